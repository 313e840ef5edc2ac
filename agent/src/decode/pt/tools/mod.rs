//! The tools: Intel's `ptdump` and `ptxed` text, and a trace encoder, apart from the
//! product path.
//!
//! In: trace bytes, code images, sideband streams, and the tools' own command lines
//! ([`ptdump_opts`], [`ptxed_opts`]). Out: the text Intel's `ptdump` ([`ptdump`]: one line
//! per packet) and `ptxed` ([`ptxed`]: one line per instruction and event) print for the
//! same input, checked against libipt's conformance corpus (the tests `conformance` and
//! `conformance_ptxed`); and [`encode`], a small PT encoder that writes programs and their
//! traces for tests and benchmarks; [`files`], what raw decoding reads besides the trace
//! (sideband files, the files their records map, kernel core dumps). Its own layer
//! because the product path (snapshot to branch events to trace) does not use it: it
//! serves `lookback-pt ptdump|ptxed`, tests and benchmarks, for debugging the decoder and
//! showing it right (and `lookback decode --sideband` reads its sideband with [`files`]).

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod conformance_ptxed;
pub mod encode;
pub mod encode_shape;
pub mod files;
pub mod ptdump;
pub mod ptdump_opts;
pub mod ptxed;
pub mod ptxed_opts;

/// The libipt corpus directory, for tests elsewhere that want real traces.
#[cfg(test)]
pub(crate) fn conformance_dir() -> Option<std::path::PathBuf> {
    conformance::corpus_dir()
}
