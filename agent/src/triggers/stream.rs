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
