//! Tests of the branch-event iterator: a hand-made trace over hand-made code, and
//! pseudo-random traces and code that must end without panics.
#![expect(
    clippy::cast_possible_truncation,
    reason = "random bytes are taken from the low bits of random words"
)]

use super::*;
use crate::decode::pt::flow::image::Image;

pub(super) const PSB: [u8; 16] = [
    2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82, 2, 0x82,
];

/// 0x1000: call 0x1010; 0x1005: jmp rax; ...; 0x1010: ret.
fn code() -> Image {
    let mut bytes = vec![0x90u8; 0x20];
    bytes[..5].copy_from_slice(&[0xe8, 0x0b, 0, 0, 0]);
    bytes[5..7].copy_from_slice(&[0xff, 0xe0]);
    bytes[0x10] = 0xc3;
    let mut image = Image::new();
    image.add("code", bytes, 0x1000);
    image
}

#[test]
fn calls_compressed_returns_and_stops_become_branch_events() {
    let mut trace = PSB.to_vec();
    // MODE.Exec 64-bit, FUP 0x1000 (sign-extended 48 bits), PSBEND.
    trace.extend_from_slice(&[0x99, 0x01, 0x7d, 0x00, 0x10, 0, 0, 0, 0, 0x02, 0x23]);
    // TNT.8 with one taken bit (the compressed return), TIP.PGD without IP.
    trace.extend_from_slice(&[0x06, 0x01]);
    let image = code();
    let events: Vec<BranchEvent> = Branches::new(&trace, &image, FlowConfig::default()).collect();
    let summary: Vec<(BranchKind, u64, u64)> =
        events.iter().map(|e| (e.kind, e.from, e.to)).collect();
    assert_eq!(
        summary,
        vec![
            (BranchKind::TraceStart, 0, 0x1000),
            (BranchKind::Call, 0x1000, 0x1010),
            (BranchKind::Return, 0x1010, 0x1005),
            (BranchKind::TraceStop, 0x1005, 0),
        ]
    );
    let counts = decode_counts(&trace, &image, FlowConfig::default());
    assert_eq!(counts.instructions, 3);
    assert_eq!(counts.branches_of(BranchKind::Call), 1);
    assert!(counts.errors.is_empty());
}

#[test]
fn missing_code_is_an_error_event_and_decoding_goes_on() {
    let mut trace = PSB.to_vec();
    trace.extend_from_slice(&[0x99, 0x01, 0x7d, 0x00, 0x50, 0, 0, 0, 0, 0x02, 0x23, 0x06]);
    let image = code();
    let events: Vec<BranchEvent> = Branches::new(&trace, &image, FlowConfig::default()).collect();
    let error = events.iter().find(|e| e.kind == BranchKind::Error).unwrap();
    assert_eq!(error.error, Some(FlowError::NoMap));
}

/// A small xorshift generator, so the test needs no dependency and is repeatable.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub(super) fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

/// A random but well-formed packet (mostly), so the decoder gets past the packet layer.
pub(super) fn random_packet(rng: &mut Rng) -> Vec<u8> {
    let r = rng.next();
    let ip = |rng: &mut Rng, op: u8| {
        let n = [0usize, 2, 4, 6, 6, 8][(rng.next() % 6) as usize];
        let bits: u8 = match n {
            0 => 0,
            2 => 1,
            4 => 2,
            8 => 6,
            _ => 3,
        };
        let mut p = vec![op | (bits << 5)];
        // Addresses near the code, so some of them decode.
        let addr = 0x1000 + rng.next() % 0x220;
        p.extend(addr.to_le_bytes().iter().take(n));
        p
    };
    match r % 20 {
        0..=4 => vec![((rng.next() as u8) | 0x80) & 0xfe],
        5 => ip(rng, 0x0d),
        6 => ip(rng, 0x11),
        7 => ip(rng, 0x01),
        8 => ip(rng, 0x1d),
        9 => vec![0x99, (rng.next() % 4) as u8],
        10 => vec![0x99, 0x20 | (rng.next() % 4) as u8],
        11 => vec![0x02, 0xf3],
        12 => PSB.to_vec(),
        13 => vec![0x02, 0x23],
        14 => vec![0x00],
        15 => {
            let mut p = vec![0x19];
            p.extend(rng.bytes(7));
            p
        }
        16 => vec![0x59, rng.next() as u8],
        17 => vec![0x03 | ((rng.next() as u8) << 3 & 0xf8)],
        18 => vec![0x02, 0x62 | ((rng.next() as u8) & 0x80)],
        _ => {
            let len = 1 + (rng.next() % 4) as usize;
            rng.bytes(len)
        }
    }
}

