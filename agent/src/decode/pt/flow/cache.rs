//! The block cache's entries: what the code walk records between decision points.
//!
//! In: nothing (plain data, filled by the walk in [`super::flow_walk`]). Out:
//! [`CacheEntry`], per (address, execution mode) the run of instructions to the next
//! decision point and what kind of point that is ([`Qualifier`]), which the walk and the
//! fast path ([`super::fast_blocks`]) read back; and [`IpHasher`], the hash of the
//! cache's keys (the trace writer and stack reconstruction use it too). Its own module so
//! that the decoder holding the cache ([`super::block`]) does not import the walk that
//! fills it, which imports the decoder.

use std::hash::Hasher;

use super::insn::Insn;
use crate::decode::pt::packets::packet::ExecMode;

/// What to do at the end of a cached run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
