//! Whole blocks for the decode fast path, one table lookup each.
//!
//! In: the block cache of a [`BlockDecoder`](super::block::BlockDecoder) (runs of instructions to the next decision
//! point, filled by the general walk in [`super::flow_walk`]). Out: [`FastBlock`]s: from
//! a start address to the branch that ends the block, with what that branch needs (a TNT
//! bit, a TIP, nothing) and where it can go, in a direct-mapped table ([`FastBlocks`]).
//! A block is resolved only where the general walk would take the cached route all the
//! way and end the block at the same branch (every run cached, inside one mapped piece,
//! at most `u16::MAX` instructions, a near branch whose size and displacement the cache
//! kept); anything else is left to the general walk, which fills the cache as it goes.

use super::block::BlockCache;
use super::cache::{CacheEntry, Qualifier};
use super::image::ImageProvider;
use super::insn::{self, InsnClass};
use crate::decode::pt::packets::packet::ExecMode;

/// How a block ends, and what the trace must say there.
///
/// One bit each, so that the fast loop's tests of a block's exit stay a few compares
/// and tests instead of becoming a jump table (one indirect jump per block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Exit {
    /// A conditional branch: a TNT bit picks `target` or `fall`.
    Cond = 1,
    /// A near direct call to `target` (no trace).
    DirectCall = 2,
    /// A near direct jump to `target` (no trace).
    DirectJump = 4,
    /// A near return: a taken TNT bit (compressed) or a TIP.
    Return = 8,
    /// A near indirect call: a TIP; returns to `fall`.
    IndirectCall = 16,
    /// A near indirect jump: a TIP.
    IndirectJump = 32,
}

impl Exit {
    /// A direct call or jump: no trace needed.
    #[inline]
    pub fn is_direct(self) -> bool {
        self as u8 & (Self::DirectCall as u8 | Self::DirectJump as u8) != 0
    }
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
    /// The table slots of `target` and `fall` (set by [`FastBlocks::insert`]): the next
    /// lookup reads its slot from here instead of hashing the address, which takes the
    /// hash off the chain from one block to the next (the loop waits on that chain).
    pub target_slot: u16,
    pub fall_slot: u16,
    pub ninsn: u16,
    /// What the general walk leaves in `Block::size` (the branch's size where it knew).
    pub size: u8,
    pub exit: Exit,
    /// A direct call that pushes its return address (not a call to the next instruction).
    pub push_ret: bool,
}

impl FastBlock {
    /// The cache entry the general walk's fill leaves at the block's start: one run to
    /// the branch and what the branch is, as `CacheEntry::for_insn` makes it (a size of
    /// 8 bytes or more kept as 0, a displacement beyond 32 bits as none) and the fill's
    /// backward pass extends it. `None` where an entry cannot hold the block (over 255
    /// instructions or 32 KiB; [`resolve`] decodes none such).
    fn entry(&self) -> Option<CacheEntry> {
        let qualifier = match self.exit {
            Exit::Cond => Qualifier::Cond,
            Exit::DirectCall => Qualifier::DirectCall,
            Exit::DirectJump => Qualifier::DirectJump,
            Exit::Return => Qualifier::Return,
            Exit::IndirectCall => Qualifier::IndirectCall,
            Exit::IndirectJump => Qualifier::Indirect,
        };
        let direct = matches!(self.exit, Exit::Cond | Exit::DirectCall | Exit::DirectJump);
        Some(CacheEntry {
            displacement: i16::try_from(self.end_ip.wrapping_sub(self.ip).cast_signed()).ok()?,
            ninsn: u8::try_from(self.ninsn).ok()?,
            mode: self.mode,
            qualifier,
            isize: if self.size < 8 { self.size } else { 0 },
            disp: direct
                .then(|| i32::try_from(self.target.wrapping_sub(self.fall).cast_signed()).ok())
                .flatten(),
        })
    }

    /// An unused slot. Its address is looked up in another slot, which holds no such
    /// empty block ([`FastBlocks::with_slots`]), so that it matches no lookup.
    const EMPTY: Self = Self {
        ip: u64::MAX,
        mode: ExecMode::Unknown,
        end_ip: 0,
        fall: 0,
        target: 0,
        isid: 0,
        target_slot: 0,
        fall_slot: 0,
        ninsn: 0,
        size: 0,
        exit: Exit::Cond,
        push_ret: false,
    };
}

