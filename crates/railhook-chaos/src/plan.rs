//! The faults a run injects ([`FaultKind`]), where ([`Link`] for the network faults), and
//! when: [`plan_faults`] places them at points of the paced stream (counted in accepted
//! events). The controller injects them in order, one at a time: a fault waits for its point
//! and for the previous one to end, so each fault's effects can be told apart.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::options::{Options, TransportKind};

/// Every kind of fault. The names are the report's (`chaos/results/*.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// SIGKILL of the first api process.
    KillApi,
    /// SIGKILL of the relay (with a standby: the one streaming).
    KillRelay,
    /// SIGKILL of the first worker.
    KillWorker,
    /// The inline transport's kill: SIGKILL of a `railhook all` process (its API, relay and
    /// worker at once). With one, that one (it streams from the slot); with two, the hot
    /// standby (its API takes half the client's requests, its worker retries and sweeps):
    /// killing the streaming one is `relay_standby_takeover`.
    KillAll,
    /// SIGTERM of the broker (SIGKILL after a bounded wait), started again on its data.
    KafkaRestart,
    /// `pg_ctl -m fast stop`, then start: a clean restart, the WAL flushed.
    PostgresRestart,
    /// SIGKILL of the postmaster under load, then start: crash recovery, the WAL not yet
    /// flushed is gone (claims committed without waiting for it among it).
    PostgresCrash,
    /// The receiver's listener and connections dropped, then bound again.
    ReceiverOutage,
    /// 200 ms added to every answer on one link (component to Postgres or Kafka).
    NetLatency,
    /// One link passes nothing and holds its connections open (20 s).
    NetBlackhole,
    /// One link resets its connections (TCP RST) for a few seconds.
    NetReset,
    /// The relays stopped, more WAL written than a small `max_slot_wal_keep_size` allows, the
    /// slot invalidated (`wal_status` lost), the relays started again.
    SlotInvalidation,
    /// The file system of Postgres' data directory full (its tmpfs shrunk to what it holds).
    DiskFull,
    /// Two relays, one streaming, one its hot standby: SIGKILL of the streaming one.
    RelayStandbyTakeover,
    /// A worker whose clock is 30 s ahead (`RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS`) joins, and the
    /// others stop for a while: it sends everything meanwhile.
    ClockSkew,
    /// A worker whose attempt tasks panic now and then (`RAILHOOK_FAILPOINT_TASK_PANIC`),
    /// from the fault to the end of the run.
    TaskPanic,
}

impl FaultKind {
    /// Every kind, in the report's order.
    pub const ALL: [FaultKind; 16] = [
        FaultKind::KillApi,
        FaultKind::KillRelay,
        FaultKind::KillWorker,
        FaultKind::KillAll,
        FaultKind::KafkaRestart,
        FaultKind::PostgresRestart,
        FaultKind::PostgresCrash,
        FaultKind::ReceiverOutage,
        FaultKind::NetLatency,
        FaultKind::NetBlackhole,
        FaultKind::NetReset,
        FaultKind::SlotInvalidation,
        FaultKind::DiskFull,
        FaultKind::RelayStandbyTakeover,
        FaultKind::ClockSkew,
        FaultKind::TaskPanic,
    ];

