//! Raw Intel PT captures with their perf sideband, turned into timelines by `lookback
//! decode --pt FILE[:CPU]... --sideband FILE... -o OUT` (issue 19, item 5).
//!
//! The sideband comes from three places: Intel libipt's conformance corpus (traces and
//! sideband files made by Intel's pttc; `../shared/corpus/libipt/pevent`), records
//! written here for the code of a libipt trace linked by gcc into an ELF file with named
//! functions, and a public perf.data of real Intel PT hardware (`LOOKBACK_REAL_TRACES`)
//! cut into per-CPU AUX and sideband files at the offsets that Debian's `perf script -D`
//! prints, as libipt's `perf-read-aux.bash` and `perf-read-sideband.bash` do. The traces
//! are read by the independent `fxt` parser.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use lookback_tests::inputs::{call_elf, have_perf, real_traces, slices, text};
use lookback_tests::{lookback_bin, read_fxt, workspace_root};
use object::{Object as _, ObjectSegment as _, SegmentFlags};
use serde_json::Value;

fn pevent_corpus() -> PathBuf {
    workspace_root().join("../shared/corpus/libipt/pevent")
}

/// The corpus' sideband file of `case` (`primary` or `secondary`), named after its
/// options as pttc names them.
fn corpus_sideband(case: &str, which: &str, sample_type: &str) -> PathBuf {
    pevent_corpus().join(format!(
        "{case}-pevent-{which},sample-type={sample_type},time-zero=0x0,time-shift=0x0,time-mult=0x1.sb"
    ))
}

/// `lookback decode ARGS --stats -o DIR/NAME.fxt`: the trace file and what was said.
fn decode(dir: &Path, name: &str, args: &[&str]) -> (PathBuf, String) {
    let trace = dir.join(format!("{name}.fxt"));
    let out = Command::new(lookback_bin())
        .current_dir(pevent_corpus())
        .args(["decode", "--stats", "-o"])
        .arg(&trace)
        .args(args)
        .output()
        .expect("lookback decode");
    let said = text(&out);
    assert!(out.status.success(), "{args:?}: {said}");
    assert!(!said.contains("panicked"), "{said}");
    (trace, said)
}

/// `decode()` of one trace and one sideband file, read with `options` (after `--`).
fn decode_one(dir: &Path, name: &str, pt: &str, sb: &str, options: &[&str]) -> (PathBuf, String) {
    let mut args = vec!["--pt", pt, "--sideband", sb, "--"];
    args.extend(options);
    decode(dir, name, &args)
}

/// The `N decode errors` of `--stats`.
fn decode_errors(said: &str) -> u64 {
    said.lines()
        .find_map(|l| l.strip_prefix("trace: "))
        .and_then(|l| l.split(", ").find_map(|f| f.strip_suffix(" decode errors")))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no decode error count: {said}"))
}

fn pids(doc: &Value) -> BTreeSet<u64> {
    doc["threads"]
        .as_array()
        .expect("threads")
        .iter()
        .filter_map(|t| t["pid"].as_u64())
        .collect()
}

#[test]
fn the_corpus_sideband_gives_a_track_per_process_and_its_secondary_maps_count() {
    let case = "pevent-tip_pgd-switch-tsc-tip_pge";
    let pt = format!("{case}.pt");
    let sb = corpus_sideband(case, "primary", "0x6");
    assert!(
        sb.is_file(),
        "the libipt corpus is missing: {}",
        sb.display()
    );
    let sb = sb.to_string_lossy().into_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    // pid 1 runs at 0x1000 until it is switched out; pid 2 at 0x2000 after it is
    // switched in (pid 3 in between ran without trace): two tracks, one per process.
    let (with, _) = decode_one(
        dir.path(),
        "with",
        &pt,
        &sb,
        &["--pevent:sample-type", "0x6"],
    );
    // The same file named as ptxed takes it: the same trace.
    let (as_ptxed, _) = decode(
        dir.path(),
        "as-ptxed",
        &[
            "--pt",
            &pt,
            "--",
            "--pevent:sample-type",
            "0x6",
            "--pevent:primary",
            &sb,
        ],
    );
    let (without, _) = decode(
        dir.path(),
        "without",
        &["--pt", &pt, "--raw", &format!("{case}.bin:0x1000")],
    );
    assert_eq!(
        std::fs::read(&with).expect("read"),
        std::fs::read(&as_ptxed).expect("read"),
        "--sideband and --pevent:primary differ"
    );
    if let (Some(with), Some(without)) = (read_fxt(&with), read_fxt(&without)) {
        assert_eq!(pids(&with), BTreeSet::from([1, 2]), "{with}");
        assert_eq!(pids(&without), BTreeSet::from([0]), "{without}");
    }
    // A secondary file's MMAP (of another CPU) maps the code pid 1 jumps to at 0xa000:
    // without it that stretch is a decode error.
    let case = "pevent-mmap_secondary-tsc";
    let pt = format!("{case}.pt");
    let primary = corpus_sideband(case, "primary", "0x4");
    let secondary = corpus_sideband(case, "secondary", "0x4");
    let (primary, secondary) = (primary.to_string_lossy(), secondary.to_string_lossy());
    let both = [
        "--pt",
        &pt,
        "--sideband",
        &primary,
        "--sideband",
        &secondary,
        "--",
        "--pevent:sample-type",
        "0x4",
    ];
    let (_, said) = decode(dir.path(), "both", &both);
    assert_eq!(decode_errors(&said), 0, "{said}");
    let one = [
        "--pt",
        &pt,
        "--sideband",
        &primary,
        "--",
        "--pevent:sample-type",
        "0x4",
    ];
    let (_, said) = decode(dir.path(), "primary-only", &one);
    assert!(decode_errors(&said) > 0, "{said}");
}

