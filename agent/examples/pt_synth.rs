//! Writes a synthetic Intel PT trace and the code it runs over, for `cargo xtask
//! bench-decode`: `pt_synth OUT_DIR MEGABYTES [SEED]` writes `OUT_DIR/synth.pt` and
//! `OUT_DIR/synth.bin` (mapped at 0x400000), see `lookback::decode::pt::tools::encode`;
//! and the same run as a PT snapshot bundle, `OUT_DIR/synth.lbsnap`, whose one process
//! maps the code from `OUT_DIR/synth.elf` (an executable with a symbol `fn_N` per
//! function), so `lookback decode synth.lbsnap` decodes, symbolizes and writes a trace of
//! it. Also `OUT_DIR/synth-SHAPE.pt`: the trace shaped like real ones (PAD-padded,
//! disable/enable-dense, wrapped: `encode_shape`).
#![expect(
    clippy::print_stdout,
    reason = "a command-line tool reports what it wrote"
)]

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};
use lookback::capture::intel_pt::SIDEBAND_SAMPLE_TYPE;
use lookback::capture::{
    Backend, CapturedData, ClockConversion, MapEntry, ProcessMaps, RecorderParams, RingData,
    RingKind, SidebandData,
};
use lookback::decode::pt::tools::encode::{CODE_BASE, SynthProgram, encode};
use lookback::decode::pt::tools::encode_shape::{Shape, reshape};
use lookback::snapshot::{Snapshot, TriggerMeta};

/// Where the code starts in `synth.elf` (one page of headers before it).
const CODE_OFFSET: u64 = 0x1000;
/// The pid and tid the bundle says ran the trace.
const PID: u32 = 4242;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: pt_synth OUT_DIR MEGABYTES [SEED]")?,
    );
    let megabytes: usize = args
        .next()
        .context("missing MEGABYTES")?
        .parse()
        .context("MEGABYTES")?;
    let seed: u64 = match args.next() {
        Some(seed) => seed.parse().context("SEED")?,
        None => 1,
    };
    let program = SynthProgram::generate(seed, 40);
    let encoded = encode(&program, seed, megabytes << 20, false);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pt = dir.join("synth.pt");
    let bin = dir.join("synth.bin");
    let elf = dir.join("synth.elf");
    let snap = dir.join("synth.lbsnap");
    write(&pt, &encoded.trace)?;
    // The same run shaped like real traces (`synth-SHAPE.pt`): the bench's other rows.
    for shape in Shape::ALL {
        let shaped = reshape(&encoded.trace, shape).context("reshaping the trace")?;
        write(&dir.join(format!("synth-{}.pt", shape.name())), &shaped)?;
    }
    write(&bin, &program.code)?;
    write(&elf, &elf_image(&program))?;
    let bundle = bundle(&program, encoded.trace.clone(), &elf)?;
    lookback::snapshot::write_atomic(&snap, &bundle)
        .with_context(|| format!("writing {}", snap.display()))?;
    println!(
        "trace={} code={}:{CODE_BASE:#x} bytes={} code_bytes={} instructions={} snapshot={}",
        pt.display(),
        bin.display(),
        encoded.trace.len(),
        program.code.len(),
        encoded.instructions,
        snap.display()
    );
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// A PT snapshot of the run: one CPU ring, `ITRACE_START` + COMM for thread `PID`, the
/// code mapped from `elf` (not embedded: read from disk as for a real process), one
/// TSC tick = 10 µs of perf time (the encoder ticks once per PSB, ~4 KiB of trace).
fn bundle(program: &SynthProgram, trace: Vec<u8>, elf: &Path) -> Result<Snapshot> {
    let elf = elf.canonicalize().context("synth.elf")?;
    let inode = std::fs::metadata(&elf).context("synth.elf")?.ino();
    let mut sideband = record(3, &[&PID.to_le_bytes(), &PID.to_le_bytes(), b"synth\0\0\0"]);
    sideband.extend(record(12, &[&PID.to_le_bytes(), &PID.to_le_bytes()]));
    let captured = CapturedData {
        backend: Backend::IntelPt,
        params: RecorderParams {
            event: "intel_pt".to_owned(),
            sample_type: SIDEBAND_SAMPLE_TYPE,
            sample_id_all: true,
            buffer_size: trace.len() as u64,
            cpus: vec![0],
            ..RecorderParams::default()
        },
        freeze_time_ns: 0,
        pause_duration_ns: 0,
        rings: vec![RingData {
            kind: RingKind::Aux,
            cpu: Some(0),
            tid: None,
            wrapped: true,
            records: 0,
            stop: None,
            data: trace,
        }],
        sideband: vec![SidebandData {
            cpu: Some(0),
            dropped_bytes: 0,
            data: sideband,
        }],
        clock: Some(ClockConversion {
            time_zero: 0,
            time_mult: 10_000,
            time_shift: 0,
            valid: true,
            tsc_at_freeze: None,
            monotonic_ns_at_freeze: 0,
            tsc_earlier: None,
            monotonic_ns_earlier: 0,
        }),
        processes: vec![ProcessMaps {
            pid: PID,
            comm: "synth".to_owned(),
            exe: Some(elf.display().to_string()),
            read_at_ns: 0,
            at_freeze: true,
            maps: vec![MapEntry {
                start: CODE_BASE,
                end: CODE_BASE + program.code.len() as u64,
                perms: "r-xp".to_owned(),
                offset: CODE_OFFSET,
                dev: "00:00".to_owned(),
                inode,
                path: elf.display().to_string(),
                build_id: None,
            }],
            origin: lookback::capture::origin::ProcessOrigin::default(),
        }],
        code: Vec::new(),
        perf_maps: Vec::new(),
        window: None,
        kernel_symbols: Vec::new(),
    };
    let trigger = TriggerMeta {
        rule: "bench".to_owned(),
        kind: "manual".to_owned(),
        detail: "synthetic trace".to_owned(),
        pid: PID,
        tid: PID,
        comm: "synth".to_owned(),
        trigger_time_ns: 0,
        duration_ns: None,
        stack: Vec::new(),
        kernel_stack: Vec::new(),
        call: None,
    };
    Ok(Snapshot::from_captured(captured, Some(trigger)))
}

