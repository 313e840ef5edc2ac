//! Decode, input side: recordings lookback did not make, as [`crate::snapshot::Snapshot`]s,
//! so that one set of stages (decode, stacks, symbols, writer) turns every input into a
//! timeline.
//!
//! `perf` takes a `perf record -e intel_pt//` file ([`super::perf_file`] reads it), `raw`
//! a raw AUX capture with the code it ran. Neither reads files: the CLI hands them bytes
//! and, afterwards, points the snapshot's maps at the local copies of the binaries
//! (`cli/local_binaries.rs`).

pub mod perf;
pub mod raw;
pub mod sideband;