    /// The snake_case name (the report's key).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillApi => "kill_api",
            FaultKind::KillRelay => "kill_relay",
            FaultKind::KillWorker => "kill_worker",
            FaultKind::KillAll => "kill_all",
            FaultKind::KafkaRestart => "kafka_restart",
            FaultKind::PostgresRestart => "postgres_restart",
            FaultKind::PostgresCrash => "postgres_crash",
            FaultKind::ReceiverOutage => "receiver_outage",
            FaultKind::NetLatency => "net_latency",
            FaultKind::NetBlackhole => "net_blackhole",
            FaultKind::NetReset => "net_reset",
            FaultKind::SlotInvalidation => "slot_invalidation",
            FaultKind::DiskFull => "disk_full",
            FaultKind::RelayStandbyTakeover => "relay_standby_takeover",
            FaultKind::ClockSkew => "clock_skew",
            FaultKind::TaskPanic => "task_panic",
        }
    }

    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Whether the kind cuts a component off from Postgres (a write the worker was making,
    /// e.g. an Attempt's finalise, may never arrive: duplicate window 8).
    pub fn postgres_unreachable(self, link: Option<Link>) -> bool {
        match self {
            FaultKind::PostgresRestart | FaultKind::PostgresCrash | FaultKind::DiskFull => true,
            FaultKind::NetLatency | FaultKind::NetBlackhole | FaultKind::NetReset => link.is_some_and(|l| l.service == Service::Postgres),
            _ => false,
        }
    }

    /// Whether the kind ends a worker's process (its Attempts in flight past the shutdown
    /// grace are never recorded): on inline the relay's kill is its whole `railhook all`
    /// process, worker included, and so is `slot_invalidation`'s stop of the relays (a quick
    /// inline run saw a Forward's request reach the receiver as that stop ended its process,
    /// and the stuck sweep send it again: window 8); `clock_skew` stops workers at its start
    /// and at its end on either transport ([`crate::record::FaultTimes`] takes both times).
    pub fn kills_a_worker(self, transport: TransportKind) -> bool {
        match self {
            FaultKind::KillWorker | FaultKind::KillAll | FaultKind::ClockSkew => true,
            FaultKind::RelayStandbyTakeover | FaultKind::KillRelay | FaultKind::SlotInvalidation => transport == TransportKind::Inline,
            _ => false,
        }
    }

    /// Why the kind (on `link`) cannot be injected on `transport`, if it cannot.
    pub fn not_applicable(self, link: Option<Link>, transport: TransportKind) -> Option<&'static str> {
        match transport {
            TransportKind::Inline => match self {
                FaultKind::KafkaRestart => Some("no Kafka on the inline transport: the relay hands announcements to the worker of its own process"),
                FaultKind::KillApi | FaultKind::KillRelay | FaultKind::KillWorker => {
                    Some("on the inline transport the api, the relay and the worker are one `railhook all` process: its SIGKILL is kill_all (and relay_standby_takeover with two)")
                }
                _ if link.is_some_and(|l| l.service == Service::Kafka) => Some("no Kafka link on the inline transport"),
                _ if link.is_some_and(|l| l.component != Component::All) => Some("the inline transport's one link to Postgres is the `railhook all` processes'"),
                _ => None,
            },
            TransportKind::Kafka => match self {
                FaultKind::KillAll => Some("kill_all is the inline transport's (a `railhook all` process); on Kafka the components are killed one by one"),
                _ if link.is_some_and(|l| l.component == Component::All) => Some("no `railhook all` process on the Kafka transport"),
                _ => None,
            },
        }
    }
}

/// A process role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    Api,
    Relay,
    Worker,
    /// `railhook all` (the inline transport): the three in one process.
    All,
}

/// What a component talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Service {
    Postgres,
    Kafka,
}

/// One network link: every process of `component` to `service`, through one proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    pub component: Component,
    pub service: Service,
}

impl Link {
    /// Every link a process of the product has (the api talks to Postgres only).
    pub const ALL: [Link; 5] = [
        Link { component: Component::Api, service: Service::Postgres },
        Link { component: Component::Relay, service: Service::Postgres },
        Link { component: Component::Worker, service: Service::Postgres },
        Link { component: Component::Relay, service: Service::Kafka },
        Link { component: Component::Worker, service: Service::Kafka },
    ];

    /// The inline transport's only link: the `railhook all` processes to Postgres.
    pub const ALL_POSTGRES: Link = Link { component: Component::All, service: Service::Postgres };

    /// The links of a run on `transport`: every one of [`Link::ALL`] on Kafka, the `all`
    /// processes' to Postgres on inline.
    pub fn of(transport: TransportKind) -> Vec<Link> {
        match transport {
            TransportKind::Kafka => Link::ALL.to_vec(),
            TransportKind::Inline => vec![Link::ALL_POSTGRES],
        }
    }

    /// `worker-postgres`: the proxy's name.
    pub fn name(self) -> String {
        let c = match self.component {
            Component::Api => "api",
            Component::Relay => "relay",
            Component::Worker => "worker",
            Component::All => "all",
        };
        let s = match self.service {
            Service::Postgres => "postgres",
            Service::Kafka => "kafka",
        };
        format!("{c}-{s}")
    }
}

/// One fault, injected once `at_accepted` events of the paced stream were accepted (and the
/// fault before it ended).
#[derive(Debug, Clone, Serialize)]
pub struct PlannedFault {
    pub at_accepted: usize,
    pub kind: FaultKind,
    /// The network faults' link.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
}

