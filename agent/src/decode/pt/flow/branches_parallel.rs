//! Parallel decode: the branch events of [`Branches`], decoded on several cores.
//!
//! In: a trace, an image, a [`FlowConfig`] and a [`Split`] (how many threads, where to
//! cut). Out: the events in order, a piece at a time, to a callback while later pieces
//! decode ([`decode_parallel_with`], for the timeline stages), or all at once
//! ([`decode_parallel`], or only counted); their [`DecodeCounts`], and [`ParallelStats`]
//! (how many pieces a worker's decode gave, how many were decoded again).
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};

use super::{BranchEvent, Branches, DecodeCounts, State, WalkBlocks};
use crate::decode::pt::events::evdec::EventConfig;
use crate::decode::pt::events::evdec_seed::{self, Seed, TimingScan};
use crate::decode::pt::flow::block::{BlockDecoder, FlowConfig};
use crate::decode::pt::flow::cache::BlockCache;
use crate::decode::pt::flow::fast_blocks::FastBlocks;
use crate::decode::pt::flow::image::ImageProvider;
use crate::decode::pt::flow::insn_cache::InsnCache;
use crate::decode::pt::packets::sync;
use crate::decode::pt::timing::time::{Time, TimeCal};

/// How to cut a trace for a parallel decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Threads to decode on (1: decode sequentially, without cutting).
    pub threads: usize,
    /// Pieces to cut the trace into, at least as many as `max_bytes` asks for (each
    /// starts at a PSB).
    pub pieces: usize,
    /// The smallest piece worth a thread of its own, in trace bytes.
    pub min_bytes: usize,
    /// The largest piece, in trace bytes: what one piece's events may take in memory.
    pub max_bytes: usize,
    /// Up to twice `pieces` where each piece still has this many bytes (0: never): pieces
    /// of equal bytes are not of equal work (PSB+ and enable/disable dense stretches), and
    /// with one piece per thread the slowest decides; more pieces even it out where each
    /// is large enough for its cold caches not to matter.
    pub balance_bytes: usize,
}

impl Split {
    /// One piece per thread, none under 16 KiB (each thread's first piece starts with
    /// cold caches: a trace much shorter is decoded faster whole; the real `avscript_32`
    /// trace, 96 KiB, on 2 cores in 2 pieces: 3.21 → 2.59 ms best of 31, where 64 KiB
    /// kept it whole), and up to two per thread where each has 512 KiB
    /// ([`Split::balance_bytes`]; on the real qemu KVM-PT trace, 2 MiB on 2 cores: 22.5 →
    /// 19.9 ms; on mruby, 0.7 MiB, 4 pieces were 7–12 % slower than 2).
    pub fn threads(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            pieces: threads.max(1),
            min_bytes: 16 << 10,
            max_bytes: usize::MAX,
            balance_bytes: 512 << 10,
        }
    }

    /// As [`Split::threads`], with pieces of at most 256 KiB of trace, for decodes that
    /// keep each piece's events until they are handed out (0.7–1.1 events per byte, 40
    /// bytes each: up to ~11 MiB per piece, `threads` pieces at most).
    pub fn streaming(threads: usize) -> Self {
        Self {
            max_bytes: 256 << 10,
            ..Self::threads(threads)
        }
    }

    /// A cut at every PSB, on `threads` threads (tests: every place a cut can be).
    pub fn every_psb(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
            pieces: usize::MAX,
            min_bytes: 0,
            max_bytes: usize::MAX,
            balance_bytes: 0,
        }
    }

    /// The PSBs to cut at: ascending, each at least `min_bytes` after the last.
    fn cuts(&self, trace: &[u8]) -> Vec<usize> {
        let balanced = match self.balance_bytes {
            bytes if bytes > 0 && self.threads > 1 => {
                self.pieces.saturating_mul(2).min(trace.len() / bytes)
            }
            _ => 0,
        };
        let wanted = self
            .pieces
            .max(balanced)
            .max(trace.len().div_ceil(self.max_bytes.max(1)));
        let pieces = wanted.min(trace.len() / self.min_bytes.max(1)).max(1);
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
    /// The most pieces, at one time, taken by a thread and not handed out yet (at most
    /// the threads where events are kept: their memory).
    pub most_ahead: usize,
    /// Why the first piece decoded again was: what differed between its worker's start
    /// and the decoder before it ("no checkpoint": the worker never reached one,
    /// "trace stop after an unknown block": its events needed a block before its start).
    pub first_difference: Option<&'static str>,
}

