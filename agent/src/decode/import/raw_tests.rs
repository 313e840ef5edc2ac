//! `--elf` and `--raw` code for a raw trace: ELF segments where ptxed puts them, raw
//! bytes under their own name, later code over earlier.
use super::*;

#[test]
fn elf_specs_take_a_base_only_when_it_is_a_number() {
    assert_eq!(
        ElfSpec::parse("a.out:0x400000"),
        ElfSpec {
            path: "a.out".to_owned(),
            base: Some(0x40_0000)
        }
    );
    assert_eq!(ElfSpec::parse("dir:x/a.out").base, None);
    assert_eq!(ElfSpec::parse("dir:x/a.out").path, "dir:x/a.out");
    assert_eq!(ElfSpec::parse(":12").path, ":12");
}

#[test]
fn an_elf_maps_its_executable_segments_with_the_lowest_segment_at_base() {
    let exe = std::env::current_exe().unwrap();
    let bytes = std::fs::read(&exe).unwrap();
    let at_file = ElfSpec {
        path: exe.to_string_lossy().into_owned(),
        base: None,
    }
    .segments(&bytes)
    .unwrap();
    let lowest = {
        let elf = object::File::parse(&*bytes).unwrap();
        elf.segments().map(|s| s.address()).min().unwrap()
    };
    let moved = ElfSpec {
        path: exe.to_string_lossy().into_owned(),
        base: Some(0x7000_0000_0000),
    }
    .segments(&bytes)
    .unwrap();
    assert_eq!(at_file.len(), moved.len());
    for ((a, code_a), (b, code_b)) in at_file.iter().zip(&moved) {
        assert_eq!(b.start - a.start, 0x7000_0000_0000 - lowest);
        assert_eq!(code_a, code_b);
        assert_eq!(a.end - a.start, code_a.len() as u64);
        assert!(a.build_id.is_some());
        // The bytes are the file's at the segment's offset.
        let off = usize::try_from(a.offset).unwrap();
        assert_eq!(&bytes[off..off + code_a.len()], &code_a[..]);
    }
}

#[test]
fn not_an_elf_is_an_error_naming_the_file() {
    let err = ElfSpec::parse("code.bin")
        .segments(&[0x90; 16])
        .unwrap_err();
    assert!(
        err.to_string().starts_with("code.bin: not an ELF file"),
        "{err}"
    );
}

#[test]
fn later_code_shadows_earlier_and_raw_bytes_are_named_apart() {
    let spec = |addr| RawSpec {
        path: "c.bin".to_owned(),
        offset: 0,
        end: None,
        addr,
    };
    let first = raw_segment(&spec(0x1000), &[0x90; 32]);
    let second = raw_segment(&spec(0x1010), &[0xc3; 4]);
    assert_eq!(first.0.path, "[raw] c.bin");
    let snap = snapshot(vec![(0, vec![0x02, 0x82])], vec![first, second], "t.pt");
    let maps = &snap.maps[0].maps;
    assert_eq!(maps.len(), 1, "the overlapped map is gone: {maps:?}");
    assert_eq!(maps[0].start, 0x1010);
    assert_eq!(snap.code.len(), 1);
    assert_eq!(snap.code[0].data, [0xc3; 4]);
    assert_eq!(snap.maps[0].comm, "t.pt");
    assert_eq!(snap.rings[0].data, [0x02, 0x82]);
}

/// A record with the trailer `TID|TIME` and, where `cpu` is given, `CPU`.
fn sb_record(kind: u32, body: &[u8], pid: u32, time: u64, cpu: Option<u32>) -> Vec<u8> {
    let size = 8 + body.len() + 16 + if cpu.is_some() { 8 } else { 0 };
    let mut out = kind.to_le_bytes().to_vec();
    out.extend(0u16.to_le_bytes());
    out.extend(u16::try_from(size).unwrap().to_le_bytes());
    out.extend(body);
    out.extend(pid.to_le_bytes());
    out.extend(pid.to_le_bytes());
    out.extend(time.to_le_bytes());
    if let Some(cpu) = cpu {
        out.extend(u64::from(cpu).to_le_bytes());
    }
    out
}

/// `PERF_RECORD_MMAP` of `path` at `start` for `pid`.
fn sb_mmap(pid: u32, start: u64, path: &str, time: u64, cpu: Option<u32>) -> Vec<u8> {
    let mut body = pid.to_le_bytes().to_vec();
    body.extend(pid.to_le_bytes());
    for word in [start, 0x1000, 0] {
        body.extend(word.to_le_bytes());
    }
    let mut name = path.as_bytes().to_vec();
    name.resize((name.len() + 1).next_multiple_of(8), 0);
    body.extend(name);
    sb_record(sideband::PERF_RECORD_MMAP, &body, pid, time, cpu)
}

