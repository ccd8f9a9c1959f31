//! Typed, prefixed ids (`evt_`, `ep_`, `dlv_`, ...).
//!
//! Each id is a UUIDv7 (time-ordered, so B-tree inserts stay append-mostly) stored in
//! Postgres as `uuid` and shown to clients as `<prefix>_<26 Crockford base32 characters>`.
//! A string with the wrong prefix is a different kind of id and does not parse.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

const ALPHABET: &[u8; 32] = b"0123456789abcdefghjkmnpqrstvwxyz";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("expected an id starting with '{expected}_'")]
    WrongPrefix { expected: &'static str },
    #[error("malformed id: expected '{expected}_' followed by 26 base32 characters")]
    Malformed { expected: &'static str },
}

fn encode(uuid: Uuid) -> String {
    let mut n = uuid.as_u128();
    let mut out = [0u8; 26];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n & 31) as usize];
        n >>= 5;
    }
    // 26 * 5 = 130 bits: the first character carries only the top 3 bits.
    String::from_utf8_lossy(&out).into_owned()
}

fn decode(text: &str) -> Option<Uuid> {
    if text.len() != 26 {
        return None;
    }
    let mut n: u128 = 0;
    for (i, c) in text.bytes().enumerate() {
        let v = ALPHABET.iter().position(|&a| a == c.to_ascii_lowercase())? as u128;
        if i == 0 && v > 7 {
            return None;
        }
        n = (n << 5) | v;
    }
    Some(Uuid::from_u128(n))
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub Uuid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            /// A new time-ordered id.
            pub fn new() -> Self {
                $name(Uuid::now_v7())
            }

            pub fn as_uuid(&self) -> Uuid {
                self.0
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl From<Uuid> for $name {
            fn from(u: Uuid) -> Self {
                $name(u)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}_{}", $prefix, encode(self.0))
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                let rest = s
                    .strip_prefix($prefix)
                    .and_then(|r| r.strip_prefix('_'))
                    .ok_or(IdError::WrongPrefix { expected: $prefix })?;
                decode(rest).map($name).ok_or(IdError::Malformed { expected: $prefix })
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }

        sql_as_uuid!($name);
    };
}

/// Binds and reads a newtype over `Uuid` as the SQL `uuid` it is stored as, so statements
/// take and return typed ids instead of bare `Uuid`s.
macro_rules! sql_as_uuid {
    ($name:ident) => {
        impl postgres_types::ToSql for $name {
            fn to_sql(
                &self,
                ty: &postgres_types::Type,
                out: &mut bytes::BytesMut,
            ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
                self.0.to_sql(ty, out)
            }
            postgres_types::accepts!(UUID);
            postgres_types::to_sql_checked!();
        }

        impl<'a> postgres_types::FromSql<'a> for $name {
            fn from_sql(ty: &postgres_types::Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
                Uuid::from_sql(ty, raw).map($name)
            }
            postgres_types::accepts!(UUID);
        }
    };
}

/// The fence of a Claim (DESIGN.md 2, 6.1): a random token written with the claim; every
/// later write on the Delivery is conditional on it. The retry scheduler's token travels in
/// the announcement so that only the hint it sent can claim the row. Shown as a plain UUID:
/// it is never part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimToken(pub Uuid);

impl serde::Serialize for ClaimToken {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ClaimToken {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        text.parse().map(ClaimToken).map_err(serde::de::Error::custom)
    }
}

impl FromStr for ClaimToken {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(ClaimToken)
    }
}

impl ClaimToken {
    /// A fresh random token (v4: nothing in it is guessable from another claim).
    pub fn new() -> Self {
        ClaimToken(Uuid::new_v4())
    }
}

impl Default for ClaimToken {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for ClaimToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

sql_as_uuid!(ClaimToken);

prefixed_id!(/// An Organization: the top of tenancy.
    OrganizationId, "org");
prefixed_id!(/// A Project: holds endpoints, sources and API keys.
    ProjectId, "proj");
prefixed_id!(/// A project API key (the id, never the secret).
    ApiKeyId, "key");
prefixed_id!(/// An Event a customer's service announced.
    EventId, "evt");
prefixed_id!(/// An Endpoint: a customer URL plus its signing secrets.
    EndpointId, "ep");
prefixed_id!(/// A Subscription of an Endpoint to an event type pattern.
    SubscriptionId, "sub");
prefixed_id!(/// A Delivery: the obligation to get one Event to one Endpoint. Also the `webhook-id`.
    DeliveryId, "dlv");
prefixed_id!(/// One Attempt (HTTP request) towards a Delivery or Forward.
    AttemptId, "att");
prefixed_id!(/// An incoming Source (a provider's webhooks).
    SourceId, "src");
prefixed_id!(/// An incoming request as a provider sent it.
    IncomingEventId, "ine");
prefixed_id!(/// A Destination that incoming events are forwarded to.
    DestinationId, "dst");
prefixed_id!(/// A Forward: the obligation to get one Incoming Event to one Destination.
    ForwardId, "fwd");
prefixed_id!(/// A Replay (the Time Machine): a background job making new Deliveries of stored Events.
    ReplayId, "rpl");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks_prefix() {
        for _ in 0..1000 {
            let id = EventId::new();
            let text = id.to_string();
            assert!(text.starts_with("evt_"));
            assert_eq!(text.len(), 4 + 26);
            assert_eq!(text.parse::<EventId>().unwrap(), id);
            assert_eq!(text.parse::<EndpointId>(), Err(IdError::WrongPrefix { expected: "ep" }));
        }
        let max = EventId(Uuid::from_u128(u128::MAX)).to_string();
        assert_eq!(max.parse::<EventId>().unwrap().0.as_u128(), u128::MAX);
    }

    #[test]
    fn malformed_ids_are_errors() {
        for bad in ["evt_", "evt_123", "evt_zzzzzzzzzzzzzzzzzzzzzzzzzz", "evt_0000000000000000000000000!", "evt_ü0000000000000000000000000"] {
            assert!(bad.parse::<EventId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn ids_sort_by_creation_time() {
        let a = DeliveryId::new();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = DeliveryId::new();
        assert!(a.to_string() < b.to_string());
    }
}
