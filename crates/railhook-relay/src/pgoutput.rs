//! Decoding of the pgoutput logical replication protocol (version 1), the payload of each
//! XLogData message on a `START_REPLICATION ... LOGICAL` stream.
//!
//! Only what the relay needs is decoded: Begin, Commit, Relation, Insert, and logical
//! decoding messages (`pg_logical_emit_message`, used as heartbeats); Origin and Type are
//! decoded so a stream that carries them does not stop. Anything else (Update, Delete and
//! Truncate cannot come from a `publish = 'insert'` publication) is an error, never skipped:
//! a relay that silently drops what it does not understand could drop an announcement.
//!
//! The decoder never panics and never allocates more than the input's length: every length
//! read from the wire is checked against the bytes that remain.
//! Reference: <https://www.postgresql.org/docs/current/protocol-logicalrep-message-formats.html>

use railhook_core::Lsn;

/// Microseconds since 2000-01-01, Postgres's epoch.
pub type PgTimestamp = i64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin { final_lsn: Lsn, commit_time: PgTimestamp, xid: u32 },
    Commit { flags: u8, commit_lsn: Lsn, end_lsn: Lsn, commit_time: PgTimestamp },
    Relation(Relation),
    Insert { relation_id: u32, tuple: Vec<TupleValue> },
    /// `pg_logical_emit_message`; `lsn` is the message's position.
    Logical { transactional: bool, lsn: Lsn, prefix: String, content: Vec<u8> },
    Origin { commit_lsn: Lsn, name: String },
    Type { type_id: u32, namespace: String, name: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    pub replica_identity: u8,
    pub columns: Vec<Column>,
}

impl Relation {
    /// Index of the column called `name`. Columns are mapped by name, never by position, so
    /// a column added to the table later does not shift the others.
    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    pub flags: u8,
    pub name: String,
    pub type_id: u32,
    pub type_modifier: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TupleValue {
    Null,
    /// A TOASTed value that did not change (only in updates; listed for completeness).
    UnchangedToast,
    /// The value in Postgres's text output format.
    Text(Vec<u8>),
    Binary(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("pgoutput message is truncated: needed {needed} more bytes at offset {offset}")]
    Truncated { offset: usize, needed: usize },
    #[error("unknown pgoutput message type {0:?} (0x{0:02x}); the relay refuses to skip it")]
    UnknownMessage(u8),
    #[error("pgoutput message type {0:?} is not expected from an insert-only publication")]
    Unexpected(char),
    #[error("unknown tuple value kind {0:?} at offset {1}")]
    UnknownTupleKind(u8, usize),
    #[error("string without terminating NUL at offset {0}")]
    UnterminatedString(usize),
    #[error("string at offset {0} is not UTF-8")]
    NotUtf8(usize),
    #[error("negative length {0} at offset {1}")]
    NegativeLength(i32, usize),
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    #[error("the message is empty")]
    Empty,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let remaining = self.buf.len() - self.pos;
        if n > remaining {
            return Err(DecodeError::Truncated { offset: self.pos, needed: n - remaining });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(self.u32()? as i32)
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn lsn(&mut self) -> Result<Lsn, DecodeError> {
        Ok(Lsn(self.u64()?))
    }
    fn timestamp(&mut self) -> Result<PgTimestamp, DecodeError> {
        Ok(self.u64()? as i64)
    }
    fn len(&mut self) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = self.i32()?;
        usize::try_from(n).map_err(|_| DecodeError::NegativeLength(n, at))
    }
    fn cstr(&mut self) -> Result<String, DecodeError> {
        let start = self.pos;
        let rest = &self.buf[self.pos..];
        let nul = rest.iter().position(|&b| b == 0).ok_or(DecodeError::UnterminatedString(start))?;
        let s = std::str::from_utf8(&rest[..nul]).map_err(|_| DecodeError::NotUtf8(start))?.to_string();
        self.pos += nul + 1;
        Ok(s)
    }
    fn done(&self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(DecodeError::Trailing(n)),
        }
    }
}

