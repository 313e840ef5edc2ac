//! The fast path against the general one: identical branch events (times and offsets
//! included) and counts, on the encoder's traces (plain, and with timing packets and
//! PADs between packets), on random traces, and on the libipt corpus.
#![expect(
    clippy::cast_possible_truncation,
    reason = "random bytes are taken from the low bits of random words"
)]

use std::fs;

use super::tests::{PSB, Rng, random_code, random_packet};
use super::*;
use crate::decode::pt::flow::image::Image;
use crate::decode::pt::packets::cpu::Errata;
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::packet::{ExecMode, Packet};
use crate::decode::pt::tools::encode::{CODE_BASE, SynthProgram, encode};
use crate::decode::pt::tools::ptxed_opts::PtxedOptions;

/// Decodes `trace` both ways; returns how many blocks took the fast path.
fn same(trace: &[u8], image: &dyn ImageProvider, config: FlowConfig, what: &str) -> u64 {
    same_blocks(trace, image, config, what).0
}

/// [`same`], and how many blocks there were in all.
fn same_blocks(
    trace: &[u8],
    image: &dyn ImageProvider,
    config: FlowConfig,
    what: &str,
) -> (u64, u64) {
    let mut fast = Branches::new(trace, image, config);
    let fast_events: Vec<BranchEvent> = fast.by_ref().collect();
    let mut general = Branches::new(trace, image, config).general_only();
    let general_events: Vec<BranchEvent> = general.by_ref().collect();
    if let Some(at) = fast_events
        .iter()
        .zip(&general_events)
        .position(|(a, b)| a != b)
    {
        panic!(
            "{what}: event {at} differs:\n fast    {:x?}\n general {:x?}",
            &fast_events[at.saturating_sub(2)..(at + 3).min(fast_events.len())],
            &general_events[at.saturating_sub(2)..(at + 3).min(general_events.len())]
        );
    }
    assert_eq!(fast_events.len(), general_events.len(), "{what}");
    assert_eq!(fast.counts, general.counts, "{what}");
    (fast.fast_blocks, fast.counts.blocks)
}

/// A PSB+ that starts tracing 64-bit code at 0x1000 (MODE.Exec, FUP with the IP in full,
/// PSBEND): the start of the hand-made traces below, whose TIPs then give the low two
/// bytes of an address or a full one.
fn at_0x1000() -> Vec<u8> {
    let mut trace = PSB.to_vec();
    trace.extend_from_slice(&[0x99, 0x01, 0x7d, 0x00, 0x10, 0, 0, 0, 0, 0x02, 0x23]);
    trace
}

pub(super) fn synth(seed: u64, functions: usize, size: usize) -> (Vec<u8>, Image) {
    let program = SynthProgram::generate(seed, functions);
    let encoded = encode(&program, seed, size, true);
    let mut image = Image::new();
    image.add("synth", program.code.clone(), CODE_BASE);
    (encoded.trace, image)
}

/// [`same`] on encoded traces of `size` bytes for each seed, through `provider` (made
/// from the seed's image); each takes the fast path for more than `min_fast` blocks.
fn same_on_encoded(
    seeds: std::ops::Range<u64>,
    size: usize,
    provider: fn(&Image) -> Box<dyn ImageProvider + '_>,
    min_fast: u64,
) {
    for seed in seeds {
        let (trace, image) = synth(seed, 2 + usize::try_from(seed).unwrap_or(0) * 4, size);
        let fast = same(
            &trace,
            provider(&image).as_ref(),
            FlowConfig::default(),
            &format!("seed {seed}"),
        );
        assert!(fast > min_fast, "seed {seed}: only {fast} fast blocks");
    }
}

#[test]
fn the_fast_path_matches_the_general_one_on_encoded_traces() {
    same_on_encoded(1..12, 32 * 1024, |image| Box::new(image), 1000);
}

/// An image that reads but does not lend its bytes (as an image provider without
/// `code` does): the first visits' decode reads each instruction instead.
struct ReadOnly<'a>(&'a Image);

impl ImageProvider for ReadOnly<'_> {
    fn read(
        &self,
        addr: u64,
        buf: &mut [u8],
    ) -> Result<
        (usize, crate::decode::pt::flow::image::Mapping),
        crate::decode::pt::flow::image::NoCode,
    > {
        self.0.read(addr, buf)
    }
}

#[test]
fn the_fast_path_matches_the_general_one_where_the_image_does_not_lend_its_bytes() {
    let (_, image) = synth(1, 6, 1024);
    assert!(image.code(CODE_BASE).is_some() && ReadOnly(&image).code(CODE_BASE).is_none());
    same_on_encoded(1..6, 16 * 1024, |image| Box::new(ReadOnly(image)), 500);
}

/// `trace` with other packets inserted at random packet boundaries after the first PSB+:
/// timing packets and PADs (which the fast path reads too), MODE.Exec and CBR (which it
/// leaves to the general path), and junk.
pub(super) fn with_interruptions(trace: &[u8], rng: &mut Rng, every: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(trace.len() * 2);
    let mut last = 0;
    let mut mtc = 0u8;
    let mut tsc = 0x1000u64;
    for (offset, _) in PacketDecoder::new(trace, Errata::default()).flatten() {
        out.extend_from_slice(&trace[last..offset]);
        last = offset;
        if offset < 0x40 || !rng.next().is_multiple_of(every) {
            continue;
        }
        match rng.next() % 16 {
            0..=5 => {
                mtc = mtc.wrapping_add(1);
                out.extend_from_slice(&[0x59, mtc]);
            }
            6..=8 => out.push(0x03 | ((rng.next() as u8) << 3 & 0x78)),
            9 | 10 => {
                let len = 1 + (rng.next() % 3) as usize;
                out.extend(std::iter::repeat_n(0, len));
            }
            11 => {
                tsc += rng.next() % 0x1000;
                out.push(0x19);
                out.extend_from_slice(&tsc.to_le_bytes()[..7]);
            }
            12 | 13 => out.extend_from_slice(&[0x99, 0x01]),
            14 => out.extend_from_slice(&[0x02, 0x03, 0x20, 0x00]),
            _ => {
                let len = 1 + (rng.next() % 3) as usize;
                out.extend(rng.bytes(len));
            }
        }
    }
    out.extend_from_slice(&trace[last..]);
    out
}

