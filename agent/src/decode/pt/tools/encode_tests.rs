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

/// A branch as the encoder records it: kind, from, to.
type Taken = (BranchKind, u64, u64);

/// Branches of a decode split at its errors: the runs of calls, returns and jumps that
/// follow each error (up to the next), and how many errors there were.
fn runs_after_errors(trace: &[u8], image: &Image) -> (Vec<Vec<Taken>>, usize) {
    let mut runs: Vec<Vec<Taken>> = Vec::new();
    let mut errors = 0;
    for event in Branches::new(trace, image, FlowConfig::default()) {
        match event.kind {
            BranchKind::Error => {
                errors += 1;
                runs.push(Vec::new());
            }
            BranchKind::Call | BranchKind::Return | BranchKind::Jump => {
                if let Some(run) = runs.last_mut() {
                    run.push((event.kind, event.from, event.to));
                }
            }
            _ => {}
        }
    }
    (runs, errors)
}

/// Whether `run` is a contiguous part of `truth`.
fn is_part_of(run: &[Taken], truth: &[Taken]) -> bool {
    run.is_empty() || truth.windows(run.len()).any(|w| w == run)
}

/// Lost trace (a range cut out, as an overflow or a lost AUX record leaves it; or the
/// start of a wrapped ring missing) over a run whose every branch is known: the decoder
/// may follow the spliced packets wrongly until it notices (no decoder can tell), but
/// every branch it reports after an error, up to the next one, is a stretch of the run
/// that really happened: recovery resumes only where the trace says exactly where the
/// program is.
#[test]
fn after_an_error_every_branch_reported_really_happened() {
    let mut recovered = 0usize;
    let mut with_errors = 0usize;
    for seed in 0..200u64 {
        let program = SynthProgram::generate(seed, 8 + usize::try_from(seed % 24).unwrap_or(0));
        let encoded = encode(&program, seed, 24 * 1024, true);
        let mut image = Image::new();
        image.add("synth", program.code.clone(), CODE_BASE);
        // A pseudo-random cut: where and how long.
        let mix = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
        let len = encoded.trace.len();
        let from = 200 + usize::try_from(mix % 16_000).unwrap_or(0);
        let cut = 1 + usize::try_from((mix >> 20) % 700).unwrap_or(0);
        let mut trace = encoded.trace.clone();
        if seed % 4 == 3 {
            // A wrapped ring: the oldest bytes are gone, the rest starts mid-packet.
            trace.drain(..from.min(len));
        } else {
            trace.drain(from..(from + cut).min(len));
        }
        let (runs, errors) = runs_after_errors(&trace, &image);
        if errors > 0 {
            with_errors += 1;
        }
        for (i, run) in runs.iter().enumerate() {
            assert!(
                is_part_of(run, &encoded.branches),
                "seed {seed}: the {} branches after error {i} did not happen in that order: {:x?}",
                run.len(),
                &run[..run.len().min(6)]
            );
            recovered += run.len();
        }
    }
    // The cuts did cause errors, and branches were recovered after them.
    assert!(with_errors > 100, "{with_errors} traces with errors");
    assert!(recovered > 100_000, "{recovered} branches recovered");
}
