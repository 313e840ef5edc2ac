//! Branch events: what the stack reconstruction consumes from an Intel PT trace.
//!
//! In: a trace, an [`ImageProvider`] with the traced code, and a [`FlowConfig`]. Out:
//! [`Branches`], an iterator of [`BranchEvent`]s in execution order: calls, returns,
//! taken jumps, far transfers (SYSCALL, SYSRET/IRET, far call/return/jump), interrupts
//! and other asynchronous branches, tracing starting and stopping, overflows (a gap in
//! the trace) and decode errors (with the trace offset; decoding goes on at the next
//! place an event or PSB gives an address). Each event carries the time of the last
//! timing update. [`decode_counts`] runs the whole trace and only counts, for `--stats`
//! and benchmarks; [`BlockInsns`] lists the instructions of a block.
//!
//! Between other events, most of a trace is TNT and TIP packets over code already
//! seen: there the fast path (`branches_fast.rs`) takes whole blocks from a table, one
//! lookup each, and reads those packets itself; everything else goes block by block
//! through the flow layer. Both give the same events (`branches_fast_tests.rs` holds
//! them to it).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::block::{Block, BlockDecoder, FlowConfig, Status};
use super::cache::IpHasher;
use super::fast_blocks::{FastBlock, FastBlocks};
use super::image::{Image, ImageProvider};
use super::insn::{self, Insn, InsnClass, InsnKind};
use super::loop_runs::LoopRuns;
use crate::decode::pt::events::evdec_ovf::QuietPsb;
use crate::decode::pt::events::event::{Event, EventKind, FlowError};
use crate::decode::pt::packets::packet::ExecMode;

/// What kind of control transfer a [`BranchEvent`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BranchKind {
    /// Near call (direct or indirect).
    Call,
    /// Near return.
    Return,
    /// Taken near jump: unconditional, conditional, or indirect.
    Jump,
    /// SYSCALL or SYSENTER.
    Syscall,
    /// Far call, software interrupt (INT n), VMCALL.
    FarCall,
    /// Far return, IRET, SYSRET/SYSEXIT, VM entry.
    FarReturn,
    FarJump,
    /// An interrupt, exception or other asynchronous branch.
    Interrupt,
    /// Tracing started (or resumed) at `to`.
    TraceStart,
    /// Tracing stopped after `from`.
    TraceStop,
    /// Trace was lost (an internal buffer overflow); tracing goes on at `to`, if known.
    TraceGap,
    /// The decoder could not follow the trace at `offset` (see `error`).
    Error,
}

impl BranchKind {
    pub const ALL: [Self; 12] = [
        Self::Call,
        Self::Return,
        Self::Jump,
        Self::Syscall,
        Self::FarCall,
        Self::FarReturn,
        Self::FarJump,
        Self::Interrupt,
        Self::TraceStart,
        Self::TraceStop,
        Self::TraceGap,
        Self::Error,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Call => "call",
            Self::Return => "return",
            Self::Jump => "jump",
            Self::Syscall => "syscall",
            Self::FarCall => "far call",
            Self::FarReturn => "far return",
            Self::FarJump => "far jump",
            Self::Interrupt => "interrupt",
            Self::TraceStart => "trace start",
            Self::TraceStop => "trace stop",
            Self::TraceGap => "trace gap",
            Self::Error => "error",
        }
    }

    /// The position in [`Self::ALL`] (the declaration order).
    fn index(self) -> usize {
        self as usize
    }
}

/// One control transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchEvent {
    pub kind: BranchKind,
    /// The branch instruction (0 when not known, e.g. for a trace start).
    pub from: u64,
    /// The target (0 when not known, e.g. for a trace stop).
    pub to: u64,
    /// The estimated TSC of the last timing update before the branch.
    pub tsc: u64,
    /// `tsc` is wall-clock TSC (the trace had a TSC packet by then).
    pub has_tsc: bool,
    /// The trace offset the decoder was at.
    pub offset: usize,
    /// For [`BranchKind::Error`]: what went wrong.
    pub error: Option<FlowError>,
}

/// How many of each thing a decode saw.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecodeCounts {
    pub instructions: u64,
    pub blocks: u64,
    /// Events of the flow layer (enabled, disabled, overflow, mode changes ...).
    pub events: u64,
    /// Branch events by kind, in [`BranchKind::ALL`] order.
    pub branches: [u64; 12],
    /// Where decoding failed, and why.
    pub errors: Vec<(usize, FlowError)>,
}

