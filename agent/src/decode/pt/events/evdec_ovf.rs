//! The event layer at synchronization points: PSB+ headers and overflows.
//!
//! In: an [`EventDecoder`] whose current packet is a PSB, PSBEND or OVF. Out: the
//! status events of a PSB+ (all bound to its PSBEND: tracing on or off, execution mode,
//! TSX state, CR3, VMCS, core:bus ratio), and overflow events placed where tracing
//! resumed (the FUP after the OVF, or nowhere when it resumed disabled). The processor
//! errata that garble what follows an OVF (SKD010, APL11, APL12) and PSB+ (BDM70) are
//! worked around here by reading ahead on a copy of the packet decoder, as libipt does.

use super::evdec::{EventDecoder, Read, Step, apply_timing, has_ip, read_packet};
use super::event::{Event, EventKind, FlowError, binding};
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::packet::{self, IpPayload, Packet};
use crate::decode::pt::packets::parse::Decoded;
use crate::decode::pt::packets::parse_hot::skip_pad_runs;
use crate::decode::pt::packets::sync::is_psb;
use crate::decode::pt::timing::time::{Time, TimeCal};

/// The PSB+ FUP, if the header that `pkt` is in has one (`None`: PSBEND or OVF first).
fn find_header_fup(pkt: &PacketDecoder<'_>) -> Result<Option<IpPayload>, FlowError> {
    let mut pkt = pkt.clone();
    loop {
        match read_packet(&mut pkt)?.1 {
            Packet::Fup(ip) => return Ok(Some(ip)),
            Packet::ModeExec(_)
            | Packet::ModeTsx(_)
            | Packet::Pip(_)
            | Packet::Vmcs { .. }
            | Packet::Mnt { .. }
            | Packet::Tsc { .. }
            | Packet::Cbr { .. }
            | Packet::Tma { .. }
            | Packet::Mtc { .. }
            | Packet::Cyc { .. }
            | Packet::Pad
            | Packet::Corrupted => {}
            Packet::PsbEnd | Packet::Ovf => return Ok(None),
            _ => return Err(FlowError::BadContext),
        }
    }
}

/// The offset from `pkt` to just after the FUP an OVF binds to; 0 when a packet shows
/// that tracing resumed disabled.
fn find_ovf_fup(pkt: &PacketDecoder<'_>) -> Result<usize, FlowError> {
    let mut pkt = pkt.clone();
    let mut offset = 0usize;
    loop {
        let (_, packet, size) = read_packet(&mut pkt)?;
        offset = offset.checked_add(size).ok_or(FlowError::Overflow)?;
        match packet {
            Packet::Fup(_) => return Ok(offset),
            Packet::Pad
            | Packet::Mnt { .. }
            | Packet::Cbr { .. }
            | Packet::Tsc { .. }
            | Packet::Tma { .. }
            | Packet::Mtc { .. }
            | Packet::Cyc { .. }
            | Packet::Corrupted => {}
            Packet::PsbEnd
            | Packet::Tip(_)
            | Packet::TipPgd(_)
            | Packet::Tnt8(_)
            | Packet::Tnt64(_) => return Err(FlowError::BadContext),
            _ => return Ok(0),
        }
    }
}

fn is_timing(packet: &Packet) -> bool {
    matches!(
        packet,
        Packet::Tsc { .. }
            | Packet::Cbr { .. }
            | Packet::Tma { .. }
            | Packet::Mtc { .. }
            | Packet::Cyc { .. }
    )
}

/// The status event a PSB+ header packet restates (TSX state, CR3, VMCS, core:bus ratio),
/// without its IP; `None` for other packets. For [`EventDecoder::decode_psb`] and
/// [`EventDecoder::quiet_psb`] alike.
fn header_status(packet: &Packet) -> Option<EventKind> {
    Some(match *packet {
        Packet::ModeTsx(tsx) => EventKind::Tsx {
            speculative: tsx.intx,
            aborted: tsx.abrt,
            ip: 0,
        },
        Packet::Pip(pip) => EventKind::AsyncPaging {
            cr3: pip.cr3,
            non_root: pip.nr,
            ip: 0,
        },
        Packet::Vmcs { base } => EventKind::AsyncVmcs { base, ip: 0 },
        Packet::Cbr { ratio } => EventKind::Cbr { ratio },
        _ => return None,
    })
}

