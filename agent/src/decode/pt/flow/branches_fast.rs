//! The fast path of [`Branches`]: TNT and TIP packets straight to branch events.
//!
//! In: a [`Branches`] whose decoder is between blocks in the common state: tracing on,
//! the current event a TNT or a TIP, nothing queued or postponed, no TSX, no ticks. Out:
//! the branch events of the blocks that follow, up to [`BATCH`] at a time, exactly as the
//! general path (`next_block`, its cache walk, the event layer) would report them: same
//! events, times, offsets, counts and decoder state. Blocks come whole from
//! [`FastBlocks`] (one lookup per block), TNT bits are used from a word, TNT and TIP
//! packets are read straight from the trace ([`hot_packet`]), and timing packets between
//! them (MTC, CYC, TSC, TMA) go to the clock as the event layer applies them. Anything
//! else goes to the general path: a block the fast path cannot take (not cached yet, a
//! far transfer, a TNT where a TIP is due ...) is left to it whole; when a block's last
//! TNT bit or its TIP is used and the next event is not a TNT or TIP (PSB+, CBR, MODE,
//! FUP, OVF, PTWRITE, a timing error ...), the general path fetches that event and ends
//! the block itself. One exception, the commonest event pair of real traces: a TIP.PGD
//! with an IP right followed by a TIP.PGE with an IP (code leaving the traced range and
//! coming back, e.g. through a PLT stub) is taken here ([`toggle`]), by the general
//! path's rules, where every event has the same time.
//!
//! The loop is instruction-bound, so it is shaped for the register allocator: what
//! changes per block or per trace event (the IP, the TNT word, the trace position, the
//! counts, the batch position) lives in locals, the table is read through a [`fast_blocks::View`]
//! (a `&mut` table was reloaded after every store), the common packets are read inline,
//! and the clock and the rest of [`Fast`] are touched once per event; all of it is
//! written back to the decoder when the loop stops.

use super::{BranchEvent, BranchKind, Branches, MAX_STALLED_INSNS, WalkBlocks};
use crate::decode::pt::events::evdec::apply_timing;
use crate::decode::pt::events::event::{Event, EventKind};
use crate::decode::pt::flow::block::{Block, BlockCache, BlockDecoder, RetView};
use crate::decode::pt::flow::fast_blocks::{self, Exit, FastBlock, FastBlocks, View};
use crate::decode::pt::flow::image::ImageProvider;
use crate::decode::pt::flow::insn::InsnClass;
use crate::decode::pt::flow::loop_runs::{self, LoopRun, LoopRuns, RUN_EVENTS};
use crate::decode::pt::packets::last_ip::LastIp;
use crate::decode::pt::packets::packet::{ExecMode, IpCompression, Packet};
use crate::decode::pt::packets::parse::{BlockContext, decode_packet};
use crate::decode::pt::packets::parse_hot::{
    Hot, TIP_PGD, TIP_PGE, hot_packet, ip_packet, skip_pad_runs, skip_pads,
};
use crate::decode::pt::timing::time::{Time, TimeCal, TimingConfig};

/// Branch events a fast run produces before handing them out.
const BATCH: usize = 1024;

/// The batch a decode starts with: the first fast run that fills more than half of it
/// makes the batch [`BATCH`]. Why: the buffer is written whole when it is made, and 1 Ki
/// events are 12 fresh pages (~40 µs of page faults on a VM), most of a short trace's
/// decode. Two sizes, each a constant in its copy of the loop: a batch length read at
/// run time cost the loop 2 % more instructions.
pub(super) const FIRST_BATCH: usize = 64;

/// The largest instruction count a fast run starts from: it adds at most
/// [`MAX_STALLED_INSNS`] plus a block before the count starts over, so it cannot overflow.
const MAX_ENTRY_ICNT: u32 = u32::MAX - (1 << 22);

/// The time fields of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    tsc: u64,
    has_tsc: bool,
    lost_mtc: u32,
    lost_cyc: u32,
}

impl Stamp {
    fn of_time(time: &Time) -> Self {
        Self {
            tsc: time.relative_tsc(),
            has_tsc: time.tsc().is_ok(),
            lost_mtc: time.lost().0,
            lost_cyc: time.lost().1,
        }
    }

    fn of(event: &Event) -> Self {
        Self {
            tsc: event.tsc,
            has_tsc: event.has_tsc,
            lost_mtc: event.lost_mtc,
            lost_cyc: event.lost_cyc,
        }
    }
}

/// The decoder state the fast path works on.
#[derive(Debug, Clone, Copy)]
struct Fast {
    ip: u64,
    mode: ExecMode,
    /// The current event: a TNT with `left` outcomes still to use in `bits` (the next
    /// is bit `left - 1`), or, with `tip`, a TIP to `bits`, `tip_size` bytes at `pos`.
    /// (A used-up TNT has `left` 0 only until the next event replaces it.)
    bits: u64,
    left: u8,
    tip: bool,
    tip_size: usize,
    /// Where the event layer reads on: the packet after the current TNT (PADs
    /// skipped), or the current TIP itself (the event layer moves past a TIP on the
    /// next event).
    pos: usize,
    /// The time of the last event used up: what branch events carry.
    seen: Stamp,
    /// The time of the current event.
    cur_time: Stamp,
    /// The time fields of `time`: what the next event will carry unless a timing
    /// packet comes first.
    now: Stamp,
    /// Events taken since the clock last moved (counting to 2; see `took_event`).
    settled: u8,
    /// The event layer's clock (timing packets between TNTs and TIPs are applied here
    /// as it applies them), and its configuration.
    time: Time,
    tcal: TimeCal,
    timing: TimingConfig,
    /// The instruction count for TRIG (`BlockDecoder::icnt`): `icnt_base` plus the
    /// instructions after the first `icnt_mark` of the run, when on.
    icnt_on: bool,
    icnt_base: u32,
    icnt_mark: u64,
    last_ip: LastIp,
}

