//! The event layer: Intel PT packets in, [`Event`]s out.
//!
//! In: a trace and its [`EventConfig`] (timing, errata, which events to report). Out:
//! one [`Event`] per call to [`EventDecoder::next_event`], or a [`FlowError`] saying why
//! not. Packets that belong together (MODE.Exec + TIP, PIP/VMCS between FUP and TIP,
//! MWAIT + EXSTOP + FUP, CFE/EVD + FUP, PSB+ state) are bound here, following the binding
//! rules libipt's event decoder uses, so the flow layer above ([`crate::decode::pt::flow`])
//! only deals with events at addresses. The overflow and errata handling lives in
//! [`super::evdec_ovf`], control-flow events (CFE/EVD/TRIG) in [`super::evdec_cfe`].

use super::event::{Event, EventKind, EventQueue, FlowError, binding};
use crate::decode::pt::packets::cpu::Errata;
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::last_ip::{LastIp, LastIpError};
use crate::decode::pt::packets::packet::{self, IpCompression, IpPayload, ModeExec, Packet};
use crate::decode::pt::packets::parse::{self, PacketError};
use crate::decode::pt::packets::parse_hot::{Hot, hot_packet, skip_pad_runs};
use crate::decode::pt::timing::time::{Time, TimeCal, TimeError, TimingConfig};

/// How the event layer decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EventConfig {
    /// MTC/CYC configuration and the recording CPU's errata (`timing.errata`).
    pub timing: TimingConfig,
    /// Keep the CYC calibration over an overflow.
    pub keep_tcal_on_ovf: bool,
    /// Report RFLAGS.IF changes (`ptxed --event:iflags`).
    pub iflags_events: bool,
    /// IP filter configuration (`ADDRn_CFG`/`A`/`B`), for erratum SKL014.
    pub filter: AddrFilter,
}

impl EventConfig {
    pub fn errata(&self) -> Errata {
        self.timing.errata
    }
}

/// The IP filter ranges of `IA32_RTIT_CTL`/`IA32_RTIT_ADDRn_A/B`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AddrFilter {
    /// `ADDRn_CFG` for n = 0..4: 0 unused, 1 filter (trace inside), 2 `TraceStop`.
    pub cfg: [u8; 4],
    pub ranges: [(u64, u64); 4],
}

impl AddrFilter {
    /// Whether any range is configured.
    pub fn is_used(&self) -> bool {
        self.cfg.iter().any(|&c| c != 0)
    }

    /// Whether tracing is on at `ip`: inside a filter range (if there are any) and
    /// outside every `TraceStop` range.
    pub fn allows(&self, ip: u64) -> bool {
        let mut have_filter = false;
        let mut in_filter = false;
        for (cfg, (a, b)) in self.cfg.iter().zip(self.ranges) {
            let inside = a <= ip && ip <= b;
            match cfg {
                1 => {
                    have_filter = true;
                    in_filter |= inside;
                }
                2 if inside => return false,
                _ => {}
            }
        }
        !have_filter || in_filter
    }
}

/// A packet read ahead of decoding (offset, packet, size).
pub(crate) type Read = (usize, Packet, usize);

/// Reads the next packet as libipt's packet decoder would: the end of the trace (or a
/// truncated packet) is [`FlowError::Eos`]; packets libipt does not know (BBP/BIP/BEP)
/// are errors that do not move the position. A packet an erratum corrupted
/// ([`Packet::Corrupted`]) is returned and skipped by the layers above.
pub(crate) fn read_packet(pkt: &mut PacketDecoder<'_>) -> Result<Read, FlowError> {
    let saved = pkt.clone();
    match pkt.next_decoded() {
        None => Err(FlowError::Eos),
        Some(Err(err)) => Err(packet_error(&err)),
        Some(Ok((
            _,
            parse::Decoded {
                packet: Packet::Bbp(_) | Packet::Bip(_) | Packet::Bep { .. },
                ..
            },
        ))) => {
            *pkt = saved;
            Err(FlowError::BadOpcode)
        }
        Some(Ok((offset, decoded))) => Ok((offset, decoded.packet, decoded.size)),
    }
}

/// The flow-level error for a packet-level one.
pub fn packet_error(err: &PacketError) -> FlowError {
    match err {
        PacketError::UnknownOpcode { .. } => FlowError::BadOpcode,
        PacketError::BadPayload { .. } => FlowError::BadPacket,
        PacketError::Truncated { .. }
        | PacketError::NoSync { .. }
        | PacketError::OutOfRange { .. } => FlowError::Eos,
    }
}

