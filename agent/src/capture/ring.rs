//! perf ring buffers: the mmap'd metadata page plus data area of one perf event, and the
//! two ways lookback reads them.
//!
//! - **Overwrite mode** (`write_backward`, Linux 4.7; mapped read-only): the kernel writes
//!   each record *before* the previous one and keeps going around, so the ring always holds
//!   the newest records. `data_head` (a decreasing counter) is where the newest record
//!   starts. Reading walks forward from there, newest to oldest, and stops at an unwritten
//!   (zero) header, after one ring size (the oldest record, partly overwritten, is dropped),
//!   or at an invalid header. [`walk_backward`] is that walk over a plain byte slice;
//!   [`PerfRing`] walks its mapping in place ([`RingBytes`]) and copies only the records.
//! - **Forward mode** (the PT sideband ring; mapped read-write): records between
//!   `data_tail` and `data_head`, consumed and committed with `data_tail` ([`drain_forward`]).
//!
//! Every header is validated: at least 8 bytes, a multiple of 8, no larger than the ring. A
//! zero size ends the walk (it never spins). [`PerfRing`] owns the event's fd and mapping;
//! dropping it disables the event and unmaps. The walkers are pure functions over slices,
//! and [`PerfRing::fake`] builds a ring over anonymous memory, so wrap cases run in unit
//! tests without a PMU.

use std::{
    mem::offset_of,
    os::fd::{AsFd as _, BorrowedFd, OwnedFd},
    sync::atomic::{Ordering, fence},
};

use perf_event_open_sys::bindings::perf_event_mmap_page;

use super::CaptureError;
use crate::sys::{mmap::Mapping, perf};

/// Size of `struct perf_event_header`.
pub const HEADER_SIZE: usize = 8;

/// Why a ring walk stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum WalkStop {
    /// Nothing was ever written (`data_head` still 0 or a zero header at the head).
    Empty,
    /// An unwritten (zero-size) header: the ring never filled up.
    Unwritten,
    /// One full ring size was read: the ring has wrapped (older data is gone).
    Wrapped,
    /// Reached `data_head` (forward mode).
    Head,
    /// A header that cannot be valid (size < 8, not a multiple of 8, or larger than the
    /// ring) at this ring offset: the rest is not trusted.
    BadHeader { offset: u64, size: u16 },
}

/// The records copied out of a ring, oldest first, as one perf record stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingCopy {
    pub data: Vec<u8>,
    pub records: usize,
    pub stop: WalkStop,
}

/// The `size` field of the header at `offset` of `data` (offset is 8-aligned and the ring a
/// multiple of 8 long, so a header never straddles the end).
fn header_at(data: &[u8], offset: usize) -> Option<(u32, u16)> {
    let h = data.get(offset..offset.checked_add(HEADER_SIZE)?)?;
    let kind = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    Some((kind, u16::from_le_bytes([h[6], h[7]])))
}

/// Whether `size` can be a record of a ring of `ring_size` bytes.
pub fn valid_record_size(size: u16, ring_size: usize) -> bool {
    let size = usize::from(size);
    size >= HEADER_SIZE && size % 8 == 0 && size <= ring_size
}

/// Appends `len` bytes of the ring starting at ring offset `start`, wrapping at the end.
fn copy_wrapped(data: &[u8], start: usize, len: usize, out: &mut Vec<u8>) {
    let first = len.min(data.len() - start);
    out.extend_from_slice(&data[start..start + first]);
    out.extend_from_slice(&data[..len - first]);
}

/// The bytes of a ring's data area as the walkers read them: a slice (tests, fixtures) or
/// the mapping itself ([`MappedData`]), so that a snapshot copies its records and not the
/// whole area (4 MiB per CPU by default, and freshly allocated pages are slow to fault in
/// on some VMs: the first snapshot took 58 ms to copy 73 KB of records).
pub trait RingBytes {
    /// The data area's size.
    fn size(&self) -> usize;
    /// The type and size of the record header at the 8-aligned `offset`.
    fn header(&self, offset: usize) -> Option<(u32, u16)>;
    /// Appends `len` bytes starting at `start`, wrapping at the end.
    fn append(&self, start: usize, len: usize, out: &mut Vec<u8>);
}

impl RingBytes for [u8] {
    fn size(&self) -> usize {
        self.len()
    }

    fn header(&self, offset: usize) -> Option<(u32, u16)> {
        header_at(self, offset)
    }

    fn append(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        copy_wrapped(self, start, len, out);
    }
}

/// The data area of a mapped ring, read in place (volatile reads; the ring should be
/// paused or disabled, or be a forward ring read below `data_head`).
pub struct MappedData<'a> {
    map: &'a Mapping,
    offset: usize,
    size: usize,
}

