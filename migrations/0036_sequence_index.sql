-- The claim's numbering (migration 0035) as a HOT update (issue 30). While `sequence_number`
-- was in an index of `deliveries` (deliveries_endpoint_idx, (endpoint_id, sequence_number)),
-- setting it made a new row version with an entry in every index of the table, for every
-- ordered Delivery: in an A/B of the `ordered` bench phase, 6.2-6.4 KB of WAL per Delivery
-- against 5.4-5.8 KB with the number written by the ingest. Now the Ordering Buffer finds an
-- Endpoint's Delivery by number through a table of its own, written by the numbering claim
-- (one small row and two index entries), and `deliveries` indexes no column the numbering
-- changes.
CREATE TABLE delivery_sequence (
    endpoint_id     uuid NOT NULL,
    sequence_number bigint NOT NULL,
    -- No key to `endpoints`: a numbering claim would take a share lock on the Endpoint's row
    -- it has just updated; the Delivery's cascade takes the row along when the Endpoint goes.
    delivery_id     uuid NOT NULL UNIQUE REFERENCES deliveries (id) ON DELETE CASCADE,
    PRIMARY KEY (endpoint_id, sequence_number)
);

INSERT INTO delivery_sequence (endpoint_id, sequence_number, delivery_id)
SELECT endpoint_id, sequence_number, id FROM deliveries WHERE sequence_number IS NOT NULL
ON CONFLICT DO NOTHING;

-- An Endpoint's Deliveries (the deletes of migration 0027) by Endpoint alone.
-- IF NOT EXISTS: on a large database the index may be built CONCURRENTLY beforehand (RUNBOOK.md).
CREATE INDEX IF NOT EXISTS deliveries_endpoint_only_idx ON deliveries (endpoint_id);
DROP INDEX deliveries_endpoint_idx;
ALTER INDEX deliveries_endpoint_only_idx RENAME TO deliveries_endpoint_idx;
