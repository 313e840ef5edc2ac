//! `lookback decode`: decode a snapshot, a perf.data recording or raw Intel PT into a trace;
//! and the engine behind `lookback-pt`, Intel's tools' views of the same decoder.
//!
//! `lookback decode SNAPSHOT.lbsnap [-o OUT]` writes the trace of a sampling or Intel PT
//! snapshot (FXT by default, `OUT` = the input's stem + `.fxt.gz`; `.json`/`.json.gz` →
//! Chrome JSON); `lookback decode perf.data [-o OUT]` does the same for a `perf record -e
//! intel_pt//` recording (its binaries found under `--symfs`, in the build-id cache or
//! at their paths, with the recorded build-ids). Raw Intel PT is decoded with `--pt FILE`
//! and the code given by `--elf FILE[:BASE]` or `--raw FILE[:OFFSET[-END]]:ADDR`; with
//! `-o OUT` it becomes a trace file the same way (perf sideband with `--sideband`, its
//! layout in `--pevent:*` options after `--`); without, the branch events are listed.
//!
//! [`DecodeArgs`] is the user's command line; [`DecodeRequest`] what [`run_request`] does,
//! which `lookback-pt` ([`super::pt_tool`]) also fills with a debug view of the decoder's
//! layers: ptdump (packets, like Intel's ptdump), ptxed (instructions and events, like
//! Intel's `ptxed --no-inst`; the files its MMAP records name read relative to the current
//! directory, as ptxed does) and a packet pass timed apart. One engine, two front ends.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::fs;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use super::{CliError, CliResult};
use crate::decode::import::raw::{
    ElfSpec, SidebandFile, VdsoImages, add_sideband, embed_vdso, raw_segment,
};
use crate::decode::pt::flow::branches::{
    BranchEvent, BranchKind, Branches, DecodeCounts, ParallelStats, Split, decode_parallel,
    decode_parallel_with,
};
use crate::decode::pt::flow::image::{Image, RawSpec};
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::packet::PacketKind;
use crate::decode::pt::sideband::pevent::{PeventConfig, SidebandStream};
use crate::decode::pt::sideband::sb_context::Abi;
use crate::decode::pt::tools::files::{FileLoader, kernel_image, read_pevent};
use crate::decode::pt::tools::ptdump::ptdump_with_sideband;
use crate::decode::pt::tools::ptdump_opts::{PeventFile, PtdumpOptions};
use crate::decode::pt::tools::ptxed::{Sideband, ptxed_with_sideband};
use crate::decode::pt::tools::ptxed_opts::PtxedOptions;
use crate::decode::pt::{Cpu, Errata};

#[derive(Debug, Args)]
#[command(after_help = "Examples:\n  \
lookback decode trace.lbsnap                      # → trace.fxt.gz\n  \
lookback decode trace.lbsnap -o trace.json.gz\n  \
lookback decode perf.data --symfs /mnt/host -o perf.fxt.gz\n  \
lookback decode --pt trace.pt --elf ./server:0x555555554000 -o trace.fxt.gz\n  \
lookback decode --pt aux0.bin:0 --sideband sb0.pevent -o t.fxt.gz -- --pevent:sample-type 0x10086\n\n\
Intel's ptdump and ptxed views of a raw trace: lookback-pt (cargo xtask pt --help).")]
pub struct DecodeArgs {
    /// A snapshot (.lbsnap) or a `perf record -e intel_pt//` file (perf.data).
    #[arg(conflicts_with_all = ["pt", "raw", "elf"])]
    pub input: Option<PathBuf>,
    /// The trace: `.fxt`/`.fxt.gz` (FXT) or `.json`/`.json.gz` (Chrome JSON). Default
    /// for INPUT: its stem + `.fxt.gz`; without it, `--pt` lists the branch events.
    #[arg(short, long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// A raw Intel PT trace (the AUX data, oldest byte first); with `-o`, one per CPU.
    #[arg(long, value_name = "FILE[:CPU]")]
    pub pt: Vec<String>,
    /// With `--pt ... -o OUT`: a perf sideband file for the CPU of the `--pt` at its
    /// place (or the one its records name); its layout in `--pevent:*` after `--`.
    #[arg(
        long,
        value_name = "FILE",
        requires = "output",
        conflicts_with = "input"
    )]
    pub sideband: Vec<PathBuf>,
    /// Code at an address: FILE[:OFFSET[-END]]:ADDR. Repeatable; later files shadow.
    #[arg(long, value_name = "FILE:ADDR")]
    pub raw: Vec<String>,
    /// An ELF file the trace ran, its lowest loadable segment at BASE if given.
    #[arg(long, value_name = "FILE[:BASE]", requires = "pt")]
    pub elf: Vec<String>,
    /// perf.data and `--sideband`: the recording's binaries under DIR (`perf --symfs`).
    #[arg(long, value_name = "DIR")]
    pub symfs: Option<PathBuf>,
    /// perf.data: the build-id cache (default `~/.debug`, as perf's).
    #[arg(long, value_name = "DIR", requires = "input")]
    pub buildid_dir: Option<PathBuf>,
    /// With INPUT: also look for separate debug files in DIR; repeatable.
    #[arg(long, value_name = "DIR", requires = "input")]
    pub debug_dir: Vec<PathBuf>,
    /// Never ask debuginfod servers for stripped binaries' debug files (the snapshot's
    /// rule, else `DEBUGINFOD_URLS`, says which otherwise).
    #[arg(long)]
    pub no_debuginfod: bool,
    /// The CPU that recorded the trace, for its errata: FAMILY/MODEL[/STEPPING].
    #[arg(long, value_name = "F/M[/S]")]
    pub cpu: Option<String>,
    /// Decode on N threads (default: every core); the result is the one-thread decode's.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Report counts, time and peak memory (with INPUT or `-o`: beside the trace).
    #[arg(long)]
    pub stats: bool,
    /// The trace's sideband layout and timing (`--pevent:*`, `--mtc-freq`, ...), after `--`.
    #[arg(last = true, value_name = "TRACE-OPTIONS")]
    pub tool_args: Vec<String>,
}

