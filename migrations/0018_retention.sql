-- Retention (issue 17): per-Project overrides of how long Events and Failed Messages are
-- kept, and the index a Delivery's delete needs.
--
-- The worker's retention job (crates/railhook-worker/src/retention.rs, its SQL in
-- railhook_store::retention) deletes Events (and Incoming Events) whose every Delivery (and
-- Forward) is final and older than `retention.events_days`, keeping a FAILED one
-- `retention.failed_days`. A Project may keep its data longer or shorter: NULL means the
-- configured default. Days, fractional allowed (0.25 = 6 hours). Set by SQL, e.g.
--   UPDATE projects SET retention_events_days = 7, retention_failed_days = 30 WHERE id = '...';
ALTER TABLE projects
    ADD COLUMN retention_events_days double precision CHECK (retention_events_days > 0),
    ADD COLUMN retention_failed_days double precision CHECK (retention_failed_days > 0);

-- deliveries.replay_of REFERENCES deliveries ON DELETE SET NULL: each deleted Delivery makes
-- Postgres run `UPDATE deliveries SET replay_of = NULL WHERE replay_of = $1`, a sequential
-- scan of the whole table without this index. Partial: almost every Delivery has none.
CREATE INDEX deliveries_replay_of_idx ON deliveries (replay_of) WHERE replay_of IS NOT NULL;