impl ParallelStats {
    /// Adds another decode's pieces (of another ring).
    pub fn add(&mut self, other: &Self) {
        self.pieces += other.pieces;
        self.taken += other.taken;
        self.redone += other.redone;
        self.unreached += other.unreached;
        self.most_ahead = self.most_ahead.max(other.most_ahead);
        self.first_difference = self.first_difference.or(other.first_difference);
    }

    /// `P pieces: T taken from their thread, R decoded again (first: WHAT differed), U not
    /// reached`, for `--stats`.
    pub fn describe(&self) -> String {
        format!(
            "{} pieces: {} taken from their thread, {} decoded again{}, {} not reached",
            self.pieces,
            self.taken,
            self.redone,
            self.first_difference
                .map_or_else(String::new, |what| format!(" (first: {what} differed)")),
            self.unreached
        )
    }
}

/// The result of [`decode_parallel`].
#[derive(Debug, Default)]
pub struct Parallel {
    /// The branch events in order, in chunks (empty when events were not kept).
    pub events: Vec<Vec<BranchEvent>>,
    pub counts: DecodeCounts,
    pub stats: ParallelStats,
    /// What the calling thread spent before the workers started: finding the PSBs to
    /// cut at. Sequential, so the floor of a decode on many cores.
    pub prepare: std::time::Duration,
    /// What the workers spent, in all, on the time at each cut (a walk over the timing
    /// packets up to the last cut), each before the piece that needed it.
    pub seeding: std::time::Duration,
}

impl Parallel {
    /// The events in order.
    pub fn iter(&self) -> impl Iterator<Item = &BranchEvent> {
        self.events.iter().flatten()
    }
}

/// Events per chunk of a piece's events: pieces keep their events in chunks (not one
/// `Vec` that doubles, copying itself into fresh pages), recycled through [`Pool`] once
/// handed out, so a streaming decode touches the same memory again.
const CHUNK: usize = 8192;

/// Chunks handed out and emptied, for the next pieces.
#[derive(Default)]
struct Pool(Mutex<Vec<Vec<BranchEvent>>>);

impl Pool {
    fn get(&self) -> Vec<BranchEvent> {
        lock(&self.0)
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(CHUNK))
    }

    fn put(&self, mut chunk: Vec<BranchEvent>) {
        chunk.clear();
        lock(&self.0).push(chunk);
    }
}

/// Where a piece's events go.
enum Sink<'s> {
    Keep {
        chunks: &'s mut Vec<Vec<BranchEvent>>,
        pool: &'s Pool,
    },
    Drop,
}

