//! Reads trigger records from the `EVENTS` ring buffer with tokio, and forwards the eBPF
//! programs' aya-log messages to the `log` facade.
use std::io;

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use super::event::{EventError, TriggerEvent};

/// Async reader of trigger events.
pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records that did not decode (counted, never fatal).
    pub malformed: u64,
}

impl EventStream {
    /// Wraps the ring buffer; needs a tokio runtime with IO enabled.
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the ring owns its fd (closed on drop) and is never replaced while registered.
        let ring = unsafe { AsyncFd::register(ring) }?;
        Ok(Self { ring, malformed: 0 })
    }

    /// Waits until records are available and returns all of them, in ring order.
    pub async fn next_batch(&mut self) -> io::Result<Vec<TriggerEvent>> {
        loop {
            let mut guard = self.ring.readable_mut().await?;
            let events = Self::drain_ring(guard.get_inner_mut(), &mut self.malformed);
            guard.clear_ready();
            if !events.is_empty() {
                return Ok(events);
            }
        }
    }

    /// Returns whatever records are available now, without waiting.
    pub fn drain(&mut self) -> Vec<TriggerEvent> {
        Self::drain_ring(self.ring.get_mut(), &mut self.malformed)
    }

    fn drain_ring(ring: &mut RingBuf<MapData>, malformed: &mut u64) -> Vec<TriggerEvent> {
        let mut out = Vec::new();
        while let Some(item) = ring.next() {
            match TriggerEvent::from_bytes(&item) {
                Ok(event) => out.push(event),
                Err(e @ (EventError::Short { .. } | EventError::Kind { .. })) => {
                    *malformed += 1;
                    log::debug!("dropping trigger record: {e}");
                }
            }
        }
        out
    }
}

/// Forwards aya-log records from the kernel until the task is dropped.
pub async fn forward_logs(logger: aya_log::EbpfLogger<&'static dyn log::Log>) {
    // SAFETY: the logger owns its ring fd and is never replaced while registered.
    let Ok(mut fd) = (unsafe { AsyncFd::register(logger) }) else {
        return;
    };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}

/// What the kernel said about a process (agent target discovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessEvent {
    /// Process `tgid` called execve at `at_ns` (`CLOCK_MONOTONIC`): match it against the
    /// rules again. `selected`: the rules whose comm put it into the kernel's target set
    /// at this exec (0: none).
    Exec {
        tgid: u32,
        at_ns: u64,
        selected: u64,
    },
    /// Traced process `tgid` exited; the kernel already dropped its target entry.
    Exit { tgid: u32 },
}

impl ProcessEvent {
    /// Decodes one `PROC_EVENTS` record; `None` for short records and unknown kinds.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        use lookback_common::process::{PROC_EXEC, PROC_EXIT, PROCESS_RECORD_SIZE, ProcessRecord};
        if bytes.len() < PROCESS_RECORD_SIZE {
            return None;
        }
        // SAFETY: length checked; ProcessRecord is repr(C) plain integers, valid for every
        // bit pattern; read_unaligned makes no alignment assumption on ring memory.
        let r: ProcessRecord = unsafe { bytes.as_ptr().cast::<ProcessRecord>().read_unaligned() };
        match r.kind {
            PROC_EXEC => Some(Self::Exec {
                tgid: r.tgid,
                at_ns: r.timestamp_ns,
                selected: r.selected,
            }),
            PROC_EXIT => Some(Self::Exit { tgid: r.tgid }),
            _ => None,
        }
    }
}

/// Async reader of exec/exit events.
pub struct ProcessEventStream {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl ProcessEventStream {
    /// Wraps the `PROC_EVENTS` ring buffer; needs a tokio runtime with IO enabled.
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the ring owns its fd (closed on drop) and is never replaced while registered.
        let ring = unsafe { AsyncFd::register(ring) }?;
        Ok(Self { ring })
    }

    /// Waits until events are available and returns all of them, in ring order.
    pub async fn next_batch(&mut self) -> io::Result<Vec<ProcessEvent>> {
        loop {
            let mut guard = self.ring.readable_mut().await?;
            let ring = guard.get_inner_mut();
            let mut out = Vec::new();
            while let Some(item) = ring.next() {
                out.extend(ProcessEvent::from_bytes(&item));
            }
            guard.clear_ready();
            if !out.is_empty() {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lookback_common::process::{PROC_EXEC, PROC_EXIT, ProcessRecord};

    use super::ProcessEvent;

    fn bytes(r: ProcessRecord) -> Vec<u8> {
        let mut out = r.timestamp_ns.to_ne_bytes().to_vec();
        out.extend(r.kind.to_ne_bytes());
        out.extend(r.tgid.to_ne_bytes());
        out.extend(r.selected.to_ne_bytes());
        out
    }

    #[test]
    fn process_records_decode() {
        let exec = ProcessRecord {
            timestamp_ns: 5,
            kind: PROC_EXEC,
            tgid: 42,
            selected: 0b100,
        };
        assert_eq!(
            ProcessEvent::from_bytes(&bytes(exec)),
            Some(ProcessEvent::Exec {
                tgid: 42,
                at_ns: 5,
                selected: 0b100
            })
        );
        let exit = ProcessRecord {
            kind: PROC_EXIT,
            ..exec
        };
        assert_eq!(
            ProcessEvent::from_bytes(&bytes(exit)),
            Some(ProcessEvent::Exit { tgid: 42 })
        );
        let unknown = ProcessRecord { kind: 9, ..exec };
        assert_eq!(ProcessEvent::from_bytes(&bytes(unknown)), None);
        assert_eq!(ProcessEvent::from_bytes(&[0; 16]), None);
    }
}
