-- Fewer index entries per Delivery (issue 20). Every claim (PENDING -> PROCESSING) is a
-- non-HOT update (status is in the partial indexes' predicates), so it adds an entry to every
-- index whose predicate the new row matches; the ingest adds one to every outbox index.
--
-- - The three PROCESSING partial indexes become one. The claim's counts name the project
--   (and, for the Endpoint's count, the project and the Endpoint), so both are range scans
--   of it; the stuck sweep reads the whole PROCESSING set, which is bounded by the workers'
--   in-flight limits (a few thousand rows at most).
-- - The poller's index (outbox_poll_idx) is dropped: in CDC mode poll_status never leaves
--   PENDING, so every announcement paid an index entry for nothing. `railhook relay` in poll
--   mode creates it when it starts (railhook_relay::poll::ensure_index).
DROP INDEX IF EXISTS deliveries_processing_endpoint_idx;
DROP INDEX IF EXISTS deliveries_processing_project_idx;
DROP INDEX IF EXISTS deliveries_processing_idx;
CREATE INDEX deliveries_processing_idx ON deliveries (project_id, endpoint_id) WHERE status = 'PROCESSING';
DROP INDEX IF EXISTS outbox_poll_idx;
