-- Whether a Delivery is parked now (issue 30, the fourteenth session's review): PENDING in the
-- Ordering Buffer, waiting for its predecessor. `parked_at` stays what it was, when the
-- Delivery was first parked (the gap timeout counts from it, DESIGN.md 6.5), and it is never
-- cleared; until now it also stood for "parked now". A Delivery once parked, then claimed
-- (behind its predecessor, or at its gap timeout) and back on its own Retry Ladder, still
-- looked parked: its predecessor's finalise made it due at once (its retry delay skipped),
-- its successor waited for it without a gap timeout, and the parked gauge and the API counted
-- it. `parked` is set by the ordering Deferral (and the worker's park of a held Delivery) and
-- cleared by the claim; no index holds it, so the claim's update stays HOT.
ALTER TABLE deliveries ADD COLUMN parked boolean NOT NULL DEFAULT false;

-- The open Deliveries that look parked now. One once parked and back on its ladder cannot be
-- told apart here: it counts as parked until its next claim, as it did before.
-- By primary key (the open ones are few), as the queue gauges read them.
UPDATE deliveries d SET parked = true
WHERE d.id = ANY (ARRAY(SELECT delivery_id FROM open_deliveries))
  AND d.status = 'PENDING' AND d.parked_at IS NOT NULL AND d.claim_token IS NULL;
