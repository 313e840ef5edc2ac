//! Loops replayed whole: the blocks of a TNT that repeats the last one, at one compare.
//!
//! In: the fast table's blocks ([`View`]) and, at each TNT packet the fast loop starts,
//! its IP and outcomes. Out: where a TNT starts at the same IP with the same outcomes as
//! the TNT before it (a loop whose body takes one packet), the [`LoopRun`] of its
//! blocks: what the fast loop would report on the way (the taken jumps), count (blocks,
//! instructions) and end at (the IP after, the last block's branch), to be taken whole
//! for as long as the trace repeats it.
//!
//! Why only repeats: real traces spend much of their time in loops (qemu's: 910,000 of
//! 1.3 M blocks in runs of TNT packets that repeat the one before), where replaying a
//! TNT's blocks whole saved 12–15 %. Runs for every (IP, outcomes) in a table, as
//! libxdc keeps them, were measured too and not kept: on traces of calls and returns
//! (mruby, foo) they cost more than they saved (table misses, builds of runs taken once,
//! mispredicted replays: 3–10 % slower); a repeat is one held run that stays in cache.
//!
//! A run takes conditional branches and direct jumps only (a call or return changes the
//! return stack), and uses all the TNT's outcomes or ends early (a *partial* run: the
//! loop takes the rest).

use super::fast_blocks::{Exit, View};
use crate::decode::pt::packets::packet::ExecMode;

/// Taken jumps a run reports at most (a one-block loop body taken six times: qemu's
/// commonest run).
pub(crate) const RUN_EVENTS: usize = 6;
/// Blocks a run walks at most: never reached (47 outcomes and [`RUN_EVENTS`] direct
/// jumps at most), a bound on the walk whatever the blocks.
const RUN_BLOCKS: u8 = 64;
/// The most outcomes of a TNT packet (a long TNT has 47).
const MAX_OUTCOMES: u8 = 47;

/// The blocks from `ip` with the TNT outcomes `key` (see [`key`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoopRun {
    pub ip: u64,
    pub key: u64,
    /// The IP after the run, and the branch that ended its last block.
    pub to: u64,
    pub last_ip: u64,
    /// Instructions of all its blocks, and of the first.
    pub insns: u32,
    pub first_ninsn: u16,
    /// Outcomes the run uses, its blocks, and its taken jumps (the first `jumps` of
    /// `events`, as (branch, target)).
    pub used: u8,
    pub blocks: u8,
    pub jumps: u8,
    /// The last block's branch is the last of those jumps.
    pub last_jump: bool,
    /// The run uses all the outcomes (its last block used the TNT's last).
    pub full: bool,
    pub events: [(u64, u64); RUN_EVENTS],
}

impl LoopRun {
    /// No run: key 0 is no key ([`key`] sets a bit above the outcomes).
    const NONE: Self = Self {
        ip: 0,
        key: 0,
        to: 0,
        last_ip: 0,
        insns: 0,
        first_ninsn: 0,
        used: 0,
        blocks: 0,
        jumps: 0,
        last_jump: false,
        full: false,
        events: [(0, 0); RUN_EVENTS],
    };
}

/// The key of `left` outcomes still to use in `bits` (the next is bit `left - 1`): the
/// outcomes under a bit that says how many; `None` for fewer than two (one block: no
/// run is shorter) or more than a TNT packet has.
#[inline]
pub(crate) fn key(bits: u64, left: u8) -> Option<u64> {
    if !(2..=MAX_OUTCOMES).contains(&left) {
        return None;
    }
    let mask = (1u64 << left) - 1;
    Some((bits & mask) | (mask + 1))
}

/// The run held for repeats, and where the last TNT started.
#[derive(Debug, Clone)]
pub(crate) struct LoopRuns {
    pub run: LoopRun,
    /// The IP and key of the last TNT that started without the held run.
    pub seen: (u64, u64),
    mode: ExecMode,
    /// The most instructions of a block in any run held (the fast loop's stall bound
    /// counts them: `FastBlocks::stall_free`).
    max_ninsn: u16,
    /// Blocks taken in runs.
    pub replayed: u64,
}