const SAMPLE_TID: u64 = 1 << 1;
const SAMPLE_TIME: u64 = 1 << 2;
const SAMPLE_CPU: u64 = 1 << 7;
const SAMPLE_IDENTIFIER: u64 = 1 << 16;

/// A perf record with the trailer `TID|TIME|CPU|IDENTIFIER` (pid = tid, CPU 0).
fn record(kind: u32, body: &[u8], pid: u32, time: u64, id: u64) -> Vec<u8> {
    let size = 8 + body.len() + 32;
    let mut out = kind.to_le_bytes().to_vec();
    out.extend(0u16.to_le_bytes());
    out.extend(u16::try_from(size).expect("size").to_le_bytes());
    out.extend(body);
    out.extend(pid.to_le_bytes());
    out.extend(pid.to_le_bytes());
    for word in [time, 0, id] {
        out.extend(word.to_le_bytes());
    }
    out
}

/// `pid`, `pid`, then `name` NUL-padded to 8 bytes.
fn with_name(pid: u32, words: &[u64], name: &str) -> Vec<u8> {
    let mut body = pid.to_le_bytes().to_vec();
    body.extend(pid.to_le_bytes());
    for word in words {
        body.extend(word.to_le_bytes());
    }
    let mut name = name.as_bytes().to_vec();
    name.resize((name.len() + 1).next_multiple_of(8), 0);
    body.extend(name);
    body
}

/// `elf`'s executable segment: (address, file offset, size), and the file's length.
fn text_segment(elf: &Path) -> (u64, u64, u64, u64) {
    let bytes = std::fs::read(elf).expect("read elf");
    let file = object::File::parse(&*bytes).expect("parse elf");
    let text = file
        .segments()
        .find(|s| matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & 1 != 0))
        .expect("an executable segment");
    let (offset, size) = text.file_range();
    let len = u64::try_from(bytes.len()).expect("size");
    (text.address(), offset, size, len)
}

/// COMM, an MMAP (`[addr, len, pgoff]` of file `name`) and `ITRACE_START` of process 7,
/// `server`.
fn mapping_sideband(mapping: [u64; 3], name: &str) -> Vec<u8> {
    let mut out = record(3, &with_name(7, &[], "server"), 7, 10, 5);
    out.extend(record(1, &with_name(7, &mapping, name), 7, 11, 5));
    let mut start = 7u32.to_le_bytes().to_vec();
    start.extend(7u32.to_le_bytes());
    out.extend(record(12, &start, 7, 12, 5));
    out
}

/// [`mapping_sideband`] of `elf`'s executable segment.
fn server_sideband(elf: &Path) -> Vec<u8> {
    let (address, offset, size, _) = text_segment(elf);
    mapping_sideband([address, size, offset], &elf.to_string_lossy())
}

/// [`server_sideband`] with `elf` mapped whole as `[vdso]`, as the kernel maps its vDSO
/// image (from offset 0, its text where the ELF file puts it); no file names it.
fn vdso_sideband(elf: &Path) -> Vec<u8> {
    let (address, offset, _, len) = text_segment(elf);
    mapping_sideband([address - offset, len.next_multiple_of(4096), 0], "[vdso]")
}

