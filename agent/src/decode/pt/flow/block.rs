//! The block decoder: events and code in, blocks of executed instructions out.
//!
//! In: an [`EventDecoder`] over a trace and an [`ImageProvider`] with the traced code.
//! Out: [`Block`]s (runs of instructions that executed one after the other, from `ip` to
//! `end_ip`, without needing trace in between) from [`BlockDecoder::next_block`], and the
//! events between them from [`BlockDecoder::next_event`] whenever the returned
//! [`Status`] says one is pending. Conditional branches take their outcome from TNT
//! bits, indirect branches their target from TIP, compressed returns theirs from a call
//! stack; events are placed at the instruction they bind to. The control flow follows
//! libipt's block decoder (also its errata work-arounds and its block cache, so block
//! boundaries match `ptxed --block:show-blocks`). The code walk without events is in
//! [`super::flow_walk`], event placement after a block in [`super::flow_events`].

use super::image::ImageProvider;
use super::insn::{self, Insn, InsnClass, MAX_INSN_SIZE, Undecodable};
use super::insn_cache::InsnCache;
use crate::decode::pt::events::evdec::{EventConfig, EventDecoder};
use crate::decode::pt::events::event::{Event, EventKind, FlowError};
use crate::decode::pt::packets::packet::ExecMode;
use crate::decode::pt::timing::time::{Time, TimeCal};

/// What the flow layer adds to the event layer's configuration.
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent switches, as ptxed's options and the product path set them"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FlowConfig {
    pub events: EventConfig,
    /// End a block after each near call (`--block:end-on-call`).
    pub end_on_call: bool,
    /// End a block after each near direct jump (`--block:end-on-jump`).
    pub end_on_jump: bool,
    /// Report tick events when time moves on at TIP/TNT (`--event:tick`).
    pub tick_events: bool,
    /// After an error, resume only at a PSB+ or at an event whose IP came whole from
    /// packets after the error (a full or sign-extended address, maybe updated in its low
    /// bits since): never at one built on a last IP from before, which lost trace may
    /// have made another place's. The product path ([`super::branches::Branches`]) sets
    /// it; ptxed's resynchronization (libipt's) does not.
    pub resync_exact_only: bool,
}

/// Instructions that executed in sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// The first instruction.
    pub ip: u64,
    /// The last instruction.
    pub end_ip: u64,
    pub mode: ExecMode,
    /// The section the code came from.
    pub isid: u32,
    /// How many instructions (0: an empty block, e.g. before an event).
    pub ninsn: u16,
    /// The class of the last instruction, where known.
    pub class: InsnClass,
    /// Executed inside a transaction.
    pub speculative: bool,
    /// The last instruction spans two sections; its bytes are in `raw`.
    pub truncated: bool,
    pub raw: [u8; MAX_INSN_SIZE],
    /// The last instruction's size (0 where not known, e.g. at the end of a long
    /// cached run); with `truncated`, how much of `raw` it is.
    pub size: u8,
}

impl Default for Block {
    fn default() -> Self {
        Self {
            ip: 0,
            end_ip: 0,
            mode: ExecMode::Unknown,
            isid: 0,
            ninsn: 0,
            class: InsnClass::Unknown,
            speculative: false,
            truncated: false,
            raw: [0; MAX_INSN_SIZE],
            size: 0,
        }
    }
}

/// What a block or event call says about what comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Call [`BlockDecoder::next_event`] before the next block.
    pub event_pending: bool,
    /// Tracing is disabled: there is no current IP.
    pub ip_suppressed: bool,
    /// The trace ends here.
    pub eos: bool,
}

impl Status {
    pub(crate) const NONE: Self = Self {
        event_pending: false,
        ip_suppressed: false,
        eos: false,
    };
}

/// Return addresses of calls, for compressed returns (64 deep, oldest dropped): a ring
/// of 64 slots, so that a push onto a full stack costs no more than any other.
#[derive(Debug, Clone)]
pub(crate) struct RetStack {
    slots: [u64; RETSTACK_SIZE],
    /// The slot after the top (modulo the size).
    top: usize,
    len: usize,
}

const RETSTACK_SIZE: usize = 64;

