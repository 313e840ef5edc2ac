//! The fast path of [`Branches`]: TNT and TIP packets straight to branch events.
//!
//! In: a [`Branches`] whose decoder is between blocks in the common state: tracing on,
//! the current event a TNT or a TIP, nothing queued or postponed, no TSX, no ticks. Out:
//! the branch events of the blocks that follow, up to [`BATCH`] at a time, exactly as the
//! general path (`next_block`, its cache walk, the event layer) would report them: same
//! events, times, offsets, counts and decoder state. Blocks come whole from
//! [`FastBlocks`] (one lookup per block), TNT bits are used from a word, and TNT and TIP
//! packets are read straight from the trace ([`hot_packet`]). Anything else goes to the
//! general path: a block the fast path cannot take (not cached yet, a far transfer, a
//! TNT where a TIP is due ...) is left to it whole; when a block's last TNT bit or its
//! TIP is used and the next packet is not a TNT or TIP (PSB+, timing, MODE, FUP, OVF
//! ...), the general path fetches that event and ends the block itself.
//!
//! The loop runs on locals ([`Fast`], [`Tally`], the return stack) that are written back
//! when it stops, so that the compiler keeps them in registers: it is about 60
//! instructions per block, and the instruction count is what bounds its speed.

use super::{BranchEvent, BranchKind, Branches, MAX_STALLED_INSNS};
use crate::decode::pt::events::{Event, EventKind};
use crate::decode::pt::fast_blocks::{self, Exit, FastBlock, FastBlocks};
use crate::decode::pt::flow::{Block, BlockDecoder, RetStack};
use crate::decode::pt::insn::InsnClass;
use crate::decode::pt::last_ip::LastIp;
use crate::decode::pt::packet::{ExecMode, IpCompression, Packet};
use crate::decode::pt::parse_hot::{Hot, hot_packet, skip_pads};

/// Branch events a fast run produces before handing them out.
const BATCH: usize = 256;

/// The largest instruction count a fast run starts from: it adds at most
/// [`MAX_STALLED_INSNS`] plus a block before the count starts over, so it cannot overflow.
const MAX_ENTRY_ICNT: u32 = u32::MAX - (1 << 22);

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