/// Quick mode: a short fixed list at fixed shares of the events (each kind once). On Kafka:
/// the kills, the Kafka restart, the Postgres crash and restart, resets on the worker's link
/// to Postgres, the receiver's absence. On inline: the kill of the `railhook all` process,
/// the Postgres crash and restart, resets on its link to Postgres, a lost slot, the
/// receiver's absence. Full mode: every kind that applies to the transport, the network
/// ones once per link, the kills `kills_per_component` times (on Kafka the relay's as
/// standby takeovers; on inline with two `all` processes, `kill_all` of the standby and as
/// many takeovers), in a seeded order at evenly spaced points between 4 % and 88 %,
/// `task_panic` last (it lasts to the end of the run). `opts.only` filters either plan.
pub fn plan_faults(opts: &Options) -> Vec<PlannedFault> {
    let n = opts.events;
    let at = |share: f64| ((n as f64 * share) as usize).max(1);
    let worker_postgres = Link { component: Component::Worker, service: Service::Postgres };
    let mut plan: Vec<PlannedFault> = if opts.quick {
        let list: Vec<(f64, FaultKind, Option<Link>)> = match opts.transport {
            TransportKind::Kafka => vec![
                (0.10, FaultKind::KillWorker, None),
                (0.20, FaultKind::KillRelay, None),
                (0.30, FaultKind::KillApi, None),
                (0.40, FaultKind::KafkaRestart, None),
                (0.50, FaultKind::PostgresCrash, None),
                (0.60, FaultKind::PostgresRestart, None),
                (0.68, FaultKind::NetReset, Some(worker_postgres)),
                (0.75, FaultKind::ReceiverOutage, None),
            ],
            TransportKind::Inline => vec![
                (0.10, FaultKind::KillAll, None),
                (0.25, FaultKind::PostgresCrash, None),
                (0.40, FaultKind::PostgresRestart, None),
                (0.55, FaultKind::NetReset, Some(Link::ALL_POSTGRES)),
                (0.65, FaultKind::SlotInvalidation, None),
                (0.75, FaultKind::ReceiverOutage, None),
            ],
        };
        list.into_iter().map(|(share, kind, link)| PlannedFault { at_accepted: at(share), kind, link }).collect()
    } else {
        let mut kinds: Vec<(FaultKind, Option<Link>)> = Vec::new();
        for _ in 0..opts.kills_per_component {
            match opts.transport {
                TransportKind::Kafka => {
                    kinds.push((FaultKind::KillApi, None));
                    kinds.push((FaultKind::KillWorker, None));
                    // With a standby, killing the relay is the standby's takeover.
                    kinds.push((if opts.relays > 1 { FaultKind::RelayStandbyTakeover } else { FaultKind::KillRelay }, None));
                }
                TransportKind::Inline => {
                    kinds.push((FaultKind::KillAll, None));
                    if opts.alls > 1 {
                        kinds.push((FaultKind::RelayStandbyTakeover, None));
                    }
                }
            }
        }
        for kind in [FaultKind::KafkaRestart, FaultKind::PostgresRestart, FaultKind::PostgresCrash, FaultKind::ReceiverOutage, FaultKind::SlotInvalidation, FaultKind::DiskFull, FaultKind::ClockSkew] {
            kinds.push((kind, None));
        }
        for kind in [FaultKind::NetLatency, FaultKind::NetBlackhole, FaultKind::NetReset] {
            for link in Link::of(opts.transport) {
                kinds.push((kind, Some(link)));
            }
        }
        kinds.retain(|(k, link)| k.not_applicable(*link, opts.transport).is_none());
        kinds.retain(|(k, _)| opts.only.as_ref().is_none_or(|only| only.contains(k)));
        kinds.shuffle(&mut StdRng::seed_from_u64(opts.seed));
        if opts.only.as_ref().is_none_or(|only| only.contains(&FaultKind::TaskPanic)) {
            kinds.push((FaultKind::TaskPanic, None));
        }
        let (first, last) = (0.04, 0.88);
        let step = if kinds.len() > 1 { (last - first) / (kinds.len() - 1) as f64 } else { 0.0 };
        kinds.into_iter().enumerate().map(|(i, (kind, link))| PlannedFault { at_accepted: at(first + step * i as f64), kind, link }).collect()
    };
    plan.retain(|f| opts.only.as_ref().is_none_or(|only| only.contains(&f.kind)));
    plan.sort_by_key(|f| f.at_accepted);
    plan
}