impl Fast {
    /// The decoder's state, if the fast path can take it from here.
    ///
    /// The event layer's `status` is not asked: it says why there is no packet, and the
    /// fast path needs a packet. With one it is stale (an overflow's restart leaves
    /// `NoSync` there for the rest of the trace), and testing it kept every block after
    /// the first overflow off the fast path: 64,000 of mruby's 460,000 blocks.
    #[expect(
        clippy::inline_always,
        reason = "built in place: returned, the 268-byte state was a memcpy call per run"
    )]
    #[inline(always)]
    fn enter(dec: &BlockDecoder<'_>) -> Option<Self> {
        let ev = &dec.evdec;
        if dec.status.is_err()
            || !dec.enabled
            || dec.postponed.is_some()
            || dec.config.tick_events
            || dec.speculative
            || dec.mode == ExecMode::Unknown
            || dec.icnt.is_some_and(|n| n > MAX_ENTRY_ICNT)
            || !ev.enabled
            || ev.event.is_some()
            || !ev.evq.is_empty()
            || dec.event.ip_suppressed
            || dec.event.status_update
        {
            return None;
        }
        let (pos, packet, read) = ev.packet?;
        let (bits, left, tip) = match (dec.event.kind, packet) {
            (EventKind::Tnt { bits, size }, _) if size > 0 && !ev.bound => (bits, size, false),
            (EventKind::Tip { ip }, Packet::Tip(_)) if ev.bound => (ip, 0, true),
            _ => return None,
        };
        Some(Self {
            ip: dec.ip,
            mode: dec.mode,
            bits,
            left,
            tip,
            tip_size: read,
            pos,
            seen: Stamp {
                tsc: dec.tsc,
                has_tsc: dec.has_tsc,
                lost_mtc: dec.lost_mtc,
                lost_cyc: dec.lost_cyc,
            },
            cur_time: Stamp::of(&dec.event),
            now: Stamp::of_time(&ev.time),
            settled: 0,
            time: ev.time,
            tcal: ev.tcal,
            timing: ev.config.timing,
            icnt_on: dec.icnt.is_some(),
            icnt_base: dec.icnt.unwrap_or(0),
            icnt_mark: 0,
            last_ip: ev.ip,
        })
    }

    /// Moves on to the next event if it is a TNT or a TIP with an IP, after any timing
    /// packets (MTC, CYC, TSC, TMA) before it; false (and no change) otherwise.
    /// `insns` is the run's instruction count so far.
    #[inline(never)]
    fn next_event(&mut self, trace: &[u8], insns: u64) -> bool {
        let mut at = next_packet(trace, self.tip, self.pos, self.tip_size);
        let mut clock = None;
        // Each round moves on by a packet, so this ends with the trace.
        loop {
            match hot_packet(trace, at) {
                Hot::Tnt { bits, count, size } => {
                    self.pos = skip_pads(trace, at + size);
                    self.bits = bits;
                    self.left = count;
                    self.tip = false;
                    break;
                }
                Hot::Tip { payload, size } => {
                    if payload.compression == IpCompression::Suppressed {
                        return false;
                    }
                    let mut last_ip = self.last_ip;
                    last_ip.update(payload);
                    let Ok(ip) = last_ip.ip() else {
                        return false;
                    };
                    self.last_ip = last_ip;
                    self.pos = at;
                    self.bits = ip;
                    self.left = 0;
                    self.tip = true;
                    self.tip_size = size;
                    break;
                }
                Hot::Other => {
                    let Some((next, time, tcal)) = self.timing_packet(trace, at, clock) else {
                        return false;
                    };
                    clock = Some((time, tcal));
                    at = next;
                }
            }
        }
        // As `BlockDecoder::fetch_event`: the used-up event's time counts as seen, and
        // a TNT or TIP anchors the instruction count.
        if let Some((time, tcal)) = clock {
            self.time = time;
            self.tcal = tcal;
            self.now = Stamp::of_time(&time);
            self.settled = 0;
        }
        self.took_event(insns);
        true
    }

    /// What `BlockDecoder::fetch_event` does once the next TNT or TIP is in place:
    /// the used-up event's time counts as seen, the new one carries the clock's, and it
    /// anchors the instruction count.
    #[expect(
        clippy::inline_always,
        reason = "the fast loop's registers hold up only if this is inlined"
    )]
    #[inline(always)]
    fn took_event(&mut self, insns: u64) {
        self.icnt_mark = insns;
        // Two events after the clock last moved, `seen`, `cur_time` and `now` are equal
        // and the instruction count is on from 0: nothing else to do.
        if self.settled < 2 {
            self.seen = self.cur_time;
            self.cur_time = self.now;
            self.icnt_on = true;
            self.icnt_base = 0;
            self.settled += 1;
        }
    }

    /// Applies the timing packet at `at` to `clock` (or, if `None`, to the current clock),
    /// as the event layer does between events: the clock after it and where the next
    /// packet starts; `None` for any other packet, or where the event layer fails.
    #[cold]
    fn timing_packet(
        &self,
        trace: &[u8],
        at: usize,
        clock: Option<(Time, TimeCal)>,
    ) -> Option<(usize, Time, TimeCal)> {
        let decoded = decode_packet(trace, at, self.timing.errata, BlockContext::None).ok()?;
        if !matches!(
            decoded.packet,
            Packet::Mtc { .. } | Packet::Cyc { .. } | Packet::Tsc { .. } | Packet::Tma { .. }
        ) {
            return None;
        }
        let (mut time, mut tcal) = clock.unwrap_or((self.time, self.tcal));
        apply_timing(&mut time, &mut tcal, &self.timing, &decoded.packet, false).ok()?;
        Some((skip_pads(trace, at + decoded.size), time, tcal))
    }

    /// Writes the state back, as the general path would have left it (`insns`: the
    /// run's instruction count).
    fn store(&self, dec: &mut BlockDecoder<'_>, insns: u64) {
        dec.ip = self.ip;
        // Wrapping: a run adds at most MAX_STALLED_INSNS and a block to a count it took
        // at most MAX_ENTRY_ICNT, or to 0, so this is exact.
        #[expect(
            clippy::cast_possible_truncation,
            reason = "the difference is below 2^22, see above"
        )]
        let added = insns.wrapping_sub(self.icnt_mark) as u32;
        dec.icnt = self.icnt_on.then_some(self.icnt_base.wrapping_add(added));
        let seen = self.seen;
        dec.tsc = seen.tsc;
        dec.has_tsc = seen.has_tsc;
        dec.lost_mtc = seen.lost_mtc;
        dec.lost_cyc = seen.lost_cyc;
        let kind = if self.tip {
            EventKind::Tip { ip: self.bits }
        } else {
            EventKind::Tnt {
                bits: self.bits,
                size: self.left,
            }
        };
        let cur = self.cur_time;
        dec.event = Event {
            kind,
            ip_suppressed: false,
            status_update: false,
            has_tsc: cur.has_tsc,
            tsc: cur.tsc,
            lost_mtc: cur.lost_mtc,
            lost_cyc: cur.lost_cyc,
            // Never a place to resume at after an error (the general path's are).
            ip_exact_epoch: None,
        };
        dec.evdec.ip = self.last_ip;
        dec.evdec.time = self.time;
        dec.evdec.tcal = self.tcal;
        dec.evdec.pkt.seek(self.pos);
        dec.evdec.fetch_packet();
        dec.evdec.bound = self.tip;
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
    /// TIP.PGD/TIP.PGE pairs taken here (two flow events and a trace stop and start
    /// each).
    toggles: u64,
    /// Tracing is on as far as reported (`Branches::tracing`): only then does a
    /// disable report a trace stop (after an error it is off until the next start).
    tracing: bool,
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
        counts.events += 2 * self.toggles;
        counts.branches[BranchKind::TraceStop.index()] += self.toggles;
        counts.branches[BranchKind::TraceStart.index()] += self.toggles;
        branches.fast_blocks += self.blocks;
        branches.last_ip = self.last_ip;
        branches.last_ip_known |= self.blocks > 0;
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
    /// one (then no event and none of the decode's state changed; the fast table and
    /// the block cache may hold the block at the decoder's IP now).
    pub(super) fn run_fast(&mut self) -> bool {
        // (Not through `Option::then` and `flatten`: each moved the 268-byte state
        // once more, a memcpy call per run.)
        if self.fast.is_none() {
            return false;
        }
        let Some(mut fast) = Fast::enter(&self.dec) else {
            return false;
        };
        // A block the table cannot take (nor resolve: a far transfer, code that leaves
        // its piece) would stop a run at its first block and leave it to the general
        // path: left to it here, without a run's start and end (~500 instructions).
        if self.held.is_none() && !self.first_block_ready() {
            return false;
        }
        let full = self.queue.full_batch;
        let cap = if full { BATCH } else { FIRST_BATCH };
        if self.queue.buf.len() < cap {
            self.queue.buf.resize(cap, NO_EVENT);
        }
        let mut tally = Tally {
            blocks: 0,
            insns: 0,
            branches: [0; 3],
            last_ip: self.last_ip,
            stalled: self.stalled,
            queued: self.queue.len,
            toggles: 0,
            tracing: self.tracing,
        };
        let dec = &mut self.dec;
        let code = Code {
            trace: dec.evdec.pkt.trace(),
            image: dec.image,
            cache: &mut dec.cache,
        };
        let retstack = dec.retstack.view();
        let buf = &mut self.queue.buf;
        let stop = match self.fast.as_mut() {
            Some(table) => {
                let with = (
                    &mut fast,
                    &mut tally,
                    (table, &mut self.loops),
                    code,
                    retstack,
                    &mut self.walks,
                );
                if full {
                    run_in::<BATCH>(buf, with)
                } else {
                    run_in::<FIRST_BATCH>(buf, with)
                }
            }
            None => Stop::Pause,
        };
        let progressed = tally.blocks > 0;
        self.queue.full_batch |= tally.queued * 2 > cap;
        tally.store(self);
        match stop {
            Stop::HandOver { offset, block } => {
                // The block's instructions count for TRIG before the next event.
                fast.store(&mut self.dec, tally.insns + u64::from(block.ninsn));
                self.hand_over(&fast, offset, &block);
                true
            }
            Stop::Pause if progressed => {
                fast.store(&mut self.dec, tally.insns);
                true
            }
            Stop::Pause => false,
        }
    }

    /// Whether the fast table holds the block at the decoder's IP, resolving it (from
    /// the cache, or decoded on a first visit) into the table if not.
    fn first_block_ready(&mut self) -> bool {
        let (ip, mode) = (self.dec.ip, self.dec.mode);
        let Some(table) = self.fast.as_mut() else {
            return false;
        };
        let view = table.view(mode);
        view.at(view.slot_of(ip), ip).is_some()
            || table.resolve(self.image, &mut self.dec.cache, ip, mode)
    }

    /// Ends `block` on the general path after its trace event was used up.
    fn hand_over(&mut self, fast: &Fast, offset: usize, block: &FastBlock) {
        let block = general_block(block);
        let result = if fast.tip {
            self.dec
                .fetch_event()
                .and_then(|()| self.dec.proceed_trailing_event(Some(&block)))
        } else {
            // A used-up TNT is left behind by the trailing-event check itself.
            self.dec.proceed_trailing_event(Some(&block))
        };
        self.finish_block(offset, &block, result);
    }
}

