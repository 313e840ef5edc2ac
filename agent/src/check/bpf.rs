//! BPF probes: load a trivial program, create a ring buffer map, attach raw tracepoints,
//! read the kernel's BTF header. Each one a real system call through [`crate::sys::bpf`].

use std::{ffi::CStr, io::Read as _, os::fd::AsFd as _, path::Path};

use super::{Paths, Probe};
use crate::sys::{self, SyscallError, bpf};

/// What to do when BPF is refused for lack of privilege.
const PRIVILEGE_FIX: &str = "run as root (or grant CAP_BPF and CAP_PERFMON)";

/// Raw tracepoints the triggers attach to: syscall latency/errno and fatal signals.
const RAW_TRACEPOINTS: [&CStr; 3] = [c"sys_enter", c"sys_exit", c"signal_generate"];

/// `BPF_MAGIC` at the start of every BTF blob (`0xeB9F`, little- or big-endian).
const BTF_MAGIC: u16 = 0xeb9f;

fn privilege_fix(probe: Probe, err: &SyscallError) -> Probe {
    if matches!(err.errno(), Some(libc::EPERM | libc::EACCES)) {
        probe.with_fix(PRIVILEGE_FIX)
    } else {
        probe
    }
}

/// `BPF_PROG_LOAD` of `r0 = 0; exit` as a socket filter (any kernel with eBPF).
pub(super) fn probe_prog_load() -> Probe {
    match bpf::load_program(
        bpf::ProgType::SocketFilter,
        &bpf::RETURN_ZERO,
        c"GPL",
        "lb_check",
    ) {
        Ok(_fd) => {
            Probe::pass("BPF_PROG_LOAD of a 2-instruction socket filter passed the verifier")
        }
        Err(err) => privilege_fix(
            Probe::syscall_failed("loading a trivial BPF program", &err),
            &err,
        ),
    }
}

/// `BPF_MAP_CREATE` of a one-page `BPF_MAP_TYPE_RINGBUF`.
pub(super) fn probe_ringbuf() -> Probe {
    let Some(size) = sys::page_size().and_then(|s| u32::try_from(s).ok()) else {
        return Probe::fail("cannot determine the page size (sysconf(_SC_PAGESIZE))");
    };
    match bpf::create_ringbuf(size) {
        Ok(_fd) => Probe::pass(format!("BPF_MAP_TYPE_RINGBUF of {size} bytes created")),
        Err(err) => {
            let probe = Probe::syscall_failed("creating a BPF ring buffer map", &err);
            if err.errno() == Some(libc::EINVAL) {
                probe.with_detail("BPF ring buffers need Linux 5.8 or later")
            } else {
                privilege_fix(probe, &err)
            }
        }
    }
}

/// Loads a raw-tracepoint program and attaches it to each of [`RAW_TRACEPOINTS`] in turn;
/// each link is closed (detached) right away.
pub(super) fn probe_raw_tracepoints() -> Probe {
    let prog = match bpf::load_program(
        bpf::ProgType::RawTracepoint,
        &bpf::RETURN_ZERO,
        c"GPL",
        "lb_check_rawtp",
    ) {
        Ok(prog) => prog,
        Err(err) => {
            let probe = Probe::syscall_failed("loading a raw tracepoint BPF program", &err);
            return privilege_fix(probe, &err);
        }
    };
    let mut attached = Vec::new();
    for name in RAW_TRACEPOINTS {
        let name_str = name.to_string_lossy();
        match bpf::raw_tracepoint_open(name, prog.as_fd()) {
            Ok(_link) => attached.push(name_str.into_owned()),
            Err(err) => {
                let probe = Probe::syscall_failed(&format!("attaching to {name_str}"), &err);
                let probe = if attached.is_empty() {
                    probe
                } else {
                    probe.with_detail(format!("attached: {}", attached.join(", ")))
                };
                return privilege_fix(probe, &err);
            }
        }
    }
    Probe::pass(format!("attached to {}", attached.join(", ")))
}

/// `/sys/kernel/btf/vmlinux` readable and starting with the BTF magic.
pub(super) fn probe_btf(paths: &Paths) -> Probe {
    let path = paths.sys.join("kernel/btf/vmlinux");
    match check_btf_file(&path) {
        Ok(len) => Probe::pass(format!("{} ({len} bytes)", path.display())),
        Err(reason) => Probe::fail(reason),
    }
}

fn check_btf_file(path: &Path) -> Result<u64, String> {
    let mut file = std::fs::File::open(path).map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{} missing: kernel built without CONFIG_DEBUG_INFO_BTF",
                path.display()
            )
        } else {
            format!("cannot open {}: {err}", path.display())
        }
    })?;
    let mut magic = [0u8; 2];
    file.read_exact(&mut magic)
        .map_err(|err| format!("cannot read {}: {err}", path.display()))?;
    if u16::from_le_bytes(magic) != BTF_MAGIC && u16::from_be_bytes(magic) != BTF_MAGIC {
        return Err(format!(
            "{} does not start with the BTF magic 0xeB9F",
            path.display()
        ));
    }
    // sysfs reports the blob's real size for this file.
    Ok(file.metadata().map_or(0, |m| m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btf_fixture_with_magic_passes() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("sys/kernel/btf");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("vmlinux"), [0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).expect("write");
        let probe = probe_btf(&Paths::under(root.path()));
        assert!(probe.ok, "{probe:?}");
        assert!(probe.detail.expect("detail").ends_with("(8 bytes)"));
    }

    #[test]
    fn btf_garbage_or_missing_fails_without_panicking() {
        let root = tempfile::tempdir().expect("tempdir");
        let paths = Paths::under(root.path());
        let missing = probe_btf(&paths);
        assert!(!missing.ok);
        assert!(
            missing
                .reason
                .expect("reason")
                .contains("CONFIG_DEBUG_INFO_BTF")
        );

        let dir = root.path().join("sys/kernel/btf");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("vmlinux"), b"ELF garbage").expect("write");
        assert!(probe_btf(&paths).reason.expect("reason").contains("magic"));
        std::fs::write(dir.join("vmlinux"), b"x").expect("write");
        assert!(
            probe_btf(&paths)
                .reason
                .expect("reason")
                .contains("cannot read")
        );
    }

    /// Whatever the privileges, the probes return a verdict with a reason on failure.
    #[test]
    fn live_bpf_probes_give_reasons() {
        for probe in [probe_prog_load(), probe_ringbuf(), probe_raw_tracepoints()] {
            assert_eq!(probe.ok, probe.reason.is_none(), "{probe:?}");
        }
    }
}
