-- Manual retry of Failed Messages, and the start of the Retry Ladder it restarts.

-- When the current Retry Ladder started: the creation of the Delivery (or Forward), or the
-- last manual retry. The worker measures the hard caps (96 h outgoing, 24 h incoming,
-- DESIGN.md 6.3) from this column, not from created_at, so a Failed Message that a person
-- retries gets a fresh window instead of going straight back to Failed Messages.
-- The default fills existing rows with the time of this migration, which is no earlier
-- than their creation: at worst they get a longer window once.
ALTER TABLE deliveries ADD COLUMN ladder_started_at timestamptz NOT NULL DEFAULT now();
ALTER TABLE forwards ADD COLUMN ladder_started_at timestamptz NOT NULL DEFAULT now();

-- Failed Messages are listed, and retried by filter, in id order (the order of every list).
-- deliveries_failed_idx (project_id, completed_at) serves the completed_at ranges; this one
-- serves the plain listing and its cursor without sorting a project's whole backlog. Both
-- are partial, so only rows entering or leaving FAILED maintain them.
CREATE INDEX deliveries_failed_id_idx ON deliveries (project_id, id) WHERE status = 'FAILED';