impl RingBytes for MappedData<'_> {
    fn size(&self) -> usize {
        self.size
    }

    fn header(&self, offset: usize) -> Option<(u32, u16)> {
        if offset.checked_add(HEADER_SIZE)? > self.size {
            return None;
        }
        let word = self.map.read_u64(self.offset.checked_add(offset)?)?;
        header_at(&word.to_ne_bytes(), 0)
    }

    fn append(&self, start: usize, len: usize, out: &mut Vec<u8>) {
        let first = len.min(self.size.saturating_sub(start));
        self.map.copy_out(self.offset + start, first, out);
        self.map.copy_out(self.offset, len - first, out);
    }
}

/// Reads an overwrite-mode (`write_backward`) ring: `data` is the whole data area (a power
/// of two, multiple of 8), `head` the `data_head` value. Returns the records oldest first.
pub fn walk_backward(data: &[u8], head: u64) -> RingCopy {
    walk_backward_in(data, head)
}

/// [`walk_backward`] over any [`RingBytes`].
pub fn walk_backward_in<D: RingBytes + ?Sized>(data: &D, head: u64) -> RingCopy {
    walk_backward_within(data, head, data.size())
}

/// [`walk_backward_in`], reading at most `limit` bytes back from `head`: what lies further
/// back may have been overwritten while the ring was copied (see
/// [`PerfRing::copy_backward_live`]).
pub fn walk_backward_within<D: RingBytes + ?Sized>(data: &D, head: u64, limit: usize) -> RingCopy {
    let size = data.size();
    let limit = limit.min(size);
    let mut records: Vec<(usize, usize)> = Vec::new();
    let empty = |stop| RingCopy {
        data: Vec::new(),
        records: 0,
        stop,
    };
    if size == 0 || !size.is_multiple_of(8) {
        return empty(WalkStop::Empty);
    }
    // `head` counts down from 0; its position in the ring is head mod size.
    let start = usize::try_from(head % size as u64).unwrap_or(0);
    if start % 8 != 0 {
        return empty(WalkStop::BadHeader {
            offset: start as u64,
            size: 0,
        });
    }
    let mut read = 0usize;
    let stop = loop {
        if read >= limit {
            break WalkStop::Wrapped;
        }
        let at = (start + read) % size;
        let Some((_, rec_size)) = data.header(at) else {
            break WalkStop::BadHeader {
                offset: at as u64,
                size: 0,
            };
        };
        if rec_size == 0 {
            break if records.is_empty() {
                WalkStop::Empty
            } else {
                WalkStop::Unwritten
            };
        }
        if !valid_record_size(rec_size, size) {
            break WalkStop::BadHeader {
                offset: at as u64,
                size: rec_size,
            };
        }
        let len = usize::from(rec_size);
        if read + len > limit {
            // The oldest record's tail was overwritten by the newest one.
            break WalkStop::Wrapped;
        }
        records.push((at, len));
        read += len;
    };
    let mut out = Vec::with_capacity(read);
    for &(at, len) in records.iter().rev() {
        data.append(at, len, &mut out);
    }
    RingCopy {
        data: out,
        records: records.len(),
        stop,
    }
}

/// Reads a forward ring from `tail` to `head` (both free-running byte counters) and
/// appends the valid records to `out`. Returns the new tail (where reading stopped) and
/// why it stopped.
pub fn drain_forward(data: &[u8], tail: u64, head: u64, out: &mut Vec<u8>) -> (u64, WalkStop) {
    drain_forward_in(data, tail, head, out)
}

/// [`drain_forward`] over any [`RingBytes`].
pub fn drain_forward_in<D: RingBytes + ?Sized>(
    data: &D,
    tail: u64,
    head: u64,
    out: &mut Vec<u8>,
) -> (u64, WalkStop) {
    let size = data.size();
    if size == 0 || !size.is_multiple_of(8) {
        return (head, WalkStop::Empty);
    }
    // A head more than one ring ahead means the kernel overwrote unread data: skip to the
    // oldest complete data (cannot happen with a writable mapping; be safe anyway).
    let mut pos = tail.max(head.saturating_sub(size as u64));
    while pos < head {
        let at = usize::try_from(pos % size as u64).unwrap_or(0);
        let Some((_, rec_size)) = data.header(at) else {
            return (
                head,
                WalkStop::BadHeader {
                    offset: at as u64,
                    size: 0,
                },
            );
        };
        let len = u64::from(rec_size);
        if !valid_record_size(rec_size, size) || pos + len > head {
            return (
                head,
                WalkStop::BadHeader {
                    offset: at as u64,
                    size: rec_size,
                },
            );
        }
        data.append(at, usize::from(rec_size), out);
        pos += len;
    }
    (pos, WalkStop::Head)
}