/// The most status events of a quiet PSB+ ([`EventDecoder::quiet_psb`]; the queue
/// holds 14).
pub(crate) const QUIET_MAX: usize = 8;

/// The status events of a quiet PSB+, in the order the general path publishes them
/// ([`EventDecoder::quiet_psb`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuietPsb {
    kinds: [EventKind; QUIET_MAX],
    len: usize,
    /// The time and flags every one of them has.
    time: Event,
}

impl Default for QuietPsb {
    fn default() -> Self {
        Self {
            kinds: [EventKind::Ignore; QUIET_MAX],
            len: 0,
            time: Event::new(EventKind::Ignore),
        }
    }
}

impl QuietPsb {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The `i`-th event, as `decode_psbend` publishes it.
    pub fn event(&self, i: usize) -> Option<Event> {
        let kind = *self.kinds.get(..self.len)?.get(i)?;
        Some(Event {
            kind,
            ip_suppressed: !matches!(kind, EventKind::Cbr { .. }),
            ..self.time
        })
    }
}

/// A read-ahead position the decoder may resume from.
struct Ahead<'a> {
    pkt: PacketDecoder<'a>,
    time: Time,
    tcal: TimeCal,
}

impl<'a> EventDecoder<'a> {
    fn status_event(kind: EventKind) -> Event {
        let mut event = Event::new(kind);
        event.status_update = true;
        event
    }

    /// Decodes PSB+ up to its PSBEND (or OVF), queueing the status events.
    pub(crate) fn decode_psb(&mut self) -> Result<Step, FlowError> {
        if self.evq.pending(binding::ALL) {
            return Err(FlowError::BadContext);
        }
        self.psb_timing = (self.time, self.tcal);
        self.ip.reset();
        self.enabled = false;
        // The enabled/disabled status goes first; which one it is shows at PSBEND.
        let status = self.evq.push(
            binding::PSBEND,
            Self::status_event(EventKind::Disabled { ip: 0 }),
        )?;
        loop {
            self.fetch_packet();
            let Some((_, packet, _)) = self.packet else {
                return Err(self.status.err().unwrap_or(FlowError::Internal));
            };
            match packet {
                Packet::Fup(ip) => self.header_fup(ip)?,
                Packet::ModeExec(mode) => self.header_mode_exec(mode)?,
                Packet::ModeTsx(_)
                | Packet::Pip(_)
                | Packet::Vmcs { .. }
                | Packet::Cbr { .. }
                | Packet::Tsc { .. }
                | Packet::Tma { .. }
                | Packet::Mtc { .. }
                | Packet::Cyc { .. } => {
                    if is_timing(&packet) {
                        self.apply_timing(&packet, true)?;
                    }
                    if let Some(kind) = header_status(&packet) {
                        self.evq.push(binding::PSBEND, Self::status_event(kind))?;
                    }
                }
                Packet::Mnt { payload } => {
                    self.evq
                        .enqueue(binding::PSBEND, EventKind::Mnt { payload })?;
                }
                Packet::PsbEnd => {
                    let enabled = self.enabled;
                    let event = self.evq.get_mut(status).ok_or(FlowError::Internal)?;
                    if enabled {
                        event.kind = EventKind::Enabled {
                            ip: 0,
                            resumed: false,
                        };
                    } else {
                        event.ip_suppressed = true;
                    }
                    return Ok(Step::More);
                }
                Packet::Ovf => {
                    // Without a FUP, the OVF reports the state; drop the status event.
                    if self.enabled {
                        let event = self.evq.get_mut(status).ok_or(FlowError::Internal)?;
                        event.kind = EventKind::Enabled {
                            ip: 0,
                            resumed: false,
                        };
                    } else if self.evq.peek(binding::PSBEND) == Some(status) {
                        self.evq.remove(status);
                    } else {
                        return Err(FlowError::Internal);
                    }
                    return Ok(Step::More);
                }
                Packet::Pad | Packet::Corrupted => {}
                _ => return Err(FlowError::BadContext),
            }
        }
    }

