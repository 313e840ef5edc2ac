//! Parallel decode: the branch events of [`Branches`], decoded on several cores.
//!
//! In: a trace, an image, a [`FlowConfig`] and a [`Split`] (how many threads, where to
//! cut). Out: [`Parallel`]: the events in order (in pieces, or none when only counts are
//! wanted), their [`DecodeCounts`], and [`ParallelStats`] (how many pieces a worker's
//! decode gave, how many were decoded again).
//!
//! Why it is exact: speculate, then verify. The trace is cut at PSBs `b1 < b2 < ...`.
//! Worker `i` synchronizes at `b_i` with the time a decode from the start has there
//! (`evdec_seed`), drops what it decodes until its first *checkpoint* — the first moment,
//! between blocks with no event pending, after it handled the PSB+ status events of a
//! PSB at or after `b_i` — keeps a copy of its state there, then collects its events up
//! to its checkpoint for `b_{i+1}` and stops. The first piece is decoded from the start
//! of the trace as [`Branches`] does. Stitching goes through the pieces in order: the
//! decoder that made piece `i - 1` stands at its checkpoint for `b_i`; when its state
//! equals worker `i`'s copy (every field a later step reads: packet position, IP, time,
//! calibration, waiting events, return stack, flags — not caches, which only save work),
//! the two decode the rest alike, so worker `i`'s events are the ones a sequential decode
//! gives, and worker `i`'s decoder goes on from there. When not (a cut the seed scan got
//! wrong, a PSB+ inside an event, a resynchronization that reset time), the decoder of
//! piece `i - 1` decodes piece `i` itself. So the result is the sequential decode's, event
//! for event and count for count, wherever the cut is; a bad cut only costs time.
//!
//! What makes the states meet at a PSB: PSB+ restates the IP, execution mode, paging and
//! whether tracing is on; the return stack starts empty at each PSB (see
//! [`Branches::step`]); the time comes from the seed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{BranchEvent, Branches, DecodeCounts, State};
use crate::decode::pt::events::evdec_seed;
use crate::decode::pt::flow::block::{BlockDecoder, FlowConfig};
use crate::decode::pt::flow::image::ImageProvider;
use crate::decode::pt::packets::sync;
use crate::decode::pt::timing::time::{Time, TimeCal};

/// How to cut a trace for a parallel decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Threads to decode on (1: decode sequentially, without cutting).
    pub threads: usize,
    /// Pieces to cut the trace into, at most (each starts at a PSB).
    pub pieces: usize,
    /// The smallest piece worth a thread of its own, in trace bytes.
    pub min_bytes: usize,
}

impl Split {
    /// One piece per thread, none under 64 KiB: a worker's decode starts with cold
    /// caches, so fewer, larger pieces are faster.
    pub fn threads(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            pieces: threads.max(1),
            min_bytes: 64 << 10,
        }
    }

    /// A cut at every PSB, on `threads` threads (tests: every place a cut can be).
    pub fn every_psb(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            pieces: usize::MAX,
            min_bytes: 0,
        }
    }

    /// The PSBs to cut at: ascending, each at least `min_bytes` after the last.
    fn cuts(&self, trace: &[u8]) -> Vec<usize> {
        let pieces = self.pieces.min(trace.len() / self.min_bytes.max(1)).max(1);
        let step = (trace.len() / pieces).max(self.min_bytes).max(1);
        let mut cuts = Vec::new();
        let mut from = step;
        while from < trace.len() && cuts.len() + 1 < pieces {
            let Some(psb) = sync::find_psb_forward(trace, from) else {
                break;
            };
            // `find_psb_forward` may find one that starts a little before `from`.
            if cuts.last().is_none_or(|&last| psb > last) && psb > 0 {
                cuts.push(psb);
            }
            from = psb.max(from) + step.max(sync::PSB_LEN);
        }
        cuts
    }
}

/// How a parallel decode went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ParallelStats {
    /// Pieces the trace was cut into.
    pub pieces: usize,
    /// Pieces whose worker's events were taken.
    pub taken: usize,
    /// Pieces decoded again after their worker's start did not match.
    pub redone: usize,
    /// Pieces not reached: the decode ended before them.
    pub unreached: usize,
    /// Why the first piece decoded again was: what differed between its worker's start
    /// and the decoder before it ("no checkpoint": the worker never reached one,
    /// "trace stop after an unknown block": its events needed a block before its start).
    pub first_difference: Option<&'static str>,
}

/// The result of [`decode_parallel`].
#[derive(Debug, Default)]
pub struct Parallel {
    /// The branch events in order, in pieces (empty when events were not kept).
    pub events: Vec<Vec<BranchEvent>>,
    pub counts: DecodeCounts,
    pub stats: ParallelStats,
}

impl Parallel {
    /// The events in order.
    pub fn iter(&self) -> impl Iterator<Item = &BranchEvent> {
        self.events.iter().flatten()
    }
}

/// Where a piece's events go.
enum Sink<'s> {
    Keep(&'s mut Vec<BranchEvent>),
    Drop,
}

