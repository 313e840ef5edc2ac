//! The AUX area of a perf event (Intel PT trace bytes), mapped read-only: overwrite mode
//! (Linux 4.1). The hardware keeps writing around the buffer; nothing is ever consumed.
//!
//! In overwrite mode `aux_head` is the *offset* in the buffer where the next byte goes
//! (the PT driver's snapshot mode), not a free-running counter. Whether the buffer has
//! wrapped is not published, so it is inferred the way perf does: the buffer starts
//! zeroed, and once anything past the head is non-zero the trace has been around at least
//! once. A head beyond the buffer size (a free-running counter, in case a driver reports
//! one) also means wrapped. Once seen wrapped, an area stays wrapped.
//!
//! In: the area's bytes and `aux_head`. Out: [`AuxCopy`], the trace oldest byte first
//! (`[head, end)` then `[0, head)` when wrapped, `[0, head)` otherwise). The decoder
//! synchronises at the first PSB, so starting mid-packet is fine.

use std::os::fd::BorrowedFd;

use super::CaptureError;
use crate::sys::mmap::Mapping;

/// The AUX trace copied out, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuxCopy {
    pub data: Vec<u8>,
    /// The buffer had wrapped: the oldest bytes were overwritten (the copy is full).
    pub wrapped: bool,
    /// `aux_head` as read, reduced to an offset in the buffer.
    pub head_offset: u64,
}

/// Whether `aux_head` over a buffer of `size` bytes shows a wrap on its own.
fn head_offset(head: u64, size: usize) -> (usize, bool) {
    let size64 = size as u64;
    let offset = usize::try_from(head % size64).unwrap_or(0);
    (offset, head >= size64)
}

/// Copies `data` (the whole AUX area) oldest first, given `aux_head` and whether it was
/// already known to have wrapped.
pub fn aux_snapshot(data: &[u8], head: u64, known_wrapped: bool) -> AuxCopy {
    if data.is_empty() {
        return AuxCopy {
            data: Vec::new(),
            wrapped: known_wrapped,
            head_offset: 0,
        };
    }
    let (offset, head_wrapped) = head_offset(head, data.len());
    let wrapped = known_wrapped || head_wrapped || data[offset..].iter().any(|&b| b != 0);
    let mut out = Vec::with_capacity(if wrapped { data.len() } else { offset });
    if wrapped {
        out.extend_from_slice(&data[offset..]);
    }
    out.extend_from_slice(&data[..offset]);
    AuxCopy {
        data: out,
        wrapped,
        head_offset: offset as u64,
    }
}

/// A read-only (overwrite-mode) AUX mapping and what is known about its wrap.
#[derive(Debug)]
pub struct AuxArea {
    map: Mapping,
    wrapped: bool,
}

impl AuxArea {
    /// Maps `size` bytes (a power of two of pages) of `fd` at `offset` read-only. The
    /// ring's metadata page must already carry `aux_offset`/`aux_size`.
    pub fn map(fd: BorrowedFd<'_>, offset: u64, size: usize) -> Result<Self, CaptureError> {
        let map =
            Mapping::map_fd(fd, size, offset, false).map_err(|source| CaptureError::Syscall {
                what: "mapping the AUX area",
                source,
            })?;
        Ok(Self::over(map))
    }

    /// An area over an existing mapping (tests: [`Mapping::anonymous`]).
    pub fn over(map: Mapping) -> Self {
        Self {
            map,
            wrapped: false,
        }
    }

    pub fn size(&self) -> usize {
        self.map.len()
    }

    /// Copies the trace oldest first; `head` is `aux_head` read after the trace stopped.
    pub fn copy(&mut self, head: u64) -> AuxCopy {
        let mut bytes = Vec::new();
        self.map.copy_out(0, self.map.len(), &mut bytes);
        let copy = aux_snapshot(&bytes, head, self.wrapped);
        self.wrapped = copy.wrapped;
        copy
    }

    /// Writes into a fake area (tests).
    #[cfg(test)]
    pub(crate) fn fake_write(&mut self, offset: usize, bytes: &[u8]) {
        assert!(self.map.copy_in(offset, bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Simulates the PT driver writing `total` bytes (byte i = i mod 251 + 1, never zero)
    /// through a buffer of `size` bytes; returns the buffer and the head offset.
    fn written(size: usize, total: usize) -> (Vec<u8>, u64) {
        let mut buf = vec![0u8; size];
        for i in 0..total {
            buf[i % size] = u8::try_from(i % 251 + 1).unwrap();
        }
        (buf, (total % size) as u64)
    }

    fn stream(from: usize, to: usize) -> Vec<u8> {
        (from..to)
            .map(|i| u8::try_from(i % 251 + 1).unwrap())
            .collect()
    }

    #[test]
    fn not_wrapped_copies_up_to_the_head() {
        let (buf, head) = written(1024, 300);
        let copy = aux_snapshot(&buf, head, false);
        assert!(!copy.wrapped);
        assert_eq!(copy.head_offset, 300);
        assert_eq!(copy.data, stream(0, 300));
    }

    #[test]
    fn wrapped_copies_oldest_first() {
        let (buf, head) = written(1024, 2500);
        let copy = aux_snapshot(&buf, head, false);
        assert!(copy.wrapped);
        assert_eq!(copy.head_offset, 2500 % 1024);
        assert_eq!(copy.data, stream(2500 - 1024, 2500));
    }

    #[test]
    fn exactly_full_is_wrapped_with_head_at_zero() {
        let (buf, head) = written(1024, 1024);
        assert_eq!(head, 0);
        let copy = aux_snapshot(&buf, head, false);
        assert!(copy.wrapped);
        assert_eq!(copy.data, stream(0, 1024));
    }

    #[test]
    fn head_at_zero_with_nothing_written_is_empty() {
        let copy = aux_snapshot(&[0u8; 1024], 0, false);
        assert!(!copy.wrapped);
        assert!(copy.data.is_empty());
    }

    #[test]
    fn a_known_wrap_sticks_even_when_the_tail_looks_unwritten() {
        // After a wrap the bytes past the head may be PAD (0x00) packets.
        let mut buf = vec![0u8; 64];
        buf[..16].fill(0xaa);
        let copy = aux_snapshot(&buf, 16, true);
        assert!(copy.wrapped);
        assert_eq!(copy.data.len(), 64);
        assert_eq!(&copy.data[48..], &[0xaa; 16]);
    }

    #[test]
    fn a_free_running_head_past_the_end_means_wrapped() {
        let (buf, _) = written(256, 600);
        let copy = aux_snapshot(&buf, 600, false);
        assert!(copy.wrapped);
        assert_eq!(copy.data, stream(600 - 256, 600));
        assert!(aux_snapshot(&[], 7, false).data.is_empty());
    }

    #[test]
    fn area_over_fake_memory_remembers_the_wrap() {
        let mut area = AuxArea::over(Mapping::anonymous(4096).unwrap());
        assert_eq!(area.size(), 4096);
        let (buf, head) = written(4096, 5000);
        area.fake_write(0, &buf);
        assert!(area.copy(head).wrapped);
        // Even if the tail were zeroed later (PAD), the area stays wrapped.
        area.fake_write(usize::try_from(head).unwrap(), &vec![0u8; 4096 - 904]);
        let copy = area.copy(head);
        assert!(copy.wrapped);
        assert_eq!(copy.data.len(), 4096);
    }
}
