-- Ordered delivery per Endpoint (DESIGN.md 6.5). Sequence numbers are handed out by the
-- ingest (endpoints.last_sequence, under the endpoint row's lock, so in commit order and
-- never burned by a rollback). What this adds:
-- (deliveries.parked_at, from 0003, is when the Ordering Buffer first parked a Delivery; the
-- gap timeout counts from it.)
-- - endpoint_ordering: the Endpoint's cursor, the highest Sequence Number resolved (SUCCESS or
--   Failed Messages); it only moves forward. A table of its own so the finalise does not
--   contend with the ingest for the endpoints row.
CREATE TABLE endpoint_ordering (
    endpoint_id  uuid PRIMARY KEY REFERENCES endpoints (id) ON DELETE CASCADE,
    cursor       bigint NOT NULL DEFAULT 0,
    advanced_at  timestamptz NOT NULL DEFAULT now()
);