/// perf's TSC ↔ perf-clock conversion as published in the metadata page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageClock {
    pub time_zero: u64,
    pub time_mult: u32,
    pub time_shift: u16,
    /// `cap_user_time_zero`: the three values are valid.
    pub valid: bool,
}

const OFF_LOCK: usize = offset_of!(perf_event_mmap_page, lock);
const OFF_CAPS: usize = offset_of!(perf_event_mmap_page, __bindgen_anon_1);
const OFF_PMC_WIDTH: usize = offset_of!(perf_event_mmap_page, pmc_width);
const OFF_TIME_ZERO: usize = offset_of!(perf_event_mmap_page, time_zero);
const OFF_DATA_HEAD: usize = offset_of!(perf_event_mmap_page, data_head);
const OFF_DATA_TAIL: usize = offset_of!(perf_event_mmap_page, data_tail);
const OFF_DATA_OFFSET: usize = offset_of!(perf_event_mmap_page, data_offset);
const OFF_DATA_SIZE: usize = offset_of!(perf_event_mmap_page, data_size);
pub(super) const OFF_AUX_HEAD: usize = offset_of!(perf_event_mmap_page, aux_head);
const OFF_AUX_OFFSET: usize = offset_of!(perf_event_mmap_page, aux_offset);
const OFF_AUX_SIZE: usize = offset_of!(perf_event_mmap_page, aux_size);
/// `cap_user_time_zero` is bit 4 of `capabilities`.
const CAP_USER_TIME_ZERO: u64 = 1 << 4;

/// One perf event's ring: owns the event fd and the mapping (metadata page + data area).
#[derive(Debug)]
pub struct PerfRing {
    fd: OwnedFd,
    map: Mapping,
    data_offset: usize,
    data_size: usize,
}

impl PerfRing {
    /// Maps the metadata page and `data_pages` (a power of two) pages of data of `fd`.
    /// `backward`: overwrite mode (the event must have `write_backward`; read-only map).
    pub fn map(fd: OwnedFd, data_pages: usize, backward: bool) -> Result<Self, CaptureError> {
        let page = crate::sys::page_size().ok_or(CaptureError::PageSize)?;
        if !data_pages.is_power_of_two() {
            return Err(CaptureError::BadBufferSize {
                bytes: data_pages.saturating_mul(page),
            });
        }
        let len = page * (1 + data_pages);
        let map = Mapping::map_fd(fd.as_fd(), len, 0, !backward).map_err(|source| {
            CaptureError::Syscall {
                what: "mapping the perf ring",
                source,
            }
        })?;
        Ok(Self::from_parts(fd, map, page))
    }

    /// A ring over an existing mapping laid out like a perf ring (`map.len()` = one page
    /// of metadata + data). Tests build fakes over [`Mapping::anonymous`].
    pub fn from_parts(fd: OwnedFd, map: Mapping, page_size: usize) -> Self {
        let fallback = (page_size, map.len().saturating_sub(page_size));
        // Linux 4.1+ publishes where the data is; older kernels: right after the page.
        let published = map
            .read_u64(OFF_DATA_OFFSET)
            .zip(map.read_u64(OFF_DATA_SIZE))
            .and_then(|(o, s)| Some((usize::try_from(o).ok()?, usize::try_from(s).ok()?)))
            .filter(|&(o, s)| s > 0 && o.checked_add(s).is_some_and(|end| end <= map.len()));
        let (data_offset, data_size) = published.unwrap_or(fallback);
        Self {
            fd,
            map,
            data_offset,
            data_size,
        }
    }

    /// The event's descriptor (for ioctls and `SET_OUTPUT`).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Size of the data area in bytes.
    pub fn data_size(&self) -> usize {
        self.data_size
    }

    /// `data_head`: a volatile load then an Acquire fence, so the record bytes read after
    /// this are at least as new as the head.
    pub fn head(&self) -> u64 {
        let head = self.map.read_u64(OFF_DATA_HEAD).unwrap_or(0);
        fence(Ordering::Acquire);
        head
    }

    fn tail(&self) -> u64 {
        self.map.read_u64(OFF_DATA_TAIL).unwrap_or(0)
    }

    /// Commits `tail`: a Release fence (our reads are done) then a volatile store.
    fn set_tail(&mut self, tail: u64) {
        fence(Ordering::Release);
        self.map.write_u64(OFF_DATA_TAIL, tail);
    }

