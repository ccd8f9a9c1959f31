-- The attempt log keeps no foreign key to `deliveries` or `forwards` (issue 17: retention
-- must not slow the live traffic). Measured on a retention batch of 200 expired Events with
-- their Deliveries and Attempts, 9 partitions of `attempts` (docs/BENCHMARKS.md "retention"):
-- the cascade of `attempts_delivery_id_fkey` cost 2.7-4.0 ms of the statement's 5.5-8.7 ms,
-- one probe of every partition per deleted Delivery (a foreign key's cascade cannot prune),
-- so its cost grew with `retention.attempts_days`; and every Attempt the finalise inserts
-- paid a key-share lock on its Delivery for the check. Attaching or dropping a daily
-- partition also had to lock `deliveries` and `forwards` to add or remove the keys.
--
-- Who deletes an Attempt instead, all set-based and within the partitions the rows can be in:
-- - the retention job, with the Delivery or Forward (`railhook_store::retention`), and the
--   drop of a whole day's partition after `retention.attempts_days`;
-- - `railhook admin project erase`, with the Delivery or Forward and then by `project_id`
--   (the key to `projects` stays, so deleting a Project still takes its Attempts along).
-- The Attempts of a Delivery deleted with its Endpoint (or of a Forward deleted with its
-- Source or Destination) stay in the log, out of the API's reach (their Delivery is gone),
-- until their day's partition is dropped: the attempt log is bounded by time, not by its
-- parents. docs/ARCHITECTURE.md "The attempt log".
ALTER TABLE attempts DROP CONSTRAINT attempts_delivery_id_fkey;
ALTER TABLE attempts DROP CONSTRAINT attempts_forward_id_fkey;
