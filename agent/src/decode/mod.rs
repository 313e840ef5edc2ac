//! Decode: snapshot recorder bytes to control flow.
//!
//! In: what `capture/` froze (Intel PT bytes with their sideband, or sampled stacks). Out:
//! packets, branch events and timestamps for `stacks/`. `pt` holds the Intel PT layers,
//! `samples` the sampled stacks;
//! decoding never opens files or asks the live system anything.

pub mod pt;
pub mod samples;