/// [`decode_one`] with the records' layout given by their identifier (as libipt's
/// perf-get-opts.bash gives it), then `more` options.
fn decode_laid_out(dir: &Path, name: &str, pt: &str, sb: &str, more: &[&str]) -> (PathBuf, String) {
    let layout = format!(
        "5:{:#x}",
        SAMPLE_TID | SAMPLE_TIME | SAMPLE_CPU | SAMPLE_IDENTIFIER
    );
    let mut options = vec!["--pevent:sample-config", &layout];
    options.extend(more);
    decode_one(dir, name, pt, sb, &options)
}

/// The names of all slices of `trace` (`None`: the `fxt` parser is missing here).
fn slice_names(trace: &Path) -> Option<Vec<String>> {
    let doc = read_fxt(trace)?;
    Some(
        slices(&doc)
            .into_values()
            .flatten()
            .map(|(n, _)| n)
            .collect(),
    )
}

#[test]
fn a_sideband_names_the_thread_and_maps_the_code_whose_calls_are_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pt = workspace_root().join("../shared/corpus/libipt/core/call_direct-ret_compressed.pt");
    let pt = pt.to_string_lossy().into_owned();
    let elf = call_elf(dir.path(), 0x10_0000);
    let sideband = dir.path().join("server.pevent");
    let records = server_sideband(&elf);
    std::fs::write(&sideband, &records).expect("write");
    let sb = sideband.to_string_lossy().into_owned();
    let (trace, said) = decode_laid_out(dir.path(), "server", &pt, &sb, &[]);
    assert_eq!(decode_errors(&said), 0, "{said}");
    if let Some(doc) = read_fxt(&trace) {
        let threads = slices(&doc);
        let [(name, only)] = threads.iter().collect::<Vec<_>>()[..] else {
            panic!("one track expected: {threads:?}");
        };
        assert!(name.starts_with("server"), "{name}");
        let named: Vec<(&str, u64)> = only
            .iter()
            .filter(|(n, _)| !n.starts_with('['))
            .map(|(n, d)| (n.as_str(), *d))
            .collect();
        assert_eq!(named, [("outer", 0), ("callee", 1)], "{only:?}");
    }
    // Cut inside the last record (ITRACE_START): the records before it are kept (the
    // code is mapped, the calls named), and the warning says where the file stopped.
    std::fs::write(&sideband, &records[..records.len() - 5]).expect("write");
    let (trace, said) = decode_laid_out(dir.path(), "cut", &pt, &sb, &[]);
    let stop = records.len() - 48;
    assert!(
        said.contains(&format!("the record at byte {stop} cannot be read")),
        "{said}"
    );
    if let Some(names) = slice_names(&trace) {
        assert!(names.iter().any(|n| n == "callee"), "{names:?}");
    }
    // Read with the wrong layout (no identifier): a warning at byte 0, no invented maps.
    std::fs::write(&sideband, &records).expect("write");
    let (trace, said) = decode_one(
        dir.path(),
        "wrong-layout",
        &pt,
        &sb,
        &["--pevent:sample-type", "0x6"],
    );
    assert!(
        said.contains("the record at byte 0 cannot be read"),
        "{said}"
    );
    if let Some(names) = slice_names(&trace) {
        assert!(
            names.iter().all(|n| n != "outer" && n != "callee"),
            "{names:?}"
        );
    }
}

#[test]
fn code_mapped_as_the_vdso_decodes_from_the_vdso_image_given_like_ptxeds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pt = workspace_root().join("../shared/corpus/libipt/core/call_direct-ret_compressed.pt");
    let pt = pt.to_string_lossy().into_owned();
    let elf = call_elf(dir.path(), 0x10_0000);
    let sideband = dir.path().join("vdso.pevent");
    std::fs::write(&sideband, vdso_sideband(&elf)).expect("write");
    let sb = sideband.to_string_lossy().into_owned();
    // Without the image the vDSO has no code: the calls are lost, the gap is an error,
    // and the log says what to give.
    let (trace, said) = decode_laid_out(dir.path(), "no-vdso", &pt, &sb, &[]);
    assert!(decode_errors(&said) > 0, "{said}");
    assert!(said.contains("[vdso] mapping(s) without code"), "{said}");
    let calls = |trace: &Path| {
        read_fxt(trace).map(|doc| {
            slices(&doc)
                .into_values()
                .flatten()
                .filter(|(n, _)| !n.starts_with('['))
                .collect::<Vec<_>>()
        })
    };
    if let Some(named) = calls(&trace) {
        assert_eq!(named, [], "no call without the vDSO's code");
    }
    // With `--pevent:vdso-x64` (the ELF standing in for the kernel's vdso64.so): the code
    // of the mapping, from its page offset; no error, both calls, named from the image's
    // own symbols.
    let elf_arg = elf.to_string_lossy().into_owned();
    let (trace, said) = decode_laid_out(
        dir.path(),
        "vdso",
        &pt,
        &sb,
        &["--pevent:vdso-x64", &elf_arg],
    );
    assert_eq!(decode_errors(&said), 0, "{said}");
    assert!(!said.contains("without code"), "{said}");
    if let Some(named) = calls(&trace) {
        assert_eq!(
            named,
            [("outer".to_owned(), 0), ("callee".to_owned(), 1)],
            "{:?}",
            read_fxt(&trace).map(|d| slices(&d))
        );
    }
}