impl Default for RetStack {
    fn default() -> Self {
        Self {
            slots: [0; RETSTACK_SIZE],
            top: 0,
            len: 0,
        }
    }
}

impl RetStack {
    #[inline]
    pub fn push(&mut self, ip: u64) {
        let mut view = self.view();
        view.push(ip);
        view.store();
    }

    #[inline]
    pub fn pop(&mut self) -> Result<u64, FlowError> {
        let mut view = self.view();
        let popped = view.pop();
        view.store();
        popped
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The stack as a view whose top and length live in the caller's frame (the decode
    /// fast loop keeps them in registers) while the slots stay where they are: no copy
    /// of the 64 slots per fast run. [`RetView::store`] writes top and length back.
    pub(crate) fn view(&mut self) -> RetView<'_> {
        RetView {
            top: self.top,
            len: self.len,
            stack: self,
        }
    }

    /// Whether both hold the same return addresses (slots below the live ones are not
    /// state: a push overwrites them before a pop can see them).
    fn same_as(&self, other: &Self) -> bool {
        self.len == other.len
            && (1..=self.len).all(|k| {
                self.slots[self.top.wrapping_sub(k) % RETSTACK_SIZE]
                    == other.slots[other.top.wrapping_sub(k) % RETSTACK_SIZE]
            })
    }
}

/// [`RetStack::view`]: the same pushes and pops as on the stack itself.
pub(crate) struct RetView<'s> {
    stack: &'s mut RetStack,
    top: usize,
    len: usize,
}

impl RetView<'_> {
    #[inline]
    pub fn push(&mut self, ip: u64) {
        self.stack.slots[self.top % RETSTACK_SIZE] = ip;
        self.top = self.top.wrapping_add(1);
        self.len = (self.len + 1).min(RETSTACK_SIZE);
    }

    #[inline]
    pub fn pop(&mut self) -> Result<u64, FlowError> {
        if self.len == 0 {
            return Err(FlowError::RetStackEmpty);
        }
        self.len -= 1;
        self.top = self.top.wrapping_sub(1);
        Ok(self.stack.slots[self.top % RETSTACK_SIZE])
    }

    /// Writes top and length back into the stack.
    pub fn store(self) {
        self.stack.top = self.top;
        self.stack.len = self.len;
    }
}

/// Which events were already bound to the postponed instruction.
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per event type, as the binding rules have them"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Bound {
    pub paging: bool,
    pub vmcs: bool,
    pub ptwrite: bool,
    pub iret: bool,
    pub vmentry: bool,
    pub uiret: bool,
    pub swintr: bool,
    pub syscall: bool,
}

pub(crate) use super::cache::BlockCache;

/// Decodes a trace into blocks and events.
pub struct BlockDecoder<'a> {
    pub(crate) evdec: EventDecoder<'a>,
    pub(crate) image: &'a dyn ImageProvider,
    pub(crate) config: FlowConfig,
    /// The current event (valid while `status` is `Ok`).
    pub(crate) event: Event,
    pub(crate) status: Result<(), FlowError>,
    pub(crate) retstack: RetStack,
    /// An instruction events bind to, not yet proceeded past.
    pub(crate) postponed: Option<Insn>,
    pub(crate) bound: Bound,
    /// Where the next block starts (or where tracing is expected to resume).
    pub(crate) ip: u64,
    pub(crate) tsc: u64,
    pub(crate) has_tsc: bool,
    pub(crate) lost_mtc: u32,
    pub(crate) lost_cyc: u32,
    pub(crate) cbr: Option<u8>,
    /// Instructions since the last TRIG anchor.
    pub(crate) icnt: Option<u32>,
    pub(crate) mode: ExecMode,
    pub(crate) enabled: bool,
    pub(crate) speculative: bool,
    pub(crate) cache: BlockCache,
    /// Decoded instructions, for the walks that go one at a time (also a pure function
    /// of the image).
    pub(crate) insns: InsnCache,
    /// The instructions of the run the cache fill is decoding (kept to be reused).
    pub(crate) fill_ips: Vec<u64>,
}

