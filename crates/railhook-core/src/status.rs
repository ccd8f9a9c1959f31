//! Statuses, mapped to their SQL spelling in one place.

use std::fmt;
use std::str::FromStr;

/// Where a Delivery (or Forward) stands. SQL type `delivery_status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DeliveryStatus {
    /// Waiting for its next Attempt (`next_retry_at`), or for its first.
    Pending,
    /// Claimed by a worker for one Attempt; `claim_token` is the fence.
    Processing,
    /// Delivered: the receiver answered 2xx.
    Success,
    /// Abandoned: in Failed Messages until a person retries it.
    Failed,
}

impl DeliveryStatus {
    pub const ALL: [DeliveryStatus; 4] =
        [DeliveryStatus::Pending, DeliveryStatus::Processing, DeliveryStatus::Success, DeliveryStatus::Failed];

    pub fn as_sql(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "PENDING",
            DeliveryStatus::Processing => "PROCESSING",
            DeliveryStatus::Success => "SUCCESS",
            DeliveryStatus::Failed => "FAILED",
        }
    }

    pub fn is_terminal(self) -> bool {
        matches!(self, DeliveryStatus::Success | DeliveryStatus::Failed)
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_sql())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown delivery status '{0}'")]
pub struct UnknownStatus(pub String);

impl FromStr for DeliveryStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeliveryStatus::ALL
            .into_iter()
            .find(|st| st.as_sql().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownStatus(s.to_string()))
    }
}
