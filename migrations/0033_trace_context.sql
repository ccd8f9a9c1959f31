-- OpenTelemetry (issue 33): an Event keeps the W3C trace context its ingest continued, so
-- every announcement of its Deliveries carries it to the worker (and the worker to the
-- receiver as `traceparent`), and the dashboard shows its trace id. NULL when the caller sent
-- none and tracing is off: the common case costs nothing (no default, no table rewrite).
-- Both columns hold the header forms as Railhook normalised them
-- (railhook_core::trace: version 00, lowercase; tracestate without spaces).
ALTER TABLE events ADD COLUMN traceparent text, ADD COLUMN tracestate text;

-- The polling relay's announcements (and the CDC relay's before it switched to messages)
-- are outbox rows: they carry the same two fields.
ALTER TABLE outbox ADD COLUMN traceparent text, ADD COLUMN tracestate text;
