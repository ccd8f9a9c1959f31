-- Attempts of both directions, and the Outbox.

-- One HTTP request towards a Delivery or a Forward, written in the same statement as the
-- finalise that records its outcome.
CREATE TABLE attempts (
    id                 uuid PRIMARY KEY,
    project_id         uuid NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    delivery_id        uuid REFERENCES deliveries (id) ON DELETE CASCADE,
    forward_id         uuid REFERENCES forwards (id) ON DELETE CASCADE,
    attempt_number     integer NOT NULL,
    started_at         timestamptz NOT NULL,
    duration_ms        integer NOT NULL,
    status_code        integer,
    -- success, http_status, timeout, connect, dns, tls, refused_address, body_read, ...
    result             text NOT NULL,
    error_message      text,
    response_headers   jsonb,
    response_body      text,
    response_truncated boolean NOT NULL DEFAULT false,
    CHECK ((delivery_id IS NULL) <> (forward_id IS NULL))
);
CREATE INDEX attempts_delivery_idx ON attempts (delivery_id, attempt_number) WHERE delivery_id IS NOT NULL;
CREATE INDEX attempts_forward_idx ON attempts (forward_id, attempt_number) WHERE forward_id IS NOT NULL;

-- The Outbox: one row announces that a Delivery or Forward needs work, inserted in the same
-- transaction as that work. The CDC relay reads inserts from the WAL (publication with
-- publish = 'insert'), so it never updates these rows; the polling relay (baseline) uses
-- poll_status. Relayed rows are deleted in bounded batches after a retention period.
CREATE TABLE outbox (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    project_id       uuid NOT NULL,
    delivery_id      uuid,
    forward_id       uuid,
    -- Kafka key: the endpoint id for deliveries, the destination id for forwards.
    routing_id       uuid NOT NULL,
    -- created, retry, replay, manual_retry, reannounce
    reason           text NOT NULL,
    -- On the retry path, the token the scheduler claimed the row under; the consumer swaps
    -- it for its own only while the row still carries it.
    claim_token      uuid,
    created_at       timestamptz NOT NULL DEFAULT now(),
    poll_status      text NOT NULL DEFAULT 'PENDING' CHECK (poll_status IN ('PENDING', 'SENDING', 'PUBLISHED')),
    poll_claimed_at  timestamptz,
    CHECK ((delivery_id IS NULL) <> (forward_id IS NULL))
);
CREATE INDEX outbox_created_idx ON outbox (created_at);
CREATE INDEX outbox_poll_idx ON outbox (id) WHERE poll_status <> 'PUBLISHED';
