//! Call stacks from branch events: one thread's branch events (calls, returns, jumps,
//! syscalls, interrupts, trace starts/stops/gaps, decode errors) in time order → properly
//! nested [`StackEvent`]s, one slice per function call.
//!
//! The rules follow magic-trace's (`src/trace_writer.ml`):
//! - a call opens a frame for its target; a return closes the innermost frame;
//! - a return into another function than the caller's frame is in replaces that frame
//!   (a call that ends a function and returns into the next one; unsymbolized code);
//! - a return that leaves the stack empty returns into a function whose call was before
//!   the window: a frame for it is put *under* everything seen so far, beginning at the
//!   start of the window (`NAME [inferred start time]`);
//! - a return whose target is the return address of a deeper frame (longjmp, exceptions,
//!   return-address tricks) closes every frame down to that one, so no staircase of frames
//!   that never returned is left behind;
//! - a jump to the first instruction of another function is a tail call (or a PLT stub's
//!   jump): it replaces the innermost frame; a jump into the middle of a function that is on
//!   the stack (a context switch such as Go's `gogo`) closes the frames down to it and opens
//!   it afresh; a jump into the middle of any other function replaces the innermost frame;
//! - syscalls and interrupts nest as `[syscall]` / `[interrupt]` until the return to user
//!   code (or tracing resuming);
//! - tracing stopping opens `[untraced]` until it starts again; a trace gap does the same;
//! - a decode error leaves a zero-length `[decode error: MESSAGE]` slice where it happened,
//!   closes every frame and starts a new window at its time.
//!
//! Timestamps are clamped to be non-decreasing; [`spread_ties`] then spreads the slices
//! that begin at one timestamp over the time to the next event (magic-trace's rule), so
//! calls made "at once" get a width and an order while nesting stays valid. Symbols are looked up through a caller-given function (address →
//! [`Symbol`]), so this module knows nothing of ELF files.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::fmt;
use std::hash::BuildHasherDefault;
use std::rc::Rc;

use super::StackEvent;
use crate::decode::pt::flow::branches::BranchKind;
use crate::decode::pt::flow::cache::IpHasher;
/// The branches this module reconstructs from: the decoder's, as the PT decode puts them on
/// threads ([`crate::decode::pt_snapshot`]).
pub use crate::decode::pt_snapshot::Branch;

/// The function an address is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Shared: the same function is looked up again for every call and jump into it.
    pub name: Rc<str>,
    /// The function's first address.
    pub start: u64,
}

/// What a slice is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A function call; `inferred_start` when the call was before the window (the slice
    /// then begins at the window's start).
    Function {
        name: Rc<str>,
        start: u64,
        inferred_start: bool,
    },
    Syscall,
    Interrupt,
    Untraced,
    DecodeError(String),
}

impl fmt::Display for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Function {
                name,
                inferred_start: true,
                ..
            } => write!(f, "{name} [inferred start time]"),
            Self::Function { name, .. } => f.write_str(name),
            Self::Syscall => f.write_str("[syscall]"),
            Self::Interrupt => f.write_str("[interrupt]"),
            Self::Untraced => f.write_str("[untraced]"),
            Self::DecodeError(message) => write!(f, "[decode error: {message}]"),
        }
    }
}

impl Frame {
    fn function_start(&self) -> Option<u64> {
        match self {
            Self::Function { start, .. } => Some(*start),
            _ => None,
        }
    }
}

/// The longest x86 instruction: a return lands at most this far after its call.
const MAX_INSN_LEN: u64 = 15;

/// No node (end of a child list). Also the most nodes a builder makes (4 G slices: about
/// 12 GiB of PT at a call per 3 bytes); later branches are dropped.
const NONE: u32 = u32::MAX;

/// A slice; its children are a linked list (no allocation per node: a large trace has
/// millions, so a node is 32 bytes and names its frame by index).
struct Node {
    frame: u32,
    first_child: u32,
    last_child: u32,
    next_sibling: u32,
    begin: u64,
    end: u64,
}

/// The frames of the nodes, each kind once: a function per (start, inferred), the pseudo
/// frames at fixed indices, each decode error anew.
struct Frames {
    list: Vec<Frame>,
    functions: HashMap<(u64, bool), u32, BuildHasherDefault<IpHasher>>,
}