impl DecodeCounts {
    pub fn branches_of(&self, kind: BranchKind) -> u64 {
        self.branches[kind.index()]
    }
}

/// Blocks by (address, mode) for the fast path's walks to a disable, and the walks
/// themselves whole (`branches_fast.rs`, `toggle`): a loop that calls out of the traced
/// range disables at the same branch from the same place every time round.
#[derive(Debug, Default)]
pub(crate) struct WalkBlocks {
    pub(crate) blocks: HashMap<(u64, ExecMode), Option<FastBlock>, BuildHasherDefault<IpHasher>>,
    /// Walks taken, direct-mapped by their key (`fast::walk_slot`), made at the first.
    pub(crate) walks: Vec<Option<fast::KeptWalk>>,
}

/// Instructions decoded without trace progress after which the decoder gives up on a
/// segment (only corrupt traces get there: code that loops without producing trace).
pub const MAX_STALLED_INSNS: u64 = 1 << 20;

/// Branch events decoded and not handed out yet: `buf[head..len]`. The buffer keeps its
/// length, so that the fast path writes into slots instead of pushing.
#[derive(Debug, Clone, Default)]
struct Queue {
    buf: Vec<BranchEvent>,
    head: usize,
    len: usize,
    /// The fast path's batch is the full one (`branches_fast.rs`): it starts short.
    full_batch: bool,
}

impl Queue {
    fn push(&mut self, event: BranchEvent) {
        match self.buf.get_mut(self.len) {
            Some(slot) => *slot = event,
            None => self.buf.push(event),
        }
        self.len += 1;
    }

    fn last_mut(&mut self) -> Option<&mut BranchEvent> {
        self.len.checked_sub(1).and_then(|i| self.buf.get_mut(i))
    }

    #[inline]
    fn pop(&mut self) -> Option<BranchEvent> {
        if self.head >= self.len {
            return None;
        }
        let event = self.buf.get(self.head).copied();
        self.head += 1;
        event
    }

    fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Sync,
    Running(Status),
    Done,
}

/// Decodes a trace into branch events.
pub struct Branches<'a> {
    dec: BlockDecoder<'a>,
    image: &'a dyn ImageProvider,
    state: State,
    queue: Queue,
    counts: DecodeCounts,
    last_sync: Option<usize>,
    last_error: Option<usize>,
    stalled: (usize, u64),
    /// Tracing is on as far as reported (a trace start was reported, no stop since).
    tracing: bool,
    /// The last instruction of the last block.
    last_ip: u64,
    /// A block's branch held back until the event after it shows whether it left the
    /// traced code (then a trace stop reports it).
    held: Option<(BranchKind, u64, u64)>,
    /// Blocks for the fast path (`branches_fast.rs`); `None` when it is off.
    fast: Option<FastBlocks>,
    /// The loop run the fast path replays (`loop_runs.rs`).
    loops: LoopRuns,
    /// Blocks the fast path decoded.
    fast_blocks: u64,
    /// Blocks on the way from a traced branch to the branch a TIP.PGD binds to, decoded
    /// once (`None`: not one the fast path takes); `branches_fast.rs`, `toggle`.
    walks: WalkBlocks,
    /// The PSB of the last PSB+ status event handled: a parallel decode's checkpoints
    /// come after the PSB+ of the PSB they are for (`branches_parallel.rs`).
    status_psb: Option<usize>,
    /// The last quiet PSB+ read (`branches_idle.rs`), kept here to be filled in place.
    quiet: QuietPsb,
    /// PSB+ headers the quiet path took whole.
    quiet_psbs: u64,
    /// `last_ip` is the last block's: false for a parallel worker before its first block.
    last_ip_known: bool,
    /// A trace stop took `last_ip` while it was not known (a parallel worker's events
    /// then differ from a sequential decode's).
    tainted: bool,
}

