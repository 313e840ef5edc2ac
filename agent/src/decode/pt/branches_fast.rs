//! The fast path of [`Branches`]: TNT and TIP packets straight to branch events.
//!
//! In: a [`Branches`] whose decoder is between blocks in the common state: tracing on,
//! the current event a TNT or a TIP, nothing queued or postponed, no TSX, no ticks. Out:
//! the branch events of the blocks that follow, up to [`BATCH`] at a time, exactly as the
//! general path (`next_block`, its cache walk, the event layer) would report them: same
//! events, times, offsets, counts and decoder state. Blocks come whole from
//! [`FastBlocks`] (one lookup per block), TNT bits are used from a word, and TNT and TIP
//! packets are read straight from the trace ([`hot_packet`]). Anything else hands over
//! to the general path: before a block the fast path cannot take (a block not cached
//! yet, a far transfer, a TNT where a TIP is due ...), or, after a block's last bit or
//! TIP, when the next packet is not a TNT or TIP (PSB+, timing, MODE, FUP, OVF ...):
//! then the general path fetches that event and ends the block itself.

use super::{BranchEvent, BranchKind, Branches, MAX_STALLED_INSNS};
use crate::decode::pt::events::{Event, EventKind};
use crate::decode::pt::fast_blocks::{self, Exit, FastBlock};
use crate::decode::pt::flow::{Block, BlockDecoder, RetStack};
use crate::decode::pt::insn::InsnClass;
use crate::decode::pt::last_ip::LastIp;
use crate::decode::pt::packet::{ExecMode, IpCompression, Packet};
use crate::decode::pt::parse_hot::{Hot, hot_packet, skip_pads};

/// Branch events a fast run produces before handing them out.
const BATCH: usize = 256;

/// The trace event being used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cur {
    /// A TNT with `left` outcomes still to use (the next is bit `left - 1` of `bits`).
    Tnt { bits: u64, left: u8 },
    /// A TIP to `ip`, `size` bytes at the read position.
    Tip { ip: u64, size: usize },
}

/// The time fields of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    tsc: u64,
    has_tsc: bool,
    lost_mtc: u32,
    lost_cyc: u32,
}

impl Stamp {
    fn of(event: &Event) -> Self {
        Self {
            tsc: event.tsc,
            has_tsc: event.has_tsc,
            lost_mtc: event.lost_mtc,
            lost_cyc: event.lost_cyc,
        }
    }
}

/// The decoder state the fast path keeps in locals, and writes back when it hands over.
#[derive(Debug, Clone, Copy)]
struct Fast {
    ip: u64,
    mode: ExecMode,
    cur: Cur,
    /// Where the event layer reads on: the packet after `cur`'s TNT (PADs skipped), or
    /// `cur`'s TIP itself (the event layer moves past a TIP on the next event).
    pos: usize,
    /// The time of the last event used up: what branch events carry.
    seen: Stamp,
    /// The time of `cur`.
    cur_time: Stamp,
    /// The time new events get (no timing packet is read here).
    now: Stamp,
    icnt: Option<u32>,
    last_ip: LastIp,
}

impl Fast {
    /// The decoder's state, if the fast path can take it from here.
    fn enter(dec: &BlockDecoder<'_>) -> Option<Self> {
        let ev = &dec.evdec;
        if dec.status.is_err()
            || !dec.enabled
            || dec.postponed.is_some()
            || dec.config.tick_events
            || dec.speculative
            || dec.mode == ExecMode::Unknown
            || ev.status.is_err()
            || !ev.enabled
            || ev.event.is_some()
            || !ev.evq.is_empty()
            || dec.event.ip_suppressed
            || dec.event.status_update
        {
            return None;
        }
        let (pos, packet, read) = ev.packet?;
        let cur = match (dec.event.kind, packet) {
            (EventKind::Tnt { bits, size }, _) if size > 0 && !ev.bound => {
                Cur::Tnt { bits, left: size }
            }
            (EventKind::Tip { ip }, Packet::Tip(_)) if ev.bound => Cur::Tip { ip, size: read },
            _ => return None,
        };
        Some(Self {
            ip: dec.ip,
            mode: dec.mode,
            cur,
            pos,
            seen: Stamp {
                tsc: dec.tsc,
                has_tsc: dec.has_tsc,
                lost_mtc: dec.lost_mtc,
                lost_cyc: dec.lost_cyc,
            },
            cur_time: Stamp::of(&dec.event),
            now: Stamp::of(&ev.timed(EventKind::Ignore)),
            icnt: dec.icnt,
            last_ip: ev.ip,
        })
    }

    /// Uses the next TNT bit (the caller checked there is one).
    #[inline]
    fn take_bit(&mut self) -> bool {
        match &mut self.cur {
            Cur::Tnt { bits, left } if *left > 0 => {
                *left -= 1;
                *bits >> *left & 1 == 1
            }
            _ => false,
        }
    }

    /// `cur` is used up (after a branch that needed trace).
    #[inline]
    fn used_up(&self) -> bool {
        match self.cur {
            Cur::Tnt { left, .. } => left == 0,
            Cur::Tip { .. } => true,
        }
    }