#[test]
fn the_fast_path_matches_the_general_one_around_other_packets() {
    let mut rng = Rng(0x853c_49e6_748f_ea9b);
    for seed in 1..8 {
        let (trace, image) = synth(seed, 3 + usize::try_from(seed).unwrap_or(0) * 3, 32 * 1024);
        for every in [3, 17, 200] {
            let trace = with_interruptions(&trace, &mut rng, every);
            let what = format!("seed {seed}, one in {every}");
            let fast = same(&trace, &image, FlowConfig::default(), &what);
            assert!(fast > 100, "{what}: only {fast} fast blocks");
            // Time moves (the inserted TSCs), so the times compared above differ.
            let times: std::collections::HashSet<u64> =
                Branches::new(&trace, &image, FlowConfig::default())
                    .map(|e| e.tsc)
                    .collect();
            assert!(times.len() > 5, "{what}: {} times", times.len());
        }
    }
}

#[test]
fn the_fast_path_matches_the_general_one_on_random_traces() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut fast = 0;
    for round in 0..300 {
        let mut image = Image::new();
        image.add("random", random_code(&mut rng), 0x1000);
        let mut trace = at_0x1000();
        // Mostly TNT and TIP into the code, so that blocks come round again.
        for _ in 0..300 {
            match rng.next() % 10 {
                0..=5 => trace.push(((rng.next() as u8) | 0x80) & 0xfe),
                6 => trace.extend_from_slice(&[0x02, 0xa3, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
                // After an error the product path resumes only at an exact address:
                // some TIPs carry one (sign-extended 48 bits), the others 16 bits.
                7 if rng.next().is_multiple_of(2) => {
                    trace.extend_from_slice(&[0x6d, (rng.next() % 0x200) as u8, 0x10, 0, 0, 0, 0]);
                }
                7 => trace.extend_from_slice(&[0x2d, (rng.next() % 0x200) as u8, 0x10]),
                _ => trace.extend(random_packet(&mut rng)),
            }
        }
        let config = FlowConfig {
            end_on_call: round % 5 == 0,
            ..FlowConfig::default()
        };
        fast += same(&trace, &image, config, &format!("round {round}"));
    }
    assert!(fast > 1000, "only {fast} fast blocks");
}

/// Calls `each(trace, image, config, what)` for every libipt corpus case, once without
/// and once per CPU its manifest names (their errata); how many, or `None` without the
/// corpus.
pub(super) fn for_each_corpus_case(
    mut each: impl FnMut(&[u8], &Image, FlowConfig, &str),
) -> Option<usize> {
    let Some(corpus) = crate::decode::pt::tools::conformance_dir() else {
        println!("libipt corpus not found: skipped");
        return None;
    };
    let suite = corpus.join("core");
    let manifest = fs::read_to_string(suite.join("MANIFEST.tsv")).unwrap();
    let mut cases = 0;
    for line in manifest.lines().skip(1) {
        let cols: Vec<&str> = line.split('\t').collect();
        let (Some(name), Some(org)) = (cols.first(), cols.get(1)) else {
            continue;
        };
        let (Ok(trace), Ok(code)) = (
            fs::read(suite.join(format!("{name}.pt"))),
            fs::read(suite.join(format!("{name}.bin"))),
        ) else {
            continue;
        };
        let Ok(org) = u64::from_str_radix(org.trim_start_matches("0x"), 16) else {
            continue;
        };
        let mut image = Image::new();
        image.add(name, code, org);
        let opts: Vec<&str> = cols
            .get(4)
            .map_or(vec![], |o| o.split_whitespace().collect());
        let cpus = cols
            .get(2)
            .map_or(vec![], |c| c.split_whitespace().collect());
        for cpu in std::iter::once(None).chain(cpus.into_iter().map(Some)) {
            let mut args: Vec<&str> = cpu.map_or(vec![], |cpu| vec!["--cpu", cpu]);
            args.extend(&opts);
            let Ok(parsed) = PtxedOptions::from_args(&args) else {
                continue;
            };
            each(&trace, &image, parsed.flow, &format!("{name} {args:?}"));
            cases += 1;
        }
    }
    Some(cases)
}

#[test]
fn the_fast_path_matches_the_general_one_on_the_libipt_corpus() {
    let Some(cases) = for_each_corpus_case(|trace, image, config, what| {
        same(trace, image, config, what);
    }) else {
        return;
    };
    assert!(cases > 100, "only {cases} corpus cases");
}

/// An overflow early in the trace: the decode after it takes the fast path as before
/// it. (The event layer's restart after an overflow leaves a stale status behind while
/// packets flow again; the fast path asked for it and left every later block to the
/// general path, 64,000 of the real mruby trace's 460,000.)
#[test]
fn the_fast_path_goes_on_after_an_overflow() {
    let (trace, image) = synth(3, 12, 64 * 1024);
    // After the second PSB+, an OVF and the PSB+'s own FUP: nothing lost, tracing
    // resumes where it was.
    let second_psb = trace
        .windows(PSB.len())
        .enumerate()
        .skip(1)
        .find_map(|(at, w)| (w == PSB).then_some(at))
        .expect("a second PSB");
    assert!(second_psb < trace.len() / 8, "PSB at {second_psb}");
    let packets: Vec<(usize, Packet)> = PacketDecoder::new(&trace, Errata::default())
        .flatten()
        .skip_while(|&(at, _)| at < second_psb)
        .take(8)
        .collect();
    let fup = packets
        .iter()
        .position(|(_, p)| matches!(p, Packet::Fup(_)))
        .expect("a FUP in PSB+");
    let end = packets
        .iter()
        .position(|(_, p)| matches!(p, Packet::PsbEnd))
        .expect("PSBEND");
    let (fup_bytes, resume) = (
        &trace[packets[fup].0..packets[fup + 1].0],
        packets[end + 1].0,
    );
    let mut ovf = trace[..resume].to_vec();
    ovf.extend_from_slice(&[0x02, 0xf3]);
    ovf.extend_from_slice(fup_bytes);
    ovf.extend_from_slice(&trace[resume..]);
    let fast = same(&ovf, &image, FlowConfig::default(), "overflow");
    let mut branches = Branches::new(&ovf, &image, FlowConfig::default());
    let events: Vec<BranchEvent> = branches.by_ref().collect();
    let gaps = events
        .iter()
        .filter(|e| e.kind == BranchKind::TraceGap)
        .count();
    let errors = events
        .iter()
        .filter(|e| e.kind == BranchKind::Error)
        .count();
    assert_eq!(
        (gaps, errors),
        (1, 0),
        "one overflow, no errors: {:?}",
        branches.counts().errors
    );
    let blocks = branches.counts().blocks;
    assert!(
        fast * 10 > blocks * 9,
        "only {fast} of {blocks} blocks on the fast path"
    );
}

/// Public real KVM-PT traces (nyx-fuzz/libxdc_experiments' `test_data`: a trace and the
/// pages of code it ran, `PREFIX.addr` one little-endian u64 address per page and
/// `PREFIX.dump` the pages), kept outside the repository: `LOOKBACK_REAL_TRACES/libxdc`
/// or `../real-traces/libxdc` beside the workspace. `None` (the test says it skipped)
/// where they are absent, as in CI without network.
fn real_kvm_pt_traces() -> Option<Vec<(String, Vec<u8>, Image)>> {
    let given = std::env::var_os("LOOKBACK_REAL_TRACES");
    let named = given.is_some();
    let dir = given.map_or_else(
        || std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../real-traces"),
        std::path::PathBuf::from,
    );
    let mut found = Vec::new();
    for (name, trace, cache) in [
        ("mruby", "trace", "data"),
        ("qemu", "trace1", "page_cache"),
        ("foo", "trace", "data"),
    ] {
        let case = dir.join("libxdc").join(name);
        let (Ok(trace), Ok(addrs), Ok(pages)) = (
            fs::read(case.join(trace)),
            fs::read(case.join(format!("{cache}.addr"))),
            fs::read(case.join(format!("{cache}.dump"))),
        ) else {
            continue;
        };
        let mut image = Image::new();
        for (addr, page) in addrs.chunks_exact(8).zip(pages.chunks(4096)) {
            let addr = u64::from_le_bytes(addr.try_into().expect("8 bytes"));
            image.add(name, page.to_vec(), addr);
        }
        found.push((name.to_owned(), trace, image));
    }
    // Named on purpose but not there: a mistake to report, not a skip. (A directory
    // with other recordings only, e.g. a perf.data, is a setup the integration tests
    // use: skipped here.)
    assert!(
        !named || dir.is_dir(),
        "LOOKBACK_REAL_TRACES={} is not a directory",
        dir.display()
    );
    if found.is_empty() {
        println!("no real KVM-PT traces under {}: skipped", dir.display());
        return None;
    }
    Some(found)
}

/// The fast path against the general one on real traces: every event (times and offsets
/// included) and count the same, and most blocks taken by the fast path (real traces are
/// where the decode's time goes: TIP.PGD/TIP.PGE every few hundred bytes, an overflow,
/// PSB+ every few hundred bytes in qemu's).
#[test]
fn the_fast_path_matches_the_general_one_on_real_traces() {
    let Some(traces) = real_kvm_pt_traces() else {
        return;
    };
    for (name, trace, image) in traces {
        let (fast, blocks) = same_blocks(&trace, &image, FlowConfig::default(), &name);
        println!("{name}: {fast} of {blocks} blocks on the fast path");
        assert!(
            fast * 5 > blocks * 4,
            "{name}: only {fast} of {blocks} blocks on the fast path"
        );
    }
}

/// A loop through a PLT stub: 0x1000: call 0x1100; 0x1005: jne 0x1000; 0x1007: ret;
/// 0x1100: jmp [rip] (out of the traced code).
fn plt_loop() -> Image {
    let mut code = vec![0x90u8; 0x200];
    code[..5].copy_from_slice(&[0xe8, 0xfb, 0, 0, 0]);
    code[5..7].copy_from_slice(&[0x75, 0xf9]);
    code[7] = 0xc3;
    code[0x100..0x106].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    let mut image = Image::new();
    image.add("plt", code, 0x1000);
    image
}

/// Code leaving the traced range through a PLT stub and coming back, as in real
/// KVM-PT traces: a loop calls 0x1100, whose indirect jump leaves (TIP.PGD to 0x9000),
/// tracing resumes at the return address (TIP.PGE), and a TNT bit closes the loop. The
/// fast path takes each disable and enable itself (a trace stop and start, the call
/// reported, the stub's jump not), with the general path's events, times and offsets;
/// PADs between the two packets change nothing.
#[test]
fn the_fast_path_takes_a_disable_and_enable_through_a_plt_stub() {
    let image = plt_loop();
    let ip48 = |ip: u64| ip.to_le_bytes()[..6].to_vec();
    let mut trace = at_0x1000();
    let rounds = 2000;
    for round in 0..rounds {
        // TIP.PGD to 0x9000, TIP.PGE at 0x1005 (full IPs), a taken TNT bit.
        trace.push(0x61);
        trace.extend(ip48(0x9000));
        trace.extend(std::iter::repeat_n(0, round % 3));
        trace.push(0x71);
        trace.extend(ip48(0x1005));
        trace.push(0x06);
    }
    let (fast, blocks) = same_blocks(&trace, &image, FlowConfig::default(), "plt");
    let events: Vec<BranchEvent> = Branches::new(&trace, &image, FlowConfig::default()).collect();
    let count = |kind| events.iter().filter(|e| e.kind == kind).count();
    assert_eq!(count(BranchKind::TraceStop), rounds);
    assert_eq!(count(BranchKind::TraceStart), rounds + 1);
    assert_eq!(count(BranchKind::Error), 0);
    assert!(count(BranchKind::Call) >= rounds);
    // The stub's jump out is not reported: the trace stop is.
    assert!(
        !events
            .iter()
            .any(|e| e.kind == BranchKind::Jump && e.from == 0x1100)
    );
    assert!(
        fast * 10 > blocks * 9,
        "only {fast} of {blocks} blocks on the fast path"
    );
}

/// Two PLT stubs in one loop, each leaving the traced code: the fast path keeps its walks
/// to a disable and takes one again when a later toggle has the same start, disable IP
/// and mode. Toggles here repeat one stub a random number of times, then go through the
/// other (whose walk is longer: a direct jump, reported, before its indirect one), with
/// one of three disable IPs at random (one the direct jump's target, which ends stub B's
/// walk there): every event, time, offset and count must still be the general path's, so
/// a walk taken for the wrong toggle shows.
///
/// 0x1000: call 0x1100; 0x1005: jne 0x1000; 0x1007: call 0x1120; 0x100c: jne 0x1000;
/// 0x100e: ret; 0x1100: jmp [rip]; 0x1120: jmp 0x1140; 0x1140: jmp [rip].
#[test]
fn toggles_through_two_stubs_take_each_its_own_walk() {
    let mut code = vec![0x90u8; 0x200];
    code[..5].copy_from_slice(&[0xe8, 0xfb, 0, 0, 0]);
    code[5..7].copy_from_slice(&[0x75, 0xf9]);
    code[7..12].copy_from_slice(&[0xe8, 0x14, 0x01, 0, 0]);
    code[12..14].copy_from_slice(&[0x75, 0xf2]);
    code[14] = 0xc3;
    code[0x100..0x106].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    code[0x120..0x125].copy_from_slice(&[0xe9, 0x1b, 0, 0, 0]);
    code[0x140..0x146].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    let mut image = Image::new();
    image.add("stubs", code, 0x1000);
    let ip48 = |ip: u64| ip.to_le_bytes()[..6].to_vec();
    let mut rng = Rng(0x2f_6b_93_0c_d4_71_5e_a8);
    let mut trace = at_0x1000();
    // The disable's IP: outside the code, or stub B's direct jump's target (then the
    // disable binds to that jump, whose event is dropped: a one-block walk instead of
    // two, so a walk taken again for another disable IP shows). Returns it. One of the
    // IPs outside has its walk from stub B (from 0x1007, after the `jne` not taken) in
    // the same slot of the kept walks as the target's: only the key tells them apart.
    let slot = |off| fast::walk_slot((0x1007, off, ExecMode::Bits64));
    let Some(twin) = (0xa000..0xb000).find(|&off| slot(off) == slot(0x1140)) else {
        panic!("no IP whose walk shares the slot");
    };
    let toggle = |trace: &mut Vec<u8>, rng: &mut Rng, back: u64, taken: bool| {
        let off = match rng.next() % 4 {
            0 => twin,
            1 => 0x1140,
            _ => 0x9000,
        };
        trace.push(0x61);
        trace.extend(ip48(off));
        trace.extend(std::iter::repeat_n(0, (rng.next() % 3) as usize));
        trace.push(0x71);
        trace.extend(ip48(back));
        trace.push(if taken { 0x06 } else { 0x04 });
        off
    };
    let (mut stub_a, mut stub_b, mut b_jumps) = (0, 0, 0);
    for _ in 0..500 {
        let repeats = 1 + rng.next() % 4;
        for n in 0..repeats {
            toggle(&mut trace, &mut rng, 0x1005, n + 1 < repeats);
            stub_a += 1;
        }
        if toggle(&mut trace, &mut rng, 0x100c, true) != 0x1140 {
            b_jumps += 1;
        }
        stub_b += 1;
    }
    let (fast, blocks) = same_blocks(&trace, &image, FlowConfig::default(), "two stubs");
    let events: Vec<BranchEvent> = Branches::new(&trace, &image, FlowConfig::default()).collect();
    let count = |kind| events.iter().filter(|e| e.kind == kind).count();
    assert_eq!(count(BranchKind::TraceStop), stub_a + stub_b);
    assert_eq!(count(BranchKind::Error), 0);
    // Stub B's direct jump is reported once per pass it does not end; stub A has none.
    let jumps = events
        .iter()
        .filter(|e| e.kind == BranchKind::Jump && e.from == 0x1120)
        .count();
    assert_eq!(jumps, b_jumps);
    assert!(b_jumps > 0 && b_jumps < stub_b, "{b_jumps} of {stub_b}");
    assert!(
        fast * 10 > blocks * 9,
        "only {fast} of {blocks} blocks on the fast path"
    );
}

/// Stretches of PSB+ headers while tracing is off (KVM-PT writes them every few
/// hundred bytes): the quiet path takes them a header at a time, with the general
/// path's events, times, offsets and counts, and leaves to it the headers it does not
/// take (a MODE.EXEC in one, the first after a disable, a header with a FUP).
#[test]
fn quiet_psb_headers_go_as_the_general_path_takes_them() {
    let image = plt_loop();
    let ip48 = |ip: u64| ip.to_le_bytes()[..6].to_vec();
    let mut rng = Rng(0x51_7c_c1_b7_27_22_0a_95);
    let mut trace = at_0x1000();
    let mut headers = 0;
    let mut tsc = 0x1000u64;
    for round in 0..300u64 {
        // Tracing leaves through the stub ...
        trace.push(0x61);
        trace.extend(ip48(0x9000));
        // ... and stays off for a few PSB+.
        for _ in 0..=(rng.next() % 4) {
            trace.extend(std::iter::repeat_n(0, (rng.next() % 12) as usize));
            trace.extend_from_slice(&PSB);
            let mut fields: Vec<Vec<u8>> = vec![
                vec![0x99, 0x20 | u8::from(round.is_multiple_of(5))],
                [&[0x02, 0x43][..], &ip48(0x48c9_0000 >> 4 | 1)].concat(),
                vec![0x02, 0xc8, 0xee, 0x56, 0x3b, 0, 0],
                vec![0x02, 0x03, 26 + (round % 3) as u8, 0],
            ];
            if rng.next().is_multiple_of(3) {
                // Time moves on in the header.
                tsc += 1 + (rng.next() % 5000);
                fields.push([&[0x19][..], &tsc.to_le_bytes()[..7]].concat());
            }
            match rng.next() % 10 {
                // Not quiet: left to the general path.
                0 => fields.push(vec![0x99, 0x01]),
                1 => fields.push([&[0x02, 0xc3, 0x88][..], &[7; 8][..]].concat()),
                _ => {}
            }
            for field in fields {
                trace.extend(field);
                trace.extend(std::iter::repeat_n(0, (rng.next() % 3) as usize));
            }
            trace.extend_from_slice(&[0x02, 0x23]);
            headers += 1;
        }
        // Back at the return address; a taken TNT bit closes the loop.
        trace.extend_from_slice(&[0x02, 0x43]);
        trace.extend(ip48(0x48c9_1000 >> 4 | 1));
        trace.extend_from_slice(&[0x99, 0x01, 0x71]);
        trace.extend(ip48(0x1005));
        trace.push(0x06);
    }
    let config = FlowConfig::default();
    same(&trace, &image, config, "quiet psb");
    let mut branches = Branches::new(&trace, &image, config);
    let events: Vec<BranchEvent> = branches.by_ref().collect();
    let count = |kind| events.iter().filter(|e| e.kind == kind).count();
    assert_eq!(count(BranchKind::Error), 0);
    assert_eq!(count(BranchKind::TraceStop), 300);
    assert!(
        events.iter().any(|e| e.has_tsc),
        "the headers' TSCs reach the events"
    );
    // The first header after each disable goes the general way (its pending event is
    // the disable itself), and so do the ones with a MODE.EXEC or an MNT.
    let quiet = branches.quiet_psbs();
    assert!(
        quiet * 10 > (headers - 300) * 6,
        "only {quiet} of {headers} headers taken quietly"
    );
}

#[test]
fn batches_hand_out_the_iterators_events() {
    let (trace, image) = synth(3, 12, 64 * 1024);
    let one_by_one: Vec<BranchEvent> =
        Branches::new(&trace, &image, FlowConfig::default()).collect();
    let mut branches = Branches::new(&trace, &image, FlowConfig::default());
    let mut batched = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let batch = branches.next_batch();
        if batch.is_empty() {
            break;
        }
        sizes.push(batch.len());
        batched.extend_from_slice(batch);
    }
    assert_eq!(batched, one_by_one);
    assert!(branches.next().is_none());
    // The batch starts short (the general path may add a few events to a fast run's)
    // and takes its full size once a fast run fills more than half of it.
    let short = fast::FIRST_BATCH;
    let first_long = sizes.iter().find(|&&n| n > short / 2);
    assert!(first_long.is_some_and(|&n| n < 2 * short), "{sizes:?}");
    assert!(sizes.iter().any(|&n| n >= 16 * short), "{sizes:?}");
}

