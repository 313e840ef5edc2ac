//! Placing events in the instruction flow.
//!
//! In: a [`BlockDecoder`] whose current event is not a TIP/TNT, and the [`Block`] being
//! filled. Out: the block extended to where the event binds (an IP, the next
//! instruction of some kind such as MOV CR3 for a PIP, or the instruction a count of
//! instructions away for TRIG), and a [`Status`] saying the event is due. After a block
//! ends, [`BlockDecoder::proceed_trailing_event`] decides whether the next event binds
//! right here. Binding rules and errata work-arounds (SKD022, SKL014, BDM64) follow
//! libipt's block decoder.

use super::block::{Block, BlockDecoder, Status};
use super::insn::{self, Insn};
use crate::decode::pt::events::event::{EventKind, FlowError};

/// Proceeding result: reached the event's place, or not (yet), plus the last
/// instruction reached.
type Reached = (Result<bool, FlowError>, Option<Insn>);

/// Steps BDM64's check walks before it decides the event is out of reach.
const BDM64_MAX_STEPS: usize = 0x100;

impl BlockDecoder<'_> {
    /// Proceeds to where the current event binds; reports it as pending when reached.
    #[expect(
        clippy::too_many_lines,
        reason = "one arm per event type: the binding rules read best as one table"
    )]
    pub(crate) fn proceed_event(&mut self, block: &mut Block) -> Result<Status, FlowError> {
        let ev = self.event;
        let reached: Reached = match ev.kind {
            EventKind::Disabled { ip } => {
                if ev.status_update {
                    return Ok(self.status_flags(true));
                }
                let (result, last) = if ev.ip_suppressed {
                    let filter = self.config.events.filter;
                    if filter.is_used() && self.config.events.errata().skl014 {
                        self.proceed_skl014(block)
                    } else {
                        self.proceed_to_insn(block, Insn::changes_cr3)
                    }
                } else {
                    self.proceed_to_ip(block, ip)
                };
                match result {
                    Ok(true) => {}
                    Ok(false) => return Ok(Status::NONE),
                    // It also binds to the next branch that needs trace.
                    Err(FlowError::BadQuery) => self.set_disable_resume_ip(last.as_ref()),
                    Err(err) => return Err(err),
                }
                return Ok(self.status_flags(true));
            }
            EventKind::AsyncDisabled { at, .. } => {
                if !self.proceed_to_ip(block, at).0? {
                    return Ok(Status::NONE);
                }
                if self.config.events.errata().skd022 && self.handle_skd022() {
                    return self.proceed_event(block);
                }
                return Ok(self.status_flags(true));
            }
            EventKind::AsyncBranch { from, .. } => self.proceed_to_ip(block, from),
            EventKind::Paging { .. } | EventKind::Vmcs { .. } if !self.enabled => (Ok(true), None),
            EventKind::Paging { .. } => {
                return self.bind_to_insn(block, Insn::binds_to_pip, |b| b.bound.paging = true);
            }
            EventKind::Vmcs { .. } => {
                return self.bind_to_insn(block, Insn::binds_to_vmcs, |b| b.bound.vmcs = true);
            }
            EventKind::Exstop { ip } | EventKind::Mwait { ip, .. }
                if self.enabled && !ev.ip_suppressed =>
            {
                self.proceed_to_ip(block, ip)
            }
            EventKind::AsyncPaging { ip, .. }
            | EventKind::AsyncVmcs { ip, .. }
            | EventKind::ExecMode { ip, .. }
            | EventKind::Tsx { ip, .. }
            | EventKind::Iflags { ip, .. }
            | EventKind::Interrupt { ip, .. }
            | EventKind::Smi { ip }
            | EventKind::Init { ip }
            | EventKind::Vmexit { ip, .. }
            | EventKind::Shutdown { ip }
            | EventKind::Uintr { ip, .. }
                if !ev.ip_suppressed =>
            {
                self.proceed_to_ip(block, ip)
            }
            EventKind::Ptwrite { ip, .. } if self.enabled => {
                return self.bind_past(
                    block,
                    ev.ip_suppressed,
                    ip,
                    |i| i.class == insn::InsnClass::PtWrite,
                    |b| {
                        b.bound.ptwrite = true;
                    },
                );
            }
            EventKind::Iret { ip } if self.enabled => {
                return self.bind_past(block, ev.ip_suppressed, ip, Insn::is_iret, |b| {
                    b.bound.iret = true;
                });
            }
            EventKind::Vmentry { ip } if self.enabled => {
                return self.bind_past(block, ev.ip_suppressed, ip, Insn::is_vmentry, |b| {
                    b.bound.vmentry = true;
                });
            }
            EventKind::Uiret { ip } if self.enabled => {
                return self.bind_past(
                    block,
                    ev.ip_suppressed,
                    ip,
                    |i| i.kind == insn::InsnKind::Uiret,
                    |b| {
                        b.bound.uiret = true;
                    },
                );
            }
            EventKind::Swintr { ip, .. } if self.enabled => {
                return self.bind_at(block, ev.ip_suppressed, ip, Insn::is_swint, |b| {
                    b.bound.swintr = true;
                });
            }
            EventKind::Syscall { ip } if self.enabled => {
                return self.bind_at(block, ev.ip_suppressed, ip, Insn::is_syscall, |b| {
                    b.bound.syscall = true;
                });
            }
            EventKind::Trig { .. } => self.proceed_to_trig(block),
            EventKind::Tip { .. } | EventKind::Tnt { .. } => return Err(FlowError::Internal),
            _ => (Ok(true), None),
        };
        if !reached.0? {
            return Ok(Status::NONE);
        }
        Ok(self.status_flags(true))
    }

    /// Binds the event to the next instruction for which `pred` holds, postponing it.
    fn bind_to_insn(
        &mut self,
        block: &mut Block,
        pred: fn(&Insn) -> bool,
        mark: fn(&mut Self),
    ) -> Result<Status, FlowError> {
        let (result, last) = self.proceed_to_insn(block, pred);
        if !result? {
            return Ok(Status::NONE);
        }
        mark(self);
        self.postpone(last.ok_or(FlowError::Internal)?)
    }

    /// Binds to the next `pred` instruction (at `ip` if known) and passes beyond it.
    fn bind_past(
        &mut self,
        block: &mut Block,
        suppressed: bool,
        ip: u64,
        pred: fn(&Insn) -> bool,
        mark: fn(&mut Self),
    ) -> Result<Status, FlowError> {
        if suppressed {
            return self.bind_to_insn(block, pred, mark);
        }
        let (result, _) = self.proceed_to_ip(block, ip);
        if !result? {
            return Ok(Status::NONE);
        }
        let Some(insn) = self.proceed_one_insn(block)? else {
            return Ok(Status::NONE);
        };
        mark(self);
        self.postpone(insn)
    }

    /// Binds to the next `pred` instruction (at `ip` if known) without passing it: an
    /// asynchronous branch from that instruction may follow.
    fn bind_at(
        &mut self,
        block: &mut Block,
        suppressed: bool,
        ip: u64,
        pred: fn(&Insn) -> bool,
        mark: fn(&mut Self),
    ) -> Result<Status, FlowError> {
        if suppressed {
            return self.bind_to_insn(block, pred, mark);
        }
        let (result, last) = self.proceed_to_ip(block, ip);
        if !result? {
            return Ok(Status::NONE);
        }
        mark(self);
        match last {
            Some(insn) => self.postpone(insn),
            // Already there: nothing to proceed past.
            None => Ok(self.status_flags(true)),
        }
    }

    /// SKL014: a TIP.PGD with suppressed IP may come from a direct branch out of the
    /// filter region; find the branch whose target the filter excludes.
    fn proceed_skl014(&mut self, block: &mut Block) -> Reached {
        let filter = self.config.events.filter;
        loop {
            let (result, last) = self.proceed_to_insn(block, |insn| match insn.class {
                insn::InsnClass::Jump | insn::InsnClass::Call => insn.displacement.is_some(),
                insn::InsnClass::Other => insn.changes_cr3(),
                _ => false,
            });
            match result {
                Ok(true) => {}
                other => return (other, last),
            }
            let Some(insn) = last else {
                return (Err(FlowError::Internal), None);
            };
            if insn.changes_cr3() {
                return (Ok(true), last);
            }
            let target = match insn.next_ip() {
                Ok(target) => target,
                Err(err) => return (Err(err), last),
            };
            if !filter.allows(target) {
                return (Ok(true), last);
            }
            self.ip = target;
            if self.ends_block(&insn) {
                return (Ok(true), last);
            }
        }
    }

    /// SKD022: an asynchronous disable at VMLAUNCH/VMRESUME may really be synchronous.
    /// Turns the event into a disable and says so.
    pub(crate) fn handle_skd022(&mut self) -> bool {
        let EventKind::AsyncDisabled { at, ip } = self.event.kind else {
            return false;
        };
        match insn::decode(self.image, at, self.mode) {
            Ok(insn) if insn.is_vmentry() => {
                self.event.kind = EventKind::Disabled { ip };
                true
            }
            _ => false,
        }
    }

    /// Fills in a TRIG event's anchor IP and remaining count from the current position.
    pub(crate) fn provide_trig_anchor(&mut self) -> Result<(), FlowError> {
        let suppressed = self.event.ip_suppressed;
        let EventKind::Trig { icnt, ip, .. } = &mut self.event.kind else {
            return Err(FlowError::Internal);
        };
        if suppressed {
            return Err(FlowError::Internal);
        }
        if *ip != 0 {
            return Ok(());
        }
        let done = self.icnt.ok_or(FlowError::BadPacket)?;
        let done = u16::try_from(done).map_err(|_| FlowError::BadPacket)?;
        if *icnt < done {
            return Err(FlowError::BadPacket);
        }
        *icnt -= done;
        *ip = self.ip;
        Ok(())
    }

    fn trig_state(&self) -> (u16, u64) {
        match self.event.kind {
            EventKind::Trig { icnt, ip, .. } => (icnt, ip),
            _ => (0, 0),
        }
    }

    fn proceed_to_trig(&mut self, block: &mut Block) -> Reached {
        if self.event.ip_suppressed {
            return (Ok(true), None);
        }
        if let Err(err) = self.provide_trig_anchor() {
            return (Err(err), None);
        }
        let (icnt, anchor) = self.trig_state();
        if !self.enabled {
            // With tracing off, the IP is already precise.
            return (
                if icnt == 0 {
                    Err(FlowError::Internal)
                } else {
                    Ok(true)
                },
                None,
            );
        }
        let reached = self.proceed_to_ip(block, anchor);
        if !matches!(reached.0, Ok(true)) {
            return reached;
        }
        let mut last = reached.1;
        while self.trig_state().0 != 0 {
            let insn = match self.proceed_one_insn(block) {
                Ok(Some(insn)) => insn,
                Ok(None) => return (Ok(false), last),
                Err(err) => return (Err(err), last),
            };
            last = Some(insn);
            match insn.next_ip() {
                Ok(ip) => self.ip = ip,
                Err(err) => return (Err(err), last),
            }
            let next = self.ip;
            if let EventKind::Trig { icnt, ip, .. } = &mut self.event.kind {
                *ip = next;
                *icnt -= 1;
            }
        }
        (Ok(true), last)
    }

    /// BDM64: a transaction abort right after a branch may corrupt that branch's trace.
    /// If the abort's IP can't be reached from here, pretend the branch went there.
    fn handle_bdm64(&mut self, block: &Block, tsx_ip: u64) {
        let aborted = matches!(self.event.kind, EventKind::Tsx { aborted: true, .. });
        if !aborted || block.ninsn == 0 {
            return;
        }
        let Ok(last) = insn::decode(self.image, block.end_ip, block.mode) else {
            return;
        };
        if !last.is_branch() {
            return;
        }
        if self.range_is_contiguous(self.ip, tsx_ip) != Ok(true) {
            self.ip = tsx_ip;
        }
    }

    /// Whether `end` is reached from `begin` without trace within a few steps.
    fn range_is_contiguous(&self, begin: u64, end: u64) -> Result<bool, FlowError> {
        let mut ip = begin;
        for _ in 0..BDM64_MAX_STEPS {
            if ip == end {
                return Ok(true);
            }
            ip = insn::decode(self.image, ip, self.mode)?.next_ip()?;
        }
        Ok(ip == end)
    }

    /// Whether a TSX event after `block` must wait (it binds further on).
    pub(crate) fn postpone_trailing_tsx(&mut self, block: Option<&Block>) -> bool {
        let EventKind::Tsx { ip, .. } = self.event.kind else {
            return false;
        };
        if self.event.ip_suppressed {
            return false;
        }
        if let Some(block) = block
            && self.config.events.errata().bdm64
        {
            self.handle_bdm64(block, ip);
        }
        self.ip != ip
    }
}