/// Cache runs one block may chain before it is left to the general walk.
const MAX_CHAIN: usize = 256;

/// The most instructions of a block [`resolve`] decodes from the image; a longer one is
/// the general walk's. Why 255: the general walk's first visit is one run up to the
/// block's branch only where no entry it joins on the way splits it. Its fill ends a
/// block after 1,024 instructions (`FILL_STEPS`), and where it joins an entry of 255
/// instructions that the joined run would overflow (an entry made by an earlier walk
/// that started inside this run); an entry inside a block of at most 255 instructions
/// holds fewer, so up to there the walk's block is the decoded run whatever the cache
/// holds (`a_first_visit_through_code_walked_from_its_middle_ends_where_the_general_walk_does`
/// fails at 1,024). Except an entry a fill left at its step limit, which goes on to the
/// next instruction: a fill joining it leaves another entry at the block's start than
/// one run to the branch. The cache says when it may hold one
/// ([`BlockCache::step_limited`]); then a block with an entry inside is the walk's.
const FIRST_VISIT_MAX: u16 = u8::MAX as u16;

/// The block starting at `ip` in `mode`: from the cache if it holds all of it; where it
/// holds nothing at `ip` (code seen for the first time), decoded from the image
/// ([`resolve_decoded`]).
///
/// Why decoded here and not left to the general walk: a first visit there cost ~330
/// instructions an instruction (the length decoder ~130, the walk that fills the cache
/// and its entries ~200) and ~220 a block to resolve and insert it after; that was half
/// of a 29 KB real trace's decode (foo: 2,559 first visits, 9,565 instructions). Here
/// it is the length decoder and a short loop. The cache is not filled: the general walk
/// fills it where it goes itself (a block with an event inside, a hand-over), except
/// for the entries a fill would leave where the block starts ([`FastBlock::entry`]) and
/// at its branch:
/// without it, a block that a busy table evicts was decoded again at its next visit
/// (qemu's trace: 5× the length decoder's work).
pub(crate) fn resolve(
    image: &dyn ImageProvider,
    cache: &mut BlockCache,
    ip: u64,
    mode: ExecMode,
) -> Option<FastBlock> {
    // The cache first: the image's lookup costs more.
    let Some(mut entry) = cache.get(ip, mode) else {
        let inside = cache.step_limited().then_some(&*cache);
        let block = resolve_decoded(image, ip, mode, FIRST_VISIT_MAX, inside)?;
        let entry = block.entry()?;
        // The fill keeps the branch's own entry too: a later fill reaching the branch
        // from code that overlaps this block's (a jump into an instruction's middle)
        // joins it there, instead of running on to its step limit.
        if block.end_ip != ip {
            cache.insert(
                block.end_ip,
                CacheEntry {
                    displacement: 0,
                    ninsn: 1,
                    ..entry
                },
            );
        }
        cache.insert(ip, entry);
        return Some(block);
    };
    let mapping = image.mapping(ip).ok()?;
    let mut at = ip;
    let mut ninsn = 0u16;
    for _ in 0..MAX_CHAIN {
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
            target_slot: 0,
            fall_slot: 0,
            ninsn,
            size: 0,
            exit: Exit::Return,
            push_ret: false,
        };
        let sized = entry.isize != 0;
        match entry.qualifier {
            Qualifier::Again => {
                at = point;
                entry = cache.get(at, mode)?;
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
                if insn::decode(image, point, mode).is_ok_and(|i| i.class == InsnClass::Jump) =>
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
    /// The block at `ip` (in the view's mode), if it was resolved before.
    #[cfg(test)]
    pub fn get(self, ip: u64) -> Option<&'a FastBlock> {
        self.at(self.slot_of(ip), ip)
    }

    /// The slot where the block at `ip` would be.
    #[inline]
    pub fn slot_of(self, ip: u64) -> usize {
        slot_index(ip, self.shift)
    }

    /// The block at `ip`, looked up in its slot `slot` ([`Self::slot_of`], or a block's
    /// `target_slot`/`fall_slot`): empty slots match no address only in the slot where
    /// their address is looked up.
    #[inline]
    pub fn at(self, slot: usize, ip: u64) -> Option<&'a FastBlock> {
        debug_assert_eq!(slot, self.slot_of(ip), "the slot of {ip:#x}");
        self.slots.get(slot).filter(|b| b.ip == ip)
    }
}