/// Code that never needs the trace again (direct jumps and calls in a loop) stalls the
/// decoder: both paths give up at the same instruction, after the same events, whether
/// the loop starts with TNT bits left, right after a TNT or a TIP, or some blocks into
/// one.
#[test]
fn the_fast_path_stalls_where_the_general_one_does() {
    // PSB+ with MODE.Exec (64-bit) and a FUP to 0x1000.
    let start = |tail: &[u8]| {
        let mut trace = at_0x1000();
        trace.extend_from_slice(tail);
        trace.extend_from_slice(&PSB);
        trace
    };
    let cases: [(&str, Vec<u8>, Vec<u8>); 7] = [
        // jmp . (2 instructions a round with the block)
        ("jmp .", vec![0xeb, 0xfe], start(&[0x06])),
        // jne +2; jmp . / jmp 0x1000: not taken, then stuck with bits left
        (
            "jne; jmp .",
            vec![0x75, 0x02, 0xeb, 0xfe, 0xeb, 0xfa],
            start(&[0x02, 0xa3, 0xfa, 0xff, 0xff, 0xff, 0xff, 0x7f]),
        ),
        // jne +0 (to the next instruction) many times, then the loop
        (
            "jne +0; jmp .",
            vec![0x75, 0x00, 0x75, 0x00, 0xeb, 0xfe],
            start(&[0x0c, 0x06]),
        ),
        // jmp rax to a TIP, then jmp . there
        (
            "jmp rax; jmp .",
            vec![0xff, 0xe0, 0x90, 0x90, 0xeb, 0xfe],
            start(&[0x2d, 0x04, 0x10, 0x06]),
        ),
        // call . (calls need no trace)
        ("call .", vec![0xe8, 0xfb, 0xff, 0xff, 0xff], start(&[0x06])),
        // jne . while taken, then jmp . right after the TNT that ended the loop
        (
            "jne .; jmp .",
            vec![0x75, 0xfe, 0xeb, 0xfe],
            start(&[0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0e, 0x0c, 0x0e]),
        ),
        // 1,500 nops and a jmp back: blocks too large for the unchecked loop
        (
            "nops; jmp",
            {
                let mut code = vec![0x90; 1500];
                code.extend_from_slice(&[0xe9]);
                code.extend_from_slice(&(-1505i32).to_le_bytes());
                code
            },
            start(&[0x06]),
        ),
    ];
    for (what, code, trace) in cases {
        let mut image = Image::new();
        image.add("stall", code, 0x1000);
        let fast = same(&trace, &image, FlowConfig::default(), what);
        assert!(fast > 500, "{what}: only {fast} fast blocks");
        let errors: Vec<BranchEvent> = Branches::new(&trace, &image, FlowConfig::default())
            .filter(|e| e.kind == BranchKind::Error)
            .collect();
        assert!(!errors.is_empty(), "{what}: no stall reported");
    }
}

