-- Announcements (DESIGN.md 5, issue 30): how every statement that makes work for the worker
-- announces it, in its own transaction. A repeatable migration like rules.sql: applied again
-- whenever this file changes.
--
-- railhook_announce(kind, projects, ids, routing, reason, tokens) announces one statement's
-- Deliveries (kind 'd', routed by Endpoint) or Forwards (kind 'f', routed by Destination),
-- one reason for all, the scheduler's tokens on the retry path (NULL otherwise), the arrays
-- aligned. It returns how many it announced. By `railhook_announce_via` (migration 0030):
-- - 'message': ONE transactional logical decoding message for the whole statement, prefix
--   'railhook.announce.v1', one line per announcement: `<kind> <id> <routing> <reason>`
--   and ` <token>` when there is one, then ` tp=<traceparent>` and ` ts=<tracestate>` when there are (uuids in their hyphenated text form). Decoded by
--   pgoutput (`messages 'true'`) inside the transaction, so the relay announces it at the
--   commit and never for a rollback, exactly as it would an outbox insert
--   (railhook_kafka::announcement::Announcement::parse_message reads it);
-- - 'outbox': one outbox row per announcement (the polling relay's table).
-- Callers reference its result in their query (a CTE that calls it, joined in), so it runs
-- once per statement, after the rows it announces were written.
-- Issue 33: p_traceparents and p_tracestates, aligned with the ids like the tokens, carry
-- each announcement's W3C trace context (NULL where there is none): ` tp=<traceparent>` and
-- ` ts=<tracestate>` at the end of its line, or the outbox row's two columns (migration 0033).
-- The six-argument form before it is dropped (a changed signature, see rules.sql).
DROP FUNCTION IF EXISTS railhook_announce("char", uuid[], uuid[], uuid[], text, uuid[]);
CREATE OR REPLACE FUNCTION railhook_announce(
    p_kind "char", p_projects uuid[], p_ids uuid[], p_routing uuid[], p_reason text, p_tokens uuid[] DEFAULT NULL,
    p_traceparents text[] DEFAULT NULL, p_tracestates text[] DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF coalesce(cardinality(p_ids), 0) = 0 THEN
        RETURN 0;
    END IF;
    IF p_kind NOT IN ('d', 'f') THEN
        RAISE EXCEPTION 'railhook_announce: kind %, expected d or f', p_kind;
    END IF;
    -- Deliveries announced without a trace context by their caller (the retry scheduler,
    -- the sweeps, the relay's re-announcement, a person's retry) carry their Event's, so
    -- every Attempt is in the Event's trace (issue 33): two primary-key reads per
    -- announcement, off the ingest's path (the ingest passes its context). Deliveries made by
    -- the calling statement itself are not visible to this lookup: such a caller (a Replay's
    -- batch) passes its Events' context; Forwards likewise, their Incoming Event's.
    IF p_kind = 'd' AND p_traceparents IS NULL THEN
        SELECT array_agg(e.traceparent ORDER BY u.n), array_agg(e.tracestate ORDER BY u.n)
          INTO p_traceparents, p_tracestates
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
        LEFT JOIN deliveries d ON d.id = u.id
        LEFT JOIN events e ON e.id = d.event_id;
    ELSIF p_kind = 'f' AND p_traceparents IS NULL THEN
        -- The same for a Forward: its Incoming Event's context (migration 0034).
        SELECT array_agg(ie.traceparent ORDER BY u.n), array_agg(ie.tracestate ORDER BY u.n)
          INTO p_traceparents, p_tracestates
        FROM unnest(p_ids) WITH ORDINALITY AS u(id, n)
        LEFT JOIN forwards f ON f.id = u.id
        LEFT JOIN incoming_events ie ON ie.id = f.incoming_event_id;
    END IF;
    IF (SELECT via FROM railhook_announce_via) = 'message' THEN
        PERFORM pg_logical_emit_message(true, 'railhook.announce.v1',
            (SELECT string_agg(concat_ws(' ', p_kind, u.id, u.routing, p_reason, u.token, 'tp=' || u.tp, 'ts=' || u.ts), E'\n' ORDER BY u.n)
             FROM unnest(p_ids, p_routing, p_tokens, p_traceparents, p_tracestates) WITH ORDINALITY AS u(id, routing, token, tp, ts, n)));
    ELSIF p_kind = 'd' THEN
        INSERT INTO outbox (project_id, delivery_id, routing_id, reason, claim_token, traceparent, tracestate)
        SELECT u.project, u.id, u.routing, p_reason, u.token, u.tp, u.ts
        FROM unnest(p_projects, p_ids, p_routing, p_tokens, p_traceparents, p_tracestates) WITH ORDINALITY AS u(project, id, routing, token, tp, ts, n) ORDER BY u.n;
    ELSE
        INSERT INTO outbox (project_id, forward_id, routing_id, reason, claim_token, traceparent, tracestate)
        SELECT u.project, u.id, u.routing, p_reason, u.token, u.tp, u.ts
        FROM unnest(p_projects, p_ids, p_routing, p_tokens, p_traceparents, p_tracestates) WITH ORDINALITY AS u(project, id, routing, token, tp, ts, n) ORDER BY u.n;
    END IF;
    RETURN cardinality(p_ids);
END $$;
