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

/// Declares a closed set of words stored or sent as text: each variant's SQL/wire spelling
/// is written once, here, and parsing refuses anything else.
macro_rules! text_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownWord;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(UnknownWord { kind: stringify!($name), word: other.to_string() }),
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        /// Bound and read as the SQL text it is stored as; an unknown word read from the
        /// database is an error, not a silent default.
        impl postgres_types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &postgres_types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.as_str().to_sql(ty, out)
            }
            postgres_types::accepts!(TEXT, VARCHAR);
            postgres_types::to_sql_checked!();
        }

        impl<'a> postgres_types::FromSql<'a> for $name {
            fn from_sql(ty: &postgres_types::Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                Ok(<&str as postgres_types::FromSql>::from_sql(ty, raw)?.parse::<$name>()?)
            }
            postgres_types::accepts!(TEXT, VARCHAR);
        }
    };
}

#[derive(Debug, thiserror::Error)]
#[error("unknown {kind} '{word}'")]
pub struct UnknownWord {
    pub kind: &'static str,
    pub word: String,
}

text_enum!(
    /// Why an outbox row (an announcement) was written. Column `outbox.reason`, and the
    /// `reason` of the Kafka message.
    AnnouncementReason {
        /// The ingest made the Delivery (or the ingress the Forward).
        Created => "created",
        /// The retry scheduler announces a due retry or Deferral, with its claim token.
        Retry => "retry",
        /// A sweep or the relay's slot recovery announces it again.
        Reannounce => "reannounce",
        /// A person asked for it again (Failed Messages, bulk retry).
        ManualRetry => "manual_retry",
        /// A Replay (the Time Machine) made it.
        Replay => "replay",
    }
);

text_enum!(
    /// Why a claim was a Deferral: the Claim released before anything was sent, no Attempt
    /// spent (DESIGN.md 2). Also the `reason` label of `railhook_worker_deferrals_total`.
    DeferralReason {
        CircuitOpen => "circuit_open",
        CircuitHalfOpen => "circuit_half_open",
        EndpointConcurrency => "endpoint_concurrency",
        ProjectConcurrency => "project_concurrency",
        EndpointRate => "endpoint_rate",
        ProjectRate => "project_rate",
        EndpointDisabled => "endpoint_disabled",
        /// The ordering buffer: an earlier Delivery of the Endpoint is unresolved.
        Ordering => "ordering",
    }
);

text_enum!(
    /// A change of an Endpoint's circuit breaker, as the finalise reports it.
    CircuitChange {
        Opened => "opened",
        Closed => "closed",
        Reopened => "reopened",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_unknown_ones_are_refused() {
        for r in AnnouncementReason::ALL {
            assert_eq!(r.as_str().parse::<AnnouncementReason>().unwrap(), *r);
            assert_eq!(serde_json::to_string(r).unwrap(), format!("\"{}\"", r.as_str()));
        }
        for r in DeferralReason::ALL {
            assert_eq!(r.as_str().parse::<DeferralReason>().unwrap(), *r);
        }
        for c in CircuitChange::ALL {
            assert_eq!(c.as_str().parse::<CircuitChange>().unwrap(), *c);
        }
        assert!("Created".parse::<AnnouncementReason>().is_err());
        assert!("".parse::<DeferralReason>().is_err());
        assert!(serde_json::from_str::<CircuitChange>("\"half\"").is_err());
    }
}