/// Straight-line code first walked from its middle, then from its start: the general
/// walk's fill joins the entry the first walk left and, where that entry holds 255
/// instructions, ends the block there (the joined run would not fit an entry). The fast
/// path's first-visit decode must give the same blocks: it takes only blocks short
/// enough that no entry inside them can be that long.
#[test]
fn a_first_visit_through_code_walked_from_its_middle_ends_where_the_general_walk_does() {
    // 0x1000: jmp rax; 0x1002: 300 nops; jmp 0x1000.
    let mut code = vec![0xff, 0xe0];
    code.extend_from_slice(&[0x90; 300]);
    code.push(0xe9);
    let back = -i32::try_from(code.len() + 4).unwrap_or(0);
    code.extend_from_slice(&back.to_le_bytes());
    let mut image = Image::new();
    image.add("nops", code, 0x1000);
    // PSB+ (64-bit, FUP at 0x1000); TIPs to 0x1030 (254 nops and the jmp from there),
    // to 0x1002 (the run's start) and to 0x1030 again, twice over.
    let mut trace = at_0x1000();
    for _ in 0..2 {
        trace.extend_from_slice(&[0x2d, 0x30, 0x10, 0x2d, 0x02, 0x10]);
    }
    trace.extend_from_slice(&PSB);
    let (_, blocks) = same_blocks(
        &trace,
        &image,
        FlowConfig::default(),
        "nops from the middle",
    );
    assert!(blocks >= 8, "{blocks} blocks");
}