    /// The next PSB+ whole, where it is a quiet one, into `out`: the same status
    /// events, time and position as [`Self::decode_psb`] and the
    /// [`Self::decode_psbend`]s that publish them would give, without the queue. False
    /// (nothing changed) unless the current packet is the PSBEND of a header whose
    /// events are all taken, PADs at most lead to a PSB, and its header holds only
    /// MODE.TSX, PIP, VMCS, CBR, timing packets and PADs (no FUP: tracing stays off; no
    /// MODE.EXEC, MNT or OVF), at most [`QUIET_MAX`] events, and every packet reads and
    /// times as the general path would have it (the same packet reader and clock).
    ///
    /// Why: a KVM-PT trace writes a PSB+ every few hundred bytes while tracing is off
    /// (qemu's real trace: 13,000 of them between TIP.PGD and TIP.PGE), and published
    /// one by one through the queue and the flow layer they were a quarter of its
    /// decode. For `Branches`' quiet stretches (`branches_idle.rs`).
    pub(crate) fn quiet_psb(&mut self, out: &mut QuietPsb) -> bool {
        if !matches!(self.packet, Some((_, Packet::PsbEnd, _)))
            || self.event.is_some()
            || !self.evq.is_empty()
        {
            return false;
        }
        // A look at the bytes first: most calls are at the end of a quiet stretch.
        let trace = self.pkt.trace();
        let next = skip_pad_runs(trace, self.pkt.position());
        if !trace.get(next..).is_some_and(is_psb) {
            return false;
        }
        let mut pkt = self.pkt.clone();
        pkt.seek(next);
        if !matches!(
            pkt.next_decoded(),
            Some(Ok((
                _,
                Decoded {
                    packet: Packet::Psb,
                    ..
                }
            )))
        ) {
            return false;
        }
        let (mut time, mut tcal) = (self.time, self.tcal);
        // The enabled/disabled status first, as `decode_psb` queues it.
        out.kinds[0] = EventKind::Disabled { ip: 0 };
        out.len = 1;
        let end = loop {
            pkt.skip_pads();
            // (BBP, BIP and BEP, which `read_packet` puts back, end the batch too.)
            let Some(Ok((offset, Decoded { packet, size }))) = pkt.next_decoded() else {
                return false;
            };
            if is_timing(&packet)
                && apply_timing(&mut time, &mut tcal, &self.config.timing, &packet, true).is_err()
            {
                return false;
            }
            let kind = match packet {
                Packet::PsbEnd => break (offset, packet, size),
                Packet::Pad | Packet::Corrupted => continue,
                _ => match header_status(&packet) {
                    Some(kind) => kind,
                    None if is_timing(&packet) => continue,
                    None => return false,
                },
            };
            let Some(slot) = out.kinds.get_mut(out.len) else {
                return false;
            };
            *slot = kind;
            out.len += 1;
        };
        // As `decode_psb` then the `decode_psbend`s leave it.
        self.psb_timing = (self.time, self.tcal);
        self.ip.reset();
        self.enabled = false;
        self.time = time;
        self.tcal = tcal;
        self.pkt = pkt;
        self.packet = Some(end);
        self.status = Ok(());
        self.bound = false;
        // Every event has the time after the header (`decode_psbend` sets it). Tracing
        // is off: the disable is without an IP (PSBEND), and the events with an IP
        // field have none (the last IP was reset); a CBR has no IP.
        out.time = Event::new(EventKind::Ignore);
        out.time.status_update = true;
        self.set_time(&mut out.time);
        true
    }

    fn header_fup(&mut self, payload: IpPayload) -> Result<(), FlowError> {
        let mut enabled = has_ip(payload);
        // BDM70: a PSB+ right before a TIP.PGE may carry a stale FUP.
        if self.config.errata().bdm70 && self.check_bdm70()? {
            enabled = false;
        }
        self.enabled = enabled;
        if enabled {
            self.update_ip(payload);
        }
        Ok(())
    }