impl Sink<'_> {
    fn take(&mut self, mut events: &[BranchEvent]) {
        let Self::Keep { chunks, pool } = self else {
            return;
        };
        while !events.is_empty() {
            if chunks.last().is_none_or(|c| c.len() >= CHUNK) {
                chunks.push(pool.get());
            }
            let Some(chunk) = chunks.last_mut() else {
                return;
            };
            let n = (CHUNK - chunk.len().min(CHUNK)).min(events.len());
            chunk.extend_from_slice(&events[..n]);
            events = &events[n..];
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
    events: Vec<Vec<BranchEvent>>,
    counts: DecodeCounts,
    /// The worker's decoder at its end checkpoint; `None` when the decode ended.
    end: Option<Branches<'a>>,
    tainted: bool,
}

/// What a worker's decoder learned of the code and the buffers it filled, handed to the
/// next piece its thread decodes.
///
/// Why: a piece's decoder starting cold decodes every block it meets for the first time
/// again and writes fresh pages (qemu's real trace, 4 pieces on 2 threads: about 2 ms of
/// CPU time over a 23 ms sequential decode). These are pure functions of the image, which every
/// piece shares, as the sequential decoder keeps them over the whole trace; they change
/// how fast a decode is, never what it gives.
struct Learned {
    cache: BlockCache,
    insns: InsnCache,
    fill_ips: Vec<u64>,
    fast: Option<FastBlocks>,
    walks: WalkBlocks,
    /// The event batch (emptied at every checkpoint) and whether it is full-sized.
    batch: (Vec<BranchEvent>, bool),
}

impl<'a> Branches<'a> {
    /// Takes what this decoder learned, leaving it cold (a decoder the stitch uses to
    /// decode a piece again only decodes slower).
    fn take_learned(&mut self) -> Learned {
        Learned {
            cache: std::mem::replace(&mut self.dec.cache, BlockCache::for_trace(0)),
            insns: std::mem::take(&mut self.dec.insns),
            fill_ips: std::mem::take(&mut self.dec.fill_ips),
            fast: self
                .fast
                .as_mut()
                .map(|fast| std::mem::replace(fast, FastBlocks::for_trace(0))),
            walks: std::mem::take(&mut self.walks),
            batch: (
                std::mem::take(&mut self.queue.buf),
                std::mem::take(&mut self.queue.full_batch),
            ),
        }
    }

    /// Goes on with what another decoder of the same image learned.
    fn learn(&mut self, learned: Learned) {
        self.dec.cache = learned.cache;
        self.dec.insns = learned.insns;
        self.dec.fill_ips = learned.fill_ips;
        if let (Some(fast), Some(learned)) = (self.fast.as_mut(), learned.fast) {
            *fast = learned;
        }
        self.walks = learned.walks;
        (self.queue.buf, self.queue.full_batch) = learned.batch;
        self.queue.clear();
    }

    /// A parallel worker: synchronized at the PSB at `offset` with `timing`, with what
    /// the thread's last piece learned.
    fn worker(
        trace: &'a [u8],
        image: &'a dyn ImageProvider,
        config: FlowConfig,
        offset: usize,
        timing: Option<(Time, TimeCal)>,
        learned: Option<Learned>,
    ) -> Self {
        let mut branches = Self::new(trace, image, config);
        if let Some(learned) = learned {
            branches.learn(learned);
        }
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
    let mut events = Vec::new();
    let mut prepare = Prepare::default();
    let (counts, stats) = run(
        trace,
        image,
        config,
        (split, keep_events, &mut prepare),
        &mut |chunk| {
            events.push(chunk);
            None
        },
    );
    Parallel {
        events,
        counts,
        stats,
        prepare: prepare.cut,
        seeding: prepare.seed,
    }
}

/// Decodes `trace` as [`Branches`] does, on `split.threads` threads, handing the events
/// to `each` in order, a piece at a time, as soon as the pieces before are handed out:
/// the timeline stages consume them while later pieces decode. At most `split.threads`
/// pieces wait decoded, which bounds the memory (a piece is at most `split.max_bytes` of
/// trace: [`Split::streaming`]). Returns the counts and how the pieces went.
pub fn decode_parallel_with(
    trace: &[u8],
    image: &dyn ImageProvider,
    config: FlowConfig,
    split: Split,
    each: &mut dyn FnMut(&[BranchEvent]),
) -> (DecodeCounts, ParallelStats) {
    let mut prepare = Prepare::default();
    run(
        trace,
        image,
        config,
        (split, true, &mut prepare),
        &mut |chunk| {
            each(&chunk);
            Some(chunk)
        },
    )
}

/// What every worker reads.
struct Job<'a> {
    trace: &'a [u8],
    image: &'a dyn ImageProvider,
    config: FlowConfig,
    cuts: Vec<usize>,
    seeds: Seeds<'a>,
    /// Piece i ends at the checkpoint for `ends[i]` (`usize::MAX`: the end of the trace).
    ends: Vec<usize>,
    keep_events: bool,
    pool: Pool,
}

/// Decoded pieces not handed out yet, and how far the hand-out is.
struct Queue<'a> {
    pieces: Vec<Option<Piece<'a>>>,
    /// Pieces before this one are handed out.
    consumed: usize,
    /// The consumer is gone (it panicked): workers stop.
    stop: bool,
}

/// What takes a chunk of events; it gives the chunk back to be used again, or keeps it.
type HandOut<'e> = dyn FnMut(Vec<BranchEvent>) -> Option<Vec<BranchEvent>> + 'e;

