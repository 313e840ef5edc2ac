//! A perf.data built as perf lays it out (`perf_file` tests' builders) becomes a snapshot:
//! records of events with different `sample_type`s re-trailed to one layout, routed by
//! CPU, maps inherited at FORK with build-ids, PT config and clock from `AUXTRACE_INFO`.
use super::*;
use crate::capture::records::{PERF_RECORD_FORK, PERF_RECORD_MMAP2};
use crate::decode::perf_file::tests::{attr_bytes, auxtrace, auxtrace_info, file_mode, record};
use crate::decode::pt::sideband::pevent::{PeventConfig, read_record};

const PT_ST: u64 = SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_IDENTIFIER;
const CYCLES_ST: u64 = SAMPLE_TID | SAMPLE_TIME | SAMPLE_IDENTIFIER;

fn words(list: &[u64]) -> Vec<u8> {
    list.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn mmap2_body(pid: u32, start: u64, path: &str) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend(words(&[start, 0x1000, 0]));
    b.extend_from_slice(&[0u8; 24]);
    b.extend_from_slice(&5u32.to_le_bytes());
    b.extend_from_slice(&2u32.to_le_bytes());
    let mut name = path.as_bytes().to_vec();
    name.resize((name.len() + 8) & !7, 0);
    b.extend(name);
    b
}

fn pt_trailer(pid: u32, time: u64, cpu: u32) -> Vec<u8> {
    let mut t = Vec::new();
    t.extend_from_slice(&pid.to_le_bytes());
    t.extend_from_slice(&pid.to_le_bytes());
    t.extend(words(&[time, u64::from(cpu), 11]));
    t
}

fn recording(info_kind: u32) -> Vec<u8> {
    recording_of(info_kind, 0x40_0000, &[0x02, 0x82, 0x02, 0x82])
}

/// A recording of process 42 with `/bin/echo` mapped at `echo_at` and `aux` as CPU 1's
/// trace.
fn recording_of(info_kind: u32, echo_at: u64, aux: &[u8]) -> Vec<u8> {
    let config = 0x400 | 0x200 | 3 << 14;
    let attrs = vec![
        (attr_bytes(8, config, PT_ST), vec![11]),
        (attr_bytes(0, 0, CYCLES_ST), vec![31]),
    ];
    let mut data = auxtrace_info(
        info_kind,
        &[
            8, 10, 1024, 0, 1, 0x400, 0x800, 0, 0, 1, 0x200, 0x3c000, 100, 2, 0x2, 12, 0,
        ],
    );
    let mut mmap = mmap2_body(42, echo_at, "/bin/echo");
    mmap.extend(pt_trailer(42, 100, 1));
    data.extend(record(PERF_RECORD_MMAP2, 0, &mmap));
    // A FORK written by the cycles event: its trailer has no CPU.
    let mut fork = words(&[]);
    for v in [43u32, 42, 43, 42] {
        fork.extend_from_slice(&v.to_le_bytes());
    }
    fork.extend(words(&[150]));
    fork.extend_from_slice(&43u32.to_le_bytes());
    fork.extend_from_slice(&43u32.to_le_bytes());
    fork.extend(words(&[150, 31]));
    data.extend(record(PERF_RECORD_FORK, 0, &fork));
    let mut switch = Vec::new();
    switch.extend_from_slice(&43u32.to_le_bytes());
    switch.extend_from_slice(&43u32.to_le_bytes());
    switch.extend(pt_trailer(42, 200, 1));
    data.extend(record(15, 0, &switch));
    data.extend(auxtrace(1, 1, 42, aux));
    file_mode(&attrs, &data, &[(0xcd, "/bin/echo")])
}

#[test]
fn a_recording_becomes_a_snapshot_with_one_sideband_layout() {
    let bytes = recording(1);
    let file = PerfFile::parse(&bytes).unwrap();
    let snap = snapshot(&file).unwrap();
    assert_eq!(snap.rings.len(), 1);
    assert_eq!(snap.rings[0].cpu, Some(1));
    assert_eq!(snap.rings[0].data, [0x02, 0x82, 0x02, 0x82]);
    let fields = &snap.meta.recorder.config_fields;
    assert_eq!(fields.get("mtc_period"), Some(&3));
    assert_eq!(fields.get("tsc"), Some(&1));
    assert_eq!(fields.get("cyc"), Some(&0));
    let timing = snap.meta.recorder.pt_timing.as_ref().unwrap();
    assert_eq!(timing.tsc_art_ratio, Some((100, 2)));
    assert_eq!(timing.max_nonturbo_ratio, Some(12));
    let clock = snap.meta.clock.unwrap();
    assert_eq!((clock.time_mult, clock.time_shift), (1024, 10));
    assert_eq!(snap.meta.kernel, "6.1.0-test");
    // Maps: the child inherited the parent's at FORK; the build-id is the recording's.
    let pids: Vec<u32> = snap.maps.iter().map(|m| m.pid).collect();
    assert_eq!(pids, [42, 43]);
    for process in &snap.maps {
        assert_eq!(process.maps.len(), 1);
        assert_eq!(process.maps[0].path, "/bin/echo");
        assert_eq!(process.maps[0].perms, "r-xp");
        assert_eq!(
            process.maps[0].build_id.as_deref(),
            Some("cd".repeat(20).as_str())
        );
    }
    // The sideband: CPU 1 has the MMAP2 and the SWITCH, the FORK (no CPU) is apart; all
    // read back with the one layout.
    let config = PeventConfig {
        sample_type: SIDEBAND_SAMPLE_TYPE,
        time_mult: 1,
        ..PeventConfig::default()
    };
    let read = |data: &[u8]| {
        let mut out = Vec::new();
        let mut rest = data;
        while let Ok((r, size)) = read_record(rest, &config) {
            out.push((r.kind, r.samples.pid_tid, r.samples.time, r.samples.cpu));
            rest = &rest[size..];
        }
        assert!(rest.is_empty(), "every record read");
        out
    };
    let on_cpu = snap.sideband.iter().find(|s| s.cpu == Some(1)).unwrap();
    assert_eq!(
        read(&on_cpu.data),
        [
            (PERF_RECORD_MMAP2, Some((42, 42)), Some(100), Some(1)),
            (15, Some((42, 42)), Some(200), Some(1)),
        ]
    );
    let apart = snap.sideband.iter().find(|s| s.cpu.is_none()).unwrap();
    assert_eq!(
        read(&apart.data),
        [(PERF_RECORD_FORK, Some((43, 43)), Some(150), Some(u32::MAX))]
    );
}