    fn check_bdm70(&self) -> Result<bool, FlowError> {
        let mut pkt = self.pkt.clone();
        loop {
            match read_packet(&mut pkt) {
                Err(FlowError::Eos) => return Ok(false),
                Err(err) => return Err(err),
                Ok((_, Packet::TipPge(_), _)) => return Ok(true),
                Ok((
                    _,
                    Packet::Pad
                    | Packet::Tsc { .. }
                    | Packet::Cbr { .. }
                    | Packet::PsbEnd
                    | Packet::Pip(_)
                    | Packet::ModeExec(_)
                    | Packet::ModeTsx(_)
                    | Packet::Vmcs { .. }
                    | Packet::Tma { .. }
                    | Packet::Mtc { .. }
                    | Packet::Cyc { .. }
                    | Packet::Mnt { .. },
                    _,
                )) => {}
                Ok(_) => return Ok(false),
            }
        }
    }

    fn header_mode_exec(&mut self, mode: packet::ModeExec) -> Result<(), FlowError> {
        if self.exec.valid {
            let bits = self.exec.bits;
            if (self.config.iflags_events && bits.iflag != mode.iflag)
                || bits.csd != mode.csd
                || bits.csl != mode.csl
            {
                return Err(FlowError::BadStatusUpdate);
            }
        } else {
            self.exec.valid = true;
            self.exec.bits = mode;
        }
        self.evq.push(
            binding::PSBEND,
            Self::status_event(EventKind::ExecMode {
                mode: mode.exec_mode(),
                ip: 0,
            }),
        )?;
        if self.config.iflags_events {
            self.evq.push(
                binding::PSBEND,
                Self::status_event(EventKind::Iflags {
                    iflag: mode.iflag,
                    ip: 0,
                }),
            )?;
        }
        Ok(())
    }