    /// Moves on to the next event if it is a TNT or a TIP with an IP; false (and no
    /// change) otherwise.
    fn next_event(&mut self, trace: &[u8]) -> bool {
        let at = match self.cur {
            Cur::Tnt { .. } => self.pos,
            Cur::Tip { size, .. } => skip_pads(trace, self.pos + size),
        };
        let cur = match hot_packet(trace, at) {
            Hot::Tnt { bits, count, size } => {
                self.pos = skip_pads(trace, at + size);
                Cur::Tnt { bits, left: count }
            }
            Hot::Tip { payload, size } if payload.compression != IpCompression::Suppressed => {
                self.last_ip.update(payload);
                let Ok(ip) = self.last_ip.ip() else {
                    return false;
                };
                self.pos = at;
                Cur::Tip { ip, size }
            }
            _ => return false,
        };
        // As `BlockDecoder::fetch_event`: the used-up event's time counts as seen, and
        // a TNT or TIP anchors the instruction count.
        self.seen = self.cur_time;
        self.icnt = Some(0);
        self.cur = cur;
        self.cur_time = self.now;
        true
    }

    /// Writes the state back, as the general path would have left it.
    fn store(&self, dec: &mut BlockDecoder<'_>) {
        dec.ip = self.ip;
        dec.icnt = self.icnt;
        dec.tsc = self.seen.tsc;
        dec.has_tsc = self.seen.has_tsc;
        dec.lost_mtc = self.seen.lost_mtc;
        dec.lost_cyc = self.seen.lost_cyc;
        let kind = match self.cur {
            Cur::Tnt { bits, left } => EventKind::Tnt { bits, size: left },
            Cur::Tip { ip, .. } => EventKind::Tip { ip },
        };
        dec.event = Event {
            kind,
            ip_suppressed: false,
            status_update: false,
            has_tsc: self.cur_time.has_tsc,
            tsc: self.cur_time.tsc,
            lost_mtc: self.cur_time.lost_mtc,
            lost_cyc: self.cur_time.lost_cyc,
        };
        dec.evdec.ip = self.last_ip;
        dec.evdec.pkt.seek(self.pos);
        dec.evdec.fetch_packet();
        dec.evdec.bound = matches!(self.cur, Cur::Tip { .. });
    }
}

/// The general path's block for `block` (for the hand-over).
fn general_block(block: &FastBlock) -> Block {
    Block {
        ip: block.ip,
        end_ip: block.end_ip,
        mode: block.mode,
        isid: block.isid,
        ninsn: block.ninsn,
        class: match block.exit {
            Exit::Cond => InsnClass::CondJump,
            Exit::DirectCall | Exit::IndirectCall => InsnClass::Call,
            Exit::DirectJump => InsnClass::Jump,
            Exit::Return => InsnClass::Return,
            Exit::IndirectJump => InsnClass::Indirect,
        },
        size: block.size,
        ..Block::default()
    }
}

/// What the fast path counts as it goes, kept out of `Branches` until it stops (the
/// compiler keeps these in registers).
struct Tally {
    blocks: u64,
    insns: u64,
    /// Calls, returns and jumps.
    branches: [u64; 3],
    last_ip: u64,
    stalled: (usize, u64),
}

impl Tally {
    fn new(branches: &Branches<'_>) -> Self {
        Self {
            blocks: 0,
            insns: 0,
            branches: [0; 3],
            last_ip: branches.last_ip,
            stalled: branches.stalled,
        }
    }

    fn store(&self, branches: &mut Branches<'_>) {
        let counts = &mut branches.counts;
        counts.blocks += self.blocks;
        counts.instructions += self.insns;
        for (kind, n) in [BranchKind::Call, BranchKind::Return, BranchKind::Jump]
            .into_iter()
            .zip(self.branches)
        {
            counts.branches[kind.index()] += n;
        }
        branches.fast_blocks += self.blocks;
        branches.last_ip = self.last_ip;
        branches.stalled = self.stalled;
        branches.held = None;
    }
}

/// A slot filler for the event buffer.
const NO_EVENT: BranchEvent = BranchEvent {
    kind: BranchKind::Error,
    from: 0,
    to: 0,
    tsc: 0,
    has_tsc: false,
    offset: 0,
    error: None,
};