/// What to decode and how: `lookback decode`'s arguments, or `lookback-pt`'s with one of
/// Intel's tools' views. In: paths and options as given. Out: [`run`]'s file or text.
#[derive(Debug, Default, Clone)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "modes and switches, each its own flag"
)]
pub struct DecodeRequest {
    pub input: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub pt: Vec<String>,
    pub sideband: Vec<PathBuf>,
    pub raw: Vec<String>,
    pub elf: Vec<String>,
    pub symfs: Option<PathBuf>,
    pub buildid_dir: Option<PathBuf>,
    pub cpu: Option<String>,
    /// Intel's ptdump text.
    pub ptdump: bool,
    /// Intel's `ptxed --no-inst` text.
    pub ptxed: bool,
    pub stats: bool,
    /// With `stats` on a raw trace: a timed packet pass of its own first.
    pub packet_stats: bool,
    pub threads: Option<u16>,
    pub debug_dir: Vec<PathBuf>,
    pub no_debuginfod: bool,
    /// Options of ptdump or ptxed (`--pevent:*` only from `lookback decode`).
    pub tool_args: Vec<String>,
}

/// Options after `--` that describe the trace rather than how a tool prints it: the
/// sideband's layout and files (`--pevent`, `--pevent:*`), and the recording CPU's and
/// clock's settings the decode needs for timing (as libipt's `perf-get-opts.bash` prints
/// them for a perf.data).
const TRACE_OPTIONS: [&str; 5] = [
    "--cpu",
    "--mtc-freq",
    "--nom-freq",
    "--cpuid-0x15.eax",
    "--cpuid-0x15.ebx",
];

/// Whether `arg`, an option after `--`, is one `lookback decode` takes.
fn is_trace_option(arg: &str) -> bool {
    arg == "--pevent" || arg.starts_with("--pevent:") || TRACE_OPTIONS.contains(&arg)
}

impl DecodeArgs {
    /// The request, after checking that only options describing the trace come after
    /// `--` (Intel's tools' display options are `lookback-pt`'s).
    pub fn request(&self) -> Result<DecodeRequest, CliError> {
        if let Some(other) = self
            .tool_args
            .iter()
            .find(|a| a.starts_with("--") && !is_trace_option(a))
        {
            return Err(CliError::usage(anyhow::anyhow!(
                "{other}: after `--`, lookback decode takes the trace's --pevent:*, --cpu, \
                 --mtc-freq, --nom-freq and --cpuid-0x15.* options only (Intel's ptdump and \
                 ptxed display options: lookback-pt)"
            )));
        }
        Ok(DecodeRequest {
            input: self.input.clone(),
            output: self.output.clone(),
            pt: self.pt.clone(),
            sideband: self.sideband.clone(),
            raw: self.raw.clone(),
            elf: self.elf.clone(),
            symfs: self.symfs.clone(),
            buildid_dir: self.buildid_dir.clone(),
            cpu: self.cpu.clone(),
            stats: self.stats,
            threads: self.threads,
            debug_dir: self.debug_dir.clone(),
            no_debuginfod: self.no_debuginfod,
            tool_args: self.tool_args.clone(),
            ..DecodeRequest::default()
        })
    }
}

struct Out<W: io::Write> {
    inner: W,
    error: Option<io::Error>,
}

impl<W: io::Write> fmt::Write for Out<W> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.inner.write_all(s.as_bytes()).map_err(|err| {
            self.error = Some(err);
            fmt::Error
        })
    }
}

fn stdout() -> Out<BufWriter<io::StdoutLock<'static>>> {
    Out {
        inner: BufWriter::new(io::stdout().lock()),
        error: None,
    }
}

