-- Claims in batches. railhook_claim (0008) holds the project's advisory lock until its
-- transaction commits, WAL flush included, so every claim of a project waited for the one
-- before it: about 350 claims/s per project on a 2-core machine, whatever the number of
-- workers (the e2e benchmark, docs/BENCHMARKS.md). railhook_claim_batch decides many claims
-- under one acquisition of the locks and one commit; each claim is decided exactly as a
-- claim on its own would be, in the order given, so a later claim of the batch sees the
-- earlier ones (counts, rate windows, the half-open probe).
--
-- Locks: every project lock of the batch in key order, then every endpoint lock in key
-- order. railhook_claim took one project lock and then one endpoint lock, which is the same
-- total order, so batches and single claims cannot deadlock.
--
-- A row is claimed (or deferred) only if, after the locks, it is still PENDING, due, and
-- carries the hint's token: a concurrent claim of the same Delivery that won the locks first
-- makes this one 'none' instead of being overwritten (0008 re-read nothing after its locks).
--
-- Outcomes per claim: 'claimed', 'none' (done, not due, another token), 'missing' (the row
-- is not visible: see below), or the Deferral's reason.

CREATE FUNCTION railhook_claim_batch(
    p_deliveries uuid[], p_tokens uuid[], p_hints uuid[],
    p_endpoint_concurrency integer, p_project_concurrency integer, p_project_rate integer,
    p_circuit_cooldown_s double precision, p_probe_timeout_s double precision
) RETURNS TABLE (idx integer, outcome text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k bigint;
    i integer;
    d record;
    c_state text;
    c_opened timestamptz;
    c_probe timestamptz;
    ep_rate integer;
    n integer;
    defer_until timestamptz;
    reason text;
BEGIN
    IF cardinality(p_deliveries) IS DISTINCT FROM cardinality(p_tokens)
       OR cardinality(p_deliveries) IS DISTINCT FROM cardinality(p_hints) THEN
        RAISE EXCEPTION 'railhook_claim_batch: % deliveries, % tokens, % hints',
            cardinality(p_deliveries), cardinality(p_tokens), cardinality(p_hints);
    END IF;
    IF coalesce(cardinality(p_deliveries), 0) = 0 THEN
        RETURN;
    END IF;

    -- The locks, in the one total order: projects by key, then endpoints by key.
    FOR k IN
        SELECT DISTINCT hashtextextended(dl.project_id::text, 7061) AS key
        FROM deliveries dl WHERE dl.id = ANY (p_deliveries) AND dl.status = 'PENDING'
        ORDER BY key
    LOOP
        PERFORM pg_advisory_xact_lock(k);
    END LOOP;
    FOR k IN
        SELECT DISTINCT hashtextextended(dl.endpoint_id::text, 6570) AS key
        FROM deliveries dl WHERE dl.id = ANY (p_deliveries) AND dl.status = 'PENDING'
        ORDER BY key
    LOOP
        PERFORM pg_advisory_xact_lock(k);
    END LOOP;

    FOR i IN 1 .. cardinality(p_deliveries) LOOP
        reason := NULL;
        defer_until := NULL;
        ep_rate := NULL;
        -- A fresh snapshot (VOLATILE, READ COMMITTED): sees every claim committed before the
        -- locks were granted and the earlier claims of this batch.
        SELECT dl.id, dl.project_id, dl.endpoint_id INTO d FROM deliveries dl
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
            idx := i;
            outcome := CASE WHEN EXISTS (
                SELECT 1 FROM deliveries dl WHERE dl.id = p_deliveries[i]
                  AND NOT (dl.status = 'PENDING'
                           AND (dl.next_retry_at IS NULL OR dl.next_retry_at <= now())
                           AND dl.claim_token IS NOT DISTINCT FROM p_hints[i]))
              THEN 'none' ELSE 'missing' END;
            RETURN NEXT;
            CONTINUE;
        END IF;
        -- Taken above unless the row became PENDING after that (a release in between):
        -- then here, after the others. Re-acquiring a held lock is a no-op.
        PERFORM pg_advisory_xact_lock(hashtextextended(d.project_id::text, 7061));
        PERFORM pg_advisory_xact_lock(hashtextextended(d.endpoint_id::text, 6570));

        -- The circuit.
        c_state := NULL;
        SELECT state, opened_at, probe_at INTO c_state, c_opened, c_probe FROM endpoint_circuits WHERE endpoint_id = d.endpoint_id;
        IF c_state = 'open' THEN
            IF now() < c_opened + make_interval(secs => p_circuit_cooldown_s) THEN
                reason := 'circuit_open';
                defer_until := c_opened + make_interval(secs => p_circuit_cooldown_s);
            END IF;
        ELSIF c_state = 'half_open' AND c_probe > now() - make_interval(secs => p_probe_timeout_s) THEN
            reason := 'circuit_half_open';
            defer_until := now() + interval '1 second';
        END IF;

        -- Concurrency.
        IF reason IS NULL AND p_endpoint_concurrency > 0 THEN
            SELECT count(*) INTO n FROM deliveries WHERE endpoint_id = d.endpoint_id AND status = 'PROCESSING';
            IF n >= p_endpoint_concurrency THEN
                reason := 'endpoint_concurrency';
                defer_until := now() + interval '1 second';
            END IF;
        END IF;
        IF reason IS NULL AND p_project_concurrency > 0 THEN
            SELECT count(*) INTO n FROM deliveries WHERE project_id = d.project_id AND status = 'PROCESSING';
            IF n >= p_project_concurrency THEN
                reason := 'project_concurrency';
                defer_until := now() + interval '1 second';
            END IF;
        END IF;

        -- Rates: fixed one-second windows.
        IF reason IS NULL THEN
            SELECT rate_limit_per_second INTO ep_rate FROM endpoints WHERE id = d.endpoint_id;
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

        IF reason IS NOT NULL THEN
            -- The Deferral: no Attempt, no Claim; the scheduler announces it again when due.
            UPDATE deliveries SET next_retry_at = defer_until, claim_token = NULL, updated_at = now()
            WHERE id = d.id AND status = 'PENDING' AND claim_token IS NOT DISTINCT FROM p_hints[i];
            idx := i; outcome := CASE WHEN FOUND THEN reason ELSE 'none' END; RETURN NEXT;
            CONTINUE;
        END IF;

        -- Conditional like every other write: the retry scheduler takes PENDING rows without
        -- these locks, and a row it took since the SELECT above is its, not this claim's.
        UPDATE deliveries SET status = 'PROCESSING', claim_token = p_tokens[i], claimed_at = now(), updated_at = now()
        WHERE id = d.id AND status = 'PENDING' AND claim_token IS NOT DISTINCT FROM p_hints[i];
        IF NOT FOUND THEN
            idx := i; outcome := 'none'; RETURN NEXT;
            CONTINUE;
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
        IF c_state = 'open' THEN
            -- Cool-down over: this claim is the half-open probe.
            UPDATE endpoint_circuits SET state = 'half_open', probe_token = p_tokens[i], probe_at = now() WHERE endpoint_id = d.endpoint_id;
        ELSIF c_state = 'half_open' THEN
            UPDATE endpoint_circuits SET probe_token = p_tokens[i], probe_at = now() WHERE endpoint_id = d.endpoint_id;
        END IF;
        idx := i; outcome := 'claimed'; RETURN NEXT;
    END LOOP;
END
$$;

-- The single claim is a batch of one now: one definition of the rules.
CREATE OR REPLACE FUNCTION railhook_claim(
    p_delivery uuid, p_token uuid, p_hint uuid,
    p_endpoint_concurrency integer, p_project_concurrency integer, p_project_rate integer,
    p_circuit_cooldown_s double precision, p_probe_timeout_s double precision
) RETURNS text
LANGUAGE sql VOLATILE AS $$
    SELECT outcome FROM railhook_claim_batch(ARRAY[p_delivery], ARRAY[p_token], ARRAY[p_hint],
        p_endpoint_concurrency, p_project_concurrency, p_project_rate, p_circuit_cooldown_s, p_probe_timeout_s);
$$;