/// The faults the run does not inject because they do not apply to its transport, each with
/// the reason: on inline, what the same mode's Kafka plan has and inline has not (the Kafka
/// restart, the Kafka links, the kills of single components); on either, a kind asked for
/// with `--faults` that the transport has not. Not silently dropped: the report lists them.
pub fn skipped_faults(opts: &Options) -> Vec<String> {
    let kafka = Options { transport: TransportKind::Kafka, ..opts.clone() };
    let mut candidates: Vec<(FaultKind, Option<Link>)> = plan_faults(&kafka).iter().map(|f| (f.kind, f.link)).collect();
    candidates.extend(opts.only.iter().flatten().map(|k| (*k, None)));
    let mut skipped: Vec<String> = Vec::new();
    for (kind, mut link) in candidates {
        // On inline, a fault on a component's link to Postgres is injected on the `all`
        // processes' link: moved, not skipped.
        if opts.transport == TransportKind::Inline && link.is_some_and(|l| l.service == Service::Postgres) {
            link = Some(Link::ALL_POSTGRES);
        }
        if let Some(why) = kind.not_applicable(link, opts.transport) {
            let what = match link {
                Some(l) if l.component != Component::All || opts.transport == TransportKind::Kafka => format!("{} {}", kind.name(), l.name()),
                _ => kind.name().to_string(),
            };
            let line = format!("{what}: {why}");
            if !skipped.contains(&line) {
                skipped.push(line);
            }
        }
    }
    skipped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_that_stop_a_worker_process_are_the_kills_of_the_checker() {
        use TransportKind::{Inline, Kafka};
        for (kind, kafka, inline) in [
            (FaultKind::KillWorker, true, true),
            (FaultKind::KillAll, true, true),
            (FaultKind::ClockSkew, true, true),
            (FaultKind::KillRelay, false, true),
            (FaultKind::RelayStandbyTakeover, false, true),
            (FaultKind::SlotInvalidation, false, true),
            (FaultKind::KillApi, false, false),
            (FaultKind::PostgresCrash, false, false),
            (FaultKind::ReceiverOutage, false, false),
        ] {
            assert_eq!((kind.kills_a_worker(Kafka), kind.kills_a_worker(Inline)), (kafka, inline), "{kind:?}");
        }
    }

    #[test]
    fn the_full_plan_has_every_kind_and_every_link_and_ends_with_the_panics() {
        let opts = Options::full("railhook".into());
        let plan = plan_faults(&opts);
        for kind in FaultKind::ALL {
            let wanted = match kind {
                FaultKind::KillRelay | FaultKind::KillAll => 0,
                FaultKind::KillApi | FaultKind::KillWorker | FaultKind::RelayStandbyTakeover => 3,
                FaultKind::NetLatency | FaultKind::NetBlackhole | FaultKind::NetReset => 5,
                _ => 1,
            };
            assert_eq!(plan.iter().filter(|f| f.kind == kind).count(), wanted, "{kind:?}");
        }
        assert_eq!(plan.last().map(|f| f.kind), Some(FaultKind::TaskPanic));
        assert!(plan.windows(2).all(|w| w[0].at_accepted < w[1].at_accepted), "evenly spaced points");
        let again = plan_faults(&opts);
        assert_eq!(format!("{plan:?}"), format!("{again:?}"), "seeded");
    }

    #[test]
    fn the_inline_plans_kill_the_all_process_and_name_what_does_not_apply() {
        let mut opts = Options::quick("railhook".into());
        opts.transport = TransportKind::Inline;
        let plan = plan_faults(&opts);
        let kinds: Vec<FaultKind> = plan.iter().map(|f| f.kind).collect();
        assert!(kinds.contains(&FaultKind::KillAll) && kinds.contains(&FaultKind::PostgresCrash) && kinds.contains(&FaultKind::NetReset));
        assert!(plan.iter().all(|f| f.kind.not_applicable(f.link, TransportKind::Inline).is_none()), "{plan:?}");
        assert!(plan.iter().filter_map(|f| f.link).all(|l| l == Link::ALL_POSTGRES));
        let skipped = skipped_faults(&opts);
        for kind in ["kafka_restart", "kill_api", "kill_relay", "kill_worker"] {
            assert!(skipped.iter().any(|s| s.starts_with(&format!("{kind}:"))), "{kind} in {skipped:?}");
        }

        let mut full = Options::full("railhook".into());
        full.transport = TransportKind::Inline;
        let plan = plan_faults(&full);
        for kind in FaultKind::ALL {
            let wanted = match kind {
                FaultKind::KillApi | FaultKind::KillRelay | FaultKind::KillWorker | FaultKind::KafkaRestart => 0,
                FaultKind::KillAll | FaultKind::RelayStandbyTakeover => 3,
                FaultKind::NetLatency | FaultKind::NetBlackhole | FaultKind::NetReset => 1,
                _ => 1,
            };
            assert_eq!(plan.iter().filter(|f| f.kind == kind).count(), wanted, "{kind:?}");
        }
        let skipped = skipped_faults(&full);
        assert!(skipped.iter().any(|s| s.starts_with("net_blackhole worker-kafka:")), "{skipped:?}");
        assert!(skipped_faults(&Options::full("railhook".into())).is_empty());
    }

    #[test]
    fn the_quick_plan_crashes_postgres_and_only_filters() {
        let mut opts = Options::quick("railhook".into());
        assert!(plan_faults(&opts).iter().any(|f| f.kind == FaultKind::PostgresCrash));
        opts.only = Some(vec![FaultKind::PostgresCrash]);
        assert_eq!(plan_faults(&opts).len(), 1);
        for kind in FaultKind::ALL {
            assert_eq!(FaultKind::parse(kind.name()), Some(kind));
            assert_eq!(serde_json::to_value(kind).unwrap(), serde_json::Value::String(kind.name().into()));
        }
    }
}