impl<'a> BlockDecoder<'a> {
    pub fn new(trace: &'a [u8], image: &'a dyn ImageProvider, config: FlowConfig) -> Self {
        Self {
            evdec: EventDecoder::new(trace, config.events),
            image,
            config,
            event: Event::new(EventKind::Ignore),
            status: Err(FlowError::NoSync),
            retstack: RetStack::default(),
            postponed: None,
            bound: Bound::default(),
            ip: 0,
            tsc: 0,
            has_tsc: false,
            lost_mtc: 0,
            lost_cyc: 0,
            cbr: None,
            icnt: None,
            mode: ExecMode::Unknown,
            enabled: false,
            speculative: false,
            cache: BlockCache::for_trace(trace.len()),
            insns: InsnCache::default(),
            fill_ips: Vec::new(),
        }
    }

    /// Switches to another image (the block cache starts over).
    pub fn set_image(&mut self, image: &'a dyn ImageProvider) {
        self.image = image;
        self.cache.clear();
        self.insns.clear();
    }

    /// The trace offset the decoder is at (for diagnostics).
    pub fn offset(&self) -> usize {
        self.evdec.offset()
    }

    /// The offset of the PSB the decoder last synchronized at.
    pub fn sync_offset(&self) -> usize {
        self.evdec.sync_offset()
    }

    /// The time of the last event: `(tsc, lost_mtc, lost_cyc)`; the TSC is relative to
    /// an unknown start until the trace had a TSC packet.
    pub fn time(&self) -> (u64, bool, u32, u32) {
        (self.tsc, self.has_tsc, self.lost_mtc, self.lost_cyc)
    }

    /// The last core:bus ratio.
    pub fn core_bus_ratio(&self) -> Option<u8> {
        self.cbr
    }

    fn reset(&mut self) {
        self.tsc = 0;
        self.lost_mtc = 0;
        self.lost_cyc = 0;
        self.cbr = None;
        self.icnt = None;
        self.mode = ExecMode::Unknown;
        self.ip = 0;
        self.status = Err(FlowError::NoSync);
        self.enabled = false;
        self.speculative = false;
        self.has_tsc = false;
        self.postponed = None;
        self.bound = Bound::default();
        self.event = Event::new(EventKind::Ignore);
        self.retstack.clear();
    }

    pub(crate) fn status_flags(&self, event_pending: bool) -> Status {
        Status {
            event_pending,
            ip_suppressed: !self.enabled,
            eos: self.status == Err(FlowError::Eos),
        }
    }

    /// Synchronizes at the next PSB.
    pub fn sync_forward(&mut self) -> Result<Status, FlowError> {
        self.reset();
        self.evdec.sync_forward()?;
        self.start()
    }

    /// Synchronizes at the PSB at `offset`.
    pub fn sync_set(&mut self, offset: usize) -> Result<Status, FlowError> {
        self.sync_set_timed(offset, None)
    }

    /// Synchronizes at the PSB at `offset` with the time and calibration a decode from
    /// the start would have there ([`EventDecoder::sync_set_timed`]).
    pub(crate) fn sync_set_timed(
        &mut self,
        offset: usize,
        timing: Option<(Time, TimeCal)>,
    ) -> Result<Status, FlowError> {
        self.reset();
        // The last core:bus ratio is the time's: a decode from the start has it too.
        self.cbr = timing.and_then(|(time, _)| time.cbr());
        self.evdec.sync_set_timed(offset, timing)?;
        self.start()
    }

    /// A copy of the decoder's state without its block and instruction caches (pure
    /// functions of the image): a parallel decoder's checkpoint.
    pub(crate) fn snapshot(&self) -> Self {
        Self {
            evdec: self.evdec.clone(),
            image: self.image,
            config: self.config,
            event: self.event,
            status: self.status,
            retstack: self.retstack.clone(),
            postponed: self.postponed,
            bound: self.bound,
            ip: self.ip,
            tsc: self.tsc,
            has_tsc: self.has_tsc,
            lost_mtc: self.lost_mtc,
            lost_cyc: self.lost_cyc,
            cbr: self.cbr,
            icnt: self.icnt,
            mode: self.mode,
            enabled: self.enabled,
            speculative: self.speculative,
            cache: BlockCache::default(),
            insns: InsnCache::default(),
            fill_ips: Vec::new(),
        }
    }

