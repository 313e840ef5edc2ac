//! Walking the code between decision points, with a cache of decoded blocks.
//!
//! In: a [`BlockDecoder`] with tracing on and no event due, and the [`Block`] being
//! filled. Out: the block extended up to the next instruction that needs trace (a
//! conditional or indirect branch, a return, a far transfer), that instruction's trace
//! consumed, and the decoder's IP at the start of the next block. Hot code is decoded
//! once: the first walk records, per (address, execution mode), how many instructions
//! it is to the next decision point and what kind of point that is ([`CacheEntry`]);
//! later walks jump there directly. The cache follows libipt's block cache, including
//! where it ends blocks (after direct calls and backward jumps while filling), so block
//! boundaries match Intel's `ptxed`; unlike libipt's, it keeps entries only where a run
//! starts and ends ([`BlockDecoder::fill_cache`] says why).

use super::block::{Block, BlockDecoder};
use super::cache::{CacheEntry, Qualifier};
use super::image::Mapping;
use super::insn::{self, Insn, InsnClass};
use crate::decode::pt::events::event::FlowError;
use crate::decode::pt::packets::packet::ExecMode;

/// Steps one fill of the cache may take before it leaves a trampoline.
const FILL_STEPS: usize = 0x400;

/// How a walk goes on after [`BlockDecoder::fill_cache`]'s run.
enum Then {
    /// The block ends where the run did.
    Done,
    /// The run ended at an instruction that needs trace.
    Trace(Insn),
    /// The run reached code the cache knows: walk on from there.
    Cached,
}

/// The entry of the instruction at `ip`, whose successor at `next` has `below`: the
/// same point one instruction further, or a trampoline to `next` where that does not fit
/// the entry's fields (`true`); `None` where the point is outside `mapping` (a split
/// section: the run is not cached across it).
fn joined(ip: u64, next: u64, below: CacheEntry, mapping: Mapping) -> Option<(CacheEntry, bool)> {
    let point = next.wrapping_add_signed(i64::from(below.displacement));
    if !mapping.contains(point) {
        return None;
    }
    let displacement = point.wrapping_sub(ip).cast_signed();
    Some(
        match (below.ninsn.checked_add(1), i16::try_from(displacement)) {
            (Some(ninsn), Ok(displacement)) => (
                CacheEntry {
                    displacement,
                    ninsn,
                    ..below
                },
                false,
            ),
            _ => (trampoline(ip, next, below.mode), true),
        },
    )
}

/// An entry that just moves on to the next instruction `next`.
fn trampoline(ip: u64, next: u64, mode: ExecMode) -> CacheEntry {
    match i16::try_from(next.wrapping_sub(ip).cast_signed()) {
        Ok(displacement) => CacheEntry {
            displacement,
            ..CacheEntry::at_point(mode, Qualifier::Again, 0)
        },
        Err(_) => CacheEntry::at_point(mode, Qualifier::Decode, 0),
    }
}

