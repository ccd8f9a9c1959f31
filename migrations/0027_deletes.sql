-- Deleting an Endpoint, a Subscription, a Destination or a Source with a million Deliveries
-- or Forwards behind it (issue 31). Their deletes now take the history away in short
-- batches first (`railhook_store::deletion`), which needs each kind's rows found by index;
-- each cascade of the final DELETE finds at most what was made meanwhile.
--
-- Each index is made with IF NOT EXISTS: on a large `deliveries` an operator may build it
-- first with CREATE INDEX CONCURRENTLY under the same name (docs/RUNBOOK.md), so that this
-- migration does not hold the table's writes while it builds.

-- An Endpoint's Deliveries: the Ordering Buffer's index, (endpoint_id, sequence_number) for
-- ordered Deliveries only, becomes one over every Delivery (the predecessor lookup and the
-- release use it as before). Without it the cascade read all of `deliveries`.
CREATE INDEX IF NOT EXISTS deliveries_endpoint_idx ON deliveries (endpoint_id, sequence_number);
DROP INDEX IF EXISTS deliveries_sequence_idx;

-- A Destination's Forwards: the rate limit's index, (destination_id, claimed_at) for claimed
-- Forwards only, becomes one over every Forward (the rate count uses it as before).
CREATE INDEX IF NOT EXISTS forwards_destination_idx ON forwards (destination_id, claimed_at);
DROP INDEX IF EXISTS forwards_destination_claimed_idx;

-- A Delivery's `subscription_id` names the Subscription that made it and keeps it after that
-- Subscription is deleted, like `attempts` keeps its Delivery's id (migration 0020). Its
-- `ON DELETE SET NULL` rewrote every Delivery the Subscription ever made, in the delete's one
-- transaction (a sequential scan of `deliveries` to find them, then a new row version and an
-- entry in each of its indexes per Delivery); and every Delivery the ingest inserts no longer
-- takes a key-share lock on its Subscription's row.
ALTER TABLE deliveries DROP CONSTRAINT IF EXISTS deliveries_subscription_id_fkey;