/// What a fast run works with besides its batch.
type With<'r, 'a, 'c> = (
    &'r mut Fast,
    &'r mut Tally,
    (&'r mut FastBlocks, &'r mut LoopRuns),
    Code<'a, 'c>,
    RetView<'r>,
    &'r mut WalkBlocks,
);

/// [`run`] with the first `N` slots of the event buffer as its batch.
fn run_in<const N: usize>(
    buf: &mut [BranchEvent],
    (fast, tally, table, code, retstack, walks): With<'_, '_, '_>,
) -> Stop {
    match buf.get_mut(..N).and_then(|b| b.try_into().ok()) {
        Some(buf) => run::<N>(fast, tally, table, buf, code, retstack, walks),
        None => Stop::Pause,
    }
}

/// The fast loop: blocks to branch events in `buf` until the batch is full or the
/// general path is needed. What changes per block or per trace event is in locals
/// (registers, mostly); the clock and the rest of [`Fast`] are touched per event only.
#[inline(never)]
fn run<const N: usize>(
    fast: &mut Fast,
    tally: &mut Tally,
    (table, loops_held): (&mut FastBlocks, &mut LoopRuns),
    buf: &mut [BranchEvent; N],
    code: Code<'_, '_>,
    retstack: RetView<'_>,
    walks: &mut WalkBlocks,
) -> Stop {
    let Code {
        trace,
        image,
        cache,
    } = code;
    let mode = fast.mode;
    loops_held.use_mode(mode);
    let mut st = Locals {
        ip: fast.ip,
        ev: Current {
            bits: fast.bits,
            left: fast.left,
            tip: fast.tip,
            tip_size: fast.tip_size,
            pos: fast.pos,
        },
        queued: tally.queued,
        insns: tally.insns,
        blocks: tally.blocks,
        last_ip: tally.last_ip,
        // The stall count as `Branches::check_stall` keeps it for the current offset.
        mark: (tally.insns + tally.blocks).wrapping_sub(tally.stalled.1),
        fresh: tally.stalled.0 != fast.pos,
    };
    let mut resolved = None;
    let mut loops = Loops {
        trace,
        fast,
        tally,
        // Top and length in the loop's own frame (a view): through a `&mut RetStack`
        // they were written back after every push and pop; a copy of the whole stack
        // cost four 528-byte copies per fast run.
        retstack,
        buf,
        walks,
        image,
        held: loops_held,
    };
    let stop = loop {
        // No block count at one offset can reach the stall limit in this round: the
        // loop need not count per block.
        let unchecked = table.stall_free(
            st.stalled(),
            (PER_OFFSET, loops.held.max_ninsn()),
            MAX_STALLED_INSNS,
        );
        let view = table.view(mode);
        let ended = if unchecked {
            blocks::<false, N>(&mut st, &mut loops, view)
        } else {
            blocks::<true, N>(&mut st, &mut loops, view)
        };
        match ended {
            Step::Stop(stop) => break stop,
            // Resolve the block (then it is there on the next round); a block that does
            // not resolve (or, which cannot happen, is not found after) is the general
            // path's.
            Step::Miss if resolved == Some(st.ip) => break Stop::Pause,
            Step::Miss if table.resolve(image, cache, st.ip, mode) => resolved = Some(st.ip),
            Step::Miss => break Stop::Pause,
        }
    };
    let Loops {
        fast,
        tally,
        retstack,
        ..
    } = loops;
    retstack.store();
    fast.ip = st.ip;
    fast.bits = st.ev.bits;
    fast.left = st.ev.left;
    fast.tip = st.ev.tip;
    fast.tip_size = st.ev.tip_size;
    fast.pos = st.ev.pos;
    tally.queued = st.queued;
    tally.insns = st.insns;
    tally.blocks = st.blocks;
    tally.last_ip = st.last_ip;
    // (At a hand-over, as the count was before the block: the general path counts it.)
    tally.stalled = if st.fresh {
        // No offset matches: the next block starts the count.
        (usize::MAX, 0)
    } else {
        (st.ev.pos, st.stalled())
    };
    stop
}