/// The decoder state the fast path keeps in locals.
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
    /// The instruction count for TRIG, when it is on (`BlockDecoder::icnt`).
    icnt: u32,
    icnt_on: bool,
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
            || dec.icnt.is_some_and(|n| n > MAX_ENTRY_ICNT)
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
            icnt: dec.icnt.unwrap_or(0),
            icnt_on: dec.icnt.is_some(),
            last_ip: ev.ip,
        })
    }

    /// Moves on to the next event if it is a TNT or a TIP with an IP; false (and no
    /// change) otherwise.
    #[expect(
        clippy::inline_always,
        reason = "the fast loop's state stays in registers only if this is inlined"
    )]
    #[inline(always)]
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
        self.icnt = 0;
        self.icnt_on = true;
        self.cur = cur;
        self.cur_time = self.now;
        true
    }

    /// Writes the state back, as the general path would have left it.
    fn store(self, dec: &mut BlockDecoder<'_>) {
        dec.ip = self.ip;
        dec.icnt = self.icnt_on.then_some(self.icnt);
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

/// What the fast path counts as it goes, written to `Branches` when it stops.
#[derive(Debug, Clone, Copy)]
struct Tally {
    blocks: u64,
    insns: u64,
    /// Calls, returns and jumps.
    branches: [u64; 3],
    last_ip: u64,
    stalled: (usize, u64),
    /// Events in the batch.
    queued: usize,
}

impl Tally {
    fn store(self, branches: &mut Branches<'_>) {
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
        branches.queue.len = self.queued;
    }
}

/// Why a fast run stopped.
enum Stop {
    /// The batch is full, or the next block is for the general path.
    Pause,
    /// The branch ending `block` used up its trace event and the next event is not one
    /// the fast path reads: the general path fetches it and ends the block.
    HandOver { offset: usize, block: FastBlock },
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
        let Some(mut fast) = self
            .fast
            .is_some()
            .then(|| Fast::enter(&self.dec))
            .flatten()
        else {
            return false;
        };
        if self.queue.buf.len() < BATCH {
            self.queue.buf.resize(BATCH, NO_EVENT);
        }
        let mut tally = Tally {
            blocks: 0,
            insns: 0,
            branches: [0; 3],
            last_ip: self.last_ip,
            stalled: self.stalled,
            queued: self.queue.len,
        };
        let mut retstack = std::mem::take(&mut self.dec.retstack);
        let stop = match (
            self.fast.as_mut(),
            self.queue
                .buf
                .get_mut(..BATCH)
                .and_then(|b| b.try_into().ok()),
        ) {
            (Some(table), Some(buf)) => {
                run(&mut fast, &mut tally, &mut retstack, table, buf, &self.dec)
            }
            _ => Stop::Pause,
        };
        self.dec.retstack = retstack;
        let progressed = tally.blocks > 0;
        tally.store(self);
        match stop {
            Stop::HandOver { offset, block } => {
                fast.store(&mut self.dec);
                self.hand_over(fast, offset, &block);
                true
            }
            Stop::Pause if progressed => {
                fast.store(&mut self.dec);
                true
            }
            Stop::Pause => false,
        }
    }

    /// Ends `block` on the general path after its trace event was used up.
    fn hand_over(&mut self, fast: Fast, offset: usize, block: &FastBlock) {
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

/// The fast loop: blocks to branch events in `buf` until the batch is full or the
/// general path is needed.
#[inline]
fn run(
    fast: &mut Fast,
    tally: &mut Tally,
    retstack: &mut RetStack,
    table: &mut FastBlocks,
    buf: &mut [BranchEvent; BATCH],
    dec: &BlockDecoder<'_>,
) -> Stop {
    let trace = dec.evdec.pkt.trace();
    let mut resolved = false;
    while tally.queued < BATCH {
        let offset = fast.pos;
        let Some(block) = table.get(fast.ip, fast.mode) else {
            // Resolve once; a block that does not resolve is the general path's.
            if resolved {
                return Stop::Pause;
            }
            let Some(block) = fast_blocks::resolve(dec, fast.ip, fast.mode) else {
                return Stop::Pause;
            };
            table.insert(block);
            resolved = true;
            continue;
        };
        resolved = false;
        let stalled = if offset == tally.stalled.0 {
            tally.stalled.1 + u64::from(block.ninsn) + 1
        } else {
            0
        };
        if stalled > MAX_STALLED_INSNS {
            return Stop::Pause;
        }
        // The branch: where it goes, what it reports, whether it used up `cur`. Where
        // the trace does not fit (the general path fails there) leave the block.
        let (to, kind, used) = match (block.exit, fast.cur) {
            (Exit::Cond, Cur::Tnt { bits, left }) => {
                let left = left - 1;
                fast.cur = Cur::Tnt { bits, left };
                let to = if bits >> left & 1 == 1 {
                    block.target
                } else {
                    block.fall
                };
                (
                    to,
                    (to != block.fall).then_some(BranchKind::Jump),
                    left == 0,
                )
            }
            (Exit::DirectCall, _) => {
                if block.push_ret {
                    retstack.push(block.fall);
                }
                (block.target, Some(BranchKind::Call), false)
            }
            (Exit::DirectJump, _) => (block.target, Some(BranchKind::Jump), false),
            (Exit::Return, Cur::Tnt { bits, left }) => {
                let left = left - 1;
                if bits >> left & 1 == 0 || retstack.is_empty() {
                    return Stop::Pause;
                }
                fast.cur = Cur::Tnt { bits, left };
                let to = retstack.pop().unwrap_or(0);
                (to, Some(BranchKind::Return), left == 0)
            }
            (Exit::Return, Cur::Tip { ip, .. }) => (ip, Some(BranchKind::Return), true),
            (Exit::IndirectCall, Cur::Tip { ip, .. }) => {
                retstack.push(block.fall);
                (ip, Some(BranchKind::Call), true)
            }
            (Exit::IndirectJump, Cur::Tip { ip, .. }) => (ip, Some(BranchKind::Jump), true),
            (Exit::Cond, Cur::Tip { .. })
            | (Exit::IndirectCall | Exit::IndirectJump, Cur::Tnt { .. }) => return Stop::Pause,
        };
        fast.ip = to;
        // Ok: `stalled` bounds what a run adds to a count it took at most MAX_ENTRY_ICNT.
        fast.icnt = fast.icnt.wrapping_add(u32::from(block.ninsn));
        if used && !fast.next_event(trace) {
            return Stop::HandOver {
                offset,
                block: *block,
            };
        }
        tally.blocks += 1;
        tally.insns += u64::from(block.ninsn);
        tally.last_ip = block.end_ip;
        tally.stalled = (offset, stalled);
        if let Some(kind) = kind {
            if let Some(n) = tally.branches.get_mut(kind.index()) {
                *n += 1;
            }
            buf[tally.queued] = BranchEvent {
                kind,
                from: block.end_ip,
                to,
                tsc: fast.seen.tsc,
                has_tsc: fast.seen.has_tsc,
                offset: fast.pos,
                error: None,
            };
            tally.queued += 1;
        }
    }
    Stop::Pause
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