/// The flow-level error for a timing error; `None` for configuration problems, which
/// only make time less precise.
pub(crate) fn time_error(err: TimeError) -> Option<FlowError> {
    match err {
        TimeError::NoCrystalRatio => None,
        TimeError::NoTime => Some(FlowError::NoTime),
        TimeError::ZeroCbr | TimeError::CtcBackwards | TimeError::TscBackwards => {
            Some(FlowError::BadPacket)
        }
        TimeError::TmaWithoutTsc | TimeError::DuplicateTma => Some(FlowError::BadContext),
        TimeError::Inconsistent => Some(FlowError::Internal),
    }
}

pub(crate) fn check_time(result: Result<(), TimeError>) -> Result<(), FlowError> {
    match result.map_err(time_error) {
        Err(Some(err)) => Err(err),
        _ => Ok(()),
    }
}

/// What a packet handler did: made an event, or needs the next packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Event,
    More,
}

/// MODE.Exec state, to turn repeated MODE.Exec packets into changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct ExecState {
    pub valid: bool,
    pub bits: ModeExec,
}

/// Decodes a trace into events.
#[derive(Debug, Clone)]
pub struct EventDecoder<'a> {
    pub(crate) pkt: PacketDecoder<'a>,
    pub(crate) config: EventConfig,
    /// The packet being processed; `None` when reading it failed (`status` says why).
    pub(crate) packet: Option<Read>,
    pub(crate) status: Result<(), FlowError>,
    pub(crate) ip: LastIp,
    pub(crate) time: Time,
    pub(crate) tcal: TimeCal,
    pub(crate) evq: EventQueue,
    /// The event produced by the last handler.
    pub(crate) event: Option<Event>,
    pub(crate) exec: ExecState,
    pub(crate) enabled: bool,
    /// The current packet is bound to events already; don't also treat it on its own.
    pub(crate) bound: bool,
    /// Counts [`EventDecoder::doubt_ip`] calls: an event's exact IP is of one epoch.
    pub(crate) ip_epoch: u32,
    /// The time and calibration before the last PSB: what a recovery that synchronizes
    /// at that PSB again keeps ([`EventDecoder::sync_set_timed`]).
    pub(crate) psb_timing: (Time, TimeCal),
}

impl<'a> EventDecoder<'a> {
    pub fn new(trace: &'a [u8], config: EventConfig) -> Self {
        Self {
            pkt: PacketDecoder::new(trace, config.errata()),
            config,
            packet: None,
            status: Err(FlowError::NoSync),
            ip: LastIp::new(),
            time: Time::new(),
            tcal: TimeCal::new(),
            evq: EventQueue::default(),
            event: None,
            exec: ExecState::default(),
            enabled: false,
            bound: false,
            ip_epoch: 0,
            psb_timing: (Time::new(), TimeCal::new()),
        }
    }

    pub fn config(&self) -> &EventConfig {
        &self.config
    }

    pub(crate) fn reset_state(&mut self) {
        self.packet = None;
        self.status = Err(FlowError::NoSync);
        self.event = None;
        self.enabled = false;
        self.bound = false;
        self.exec = ExecState::default();
        self.ip.reset();
        self.time = Time::new();
        self.tcal = TimeCal::new();
        self.evq.clear();
    }

    /// The trace offset of the packet being processed (or of the one that failed).
    pub fn offset(&self) -> usize {
        match self.packet {
            Some((offset, _, _)) => offset,
            None => self.pkt.position(),
        }
    }

    /// The offset after the packet being processed: where reading goes on.
    pub(crate) fn read_position(&self) -> usize {
        self.pkt.position()
    }

    /// The offset of the last PSB synchronized to.
    pub fn sync_offset(&self) -> usize {
        self.pkt.last_sync().unwrap_or(0)
    }

