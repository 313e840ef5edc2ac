//! Raw `bpf(2)`: load a program, create a map, open a raw tracepoint, create a
//! `uprobe_multi` link. Used by `check` to prove (not guess) that this kernel accepts BPF,
//! and by the trigger loader for what aya 0.14 cannot do: load a program with an expected
//! attach type of `BPF_TRACE_UPROBE_MULTI` and link it (`triggers::uprobe_multi`).
//!
//! The attribute structs below are prefixes of the kernel's `union bpf_attr`; the kernel
//! zero-fills the fields we do not pass (it copies `min(size, sizeof(bpf_attr))` bytes).

use std::{
    ffi::CStr,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

use super::SyscallError;

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
/// `BPF_TRACE_ITER` (`enum bpf_attach_type`).
const ATTACH_TRACE_ITER: u32 = 28;

/// `BPF_TRACE_UPROBE_MULTI` (`enum bpf_attach_type`, Linux 6.6): the expected attach type
/// of a program for [`uprobe_multi_link`].
pub const ATTACH_TRACE_UPROBE_MULTI: u32 = 48;
/// `BPF_F_UPROBE_MULTI_RETURN`: the link's probes are uretprobes.
pub const UPROBE_MULTI_RETURN: u32 = 1;

/// BPF program types used here (`enum bpf_prog_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum ProgType {
    /// `BPF_PROG_TYPE_SOCKET_FILTER`: loadable without any attach point (Linux 3.19).
    SocketFilter = 1,
    /// `BPF_PROG_TYPE_KPROBE`: kprobes and uprobes (perf events, or multi links).
    Kprobe = 2,
    /// `BPF_PROG_TYPE_RAW_TRACEPOINT`: attached by tracepoint name (Linux 4.17).
    RawTracepoint = 17,
}

/// BPF map types used here (`enum bpf_map_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum MapType {
    /// `BPF_MAP_TYPE_RINGBUF` (Linux 5.8).
    RingBuf = 27,
}

/// One eBPF instruction (`struct bpf_insn`): opcode, dst/src registers packed in one byte,
/// offset, immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    /// `dst = imm` (64-bit): `BPF_ALU64 | BPF_MOV | BPF_K`.
    pub const fn mov64_imm(dst: u8, imm: i32) -> Self {
        Self {
            code: 0x07 | 0xb0,
            regs: dst & 0x0f,
            off: 0,
            imm,
        }
    }

    /// `exit`: `BPF_JMP | BPF_EXIT`.
    pub const fn exit() -> Self {
        Self {
            code: 0x05 | 0x90,
            regs: 0,
            off: 0,
            imm: 0,
        }
    }
}

/// `r0 = 0; exit`: the smallest valid program.
pub const RETURN_ZERO: [Insn; 2] = [Insn::mov64_imm(0, 0), Insn::exit()];

/// The `BPF_PROG_LOAD` prefix of `union bpf_attr` (no padding: 72 bytes).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

/// The `BPF_LINK_CREATE` prefix of `union bpf_attr` for a `uprobe_multi` link (explicit
/// padding: 64 bytes).
#[repr(C)]
#[derive(Default)]
struct UprobeMultiLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    path: u64,
    offsets: u64,
    ref_ctr_offsets: u64,
    cookies: u64,
    cnt: u32,
    multi_flags: u32,
    pid: u32,
    pad: u32,
}

/// The `BPF_MAP_CREATE` prefix of `union bpf_attr` (no padding: 20 bytes).
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// The `BPF_RAW_TRACEPOINT_OPEN` prefix of `union bpf_attr` (explicit padding: 16 bytes).
#[repr(C)]
#[derive(Default)]
struct RawTracepointAttr {
    name: u64,
    prog_fd: u32,
    pad: u32,
}

/// The `BPF_PROG_TEST_RUN` prefix of `union bpf_attr` (explicit padding: 80 bytes).
#[repr(C)]
#[derive(Default)]
struct TestRunAttr {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
    batch_size: u32,
    pad: u32,
}

/// The `BPF_LINK_CREATE` prefix for an iterator link (no padding: 16 bytes; the iterator
/// info pointer and length left 0).
#[repr(C)]
#[derive(Default)]
struct IterLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
}

/// The `BPF_ITER_CREATE` prefix (no padding: 8 bytes).
#[repr(C)]
#[derive(Default)]
struct IterCreateAttr {
    link_fd: u32,
    flags: u32,
}

/// Runs the raw tracepoint program `prog` once on this CPU with `args` as its context
/// (`BPF_PROG_TEST_RUN`, Linux 5.10; at most 12 arguments); its return value.
pub fn test_run_raw_tp(prog: BorrowedFd<'_>, args: &[u64]) -> Result<u32, SyscallError> {
    const CALL: &str = "bpf(BPF_PROG_TEST_RUN)";
    let mut attr = TestRunAttr {
        prog_fd: fd_u32(prog, CALL)?,
        ctx_size_in: u32::try_from(size_of_val(args)).unwrap_or(u32::MAX),
        ctx_in: args.as_ptr() as u64,
        ..TestRunAttr::default()
    };
    bpf_raw(BPF_PROG_TEST_RUN, &mut attr, CALL)?;
    Ok(attr.retval)
}