impl<'a> Branches<'a> {
    /// Blocks end at every near call and jump here (whatever `config` says), so that
    /// direct calls and jumps, which need no trace, are reported too.
    pub fn new(trace: &'a [u8], image: &'a dyn ImageProvider, config: FlowConfig) -> Self {
        let config = FlowConfig {
            end_on_call: true,
            end_on_jump: true,
            resync_exact_only: true,
            ..config
        };
        Self {
            dec: BlockDecoder::new(trace, image, config),
            image,
            state: State::Sync,
            queue: Queue::default(),
            counts: DecodeCounts::default(),
            last_sync: None,
            last_error: None,
            stalled: (usize::MAX, 0),
            tracing: false,
            last_ip: 0,
            held: None,
            fast: Some(FastBlocks::for_trace(trace.len())),
            loops: LoopRuns::default(),
            fast_blocks: 0,
            walks: WalkBlocks::default(),
            status_psb: None,
            quiet: QuietPsb::default(),
            quiet_psbs: 0,
            last_ip_known: true,
            tainted: false,
        }
    }

    /// Decodes without the fast path (to check it against the general one).
    #[cfg(test)]
    pub(crate) fn general_only(mut self) -> Self {
        self.fast = None;
        self
    }

    /// How many of the blocks so far took the fast path (the rest: the general one).
    pub fn fast_blocks(&self) -> u64 {
        self.fast_blocks
    }

    /// How many of the fast path's blocks were taken in loop runs (`loop_runs.rs`).
    pub fn loop_blocks(&self) -> u64 {
        self.loops.replayed
    }

    /// How many PSB+ headers were taken whole while tracing was off (the rest of the
    /// events went one at a time).
    pub fn quiet_psbs(&self) -> u64 {
        self.quiet_psbs
    }

    /// What was seen so far.
    pub fn counts(&self) -> &DecodeCounts {
        &self.counts
    }

    fn push(&mut self, kind: BranchKind, from: u64, to: u64) {
        let (tsc, has_tsc, _, _) = self.dec.time();
        self.counts.branches[kind.index()] += 1;
        self.queue.push(BranchEvent {
            kind,
            from,
            to,
            tsc,
            has_tsc,
            offset: self.dec.offset(),
            error: None,
        });
    }

    fn error(&mut self, err: FlowError) {
        self.tracing = false;
        // A branch held for the event after it: the event failed, so its target is not
        // known to be right; reported after the resync, it was a call to nowhere.
        self.held = None;
        let offset = self.dec.offset();
        self.counts.errors.push((offset, err));
        self.push(BranchKind::Error, 0, 0);
        if let Some(last) = self.queue.last_mut() {
            last.error = Some(err);
        }
        // Go on where an event gives an IP, unless that makes no progress.
        if self.last_error.is_some_and(|last| offset <= last) {
            self.state = State::Sync;
            return;
        }
        self.last_error = Some(offset);
        self.state = loop {
            match self.dec.resync() {
                Ok(status) => break State::Running(status),
                Err(FlowError::EventIgnored) => {
                    if self.dec.next_event().is_err() {
                        break State::Sync;
                    }
                }
                Err(_) => break State::Sync,
            }
        };
    }

    fn sync(&mut self) {
        self.tracing = false;
        self.held = None;
        match self.dec.sync_forward() {
            Ok(status) => self.state = State::Running(status),
            Err(FlowError::Eos) => self.state = State::Done,
            Err(err) => {
                let offset = self.dec.offset();
                self.counts.errors.push((offset, err));
                self.push(BranchKind::Error, 0, 0);
                if self.last_sync.is_some_and(|last| offset <= last) {
                    self.state = State::Done;
                }
                self.last_sync = Some(offset);
            }
        }
    }

    fn step(&mut self, status: Status) {
        if status.event_pending {
            match self.dec.next_event() {
                Ok((event, status)) => {
                    self.took_event(&event);
                    self.state = State::Running(status);
                }
                Err(FlowError::Eos) => self.state = State::Done,
                Err(err) => self.error(err),
            }
            return;
        }
        if status.eos {
            self.state = State::Done;
            return;
        }
        let offset = self.dec.offset();
        let (block, result) = self.dec.next_block();
        self.finish_block(offset, &block, result);
    }

    /// Counts an event the decoder applied and reports what it means for the branches.
    fn took_event(&mut self, event: &Event) {
        self.counts.events += 1;
        if event.status_update {
            // The return stack starts empty at each PSB, as Linux perf's decoder has
            // it: the processor compresses no return whose call came before a PSB. So a
            // decode started at a PSB is in the state a decode from the start is in
            // there (parallel decode).
            self.dec.retstack.clear();
            self.status_psb = Some(self.dec.sync_offset());
        }
        if let Some((kind, from, to)) = self.held.take()
            && !matches!(
                event.kind,
                EventKind::Disabled { .. } | EventKind::AsyncDisabled { .. }
            )
        {
            self.push(kind, from, to);
        }
        self.on_event(event);
    }