/// Decodes one pgoutput message (the `data` of one XLogData).
pub fn decode(buf: &[u8]) -> Result<Message, DecodeError> {
    let mut r = Reader { buf, pos: 0 };
    let tag = r.u8().map_err(|_| DecodeError::Empty)?;
    let msg = match tag {
        b'B' => Message::Begin { final_lsn: r.lsn()?, commit_time: r.timestamp()?, xid: r.u32()? },
        b'C' => Message::Commit { flags: r.u8()?, commit_lsn: r.lsn()?, end_lsn: r.lsn()?, commit_time: r.timestamp()? },
        b'R' => {
            let id = r.u32()?;
            let namespace = r.cstr()?;
            let name = r.cstr()?;
            let replica_identity = r.u8()?;
            let n = r.u16()? as usize;
            // Each column takes at least 10 bytes: never reserve more than the input can hold.
            let mut columns = Vec::with_capacity(n.min(buf.len() / 10));
            for _ in 0..n {
                columns.push(Column { flags: r.u8()?, name: r.cstr()?, type_id: r.u32()?, type_modifier: r.i32()? });
            }
            Message::Relation(Relation { id, namespace, name, replica_identity, columns })
        }
        b'I' => {
            let relation_id = r.u32()?;
            match r.u8()? {
                b'N' => {}
                other => return Err(DecodeError::UnknownTupleKind(other, r.pos - 1)),
            }
            Message::Insert { relation_id, tuple: tuple(&mut r, buf.len())? }
        }
        b'M' => {
            let transactional = r.u8()? != 0;
            let lsn = r.lsn()?;
            let prefix = r.cstr()?;
            let n = r.len()?;
            Message::Logical { transactional, lsn, prefix, content: r.take(n)?.to_vec() }
        }
        b'O' => Message::Origin { commit_lsn: r.lsn()?, name: r.cstr()? },
        b'Y' => Message::Type { type_id: r.u32()?, namespace: r.cstr()?, name: r.cstr()? },
        b'U' | b'D' | b'T' => return Err(DecodeError::Unexpected(tag as char)),
        other => return Err(DecodeError::UnknownMessage(other)),
    };
    r.done()?;
    Ok(msg)
}