/// What the fast loop changes per block or per event, in registers while it runs.
struct Locals {
    ip: u64,
    ev: Current,
    queued: usize,
    insns: u64,
    blocks: u64,
    last_ip: u64,
    /// `insns + blocks` where the stall count at the current offset was 0 (wrapping).
    mark: u64,
    /// No block at the current offset yet: the next one starts the stall count at 0
    /// (as `Branches::check_stall` does), whatever its size.
    fresh: bool,
}

impl Locals {
    /// The stall count at the current offset (0 before its first block).
    fn stalled(&self) -> u64 {
        if self.fresh {
            0
        } else {
            (self.insns + self.blocks).wrapping_sub(self.mark)
        }
    }

    /// Counts a block that went on at the same offset (`used`: and a new event at a
    /// new offset came after it).
    #[expect(
        clippy::inline_always,
        reason = "the fast loop's registers hold up only if this is inlined"
    )]
    #[inline(always)]
    fn count(&mut self, block: &FastBlock, new_offset: bool) {
        self.insns += u64::from(block.ninsn);
        self.blocks += 1;
        self.last_ip = block.end_ip;
        if new_offset {
            self.fresh = true;
        } else if self.fresh {
            self.fresh = false;
            self.mark = self.insns + self.blocks;
        }
    }
}

/// What the fast loop reads besides the trace position: the trace, the image and the
/// block cache (borrowed apart from the return stack, which the loop changes; a first
/// visit adds to the cache).
struct Code<'a, 'c> {
    trace: &'a [u8],
    image: &'a dyn ImageProvider,
    cache: &'c mut BlockCache,
}