/// The block starting at `ip` in `mode`, decoded from the image: for code seen for the
/// first time ([`resolve`]) and for code the general walk has only gone through with an
/// event due (it fills no cache there), such as the path from the last traced branch to
/// the one that leaves the traced range. The same block the cache would give:
/// straight-line code in one mapped piece up to its first near branch; `None` for
/// anything else (a far transfer, PTWRITE, code that runs past its piece, a run over
/// `max` instructions). With `inside`, also `None` where that cache holds an entry at
/// one of the block's instructions after its first.
pub(crate) fn resolve_decoded(
    image: &dyn ImageProvider,
    ip: u64,
    mode: ExecMode,
    max: u16,
    inside: Option<&BlockCache>,
) -> Option<FastBlock> {
    let mapping = image.mapping(ip).ok()?;
    // The piece's bytes, lent where the image can (as the general walk's fill): no
    // lookup and copy an instruction.
    let code = image.code(ip).filter(|&(begin, bytes)| {
        begin == mapping.begin && mapping.end - begin == bytes.len() as u64
    });
    let mut at = ip;
    let mut ninsn = 0u16;
    loop {
        if at != ip && inside.is_some_and(|cache| cache.get(at, mode).is_some()) {
            return None;
        }
        let (size, class, displacement) = decoded_at(image, (code, mapping.isid), at, mode)?;
        ninsn += 1;
        let fall = at.wrapping_add(u64::from(size));
        let (exit, push_ret) = match (class, displacement) {
            (InsnClass::Other, _) if ninsn < max && mapping.contains(fall) => {
                at = fall;
                continue;
            }
            (InsnClass::CondJump, Some(_)) => (Exit::Cond, false),
            (InsnClass::Call, Some(disp)) => (Exit::DirectCall, disp != 0),
            (InsnClass::Jump, Some(_)) => (Exit::DirectJump, false),
            (InsnClass::Call, None) => (Exit::IndirectCall, false),
            (InsnClass::Jump, None) => (Exit::IndirectJump, false),
            (InsnClass::Return, _) => (Exit::Return, false),
            _ => return None,
        };
        return Some(FastBlock {
            ip,
            mode,
            end_ip: at,
            fall,
            target: fall.wrapping_add_signed(displacement.unwrap_or(0)),
            isid: mapping.isid,
            target_slot: 0,
            fall_slot: 0,
            ninsn,
            size,
            exit,
            push_ret,
        });
    }
}

/// The size, class and branch displacement of the instruction at `at`, which lies in
/// the piece whose bytes are `code` (where lent); `None` where it runs past the piece or
/// is not an instruction.
fn decoded_at(
    image: &dyn ImageProvider,
    (code, isid): (Option<(u64, &[u8])>, u32),
    at: u64,
    mode: ExecMode,
) -> Option<(u8, InsnClass, Option<i64>)> {
    let Some((begin, bytes)) = code else {
        let insn = insn::decode(image, at, mode).ok()?;
        return (!insn.truncated && insn.isid == isid).then_some((
            insn.size,
            insn.class,
            insn.displacement,
        ));
    };
    let rest = bytes.get(usize::try_from(at.wrapping_sub(begin)).ok()?..)?;
    let avail = rest.get(..insn::MAX_INSN_SIZE).unwrap_or(rest);
    // Too few bytes left: the instruction runs past the piece (truncated).
    let (size, class, _, displacement) = insn::classify(avail, at, mode).ok()?;
    Some((size, class, displacement))
}