    /// What in `other`'s state differs from this decoder's, if anything (`None`: the
    /// same packet at the same place, the same IP, time, calibration and waiting events,
    /// so that both decode the rest of the trace alike). IP epochs are compared by what
    /// they mean, not by number ([`Event::in_epoch`]). For the parallel decoder.
    pub(crate) fn state_difference(&self, other: &Self) -> Option<&'static str> {
        let (epoch, other_epoch) = (self.ip_epoch, other.ip_epoch);
        [
            (self.pkt.same_place(&other.pkt), "packet position"),
            (self.config == other.config, "configuration"),
            (self.packet == other.packet, "packet"),
            // `status` is read only while there is no packet (it says why): an overflow
            // leaves the one of its reset behind while packets are read again.
            (
                self.packet.is_some() || self.status == other.status,
                "packet status",
            ),
            (self.ip == other.ip, "last IP"),
            (self.time == other.time, "time"),
            (self.tcal == other.tcal, "time calibration"),
            (self.psb_timing == other.psb_timing, "time at the PSB"),
            (
                self.evq.same_as(epoch, &other.evq, other_epoch),
                "waiting events",
            ),
            (
                self.event.map(|e| e.in_epoch(epoch))
                    == other.event.map(|e| e.in_epoch(other_epoch)),
                "event",
            ),
            (
                (self.exec, self.enabled, self.bound) == (other.exec, other.enabled, other.bound),
                "packet state",
            ),
        ]
        .into_iter()
        .find_map(|(same, what)| (!same).then_some(what))
    }

    /// The time and calibration before the last PSB decoded.
    pub(crate) fn psb_timing(&self) -> (Time, TimeCal) {
        self.psb_timing
    }

    /// Moves to the next PSB and decodes its PSB+ header.
    pub fn sync_forward(&mut self) -> Result<(), FlowError> {
        self.reset_state();
        self.pkt.sync_forward().map_err(|e| packet_error(&e))?;
        self.start()
    }

    /// Decodes from a PSB at `offset`.
    pub fn sync_set(&mut self, offset: usize) -> Result<(), FlowError> {
        self.sync_set_timed(offset, None)
    }

    /// Decodes from a PSB at `offset` with the time and calibration a decode from the
    /// start of the trace would have there (`timing`; fresh ones when `None`): a
    /// parallel decoder's worker starts so, to reach the state a sequential decode is in.
    pub(crate) fn sync_set_timed(
        &mut self,
        offset: usize,
        timing: Option<(Time, TimeCal)>,
    ) -> Result<(), FlowError> {
        self.reset_state();
        if let Some((time, tcal)) = timing {
            self.time = time;
            self.tcal = tcal;
        }
        self.pkt.sync_set(offset).map_err(|e| packet_error(&e))?;
        self.start()
    }

    fn start(&mut self) -> Result<(), FlowError> {
        self.status = Ok(());
        self.fetch_packet();
        match self.packet {
            Some((_, Packet::Psb, _)) => self.decode_psb().map(|_| ()),
            Some(_) => Err(FlowError::NoSync),
            None => Err(self.status.err().unwrap_or(FlowError::Internal)),
        }
    }

    /// Reads the next packet into `packet`, skipping PADs; errors are kept in `status`.
    pub(crate) fn fetch_packet(&mut self) {
        loop {
            // Real traces are a third PADs (KVM-PT): not one packet read each.
            self.pkt.skip_pads();
            match read_packet(&mut self.pkt) {
                Ok((_, Packet::Pad, _)) => {}
                Ok(read) => {
                    self.packet = Some(read);
                    // Kept true with a packet in hand too (it is read only without one):
                    // an overflow's restart left `NoSync` here while packets flowed, and
                    // the fast path, which asked, stayed off for the rest of the trace.
                    self.status = Ok(());
                    return;
                }
                Err(err) => {
                    self.packet = None;
                    self.status = Err(err);
                    return;
                }
            }
        }
    }

    /// Steps over the TNT packet in hand and the TNTs (and PADs) right after it without an
    /// event each, for a caller that would drop their events unread: the flow layer's
    /// resync after an error (`flow_trailing.rs`), which reads on to an event with an IP
    /// (real traces: ~70 events a resync, most of them TNTs, each ~250 instructions
    /// through this layer and the flow layer's). The same as decoding them: a TNT moves
    /// no clock and no IP, and the next packet is read as `fetch_packet` reads it. Not
    /// while tracing is off, where a TNT is an error the decode reports. (Not inlined:
    /// it is on the error path only.)
    #[inline(never)]
    pub(crate) fn skip_tnt_run(&mut self) {
        let Some((offset, Packet::Tnt8(_) | Packet::Tnt64(_), size)) = self.packet else {
            return;
        };
        if !self.enabled {
            return;
        }
        let trace = self.pkt.trace();
        let mut at = offset + size;
        loop {
            at = skip_pad_runs(trace, at);
            match hot_packet(trace, at) {
                Hot::Tnt { size, .. } => at += size,
                Hot::Tip { .. } | Hot::Other => break,
            }
        }
        // (A TNT leaves no block context: none to keep.)
        self.pkt.seek(at);
        self.fetch_packet();
    }

    /// Finishes a handler that produced `event`: publish it and move to the next packet.
    pub(crate) fn publish_and_fetch(&mut self, event: Event) -> Step {
        self.event = Some(event);
        self.fetch_packet();
        Step::Event
    }

    /// A standalone event with the current time.
    pub(crate) fn timed(&self, kind: EventKind) -> Event {
        let mut event = Event::new(kind);
        self.set_time(&mut event);
        event
    }

    pub(crate) fn set_time(&self, event: &mut Event) {
        event.tsc = self.time.relative_tsc();
        let (lost_mtc, lost_cyc) = self.time.lost();
        event.lost_mtc = lost_mtc;
        event.lost_cyc = lost_cyc;
        event.has_tsc = self.time.tsc().is_ok();
    }

    /// Gives `event` the current IP, or marks it suppressed.
    pub(crate) fn set_ip(&self, event: &mut Event) {
        match self.ip.ip() {
            Ok(ip) => {
                if let Some(field) = event.kind.ip_mut() {
                    *field = ip;
                }
                event.ip_exact_epoch = self.ip.is_exact().then_some(self.ip_epoch);
            }
            Err(_) => event.ip_suppressed = true,
        }
    }

    /// Distrusts the last IP's high bits (trace may have been lost before an error) and
    /// starts a new IP epoch: events whose IP was taken before are not exact now.
    pub fn doubt_ip(&mut self) {
        self.ip.doubt();
        self.ip_epoch = self.ip_epoch.wrapping_add(1);
    }

    /// The current IP epoch ([`EventDecoder::doubt_ip`]).
    pub fn ip_epoch(&self) -> u32 {
        self.ip_epoch
    }

    pub(crate) fn update_ip(&mut self, payload: IpPayload) {
        self.ip.update(payload);
    }

    /// The next event.
    pub fn next_event(&mut self) -> Result<Event, FlowError> {
        loop {
            match self.decode_packet()? {
                Step::Event => return self.event.take().ok_or(FlowError::Internal),
                Step::More => {
                    if self.event.is_some() {
                        return Err(FlowError::Internal);
                    }
                    self.bound = false;
                    self.fetch_packet();
                }
            }
        }
    }

    pub(crate) fn decode_packet(&mut self) -> Result<Step, FlowError> {
        let Some((_, packet, _)) = self.packet else {
            self.status?;
            return Ok(Step::More);
        };
        match packet {
            Packet::Tnt8(tnt) | Packet::Tnt64(tnt) => {
                if !self.enabled {
                    return Err(FlowError::BadContext);
                }
                let event = self.timed(EventKind::Tnt {
                    bits: tnt.bits,
                    size: tnt.count,
                });
                Ok(self.publish_and_fetch(event))
            }
            Packet::Pad | Packet::Corrupted => Ok(Step::More),
            Packet::Fup(ip) => self.decode_fup(ip),
            Packet::Tip(ip) => self.decode_tip(ip),
            Packet::TipPge(ip) => self.decode_tip_pge(ip),
            Packet::TipPgd(ip) => self.decode_tip_pgd(ip),
            Packet::Tsc { .. } | Packet::Tma { .. } | Packet::Mtc { .. } | Packet::Cyc { .. } => {
                self.apply_timing(&packet, false)?;
                Ok(Step::More)
            }
            Packet::Cbr { ratio } => {
                self.apply_timing(&packet, false)?;
                let event = self.timed(EventKind::Cbr { ratio });
                Ok(self.publish_and_fetch(event))
            }
            Packet::ModeExec(mode) => self.decode_mode_exec(mode),
            Packet::ModeTsx(tsx) => self.decode_mode_tsx(tsx.intx, tsx.abrt),
            Packet::Pip(pip) => self.decode_pip(pip.cr3, pip.nr),
            Packet::Vmcs { base } => self.decode_vmcs(base),
            Packet::Ptw(ptw) => self.decode_ptw(ptw),
            Packet::Psb => {
                if self.decode_psb()? == Step::Event {
                    return Ok(Step::Event);
                }
                self.decode_packet()
            }
            Packet::PsbEnd => self.decode_psbend(),
            Packet::Exstop { ip } => self.decode_exstop(ip),
            Packet::Pwre(pwre) => {
                let mut event = Event::new(EventKind::Pwre {
                    state: pwre.state(),
                    sub_state: pwre.sub_state(),
                    hw: pwre.payload & 0x08 != 0,
                });
                self.set_time(&mut event);
                self.evq.push(binding::PWRX, event)?;
                Ok(Step::More)
            }
            Packet::Pwrx(pwrx) => Ok(self.decode_pwrx(pwrx)),
            Packet::Mwait(mwait) => {
                self.evq.enqueue(
                    binding::EXSTOP,
                    EventKind::Mwait {
                        hints: mwait.hints,
                        ext: mwait.ext,
                        ip: 0,
                    },
                )?;
                Ok(Step::More)
            }
            Packet::Ovf => self.decode_ovf(),
            Packet::Stop => {
                let event = self.timed(EventKind::Stop);
                Ok(self.publish_and_fetch(event))
            }
            Packet::Mnt { payload } => {
                let event = self.timed(EventKind::Mnt { payload });
                Ok(self.publish_and_fetch(event))
            }
            Packet::Cfe(cfe) => self.decode_cfe(cfe),
            Packet::Evd(evd) => self.decode_evd(evd),
            Packet::Trig(trig) => self.decode_trig(trig),
            Packet::Bbp(_) | Packet::Bip(_) | Packet::Bep { .. } => Err(FlowError::BadOpcode),
        }
    }

    /// Applies a timing packet to time and calibration, inside (`header`) or outside PSB+.
    pub(crate) fn apply_timing(&mut self, packet: &Packet, header: bool) -> Result<(), FlowError> {
        apply_timing(
            &mut self.time,
            &mut self.tcal,
            &self.config.timing,
            packet,
            header,
        )
    }

    fn decode_pwrx(&mut self, pwrx: packet::Pwrx) -> Step {
        if let Some(event) = self.evq.dequeue(binding::PWRX) {
            // The PWRE keeps its own time.
            self.event = Some(event);
            return Step::Event;
        }
        let event = self.timed(EventKind::Pwrx {
            last: pwrx.last,
            deepest: pwrx.deepest,
            interrupt: pwrx.wake_reason & 0x01 != 0,
            store: pwrx.wake_reason & 0x04 != 0,
            autonomous: pwrx.wake_reason & 0x08 != 0,
        });
        self.publish_and_fetch(event)
    }

    fn decode_ptw(&mut self, ptw: packet::Ptw) -> Result<Step, FlowError> {
        let size = match ptw.plc {
            0 => 4,
            1 => 8,
            _ => return Err(FlowError::BadPacket),
        };
        let kind = EventKind::Ptwrite {
            size,
            payload: ptw.payload,
            ip: 0,
        };
        if ptw.ip {
            self.evq.enqueue(binding::FUP_BOUND, kind)?;
            return Ok(Step::More);
        }
        let mut event = self.timed(kind);
        event.ip_suppressed = true;
        Ok(self.publish_and_fetch(event))
    }

    fn decode_exstop(&mut self, with_ip: bool) -> Result<Step, FlowError> {
        if let Some(mut mwait) = self.evq.dequeue(binding::EXSTOP) {
            if !matches!(mwait.kind, EventKind::Mwait { .. }) {
                return Err(FlowError::Internal);
            }
            if with_ip {
                // MWAIT and EXSTOP both bind to the FUP; EXSTOP is handled below.
                self.evq.push(binding::FUP_BOUND, mwait)?;
            } else {
                // Both are standalone: MWAIT now, EXSTOP on the next call (the packet
                // stays current).
                mwait.ip_suppressed = true;
                self.set_time(&mut mwait);
                self.event = Some(mwait);
                return Ok(Step::Event);
            }
        }
        let kind = EventKind::Exstop { ip: 0 };
        if with_ip {
            self.evq.enqueue(binding::FUP_BOUND, kind)?;
            return Ok(Step::More);
        }
        let mut event = self.timed(kind);
        event.ip_suppressed = true;
        Ok(self.publish_and_fetch(event))
    }

    fn decode_mode_exec(&mut self, mode: ModeExec) -> Result<Step, FlowError> {
        let bind = binding::TIP | binding::FUP_BOUND;
        let mut events = 0;
        let changed =
            !self.exec.valid || self.exec.bits.csl != mode.csl || self.exec.bits.csd != mode.csd;
        if changed {
            self.evq.enqueue(
                bind,
                EventKind::ExecMode {
                    mode: mode.exec_mode(),
                    ip: 0,
                },
            )?;
            self.exec.bits.csl = mode.csl;
            self.exec.bits.csd = mode.csd;
            events += 1;
        }
        if self.config.iflags_events && (!self.exec.valid || self.exec.bits.iflag != mode.iflag) {
            self.evq.enqueue(
                bind,
                EventKind::Iflags {
                    iflag: mode.iflag,
                    ip: 0,
                },
            )?;
            self.exec.bits.iflag = mode.iflag;
            events += 1;
        }
        if events == 0 {
            self.evq.enqueue(bind, EventKind::Ignore)?;
        }
        self.exec.valid = true;
        Ok(Step::More)
    }

    fn decode_mode_tsx(&mut self, intx: bool, abrt: bool) -> Result<Step, FlowError> {
        let kind = EventKind::Tsx {
            speculative: intx,
            aborted: abrt,
            ip: 0,
        };
        if self.enabled {
            let bind = if abrt {
                binding::FUP
            } else {
                binding::FUP_BOUND
            };
            self.evq.enqueue(bind, kind)?;
            return Ok(Step::More);
        }
        let mut event = self.timed(kind);
        event.ip_suppressed = true;
        Ok(self.publish_and_fetch(event))
    }

    fn decode_pip(&mut self, cr3: u64, non_root: bool) -> Result<Step, FlowError> {
        let is_async = |k: &EventKind| matches!(k, EventKind::AsyncBranch { .. });
        if self.evq.find(binding::TIP, is_async).is_some() {
            self.evq.enqueue(
                binding::TIP,
                EventKind::AsyncPaging {
                    cr3,
                    non_root,
                    ip: 0,
                },
            )?;
            return Ok(Step::More);
        }
        let event = self.timed(EventKind::Paging { cr3, non_root });
        Ok(self.publish_and_fetch(event))
    }

    fn decode_vmcs(&mut self, base: u64) -> Result<Step, FlowError> {
        // VMCS goes before a PIP that binds to the same TIP.
        let is_paging = |k: &EventKind| matches!(k, EventKind::AsyncPaging { .. });
        if let Some(index) = self.evq.find(binding::TIP, is_paging) {
            let paging = *self.evq.get(index).ok_or(FlowError::Internal)?;
            self.evq.push(binding::TIP, paging)?;
            let slot = self.evq.get_mut(index).ok_or(FlowError::Internal)?;
            *slot = Event::new(EventKind::AsyncVmcs { base, ip: 0 });
            return Ok(Step::More);
        }
        let is_async = |k: &EventKind| matches!(k, EventKind::AsyncBranch { .. });
        if self.evq.find(binding::TIP, is_async).is_some() {
            self.evq
                .enqueue(binding::TIP, EventKind::AsyncVmcs { base, ip: 0 })?;
            return Ok(Step::More);
        }
        let event = self.timed(EventKind::Vmcs { base });
        Ok(self.publish_and_fetch(event))
    }
}