/// A perf.data cut as libipt's scripts cut it, from the offsets `perf script -D` prints:
/// `DIR/aux-idxN.bin` per mmap index (AUXTRACE payloads in file order), `DIR/sb-cpuN.pevent`
/// per CPU and `DIR/sb.pevent` (no CPU) of the other records. Out: the `--pt` and
/// `--sideband` arguments.
fn split_like_libipt(data: &Path, dir: &Path) -> (Vec<String>, Vec<String>) {
    let out = Command::new("perf")
        .args(["script", "--no-itrace", "-D", "-i"])
        .arg(data)
        .output()
        .expect("perf script -D");
    assert!(out.status.success(), "perf script -D: {}", text(&out));
    let bytes = std::fs::read(data).expect("read perf.data");
    let number = |s: &str| {
        s.strip_prefix("0x")
            .map_or_else(|| s.parse().ok(), |h| u64::from_str_radix(h, 16).ok())
            .unwrap_or_else(|| panic!("not a number: {s}"))
    };
    let mut files: std::collections::BTreeMap<String, Vec<u8>> = std::collections::BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `CPU TIME 0xOFFSET [0xSIZE]: PERF_RECORD_KIND ...`
        let Some((head, kind)) = line.split_once("]: PERF_RECORD_") else {
            continue;
        };
        let fields: Vec<&str> = head.split_whitespace().collect();
        let [.., offset, size] = fields[..] else {
            continue;
        };
        let (offset, size) = (number(offset), number(size.trim_start_matches('[')));
        let cpu = (fields.len() == 4)
            .then(|| fields[0])
            .filter(|c| *c != "-1" && *c != "4294967295");
        let kind = kind.split([' ', ':', '(']).next().unwrap_or_default();
        let at = usize::try_from(offset).expect("offset");
        match kind {
            "AUXTRACE_INFO" | "FINISHED_ROUND" => {}
            "AUXTRACE" => {
                let word = |name: &str| {
                    let tail = &kind_tail(line, name);
                    number(tail.split_whitespace().next().expect("value"))
                };
                let (len, idx) = (word("size:"), word("idx:"));
                let from = at + usize::try_from(size).expect("size");
                let payload = &bytes[from..from + usize::try_from(len).expect("len")];
                files
                    .entry(format!("aux-idx{idx}.bin"))
                    .or_default()
                    .extend(payload);
            }
            _ => {
                let name =
                    cpu.map_or_else(|| "sb.pevent".to_owned(), |c| format!("sb-cpu{c}.pevent"));
                let end = at + usize::try_from(size).expect("size");
                files.entry(name).or_default().extend(&bytes[at..end]);
            }
        }
    }
    let (mut pt, mut sideband) = (Vec::new(), Vec::new());
    for (name, data) in &files {
        let path = dir.join(name);
        std::fs::write(&path, data).expect("write");
        if let Some(idx) = name
            .strip_prefix("aux-idx")
            .and_then(|n| n.strip_suffix(".bin"))
        {
            pt.push(format!("{}:{idx}", path.display()));
        } else {
            sideband.push(path.display().to_string());
        }
    }
    (pt, sideband)
}

/// What follows `name` in `line`.
fn kind_tail<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_once(name).map_or("", |(_, tail)| tail)
}

/// perf's `sample_type` names (`perf script --header-only`) as bits.
fn sample_type_bits(names: &str) -> u64 {
    const BITS: &[&str] = &[
        "IP",
        "TID",
        "TIME",
        "ADDR",
        "READ",
        "CALLCHAIN",
        "ID",
        "CPU",
        "PERIOD",
        "STREAM_ID",
        "RAW",
        "BRANCH_STACK",
        "REGS_USER",
        "STACK_USER",
        "WEIGHT",
        "DATA_SRC",
        "IDENTIFIER",
    ];
    names
        .split('|')
        .map(|n| {
            BITS.iter()
                .position(|b| *b == n.trim())
                .map_or(0, |bit| 1 << bit)
        })
        .sum()
}

