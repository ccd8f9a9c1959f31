-- The incoming direction: Sources receive provider webhooks, Destinations get Forwards.
CREATE TABLE sources (
    id             uuid PRIMARY KEY,
    project_id     uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name           text NOT NULL,
    provider       text NOT NULL,           -- stripe, github, shopify, standard_webhooks, ...
    secret         text NOT NULL,           -- the provider's signing secret
    ingress_token  text NOT NULL UNIQUE,    -- the unguessable part of the ingress URL
    enabled        boolean NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sources_project_idx ON sources (project_id, id);

CREATE TABLE destinations (
    id                     uuid PRIMARY KEY,
    project_id             uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    source_id              uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    url                    text NOT NULL,
    headers                jsonb NOT NULL DEFAULT '{}'::jsonb,
    enabled                boolean NOT NULL DEFAULT true,
    rate_limit_per_second  integer CHECK (rate_limit_per_second > 0),
    created_at             timestamptz NOT NULL DEFAULT now(),
    updated_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX destinations_source_idx ON destinations (source_id);

-- The request exactly as it arrived.
CREATE TABLE incoming_events (
    id                 uuid PRIMARY KEY,
    project_id         uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    source_id          uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    -- Duplicate window 2: a provider's resend carries the same provider event id.
    provider_event_id  text NOT NULL,
    method             text NOT NULL,
    headers            jsonb NOT NULL,
    body               bytea NOT NULL,
    received_at        timestamptz NOT NULL DEFAULT now(),
    UNIQUE (source_id, provider_event_id)
);

CREATE TABLE forwards (
    id                 uuid PRIMARY KEY,
    project_id         uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    incoming_event_id  uuid NOT NULL REFERENCES incoming_events (id) ON DELETE CASCADE,
    destination_id     uuid NOT NULL REFERENCES destinations (id) ON DELETE CASCADE,
    status             delivery_status NOT NULL DEFAULT 'PENDING',
    attempt_count      integer NOT NULL DEFAULT 0,
    max_attempts       integer NOT NULL,
    retry_delays       integer[] NOT NULL,
    timeout_seconds    integer NOT NULL,
    next_retry_at      timestamptz,
    claim_token        uuid,
    claimed_at         timestamptz,
    last_error         text,
    last_announced_at  timestamptz NOT NULL DEFAULT now(),
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now(),
    completed_at       timestamptz,
    UNIQUE (incoming_event_id, destination_id)
);
CREATE INDEX forwards_due_idx ON forwards (next_retry_at) WHERE status = 'PENDING';
CREATE INDEX forwards_processing_idx ON forwards (claimed_at) WHERE status = 'PROCESSING';
