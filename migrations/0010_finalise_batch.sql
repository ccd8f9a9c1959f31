-- Finalises in batches: one statement and one commit for many Attempts instead of one each
-- (the e2e benchmark spent its Postgres time on per-Attempt statements and WAL flushes).
-- Element i of every array belongs to the same Attempt. For each, as the single-Attempt
-- finalise did: the Attempt is inserted whatever happens to the fence (every Attempt is on
-- record); the Delivery changes only while the Claim (p_tokens[i]) still holds it; and only
-- then is the outcome recorded in the endpoint's circuit. The caller sorts the batch by
-- endpoint, so the circuit rows are locked in one order by every batch (no deadlock between
-- two workers' batches) and one endpoint's outcomes are counted in their order.
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
BEGIN
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
    SELECT * FROM unnest(p_attempt_ids, p_projects, p_deliveries, p_numbers, p_started, p_durations, p_codes,
                         p_results, p_errors, p_headers, p_bodies, p_truncated);

    FOR i IN 1 .. coalesce(cardinality(p_deliveries), 0) LOOP
        idx := i;
        wrote := i = ANY (fenced);
        circuit := CASE WHEN wrote
            THEN railhook_circuit_record(p_endpoints[i], p_tokens[i], p_healthy[i], p_window_s, p_min_volume, p_ratio)
        END;
        RETURN NEXT;
    END LOOP;
END
$$;