    /// What in `other`'s state differs from this decoder's (`None`: both decode the rest
    /// of the trace alike): every field but the block cache, IP epochs compared by what
    /// they mean. For the parallel decoder's checkpoints; the name is for `--stats`.
    pub(crate) fn state_difference(&self, other: &Self) -> Option<&'static str> {
        if let Some(what) = self.evdec.state_difference(&other.evdec) {
            return Some(what);
        }
        let (epoch, other_epoch) = (self.evdec.ip_epoch(), other.evdec.ip_epoch());
        [
            (self.config == other.config, "configuration"),
            (
                self.event.in_epoch(epoch) == other.event.in_epoch(other_epoch),
                "next event",
            ),
            (self.status == other.status, "event status"),
            (self.retstack.same_as(&other.retstack), "return stack"),
            (self.postponed == other.postponed, "postponed instruction"),
            (self.bound == other.bound, "bound events"),
            (self.ip == other.ip, "IP"),
            (
                (self.tsc, self.has_tsc, self.lost_mtc, self.lost_cyc)
                    == (other.tsc, other.has_tsc, other.lost_mtc, other.lost_cyc),
                "event time",
            ),
            (self.cbr == other.cbr, "core:bus ratio"),
            (self.icnt == other.icnt, "instruction count"),
            (self.mode == other.mode, "execution mode"),
            (
                (self.enabled, self.speculative) == (other.enabled, other.speculative),
                "tracing state",
            ),
        ]
        .into_iter()
        .find_map(|(same, what)| (!same).then_some(what))
    }

    fn start(&mut self) -> Result<Status, FlowError> {
        // Take the initial state from the PSB+ status events on a copy; the events
        // themselves are still reported to the user.
        let mut evdec = self.evdec.clone();
        loop {
            if evdec.read_position() != self.evdec.read_position() {
                break;
            }
            let event = match evdec.next_event() {
                Ok(event) => event,
                Err(FlowError::Eos) => break,
                Err(err) => return Err(err),
            };
            if !event.status_update {
                break;
            }
            if let EventKind::Enabled { ip, .. } = event.kind {
                self.enabled = true;
                self.ip = ip;
                break;
            }
        }
        match self.evdec.next_event() {
            Ok(event) => {
                self.event = event;
                self.status = Ok(());
            }
            Err(err) => self.status = Err(err),
        }
        self.proceed_trailing_event(None)
    }

    /// Moves on to the next event, remembering the current one's time.
    pub(crate) fn fetch_event(&mut self) -> Result<(), FlowError> {
        self.leave_event()?;
        match self.evdec.next_event() {
            Ok(event) => self.event = event,
            Err(err) => {
                self.status = Err(err);
                self.event = Event::new(EventKind::Ignore);
            }
        }
        Ok(())
    }

    /// Moves past the current event: its time counts as seen, and it may anchor the
    /// instruction count of later TRIG packets. The first half of [`Self::fetch_event`]
    /// (also run by the quiet PSB+ batches of `branches_idle.rs`, whose next event
    /// comes from the batch).
    pub(crate) fn leave_event(&mut self) -> Result<(), FlowError> {
        self.tsc = self.event.tsc;
        self.has_tsc = self.event.has_tsc;
        self.lost_mtc = self.event.lost_mtc;
        self.lost_cyc = self.event.lost_cyc;
        self.update_trig_anchor()
    }

    /// Events at known IPs anchor the instruction count of later TRIG packets.
    fn update_trig_anchor(&mut self) -> Result<(), FlowError> {
        let ev = &self.event;
        match ev.kind {
            EventKind::Enabled { .. }
            | EventKind::AsyncBranch { .. }
            | EventKind::Tip { .. }
            | EventKind::Tnt { .. } => {
                if ev.ip_suppressed {
                    return Err(FlowError::Internal);
                }
                self.icnt = Some(0);
            }
            EventKind::Disabled { .. } | EventKind::AsyncDisabled { .. } => self.icnt = None,
            EventKind::Overflow { .. } => {
                self.icnt = if ev.ip_suppressed { None } else { Some(0) };
            }
            EventKind::Paging { .. }
            | EventKind::Sipi { .. }
            | EventKind::Cbr { .. }
            | EventKind::Mnt { .. }
            | EventKind::Stop
            | EventKind::Vmcs { .. }
            | EventKind::Mwait { .. }
            | EventKind::Pwre { .. }
            | EventKind::Pwrx { .. }
            | EventKind::Ignore => {}
            _ => {
                if !ev.ip_suppressed {
                    self.icnt = Some(0);
                }
            }
        }
        Ok(())
    }

    /// After a TIP or TNT: a tick event if time moved on (and they are wanted), else
    /// the next event.
    pub(crate) fn tick(&mut self, ip: u64) -> Result<(), FlowError> {
        if self.config.tick_events && self.event.tsc != self.tsc {
            self.event.kind = EventKind::Tick { ip };
            return Ok(());
        }
        self.fetch_event()
    }

    /// Takes an indirect branch's target from the trace.
    pub(crate) fn proceed_indirect(&mut self) -> Result<(), FlowError> {
        match self.event.kind {
            EventKind::Tip { ip } => {
                if self.event.ip_suppressed {
                    return Err(FlowError::BadPacket);
                }
                let from = self.ip;
                self.ip = ip;
                self.tick(from)
            }
            EventKind::Tnt { .. } => {
                // A deferred TIP may hide behind the TNT in progress: look ahead.
                let saved = self.evdec.clone();
                if let Ok(Event {
                    kind: EventKind::Tip { ip },
                    ..
                }) = self.evdec.next_event()
                {
                    self.ip = ip;
                    Ok(())
                } else {
                    self.evdec = saved;
                    Err(FlowError::BadQuery)
                }
            }
            _ => Err(FlowError::BadQuery),
        }
    }

    /// Takes a conditional branch's outcome from the trace.
    pub(crate) fn cond_branch(&mut self) -> Result<bool, FlowError> {
        let EventKind::Tnt { bits, size } = &mut self.event.kind else {
            return Err(FlowError::BadQuery);
        };
        if *size == 0 {
            return Err(FlowError::Internal);
        }
        *size -= 1;
        // The next event is fetched once the bit is used, to allow a tick first.
        Ok(bits
            .checked_shr(u32::from(*size))
            .is_some_and(|b| b & 1 == 1))
    }

    /// The next block, and what follows it (or the error that ended it; the block
    /// still holds the instructions decoded before).
    pub fn next_block(&mut self) -> (Block, Result<Status, FlowError>) {
        let mut block = Block {
            ip: self.ip,
            mode: self.mode,
            speculative: self.speculative,
            ..Block::default()
        };
        let status = self.proceed(&mut block);
        (block, status)
    }

    fn proceed(&mut self, block: &mut Block) -> Result<Status, FlowError> {
        match self.status {
            Err(FlowError::Eos) => {
                // Out of trace: go on while no trace is needed (adjacent segments may
                // be stitched together), as long as tracing is on.
                if !self.enabled {
                    return Err(FlowError::Eos);
                }
                self.proceed_no_event(block)?;
                return Ok(Status {
                    eos: true,
                    ..Status::NONE
                });
            }
            Err(err) => return Err(err),
            Ok(()) => {}
        }
        match self.event.kind {
            EventKind::Tnt { .. } | EventKind::Tip { .. } => {
                if !self.enabled {
                    return Err(FlowError::NoEnable);
                }
                self.proceed_no_event(block)?;
                self.proceed_trailing_event(Some(block))
            }
            _ => self.proceed_event(block),
        }
    }

    /// Adds the instruction at `ip` to `block`. `None` when it does not fit (the block
    /// is full, ends in a truncated instruction, or the code is in another section).
    pub(crate) fn proceed_one_insn(
        &mut self,
        block: &mut Block,
    ) -> Result<Option<Insn>, FlowError> {
        if block.ninsn == u16::MAX || block.truncated {
            return Ok(None);
        }
        let insn = self.insns.decode(self.image, self.ip, self.mode)?;
        Ok(self.add_insn(block, &insn)?.then_some(insn))
    }

    /// [`Self::proceed_one_insn`] with the instruction decoded from `code` (the bytes
    /// of a piece of section `isid`, from the address given with them) where it lies
    /// whole in them: for the cache fill, which decodes runs of code not seen before,
    /// so that the memo of decoded instructions (missed there) and the image's lookup
    /// and copy are left out. The same instruction (into `insn`, true; false where
    /// `proceed_one_insn` gives none), block and decoder state. Written in place: the
    /// 56-byte instruction returned in an `Option` was copied twice an instruction.
    #[inline]
    pub(crate) fn fill_one_insn(
        &mut self,
        block: &mut Block,
        code: Option<(u64, &[u8])>,
        isid: u32,
        insn: &mut Insn,
    ) -> Result<bool, FlowError> {
        let Some((begin, bytes)) = code else {
            return self.proceed_one_insn_into(block, insn);
        };
        if block.ninsn == u16::MAX || block.truncated {
            return Ok(false);
        }
        let ip = self.ip;
        let Some(at) = usize::try_from(ip.wrapping_sub(begin))
            .ok()
            .filter(|&at| at < bytes.len())
        else {
            return self.proceed_one_insn_into(block, insn);
        };
        let avail = &bytes[at..bytes.len().min(at + MAX_INSN_SIZE)];
        let (size, class, kind, displacement) = match insn::classify(avail, ip, self.mode) {
            Ok(classified) => classified,
            // Into the next piece: read as the walk does.
            Err(Undecodable::NeedMore) => return self.proceed_one_insn_into(block, insn),
            Err(Undecodable::Invalid) => return Err(FlowError::BadInsn),
        };
        // A fixed-size copy where the piece goes on (a copy of `avail.len()` bytes is a
        // call to memcpy).
        let raw = if let Some(whole) = avail.first_chunk::<MAX_INSN_SIZE>() {
            *whole
        } else {
            let mut raw = [0u8; MAX_INSN_SIZE];
            raw[..avail.len()].copy_from_slice(avail);
            raw
        };
        *insn = Insn {
            ip,
            mode: self.mode,
            size,
            raw,
            class,
            kind,
            displacement,
            isid,
            truncated: false,
        };
        self.add_insn(block, insn)
    }

    fn proceed_one_insn_into(
        &mut self,
        block: &mut Block,
        insn: &mut Insn,
    ) -> Result<bool, FlowError> {
        Ok(match self.proceed_one_insn(block)? {
            Some(one) => {
                *insn = one;
                true
            }
            None => false,
        })
    }

    /// Adds the decoded `insn` at `self.ip` to `block` ([`Self::proceed_one_insn`]);
    /// false where it does not fit.
    #[inline]
    fn add_insn(&mut self, block: &mut Block, insn: &Insn) -> Result<bool, FlowError> {
        if insn.isid != block.isid {
            if block.ninsn != 0 {
                return Ok(false);
            }
            block.isid = insn.isid;
        }
        block.size = insn.size;
        if insn.truncated {
            block.raw = insn.raw;
            block.truncated = true;
        }
        self.log_call(insn);
        block.class = insn.class;
        block.end_ip = insn.ip;
        block.ninsn += 1;
        if let Some(icnt) = &mut self.icnt {
            *icnt = icnt.checked_add(1).ok_or(FlowError::Overflow)?;
        }
        Ok(true)
    }

    /// Remembers a near call's return address (not for calls to the next instruction,
    /// which position-independent code uses to read its IP).
    pub(crate) fn log_call(&mut self, insn: &Insn) {
        if insn.class == InsnClass::Call && insn.displacement != Some(0) {
            self.retstack.push(insn.end());
        }
    }

    pub(crate) fn ends_block(&self, insn: &Insn) -> bool {
        (self.config.end_on_call && insn.class == InsnClass::Call)
            || (self.config.end_on_jump && insn.class == InsnClass::Jump)
    }

    /// Proceeds to the first instruction for which `pred` holds (it is added to the
    /// block; `ip` stays at it). Also returns the last instruction reached.
    pub(crate) fn proceed_to_insn(
        &mut self,
        block: &mut Block,
        pred: fn(&Insn) -> bool,
    ) -> (Result<bool, FlowError>, Option<Insn>) {
        let mut last = None;
        loop {
            let insn = match self.proceed_one_insn(block) {
                Ok(Some(insn)) => insn,
                Ok(None) => return (Ok(false), last),
                Err(err) => return (Err(err), last),
            };
            last = Some(insn);
            if pred(&insn) {
                return (Ok(true), last);
            }
            match insn.next_ip() {
                Ok(ip) => self.ip = ip,
                Err(err) => return (Err(err), last),
            }
            if self.ends_block(&insn) {
                return (Ok(false), last);
            }
        }
    }

    /// Proceeds until `ip` is the next instruction.
    pub(crate) fn proceed_to_ip(
        &mut self,
        block: &mut Block,
        ip: u64,
    ) -> (Result<bool, FlowError>, Option<Insn>) {
        let mut last = None;
        loop {
            if self.ip == ip {
                return (Ok(true), last);
            }
            let insn = match self.proceed_one_insn(block) {
                Ok(Some(insn)) => insn,
                Ok(None) => return (Ok(false), last),
                Err(err) => return (Err(err), last),
            };
            last = Some(insn);
            match insn.next_ip() {
                Ok(next) => self.ip = next,
                Err(err) => return (Err(err), last),
            }
            if self.ends_block(&insn) {
                return (Ok(self.ip == ip), last);
            }
        }
    }

    /// One step that needs trace, at the instruction that ended a block.
    pub(crate) fn proceed_with_trace(&mut self, insn: &Insn) -> Result<(), FlowError> {
        match insn.class {
            InsnClass::CondJump => {
                let mut ip = insn.end();
                if self.cond_branch()? {
                    ip = ip.wrapping_add_signed(insn.displacement.unwrap_or(0));
                }
                self.ip = ip;
                return Ok(());
            }
            InsnClass::Return => {
                // A taken TNT bit is a compressed return.
                match self.cond_branch() {
                    Ok(true) => {
                        self.ip = self.retstack.pop()?;
                        return Ok(());
                    }
                    Ok(false) => return Err(FlowError::BadRetComp),
                    Err(FlowError::BadQuery) => {}
                    Err(err) => return Err(err),
                }
            }
            InsnClass::Jump | InsnClass::Call => {
                if insn.displacement.is_some() {
                    return Err(FlowError::Internal);
                }
            }
            InsnClass::FarCall
            | InsnClass::FarReturn
            | InsnClass::FarJump
            | InsnClass::Indirect => {}
            InsnClass::PtWrite | InsnClass::Other => return Err(FlowError::Internal),
            InsnClass::Unknown => return Err(FlowError::BadInsn),
        }
        self.proceed_indirect()
    }

    /// Keeps `insn` for further events binding to it; reports the pending event.
    pub(crate) fn postpone(&mut self, insn: Insn) -> Result<Status, FlowError> {
        if self.postponed.is_some() {
            return Err(FlowError::Internal);
        }
        self.postponed = Some(insn);
        Ok(self.status_flags(true))
    }

    pub(crate) fn clear_postponed(&mut self) {
        self.postponed = None;
        self.bound = Bound::default();
    }

    /// Proceeds past a postponed instruction, if any.
    pub(crate) fn proceed_postponed(&mut self) -> Result<(), FlowError> {
        let Some(insn) = self.postponed else {
            return Ok(());
        };
        if self.enabled {
            match insn.next_ip() {
                Ok(ip) => self.ip = ip,
                Err(FlowError::BadQuery) => self.proceed_with_trace(&insn)?,
                Err(err) => return Err(err),
            }
        }
        self.clear_postponed();
        Ok(())
    }

    /// Where tracing is expected to resume after a synchronous disable at `insn`: after
    /// a call (on return), otherwise unknown.
    pub(crate) fn set_disable_resume_ip(&mut self, insn: Option<&Insn>) {
        self.ip = match insn {
            Some(insn) if matches!(insn.class, InsnClass::Call | InsnClass::FarCall) => insn.end(),
            _ => 0,
        };
    }
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;
