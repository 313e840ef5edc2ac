//! The event layer for Event Trace packets: CFE, EVD and TRIG.
//!
//! In: an [`EventDecoder`] whose current packet is a CFE (control-flow event), EVD (its
//! event data: CR2, VMX exit reason/qualification) or TRIG. Out: interrupt, IRET, SMI,
//! RSM, SIPI, INIT, VM entry/exit, shutdown, user-interrupt, software-interrupt, syscall
//! and trigger events. An event with an IP binds to the FUP that follows; while tracing
//! is on, one without waits for the FUP of the asynchronous branch it belongs to.

use super::evdec::{EventDecoder, Step};
use super::event::{Event, EventKind, FlowError, binding};
use crate::decode::pt::packets::packet::{Cfe, Evd, Trig};

/// How a CFE type binds when its packet has no IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NoIp {
    /// Always standalone.
    Standalone,
    /// Binds to the next FUP while tracing is on.
    FupWhenEnabled,
}

impl EventDecoder<'_> {
    /// Queues or publishes a CFE event built in `event`.
    fn place_cfe(
        &mut self,
        mut event: Event,
        with_ip: bool,
        no_ip: NoIp,
    ) -> Result<Step, FlowError> {
        if with_ip {
            self.evq.push(binding::FUP_BOUND, event)?;
            return Ok(Step::More);
        }
        if no_ip == NoIp::FupWhenEnabled && self.enabled {
            self.evq.push(binding::FUP, event)?;
            return Ok(Step::More);
        }
        self.set_time(&mut event);
        event.ip_suppressed = true;
        Ok(self.publish_and_fetch(event))
    }

    pub(crate) fn decode_cfe(&mut self, cfe: Cfe) -> Result<Step, FlowError> {
        // An EVD may have queued the event this CFE completes.
        let pending = self.evq.dequeue(binding::CFE);
        let fresh = |kind| -> Result<Event, FlowError> {
            if pending.is_some() {
                Err(FlowError::BadContext)
            } else {
                Ok(Event::new(kind))
            }
        };
        let vector = cfe.vector;
        match cfe.kind {
            0x01 => {
                let mut event = pending.unwrap_or(Event::new(EventKind::Interrupt {
                    vector: 0,
                    cr2: None,
                    ip: 0,
                }));
                let EventKind::Interrupt { vector: v, .. } = &mut event.kind else {
                    return Err(FlowError::BadContext);
                };
                *v = vector;
                self.place_cfe(event, cfe.ip, NoIp::FupWhenEnabled)
            }
            0x02 => self.place_cfe(fresh(EventKind::Iret { ip: 0 })?, cfe.ip, NoIp::Standalone),
            0x03 => self.place_cfe(
                fresh(EventKind::Smi { ip: 0 })?,
                cfe.ip,
                NoIp::FupWhenEnabled,
            ),
            0x04 | 0x05 => {
                let kind = if cfe.kind == 0x04 {
                    EventKind::Rsm { ip: 0 }
                } else {
                    EventKind::Sipi { vector }
                };
                let mut event = fresh(kind)?;
                if cfe.ip {
                    return Err(FlowError::BadPacket);
                }
                event.ip_suppressed = true;
                self.place_cfe(event, false, NoIp::FupWhenEnabled)
            }
            0x06 => self.place_cfe(
                fresh(EventKind::Init { ip: 0 })?,
                cfe.ip,
                NoIp::FupWhenEnabled,
            ),
            0x07 => self.place_cfe(
                fresh(EventKind::Vmentry { ip: 0 })?,
                cfe.ip,
                NoIp::Standalone,
            ),
            0x08 | 0x09 => {
                let mut event = pending.unwrap_or(Event::new(EventKind::Vmexit {
                    vector: None,
                    vmxr: None,
                    vmxq: None,
                    ip: 0,
                }));
                let EventKind::Vmexit { vector: v, .. } = &mut event.kind else {
                    return Err(FlowError::BadContext);
                };
                if cfe.kind == 0x09 {
                    *v = Some(vector);
                }
                self.place_cfe(event, cfe.ip, NoIp::FupWhenEnabled)
            }
            0x0a => self.place_cfe(
                fresh(EventKind::Shutdown { ip: 0 })?,
                cfe.ip,
                NoIp::Standalone,
            ),
            0x0c => self.place_cfe(
                fresh(EventKind::Uintr { vector, ip: 0 })?,
                cfe.ip,
                NoIp::FupWhenEnabled,
            ),
            0x0d => self.place_cfe(fresh(EventKind::Uiret { ip: 0 })?, cfe.ip, NoIp::Standalone),
            0x0e => self.place_cfe(
                fresh(EventKind::Swintr { vector, ip: 0 })?,
                cfe.ip,
                NoIp::FupWhenEnabled,
            ),
            0x0f => self.place_cfe(
                fresh(EventKind::Syscall { ip: 0 })?,
                cfe.ip,
                NoIp::Standalone,
            ),
            _ => {
                // Unknown types add nothing essential; ignore them and their FUP.
                if pending.is_some() {
                    return Err(FlowError::Internal);
                }
                if cfe.ip {
                    self.evq.enqueue(binding::FUP_BOUND, EventKind::Ignore)?;
                }
                Ok(Step::More)
            }
        }
    }

    pub(crate) fn decode_evd(&mut self, evd: Evd) -> Result<Step, FlowError> {
        let pending = self.evq.peek(binding::CFE);
        match evd.kind {
            0 => {
                if pending.is_some() {
                    return Err(FlowError::BadContext);
                }
                self.evq.enqueue(
                    binding::CFE,
                    EventKind::Interrupt {
                        vector: 0,
                        cr2: Some(evd.payload),
                        ip: 0,
                    },
                )?;
            }
            1 | 2 => {
                let index = match pending {
                    Some(index) => index,
                    None => self.evq.enqueue(
                        binding::CFE,
                        EventKind::Vmexit {
                            vector: None,
                            vmxr: None,
                            vmxq: None,
                            ip: 0,
                        },
                    )?,
                };
                let event = self.evq.get_mut(index).ok_or(FlowError::Internal)?;
                let EventKind::Vmexit { vmxr, vmxq, .. } = &mut event.kind else {
                    return Err(FlowError::BadContext);
                };
                let slot = if evd.kind == 1 { vmxq } else { vmxr };
                if slot.is_some() {
                    return Err(FlowError::BadContext);
                }
                *slot = Some(evd.payload);
            }
            _ => {}
        }
        Ok(Step::More)
    }

    pub(crate) fn decode_trig(&mut self, trig: Trig) -> Result<Step, FlowError> {
        let kind = EventKind::Trig {
            trbv: trig.trbv,
            mult: trig.mult,
            icnt: 0,
            ip: 0,
        };
        if trig.ip {
            // The FUP gives the precise IP, so there must be no count.
            match trig.icnt {
                Some(0) => {}
                _ => return Err(FlowError::BadPacket),
            }
            self.evq.enqueue(binding::FUP_BOUND, kind)?;
            return Ok(Step::More);
        }
        let mut event = Event::new(kind);
        match trig.icnt {
            Some(icnt) => {
                if icnt != 0 && !self.enabled {
                    return Err(FlowError::BadPacket);
                }
                if let EventKind::Trig { icnt: count, .. } = &mut event.kind {
                    *count = icnt;
                }
            }
            None => event.ip_suppressed = true,
        }
        self.set_time(&mut event);
        Ok(self.publish_and_fetch(event))
    }
}
