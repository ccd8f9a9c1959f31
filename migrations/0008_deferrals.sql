-- Deferrals (DESIGN.md 6.4): concurrency and rate limits per endpoint and per project, and a
-- circuit breaker per endpoint. They live in Postgres so they hold across worker processes:
-- a claim takes the project's and then the endpoint's advisory lock (always in that order),
-- so the counts it reads cannot be raced by another claim of the same endpoint or project.

-- Fixed one-second windows of claims, per endpoint and per project.
CREATE TABLE claim_rates (
    kind          text NOT NULL CHECK (kind IN ('endpoint', 'project')),
    id            uuid NOT NULL,
    window_start  timestamptz NOT NULL,
    used          integer NOT NULL,
    PRIMARY KEY (kind, id)
);

-- The circuit of an endpoint: closed (normal), open (every claim deferred until
-- opened_at + cool-down), half_open (one probe Attempt; its outcome closes or reopens it).
CREATE TABLE endpoint_circuits (
    endpoint_id   uuid PRIMARY KEY REFERENCES endpoints (id) ON DELETE CASCADE,
    state         text NOT NULL DEFAULT 'closed' CHECK (state IN ('closed', 'open', 'half_open')),
    window_start  timestamptz NOT NULL DEFAULT now(),
    successes     integer NOT NULL DEFAULT 0,
    failures      integer NOT NULL DEFAULT 0,
    opened_at     timestamptz,
    probe_token   uuid,
    probe_at      timestamptz
);

CREATE INDEX deliveries_processing_endpoint_idx ON deliveries (endpoint_id) WHERE status = 'PROCESSING';
CREATE INDEX deliveries_processing_project_idx ON deliveries (project_id) WHERE status = 'PROCESSING';

-- One claim (6.1) with its admission checks, in one round trip. Returns 'claimed' (the row is
-- PROCESSING under p_token), 'none' (nothing to claim: done, not due, or another token), or
-- the Deferral's reason, in which case the Delivery stays PENDING with next_retry_at set to
-- when it may try again (the retry scheduler announces it then) and no Attempt is spent.
-- Limits of 0 or less mean unlimited. Each statement takes a fresh snapshot (VOLATILE,
-- READ COMMITTED), so counts read after the locks see every earlier claim.
CREATE FUNCTION railhook_claim(
    p_delivery uuid, p_token uuid, p_hint uuid,
    p_endpoint_concurrency integer, p_project_concurrency integer, p_project_rate integer,
    p_circuit_cooldown_s double precision, p_probe_timeout_s double precision
) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    d record;
    c_state text;
    c_opened timestamptz;
    c_probe timestamptz;
    ep_rate integer;
    n integer;
    defer_until timestamptz;
    reason text;
