//! `Lsn`: a position in the Postgres write-ahead log.

use std::fmt;
use std::str::FromStr;

/// A WAL position. Shown as Postgres does (`16/B374D848`): high and low 32 bits in hex.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    /// Bytes from `earlier` to `self`, zero if `earlier` is ahead.
    pub fn bytes_since(self, earlier: Lsn) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid LSN '{0}': expected two hex numbers separated by '/', e.g. 0/16B3748")]
pub struct LsnParseError(String);

impl FromStr for Lsn {
    type Err = LsnParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (hi, lo) = s.split_once('/').ok_or_else(|| LsnParseError(s.into()))?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| LsnParseError(s.into()))?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| LsnParseError(s.into()))?;
        Ok(Lsn(((hi as u64) << 32) | lo as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn displays_like_postgres() {
        let lsn: Lsn = "16/B374D848".parse().unwrap();
        assert_eq!(lsn.0, 0x16_B374_D848);
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn(0).to_string(), "0/0");
        assert!("16".parse::<Lsn>().is_err());
        assert!("x/1".parse::<Lsn>().is_err());
        assert_eq!(Lsn(10).bytes_since(Lsn(4)), 6);
        assert_eq!(Lsn(4).bytes_since(Lsn(10)), 0);
    }
}
