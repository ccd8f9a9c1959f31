-- Two changes: finalises in batches (railhook_finalise_batch), and concurrency deferrals of
-- 50-150 ms instead of 1 s (railhook_claim_batch replaced, at the end).
--
-- Finalises in batches: one statement and one commit for many Attempts instead of one each
-- (the e2e benchmark spent its Postgres time on per-Attempt statements and WAL flushes).
-- Element i of every array belongs to the same Attempt. For each, as the single-Attempt
-- finalise did: the Attempt is inserted whatever happens to the fence (every Attempt is on
-- record); the Delivery changes only while the Claim (p_tokens[i]) still holds it; and only
-- then is the outcome recorded in the endpoint's circuit. The caller sorts the batch by
-- endpoint, so finalise batches lock circuit rows in one order (no deadlock between two
-- workers' finalises) and one endpoint's outcomes are counted in their order. (A claim batch
-- that starts two half-open probes updates their circuit rows in its own order; a deadlock
-- with a finalise is then possible, rare, and ended by Postgres after deadlock_timeout: the
-- losing batch fails and its requests are made again one by one.)
-- An Attempt whose Delivery is gone (deleted with its endpoint while the request was in
-- flight) is not inserted: its row would have been deleted with the Delivery. The Attempt id
-- comes from the caller, so a finalise made again after a lost reply inserts nothing twice.
-- Returns one row per element: its 1-based index, whether the fence held, and the circuit's
-- state change (railhook_circuit_record) or NULL.
CREATE FUNCTION railhook_finalise_batch(
    p_deliveries uuid[], p_tokens uuid[], p_statuses text[], p_retry_at timestamptz[], p_last_errors text[],
    p_attempt_ids uuid[], p_projects uuid[], p_numbers integer[], p_started timestamptz[], p_durations integer[],
    p_codes integer[], p_results text[], p_errors text[], p_headers jsonb[], p_bodies text[], p_truncated boolean[],
    p_endpoints uuid[], p_healthy boolean[],
    p_window_s double precision, p_min_volume integer, p_ratio double precision
) RETURNS TABLE (idx integer, wrote boolean, circuit text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    fenced integer[];
    n integer := coalesce(cardinality(p_deliveries), 0);
BEGIN
    IF n <> coalesce(cardinality(p_tokens), 0) OR n <> coalesce(cardinality(p_attempt_ids), 0)
       OR n <> coalesce(cardinality(p_endpoints), 0) OR n <> coalesce(cardinality(p_healthy), 0)
       OR n <> coalesce(cardinality(p_bodies), 0) THEN
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
        RETURNING i.n
    )
    SELECT coalesce(array_agg(done.n::integer), '{}') INTO fenced FROM done;

    INSERT INTO attempts (id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code,
                          result, error_message, response_headers, response_body, response_truncated)
    SELECT u.* FROM unnest(p_attempt_ids, p_projects, p_deliveries, p_numbers, p_started, p_durations, p_codes,
                           p_results, p_errors, p_headers, p_bodies, p_truncated)
        AS u(id, project_id, delivery_id, attempt_number, started_at, duration_ms, status_code,
             result, error_message, response_headers, response_body, response_truncated)
    WHERE EXISTS (SELECT 1 FROM deliveries d WHERE d.id = u.delivery_id)
    ON CONFLICT (id) DO NOTHING;

    FOR i IN 1 .. n LOOP
        idx := i;
        wrote := i = ANY (fenced);
        circuit := CASE WHEN wrote
            THEN railhook_circuit_record(p_endpoints[i], p_tokens[i], p_healthy[i], p_window_s, p_min_volume, p_ratio)
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

-- Concurrency deferrals wait 50-150 ms instead of 1 s. A claim over the endpoint's or the
-- project's concurrency waits for a slot, which frees as soon as an Attempt in flight
-- finishes. The worker holding the hint claims it again every 150 ms, up to six times
-- (runner.rs, BUSY_RETRY_MS); the retry scheduler may take the due row first, which is as good.
-- With 1 s, a stall of 50 ms at 200 events/s to one endpoint (concurrency 10) cost the
-- deferred Deliveries 1.3 s or more each (docs/BENCHMARKS.md, e2e light rate). The rest of
-- the function is 0009's, unchanged.
CREATE OR REPLACE FUNCTION railhook_claim_batch(
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
                defer_until := now() + make_interval(secs => 0.05 + random() * 0.1);
            END IF;
        END IF;
        IF reason IS NULL AND p_project_concurrency > 0 THEN
            SELECT count(*) INTO n FROM deliveries WHERE project_id = d.project_id AND status = 'PROCESSING';
            IF n >= p_project_concurrency THEN
                reason := 'project_concurrency';
                defer_until := now() + make_interval(secs => 0.05 + random() * 0.1);
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
