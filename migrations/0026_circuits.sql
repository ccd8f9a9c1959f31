-- Destinations get the circuit breaker Endpoints have (issue 31): one table of circuits, one
-- set of rules (`railhook_circuit_*` in crates/railhook-store/src/lifecycle/rules.sql).
-- A Destination that was down took every Forward's Attempt on its ladder (10,689 failed
-- connections in a 60 s outage of the chaos suite, where the Endpoints' open circuits let
-- 338 through).
--
-- The circuit of an Endpoint or of a Destination: exactly one of the two keys is set, each a
-- foreign key that takes the circuit along when its owner is deleted; `target_id` is
-- whichever is set, the key the rules look circuits up by (ids are UUIDs of one generator,
-- so an Endpoint's and a Destination's never meet).
ALTER TABLE endpoint_circuits RENAME TO circuits;
ALTER TABLE circuits RENAME CONSTRAINT endpoint_circuits_endpoint_id_fkey TO circuits_endpoint_id_fkey;
ALTER TABLE circuits RENAME CONSTRAINT endpoint_circuits_state_check TO circuits_state_check;
ALTER TABLE circuits DROP CONSTRAINT endpoint_circuits_pkey;
ALTER TABLE circuits ALTER COLUMN endpoint_id DROP NOT NULL;
ALTER TABLE circuits ADD COLUMN destination_id uuid REFERENCES destinations (id) ON DELETE CASCADE;
ALTER TABLE circuits ADD COLUMN target_id uuid GENERATED ALWAYS AS (coalesce(endpoint_id, destination_id)) STORED;
ALTER TABLE circuits ADD CONSTRAINT circuits_pkey PRIMARY KEY (target_id);
ALTER TABLE circuits ADD CONSTRAINT circuits_one_target CHECK (num_nonnulls(endpoint_id, destination_id) = 1);
-- For the foreign keys' cascades (deleting an Endpoint or a Destination finds its circuit).
CREATE INDEX circuits_endpoint_idx ON circuits (endpoint_id) WHERE endpoint_id IS NOT NULL;
CREATE INDEX circuits_destination_idx ON circuits (destination_id) WHERE destination_id IS NOT NULL;
