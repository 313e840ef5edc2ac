//! The endpoint's open connections, and which to close when there are too many.
//!
//! In: each accepted connection ([`Table::admit`]), and what it is doing ([`Slot`]: has
//! it sent a complete request yet, is one being answered). Out: an [`Admission`] for the
//! new connection, and the connections to shed, told through their [`ShedSignal`].
//!
//! The policy keeps health probes answered whatever other clients do: a new connection is
//! always taken while the table holds fewer than `soft_cap` connections; at the cap, the
//! oldest connection that has not sent a complete request yet is shed to make room (a slow
//! or silent client: slowloris), else the oldest idle keep-alive connection; only when
//! every connection is answering a request (which takes milliseconds) is the new one
//! taken beyond the cap, up to `hard_cap`, and refused after that. So a flood of silent
//! connections costs at most `soft_cap` fds and buffers, and a probe that sends its
//! request at once is never the one shed.
#![forbid(unsafe_code)]

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
};

use tokio::sync::oneshot;

/// What a connection is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Accepted, no complete request head yet.
    Fresh,
    /// Answering a request.
    Busy,
    /// Answered, waiting for the next request of a keep-alive connection.
    Idle,
}

#[derive(Debug)]
struct Entry {
    state: State,
    /// Taken when the connection is shed.
    shed: Option<oneshot::Sender<()>>,
}

#[derive(Debug)]
struct Inner {
    next_id: u64,
    /// By id: ids grow with acceptance, so the first is the oldest.
    open: BTreeMap<u64, Entry>,
    soft_cap: usize,
    hard_cap: usize,
}

/// The connection table (one per endpoint).
#[derive(Debug)]
pub struct Table {
    inner: Mutex<Inner>,
}

/// Received when the connection is shed: close it.
pub type ShedSignal = oneshot::Receiver<()>;

/// The outcome of [`Table::admit`].
#[derive(Debug)]
pub enum Admission {
    /// Serve it; drop the slot when it closes. `shed` connections were closed to make room
    /// (each counted once, by the caller).
    Admitted {
        slot: Slot,
        signal: ShedSignal,
        shed: usize,
    },
    /// Every connection is answering a request and the hard cap is reached: close it.
    Refused,
}

impl Table {
    /// A table that sheds at `soft_cap` connections and refuses at `hard_cap`.
    pub fn new(soft_cap: usize, hard_cap: usize) -> Arc<Self> {
        let soft_cap = soft_cap.max(1);
        Arc::new(Self {
            inner: Mutex::new(Inner {
                next_id: 0,
                open: BTreeMap::new(),
                soft_cap,
                hard_cap: hard_cap.max(soft_cap),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Plain data: a panic elsewhere cannot leave it half-written.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a new connection, shedding another when the table is full (module doc).
    pub fn admit(self: &Arc<Self>) -> Admission {
        let mut inner = self.lock();
        let mut shed = 0;
        while inner.open.len() >= inner.soft_cap {
            let victim = inner
                .open
                .iter()
                .find(|(_, e)| e.state == State::Fresh)
                .or_else(|| inner.open.iter().find(|(_, e)| e.state == State::Idle))
                .map(|(&id, _)| id);
            let Some(id) = victim else {
                break;
            };
            if let Some(mut entry) = inner.open.remove(&id)
                && let Some(tx) = entry.shed.take()
            {
                let _ = tx.send(());
            }
            shed += 1;
        }
        if inner.open.len() >= inner.hard_cap {
            return Admission::Refused;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let (tx, signal) = oneshot::channel();
        inner.open.insert(
            id,
            Entry {
                state: State::Fresh,
                shed: Some(tx),
            },
        );
        Admission::Admitted {
            slot: Slot {
                table: Arc::clone(self),
                id,
            },
            signal,
            shed,
        }
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.lock().open.len()
    }

    /// No connection open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn set(&self, id: u64, state: State) {
        if let Some(entry) = self.lock().open.get_mut(&id) {
            entry.state = state;
        }
    }
}

/// One admitted connection's place in the table; dropping it removes the connection.
#[derive(Debug)]
pub struct Slot {
    table: Arc<Table>,
    id: u64,
}

impl Slot {
    /// A complete request head arrived: it is being answered (not sheddable).
    pub fn busy(&self) {
        self.table.set(self.id, State::Busy);
    }

    /// Its answer went out: idle until the next request (sheddable after the fresh ones).
    pub fn idle(&self) {
        self.table.set(self.id, State::Idle);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.table.lock().open.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(a: Admission) -> (Slot, ShedSignal, usize) {
        match a {
            Admission::Admitted { slot, signal, shed } => (slot, signal, shed),
            Admission::Refused => panic!("refused"),
        }
    }

    #[test]
    fn at_the_cap_the_oldest_silent_connection_goes_first() {
        let table = Table::new(3, 4);
        let (a, mut a_sig, _) = admitted(table.admit());
        let (b, mut b_sig, _) = admitted(table.admit());
        let (c, mut c_sig, _) = admitted(table.admit());
        // a answered a request and is idle, b is being answered, c has sent nothing.
        a.idle();
        b.busy();
        let (d, _, shed) = admitted(table.admit());
        assert_eq!(shed, 1);
        assert!(c_sig.try_recv().is_ok(), "the silent one is shed");
        assert!(a_sig.try_recv().is_err() && b_sig.try_recv().is_err());
        assert_eq!(table.len(), 3);
        // No silent one left: the idle keep-alive connection goes next, never the busy one.
        d.busy();
        let (_e, _, shed) = admitted(table.admit());
        assert_eq!(shed, 1);
        assert!(a_sig.try_recv().is_ok());
        assert!(b_sig.try_recv().is_err());
        drop((a, c));
    }

    #[test]
    fn busy_connections_let_new_ones_in_up_to_the_hard_cap() {
        let table = Table::new(2, 3);
        let slots: Vec<Slot> = (0..2)
            .map(|_| {
                let (slot, _, _) = admitted(table.admit());
                slot.busy();
                slot
            })
            .collect();
        let (third, _, shed) = admitted(table.admit());
        assert_eq!(shed, 0);
        third.busy();
        assert!(matches!(table.admit(), Admission::Refused));
        drop(slots);
        assert_eq!(table.len(), 1);
        let (_, _, shed) = admitted(table.admit());
        assert_eq!(shed, 0);
    }

    #[test]
    fn a_thousand_silent_connections_keep_the_newest_within_the_cap() {
        let table = Table::new(64, 80);
        let mut kept = Vec::new();
        let mut shed_total = 0;
        for _ in 0..1000 {
            let (slot, signal, shed) = admitted(table.admit());
            shed_total += shed;
            kept.push((slot, signal));
        }
        assert_eq!(table.len(), 64);
        assert_eq!(shed_total, 1000 - 64);
        // The last 64 are the ones still open.
        let open: usize = kept
            .iter_mut()
            .skip(1000 - 64)
            .filter_map(|(_, s)| s.try_recv().is_err().then_some(()))
            .count();
        assert_eq!(open, 64);
    }
}