/// The ptxed options of a perf.data, as libipt's `perf-get-opts.bash` makes them (but
/// with the exact integers: its gawk rounds `Time Zero` to a double).
fn options_like_libipt(data: &Path) -> Vec<String> {
    let header = Command::new("perf")
        .args(["script", "--header-only", "-i"])
        .arg(data)
        .output()
        .expect("perf script --header-only");
    let mut opts = Vec::new();
    let mut first = true;
    for line in String::from_utf8_lossy(&header.stdout).lines() {
        if let Some(cpuid) = line.strip_prefix("# cpuid : GenuineIntel,") {
            opts.extend(["--cpu".to_owned(), cpuid.replace(',', "/")]);
        }
        let Some(event) = line.strip_prefix("# event : ") else {
            continue;
        };
        let ids = kind_tail(event, "id = {")
            .split('}')
            .next()
            .unwrap_or_default();
        let types = kind_tail(event, "sample_type = ")
            .split(',')
            .next()
            .unwrap_or_default();
        let bits = format!("{:#x}", sample_type_bits(types));
        for id in ids.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            // Synthesized records have identifier 0 and the first event's layout.
            if first {
                opts.extend(["--pevent:sample-config".to_owned(), format!("0:{bits}")]);
                first = false;
            }
            opts.extend(["--pevent:sample-config".to_owned(), format!("{id}:{bits}")]);
        }
        if event.starts_with("name = intel_pt") {
            let config = kind_tail(event, "config = ")
                .split(',')
                .next()
                .unwrap_or_default();
            let config = u64::from_str_radix(config.trim_start_matches("0x"), 16).expect("config");
            opts.extend(["--mtc-freq".to_owned(), ((config >> 14) & 0xf).to_string()]);
        }
    }
    let dump = Command::new("perf")
        .args(["script", "--no-itrace", "-D", "-i"])
        .arg(data)
        .output()
        .expect("perf script -D");
    let dump = String::from_utf8_lossy(&dump.stdout);
    for (label, option) in [
        ("Time Shift", "--pevent:time-shift"),
        ("Time Muliplier", "--pevent:time-mult"),
        ("Time Multiplier", "--pevent:time-mult"),
        ("Time Zero", "--pevent:time-zero"),
        ("TSC:CTC numerator", "--cpuid-0x15.ebx"),
        ("TSC:CTC denominator", "--cpuid-0x15.eax"),
        ("Max non-turbo ratio", "--nom-freq"),
    ] {
        if let Some(line) = dump.lines().find(|l| l.trim_start().starts_with(label)) {
            let value = line.split_whitespace().last().expect("value");
            opts.extend([option.to_owned(), value.to_owned()]);
        }
    }
    opts
}

#[test]
fn a_real_perf_data_cut_by_perf_into_raw_traces_and_sideband_decodes_as_the_perf_data() {
    let Some(real) = real_traces() else { return };
    let data = real.join("perf.data.intel_pt-4.14");
    if !data.is_file() || !have_perf() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let (pt, sideband) = split_like_libipt(&data, dir.path());
    // 2 AUX rings (CPUs 0 and 3), sideband of 4 CPUs and the records of none.
    assert_eq!(pt.len(), 2, "{pt:?}");
    assert!(sideband.len() >= 4, "{sideband:?}");
    let mut args: Vec<String> = Vec::new();
    for file in &pt {
        args.extend(["--pt".to_owned(), file.clone()]);
    }
    for file in &sideband {
        args.extend(["--sideband".to_owned(), file.clone()]);
    }
    args.push("--".to_owned());
    args.extend(options_like_libipt(&data));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (raw, said) = decode(dir.path(), "raw", &args);
    let whole = dir.path().join("whole.fxt");
    let out = Command::new(lookback_bin())
        .arg("decode")
        .arg(&data)
        .arg("-o")
        .arg(&whole)
        .output()
        .expect("lookback decode");
    assert!(out.status.success(), "{}", text(&out));
    // The same threads, calls, errors and times: the same file.
    assert!(
        std::fs::read(&raw).expect("read") == std::fs::read(&whole).expect("read"),
        "the raw capture's trace differs from the perf.data's: {said}"
    );
    assert!(
        decode_errors(&said) > 0,
        "the absent binaries are decode errors: {said}"
    );
}
