-- How a statement that makes work announces it (issue 30): one outbox row per announcement
-- (the polling relay reads the table; every relay before this migration read inserts), or
-- one transactional logical decoding message per statement (prefix 'railhook.announce.v1'),
-- which the CDC relay decodes from the slot with the commit, at a fraction of the cost: no
-- heap tuple, no index entries, nothing for the relay's retention to delete later.
--
-- The relay that runs decides, because only it knows what it reads: the CDC relay sets
-- 'message' once its stream is live, the polling relay sets 'outbox' when it starts (and
-- re-announces what was announced by message while no CDC relay ran). 'outbox' until a
-- relay says otherwise, which every relay understands (the CDC relay still streams outbox
-- inserts: a process of the previous build keeps working during a rolling upgrade).
-- `railhook_announce` (lifecycle/announce.sql) reads it once per statement.
CREATE TABLE railhook_announce_via (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    via        text NOT NULL CHECK (via IN ('outbox', 'message')),
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO railhook_announce_via (via) VALUES ('outbox');
