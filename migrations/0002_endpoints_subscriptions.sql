-- Endpoints, their signing secrets, and Subscriptions.
CREATE TABLE endpoints (
    id                     uuid PRIMARY KEY,
    project_id             uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    url                    text NOT NULL,
    description            text NOT NULL DEFAULT '',
    enabled                boolean NOT NULL DEFAULT true,
    rate_limit_per_second  integer CHECK (rate_limit_per_second > 0),
    headers                jsonb NOT NULL DEFAULT '{}'::jsonb,
    -- Ordering: the last sequence number handed out. Incremented inside the ingest
    -- transaction, so numbers follow commit order and a rollback burns none.
    last_sequence          bigint NOT NULL DEFAULT 0,
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX endpoints_project_idx ON endpoints (project_id, id);

-- The current secret has expires_at NULL. A rotation sets the previous one's expires_at to
-- now() + grace; until then deliveries carry one signature per unexpired secret.
CREATE TABLE endpoint_secrets (
    id           uuid PRIMARY KEY,
    endpoint_id  uuid NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    secret       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz
);
CREATE INDEX endpoint_secrets_endpoint_idx ON endpoint_secrets (endpoint_id, created_at);
CREATE UNIQUE INDEX endpoint_secrets_one_current ON endpoint_secrets (endpoint_id) WHERE expires_at IS NULL;

-- Event type patterns: an exact type (`order.paid`), one trailing segment wildcard
-- (`order.*`), a trailing any-depth wildcard (`order.**`) or everything (`**`). Ingest
-- computes the few patterns that can match a type and looks them up with the index below.
CREATE TABLE subscriptions (
    id                  uuid PRIMARY KEY,
    project_id          uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    endpoint_id         uuid NOT NULL REFERENCES endpoints (id) ON DELETE CASCADE,
    event_type_pattern  text NOT NULL,
    ordering            boolean NOT NULL DEFAULT false,
    max_attempts        smallint NOT NULL DEFAULT 7 CHECK (max_attempts BETWEEN 1 AND 20),
    timeout_seconds     smallint NOT NULL DEFAULT 30 CHECK (timeout_seconds BETWEEN 1 AND 60),
    -- NULL: the default outgoing ladder.
    retry_delays        integer[],
    enabled             boolean NOT NULL DEFAULT true,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX subscriptions_match_idx ON subscriptions (project_id, event_type_pattern) WHERE enabled;
CREATE INDEX subscriptions_project_idx ON subscriptions (project_id, id);
CREATE INDEX subscriptions_endpoint_idx ON subscriptions (endpoint_id);