/// A sideband record of `kind` with `body`, then the `sample_id_all` trailer (pid/tid,
/// time 0, cpu 0, identifier 0).
fn record(kind: u32, body: &[&[u8]]) -> Vec<u8> {
    let body = body.concat();
    let size = u16::try_from(8 + body.len() + 32).unwrap_or(u16::MAX);
    let mut r = kind.to_le_bytes().to_vec();
    r.extend(0u16.to_le_bytes());
    r.extend(size.to_le_bytes());
    r.extend(body);
    r.extend(PID.to_le_bytes());
    r.extend(PID.to_le_bytes());
    r.extend([0u8; 24]);
    r
}

/// name, type, flags, addr, offset, size, link, info, entsize of an `Elf64_Shdr`.
type SectionHeader = (u32, u32, u64, u64, u64, u64, u32, u32, u64);

fn u16le(v: u16) -> [u8; 2] {
    v.to_le_bytes()
}
fn u32le(v: u32) -> [u8; 4] {
    v.to_le_bytes()
}
fn u64le(v: u64) -> [u8; 8] {
    v.to_le_bytes()
}

/// A minimal x86-64 executable: one `PT_LOAD` mapping the file from offset 0 at
/// `CODE_BASE - CODE_OFFSET` (so the code lands at `CODE_BASE`), sections `.text`,
/// `.symtab` (a global function `fn_N` per function, sized to the next one), `.strtab`,
/// `.shstrtab`.
fn elf_image(program: &SynthProgram) -> Vec<u8> {
    let code_len = program.code.len() as u64;
    let mut out = vec![0u8; usize::try_from(CODE_OFFSET).unwrap_or(0x1000)];
    out.extend(&program.code);
    // .strtab and the symbols.
    let mut strtab = vec![0u8];
    let mut symtab = vec![0u8; 24];
    let ends = program.functions.iter().skip(1).copied();
    let ends = ends.chain(std::iter::once(CODE_BASE + code_len));
    for (i, (&start, end)) in program.functions.iter().zip(ends).enumerate() {
        let name = u32::try_from(strtab.len()).unwrap_or(0);
        strtab.extend(format!("fn_{i}\0").as_bytes());
        symtab.extend(u32le(name));
        symtab.push(0x12); // STB_GLOBAL, STT_FUNC
        symtab.push(0);
        symtab.extend(u16le(1)); // .text
        symtab.extend(u64le(start));
        symtab.extend(u64le(end - start));
    }
    let shstrtab = b"\0.text\0.symtab\0.strtab\0.shstrtab\0".to_vec();
    let mut place = |bytes: &[u8]| {
        let at = out.len().next_multiple_of(8);
        out.resize(at, 0);
        out.extend(bytes);
        at as u64
    };
    let (symtab_at, strtab_at, shstrtab_at) = (place(&symtab), place(&strtab), place(&shstrtab));
    let shoff = out.len().next_multiple_of(8) as u64;
    out.resize(usize::try_from(shoff).unwrap_or(0), 0);
    // Section headers: null, .text, .symtab, .strtab, .shstrtab.
    let sections: [SectionHeader; 5] = [
        (0, 0, 0, 0, 0, 0, 0, 0, 0),
        (1, 1, 6, CODE_BASE, CODE_OFFSET, code_len, 0, 0, 0),
        (7, 2, 0, 0, symtab_at, symtab.len() as u64, 3, 1, 24),
        (15, 3, 0, 0, strtab_at, strtab.len() as u64, 0, 0, 0),
        (23, 3, 0, 0, shstrtab_at, shstrtab.len() as u64, 0, 0, 0),
    ];
    for (name, kind, flags, addr, offset, size, link, info, entsize) in sections {
        out.extend(u32le(name));
        out.extend(u32le(kind));
        out.extend(u64le(flags));
        out.extend(u64le(addr));
        out.extend(u64le(offset));
        out.extend(u64le(size));
        out.extend(u32le(link));
        out.extend(u32le(info));
        out.extend(u64le(1));
        out.extend(u64le(entsize));
    }
    let file_len = CODE_OFFSET + code_len;
    let mut header = Vec::with_capacity(120);
    header.extend(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    header.extend(u16le(2)); // ET_EXEC
    header.extend(u16le(62)); // EM_X86_64
    header.extend(u32le(1));
    header.extend(u64le(CODE_BASE)); // entry
    header.extend(u64le(64)); // phoff
    header.extend(u64le(shoff));
    header.extend(u32le(0));
    header.extend(u16le(64));
    header.extend(u16le(56));
    header.extend(u16le(1));
    header.extend(u16le(64));
    header.extend(u16le(5));
    header.extend(u16le(4)); // shstrndx
    // PT_LOAD, R+X, the headers and the code.
    header.extend(u32le(1));
    header.extend(u32le(5));
    header.extend(u64le(0));
    header.extend(u64le(CODE_BASE - CODE_OFFSET));
    header.extend(u64le(CODE_BASE - CODE_OFFSET));
    header.extend(u64le(file_len));
    header.extend(u64le(file_len));
    header.extend(u64le(0x1000));
    out[..header.len()].copy_from_slice(&header);
    out
}