/// A first visit's block ending in a branch of 8 bytes (an indirect jump through a
/// table with REX and SIB), then a walk into the code before it: the entry the first
/// visit leaves is the general walk's (its branch size too long for an entry, kept as
/// none), so the later walk joins it alike. Found in review: an entry left out there
/// let the fast path's later walk go on where the general one ends its block.
#[test]
fn a_first_visit_ending_in_a_long_branch_leaves_the_general_walks_entry() {
    // 0x1000: jmp rax; 0x1002: 264 nops; 0x110a: jmp [r8*8+0x1000] (8 bytes).
    let mut code = vec![0xff, 0xe0];
    code.extend_from_slice(&[0x90; 264]);
    code.extend_from_slice(&[0x42, 0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x00]);
    let mut image = Image::new();
    image.add("nops", code, 0x1000);
    let mut trace = at_0x1000();
    // TIPs: to 0x100c (254 nops and the jump), to 0x1000, to 0x1002 (the run's start),
    // to 0x1000; twice over.
    for _ in 0..2 {
        trace.extend_from_slice(&[
            0x2d, 0x0c, 0x10, 0x2d, 0x00, 0x10, 0x2d, 0x02, 0x10, 0x2d, 0x00, 0x10,
        ]);
    }
    trace.extend_from_slice(&PSB);
    let (_, blocks) = same_blocks(&trace, &image, FlowConfig::default(), "8-byte branch");
    assert!(blocks >= 8, "{blocks} blocks");
}