fn tuple(r: &mut Reader<'_>, total: usize) -> Result<Vec<TupleValue>, DecodeError> {
    let n = r.u16()? as usize;
    // Each value takes at least one byte.
    let mut values = Vec::with_capacity(n.min(total));
    for _ in 0..n {
        let at = r.pos;
        values.push(match r.u8()? {
            b'n' => TupleValue::Null,
            b'u' => TupleValue::UnchangedToast,
            b't' => {
                let len = r.len()?;
                TupleValue::Text(r.take(len)?.to_vec())
            }
            b'b' => {
                let len = r.len()?;
                TupleValue::Binary(r.take(len)?.to_vec())
            }
            other => return Err(DecodeError::UnknownTupleKind(other, at)),
        });
    }
    Ok(values)
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Real bytes, captured from Postgres 15 with `pg_logical_slot_peek_binary_changes(...,
    //! 'proto_version', '1', 'publication_names', ..., 'messages', 'true')` for one
    //! transaction of two outbox inserts followed by a heartbeat message.
    pub const BEGIN: &str = "42000000000ced5ce8000304a4decaedac000003c7";
    pub const RELATION: &str = "5200004a047075626c6963006f7574626f780064000a0169640000000014ffffffff0070726f6a6563745f69640000000b86ffffffff0064656c69766572795f69640000000b86ffffffff00666f72776172645f69640000000b86ffffffff00726f7574696e675f69640000000b86ffffffff00726561736f6e0000000019ffffffff00636c61696d5f746f6b656e0000000b86ffffffff00637265617465645f617400000004a0ffffffff00706f6c6c5f7374617475730000000019ffffffff00706f6c6c5f636c61696d65645f617400000004a0ffffffff";
    pub const INSERT_1: &str = "4900004a044e000a740000000131740000002430313930663061302d303030302d373030302d383030302d303030303030303030303031740000002430313930663061302d303030302d373030302d383030302d3030303030303030303030326e740000002430313930663061302d303030302d373030302d383030302d3030303030303030303030337400000007637265617465646e740000001d323032362d31322d30322031323a35313a32392e3131383436382b3030740000000750454e44494e476e";
    pub const INSERT_2: &str = "4900004a044e000a740000000132740000002430313930663061302d303030302d373030302d383030302d303030303030303030303031740000002430313930663061302d303030302d373030302d383030302d3030303030303030303030346e740000002430313930663061302d303030302d373030302d383030302d303030303030303030303033740000000572657472796e740000001d323032362d31322d30322031323a35313a32392e3131383436382b3030740000000750454e44494e476e";
    pub const COMMIT: &str = "4300000000000ced5ce8000000000ced5d18000304a4decaedac";
    pub const HEARTBEAT: &str = "4d00000000000ced5d607261696c686f6f6b0000000009686561727462656174";

    pub fn bytes(hex_text: &str) -> Vec<u8> {
        (0..hex_text.len()).step_by(2).map(|i| u8::from_str_radix(&hex_text[i..i + 2], 16).unwrap()).collect()
    }

    pub const ALL: [&str; 6] = [BEGIN, RELATION, INSERT_1, INSERT_2, COMMIT, HEARTBEAT];
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn decodes_a_captured_transaction() {
        let Message::Begin { final_lsn, xid, .. } = decode(&bytes(BEGIN)).unwrap() else { panic!("begin") };
        assert_eq!(final_lsn, "0/CED5CE8".parse().unwrap());
        assert_eq!(xid, 0x3c7);

        let Message::Relation(rel) = decode(&bytes(RELATION)).unwrap() else { panic!("relation") };
        assert_eq!((rel.namespace.as_str(), rel.name.as_str()), ("public", "outbox"));
        assert_eq!(rel.id, 0x4a04);
        let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "project_id", "delivery_id", "forward_id", "routing_id", "reason", "claim_token", "created_at", "poll_status", "poll_claimed_at"]);
        assert_eq!(rel.columns[0].type_id, 20, "id is int8");
        assert_eq!(rel.columns[1].type_id, 2950, "uuid");
        assert_eq!(rel.column_index("reason"), Some(5));

        let Message::Insert { relation_id, tuple } = decode(&bytes(INSERT_1)).unwrap() else { panic!("insert") };
        assert_eq!(relation_id, rel.id);
        assert_eq!(tuple.len(), 10);
        assert_eq!(tuple[0], TupleValue::Text(b"1".to_vec()));
        assert_eq!(tuple[3], TupleValue::Null);
        assert_eq!(tuple[5], TupleValue::Text(b"created".to_vec()));

        let Message::Commit { commit_lsn, end_lsn, .. } = decode(&bytes(COMMIT)).unwrap() else { panic!("commit") };
        assert_eq!(commit_lsn, final_lsn, "commit LSN equals Begin's final LSN");
        assert_eq!(end_lsn, "0/CED5D18".parse().unwrap());
        assert!(end_lsn > commit_lsn);

        let Message::Logical { transactional, prefix, content, .. } = decode(&bytes(HEARTBEAT)).unwrap() else { panic!("message") };
        assert!(!transactional);
        assert_eq!(prefix, "railhook");
        assert_eq!(content, b"heartbeat");
    }

    #[test]
    fn unknown_and_unexpected_messages_are_errors() {
        assert_eq!(decode(&[b'Z', 0, 0]), Err(DecodeError::UnknownMessage(b'Z')));
        assert_eq!(decode(&[b'U', 0, 0, 0, 1]), Err(DecodeError::Unexpected('U')));
        assert_eq!(decode(&[b'D']), Err(DecodeError::Unexpected('D')));
        assert_eq!(decode(&[]), Err(DecodeError::Empty));
        let mut trailing = bytes(COMMIT);
        trailing.push(0);
        assert_eq!(decode(&trailing), Err(DecodeError::Trailing(1)));
    }

    #[test]
    fn every_truncation_of_real_messages_is_an_error_not_a_panic() {
        for hex_text in ALL {
            let full = bytes(hex_text);
            for cut in 0..full.len() {
                assert!(decode(&full[..cut]).is_err(), "{} bytes of {hex_text}", cut);
            }
        }
    }

    #[test]
    fn random_mutations_never_panic() {
        let mut seed: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut decoded = 0;
        for round in 0..200_000u32 {
            let mut msg = bytes(ALL[(next() % ALL.len() as u64) as usize]);
            for _ in 0..(1 + next() % 4) {
                let i = (next() % msg.len() as u64) as usize;
                msg[i] = next() as u8;
            }
            if round % 7 == 0 {
                let len = (next() % (msg.len() as u64 + 1)) as usize;
                msg.truncate(len);
            }
            if decode(&msg).is_ok() {
                decoded += 1;
            }
        }
        // Most mutations that keep the shape still decode; the point is that none panicked.
        assert!(decoded > 0);
        // Huge declared lengths are refused without allocating them.
        let mut huge = vec![b'I', 0, 0, 0, 1, b'N', 0xff, 0xff];
        huge.extend_from_slice(&[b't', 0x7f, 0xff, 0xff, 0xff]);
        assert!(matches!(decode(&huge), Err(DecodeError::Truncated { .. })));
        assert!(matches!(decode(&[b'I', 0, 0, 0, 1, b'N', 0, 1, b't', 0xff, 0xff, 0xff, 0xff]), Err(DecodeError::NegativeLength(-1, _))));
    }
}
