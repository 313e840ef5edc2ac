//! Counts of signals received, beside tokio's streams: a stream wakes once for any number
//! of signals that arrived since its last wake, so three quick SIGHUPs become one reload
//! and nothing says so. The count tells the agent how many it folded into that reload.
//!
//! In: a signal number. Out: the number received since the last [`Counter::take`].

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

/// Signals of one kind received, counted in the handler.
#[derive(Debug)]
pub struct Counter {
    count: &'static AtomicU64,
}

impl Counter {
    /// Counts `signal` from now on (beside the handlers already registered, such as
    /// tokio's: signal-hook-registry runs every action registered for a signal).
    pub fn register(signal: libc::c_int) -> io::Result<Self> {
        // One counter per registration for the agent's lifetime (a few at most).
        let count: &'static AtomicU64 = Box::leak(Box::new(AtomicU64::new(0)));
        // SAFETY: the action only increments an atomic, which is async-signal-safe, and
        // `count` lives for the rest of the process.
        unsafe {
            signal_hook_registry::register(signal, move || {
                count.fetch_add(1, Ordering::Relaxed);
            })
        }?;
        Ok(Self { count })
    }

    /// The signals received since the last call.
    pub fn take(&self) -> u64 {
        self.count.swap(0, Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_raised_before_a_take_are_all_counted() {
        // SIGWINCH: ignored by default, so raising it cannot end the test process.
        let counter = Counter::register(libc::SIGWINCH).expect("register");
        for _ in 0..3 {
            // SAFETY: raising a signal at ourselves whose handler only counts.
            assert_eq!(unsafe { libc::raise(libc::SIGWINCH) }, 0);
        }
        assert_eq!(counter.take(), 3);
        assert_eq!(counter.take(), 0);
    }
}
