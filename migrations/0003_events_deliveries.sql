-- Events, Deliveries and Attempts of the outgoing direction.
CREATE TYPE delivery_status AS ENUM ('PENDING', 'PROCESSING', 'SUCCESS', 'FAILED');

CREATE TABLE events (
    id               uuid PRIMARY KEY,
    project_id       uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    event_type       text NOT NULL,
    payload          jsonb NOT NULL,
    -- Duplicate window 1: a client's retry of the same POST. Unique per project.
    idempotency_key  text,
    -- SHA-256 of the request's type and payload: the same key with another body is a 409.
    request_sha256   bytea,
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX events_idempotency_key_idx ON events (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_project_created_idx ON events (project_id, created_at, id);
CREATE INDEX events_project_type_idx ON events (project_id, event_type, created_at);

CREATE TABLE deliveries (
    id               uuid PRIMARY KEY,
    project_id       uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    event_id         uuid NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    endpoint_id      uuid NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    subscription_id  uuid REFERENCES subscriptions (id) ON DELETE SET NULL,
    status           delivery_status NOT NULL DEFAULT 'PENDING',
    -- The ladder, copied from the Subscription when the Delivery is created, so editing a
    -- Subscription never changes Deliveries in flight.
    attempt_count    integer NOT NULL DEFAULT 0,
    max_attempts     integer NOT NULL,
    retry_delays     integer[] NOT NULL,
    timeout_seconds  integer NOT NULL,
    next_retry_at    timestamptz,
    -- The Claim: every write that matters is conditional on still holding this token.
    claim_token      uuid,
    claimed_at       timestamptz,
    -- Ordering (opt-in per Subscription): endpoint-scoped, in commit order.
    sequence_number  bigint,
    parked_at        timestamptz,
    -- Replay (Time Machine): a new Delivery built from a stored Event.
    replay_of        uuid REFERENCES deliveries (id) ON DELETE SET NULL,
    last_error       text,
    last_announced_at timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz
);
-- One Delivery per (event, endpoint, subscription); replays are extra rows.
CREATE UNIQUE INDEX deliveries_once_idx ON deliveries (event_id, endpoint_id, subscription_id) WHERE replay_of IS NULL;
CREATE INDEX deliveries_event_idx ON deliveries (event_id);
CREATE INDEX deliveries_due_idx ON deliveries (next_retry_at) WHERE status = 'PENDING';
CREATE INDEX deliveries_processing_idx ON deliveries (claimed_at) WHERE status = 'PROCESSING';
CREATE INDEX deliveries_failed_idx ON deliveries (project_id, completed_at) WHERE status = 'FAILED';
CREATE INDEX deliveries_project_idx ON deliveries (project_id, created_at, id);
CREATE INDEX deliveries_sequence_idx ON deliveries (endpoint_id, sequence_number) WHERE sequence_number IS NOT NULL;
