//! Intel PT events: what the event layer ([`super::evdec`]) makes of packet sequences.
//!
//! In: nothing (plain data). Out: [`Event`] (tracing enabled/disabled, asynchronous
//! branches, overflow, execution mode, TSX, paging, power and control-flow events, and
//! the raw TIP/TNT events the flow layer consumes), the [`FlowError`] every layer above
//! the packets reports, and [`EventQueue`], the pending events that wait for the packet
//! they bind to (a FUP, TIP or PSBEND). Event and error names follow libipt's, so the
//! `ptxed`-style output of [`crate::decode::pt::tools::ptxed`] can be checked against
//! Intel's corpus.

use std::collections::VecDeque;

use crate::decode::pt::packets::packet::ExecMode;

/// Why decoding (events, flow or instructions) could not go on at some point.
///
/// The messages are libipt's, so diagnostics line up with Intel's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum FlowError {
    #[error("internal error")]
    Internal,
    #[error("invalid argument")]
    Invalid,
    #[error("decoder out of sync")]
    NoSync,
    #[error("unknown opcode")]
    BadOpcode,
    #[error("unknown packet")]
    BadPacket,
    #[error("unexpected packet context")]
    BadContext,
    #[error("reached end of trace stream")]
    Eos,
    #[error("trace stream does not match query")]
    BadQuery,
    #[error("out of memory")]
    NoMemory,
    #[error("bad configuration")]
    BadConfig,
    #[error("no ip")]
    NoIp,
    #[error("ip has been suppressed")]
    IpSuppressed,
    #[error("no memory mapped at this address")]
    NoMap,
    #[error("unknown instruction")]
    BadInsn,
    #[error("no timing information")]
    NoTime,
    #[error("compressed return without call")]
    RetStackEmpty,
    #[error("bad compressed return")]
    BadRetComp,
    #[error("bad status update")]
    BadStatusUpdate,
    #[error("expected tracing enabled event")]
    NoEnable,
    #[error("event ignored")]
    EventIgnored,
    #[error("overflow")]
    Overflow,
    #[error("unknown cpu")]
    BadCpu,
}

/// What happened, with the addresses that belong to it.
///
/// `ip` fields hold the address the event binds to; they are 0 when
/// [`Event::ip_suppressed`] is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// Tracing was enabled at `ip`; `resumed` when it resumes where it was disabled.
    Enabled {
        ip: u64,
        resumed: bool,
    },
    /// Tracing was disabled by the instruction before `ip` (a branch out of the filter).
    Disabled {
        ip: u64,
    },
    /// Tracing was disabled asynchronously at `at`; execution went on at `ip`.
    AsyncDisabled {
        at: u64,
        ip: u64,
    },
    /// An interrupt, exception or other asynchronous branch from `from` to `to`.
    AsyncBranch {
        from: u64,
        to: u64,
    },
    /// CR3 changed on the next instruction that can change it.
    Paging {
        cr3: u64,
        non_root: bool,
    },
    /// CR3 changed asynchronously at `ip`.
    AsyncPaging {
        cr3: u64,
        non_root: bool,
        ip: u64,
    },
    /// The trace buffer overflowed; tracing resumed at `ip`.
    Overflow {
        ip: u64,
    },
    /// The execution mode changed at `ip`.
    ExecMode {
        mode: ExecMode,
        ip: u64,
    },
    /// A transaction began (`speculative`), committed, or `aborted` at `ip`.
    Tsx {
        speculative: bool,
        aborted: bool,
        ip: u64,
    },
    /// Tracing stopped (`TraceStop`).
    Stop,
    /// The VMCS changed on the next instruction that can change it.
    Vmcs {
        base: u64,
    },
    /// The VMCS changed asynchronously at `ip`.
    AsyncVmcs {
        base: u64,
        ip: u64,
    },
    /// Execution stopped at `ip`.
    Exstop {
        ip: u64,
    },
    /// An MWAIT at `ip` completed.
    Mwait {
        hints: u32,
        ext: u32,
        ip: u64,
    },
    /// A power state was entered.
    Pwre {
        state: u8,
        sub_state: u8,
        hw: bool,
    },
    /// A power state was left.
    Pwrx {
        last: u8,
        deepest: u8,
        interrupt: bool,
        store: bool,
        autonomous: bool,
    },
    /// A PTWRITE at `ip` wrote `payload` (`size` bytes).
    Ptwrite {
        size: u8,
        payload: u64,
        ip: u64,
    },
    /// Time moved on at `ip` (synthesized by the flow layer on request).
    Tick {
        ip: u64,
    },
    /// The core:bus ratio changed.
    Cbr {
        ratio: u8,
    },
    /// A maintenance packet.
    Mnt {
        payload: u64,
    },
    /// The target of an indirect branch (consumed by the flow layer).
    Tip {
        ip: u64,
    },
    /// Conditional branch outcomes, oldest at bit `size - 1` (consumed by the flow layer).
    Tnt {
        bits: u64,
        size: u8,
    },
    /// RFLAGS.IF changed at `ip`.
    Iflags {
        iflag: bool,
        ip: u64,
    },
    /// An interrupt or exception (with a page fault's CR2) at `ip`.
    Interrupt {
        vector: u8,
        cr2: Option<u64>,
        ip: u64,
    },
    Iret {
        ip: u64,
    },
    Smi {
        ip: u64,
    },
    Rsm {
        ip: u64,
    },
    Sipi {
        vector: u8,
    },
    Init {
        ip: u64,
    },
    Vmentry {
        ip: u64,
    },
    Vmexit {
        vector: Option<u8>,
        vmxr: Option<u64>,
        vmxq: Option<u64>,
        ip: u64,
    },
    Shutdown {
        ip: u64,
    },
    Uintr {
        vector: u8,
        ip: u64,
    },
    Uiret {
        ip: u64,
    },
    /// A trigger: `icnt` instructions after `ip`.
    Trig {
        trbv: u8,
        mult: bool,
        icnt: u16,
        ip: u64,
    },
    Swintr {
        vector: u8,
        ip: u64,
    },
    Syscall {
        ip: u64,
    },
    /// Internal: binds a packet without reporting anything.
    Ignore,
}