/// Links the loaded iterator program `prog` (`BPF_LINK_CREATE`, `BPF_TRACE_ITER`); each
/// [`iter_create`] on the link then runs it once over its objects. Linux 5.8.
pub fn iter_link_create(prog: BorrowedFd<'_>) -> Result<OwnedFd, SyscallError> {
    const CALL: &str = "bpf(BPF_LINK_CREATE, iter)";
    let mut attr = IterLinkAttr {
        prog_fd: fd_u32(prog, CALL)?,
        attach_type: ATTACH_TRACE_ITER,
        ..IterLinkAttr::default()
    };
    bpf(BPF_LINK_CREATE, &mut attr, CALL)
}

/// A new pass of the iterator of `link` (`BPF_ITER_CREATE`): reading the returned file to
/// its end runs the program over every object.
pub fn iter_create(link: BorrowedFd<'_>) -> Result<OwnedFd, SyscallError> {
    const CALL: &str = "bpf(BPF_ITER_CREATE)";
    let mut attr = IterCreateAttr {
        link_fd: fd_u32(link, CALL)?,
        flags: 0,
    };
    bpf(BPF_ITER_CREATE, &mut attr, CALL)
}

/// A descriptor as the `u32` `bpf_attr` holds; `EBADF` when negative.
fn fd_u32(fd: BorrowedFd<'_>, call: &'static str) -> Result<u32, SyscallError> {
    u32::try_from(fd.as_raw_fd()).map_err(|_| SyscallError {
        call,
        source: std::io::Error::from_raw_os_error(libc::EBADF),
    })
}

/// Calls `bpf(cmd, attr, sizeof attr)` once for a command that returns 0 on success.
fn bpf_raw<T>(cmd: libc::c_long, attr: &mut T, call: &'static str) -> Result<(), SyscallError> {
    // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr` with
    // explicit padding, valid for `size_of::<T>()` bytes; the pointers it holds are
    // borrowed by the caller for this call.
    let ret =
        unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if ret < 0 {
        return Err(SyscallError::last(call));
    }
    Ok(())
}