/// libipt's error for a missing last IP.
pub(crate) fn last_ip_error(err: LastIpError) -> FlowError {
    match err {
        LastIpError::NoIp => FlowError::NoIp,
        LastIpError::Suppressed => FlowError::IpSuppressed,
    }
}

/// Applies a timing packet (TSC, CBR, TMA, MTC, CYC) to time and calibration.
pub(crate) fn apply_timing(
    time: &mut Time,
    tcal: &mut TimeCal,
    config: &TimingConfig,
    packet: &Packet,
    header: bool,
) -> Result<(), FlowError> {
    match *packet {
        Packet::Tsc { tsc } => {
            if header {
                check_time(tcal.header_tsc(tsc))?;
            } else {
                tcal.update_tsc(tsc);
            }
            time.update_tsc(tsc);
            Ok(())
        }
        Packet::Cbr { ratio } => {
            if header {
                check_time(tcal.header_cbr(ratio, config))?;
            } else {
                check_time(tcal.update_cbr(ratio, config))?;
            }
            check_time(time.update_cbr(ratio))
        }
        Packet::Tma { ctc, fc } => check_time(time.update_tma(ctc, fc, config)),
        Packet::Mtc { ctc } => {
            check_time(tcal.update_mtc(ctc, config))?;
            check_time(time.update_mtc(ctc, config))
        }
        Packet::Cyc { value } => {
            tcal.update_cyc(value);
            let fcr = tcal.fcr().unwrap_or(0);
            check_time(time.update_cyc(value, config, fcr))
        }
        _ => Ok(()),
    }
}

/// Whether an IP payload carries an address.
pub(crate) fn has_ip(payload: IpPayload) -> bool {
    payload.compression != IpCompression::Suppressed
}

#[cfg(test)]
#[path = "evdec_tests.rs"]
mod tests;