    /// The data area, read in place.
    fn data(&self) -> MappedData<'_> {
        MappedData {
            map: &self.map,
            offset: self.data_offset,
            size: self.data_size,
        }
    }

    /// Overwrite mode: the records in the ring now, oldest first (the ring should be
    /// paused or disabled).
    pub fn copy_backward(&self) -> RingCopy {
        let head = self.head();
        walk_backward_in(&self.data(), head)
    }

    /// Overwrite mode, while the kernel goes on writing: the records in the ring, oldest
    /// first, without pausing it (the per-CPU ring shared by every target: a pause would
    /// stop all of them). `data_head` is read before and after one copy of the data area
    /// into `scratch` (reused: its pages are not faulted in again). The kernel publishes
    /// `data_head` only after a record is complete, so the records from the first head
    /// on are whole; it writes new ones over the oldest, so of the copy only `size -
    /// written - one record` bytes back from that head are trusted.
    pub fn copy_backward_live(&self, scratch: &mut Vec<u8>) -> RingCopy {
        let before = self.head();
        scratch.clear();
        if !self.map.copy_out(self.data_offset, self.data_size, scratch) {
            scratch.clear();
        }
        fence(Ordering::Acquire);
        let after = self.head();
        // `data_head` counts down in overwrite mode.
        let written = usize::try_from(before.wrapping_sub(after)).unwrap_or(usize::MAX);
        let trusted = self
            .data_size
            .saturating_sub(written)
            .saturating_sub(usize::from(u16::MAX) + 1);
        walk_backward_within(scratch.as_slice(), before, trusted)
    }

    /// Forward mode: appends the records since the last drain to `out` and commits the
    /// tail. Returns why the walk stopped.
    pub fn drain(&mut self, out: &mut Vec<u8>) -> WalkStop {
        let head = self.head();
        let tail = self.tail();
        if head == tail {
            return WalkStop::Head;
        }
        // Below `head` the kernel does not write until the tail moves on.
        let (new_tail, stop) = drain_forward_in(&self.data(), tail, head, out);
        self.set_tail(new_tail);
        stop
    }

    /// The TSC conversion of the metadata page, read under its seqlock (`lock`).
    pub fn clock(&self) -> PageClock {
        // `lock` (u32) shares its 8-byte word with `index`.
        let lock = || {
            let word = self.map.read_u64(OFF_LOCK & !7).unwrap_or(0);
            word.to_le_bytes()[OFF_LOCK % 8..OFF_LOCK % 8 + 4].to_vec()
        };
        for _ in 0..1000 {
            let seq = lock();
            fence(Ordering::Acquire);
            let caps = self.map.read_u64(OFF_CAPS).unwrap_or(0);
            let word = self.map.read_u64(OFF_PMC_WIDTH).unwrap_or(0).to_le_bytes();
            let time_zero = self.map.read_u64(OFF_TIME_ZERO).unwrap_or(0);
            fence(Ordering::Acquire);
            if seq == lock() {
                // pmc_width: u16, time_shift: u16, time_mult: u32 share one word.
                return PageClock {
                    time_zero,
                    time_shift: u16::from_le_bytes([word[2], word[3]]),
                    time_mult: u32::from_le_bytes([word[4], word[5], word[6], word[7]]),
                    valid: caps & CAP_USER_TIME_ZERO != 0,
                };
            }
        }
        PageClock {
            time_zero: 0,
            time_mult: 0,
            time_shift: 0,
            valid: false,
        }
    }

    /// Publishes where the AUX area goes (`aux_offset`, `aux_size`) before mapping it.
    pub fn set_aux_area(&mut self, offset: u64, size: u64) -> bool {
        self.map.write_u64(OFF_AUX_OFFSET, offset) && self.map.write_u64(OFF_AUX_SIZE, size)
    }

    /// `aux_head` with the same load discipline as [`head`](Self::head).
    pub fn aux_head(&self) -> u64 {
        let head = self.map.read_u64(OFF_AUX_HEAD).unwrap_or(0);
        fence(Ordering::Acquire);
        head
    }

    /// Writes raw bytes into the fake's memory (tests).
    #[cfg(test)]
    pub(crate) fn fake_write(&mut self, offset: usize, bytes: &[u8]) {
        assert!(self.map.copy_in(offset, bytes), "fake write out of bounds");
    }
}

impl Drop for PerfRing {
    fn drop(&mut self) {
        // Stop the event before the mapping goes (the map is dropped after this body).
        let _ = perf::disable(self.fd.as_fd());
    }
}

#[cfg(test)]
#[path = "ring_tests.rs"]
mod tests;
