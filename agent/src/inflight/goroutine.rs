//! Go calls in flight: which look shows the goroutine, and the look at a goroutine that no
//! thread runs.
//!
//! In: a goroutine (`g`, the key of its calls in `RUNNING_TIMES`), the looks at its
//! process's threads, and the process's memory. Out: the look that shows it running (its
//! R14 is `g` and its SP lies within `g`'s stack), or a look made from the goroutine's
//! saved state when it is parked or waiting for a thread; with the goroutine's stack top
//! at that moment, which turns the call's height (its distance from the top, stable while
//! the runtime copies the stack) into an address.
//!
//! Why both: a goroutine moves between threads, and one that waits (a channel, a lock,
//! `time.Sleep`, its turn after a preemption) is on no thread at all; its registers are then
//! in `g.sched`, which the runtime wrote when it stopped running it.

use std::{fs::File, os::unix::fs::FileExt as _};

use crate::{sys, triggers::event::StackCopy, triggers::event::UserRegs};

/// Words of `runtime.g` read: `stack.lo`, `stack.hi`, `stackguard0`, `stackguard1`,
/// `_panic`, `_defer`, `m`, then `sched` (a `gobuf`: `sp`, `pc`, `g`, `ctxt`, `ret`, `lr`,
/// `bp`) — the layout of Go 1.4 to today on amd64, checked on each read by `sched.g`
/// pointing back at the goroutine.
const HEADER_WORDS: usize = 14;
const LO: usize = 0;
const HI: usize = 1;
const M: usize = 6;
const SCHED_SP: usize = 7;
const SCHED_PC: usize = 8;
const SCHED_G: usize = 9;
const SCHED_BP: usize = 13;

/// Bytes of a parked goroutine's stack copied from its saved SP up (as a look's).
const STACK_BYTES: u64 = 8192;

/// A goroutine's stack bounds at a look: `[lo, hi)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct GoStack {
    pub g: u64,
    pub lo: u64,
    pub hi: u64,
}

impl GoStack {
    /// Whether a thread whose look read `self` (its R14 and the bounds at it) with stack
    /// pointer `sp` was running goroutine `g`: R14 alone may be stale in assembly code; SP
    /// on `g`'s own stack is not.
    pub(super) fn runs(&self, g: u64, sp: u64) -> bool {
        g != 0 && self.g == g && (self.lo..self.hi).contains(&sp)
    }

    /// The address of a frame at `height` (relative to the stack's top, negative).
    pub(super) fn address(&self, height: u64) -> u64 {
        self.hi.wrapping_add(height)
    }
}

/// A look at goroutine `g` of process `tgid` from its saved state, when no thread runs it
/// (`g.m` is nil): its saved PC, SP and BP, and its stack from SP up, read twice around the
/// stack copy, kept only when the saved state did not change meanwhile. `None`: it runs on
/// a thread, it is not a goroutine (the layout check failed), or its memory is unreadable
/// (the process is gone, or ptrace access is denied). Returns the time read before the
/// copy, the copy and the stack bounds.
pub(super) fn parked(tgid: u32, g: u64) -> Option<(u64, StackCopy, GoStack)> {
    let mem = File::open(format!("/proc/{tgid}/mem")).ok()?;
    let look_ns = sys::monotonic_ns();
    let before = header(&mem, g)?;
    if before[SCHED_G] != g || before[M] != 0 || before[SCHED_PC] == 0 {
        return None;
    }
    let (lo, hi, sp) = (before[LO], before[HI], before[SCHED_SP]);
    if !(lo..hi).contains(&sp) {
        return None;
    }
    let len = usize::try_from((hi - sp).min(STACK_BYTES)).ok()?;
    let mut bytes = vec![0u8; len];
    mem.read_exact_at(&mut bytes, sp).ok()?;
    let after = header(&mem, g)?;
    let same = [LO, HI, M, SCHED_SP, SCHED_PC, SCHED_BP]
        .iter()
        .all(|&i| before[i] == after[i]);
    if !same {
        return None; // it ran meanwhile: the next scan looks again
    }
    let copy = StackCopy {
        regs: UserRegs {
            ip: before[SCHED_PC],
            sp,
            bp: before[SCHED_BP],
        },
        bytes,
    };
    Some((look_ns, copy, GoStack { g, lo, hi }))
}

/// The first [`HEADER_WORDS`] words of `runtime.g` at `g`.
fn header(mem: &File, g: u64) -> Option<[u64; HEADER_WORDS]> {
    let mut raw = [0u8; HEADER_WORDS * 8];
    mem.read_exact_at(&mut raw, g).ok()?;
    let mut words = [0u64; HEADER_WORDS];
    for (word, bytes) in words.iter_mut().zip(raw.chunks_exact(8)) {
        *word = u64::from_le_bytes(bytes.try_into().ok()?);
    }
    Some(words)
}

#[cfg(test)]
mod tests {
    use super::GoStack;

    #[test]
    fn a_thread_runs_a_goroutine_only_with_its_sp_on_the_goroutine_stack() {
        let stack = GoStack {
            g: 0x00c0_0000_1100,
            lo: 0xc000_1000,
            hi: 0xc000_3000,
        };
        assert!(stack.runs(0x00c0_0000_1100, 0xc000_2000));
        assert!(
            !stack.runs(0x00c0_0000_1100, 0xc000_3000),
            "SP at hi is outside"
        );
        assert!(!stack.runs(0x00c0_0000_1100, 0x7ffd_0000), "g0's stack");
        assert!(
            !stack.runs(0x00c0_0000_2200, 0xc000_2000),
            "another goroutine"
        );
        assert!(!GoStack::default().runs(0, 0));
        // A frame 0x40 below the top.
        assert_eq!(stack.address(0u64.wrapping_sub(0x40)), 0xc000_2fc0);
    }
}
