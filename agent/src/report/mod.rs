//! Report stage: what a snapshot says happened, in numbers and one line a person can act
//! on.
//!
//! In: the triggering thread's slices as a trace sink sees them (begin and end, each frame
//! with its module; `[off-cpu]` slices with whether the thread was preempted), and the
//! trigger (rule, kind, time, duration, stack). Out: a [`Report`]: the interval the trigger
//! is about (the slow call from its kernel-timed entry to its return, or the window before
//! a signal or entry trigger), that interval's time on and off the CPU by stack
//! ([`Entry`], largest first), a depth-limited call tree, and a verdict
//! (`handle_request 20.2 ms: 98 % off-CPU, sleeping in clock_nanosleep ← nanosleep ←
//! wait_for_backend ← handle_request`).
//!
//! Why here, fed by events: the same engine serves a trace being written (the writer tees
//! its events into a [`Collector`], so the agent's metadata and the CLI's log carry the
//! verdict), a snapshot decoded again, and a trace file read back ([`read`]).
#![forbid(unsafe_code)]

pub mod read;
mod reason;
mod verdict;

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

pub use reason::{Reason, plain_name};

/// The slice name of a stretch the thread spent off the CPU (a context switch said so).
pub const OFF_CPU: &str = "[off-cpu]";
/// The slice name of a stretch without samples.
pub const UNTRACED: &str = "[untraced]";
/// The prefix of a trigger instant's name (`trigger: <rule>`).
pub const TRIGGER_PREFIX: &str = "trigger: ";
/// The window a trigger without a duration (signal, entry) is explained over, by default.
pub const DEFAULT_WINDOW_NS: u64 = 10_000_000;
/// How deep the call tree goes below its root, by default.
pub const DEFAULT_DEPTH: usize = 6;

/// The trigger a report explains.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TriggerInfo {
    pub rule: String,
    /// `function`, `syscall`, `signal`, `manual`.
    pub kind: String,
    pub detail: String,
    pub pid: u32,
    pub tid: u32,
    /// The thread's name, where known (a snapshot has it; a trace read back does not).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub comm: String,
    /// The kernel's time of the trigger (the return, for a latency trigger).
    pub time_ns: u64,
    /// The call's or syscall's duration (latency triggers; `null` otherwise).
    pub duration_ns: Option<u64>,
    /// The trigger stack's functions, outermost first (the last is the probed function
    /// for a function trigger, which fires inside it).
    #[serde(skip)]
    pub stack: Vec<String>,
}

impl TriggerInfo {
    /// The interval `[start, end)` the report explains: the call (entry = return −
    /// duration, both the kernel's timestamps) for a latency trigger, else the `window`
    /// before the trigger.
    #[must_use]
    pub fn interval(&self, window_ns: u64) -> (u64, u64) {
        match self.duration_ns {
            Some(d) if self.is_latency() => (self.time_ns.saturating_sub(d), self.time_ns),
            _ => (self.time_ns.saturating_sub(window_ns), self.time_ns),
        }
    }

    /// A function or syscall trigger that timed a call (its interval is the call).
    #[must_use]
    pub fn is_latency(&self) -> bool {
        self.duration_ns.is_some() && is_latency_kind(&self.kind)
    }

    /// The probed function, for a function trigger: its stack's innermost frame.
    fn probed_function(&self) -> Option<&str> {
        (self.kind == "function")
            .then(|| self.stack.last().map(String::as_str))
            .flatten()
    }

    /// The syscall of a syscall trigger, from its detail.
    fn syscall(&self) -> Option<&str> {
        (self.kind == "syscall")
            .then(|| syscall_of_detail(&self.detail))
            .flatten()
    }
}

/// Whether a trigger of `kind` times a call (`function`, `syscall`).
#[must_use]
pub fn is_latency_kind(kind: &str) -> bool {
    kind == "function" || kind == "syscall"
}

/// The syscall a syscall trigger's detail names: `read = 0, duration 1.2ms` → `read`;
/// `syscall 451 = 0, ...` (a number without a name) → `syscall 451`.
#[must_use]
pub fn syscall_of_detail(detail: &str) -> Option<&str> {
    let head = detail.split([',', '=']).next()?.trim();
    (!head.is_empty()).then_some(head)
}