impl BlockDecoder<'_> {
    /// Proceeds past a cached near direct call or jump at `self.ip`; true when the
    /// block ends there.
    fn proceed_direct(
        &mut self,
        block: &mut Block,
        entry: CacheEntry,
        disp: i32,
        mapping: Mapping,
    ) -> bool {
        let call = entry.qualifier == Qualifier::DirectCall;
        let end = self.ip.wrapping_add(u64::from(entry.isize));
        block.class = if call {
            InsnClass::Call
        } else {
            InsnClass::Jump
        };
        block.size = entry.isize;
        if call && disp != 0 {
            self.retstack.push(end);
        }
        self.ip = end.wrapping_add_signed(i64::from(disp));
        (call && self.config.end_on_call)
            || (!call && self.config.end_on_jump)
            || !mapping.contains(self.ip)
    }

    fn cache_add(&mut self, ip: u64, entry: CacheEntry) {
        // An unknown mode makes an invalid entry.
        if entry.mode != ExecMode::Unknown {
            self.cache.insert(ip, entry);
        }
    }

    fn cache_lookup(&self, ip: u64) -> Option<CacheEntry> {
        self.cache.get(ip, self.mode)
    }

    /// Proceeds to the next decision point, using the cache where the code is mapped.
    pub(crate) fn proceed_no_event(&mut self, block: &mut Block) -> Result<(), FlowError> {
        let Ok(mapping) = self.image.mapping(self.ip) else {
            return self.proceed_no_event_uncached(block);
        };
        if mapping.isid != block.isid {
            if block.ninsn != 0 {
                return Ok(());
            }
            block.isid = mapping.isid;
        }
        self.proceed_cached(block, mapping)
    }

    fn proceed_no_event_uncached(&mut self, block: &mut Block) -> Result<(), FlowError> {
        let (result, last) = self.proceed_to_insn(block, |_| false);
        match result {
            Err(FlowError::BadQuery) => match last {
                Some(insn) => self.proceed_with_trace(&insn),
                None => Err(FlowError::BadInsn),
            },
            Err(err) => Err(err),
            Ok(_) => Ok(()),
        }
    }

    /// Decodes at `ip` within `mapping` only ([`FlowError::BadInsn`] if it runs past).
    fn decode_in(&self, ip: u64, mode: ExecMode, mapping: Mapping) -> Result<Insn, FlowError> {
        let insn = insn::decode(self.image, ip, mode)?;
        if insn.truncated || !mapping.contains(ip) {
            return Err(FlowError::BadInsn);
        }
        Ok(insn)
    }

    fn proceed_cached(&mut self, block: &mut Block, mapping: Mapping) -> Result<(), FlowError> {
        loop {
            let Some(entry) = self.cache_lookup(self.ip) else {
                return self.fill_cache(block, mapping);
            };
            let next = self.ip.wrapping_add_signed(i64::from(entry.displacement));
            // The section was split underneath us: walk slowly to its end.
            if !mapping.contains(next) {
                return self.proceed_no_event_uncached(block);
            }
            // If the run does not fit, end the block; the next one starts empty.
            let Some(ninsn) = block.ninsn.checked_add(u16::from(entry.ninsn)) else {
                return Ok(());
            };
            if let Some(icnt) = &mut self.icnt {
                *icnt = icnt
                    .checked_add(u32::from(entry.ninsn))
                    .ok_or(FlowError::Overflow)?;
            }
            self.ip = next;
            block.end_ip = next;
            block.ninsn = ninsn;
            block.mode = entry.mode;
            match entry.qualifier {
                Qualifier::Again => {
                    block.class = InsnClass::Unknown;
                }
                Qualifier::DirectCall | Qualifier::DirectJump
                    if entry.isize != 0 && entry.disp.is_some() =>
                {
                    let disp = entry.disp.unwrap_or(0);
                    if self.proceed_direct(block, entry, disp, mapping) {
                        return Ok(());
                    }
                }
                Qualifier::Cond if entry.isize != 0 => {
                    block.class = InsnClass::CondJump;
                    block.size = entry.isize;
                    let ip = self.ip;
                    let mut target = ip;
                    if self.cond_branch()? {
                        let disp = match entry.disp {
                            Some(disp) => i64::from(disp),
                            None => self
                                .decode_in(ip, entry.mode, mapping)?
                                .displacement
                                .unwrap_or(0),
                        };
                        target = ip.wrapping_add_signed(disp);
                    }
                    self.ip = target.wrapping_add(u64::from(entry.isize));
                    return Ok(());
                }
                Qualifier::Cond
                | Qualifier::DirectCall
                | Qualifier::DirectJump
                | Qualifier::Decode => {
                    let insn = match self.decode_in(self.ip, entry.mode, mapping) {
                        Ok(insn) => insn,
                        Err(FlowError::BadInsn) => return self.proceed_truncated(block),
                        Err(err) => return Err(err),
                    };
                    block.class = insn.class;
                    block.size = insn.size;
                    self.log_call(&insn);
                    match insn.next_ip() {
                        Err(FlowError::BadQuery) => return self.proceed_with_trace(&insn),
                        Err(err) => return Err(err),
                        Ok(ip) => self.ip = ip,
                    }
                    if self.ends_block(&insn) || !mapping.contains(self.ip) {
                        return Ok(());
                    }
                }
                Qualifier::IndirectCall => {
                    block.class = InsnClass::Call;
                    let size = if entry.isize != 0 {
                        entry.isize
                    } else {
                        self.decode_in(self.ip, entry.mode, mapping)?.size
                    };
                    self.retstack.push(self.ip.wrapping_add(u64::from(size)));
                    return self.proceed_indirect();
                }
                Qualifier::Return => {
                    block.class = InsnClass::Return;
                    return match self.cond_branch() {
                        Ok(true) => {
                            self.ip = self.retstack.pop()?;
                            Ok(())
                        }
                        Ok(false) => Err(FlowError::BadRetComp),
                        Err(FlowError::BadQuery) => self.proceed_indirect(),
                        Err(err) => Err(err),
                    };
                }
                Qualifier::Indirect => {
                    block.class = InsnClass::Indirect;
                    return self.proceed_indirect();
                }
            }
        }
    }

    /// Decodes from `self.ip` to the next point the walk needs trace or stops at (or
    /// to code the cache knows), adds the cache entries of that run, then goes on as
    /// the entry it reached says.
    ///
    /// libipt fills recursively: each instruction decoded, the rest of the run filled,
    /// then the instruction's entry made from its successor's, looked up again. Here the
    /// run is decoded forward into [`BlockDecoder::fill_ips`] and the entries made
    /// backward from the one in hand: one lookup an instruction instead of two, no
    /// recursion. Why entries go only to the run's first instruction and to the points
    /// it ends at (a decision point, a direct call or backward jump, a trampoline):
    /// an entry in the middle of a run is read again only where a later walk starts
    /// there (a loop's head, a jump into the run), and that walk decodes the few
    /// instructions to the next entry again; libipt's entry for every instruction cost
    /// ~90 instructions each and most of the table's page faults. The walks are the
    /// same: every point where filling ends a block but the cached walk does not (a
    /// direct call, a backward jump) has its entry, so a walk that decodes again reaches
    /// it cached, as a walk from an entry would.
    fn fill_cache(&mut self, block: &mut Block, mapping: Mapping) -> Result<(), FlowError> {
        let mut ips = std::mem::take(&mut self.fill_ips);
        ips.clear();
        let then = self.fill_run(block, mapping, &mut ips);
        self.fill_ips = ips;
        match then? {
            Then::Done => Ok(()),
            Then::Trace(insn) => self.proceed_with_trace(&insn),
            Then::Cached => self.proceed_cached(block, mapping),
        }
    }

    /// [`Self::fill_cache`]'s run: decodes it, adds its entries, and says how the walk
    /// goes on.
    fn fill_run(
        &mut self,
        block: &mut Block,
        mapping: Mapping,
        ips: &mut Vec<u64>,
    ) -> Result<Then, FlowError> {
        // Forward: the run's instructions, up to the entry its last one gets. Every one
        // is in `mapping`, so its bytes are lent once.
        let image = self.image;
        let code = image.code(self.ip).filter(|&(begin, bytes)| {
            begin == mapping.begin && mapping.end - begin == bytes.len() as u64
        });
        let mut insn = Insn::NONE;
        let (last, then) = loop {
            if !self.fill_one_insn(block, code, mapping.isid, &mut insn)? {
                return Ok(Then::Done);
            }
            ips.push(insn.ip);
            let next = match insn.next_ip() {
                Ok(next) => next,
                Err(FlowError::BadQuery) => {
                    let qualifier = match insn.class {
                        _ if block.truncated => Qualifier::Decode,
                        InsnClass::Jump | InsnClass::Call if insn.displacement.is_some() => {
                            return Err(FlowError::Internal);
                        }
                        InsnClass::Call => Qualifier::IndirectCall,
                        InsnClass::Return => Qualifier::Return,
                        InsnClass::CondJump => Qualifier::Cond,
                        InsnClass::Jump
                        | InsnClass::FarCall
                        | InsnClass::FarReturn
                        | InsnClass::FarJump
                        | InsnClass::Indirect => Qualifier::Indirect,
                        InsnClass::PtWrite | InsnClass::Unknown | InsnClass::Other => {
                            return Err(FlowError::Internal);
                        }
                    };
                    break (CacheEntry::for_insn(&insn, qualifier), Then::Trace(insn));
                }
                Err(err) => return Err(err),
            };
            self.ip = next;
            // Stop at direct calls (the call stack needs them) and backward jumps, when
            // leaving the section, and after a truncated instruction.
            let stop = match insn.class {
                InsnClass::Call => true,
                InsnClass::Jump => {
                    insn.displacement.is_some_and(|d| d < 0) || self.config.end_on_jump
                }
                _ => false,
            };
            if stop || !mapping.contains(next) || block.truncated {
                let entry = match insn.class {
                    InsnClass::Call if !block.truncated && insn.displacement.is_some() => {
                        CacheEntry::for_insn(&insn, Qualifier::DirectCall)
                    }
                    InsnClass::Jump if !block.truncated && insn.displacement.is_some() => {
                        CacheEntry::for_insn(&insn, Qualifier::DirectJump)
                    }
                    _ => CacheEntry::at_point(insn.mode, Qualifier::Decode, 0),
                };
                break (entry, Then::Done);
            }
            if let Some(entry) = self.cache_lookup(next) {
                if entry.mode != insn.mode {
                    return Err(FlowError::Internal);
                }
                // A split section: don't cache across it, take the slow path to its end.
                let Some((entry, trampoline)) = joined(insn.ip, next, entry, mapping) else {
                    return Ok(Then::Done);
                };
                // After a trampoline the next walk goes on; this one ends here.
                break (entry, if trampoline { Then::Done } else { Then::Cached });
            }
            if ips.len() == FILL_STEPS {
                self.cache.note_step_limit();
                break (trampoline(insn.ip, next, insn.mode), Then::Done);
            }
        };
        // Backward: each instruction's entry from its successor's.
        let Some((&bottom, above)) = ips.split_last() else {
            return Err(FlowError::Internal);
        };
        let mut below = Some(last).filter(|e| e.mode != ExecMode::Unknown);
        let mut next = bottom;
        let keep_last = !matches!(then, Then::Cached);
        if keep_last || above.is_empty() {
            self.cache_add(bottom, last);
        }
        for (depth, &ip) in above.iter().enumerate().rev() {
            // An entry of an unknown mode is not kept, nor any made from it.
            let Some(entry) = below else { break };
            let Some((entry, trampoline)) = joined(ip, next, entry, mapping) else {
                break;
            };
            if depth == 0 || trampoline {
                self.cache_add(ip, entry);
            }
            below = Some(entry).filter(|e| e.mode != ExecMode::Unknown);
            next = ip;
        }
        Ok(then)
    }

    /// The instruction at `ip` runs past its section: take it whole from the image and
    /// end the block with it.
    fn proceed_truncated(&mut self, block: &mut Block) -> Result<(), FlowError> {
        let insn = insn::decode(self.image, self.ip, self.mode)?;
        if !insn.truncated {
            return Err(FlowError::Internal);
        }
        block.raw = insn.raw;
        block.class = insn.class;
        block.size = insn.size;
        block.truncated = true;
        self.log_call(&insn);
        match insn.next_ip() {
            Ok(ip) => {
                self.ip = ip;
                Ok(())
            }
            Err(FlowError::BadQuery) => self.proceed_with_trace(&insn),
            Err(err) => Err(err),
        }
    }
}
