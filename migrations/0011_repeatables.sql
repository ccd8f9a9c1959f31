-- Repeatable migrations: SQL applied again whenever its checksum changes (as Flyway's
-- repeatable migrations are), after the versioned migrations. The Delivery lifecycle's rules
-- (the claim's admission, the finalise, the circuit breaker) live in one such file,
-- crates/railhook-store/src/lifecycle/rules.sql, so a rule change is the diff of one file
-- instead of a new migration that restates a whole function.
CREATE TABLE railhook_repeatables (
    name        text PRIMARY KEY,
    checksum    text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- The single claim (0008, a wrapper over the batch since 0009) has had no caller since the
-- batch claim: one definition of the rules.
DROP FUNCTION railhook_claim(uuid, uuid, uuid, integer, integer, integer, double precision, double precision);
