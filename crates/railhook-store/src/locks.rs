//! Every Postgres advisory-lock key Railhook takes, in one registry, so that no two jobs
//! share a key by accident (the sweep once used the migrator's key, so a sweep and
//! `railhook migrate` waited for each other).
//!
//! Singleton keys are 64-bit constants whose high 32 bits spell "rhk" plus a kind byte and
//! whose low bits number the job. Per-row locks (a project's or an endpoint's claims) are
//! `hashtextextended(id::text, seed)`, with the seeds listed here; the claim SQL
//! (`deliveries::lifecycle`) takes them. A hash can equal a singleton key only by a 2^-64
//! chance.

/// A named advisory-lock key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockKey {
    pub name: &'static str,
    pub key: i64,
}

const fn singleton(n: i64) -> i64 {
    // "rhk" + 0x01 (singleton jobs), then the job's number.
    (0x7268_6b01_i64 << 32) | n
}

/// `railhook migrate`: held (session level) while migrations and the repeatable SQL apply.
pub const MIGRATE: LockKey = LockKey { name: "migrate", key: singleton(1) };
/// The worker's sweeps (6.4): one process at a time (transaction level, try-lock).
pub const SWEEP: LockKey = LockKey { name: "sweep", key: singleton(2) };
/// The Replay runner (issue 17): one batch at a time across processes (transaction level,
/// try-lock, taken by `replays::run_batch`).
pub const REPLAY: LockKey = LockKey { name: "replay", key: singleton(3) };

/// The retention job (issue 17): one run at a time across processes (session level,
/// try-lock, held by `railhook_worker::retention` for a whole run of short batches).
pub const RETENTION: LockKey = LockKey { name: "retention", key: singleton(4) };

/// Every singleton key, for the uniqueness test and for operators reading `pg_locks`.
pub const ALL: &[LockKey] = &[MIGRATE, SWEEP, REPLAY, RETENTION];

/// Seed of `hashtextextended(project_id::text, seed)`: a project's claims serialise on it.
pub const PROJECT_CLAIM_SEED: i64 = 7061;
/// Seed of `hashtextextended(endpoint_id::text, seed)`: an endpoint's claims serialise on it,
/// always after the project's.
pub const ENDPOINT_CLAIM_SEED: i64 = 6570;
/// Seed of `hashtextextended(slot_name, seed)`: the relays sharing a slot run their setup
/// one at a time (session level, held by `railhook_relay::setup::prepare` while it checks,
/// drops or creates the slot).
pub const RELAY_SLOT_SETUP_SEED: i64 = 5953;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn singleton_keys_are_distinct() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(a.key, b.key, "{} and {} share a key", a.name, b.name);
                assert_ne!(a.name, b.name);
            }
        }
        let seeds = [PROJECT_CLAIM_SEED, ENDPOINT_CLAIM_SEED, RELAY_SLOT_SETUP_SEED];
        for (i, a) in seeds.iter().enumerate() {
            assert!(!seeds[i + 1..].contains(a), "seed {a} is used twice");
        }
    }
}