impl Frames {
    const SYSCALL: u32 = 0;
    const INTERRUPT: u32 = 1;
    const UNTRACED: u32 = 2;

    fn new() -> Self {
        Self {
            list: vec![Frame::Syscall, Frame::Interrupt, Frame::Untraced],
            functions: HashMap::default(),
        }
    }

    fn get(&self, id: u32) -> &Frame {
        &self.list[id as usize]
    }

    fn push(&mut self, frame: Frame) -> u32 {
        let id = u32::try_from(self.list.len()).unwrap_or(NONE);
        self.list.push(frame);
        id
    }

    fn intern(&mut self, frame: Frame) -> u32 {
        match frame {
            Frame::Syscall => Self::SYSCALL,
            Frame::Interrupt => Self::INTERRUPT,
            Frame::Untraced => Self::UNTRACED,
            Frame::DecodeError(_) => self.push(frame),
            Frame::Function {
                start,
                inferred_start,
                ref name,
            } => {
                let key = (start, inferred_start);
                let Some(&id) = self.functions.get(&key) else {
                    let id = self.push(frame);
                    self.functions.insert(key, id);
                    return id;
                };
                // The same start with another name (a CPU track over two processes): kept
                // apart, not interned.
                let same = matches!(self.get(id), Frame::Function { name: known, .. }
                    if Rc::ptr_eq(known, name) || known == name);
                if same { id } else { self.push(frame) }
            }
        }
    }
}

struct Open {
    node: u32,
    /// The call instruction that opened the frame, when known.
    call_site: Option<u64>,
}

struct Builder<S> {
    symbol: S,
    nodes: Vec<Node>,
    frames: Frames,
    /// Set when `nodes` is full: later branches are dropped.
    full: bool,
    roots: Vec<u32>,
    /// `roots[window_roots..]` are the top-level slices of the current window.
    window_roots: usize,
    window_start: u64,
    stack: Vec<Open>,
    now: u64,
}

impl<S: Fn(u64) -> Option<Symbol>> Builder<S> {
    fn new(window_start: u64, symbol: S) -> Self {
        Self {
            symbol,
            nodes: Vec::new(),
            frames: Frames::new(),
            full: false,
            roots: Vec::new(),
            window_roots: 0,
            window_start,
            stack: Vec::new(),
            now: window_start,
        }
    }

    fn function(&self, addr: u64) -> Option<Frame> {
        (self.symbol)(addr).map(|s| Frame::Function {
            name: s.name,
            start: s.start,
            inferred_start: false,
        })
    }

    /// The function at `addr`, or `[unknown @ ADDR]` (a call must open a frame even into
    /// unknown code, or its return would close the caller's).
    fn function_or_unknown(&self, addr: u64) -> Frame {
        self.function(addr).unwrap_or_else(|| Frame::Function {
            name: format!("[unknown @ {addr:#x}]").into(),
            start: addr,
            inferred_start: false,
        })
    }