/// Straight-line code longer than a fill's step limit (1,123 instructions): the fill
/// ends the first walk's block after 1,024 and leaves an entry that goes on to the next
/// instruction; a first visit whose block holds that entry, then a walk from just
/// before it, end their blocks where the general walk does. Found in review: the
/// first visit's entry (one run to the branch) let the later walk's fill overflow
/// where the general one's did not.
#[test]
fn a_first_visit_over_an_entry_left_at_the_step_limit_is_the_general_walks() {
    // 0x1000: jmp rax; 0x1002..0x1465: 1,123 nops; 0x1465: jmp rax.
    let mut code = vec![0xff, 0xe0];
    code.extend_from_slice(&[0x90; 0x1465 - 0x1002]);
    code.extend_from_slice(&[0xff, 0xe0]);
    let mut image = Image::new();
    image.add("nops", code, 0x1000);
    let mut trace = at_0x1000();
    // From the run's start (the fill stops at its limit), from 0x1367 (254 nops and
    // the jump), from 0x135d (ten more), each back through 0x1000.
    for to in [0x1002u16, 0x1367, 0x135d] {
        let [lo, hi] = to.to_le_bytes();
        trace.extend_from_slice(&[0x2d, lo, hi, 0x2d, 0x00, 0x10]);
    }
    trace.extend_from_slice(&PSB);
    let (_, blocks) = same_blocks(&trace, &image, FlowConfig::default(), "step limit inside");
    assert!(blocks >= 7, "{blocks} blocks");
}

/// Runs of straight-line code from one instruction to more than a fill's step limit,
/// each ending in an indirect jump (2 or 8 bytes), entered by TIPs at random
/// instructions, over and over: first visits from the middle of code walked before,
/// from before entries other walks left, over entries left at the step limit. The fast
/// path gives the general path's events and counts, blocks included, on every seed.
#[test]
fn first_visits_at_random_places_in_long_runs_are_the_general_walks() {
    for seed in 1..=24u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        // 0x1000: jmp rax (the FUP's block), then the runs.
        let mut code = vec![0xff, 0xe0];
        // Where a TIP may go: every nop and every run's jump; and each jump's place.
        let mut places = Vec::new();
        let mut jumps = Vec::new();
        while code.len() < 0x6000 {
            let nops = match rng.next() % 4 {
                0 => 1 + rng.next() % 8,
                1 => 200 + rng.next() % 120,
                2 => 900 + rng.next() % 400,
                _ => 1 + rng.next() % 300,
            };
            for _ in 0..nops {
                places.push(0x1000 + code.len() as u64);
                code.push(0x90);
            }
            jumps.push(places.len());
            places.push(0x1000 + code.len() as u64);
            if rng.next().is_multiple_of(2) {
                code.extend_from_slice(&[0xff, 0xe0]);
            } else {
                code.extend_from_slice(&[0x42, 0xff, 0x24, 0xc5, 0x00, 0x10, 0x00, 0x00]);
            }
        }
        let mut image = Image::new();
        image.add("runs", code, 0x1000);
        let mut trace = at_0x1000();
        for _ in 0..400 {
            // Anywhere, or where a block of exactly 255 instructions starts (the most an
            // entry holds), or a few instructions before that.
            let jump = jumps[(rng.next() % jumps.len() as u64) as usize];
            let at = match rng.next() % 4 {
                0 | 1 => (rng.next() % places.len() as u64) as usize,
                2 => jump.saturating_sub(254),
                _ => jump.saturating_sub(254 + (rng.next() % 12) as usize),
            };
            let to = places[at];
            let [lo, hi, ..] = to.to_le_bytes();
            trace.extend_from_slice(&[0x2d, lo, hi]);
        }
        trace.extend_from_slice(&PSB);
        let (fast, blocks) = same_blocks(
            &trace,
            &image,
            FlowConfig::default(),
            &format!("seed {seed}"),
        );
        assert!(blocks >= 400, "seed {seed}: {blocks} blocks");
        assert!(fast > 0, "seed {seed}: no fast blocks");
    }
}

