-- The incoming direction as the Sources API and the ingress use it (issue 16), on the tables
-- of 0004.

-- A Source's provider configuration (only generic_hmac has one; NULL for the others) and
-- its rate at the ingress (requests per second; NULL: unlimited). `sources.secret` stays the
-- current secret.
ALTER TABLE sources
    ADD COLUMN config jsonb,
    ADD COLUMN rate_limit_per_second integer CHECK (rate_limit_per_second > 0);

-- Secrets rotated out of `sources.secret`: the ingress still accepts each until its
-- `expires_at` (ingress.secret_overlap_seconds after the rotation), so requests the provider
-- signed before the switch still verify. Expired rows are ignored, and deleted by the next
-- rotation of the same Source.
CREATE TABLE source_retired_secrets (
    id          uuid PRIMARY KEY,
    source_id   uuid NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    secret      text NOT NULL,
    expires_at  timestamptz NOT NULL
);
CREATE INDEX source_retired_secrets_source_idx ON source_retired_secrets (source_id, expires_at);

-- How Railhook authenticates to a Destination: {"type": "none"}, {"type": "basic",
-- "username", "password"}, {"type": "bearer", "token"}, {"type": "header", "name", "value"}
-- or {"type": "standard_webhooks", "secret"} (re-signed with the Destination's own secret).
ALTER TABLE destinations
    ADD COLUMN auth jsonb NOT NULL DEFAULT '{"type": "none"}'::jsonb
        CHECK (auth->>'type' IN ('none', 'basic', 'bearer', 'header', 'standard_webhooks'));
CREATE INDEX destinations_project_source_idx ON destinations (project_id, source_id, id);

-- The request as it arrived: a provider without event ids (or a request lacking one) is
-- stored without dedupe, so the id may be NULL (the unique key (source_id, provider_event_id)
-- treats NULLs as distinct). The body's SHA-256 is computed by Postgres from the very bytes
-- stored; the content type is the request's header, whatever it says.
ALTER TABLE incoming_events
    ALTER COLUMN provider_event_id DROP NOT NULL,
    ADD COLUMN body_sha256 bytea GENERATED ALWAYS AS (sha256(body)) STORED,
    ADD COLUMN content_type text;
CREATE INDEX incoming_events_project_idx ON incoming_events (project_id, id);
CREATE INDEX incoming_events_source_idx ON incoming_events (source_id, id);