    /// A new node for `frame`, or `None` when the builder is full.
    fn node(&mut self, frame: Frame, begin: u64, end: u64) -> Option<u32> {
        let id = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&id| id < NONE)?;
        let frame = self.frames.intern(frame);
        self.nodes.push(Node {
            frame,
            first_child: NONE,
            last_child: NONE,
            next_sibling: NONE,
            begin,
            end,
        });
        Some(id)
    }

    fn open(&mut self, frame: Frame, call_site: Option<u64>) {
        let Some(id) = self.node(frame, self.now, self.now) else {
            self.full = true;
            return;
        };
        match self.stack.last().map(|o| o.node) {
            Some(parent) => self.append_child(parent, id),
            None => self.roots.push(id),
        }
        self.stack.push(Open {
            node: id,
            call_site,
        });
    }

    fn append_child(&mut self, parent: u32, child: u32) {
        match self.nodes[parent as usize].last_child {
            NONE => self.nodes[parent as usize].first_child = child,
            last => self.nodes[last as usize].next_sibling = child,
        }
        self.nodes[parent as usize].last_child = child;
    }

    fn close_top(&mut self) -> Option<Open> {
        let open = self.stack.pop()?;
        self.nodes[open.node as usize].end = self.now;
        Some(open)
    }

    /// The frame of node `id`.
    fn frame(&self, id: u32) -> &Frame {
        self.frames.get(self.nodes[id as usize].frame)
    }

    /// Closes frames until the stack has `depth` frames.
    fn close_to(&mut self, depth: usize) {
        while self.stack.len() > depth {
            self.close_top();
        }
    }

    fn top_frame(&self) -> Option<&Frame> {
        self.stack.last().map(|o| self.frame(o.node))
    }

    /// Closes an innermost `[untraced]` (or, with `kernel`, `[syscall]`/`[interrupt]`).
    fn close_pseudo(&mut self, kernel: bool) {
        while let Some(frame) = self.top_frame() {
            let pseudo = match frame {
                Frame::Untraced => true,
                Frame::Syscall | Frame::Interrupt => kernel,
                _ => false,
            };
            if !pseudo {
                break;
            }
            self.close_top();
        }
    }

    /// Puts a frame for the function at `addr` under the whole window.
    fn infer_caller(&mut self, addr: u64) {
        let Some(Frame::Function { name, start, .. }) = self.function(addr) else {
            return;
        };
        let frame = Frame::Function {
            name,
            start,
            inferred_start: true,
        };
        let Some(id) = self.node(frame, self.window_start, self.now) else {
            self.full = true;
            return;
        };
        let children: Vec<u32> = self.roots.drain(self.window_roots..).collect();
        for child in children {
            self.append_child(id, child);
        }
        self.roots.push(id);
        self.stack.insert(
            0,
            Open {
                node: id,
                call_site: None,
            },
        );
    }

    fn on_return(&mut self, to: u64) {
        self.close_pseudo(true);
        let returns_to = |o: &Open| {
            o.call_site
                .is_some_and(|site| to > site && to - site <= MAX_INSN_LEN)
        };
        match self.stack.iter().rposition(returns_to) {
            Some(depth) => self.close_to(depth),
            None => {
                self.close_top();
            }
        }
        if self.stack.is_empty() {
            self.infer_caller(to);
            return;
        }
        // Returning into another function than the caller's (a call as the last
        // instruction of a function that falls through, or code without symbols where each
        // address is its own "function"): the caller's frame becomes that function's.
        let Some(target) = self.function(to) else {
            return;
        };
        let top = self.top_frame().and_then(Frame::function_start);
        if top.is_some() && top != target.function_start() {
            let call_site = self.close_top().and_then(|o| o.call_site);
            self.open(target, call_site);
        }
    }

    fn on_jump(&mut self, to: u64) {
        let Some(target) = self.function(to) else {
            return;
        };
        self.close_pseudo(false);
        let target_start = target.function_start();
        let Some(top) = self.top_frame() else {
            // Jumping inside a function whose call was before the window.
            self.infer_caller(to);
            return;
        };
        if top.function_start() == target_start {
            return;
        }
        let is_entry = target_start == Some(to);
        let on_stack = self
            .stack
            .iter()
            .rposition(|o| self.frame(o.node).function_start() == target_start);
        let depth = match on_stack {
            Some(depth) if !is_entry => depth,
            _ => self.stack.len() - 1,
        };
        let call_site = self.stack.get(depth).and_then(|o| o.call_site);
        self.close_to(depth);
        self.open(target, call_site);
    }

    fn on_error(&mut self, message: &str) {
        // Where it happened (inside the open frames), then the stack is no longer known.
        self.close_pseudo(true);
        self.open(Frame::DecodeError(message.to_owned()), None);
        self.close_top();
        self.close_to(0);
        self.window_start = self.now;
        self.window_roots = self.roots.len();
    }

    fn step(&mut self, branch: &Branch) {
        if self.full {
            return;
        }
        self.now = self.now.max(branch.time_ns);
        match branch.kind {
            BranchKind::Call => {
                self.close_pseudo(false);
                let frame = self.function_or_unknown(branch.to);
                self.open(frame, Some(branch.from));
            }
            BranchKind::Return => self.on_return(branch.to),
            BranchKind::Jump | BranchKind::FarJump => self.on_jump(branch.to),
            BranchKind::Syscall | BranchKind::FarCall => {
                self.close_pseudo(false);
                self.open(Frame::Syscall, None);
            }
            BranchKind::Interrupt => {
                self.close_pseudo(false);
                self.open(Frame::Interrupt, None);
            }
            BranchKind::FarReturn => self.close_pseudo(true),
            BranchKind::TraceStop | BranchKind::TraceGap => {
                if !matches!(
                    self.top_frame(),
                    Some(Frame::Untraced | Frame::Syscall | Frame::Interrupt)
                ) {
                    self.open(Frame::Untraced, None);
                }
            }
            BranchKind::TraceStart => {
                self.close_pseudo(true);
                if self.stack.is_empty()
                    && let Some(frame) = self.function(branch.to)
                {
                    self.open(frame, None);
                }
            }
            BranchKind::Error => {
                let message = branch.error.as_deref().unwrap_or("unknown");
                self.on_error(message);
            }
        }
    }

    /// Hands the slices out depth-first, in order.
    fn finish_into(mut self, mut out: impl FnMut(StackEvent<Frame>)) {
        self.close_to(0);
        // Without recursion: (node, next child to visit).
        let mut walk: Vec<(u32, u32)> = Vec::new();
        for &root in &self.roots {
            let node = &self.nodes[root as usize];
            out(StackEvent::Begin {
                ts: node.begin,
                frame: self.frames.get(node.frame).clone(),
            });
            walk.push((root, node.first_child));
            while let Some(&mut (id, ref mut next)) = walk.last_mut() {
                if *next == NONE {
                    out(StackEvent::End {
                        ts: self.nodes[id as usize].end,
                    });
                    walk.pop();
                    continue;
                }
                let child = *next;
                let c = &self.nodes[child as usize];
                *next = c.next_sibling;
                out(StackEvent::Begin {
                    ts: c.begin,
                    frame: self.frames.get(c.frame).clone(),
                });
                walk.push((child, c.first_child));
            }
        }
    }

    fn finish(self) -> Vec<StackEvent<Frame>> {
        let mut events = Vec::with_capacity(self.nodes.len() * 2);
        self.finish_into(|e| events.push(e));
        events
    }
}

