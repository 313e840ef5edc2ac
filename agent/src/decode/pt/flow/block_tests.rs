//! Tests of the flow layer on hand-made traces over hand-made code, checked through
//! the `ptxed` text (instruction addresses and events).

use crate::decode::pt::flow::image::Image;
use crate::decode::pt::tools::ptxed::ptxed;
use crate::decode::pt::tools::ptxed_opts::PtxedOptions;

const PSB: [u8; 16] = [
    2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82,
];
/// MODE.Exec 64-bit, FUP 0x1000, PSBEND.
const HEADER: [u8; 11] = [0x99, 0x01, 0x7d, 0x00, 0x10, 0, 0, 0, 0, 0x02, 0x23];

fn run(code: &[u8], packets: &[u8], args: &[&str]) -> Vec<String> {
    let mut image = Image::new();
    image.add("code", code.to_vec(), 0x1000);
    let mut trace = PSB.to_vec();
    trace.extend_from_slice(&HEADER);
    trace.extend_from_slice(packets);
    let opts = PtxedOptions::from_args(args).unwrap();
    let mut out = String::new();
    ptxed(&trace, &image, &opts, &mut out).unwrap();
    out.lines().map(str::to_owned).collect()
}

#[test]
fn a_loop_follows_tnt_bits_and_decodes_the_same_from_the_block_cache() {
    // 0x1000: nop; 0x1001: jne 0x1000; 0x1003: jmp rax.
    let code = [0x90, 0x75, 0xfd, 0xff, 0xe0];
    // TNT.8 taken, taken, not taken; TIP.PGD without IP.
    let lines = run(&code, &[0x1c, 0x01], &["--block:show-blocks"]);
    let insns: Vec<&str> = lines
        .iter()
        .map(String::as_str)
        .filter(|l| !l.starts_with('['))
        .collect();
    let expected = ["1000", "1001", "1000", "1001", "1000", "1001", "1003"];
    assert_eq!(insns.len(), expected.len(), "{lines:?}");
    for (line, want) in insns.iter().zip(expected) {
        assert!(line.ends_with(want), "{lines:?}");
    }
    assert_eq!(lines.last().map(String::as_str), Some("[disabled]"));
    assert!(lines.iter().filter(|l| *l == "[block]").count() >= 3);
}

#[test]
fn indirect_calls_and_uncompressed_returns_take_their_targets_from_tip() {
    // 0x1000: call rax; 0x1002: jmp rbx; ...; 0x1010: ret.
    let mut code = vec![0x90; 0x11];
    code[..4].copy_from_slice(&[0xff, 0xd0, 0xff, 0xe3]);
    code[0x10] = 0xc3;
    // TIP 0x1010, TIP 0x1002 (16-bit updates), TIP.PGD without IP.
    let lines = run(
        &code,
        &[0x2d, 0x10, 0x10, 0x2d, 0x02, 0x10, 0x01],
        &["--event:ip"],
    );
    assert_eq!(
        lines,
        [
            "0000000000001000",
            "0000000000001010",
            "0000000000001002",
            "[disabled]",
        ]
    );
}

#[test]
fn missing_code_is_reported_at_its_address_and_trace_offset() {
    // The FUP points at 0x1000 but the code starts at 0x1000 + 0x100.
    let mut image = Image::new();
    image.add("code", vec![0x90; 4], 0x1100);
    let mut trace = PSB.to_vec();
    trace.extend_from_slice(&HEADER);
    trace.extend_from_slice(&[0x06]);
    let mut out = String::new();
    ptxed(&trace, &image, &PtxedOptions::default(), &mut out).unwrap();
    // As in libipt, the offset is that of the next packet to read (after the TNT).
    assert_eq!(out, "[1c, 1000: error: no memory mapped at this address]\n");
}

