//! Which WAL position the relay may confirm to Postgres.
//!
//! Invariant (DESIGN.md section 5): the flush LSN sent in a Standby Status Update is the end
//! LSN of the newest commit such that Kafka has acknowledged every message of that commit and
//! of every earlier commit. It never points into a transaction and never moves backwards;
//! both are asserted here, where the position is computed, rather than trusted.
//!
//! Kafka acknowledges messages out of order across partitions, so each transaction counts its
//! outstanding messages and the confirmable position advances over a prefix of finished
//! transactions only.

use std::collections::VecDeque;

use railhook_core::Lsn;

/// The replication stream's messages arrived in an impossible order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("replication stream out of order: {0}")]
pub struct OrderError(pub &'static str);

/// Identifies the transaction a produced message belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Debug)]
struct Txn {
    seq: u64,
    outstanding: usize,
    /// `Some(end_lsn)` once its Commit was seen.
    end_lsn: Option<Lsn>,
}

#[derive(Debug)]
pub struct Progress {
    confirmed: Lsn,
    txns: VecDeque<Txn>,
    next_seq: u64,
    open: bool,
}

impl Progress {
    /// Starts from the slot's `confirmed_flush_lsn`.
    pub fn new(confirmed: Lsn) -> Progress {
        Progress { confirmed, txns: VecDeque::new(), next_seq: 0, open: false }
    }

    /// The position that may be confirmed now.
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// Transactions seen but not yet confirmable.
    pub fn in_flight(&self) -> usize {
        self.txns.len()
    }

    /// Errors (instead of panicking) when the stream's order is wrong: these come from the
    /// network, so the relay reports them and restarts from the slot.
    pub fn begin(&mut self) -> Result<(), OrderError> {
        if self.open {
            return Err(OrderError("Begin inside an open transaction"));
        }
        self.txns.push_back(Txn { seq: self.next_seq, outstanding: 0, end_lsn: None });
        self.next_seq += 1;
        self.open = true;
        Ok(())
    }

    /// A message of the open transaction was handed to the producer.
    pub fn produced(&mut self) -> Result<Ticket, OrderError> {
        if !self.open {
            return Err(OrderError("a change outside a transaction"));
        }
        let txn = self.txns.back_mut().expect("open transaction is queued");
        txn.outstanding += 1;
        Ok(Ticket(txn.seq))
    }

    pub fn commit(&mut self, end_lsn: Lsn) -> Result<(), OrderError> {
        if !self.open {
            return Err(OrderError("Commit without Begin"));
        }
        self.open = false;
        let txn = self.txns.back_mut().expect("open transaction is queued");
        txn.end_lsn = Some(end_lsn);
        self.advance();
        Ok(())
    }

    /// Kafka acknowledged the message behind `ticket`.
    pub fn acked(&mut self, ticket: Ticket) {
        let Some(front) = self.txns.front() else { panic!("ack {ticket:?} with nothing in flight") };
        let index = (ticket.0 - front.seq) as usize;
        let txn = &mut self.txns[index];
        assert!(txn.outstanding > 0, "more acks than messages for {ticket:?}");
        txn.outstanding -= 1;
        self.advance();
    }

    /// With nothing in flight, the server's WAL position (from a keepalive) is safe to
    /// confirm: nothing before it is owed to Kafka. An idle outbox then pins no WAL.
    pub fn idle_at(&mut self, wal_end: Lsn) {
        if self.txns.is_empty() && !self.open && wal_end > self.confirmed {
            self.confirmed = wal_end;
        }
    }

    fn advance(&mut self) {
        while let Some(front) = self.txns.front() {
            match front.end_lsn {
                Some(end) if front.outstanding == 0 => {
                    assert!(end >= self.confirmed, "flush LSN would move backwards: {end} < {}", self.confirmed);
                    self.confirmed = end;
                    self.txns.pop_front();
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_only_over_fully_acked_commits_in_order() {
        let mut p = Progress::new(Lsn(100));
        p.begin().unwrap();
        let a1 = p.produced().unwrap();
        let a2 = p.produced().unwrap();
        p.commit(Lsn(200)).unwrap();
        p.begin().unwrap();
        let b1 = p.produced().unwrap();
        p.commit(Lsn(300)).unwrap();
        assert_eq!(p.confirmed(), Lsn(100));
        p.acked(b1); // later transaction first: nothing moves
        assert_eq!(p.confirmed(), Lsn(100));
        p.acked(a1);
        assert_eq!(p.confirmed(), Lsn(100), "never mid-transaction");
        p.acked(a2);
        assert_eq!(p.confirmed(), Lsn(300), "both commits complete");
        assert_eq!(p.in_flight(), 0);
    }

    #[test]
    fn open_transaction_is_not_confirmable_even_if_acked() {
        let mut p = Progress::new(Lsn(10));
        p.begin().unwrap();
        let t = p.produced().unwrap();
        p.acked(t);
        assert_eq!(p.confirmed(), Lsn(10));
        p.idle_at(Lsn(50));
        assert_eq!(p.confirmed(), Lsn(10), "keepalive position is not confirmable with work in flight");
        p.commit(Lsn(40)).unwrap();
        assert_eq!(p.confirmed(), Lsn(40));
    }

    #[test]
    fn empty_transactions_and_idle_keepalives_advance() {
        let mut p = Progress::new(Lsn(10));
        p.begin().unwrap();
        p.commit(Lsn(20)).unwrap();
        assert_eq!(p.confirmed(), Lsn(20));
        p.idle_at(Lsn(90));
        assert_eq!(p.confirmed(), Lsn(90));
        p.idle_at(Lsn(50));
        assert_eq!(p.confirmed(), Lsn(90), "never backwards");
    }

    #[test]
    #[should_panic(expected = "backwards")]
    fn a_commit_behind_the_confirmed_position_is_refused() {
        let mut p = Progress::new(Lsn(100));
        p.begin().unwrap();
        p.commit(Lsn(50)).unwrap();
    }

    #[test]
    fn random_ack_orders_never_confirm_an_unacked_commit() {
        let mut seed: u64 = 7;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..500 {
            let mut p = Progress::new(Lsn(0));
            let mut pending: Vec<(Ticket, usize)> = Vec::new();
            let mut ends = Vec::new();
            let mut acked_per_txn = Vec::new();
            let mut sizes = Vec::new();
            for t in 0..(1 + next(8) as usize) {
                p.begin().unwrap();
                let n = next(4) as usize;
                for _ in 0..n {
                    pending.push((p.produced().unwrap(), t));
                }
                let end = Lsn(((t + 1) * 100) as u64);
                p.commit(end).unwrap();
                ends.push(end);
                sizes.push(n);
                acked_per_txn.push(0usize);
            }
            while !pending.is_empty() {
                let i = next(pending.len() as u64) as usize;
                let (ticket, t) = pending.swap_remove(i);
                p.acked(ticket);
                acked_per_txn[t] += 1;
                // The confirmed position is the end of the longest fully acked prefix.
                let prefix = acked_per_txn.iter().zip(&sizes).take_while(|(a, s)| a == s).count();
                let expect = if prefix == 0 { Lsn(0) } else { ends[prefix - 1] };
                assert_eq!(p.confirmed(), expect);
            }
            assert_eq!(p.confirmed(), *ends.last().unwrap());
        }
    }
}
