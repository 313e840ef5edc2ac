//! The parallel decode against the sequential one: identical branch events (times and
//! offsets included) and counts, cut at every PSB and cut per thread, on the encoder's
//! traces (plain, with timing packets, with lost trace), on random traces and on the
//! libipt corpus; and most pieces taken from their worker where nothing is wrong.

use super::fast_tests::{for_each_corpus_case, synth, with_interruptions};
use super::parallel::{ParallelStats, Split, decode_parallel, decode_parallel_with};
use super::tests::{PSB, Rng, random_code, random_packet};
use super::*;

/// Decodes `trace` sequentially and in parallel with `split`; panics where they differ.
fn same_split(
    trace: &[u8],
    image: &dyn ImageProvider,
    config: FlowConfig,
    split: Split,
    what: &str,
) -> ParallelStats {
    let mut sequential = Branches::new(trace, image, config);
    let expected: Vec<BranchEvent> = sequential.by_ref().collect();
    let parallel = decode_parallel(trace, image, config, split, true);
    let got: Vec<BranchEvent> = parallel.iter().copied().collect();
    if let Some(at) = expected.iter().zip(&got).position(|(a, b)| a != b) {
        panic!(
            "{what} {split:?}: event {at} differs ({:?}):\n sequential {:x?}\n parallel   {:x?}",
            parallel.stats,
            &expected[at.saturating_sub(2)..(at + 3).min(expected.len())],
            &got[at.saturating_sub(2)..(at + 3).min(got.len())]
        );
    }
    assert_eq!(
        expected.len(),
        got.len(),
        "{what} {split:?}: {:?}",
        parallel.stats
    );
    assert_eq!(sequential.counts, parallel.counts, "{what} {split:?}");
    let counted = decode_parallel(trace, image, config, split, false);
    assert!(counted.events.is_empty(), "{what}");
    assert_eq!(
        sequential.counts, counted.counts,
        "{what} {split:?}, counts only"
    );
    let stats = parallel.stats;
    assert_eq!(
        stats.taken + stats.redone + stats.unreached,
        stats.pieces,
        "{what} {split:?}"
    );
    stats
}

/// Both splits; the stats of the cut at every PSB.
fn same(trace: &[u8], image: &dyn ImageProvider, config: FlowConfig, what: &str) -> ParallelStats {
    same_split(
        trace,
        image,
        config,
        Split {
            min_bytes: 0,
            ..Split::threads(3)
        },
        what,
    );
    same_split(trace, image, config, Split::every_psb(3), what)
}

#[test]
fn the_parallel_decode_is_the_sequential_one_on_encoded_traces() {
    for seed in 1..10 {
        let (trace, image) = synth(seed, 2 + usize::try_from(seed).unwrap_or(0) * 4, 48 * 1024);
        let stats = same(
            &trace,
            &image,
            FlowConfig::default(),
            &format!("seed {seed}"),
        );
        // A clean trace: every piece's worker meets the sequential decode.
        assert!(stats.pieces > 10, "seed {seed}: {stats:?}");
        assert_eq!(stats.redone, 0, "seed {seed}: {stats:?}");
    }
}

#[test]
fn the_parallel_decode_is_the_sequential_one_around_timing_packets() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for seed in 1..7 {
        let (trace, image) = synth(seed, 3 + usize::try_from(seed).unwrap_or(0) * 3, 48 * 1024);
        for every in [3, 17, 200] {
            let trace = with_interruptions(&trace, &mut rng, every);
            let what = format!("seed {seed}, one in {every}");
            let stats = same(&trace, &image, FlowConfig::default(), &what);
            // The seed scan gives the workers the time a sequential decode has; junk
            // inserted among the packets may make the decoder resynchronize, which
            // resets time: those pieces are decoded again.
            assert!(stats.taken * 2 > stats.pieces, "{what}: {stats:?}");
        }
    }
}

#[test]
fn the_parallel_decode_is_the_sequential_one_on_random_traces() {
    let mut rng = Rng(0x6a09_e667_f3bc_c908);
    let mut taken = 0;
    for round in 0..150 {
        let mut image = Image::new();
        image.add("random", random_code(&mut rng), 0x1000);
        let mut trace = Vec::new();
        for _ in 0..6 {
            trace.extend_from_slice(&PSB);
            trace.extend_from_slice(&[0x99, 0x01, 0x7d, 0x00, 0x10, 0, 0, 0, 0, 0x02, 0x23]);
            for _ in 0..60 {
                match rng.next() % 10 {
                    0..=5 => trace.push((rng.next().to_le_bytes()[0] | 0x80) & 0xfe),
                    6 => trace.extend_from_slice(&[0x02, 0xa3, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
                    7 => trace.extend_from_slice(&[
                        0x6d,
                        rng.next().to_le_bytes()[0],
                        0x10,
                        0,
                        0,
                        0,
                        0,
                    ]),
                    _ => trace.extend(random_packet(&mut rng)),
                }
            }
        }
        let config = FlowConfig {
            end_on_call: round % 5 == 0,
            ..FlowConfig::default()
        };
        taken += same(&trace, &image, config, &format!("round {round}")).taken;
    }
    assert!(taken > 150, "only {taken} pieces taken");
}

#[test]
fn the_parallel_decode_is_the_sequential_one_on_the_libipt_corpus() {
    let Some(cases) = for_each_corpus_case(|trace, image, config, what| {
        same(trace, image, config, what);
    }) else {
        return;
    };
    assert!(cases > 100, "only {cases} corpus cases");
}

/// A decode that hands its events out while later pieces decode (the timeline stages'
/// way) keeps at most one piece per thread taken and not handed out: their events are
/// the memory it holds (a worker that took the next piece without waiting for room
/// goes past it whenever the hand-out is behind). Each run: the same events as the
/// sequential decode, in order.
#[test]
fn a_streaming_decode_keeps_at_most_a_piece_per_thread_ahead_of_the_hand_out() {
    for seed in 1..13 {
        let (trace, image) = synth(seed, 6, 96 * 1024);
        let expected: Vec<BranchEvent> =
            Branches::new(&trace, &image, FlowConfig::default()).collect();
        for threads in [1, 2, 3] {
            // (One thread cuts only where told to cut at every PSB.)
            let split = Split {
                threads,
                pieces: if threads == 1 { usize::MAX } else { 12 },
                min_bytes: 0,
                max_bytes: usize::MAX,
                balance_bytes: 0,
            };
            let mut got = Vec::new();
            let (_, stats) = decode_parallel_with(
                &trace,
                &image,
                FlowConfig::default(),
                split,
                &mut |events| got.extend_from_slice(events),
            );
            assert!(stats.pieces > 8, "seed {seed}: {stats:?}");
            assert!(
                (1..=threads).contains(&stats.most_ahead),
                "seed {seed}, {threads} threads: {stats:?}"
            );
            assert!(got == expected, "seed {seed}, {threads} threads");
        }
    }
}