    /// Publishes the next PSB+ status event (the current packet is PSBEND or OVF).
    pub(crate) fn decode_psbend(&mut self) -> Result<Step, FlowError> {
        let Some(mut event) = self.evq.dequeue(binding::PSBEND) else {
            return Ok(Step::More);
        };
        match event.kind {
            EventKind::Enabled { .. }
            | EventKind::ExecMode { .. }
            | EventKind::Iflags { .. }
            | EventKind::Tsx { .. }
            | EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. } => self.set_ip(&mut event),
            EventKind::Disabled { .. } | EventKind::Cbr { .. } | EventKind::Mnt { .. } => {}
            _ => return Err(FlowError::BadContext),
        }
        self.set_time(&mut event);
        self.event = Some(event);
        Ok(Step::Event)
    }

    pub(crate) fn decode_ovf(&mut self) -> Result<Step, FlowError> {
        // An OVF ends PSB+ like PSBEND does.
        if self.decode_psbend()? == Step::Event {
            return Ok(Step::Event);
        }
        // Publish other pending events unless tracing is on (they can't be placed then).
        while !self.enabled {
            let bind =
                binding::FUP_BOUND | binding::FUP | binding::TIP | binding::EXSTOP | binding::PWRX;
            let Some(mut event) = self.evq.dequeue(bind) else {
                break;
            };
            match event.kind {
                EventKind::Pwre { .. } | EventKind::Rsm { .. } | EventKind::Sipi { .. } => {}
                EventKind::Exstop { .. }
                | EventKind::Mwait { .. }
                | EventKind::Ptwrite { .. }
                | EventKind::Tsx { .. }
                | EventKind::ExecMode { .. }
                | EventKind::Iflags { .. }
                | EventKind::Interrupt { .. }
                | EventKind::Iret { .. }
                | EventKind::Smi { .. }
                | EventKind::Init { .. }
                | EventKind::Vmentry { .. }
                | EventKind::Vmexit { .. }
                | EventKind::Shutdown { .. }
                | EventKind::Uintr { .. }
                | EventKind::Uiret { .. }
                | EventKind::Trig { .. }
                | EventKind::Swintr { .. }
                | EventKind::Syscall { .. } => event.ip_suppressed = true,
                _ => continue,
            }
            self.event = Some(event);
            return Ok(Step::Event);
        }
        // Start over, keeping time (and, on request, the calibration).
        let (time, mut tcal) = (self.time, self.tcal);
        self.reset_state();
        self.time = time;
        if self.config.keep_tcal_on_ovf {
            tcal.update_ovf();
            self.tcal = tcal;
        }
        let errata = self.config.errata();
        match find_ovf_fup(&self.pkt) {
            Ok(offset) if offset > 0 => {
                // APL12: a FUP may follow even though tracing resumed disabled.
                if errata.apl12
                    && let Some(step) = self.handle_apl12(offset)?
                {
                    return Ok(step);
                }
                let event = self.timed(EventKind::Overflow { ip: 0 });
                self.evq.push(binding::FUP_BOUND, event)?;
                Ok(Step::More)
            }
            found => {
                // SKD010: the FUP may be missing although tracing resumed enabled.
                if errata.skd010
                    && let Some(step) = self.handle_skd010()?
                {
                    return Ok(step);
                }
                // APL11: an extra TIP.PGD may follow.
                if errata.apl11
                    && found == Err(FlowError::BadContext)
                    && let Some(step) = self.handle_apl11()?
                {
                    return Ok(step);
                }
                if let Err(err) = found
                    && err != FlowError::Eos
                {
                    return Err(err);
                }
                let mut event = self.timed(EventKind::Overflow { ip: 0 });
                event.ip_suppressed = true;
                Ok(self.publish_and_fetch(event))
            }
        }
    }

    /// An overflow that resolved at `payload`'s IP; decoding goes on from `ahead` with
    /// `packet` current.
    fn recover_ovf_at_ip(&mut self, ahead: Ahead<'a>, packet: Read, payload: IpPayload) -> Step {
        self.update_ip(payload);
        // The overflow keeps the time of the OVF.
        let mut event = self.timed(EventKind::Overflow { ip: 0 });
        self.resume_from(ahead, packet);
        self.enabled = true;
        self.set_ip(&mut event);
        self.event = Some(event);
        Step::Event
    }

    /// An overflow that resolved with tracing disabled; decoding goes on after `packet`.
    fn recover_ovf_disabled(&mut self, ahead: Ahead<'a>, packet: Read) -> Step {
        let mut event = self.timed(EventKind::Overflow { ip: 0 });
        event.ip_suppressed = true;
        self.resume_from(ahead, packet);
        self.publish_and_fetch(event)
    }

    fn resume_from(&mut self, ahead: Ahead<'a>, packet: Read) {
        let Ahead { pkt, time, tcal } = ahead;
        // The read-ahead decoder walks the same trace as ours.
        self.pkt.clone_from(&pkt);
        self.packet = Some(packet);
        self.time = time;
        self.tcal = tcal;
    }

    /// Skips `offset` bytes of packets (keeping time) and reports a disabled overflow.
    fn recover_ovf_at_offset(&mut self, offset: usize) -> Result<Step, FlowError> {
        let mut left = offset;
        loop {
            let read = read_packet(&mut self.pkt)?;
            self.packet = Some(read);
            let (_, packet, size) = read;
            if left <= size {
                if left < size {
                    return Err(FlowError::Internal);
                }
                break;
            }
            left -= size;
            match packet {
                Packet::ModeExec(_)
                | Packet::ModeTsx(_)
                | Packet::Pip(_)
                | Packet::Vmcs { .. }
                | Packet::Corrupted => {
                    return Err(FlowError::Internal);
                }
                _ if is_timing(&packet) => self.apply_timing(&packet, false)?,
                _ => {}
            }
        }
        let mut event = self.timed(EventKind::Overflow { ip: 0 });
        event.ip_suppressed = true;
        Ok(self.publish_and_fetch(event))
    }

    fn ahead(&self) -> Ahead<'a> {
        Ahead {
            pkt: self.pkt.clone(),
            time: self.time,
            tcal: self.tcal,
        }
    }

    /// SKD010: after an OVF without FUP, look for signs that tracing is in fact on.
    fn handle_skd010(&mut self) -> Result<Option<Step>, FlowError> {
        let mut ahead = self.ahead();
        let mut tsx: Option<(bool, bool)> = None;
        loop {
            let read = match read_packet(&mut ahead.pkt) {
                Err(FlowError::Eos) => return Ok(None),
                other => other?,
            };
            let packet = read.1;
            match packet {
                Packet::TipPge(_)
                | Packet::Tnt8(_)
                | Packet::Tnt64(_)
                | Packet::Ovf
                | Packet::Stop
                | Packet::Mwait(_)
                | Packet::Exstop { ip: true }
                | Packet::Ptw(packet::Ptw { ip: true, .. })
                | Packet::Cfe(packet::Cfe { ip: true, .. })
                | Packet::Corrupted => return Ok(None),
                Packet::ModeTsx(_) if tsx.is_some() => return Ok(None),
                Packet::ModeTsx(mode) => tsx = Some((mode.intx, mode.abrt)),
                Packet::TipPgd(_) => return Ok(Some(self.recover_ovf_disabled(ahead, read))),
                Packet::Fup(ip) => {
                    if let Some((speculative, aborted)) = tsx {
                        self.evq.enqueue(
                            binding::FUP_BOUND,
                            EventKind::Tsx {
                                speculative,
                                aborted,
                                ip: 0,
                            },
                        )?;
                    }
                    return Ok(Some(self.recover_ovf_at_ip(ahead, read, ip)));
                }
                Packet::Tip(ip) => {
                    let step = self.recover_ovf_at_ip(ahead, read, ip);
                    self.fetch_packet();
                    return Ok(Some(step));
                }
                Packet::Psb => {
                    return match find_header_fup(&ahead.pkt) {
                        Err(FlowError::Eos) | Ok(None) => Ok(None),
                        Err(err) => Err(err),
                        Ok(Some(fup)) => Ok(Some(self.recover_ovf_at_ip(ahead, read, fup))),
                    };
                }
                Packet::PsbEnd => return Err(FlowError::BadContext),
                _ if is_timing(&packet) => {
                    apply_timing(
                        &mut ahead.time,
                        &mut ahead.tcal,
                        &self.config.timing,
                        &packet,
                        false,
                    )?;
                }
                _ => {}
            }
        }
    }

    /// APL11: an OVF may be followed by a spurious TIP.PGD; resume after it, disabled.
    fn handle_apl11(&mut self) -> Result<Option<Step>, FlowError> {
        let mut ahead = self.ahead();
        loop {
            let read = read_packet(&mut ahead.pkt)?;
            let packet = read.1;
            match packet {
                Packet::TipPgd(_) => return Ok(Some(self.recover_ovf_disabled(ahead, read))),
                _ if is_timing(&packet) => {
                    apply_timing(
                        &mut ahead.time,
                        &mut ahead.tcal,
                        &self.config.timing,
                        &packet,
                        false,
                    )?;
                }
                Packet::Pad
                | Packet::Mnt { .. }
                | Packet::Cfe(_)
                | Packet::Evd(_)
                | Packet::Trig(_) => {}
                _ => return Ok(None),
            }
        }
    }

    /// APL12: a FUP `offset` bytes on may follow an overflow that resolved disabled.
    fn handle_apl12(&mut self, offset: usize) -> Result<Option<Step>, FlowError> {
        let mut pkt = self.pkt.clone();
        pkt.sync_set(self.pkt.position() + offset)
            .map_err(|_| FlowError::Internal)?;
        loop {
            let packet = match read_packet(&mut pkt) {
                Err(FlowError::Eos) => return Ok(None),
                other => other?.1,
            };
            match packet {
                Packet::Tnt8(_)
                | Packet::Tnt64(_)
                | Packet::Tip(_)
                | Packet::TipPgd(_)
                | Packet::PsbEnd
                | Packet::Ovf
                | Packet::Corrupted => return Ok(None),
                Packet::Psb => {
                    return match find_header_fup(&pkt) {
                        Ok(None) => self.recover_ovf_at_offset(offset).map(Some),
                        Err(FlowError::Eos) | Ok(Some(_)) => Ok(None),
                        Err(err) => Err(err),
                    };
                }
                Packet::Stop | Packet::TipPge(_) => {
                    return self.recover_ovf_at_offset(offset).map(Some);
                }
                _ => {}
            }
        }
    }
}
