//! Runs of blocks the fast path replays whole: one lookup for the TNT bits of a packet.
//!
//! In: the block at which the fast loop stands, the TNT bits left (more than one) and
//! the [`FastBlocks`](super::fast_blocks::FastBlocks) view. Out: a [`Run`], what the
//! fast loop's short path (a conditional branch that does not use the TNT's last bit,
//! a direct jump or call) would do block after block from there: the blocks, instructions
//! and bits it takes, the jumps it reports, where it ends. Why: real code takes the
//! same paths again and again, so the IP and the bits left of a TNT repeat (0.35 % of
//! the TNTs of qemu's real trace, 2.2 % of mruby's start at a new pair); this is
//! libxdc's cache keyed by (IP, TNT bits), keeping what the product path needs: the
//! jumps and direct calls with their addresses, the return addresses calls push, the
//! counts. The last bit of a TNT, returns and indirect branches stay with the fast
//! loop, block by block.

use super::fast_blocks::{Exit, View};

/// Blocks in one run at most (and so jumps: one per block at most).
pub(crate) const RUN_BLOCKS: usize = 8;

/// A run of blocks from `ip` with `left` TNT bits `bits` (those below `left`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Run {
    pub ip: u64,
    /// The TNT bits left at the start: 0 marks an empty slot (a run needs two).
    pub left: u8,
    pub bits: u64,
    /// TNT bits the run uses.
    pub used: u8,
    pub blocks: u8,
    /// Instructions of all blocks, and of the first (which starts a stall count).
    pub ninsn: u32,
    pub first_ninsn: u16,
    /// Where the run ends (the next block's address and its table slot, valid while
    /// the run is: both go when the table grows), and the last block's branch.
    pub next: u64,
    pub next_slot: u16,
    pub last_ip: u64,
    /// The branches it reports, `(from, to)`: jumps, and calls where `calls` has
    /// their bit; a call with its bit in `pushes` also pushes its return address
    /// (`ret`: a call to the next instruction pushes none).
    pub jumps: u8,
    pub jump: [(u64, u64); RUN_BLOCKS],
    pub calls: u8,
    pub pushes: u8,
    pub ret: [u64; RUN_BLOCKS],
}

impl Run {
    const EMPTY: Self = Self {
        ip: 0,
        left: 0,
        bits: 0,
        used: 0,
        blocks: 0,
        ninsn: 0,
        first_ninsn: 0,
        next: 0,
        next_slot: 0,
        last_ip: 0,
        jumps: 0,
        jump: [(0, 0); RUN_BLOCKS],
        calls: 0,
        pushes: 0,
        ret: [0; RUN_BLOCKS],
    };
}

/// The bits below `left` of a TNT word (`left` < 64: a TNT has at most 47).
#[inline]
pub(crate) fn bits_left(bits: u64, left: u8) -> u64 {
    bits & ((1 << left) - 1)
}

/// Slots of a new run table, and the most it grows to (direct-mapped by IP and bits):
/// small first, since a fresh table's pages cost every decode (a short trace needs a
/// few dozen runs, qemu's ~1,100).
const MIN_SLOTS: usize = 1 << 6;
const MAX_SLOTS: usize = 1 << 11;

/// A direct-mapped table of runs, for one mode and image (it goes with the block
/// table, which is emptied when the mode changes or it grows).
#[derive(Debug, Clone, Default)]
pub(crate) struct Runs {
    slots: Vec<Run>,
    /// Runs replaced since the table last grew.
    evictions: usize,
}

impl Runs {
    fn index(&self, ip: u64, left: u8, bits: u64) -> usize {
        let key = ip ^ bits.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ u64::from(left) << 56;
        // The top bits of a multiplicative hash (the table has a power of two slots;
        // none before its first run, and then no index is in it).
        let shift = 64 - self.slots.len().trailing_zeros();
        let hash = key.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        usize::try_from(hash.checked_shr(shift).unwrap_or(0)).unwrap_or(usize::MAX)
    }

    /// The run from `ip` with `left` bits `bits` left (`left` > 1), if one was stored.
    #[inline]
    pub fn get(&self, ip: u64, left: u8, bits: u64) -> Option<&Run> {
        let bits = bits_left(bits, left);
        self.slots
            .get(self.index(ip, left, bits))
            .filter(|run| run.ip == ip && run.left == left && run.bits == bits)
    }

    /// Records the run from `ip` with `left` bits `bits` left from the blocks in
    /// `view`, in its slot: no blocks where the first one takes no part in a run (a
    /// call, a return ...); `None` (nothing stored) where it is not in the table yet.
    /// The table is made at first use (a trace without TNTs pays nothing) and doubles
    /// when runs keep evicting each other.
    pub fn record(&mut self, view: View<'_>, ip: u64, left: u8, bits: u64) -> Option<&Run> {
        view.get(ip)?;
        if self.slots.is_empty() {
            self.slots = vec![Run::EMPTY; MIN_SLOTS];
        }
        if self.evictions > 2 * self.slots.len() && self.slots.len() < MAX_SLOTS {
            self.grow();
        }
        let bits = bits_left(bits, left);
        let index = self.index(ip, left, bits);
        let run = self.slots.get_mut(index)?;
        if run.left != 0 {
            self.evictions += 1;
        }
        run.ip = ip;
        run.left = left;
        run.bits = bits;
        run.blocks = 0;
        run.ninsn = 0;
        run.jumps = 0;
        run.calls = 0;
        run.pushes = 0;
        run.next = ip;
        let mut left = left;
        while usize::from(run.blocks) < RUN_BLOCKS {
            let Some(block) = view.get(run.next) else {
                break;
            };
            let (to, jump) = match block.exit {
                // As the fast loop's short path: a bit that is not the TNT's last.
                Exit::Cond if left > 1 => {
                    left -= 1;
                    if bits >> left & 1 == 1 {
                        (block.target, block.target != block.fall)
                    } else {
                        (block.fall, false)
                    }
                }
                Exit::DirectJump => (block.target, true),
                Exit::DirectCall => {
                    let bit = 1 << run.jumps;
                    run.calls |= bit;
                    if block.push_ret {
                        run.pushes |= bit;
                        if let Some(ret) = run.ret.get_mut(usize::from(run.jumps)) {
                            *ret = block.fall;
                        }
                    }
                    (block.target, true)
                }
                _ => break,
            };
            if jump {
                if let Some(slot) = run.jump.get_mut(usize::from(run.jumps)) {
                    *slot = (block.end_ip, block.target);
                }
                run.jumps += 1;
            }
            if run.blocks == 0 {
                run.first_ninsn = block.ninsn;
            }
            run.blocks += 1;
            run.ninsn += u32::from(block.ninsn);
            run.last_ip = block.end_ip;
            run.next = to;
        }
        run.used = run.left - left;
        run.next_slot = u16::try_from(view.slot_of(run.next)).unwrap_or(u16::MAX);
        Some(run)
    }

    /// Twice the slots, with the runs there were.
    fn grow(&mut self) {
        let grown = vec![Run::EMPTY; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, grown);
        self.evictions = 0;
        for run in old.into_iter().filter(|run| run.left != 0) {
            let index = self.index(run.ip, run.left, run.bits);
            if let Some(slot) = self.slots.get_mut(index) {
                *slot = run;
            }
        }
    }
}
