-- HOT claim and finalise (issue 30). A Postgres UPDATE is heap-only (no new entry in any
-- index, the new row version on the same page) only when no column that an index uses (as
-- a key, in an expression or in a partial index's predicate) changes. The claim (PENDING
-- -> PROCESSING) and the finalise (PROCESSING -> SUCCESS) change `status`, `claim_token`,
-- `claimed_at`, `completed_at`, `attempt_count`, `last_error` and `updated_at`; before
-- this migration `status` was in the predicate of four partial indexes and `completed_at`
-- a key, so every claim and every finalise wrote a new entry in each of the table's
-- indexes (5-6 per UPDATE: docs/BENCHMARKS.md "Issue 30").
--
-- After it, no index of `deliveries` uses a column that the first Attempt's claim and its
-- successful finalise change, and the sets the readers need live where they stay
-- HOT-compatible:
--   * Failed Messages: `failed_at`, set only on the (rare) FAILED transition and cleared by
--     a person's retry, indexed where not NULL. A trigger keeps it in step with `status`
--     for every writer (it fires only when the two disagree, so never on the hot path).
--   * due retries and Deferrals: `deliveries_due_idx (next_retry_at) WHERE next_retry_at IS
--     NOT NULL`. A first Attempt's row has no `next_retry_at` from its ingest to its
--     SUCCESS; the claim clears it on the retry path, so the index holds PENDING rows.
--   * PROCESSING per Endpoint and Project (every claim's concurrency count, the stuck
--     sweep, the dashboard): `delivery_claims`, a row per Claim, inserted by the claim and
--     deleted by whatever ends it (finalise, release, park, stuck sweep).
--   * every Delivery not ended (PENDING or PROCESSING: the stranded sweep, the hard cap,
--     the re-announcements, the gauges, the Replays' pressure): `open_deliveries`, a row
--     per open Delivery, inserted with it (a trigger, for every writer) and deleted by what
--     ends it (finalise, hard cap).
-- Readers filter `status` on the heap after finding their rows through these.

-- Failed Messages -------------------------------------------------------------------------
ALTER TABLE deliveries ADD COLUMN failed_at timestamptz;
UPDATE deliveries SET failed_at = coalesce(completed_at, updated_at) WHERE status = 'FAILED';

-- `failed_at` is set exactly when `status` is FAILED: when a write leaves the two in
-- disagreement (the finalise's or the hard cap's FAILED, a person's retry, a writer that does
-- not know the column), this sets it from `completed_at`. The WHEN clause is evaluated for
-- every row written but the function runs only on those transitions.
CREATE FUNCTION railhook_deliveries_failed_at() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.failed_at := CASE WHEN NEW.status = 'FAILED' THEN coalesce(NEW.completed_at, now()) END;
    RETURN NEW;
END
$$;
CREATE TRIGGER deliveries_failed_at BEFORE INSERT OR UPDATE ON deliveries
FOR EACH ROW WHEN ((NEW.status = 'FAILED') IS DISTINCT FROM (NEW.failed_at IS NOT NULL))
EXECUTE FUNCTION railhook_deliveries_failed_at();

DROP INDEX deliveries_failed_idx;
DROP INDEX deliveries_failed_id_idx;
CREATE INDEX deliveries_failed_idx ON deliveries (project_id, failed_at) WHERE failed_at IS NOT NULL;
CREATE INDEX deliveries_failed_id_idx ON deliveries (project_id, id) WHERE failed_at IS NOT NULL;

-- Open Deliveries -------------------------------------------------------------------------
-- One row per Delivery that is PENDING or PROCESSING. Narrow on purpose: the readers join
-- `deliveries` by primary key and filter there. No foreign key (a key-share lock per
-- ingested Delivery, and a probe per deleted one for retention): a row whose Delivery ended
-- or was deleted without taking it along is harmless (the readers filter) and the stranded
-- sweep deletes it.
CREATE TABLE open_deliveries (
    delivery_id uuid PRIMARY KEY,
    project_id uuid NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02);

INSERT INTO open_deliveries (delivery_id, project_id)
SELECT id, project_id FROM deliveries WHERE status = 'PENDING'
UNION ALL
SELECT id, project_id FROM deliveries WHERE status = 'PROCESSING';

-- Every inserted Delivery that is open gets its row in the same statement, whoever inserts
-- it (the ingest, a Replay, a writer of the previous build, a test).
CREATE FUNCTION railhook_deliveries_opened() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO open_deliveries (delivery_id, project_id)
    SELECT n.id, n.project_id FROM new_deliveries n WHERE n.status IN ('PENDING', 'PROCESSING')
    ON CONFLICT (delivery_id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER deliveries_opened AFTER INSERT ON deliveries
REFERENCING NEW TABLE AS new_deliveries
FOR EACH STATEMENT EXECUTE FUNCTION railhook_deliveries_opened();

-- An ended Delivery that becomes open again (a person's retry, FAILED -> PENDING) gets its
-- row back, whoever writes it. Rare, so a row trigger; its WHEN clause keeps it off the
-- claim's and the finalise's path.
CREATE FUNCTION railhook_deliveries_reopened() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO open_deliveries (delivery_id, project_id) VALUES (NEW.id, NEW.project_id)
    ON CONFLICT (delivery_id) DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER deliveries_reopened AFTER UPDATE ON deliveries
FOR EACH ROW WHEN (OLD.status IN ('SUCCESS', 'FAILED') AND NEW.status IN ('PENDING', 'PROCESSING'))
EXECUTE FUNCTION railhook_deliveries_reopened();

-- Claims ----------------------------------------------------------------------------------
-- One row per Delivery that is PROCESSING, under the Claim's token. The key serves the
-- claim's counts (per Project, per Endpoint of a Project) and the deletes of whatever ends
-- the Claim, which know all three. The claim writes the row in the statement that claims
-- (railhook_claim_batch), so a Delivery is never PROCESSING without one; a row whose Claim
-- ended without taking it along (a writer of the previous build) counts for nothing (the
-- readers check the Delivery) and the stuck sweep deletes it.
CREATE TABLE delivery_claims (
    project_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    delivery_id uuid NOT NULL,
    claim_token uuid NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (project_id, endpoint_id, delivery_id)
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.02);

INSERT INTO delivery_claims (project_id, endpoint_id, delivery_id, claim_token, claimed_at)
SELECT project_id, endpoint_id, id, coalesce(claim_token, gen_random_uuid()), coalesce(claimed_at, now())
FROM deliveries WHERE status = 'PROCESSING';

-- Due retries and Deferrals -----------------------------------------------------------------
DROP INDEX deliveries_processing_idx;
DROP INDEX deliveries_due_idx;
CREATE INDEX deliveries_due_idx ON deliveries (next_retry_at) WHERE next_retry_at IS NOT NULL;

-- Room on each page for the claim's and the finalise's new row versions (an UPDATE is HOT
-- only if its new version fits on the old one's page). Applies to pages filled from now on.
-- A claim batch updates up to 64 neighbouring rows (they were ingested one after the other)
-- in one transaction, and the versions it leaves dead cannot be pruned before it commits,
-- so a page needs room for a new version of every row it holds: half of it. Measured
-- (store/tests/hot.rs, 1,000 Deliveries claimed and finalised in batches of 64, a tenth
-- FAILED and a tenth retried, which are not HOT by design): 14 % of the updates HOT at
-- fillfactor 100, 57 % at 70, 68 % at 60, 86 % at 50; with the few rows per batch of a
-- steady load 90 % at 100 and 100 % at 70 or less. The price: finished rows fill their
-- pages to half, so the heap of `deliveries` is up to twice as large (an operator who
-- prefers the space sets it back with ALTER TABLE deliveries SET (fillfactor = ...)).
ALTER TABLE deliveries SET (fillfactor = 50);
