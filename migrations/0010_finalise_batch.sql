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
