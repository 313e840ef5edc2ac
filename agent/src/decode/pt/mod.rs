//! Intel Processor Trace decoding, in layers, bottom first; one folder per layer.
//!
//! In: the PT bytes of a snapshot (AUX area, oldest first) and what the recording CPU
//! was (family/model for errata, MTC frequency and CPUID leaf 0x15 for time). Out: the
//! branch events later stages consume ([`Branches`]), and Intel-tool-style dumps.
//!
//! - [`packets`]: bytes to packets (`parse`, `decoder`, `sync` for PSBs), full IPs
//!   (`last_ip`), the CPU and its errata (`cpu`).
//! - [`timing`]: timing packets to an estimated TSC (`time`, `clock`).
//! - [`events`]: packets bound into events ([`events::evdec`], [`events::event`]).
//! - [`flow`]: the product path: the instruction flow over the traced code (`block`:
//!   blocks of executed instructions, TNT/TIP resolved against the code that `insn`
//!   decodes from an `image`, return compression, errata, a block `cache`), and
//!   [`flow::branches`] (calls, returns, jumps, far transfers, interrupts, trace
//!   start/stop/gap, errors, with time; runs of TNT and TIP packets take a fast path over
//!   whole cached blocks that gives the same events).
//! - [`sideband`]: perf sideband records (`pevent`), and ptxed's sideband session
//!   (`sb_session`: process images from MMAP records, switched at execs and context
//!   switches).
//! - [`tools`]: `ptdump`- and `ptxed`-style text dumps, checked against Intel libipt's
//!   conformance corpus, and the trace encoder of tests and benchmarks (`encode`); not
//!   on the product path.
//!
//! Each layer's code imports only from the layers listed before it (tests also use the
//! tools). Everything here is sans-IO: callers hand in byte slices and an
//! [`ImageProvider`] for code bytes, and get values back. TSC to perf time is
//! [`crate::capture::tsc::TscConversion`], from the perf mmap page.

pub mod events;
pub mod flow;
pub mod packets;
pub mod sideband;
pub mod timing;
pub mod tools;

pub use events::evdec::{AddrFilter, EventConfig, EventDecoder};
pub use events::event::{Event, EventKind, FlowError};
pub use flow::block::{Block, BlockDecoder, FlowConfig, Status};
pub use flow::branches::{
    BlockInsns, BranchEvent, BranchKind, Branches, DecodeCounts, decode_counts,
};
pub use flow::image::{Image, ImageProvider, Mapping, NoCode, RawSpec};
pub use flow::insn::{Insn, InsnClass, InsnKind};
pub use packets::cpu::{Cpu, Errata};
pub use packets::decoder::PacketDecoder;
pub use packets::last_ip::{LastIp, LastIpError};
pub use packets::packet::{IpCompression, IpPayload, Packet, PacketKind};
pub use packets::parse::{PacketError, decode_packet};
pub use timing::clock::{TimeTracker, TrackerOptions};
pub use timing::time::{Time, TimeCal, TimeError, TimingConfig};
pub use tools::ptdump::{ptdump, ptdump_with_sideband};
pub use tools::ptdump_opts::{PtdumpArgsError, PtdumpOptions};
pub use tools::ptxed::{PtxedStats, ptxed};
pub use tools::ptxed_opts::{PtxedArgsError, PtxedOptions};