impl Sink<'_> {
    fn take(&mut self, events: &[BranchEvent]) {
        if let Self::Keep(out) = self {
            out.extend_from_slice(events);
        }
    }
}

/// The state of a decoder at a checkpoint, to compare with another decoder's.
struct Checkpoint<'a> {
    dec: BlockDecoder<'a>,
    state: State,
    tracing: bool,
    held: Option<(super::BranchKind, u64, u64)>,
    last_sync: Option<usize>,
    last_error: Option<usize>,
    stalled: (usize, u64),
    last_ip: Option<u64>,
}

impl<'a> Checkpoint<'a> {
    /// The state of `branches` as its future decode sees it: offsets of earlier errors
    /// and stalls are normalized away (only ones at or after the current offset can
    /// change what happens next).
    fn of(branches: &Branches<'a>) -> Self {
        let at = branches.dec.offset();
        let recent = |offset: Option<usize>| offset.filter(|&o| o >= at);
        let stalled = if branches.stalled.0 >= at && branches.stalled.0 != usize::MAX {
            branches.stalled
        } else {
            (usize::MAX, 0)
        };
        Self {
            dec: branches.dec.snapshot(),
            state: branches.state,
            tracing: branches.tracing,
            held: branches.held,
            last_sync: recent(branches.last_sync),
            last_error: recent(branches.last_error),
            stalled,
            last_ip: branches.last_ip_known.then_some(branches.last_ip),
        }
    }

    /// What in `other`'s state differs from this checkpoint's, if anything: `None` when
    /// `other` decodes the rest of the trace as the decoder of this checkpoint does. A
    /// last IP this checkpoint does not know is not compared: the worker's events are
    /// refused instead if it ever used it (`Branches::tainted`).
    fn difference(&self, other: &Self) -> Option<&'static str> {
        if let Some(what) = self.dec.state_difference(&other.dec) {
            return Some(what);
        }
        [
            (self.state == other.state, "decode state"),
            (self.tracing == other.tracing, "tracing"),
            (self.held == other.held, "held branch"),
            (self.last_sync == other.last_sync, "last sync error"),
            (self.last_error == other.last_error, "last error"),
            (self.stalled == other.stalled, "stall count"),
            (
                self.last_ip.is_none() || self.last_ip == other.last_ip,
                "last block",
            ),
        ]
        .into_iter()
        .find_map(|(same, what)| (!same).then_some(what))
    }
}

/// One piece as its worker decoded it.
struct Piece<'a> {
    /// The worker's state at its start checkpoint (`None`: it never reached one).
    start: Option<Checkpoint<'a>>,
    events: Vec<BranchEvent>,
    counts: DecodeCounts,
    /// The worker's decoder at its end checkpoint; `None` when the decode ended.
    end: Option<Branches<'a>>,
    tainted: bool,
}

impl<'a> Branches<'a> {
    /// A parallel worker: synchronized at the PSB at `offset` with `timing`.
    fn worker(
        trace: &'a [u8],
        image: &'a dyn ImageProvider,
        config: FlowConfig,
        offset: usize,
        timing: Option<(Time, TimeCal)>,
    ) -> Self {
        let mut branches = Self::new(trace, image, config);
        branches.last_ip_known = false;
        branches.state = match branches.dec.sync_set_timed(offset, timing) {
            Ok(status) => State::Running(status),
            Err(crate::decode::pt::events::event::FlowError::Eos) => State::Done,
            Err(_) => State::Sync,
        };
        branches
    }

    /// Whether the decoder stands at its checkpoint for the PSB at `cut`: between blocks,
    /// no event pending, the status events of a PSB+ at or after `cut` handled and none
    /// waiting for the flow to reach its IP (the decoder started at a PSB handles those
    /// at its start).
    fn at_checkpoint(&self, cut: usize) -> bool {
        matches!(self.state, State::Running(status) if !status.event_pending)
            && self.status_psb.is_some_and(|psb| psb >= cut)
            && !(self.dec.status.is_ok() && self.dec.event.status_update)
    }

    /// Decodes on to the checkpoint for the PSB at `cut` (the end of the trace for
    /// `usize::MAX`), handing the events to `sink`. False when the decode ended first.
    fn run_to(&mut self, cut: usize, sink: &mut Sink<'_>) -> bool {
        loop {
            if self.queue.head < self.queue.len {
                sink.take(
                    self.queue
                        .buf
                        .get(self.queue.head..self.queue.len)
                        .unwrap_or_default(),
                );
            }
            self.queue.clear();
            if cut != usize::MAX && self.at_checkpoint(cut) {
                return true;
            }
            if !self.advance() {
                return false;
            }
        }
    }

    /// The counts since the last call, and a fresh start for the next piece.
    fn take_counts(&mut self) -> DecodeCounts {
        std::mem::take(&mut self.counts)
    }
}

