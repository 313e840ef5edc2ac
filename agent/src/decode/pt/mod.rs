//! Intel Processor Trace decoding, bottom layer first.
//!
//! In: the PT bytes of a snapshot (AUX area, oldest first) and what the recording CPU
//! was (family/model for errata, MTC frequency and CPUID leaf 0x15 for time). Out:
//! packets ([`parse`]), full IPs ([`last_ip`]), time ([`timing`]), events bound to
//! their packets ([`evdec`], [`events`]), the instruction flow over the traced code
//! ([`flow`]: blocks of executed instructions, TNT/TIP resolved against the code that
//! [`insn`] decodes from an [`image`], return compression, errata, a block cache), and
//! what later stages consume: [`branches`] (calls, returns, jumps, far transfers,
//! interrupts, trace start/stop/gap, errors, with time; runs of TNT and TIP packets
//! take a fast path over whole cached blocks that gives the same events). `ptdump`- and
//! `ptxed`-style text dumps ([`ptdump`], [`ptxed`]; the latter with perf sideband through
//! [`sb_session`]: process images from MMAP records, switched at execs and context
//! switches) are checked against Intel libipt's conformance corpus.
//!
//! Everything here is sans-IO: callers hand in byte slices and an [`ImageProvider`]
//! for code bytes, and get values back.

pub mod branches;
pub mod clock;
pub mod cpu;
pub mod decoder;
pub mod encode;
pub mod evdec;
mod evdec_cfe;
mod evdec_ip;
mod evdec_ovf;
pub mod events;
mod fast_blocks;
pub mod flow;
mod flow_events;
mod flow_trailing;
mod flow_walk;
pub mod image;
pub mod insn;
pub mod last_ip;
pub mod packet;
pub mod parse;
mod parse_hot;
pub mod pevent;
pub mod pevent_body;
pub mod ptdump;
pub mod ptdump_opts;
pub mod ptxed;
pub mod ptxed_opts;
pub mod sb_context;
mod sb_location;
pub mod sb_session;
pub mod sync;
pub mod timing;

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_ptxed;

/// The libipt corpus directory, for tests elsewhere that want real traces.
#[cfg(test)]
pub(crate) fn conformance_dir() -> Option<std::path::PathBuf> {
    conformance::corpus_dir()
}

pub use branches::{BlockInsns, BranchEvent, BranchKind, Branches, DecodeCounts, decode_counts};
pub use clock::{TimeTracker, TrackerOptions, TscConversion};
pub use cpu::{Cpu, Errata};
pub use decoder::PacketDecoder;
pub use evdec::{AddrFilter, EventConfig, EventDecoder};
pub use events::{Event, EventKind, FlowError};
pub use flow::{Block, BlockDecoder, FlowConfig, Status};
pub use image::{Image, ImageProvider, Mapping, NoCode, RawSpec};
pub use insn::{Insn, InsnClass, InsnKind};
pub use last_ip::{LastIp, LastIpError};
pub use packet::{IpCompression, IpPayload, Packet, PacketKind};
pub use parse::{PacketError, decode_packet};
pub use ptdump::{ptdump, ptdump_with_sideband};
pub use ptdump_opts::{PtdumpArgsError, PtdumpOptions};
pub use ptxed::{PtxedStats, ptxed};
pub use ptxed_opts::{PtxedArgsError, PtxedOptions};
pub use timing::{Time, TimeCal, TimeError, TimingConfig};
