//! The quiet path of [`Branches`]: PSB+ headers while tracing is off, a header at a time.
//!
//! In: a [`Branches`] whose decoder has tracing off (as reported and in the flow layer),
//! nothing held or postponed, and as its pending event the last status event of a PSB+
//! (a disable, TSX, paging, VMCS or core:bus-ratio status). Out: that event and the
//! next PSB+'s status events applied, the last of those pending, exactly as
//! [`Branches::step`] would leave it event by event: the same flow-layer code applies
//! each event ([`BlockDecoder::apply_event`], [`BlockDecoder::leave_event`],
//! [`BlockDecoder::proceed_trailing_event`]) and the same bookkeeping counts it
//! ([`Branches::took_event`]); only the event layer's queue is skipped: the header
//! comes whole from [`EventDecoder::quiet_psb`](crate::decode::pt::events::evdec::EventDecoder),
//! which reads it with the general packet reader and clock. Anything else (a FUP, a
//! MODE.EXEC, a TIP.PGE, an error ...) is left to [`Branches::step`].
//!
//! Why: KVM-PT writes a PSB+ every few hundred bytes, also while tracing is off; in
//! qemu's real trace 13,000 of them (65,000 status events) come between TIP.PGD and
//! TIP.PGE, and event by event they were a quarter of its decode. No branch event
//! comes from them, only state: the return stack emptied, the time, the core:bus ratio.

use super::{Branches, State};
use crate::decode::pt::events::event::{Event, EventKind, FlowError};
use crate::decode::pt::flow::block::Status;

impl Branches<'_> {
    /// Takes the next quiet PSB+ if the decoder stands before one; false (nothing
    /// changed) otherwise.
    pub(super) fn run_idle(&mut self) -> bool {
        if self.fast.is_none() || self.tracing || self.held.is_some() {
            return false;
        }
        let dec = &mut self.dec;
        if dec.status.is_err() || dec.enabled || dec.postponed.is_some() || !quiet(&dec.event) {
            return false;
        }
        // The header is read before the pending event is applied (the general path
        // applies it first): the same, since applying a quiet event with tracing off
        // cannot fail (a disable's status update, IP checks that pass on a suppressed
        // IP, a ratio) and touches no state of the event layer's.
        if !dec.evdec.quiet_psb(&mut self.quiet) {
            return false;
        }
        self.quiet_psbs += 1;
        // Event by event as `Branches::step` and `BlockDecoder::next_event` take them,
        // the next event coming from the header instead of the event layer's queue:
        // first the pending one, then the header's but its last, which is left pending.
        for i in 0..self.quiet.len() {
            let Some(next) = self.quiet.event(i) else {
                break;
            };
            let result = self.dec.apply_event().and_then(|()| {
                let applied = self.dec.event;
                self.dec.leave_event()?;
                self.dec.event = next;
                let status = self.trailing_quiet()?;
                Ok((applied, status))
            });
            match result {
                Ok((applied, status)) => {
                    self.took_event(&applied);
                    self.state = State::Running(status);
                }
                // Not for quiet events with tracing off; the general path's answer.
                Err(err) => {
                    self.error(err);
                    return true;
                }
            }
        }
        true
    }
}

impl Branches<'_> {
    /// `proceed_trailing_event(None)` for the decoder's event, which comes from a quiet
    /// header: with tracing off and no instruction postponed, a quiet event binds at
    /// once (a disable's status update; TSX, paging and VMCS status with a suppressed
    /// IP; a ratio), and nothing changes. Why: the general call was a third of the
    /// quiet path's per-event cost (qemu's real trace: 56,000 events, 4.6 M
    /// instructions). Debug builds check the answer against the general call.
    fn trailing_quiet(&mut self) -> Result<Status, FlowError> {
        let dec = &mut self.dec;
        if !quiet(&dec.event) || dec.postponed.is_some() || dec.enabled || dec.status.is_err() {
            return dec.proceed_trailing_event(None);
        }
        let pending = dec.status_flags(true);
        #[cfg(debug_assertions)]
        {
            let general = dec.proceed_trailing_event(None);
            debug_assert_eq!(general, Ok(pending), "{:?}", dec.event);
        }
        Ok(pending)
    }
}

/// A status event of a PSB+ with tracing off that applies without an IP.
fn quiet(event: &Event) -> bool {
    event.status_update
        && match event.kind {
            EventKind::Cbr { .. } => true,
            EventKind::Disabled { .. }
            | EventKind::Tsx { .. }
            | EventKind::AsyncPaging { .. }
            | EventKind::AsyncVmcs { .. } => event.ip_suppressed,
            _ => false,
        }
}
