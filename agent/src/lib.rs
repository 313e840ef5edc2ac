//! lookback: an eBPF-triggered flight recorder.
//!
//! The modules follow the pipeline (see `docs/` and `shared/docs/design.md`):
//! `rules` → `triggers` → `capture` → `snapshot` → `decode` → `stacks` → `symbols` →
//! `writer` → `daemon`, with `cli` (one module per subcommand), `check` (what this machine
//! supports), `sys` (the only place that makes raw syscalls) and `elf` (what the stages
//! read from binaries: segments, build-ids, symbols, debug files).

pub mod capture;
pub mod check;
pub mod cli;
pub mod daemon;
pub mod decode;
pub mod elf;
pub mod inflight;
pub mod report;
pub mod rules;
pub mod snapshot;
pub mod stacks;
pub mod symbols;
pub mod sys;
#[cfg(test)]
mod test_support;
pub mod triggers;
pub mod unwind;
pub mod upload;
pub mod writer;