/// The time at each cut, from one scan of the timing packets that the workers take on
/// as far as the piece they start needs (each part of it once).
///
/// Why the workers: the scan in a thread of its own competed with them for the cores
/// until it ended (qemu's real trace on 2 cores: 3–7 ms of 16–22), and the hand-out,
/// which ran it, was late for the first pieces while workers waited for it.
struct Seeds<'a> {
    trace: &'a [u8],
    config: EventConfig,
    scan: Mutex<TimingScan<'a>>,
    /// Nanoseconds the workers spent on seeds (scanning, or waiting for the scan), in all.
    spent: AtomicU64,
}

impl<'a> Seeds<'a> {
    fn new(trace: &'a [u8], config: EventConfig, cuts: Vec<usize>) -> Self {
        Self {
            trace,
            config,
            scan: Mutex::new(TimingScan::new(trace, config, cuts)),
            spent: AtomicU64::new(0),
        }
    }

    /// The seed of cut `i` (at `cut`): from the trace just before it where that tells
    /// ([`evdec_seed::local_seed`]), else from the scan from the start, which goes on to
    /// it if no worker has taken it that far yet.
    fn get(&self, i: usize, cut: usize) -> Seed {
        let started = std::time::Instant::now();
        let seed = evdec_seed::local_seed(self.trace, self.config, cut)
            .unwrap_or_else(|| lock(&self.scan).seed(i));
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.spent.fetch_add(nanos, Ordering::Relaxed);
        seed
    }
}

/// Where a parallel decode spent its time besides the pieces' decode and the hand-out.
#[derive(Debug, Default)]
struct Prepare {
    /// Cutting, before the workers start.
    cut: std::time::Duration,
    /// The timing scan, in the workers (all of them together).
    seed: std::time::Duration,
}

/// The decode of every piece, with the hand-out in the calling thread: `each` gets the
/// events a chunk at a time and gives the chunk back to be used again, or keeps it.
/// `prepare` gets the time spent cutting before the workers start and seeding in them.
fn run(
    trace: &[u8],
    image: &dyn ImageProvider,
    config: FlowConfig,
    (split, keep_events, prepare): (Split, bool, &mut Prepare),
    each: &mut HandOut<'_>,
) -> (DecodeCounts, ParallelStats) {
    let started = std::time::Instant::now();
    let cuts = if split.threads > 1 || split.pieces == usize::MAX {
        split.cuts(trace)
    } else {
        Vec::new()
    };
    prepare.cut = started.elapsed();
    let ends: Vec<usize> = cuts.iter().copied().chain([usize::MAX]).collect();
    let job = Job {
        trace,
        image,
        config,
        seeds: Seeds::new(trace, config.events, cuts.clone()),
        cuts,
        ends,
        keep_events,
        pool: Pool::default(),
    };
    let pieces = job.ends.len();
    if pieces == 1 {
        // Nothing to cut (a short trace): no threads, no waiting.
        let mut stitch = Stitch::new(&job, pieces);
        stitch.add(0, decode_piece(&job, 0, &mut None), each);
        return (stitch.counts, stitch.stats);
    }
    let board = Board::new(pieces, split.threads.min(pieces).max(1), keep_events);
    let work = || {
        let mut learned = None;
        while let Some(i) = board.claim() {
            board.decode(&job, i, &mut learned);
        }
    };
    std::thread::scope(|scope| {
        // The calling thread only hands out. (Tried: it decoded too while the piece it
        // hands out next was not ready, with a worker fewer. Faster at real-time
        // priority, but without it the new worker often shared the caller's CPU for a
        // while: qemu's real trace on 2 cores, median of 25 runs 8.2 → 9.9 ms.)
        for _ in 0..board.threads {
            scope.spawn(work);
        }
        let _stop = Stop(&board);
        let mut stitch = Stitch::new(&job, pieces);
        for i in 0..pieces {
            let piece = board.take(i);
            stitch.add(i, piece, each);
            board.handed_out(i);
        }
        prepare.seed = std::time::Duration::from_nanos(job.seeds.spent.load(Ordering::Relaxed));
        let stats = ParallelStats {
            most_ahead: board.ahead.load(Ordering::Relaxed),
            ..stitch.stats
        };
        (stitch.counts, stats)
    })
}

