//! The Delivery lifecycle: every write to `deliveries` after the ingest, in one module, and
//! the rules of claim and finalise in one editable file (`rules.sql`).
//!
//! The worker and the relay call these functions; neither holds SQL for this table. Statuses
//! are `railhook_core::DeliveryStatus`, Deferral reasons `DeferralReason`, circuit changes
//! `CircuitChange`, announcement reasons `AnnouncementReason`: each is mapped to its SQL
//! spelling once, in `railhook-core::status`.
//!
//! # Transitions
//!
//! | from | to | who | where |
//! | --- | --- | --- | --- |
//! | (none) | PENDING | the ingest: the Event, its Deliveries and their announcements in one statement | `events::INGEST_SQL` (kept there: `scripts/bench` runs that very statement under pgbench) |
//! | PENDING | PROCESSING | the worker's claim, under the scheduler's token on the retry path | [`claim::claim_batch`] (`railhook_claim_batch`) |
//! | PENDING | PENDING, due later | a Deferral: circuit, concurrency, rate, disabled endpoint; no Attempt spent | [`claim::claim_batch`] |
//! | PROCESSING | SUCCESS / FAILED / PENDING (successor) | the finalise, only while the Claim holds | [`finalise::finalise_batch`] (`railhook_finalise_batch`) |
//! | PROCESSING | PENDING | a Claim given back unsent (shutdown) | [`finalise::release`] |
//! | PENDING (due) | PENDING, tokened and announced | the retry scheduler | [`schedule::schedule_due`] |
//! | PROCESSING (stuck) | PENDING, announced | the sweep, after `worker.processing_timeout_seconds` | [`schedule::sweep`] |
//! | PENDING (stranded) | PENDING, announced | the sweep, after `worker.stranded_after_seconds` | [`schedule::sweep`] |
//! | PENDING (its claim forgotten by a Postgres crash) | PENDING, announced | the worker's sweep loop, once per server start it sees | [`schedule::reannounce_after_restart`] |
//! | PENDING (past the hard cap) | FAILED | the sweep | [`schedule::sweep`] |
//! | PENDING (unclaimed) | PENDING, announced | the relay, after it created a slot | [`schedule::reannounce_pending`] |
//! | FAILED | PENDING, announced | a person: manual and bulk retry | [`manual::retry`], [`manual::retry_many`] |
//! | (none) | PENDING, announced | a Replay (Time Machine): a new Delivery per (Event, Endpoint), in the runner's batch transaction with the Replay's cursor | [`replay::insert_batch`] |
//! | (none) | PENDING, announced | Forwards: the ingress, one per enabled Destination | `incoming::INGRESS_SQL` |
//! | (none) | PENDING, announced | Forwards: a replay of an Incoming Event (a new Forward) | [`forward::replay`] |
//! | PENDING | PROCESSING | Forwards: the worker's claim (fenced like Deliveries) | [`forward::claim_batch`] |
//! | PENDING | PENDING, due later | Forwards: a Deferral (disabled Destination 60 s, its rate 1 s, its circuit) | [`forward::claim_batch`] |
//! | PROCESSING | SUCCESS / FAILED / PENDING (due) | Forwards: the finalise, only while the Claim holds | [`forward::finalise_batch`] |
//! | PROCESSING | PENDING, due now | Forwards: a Claim given back unsent | [`forward::release`] |
//! | PENDING (due) | PENDING, tokened and announced | Forwards: the retry scheduler | [`forward::schedule_due`] |
//! | PROCESSING (stuck) / PENDING (stranded) | PENDING, announced | Forwards: the sweeps | [`forward::sweep`] |
//! | PENDING (past 24 h) | FAILED | Forwards: the hard-cap sweep | [`schedule::sweep`] |
//! | FAILED | PENDING, announced | Forwards: manual and bulk retry | [`forward::retry`], [`forward::retry_many`] |
//!
//! SUCCESS is final. Every write on a claimed row is conditional on its `claim_token` (the
//! fence); every write on an unclaimed row is conditional on the state it read.
//!
//! # Where the sets live (migration 0032: HOT claim and finalise)
//!
//! No index of `deliveries` uses a column a first Attempt's claim or finalise changes. The
//! PROCESSING Deliveries are found through `delivery_claims` (written with the claim, deleted
//! with whatever ends the Claim), the open ones (PENDING or PROCESSING) through
//! `open_deliveries` (filled by triggers on insert and reopening, emptied by the finalise
//! and the hard cap), due retries through `deliveries_due_idx` on `next_retry_at`, Failed
//! Messages through `failed_at`. Every reader checks `status` on the Delivery itself.
//!
//! # Announcements
//!
//! Every statement above that announces (the ingest, the scheduler, the sweeps, the relay's
//! re-announcement, retries, replays, the ingress) calls `railhook_announce` (`announce.sql`)
//! once, in the same statement: outbox rows or, in CDC mode, one logical decoding message
//! ([`announce`]).
//!
//! # Rules
//!
//! `rules.sql` holds the plpgsql of the claim's admission (circuit, concurrency, rates,
//! disabled endpoint, Deferral lengths), the batch finalise and the circuit breaker, as
//! `CREATE OR REPLACE` statements. It is a repeatable migration: `railhook migrate` (and every
//! component at start) applies it again whenever its checksum differs from the one recorded
//! in `railhook_repeatables`, after the versioned migrations, under the migration lock. A rule
//! change is the diff of that one file.

pub mod announce;
pub mod claim;
pub mod finalise;
pub mod forward;
pub mod manual;
pub mod replay;
pub mod schedule;

pub use claim::{claim_batch, claim_batch_finishing, park_held, warm, ClaimRequest, ClaimResult, Claimed, Limits};
pub use finalise::{finalise_batch, release, AttemptRecord, Circuit, Finalised, FinaliseRequest, Next};
pub use schedule::{queue_gauges, reannounce_after_restart, reannounce_pending, restore_claims, schedule_due, server_started_at, sweep, vacuum_claims, QueueGauges, Reannounced, SweepLimits, Swept};

/// The repeatable SQL of the lifecycle's rules: (name, text). Applied by the migrator.
pub const REPEATABLES: &[(&str, &str)] = &[("lifecycle_rules", include_str!("rules.sql")), ("announce", include_str!("announce.sql"))];

/// A pooled connection (or a transaction on one) with its statement cache: the per-Attempt
/// statements (claim, finalise, release) are prepared once per connection, so each costs one
/// round trip instead of a parse and an execute.
pub trait Prepared: deadpool_postgres::GenericClient + Sync {}
impl<C: deadpool_postgres::GenericClient + Sync> Prepared for C {}