impl EventKind {
    /// The field that receives the binding IP, for events that have one.
    pub fn ip_mut(&mut self) -> Option<&mut u64> {
        use EventKind as K;
        match self {
            K::Enabled { ip, .. }
            | K::Disabled { ip }
            | K::AsyncDisabled { ip, .. }
            | K::AsyncPaging { ip, .. }
            | K::Overflow { ip }
            | K::ExecMode { ip, .. }
            | K::Tsx { ip, .. }
            | K::AsyncVmcs { ip, .. }
            | K::Exstop { ip }
            | K::Mwait { ip, .. }
            | K::Ptwrite { ip, .. }
            | K::Tick { ip }
            | K::Tip { ip }
            | K::Iflags { ip, .. }
            | K::Interrupt { ip, .. }
            | K::Iret { ip }
            | K::Smi { ip }
            | K::Rsm { ip }
            | K::Init { ip }
            | K::Vmentry { ip }
            | K::Vmexit { ip, .. }
            | K::Shutdown { ip }
            | K::Uintr { ip, .. }
            | K::Uiret { ip }
            | K::Trig { ip, .. }
            | K::Swintr { ip, .. }
            | K::Syscall { ip } => Some(ip),
            K::AsyncBranch { to, .. } => Some(to),
            K::Paging { .. }
            | K::Stop
            | K::Vmcs { .. }
            | K::Pwre { .. }
            | K::Pwrx { .. }
            | K::Cbr { .. }
            | K::Mnt { .. }
            | K::Tnt { .. }
            | K::Sipi { .. }
            | K::Ignore => None,
        }
    }

    /// The binding IP, for events that have one.
    pub fn ip(&self) -> Option<u64> {
        let mut copy = *self;
        copy.ip_mut().map(|ip| *ip)
    }
}

/// One event with its time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event {
    pub kind: EventKind,
    /// The event's IP is not known (the `ip` field is 0).
    pub ip_suppressed: bool,
    /// The event restates the current state (from PSB+) rather than reporting a change.
    pub status_update: bool,
    /// The trace had a TSC packet by the event, so `tsc` is wall-clock time.
    pub has_tsc: bool,
    /// The estimated TSC at the event (relative to an unknown start without `has_tsc`).
    pub tsc: u64,
    /// MTC and CYC packets lost since the last TSC (how rough `tsc` is).
    pub lost_mtc: u32,
    pub lost_cyc: u32,
    /// The decoder's IP epoch ([`crate::decode::pt::EventDecoder::ip_epoch`]) when the
    /// event's IP was taken from an exact last IP, else `None`: whether recovery after an
    /// error may resume at it.
    pub ip_exact_epoch: Option<u32>,
}

impl Event {
    pub fn new(kind: EventKind) -> Self {
        Self {
            kind,
            ip_suppressed: false,
            status_update: false,
            has_tsc: false,
            tsc: 0,
            lost_mtc: 0,
            lost_cyc: 0,
            ip_exact_epoch: None,
        }
    }

    /// The event as the decoder's future sees it in IP epoch `epoch`: whether its IP is
    /// exact in the current epoch, not the epoch's number (two decoders that started at
    /// different places count epochs differently). For the parallel decoder's checkpoints.
    pub(crate) fn in_epoch(&self, epoch: u32) -> Self {
        Self {
            ip_exact_epoch: (self.ip_exact_epoch == Some(epoch)).then_some(0),
            ..*self
        }
    }

    /// The event's IP unless it is suppressed.
    pub fn ip(&self) -> Option<u64> {
        if self.ip_suppressed {
            None
        } else {
            self.kind.ip()
        }
    }
}

/// The packet an enqueued event waits for (a bit set; an event may wait for several).
pub mod binding {
    pub const PSBEND: u8 = 1 << 0;
    pub const TIP: u8 = 1 << 1;
    pub const FUP: u8 = 1 << 2;
    pub const FUP_BOUND: u8 = 1 << 3;
    pub const EXSTOP: u8 = 1 << 4;
    pub const CFE: u8 = 1 << 5;
    pub const PWRX: u8 = 1 << 6;
    pub const ALL: u8 = u8::MAX;
}

