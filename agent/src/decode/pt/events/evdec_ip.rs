//! The event layer for IP packets: FUP, TIP, TIP.PGE and TIP.PGD.
//!
//! In: an [`EventDecoder`] whose current packet carries an IP. Out: the events that
//! packet completes: those waiting for a FUP (overflow, TSX, EXSTOP/MWAIT, PTWRITE,
//! CFE events ...), the asynchronous branch a lone FUP starts and its TIP ends, plain
//! TIP targets for indirect branches, and tracing being enabled or disabled. Events
//! that bind to the same TIP (MODE.Exec, PIP, VMCS) follow the branch or enable event.

use super::evdec::{EventDecoder, Step, last_ip_error};
use super::event::{Event, EventKind, FlowError, binding};
use crate::decode::pt::packets::packet::IpPayload;

impl EventDecoder<'_> {
    pub(crate) fn decode_fup(&mut self, payload: IpPayload) -> Result<Step, FlowError> {
        self.update_ip(payload);
        if self.evq.pending(binding::FUP_BOUND) {
            self.bound = true;
        }
        let Some(mut event) = self.evq.dequeue(binding::FUP | binding::FUP_BOUND) else {
            if self.bound {
                return Ok(Step::More);
            }
            // A FUP on its own starts an asynchronous branch; its TIP gives the target.
            let from = self.ip.ip().map_err(last_ip_error)?;
            self.evq
                .enqueue(binding::TIP, EventKind::AsyncBranch { from, to: 0 })?;
            return Ok(Step::More);
        };
        match event.kind {
            EventKind::Overflow { .. } => {
                // The overflow keeps the time at the OVF.
                self.set_ip(&mut event);
                self.enabled = true;
            }
            EventKind::Rsm { .. } | EventKind::Sipi { .. } => {
                self.set_time(&mut event);
                if !event.ip_suppressed {
                    return Err(FlowError::Internal);
                }
            }
            EventKind::Ignore => return self.decode_fup(payload),
            EventKind::Tsx { .. }
            | EventKind::Exstop { .. }
            | EventKind::Mwait { .. }
            | EventKind::Ptwrite { .. }
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
            | EventKind::Syscall { .. } => {
                self.set_time(&mut event);
                self.set_ip(&mut event);
            }
            _ => return Err(FlowError::BadContext),
        }
        self.event = Some(event);
        Ok(Step::Event)
    }

    pub(crate) fn decode_tip(&mut self, payload: IpPayload) -> Result<Step, FlowError> {
        if !self.enabled {
            return Err(FlowError::BadContext);
        }
        self.update_ip(payload);
        if !self.bound {
            return self.decode_tip_event();
        }
        let Some(mut event) = self.evq.dequeue(binding::TIP) else {
            return Ok(Step::More);
        };
        match event.kind {
            EventKind::AsyncBranch { .. } => return Err(FlowError::Internal),
            EventKind::ExecMode { .. }
            | EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. }
            | EventKind::Iflags { .. } => self.set_ip(&mut event),
            EventKind::Ignore => return self.decode_tip(payload),
            _ => return Err(FlowError::BadContext),
        }
        self.set_time(&mut event);
        self.event = Some(event);
        Ok(Step::Event)
    }

    /// The branch event of a TIP: the asynchronous branch a FUP started, or a plain TIP.
    fn decode_tip_event(&mut self) -> Result<Step, FlowError> {
        self.bound = true;
        let is_async = |k: &EventKind| matches!(k, EventKind::AsyncBranch { .. });
        if let Some(async_index) = self.evq.find(binding::TIP, is_async) {
            let first = self.evq.peek(binding::TIP).ok_or(FlowError::Internal)?;
            self.evq.swap(first, async_index);
            let mut event = self.evq.remove(first).ok_or(FlowError::Internal)?;
            self.set_ip(&mut event);
            self.set_time(&mut event);
            self.event = Some(event);
            return Ok(Step::Event);
        }
        let mut event = Event::new(EventKind::Tip { ip: 0 });
        self.set_ip(&mut event);
        self.set_time(&mut event);
        self.event = Some(event);
        Ok(Step::Event)
    }

    pub(crate) fn decode_tip_pge(&mut self, payload: IpPayload) -> Result<Step, FlowError> {
        self.update_ip(payload);
        if !self.bound {
            // The enable goes first; events binding to the same TIP.PGE follow.
            let mut event = Event::new(EventKind::Enabled {
                ip: 0,
                resumed: false,
            });
            self.set_ip(&mut event);
            self.enabled = true;
            self.bound = true;
            self.set_time(&mut event);
            self.event = Some(event);
            return Ok(Step::Event);
        }
        let Some(mut event) = self.evq.dequeue(binding::TIP) else {
            return Ok(Step::More);
        };
        match event.kind {
            EventKind::ExecMode { .. } | EventKind::Iflags { .. } => self.set_ip(&mut event),
            EventKind::Ignore => return self.decode_tip_pge(payload),
            _ => return Err(FlowError::BadContext),
        }
        self.set_time(&mut event);
        self.event = Some(event);
        Ok(Step::Event)
    }

    pub(crate) fn decode_tip_pgd(&mut self, payload: IpPayload) -> Result<Step, FlowError> {
        self.update_ip(payload);
        let Some(mut event) = self.evq.dequeue(binding::TIP) else {
            if self.bound {
                return Ok(Step::More);
            }
            let mut event = Event::new(EventKind::Disabled { ip: 0 });
            self.set_ip(&mut event);
            self.set_time(&mut event);
            self.enabled = false;
            return Ok(self.publish_and_fetch(event));
        };
        match event.kind {
            EventKind::AsyncBranch { from, .. } => {
                event.kind = EventKind::AsyncDisabled { at: from, ip: 0 };
                self.set_ip(&mut event);
                self.enabled = false;
                self.bound = true;
            }
            EventKind::AsyncPaging { .. } | EventKind::AsyncVmcs { .. } if !self.bound => {
                return Err(FlowError::Internal);
            }
            EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. }
            | EventKind::ExecMode { .. } => {
                // Tracing is off by the time these apply.
                event.ip_suppressed = true;
            }
            _ => return Err(FlowError::BadContext),
        }
        self.set_time(&mut event);
        self.event = Some(event);
        Ok(Step::Event)
    }
}