fn itrace_start(pid: u32, time: u64, cpu: Option<u32>) -> Vec<u8> {
    let mut body = pid.to_le_bytes().to_vec();
    body.extend(pid.to_le_bytes());
    sb_record(12, &body, pid, time, cpu)
}

/// A record's kind, pid/tid and time.
type Seen = (u32, Option<(u32, u32)>, Option<u64>);

/// The records of `cpu`'s sideband.
fn read(snap: &Snapshot, cpu: u32) -> Vec<Seen> {
    let stream = snap.sideband.iter().find(|s| s.cpu == Some(cpu)).unwrap();
    let config = PeventConfig {
        sample_type: SIDEBAND_SAMPLE_TYPE,
        ..PeventConfig::default()
    };
    let mut rest = stream.data.as_slice();
    let mut kinds = Vec::new();
    while let Ok((record, size)) = read_record(rest, &config) {
        kinds.push((record.kind, record.samples.pid_tid, record.samples.time));
        rest = &rest[size..];
    }
    kinds
}

fn maps(snap: &Snapshot, pid: u32) -> Vec<(u64, String)> {
    let process = snap.maps.iter().find(|p| p.pid == pid).unwrap();
    process
        .maps
        .iter()
        .map(|m| (m.start, m.path.clone()))
        .collect()
}

#[test]
fn sideband_records_go_to_their_cpu_and_make_every_process_with_the_code_given() {
    let given = raw_segment(
        &RawSpec {
            path: "c.bin".to_owned(),
            offset: 0,
            end: None,
            addr: 0x9000,
        },
        &[0x90; 16],
    );
    let mut snap = snapshot(vec![(2, vec![0x02]), (5, vec![0x02])], vec![given], "t");
    let with_cpu = PeventConfig {
        sample_type: 0x86,
        time_zero: 100,
        time_mult: 3,
        ..PeventConfig::default()
    };
    let without_cpu = PeventConfig {
        sample_type: 0x6,
        ..PeventConfig::default()
    };
    // File a says CPU 5 in its records (its own CPU, 2, does not count); file b says
    // none: its records are CPU 2's; file c has no CPU: its maps count, nothing else.
    // pid 1's map at 0x1000 is /new in time order although file c, read last, has /old.
    let mut a = sb_mmap(1, 0x1000, "/new", 20, Some(5));
    a.extend(itrace_start(1, 21, Some(5)));
    let b = itrace_start(2, 30, None);
    let mut c = sb_mmap(1, 0x1000, "/old", 10, None);
    c.extend(sb_mmap(2, 0x2000, "/two", 11, None));
    c.extend([0xff; 5]);
    let summary = add_sideband(
        &mut snap,
        &[
            SidebandFile {
                name: "a",
                data: &a,
                config: &with_cpu,
                cpu: Some(2),
            },
            SidebandFile {
                name: "b",
                data: &b,
                config: &without_cpu,
                cpu: Some(2),
            },
            SidebandFile {
                name: "c",
                data: &c,
                config: &without_cpu,
                cpu: None,
            },
        ],
    );
    assert_eq!(summary.records, 5);
    assert_eq!(summary.problems.len(), 1, "{summary:?}");
    assert!(
        summary.problems[0]
            .starts_with("c: the record at byte 128 cannot be read (the file ends inside it)"),
        "{summary:?}"
    );
    let cpus: Vec<Option<u32>> = snap.sideband.iter().map(|s| s.cpu).collect();
    assert_eq!(cpus, [Some(2), Some(5)]);
    assert_eq!(read(&snap, 2), [(12, Some((2, 2)), Some(30))]);
    assert_eq!(
        read(&snap, 5),
        [
            (sideband::PERF_RECORD_MMAP, Some((1, 1)), Some(20)),
            (12, Some((1, 1)), Some(21))
        ]
    );
    assert_eq!(
        maps(&snap, 1),
        [
            (0x1000, "/new".to_owned()),
            (0x9000, "[raw] c.bin".to_owned())
        ]
    );
    assert_eq!(
        maps(&snap, 2),
        [
            (0x2000, "/two".to_owned()),
            (0x9000, "[raw] c.bin".to_owned())
        ]
    );
    let code_pids: Vec<u32> = snap.code.iter().map(|c| c.pid).collect();
    assert_eq!(code_pids, [0, 1, 2]);
    let clock = snap.meta.clock.unwrap();
    assert_eq!(
        (clock.time_zero, clock.time_mult, clock.valid),
        (100, 3, true)
    );
    assert_eq!(snap.meta.recorder.sample_type, SIDEBAND_SAMPLE_TYPE);
    assert_eq!(snap.meta.recorder.cpus, [2, 5]);
}