/// Code that is mostly branches and simple instructions.
pub(super) fn random_code(rng: &mut Rng) -> Vec<u8> {
    let mut code = Vec::new();
    while code.len() < 0x200 {
        let pieces: [&[u8]; 10] = [
            &[0x90],
            &[0xc3],
            &[0xff, 0xe0],
            &[0xff, 0xd0],
            &[0x0f, 0x05],
            &[0x48, 0xcf],
            &[0xcc],
            &[0x0f, 0x22, 0xd8],
            &[0xf3, 0x0f, 0xae, 0xe0],
            &[0x0f, 0x01, 0xc2],
        ];
        match rng.next() % 14 {
            10 => code.extend_from_slice(&[0x74, rng.next() as u8]),
            11 => code.extend_from_slice(&[0xeb, rng.next() as u8]),
            12 => {
                code.push(0xe8);
                code.extend_from_slice(&((rng.next() % 0x200) as i32 - 0x100).to_le_bytes());
            }
            13 => code.extend(rng.bytes(3)),
            n => code.extend_from_slice(pieces[(n % 10) as usize]),
        }
    }
    code
}

#[test]
fn random_packets_over_random_code_end_without_panics() {
    let started = std::time::Instant::now();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for round in 0..400 {
        let mut image = Image::new();
        image.add("random", random_code(&mut rng), 0x1000);
        let mut trace = PSB.to_vec();
        trace.extend_from_slice(&[0x99, 0x01, 0x7d, 0x00, 0x10, 0, 0, 0, 0, 0x02, 0x23]);
        for _ in 0..200 {
            trace.extend(random_packet(&mut rng));
        }
        let config = FlowConfig {
            tick_events: round % 2 == 0,
            end_on_call: round % 5 == 0,
            ..FlowConfig::default()
        };
        let counts = decode_counts(&trace, &image, config);
        assert!(counts.blocks < 10_000_000);
        let opts = crate::decode::pt::tools::ptxed_opts::PtxedOptions {
            flow: config,
            resync_on_error: round % 3 == 0,
            ..Default::default()
        };
        let mut out = String::new();
        crate::decode::pt::tools::ptxed::ptxed(&trace, &image, &opts, &mut out).unwrap();
    }
    assert!(
        started.elapsed().as_secs() < 120,
        "random decoding took too long"
    );
}

#[test]
fn random_traces_over_random_code_end_without_panics() {
    let started = std::time::Instant::now();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for round in 0..300 {
        let mut image = Image::new();
        image.add("random", rng.bytes(512), 0x1000);
        // Mostly random packets behind a PSB, so the decoder gets past the sync.
        let mut trace = PSB.to_vec();
        if round % 2 == 0 {
            trace.extend_from_slice(&[0x99, 0x01, 0x7d, 0x00, 0x10, 0, 0, 0, 0, 0x02, 0x23]);
        }
        trace.extend(rng.bytes(256));
        if round % 3 == 0 {
            trace.extend_from_slice(&PSB);
            trace.extend(rng.bytes(64));
        }
        let config = FlowConfig {
            tick_events: round % 4 == 0,
            ..FlowConfig::default()
        };
        let counts = decode_counts(&trace, &image, config);
        assert!(counts.blocks < 10_000_000);
    }
    assert!(
        started.elapsed().as_secs() < 120,
        "random decoding took too long"
    );
}

#[test]
fn branch_kinds_count_in_the_order_of_all() {
    for (i, kind) in BranchKind::ALL.iter().enumerate() {
        assert_eq!(kind.index(), i, "{kind:?}");
    }
}
