-- The rules of the Delivery lifecycle: the claim's admission, the batch finalise and the
-- circuit breaker (which the Forwards' claim and finalise, `lifecycle/forward.rs`, use as
-- well). A repeatable migration: applied again by `railhook migrate` whenever this
-- file's checksum changes (railhook_repeatables), after the versioned migrations and under
-- the migration lock, in one transaction. Edit the rules here; the Rust side that calls them
-- is crates/railhook-store/src/lifecycle/ (claim.rs, finalise.rs). Keep every signature: a
-- changed one needs a DROP FUNCTION first, and workers of the previous build still call the
-- old one until they restart.

-- ---------------------------------------------------------------------------------------
-- Claim (DESIGN.md 6.1) with admission, for a batch.
--
-- Locks: every project lock of the batch in key order, then every endpoint lock in key
-- order (seeds 7061 and 6570: railhook_store::locks), so two batches cannot deadlock. A
-- row is claimed (or deferred) only if, after the locks, it is still PENDING, due, and
-- carries the hint's token. Each claim is decided as a claim on its own would be, in the
-- order given, so a later claim of the batch sees the earlier ones (counts, rate windows,
-- the half-open probe).
--
-- Admission, in this order; the first that applies is the Deferral's reason, and the
-- Delivery stays PENDING, due again at the time given, with no Attempt spent:
--   endpoint_disabled     the endpoint is disabled              60 s
--   ordering              ordered, and the Delivery with the    until parked_at + p_gap_s
--                         previous Sequence Number of the
--                         Endpoint is PENDING or PROCESSING
--   circuit_open          open and cooling down                 until the cool-down ends
--   circuit_half_open     a probe is in flight                  1 s
--   endpoint_concurrency  PROCESSING >= p_endpoint_concurrency  1 s
--   project_concurrency   PROCESSING >= p_project_concurrency   1 s
--                         (PROCESSING rows named in p_finishing not counted, see below)
--   endpoint_rate         the endpoint's one-second window used the next window
--   project_rate          the project's one-second window used  the next window
-- Limits of 0 or less mean unlimited.
--
-- p_finishing: the Claim tokens of the claiming worker's own Deliveries whose HTTP request
-- has ended and whose finalise has not committed yet. They are PROCESSING but no longer use a
-- receiver's connection, so the concurrency limits do not count them: the limits bound
-- requests in flight (and claims about to send), not finalises. Safe across workers: a
-- worker leaves out only its own Claims whose request is over (another worker counts them,
-- which only errs on the safe side); a row finalised meanwhile is not PROCESSING, and one
-- swept and claimed again has another token.
--
-- A claim in the waiting mode (p_wait[i], the worker's per-Endpoint queue) does not defer
-- over a concurrency or rate limit: it answers 'busy:<reason>' and writes nothing, and the
-- worker keeps the hint until a slot frees or the window opens.
--
-- Outcomes per claim: 'claimed', 'claimed:behind' (see the worker's Ordering Buffer below),
-- 'claimed:gap', 'none' (done, not due, another token), 'missing' (the row is not visible
-- yet, or it is ordered and could not be numbered yet: see below), 'busy:<reason>', or the
-- Deferral's reason.
--
-- p_announced[i]: when the hint's announcement was committed (the relay's `commit_time_us`
-- header; NULL when unknown, e.g. the polling relay). A hint on the retry path that finds
-- its row PENDING and due, without its token, and last announced before that commit, has
-- overtaken the scheduler's commit (the commit is decoded and announced before it is
-- visible): 'missing', claimed again shortly. A row announced since (a later scheduler run, a
-- sweep) makes the hint stale: 'none'.
--
-- The worker's Ordering Buffer (issue 30): p_mine holds the Claim tokens of the ordered
-- Deliveries the claiming worker holds now. An ordered Delivery whose predecessor is
-- PROCESSING under one of them, or under a claim earlier in this batch, is claimed
-- ('claimed:behind') instead of parked: the worker holds it and sends it only once the
-- predecessor's Attempt ended in a final verdict, so an Endpoint's ordered Deliveries are
-- claimed ahead, many per round trip, and sent one after another without a round trip
-- through Postgres in between. If the predecessor goes back on its ladder instead, the
-- worker parks what it held behind it (railhook_park_held), and the rest is as below.
--
-- The Ordering Buffer (DESIGN.md 6.5): a Delivery with a Sequence Number whose predecessor
-- (the same Endpoint's Delivery numbered one less) is unresolved is parked: a Deferral that
-- sets parked_at on the first park and is due again at parked_at + p_gap_s. The finalise
-- that resolves the predecessor releases it at once (railhook_finalise_batch). Once the gap
-- timeout is over it goes without a predecessor that is PENDING on its own ladder: outcome
-- 'claimed:gap'. A predecessor in flight or itself parked is always waited for.
DROP FUNCTION IF EXISTS railhook_claim_batch(uuid[], uuid[], uuid[], integer, integer, integer, double precision, double precision);
DROP FUNCTION IF EXISTS railhook_claim_batch(uuid[], uuid[], uuid[], integer, integer, integer, double precision, double precision, boolean[]);
CREATE OR REPLACE FUNCTION railhook_claim_batch(
    p_deliveries uuid[], p_tokens uuid[], p_hints uuid[],
    p_endpoint_concurrency integer, p_project_concurrency integer, p_project_rate integer,
    p_circuit_cooldown_s double precision, p_probe_timeout_s double precision,
    p_wait boolean[], p_gap_s double precision, p_finishing uuid[],
    p_announced timestamptz[], p_mine uuid[]
) RETURNS TABLE (idx integer, outcome text)
LANGUAGE plpgsql VOLATILE
-- Generic plans for the statements inside (issue 30). With array parameters the custom
-- plan's estimate (the batch's real size) looked cheaper than the generic one's, and the
-- plan cache planned most executions again: 0.1-0.5 ms of planning per statement, about a
-- fifth of Postgres' CPU per Delivery (BENCHMARKS "Planning"). Every statement here reads
-- and writes rows by key, and says so with enable_seqscan off: a generic plan made while a
-- table is small (a new database, before its first ANALYZE) would otherwise be a sequential
-- scan, kept until the next ANALYZE (measured: 1 ms a claim instead of 0.05). A SET clause
-- puts both back when the function returns; it leaves the railhook.claim_numbered the
-- function sets alone (only the settings it names are restored).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    k bigint;
    i integer;
    d record;
    c_state text;
    c_reason text;
    c_until timestamptz;
    ep_rate integer;
    ep_enabled boolean;
    n integer;
    defer_until timestamptz;
    reason text;
    gap boolean;
    behind boolean;
    pred_status delivery_status;
    pred_parked timestamptz;
    pred_token uuid;
    pred_next timestamptz;
    ordering_busy boolean;
    -- PROCESSING counts per Endpoint and per Project, read once per batch (issue 30) and
    -- raised by this batch's own claims: under the advisory locks no other claim adds to
    -- them before this transaction commits, and a finalise meanwhile only lowers the real
    -- count (the cached one errs on the safe side).
    ep_keys uuid[] := '{}';
    ep_counts integer[] := '{}';
    pr_keys uuid[] := '{}';
    pr_counts integer[] := '{}';
    ep_j integer;
    pr_j integer;
    lock_ep uuid;
    locked_eps uuid[] := '{}';
    unnumbered boolean;
    to_number boolean := false;
    -- The numbers this batch handed out, not yet written to their rows: the claim's (or the
    -- Deferral's) UPDATE of the row writes its number; the rest at the end.
    num_ids uuid[] := '{}';
    num_ns bigint[] := '{}';
    unwritten integer := 0;
    num_j integer;
    -- The last Endpoint read in this batch (a batch is mostly one Endpoint's): its settings,
    -- and whether its circuit was closed. Read once per batch, they err towards admitting
    -- for the rest of it (a few milliseconds): a finalise that opens the circuit, or a
    -- disable, committed meanwhile is seen by the next batch. Nothing this batch does can
    -- open the circuit; a half-open one is never cached (its probe is taken below).
    seen_ep uuid;
    seen_enabled boolean;
    seen_rate integer;
    closed_ep uuid;
    -- The projects whose claim lock this batch took (the fast path below claims only rows
    -- under both of their locks).
    locked_prs uuid[] := '{}';
    fast boolean;
BEGIN
    IF cardinality(p_deliveries) IS DISTINCT FROM cardinality(p_tokens)
       OR cardinality(p_deliveries) IS DISTINCT FROM cardinality(p_hints) THEN
        RAISE EXCEPTION 'railhook_claim_batch: % deliveries, % tokens, % hints',
            cardinality(p_deliveries), cardinality(p_tokens), cardinality(p_hints);
    END IF;
    IF coalesce(cardinality(p_deliveries), 0) = 0 THEN
        RETURN;
    END IF;

    -- The locks, in the one total order: projects by key, then endpoints by key. The batch's
    -- rows are found by primary key alone (a MATERIALIZED CTE), the status checked after:
    -- with `id = ANY (..) AND status = 'PENDING'` in one scan the planner may AND the
    -- primary key with deliveries_due_idx (every PENDING row), whose size it takes from
    -- the last ANALYZE; under a backlog that read every PENDING entry on each claim.
    FOR k, lock_ep IN
        WITH mine AS MATERIALIZED (SELECT dl.project_id, dl.status FROM deliveries dl WHERE dl.id = ANY (p_deliveries))
        SELECT DISTINCT hashtextextended(mine.project_id::text, 7061) AS key, mine.project_id
        FROM mine WHERE mine.status = 'PENDING'
        ORDER BY key
    LOOP
        PERFORM pg_advisory_xact_lock(k);
        locked_prs := locked_prs || lock_ep;
    END LOOP;
    FOR k, lock_ep, unnumbered IN
        WITH mine AS MATERIALIZED (SELECT dl.endpoint_id, dl.status, dl.ordered AND dl.sequence_number IS NULL AS unnumbered
                                   FROM deliveries dl WHERE dl.id = ANY (p_deliveries))
        SELECT hashtextextended(mine.endpoint_id::text, 6570) AS key, mine.endpoint_id, bool_or(mine.unnumbered)
        FROM mine WHERE mine.status = 'PENDING'
        GROUP BY mine.endpoint_id
        ORDER BY key
    LOOP
        PERFORM pg_advisory_xact_lock(k);
        locked_eps := locked_eps || lock_ep;
        to_number := to_number OR unnumbered;
    END LOOP;

    -- Sequence Numbers (migration 0035): the batch's ordered Deliveries that have none yet
    -- get theirs here, per Endpoint in the batch's order (the hints' order: the relay
    -- announces in commit order), from endpoints.last_sequence. Only under the Endpoint's
    -- claim lock (taken above), so no other claim numbers the same rows meanwhile and no
    -- number is handed out twice or skipped; a rollback takes the numbers back with the
    -- counter. Nothing after the first hint whose row this snapshot cannot see yet (a hint
    -- that overtook its commit, 'missing' below): what comes after it waits for it, so
    -- numbers follow the hints' order. An ordered row left without a number answers
    -- 'missing' in the loop and is claimed again shortly. The number goes into the row with
    -- the claim's own UPDATE below (or the Deferral's, or the last statement): one row
    -- version per claim, not two, and no foreign key checked again (an UPDATE of a row this
    -- transaction wrote checks the row's foreign keys, KEY SHARE locks on its Event and
    -- Endpoint included). A batch that numbered anything sets railhook.claim_numbered:
    -- its commit waits for the WAL flush even where claims commit without (claim.rs), so a
    -- number a receiver saw is never handed out again after a Postgres crash.
    IF to_number THEN
        -- The batch's rows by primary key alone (MATERIALIZED, as the lock reads above): a
        -- plan through deliveries_endpoint_idx (the Endpoint's) would read every Delivery
        -- of the Endpoint.
        WITH w AS MATERIALIZED (
            SELECT * FROM unnest(p_deliveries, p_hints) WITH ORDINALITY AS w(id, hint, ord)
        ),
        cand AS MATERIALIZED (
            SELECT dl.id, dl.endpoint_id, dl.ordered, dl.sequence_number, dl.status, dl.claim_token
            FROM deliveries dl WHERE dl.id = ANY (p_deliveries)
        ),
        unseen AS (
            SELECT min(w.ord) AS ord FROM w LEFT JOIN cand ON cand.id = w.id WHERE cand.id IS NULL
        ),
        want AS (
            SELECT DISTINCT ON (cand.id) cand.id, cand.endpoint_id, w.ord
            FROM w JOIN cand ON cand.id = w.id
            WHERE cand.ordered AND cand.sequence_number IS NULL AND cand.status = 'PENDING'
              AND cand.claim_token IS NOT DISTINCT FROM w.hint
              AND cand.endpoint_id = ANY (locked_eps)
              AND w.ord < coalesce((SELECT unseen.ord FROM unseen), 9223372036854775807)
            ORDER BY cand.id, w.ord
        ),
        ranked AS (
            SELECT want.id, want.endpoint_id, row_number() OVER (PARTITION BY want.endpoint_id ORDER BY want.ord) AS nth FROM want
        ),
        seq AS (
            UPDATE endpoints e SET last_sequence = e.last_sequence + c.n
            FROM (SELECT ranked.endpoint_id, count(*) AS n FROM ranked GROUP BY ranked.endpoint_id) c
            WHERE e.id = c.endpoint_id
            RETURNING e.id, e.last_sequence - c.n AS base
        ),
        numbers AS (
            SELECT ranked.id, ranked.endpoint_id, seq.base + ranked.nth AS n FROM ranked JOIN seq ON seq.id = ranked.endpoint_id
        ),
        -- The Ordering Buffer's index (migration 0036): no index of `deliveries` holds
        -- `sequence_number`, so writing it keeps the claim's UPDATE of a first Attempt HOT
        -- (a Deferral's UPDATE sets `next_retry_at`, which deliveries_due_idx holds).
        indexed AS (
            INSERT INTO delivery_sequence (endpoint_id, sequence_number, delivery_id)
            SELECT numbers.endpoint_id, numbers.n, numbers.id FROM numbers
        )
        SELECT coalesce(array_agg(numbers.id), '{}'), coalesce(array_agg(numbers.n), '{}') INTO num_ids, num_ns FROM numbers;
        unwritten := cardinality(num_ids);
        IF unwritten > 0 THEN
            PERFORM set_config('railhook.claim_numbered', 'on', true);
        END IF;
    END IF;

    -- The fast path (issue 30): a batch in which every row would be claimed by the loop
    -- below is claimed in a few statements for the whole batch instead of about eight per
    -- row. It applies when every row is found PENDING, due and under its hint's token, is
    -- not ordered, appears once, and is under both claim locks taken above; every Endpoint
    -- of the batch is enabled, without a rate limit, and its circuit closed (or without a
    -- row); no project rate; and each Endpoint's and Project's PROCESSING count (read as
    -- the loop reads it) plus the batch's rows for it stays within its limit. Those are the
    -- conditions under which the loop claims every row, so the outcomes are the loop's.
    -- Anything else (an ordered row, a limit that would bite, a circuit not closed, a
    -- missing row) goes through the loop, row by row, unchanged.
    IF NOT to_number AND p_project_rate <= 0 THEN
        WITH w AS (
            SELECT * FROM unnest(p_deliveries, p_hints) WITH ORDINALITY AS w(id, hint, ord)
        ), r AS MATERIALIZED (
            SELECT w.ord, dl.id, dl.project_id, dl.endpoint_id
            FROM w LEFT JOIN deliveries dl
              ON dl.id = w.id AND dl.status = 'PENDING'
             AND (dl.next_retry_at IS NULL OR dl.next_retry_at <= now())
             AND dl.claim_token IS NOT DISTINCT FROM w.hint AND NOT dl.ordered
        ), per_ep AS (
            SELECT r.project_id, r.endpoint_id, count(*) AS n FROM r WHERE r.id IS NOT NULL GROUP BY r.project_id, r.endpoint_id
        ), per_pr AS (
            SELECT r.project_id, count(*) AS n FROM r WHERE r.id IS NOT NULL GROUP BY r.project_id
        )
        SELECT (SELECT bool_and(r.id IS NOT NULL AND r.endpoint_id = ANY (locked_eps) AND r.project_id = ANY (locked_prs))
                       AND count(DISTINCT r.id) = count(*) FROM r)
           AND (SELECT bool_and(ep.id IS NOT NULL AND ep.enabled IS TRUE AND coalesce(ep.rate_limit_per_second, 0) <= 0
                                AND coalesce(c.state, 'closed') = 'closed')
                FROM per_ep LEFT JOIN endpoints ep ON ep.id = per_ep.endpoint_id
                LEFT JOIN circuits c ON c.target_id = per_ep.endpoint_id)
           AND (p_endpoint_concurrency <= 0 OR NOT EXISTS (
                SELECT 1 FROM per_ep
                WHERE per_ep.n + (SELECT count(*) FROM delivery_claims c
                                  JOIN deliveries dc ON dc.id = c.delivery_id AND dc.claim_token = c.claim_token AND dc.status = 'PROCESSING'
                                  WHERE c.project_id = per_ep.project_id AND c.endpoint_id = per_ep.endpoint_id
                                    AND NOT coalesce(c.claim_token = ANY (p_finishing), false)) > p_endpoint_concurrency))
           AND (p_project_concurrency <= 0 OR NOT EXISTS (
                SELECT 1 FROM per_pr
                WHERE per_pr.n + (SELECT count(*) FROM delivery_claims c
                                  JOIN deliveries dc ON dc.id = c.delivery_id AND dc.claim_token = c.claim_token AND dc.status = 'PROCESSING'
                                  WHERE c.project_id = per_pr.project_id
                                    AND NOT coalesce(c.claim_token = ANY (p_finishing), false)) > p_project_concurrency))
        INTO fast;
        IF fast THEN
            -- As the loop's claim: conditional (the retry scheduler takes PENDING rows without
            -- these locks; a row it took since the read above is 'none'), HOT, and each
            -- Claim's row in delivery_claims in the same statement.
            RETURN QUERY
            WITH w AS (
                SELECT * FROM unnest(p_deliveries, p_tokens, p_hints) WITH ORDINALITY AS w(id, token, hint, ord)
            ), claimed AS (
                UPDATE deliveries dlc SET status = 'PROCESSING', claim_token = w.token, claimed_at = now(),
                                        next_retry_at = NULL, updated_at = now()
                FROM w
                WHERE dlc.id = w.id AND dlc.status = 'PENDING' AND dlc.claim_token IS NOT DISTINCT FROM w.hint
                RETURNING w.ord, dlc.id, dlc.project_id, dlc.endpoint_id, dlc.claim_token, dlc.claimed_at
            ), claims AS (
                INSERT INTO delivery_claims AS c (project_id, endpoint_id, delivery_id, claim_token, claimed_at)
                SELECT claimed.project_id, claimed.endpoint_id, claimed.id, claimed.claim_token, claimed.claimed_at FROM claimed
                ON CONFLICT (project_id, endpoint_id, delivery_id) DO UPDATE
                    SET claim_token = excluded.claim_token, claimed_at = excluded.claimed_at
            )
            SELECT w.ord::integer, CASE WHEN claimed.id IS NULL THEN 'none' ELSE 'claimed' END
            FROM w LEFT JOIN claimed ON claimed.ord = w.ord
            ORDER BY w.ord;
            RETURN;
        END IF;
    END IF;

    FOR i IN 1 .. cardinality(p_deliveries) LOOP
        reason := NULL;
        defer_until := NULL;
        ep_rate := NULL;
        ep_enabled := NULL;
        -- A fresh snapshot (VOLATILE, READ COMMITTED): sees every claim committed before the
        -- locks were granted and the earlier claims of this batch.
        SELECT dl.id, dl.project_id, dl.endpoint_id, dl.sequence_number, dl.parked_at, dl.ordered INTO d FROM deliveries dl
        WHERE dl.id = p_deliveries[i] AND dl.status = 'PENDING'
          AND (dl.next_retry_at IS NULL OR dl.next_retry_at <= now())
          AND dl.claim_token IS NOT DISTINCT FROM p_hints[i];
        IF NOT FOUND THEN
            -- 'missing': no such row in this snapshot. A hint comes from an outbox row
            -- committed with its Delivery, so the row exists; it is not visible yet when the
            -- commit record was flushed (and decoded, and announced) before the committing
            -- backend left the proc array. The worker claims it again shortly. 'none' only
            -- for a row seen and not claimable: this statement has a newer snapshot than the
            -- one above, in which the row may just have become visible, and claimable.
            -- (A retry's hint that overtakes the scheduler's commit finds the row without its
            -- token and is 'none': treating it as 'missing' held an Endpoint's slot for about
            -- 4 s per stale hint, and under the chaos suite's backlog every hint went stale
            -- before its claim, a livelock. Left to the re-announcement.)
            idx := i;
            outcome := CASE WHEN EXISTS (
                SELECT 1 FROM deliveries dl WHERE dl.id = p_deliveries[i]
                  AND NOT (dl.status = 'PENDING'
                           AND (dl.next_retry_at IS NULL OR dl.next_retry_at <= now())
                           AND dl.claim_token IS NOT DISTINCT FROM p_hints[i])
                  -- A retry's hint that overtook the scheduler's commit (see above).
                  AND NOT (p_hints[i] IS NOT NULL AND p_announced[i] IS NOT NULL
                           AND dl.status = 'PENDING'
                           AND (dl.next_retry_at IS NULL OR dl.next_retry_at <= now())
                           AND dl.last_announced_at < p_announced[i]))
              THEN 'none' ELSE 'missing' END;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Numbered by this batch above: its number, written by the UPDATE that claims or
        -- defers it (or at the end).
        num_j := NULL;
        IF d.ordered AND d.sequence_number IS NULL AND unwritten > 0 THEN
            num_j := array_position(num_ids, d.id);
            IF num_j IS NOT NULL THEN
                d.sequence_number := num_ns[num_j];
            END IF;
        END IF;
        IF d.ordered AND d.sequence_number IS NULL THEN
            -- Ordered and not numbered above (visible only since, behind an unseen hint, or its
            -- Endpoint's lock not taken): never sent without its number.
            idx := i; outcome := 'missing'; RETURN NEXT;
            CONTINUE;
        END IF;
        -- Taken above unless the row became PENDING after that (a release in between):
        -- then here, after the others. Re-acquiring a held lock is a no-op.
        PERFORM pg_advisory_xact_lock(hashtextextended(d.project_id::text, 7061));
        PERFORM pg_advisory_xact_lock(hashtextextended(d.endpoint_id::text, 6570));

        -- A disabled endpoint: wait a minute, no Attempt spent (checked first: nothing else
        -- about a disabled endpoint matters).
        IF seen_ep IS DISTINCT FROM d.endpoint_id THEN
            SELECT ep.enabled, ep.rate_limit_per_second INTO seen_enabled, seen_rate FROM endpoints ep WHERE ep.id = d.endpoint_id;
            seen_ep := d.endpoint_id;
        END IF;
        ep_enabled := seen_enabled;
        ep_rate := seen_rate;
        IF ep_enabled IS DISTINCT FROM true THEN
            reason := 'endpoint_disabled';
            defer_until := now() + interval '60 seconds';
        END IF;

        -- The Ordering Buffer. A predecessor in flight (PROCESSING) or itself parked is
        -- waited for without a gap timeout: it ends (or is swept back) and its finalise
        -- releases this one, so the gap timeout fires once, behind the Delivery that is
        -- really stuck (PENDING on its own retry ladder), not along the chain behind it.
        gap := false;
        behind := false;
        ordering_busy := false;
        IF reason IS NULL AND d.sequence_number IS NOT NULL AND d.sequence_number > 1 THEN
            SELECT p.status, p.parked_at, p.claim_token, p.next_retry_at INTO pred_status, pred_parked, pred_token, pred_next
            FROM delivery_sequence q JOIN deliveries p ON p.id = q.delivery_id
            WHERE q.endpoint_id = d.endpoint_id AND q.sequence_number = d.sequence_number - 1;
            IF FOUND AND pred_status = 'PROCESSING'
               AND (pred_token = ANY (p_mine) OR pred_token = ANY (p_tokens[1:i - 1])) THEN
                -- Held by this worker behind its own predecessor (the Ordering Buffer above).
                behind := true;
            ELSIF FOUND AND (pred_status = 'PROCESSING' OR (pred_status = 'PENDING' AND pred_parked IS NOT NULL)) THEN
                reason := 'ordering';
                defer_until := greatest(coalesce(d.parked_at, now()) + make_interval(secs => p_gap_s), now() + interval '1 second');
            ELSIF FOUND AND pred_status = 'PENDING' AND pred_parked IS NULL AND pred_token IS NULL
                  AND (pred_next IS NULL OR pred_next <= now()) AND coalesce(p_wait[i], false) THEN
                -- The predecessor is due and unclaimed: its own hint is about to claim it (the
                -- claims of one Endpoint's hints can reach Postgres out of their order). In the
                -- waiting mode, wait for it in the worker ('busy:ordering') rather than park:
                -- once it is claimed, this one goes behind it.
                reason := 'ordering';
                ordering_busy := true;
            ELSIF FOUND AND pred_status = 'PENDING' THEN
                IF d.parked_at IS NULL OR now() < d.parked_at + make_interval(secs => p_gap_s) THEN
                    reason := 'ordering';
                    defer_until := coalesce(d.parked_at, now()) + make_interval(secs => p_gap_s);
                ELSE
                    gap := true;
                END IF;
            END IF;
        END IF;

        -- The circuit (railhook_circuit_admit; no row: closed).
        IF closed_ep IS NOT DISTINCT FROM d.endpoint_id THEN
            c_state := NULL; c_reason := NULL; c_until := NULL;
        ELSE
            SELECT a.state, a.reason, a.defer_until INTO c_state, c_reason, c_until
            FROM railhook_circuit_admit(d.endpoint_id, p_circuit_cooldown_s, p_probe_timeout_s) AS a;
            IF NOT FOUND OR c_state = 'closed' THEN
                closed_ep := d.endpoint_id;
            END IF;
        END IF;
        IF reason IS NULL AND c_reason IS NOT NULL THEN
            reason := c_reason;
            defer_until := c_until;
        END IF;

        -- Concurrency (counted once per batch, see ep_counts). A Delivery claimed behind its
        -- predecessor uses no connection of the receiver while it waits in the worker (which
        -- leaves it out of the counts through p_finishing until it is sent, and then its
        -- predecessor's request is over): neither checked nor counted.
        ep_j := NULL;
        pr_j := NULL;
        IF reason IS NULL AND NOT behind AND p_endpoint_concurrency > 0 THEN
            ep_j := array_position(ep_keys, d.endpoint_id);
            IF ep_j IS NULL THEN
                -- The Claims' rows (migration 0032), each checked against its Delivery, so
                -- a row some writer left behind never counts.
                SELECT count(*) INTO n FROM delivery_claims c
                JOIN deliveries dc ON dc.id = c.delivery_id AND dc.claim_token = c.claim_token AND dc.status = 'PROCESSING'
                WHERE c.project_id = d.project_id AND c.endpoint_id = d.endpoint_id
                  AND NOT coalesce(c.claim_token = ANY (p_finishing), false);
                ep_keys := ep_keys || d.endpoint_id;
                ep_counts := ep_counts || n;
                ep_j := cardinality(ep_keys);
            END IF;
            IF ep_counts[ep_j] >= p_endpoint_concurrency THEN
                reason := 'endpoint_concurrency';
                defer_until := now() + interval '1 second';
            END IF;
        END IF;
        IF reason IS NULL AND NOT behind AND p_project_concurrency > 0 THEN
            pr_j := array_position(pr_keys, d.project_id);
            IF pr_j IS NULL THEN
                SELECT count(*) INTO n FROM delivery_claims c
                JOIN deliveries dc ON dc.id = c.delivery_id AND dc.claim_token = c.claim_token AND dc.status = 'PROCESSING'
                WHERE c.project_id = d.project_id
                  AND NOT coalesce(c.claim_token = ANY (p_finishing), false);
                pr_keys := pr_keys || d.project_id;
                pr_counts := pr_counts || n;
                pr_j := cardinality(pr_keys);
            END IF;
            IF pr_counts[pr_j] >= p_project_concurrency THEN
                reason := 'project_concurrency';
                defer_until := now() + interval '1 second';
            END IF;
        END IF;

        -- Rates: fixed one-second windows.
        IF reason IS NULL THEN
            IF ep_rate IS NOT NULL AND ep_rate > 0 THEN
                SELECT used INTO n FROM claim_rates WHERE kind = 'endpoint' AND id = d.endpoint_id AND window_start = date_trunc('second', now());
                IF coalesce(n, 0) >= ep_rate THEN
                    reason := 'endpoint_rate';
                    defer_until := date_trunc('second', now()) + interval '1 second';
                END IF;
            END IF;
        END IF;
        IF reason IS NULL AND p_project_rate > 0 THEN
            SELECT used INTO n FROM claim_rates WHERE kind = 'project' AND id = d.project_id AND window_start = date_trunc('second', now());
            IF coalesce(n, 0) >= p_project_rate THEN
                reason := 'project_rate';
                defer_until := date_trunc('second', now()) + interval '1 second';
            END IF;
        END IF;

        IF (ordering_busy OR reason IN ('endpoint_concurrency', 'project_concurrency', 'endpoint_rate', 'project_rate'))
           AND coalesce(p_wait[i], false) THEN
            idx := i; outcome := 'busy:' || reason; RETURN NEXT;
            CONTINUE;
        END IF;
        IF reason IS NOT NULL THEN
            -- The Deferral: no Attempt, no Claim; the scheduler announces it again when due.
            UPDATE deliveries SET next_retry_at = defer_until, claim_token = NULL, updated_at = now(),
                                  parked_at = CASE WHEN reason = 'ordering' THEN coalesce(parked_at, now()) ELSE parked_at END,
                                  sequence_number = coalesce(sequence_number, d.sequence_number)
            WHERE id = d.id AND status = 'PENDING' AND claim_token IS NOT DISTINCT FROM p_hints[i];
            IF FOUND AND num_j IS NOT NULL THEN
                unwritten := unwritten - 1;
            END IF;
            idx := i; outcome := CASE WHEN FOUND THEN reason ELSE 'none' END; RETURN NEXT;
            CONTINUE;
        END IF;

        -- Conditional like every other write: the retry scheduler takes PENDING rows without
        -- these locks, and a row it took since the SELECT above is its, not this claim's.
        -- HOT (migration 0032): no index of `deliveries` uses a column this changes on a
        -- first Attempt (`next_retry_at` is NULL already; on the retry path it is cleared, so
        -- `deliveries_due_idx` holds PENDING rows only). The Claim's row in
        -- `delivery_claims` goes in with it, in the same statement: a Delivery is never
        -- PROCESSING without one (the counts above and the stuck sweep read them).
        WITH claimed AS (
            UPDATE deliveries SET status = 'PROCESSING', claim_token = p_tokens[i], claimed_at = now(),
                                  next_retry_at = NULL, updated_at = now(),
                                  sequence_number = coalesce(sequence_number, d.sequence_number)
            WHERE id = d.id AND status = 'PENDING' AND claim_token IS NOT DISTINCT FROM p_hints[i]
            RETURNING id, project_id, endpoint_id, claim_token, claimed_at
        )
        INSERT INTO delivery_claims AS c (project_id, endpoint_id, delivery_id, claim_token, claimed_at)
        SELECT project_id, endpoint_id, id, claim_token, claimed_at FROM claimed
        -- A row left behind by a Claim that ended without taking it (a writer of the previous
        -- build) is this Claim's now.
        ON CONFLICT (project_id, endpoint_id, delivery_id) DO UPDATE
            SET claim_token = excluded.claim_token, claimed_at = excluded.claimed_at;
        IF NOT FOUND THEN
            idx := i; outcome := 'none'; RETURN NEXT;
            CONTINUE;
        END IF;
        IF num_j IS NOT NULL THEN
            unwritten := unwritten - 1;
        END IF;
        -- This claim counts against both limits for the rest of the batch. (A count not read
        -- yet will see it: the counting query's snapshot includes this transaction's writes;
        -- a Delivery claimed behind is left out of it only by p_finishing, in later batches.)
        IF NOT behind THEN
            IF ep_j IS NOT NULL THEN
                ep_counts[ep_j] := ep_counts[ep_j] + 1;
            ELSIF array_position(ep_keys, d.endpoint_id) IS NOT NULL THEN
                ep_counts[array_position(ep_keys, d.endpoint_id)] := ep_counts[array_position(ep_keys, d.endpoint_id)] + 1;
            END IF;
            IF pr_j IS NOT NULL THEN
                pr_counts[pr_j] := pr_counts[pr_j] + 1;
            ELSIF array_position(pr_keys, d.project_id) IS NOT NULL THEN
                pr_counts[array_position(pr_keys, d.project_id)] := pr_counts[array_position(pr_keys, d.project_id)] + 1;
            END IF;
        END IF;

        IF ep_rate IS NOT NULL AND ep_rate > 0 THEN
            INSERT INTO claim_rates AS r (kind, id, window_start, used) VALUES ('endpoint', d.endpoint_id, date_trunc('second', now()), 1)
            ON CONFLICT (kind, id) DO UPDATE SET
                used = CASE WHEN r.window_start = excluded.window_start THEN r.used + 1 ELSE 1 END,
                window_start = excluded.window_start;
        END IF;
        IF p_project_rate > 0 THEN
            INSERT INTO claim_rates AS r (kind, id, window_start, used) VALUES ('project', d.project_id, date_trunc('second', now()), 1)
            ON CONFLICT (kind, id) DO UPDATE SET
                used = CASE WHEN r.window_start = excluded.window_start THEN r.used + 1 ELSE 1 END,
                window_start = excluded.window_start;
        END IF;
        IF c_state IN ('open', 'half_open') THEN
            -- Admitted through a circuit that is not closed: this claim is the probe.
            PERFORM railhook_circuit_take_probe(d.endpoint_id, p_tokens[i]);
        END IF;
        idx := i; outcome := CASE WHEN gap THEN 'claimed:gap' WHEN behind THEN 'claimed:behind' ELSE 'claimed' END; RETURN NEXT;
    END LOOP;
    -- Numbers handed out to rows this batch did not write (busy, not claimable after all):
    -- theirs all the same, as delivery_sequence says.
    IF unwritten > 0 THEN
        UPDATE deliveries dn SET sequence_number = x.n
        FROM unnest(num_ids, num_ns) AS x(id, n)
        WHERE dn.id = x.id AND dn.sequence_number IS NULL;
    END IF;
END
$$;

-- The signature before p_announced and p_mine (a worker of the previous build, until it
-- restarts): no overtaken retries told apart, no Ordering Buffer in the worker.
CREATE OR REPLACE FUNCTION railhook_claim_batch(
    p_deliveries uuid[], p_tokens uuid[], p_hints uuid[],
    p_endpoint_concurrency integer, p_project_concurrency integer, p_project_rate integer,
    p_circuit_cooldown_s double precision, p_probe_timeout_s double precision,
    p_wait boolean[], p_gap_s double precision, p_finishing uuid[]
) RETURNS TABLE (idx integer, outcome text)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM railhook_claim_batch(p_deliveries, p_tokens, p_hints, p_endpoint_concurrency, p_project_concurrency,
        p_project_rate, p_circuit_cooldown_s, p_probe_timeout_s, p_wait, p_gap_s, p_finishing, NULL::timestamptz[], '{}'::uuid[])
$$;

-- The Attempts' details of a claim batch's won rows, by Delivery id and new token (claim.rs
-- reads them right after the claim, in the same round trip). A function only for its plan:
-- as a statement of the worker's own, the plan cache planned it again on most executions
-- (its custom plan, for the batch's real size, looked cheaper than the generic one), 0.5 ms
-- a time, more than it took to run (issue 30); here its generic plan by key is kept (see
-- railhook_claim_batch).
CREATE OR REPLACE FUNCTION railhook_claimed(p_ids uuid[], p_tokens uuid[])
RETURNS TABLE (id uuid, project_id uuid, event_id uuid, endpoint_id uuid, attempt_count integer, max_attempts integer,
               retry_delays integer[], timeout_seconds integer, sequence_number bigint, ladder_started_at timestamptz,
               event_type text, created_at timestamptz, payload text, url text, enabled boolean, headers jsonb,
               secrets text[], claim_token uuid, parked_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT c.id, c.project_id, c.event_id, c.endpoint_id, c.attempt_count, c.max_attempts, c.retry_delays,
           c.timeout_seconds, c.sequence_number, c.ladder_started_at,
           e.event_type, e.created_at, e.payload::text, ep.url, ep.enabled, ep.headers,
           ARRAY(SELECT s.secret FROM endpoint_secrets s
                 WHERE s.endpoint_id = c.endpoint_id AND (s.expires_at IS NULL OR s.expires_at > now())
                 ORDER BY s.expires_at IS NULL DESC, s.created_at DESC),
           c.claim_token, c.parked_at
    FROM unnest(p_ids, p_tokens) AS want (id, token)
    JOIN deliveries c ON c.id = want.id AND c.claim_token = want.token AND c.status = 'PROCESSING'
    JOIN events e ON e.id = c.event_id
    JOIN endpoints ep ON ep.id = c.endpoint_id;
END
$$;

-- The worker's Ordering Buffer gives back what it held behind a predecessor that did not end
-- in a final verdict (back on its ladder, cut short, fenced out): the held Delivery becomes
-- PENDING and parked, exactly as if its claim had parked it (due again at its gap timeout;
-- released at once by the predecessor's finalise when that one ends), with no Attempt spent.
-- Only while the Claim holds. Returns whether it wrote.
CREATE OR REPLACE FUNCTION railhook_park_held(p_delivery uuid, p_token uuid, p_gap_s double precision)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ep uuid;
BEGIN
    -- The Endpoint's claim lock, as a claim that parks holds it: a finalise releasing this
    -- Delivery either sees the park or ran before it (then the predecessor has ended and the
    -- Delivery is due at once).
    SELECT endpoint_id INTO ep FROM deliveries WHERE id = p_delivery;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(ep::text, 6570));
    UPDATE deliveries d
    SET status = 'PENDING', claim_token = NULL, claimed_at = NULL, updated_at = now(),
        parked_at = coalesce(d.parked_at, now()),
        next_retry_at = CASE
            -- The predecessor ended meanwhile (its finalise found nothing parked to release).
            WHEN EXISTS (SELECT 1 FROM delivery_sequence q JOIN deliveries p ON p.id = q.delivery_id
                         WHERE q.endpoint_id = d.endpoint_id AND q.sequence_number = d.sequence_number - 1
                           AND p.status IN ('SUCCESS', 'FAILED'))
            THEN now()
            ELSE coalesce(d.parked_at, now()) + make_interval(secs => p_gap_s) END
    WHERE d.id = p_delivery AND d.claim_token = p_token AND d.status = 'PROCESSING';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    DELETE FROM delivery_claims c USING deliveries d
    WHERE d.id = p_delivery AND c.project_id = d.project_id AND c.endpoint_id = d.endpoint_id AND c.delivery_id = d.id;
    RETURN true;
END
$$;

-- The signature before p_finishing, for workers of the previous build until they restart:
-- every PROCESSING row counts.
CREATE OR REPLACE FUNCTION railhook_claim_batch(
    p_deliveries uuid[], p_tokens uuid[], p_hints uuid[],
    p_endpoint_concurrency integer, p_project_concurrency integer, p_project_rate integer,
    p_circuit_cooldown_s double precision, p_probe_timeout_s double precision,
    p_wait boolean[], p_gap_s double precision
) RETURNS TABLE (idx integer, outcome text)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM railhook_claim_batch(p_deliveries, p_tokens, p_hints, p_endpoint_concurrency, p_project_concurrency,
        p_project_rate, p_circuit_cooldown_s, p_probe_timeout_s, p_wait, p_gap_s, '{}'::uuid[], NULL::timestamptz[], '{}'::uuid[])
$$;

-- ---------------------------------------------------------------------------------------
-- Finalise (DESIGN.md 6.2) for a batch of Attempts: one statement and one commit. Element
-- i of every array belongs to the same Attempt. The Attempt is inserted whatever happens to
-- the fence (every Attempt is on record) unless its Delivery is gone; the Delivery changes
-- only while the Claim (p_tokens[i]) still holds it; only then is the outcome recorded in the
-- endpoint's circuit. The caller sorts the batch by endpoint, so finalise batches lock
-- circuit rows in one order. The Attempt id comes from the caller, so a finalise made again
-- after a lost reply inserts nothing twice. Returns per element its 1-based index, whether
-- the fence held, the circuit's change (railhook_circuit_record_many, once per endpoint of the batch) or NULL, and the Delivery
-- the Ordering Buffer released (or NULL).
--
-- The Attempt: its request headers as sent (credentials redacted by the worker), the
-- response's status, headers and body (TOAST-compressed with lz4 above about 2 KB per row:
-- migration 0017), duration and error class (`result`). `attempts` is partitioned by day on
-- started_at (migration 0017); the default partition takes an Attempt whose day has none, so
-- the insert never fails for want of a partition. The key is (id, started_at), and a
-- finalise made again carries both unchanged.
--
-- Ordering: a Delivery with a Sequence Number that ends (SUCCESS or Failed Messages)
-- advances its Endpoint's cursor (never backwards) and releases its parked successor at once:
-- due now, unclaimed, so the worker that finalised claims it right away (and, should that
-- worker die first, the retry scheduler announces it).
DROP FUNCTION IF EXISTS railhook_finalise_batch(uuid[], uuid[], text[], timestamptz[], text[], uuid[], uuid[], integer[],
    timestamptz[], integer[], integer[], text[], text[], jsonb[], text[], boolean[], uuid[], boolean[],
    double precision, integer, double precision);
CREATE OR REPLACE FUNCTION railhook_finalise_batch(
    p_deliveries uuid[], p_tokens uuid[], p_statuses text[], p_retry_at timestamptz[], p_last_errors text[],
    p_attempt_ids uuid[], p_projects uuid[], p_numbers integer[], p_started timestamptz[], p_durations integer[],
    p_codes integer[], p_results text[], p_errors text[], p_headers jsonb[], p_bodies text[], p_truncated boolean[],
    p_request_headers jsonb[],
    p_endpoints uuid[], p_healthy boolean[],
    p_window_s double precision, p_min_volume integer, p_ratio double precision
) RETURNS TABLE (idx integer, wrote boolean, circuit text, released uuid)
LANGUAGE plpgsql VOLATILE
-- Generic plans by key, as railhook_claim_batch (a batch's arrays made the plan cache plan
-- most executions again).
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
AS $$
DECLARE
    fenced integer[];
    -- The fenced rows that carry a Sequence Number: their index, Endpoint, number, and
    -- whether they ended (SUCCESS or Failed Messages), as the UPDATE returned them.
    o_n integer[];
    o_endpoints uuid[];
    o_sequences bigint[];
    o_ended boolean[];
    freed uuid[] := '{}';
    k bigint;
    n integer := coalesce(cardinality(p_deliveries), 0);
    run_start integer := 1;
    run_tokens uuid[];
    run_healthy boolean[];
    -- The Endpoints whose circuit the batch statement below did not count (no row, not
    -- closed, or this batch opens it): recorded one by one.
    slow_eps uuid[];
BEGIN
    IF n <> coalesce(cardinality(p_tokens), 0) OR n <> coalesce(cardinality(p_attempt_ids), 0)
       OR n <> coalesce(cardinality(p_endpoints), 0) OR n <> coalesce(cardinality(p_healthy), 0)
       OR n <> coalesce(cardinality(p_bodies), 0) OR n <> coalesce(cardinality(p_request_headers), 0) THEN
        RAISE EXCEPTION 'railhook_finalise_batch: arrays of different lengths (% deliveries)', n;
    END IF;
    WITH input AS (
        SELECT * FROM unnest(p_deliveries, p_tokens, p_statuses, p_retry_at, p_last_errors)
            WITH ORDINALITY AS t(delivery, token, status, retry_at, last_error, n)
    ), done AS (
        UPDATE deliveries d
        SET status = i.status::delivery_status,
            attempt_count = d.attempt_count + 1,
            next_retry_at = i.retry_at,
            claim_token = NULL, claimed_at = NULL,
            last_error = i.last_error,
            completed_at = CASE WHEN i.status IN ('SUCCESS', 'FAILED') THEN now() END,
            updated_at = now()
        FROM input i
        WHERE d.id = i.delivery AND d.claim_token = i.token AND d.status = 'PROCESSING'
        RETURNING i.n, d.id, d.project_id, d.endpoint_id, d.sequence_number, d.status
    ), unclaimed AS (
        -- The Claim ends with the fence held; and an ended Delivery is no longer open
        -- (migration 0032). Both by primary key.
        DELETE FROM delivery_claims c USING done
        WHERE c.project_id = done.project_id AND c.endpoint_id = done.endpoint_id AND c.delivery_id = done.id
    ), closed AS (
        DELETE FROM open_deliveries o USING done
        WHERE o.delivery_id = done.id AND done.status IN ('SUCCESS', 'FAILED')
    )
    SELECT coalesce(array_agg(done.n::integer), '{}'),
           array_agg(done.n::integer) FILTER (WHERE done.sequence_number IS NOT NULL),
           array_agg(done.endpoint_id) FILTER (WHERE done.sequence_number IS NOT NULL),
           array_agg(done.sequence_number) FILTER (WHERE done.sequence_number IS NOT NULL),
           array_agg(done.status IN ('SUCCESS', 'FAILED')) FILTER (WHERE done.sequence_number IS NOT NULL)
    INTO fenced, o_n, o_endpoints, o_sequences, o_ended FROM done;
    freed := array_fill(NULL::uuid, ARRAY[n]);

    -- Ordering: cursors and releases, for the ended Deliveries that carry a Sequence Number.
    -- First the endpoints' claim locks (the claim holds them while it reads a predecessor and
    -- parks its successor): without them a claim could read the predecessor as PROCESSING
    -- while this finalise, not yet seeing the park, releases nothing, and the successor would
    -- wait for its gap timeout. With them, either this release sees the park or the claim
    -- sees the predecessor ended. In key order, like the claims.
    -- (Read off the UPDATE above: a batch without ordered Deliveries runs nothing more.)
    IF o_n IS NOT NULL THEN
        FOR k IN
            SELECT DISTINCT hashtextextended(e::text, 6570) AS key FROM unnest(o_endpoints) AS e ORDER BY key
        LOOP
            PERFORM pg_advisory_xact_lock(k);
        END LOOP;
        -- One statement for the batch (issue 30; it was two per Delivery): each Endpoint's
        -- cursor to the highest number that ended (never backwards), and each ended
        -- Delivery's parked successor released.
        WITH ended AS (
            SELECT t.n AS nth, t.endpoint_id, t.sequence_number
            FROM unnest(o_n, o_endpoints, o_sequences, o_ended) AS t(n, endpoint_id, sequence_number, is_end)
            WHERE t.is_end
        ), cursors AS (
            INSERT INTO endpoint_ordering AS o (endpoint_id, cursor)
            SELECT ended.endpoint_id, max(ended.sequence_number) FROM ended GROUP BY ended.endpoint_id ORDER BY ended.endpoint_id
            ON CONFLICT (endpoint_id) DO UPDATE SET cursor = greatest(o.cursor, excluded.cursor), advanced_at = now()
            WHERE o.cursor < excluded.cursor
        ), successors AS (
            UPDATE deliveries s SET next_retry_at = now(), updated_at = now()
            FROM ended JOIN delivery_sequence q
                ON q.endpoint_id = ended.endpoint_id AND q.sequence_number = ended.sequence_number + 1
            WHERE s.id = q.delivery_id
              AND s.status = 'PENDING' AND s.parked_at IS NOT NULL AND s.claim_token IS NULL
            RETURNING ended.nth, s.id
        )
        SELECT array_agg(successors.id ORDER BY g.pos) INTO freed
        FROM generate_series(1, n) AS g(pos) LEFT JOIN successors ON successors.nth = g.pos;
    END IF;

    INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code,
                          result, error_message, response_headers, response_body, response_truncated, request_headers)
    SELECT u.* FROM unnest(p_attempt_ids, p_projects, p_deliveries, p_numbers, p_started, p_durations, p_codes,
                           p_results, p_errors, p_headers, p_bodies, p_truncated, p_request_headers)
        AS u(id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code,
             result, error_message, response_headers, response_body, response_truncated, request_headers)
    -- The batch's Deliveries that still exist, read by primary key: as a semi-join, the
    -- generic plan made when `deliveries` was small hashed the whole table (through an
    -- index, seqscan being off), 34,000 rows a batch at the end of a saturation bench
    -- (seventeenth session; tests/finalise.rs `the_attempts_insert_reads_its_deliveries_by_key`).
    WHERE u.delivery_id = ANY (ARRAY(SELECT d.id FROM deliveries d WHERE d.id = ANY (p_deliveries)))
    ON CONFLICT (id, started_at) DO NOTHING;

    -- The circuits, the common case for the whole batch in two statements (issue 30; it
    -- was two statements and a function call per Endpoint of the batch): every closed
    -- circuit that this batch does not open counts its Endpoint's fenced outcomes in its
    -- window, as railhook_circuit_record_many's first statement does. Every circuit row of
    -- the batch is locked first, in key order (the order of the runs below and of every
    -- other finalise), whatever its state: the ones left to the runs below are then locked
    -- already, so no two finalises wait for each other's rows in opposite orders.
    IF cardinality(fenced) > 0 THEN
        PERFORM 1 FROM circuits c
        WHERE c.target_id IN (SELECT p_endpoints[j] FROM unnest(fenced) AS j)
        ORDER BY c.target_id FOR UPDATE;
        WITH o AS (
            SELECT p_endpoints[j] AS ep, count(*) FILTER (WHERE p_healthy[j]) AS ok, count(*) FILTER (WHERE NOT p_healthy[j]) AS bad
            FROM unnest(fenced) AS j GROUP BY p_endpoints[j]
        ), w AS (
            SELECT c.target_id, o.ep,
                   c.window_start < now() - make_interval(secs => p_window_s) AS reset,
                   CASE WHEN c.window_start < now() - make_interval(secs => p_window_s) THEN 0 ELSE c.successes END + o.ok AS ok,
                   CASE WHEN c.window_start < now() - make_interval(secs => p_window_s) THEN 0 ELSE c.failures END + o.bad AS bad
            FROM o JOIN circuits c ON c.target_id = o.ep AND c.state = 'closed'
        ), counted AS (
            UPDATE circuits c SET
                window_start = CASE WHEN w.reset THEN now() ELSE c.window_start END,
                successes = w.ok, failures = w.bad
            FROM w
            WHERE c.target_id = w.target_id
              AND NOT (p_min_volume > 0 AND w.ok + w.bad >= p_min_volume AND w.bad::double precision / (w.ok + w.bad) >= p_ratio)
            RETURNING c.target_id
        )
        SELECT array_agg(o.ep) INTO slow_eps FROM o WHERE o.ep NOT IN (SELECT counted.target_id FROM counted);
    END IF;

    -- The rest: once per Endpoint of the batch not counted above (the caller sorts by
    -- Endpoint, so its rows are one run), with the outcomes of its fenced rows; a change is
    -- reported on the run's last row.
    FOR i IN 1 .. n LOOP
        idx := i;
        wrote := i = ANY (fenced);
        circuit := NULL;
        IF i = n OR p_endpoints[i + 1] IS DISTINCT FROM p_endpoints[i] THEN
            IF p_endpoints[i] = ANY (slow_eps) THEN
                SELECT array_agg(p_tokens[j] ORDER BY j), array_agg(p_healthy[j] ORDER BY j) INTO run_tokens, run_healthy
                FROM generate_series(run_start, i) AS j WHERE j = ANY (fenced);
                IF run_tokens IS NOT NULL THEN
                    circuit := railhook_circuit_record_many(p_endpoints[i], 'endpoint', run_tokens, run_healthy, p_window_s, p_min_volume, p_ratio);
                END IF;
            END IF;
            run_start := i + 1;
        END IF;
        released := freed[i];
        RETURN NEXT;
    END LOOP;
END
$$;

-- The previous signature (without p_request_headers), kept for workers of the build before
-- migration 0017 until they restart: their Attempts are recorded without request headers.
CREATE OR REPLACE FUNCTION railhook_finalise_batch(
    p_deliveries uuid[], p_tokens uuid[], p_statuses text[], p_retry_at timestamptz[], p_last_errors text[],
    p_attempt_ids uuid[], p_projects uuid[], p_numbers integer[], p_started timestamptz[], p_durations integer[],
    p_codes integer[], p_results text[], p_errors text[], p_headers jsonb[], p_bodies text[], p_truncated boolean[],
    p_endpoints uuid[], p_healthy boolean[],
    p_window_s double precision, p_min_volume integer, p_ratio double precision
) RETURNS TABLE (idx integer, wrote boolean, circuit text, released uuid)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM railhook_finalise_batch(p_deliveries, p_tokens, p_statuses, p_retry_at, p_last_errors,
        p_attempt_ids, p_projects, p_numbers, p_started, p_durations, p_codes, p_results, p_errors, p_headers,
        p_bodies, p_truncated, array_fill(NULL::jsonb, ARRAY[coalesce(cardinality(p_deliveries), 0)]),
        p_endpoints, p_healthy, p_window_s, p_min_volume, p_ratio)
$$;

-- ---------------------------------------------------------------------------------------
-- The circuit breaker, of an Endpoint (the Deliveries' claim and finalise above) or of a
-- Destination (the Forwards', railhook_store::lifecycle::forward): one row of `circuits`
-- per target (migration 0026), looked up by `target_id`, the Endpoint's or Destination's id.
--
-- States: closed (normal); open (every claim deferred until opened_at + the cool-down, no
-- Attempt spent); half_open (one probe Attempt in flight: its outcome closes or reopens the
-- circuit; the others are deferred by 1 s; a probe older than the probe timeout is replaced
-- by the next claim). p_kind is 'endpoint' or 'destination'.

-- The admission: for a claim of a Delivery or Forward of p_target, the circuit's state and,
-- when the claim must wait, the Deferral's reason and until when. No row: closed (a circuit
-- row is made by its first recorded outcome).
CREATE OR REPLACE FUNCTION railhook_circuit_admit(
    p_target uuid, p_cooldown_s double precision, p_probe_timeout_s double precision
) RETURNS TABLE (state text, reason text, defer_until timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT c.state,
           CASE WHEN c.state = 'open' AND now() < c.opened_at + make_interval(secs => p_cooldown_s) THEN 'circuit_open'
                WHEN c.state = 'half_open' AND c.probe_at > now() - make_interval(secs => p_probe_timeout_s) THEN 'circuit_half_open' END,
           CASE WHEN c.state = 'open' AND now() < c.opened_at + make_interval(secs => p_cooldown_s) THEN c.opened_at + make_interval(secs => p_cooldown_s)
                WHEN c.state = 'half_open' AND c.probe_at > now() - make_interval(secs => p_probe_timeout_s) THEN now() + interval '1 second' END
    FROM circuits c WHERE c.target_id = p_target
$$;

-- A claim admitted while the circuit was open (cool-down over) or half-open (its probe timed
-- out) is the probe: its Claim token is the one whose outcome counts. Nothing when the
-- circuit closed meanwhile.
CREATE OR REPLACE FUNCTION railhook_circuit_take_probe(p_target uuid, p_token uuid) RETURNS void
LANGUAGE sql VOLATILE AS $$
    UPDATE circuits SET state = 'half_open', probe_token = p_token, probe_at = now()
    WHERE target_id = p_target AND state IN ('open', 'half_open')
$$;

-- Records the outcomes of one target's Attempts of a finalise batch
-- (p_tokens[i], p_healthy[i], in the batch's order) in its circuit, with one row lock and
-- one update; returns the change ('opened', 'closed', 'reopened') or NULL. A failure is an
-- outcome that asks for a retry. Closed: the batch's outcomes are added to the current
-- window of p_window_s seconds, and the circuit opens when at least p_min_volume outcomes
-- were seen and the failure ratio reached p_ratio. Half-open: only the probe's outcome (the
-- Attempt under probe_token) counts; it closes the circuit on success and reopens it on
-- failure. Open: nothing is recorded.
DROP FUNCTION IF EXISTS railhook_circuit_record(uuid, uuid, boolean, double precision, integer, double precision);
DROP FUNCTION IF EXISTS railhook_circuit_record_many(uuid, uuid[], boolean[], double precision, integer, double precision);
CREATE OR REPLACE FUNCTION railhook_circuit_record_many(
    p_target uuid, p_kind text, p_tokens uuid[], p_healthy boolean[],
    p_window_s double precision, p_min_volume integer, p_ratio double precision
) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c record;
    probe integer;
    ok integer := coalesce(cardinality(array_positions(p_healthy, true)), 0);
    bad integer := coalesce(cardinality(array_positions(p_healthy, false)), 0);
    c_ok integer;
    c_bad integer;
BEGIN
    -- The common case in one statement (issue 30; it took four, every finalise batch): a
    -- closed circuit counts the batch's outcomes in its window. The UPDATE locks the row as
    -- the SELECT .. FOR UPDATE below does; a circuit without a row, or not closed, goes the
    -- long way.
    UPDATE circuits SET
        window_start = CASE WHEN window_start < now() - make_interval(secs => p_window_s) THEN now() ELSE window_start END,
        successes = CASE WHEN window_start < now() - make_interval(secs => p_window_s) THEN 0 ELSE successes END + ok,
        failures = CASE WHEN window_start < now() - make_interval(secs => p_window_s) THEN 0 ELSE failures END + bad
    WHERE target_id = p_target AND state = 'closed'
    RETURNING successes, failures INTO c_ok, c_bad;
    IF FOUND THEN
        IF p_min_volume > 0 AND c_ok + c_bad >= p_min_volume AND c_bad::double precision / (c_ok + c_bad) >= p_ratio THEN
            UPDATE circuits SET state = 'open', opened_at = now(), window_start = now(), successes = 0, failures = 0
            WHERE target_id = p_target;
            RETURN 'opened';
        END IF;
        RETURN NULL;
    END IF;
    INSERT INTO circuits (endpoint_id, destination_id)
    VALUES (CASE WHEN p_kind = 'endpoint' THEN p_target END, CASE WHEN p_kind = 'destination' THEN p_target END)
    ON CONFLICT (target_id) DO NOTHING;
    SELECT * INTO c FROM circuits WHERE target_id = p_target FOR UPDATE;
    IF c.state = 'half_open' THEN
        probe := array_position(p_tokens, c.probe_token);
        IF probe IS NULL THEN
            RETURN NULL;
        END IF;
        IF p_healthy[probe] THEN
            UPDATE circuits SET state = 'closed', window_start = now(), successes = 0, failures = 0,
                                opened_at = NULL, probe_token = NULL, probe_at = NULL
            WHERE target_id = p_target;
            RETURN 'closed';
        END IF;
        UPDATE circuits SET state = 'open', opened_at = now(), probe_token = NULL, probe_at = NULL WHERE target_id = p_target;
        RETURN 'reopened';
    END IF;
    IF c.state <> 'closed' THEN
        RETURN NULL;
    END IF;
    IF c.window_start < now() - make_interval(secs => p_window_s) THEN
        c.successes := 0;
        c.failures := 0;
        c.window_start := now();
    END IF;
    c.successes := c.successes + ok;
    c.failures := c.failures + bad;
    IF p_min_volume > 0 AND c.successes + c.failures >= p_min_volume
       AND c.failures::double precision / (c.successes + c.failures) >= p_ratio THEN
        UPDATE circuits SET state = 'open', opened_at = now(), window_start = now(), successes = 0, failures = 0
        WHERE target_id = p_target;
        RETURN 'opened';
    END IF;
    UPDATE circuits SET window_start = c.window_start, successes = c.successes, failures = c.failures WHERE target_id = p_target;
    RETURN NULL;
END
$$;

-- railhook_circuit_record_many for a batch in any order (the Forwards' finalise): each
-- target's outcomes in the batch's order, recorded once per target, targets in key order (so
-- two batches lock circuit rows in one order). One row per target with its change or NULL.
CREATE OR REPLACE FUNCTION railhook_circuit_record_batch(
    p_kind text, p_targets uuid[], p_tokens uuid[], p_healthy boolean[],
    p_window_s double precision, p_min_volume integer, p_ratio double precision
) RETURNS TABLE (target uuid, change text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t uuid;
    run_tokens uuid[];
    run_healthy boolean[];
BEGIN
    FOR t IN SELECT DISTINCT x FROM unnest(p_targets) AS x WHERE x IS NOT NULL ORDER BY x LOOP
        SELECT array_agg(u.tok ORDER BY u.n), array_agg(u.ok ORDER BY u.n) INTO run_tokens, run_healthy
        FROM unnest(p_targets, p_tokens, p_healthy) WITH ORDINALITY AS u(tgt, tok, ok, n) WHERE u.tgt = t;
        target := t;
        change := railhook_circuit_record_many(t, p_kind, run_tokens, run_healthy, p_window_s, p_min_volume, p_ratio);
        RETURN NEXT;
    END LOOP;
END
$$;