#[test]
fn a_walk_into_the_middle_of_cached_code_goes_on_through_its_direct_call() {
    // 0x1000: nop; 0x1001: nop; 0x1002: call 0x1010; 0x1007: jne 0x1001; 0x1009: jmp rax;
    // 0x1010: ret.
    let mut code = vec![0x90; 0x11];
    code[2..11].copy_from_slice(&[0xe8, 0x09, 0, 0, 0, 0x75, 0xf8, 0xff, 0xe0]);
    code[0x10] = 0xc3;
    // TNT.8 taken (ret), taken (jne), taken (ret), not taken (jne); TIP.PGD without IP.
    let lines = run(&code, &[0x3c, 0x01], &["--block:show-blocks"]);
    let blocks: Vec<Vec<&str>> = lines
        .split(|l| l == "[block]")
        .map(|b| b.iter().map(|l| &l[l.len() - 4..]).collect())
        .filter(|b: &Vec<&str>| !b.is_empty())
        .collect();
    // The first walk decodes the code and ends its block at the call, as libipt's does
    // when it fills its cache. The walk back into the middle, at 0x1001, finds the code
    // cached and goes on through the call to the return, as libipt's does: libipt has
    // an entry for every instruction it decoded, this cache only for the call it
    // stopped at, and the walk must not tell the two apart.
    assert_eq!(
        blocks,
        [
            vec!["1000", "1001", "1002"],
            vec!["1010"],
            vec!["1007"],
            vec!["1001", "1002", "1010"],
            vec!["1007"],
            vec!["1009", "led]"],
        ],
        "{lines:?}"
    );
}

#[test]
fn the_fill_decodes_from_lent_bytes_as_the_walk_decodes_from_the_image() {
    use crate::decode::pt::flow::block::{Block, BlockDecoder, FlowConfig};
    use crate::decode::pt::flow::image::ImageProvider;
    use crate::decode::pt::flow::insn::Insn;
    use crate::decode::pt::packets::packet::ExecMode;
    // Real code (this test's own executable) and bytes no compiler writes, in two
    // pieces, so that instructions run into the next piece and off the end.
    let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let mut bytes = exe[exe.len() / 2..][..0x800].to_vec();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    bytes.extend((0..0x100).map(|_| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 56) as u8
    }));
    // One instruction that surely straddles them, whatever the executable's bytes:
    // movabs rax, imm64 (10 bytes) starting 2 bytes before the second piece.
    bytes[0x4fe..0x500].copy_from_slice(&[0x48, 0xb8]);
    let mut image = Image::new();
    let first = image.add("a", bytes[..0x500].to_vec(), 0x1000);
    image.add("b", bytes[0x500..].to_vec(), 0x1500);
    let (mut taken, mut straddled, mut compared) = (0, 0, 0);
    for mode in [ExecMode::Bits64, ExecMode::Bits32] {
        for at in 0..0x500u64 {
            let ip = 0x1000 + at;
            let decoder = || {
                let mut decoder = BlockDecoder::new(&[], &image, FlowConfig::default());
                (decoder.ip, decoder.mode, decoder.icnt) = (ip, mode, Some(7));
                decoder
            };
            let (mut lean, mut walk) = (decoder(), decoder());
            let (mut lean_block, mut walk_block) = (Block::default(), Block::default());
            let code = image.code(ip);
            assert_eq!(
                code.map(|(begin, b)| (begin, b.len())),
                Some((0x1000, 0x500))
            );
            let mut lean_insn = Insn::NONE;
            let got = lean
                .fill_one_insn(&mut lean_block, code, first, &mut lean_insn)
                .map(|decoded| decoded.then_some(lean_insn));
            let want = walk.proceed_one_insn(&mut walk_block);
            assert_eq!(got, want, "{mode:?} at {ip:#x}");
            assert_eq!(lean_block, walk_block, "{mode:?} at {ip:#x}");
            assert_eq!(lean.icnt, walk.icnt);
            assert!(lean.retstack.same_as(&walk.retstack));
            taken += usize::from(matches!(got, Ok(Some(insn)) if !insn.truncated));
            straddled += usize::from(matches!(got, Ok(Some(insn)) if insn.truncated));
            compared += 1;
        }
    }
    // Most offsets decode, and some instructions straddle the pieces.
    assert!(taken * 2 > compared, "{taken} of {compared}");
    assert!(straddled > 0);
}