/// What the fast loop works on besides its locals.
struct Loops<'r, 't, const N: usize> {
    trace: &'t [u8],
    fast: &'r mut Fast,
    tally: &'r mut Tally,
    retstack: RetView<'r>,
    buf: &'r mut [BranchEvent; N],
    walks: &'r mut WalkBlocks,
    image: &'t dyn ImageProvider,
    held: &'r mut LoopRuns,
}

/// The most blocks at one trace offset in one round of [`blocks`]: the bits of a TNT
/// and a TIP (at most 48), and a direct call or jump per batch slot (each has an event).
const PER_OFFSET: usize = 64 + BATCH;

/// Blocks to branch events until the batch is full, the block at the IP is not in the
/// table, or the general path is needed. With `CHECKED`, each block is checked against
/// the stall limit; without, the caller has made sure no count can reach it
/// ([`FastBlocks::stall_free`] over [`PER_OFFSET`] blocks).
#[expect(
    clippy::inline_always,
    reason = "two copies of the hot loop in `run`, its values in registers"
)]
#[inline(always)]
#[expect(
    clippy::too_many_lines,
    reason = "one loop whose values stay in registers; split up, they were spilled"
)]
fn blocks<const CHECKED: bool, const N: usize>(
    st: &mut Locals,
    lp: &mut Loops<'_, '_, N>,
    view: View<'_>,
) -> Step {
    let trace = lp.trace;
    // The slot of `st.ip`: from the previous block where it knew it (its successors'
    // slots), hashed only after a return or an indirect branch.
    let mut slot = view.slot_of(st.ip);
    loop {
        if st.queued >= N {
            return Step::Stop(Stop::Pause);
        }
        let Some(block) = view.at(slot, st.ip) else {
            return Step::Miss;
        };
        if CHECKED && st.stalled() + u64::from(block.ninsn) + 1 > MAX_STALLED_INSNS {
            return Step::Stop(Stop::Pause);
        }
        // Where the branch goes, its event, and whether it used up the trace event.
        // `left` is 0 for a TIP and at least 1 for a TNT; a branch that does not fit the
        // event is left to the general path, which reports the error. Conditional
        // branches first: they are most blocks.
        let (to, kind, keep, used) = if block.exit == Exit::Cond {
            let Some(left) = st.ev.left.checked_sub(1) else {
                return Step::Stop(Stop::Pause);
            };
            st.ev.left = left;
            let taken = st.ev.bits >> left & 1 == 1;
            if left > 0 {
                // The common case, in short: a bit that is not the TNT's last.
                // Without branches on the bit, which the CPU cannot predict where the
                // trace's outcomes are irregular: the event is written either way and
                // counted only for a taken jump.
                st.count(block, false);
                #[expect(clippy::needless_bitwise_bool, reason = "no branch on the outcome bit")]
                let jump = taken & (block.target != block.fall);
                (st.ip, slot) = if taken {
                    (block.target, usize::from(block.target_slot))
                } else {
                    (block.fall, usize::from(block.fall_slot))
                };
                lp.tally.branches[BranchKind::Jump.index()] += u64::from(jump);
                emit_if(
                    jump,
                    lp.buf,
                    &mut st.queued,
                    &lp.fast.seen,
                    st.ev.pos,
                    BranchKind::Jump,
                    block.end_ip,
                    block.target,
                );
                continue;
            }
            let to = if taken { block.target } else { block.fall };
            (to, BranchKind::Jump, to != block.fall, true)
        } else if block.exit.is_direct() {
            // No trace needed.
            let kind = if block.exit == Exit::DirectCall {
                if block.push_ret {
                    lp.retstack.push(block.fall);
                }
                BranchKind::Call
            } else {
                BranchKind::Jump
            };
            st.count(block, false);
            st.ip = block.target;
            slot = usize::from(block.target_slot);
            lp.tally.branches[kind.index()] += 1;
            emit_if(
                true,
                lp.buf,
                &mut st.queued,
                &lp.fast.seen,
                st.ev.pos,
                kind,
                block.end_ip,
                block.target,
            );
            continue;
        } else if block.exit == Exit::Return {
            if st.ev.left > 0 {
                let left = st.ev.left - 1;
                if st.ev.bits >> left & 1 == 0 {
                    return Step::Stop(Stop::Pause);
                }
                let Ok(to) = lp.retstack.pop() else {
                    return Step::Stop(Stop::Pause);
                };
                st.ev.left = left;
                (to, BranchKind::Return, true, left == 0)
            } else {
                (st.ev.bits, BranchKind::Return, true, true)
            }
        } else if st.ev.left > 0 {
            // An indirect call or jump needs a TIP.
            return Step::Stop(Stop::Pause);
        } else if block.exit == Exit::IndirectCall {
            lp.retstack.push(block.fall);
            (st.ev.bits, BranchKind::Call, true, true)
        } else {
            (st.ev.bits, BranchKind::Jump, true, true)
        };
        let offset = st.ev.pos;
        if used
            && !fetch(
                trace,
                lp.fast,
                &mut st.ev,
                st.insns + u64::from(block.ninsn),
            )
        {
            if !CHECKED && toggle(st, lp, view, block, (to, kind, keep)) {
                slot = view.slot_of(st.ip);
                continue;
            }
            // The general path fetches the next event, ends the block and counts it.
            st.ip = to;
            return Step::Stop(Stop::HandOver {
                offset,
                block: *block,
            });
        }
        st.ip = to;
        slot = view.slot_of(to);
        st.count(block, st.ev.pos != offset);
        // (Without a branch on `keep`: a TNT's last bit decides it.)
        lp.tally.branches[kind.index()] += u64::from(keep);
        emit_if(
            keep,
            lp.buf,
            &mut st.queued,
            &lp.fast.seen,
            st.ev.pos,
            kind,
            block.end_ip,
            to,
        );
        // A new TNT: where it repeats the last one (a loop), its blocks whole.
        if !CHECKED
            && used
            && let Some(key) = loop_runs::key(st.ev.bits, st.ev.left)
        {
            let held = lp.held.holds(st.ip, key)
                || (lp.held.seen == (st.ip, key)
                    && lp.held.hold(view, (st.ip, st.ev.bits, st.ev.left), key));
            if !held {
                lp.held.seen = (st.ip, key);
            } else if replay_loop(st, lp) {
                slot = view.slot_of(st.ip);
            }
        }
    }
}