/// What the threads of a parallel decode share: the decoded pieces, the next piece no
/// thread took, and the most pieces taken ahead of the hand-out.
struct Board<'a> {
    queue: Mutex<Queue<'a>>,
    changed: Condvar,
    next: AtomicUsize,
    ahead: AtomicUsize,
    pieces: usize,
    threads: usize,
    keep_events: bool,
}

impl<'a> Board<'a> {
    fn new(pieces: usize, threads: usize, keep_events: bool) -> Self {
        Self {
            queue: Mutex::new(Queue {
                pieces: (0..pieces).map(|_| None).collect(),
                consumed: 0,
                stop: false,
            }),
            changed: Condvar::new(),
            next: AtomicUsize::new(0),
            ahead: AtomicUsize::new(0),
            pieces,
            threads,
            keep_events,
        }
    }

    /// A worker's next piece, `None` when there is none left or the hand-out stopped.
    /// Kept events: no more than `threads` pieces ahead of the hand-out (their memory).
    /// Counted ones keep nothing: a worker whose piece ended before the one before it
    /// goes on instead of waiting.
    fn claim(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        if i >= self.pieces {
            return None;
        }
        let mut q = lock(&self.queue);
        while self.keep_events && i >= q.consumed + self.threads && !q.stop {
            q = self.changed.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
        if q.stop {
            return None;
        }
        self.ahead
            .fetch_max((i + 1).saturating_sub(q.consumed), Ordering::Relaxed);
        Some(i)
    }

    /// Decodes piece `i` into the queue. A thread that fails leaves an empty piece
    /// there: the decoder before it decodes the piece again.
    fn decode(&self, job: &Job<'a>, i: usize, learned: &mut Option<Learned>) {
        let mut done = Done {
            board: self,
            i,
            piece: None,
        };
        done.piece = Some(decode_piece(job, i, learned));
    }

    /// The hand-out's piece `i`, once a worker decoded it.
    fn take(&self, i: usize) -> Piece<'a> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(piece) = q.pieces.get_mut(i).and_then(Option::take) {
                return piece;
            }
            q = self.changed.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Piece `i` is stitched and its memory given back: workers waiting for room go on.
    fn handed_out(&self, i: usize) {
        lock(&self.queue).consumed = i + 1;
        self.changed.notify_all();
    }
}

/// `mutex` locked, whether or not a thread panicked holding it (each use leaves its
/// data whole between steps).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Puts a worker's piece (or, if the worker failed, an empty one) in the queue.
struct Done<'q, 'a> {
    board: &'q Board<'a>,
    i: usize,
    piece: Option<Piece<'a>>,
}

impl Drop for Done<'_, '_> {
    fn drop(&mut self) {
        let piece = self.piece.take().unwrap_or_else(Piece::none);
        if let Some(slot) = lock(&self.board.queue).pieces.get_mut(self.i) {
            *slot = Some(piece);
        }
        self.board.changed.notify_all();
    }
}

/// Stops the workers when the hand-out ends, however it ends.
struct Stop<'q, 'a>(&'q Board<'a>);

impl Drop for Stop<'_, '_> {
    fn drop(&mut self) {
        lock(&self.0.queue).stop = true;
        self.0.changed.notify_all();
    }
}

impl Piece<'_> {
    /// A piece whose worker got nowhere.
    fn none() -> Self {
        Self {
            start: None,
            events: Vec::new(),
            counts: DecodeCounts::default(),
            end: None,
            tainted: false,
        }
    }
}

/// Decodes piece `i`, starting with what the thread's last piece learned (`learned`),
/// and leaves there what this one learned.
fn decode_piece<'a>(job: &Job<'a>, i: usize, learned: &mut Option<Learned>) -> Piece<'a> {
    let (trace, image, config) = (job.trace, job.image, job.config);
    let end = job.ends.get(i).copied().unwrap_or(usize::MAX);
    let mut events = Vec::new();
    let (mut branches, start) = match i.checked_sub(1).and_then(|c| job.cuts.get(c)) {
        None => {
            let mut branches = Branches::new(trace, image, config);
            if let Some(learned) = learned.take() {
                branches.learn(learned);
            }
            (branches, None)
        }
        Some(&cut) => {
            let seed = job.seeds.get(i - 1, cut);
            let mut branches = Branches::worker(trace, image, config, cut, seed, learned.take());
            if !branches.run_to(cut, &mut Sink::Drop) {
                *learned = Some(branches.take_learned());
                return Piece::none();
            }
            branches.take_counts();
            branches.tainted = false;
            let start = Checkpoint::of(&branches);
            (branches, Some(start))
        }
    };
    let mut sink = if job.keep_events {
        Sink::Keep {
            chunks: &mut events,
            pool: &job.pool,
        }
    } else {
        Sink::Drop
    };
    let more = branches.run_to(end, &mut sink);
    let counts = branches.take_counts();
    let tainted = branches.tainted;
    *learned = Some(branches.take_learned());
    Piece {
        start,
        events,
        counts,
        end: more.then_some(branches),
        tainted,
    }
}

