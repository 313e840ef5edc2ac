//! Recordings lookback did not make, turned into timelines by `lookback decode`: a raw
//! Intel PT capture with its ELF file, and `perf record` files (perf.data).
//!
//! The raw captures are Intel libipt's conformance traces (`../shared/corpus`, made by
//! Intel's tools), their code linked into ELF files here by gcc with named functions.
//! perf.data files come from Debian's `perf` (this machine has no Intel PT: its files
//! hold none, which must be refused with the reason) and, where present, from public
//! recordings of real Intel PT hardware given in `LOOKBACK_REAL_TRACES` (default
//! `../real-traces` beside the repository; e.g. `perf.data.intel_pt-4.14` and
//! `perf.data.piped.intel_pt-4.14` of `google/perf_data_converter`'s quipper test data,
//! never committed). Each parse is compared with an independent reader in the same run:
//! `perf report -D` for file mode, quipper's recorded parse (`….pr.out.pb_text`) for pipe
//! mode. The traces are read by the independent `fxt` parser.
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use lookback_tests::inputs::{
    call_elf, corpus, have_perf, lowest_segment, real_traces, skipped, slices, text,
};
use lookback_tests::{lookback_bin, read_fxt};

#[test]
fn a_raw_capture_and_its_elf_become_a_trace_with_its_calls_named() {
    let pt = corpus().join("call_direct-ret_compressed.pt");
    assert!(
        pt.is_file(),
        "the libipt corpus is missing: {}",
        pt.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    // The trace ran the code at 0x100000: an ELF linked there, and one linked elsewhere
    // and relocated with BASE (its lowest segment's new address, as ptxed takes it).
    let at_place = call_elf(dir.path(), 0x10_0000);
    let elsewhere = call_elf(dir.path(), 0x30_0000);
    let base = lowest_segment(&elsewhere) - 0x20_0000;
    let relocated = format!("{}:{base:#x}", elsewhere.display());
    for elf in [at_place.display().to_string(), relocated] {
        let trace = dir.path().join("t.fxt");
        let out = Command::new(lookback_bin())
            .args(["decode", "--pt"])
            .arg(&pt)
            .args(["--elf", &elf, "-o"])
            .arg(&trace)
            .output()
            .expect("lookback decode");
        assert!(out.status.success(), "{elf}: {}", text(&out));
        let Some(doc) = read_fxt(&trace) else { return };
        let threads = slices(&doc);
        let [(_, only)] = threads.iter().collect::<Vec<_>>()[..] else {
            panic!("{elf}: one track expected: {threads:?}");
        };
        let named: Vec<(&str, u64)> = only
            .iter()
            .filter(|(n, _)| !n.starts_with('['))
            .map(|(n, d)| (n.as_str(), *d))
            .collect();
        assert_eq!(named, [("outer", 0), ("callee", 1)], "{elf}: {only:?}");
        assert!(
            only.iter().all(|(n, _)| !n.starts_with("[decode error")),
            "{elf}: {only:?}"
        );
    }
}

#[test]
fn kernel_code_given_as_a_kcore_is_decoded_into_the_trace_file() {
    // A kcore (`perf record --kcore`, libipt's `--pevent:kcore`) is an ELF core file whose
    // loadable segments hold the kernel's code at its addresses; an ELF linked where the
    // trace ran stands in for one (its symbols then name the calls, as kallsyms would).
    let pt = corpus().join("call_direct-ret_compressed.pt");
    let dir = tempfile::tempdir().expect("tempdir");
    let core = call_elf(dir.path(), 0x10_0000);
    let core = core.display().to_string();
    for with_kcore in [false, true] {
        let trace = dir.path().join(format!("k{with_kcore}.fxt"));
        let mut cmd = Command::new(lookback_bin());
        cmd.args(["decode", "--pt"]).arg(&pt).arg("-o").arg(&trace);
        if with_kcore {
            cmd.args(["--", "--pevent:kcore", &core]);
        }
        let out = cmd.output().expect("lookback decode");
        assert!(out.status.success(), "kcore {with_kcore}: {}", text(&out));
        let Some(doc) = read_fxt(&trace) else { return };
        let all: Vec<(String, u64)> = slices(&doc).into_values().flatten().collect();
        let errors = all.iter().any(|(n, _)| n.starts_with("[decode error"));
        let named: Vec<(&str, u64)> = all
            .iter()
            .filter(|(n, _)| !n.starts_with('['))
            .map(|(n, d)| (n.as_str(), *d))
            .collect();
        if with_kcore {
            assert_eq!(named, [("outer", 0), ("callee", 1)], "{all:?}");
            assert!(!errors, "{all:?}");
        } else {
            // Without the code: no calls invented, the gap marked.
            assert!(named.is_empty() && errors, "{all:?}");
        }
    }
}

#[test]
fn code_at_the_wrong_address_is_a_marked_error_not_invented_calls() {
    let pt = corpus().join("call_direct-ret_compressed.pt");
    let dir = tempfile::tempdir().expect("tempdir");
    let elf = call_elf(dir.path(), 0x30_0000);
    let trace = dir.path().join("t.fxt");
    let out = Command::new(lookback_bin())
        .args(["decode", "--pt"])
        .arg(&pt)
        .arg("--elf")
        .arg(&elf)
        .arg("-o")
        .arg(&trace)
        .output()
        .expect("lookback decode");
    assert!(out.status.success(), "{}", text(&out));
    let Some(doc) = read_fxt(&trace) else { return };
    let threads = slices(&doc);
    let all: Vec<&(String, u64)> = threads.values().flatten().collect();
    assert!(
        all.iter().any(|(n, _)| n.starts_with("[decode error")),
        "{all:?}"
    );
    assert!(
        all.iter().all(|(n, _)| n != "outer" && n != "callee"),
        "{all:?}"
    );
}

#[test]
fn a_perf_data_without_intel_pt_is_refused_with_the_reason_also_when_cut() {
    if !have_perf() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("perf.data");
    let record = Command::new("perf")
        .args(["record", "-q", "-e", "cpu-clock", "--switch-events", "-o"])
        .arg(&data)
        .args(["--", "/bin/true"])
        .output()
        .expect("perf record");
    assert!(record.status.success(), "perf record: {}", text(&record));
    let bytes = std::fs::read(&data).expect("perf.data");
    let cut = dir.path().join("cut.data");
    std::fs::write(&cut, &bytes[..bytes.len() * 2 / 3]).expect("write cut");
    for file in [&data, &cut] {
        let out = Command::new(lookback_bin())
            .arg("decode")
            .arg(file)
            .arg("-o")
            .arg(dir.path().join("t.fxt"))
            .output()
            .expect("lookback decode");
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{}: {said}", file.display());
        assert!(
            said.contains("no Intel PT in this perf.data"),
            "{}: {said}",
            file.display()
        );
        assert!(!said.contains("panicked"), "{said}");
    }
}

/// `perf report -D`'s AUX bytes by CPU and kernel records by type name.
fn perf_dump(data: &Path) -> (BTreeMap<u32, u64>, BTreeMap<String, u64>) {
    let out = Command::new("perf")
        .args(["report", "-D", "-i"])
        .arg(data)
        .output()
        .expect("perf report -D");
    let mut aux = BTreeMap::new();
    let mut kinds = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(at) = line.find("PERF_RECORD_") else {
            continue;
        };
        if !line.contains(": PERF_RECORD_") {
            continue;
        }
        let kind: String = line[at..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if kind == "PERF_RECORD_AUXTRACE" {
            let field = |name: &str| {
                let rest = &line[line.find(name)? + name.len()..];
                let word = rest.split_whitespace().next()?;
                u64::from_str_radix(word.trim_start_matches("0x"), 16)
                    .ok()
                    .or_else(|| word.parse().ok())
            };
            let size = field("size: ").expect("AUXTRACE size");
            let cpu = line[line.find("cpu: ").expect("cpu") + 5..]
                .trim()
                .parse::<u32>()
                .expect("cpu number");
            *aux.entry(cpu).or_default() += size;
        }
        *kinds.entry(kind).or_default() += 1;
    }
    (aux, kinds)
}

/// `lookback decode FILE --stats`'s `perf.data:` line: AUX bytes by CPU, records by type.
fn our_counts(stats: &str) -> (BTreeMap<u32, u64>, BTreeMap<u32, u64>) {
    let line = stats
        .lines()
        .find(|l| l.starts_with("perf.data:"))
        .expect("a perf.data line");
    let aux_part = &line[line.find("AUX bytes: ").expect("aux") + 11..line.find(';').expect(";")];
    let aux = aux_part
        .split(", ")
        .map(|p| {
            let words: Vec<&str> = p.split_whitespace().collect();
            (
                words[1].parse().expect("cpu"),
                words[2].parse().expect("bytes"),
            )
        })
        .collect();
    let kinds = line[line.find("by type: ").expect("types") + 9..]
        .split_whitespace()
        .map(|p| {
            let (k, n) = p.split_once(':').expect("k:n");
            (k.parse().expect("kind"), n.parse().expect("count"))
        })
        .collect();
    (aux, kinds)
}

/// Record type numbers of the names `perf report -D` prints.
const KINDS: [(&str, u32); 10] = [
    ("PERF_RECORD_MMAP", 1),
    ("PERF_RECORD_COMM", 3),
    ("PERF_RECORD_EXIT", 4),
    ("PERF_RECORD_FORK", 7),
    ("PERF_RECORD_SAMPLE", 9),
    ("PERF_RECORD_MMAP2", 10),
    ("PERF_RECORD_AUX", 11),
    ("PERF_RECORD_ITRACE_START", 12),
    ("PERF_RECORD_SWITCH", 14),
    ("PERF_RECORD_SWITCH_CPU_WIDE", 15),
];

/// Decodes a real recording; checks the trace the `fxt` parser reads: threads with the
/// recording's names, decode errors marked where the binaries are absent.
fn decode_real(data: &Path, dir: &Path) -> String {
    let trace = dir.join("real.fxt.gz");
    let out = Command::new(lookback_bin())
        .arg("decode")
        .arg(data)
        .arg("--stats")
        .arg("-o")
        .arg(&trace)
        .output()
        .expect("lookback decode");
    let said = text(&out);
    assert!(out.status.success(), "{}: {said}", data.display());
    assert!(
        said.contains("[unknown]"),
        "the missing binaries are named: {said}"
    );
    if let Some(doc) = read_fxt(&trace) {
        let threads = slices(&doc);
        assert!(
            threads.keys().any(|n| n.starts_with("echo")),
            "{:?}",
            threads.keys()
        );
        let errors = threads
            .values()
            .flatten()
            .filter(|(n, _)| n.starts_with("[decode error"))
            .count();
        assert!(errors > 0, "no decode error marked without the binaries");
    }
    said
}

#[test]
fn a_public_perf_data_of_real_intel_pt_parses_as_perf_reads_it_and_becomes_a_trace() {
    let Some(dir) = real_traces() else { return };
    let data = dir.join("perf.data.intel_pt-4.14");
    if !data.is_file() || !have_perf() {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let said = decode_real(&data, tmp.path());
    let (aux, kinds) = our_counts(&said);
    let (perf_aux, perf_kinds) = perf_dump(&data);
    assert_eq!(aux, perf_aux, "AUX bytes by CPU");
    for (name, kind) in KINDS {
        assert_eq!(
            kinds.get(&kind).copied().unwrap_or(0),
            perf_kinds.get(name).copied().unwrap_or(0),
            "{name}"
        );
    }
    // Cut in the middle of an AUX chunk: what came before is decoded, with a warning.
    let bytes = std::fs::read(&data).expect("read");
    let cut = tmp.path().join("cut.data");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let out = Command::new(lookback_bin())
        .arg("decode")
        .arg(&cut)
        .arg("-o")
        .arg(tmp.path().join("cut.fxt.gz"))
        .output()
        .expect("lookback decode");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    assert!(said.contains("the records stop at byte"), "{said}");
    // Its rings (MTC/CYC timing) decode to the same trace on 1 thread and 2: CPU 3's
    // 137 KB ring is cut in 2, and its second piece's worker, started at a PSB with the
    // time the seed scan gave, meets the first piece's decoder.
    let on = |threads: &str| {
        let path = tmp.path().join(format!("t{threads}.fxt"));
        let out = Command::new(lookback_bin())
            .args(["decode", "--stats", "--threads", threads])
            .arg(&data)
            .arg("-o")
            .arg(&path)
            .output()
            .expect("lookback decode");
        assert!(out.status.success(), "{}", text(&out));
        (std::fs::read(&path).expect("read the trace"), text(&out))
    };
    let ((one, _), (two, said)) = (on("1"), on("2"));
    assert!(one == two, "the 2-thread trace differs");
    assert!(
        said.contains("decode threads: 2, 3 pieces: 3 taken from their thread"),
        "{said}"
    );
}

/// quipper's recorded parse of a file: AUX bytes by CPU and events by kind.
fn quipper_counts(pb_text: &str) -> (BTreeMap<u32, u64>, BTreeMap<String, u64>) {
    let mut aux = BTreeMap::new();
    let mut kinds = BTreeMap::new();
    let mut in_aux = None::<u64>;
    for line in pb_text.lines() {
        let trimmed = line.trim();
        if line.starts_with("  ") && !line.starts_with("   ") && trimmed.ends_with("_event {") {
            *kinds
                .entry(trimmed.trim_end_matches(" {").to_owned())
                .or_default() += 1;
            in_aux = (trimmed == "auxtrace_event {").then_some(0);
        }
        if let Some(size) = in_aux {
            if let Some(v) = trimmed.strip_prefix("size: ") {
                in_aux = v.parse().ok();
            } else if let Some(cpu) = trimmed.strip_prefix("cpu: ") {
                aux.insert(cpu.parse().expect("cpu"), size);
                in_aux = None;
            }
        }
    }
    (aux, kinds)
}

#[test]
fn a_public_piped_perf_data_of_real_intel_pt_parses_as_quipper_reads_it() {
    let Some(dir) = real_traces() else { return };
    let data = dir.join("perf.data.piped.intel_pt-4.14");
    let reference = dir.join("perf.data.piped.intel_pt-4.14.pr.out.pb_text");
    if !data.is_file() || !reference.is_file() {
        skipped(&format!(
            "{} or its quipper parse is missing",
            data.display()
        ));
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let said = decode_real(&data, tmp.path());
    let (aux, kinds) = our_counts(&said);
    let (q_aux, q_kinds) = quipper_counts(&std::fs::read_to_string(&reference).expect("read"));
    assert_eq!(aux, q_aux, "AUX bytes by CPU");
    let ours = |k: u32| kinds.get(&k).copied().unwrap_or(0);
    let theirs = |k: &str| q_kinds.get(k).copied().unwrap_or(0);
    assert_eq!(ours(1) + ours(10), theirs("mmap_event"), "MMAP and MMAP2");
    assert_eq!(ours(3), theirs("comm_event"));
    assert_eq!(ours(4), theirs("exit_event"));
    assert_eq!(ours(9), theirs("sample_event"));
    assert_eq!(ours(11), theirs("aux_event"));
    assert_eq!(ours(12), theirs("itrace_start_event"));
    assert_eq!(ours(14) + ours(15), theirs("context_switch_event"));
}

/// `--raw` arguments for a libxdc page cache (`PREFIX.addr`: one little-endian u64
/// address per 4 KiB page of `PREFIX.dump`).
fn page_cache_raw(prefix: &Path) -> Vec<String> {
    let addrs = std::fs::read(prefix.with_extension("addr")).expect("read .addr");
    let dump = prefix.with_extension("dump");
    addrs
        .chunks_exact(8)
        .enumerate()
        .flat_map(|(i, a)| {
            let addr = u64::from_le_bytes(a.try_into().expect("8 bytes"));
            let offset = i * 4096;
            [
                "--raw".to_owned(),
                format!(
                    "{}:{offset:#x}-{:#x}:{addr:#x}",
                    dump.display(),
                    offset + 4096
                ),
            ]
        })
        .collect()
}

#[test]
fn real_kvm_pt_captures_decode_on_several_threads_as_on_one() {
    let Some(dir) = real_traces() else { return };
    let mut cases = 0;
    // nyx-fuzz/libxdc_experiments' test_data (real KVM-PT traces of programs under fuzzing).
    for (name, trace, cache) in [("qemu", "trace1", "page_cache"), ("mruby", "trace", "data")] {
        let case = dir.join("libxdc").join(name);
        let trace = case.join(trace);
        if !trace.is_file() || !case.join(format!("{cache}.dump")).is_file() {
            skipped(&format!("{} is missing", trace.display()));
            continue;
        }
        let raw = page_cache_raw(&case.join(cache));
        let decode = |args: &[&str]| {
            let out = Command::new(lookback_bin())
                .arg("decode")
                .args(args)
                .arg("--pt")
                .arg(&trace)
                .args(&raw)
                .output()
                .expect("lookback decode");
            assert!(out.status.success(), "{name}: {}", text(&out));
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let one = decode(&["--threads", "1"]);
        let four = decode(&["--threads", "4"]);
        assert!(
            one.lines().count() > 100_000,
            "{name}: {} events",
            one.lines().count()
        );
        // Every event (kind, addresses, time, offset, error) in the same order.
        if one != four {
            let at = one
                .lines()
                .zip(four.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!("{name}: the 4-thread decode differs from event {at} on");
        }
        // The trace is cut into 4 pieces and each worker's start met the decode before
        // it: the parallel decode did not fall back to one thread.
        let stats = decode(&["--stats", "--threads", "4"]);
        assert!(
            stats.contains("threads: 4, 4 pieces: 4 taken from their thread, 0 decoded again"),
            "{name}: {stats}"
        );
        // The timeline too: the same FXT file, byte for byte.
        let tmp = tempfile::tempdir().expect("tempdir");
        let fxt = |threads: &str| {
            let path = tmp.path().join(format!("{threads}.fxt"));
            decode(&["--threads", threads, "-o", path.to_str().expect("utf-8")]);
            std::fs::read(&path).expect("read the trace")
        };
        let (one, four) = (fxt("1"), fxt("4"));
        assert!(one.len() > 1 << 20, "{name}: {} bytes of FXT", one.len());
        assert!(one == four, "{name}: the 4-thread timeline differs");
        cases += 1;
    }
    if cases == 0 {
        skipped("no libxdc_experiments traces under LOOKBACK_REAL_TRACES/libxdc");
    }
}

#[test]
fn a_perf_record_kcore_directory_is_read_with_its_kernel_text_and_symbols() {
    let Some(dir) = real_traces() else { return };
    let data = dir.join("perf.data.intel_pt-4.14");
    if !data.is_file() {
        return;
    }
    // `perf record --kcore` writes a directory: DIR/data and DIR/kcore_dir/{kcore,
    // kallsyms}. No kcore of that recording's machine is public: an ELF file stands in
    // for it (its text is not the trace's kernel code, so the trace is the same).
    let tmp = tempfile::tempdir().expect("tempdir");
    let recording = tmp.path().join("perf.data");
    let kcore_dir = recording.join("kcore_dir");
    std::fs::create_dir_all(&kcore_dir).expect("mkdir");
    std::fs::copy(&data, recording.join("data")).expect("copy");
    let elf = call_elf(tmp.path(), 0x10_0000);
    std::fs::copy(&elf, kcore_dir.join("kcore")).expect("copy");
    std::fs::write(
        kcore_dir.join("kallsyms"),
        "ffffffff81000000 T _stext\nffffffff81000100 t do_one\nffffffff81000200 D data\n",
    )
    .expect("write");
    let decode = |input: &Path, out: &Path| {
        let out = Command::new(lookback_bin())
            .args(["decode", "--threads", "1"])
            .arg(input)
            .arg("-o")
            .arg(out)
            .output()
            .expect("lookback decode");
        (out.status.code(), text(&out))
    };
    let (code, said) = decode(&recording, &tmp.path().join("dir.fxt"));
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("kcore_dir: 1 segments of the kernel's code, 2 kernel symbols"),
        "{said}"
    );
    let (code, plain) = decode(&data, &tmp.path().join("file.fxt"));
    assert_eq!(code, Some(0), "{plain}");
    let trace = |name: &str| std::fs::read(tmp.path().join(name)).expect("trace");
    assert!(
        trace("dir.fxt") == trace("file.fxt"),
        "the same recording, the same trace"
    );
    // A kcore that is no ELF file: a usage error naming it, no trace.
    std::fs::write(kcore_dir.join("kcore"), b"not an elf").expect("write");
    let (code, said) = decode(&recording, &tmp.path().join("bad.fxt"));
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("kcore: not an ELF file"), "{said}");
}