/// Takes the held loop run ([`LoopRun`]) for as long as the trace repeats it (each run
/// that uses up its TNT starts the next one): whether it took any.
#[inline(never)]
fn replay_loop<const N: usize>(st: &mut Locals, lp: &mut Loops<'_, '_, N>) -> bool {
    let mut any = false;
    while let Some(key) = loop_runs::key(st.ev.bits, st.ev.left) {
        if !lp.held.holds(st.ip, key) {
            break;
        }
        let run = &lp.held.run;
        if !replay(st, (lp.trace, lp.fast, lp.buf, &mut lp.tally.branches), run) {
            break;
        }
        any = true;
        let full = run.full;
        lp.held.replayed += u64::from(run.blocks);
        if !full {
            break;
        }
    }
    any
}

/// Takes `run` (at the loop's IP, with its TNT outcomes) as the loop would take its
/// blocks one by one: the same events, counts, trace event and position after; false
/// (nothing changed) where the batch has no room for [`RUN_EVENTS`] more events, or the
/// run is full and the next event is not one the loop reads (then the loop takes the
/// blocks, as it would have). A full run's last block used the TNT's last outcome: the
/// next event is fetched here, as the loop fetches it. All [`RUN_EVENTS`] events are
/// written (without a branch on how many are kept, which the CPU cannot predict), and
/// the run's are counted.
#[expect(
    clippy::inline_always,
    reason = "one copy per call site, with the state in registers"
)]
#[inline(always)]
fn replay<const N: usize>(
    st: &mut Locals,
    (trace, fast, buf, branches): (&[u8], &mut Fast, &mut [BranchEvent; N], &mut [u64; 3]),
    run: &LoopRun,
) -> bool {
    let Some(slots) = buf
        .get_mut(st.queued..st.queued + RUN_EVENTS)
        .and_then(|s| <&mut [BranchEvent; RUN_EVENTS]>::try_from(s).ok())
    else {
        return false;
    };
    // The time and place of the blocks' events (the fetch moves both on).
    let (offset, seen) = (st.ev.pos, fast.seen);
    let insns = st.insns + u64::from(run.insns);
    if run.full && !fetch(trace, fast, &mut st.ev, insns) {
        return false;
    }
    for (slot, &(from, to)) in slots.iter_mut().zip(&run.events) {
        *slot = BranchEvent {
            kind: BranchKind::Jump,
            from,
            to,
            tsc: seen.tsc,
            has_tsc: seen.has_tsc,
            offset,
            error: None,
        };
    }
    let jumps = usize::from(run.jumps);
    if run.full {
        // The last block's jump is reported as the loop reports the branch that used
        // up its event: with the next event's place and the time seen by then.
        if run.last_jump
            && let Some(last) = slots.get_mut(jumps.wrapping_sub(1))
        {
            last.offset = st.ev.pos;
            last.tsc = fast.seen.tsc;
            last.has_tsc = fast.seen.has_tsc;
        }
    } else {
        st.ev.left -= run.used;
    }
    // As `Locals::count` for each block: the first at this offset sets the mark; a last
    // block whose event was followed at a new offset starts the count over (a TIP right
    // after the TNT is at the TNT's offset: the count goes on).
    if st.fresh {
        st.fresh = false;
        st.mark = st.insns + u64::from(run.first_ninsn) + st.blocks + 1;
    }
    if run.full && st.ev.pos != offset {
        st.fresh = true;
    }
    st.queued += jumps;
    branches[BranchKind::Jump.index()] += u64::from(run.jumps);
    st.insns = insns;
    st.blocks += u64::from(run.blocks);
    st.last_ip = run.last_ip;
    st.ip = run.to;
    true
}

/// Blocks [`toggle`] walks at most, and instructions per block it decodes at most.
const TOGGLE_WALK: usize = 8;
const TOGGLE_BLOCK: u16 = 256;

/// A walk [`toggle`] took: from `to` to the branch a disable at `off` binds to, in
/// `mode` (its key), `walked` blocks of `walk`. The walk is a pure function of the key
/// and the image (as [`WalkBlocks`]' blocks are), so a toggle with the same key takes it
/// without walking. Kept in a direct-mapped table of [`WALK_SLOTS`]: 61 % of a real
/// KVM-PT trace's toggles (mruby) repeat the one before, 94 % one of the 64 kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeptWalk {
    key: (u64, u64, ExecMode),
    walked: usize,
    walk: [Option<FastBlock>; TOGGLE_WALK],
}

/// Walks kept, direct-mapped by key (~420 bytes each: 7 pages, made at the first toggle).
const WALK_SLOTS: usize = 64;

