-- Tenancy: organizations hold projects; a project holds endpoints, sources and API keys.
CREATE TABLE organizations (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE projects (
    id               uuid PRIMARY KEY,
    organization_id  uuid NOT NULL REFERENCES organizations (id) ON DELETE CASCADE,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX projects_organization_idx ON projects (organization_id, id);

-- API keys are random and shown once; only their SHA-256 is stored, so a leaked database
-- yields no usable key. `display_prefix` lets a person recognise a key in a list.
CREATE TABLE api_keys (
    id              uuid PRIMARY KEY,
    project_id      uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name            text NOT NULL DEFAULT '',
    display_prefix  text NOT NULL,
    secret_sha256   bytea NOT NULL UNIQUE,
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_used_at    timestamptz,
    revoked_at      timestamptz
);
CREATE INDEX api_keys_project_idx ON api_keys (project_id, id);