impl Branches<'_> {
    /// Decodes blocks on the fast path while it can; false if it could not take even
    /// one (then nothing changed).
    pub(super) fn run_fast(&mut self) -> bool {
        if self.fast.is_none() {
            return false;
        }
        let Some(mut fast) = Fast::enter(&self.dec) else {
            return false;
        };
        if self.queue.buf.len() < BATCH {
            self.queue.buf.resize(BATCH, NO_EVENT);
        }
        let trace = self.dec.evdec.pkt.trace();
        let mut tally = Tally::new(self);
        let mut queued = self.queue.len;
        let mut resolved = false;
        while queued < BATCH {
            let offset = fast.pos;
            // The block is used in place: copying it showed up as store-forwarding stalls.
            let Some(block) = self.fast.as_ref().and_then(|b| b.get(fast.ip, fast.mode)) else {
                if resolved {
                    break;
                }
                let Some(block) = fast_blocks::resolve(&self.dec, fast.ip, fast.mode) else {
                    break;
                };
                if let Some(blocks) = self.fast.as_mut() {
                    blocks.insert(block);
                }
                resolved = true;
                continue;
            };
            resolved = false;
            // Leave the block to the general path where it would fail or differ.
            let ready = match (block.exit, fast.cur) {
                (Exit::Cond, Cur::Tnt { .. })
                | (Exit::DirectCall | Exit::DirectJump, _)
                | (Exit::Return | Exit::IndirectCall | Exit::IndirectJump, Cur::Tip { .. }) => true,
                (Exit::Return, Cur::Tnt { bits, left }) => {
                    bits >> (left - 1) & 1 == 1 && !self.dec.retstack.is_empty()
                }
                (Exit::IndirectCall | Exit::IndirectJump, Cur::Tnt { .. })
                | (Exit::Cond, Cur::Tip { .. }) => false,
            };
            let icnt = match fast.icnt {
                Some(n) => match n.checked_add(u32::from(block.ninsn)) {
                    Some(n) => Some(n),
                    None => break,
                },
                None => None,
            };
            let stalled = if offset == tally.stalled.0 {
                tally.stalled.1 + u64::from(block.ninsn) + 1
            } else {
                0
            };
            if !ready || stalled > MAX_STALLED_INSNS {
                break;
            }
            fast.icnt = icnt;
            let kind = take_branch(&mut fast, block, &mut self.dec.retstack);
            let traced = !matches!(block.exit, Exit::DirectCall | Exit::DirectJump);
            if traced && fast.used_up() && !fast.next_event(trace) {
                let block = *block;
                self.queue.len = queued;
                tally.store(self);
                self.hand_over(&fast, offset, &block);
                return true;
            }
            tally.blocks += 1;
            tally.insns += u64::from(block.ninsn);
            tally.last_ip = block.end_ip;
            tally.stalled = (offset, stalled);
            if let Some(kind) = kind {
                if let Some(n) = tally.branches.get_mut(kind.index()) {
                    *n += 1;
                }
                if let Some(slot) = self.queue.buf.get_mut(queued) {
                    *slot = BranchEvent {
                        kind,
                        from: block.end_ip,
                        to: fast.ip,
                        tsc: fast.seen.tsc,
                        has_tsc: fast.seen.has_tsc,
                        offset: fast.pos,
                        error: None,
                    };
                }
                queued += 1;
            }
        }
        if tally.blocks == 0 {
            return false;
        }
        self.queue.len = queued;
        tally.store(self);
        fast.store(&mut self.dec);
        true
    }

    /// `block`'s trace is used up and the next event is not one the fast path reads:
    /// the general path fetches it and ends the block, as `next_block` would.
    fn hand_over(&mut self, fast: &Fast, offset: usize, block: &FastBlock) {
        fast.store(&mut self.dec);
        let block = general_block(block);
        let result = match fast.cur {
            // A used-up TNT is left behind by the trailing-event check itself.
            Cur::Tnt { .. } => self.dec.proceed_trailing_event(Some(&block)),
            Cur::Tip { .. } => self
                .dec
                .fetch_event()
                .and_then(|()| self.dec.proceed_trailing_event(Some(&block))),
        };
        self.finish_block(offset, &block, result);
    }
}

/// Takes the branch that ends `block` (the caller checked the trace has what it needs):
/// moves `fast.ip` on; returns the branch event's kind, if one is due.
#[inline]
fn take_branch(fast: &mut Fast, block: &FastBlock, retstack: &mut RetStack) -> Option<BranchKind> {
    let tip = match fast.cur {
        Cur::Tip { ip, .. } => ip,
        Cur::Tnt { .. } => 0,
    };
    match block.exit {
        Exit::Cond => {
            fast.ip = if fast.take_bit() {
                block.target
            } else {
                block.fall
            };
            (fast.ip != block.fall).then_some(BranchKind::Jump)
        }
        Exit::DirectCall => {
            if block.push_ret {
                retstack.push(block.fall);
            }
            fast.ip = block.target;
            Some(BranchKind::Call)
        }
        Exit::DirectJump => {
            fast.ip = block.target;
            Some(BranchKind::Jump)
        }
        Exit::Return => {
            fast.ip = match fast.cur {
                Cur::Tnt { .. } => {
                    fast.take_bit();
                    // Checked non-empty before the block.
                    retstack.pop().unwrap_or(0)
                }
                Cur::Tip { .. } => tip,
            };
            Some(BranchKind::Return)
        }
        Exit::IndirectCall => {
            retstack.push(block.fall);
            fast.ip = tip;
            Some(BranchKind::Call)
        }
        Exit::IndirectJump => {
            fast.ip = tip;
            Some(BranchKind::Jump)
        }
    }
}