    /// Counts a block that started at trace offset `offset`, reports its branch and
    /// goes on with what followed it.
    fn finish_block(&mut self, offset: usize, block: &Block, result: Result<Status, FlowError>) {
        self.counts.blocks += 1;
        self.counts.instructions += u64::from(block.ninsn);
        self.held = None;
        if let Some((kind, from, to)) = self.block_branch(block, result.is_ok()) {
            if matches!(result, Ok(status) if status.event_pending) {
                self.held = Some((kind, from, to));
            } else {
                self.push(kind, from, to);
            }
        }
        match result {
            Ok(status) => {
                self.state = State::Running(status);
                self.check_stall(offset, block, status);
            }
            Err(FlowError::Eos) => self.state = State::Done,
            Err(err) => self.error(err),
        }
    }

    fn check_stall(&mut self, offset: usize, block: &Block, status: Status) {
        if offset != self.stalled.0 || status.event_pending {
            self.stalled = (offset, 0);
            return;
        }
        self.stalled.1 += u64::from(block.ninsn) + 1;
        if self.stalled.1 > MAX_STALLED_INSNS {
            self.stalled = (usize::MAX, 0);
            self.counts.errors.push((offset, FlowError::NoSync));
            self.push(BranchKind::Error, 0, 0);
            self.state = State::Sync;
        }
    }

    fn on_event(&mut self, event: &Event) {
        let ip = event.ip().unwrap_or(0);
        match event.kind {
            EventKind::Enabled { .. } if !self.tracing => {
                self.tracing = true;
                self.push(BranchKind::TraceStart, 0, ip);
            }
            EventKind::Disabled { .. } if self.tracing => {
                self.tracing = false;
                self.tainted |= !self.last_ip_known;
                self.push(BranchKind::TraceStop, self.last_ip, 0);
            }
            EventKind::AsyncDisabled { at, .. } => {
                self.tracing = false;
                self.push(BranchKind::TraceStop, at, 0);
            }
            EventKind::AsyncBranch { from, to } => self.push(BranchKind::Interrupt, from, to),
            EventKind::Overflow { .. } => {
                self.tracing = !event.ip_suppressed;
                self.push(BranchKind::TraceGap, 0, ip);
            }
            _ => {}
        }
    }

    /// The branch that ended `block`, if it ended with one that was taken.
    fn block_branch(&mut self, block: &Block, complete: bool) -> Option<(BranchKind, u64, u64)> {
        if block.ninsn == 0 {
            return None;
        }
        self.last_ip = block.end_ip;
        self.last_ip_known = true;
        if !complete || !self.dec.enabled {
            return None;
        }
        let to = self.dec.ip;
        let kind = match block.class {
            InsnClass::Call => BranchKind::Call,
            InsnClass::Return => BranchKind::Return,
            InsnClass::Jump => BranchKind::Jump,
            // The block knows its last instruction's size: no need to decode it again.
            InsnClass::CondJump if block.size != 0 && !block.truncated => {
                if to == block.end_ip.wrapping_add(u64::from(block.size)) {
                    return None;
                }
                BranchKind::Jump
            }
            InsnClass::FarCall
            | InsnClass::FarReturn
            | InsnClass::FarJump
            | InsnClass::Indirect
            | InsnClass::Unknown
            | InsnClass::CondJump => {
                let insn = self.last_insn(block)?;
                match far_kind(&insn) {
                    Some(kind) => kind,
                    None if insn.class == InsnClass::CondJump && to != insn.end() => {
                        BranchKind::Jump
                    }
                    None if matches!(insn.class, InsnClass::Jump) => BranchKind::Jump,
                    None if insn.class == InsnClass::Call => BranchKind::Call,
                    None if insn.class == InsnClass::Return => BranchKind::Return,
                    None => return None,
                }
            }
            InsnClass::Other | InsnClass::PtWrite => return None,
        };
        Some((kind, block.end_ip, to))
    }