/// Slots of a new table; it doubles (up to [`MAX_SLOTS`]) when blocks keep evicting
/// each other. A short trace starts smaller ([`FastBlocks::for_trace`]).
const MIN_SLOTS: usize = 1 << 10;
const MAX_SLOTS: usize = 1 << 16;
/// The fewest slots a table for a short trace starts with, and the trace bytes per slot.
const SHORT_SLOTS: usize = 1 << 6;
const TRACE_BYTES_PER_SLOT: usize = 32;

/// A direct-mapped table of resolved blocks, keyed by start address and mode.
#[derive(Debug, Clone)]
pub(crate) struct FastBlocks {
    slots: Vec<FastBlock>,
    /// The mode of every block in the table: one mode at a time, so that a lookup
    /// compares the address only (modes change at most at PSBs and far transfers).
    mode: ExecMode,
    /// 64 minus log2 of the slot count.
    shift: u32,
    /// Valid blocks replaced since the table last grew.
    evictions: usize,
    /// The most instructions of any block in the table: bounds how far a run of
    /// blocks can stall without a look at each one ([`Self::stall_free`]).
    max_ninsn: u16,
    /// The slots of the first table.
    first: usize,
}

impl Default for FastBlocks {
    /// No slots until the first lookup or insert, which knows the mode: the table was
    /// made twice before (for no mode, then for the first block's), and a fresh table's
    /// pages are a fixed cost every decode pays (page faults: ~100 µs here, a third of
    /// the decode of a 208-byte real trace).
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            mode: ExecMode::Unknown,
            shift: 64 - MIN_SLOTS.trailing_zeros(),
            evictions: 0,
            max_ninsn: 0,
            first: MIN_SLOTS,
        }
    }
}

impl FastBlocks {
    /// A table for a trace of `len` bytes: a slot per 32 bytes up to the usual
    /// [`MIN_SLOTS`]. Why: the table is written whole when it is made, 48 KB of fresh
    /// pages (~3 µs each on a VM), most of what a decode of a few hundred bytes cost;
    /// such a trace has a few blocks (a 208-byte real trace: 5, a 12 KB one: 127).
    pub(crate) fn for_trace(len: usize) -> Self {
        Self {
            first: (len / TRACE_BYTES_PER_SLOT)
                .next_power_of_two()
                .clamp(SHORT_SLOTS, MIN_SLOTS),
            ..Self::default()
        }
    }

    fn with_slots(slots: usize) -> Self {
        let mut table = Self {
            slots: vec![FastBlock::EMPTY; slots],
            mode: ExecMode::Unknown,
            shift: 64 - slots.trailing_zeros(),
            evictions: 0,
            max_ninsn: 0,
            first: slots,
        };
        // Lookups compare addresses only: the slot where EMPTY's own address is looked
        // up gets another address for its empty block, one that is looked up elsewhere.
        let home = table.index(FastBlock::EMPTY.ip);
        let other = (1..=u64::from(u16::MAX))
            .map(|d| FastBlock::EMPTY.ip - d)
            .find(|&ip| table.index(ip) != home);
        if let (Some(slot), Some(ip)) = (table.slots.get_mut(home), other) {
            slot.ip = ip;
        }
        table
    }

    fn index(&self, ip: u64) -> usize {
        slot_index(ip, self.shift)
    }

    /// [`Self::index`] as stored in a block: the table has at most 2^16 slots.
    fn slot(&self, ip: u64) -> u16 {
        u16::try_from(self.index(ip)).unwrap_or(u16::MAX)
    }

