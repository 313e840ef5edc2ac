//! Function probes through BPF `uprobe_multi` links (Linux 6.6), the attach path that
//! needs only `CAP_BPF` and `CAP_PERFMON`.
//!
//! Why: a uprobe perf event (`perf_event_open` on the `uprobe` PMU, what aya's
//! `UProbe::attach` opens) needs `CAP_SYS_ADMIN` again since Linux 6.16 (kernel commit
//! "perf: Revert to requiring `CAP_SYS_ADMIN` for uprobes", backported to stable kernels),
//! so the `DaemonSet`'s capabilities cannot place a single function probe that way. A
//! `BPF_LINK_CREATE` of type `BPF_TRACE_UPROBE_MULTI` places the same probes (one link for
//! any number of offsets of one file, each with its cookie) with what loading the program
//! already needed. The offsets are the entry and the exits found by disassembling the
//! function (`triggers::exits`), never the middle of an instruction.
//!
//! aya 0.14 loads uprobe programs without an expected attach type, which such a link
//! requires. So this module loads a second copy of the function programs from the same
//! eBPF object: parsed and relocated by aya-obj (the parser aya itself uses) against the
//! maps aya already created — both copies share every map — and loaded with
//! `BPF_TRACE_UPROBE_MULTI` as their expected attach type.
//!
//! In: the loaded [`Ebpf`], the object's bytes, the globals aya was given. Out:
//! [`MultiPrograms`], whose [`attach`](MultiPrograms::attach) gives one link fd per call.

#![forbid(unsafe_code)]

