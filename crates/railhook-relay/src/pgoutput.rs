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
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
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
            // Each column takes at least 10 bytes: never reserve more than what remains of
            // the input can hold, whatever the count says.
            let mut columns = Vec::with_capacity(n.min(r.remaining() / 10));
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
            Message::Insert { relation_id, tuple: tuple(&mut r)? }
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

fn tuple(r: &mut Reader<'_>) -> Result<Vec<TupleValue>, DecodeError> {
    let n = r.u16()? as usize;
    // Each value takes at least one byte of what remains.
    let mut values = Vec::with_capacity(n.min(r.remaining()));
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

/// Property tests (proptest): the decoder against arbitrary bytes, and against valid messages
/// that are then truncated, mutated, or given length fields that promise more than is there.
#[cfg(test)]
mod props {
    use super::fixtures::{bytes, ALL};
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;

    /// A message in pgoutput's wire format, with the offsets of its i32 length fields and its
    /// u16 count fields, so that tests can inflate them.
    #[derive(Debug, Default)]
    struct Encoded {
        bytes: Vec<u8>,
        lengths: Vec<usize>,
        counts: Vec<usize>,
    }

    impl Encoded {
        fn u8(&mut self, v: u8) {
            self.bytes.push(v);
        }
        fn u16_count(&mut self, v: usize) {
            self.counts.push(self.bytes.len());
            self.bytes.extend_from_slice(&(v as u16).to_be_bytes());
        }
        fn u32(&mut self, v: u32) {
            self.bytes.extend_from_slice(&v.to_be_bytes());
        }
        fn u64(&mut self, v: u64) {
            self.bytes.extend_from_slice(&v.to_be_bytes());
        }
        fn cstr(&mut self, s: &str) {
            self.bytes.extend_from_slice(s.as_bytes());
            self.bytes.push(0);
        }
        fn sized(&mut self, data: &[u8]) {
            self.lengths.push(self.bytes.len());
            self.u32(data.len() as u32);
            self.bytes.extend_from_slice(data);
        }
    }

    fn encode(m: &Message) -> Encoded {
        let mut e = Encoded::default();
        match m {
            Message::Begin { final_lsn, commit_time, xid } => {
                e.u8(b'B');
                e.u64(final_lsn.0);
                e.u64(*commit_time as u64);
                e.u32(*xid);
            }
            Message::Commit { flags, commit_lsn, end_lsn, commit_time } => {
                e.u8(b'C');
                e.u8(*flags);
                e.u64(commit_lsn.0);
                e.u64(end_lsn.0);
                e.u64(*commit_time as u64);
            }
            Message::Relation(r) => {
                e.u8(b'R');
                e.u32(r.id);
                e.cstr(&r.namespace);
                e.cstr(&r.name);
                e.u8(r.replica_identity);
                e.u16_count(r.columns.len());
                for c in &r.columns {
                    e.u8(c.flags);
                    e.cstr(&c.name);
                    e.u32(c.type_id);
                    e.u32(c.type_modifier as u32);
                }
            }
            Message::Insert { relation_id, tuple } => {
                e.u8(b'I');
                e.u32(*relation_id);
                e.u8(b'N');
                e.u16_count(tuple.len());
                for v in tuple {
                    match v {
                        TupleValue::Null => e.u8(b'n'),
                        TupleValue::UnchangedToast => e.u8(b'u'),
                        TupleValue::Text(d) => {
                            e.u8(b't');
                            e.sized(d);
                        }
                        TupleValue::Binary(d) => {
                            e.u8(b'b');
                            e.sized(d);
                        }
                    }
                }
            }
            Message::Logical { transactional, lsn, prefix, content } => {
                e.u8(b'M');
                e.u8(u8::from(*transactional));
                e.u64(lsn.0);
                e.cstr(prefix);
                e.sized(content);
            }
            Message::Origin { commit_lsn, name } => {
                e.u8(b'O');
                e.u64(commit_lsn.0);
                e.cstr(name);
            }
            Message::Type { type_id, namespace, name } => {
                e.u8(b'Y');
                e.u32(*type_id);
                e.cstr(namespace);
                e.cstr(name);
            }
        }
        e
    }

    /// Text without NUL (a C string on the wire), including multi-byte characters.
    fn cstring() -> impl Strategy<Value = String> {
        vec(any::<char>().prop_map(|c| if c == '\0' { '.' } else { c }), 0..12).prop_map(String::from_iter)
    }

    fn value() -> impl Strategy<Value = TupleValue> {
        prop_oneof![
            Just(TupleValue::Null),
            Just(TupleValue::UnchangedToast),
            vec(any::<u8>(), 0..40).prop_map(TupleValue::Text),
            vec(any::<u8>(), 0..40).prop_map(TupleValue::Binary),
        ]
    }

    fn message() -> impl Strategy<Value = Message> {
        let lsn = any::<u64>().prop_map(Lsn);
        let column = (any::<u8>(), cstring(), any::<u32>(), any::<i32>())
            .prop_map(|(flags, name, type_id, type_modifier)| Column { flags, name, type_id, type_modifier });
        prop_oneof![
            (lsn.clone(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| Message::Begin { final_lsn, commit_time, xid }),
            (any::<u8>(), lsn.clone(), lsn.clone(), any::<i64>())
                .prop_map(|(flags, commit_lsn, end_lsn, commit_time)| Message::Commit { flags, commit_lsn, end_lsn, commit_time }),
            (any::<u32>(), cstring(), cstring(), any::<u8>(), vec(column, 0..12)).prop_map(|(id, namespace, name, replica_identity, columns)| {
                Message::Relation(Relation { id, namespace, name, replica_identity, columns })
            }),
            (any::<u32>(), vec(value(), 0..12)).prop_map(|(relation_id, tuple)| Message::Insert { relation_id, tuple }),
            (any::<bool>(), lsn.clone(), cstring(), vec(any::<u8>(), 0..64))
                .prop_map(|(transactional, lsn, prefix, content)| Message::Logical { transactional, lsn, prefix, content }),
            (lsn, cstring()).prop_map(|(commit_lsn, name)| Message::Origin { commit_lsn, name }),
            (any::<u32>(), cstring(), cstring()).prop_map(|(type_id, namespace, name)| Message::Type { type_id, namespace, name }),
        ]
    }

    fn sized_value() -> impl Strategy<Value = TupleValue> {
        prop_oneof![vec(any::<u8>(), 0..40).prop_map(TupleValue::Text), vec(any::<u8>(), 0..40).prop_map(TupleValue::Binary)]
    }

    /// Messages that carry at least one i32 length field.
    fn message_with_lengths() -> impl Strategy<Value = Message> {
        prop_oneof![
            (any::<u32>(), vec(value(), 0..6), sized_value(), vec(value(), 0..6)).prop_map(|(relation_id, mut before, v, after)| {
                before.push(v);
                before.extend(after);
                Message::Insert { relation_id, tuple: before }
            }),
            (any::<bool>(), any::<u64>(), cstring(), vec(any::<u8>(), 0..64))
                .prop_map(|(transactional, lsn, prefix, content)| Message::Logical { transactional, lsn: Lsn(lsn), prefix, content }),
        ]
    }

    /// Messages that carry a u16 count (Relation, Insert).
    fn message_with_counts() -> impl Strategy<Value = Message> {
        message().prop_filter("has a count", |m| matches!(m, Message::Relation(_) | Message::Insert { .. }))
    }

    /// A valid message: generated, or one of the bytes captured from Postgres.
    fn valid_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![message().prop_map(|m| encode(&m).bytes), (0..ALL.len()).prop_map(|i| bytes(ALL[i]))]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        /// Whatever arrives, `decode` returns; it never panics.
        #[test]
        fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..300)) {
            let _ = decode(&data);
        }

        /// The same, with a known message tag first, so the bytes reach the field parsers.
        #[test]
        fn arbitrary_bodies_after_a_known_tag_never_panic(tag in proptest::sample::select(b"BCRIMOYUDT".to_vec()), rest in vec(any::<u8>(), 0..300)) {
            let mut data = vec![tag];
            data.extend_from_slice(&rest);
            let _ = decode(&data);
        }

        /// The encoder here and the decoder agree on every message.
        #[test]
        fn valid_messages_round_trip(m in message()) {
            prop_assert_eq!(decode(&encode(&m).bytes), Ok(m));
        }

        /// A valid message cut short anywhere is an error: each declared field, count and
        /// length is checked against the bytes that are there.
        #[test]
        fn every_truncation_is_an_error(data in valid_bytes(), cut in any::<proptest::sample::Index>()) {
            let cut = cut.index(data.len());
            prop_assert!(decode(&data[..cut]).is_err(), "{} of {} bytes decoded", cut, data.len());
            // One extra byte at the end is refused too.
            let mut longer = data.clone();
            longer.push(0);
            prop_assert_eq!(decode(&longer), Err(DecodeError::Trailing(1)));
        }

        /// Valid messages with 1 to 6 bytes overwritten never panic.
        #[test]
        fn mutated_messages_never_panic(data in valid_bytes(), edits in vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6)) {
            let mut data = data;
            for (at, byte) in edits {
                let i = at.index(data.len());
                data[i] = byte;
            }
            let _ = decode(&data);
        }

        /// A length field that promises more bytes than the whole rest of the message holds
        /// (up to i32::MAX) is `Truncated`, and a negative one `NegativeLength`, before
        /// anything of that size is allocated (the allocation side is measured in
        /// tests/decode_alloc.rs).
        #[test]
        fn inflated_lengths_are_refused(m in message_with_lengths(), which in any::<proptest::sample::Index>(), extra in 1u32..=i32::MAX as u32, negative in any::<bool>()) {
            let e = encode(&m);
            let at = e.lengths[which.index(e.lengths.len())];
            let after = (e.bytes.len() - at - 4) as u32;
            let inflated = if negative { 0x8000_0000 | extra } else { after.saturating_add(extra).min(i32::MAX as u32) };
            let mut data = e.bytes.clone();
            data[at..at + 4].copy_from_slice(&inflated.to_be_bytes());
            let got = decode(&data);
            if negative {
                prop_assert_eq!(got, Err(DecodeError::NegativeLength(inflated as i32, at)));
            } else {
                prop_assert_eq!(got, Err(DecodeError::Truncated { offset: at + 4, needed: (inflated - after) as usize }));
            }
        }

        /// A column or value count larger than what follows is an error, not a huge reservation.
        #[test]
        fn inflated_counts_are_refused(m in message_with_counts(), which in any::<proptest::sample::Index>(), count in any::<u16>()) {
            let e = encode(&m);
            let at = e.counts[which.index(e.counts.len())];
            let declared = u16::from_be_bytes([e.bytes[at], e.bytes[at + 1]]);
            let count = declared + 1 + count % (u16::MAX - declared);
            let mut data = e.bytes.clone();
            data[at..at + 2].copy_from_slice(&count.to_be_bytes());
            prop_assert!(decode(&data).is_err());
        }
    }
}