/// A first visit's block, then a fill that reaches its branch through code that
/// overlaps the block's (a jump into the middle of an instruction) exactly at the
/// fill's step limit: the general walk's fill joins the entry the branch got at the
/// first visit, so the first visit leaves that entry too. Found in a second review:
/// without it the later fill stopped at its limit and made one block more.
#[test]
fn a_fill_reaching_a_first_visits_branch_through_overlapping_code_joins_it() {
    // 0x1000: jmp rax; 0x1002: 1,023 nops; 0x1401: cmp al, 0x90 (from 0x1402: a nop);
    // 0x1403: jmp rax.
    let mut code = vec![0xff, 0xe0];
    code.extend_from_slice(&[0x90; 1023]);
    code.extend_from_slice(&[0x3c, 0x90, 0xff, 0xe0]);
    let mut image = Image::new();
    image.add("overlap", code, 0x1000);
    let mut trace = at_0x1000();
    // TIPs: to 0x1402 (a nop inside the cmp, then the jump), to 0x1002, to 0x1000.
    for _ in 0..2 {
        trace.extend_from_slice(&[0x2d, 0x02, 0x14, 0x2d, 0x02, 0x10, 0x2d, 0x00, 0x10]);
    }
    trace.extend_from_slice(&PSB);
    let (fast, blocks) = same_blocks(&trace, &image, FlowConfig::default(), "overlap");
    assert!(fast > 0, "{fast} fast blocks of {blocks}");
}

/// A loop the trace's bits steer: 0x1000: nop; jne 0x1000; nop; jne 0x1000; jmp 0x1000.
fn steered_loop() -> Image {
    let mut image = Image::new();
    image.add(
        "loop",
        vec![0x90, 0x75, 0xfd, 0x90, 0x75, 0xfa, 0xeb, 0xf8],
        0x1000,
    );
    image
}

/// `trace` (from [`at_0x1000`]) ended with a PSB, decoded both ways; how many blocks
/// took the fast path, and how many of them came in loop runs.
fn same_with_loops(trace: &[u8], image: &Image, what: &str) -> (u64, u64) {
    let mut trace = trace.to_vec();
    trace.extend_from_slice(&PSB);
    let fast = same(&trace, image, FlowConfig::default(), what);
    let mut branches = Branches::new(&trace, image, FlowConfig::default());
    branches.by_ref().for_each(drop);
    (fast, branches.loop_blocks())
}

/// TNT packets that repeat the one before at the same IP (a loop) are taken whole
/// (`loop_runs.rs`) with the events, times, offsets and counts of the blocks one by one:
/// short and long TNTs, repeats of one packet and of patterns longer than one, runs
/// with more taken jumps than a run holds (a long TNT's: the loop takes the rest), with
/// timing packets and PADs between the packets, and over batch boundaries (thousands of
/// jumps). The third field: the least share of the fast blocks, in percent, that loop
/// runs take where the packets repeat.
#[test]
fn loops_are_taken_whole_as_their_blocks_one_by_one() {
    let image = steered_loop();
    let mut rng = Rng(0x9d_31_0c_44_52_7e_b1_63);
    let long_tnt = |bits: u64| {
        // 47 outcomes under a stop bit: 0x02 0xa3, then six bytes.
        let mut packet = vec![0x02, 0xa3];
        packet.extend_from_slice(&((bits & ((1 << 47) - 1)) | 1 << 47).to_le_bytes()[..6]);
        packet
    };
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        ("all taken", vec![0xfe; 3000], 50),
        ("one pattern", vec![0xb6; 3000], 50),
        ("two patterns", [0xb6, 0xda].repeat(1500), 0),
        (
            "patterns with breaks",
            (0..3000)
                .map(|i| if i % 50 == 49 { 0xaa } else { 0xd6 })
                .collect(),
            50,
        ),
        ("short TNTs", [0x0e, 0x0e, 0x0e, 0x16].repeat(800), 0),
        ("long TNTs", long_tnt(u64::MAX).repeat(300), 10),
        (
            "long TNTs, one pattern",
            long_tnt(0x5555_5555_5555).repeat(300),
            10,
        ),
        (
            "random",
            (0..3000)
                .map(|_| (rng.next() as u8 | 0x80) & 0xfe)
                .collect(),
            0,
        ),
    ];
    for (what, tnts, share) in cases {
        let mut trace = at_0x1000();
        trace.extend_from_slice(&tnts);
        let (fast, looped) = same_with_loops(&trace, &image, what);
        assert!(fast > 1000, "{what}: only {fast} fast blocks");
        assert!(
            looped * 100 >= fast * share,
            "{what}: {looped} of {fast} blocks in loop runs"
        );
        let interrupted = with_interruptions(&trace, &mut rng, 3);
        let what = format!("{what}, interrupted");
        same_with_loops(&interrupted, &image, &what);
    }
}

/// A loop run ends where the loop needs more than its bits: at a call (0x1004, to a
/// return the next bit takes), the fast loop takes the rest of the TNT block by block;
/// where a TNT it would use up is followed by a disable (TIP.PGD), it takes that TNT's
/// blocks itself too (the disable is the general path's).
#[test]
fn a_loop_run_leaves_calls_and_disables_to_the_loop() {
    // 0x1000: jne 0x1004; nop; nop; 0x1004: call 0x1100; 0x1009: jne 0x1000;
    // 0x100b: jmp 0x1000; 0x1100: ret.
    let mut code = vec![0x90u8; 0x101];
    code[..0x0d].copy_from_slice(&[
        0x75, 0x02, 0x90, 0x90, 0xe8, 0xf7, 0x00, 0x00, 0x00, 0x75, 0xf5, 0xeb, 0xf3,
    ]);
    code[0x100] = 0xc3;
    let mut image = Image::new();
    image.add("calls", code, 0x1000);
    let mut trace = at_0x1000();
    trace.extend(std::iter::repeat_n(0xfe, 3000));
    let (fast, looped) = same_with_loops(&trace, &image, "call in the loop");
    assert!(fast > 1000, "only {fast} fast blocks");
    assert!(looped > 100, "{looped} blocks in loop runs");
    // The steered loop, disabled after a run of repeats: TIP.PGD with no IP.
    let image = steered_loop();
    let mut trace = at_0x1000();
    for _ in 0..200 {
        trace.extend(std::iter::repeat_n(0xfe, 20));
        trace.push(0x01);
        // TIP.PGE at 0x1000 (two IP bytes).
        trace.extend_from_slice(&[0x31, 0x00, 0x10]);
    }
    let (_, looped) = same_with_loops(&trace, &image, "disabled after repeats");
    assert!(looped > 1000, "{looped} blocks in loop runs");
}