fn finish<W: io::Write>(mut out: Out<W>, result: fmt::Result) -> Result<(), CliError> {
    let flushed = out.inner.flush();
    match (out.error.take(), result, flushed) {
        // A closed pipe (`| head`) is not an error.
        (Some(err), _, _) | (None, _, Err(err)) if err.kind() == io::ErrorKind::BrokenPipe => {
            Ok(())
        }
        (Some(err), _, _) | (None, _, Err(err)) => Err(CliError::runtime(
            anyhow::Error::new(err).context("writing the output"),
        )),
        (None, Err(_), Ok(())) => Err(CliError::runtime(anyhow::anyhow!(
            "formatting the output failed"
        ))),
        (None, Ok(()), Ok(())) => Ok(()),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, CliError> {
    fs::read(path)
        .with_context(|| format!("reading {}", path.display()))
        .map_err(CliError::runtime)
}

/// The tool arguments with `--cpu` in front, when given.
fn tool_args(args: &DecodeRequest) -> Vec<String> {
    let mut all = Vec::new();
    if let Some(cpu) = &args.cpu {
        all.extend(["--cpu".to_owned(), cpu.clone()]);
    }
    all.extend(args.tool_args.iter().cloned());
    all
}

/// `x/name.lbsnap` → `x/name.fxt.gz`.
fn default_output(input: &Path) -> PathBuf {
    let name = input
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name.strip_suffix(".lbsnap").unwrap_or(&name);
    input.with_file_name(format!("{stem}.fxt.gz"))
}

/// The process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Whether `path` starts with perf.data's magic.
fn is_perf_data(path: &Path) -> bool {
    use std::io::Read as _;
    let mut magic = [0u8; 8];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|()| &magic == b"PERFILE2" || &magic == b"2ELIFREP")
}

/// A `perf record` output: a perf.data file, or the directory `perf record --kcore`
/// writes (`DIR/data`, and the kernel's text in `DIR/kcore_dir`, when it is there).
fn perf_data_paths(path: &Path) -> Option<(PathBuf, Option<PathBuf>)> {
    if path.is_dir() {
        let data = path.join("data");
        let kcore_dir = Some(path.join("kcore_dir")).filter(|d| d.is_dir());
        return is_perf_data(&data).then_some((data, kcore_dir));
    }
    is_perf_data(path).then(|| (path.to_owned(), None))
}

fn run_snapshot(args: &DecodeRequest, input: &Path) -> CliResult {
    let started = Instant::now();
    let (mut snap, about) = if let Some((data, kcore_dir)) = perf_data_paths(input) {
        read_perf_data(&data, kcore_dir.as_deref(), args)?
    } else {
        let snap = crate::snapshot::read(input)
            .with_context(|| format!("reading {}", input.display()))
            .map_err(CliError::runtime)?;
        (snap, None)
    };
    // The directories given first: they are where the user knows the files are.
    let mut dirs = args.debug_dir.clone();
    dirs.extend(std::mem::take(&mut snap.meta.debug_dirs));
    snap.meta.debug_dirs = dirs;
    if args.no_debuginfod {
        snap.meta.debuginfod = crate::elf::debuginfod::Servers::Off;
    }
    let out = args.output.clone().unwrap_or_else(|| default_output(input));
    write_snapshot(&snap, &out, args, started.elapsed(), about)
}

/// What a perf.data file held, for `--stats`: its AUX rings and records by type.
fn perf_data_about(file: &crate::decode::perf_file::PerfFile) -> String {
    let mut rings: std::collections::BTreeMap<(u32, u32), usize> =
        std::collections::BTreeMap::new();
    for chunk in &file.aux {
        *rings.entry((chunk.idx, chunk.cpu)).or_default() += chunk.data.len();
    }
    let rings: Vec<String> = rings
        .iter()
        .map(|((idx, cpu), bytes)| match *cpu {
            u32::MAX => format!("mmap {idx} {bytes}"),
            cpu => format!("cpu {cpu} {bytes}"),
        })
        .collect();
    let mut kinds: std::collections::BTreeMap<u32, u64> = std::collections::BTreeMap::new();
    for record in &file.records {
        *kinds.entry(record.kind).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k}:{n}")).collect();
    format!(
        "perf.data: {} mode, {} events, AUX bytes: {}; kernel records by type: {}",
        if file.pipe { "pipe" } else { "file" },
        file.attrs.len(),
        rings.join(", "),
        kinds.join(" ")
    )
}

/// A perf.data recording of Intel PT as a snapshot, its binaries found here.
fn read_perf_data(
    input: &Path,
    kcore_dir: Option<&Path>,
    args: &DecodeRequest,
) -> Result<(crate::snapshot::Snapshot, Option<String>), CliError> {
    let bytes = read(input)?;
    let file = crate::decode::perf_file::PerfFile::parse(&bytes)
        .with_context(|| format!("reading {}", input.display()))
        .map_err(CliError::runtime)?;
    if let Some((offset, why)) = &file.stopped {
        log::warn!(
            "{}: the records stop at byte {offset}: {why}; decoding what came before",
            input.display()
        );
    }
    let mut snap = crate::decode::import::perf::snapshot(&file)
        .with_context(|| format!("decoding {}", input.display()))
        .map_err(CliError::runtime)?;
    if let Some(dir) = kcore_dir {
        add_kcore_dir(&mut snap, dir)?;
    }
    let places = super::local_binaries::Places {
        symfs: args.symfs.clone(),
        buildid_dir: args.buildid_dir.clone(),
    };
    let resolved = super::local_binaries::resolve(&mut snap, &places);
    log::info!(
        "{}: {} AUX rings ({} bytes), {} processes, {} of {} binaries found here",
        input.display(),
        snap.rings.len(),
        snap.rings.iter().map(|r| r.data.len()).sum::<usize>(),
        snap.maps.len(),
        resolved.found.len(),
        resolved.found.len() + resolved.missing.len()
    );
    for (path, why) in &resolved.missing {
        log::warn!("{path}: {why}: its code is not decoded and its frames are [unknown]");
    }
    Ok((snap, Some(perf_data_about(&file))))
}

/// The kernel's text and symbols of a `perf record --kcore` directory (`kcore`,
/// `kallsyms`) in `snap`; a kcore that is no ELF file is an error, a missing `kallsyms`
/// leaves kernel frames unnamed.
fn add_kcore_dir(snap: &mut crate::snapshot::Snapshot, dir: &Path) -> Result<(), CliError> {
    let kcore = dir.join("kcore");
    let bytes = read(&kcore)?;
    let kallsyms = fs::read_to_string(dir.join("kallsyms")).ok();
    let path = fs::canonicalize(&kcore).unwrap_or(kcore);
    let segments = crate::decode::import::perf::add_kcore(
        snap,
        &path.to_string_lossy(),
        &bytes,
        kallsyms.as_deref(),
    )
    .map_err(CliError::usage)?;
    log::info!(
        "{}: {segments} segments of the kernel's code, {} kernel symbols",
        dir.display(),
        snap.meta.kernel_symbols.len()
    );
    Ok(())
}

/// A `--pt FILE[:CPU]` argument: the file, and the CPU when a `:N` suffix is not part of
/// an existing file's name.
fn pt_spec(arg: &str) -> (PathBuf, Option<u32>) {
    if !Path::new(arg).exists()
        && let Some((path, cpu)) = arg.rsplit_once(':')
        && let Ok(cpu) = cpu.parse::<u32>()
    {
        return (PathBuf::from(path), Some(cpu));
    }
    (PathBuf::from(arg), None)
}

/// The recording's timing parameters as the tool options give them (`--mtc-freq`,
/// `--nom-freq`, `--cpuid-0x15.*`, `--cpu`), where a snapshot keeps them.
fn raw_timing(snap: &mut crate::snapshot::Snapshot, opts: &PtxedOptions) {
    let timing = &opts.flow.events.timing;
    if timing.mtc_freq != 0 {
        snap.meta
            .recorder
            .config_fields
            .insert("mtc_period".to_owned(), u64::from(timing.mtc_freq));
    }
    let pt_timing = crate::capture::pt_timing::PtTiming {
        tsc_art_ratio: (timing.cpuid_0x15_ebx != 0 && timing.cpuid_0x15_eax != 0)
            .then_some((timing.cpuid_0x15_ebx, timing.cpuid_0x15_eax)),
        max_nonturbo_ratio: (timing.nom_freq != 0).then_some(timing.nom_freq),
        cpu: opts.cpu.map(|c| c.to_string()),
    };
    if pt_timing != crate::capture::pt_timing::PtTiming::default() {
        snap.meta.recorder.pt_timing = Some(pt_timing);
    }
}

/// Raw Intel PT (one trace per CPU), the code it ran and its perf sideband as a snapshot,
/// written to `out` (`--pt FILE ... -o OUT`).
fn run_raw_trace(
    args: &DecodeRequest,
    opts: &PtxedOptions,
    code: Vec<(crate::capture::MapEntry, Vec<u8>)>,
    out: &Path,
) -> CliResult {
    let started = Instant::now();
    let mut traces = Vec::new();
    for (index, arg) in args.pt.iter().enumerate() {
        let (path, cpu) = pt_spec(arg);
        let cpu = cpu.unwrap_or_else(|| u32::try_from(index).unwrap_or(u32::MAX));
        if traces.iter().any(|(known, _)| *known == cpu) {
            return Err(CliError::usage(anyhow::anyhow!(
                "--pt {arg}: CPU {cpu} has a trace already (give FILE:CPU)"
            )));
        }
        traces.push((cpu, read(&path)?));
    }
    let name = args
        .pt
        .first()
        .map(|a| pt_spec(a).0)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "trace".to_owned());
    let cpus: Vec<u32> = traces.iter().map(|(cpu, _)| *cpu).collect();
    let mut snap = crate::decode::import::raw::snapshot(traces, code, &name);
    raw_timing(&mut snap, opts);
    // `--sideband` files with the options after `--`, then ptxed's own `--pevent:*`
    // files with theirs (a primary one is the first trace's CPU's, as in ptxed).
    let mut files: Vec<(String, Vec<u8>, PeventConfig, Option<u32>)> = Vec::new();
    for (index, path) in args.sideband.iter().enumerate() {
        files.push((
            path.display().to_string(),
            read(path)?,
            opts.sideband.pevent.clone(),
            cpus.get(index).copied(),
        ));
    }
    for file in &opts.pevent {
        let data = read_pevent(Path::new("."), file)
            .with_context(|| format!("reading {}", file.path))
            .map_err(CliError::runtime)?;
        let cpu = file.primary.then(|| cpus.first().copied()).flatten();
        files.push((file.path.clone(), data, file.config.clone(), cpu));
    }
    let mut symfs = args.symfs.clone();
    if !files.is_empty() {
        let inputs: Vec<SidebandFile> = files
            .iter()
            .map(|(name, data, config, cpu)| SidebandFile {
                name,
                data,
                config,
                cpu: *cpu,
            })
            .collect();
        let summary = add_sideband(&mut snap, &inputs);
        for problem in &summary.problems {
            log::warn!("{problem}");
        }
        log::info!(
            "sideband: {} records of {} files ({} of other kinds passed over), {} processes",
            summary.records,
            files.len(),
            summary.skipped,
            snap.maps.len() - 1
        );
        symfs = symfs.or_else(|| {
            files
                .iter()
                .find_map(|f| f.2.sysroot.clone())
                .map(PathBuf::from)
        });
        relative_maps_absolute(&mut snap, symfs.is_some());
        let configs: Vec<&PeventConfig> = files
            .iter()
            .map(|f| &f.2)
            .chain([&opts.sideband.pevent])
            .collect();
        embed_vdso_images(&mut snap, &configs, symfs.as_deref())?;
    }
    let places = super::local_binaries::Places {
        symfs,
        buildid_dir: args.buildid_dir.clone(),
    };
    let resolved = super::local_binaries::resolve(&mut snap, &places);
    for (path, why) in &resolved.missing {
        log::warn!("{path}: {why}: its code is not decoded and its frames are [unknown]");
    }
    write_snapshot(&snap, out, args, started.elapsed(), None)
}