/// Whether the thread ran or waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum State {
    #[serde(rename = "on-cpu")]
    OnCpu,
    #[serde(rename = "off-cpu")]
    OffCpu,
}

impl State {
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OnCpu => "on-cpu",
            Self::OffCpu => "off-cpu",
        }
    }
}

/// Time the triggering thread spent in one state in one stack during the interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub state: State,
    /// Outermost first, from the report's root (the probed function, else the deepest
    /// frame every stack of the interval shares) to the innermost frame.
    pub frames: Vec<String>,
    pub ns: u64,
    /// Off the CPU: why (from the frames it blocked in, or the switch's preemption).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
}

/// A node of the interval's call tree, in depth-first order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeNode {
    /// 0 for the root.
    pub depth: usize,
    pub name: String,
    pub ns: u64,
    pub off_cpu_ns: u64,
}

/// What a snapshot says happened around its trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub trigger: TriggerInfo,
    /// The interval's start (`CLOCK_MONOTONIC` ns) and length.
    pub interval_start_ns: u64,
    pub interval_ns: u64,
    /// How much of the interval the thread's slices cover (the rest: before its first
    /// sample or after its last).
    pub covered_ns: u64,
    pub on_cpu_ns: u64,
    pub off_cpu_ns: u64,
    /// Largest first.
    pub breakdown: Vec<Entry>,
    pub tree: Vec<TreeNode>,
    pub verdict: String,
}

/// Options of a report: the window of a trigger without a duration, the tree's depth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub window_ns: u64,
    pub depth: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            window_ns: DEFAULT_WINDOW_NS,
            depth: DEFAULT_DEPTH,
        }
    }
}

/// A frame as the sink saw it: the function and the file it is in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Frame {
    name: String,
    module: Option<String>,
    /// `[off-cpu]`: the switch was a preemption.
    preempted: bool,
}

/// What a stretch of time is added to: the state, the reason off the CPU, and the stack
/// (frame ids, outermost first, without the `[off-cpu]` slice).
type StackKey = (State, Option<Reason>, Vec<u32>);

/// Collects one thread's time in `[start, end)` by stack, from a trace's events as they
/// stream past: nothing per event is kept but the stack open now, so a PT trace's millions
/// of slices cost their frames' names once each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collector {
    thread: (u32, u32),
    interval: (u64, u64),
    /// Frame id → frame, and name → the ids of the frames with that name.
    frames: Vec<Frame>,
    ids: HashMap<String, Vec<u32>>,
    open: Vec<u32>,
    prev: Option<u64>,
    stacks: HashMap<StackKey, u64>,
}

impl Collector {
    /// A collector of `thread`'s (pid, tid) time in `interval` (`[start, end)`, see
    /// [`TriggerInfo::interval`]); every other thread's events are ignored.
    #[must_use]
    pub fn new(thread: (u32, u32), interval: (u64, u64)) -> Self {
        Self {
            thread,
            interval,
            frames: Vec::new(),
            ids: HashMap::new(),
            open: Vec::new(),
            prev: None,
            stacks: HashMap::new(),
        }
    }

    /// A slice of `thread` begins: `name` in `module`; `preempted` for an `[off-cpu]`
    /// slice whose switch was a preemption.
    pub fn begin(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        module: Option<&str>,
        preempted: bool,
    ) {
        if thread != self.thread {
            return;
        }
        self.advance(ts);
        let id = self.intern(name, module, preempted);
        self.open.push(id);
    }

    /// The innermost open slice of `thread` ends.
    pub fn end(&mut self, thread: (u32, u32), ts: u64) {
        if thread != self.thread {
            return;
        }
        self.advance(ts);
        self.open.pop();
    }

    /// The id of a frame, made the first time.
    fn intern(&mut self, name: &str, module: Option<&str>, preempted: bool) -> u32 {
        if let Some(ids) = self.ids.get(name) {
            for &id in ids {
                let f = &self.frames[id as usize];
                if f.module.as_deref() == module && f.preempted == preempted {
                    return id;
                }
            }
        }
        let id = u32::try_from(self.frames.len()).unwrap_or(u32::MAX);
        self.frames.push(Frame {
            name: name.to_owned(),
            module: module.map(str::to_owned),
            preempted,
        });
        self.ids.entry(name.to_owned()).or_default().push(id);
        id
    }

