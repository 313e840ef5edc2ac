//! The sideband layer: perf records beside the trace.
//!
//! In: perf sideband streams (`perf_event_header` records such as MMAP, COMM, SWITCH,
//! `ITRACE_START`) and how to read them (sample type, TSC conversion). Out: records with
//! their time as TSC ([`pevent`], which also prints them ptdump-style), the fields that
//! change a process's code image ([`pevent_body`]), and ptxed's sideband session
//! ([`sb_session`], [`sb_context`]): per-process images from MMAP records, switched as
//! the trace reaches execs and context switches. Its own layer because it reads perf's
//! records, not the PT trace: it meets the trace only through time and events.

pub mod pevent;
pub mod pevent_body;
pub mod sb_context;
mod sb_location;
pub mod sb_session;
