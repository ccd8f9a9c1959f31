//! The retry ladder (DESIGN.md 6.3): the wait before the next Attempt, jittered to 50-150%,
//! pushed later (never earlier) by a clamped `Retry-After`, and the hard cap.

use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;

/// What to do after an Attempt that asks for a retry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Step {
    RetryAt(DateTime<Utc>),
    /// Attempts used up, or the next one would fall after the hard cap.
    GiveUp(GiveUp),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    AttemptsExhausted,
    HardCap,
}

/// `attempts_made` counts the Attempt that just failed. `delays[k]` is the wait after the
/// (k+1)-th Attempt; a ladder shorter than `max_attempts - 1` repeats its last wait.
/// `jitter` is a factor in [0.5, 1.5].
pub fn next_step(
    now: DateTime<Utc>,
    attempts_made: i32,
    max_attempts: i32,
    delays: &[i32],
    jitter: f64,
    retry_after: Option<Duration>,
    retry_after_max: Duration,
    ladder_started_at: DateTime<Utc>,
    max_age: Duration,
) -> Step {
    if attempts_made >= max_attempts {
        return Step::GiveUp(GiveUp::AttemptsExhausted);
    }
    let index = (attempts_made.max(1) as usize - 1).min(delays.len().saturating_sub(1));
    let base = delays.get(index).copied().unwrap_or(60).max(0) as f64;
    let mut wait = Duration::from_secs_f64(base * jitter.clamp(0.5, 1.5));
    if let Some(asked) = retry_after {
        // Only ever later than the ladder, and never beyond the clamp.
        wait = wait.max(asked.min(retry_after_max));
    }
    let at = now + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::MAX);
    let cap = ladder_started_at + chrono::Duration::from_std(max_age).unwrap_or(chrono::Duration::MAX);
    if at > cap {
        return Step::GiveUp(GiveUp::HardCap);
    }
    Step::RetryAt(at)
}

/// A factor uniform in [0.5, 1.5].
pub fn jitter() -> f64 {
    rand::rng().random_range(0.5..=1.5)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LADDER: [i32; 6] = [60, 300, 900, 3600, 21600, 86400];

    fn step(made: i32, jitter: f64, retry_after: Option<u64>) -> Step {
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        next_step(t0, made, 7, &LADDER, jitter, retry_after.map(Duration::from_secs), Duration::from_secs(21600), t0, Duration::from_secs(96 * 3600))
    }

    fn secs(s: Step) -> i64 {
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        match s {
            Step::RetryAt(at) => (at - t0).num_seconds(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn follows_the_ladder_and_gives_up_after_the_last_attempt() {
        let waits: Vec<i64> = (1..7).map(|made| secs(step(made, 1.0, None))).collect();
        assert_eq!(waits, [60, 300, 900, 3600, 21600, 86400]);
        // About 31 hours from the first Attempt to the seventh.
        assert_eq!(waits.iter().sum::<i64>(), 112_860);
        assert_eq!(step(7, 1.0, None), Step::GiveUp(GiveUp::AttemptsExhausted));
    }

    #[test]
    fn jitter_stays_within_half_and_one_and_a_half() {
        assert_eq!(secs(step(1, 0.5, None)), 30);
        assert_eq!(secs(step(1, 1.5, None)), 90);
        assert_eq!(secs(step(1, 9.0, None)), 90, "clamped");
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.5..=1.5).contains(&j));
        }
    }

    #[test]
    fn retry_after_only_pushes_later_and_is_clamped() {
        assert_eq!(secs(step(1, 1.0, Some(10))), 60, "earlier than the ladder: ignored");
        assert_eq!(secs(step(1, 1.0, Some(600))), 600);
        assert_eq!(secs(step(1, 1.0, Some(10_000_000))), 21600, "clamped");
    }

    #[test]
    fn the_hard_cap_ends_the_ladder() {
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let late = t0 + chrono::Duration::hours(95);
        let s = next_step(late, 6, 7, &LADDER, 1.0, None, Duration::from_secs(21600), t0, Duration::from_secs(96 * 3600));
        assert_eq!(s, Step::GiveUp(GiveUp::HardCap));
    }

    #[test]
    fn a_short_ladder_repeats_its_last_wait() {
        let t0 = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().with_timezone(&Utc);
        let s = next_step(t0, 5, 10, &[1, 2], 1.0, None, Duration::from_secs(60), t0, Duration::from_secs(3600));
        assert_eq!(s, Step::RetryAt(t0 + chrono::Duration::seconds(2)));
    }
}
