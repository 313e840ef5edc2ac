//! The event layer: packets in, events bound to their packets out.
//!
//! In: a trace (through the packet layer's decoder), its timing and errata. Out:
//! [`event::Event`]s (tracing on/off, asynchronous branches, overflows, execution mode,
//! TSX, paging, power and control-flow events, raw TIP/TNT) with time, from
//! [`evdec::EventDecoder`]; [`event::FlowError`] for what went wrong. Its own layer
//! because binding packets that belong together (MODE.Exec + TIP, PSB+ state, FUP after
//! OVF ...) follows libipt's rules without looking at code, so the flow layer above only
//! deals with events at addresses.

pub mod evdec;
mod evdec_cfe;
mod evdec_ip;
pub(crate) mod evdec_ovf;
pub(crate) mod evdec_seed;
pub mod event;