    fn last_insn(&self, block: &Block) -> Option<Insn> {
        if block.truncated {
            let mut one = Image::new();
            one.add(
                "",
                block.raw[..usize::from(block.size)].to_vec(),
                block.end_ip,
            );
            return insn::decode(&one, block.end_ip, block.mode).ok();
        }
        insn::decode(self.image, block.end_ip, block.mode).ok()
    }
}

fn far_kind(insn: &Insn) -> Option<BranchKind> {
    Some(match insn.class {
        InsnClass::FarCall if matches!(insn.kind, InsnKind::Syscall | InsnKind::Sysenter) => {
            BranchKind::Syscall
        }
        InsnClass::FarCall => BranchKind::FarCall,
        InsnClass::FarReturn => BranchKind::FarReturn,
        InsnClass::FarJump => BranchKind::FarJump,
        _ => return None,
    })
}

impl Iterator for Branches<'_> {
    type Item = BranchEvent;

    #[inline]
    fn next(&mut self) -> Option<BranchEvent> {
        match self.queue.pop() {
            Some(event) => Some(event),
            None => self.refill(),
        }
    }
}

impl Branches<'_> {
    /// The next branch events, a batch at a time (empty at the end of the trace): the
    /// same events as the iterator gives, without a call per event.
    pub fn next_batch(&mut self) -> &[BranchEvent] {
        if !self.fill() {
            return &[];
        }
        let (head, len) = (self.queue.head, self.queue.len);
        self.queue.head = len;
        self.queue.buf.get(head..len).unwrap_or_default()
    }

    /// Decodes on until there are branch events to hand out (or the trace ends).
    #[inline(never)]
    fn refill(&mut self) -> Option<BranchEvent> {
        if self.fill() { self.queue.pop() } else { None }
    }

    /// Decodes on until there are branch events queued; false at the end of the trace.
    fn fill(&mut self) -> bool {
        loop {
            if self.queue.head < self.queue.len {
                return true;
            }
            self.queue.clear();
            if !self.advance() {
                return false;
            }
        }
    }

    /// One step of decoding (a sync, a fast run or a block or event); false when the
    /// decode is done. The queue is empty before.
    fn advance(&mut self) -> bool {
        match self.state {
            State::Done => return false,
            State::Sync => self.sync(),
            State::Running(status) => {
                if status.event_pending && self.run_idle() {
                    return true;
                }
                if status.event_pending || status.eos || !self.run_fast() {
                    self.step(status);
                }
            }
        }
        true
    }
}

/// Decodes the whole trace to branch events and returns only the counts.
pub fn decode_counts(trace: &[u8], image: &dyn ImageProvider, config: FlowConfig) -> DecodeCounts {
    let mut branches = Branches::new(trace, image, config);
    while !branches.next_batch().is_empty() {}
    branches.counts
}

/// The instructions of a block, decoded again from the image.
pub struct BlockInsns<'a> {
    image: &'a dyn ImageProvider,
    block: Block,
    ip: u64,
    left: u16,
}

impl<'a> BlockInsns<'a> {
    pub fn new(block: &Block, image: &'a dyn ImageProvider) -> Self {
        Self {
            image,
            block: *block,
            ip: block.ip,
            left: block.ninsn,
        }
    }
}

impl Iterator for BlockInsns<'_> {
    type Item = Result<Insn, FlowError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let decoded = if self.ip == self.block.end_ip && self.block.truncated {
            let mut one = Image::new();
            one.add(
                "",
                self.block.raw[..usize::from(self.block.size)].to_vec(),
                self.ip,
            );
            insn::decode(&one, self.ip, self.block.mode)
        } else {
            insn::decode(self.image, self.ip, self.block.mode)
        };
        let insn = match decoded {
            Ok(insn) => insn,
            Err(err) => {
                self.left = 0;
                return Some(Err(err));
            }
        };
        self.ip = insn
            .end()
            .wrapping_add_signed(insn.displacement.unwrap_or(0));
        Some(Ok(insn))
    }
}

#[path = "branches_fast.rs"]
mod fast;

#[path = "branches_idle.rs"]
mod idle;

#[path = "branches_parallel.rs"]
mod parallel;
pub use parallel::{Parallel, ParallelStats, Split, decode_parallel, decode_parallel_with};

#[cfg(test)]
#[path = "branches_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "branches_fast_tests.rs"]
mod fast_tests;

#[cfg(test)]
#[path = "branches_parallel_tests.rs"]
mod parallel_tests;