/// Events waiting for the packet they bind to, oldest first.
#[derive(Debug, Clone, Default)]
pub struct EventQueue {
    entries: VecDeque<(u8, Event)>,
}

/// At most this many events wait at once (libipt keeps 16 slots with a gap of two).
const QUEUE_MAX: usize = 14;

impl EventQueue {
    /// Whether both queues hold the same events for the same packets, each event seen in
    /// its decoder's IP epoch ([`Event::in_epoch`]).
    pub(crate) fn same_as(&self, epoch: u32, other: &Self, other_epoch: u32) -> bool {
        self.entries.len() == other.entries.len()
            && self
                .entries
                .iter()
                .zip(&other.entries)
                .all(|((b, e), (ob, oe))| b == ob && e.in_epoch(epoch) == oe.in_epoch(other_epoch))
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Appends an event waiting for `bind`; [`FlowError::NoMemory`] when full.
    pub fn enqueue(&mut self, bind: u8, kind: EventKind) -> Result<usize, FlowError> {
        self.push(bind, Event::new(kind))
    }

    /// Appends a whole event.
    pub fn push(&mut self, bind: u8, event: Event) -> Result<usize, FlowError> {
        if self.entries.len() >= QUEUE_MAX {
            return Err(FlowError::NoMemory);
        }
        self.entries.push_back((bind, event));
        Ok(self.entries.len() - 1)
    }

    /// Removes the oldest event waiting for any of `bind`.
    #[expect(
        clippy::inline_always,
        reason = "left to the inliner, a change elsewhere made it a call per TIP (+1.1 M \
                  instructions on qemu's real trace)"
    )]
    #[inline(always)]
    pub fn dequeue(&mut self, bind: u8) -> Option<Event> {
        let index = self.entries.iter().position(|(b, _)| b & bind != 0)?;
        // Mostly the oldest (PSB+'s status events): taken off the front directly, not
        // through `remove`'s general case (a call per event; qemu's real trace: -0.7 %
        // of the decode's instructions).
        let entry = if index == 0 {
            self.entries.pop_front()
        } else {
            self.entries.remove(index)
        };
        entry.map(|(_, event)| event)
    }

    /// Whether any event waits for any of `bind`.
    pub fn pending(&self, bind: u8) -> bool {
        self.entries.iter().any(|(b, _)| b & bind != 0)
    }

    /// The index of the oldest event waiting for `bind` whose kind matches.
    pub fn find(&self, bind: u8, matches: impl Fn(&EventKind) -> bool) -> Option<usize> {
        self.entries
            .iter()
            .position(|(b, e)| b & bind != 0 && matches(&e.kind))
    }

    /// The index of the oldest event waiting for `bind`.
    pub fn peek(&self, bind: u8) -> Option<usize> {
        self.entries.iter().position(|(b, _)| b & bind != 0)
    }

    pub fn get_mut(&mut self, index: usize) -> Option<&mut Event> {
        self.entries.get_mut(index).map(|(_, e)| e)
    }

    pub fn get(&self, index: usize) -> Option<&Event> {
        self.entries.get(index).map(|(_, e)| e)
    }

    pub fn swap(&mut self, a: usize, b: usize) {
        if a < self.entries.len() && b < self.entries.len() {
            let ea = self.entries[a].1;
            self.entries[a].1 = self.entries[b].1;
            self.entries[b].1 = ea;
        }
    }

    /// Removes the event at `index`.
    pub fn remove(&mut self, index: usize) -> Option<Event> {
        self.entries.remove(index).map(|(_, e)| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequeue_takes_the_oldest_matching_event_and_keeps_order() {
        let mut q = EventQueue::default();
        q.enqueue(binding::TIP, EventKind::Stop).unwrap();
        q.enqueue(binding::FUP, EventKind::Cbr { ratio: 1 })
            .unwrap();
        q.enqueue(binding::TIP, EventKind::Cbr { ratio: 2 })
            .unwrap();
        assert!(q.pending(binding::FUP));
        assert_eq!(
            q.dequeue(binding::FUP).map(|e| e.kind),
            Some(EventKind::Cbr { ratio: 1 })
        );
        assert_eq!(
            q.dequeue(binding::TIP).map(|e| e.kind),
            Some(EventKind::Stop)
        );
        assert!(!q.pending(binding::FUP));
        for _ in 0..13 {
            q.enqueue(binding::TIP, EventKind::Stop).unwrap();
        }
        assert_eq!(
            q.enqueue(binding::TIP, EventKind::Stop),
            Err(FlowError::NoMemory)
        );
    }

    #[test]
    fn async_branch_ip_is_its_target() {
        let mut kind = EventKind::AsyncBranch { from: 1, to: 2 };
        assert_eq!(kind.ip(), Some(2));
        *kind.ip_mut().unwrap() = 3;
        assert_eq!(kind, EventKind::AsyncBranch { from: 1, to: 3 });
        assert_eq!(EventKind::Stop.ip(), None);
    }
}
