//! Events at the end of a block, reporting them, and resynchronizing after errors.
//!
//! In: a [`BlockDecoder`] that just ended a block (or reported an event, or synced).
//! Out: whether the next event binds right here ([`BlockDecoder::proceed_trailing_event`]),
//! the event itself with its effect on the decoder applied ([`BlockDecoder::next_event`]:
//! tracing on/off, new IP after an asynchronous branch, execution mode, TSX state), and
//! [`BlockDecoder::resync`], which finds a place to go on after a decode error without
//! skipping to the next PSB when an event gives a usable IP.

use super::block::{Block, BlockDecoder, Status};
use super::insn::{Insn, InsnClass, InsnKind};
use crate::decode::pt::events::event::{Event, EventKind, FlowError};
use crate::decode::pt::packets::packet::ExecMode;

impl BlockDecoder<'_> {
    /// Checks whether the next event binds at the current IP.
    pub(crate) fn proceed_trailing_event(
        &mut self,
        block: Option<&Block>,
    ) -> Result<Status, FlowError> {
        if let Err(err) = self.status {
            self.proceed_postponed()?;
            // Let the caller ask for the error as an event, unless it is the end.
            return Ok(self.status_flags(err != FlowError::Eos));
        }
        let ev = self.event;
        let pending = self.status_flags(true);
        let enabled = self.enabled;
        match ev.kind {
            EventKind::Tnt { size, .. } => {
                let tick =
                    self.config.tick_events && block.is_some() && ev.has_tsc && ev.tsc != self.tsc;
                if !tick {
                    if size != 0 {
                        return self.finish_trailing();
                    }
                    // All bits used: move on (postponed to allow a tick on 1-bit TNTs).
                    self.fetch_event()?;
                    return self.proceed_trailing_event(block);
                }
                let class = block.map_or(InsnClass::Unknown, |b| b.class);
                if class != InsnClass::CondJump && class != InsnClass::Return {
                    return self.finish_trailing();
                }
                Ok(pending)
            }
            EventKind::Tip { .. } => self.finish_trailing(),
            EventKind::Disabled { ip } => {
                let Some(insn) = self.postponed else {
                    if ev.status_update {
                        return Ok(pending);
                    }
                    return self.finish_trailing();
                };
                // A synchronous disable may bind to a CR3-changing instruction, or to
                // the next branch that needs trace.
                if ev.ip_suppressed && insn.changes_cr3() {
                    return Ok(pending);
                }
                match insn.next_ip() {
                    Err(FlowError::BadQuery) => {
                        self.set_disable_resume_ip(Some(&insn));
                        return Ok(pending);
                    }
                    Err(err) => return Err(err),
                    Ok(next) => self.ip = next,
                }
                self.clear_postponed();
                if !ev.ip_suppressed && self.ip == ip {
                    return Ok(pending);
                }
                self.finish_trailing()
            }
            EventKind::Paging { .. } => {
                self.bind_trailing(enabled, |b| &mut b.bound.paging, Insn::binds_to_pip, true)
            }
            EventKind::Vmcs { .. } => {
                self.bind_trailing(enabled, |b| &mut b.bound.vmcs, Insn::binds_to_vmcs, true)
            }
            EventKind::Ptwrite { .. } => self.bind_trailing(
                enabled,
                |b| &mut b.bound.ptwrite,
                |i| i.class == InsnClass::PtWrite,
                ev.ip_suppressed,
            ),
            EventKind::Iret { .. } => self.bind_trailing(
                enabled,
                |b| &mut b.bound.iret,
                Insn::is_iret,
                ev.ip_suppressed,
            ),
            EventKind::Vmentry { .. } => self.bind_trailing(
                enabled,
                |b| &mut b.bound.vmentry,
                Insn::is_vmentry,
                ev.ip_suppressed,
            ),
            EventKind::Uiret { .. } => self.bind_trailing(
                enabled,
                |b| &mut b.bound.uiret,
                |i| i.kind == InsnKind::Uiret,
                ev.ip_suppressed,
            ),
            EventKind::Swintr { .. } => self.bind_trailing(
                enabled,
                |b| &mut b.bound.swintr,
                Insn::is_swint,
                ev.ip_suppressed,
            ),
            EventKind::Syscall { .. } => self.bind_trailing(
                enabled,
                |b| &mut b.bound.syscall,
                Insn::is_syscall,
                ev.ip_suppressed,
            ),
            _ => {
                // Events that do not bind to an instruction: first proceed past one
                // that is postponed.
                self.proceed_postponed()?;
                if self.binds_here(block)? {
                    return Ok(self.status_flags(true));
                }
                self.finish_trailing()
            }
        }
    }

    /// No event here: proceed past any postponed instruction.
    fn finish_trailing(&mut self) -> Result<Status, FlowError> {
        self.proceed_postponed()?;
        Ok(self.status_flags(false))
    }

    /// An event that binds to the postponed instruction when it is of the right kind
    /// (at most one of each kind per instruction); applied at once when tracing is off.
    fn bind_trailing(
        &mut self,
        enabled: bool,
        flag: fn(&mut Self) -> &mut bool,
        pred: fn(&Insn) -> bool,
        eligible: bool,
    ) -> Result<Status, FlowError> {
        if !enabled {
            return Ok(self.status_flags(true));
        }
        let Some(insn) = self.postponed else {
            return self.finish_trailing();
        };
        if *flag(self) || !eligible || !pred(&insn) {
            return self.finish_trailing();
        }
        *flag(self) = true;
        Ok(self.status_flags(true))
    }

    /// For events that don't bind to an instruction: whether the current one is due here.
    fn binds_here(&mut self, block: Option<&Block>) -> Result<bool, FlowError> {
        let ev = self.event;
        let here = |ip: u64| ev.ip_suppressed || ip == self.ip;
        let on_or_here = |ip: u64| !self.enabled || here(ip);
        Ok(match ev.kind {
            EventKind::Tick { .. }
            | EventKind::Enabled { .. }
            | EventKind::Overflow { .. }
            | EventKind::Stop
            | EventKind::Pwre { .. }
            | EventKind::Pwrx { .. }
            | EventKind::Cbr { .. }
            | EventKind::Mnt { .. } => true,
            EventKind::AsyncDisabled { at, .. } => {
                if self.ip != at {
                    return Ok(false);
                }
                // SKD022 turns it into a disable, reported on the next block call.
                !(self.config.events.errata().skd022 && self.handle_skd022())
            }
            EventKind::AsyncBranch { from, .. } => self.ip == from,
            EventKind::AsyncPaging { ip, .. } | EventKind::AsyncVmcs { ip, .. } => here(ip),
            EventKind::Tsx { .. } => !self.postpone_trailing_tsx(block),
            EventKind::Exstop { ip } | EventKind::Mwait { ip, .. } => {
                ev.ip_suppressed || !self.enabled || ip == self.ip
            }
            EventKind::ExecMode { ip, .. }
            | EventKind::Iflags { ip, .. }
            | EventKind::Interrupt { ip, .. }
            | EventKind::Smi { ip }
            | EventKind::Init { ip }
            | EventKind::Vmexit { ip, .. }
            | EventKind::Shutdown { ip }
            | EventKind::Uintr { ip, .. } => on_or_here(ip),
            EventKind::Rsm { .. } | EventKind::Sipi { .. } => {
                if !ev.ip_suppressed {
                    return Err(FlowError::Internal);
                }
                true
            }
            EventKind::Trig { .. } => {
                if !self.enabled || ev.ip_suppressed {
                    return Ok(true);
                }
                self.provide_trig_anchor()?;
                let EventKind::Trig { icnt, ip, .. } = self.event.kind else {
                    return Err(FlowError::Internal);
                };
                if icnt != 0 {
                    return Ok(false);
                }
                if ip != self.ip {
                    return Err(FlowError::BadPacket);
                }
                true
            }
            _ => false,
        })
    }

    /// The pending event, applied to the decoder; the status says what comes next.
    pub fn next_event(&mut self) -> Result<(Event, Status), FlowError> {
        self.status?;
        if let EventKind::Tnt { size, .. } = self.event.kind {
            return self.tick_event(size);
        }
        self.apply_event()?;
        let event = self.event;
        self.fetch_event()?;
        let status = self.proceed_trailing_event(None)?;
        Ok((event, status))
    }

    /// What the pending event (not a TNT) does to the decoder: tracing on or off, a new
    /// IP, execution mode, TSX state, core:bus ratio; an error where it does not fit.
    /// The first half of [`Self::next_event`], also run by the product path's quiet
    /// PSB+ batches (`branches_idle.rs`).
    pub(crate) fn apply_event(&mut self) -> Result<(), FlowError> {
        let ip_matches = |ev: &Event, ip: u64, current: u64| ev.ip_suppressed || ip == current;
        let ev = self.event;
        let ev = &ev;
        let (current, enabled) = (self.ip, self.enabled);
        match ev.kind {
            EventKind::Enabled { ip, .. } => {
                if ip == current {
                    self.event.kind = EventKind::Enabled { ip, resumed: true };
                }
                self.process_enabled()?;
            }
            EventKind::AsyncDisabled { at, .. } => {
                if current != at {
                    return Err(FlowError::BadQuery);
                }
                self.process_disabled()?;
            }
            EventKind::Disabled { .. } => self.process_disabled()?,
            EventKind::AsyncBranch { from, to } => {
                if current != from {
                    return Err(FlowError::BadQuery);
                }
                if ev.status_update || !enabled {
                    return Err(FlowError::BadContext);
                }
                self.ip = to;
            }
            EventKind::AsyncPaging { ip, .. } | EventKind::AsyncVmcs { ip, .. }
                if !ip_matches(ev, ip, current) =>
            {
                return Err(FlowError::BadQuery);
            }
            EventKind::Overflow { ip } => {
                if ev.status_update {
                    return Err(FlowError::BadContext);
                }
                // Suppressed: the overflow resolved with tracing off.
                self.enabled = !ev.ip_suppressed;
                self.ip = if ev.ip_suppressed { 0 } else { ip };
                self.speculative = false;
            }
            EventKind::ExecMode { mode, ip } => {
                if enabled && !ip_matches(ev, ip, current) {
                    return Err(FlowError::BadQuery);
                }
                if ev.status_update
                    && enabled
                    && self.mode != ExecMode::Unknown
                    && self.mode != mode
                {
                    return Err(FlowError::BadStatusUpdate);
                }
                self.mode = mode;
            }
            EventKind::Tsx {
                speculative, ip, ..
            } => {
                if !ip_matches(ev, ip, current) {
                    return Err(FlowError::BadQuery);
                }
                self.speculative = speculative;
            }
            EventKind::Stop if ev.status_update || enabled => {
                return Err(FlowError::BadContext);
            }
            EventKind::Cbr { ratio } => self.cbr = Some(ratio),
            EventKind::Tip { .. } => return Err(FlowError::BadQuery),
            EventKind::Exstop { ip }
            | EventKind::Mwait { ip, .. }
            | EventKind::Iflags { ip, .. }
            | EventKind::Interrupt { ip, .. }
            | EventKind::Smi { ip }
            | EventKind::Init { ip }
            | EventKind::Vmexit { ip, .. }
            | EventKind::Shutdown { ip }
            | EventKind::Uintr { ip, .. }
            | EventKind::Trig { ip, .. }
            | EventKind::Swintr { ip, .. }
            | EventKind::Syscall { ip }
                if enabled && !ip_matches(ev, ip, current) =>
            {
                return Err(FlowError::BadQuery);
            }
            EventKind::Rsm { .. } | EventKind::Sipi { .. } if !ev.ip_suppressed => {
                return Err(FlowError::Internal);
            }
            _ => {}
        }
        Ok(())
    }

    /// A tick event at the first used bit of a TNT that came with new time.
    fn tick_event(&mut self, size: u8) -> Result<(Event, Status), FlowError> {
        let tnt = self.event;
        if !self.config.tick_events || !tnt.has_tsc || tnt.tsc == self.tsc {
            return Err(FlowError::BadQuery);
        }
        let mut tick = Event::new(EventKind::Tick { ip: self.ip });
        tick.has_tsc = true;
        tick.tsc = tnt.tsc;
        tick.lost_mtc = tnt.lost_mtc;
        tick.lost_cyc = tnt.lost_cyc;
        // The TNT stays current; its time now counts as seen.
        self.has_tsc = true;
        self.tsc = tnt.tsc;
        self.lost_mtc = tnt.lost_mtc;
        self.lost_cyc = tnt.lost_cyc;
        if size == 0 {
            self.fetch_event()?;
        }
        let status = self.proceed_trailing_event(None)?;
        Ok((tick, status))
    }

    fn process_enabled(&mut self) -> Result<(), FlowError> {
        let ev = self.event;
        if ev.status_update {
            return if self.enabled {
                Ok(())
            } else {
                Err(FlowError::BadStatusUpdate)
            };
        }
        if ev.ip_suppressed {
            return Err(FlowError::NoIp);
        }
        if self.enabled {
            return Err(FlowError::BadContext);
        }
        self.ip = ev.kind.ip().unwrap_or(0);
        self.enabled = true;
        Ok(())
    }

    fn process_disabled(&mut self) -> Result<(), FlowError> {
        if self.event.status_update {
            return if self.enabled {
                Err(FlowError::BadStatusUpdate)
            } else {
                Ok(())
            };
        }
        if !self.enabled {
            return Err(FlowError::BadContext);
        }
        // Keep the IP: tracing may resume there.
        self.enabled = false;
        if self.icnt.is_some() {
            self.icnt = Some(0);
        }
        Ok(())
    }

    /// Finds a place to go on after an error: an event with an IP, or the PSB before.
    pub fn resync(&mut self) -> Result<Status, FlowError> {
        self.clear_postponed();
        let exact_only = self.config.resync_exact_only;
        if exact_only {
            self.evdec.doubt_ip();
        }
        loop {
            self.status?;
            let ev = self.event;
            if ev.status_update {
                let offset = self.evdec.sync_offset();
                // The product path keeps the time over the recovery: timing packets do
                // not depend on the flow that failed, and a decode started at this PSB
                // (a parallel worker) has it too. libipt's starts over.
                if exact_only {
                    let timing = self.evdec.psb_timing();
                    return self.sync_set_timed(offset, Some(timing));
                }
                return self.sync_set(offset);
            }
            let ip = ev.kind.ip().filter(|_| !ev.ip_suppressed);
            if exact_only && ip.is_some() && ev.ip_exact_epoch != Some(self.evdec.ip_epoch()) {
                // Its address may be made of a lost place's high bits: not a place to
                // resume at.
                self.fetch_event()?;
                continue;
            }
            let pending = |this: &Self| this.status_flags(true);
            match ev.kind {
                EventKind::Enabled { .. } => {
                    self.enabled = false;
                    return Ok(pending(self));
                }
                EventKind::Disabled { .. } => {
                    self.enabled = true;
                    self.ip = 0;
                    self.process_disabled()?;
                    self.fetch_event()?;
                    return self.proceed_trailing_event(None);
                }
                EventKind::AsyncDisabled { at, .. } => {
                    self.ip = at;
                    if !(self.config.events.errata().skd022 && self.handle_skd022()) {
                        return Ok(pending(self));
                    }
                }
                EventKind::AsyncBranch { from, .. } => {
                    self.ip = from;
                    return Ok(pending(self));
                }
                EventKind::Overflow { .. } => return Ok(pending(self)),
                EventKind::ExecMode { .. }
                | EventKind::Tsx { .. }
                | EventKind::Iflags { .. }
                | EventKind::Interrupt { .. } => {
                    self.enabled = ip.is_some();
                    if let Some(ip) = ip {
                        self.ip = ip;
                    }
                    return Ok(pending(self));
                }
                EventKind::Ptwrite { .. } if ip.is_none() => return Err(FlowError::EventIgnored),
                EventKind::Ptwrite { .. } | EventKind::Vmentry { .. } | EventKind::Uiret { .. }
                    if ip.is_some() =>
                {
                    // These are reported after their instruction.
                    self.ip = ip.unwrap_or(0);
                    return Ok(self.status_flags(false));
                }
                EventKind::Tip { ip: target } => {
                    self.ip = target;
                    self.fetch_event()?;
                    return self.proceed_trailing_event(None);
                }
                EventKind::AsyncPaging { .. }
                | EventKind::AsyncVmcs { .. }
                | EventKind::Exstop { .. }
                | EventKind::Mwait { .. }
                | EventKind::Tick { .. }
                | EventKind::Iret { .. }
                | EventKind::Smi { .. }
                | EventKind::Rsm { .. }
                | EventKind::Init { .. }
                | EventKind::Vmexit { .. }
                | EventKind::Shutdown { .. }
                | EventKind::Uintr { .. }
                | EventKind::Swintr { .. }
                | EventKind::Syscall { .. }
                    if ip.is_some() =>
                {
                    self.ip = ip.unwrap_or(0);
                    return Ok(pending(self));
                }
                // The TNTs after it are dropped too: past them at once.
                EventKind::Tnt { .. } => self.evdec.skip_tnt_run(),
                _ => {}
            }
            self.fetch_event()?;
        }
    }

    /// The instruction an event is postponed on (for diagnostics).
    pub fn postponed_insn(&self) -> Option<&Insn> {
        self.postponed.as_ref()
    }
}
