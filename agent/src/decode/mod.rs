//! Decode: snapshot recorder bytes to control flow.
//!
//! In: what `capture/` froze (Intel PT bytes with their sideband, or sampled stacks). Out:
//! packets, branch events and timestamps for `stacks/`. `pt` holds the Intel PT layers,
//! `pt_snapshot` runs them over a snapshot's rings and puts the branches on threads,
//! `samples` the sampled stacks; decoding never opens files or asks the live system
//! anything (code that is not in the snapshot comes through a caller's `CodeSource`).

pub mod import;
pub mod perf_file;
pub mod pt;
pub mod pt_snapshot;
pub mod samples;
#[cfg(test)]
mod sideband_corpus;