    /// Adds the time from the previous event to `ts` (the part inside the interval) to
    /// the stack open meanwhile. A time before the previous one counts as the previous
    /// (a trace out of order adds nothing twice).
    fn advance(&mut self, ts: u64) {
        let ts = self.prev.map_or(ts, |p| ts.max(p));
        if let Some(p) = self.prev {
            let (start, end) = self.interval;
            let (a, b) = (p.max(start), ts.min(end));
            if b > a && !self.open.is_empty() {
                let key = self.key();
                let ns = self.stacks.entry(key).or_default();
                *ns = ns.saturating_add(b - a);
            }
        }
        self.prev = Some(ts);
    }

    /// The state, reason and frames of the stack open now.
    fn key(&self) -> StackKey {
        let frame = |id: u32| &self.frames[id as usize];
        let off = self.open.iter().rposition(|&id| frame(id).name == OFF_CPU);
        let untraced = self
            .open
            .last()
            .is_some_and(|&id| frame(id).name == UNTRACED);
        let ids: Vec<u32> = self
            .open
            .iter()
            .copied()
            .filter(|&id| frame(id).name != OFF_CPU)
            .collect();
        match off {
            Some(i) => {
                let reason = if frame(self.open[i]).preempted {
                    Reason::Preempted
                } else {
                    reason::classify(ids.iter().rev().map(|&id| frame(id).name.as_str()))
                };
                (State::OffCpu, Some(reason), ids)
            }
            // No sample for more than two periods and no switch recorded: not running as
            // far as the recorder can tell, for no reason it saw.
            None if untraced => (State::OffCpu, Some(Reason::Other), ids),
            None => (State::OnCpu, None, ids),
        }
    }

    /// The report of `trigger` (whose interval this collector was made for) from the
    /// time collected; the call tree `depth` levels deep.
    #[must_use]
    pub fn report(&self, trigger: &TriggerInfo, depth: usize) -> Report {
        let (start, end) = self.interval;
        let segments: Vec<Segment> = self
            .stacks
            .iter()
            .map(|((state, reason, ids), &ns)| Segment {
                ns,
                state: *state,
                reason: *reason,
                frames: ids
                    .iter()
                    .map(|&id| self.frames[id as usize].clone())
                    .collect(),
            })
            .collect();
        let root = root_depth(&segments, trigger.probed_function());
        let mut report = Report {
            trigger: trigger.clone(),
            interval_start_ns: start,
            interval_ns: end.saturating_sub(start),
            covered_ns: 0,
            on_cpu_ns: 0,
            off_cpu_ns: 0,
            breakdown: Vec::new(),
            tree: Vec::new(),
            verdict: String::new(),
        };
        let mut by_stack: BTreeMap<(State, Vec<String>, Option<Reason>), u64> = BTreeMap::new();
        let mut trimmed: Vec<Segment> = Vec::with_capacity(segments.len());
        for seg in segments {
            let depth = root(&seg);
            let seg = seg.below(depth);
            report.covered_ns = report.covered_ns.saturating_add(seg.ns);
            match seg.state {
                State::OnCpu => report.on_cpu_ns = report.on_cpu_ns.saturating_add(seg.ns),
                State::OffCpu => report.off_cpu_ns = report.off_cpu_ns.saturating_add(seg.ns),
            }
            let names = seg.frames.iter().map(|f| f.name.clone()).collect();
            let ns = by_stack.entry((seg.state, names, seg.reason)).or_default();
            *ns = ns.saturating_add(seg.ns);
            trimmed.push(seg);
        }
        report.breakdown = by_stack
            .into_iter()
            .map(|((state, frames, reason), ns)| Entry {
                state,
                frames,
                ns,
                reason,
            })
            .collect();
        report
            .breakdown
            .sort_by(|a, b| b.ns.cmp(&a.ns).then_with(|| a.frames.cmp(&b.frames)));
        // Largest first, so the verdict's searches meet the largest stretch of each kind.
        trimmed.sort_by(|a, b| {
            b.ns.cmp(&a.ns)
                .then_with(|| a.frames.len().cmp(&b.frames.len()))
        });
        report.tree = tree(&trimmed, depth);
        report.verdict = verdict::verdict(&report, &trimmed);
        report
    }
}

