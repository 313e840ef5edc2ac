//! The flow layer, the product path: events and code in, branch events out.
//!
//! In: an [`crate::decode::pt::events::evdec::EventDecoder`] over a trace and an
//! [`image::ImageProvider`] with the traced code (instructions decoded by [`insn`]). Out:
//! blocks of executed instructions and the events between them ([`block`]: TNT/TIP
//! resolved against the code, return compression, errata; the code walk in `flow_walk`
//! with its block `cache`, event placement in `flow_events` and `flow_trailing`), and
//! what later stages consume: [`branches`] (calls, returns, jumps, far transfers,
//! interrupts, trace start/stop/gap, errors, with time; runs of TNT and TIP take a fast
//! path over whole cached blocks, `fast_blocks`, that gives the same events). Its own
//! layer because it is the only one that reads code: the layers below see only the trace.

pub mod block;
pub mod branches;
pub(crate) mod cache;
mod fast_blocks;
mod flow_events;
mod flow_trailing;
mod flow_walk;
mod ild;
pub mod image;
pub mod insn;
mod insn_cache;
mod loop_runs;