#[test]
fn a_recording_without_intel_pt_is_refused() {
    let bytes = recording(3);
    let file = PerfFile::parse(&bytes).unwrap();
    assert_eq!(snapshot(&file).unwrap_err(), ImportError::OtherAuxTrace(3));
    let attrs = vec![(attr_bytes(0, 0, CYCLES_ST), vec![31])];
    let bytes = file_mode(&attrs, &[], &[]);
    let file = PerfFile::parse(&bytes).unwrap();
    assert_eq!(snapshot(&file).unwrap_err(), ImportError::NoIntelPt(1));
}

/// A little ELF file with one loadable, executable segment: `code` at `addr` (a kcore
/// stand-in: the kernel's kcore is an ELF core file whose `PT_LOAD`s are its text).
fn elf_with_code(addr: u64, code: &[u8]) -> Vec<u8> {
    const HEADER: u64 = 64;
    const PHDR: u64 = 56;
    let mut elf = b"\x7fELF".to_vec();
    elf.extend([2, 1, 1, 0]);
    elf.resize(16, 0);
    elf.extend(4u16.to_le_bytes()); // ET_CORE
    elf.extend(62u16.to_le_bytes()); // EM_X86_64
    elf.extend(1u32.to_le_bytes());
    elf.extend(words(&[0, HEADER, 0])); // entry, phoff, shoff
    elf.extend(0u32.to_le_bytes());
    for half in [HEADER, PHDR, 1, 64, 0, 0] {
        elf.extend(u16::try_from(half).unwrap().to_le_bytes());
    }
    let offset = HEADER + PHDR;
    let len = code.len() as u64;
    elf.extend(1u32.to_le_bytes()); // PT_LOAD
    elf.extend(5u32.to_le_bytes()); // R + X
    elf.extend(words(&[offset, addr, addr, len, len, 0x1000]));
    elf.extend_from_slice(code);
    elf
}

#[test]
fn the_kcore_of_a_recording_is_every_processs_kernel_code_kept_once() {
    use crate::decode::pt::flow::branches::BranchKind;
    use crate::decode::pt::tools::encode::{CODE_BASE, SynthProgram, encode};
    use crate::decode::pt_snapshot::{EmbeddedOnly, Track, decode_all};
    // The encoder's program stands in for kernel code at its own address; /bin/echo is
    // mapped elsewhere, so only the kcore holds the code the trace ran.
    let program = SynthProgram::generate(5, 6);
    let encoded = encode(&program, 5, 8 << 10, true);
    let bytes = recording_of(1, 0x7f00_0000_0000, &encoded.trace);
    let file = PerfFile::parse(&bytes).unwrap();
    let flow = |snap: &Snapshot| {
        let out = decode_all(snap, &EmbeddedOnly, 1);
        let calls: Vec<(BranchKind, u64, u64)> = out
            .tracks
            .get(&Track::Thread { pid: 42, tid: 42 })
            .map(|t| {
                t.branches
                    .iter()
                    .filter(|b| {
                        matches!(
                            b.kind,
                            BranchKind::Call | BranchKind::Return | BranchKind::Jump
                        )
                    })
                    .map(|b| (b.kind, b.from, b.to))
                    .collect()
            })
            .unwrap_or_default();
        (out.errors, calls)
    };
    let without = snapshot(&file).unwrap();
    let (errors, calls) = flow(&without);
    assert!(
        errors > 0 && calls.is_empty(),
        "{errors} errors, {} calls",
        calls.len()
    );
    let mut with = snapshot(&file).unwrap();
    let kcore = elf_with_code(CODE_BASE, &program.code);
    let kallsyms = format!("{CODE_BASE:016x} T synth_entry\n0000000000000000 t hidden\n");
    assert_eq!(
        add_kcore(
            &mut with,
            "/perf.data/kcore_dir/kcore",
            &kcore,
            Some(&kallsyms)
        ),
        Ok(1)
    );
    let (errors, calls) = flow(&with);
    assert_eq!(errors, 0);
    assert!(
        calls == encoded.branches,
        "{} of {} branches",
        calls.len(),
        encoded.branches.len()
    );
    // Mapped in both processes, its bytes once.
    for process in &with.maps {
        assert!(
            process.maps.iter().any(|m| m.start == CODE_BASE),
            "pid {}",
            process.pid
        );
    }
    assert_eq!(with.code.iter().filter(|c| c.start == CODE_BASE).count(), 1);
    assert_eq!(with.code[0].pid, ALL_PROCESSES);
    let names: Vec<&str> = with
        .meta
        .kernel_symbols
        .iter()
        .map(|k| k.name.as_str())
        .collect();
    assert_eq!(names, ["synth_entry"], "text symbols with an address");
    // Not an ELF file: said, nothing added.
    let mut bad = snapshot(&file).unwrap();
    assert!(add_kcore(&mut bad, "kcore", b"junk", None).is_err());
    assert!(bad.code.is_empty());
}