/// A partial loop run (a taken branch and more direct jumps than a run reports) counts
/// toward the stall limit as its blocks would one by one: the code stalls right after
/// it (`jmp .`), and the stall is reported after the same events. The run is held at
/// the second time its TNT starts at 0x1000: after the first stall, the decoder goes on
/// at the next PSB.
#[test]
fn a_partial_loop_run_counts_toward_a_stall_as_its_blocks() {
    // 0x1000: jne 0x1010; 0x1002: jmp 0x1000; 0x1010..0x101c: jmp +0 (six);
    // 0x101c: jmp .
    let mut code = vec![0x90u8; 0x1e];
    code[..4].copy_from_slice(&[0x75, 0x0e, 0xeb, 0xfc]);
    for at in (0x10..0x1c).step_by(2) {
        code[at..at + 2].copy_from_slice(&[0xeb, 0x00]);
    }
    code[0x1c..].copy_from_slice(&[0xeb, 0xfe]);
    let mut image = Image::new();
    image.add("stall", code, 0x1000);
    // Two not-taken bits (round the loop), then taken: into the jumps and the stall.
    let mut trace = Vec::new();
    for _ in 0..4 {
        trace.extend(at_0x1000());
        trace.extend_from_slice(&[0x08, 0x0e]);
    }
    let (fast, looped) = same_with_loops(&trace, &image, "stall after a partial run");
    assert!(fast > 500, "only {fast} fast blocks");
    assert!(looped > 0, "no loop run");
    let errors = Branches::new(&trace, &image, FlowConfig::default())
        .filter(|e| e.kind == BranchKind::Error)
        .count();
    assert!(errors >= 2, "{errors} stalls reported");
}

/// A full loop run whose TNT is followed right by a TIP: a TIP's place is where it
/// starts, which is the TNT's place (past the TNT and its PADs), so block by block the
/// stall count goes on over the run's last block instead of starting over. Here the
/// code stalls right after the run (`jmp .`, the TIP never used), and the stall is
/// reported after the same events. (Found by a review: the run started the count over
/// whatever the next event was.)
#[test]
fn a_full_loop_run_then_a_tip_counts_toward_a_stall_as_its_blocks() {
    // 0x1000: jne 0x1004; 0x1002: jmp 0x1000; 0x1004: jne 0x1000; 0x1006: jmp .
    let mut image = Image::new();
    image.add(
        "stall",
        vec![0x75, 0x02, 0xeb, 0xfc, 0x75, 0xfa, 0xeb, 0xfe],
        0x1000,
    );
    let mut trace = Vec::new();
    for _ in 0..4 {
        trace.extend(at_0x1000());
        // T,T (back at 0x1000), then T,N (to 0x1006: jmp .), then a TIP right after.
        trace.extend_from_slice(&[0x0e, 0x0c, 0x2d, 0x00, 0x20]);
    }
    let (fast, looped) = same_with_loops(&trace, &image, "full run, then a TIP");
    assert!(looped > 0, "no loop run ({fast} fast blocks)");
}

/// Random code full of short loops (conditional branches back, direct jumps, calls,
/// returns, indirect jumps, now and then `jmp .`) under random traces of repeated
/// TNTs (short and long), TIPs, disable/enable pairs, PSB+ and other packets, with and
/// without timing packets between: loop runs give what the blocks give one by one.
#[test]
fn loop_runs_in_random_loops_are_their_blocks() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut looped = 0;
    for round in 0..200u64 {
        let mut code = Vec::new();
        while code.len() < 0x60 {
            match rng.next() % 24 {
                0..=8 => code.extend_from_slice(&[0x75, (rng.next() % 0x30) as u8 ^ 0xf0]),
                9 => code.extend_from_slice(&[0x75, 0x00]),
                10 | 11 => code.extend_from_slice(&[0xeb, (rng.next() % 0x20) as u8 ^ 0xf0]),
                12 => code.push(0xc3),
                13 => code.extend_from_slice(&[0xff, 0xe0]),
                14 | 15 => {
                    code.push(0xe8);
                    code.extend_from_slice(&((rng.next() % 0x40) as i32 - 0x20).to_le_bytes());
                }
                16 if round % 4 == 3 => code.extend_from_slice(&[0xeb, 0xfe]),
                _ => code.extend(std::iter::repeat_n(0x90, 1 + (rng.next() % 4) as usize)),
            }
        }
        let mut image = Image::new();
        image.add("random", code, 0x1000);
        let mut trace = at_0x1000();
        for _ in 0..60 {
            match rng.next() % 12 {
                0..=6 => {
                    let tnt = ((rng.next() as u8) | 0x80) & 0xfe;
                    // Now and then a shorter TNT (fewer outcomes under the stop bit).
                    let tnt = if rng.next().is_multiple_of(3) {
                        (tnt >> (rng.next() % 5) | 4) & 0xfe
                    } else {
                        tnt
                    };
                    let repeats = 1 + rng.next() % 12;
                    trace.extend(std::iter::repeat_n(tnt, repeats as usize));
                }
                7 => {
                    let bits = rng.next() & ((1 << 47) - 1) | 1 << 47;
                    for _ in 0..=rng.next() % 6 {
                        trace.extend_from_slice(&[0x02, 0xa3]);
                        trace.extend_from_slice(&bits.to_le_bytes()[..6]);
                    }
                }
                8 => trace.extend_from_slice(&[0x2d, (rng.next() % 0x60) as u8, 0x10]),
                9 => {
                    trace.extend_from_slice(&[0x21, (rng.next() % 0x60) as u8, 0x10]);
                    trace.extend_from_slice(&[0x31, (rng.next() % 0x60) as u8, 0x10]);
                }
                10 => trace.extend(at_0x1000()),
                _ if round % 2 == 1 => trace.extend(random_packet(&mut rng)),
                _ => {}
            }
        }
        let trace = if round % 2 == 0 {
            with_interruptions(&trace, &mut rng, 5)
        } else {
            trace
        };
        looped += same_with_loops(&trace, &image, &format!("round {round}")).1;
    }
    // (Random code seldom loops the same way twice in a row: a few hundred.)
    assert!(looped > 100, "only {looped} blocks in loop runs");
}