    /// The table for lookups of blocks in `mode` (emptied if it held another mode's):
    /// a loop that holds the view keeps the slots and the shift in registers (through
    /// `&mut self` they are reloaded after every store).
    #[inline]
    pub fn view(&mut self, mode: ExecMode) -> View<'_> {
        if self.mode != mode || self.slots.is_empty() {
            self.empty_for(mode);
        }
        View {
            slots: &self.slots,
            shift: self.shift,
        }
    }

    /// Whether `blocks` blocks from this table or with at most `other` instructions
    /// each (a loop run's: `LoopRuns`), each adding its instructions plus one to a
    /// stall count of `stalled`, stay within `limit`.
    pub fn stall_free(&self, stalled: u64, (blocks, other): (usize, u16), limit: u64) -> bool {
        let per_block = u64::from(self.max_ninsn.max(other)) + 1;
        u64::try_from(blocks)
            .ok()
            .and_then(|n| n.checked_mul(per_block))
            .and_then(|n| n.checked_add(stalled))
            .is_some_and(|n| n <= limit)
    }

    fn empty_for(&mut self, mode: ExecMode) {
        let slots = if self.slots.is_empty() {
            self.first
        } else {
            self.slots.len()
        };
        *self = Self::with_slots(slots);
        self.mode = mode;
    }

    /// Resolves the block at `ip` ([`resolve`]) into the table; false where it does
    /// not resolve.
    pub fn resolve(
        &mut self,
        image: &dyn ImageProvider,
        cache: &mut BlockCache,
        ip: u64,
        mode: ExecMode,
    ) -> bool {
        resolve(image, cache, ip, mode)
            .map(|block| self.insert(block))
            .is_some()
    }

    /// Adds a block (emptying the table first if it held another mode's); it can be
    /// found right after (`view`).
    pub fn insert(&mut self, block: FastBlock) {
        if block.mode != self.mode || self.slots.is_empty() {
            self.empty_for(block.mode);
        }
        if self.place(block) {
            self.evictions += 1;
        }
        self.max_ninsn = self.max_ninsn.max(block.ninsn);
        if self.evictions > 2 * self.slots.len() && self.slots.len() < MAX_SLOTS {
            self.grow();
        }
    }

    /// Writes `block` to its slot, with its successors' slots; whether it replaced
    /// another block.
    fn place(&mut self, block: FastBlock) -> bool {
        let block = FastBlock {
            target_slot: self.slot(block.target),
            fall_slot: self.slot(block.fall),
            ..block
        };
        let index = self.index(block.ip);
        self.slots
            .get_mut(index)
            .is_some_and(|slot| std::mem::replace(slot, block).ninsn != 0)
    }

    /// The working set outgrew the table: a table twice as large, with every block of
    /// this one (the block just inserted too, which callers look up next). Why keep
    /// them: each dropped block was resolved again at its next visit (~700
    /// instructions; foo's decode 4 % more). They all fit: a slot is the top bits of
    /// the address's hash, so blocks in two slots here are in two slots there.
    fn grow(&mut self) {
        let mut grown = Self::with_slots(self.slots.len() * 2);
        grown.mode = self.mode;
        grown.max_ninsn = self.max_ninsn;
        grown.first = self.first;
        for block in self.slots.iter().filter(|b| b.ninsn != 0) {
            grown.place(*block);
        }
        *self = grown;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ip: u64, mode: ExecMode) -> FastBlock {
        FastBlock {
            ip,
            mode,
            end_ip: ip.wrapping_add(2),
            fall: ip.wrapping_add(4),
            ..FastBlock::EMPTY
        }
    }

    /// Inserts `count` blocks 16 bytes apart four times over, each found right after;
    /// their addresses.
    fn evict_repeatedly(table: &mut FastBlocks, count: usize) -> Vec<u64> {
        let ips: Vec<u64> = (0..count as u64).map(|i| 0x40_0000 + 16 * i).collect();
        for _ in 0..4 {
            for &ip in &ips {
                table.insert(FastBlock {
                    ninsn: 1,
                    target: ip + 0x1000,
                    ..block(ip, ExecMode::Bits64)
                });
                assert!(table.view(ExecMode::Bits64).get(ip).is_some());
            }
        }
        ips
    }

    #[test]
    fn a_table_holds_one_mode_at_a_time() {
        let mut table = FastBlocks::default();
        table.insert(block(0x1000, ExecMode::Bits64));
        table.insert(block(0x2000, ExecMode::Bits64));
        assert_eq!(
            table.view(ExecMode::Bits64).get(0x1000).map(|b| b.fall),
            Some(0x1004)
        );
        assert!(table.view(ExecMode::Bits64).get(0x1004).is_none());
        // Another mode's lookups find nothing (and empty the table) ...
        assert!(table.view(ExecMode::Bits32).get(0x1000).is_none());
        assert!(table.view(ExecMode::Bits64).get(0x2000).is_none());
        // ... and so does inserting another mode's block.
        table.insert(block(0x2000, ExecMode::Bits64));
        table.insert(block(0x3000, ExecMode::Bits32));
        assert!(table.view(ExecMode::Bits32).get(0x3000).is_some());
        assert!(table.view(ExecMode::Bits32).get(0x2000).is_none());
    }

    #[test]
    fn a_short_traces_table_starts_small_and_grows_as_any() {
        for (len, first) in [
            (0, SHORT_SLOTS),
            (208, SHORT_SLOTS),
            (12_288, 512),
            (1 << 20, MIN_SLOTS),
        ] {
            let mut table = FastBlocks::for_trace(len);
            assert!(table.slots.is_empty(), "made at its first use");
            table.insert(block(0x1000, ExecMode::Bits64));
            assert_eq!(table.slots.len(), first, "{len} bytes");
            // A mode change keeps the size.
            table.insert(block(0x1000, ExecMode::Bits32));
            assert_eq!(table.slots.len(), first, "{len} bytes");
        }
        let mut table = FastBlocks::for_trace(208);
        evict_repeatedly(&mut table, 4 * SHORT_SLOTS);
        assert!(
            table.slots.len() > SHORT_SLOTS,
            "it grew: {}",
            table.slots.len()
        );
    }

    #[test]
    fn empty_slots_match_no_address() {
        let mut table = FastBlocks::default();
        for ip in [0, 1, u64::MAX, u64::MAX - 1] {
            assert!(table.view(ExecMode::Bits64).get(ip).is_none(), "{ip:#x}");
        }
        // Blocks at the empty slots' addresses are found.
        for ip in [u64::MAX, u64::MAX - 1, 0] {
            table.insert(FastBlock {
                ninsn: 1,
                ..block(ip, ExecMode::Bits64)
            });
            assert_eq!(
                table.view(ExecMode::Bits64).get(ip).map(|b| b.ip),
                Some(ip),
                "{ip:#x}"
            );
        }
    }

    /// The blocks a table holds when it grows are all in the grown table, with their
    /// successors' slots for its size; it fails if growth drops them or keeps their old
    /// slots.
    #[test]
    fn a_table_that_grows_keeps_every_block_it_held() {
        let mut table = FastBlocks::for_trace(208);
        let mut ip = 0x40_0000;
        loop {
            // All but the block this insert replaces.
            let held: Vec<u64> = table
                .slots
                .iter()
                .filter(|b| b.ninsn != 0 && table.index(b.ip) != table.index(ip))
                .map(|b| b.ip)
                .collect();
            let slots = table.slots.len();
            table.insert(FastBlock {
                ninsn: 1,
                target: ip + 0x40,
                ..block(ip, ExecMode::Bits64)
            });
            if table.slots.len() > slots && slots > 0 {
                let view = table.view(ExecMode::Bits64);
                for &held in held.iter().chain([&ip]) {
                    let found = view
                        .get(held)
                        .unwrap_or_else(|| panic!("{held:#x} dropped"));
                    assert_eq!(usize::from(found.target_slot), view.slot_of(found.target));
                    assert_eq!(usize::from(found.fall_slot), view.slot_of(found.fall));
                }
                assert!(held.len() > slots / 2, "{} of {slots}", held.len());
                break;
            }
            ip += 0x10;
        }
    }

    #[test]
    fn the_table_grows_when_blocks_keep_evicting_each_other_and_slots_follow() {
        let mut table = FastBlocks::default();
        let ips = evict_repeatedly(&mut table, 4 * MIN_SLOTS);
        assert!(table.slots.len() > MIN_SLOTS);
        let view = table.view(ExecMode::Bits64);
        let found: Vec<&FastBlock> = ips.iter().filter_map(|&ip| view.get(ip)).collect();
        assert!(
            found.len() > ips.len() / 2,
            "{} of {}",
            found.len(),
            ips.len()
        );
        // Through growth, every block's successor slots are those of the table it is in.
        for b in found {
            assert_eq!(usize::from(b.target_slot), view.slot_of(b.target));
            assert_eq!(usize::from(b.fall_slot), view.slot_of(b.fall));
        }
    }
}