/// One thread's slices from its branch events (in time order; earlier times after later
/// ones are clamped). `symbol` gives the function an address is in (`None`: unknown; a
/// call there opens `[unknown @ ADDR]`, a jump or return there changes no frame).
pub fn reconstruct(
    branches: &[Branch],
    symbol: impl Fn(u64) -> Option<Symbol>,
) -> Vec<StackEvent<Frame>> {
    let window_start = branches.first().map_or(0, |b| b.time_ns);
    reconstruct_window(window_start, branches, symbol)
}

/// [`reconstruct`] for a window that began at `window_start` (e.g. the snapshot's start,
/// when the thread's first branch came later): frames whose call was before the window
/// begin there.
pub fn reconstruct_window(
    window_start: u64,
    branches: &[Branch],
    symbol: impl Fn(u64) -> Option<Symbol>,
) -> Vec<StackEvent<Frame>> {
    let window_start = branches
        .first()
        .map_or(window_start, |b| window_start.min(b.time_ns));
    let mut builder = Builder::new(window_start, symbol);
    for branch in branches {
        builder.step(branch);
    }
    builder.finish()
}

/// [`reconstruct`] then [`spread_ties`], fed one branch at a time: a consumer holds one
/// per thread while a trace is decoded, so the branches themselves are never stored, and
/// the slices go out as they are listed (only a run of events at one timestamp is held).
pub struct Reconstruction<S> {
    builder: Builder<S>,
    started: bool,
}

impl<S: Fn(u64) -> Option<Symbol>> Reconstruction<S> {
    /// The window starts at the first branch.
    pub fn new(symbol: S) -> Self {
        Self {
            builder: Builder::new(0, symbol),
            started: false,
        }
    }

    /// The next branch (in time order; earlier times are clamped).
    pub fn step(&mut self, branch: &Branch) {
        if !self.started {
            self.started = true;
            self.builder.window_start = branch.time_ns;
            self.builder.now = branch.time_ns;
        }
        self.builder.step(branch);
    }

