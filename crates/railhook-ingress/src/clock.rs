//! Signed times: parsing a provider's timestamp header and the tolerance window around now.

use std::time::{SystemTime, UNIX_EPOCH};

/// How far a signed time may be from now, either direction, where a provider signs one
/// (Stripe, Slack, Standard Webhooks, HubSpot, SendGrid, generic HMAC with a timestamp header).
pub const TOLERANCE_SECS: u64 = 300;

/// `now` as unix milliseconds; times before the epoch are negative. Saturates, never panics.
pub(crate) fn unix_millis(now: SystemTime) -> i64 {
    match now.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_millis()).unwrap_or(i64::MAX),
        Err(before) => i64::try_from(before.duration().as_millis())
            .map(|m| -m)
            .unwrap_or(i64::MIN),
    }
}

/// `now` as unix seconds, floored (toward the past, also before the epoch).
pub(crate) fn unix_seconds(now: SystemTime) -> i64 {
    unix_millis(now).div_euclid(1000)
}

/// A timestamp header: ASCII digits only (no sign, no fraction, no spaces inside), at most 18
/// of them so that it fits an i64 with room for unit conversions.
pub(crate) fn parse_timestamp(text: &str) -> Option<i64> {
    if text.is_empty() || text.len() > 18 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Whether `signed` is within `tolerance` of `now` (same unit), inclusive, either direction.
pub(crate) fn within(signed: i64, now: i64, tolerance: u64) -> bool {
    signed.abs_diff(now) <= tolerance
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn parsing_and_window() {
        assert_eq!(parse_timestamp("1700000000"), Some(1_700_000_000));
        for bad in ["", "+1", "-1", "1.5", "1 2", "abc", "9999999999999999999"] {
            assert_eq!(parse_timestamp(bad), None, "{bad:?}");
        }
        assert!(within(1000, 1300, 300));
        assert!(within(1300, 1000, 300));
        assert!(!within(999, 1300, 300));
        assert!(!within(1301, 1000, 300));
        assert!(!within(i64::MIN, i64::MAX, 300));
    }

    #[test]
    fn conversions_do_not_panic() {
        let t = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        assert_eq!(unix_millis(t), 1_700_000_000_123);
        assert_eq!(unix_seconds(t), 1_700_000_000);
        assert_eq!(unix_millis(UNIX_EPOCH - Duration::from_millis(5)), -5);
        assert_eq!(unix_seconds(UNIX_EPOCH - Duration::from_millis(5)), -1);
    }
}
