-- Forwards as the worker sends them and a person retries or replays them (issue 16).

-- A replay (`POST /v1/incoming-events/{id}/replay`) makes a *new* Forward of an Incoming
-- Event to a Destination that may already have one, so (incoming_event_id, destination_id)
-- is no longer unique. The ingress never relied on it (its insert dedupes on the Incoming
-- Event, and the Forwards hang off the row it inserted). The lookup by Incoming Event keeps
-- an index.
ALTER TABLE forwards DROP CONSTRAINT forwards_incoming_event_id_destination_id_key;
CREATE INDEX forwards_incoming_event_idx ON forwards (incoming_event_id, id);

-- The failed Forwards are listed, and retried by filter, in id order (as the Failed
-- Messages of Deliveries: deliveries_failed_id_idx).
CREATE INDEX forwards_failed_id_idx ON forwards (project_id, id) WHERE status = 'FAILED';

-- A Destination's rate limit (rate_limit_per_second) counts the Forwards claimed towards
-- it in the last second; `claimed_at` is kept after the finalise for this.
CREATE INDEX forwards_destination_claimed_idx ON forwards (destination_id, claimed_at) WHERE claimed_at IS NOT NULL;
