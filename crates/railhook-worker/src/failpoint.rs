//! Failpoints: faults that a test or the chaos suite switches on through the environment.
//! Each is read once, when the worker starts, and is off unless its variable is set. They
//! are test hooks, not settings: nothing in `railhook.toml` or the flags reaches them, and a
//! production deployment never sets them.
//!
//! - `RAILHOOK_FAILPOINT_TASK_PANIC` ([`TaskPanic`]): an attempt task panics right after its
//!   claim step, holding its Endpoint's slot, its place in ingest pacing's count and (when the
//!   claim won) a PROCESSING Delivery. What must follow: the slot and the count come back
//!   (the task's drop guards), and so does the Claim (PENDING and due at once,
//!   `Runner::give_back`); only if that release fails does the stuck sweep send the Delivery
//!   again after `worker.processing_timeout_seconds`.
//! - `RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS` ([`clock_ahead`]): this host's wall clock, as the
//!   worker reads it (`crate::clock::host_now`), runs that many milliseconds ahead (the chaos
//!   suite's `clock_skew`). What must follow: retries are still timed on the database's
//!   clock, neither early nor late.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

use crate::error::{ErrorKind, WorkerError};

/// The variable of [`clock_ahead`].
pub const CLOCK_AHEAD_ENV: &str = "RAILHOOK_FAILPOINT_CLOCK_AHEAD_MS";

/// How far ahead this host's wall clock is to run, as `CLOCK_AHEAD_ENV` says (whole
/// milliseconds, either sign); zero when unset or unreadable. Read once.
pub fn clock_ahead() -> chrono::Duration {
    static AHEAD: std::sync::OnceLock<chrono::Duration> = std::sync::OnceLock::new();
    *AHEAD.get_or_init(|| {
        let ms = std::env::var(CLOCK_AHEAD_ENV).ok().and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(0);
        chrono::Duration::milliseconds(ms)
    })
}

/// The variable of [`TaskPanic`].
pub const TASK_PANIC_ENV: &str = "RAILHOOK_FAILPOINT_TASK_PANIC";

/// Which attempt tasks panic: `every:N` (the N-th, 2N-th, ... task of this worker process) or
/// `probability:P` (each with probability P, 0 < P <= 1); a bare number is either, by its
/// value (below 1 a probability, a whole number from 1 every N-th), the form the chaos suite
/// sets (`0.05`).
#[derive(Debug)]
pub struct TaskPanic {
    rule: Rule,
    /// Tasks that asked so far (for `every:N`).
    asked: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Rule {
    Every(u64),
    Probability(f64),
}

impl TaskPanic {
    /// From the process environment: `None` when the variable is unset or empty; an error
    /// (the worker does not start) when it is set to something else than the two forms.
    pub fn from_env() -> Result<Option<TaskPanic>, WorkerError> {
        match std::env::var(TASK_PANIC_ENV) {
            Ok(value) if !value.trim().is_empty() => TaskPanic::parse(&value)
                .map(Some)
                .map_err(|e| WorkerError::new(ErrorKind::Misconfigured, format!("{TASK_PANIC_ENV}={value}: {e}"), None)),
            _ => Ok(None),
        }
    }

    pub fn parse(value: &str) -> Result<TaskPanic, String> {
        let rule = match value.trim().split_once(':') {
            Some(("every", n)) => match n.trim().parse::<u64>() {
                Ok(n) if n >= 1 => Rule::Every(n),
                _ => return Err(format!("every:N needs a whole number N of at least 1, not '{n}'")),
            },
            Some(("probability", p)) => match p.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 1.0 => Rule::Probability(p),
                _ => return Err(format!("probability:P needs 0 < P <= 1, not '{p}'")),
            },
            None => match value.trim().parse::<f64>() {
                Ok(p) if p > 0.0 && p < 1.0 => Rule::Probability(p),
                Ok(n) if n >= 1.0 && n.fract() == 0.0 && n <= u64::MAX as f64 => Rule::Every(n as u64),
                _ => return Err("expected every:N, probability:P, a probability below 1 or a whole number N".into()),
            },
            _ => return Err("expected every:N, probability:P, a probability below 1 or a whole number N".into()),
        };
        Ok(TaskPanic { rule, asked: AtomicU64::new(0) })
    }

    /// Whether this task panics.
    pub fn fires(&self) -> bool {
        match self.rule {
            Rule::Every(n) => (self.asked.fetch_add(1, Ordering::Relaxed) + 1) % n == 0,
            Rule::Probability(p) => rand::rng().random_bool(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_n_fires_on_each_nth_task() {
        let f = TaskPanic::parse("every:3").unwrap();
        let fired: Vec<bool> = (0..7).map(|_| f.fires()).collect();
        assert_eq!(fired, [false, false, true, false, false, true, false]);
        assert!((0..5).all(|_| TaskPanic::parse("every:1").unwrap().fires()));
    }

    #[test]
    fn a_probability_of_one_always_fires() {
        let f = TaskPanic::parse("probability:1").unwrap();
        assert!((0..100).all(|_| f.fires()));
        let rare = TaskPanic::parse("probability:0.001").unwrap();
        assert!((0..100).filter(|_| rare.fires()).count() < 20);
    }

    #[test]
    fn a_bare_number_is_a_probability_below_1_and_a_period_from_1() {
        assert_eq!(TaskPanic::parse("0.05").unwrap().rule, Rule::Probability(0.05));
        assert_eq!(TaskPanic::parse(" 3 ").unwrap().rule, Rule::Every(3));
        assert_eq!(TaskPanic::parse("1").unwrap().rule, Rule::Every(1));
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in ["", "0", "-1", "2.5", "nan", "every:0", "every:-1", "every:x", "probability:0", "probability:1.5", "probability:nan", "sometimes:2"] {
            assert!(TaskPanic::parse(bad).is_err(), "{bad} was accepted");
        }
    }
}