    /// Hands the slices, ties spread, to `out`.
    pub fn finish(self, out: impl FnMut(StackEvent<Frame>)) {
        let mut spread = Spreader {
            run: Vec::new(),
            out,
        };
        self.builder.finish_into(|e| spread.push(e));
        spread.flush(None);
    }
}

/// [`spread_ties`] over a stream: holds the events of the current timestamp until a
/// later one arrives.
struct Spreader<O: FnMut(StackEvent<Frame>)> {
    run: Vec<StackEvent<Frame>>,
    out: O,
}

impl<O: FnMut(StackEvent<Frame>)> Spreader<O> {
    fn push(&mut self, event: StackEvent<Frame>) {
        let time = event_ts(&event);
        let run_time = self.run.first().and_then(event_ts);
        if time.is_none() || run_time.is_some_and(|t| Some(t) != time) {
            self.flush(time);
        }
        if time.is_none() {
            (self.out)(event);
        } else {
            self.run.push(event);
        }
    }

    /// Spreads the run up to `next` (a later time) and hands it out.
    fn flush(&mut self, next: Option<u64>) {
        if let (Some(time), Some(next)) = (self.run.first().and_then(event_ts), next)
            && next > time
        {
            spread_run(&mut self.run, time, next);
        }
        for event in self.run.drain(..) {
            (self.out)(event);
        }
    }
}

fn event_ts(e: &StackEvent<Frame>) -> Option<u64> {
    match e {
        StackEvent::Begin { ts, .. } | StackEvent::End { ts } => Some(*ts),
        StackEvent::Gap { .. } | StackEvent::OffCpu { .. } => None,
    }
}

/// Spreads events that share a timestamp (as magic-trace does): in each run of events at
/// time `t`, followed by events at `next`, the k-th new slice begins at
/// `t + (next - t) * k / n` (n: the slices beginning in the run, not counting those whose
/// start was inferred), and an end takes the time of the last slice begun before it (or
/// `next` after the last one). Order, and so nesting, is unchanged; times stay
/// non-decreasing. The last run keeps its time.
pub fn spread_ties(events: &mut [StackEvent<Frame>]) {
    let mut run = 0;
    while run < events.len() {
        let Some(time) = event_ts(&events[run]) else {
            run += 1;
            continue;
        };
        let mut after = run + 1;
        while after < events.len() && event_ts(&events[after]) == Some(time) {
            after += 1;
        }
        if let Some(next) = events.get(after).and_then(event_ts).filter(|&n| n > time) {
            spread_run(&mut events[run..after], time, next);
        }
        run = after;
    }
}

/// Spreads one run of events at `time` over the time to `next` (see [`spread_ties`]).
fn spread_run(events: &mut [StackEvent<Frame>], time: u64, next: u64) {
    fn counts(e: &StackEvent<Frame>) -> bool {
        !matches!(
            e,
            StackEvent::Begin {
                frame: Frame::Function {
                    inferred_start: true,
                    ..
                },
                ..
            } | StackEvent::End { .. }
                | StackEvent::Gap { .. }
                | StackEvent::OffCpu { .. }
        )
    }
    /// `step * num / den` without overflow (`num <= den`, so it fits).
    fn part(step: u64, num: u64, den: u64) -> u64 {
        let value = u128::from(step) * u128::from(num) / u128::from(den.max(1));
        u64::try_from(value).unwrap_or(step)
    }
    let begins = events.iter().filter(|e| counts(e)).count() as u64;
    let mut index = 0u64;
    let mut begun = false;
    for e in events {
        let counted = counts(e);
        if counted && begun {
            index += 1;
        }
        let step = next - time;
        let at = if begins == 0 {
            time
        } else if counted || !begun {
            time + part(step, index, begins)
        } else {
            // An end after the index-th begin: at the next begin's time.
            time + part(step, index + 1, begins)
        };
        begun |= counted;
        match e {
            StackEvent::Begin { ts, .. } | StackEvent::End { ts } => *ts = at,
            StackEvent::Gap { .. } | StackEvent::OffCpu { .. } => {}
        }
    }
}

#[cfg(test)]
#[path = "branches_tests.rs"]
mod tests;
