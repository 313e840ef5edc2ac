//! Whole blocks for the decode fast path, one table lookup each.
//!
//! In: the block cache of a [`BlockDecoder`] (runs of instructions to the next decision
//! point, filled by the general walk in [`super::flow_walk`]). Out: [`FastBlock`]s: from
//! a start address to the branch that ends the block, with what that branch needs (a TNT
//! bit, a TIP, nothing) and where it can go, in a direct-mapped table ([`FastBlocks`]).
//! A block is resolved only where the general walk would take the cached route all the
//! way and end the block at the same branch (every run cached, inside one mapped piece,
//! at most `u16::MAX` instructions, a near branch whose size and displacement the cache
//! kept); anything else is left to the general walk, which fills the cache as it goes.

use super::flow::BlockDecoder;
use super::flow_walk::{CacheEntry, Qualifier};
use super::insn::{self, InsnClass};
use super::packet::ExecMode;

/// How a block ends, and what the trace must say there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    /// A conditional branch: a TNT bit picks `target` or `fall`.
    Cond,
    /// A near direct call to `target` (no trace).
    DirectCall,
    /// A near direct jump to `target` (no trace).
    DirectJump,
    /// A near return: a taken TNT bit (compressed) or a TIP.
    Return,
    /// A near indirect call: a TIP; returns to `fall`.
    IndirectCall,
    /// A near indirect jump: a TIP.
    IndirectJump,
}

/// A block from `ip` to the branch at `end_ip`, as the general walk would build it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FastBlock {
    pub ip: u64,
    pub mode: ExecMode,
    pub end_ip: u64,
    /// The instruction after the branch.
    pub fall: u64,
    /// The branch target, for conditional and direct branches.
    pub target: u64,
    /// The mapped section the block is in.
    pub isid: u32,
    pub ninsn: u16,
    /// What the general walk leaves in `Block::size` (the branch's size where it knew).
    pub size: u8,
    pub exit: Exit,
    /// A direct call that pushes its return address (not a call to the next instruction).
    pub push_ret: bool,
}

impl FastBlock {
    /// An unused slot: no block is ever looked up with an unknown mode.
    const EMPTY: Self = Self {
        ip: 0,
        mode: ExecMode::Unknown,
        end_ip: 0,
        fall: 0,
        target: 0,
        isid: 0,
        ninsn: 0,
        size: 0,
        exit: Exit::Cond,
        push_ret: false,
    };
}

/// Cache runs one block may chain before it is left to the general walk.
const MAX_CHAIN: usize = 256;

/// The block starting at `ip` in `mode`, if the cache holds all of it.
pub(crate) fn resolve(dec: &BlockDecoder<'_>, ip: u64, mode: ExecMode) -> Option<FastBlock> {
    let mapping = dec.image.mapping(ip).ok()?;
    let mut at = ip;
    let mut ninsn = 0u16;
    for _ in 0..MAX_CHAIN {
        let entry: CacheEntry = *dec.cache.get(&(at, mode))?;
        let point = at.wrapping_add_signed(i64::from(entry.displacement));
        if !mapping.contains(point) {
            return None;
        }
        ninsn = ninsn.checked_add(u16::from(entry.ninsn))?;
        let fall = point.wrapping_add(u64::from(entry.isize));
        let mut block = FastBlock {
            ip,
            mode,
            end_ip: point,
            fall,
            target: fall.wrapping_add_signed(i64::from(entry.disp.unwrap_or(0))),
            isid: mapping.isid,
            ninsn,
            size: 0,
            exit: Exit::Return,
            push_ret: false,
        };
        let sized = entry.isize != 0;
        match entry.qualifier {
            Qualifier::Again => {
                at = point;
                continue;
            }
            Qualifier::Cond if sized && entry.disp.is_some() => {
                block.exit = Exit::Cond;
                block.size = entry.isize;
            }
            Qualifier::DirectCall | Qualifier::DirectJump if sized && entry.disp.is_some() => {
                let call = entry.qualifier == Qualifier::DirectCall;
                block.exit = if call {
                    Exit::DirectCall
                } else {
                    Exit::DirectJump
                };
                block.size = entry.isize;
                block.push_ret = call && entry.disp != Some(0);
            }
            Qualifier::Return => block.exit = Exit::Return,
            Qualifier::IndirectCall if sized => block.exit = Exit::IndirectCall,
            // Indirect jumps only; far transfers are for the general path.
            Qualifier::Indirect
                if insn::decode(dec.image, point, mode)
                    .is_ok_and(|i| i.class == InsnClass::Jump) =>
            {
                block.exit = Exit::IndirectJump;
            }
            _ => return None,
        }
        return Some(block);
    }
    None
}

/// The slot of `ip` in a table of `2^(64 - shift)` slots.
#[inline]
fn slot_index(ip: u64, shift: u32) -> usize {
    // Fibonacci hashing; the top bits index the table, which has at most 2^16 slots.
    usize::try_from(ip.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift).unwrap_or(0)
}

/// Lookups in a [`FastBlocks`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct View<'a> {
    slots: &'a [FastBlock],
    shift: u32,
}

impl<'a> View<'a> {
    /// The block at `ip` in `mode`, if it was resolved before.
    #[inline]
    pub fn get(self, ip: u64, mode: ExecMode) -> Option<&'a FastBlock> {
        self.slots
            .get(slot_index(ip, self.shift))
            .filter(|b| b.ip == ip && b.mode == mode)
    }
}

/// Slots of a new table; it doubles (up to [`MAX_SLOTS`]) when blocks keep evicting
/// each other.
const MIN_SLOTS: usize = 1 << 10;
const MAX_SLOTS: usize = 1 << 16;

/// A direct-mapped table of resolved blocks, keyed by start address and mode.
#[derive(Debug, Clone)]
pub(crate) struct FastBlocks {
    slots: Vec<FastBlock>,
    /// 64 minus log2 of the slot count.
    shift: u32,
    /// Valid blocks replaced since the table last grew.
    evictions: usize,
}

impl Default for FastBlocks {
    fn default() -> Self {
        Self::with_slots(MIN_SLOTS)
    }
}

impl FastBlocks {
    fn with_slots(slots: usize) -> Self {
        Self {
            slots: vec![FastBlock::EMPTY; slots],
            shift: 64 - slots.trailing_zeros(),
            evictions: 0,
        }
    }

    fn index(&self, ip: u64) -> usize {
        slot_index(ip, self.shift)
    }

    /// The table for lookups only: a loop that holds it keeps the slots and the shift
    /// in registers (through `&mut self` they are reloaded after every store).
    #[inline]
    pub fn view(&self) -> View<'_> {
        View {
            slots: &self.slots,
            shift: self.shift,
        }
    }

    /// Adds a block; it can be found right after (`get`).
    pub fn insert(&mut self, block: FastBlock) {
        let index = self.index(block.ip);
        let Some(slot) = self.slots.get_mut(index) else {
            return;
        };
        if slot.mode != ExecMode::Unknown {
            self.evictions += 1;
        }
        *slot = block;
        if self.evictions > 2 * self.slots.len() && self.slots.len() < MAX_SLOTS {
            // The working set outgrew the table: start over, twice as large (with this
            // block, which callers look up next).
            *self = Self::with_slots(self.slots.len() * 2);
            self.insert(block);
        }
    }
}