use std::{
    collections::{HashMap, HashSet},
    ffi::CString,
    os::{
        fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

use aya::{Ebpf, maps::Map};
use aya_obj::generated::bpf_insn;

use crate::sys::{
    SyscallError,
    bpf::{
        ATTACH_TRACE_UPROBE_MULTI, Insn, ProgType, UPROBE_MULTI_RETURN, load_program_for,
        uprobe_multi_link,
    },
};

/// Why the function programs could not be made ready for `uprobe_multi` links.
#[derive(Debug, thiserror::Error)]
pub enum MultiError {
    #[error("cannot parse the eBPF object")]
    Parse(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot relocate the eBPF object")]
    Relocate(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("eBPF program {name} is missing from the object")]
    MissingProgram { name: &'static str },
    #[error("eBPF map {name} was not created by the loader")]
    MissingMap { name: String },
    #[error("cannot load {name} for uprobe_multi links")]
    Unsupported {
        name: &'static str,
        #[source]
        source: SyscallError,
    },
    #[error(
        "{name} loads, but this kernel refuses its uprobe_multi link (Linux 6.6 or newer needed)"
    )]
    NoLinks {
        name: &'static str,
        #[source]
        source: SyscallError,
    },
    #[error("the verifier refused {name} for uprobe_multi links: {log}")]
    Verifier {
        name: &'static str,
        log: String,
        #[source]
        source: SyscallError,
    },
}

/// The function programs, loaded for `uprobe_multi` links.
pub struct MultiPrograms {
    programs: HashMap<&'static str, OwnedFd>,
}

impl std::fmt::Debug for MultiPrograms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiPrograms")
            .field("programs", &self.programs.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl MultiPrograms {
    /// Loads `names` from `object` (the same bytes `ebpf` was loaded from, with the same
    /// `globals`), their map references pointing at `ebpf`'s maps.
    pub fn load(
        ebpf: &Ebpf,
        object: &[u8],
        globals: &[(&str, &[u8])],
        names: &[&'static str],
    ) -> Result<Self, MultiError> {
        let mut obj = aya_obj::Object::parse(object).map_err(|e| MultiError::Parse(Box::new(e)))?;
        obj.patch_map_data(globals.iter().map(|&(n, v)| (n, (v, true))).collect())
            .map_err(|e| MultiError::Parse(Box::new(e)))?;
        if obj.has_btf_relocations() {
            if let Some(features) = aya::features().btf() {
                obj.fixup_and_sanitize_btf(features)
                    .map_err(|e| MultiError::Relocate(Box::new(e)))?;
            }
            let btf = aya::Btf::from_sys_fs().map_err(|e| MultiError::Relocate(Box::new(e)))?;
            obj.relocate_btf(&btf)
                .map_err(|e| MultiError::Relocate(Box::new(e)))?;
        }
        let mut fds = Vec::new();
        for name in obj.maps.keys() {
            let fd = ebpf
                .map(name)
                .map(map_fd)
                .ok_or_else(|| MultiError::MissingMap { name: name.clone() })?;
            fds.push((name.clone(), fd.as_raw_fd()));
        }
        let text_sections: HashSet<usize> = obj.functions.keys().map(|(s, _)| *s).collect();
        let maps: Vec<(String, i32, aya_obj::Map)> = fds
            .into_iter()
            .filter_map(|(name, fd)| {
                let map = obj.maps.get(&name)?.clone();
                Some((name, fd, map))
            })
            .collect();
        obj.relocate_maps(
            maps.iter().map(|(n, fd, m)| (n.as_str(), *fd, m)),
            &text_sections,
        )
        .map_err(|e| MultiError::Relocate(Box::new(e)))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| MultiError::Relocate(Box::new(e)))?;
        obj.sanitize_functions(aya::features());
        let mut programs = HashMap::new();
        for &name in names {
            let program = obj
                .programs
                .get(name)
                .ok_or(MultiError::MissingProgram { name })?;
            let function = obj
                .functions
                .get(&program.function_key())
                .ok_or(MultiError::MissingProgram { name })?;
            let insns: Vec<Insn> = function.instructions.iter().copied().map(insn).collect();
            let prog = load_one(name, &insns, &program.license)?;
            // Before Linux 6.6 a kprobe program loads whatever its expected attach type
            // (the kernel does not check it): only a link says whether they work here.
            prove_links(prog.as_fd()).map_err(|source| MultiError::NoLinks { name, source })?;
            programs.insert(name, prog);
        }
        Ok(Self { programs })
    }

    /// Places `name` at the `(file offset, cookie)` `sites` of `path` in every process that
    /// maps it (as uretprobes when `ret`); dropping the returned fd removes them.
    pub fn attach(
        &self,
        name: &'static str,
        path: &Path,
        sites: &[(u64, u64)],
        ret: bool,
    ) -> Result<OwnedFd, SyscallError> {
        let invalid = |errno| SyscallError {
            call: "bpf(BPF_LINK_CREATE uprobe_multi)",
            source: std::io::Error::from_raw_os_error(errno),
        };
        let prog = self
            .programs
            .get(name)
            .ok_or_else(|| invalid(libc::EBADF))?;
        let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| invalid(libc::EINVAL))?;
        let (offsets, cookies): (Vec<u64>, Vec<u64>) = sites.iter().copied().unzip();
        let flags = if ret { UPROBE_MULTI_RETURN } else { 0 };
        uprobe_multi_link(prog.as_fd(), &path, &offsets, &cookies, flags, None)
    }
}

/// Links `prog` at this process's own entry point (`_start`, never run again), for this
/// process only, and closes the link at once: whether this kernel (Linux 6.6+) and these
/// privileges create `uprobe_multi` links.
fn prove_links(prog: BorrowedFd<'_>) -> Result<(), SyscallError> {
    let failed = |errno| SyscallError {
        call: "bpf(BPF_LINK_CREATE uprobe_multi)",
        source: std::io::Error::from_raw_os_error(errno),
    };
    let exe = std::fs::File::open("/proc/self/exe").map_err(|source| SyscallError {
        call: "open(/proc/self/exe)",
        source,
    })?;
    let cache = object::read::ReadCache::new(exe);
    let file = object::File::parse(&cache).map_err(|_| failed(libc::ENOEXEC))?;
    let offset = crate::elf::segments::file_offset_of(&file, object::Object::entry(&file))
        .ok_or_else(|| failed(libc::ENOEXEC))?;
    uprobe_multi_link(
        prog,
        c"/proc/self/exe",
        &[offset],
        &[0],
        0,
        Some(std::process::id()),
    )
    .map(drop)
}

/// Loads one program; on failure, again with the verifier's log, which the error carries.
fn load_one(
    name: &'static str,
    insns: &[Insn],
    license: &std::ffi::CStr,
) -> Result<OwnedFd, MultiError> {
    let load = |log| {
        load_program_for(
            ProgType::Kprobe,
            ATTACH_TRACE_UPROBE_MULTI,
            insns,
            license,
            name,
            log,
        )
    };
    let source = match load(None) {
        Ok(fd) => return Ok(fd),
        Err(source) => source,
    };
    let mut log = Vec::new();
    let again = load(Some(&mut log));
    let log = verifier_tail(&log);
    match again {
        Ok(fd) => Ok(fd),
        // Refused before the verifier ran (privileges, an unknown attach type): no log.
        Err(_) if log.is_empty() => Err(MultiError::Unsupported { name, source }),
        Err(_) => Err(MultiError::Verifier { name, log, source }),
    }
}

/// The last lines of a verifier log (NUL-terminated in its buffer).
fn verifier_tail(log: &[u8]) -> String {
    let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
    let text = String::from_utf8_lossy(&log[..end]);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join(" / ")
}

/// An aya-obj instruction as the kernel reads it.
fn insn(i: bpf_insn) -> Insn {
    Insn {
        code: i.code,
        regs: (i.dst_reg() & 0x0f) | ((i.src_reg() & 0x0f) << 4),
        off: i.off,
        imm: i.imm,
    }
}

/// The fd of a map aya created (every kind holds its `MapData`).
fn map_fd(map: &Map) -> BorrowedFd<'_> {
    let data = match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    };
    data.fd().as_fd()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_tail_keeps_the_last_lines() {
        let mut log = b"a\nb\nc\nd\ne\nf\ng\nh\ni\nj\n".to_vec();
        log.push(0);
        log.extend_from_slice(b"garbage after the NUL");
        assert_eq!(verifier_tail(&log), "c / d / e / f / g / h / i / j");
        assert_eq!(verifier_tail(b""), "");
    }

    #[test]
    fn instructions_keep_both_registers() {
        let raw = bpf_insn {
            code: 0xbf,
            _bitfield_align_1: [],
            _bitfield_1: bpf_insn::new_bitfield_1(3, 10),
            off: -8,
            imm: 7,
        };
        let got = insn(raw);
        assert_eq!((got.code, got.regs, got.off, got.imm), (0xbf, 0xa3, -8, 7));
    }
}