/// The vDSO images of `--pevent:vdso-x64`/`-x32`/`-ia32` (the first file's options that
/// name one) as the code of the processes' `[vdso]` mappings, each by the ABI of the
/// process's first mapped ELF file (under `symfs` when given); a `[vdso]` left without
/// code is said once.
fn embed_vdso_images(
    snap: &mut crate::snapshot::Snapshot,
    configs: &[&PeventConfig],
    symfs: Option<&Path>,
) -> Result<(), CliError> {
    let pick = |of: fn(&PeventConfig) -> &Option<String>| -> Result<Option<Vec<u8>>, CliError> {
        configs
            .iter()
            .find_map(|c| of(c).as_ref())
            .map(|path| read(Path::new(path)))
            .transpose()
    };
    let images = VdsoImages {
        x64: pick(|c| &c.vdso_x64)?,
        x32: pick(|c| &c.vdso_x32)?,
        ia32: pick(|c| &c.vdso_ia32)?,
    };
    let abi_of = |process: &crate::capture::ProcessMaps| {
        process
            .maps
            .iter()
            .filter(|m| m.path.starts_with('/'))
            .find_map(|m| {
                let path = symfs.map_or_else(
                    || PathBuf::from(&m.path),
                    |root| root.join(m.path.trim_start_matches('/')),
                );
                let mut header = [0u8; 64];
                let mut file = fs::File::open(path).ok()?;
                io::Read::read_exact(&mut file, &mut header).ok()?;
                Some(Abi::of_elf(&header))
            })
            .unwrap_or(Abi::Unknown)
    };
    let missing = embed_vdso(snap, &images, abi_of);
    if missing > 0 {
        log::warn!(
            "{missing} [vdso] mapping(s) without code (give --pevent:vdso-x64 FILE, -x32 or \
             -ia32 after --, the kernel's vdso64.so ...): calls into the vDSO are decode errors"
        );
    }
    Ok(())
}