/// The hand-out: pieces in order, each taken from its worker or decoded again.
struct Stitch<'j, 'a> {
    job: &'j Job<'a>,
    /// The decoder of the last piece handed out, at its end checkpoint (`None` when the
    /// decode ended).
    current: Option<Branches<'a>>,
    counts: DecodeCounts,
    stats: ParallelStats,
}

impl<'j, 'a> Stitch<'j, 'a> {
    fn new(job: &'j Job<'a>, pieces: usize) -> Self {
        Self {
            job,
            current: None,
            counts: DecodeCounts::default(),
            stats: ParallelStats {
                pieces,
                ..ParallelStats::default()
            },
        }
    }

    /// Hands out piece `i`: its worker's events where its start matches the decoder of
    /// the piece before, else the events that decoder decodes on to the piece's end.
    fn add(&mut self, i: usize, piece: Piece<'a>, each: &mut HandOut<'_>) {
        let difference = if i == 0 {
            None
        } else {
            let Some(decoder) = self.current.as_ref() else {
                self.stats.unreached += 1;
                return;
            };
            match &piece.start {
                None => Some("no checkpoint"),
                Some(start) => start
                    .difference(&Checkpoint::of(decoder))
                    .or(piece.tainted.then_some("trace stop after an unknown block")),
            }
        };
        if difference.is_none() {
            self.stats.taken += 1;
            add_counts(&mut self.counts, piece.counts);
            self.hand_out(piece.events, each);
            self.current = piece.end;
            return;
        }
        self.stats.redone += 1;
        self.stats.first_difference = self.stats.first_difference.or(difference);
        let Some(mut decoder) = self.current.take() else {
            return;
        };
        let mut events = Vec::new();
        let mut sink = if self.job.keep_events {
            Sink::Keep {
                chunks: &mut events,
                pool: &self.job.pool,
            }
        } else {
            Sink::Drop
        };
        let end = self.job.ends.get(i).copied().unwrap_or(usize::MAX);
        let more = decoder.run_to(end, &mut sink);
        add_counts(&mut self.counts, decoder.take_counts());
        self.hand_out(events, each);
        self.current = more.then_some(decoder);
    }
}

impl Stitch<'_, '_> {
    fn hand_out(&self, chunks: Vec<Vec<BranchEvent>>, each: &mut HandOut<'_>) {
        for chunk in chunks {
            if let Some(used) = each(chunk) {
                self.job.pool.put(used);
            }
        }
    }
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

#[cfg(test)]
mod split_tests {
    use super::*;

    /// `len` bytes of PADs with a PSB every 4 KiB.
    fn psbs(len: usize) -> Vec<u8> {
        let mut trace = vec![0u8; len];
        for at in (0..len - 16).step_by(4096) {
            trace[at..at + 16].copy_from_slice(&[0x02, 0x82].repeat(8));
        }
        trace
    }

    #[test]
    fn pieces_double_only_where_each_keeps_half_a_mebibyte() {
        let pieces = |split: Split, len: usize| split.cuts(&psbs(len)).len() + 1;
        assert_eq!(pieces(Split::threads(2), 2 << 20), 4);
        assert_eq!(pieces(Split::threads(2), 1536 << 10), 3);
        assert_eq!(pieces(Split::threads(2), 700 << 10), 2);
        assert_eq!(pieces(Split::threads(1), 2 << 20), 1);
        let unbalanced = Split {
            balance_bytes: 0,
            ..Split::threads(2)
        };
        assert_eq!(pieces(unbalanced, 2 << 20), 2);
    }
}
