//! The block cache's entries: what the code walk records between decision points.
//!
//! In: nothing (plain data, filled by the walk in [`super::flow_walk`]). Out:
//! [`CacheEntry`], per (address, execution mode) the run of instructions to the next
//! decision point and what kind of point that is ([`Qualifier`]), which the walk and the
//! fast path ([`super::fast_blocks`]) read back; and [`IpHasher`], the hash of the
//! cache's keys (the trace writer and stack reconstruction use it too). Its own module so
//! that the decoder holding the cache ([`super::block`]) does not import the walk that
//! fills it, which imports the decoder.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::insn::Insn;
use crate::decode::pt::packets::packet::ExecMode;

/// What to do at the end of a cached run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Qualifier {
    /// Not a decision point: go on from here (the run was too long for one entry).
    Again,
    /// A conditional branch.
    Cond,
    /// A near indirect call.
    IndirectCall,
    /// A near return (maybe compressed).
    Return,
    /// An indirect jump or far transfer.
    Indirect,
    /// A near direct call (its displacement is in the entry).
    DirectCall,
    /// A near direct jump (its displacement is in the entry).
    DirectJump,
    /// Decode the instruction to know (far direct jumps, truncated instructions).
    Decode,
}

impl Qualifier {
    /// The qualifier numbered `bits` (`as u8`), of three bits.
    fn from_bits(bits: u64) -> Self {
        match bits {
            0 => Self::Again,
            1 => Self::Cond,
            2 => Self::IndirectCall,
            3 => Self::Return,
            4 => Self::Indirect,
            5 => Self::DirectCall,
            6 => Self::DirectJump,
            _ => Self::Decode,
        }
    }
}

/// A cached run of instructions from some address to the next decision point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CacheEntry {
    /// From the run's first instruction to the decision point (16-bit, as libipt's).
    pub(crate) displacement: i16,
    /// Instructions in the run, the decision point included (8-bit, as libipt's).
    pub(crate) ninsn: u8,
    pub(crate) mode: ExecMode,
    pub(crate) qualifier: Qualifier,
    /// The decision point's size when it fits 3 bits; 0 otherwise.
    pub(crate) isize: u8,
    /// The decision point's branch displacement, for conditional and direct branches
    /// (so that hot branches are not decoded again).
    pub(crate) disp: Option<i32>,
}

impl CacheEntry {
    pub(super) fn at_point(mode: ExecMode, qualifier: Qualifier, isize: u8) -> Self {
        Self {
            displacement: 0,
            ninsn: 1,
            mode,
            qualifier,
            isize,
            disp: None,
        }
    }

    /// The entry for a decision point `insn` (branch displacement included).
    pub(super) fn for_insn(insn: &Insn, qualifier: Qualifier) -> Self {
        Self {
            disp: insn.displacement.and_then(|d| i32::try_from(d).ok()),
            ..Self::at_point(
                insn.mode,
                qualifier,
                if insn.size < 8 { insn.size } else { 0 },
            )
        }
    }
}

/// Runs of instructions by where they start: a pure function of the image, filled as the
/// decode walks code. One entry per address, packed into eight bytes with its mode: a
/// lookup in another mode misses (and the walk decodes again), an insert replaces.
/// Why packed: the cache has an entry per instruction the walk has seen, and its table's
/// memory is fresh pages to a one-shot decode: ~3 µs a page fault on a VM, where a
/// 29 KB real trace's decode took 300 of them (16-byte keys and 16-byte entries then).
#[derive(Debug, Clone, Default)]
pub(crate) struct BlockCache {
    entries: HashMap<u64, u64, BuildHasherDefault<IpHasher>>,
    /// The entries the table is made for at the first insert ([`Self::for_trace`]).
    presized: usize,
    /// A fill has ended a run of straight-line code at its step limit: the cache may
    /// hold entries that go on to the next instruction (`Qualifier::Again`) inside
    /// straight-line code ([`Self::note_step_limit`]).
    step_limited: bool,
}

/// A branch displacement the packed entry cannot hold: stored as none (the walk then
/// decodes the branch again).
const NO_DISP: i32 = i32::MIN;

/// Trace bytes per block cache entry a decode is sized for at its start, and the most
/// entries it is sized for (it grows past them as it must).
const TRACE_BYTES_PER_ENTRY: usize = 16;
const PRESIZED_ENTRIES: usize = 14 * 1024;

impl BlockCache {
    /// A cache sized for a trace of `len` bytes. Since entries are kept only where
    /// runs of code start and end, a short trace that is mostly first visits makes one
    /// per 7 to 18 trace bytes (foo: 4,400 entries in 29 KB; Unzip: one per 17 B);
    /// longer traces go round their code again (mruby: 111 B, qemu: 380 B). Capped, since
    /// the code, not the trace, bounds it. Each page of the table is a page fault
    /// (~3 µs on a VM), so a table sized too small pays twice: for the tables it
    /// outgrows and for the moves. Made at the first insert, not here: a parallel
    /// decode's piece that goes on with another's cache (`branches_parallel.rs`) never
    /// fills this one.
    pub(crate) fn for_trace(len: usize) -> Self {
        Self {
            entries: HashMap::default(),
            presized: (len / TRACE_BYTES_PER_ENTRY).min(PRESIZED_ENTRIES),
            step_limited: false,
        }
    }

    /// Notes that a fill stopped at its step limit and left an entry that goes on
    /// inside straight-line code. Why: a fill that later joins such an entry leaves a
    /// different entry where it starts than one run to the branch, so the fast path's
    /// first visits ([`super::fast_blocks::resolve`]) then look for entries inside the
    /// blocks they decode.
    pub(crate) fn note_step_limit(&mut self) {
        self.step_limited = true;
    }