/// Sideband maps name files as the recording saw them; a relative name (libipt's
/// sideband tests use them) is taken from `--symfs` (as `/NAME` under it) or else from
/// the current directory, as ptxed does.
fn relative_maps_absolute(snap: &mut crate::snapshot::Snapshot, under_symfs: bool) {
    let cwd = std::env::current_dir().unwrap_or_default();
    for process in snap.maps.iter_mut().filter(|p| p.pid != 0) {
        for entry in &mut process.maps {
            if entry.path.is_empty() || entry.path.starts_with(['/', '[']) {
                continue;
            }
            entry.path = if under_symfs {
                format!("/{}", entry.path)
            } else {
                cwd.join(&entry.path).to_string_lossy().into_owned()
            };
        }
    }
}

/// Writes the trace of `snap` (read from `input` in `read_time`) to `out`.
fn write_snapshot(
    snap: &crate::snapshot::Snapshot,
    out: &Path,
    args: &DecodeRequest,
    read_time: Duration,
    about: Option<String>,
) -> CliResult {
    let stats = args.stats;
    let started = Instant::now();
    let summary = crate::writer::write_trace_on(snap, out, decode_threads(args))
        .with_context(|| format!("writing {}", out.display()))
        .map_err(CliError::runtime)?;
    log::info!(
        "{}: {} threads, {} samples, {} branches ({} decode errors), {} slices, {} unknown frames, {:.1?}",
        out.display(),
        summary.threads,
        summary.samples,
        summary.branches,
        summary.decode_errors,
        summary.slices,
        summary.unknown_frames,
        started.elapsed()
    );
    for warning in crate::writer::symbol_warnings(&summary) {
        log::warn!("{}: {warning}", out.display());
    }
    if let Some(report) = &summary.report {
        log::info!("{}: {}", out.display(), report.verdict);
    }
    let write_time = started.elapsed();
    #[expect(
        clippy::print_stdout,
        reason = "the CLI edge: the file written (and the figures asked for), for scripts"
    )]
    {
        println!("{}", out.display());
        if stats {
            if let Some(about) = about {
                println!("{about}");
            }
            println!(
                "snapshot: {} ({} bytes of raw data), read in {:.3} s",
                snap.meta.backend.as_str(),
                snap.raw_bytes(),
                read_time.as_secs_f64()
            );
            println!(
                "trace: {} threads, {} samples, {} branches, {} decode errors, {} slices, {} unknown frames",
                summary.threads,
                summary.samples,
                summary.branches,
                summary.decode_errors,
                summary.slices,
                summary.unknown_frames
            );
            if summary.decode_threads > 1 {
                println!(
                    "decode threads: {}, {}",
                    summary.decode_threads,
                    summary.decode_pieces.describe()
                );
            }
            println!(
                "write: {:.3} s (decode, stacks, symbols, writer), peak memory {} bytes",
                write_time.as_secs_f64(),
                peak_rss().unwrap_or(0)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `lookback decode`.
pub fn run(args: &DecodeArgs) -> CliResult {
    run_request(&args.request()?)
}

/// Decodes what `args` asks for: a trace file, the branch events, counts, or Intel's tools'
/// text.
pub fn run_request(args: &DecodeRequest) -> CliResult {
    if args.packet_stats && (args.input.is_some() || args.output.is_some()) {
        return Err(CliError::usage(anyhow::anyhow!(
            "packet-stats counts the packets of a raw trace decoded to branch events \
             (no INPUT or -o)"
        )));
    }
    if let Some(input) = &args.input {
        return run_snapshot(args, input);
    }
    let Some(first) = args.pt.first() else {
        return Err(CliError::usage(anyhow::anyhow!(
            "nothing to decode: give --pt FILE"
        )));
    };
    if args.pt.len() > 1 && args.output.is_none() {
        return Err(CliError::usage(anyhow::anyhow!(
            "several --pt traces are decoded into a trace file only: give -o OUT"
        )));
    }
    if let Some(cpu) = &args.cpu {
        cpu.parse::<Cpu>().map_err(CliError::usage)?;
    }
    if args.ptdump {
        return run_ptdump(&read(&pt_spec(first).0)?, args);
    }
    let mut opts = PtxedOptions::from_args(&tool_args(args)).map_err(CliError::usage)?;
    if !opts.pevent.is_empty() && !args.ptxed && args.output.is_none() {
        return Err(CliError::usage(anyhow::anyhow!(
            "perf sideband (--pevent) is only supported with -o OUT (and lookback-pt ptdump, ptxed)"
        )));
    }
    let mut specs = Vec::new();
    for raw in &args.raw {
        specs.push(RawSpec::parse(raw).map_err(CliError::usage)?);
    }
    specs.append(&mut opts.raw);
    let mut code = Vec::new();
    for spec in &args.elf {
        let mut spec = ElfSpec::parse(spec);
        let bytes = read(Path::new(&spec.path))?;
        if let Ok(abs) = fs::canonicalize(&spec.path) {
            spec.path = abs.to_string_lossy().into_owned();
        }
        code.extend(spec.segments(&bytes).map_err(CliError::usage)?);
    }
    // The kernel's code (`--pevent:kcore`, as ptxed takes it) in every process of the
    // trace file too: its loadable segments at their addresses, like an `--elf`'s (the
    // `--ptxed` path builds its kernel image from the same option).
    if args.output.is_some() {
        for path in &opts.kcore {
            let spec = ElfSpec {
                path: path.clone(),
                base: None,
            };
            let bytes = read(Path::new(path))?;
            code.extend(spec.segments(&bytes).map_err(CliError::usage)?);
        }
    }
    let mut image = Image::new();
    for (entry, bytes) in &code {
        image.add(&entry.path, bytes.clone(), entry.start);
    }
    // Each file read once: a page cache given as one `--raw` per page names its dump
    // hundreds of times (157 times 643 KB for libxdc_experiments' qemu).
    let mut files: HashMap<&str, Vec<u8>> = HashMap::new();
    for spec in &specs {
        let bytes = match files.entry(spec.path.as_str()) {
            Entry::Occupied(known) => known.into_mut(),
            Entry::Vacant(new) => new.insert(read(Path::new(&spec.path))?),
        };
        image.add(&spec.path, spec.slice(bytes).to_vec(), spec.addr);
        code.push(raw_segment(spec, bytes));
    }
    if let Some(out) = &args.output {
        return run_raw_trace(args, &opts, code, out);
    }
    let trace = read(&pt_spec(first).0)?;
    if args.ptxed {
        return run_ptxed(&trace, &image, &opts);
    }
    if let Some(cpu) = opts.cpu {
        opts.flow.events.timing.errata = Errata::for_cpu(cpu).map_err(CliError::usage)?;
    }
    let threads = decode_threads(args);
    if args.stats {
        run_stats(&trace, &image, &opts, threads, args.packet_stats)
    } else {
        run_branches(&trace, &image, &opts, threads)
    }
}

/// `--threads`, else every core the process may run on.
fn decode_threads(args: &DecodeRequest) -> usize {
    args.threads.map_or_else(
        || std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        usize::from,
    )
}

/// The sideband files of the command line, loaded (relative to the current directory).
fn read_sideband(files: &[PeventFile]) -> Result<Vec<Vec<u8>>, CliError> {
    files
        .iter()
        .map(|file| {
            read_pevent(Path::new("."), file)
                .with_context(|| format!("reading {}", file.path))
                .map_err(CliError::runtime)
        })
        .collect()
}

fn sideband_streams<'a>(files: &[PeventFile], data: &'a [Vec<u8>]) -> Vec<SidebandStream<'a>> {
    files
        .iter()
        .zip(data)
        .map(|(file, data)| SidebandStream {
            name: file.path.clone(),
            data,
            config: file.config.clone(),
            primary: file.primary,
        })
        .collect()
}

fn run_ptxed(trace: &[u8], image: &Image, opts: &PtxedOptions) -> CliResult {
    let data = read_sideband(&opts.pevent)?;
    let loader = FileLoader {
        root: PathBuf::from("."),
    };
    let sideband = if opts.pevent.is_empty() {
        None
    } else {
        Some(Sideband {
            streams: sideband_streams(&opts.pevent, &data),
            kernel: kernel_image(Path::new("."), &opts.kcore).map_err(CliError::runtime)?,
            loader: &loader,
        })
    };
    let mut out = stdout();
    let result = ptxed_with_sideband(trace, image, sideband, opts, &mut out).map(|_| ());
    finish(out, result)?;
    Ok(ExitCode::SUCCESS)
}

fn run_ptdump(trace: &[u8], args: &DecodeRequest) -> CliResult {
    let (opts, files) = PtdumpOptions::from_args(&tool_args(args)).map_err(CliError::usage)?;
    let data = read_sideband(&files)?;
    let streams = sideband_streams(&files, &data);
    let mut out = stdout();
    let result = ptdump_with_sideband(trace, streams, &opts, &mut out);
    finish(out, result)?;
    Ok(ExitCode::SUCCESS)
}

fn run_branches(trace: &[u8], image: &Image, opts: &PtxedOptions, threads: usize) -> CliResult {
    let mut out = stdout();
    let mut result = Ok(());
    let mut print = |events: &[BranchEvent]| {
        for event in events {
            if result.is_err() {
                return;
            }
            result = write_branch(&mut out, event);
        }
    };
    if threads > 1 {
        decode_parallel_with(
            trace,
            image,
            opts.flow,
            Split::streaming(threads),
            &mut print,
        );
    } else {
        let mut branches = Branches::new(trace, image, opts.flow);
        loop {
            let batch = branches.next_batch();
            if batch.is_empty() {
                break;
            }
            print(batch);
        }
    }
    finish(out, result)?;
    Ok(ExitCode::SUCCESS)
}

/// One line of the branch-event listing.
fn write_branch(out: &mut impl fmt::Write, event: &BranchEvent) -> fmt::Result {
    let time = if event.has_tsc {
        format!("{:016x}", event.tsc)
    } else {
        format!("{:>16}", "-")
    };
    match event.error {
        Some(err) => writeln!(out, "{time}  error at offset {:#x}: {err}", event.offset),
        None => writeln!(
            out,
            "{time}  {:<11} {:#018x} -> {:#018x}",
            event.kind.name(),
            event.from,
            event.to
        ),
    }
}

/// Packets by type, and packet-level errors.
fn count_packets(trace: &[u8], opts: &PtxedOptions) -> (Vec<(&'static str, u64)>, u64) {
    // Keyed by kind, not name: a string compare per packet was a tenth of this pass.
    let mut by_kind: Vec<(PacketKind, u64)> = Vec::new();
    let mut errors = 0;
    for item in PacketDecoder::new(trace, opts.flow.events.timing.errata) {
        match item {
            Ok((_, packet)) => {
                let kind = packet.kind();
                match by_kind.iter_mut().find(|(k, _)| *k == kind) {
                    Some((_, count)) => *count += 1,
                    None => by_kind.push((kind, 1)),
                }
            }
            Err(_) => errors += 1,
        }
    }
    let mut counts: Vec<(&'static str, u64)> =
        by_kind.into_iter().map(|(k, n)| (k.name(), n)).collect();
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    (counts, errors)
}

fn run_stats(
    trace: &[u8],
    image: &Image,
    opts: &PtxedOptions,
    threads: usize,
    packet_pass: bool,
) -> CliResult {
    let started = Instant::now();
    let packets = packet_pass.then(|| count_packets(trace, opts));
    let packet_time = started.elapsed();
    let started = Instant::now();
    crate::decode::pt::flow::insn::build_decoder_tables();
    let tables_time = started.elapsed();
    let started = Instant::now();
    let (counts, parallel, fast) = if threads > 1 {
        let parallel = decode_parallel(trace, image, opts.flow, Split::threads(threads), false);
        (
            parallel.counts,
            Some((parallel.stats, parallel.prepare, parallel.seeding)),
            None,
        )
    } else {
        let mut branches = Branches::new(trace, image, opts.flow);
        while !branches.next_batch().is_empty() {}
        (
            branches.counts().clone(),
            None,
            Some((
                branches.fast_blocks(),
                branches.loop_blocks(),
                branches.quiet_psbs(),
            )),
        )
    };
    let decode_time = started.elapsed();
    let mut out = stdout();
    let mut result = write_stats(
        &mut out,
        trace.len(),
        packets
            .as_ref()
            .map(|(p, e)| (p.as_slice(), *e, packet_time)),
        &counts,
        decode_time,
    );
    if result.is_ok() {
        result = fmt::Write::write_fmt(
            &mut out,
            format_args!(
                "{}{}\ndecoder tables: {:.6} s (built once per process, before the decode's time)\n",
                parallel_line(threads, parallel),
                fast_line(fast, counts.blocks),
                tables_time.as_secs_f64()
            ),
        );
    }
    finish(out, result)?;
    Ok(ExitCode::SUCCESS)
}

/// How many blocks the fast path took, for `--stats` on one thread: where the rest
/// went is where a decode spends its time (events such as TIP.PGD/TIP.PGE, first
/// visits to code); how many of them it took in loop runs (a TNT repeating the one
/// before, its blocks taken whole). The PSB+ headers taken whole while tracing was off
/// follow, where there were any.
fn fast_line(fast: Option<(u64, u64, u64)>, blocks: u64) -> String {
    match fast {
        #[expect(
            clippy::cast_precision_loss,
            reason = "a percentage for people to read"
        )]
        Some((fast, looped, quiet)) if blocks > 0 => {
            let quiet = if quiet > 0 {
                format!("; {quiet} PSB+ headers taken whole while tracing was off")
            } else {
                String::new()
            };
            format!(
                "\nfast path: {fast} of {blocks} blocks ({:.1} %), {looped} of them in loop runs{quiet}",
                fast as f64 * 100.0 / blocks as f64
            )
        }
        _ => String::new(),
    }
}

/// How the decode was spread over threads, for `--stats`: the pieces, the time cutting
/// took before the workers started (sequential: a many-core decode's floor) and the
/// timing scan the workers ran, in all (each before the piece that needed its cut's
/// time).
fn parallel_line(threads: usize, stats: Option<(ParallelStats, Duration, Duration)>) -> String {
    match stats {
        None => "threads: 1 (sequential)".to_owned(),
        Some((s, cut, seeding)) => format!(
            "threads: {threads}, {}; cut in {:.6} s before the workers started, seeded in {:.6} s in the workers",
            s.describe(),
            cut.as_secs_f64(),
            seeding.as_secs_f64()
        ),
    }
}

/// The separate packet pass of `--packet-stats`: counts by packet kind, errors, time.
type PacketPass<'a> = (&'a [(&'static str, u64)], u64, Duration);

/// `--stats`' report. `packets`: the packet pass, `None` when it did not run.
#[expect(
    clippy::cast_precision_loss,
    reason = "throughput figures are approximate by nature"
)]
fn write_stats(
    out: &mut impl fmt::Write,
    bytes: usize,
    packets: Option<PacketPass<'_>>,
    counts: &DecodeCounts,
    decode_time: Duration,
) -> fmt::Result {
    let mb = bytes as f64 / 1e6;
    let rate = |secs: f64| if secs > 0.0 { mb / secs } else { 0.0 };
    writeln!(out, "trace: {bytes} bytes")?;
    if let Some((packets, packet_errors, packet_time)) = packets {
        writeln!(
            out,
            "packets: {} ({packet_errors} errors), {:.6} s, {:.1} MB/s",
            packets.iter().map(|(_, n)| n).sum::<u64>(),
            packet_time.as_secs_f64(),
            rate(packet_time.as_secs_f64())
        )?;
        for (name, count) in packets {
            writeln!(out, "  {name:<10} {count}")?;
        }
    }
    writeln!(out, "insn: {}.", counts.instructions)?;
    writeln!(out, "blocks: {}.", counts.blocks)?;
    writeln!(out, "events: {}.", counts.events)?;
    writeln!(out, "branches:")?;
    for kind in BranchKind::ALL {
        writeln!(out, "  {:<11} {}", kind.name(), counts.branches_of(kind))?;
    }
    writeln!(out, "errors: {}", counts.errors.len())?;
    for (offset, err) in counts.errors.iter().take(20) {
        writeln!(out, "  offset {offset:#x}: {err}")?;
    }
    if counts.errors.len() > 20 {
        writeln!(out, "  ... {} more", counts.errors.len() - 20)?;
    }
    let secs = decode_time.as_secs_f64();
    let per_sec = |n: u64| {
        if secs > 0.0 {
            n as f64 / secs / 1e6
        } else {
            0.0
        }
    };
    let packets_per_sec = packets.map_or_else(String::new, |(p, _, _)| {
        format!(
            ", {:.2} M packets/s",
            per_sec(p.iter().map(|(_, n)| n).sum::<u64>())
        )
    });
    writeln!(
        out,
        "decode: {secs:.6} s, {:.1} MB/s{packets_per_sec}, {:.1} M insn/s, {:.2} M branches/s",
        rate(secs),
        per_sec(counts.instructions),
        per_sec(counts.branches.iter().sum())
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: DecodeArgs,
    }

    #[test]
    fn the_fast_line_says_how_many_blocks_came_in_loop_runs() {
        assert_eq!(
            fast_line(Some((900, 600, 0)), 1000),
            "\nfast path: 900 of 1000 blocks (90.0 %), 600 of them in loop runs"
        );
        assert!(
            fast_line(Some((9, 0, 3)), 10).ends_with(
                "0 of them in loop runs; 3 PSB+ headers taken whole while tracing was off"
            )
        );
        assert_eq!(fast_line(Some((0, 0, 0)), 0), "");
        assert_eq!(fast_line(None, 10), "");
    }

    #[test]
    fn after_dashes_only_the_sidebands_layout_is_a_users_option() {
        let parsed = Wrapper::try_parse_from([
            "x",
            "--pt",
            "t.pt",
            "--sideband",
            "sb.pevent",
            "-o",
            "t.fxt",
            "--",
            "--pevent:sample-type",
            "0x10086",
        ])
        .unwrap();
        let request = parsed.args.request().unwrap();
        assert_eq!(request.tool_args, ["--pevent:sample-type", "0x10086"]);
        assert!(!request.ptxed && !request.ptdump && !request.packet_stats);
        // What perf-get-opts.bash prints for a perf.data is the trace's, not a display's.
        let parsed = Wrapper::try_parse_from([
            "x",
            "--pt",
            "t.pt",
            "-o",
            "t.fxt",
            "--",
            "--cpu",
            "6/158",
            "--mtc-freq",
            "3",
            "--nom-freq",
            "36",
            "--cpuid-0x15.eax",
            "2",
            "--cpuid-0x15.ebx",
            "188",
            "--pevent",
            "--pevent:time-zero",
            "1",
        ])
        .unwrap();
        assert!(parsed.args.request().is_ok());
        let parsed = Wrapper::try_parse_from(["x", "--pt", "t.pt", "--", "--event:ip"]).unwrap();
        let err = parsed.args.request().unwrap_err();
        assert_eq!(err.code, 2);
        assert!(
            err.error.to_string().contains("lookback-pt"),
            "{:#}",
            err.error
        );
        // The tools' modes are not options of `lookback decode`.
        assert!(Wrapper::try_parse_from(["x", "--pt", "t", "--ptxed"]).is_err());
    }

    #[test]
    fn a_missing_snapshot_is_a_runtime_error_naming_it() {
        let parsed = Wrapper::try_parse_from(["x", "/nonexistent/snap.lbsnap"]).unwrap();
        let err = run(&parsed.args).unwrap_err();
        assert_eq!(err.code, 1);
        assert!(format!("{:#}", err.error).contains("/nonexistent/snap.lbsnap"));
        assert!(Wrapper::try_parse_from(["x", "a.lbsnap", "--pt", "b"]).is_err());
        assert_eq!(
            default_output(Path::new("/d/run-2.lbsnap")),
            Path::new("/d/run-2.fxt.gz")
        );
    }

    #[test]
    fn decodes_a_corpus_trace_in_every_mode() {
        let Some(dir) = crate::decode::pt::tools::conformance_dir() else {
            return;
        };
        let pt = dir.join("core/call_direct-ret_compressed.pt");
        let bin = format!(
            "{}:0x100000",
            dir.join("core/call_direct-ret_compressed.bin").display()
        );
        if !pt.is_file() {
            return;
        }
        let mut image = Image::new();
        let spec = RawSpec::parse(&bin).unwrap();
        image.add("c", fs::read(&spec.path).unwrap(), spec.addr);
        let trace = fs::read(&pt).unwrap();
        let opts = PtxedOptions::default();
        let mut text = String::new();
        let counts = {
            let mut b = Branches::new(&trace, &image, opts.flow);
            for _ in b.by_ref() {}
            b.counts().clone()
        };
        write_stats(&mut text, trace.len(), None, &counts, Duration::ZERO).unwrap();
        assert!(
            text.contains("insn: ") && counts.errors.is_empty(),
            "{text}"
        );
        // The packet pass is reported only when it ran (`--packet-stats`).
        assert!(!text.contains("packets"), "{text}");
        let mut with = String::new();
        let kinds = [("psb", 2), ("tnt", 5)];
        let pass = Some((&kinds[..], 0, Duration::from_millis(1)));
        write_stats(&mut with, trace.len(), pass, &counts, Duration::ZERO).unwrap();
        assert!(
            with.contains("packets: 7 (0 errors)") && with.contains("M packets/s"),
            "{with}"
        );
    }
}
