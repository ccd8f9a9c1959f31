-- Replays (the Time Machine, issue 17): a background job that makes a *new* Delivery of
-- each stored Event in a time range to each chosen Endpoint whose Subscription matches now.
--
-- The job's state is its row: `cursor_created_at`/`cursor_event_id` is the last Event done
-- (events are walked in (created_at, id) order over events_project_created_idx), and `made`
-- counts the Deliveries made so far. A batch's Deliveries, their outbox rows and the cursor
-- move in one transaction, so a restart of any process resumes where the last commit left.
CREATE TABLE replays (
    id                 uuid PRIMARY KEY,
    project_id         uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    state              text NOT NULL DEFAULT 'running' CHECK (state IN ('running', 'completed', 'cancelled')),
    range_from         timestamptz NOT NULL,
    range_to           timestamptz NOT NULL CHECK (range_to > range_from),
    -- Subscription-style patterns; NULL: every type.
    event_types        text[],
    -- NULL: every Endpoint of the project.
    endpoint_ids       uuid[],
    -- The Deliveries it would make when it was created (the dry-run count); `made` may end
    -- below or above it when Subscriptions change while it runs.
    total              bigint NOT NULL,
    -- The count stopped at its cap: `total` is a lower bound.
    total_capped       boolean NOT NULL DEFAULT false,
    made               bigint NOT NULL DEFAULT 0,
    events_done        bigint NOT NULL DEFAULT 0,
    cursor_created_at  timestamptz NOT NULL,
    cursor_event_id    uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    finished_at        timestamptz
);
-- One running replay per Project (a second one is a 409).
CREATE UNIQUE INDEX replays_one_running_idx ON replays (project_id) WHERE state = 'running';
CREATE INDEX replays_project_idx ON replays (project_id, id);
-- The runner picks running replays; few rows.
CREATE INDEX replays_running_idx ON replays (created_at) WHERE state = 'running';

-- The Replay that made a Delivery. `replay_of` (0003) stays the link to the original
-- Delivery of the same Event and Endpoint when there is one; an Endpoint subscribed after
-- the Event was stored has none, so `replay_of` alone cannot tell a replayed row from an
-- original: the once index now excludes both.
ALTER TABLE deliveries ADD COLUMN replay_id uuid REFERENCES replays (id);
DROP INDEX deliveries_once_idx;
CREATE UNIQUE INDEX deliveries_once_idx ON deliveries (event_id, endpoint_id, subscription_id) WHERE replay_of IS NULL AND replay_id IS NULL;
-- Exactly once per (replay, event, endpoint), whatever restarts happen.
CREATE UNIQUE INDEX deliveries_replay_once_idx ON deliveries (replay_id, event_id, endpoint_id) WHERE replay_id IS NOT NULL;
