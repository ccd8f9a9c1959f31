-- The hot tables keep no foreign key to `projects` (issue 30). Every ingest took FOR KEY SHARE
-- on the one `projects` row for `events` and for `deliveries`, and every finalise once more
-- for each Attempt: three row locks per Delivery on a row every writer of the Project shares,
-- so under concurrency each lock made a new MultiXact (copying the lockers' list, a WAL
-- record each) and waited on the row's buffer lock (`LWLock:BufferContent` in
-- pg_stat_activity). Measured by pg_stat_statements over a hot_endpoint run (10,000 Events
-- plus 700/s for 20 s): the key checks 87 us of wall time per Delivery, and the finalise's
-- `INSERT INTO attempts` 383 us per Attempt (mean 5.7 ms per batch, stddev 10.6 ms, max
-- 178 ms: waits), docs/BENCHMARKS.md "Issue 30".
--
-- Nothing relied on the cascades: `railhook admin project erase` deletes a Project's rows
-- table by table in bounded batches (Events, Deliveries, Attempts by project_id) before the
-- `projects` row (crates/railhook/src/project_data.rs), and no other path deletes a
-- Project. What a `DELETE FROM projects` by hand would now leave behind (that Project's
-- Events, Deliveries and Attempts) is out of every API's reach, which looks rows up by
-- project, and is taken by retention (Events, Deliveries) and the daily partition drop
-- (Attempts). The keys from `deliveries` to `endpoints` and `events` stay (an Endpoint's
-- delete takes its history in batches first: railhook_store::deletion, migration 0027).
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_project_id_fkey;
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_project_id_fkey;
ALTER TABLE attempts DROP CONSTRAINT IF EXISTS attempts_project_id_fkey;