/// Decodes `trace` as [`Branches`] does, on `split.threads` threads; the events are kept
/// only with `keep_events` (else only counted). The same events and counts as a
/// sequential decode, whatever the split (see the module's comment).
pub fn decode_parallel(
    trace: &[u8],
    image: &dyn ImageProvider,
    config: FlowConfig,
    split: Split,
    keep_events: bool,
) -> Parallel {
    let cuts = if split.threads > 1 || split.pieces == usize::MAX {
        split.cuts(trace)
    } else {
        Vec::new()
    };
    let seeds = evdec_seed::timing_at(trace, &config.events, &cuts);
    // Piece i runs from cut i-1 (the trace start for 0) to cut i (the end for the last).
    let ends: Vec<usize> = cuts.iter().copied().chain([usize::MAX]).collect();
    let pieces: Vec<Mutex<Option<Piece<'_>>>> = ends.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let work = || {
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&end) = ends.get(i) else { break };
            let piece = decode_piece(trace, image, config, &cuts, &seeds, i, end, keep_events);
            if let Some(slot) = pieces.get(i)
                && let Ok(mut slot) = slot.lock()
            {
                *slot = Some(piece);
            }
        }
    };
    let threads = split.threads.min(ends.len()).max(1);
    std::thread::scope(|scope| {
        for _ in 1..threads {
            scope.spawn(work);
        }
        work();
    });
    let pieces: Vec<Option<Piece<'_>>> = pieces
        .into_iter()
        .map(|slot| slot.into_inner().ok().flatten())
        .collect();
    stitch(pieces, &ends, keep_events)
}

/// Decodes piece `i`, which ends at the checkpoint for `end`.
#[expect(
    clippy::too_many_arguments,
    reason = "one worker's inputs, borrowed from the shared decode"
)]
fn decode_piece<'a>(
    trace: &'a [u8],
    image: &'a dyn ImageProvider,
    config: FlowConfig,
    cuts: &[usize],
    seeds: &[Option<(Time, TimeCal)>],
    i: usize,
    end: usize,
    keep_events: bool,
) -> Piece<'a> {
    let mut events = Vec::new();
    let (mut branches, start) = match i.checked_sub(1).and_then(|c| cuts.get(c)) {
        None => (Branches::new(trace, image, config), None),
        Some(&cut) => {
            let seed = seeds.get(i - 1).copied().flatten();
            let mut branches = Branches::worker(trace, image, config, cut, seed);
            if !branches.run_to(cut, &mut Sink::Drop) {
                return Piece {
                    start: None,
                    events,
                    counts: DecodeCounts::default(),
                    end: None,
                    tainted: false,
                };
            }
            branches.take_counts();
            branches.tainted = false;
            let start = Checkpoint::of(&branches);
            (branches, Some(start))
        }
    };
    let mut sink = if keep_events {
        Sink::Keep(&mut events)
    } else {
        Sink::Drop
    };
    let more = branches.run_to(end, &mut sink);
    let counts = branches.take_counts();
    let tainted = branches.tainted;
    Piece {
        start,
        events,
        counts,
        end: more.then_some(branches),
        tainted,
    }
}

/// Puts the pieces together in order, decoding again each piece whose worker started
/// from another state than the decoder before it ended in.
fn stitch(pieces: Vec<Option<Piece<'_>>>, ends: &[usize], keep_events: bool) -> Parallel {
    let mut out = Parallel {
        stats: ParallelStats {
            pieces: pieces.len(),
            ..ParallelStats::default()
        },
        ..Parallel::default()
    };
    let mut current: Option<Branches<'_>> = None;
    for (i, piece) in pieces.into_iter().enumerate() {
        let piece = piece.unwrap_or(Piece {
            start: None,
            events: Vec::new(),
            counts: DecodeCounts::default(),
            end: None,
            tainted: false,
        });
        let difference = if i == 0 {
            None
        } else {
            let Some(decoder) = current.as_ref() else {
                out.stats.unreached += 1;
                continue;
            };
            match &piece.start {
                None => Some("no checkpoint"),
                Some(start) => start
                    .difference(&Checkpoint::of(decoder))
                    .or(piece.tainted.then_some("trace stop after an unknown block")),
            }
        };
        if difference.is_none() {
            out.stats.taken += 1;
            add_counts(&mut out.counts, piece.counts);
            out.events.push(piece.events);
            current = piece.end;
            continue;
        }
        out.stats.redone += 1;
        out.stats.first_difference = out.stats.first_difference.or(difference);
        let Some(mut decoder) = current.take() else {
            continue;
        };
        let mut events = Vec::new();
        let mut sink = if keep_events {
            Sink::Keep(&mut events)
        } else {
            Sink::Drop
        };
        let end = ends.get(i).copied().unwrap_or(usize::MAX);
        let more = decoder.run_to(end, &mut sink);
        add_counts(&mut out.counts, decoder.take_counts());
        out.events.push(events);
        current = more.then_some(decoder);
    }
    out.events.retain(|piece| !piece.is_empty());
    out
}

fn add_counts(total: &mut DecodeCounts, piece: DecodeCounts) {
    total.instructions += piece.instructions;
    total.blocks += piece.blocks;
    total.events += piece.events;
    for (sum, n) in total.branches.iter_mut().zip(piece.branches) {
        *sum += n;
    }
    total.errors.extend(piece.errors);
}