/// The slot of the walk for `key` among [`WALK_SLOTS`] (the hash's top six bits).
pub(super) fn walk_slot((to, off, _): (u64, u64, ExecMode)) -> usize {
    let hash = (to ^ off.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    usize::try_from(hash >> 58).unwrap_or(0)
}

impl WalkBlocks {
    /// How many blocks the walk kept in `slot` has, if it is the walk for `key`.
    fn kept(&self, slot: usize, key: (u64, u64, ExecMode)) -> Option<usize> {
        match self.walks.get(slot) {
            Some(Some(kept)) if kept.key == key => Some(kept.walked),
            _ => None,
        }
    }

    /// Keeps `walk` in `slot` (the table is made at the first walk kept).
    fn keep(&mut self, slot: usize, walk: &KeptWalk) {
        if self.walks.is_empty() {
            self.walks = vec![None; WALK_SLOTS];
        }
        if let Some(entry) = self.walks.get_mut(slot) {
            *entry = Some(*walk);
        }
    }

    /// Block `i` of the walk kept in `slot`.
    fn step(&self, slot: usize, i: usize) -> Option<FastBlock> {
        self.walks
            .get(slot)?
            .as_ref()?
            .walk
            .get(i)
            .copied()
            .flatten()
    }
}

/// A TIP.PGD/TIP.PGE pair [`toggle`] can take: where the PGE is and its size, the IPs
/// tracing stopped for and resumed at, and the last IP after both.
struct Toggle {
    at_pge: usize,
    pge_size: usize,
    off: u64,
    on: u64,
    last_ip: LastIp,
}

impl Toggle {
    /// The pair at `at`, if it is one: both with an IP, PADs at most between them, and a
    /// TNT or a TIP with an IP right after (the fast loop reads on from there).
    fn at(trace: &[u8], at: usize, fast: &Fast) -> Option<Self> {
        let (leave_ip, leave_size) = ip_packet(trace, at, TIP_PGD)?;
        // KVM-PT pads between the two (mruby: nine PADs a pair): a word at a time.
        let at_pge = skip_pad_runs(trace, at + leave_size);
        let (back_ip, pge_size) = ip_packet(trace, at_pge, TIP_PGE)?;
        if leave_ip.compression == IpCompression::Suppressed
            || back_ip.compression == IpCompression::Suppressed
        {
            return None;
        }
        let mut last_ip = fast.last_ip;
        last_ip.update(leave_ip);
        let off = last_ip.ip().ok()?;
        last_ip.update(back_ip);
        let on = last_ip.ip().ok()?;
        match hot_packet(trace, skip_pads(trace, at_pge + pge_size)) {
            Hot::Tnt { .. } => {}
            Hot::Tip { payload, .. } if payload.compression != IpCompression::Suppressed => {}
            Hot::Tip { .. } | Hot::Other => return None,
        }
        Some(Self {
            at_pge,
            pge_size,
            off,
            on,
            last_ip,
        })
    }
}

/// The blocks from `to` to the branch a disable at `off` binds to (the first that needs
/// trace, or a direct one to `off`), that branch's block last, into `walk`: how many;
/// `None` where the
/// general path would do otherwise (`off` inside a block, or reached at a block's start)
/// or the walk is long or leaves known code.
fn toggle_walk(
    view: View<'_>,
    walks: &mut WalkBlocks,
    image: &dyn ImageProvider,
    (to, off, mode): (u64, u64, ExecMode),
    walk: &mut [Option<FastBlock>; TOGGLE_WALK],
) -> Option<usize> {
    let mut ip = to;
    for (n, step) in walk.iter_mut().enumerate() {
        if ip == off {
            return None;
        }
        let next = if let Some(next) = view.at(view.slot_of(ip), ip) {
            *next
        } else {
            (*walks.blocks.entry((ip, mode)).or_insert_with(|| {
                fast_blocks::resolve_decoded(image, ip, mode, TOGGLE_BLOCK, None)
            }))?
        };
        if (next.ip..=next.end_ip).contains(&off) {
            return None;
        }
        *step = Some(next);
        if !next.exit.is_direct() || next.target == off {
            return Some(n + 1);
        }
        ip = next.target;
    }
    None
}

/// After `block` used up its trace event with `(to, kind, keep)` its branch: takes a
/// TIP.PGD with an IP followed by a TIP.PGE with an IP (code leaving the traced range
/// and coming back: a call through a PLT to a library outside a filter) as the general
/// path does, and goes on at the PGE's IP with the TNT or TIP after it as the current
/// event. False, with nothing changed, for anything else (then the general path takes
/// the block).
///
/// The general path's rules, followed here: the disable binds to the first branch after
/// `to` that needs trace, or to a direct branch whose target is the PGD's IP; the blocks
/// up to it are walked (their direct calls and jumps reported), the binding branch's own
/// event is dropped (a call still pushes its return address), then a trace stop from
/// its address and a trace start at the PGE's IP. Only where every event has the same
/// time (the clock settled, no other packet between) and the walk is short.
#[inline(never)]
fn toggle<const N: usize>(
    st: &mut Locals,
    lp: &mut Loops<'_, '_, N>,
    view: View<'_>,
    block: &FastBlock,
    (to, kind, keep): (u64, BranchKind, bool),
) -> bool {
    let trace = lp.trace;
    let fast = &*lp.fast;
    // Every event here carries the same time: none moved the clock since the last.
    if !lp.tally.tracing || fast.seen != fast.cur_time || fast.cur_time != fast.now {
        return false;
    }
    let at = next_packet(trace, st.ev.tip, st.ev.pos, st.ev.tip_size);
    let Some(Toggle {
        at_pge,
        pge_size,
        off,
        on,
        last_ip,
    }) = Toggle::at(trace, at, fast)
    else {
        return false;
    };
    let key = (to, off, fast.mode);
    let slot = walk_slot(key);
    let walked = if let Some(walked) = lp.walks.kept(slot, key) {
        walked
    } else {
        // Filled in place: returned, the array was a 400-byte copy per toggle.
        let mut walk = [None; TOGGLE_WALK];
        let Some(walked) = toggle_walk(view, lp.walks, lp.image, key, &mut walk) else {
            return false;
        };
        lp.walks.keep(slot, &KeptWalk { key, walked, walk });
        walked
    };
    if st.queued + walked + 3 > N {
        return false;
    }
    // Taken: the block that used the event, then the walk.
    st.ip = to;
    st.count(block, true);
    lp.tally.branches[kind.index()] += u64::from(keep);
    emit_one(st, lp, (keep, at_pge), kind, (block.end_ip, to));
    for i in 0..walked {
        let Some(next) = lp.walks.step(slot, i) else {
            break;
        };
        let next = &next;
        st.count(next, false);
        let call = next.exit == Exit::DirectCall;
        if (call && next.push_ret) || next.exit == Exit::IndirectCall {
            lp.retstack.push(next.fall);
        }
        if i + 1 == walked {
            break;
        }
        let kind = if call {
            BranchKind::Call
        } else {
            BranchKind::Jump
        };
        lp.tally.branches[kind.index()] += 1;
        // Where the general path has read to when it reports it: the PGE.
        emit_one(st, lp, (true, at_pge), kind, (next.end_ip, next.target));
    }
    emit_one(
        st,
        lp,
        (true, at_pge),
        BranchKind::TraceStop,
        (st.last_ip, 0),
    );
    // The PGE as the current event: a TIP the next fetch moves past.
    lp.fast.last_ip = last_ip;
    st.ev = Current {
        bits: on,
        left: 0,
        tip: true,
        tip_size: pge_size,
        pos: at_pge,
    };
    let fetched = fetch(trace, lp.fast, &mut st.ev, st.insns);
    debug_assert!(fetched, "the event after a TIP.PGE was checked");
    emit_one(st, lp, (true, st.ev.pos), BranchKind::TraceStart, (0, on));
    lp.tally.toggles += 1;
    st.ip = on;
    st.fresh = true;
    true
}

/// An event of [`toggle`] at trace offset `pos`, kept if `keep`.
fn emit_one<const N: usize>(
    st: &mut Locals,
    lp: &mut Loops<'_, '_, N>,
    (keep, pos): (bool, usize),
    kind: BranchKind,
    (from, to): (u64, u64),
) {
    emit_if(
        keep,
        lp.buf,
        &mut st.queued,
        &lp.fast.seen,
        pos,
        kind,
        from,
        to,
    );
}

/// Where the packet after the current event starts: a TNT's `pos` is already past it
/// (and its PADs); a TIP's `pos` is the TIP itself, `tip_size` long.
#[expect(
    clippy::inline_always,
    reason = "on the fast loop's path from one trace event to the next"
)]
#[inline(always)]
fn next_packet(trace: &[u8], tip: bool, pos: usize, tip_size: usize) -> usize {
    if tip {
        skip_pads(trace, pos + tip_size)
    } else {
        pos
    }
}

