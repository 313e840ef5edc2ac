//! Shared memory mappings of perf event descriptors (`mmap(2)` / `munmap(2)`).
//!
//! A [`Mapping`] owns one mapping and unmaps it on drop. It hands out no references into
//! the mapped memory: the kernel writes there concurrently, so every access is a volatile
//! load/store of one word or a bytewise copy out ([`Mapping::copy_out`]). The capture
//! stage builds its ring types on top of this.
//!
//! [`Mapping::anonymous`] makes a private anonymous mapping with the same interface: the
//! test build's stand-in for a perf ring, so ring logic (wrap included) runs in unit tests
//! without a PMU.

use std::{
    os::fd::{AsRawFd as _, BorrowedFd},
    ptr::NonNull,
};

use super::SyscallError;

/// One `mmap`ed region, unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory owned by this value; nothing in it is tied to
// the thread that created it, and all access goes through `&self`/`&mut self` methods that
// use volatile or byte copies.
unsafe impl Send for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` at `offset`, shared; writable only when `writable`.
    /// A read-only mapping of a perf ring selects overwrite mode for the AUX area
    /// (Linux 4.1) and is what `write_backward` rings (Linux 4.7) are read through.
    pub fn map_fd(
        fd: BorrowedFd<'_>,
        len: usize,
        offset: u64,
        writable: bool,
    ) -> Result<Self, SyscallError> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        let offset = libc::off_t::try_from(offset).map_err(|_| einval("mmap"))?;
        // SAFETY: a fresh mapping at an address the kernel picks (null hint): it cannot
        // alias any Rust object. The fd is live for the call (borrowed).
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        Self::from_raw(ptr, len, writable)
    }

    /// A zeroed, private, anonymous read-write mapping of `len` bytes (a fake perf ring
    /// for tests and tools).
    pub fn anonymous(len: usize) -> Result<Self, SyscallError> {
        // SAFETY: as in `map_fd`; no file is involved.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        Self::from_raw(ptr, len, true)
    }

    fn from_raw(ptr: *mut libc::c_void, len: usize, writable: bool) -> Result<Self, SyscallError> {
        if ptr == libc::MAP_FAILED {
            return Err(SyscallError::last("mmap"));
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| einval("mmap"))?;
        Ok(Self { ptr, len, writable })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never for a successful `mmap`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 8-byte aligned word at `offset`, when it lies inside the mapping.
    fn word_ptr(&self, offset: usize) -> Option<*mut u64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: `offset + 8 <= len`, so the pointer stays inside the mapping.
        let ptr = unsafe { self.ptr.as_ptr().add(offset) };
        // The mapping is page aligned and `offset` a multiple of 8: aligned for u64.
        #[expect(clippy::cast_ptr_alignment, reason = "alignment checked just above")]
        Some(ptr.cast::<u64>())
    }

    /// A volatile load of the `u64` at `offset` (8-byte aligned); `None` outside the map.
    pub fn read_u64(&self, offset: usize) -> Option<u64> {
        let ptr = self.word_ptr(offset)?;
        // SAFETY: in bounds and aligned (`word_ptr`); the memory stays mapped while `self`
        // lives; a volatile read of a u64 is valid for any bit pattern the kernel writes.
        Some(unsafe { ptr.read_volatile() })
    }

    /// A volatile store of `value` at `offset`; `false` when outside the map or the
    /// mapping is read-only.
    pub fn write_u64(&mut self, offset: usize, value: u64) -> bool {
        if !self.writable {
            return false;
        }
        let Some(ptr) = self.word_ptr(offset) else {
            return false;
        };
        // SAFETY: in bounds and aligned (`word_ptr`), and the mapping has PROT_WRITE.
        unsafe { ptr.write_volatile(value) };
        true
    }

    /// Appends `len` bytes starting at `offset` to `out`; `false` when the range is not
    /// inside the mapping.
    pub fn copy_out(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> bool {
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        if end > self.len {
            return false;
        }
        out.reserve(len);
        let start = out.len();
        // SAFETY: source `offset..offset+len` is inside the mapping (checked above);
        // destination is `len` bytes of reserved capacity of `out`; the regions cannot
        // overlap (`out` is heap memory we own). `u8` has no invalid bit patterns, so
        // bytes the kernel writes concurrently are at worst stale, never UB to copy.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr().add(start),
                len,
            );
            out.set_len(start + len);
        }
        true
    }

    /// Writes `bytes` at `offset` (fakes in tests); `false` when outside or read-only.
    pub fn copy_in(&mut self, offset: usize, bytes: &[u8]) -> bool {
        let fits = offset
            .checked_add(bytes.len())
            .is_some_and(|end| end <= self.len);
        if !self.writable || !fits {
            return false;
        }
        // SAFETY: the range is inside the writable mapping (checked above) and `bytes`
        // is ordinary memory that cannot overlap a mapping we own exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.as_ptr().add(offset),
                bytes.len(),
            );
        }
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` describe exactly the mapping `mmap` returned, unmapped once.
        // No references into it exist (the API hands out copies only).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

fn einval(call: &'static str) -> SyscallError {
    SyscallError {
        call,
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_mapping_reads_writes_and_bounds() {
        let mut map = Mapping::anonymous(4096).expect("mmap");
        assert_eq!(map.read_u64(0), Some(0));
        assert!(map.write_u64(8, 0xdead_beef));
        assert_eq!(map.read_u64(8), Some(0xdead_beef));
        assert_eq!(map.read_u64(4092), None, "straddles the end");
        assert_eq!(map.read_u64(3), None, "unaligned");
        assert!(map.copy_in(100, b"abc"));
        let mut out = vec![1];
        assert!(map.copy_out(100, 3, &mut out));
        assert_eq!(out, b"\x01abc");
        assert!(!map.copy_out(4095, 2, &mut out));
        assert!(!map.copy_out(usize::MAX, 2, &mut out));
        assert!(!map.copy_in(4095, b"ab"));
    }
}
