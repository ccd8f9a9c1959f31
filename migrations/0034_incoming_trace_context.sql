-- OpenTelemetry (issue 33): an Incoming Event keeps the W3C trace context its ingress request
-- continued, as an Event does (migration 0033), so the announcements of its Forwards' retries
-- (the scheduler, the sweeps, a person's retry) carry it like the first one: every Attempt of
-- a Forward is in the ingress request's trace. NULL when the request sent none and tracing is
-- off. Header forms as Railhook normalised them (railhook_core::trace).
ALTER TABLE incoming_events ADD COLUMN traceparent text, ADD COLUMN tracestate text;