/// How the inner loop of [`run`] ended.
enum Step {
    Stop(Stop),
    /// The block at the IP is not in the table.
    Miss,
}

/// The trace event the fast loop is on (see [`Fast`]).
#[derive(Debug, Clone, Copy)]
struct Current {
    bits: u64,
    left: u8,
    tip: bool,
    tip_size: usize,
    pos: usize,
}

/// Moves `ev` on to the next event if it is a TNT or a TIP with an IP (after timing
/// packets, through [`Fast::next_event`]); false (and `ev` unchanged) otherwise. The
/// common packets are read here, inline.
#[expect(
    clippy::inline_always,
    reason = "the fast loop's registers hold up only if this is inlined"
)]
#[inline(always)]
fn fetch(trace: &[u8], fast: &mut Fast, ev: &mut Current, insns: u64) -> bool {
    let at = next_packet(trace, ev.tip, ev.pos, ev.tip_size);
    match hot_packet(trace, at) {
        Hot::Tnt { bits, count, size } => {
            *ev = Current {
                bits,
                left: count,
                tip: false,
                tip_size: ev.tip_size,
                pos: skip_pads(trace, at + size),
            };
        }
        Hot::Tip { payload, size } if payload.compression != IpCompression::Suppressed => {
            let mut last_ip = fast.last_ip;
            last_ip.update(payload);
            let Ok(ip) = last_ip.ip() else {
                return false;
            };
            fast.last_ip = last_ip;
            *ev = Current {
                bits: ip,
                left: 0,
                tip: true,
                tip_size: size,
                pos: at,
            };
        }
        Hot::Tip { .. } => return false,
        // A TIP.PGD (tracing stops: for `toggle` or the general path) is no timing
        // packet: `Fast::next_event` would decode it whole to say so.
        Hot::Other if trace.get(at).is_some_and(|&opc| opc & 0x1f == TIP_PGD) => return false,
        Hot::Other => {
            fast.bits = ev.bits;
            fast.left = ev.left;
            fast.tip = ev.tip;
            fast.tip_size = ev.tip_size;
            fast.pos = ev.pos;
            if !fast.next_event(trace, insns) {
                return false;
            }
            *ev = Current {
                bits: fast.bits,
                left: fast.left,
                tip: fast.tip,
                tip_size: fast.tip_size,
                pos: fast.pos,
            };
            return true;
        }
    }
    fast.took_event(insns);
    true
}

/// Writes a branch event at time `seen` and trace offset `pos` to the next free slot of
/// the batch, and keeps it only if `keep` (written either way, so that a caller needs no
/// branch on it).
#[expect(
    clippy::inline_always,
    reason = "the fast loop's registers hold up only if this is inlined"
)]
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "the event's fields, from the fast loop's registers"
)]
fn emit_if<const N: usize>(
    keep: bool,
    buf: &mut [BranchEvent; N],
    queued: &mut usize,
    seen: &Stamp,
    pos: usize,
    kind: BranchKind,
    from: u64,
    to: u64,
) {
    if let Some(slot) = buf.get_mut(*queued) {
        *slot = BranchEvent {
            kind,
            from,
            to,
            tsc: seen.tsc,
            has_tsc: seen.has_tsc,
            offset: pos,
            error: None,
        };
        *queued += usize::from(keep);
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
