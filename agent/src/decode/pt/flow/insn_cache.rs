//! A memo of decoded instructions, for the walks that go one instruction at a time.
//!
//! In: an address and execution mode, and the image to decode from on a miss. Out: the
//! instruction [`insn::decode`] gives for them. Why: the block cache
//! ([`super::cache`]) lets the walk jump over whole runs, but an event that binds inside
//! a run (an asynchronous disable at a VM exit, an interrupt's FUP, a first visit of the
//! code) is reached one instruction at a time, and each decode (iced-x86, the image's
//! section lookup and copy) costs ~700 instructions; on a real KVM-PT trace that was a
//! third of the decode. A decoded instruction is a pure function of the image, as the
//! block cache's entries are, so the memo is dropped with it when the image changes.
//!
//! Direct-mapped (a slot per address hash, a new decode replaces the slot's old one):
//! bounded memory whatever the trace, and no eviction bookkeeping. Decode errors are not
//! kept.

use super::image::ImageProvider;
use super::insn::{self, Insn};
use crate::decode::pt::events::event::FlowError;
use crate::decode::pt::packets::packet::ExecMode;

/// Slots of the memo (a power of two): 256 instructions, about 12 KiB. Every slot is
/// written when the memo is made, so its pages are a fixed cost of each decode (~3 µs a
/// page fault on a VM): 1 Ki slots cost the 208-byte real icelake trace a third of its
/// decode and spared qemu's only 0.3 % of its instructions (1 Ki, 4 Ki and 16 Ki slots decode
/// the large real traces alike).
const SLOTS: usize = 1 << 8;

/// Decoded instructions by (address, mode).
#[derive(Debug, Clone)]
pub(crate) struct InsnCache {
    slots: Box<[Option<Insn>]>,
}

impl Default for InsnCache {
    fn default() -> Self {
        Self {
            slots: vec![None; SLOTS].into_boxed_slice(),
        }
    }
}

impl InsnCache {
    /// The instruction at `ip` in `mode`, decoded from `image` unless it is in the memo.
    #[inline]
    pub(crate) fn decode(
        &mut self,
        image: &dyn ImageProvider,
        ip: u64,
        mode: ExecMode,
    ) -> Result<Insn, FlowError> {
        let slot = &mut self.slots[slot_of(ip)];
        if let Some(insn) = slot
            && insn.ip == ip
            && insn.mode == mode
        {
            return Ok(*insn);
        }
        let insn = insn::decode(image, ip, mode)?;
        *slot = Some(insn);
        Ok(insn)
    }

    /// Forgets every instruction (the image changed).
    pub(crate) fn clear(&mut self) {
        self.slots.fill(None);
    }
}

/// The slot of `ip`: the address bits mixed by one multiply, the top bits taken.
#[inline]
fn slot_of(ip: u64) -> usize {
    let hash = ip.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - SLOTS.trailing_zeros());
    // In range: the shift leaves log2(SLOTS) bits.
    usize::try_from(hash).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pt::flow::image::Image;

    #[test]
    fn a_hit_is_the_decode_and_a_clear_forgets_a_changed_image() {
        // nop; ret at 0x1000.
        let mut image = Image::new();
        image.add("a", vec![0x90, 0xc3], 0x1000);
        let mut memo = InsnCache::default();
        let first = memo.decode(&image, 0x1000, ExecMode::Bits64).unwrap();
        assert_eq!(
            first,
            insn::decode(&image, 0x1000, ExecMode::Bits64).unwrap()
        );
        assert_eq!(
            memo.decode(&image, 0x1000, ExecMode::Bits64).unwrap(),
            first
        );
        // Another mode is another instruction, not the memo's.
        let in32 = memo.decode(&image, 0x1001, ExecMode::Bits32).unwrap();
        assert_eq!(in32.mode, ExecMode::Bits32);
        // The same address in another image: the memo answers the old code until it is
        // cleared (as the block cache: the decoder clears both when it switches images).
        let mut other = Image::new();
        other.add("b", vec![0xc3], 0x1000);
        assert_eq!(
            memo.decode(&other, 0x1000, ExecMode::Bits64).unwrap(),
            first
        );
        memo.clear();
        let now = memo.decode(&other, 0x1000, ExecMode::Bits64).unwrap();
        assert_eq!(now, insn::decode(&other, 0x1000, ExecMode::Bits64).unwrap());
        assert_ne!(now, first);
    }

    #[test]
    fn addresses_that_share_a_slot_replace_each_other() {
        let mut image = Image::new();
        image.add("a", vec![0x90; 0x10000], 0x1000);
        let mut memo = InsnCache::default();
        let a = 0x1000;
        let b = (a + 1..0x11000)
            .find(|&ip| slot_of(ip) == slot_of(a))
            .expect("two addresses in 64 KiB share one of 1 Ki slots");
        for ip in [a, b, a, b] {
            assert_eq!(memo.decode(&image, ip, ExecMode::Bits64).unwrap().ip, ip);
        }
        // Errors are not kept: unmapped stays unmapped, and the slot keeps its entry.
        assert!(memo.decode(&image, 0x9_0000, ExecMode::Bits64).is_err());
    }
}