BEGIN
    SELECT id, project_id, endpoint_id INTO d FROM deliveries
    WHERE id = p_delivery AND status = 'PENDING'
      AND (next_retry_at IS NULL OR next_retry_at <= now())
      AND claim_token IS NOT DISTINCT FROM p_hint;
    IF NOT FOUND THEN
        RETURN 'none';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(d.project_id::text, 7061));
    PERFORM pg_advisory_xact_lock(hashtextextended(d.endpoint_id::text, 6570));

    -- The circuit.
    SELECT state, opened_at, probe_at INTO c_state, c_opened, c_probe FROM endpoint_circuits WHERE endpoint_id = d.endpoint_id;
    IF c_state = 'open' THEN
        IF now() < c_opened + make_interval(secs => p_circuit_cooldown_s) THEN
            reason := 'circuit_open';
            defer_until := c_opened + make_interval(secs => p_circuit_cooldown_s);
        END IF;
    ELSIF c_state = 'half_open' AND c_probe > now() - make_interval(secs => p_probe_timeout_s) THEN
        reason := 'circuit_half_open';
        defer_until := now() + interval '1 second';
    END IF;

    -- Concurrency.
    IF reason IS NULL AND p_endpoint_concurrency > 0 THEN
        SELECT count(*) INTO n FROM deliveries WHERE endpoint_id = d.endpoint_id AND status = 'PROCESSING';
        IF n >= p_endpoint_concurrency THEN
            reason := 'endpoint_concurrency';
            defer_until := now() + interval '1 second';
        END IF;
    END IF;
    IF reason IS NULL AND p_project_concurrency > 0 THEN
        SELECT count(*) INTO n FROM deliveries WHERE project_id = d.project_id AND status = 'PROCESSING';
        IF n >= p_project_concurrency THEN
            reason := 'project_concurrency';
            defer_until := now() + interval '1 second';
        END IF;
    END IF;

    -- Rates: fixed one-second windows.
    IF reason IS NULL THEN
        SELECT rate_limit_per_second INTO ep_rate FROM endpoints WHERE id = d.endpoint_id;
        IF ep_rate IS NOT NULL AND ep_rate > 0 THEN
            SELECT used INTO n FROM claim_rates WHERE kind = 'endpoint' AND id = d.endpoint_id AND window_start = date_trunc('second', now());
            IF coalesce(n, 0) >= ep_rate THEN
                reason := 'endpoint_rate';
                defer_until := date_trunc('second', now()) + interval '1 second';
            END IF;
        END IF;
    END IF;
    IF reason IS NULL AND p_project_rate > 0 THEN
        SELECT used INTO n FROM claim_rates WHERE kind = 'project' AND id = d.project_id AND window_start = date_trunc('second', now());
        IF coalesce(n, 0) >= p_project_rate THEN
            reason := 'project_rate';
            defer_until := date_trunc('second', now()) + interval '1 second';
        END IF;
    END IF;

    IF reason IS NOT NULL THEN
        -- The Deferral: no Attempt, no Claim; the scheduler announces it again when due.
        UPDATE deliveries SET next_retry_at = defer_until, claim_token = NULL, updated_at = now() WHERE id = d.id;
        RETURN reason;
    END IF;

    IF ep_rate IS NOT NULL AND ep_rate > 0 THEN
        INSERT INTO claim_rates AS r (kind, id, window_start, used) VALUES ('endpoint', d.endpoint_id, date_trunc('second', now()), 1)
        ON CONFLICT (kind, id) DO UPDATE SET
            used = CASE WHEN r.window_start = excluded.window_start THEN r.used + 1 ELSE 1 END,
            window_start = excluded.window_start;
    END IF;
    IF p_project_rate > 0 THEN
        INSERT INTO claim_rates AS r (kind, id, window_start, used) VALUES ('project', d.project_id, date_trunc('second', now()), 1)
        ON CONFLICT (kind, id) DO UPDATE SET
            used = CASE WHEN r.window_start = excluded.window_start THEN r.used + 1 ELSE 1 END,
            window_start = excluded.window_start;
    END IF;
    IF c_state = 'open' THEN
        -- Cool-down over: this claim is the half-open probe.
        UPDATE endpoint_circuits SET state = 'half_open', probe_token = p_token, probe_at = now() WHERE endpoint_id = d.endpoint_id;
    ELSIF c_state = 'half_open' THEN
        UPDATE endpoint_circuits SET probe_token = p_token, probe_at = now() WHERE endpoint_id = d.endpoint_id;
    END IF;

    UPDATE deliveries SET status = 'PROCESSING', claim_token = p_token, claimed_at = now(), updated_at = now() WHERE id = d.id;
    RETURN 'claimed';
END
$$;

-- Records one Attempt's outcome in the endpoint's circuit; returns the state change
-- ('opened', 'closed', 'reopened') or NULL. A failure is an outcome that asks for a retry
-- (5xx, 408, 429, timeouts, connection errors). The circuit opens when, within the current
-- window of p_window_s seconds, at least p_min_volume outcomes were seen and the failure
-- ratio reached p_ratio. A half-open probe closes it on success and reopens it on failure.
CREATE FUNCTION railhook_circuit_record(
    p_endpoint uuid, p_token uuid, p_success boolean,
    p_window_s double precision, p_min_volume integer, p_ratio double precision
) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    c record;
BEGIN
    INSERT INTO endpoint_circuits (endpoint_id) VALUES (p_endpoint) ON CONFLICT (endpoint_id) DO NOTHING;
    SELECT * INTO c FROM endpoint_circuits WHERE endpoint_id = p_endpoint FOR UPDATE;
    IF c.state = 'half_open' AND c.probe_token IS NOT DISTINCT FROM p_token THEN
        IF p_success THEN
            UPDATE endpoint_circuits SET state = 'closed', window_start = now(), successes = 0, failures = 0,
                                         opened_at = NULL, probe_token = NULL, probe_at = NULL
            WHERE endpoint_id = p_endpoint;
            RETURN 'closed';
        END IF;
        UPDATE endpoint_circuits SET state = 'open', opened_at = now(), probe_token = NULL, probe_at = NULL WHERE endpoint_id = p_endpoint;
        RETURN 'reopened';
    END IF;
    IF c.state <> 'closed' THEN
        RETURN NULL;
    END IF;
    IF c.window_start < now() - make_interval(secs => p_window_s) THEN
        c.successes := 0;
        c.failures := 0;
        c.window_start := now();
    END IF;
    IF p_success THEN
        c.successes := c.successes + 1;
    ELSE
        c.failures := c.failures + 1;
    END IF;
    IF p_min_volume > 0 AND c.successes + c.failures >= p_min_volume
       AND c.failures::double precision / (c.successes + c.failures) >= p_ratio THEN
        UPDATE endpoint_circuits SET state = 'open', opened_at = now(), window_start = now(), successes = 0, failures = 0
        WHERE endpoint_id = p_endpoint;
        RETURN 'opened';
    END IF;
    UPDATE endpoint_circuits SET window_start = c.window_start, successes = c.successes, failures = c.failures WHERE endpoint_id = p_endpoint;
    RETURN NULL;
END
$$;