impl Default for LoopRuns {
    fn default() -> Self {
        Self {
            run: LoopRun::NONE,
            seen: (0, 0),
            mode: ExecMode::Unknown,
            max_ninsn: 0,
            replayed: 0,
        }
    }
}

impl LoopRuns {
    /// The most instructions of a block in any run held.
    pub(crate) fn max_ninsn(&self) -> u16 {
        self.max_ninsn
    }

    /// Makes the runs `mode`'s (forgetting another mode's: the same bytes are other
    /// code there).
    pub(crate) fn use_mode(&mut self, mode: ExecMode) {
        if self.mode != mode {
            self.run = LoopRun::NONE;
            self.seen = (0, 0);
            self.mode = mode;
        }
    }

    /// Whether the held run starts at `ip` with `key`.
    #[inline]
    pub(crate) fn holds(&self, ip: u64, key: u64) -> bool {
        self.run.ip == ip && self.run.key == key
    }

    /// Holds the run from `ip` with `left` outcomes in `bits` (`key`), walked through
    /// `view`; false (and the held run kept) where it takes no block, or a block on the
    /// way is not in `view` yet (then it would be shorter than it will be).
    #[inline(never)]
    pub(crate) fn hold(
        &mut self,
        view: View<'_>,
        (ip, bits, left): (u64, u64, u8),
        key: u64,
    ) -> bool {
        let Some((run, max_ninsn)) = walk(view, (ip, bits, left), key) else {
            return false;
        };
        if run.blocks == 0 {
            return false;
        }
        self.max_ninsn = self.max_ninsn.max(max_ninsn);
        self.run = run;
        true
    }
}

/// The run from `ip` (see [`LoopRun`]; no blocks where none starts there) and the most
/// instructions of one of its blocks; `None` where a block on the way is not in `view`.
fn walk(view: View<'_>, (ip, bits, left): (u64, u64, u8), key: u64) -> Option<(LoopRun, u16)> {
    let mut run = LoopRun {
        ip,
        key,
        to: ip,
        ..LoopRun::NONE
    };
    let mut max_ninsn = 0;
    let mut left = left;
    while run.blocks < RUN_BLOCKS && left > 0 {
        let block = view.at(view.slot_of(run.to), run.to)?;
        let (to, jump) = match block.exit {
            Exit::Cond => {
                let taken = bits >> (left - 1) & 1 == 1;
                let to = if taken { block.target } else { block.fall };
                (to, taken && block.target != block.fall)
            }
            Exit::DirectJump => (block.target, true),
            _ => break,
        };
        let Some(insns) = run.insns.checked_add(u32::from(block.ninsn)) else {
            break;
        };
        if jump {
            let Some(event) = run.events.get_mut(usize::from(run.jumps)) else {
                break;
            };
            *event = (block.end_ip, to);
            run.jumps += 1;
        }
        if block.exit == Exit::Cond {
            left -= 1;
            run.used += 1;
        }
        if run.blocks == 0 {
            run.first_ninsn = block.ninsn;
        }
        run.blocks += 1;
        run.insns = insns;
        max_ninsn = max_ninsn.max(block.ninsn);
        run.last_ip = block.end_ip;
        run.last_jump = jump;
        run.to = to;
    }
    run.full = left == 0;
    Some((run, max_ninsn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_hold_the_outcomes_left_and_how_many() {
        assert_eq!(key(0b1011, 1), None);
        assert_eq!(key(0b1011, 48), None);
        assert_eq!(key(0b1011, 2), Some(0b111));
        assert_eq!(key(0b1011, 4), Some(0b1_1011));
        assert_eq!(key(0b0011, 4), Some(0b1_0011));
        assert_eq!(key(u64::MAX, 47), Some(u64::MAX >> 16));
        assert_ne!(key(0b01, 2), key(0b001, 3));
    }
}