/// Calls `bpf(cmd, attr, sizeof attr)`, retrying `EINTR`/`EAGAIN` a few times (the verifier
/// may return `EAGAIN` under memory pressure; libbpf retries too).
fn bpf<T>(cmd: libc::c_long, attr: &mut T, call: &'static str) -> Result<OwnedFd, SyscallError> {
    let mut tries = 0;
    loop {
        // SAFETY: `attr` is a live, initialised `#[repr(C)]` prefix of `union bpf_attr`
        // without padding bytes, valid for `size_of::<T>()` bytes; the pointers it holds
        // (instructions, license, name) are borrowed by the caller for this call.
        let ret =
            unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
        if ret >= 0 {
            let fd = libc::c_int::try_from(ret).map_err(|_| SyscallError {
                call,
                source: std::io::Error::from_raw_os_error(libc::EOVERFLOW),
            })?;
            // SAFETY: on success these commands return a new file descriptor that nothing
            // else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let err = SyscallError::last(call);
        tries += 1;
        if tries < 5 && matches!(err.errno(), Some(libc::EINTR | libc::EAGAIN)) {
            continue;
        }
        return Err(err);
    }
}

/// Loads a program with `BPF_PROG_LOAD`; the kernel runs the verifier on it. `name` is cut
/// to 15 bytes (the kernel's limit; letters, digits, `_` and `.` only).
pub fn load_program(
    prog_type: ProgType,
    insns: &[Insn],
    license: &CStr,
    name: &str,
) -> Result<OwnedFd, SyscallError> {
    load_program_for(prog_type, 0, insns, license, name, None)
}

/// [`load_program`] with an expected attach type (`enum bpf_attach_type`; 0 for none)
/// and, when `log` is given, the verifier's log written into it (level 1) — what the
/// caller shows when the load fails.
pub fn load_program_for(
    prog_type: ProgType,
    expected_attach_type: u32,
    insns: &[Insn],
    license: &CStr,
    name: &str,
    log: Option<&mut Vec<u8>>,
) -> Result<OwnedFd, SyscallError> {
    let too_big = |_| SyscallError {
        call: "bpf(BPF_PROG_LOAD)",
        source: std::io::Error::from_raw_os_error(libc::E2BIG),
    };
    let mut attr = ProgLoadAttr {
        prog_type: prog_type as u32,
        insn_cnt: u32::try_from(insns.len()).map_err(too_big)?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type,
        ..ProgLoadAttr::default()
    };
    if let Some(log) = log {
        log.clear();
        log.resize(1 << 20, 0);
        attr.log_level = 1;
        attr.log_size = u32::try_from(log.len()).map_err(too_big)?;
        attr.log_buf = log.as_mut_ptr() as u64;
    }
    for (dst, src) in attr.prog_name.iter_mut().take(15).zip(name.bytes()) {
        *dst = src;
    }
    bpf(BPF_PROG_LOAD, &mut attr, "bpf(BPF_PROG_LOAD)")
}

/// Places uprobes (uretprobes with `flags` = [`UPROBE_MULTI_RETURN`]) at `offsets` of the
/// file at `path`, every one running `prog` with the cookie of the same index, in every
/// process that maps the file (only in process `pid` when given); closing the returned
/// link removes them all. `prog` must have been loaded with
/// [`ATTACH_TRACE_UPROBE_MULTI`]. Linux 6.6; unlike a uprobe perf event (`CAP_SYS_ADMIN`
/// since Linux 6.16), needs only what loading `prog` needed (`CAP_BPF` and
/// `CAP_PERFMON`) and a path the caller may look up.
pub fn uprobe_multi_link(
    prog: BorrowedFd<'_>,
    path: &CStr,
    offsets: &[u64],
    cookies: &[u64],
    flags: u32,
    pid: Option<u32>,
) -> Result<OwnedFd, SyscallError> {
    const CALL: &str = "bpf(BPF_LINK_CREATE uprobe_multi)";
    let invalid = |errno| SyscallError {
        call: CALL,
        source: std::io::Error::from_raw_os_error(errno),
    };
    if offsets.is_empty() || offsets.len() != cookies.len() {
        return Err(invalid(libc::EINVAL));
    }
    let mut attr = UprobeMultiLinkAttr {
        prog_fd: u32::try_from(prog.as_raw_fd()).map_err(|_| invalid(libc::EBADF))?,
        attach_type: ATTACH_TRACE_UPROBE_MULTI,
        path: path.as_ptr() as u64,
        offsets: offsets.as_ptr() as u64,
        cookies: cookies.as_ptr() as u64,
        cnt: u32::try_from(offsets.len()).map_err(|_| invalid(libc::E2BIG))?,
        multi_flags: flags,
        pid: pid.unwrap_or(0),
        ..UprobeMultiLinkAttr::default()
    };
    bpf(BPF_LINK_CREATE, &mut attr, CALL)
}

/// Creates a map with `BPF_MAP_CREATE`.
pub fn create_map(
    map_type: MapType,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
) -> Result<OwnedFd, SyscallError> {
    let mut attr = MapCreateAttr {
        map_type: map_type as u32,
        key_size,
        value_size,
        max_entries,
        map_flags: 0,
    };
    bpf(BPF_MAP_CREATE, &mut attr, "bpf(BPF_MAP_CREATE)")
}

/// Creates a `BPF_MAP_TYPE_RINGBUF` of `size_bytes` (a power of two and a multiple of the
/// page size, else `EINVAL`). Linux 5.8.
pub fn create_ringbuf(size_bytes: u32) -> Result<OwnedFd, SyscallError> {
    create_map(MapType::RingBuf, 0, 0, size_bytes)
}

/// Attaches a loaded `RawTracepoint` program to the raw tracepoint `name` (e.g.
/// `sys_enter`) with `BPF_RAW_TRACEPOINT_OPEN`; the returned descriptor holds the link and
/// closing it detaches. Linux 4.17.
pub fn raw_tracepoint_open(name: &CStr, prog: BorrowedFd<'_>) -> Result<OwnedFd, SyscallError> {
    let prog_fd = u32::try_from(prog.as_raw_fd()).map_err(|_| SyscallError {
        call: "bpf(BPF_RAW_TRACEPOINT_OPEN)",
        source: std::io::Error::from_raw_os_error(libc::EBADF),
    })?;
    let mut attr = RawTracepointAttr {
        name: name.as_ptr() as u64,
        prog_fd,
        pad: 0,
    };
    bpf(
        BPF_RAW_TRACEPOINT_OPEN,
        &mut attr,
        "bpf(BPF_RAW_TRACEPOINT_OPEN)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_layouts_have_no_padding() {
        assert_eq!(size_of::<ProgLoadAttr>(), 72);
        assert_eq!(size_of::<UprobeMultiLinkAttr>(), 64);
        assert_eq!(size_of::<MapCreateAttr>(), 20);
        assert_eq!(size_of::<RawTracepointAttr>(), 16);
        assert_eq!(size_of::<TestRunAttr>(), 80);
        assert_eq!(size_of::<IterLinkAttr>(), 16);
        assert_eq!(size_of::<IterCreateAttr>(), 8);
        assert_eq!(size_of::<Insn>(), 8);
    }

    #[test]
    fn return_zero_encoding() {
        // The bytes clang emits for `r0 = 0; exit` on little-endian.
        let [mov, exit] = RETURN_ZERO;
        assert_eq!((mov.code, mov.regs, mov.off, mov.imm), (0xb7, 0, 0, 0));
        assert_eq!((exit.code, exit.regs, exit.off, exit.imm), (0x95, 0, 0, 0));
    }

    #[test]
    fn invalid_ringbuf_size_is_an_error_not_a_panic() {
        // 3 bytes is never a valid ring buffer size: EINVAL, or EPERM when unprivileged.
        let err = create_ringbuf(3).expect_err("3-byte ring buffer");
        assert_eq!(err.call, "bpf(BPF_MAP_CREATE)");
        assert!(err.errno().is_some());
    }
}