    /// Whether a fill ever stopped at its step limit since the cache was made or cleared.
    pub(crate) fn step_limited(&self) -> bool {
        self.step_limited
    }

    /// The entry for `ip` in `mode`, if one is cached.
    #[inline]
    pub(crate) fn get(&self, ip: u64, mode: ExecMode) -> Option<CacheEntry> {
        let entry = unpack(*self.entries.get(&ip)?);
        (entry.mode == mode).then_some(entry)
    }

    pub(crate) fn insert(&mut self, ip: u64, entry: CacheEntry) {
        if self.entries.len() == self.entries.capacity() {
            // The first table as presized; then twice as large: four times was fewer
            // moves when the table started at an entry per 64 trace bytes, but its last
            // growth could leave foo's 4,400 entries in 16 Ki buckets, 64 pages where 32
            // hold them.
            let more = if self.entries.capacity() == 0 {
                self.presized
            } else {
                self.entries.len()
            };
            self.entries.reserve(more.max(16));
        }
        self.entries.insert(ip, pack(entry));
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.step_limited = false;
    }
}

/// `entry` in eight bytes: displacement (16 bits), instructions (8), mode (2), qualifier
/// (3), size (3), branch displacement (32, [`NO_DISP`] for none).
fn pack(entry: CacheEntry) -> u64 {
    let mode = match entry.mode {
        ExecMode::Bits16 => 0,
        ExecMode::Bits32 => 1,
        ExecMode::Bits64 => 2,
        ExecMode::Unknown => 3,
    };
    let qualifier = entry.qualifier as u64;
    let disp = entry.disp.unwrap_or(NO_DISP);
    u64::from(entry.displacement.cast_unsigned())
        | u64::from(entry.ninsn) << 16
        | mode << 24
        | qualifier << 26
        | u64::from(entry.isize & 7) << 29
        | u64::from(disp.cast_unsigned()) << 32
}

fn unpack(packed: u64) -> CacheEntry {
    let field = |shift: u32, bits: u32| (packed >> shift) & ((1 << bits) - 1);
    let mode = match field(24, 2) {
        0 => ExecMode::Bits16,
        1 => ExecMode::Bits32,
        2 => ExecMode::Bits64,
        _ => ExecMode::Unknown,
    };
    let disp = u32::try_from(packed >> 32).unwrap_or(0).cast_signed();
    CacheEntry {
        displacement: u16::try_from(field(0, 16)).unwrap_or(0).cast_signed(),
        ninsn: u8::try_from(field(16, 8)).unwrap_or(0),
        mode,
        qualifier: Qualifier::from_bits(field(26, 3)),
        isize: u8::try_from(field(29, 3)).unwrap_or(0),
        disp: (disp != NO_DISP).then_some(disp),
    }
}

/// A fast hash for the block cache's keys (an address and a mode): one multiply per
/// word instead of `SipHash`, which showed up at 7% of decode time. The keys come from
/// the trace, but a flooded cache only slows decoding down.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct IpHasher(u64);

impl Hasher for IpHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 32)
    }

    /// Eight bytes per round (the trace writer hashes strings with it too).
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn write_isize(&mut self, n: isize) {
        self.write_u64(n.cast_unsigned() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries read back as they were stored, for every mode, qualifier and size and the
    /// extremes of each field; a lookup in another mode misses, an insert replaces, and
    /// the one displacement the packing cannot hold reads back as none.
    #[test]
    fn entries_read_back_as_stored_in_their_mode_only() {
        let modes = [ExecMode::Bits16, ExecMode::Bits32, ExecMode::Bits64];
        let qualifiers = [
            Qualifier::Again,
            Qualifier::Cond,
            Qualifier::IndirectCall,
            Qualifier::Return,
            Qualifier::Indirect,
            Qualifier::DirectCall,
            Qualifier::DirectJump,
            Qualifier::Decode,
        ];
        let mut cache = BlockCache::default();
        let mut ip = 0x1000u64;
        for mode in modes {
            for qualifier in qualifiers {
                for isize in 0..8 {
                    for (displacement, ninsn, disp) in [
                        (0, 1, None),
                        (i16::MAX, u8::MAX, Some(i32::MAX)),
                        (i16::MIN, 2, Some(i32::MIN + 1)),
                        (-5, 7, Some(-2)),
                        (300, 9, Some(0)),
                    ] {
                        let entry = CacheEntry {
                            displacement,
                            ninsn,
                            mode,
                            qualifier,
                            isize,
                            disp,
                        };
                        cache.insert(ip, entry);
                        assert_eq!(cache.get(ip, mode), Some(entry));
                        for other in modes.iter().filter(|&&m| m != mode) {
                            assert_eq!(cache.get(ip, *other), None);
                        }
                        ip += 1;
                    }
                }
            }
        }
        let entry = CacheEntry {
            disp: Some(i32::MIN),
            ..CacheEntry::at_point(ExecMode::Bits64, Qualifier::Cond, 2)
        };
        cache.insert(0x10, entry);
        assert_eq!(
            cache.get(0x10, ExecMode::Bits64).map(|e| e.disp),
            Some(None)
        );
        // Another mode's entry at the same address replaces it.
        cache.insert(
            0x10,
            CacheEntry::at_point(ExecMode::Bits32, Qualifier::Return, 1),
        );
        assert_eq!(cache.get(0x10, ExecMode::Bits64), None);
        assert_eq!(
            cache.get(0x10, ExecMode::Bits32).map(|e| e.qualifier),
            Some(Qualifier::Return)
        );
        cache.clear();
        assert_eq!(cache.get(0x10, ExecMode::Bits32), None);
    }
}