/// A stretch of the interval the thread spent in one stack and state (all such stretches
/// of one stack added up).
#[derive(Debug, Clone)]
struct Segment {
    ns: u64,
    state: State,
    /// Outermost first, without the `[off-cpu]` slice.
    frames: Vec<Frame>,
    reason: Option<Reason>,
}

impl Segment {
    /// The segment with its frames from `depth` on.
    fn below(mut self, depth: usize) -> Self {
        let depth = depth.min(self.frames.len().saturating_sub(1));
        self.frames.drain(..depth);
        self
    }
}

/// Frames a report keeps of a stack at least, when it has no probed function to start at.
const CONTEXT: usize = 4;

/// Where each segment's frames start: at the outermost `probed` frame when the segment
/// has one, else at the deepest frame all segments share (keeping [`CONTEXT`] frames).
fn root_depth<'a>(
    segments: &[Segment],
    probed: Option<&'a str>,
) -> impl Fn(&Segment) -> usize + 'a {
    let mut common = segments.first().map_or(0, |s| s.frames.len());
    for pair in segments.windows(2) {
        let same = pair[0]
            .frames
            .iter()
            .zip(&pair[1].frames)
            .take_while(|(a, b)| a.name == b.name)
            .count();
        common = common.min(same);
    }
    // The deepest shared frame, but never so deep that fewer than `CONTEXT` frames of the
    // shortest stack are left (one stack alone shares all of itself).
    let shortest = segments.iter().map(|s| s.frames.len()).min().unwrap_or(0);
    let shared = common
        .saturating_sub(1)
        .min(shortest.saturating_sub(CONTEXT));
    move |seg: &Segment| {
        probed
            .and_then(|name| seg.frames.iter().position(|f| f.name == name))
            .unwrap_or(shared)
    }
}

/// The call tree of `segments` (frames already from the root), `depth` levels below the
/// root, children largest first.
fn tree(segments: &[Segment], depth: usize) -> Vec<TreeNode> {
    #[derive(Default)]
    struct Node {
        ns: u64,
        off: u64,
        children: BTreeMap<String, Node>,
    }
    fn walk(level: BTreeMap<String, Node>, depth: usize, out: &mut Vec<TreeNode>) {
        let mut nodes: Vec<(String, Node)> = level.into_iter().collect();
        nodes.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then_with(|| a.0.cmp(&b.0)));
        for (name, node) in nodes {
            out.push(TreeNode {
                depth,
                name,
                ns: node.ns,
                off_cpu_ns: node.off,
            });
            walk(node.children, depth + 1, out);
        }
    }
    let mut root: BTreeMap<String, Node> = BTreeMap::new();
    for seg in segments {
        let mut level = &mut root;
        for frame in seg.frames.iter().take(depth.saturating_add(1)) {
            let node = level.entry(frame.name.clone()).or_default();
            node.ns = node.ns.saturating_add(seg.ns);
            if seg.state == State::OffCpu {
                node.off = node.off.saturating_add(seg.ns);
            }
            level = &mut node.children;
        }
    }
    let mut out = Vec::new();
    walk(root, 0, &mut out);
    out
}

/// `20.2 ms`, `850 µs`, `1.50 s`: a duration for a person.
#[must_use]
pub fn human_ns(ns: u64) -> String {
    #[expect(clippy::cast_precision_loss, reason = "display only")]
    let v = ns as f64;
    if ns >= 1_000_000_000 {
        format!("{:.2} s", v / 1e9)
    } else if ns >= 10_000_000 {
        format!("{:.1} ms", v / 1e6)
    } else if ns >= 1_000_000 {
        format!("{:.2} ms", v / 1e6)
    } else if ns >= 1_000 {
        format!("{:.0} µs", v / 1e3)
    } else {
        format!("{ns} ns")
    }
}

/// `part` as a percentage of `whole`, rounded (0 when `whole` is 0).
#[must_use]
pub fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    let p = (u128::from(part) * 100 + u128::from(whole) / 2) / u128::from(whole);
    u64::try_from(p).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
