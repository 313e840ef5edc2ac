//! Round trips through the encoder: the decoder, reading only the code bytes and the
//! trace, finds the calls, returns and taken jumps the encoder's own run took. (The
//! libipt corpus does the conformance; this shows the benchmark trace is decoded as
//! intended, with no errors.)

use super::{CODE_BASE, SynthProgram, encode};
use crate::decode::pt::flow::block::FlowConfig;
use crate::decode::pt::flow::branches::{BranchKind, Branches};
use crate::decode::pt::flow::image::Image;

fn round_trip(seed: u64, functions: usize, size: usize) {
    let program = SynthProgram::generate(seed, functions);
    let encoded = encode(&program, seed, size, true);
    assert_eq!(encoded.trace.len(), size, "seed {seed}");
    let mut image = Image::new();
    image.add("synth", program.code.clone(), CODE_BASE);
    let mut decoded = Vec::new();
    let mut others = Vec::new();
    for event in Branches::new(&encoded.trace, &image, FlowConfig::default()) {
        match event.kind {
            BranchKind::Call | BranchKind::Return | BranchKind::Jump => {
                decoded.push((event.kind, event.from, event.to));
            }
            _ => others.push(event),
        }
    }
    assert!(
        others
            .iter()
            .all(|e| matches!(e.kind, BranchKind::TraceStart)),
        "seed {seed}: unexpected events {:?}",
        &others[..others.len().min(5)]
    );
    if let Some(at) = decoded
        .iter()
        .zip(&encoded.branches)
        .position(|(d, e)| d != e)
    {
        panic!(
            "seed {seed}: branch {at} differs: decoded {:x?}, encoded {:x?}",
            &decoded[at..(at + 4).min(decoded.len())],
            &encoded.branches[at..(at + 4).min(encoded.branches.len())]
        );
    }
    // The decoder stops where the trace does; the encoder may have run a little past the
    // last packet (straight-line code and direct branches need none).
    assert!(
        decoded.len() <= encoded.branches.len() && decoded.len() + 64 > encoded.branches.len(),
        "seed {seed}: decoded {} branches, encoded {}",
        decoded.len(),
        encoded.branches.len()
    );
}

#[test]
fn the_decoder_reproduces_the_encoded_run_across_psbs() {
    round_trip(1, 24, 64 * 1024);
}

#[test]
fn the_decoder_reproduces_encoded_runs_of_many_programs() {
    for seed in 2..18 {
        round_trip(seed, 2 + usize::try_from(seed).unwrap_or(0) * 3, 16 * 1024);
    }
}

#[test]
fn a_large_trace_is_exactly_the_requested_size() {
    let program = SynthProgram::generate(7, 32);
    let encoded = encode(&program, 7, 1 << 20, false);
    assert_eq!(encoded.trace.len(), 1 << 20);
    assert!(encoded.branches.is_empty());
    assert!(encoded.instructions > 100_000);
}
