//! Unit tests of the byte decoder: one per tricky encoding, plus robustness on noise.

use super::*;
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::packet::{IpCompression, Packet, PacketKind};

const PSB: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];
const PSBEND: [u8; 2] = [0x02, 0x23];

fn decode(bytes: &[u8]) -> Result<Decoded, PacketError> {
    decode_packet(bytes, 0, Errata::default(), BlockContext::None)
}

fn packets(trace: &[u8]) -> Vec<Result<(usize, Packet), PacketError>> {
    PacketDecoder::new(trace, Errata::default()).collect()
}

/// A small xorshift generator: deterministic noise without a dependency.
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next().to_le_bytes()[3]).collect()
    }
}

#[test]
fn each_ip_compression_has_its_size_and_payload() {
    let payload = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];
    let cases = [
        (0u8, IpCompression::Suppressed, 1, 0),
        (1, IpCompression::Update16, 3, 0x2211),
        (2, IpCompression::Update32, 5, 0x4433_2211),
        (3, IpCompression::Sext48, 7, 0x6655_4433_2211),
        (4, IpCompression::Update48, 7, 0x6655_4433_2211),
        (6, IpCompression::Full, 9, 0x8877_6655_4433_2211),
    ];
    for (ipc, compression, size, ip) in cases {
        // TIP (0x0d), TIP.PGE (0x11), TIP.PGD (0x01), FUP (0x1d).
        for (opcode, kind) in [
            (0x0d, PacketKind::Tip),
            (0x11, PacketKind::TipPge),
            (0x01, PacketKind::TipPgd),
            (0x1d, PacketKind::Fup),
        ] {
            let mut bytes = vec![opcode | (ipc << 5)];
            bytes.extend_from_slice(&payload);
            let decoded = decode(&bytes).unwrap();
            assert_eq!(decoded.size, size, "ipc {ipc}");
            assert_eq!(decoded.packet.kind(), kind);
            let got = decoded.packet.ip_payload().unwrap();
            assert_eq!((got.compression, got.ip), (compression, ip), "ipc {ipc}");
            // One byte short of the payload is a truncation, not a misread.
            let short = decode(&bytes[..size - 1]);
            if size > 1 {
                assert!(short.unwrap_err().is_truncated());
            }
        }
    }
    for reserved in [5u8, 7] {
        let err = decode(&[0x0d | (reserved << 5), 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err();
        assert!(matches!(
            err,
            PacketError::BadPayload {
                kind: PacketKind::Tip,
                ..
            }
        ));
    }
}

#[test]
fn cyc_payload_spans_extension_bytes() {
    // 0x1234 = 10100 (5 bits in the header) 0010001 (7 bits) 1 (7 bits).
    let decoded = decode(&[(0x14 << 3) | 0x7, (0x11 << 1) | 1, 1 << 1]).unwrap();
    assert_eq!(decoded.packet, Packet::Cyc { value: 0x1234 });
    assert_eq!(decoded.size, 3);
    // A one-byte CYC.
    assert_eq!(
        decode(&[(5 << 3) | 0x3]).unwrap().packet,
        Packet::Cyc { value: 5 }
    );
    // The extension bit of the last byte points past the end of the trace.
    assert!(decode(&[0x07, 0x01]).unwrap_err().is_truncated());
    // Nine extension bytes would need more than 64 payload bits.
    let mut long = vec![0x07];
    long.extend([0x03; 9]);
    long.push(0x02);
    assert!(matches!(
        decode(&long).unwrap_err(),
        PacketError::BadPayload {
            kind: PacketKind::Cyc,
            ..
        }
    ));
}

#[test]
fn tnt_packets_keep_branch_order_and_count() {
    // TNT-8: stop bit then taken, not taken, taken (oldest first).
    let decoded = decode(&[0b0001_1010]).unwrap();
    let Packet::Tnt8(tnt) = decoded.packet else {
        panic!("not tnt.8: {decoded:?}")
    };
    assert_eq!(tnt.count, 3);
    assert_eq!(tnt.outcomes().collect::<Vec<_>>(), [true, false, true]);

    // TNT-64 with all 47 bits: the stop bit is bit 47 of the 48-bit payload.
    let payload: u64 = (1 << 47) | 0x5555_5555_5555;
    let mut bytes = vec![0x02, 0xa3];
    bytes.extend_from_slice(&payload.to_le_bytes()[..6]);
    let decoded = decode(&bytes).unwrap();
    assert_eq!(decoded.size, 8);
    let Packet::Tnt64(tnt) = decoded.packet else {
        panic!("not tnt.64: {decoded:?}")
    };
    assert_eq!(tnt.count, 47);
    assert_eq!(tnt.bits, 0x5555_5555_5555);
    let outcomes: Vec<bool> = tnt.outcomes().collect();
    assert_eq!(outcomes.len(), 47);
    assert!(outcomes[0] && !outcomes[1] && outcomes[46]);

    // No stop bit at all is not a TNT.
    assert!(matches!(
        decode(&[0x02, 0xa3, 0, 0, 0, 0, 0, 0]).unwrap_err(),
        PacketError::BadPayload {
            kind: PacketKind::Tnt64,
            ..
        }
    ));
}

#[test]
fn fixed_payload_packets_decode_their_fields() {
    let tsc = decode(&[0x19, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert_eq!(
        tsc.packet,
        Packet::Tsc {
            tsc: 0x0007_0605_0403_0201
        }
    );
    let pip = decode(&[0x02, 0x43, 0x41, 0x0, 0x1, 0, 0, 0]).unwrap();
    assert_eq!(
        pip.packet,
        Packet::Pip(Pip {
            cr3: 0x10_0400,
            nr: true
        })
    );
    let tma = decode(&[0x02, 0x73, 0x34, 0x12, 0, 0xff, 0x01]).unwrap();
    assert_eq!(
        tma.packet,
        Packet::Tma {
            ctc: 0x1234,
            fc: 0x1ff
        }
    );
    let mnt = decode(&[0x02, 0xc3, 0x88, 1, 0, 0, 0, 0, 0, 0, 0x80]).unwrap();
    assert_eq!(
        mnt.packet,
        Packet::Mnt {
            payload: 0x8000_0000_0000_0001
        }
    );
    let trig = decode(&[0xd9, 0xe0, 0xa1, 0x17, 0x00]).unwrap();
    assert_eq!(trig.size, 5);
    assert_eq!(
        trig.packet,
        Packet::Trig(Trig {
            trbv: 0xa1,
            ip: true,
            mult: true,
            icnt: Some(0x17)
        })
    );
    let ptw = decode(&[0x02, 0xb2, 1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
    assert_eq!(ptw.size, 10);
    assert!(matches!(
        ptw.packet,
        Packet::Ptw(Ptw {
            plc: 1,
            ip: true,
            ..
        })
    ));
    assert!(
        decode(&[0x02, 0xd2, 0, 0, 0, 0]).is_err(),
        "reserved PTW size"
    );
}

#[test]
fn unknown_opcodes_are_reported_with_their_bytes() {
    let err = decode(&[0x09]).unwrap_err();
    assert!(matches!(err, PacketError::UnknownOpcode { offset: 0, .. }));
    let err = decode_packet(
        &[0, 0, 0x02, 0x04],
        2,
        Errata::default(),
        BlockContext::None,
    );
    let err = err.unwrap_err();
    assert_eq!(err.offset(), 2);
    assert!(err.to_string().contains("0x02 0x04"), "{err}");
    let err = decode(&[0x02, 0xc3, 0x00]).unwrap_err();
    assert!(err.to_string().contains("0x02 0xc3 0x00"), "{err}");
}

#[test]
fn block_packets_switch_bip_decoding_on_and_off() {
    let mut trace = PSB.to_vec();
    trace.extend([0x02, 0x63, 0x84]); // BBP: type 4, 4-byte items
    trace.extend([0x0c, 1, 2, 3, 4]); // BIP id 1
    trace.extend([0x02, 0x33]); // BEP
    trace.push(0x0c); // now a TNT-8
    let kinds: Vec<PacketKind> = packets(&trace)
        .into_iter()
        .map(|p| p.unwrap().1.kind())
        .collect();
    assert_eq!(
        kinds,
        [
            PacketKind::Psb,
            PacketKind::Bbp,
            PacketKind::Bip,
            PacketKind::Bep,
            PacketKind::Tnt8
        ]
    );
    let bip = decode_packet(&trace, 19, Errata::default(), BlockContext::Items4).unwrap();
    assert_eq!(
        bip.packet,
        Packet::Bip(Bip {
            id: 1,
            value: 0x0403_0201
        })
    );
}

#[test]
fn errata_change_what_some_bytes_mean() {
    let skz84 = Errata {
        skz84: true,
        ..Errata::default()
    };
    let bad_tma = [0x02, 0x73, 0, 0, 1, 0, 0, 0];
    assert!(decode(&bad_tma).is_err());
    let decoded = decode_packet(&bad_tma, 0, skz84, BlockContext::None).unwrap();
    assert_eq!((decoded.packet, decoded.size), (Packet::Corrupted, 8));

    let skd007 = Errata {
        skd007: true,
        ..Errata::default()
    };
    // A 2-byte CYC whose second byte is 0x02, then 0xf3: an OVF split by SKD007.
    let split = [0x07, 0x02, 0xf3];
    assert!(matches!(decode(&split).unwrap().packet, Packet::Cyc { .. }));
    let decoded = decode_packet(&split, 0, skd007, BlockContext::None).unwrap();
    assert_eq!((decoded.packet, decoded.size), (Packet::Ovf, 3));
}

#[test]
fn iterator_syncs_to_the_first_psb_when_the_trace_starts_mid_packet() {
    // The tail of a TSC and a FUP cut off by the start of the buffer, then PSB+.
    let mut trace = vec![0x44, 0x55, 0x66, 0x00, 0x10, 0x00];
    trace.extend(PSB);
    trace.extend([0x1d | (3 << 5), 0x00, 0x10, 0, 0, 0, 0]);
    trace.extend(PSBEND);
    let items = packets(&trace);
    assert_eq!(items[0], Ok((6, Packet::Psb)));
    assert!(matches!(items[1], Ok((22, Packet::Fup(_)))));
    assert_eq!(items[2], Ok((29, Packet::PsbEnd)));
    assert_eq!(items.len(), 3);
}

#[test]
fn no_psb_at_all_is_one_error_with_an_offset() {
    let items = packets(&[0x0d, 0x00, 0x99, 0x01, 0x02, 0x23]);
    assert_eq!(items, [Err(PacketError::NoSync { offset: 0 })]);
    assert_eq!(packets(&[]), [Err(PacketError::NoSync { offset: 0 })]);
    let mut decoder = PacketDecoder::new(&[1, 2, 3], Errata::default());
    assert!(matches!(
        decoder.next_packet(),
        Some(Err(PacketError::NoSync { .. }))
    ));
}

#[test]
fn a_truncated_packet_at_the_end_is_an_error_then_the_end() {
    let mut trace = PSB.to_vec();
    trace.extend([0x19, 1, 2, 3]); // a TSC needs 8 bytes
    let items = packets(&trace);
    assert_eq!(items.len(), 2);
    let err = items[1].unwrap_err();
    assert_eq!(err.offset(), 16);
    assert!(err.is_truncated());
    assert!(err.to_string().contains("tsc"), "{err}");
}

#[test]
fn an_error_is_followed_by_the_next_psb() {
    let mut trace = PSB.to_vec();
    trace.extend([0x02, 0x04]); // unknown extended opcode
    trace.extend([0x00; 3]);
    trace.extend(PSB);
    trace.extend(PSBEND);
    let items = packets(&trace);
    assert_eq!(items[0], Ok((0, Packet::Psb)));
    assert!(matches!(
        items[1],
        Err(PacketError::UnknownOpcode { offset: 16, .. })
    ));
    assert_eq!(items[2], Ok((21, Packet::Psb)));
    assert_eq!(items[3], Ok((37, Packet::PsbEnd)));
    assert_eq!(items.len(), 4);
}

#[test]
fn no_sync_mode_decodes_from_the_given_offset() {
    let trace = [0x02, 0x23, 0x00, 0x59, 0x12];
    let mut decoder = PacketDecoder::new(&trace, Errata::default());
    decoder.sync_set(0).unwrap();
    let items: Vec<_> = decoder.collect();
    assert_eq!(
        items,
        [
            Ok((0, Packet::PsbEnd)),
            Ok((2, Packet::Pad)),
            Ok((3, Packet::Mtc { ctc: 0x12 }))
        ]
    );
    let mut decoder = PacketDecoder::new(&trace, Errata::default());
    assert!(decoder.sync_set(6).is_err());
}

#[test]
fn random_bytes_never_panic_or_hang() {
    let mut noise = Noise(0x9e37_79b9_7f4a_7c15);
    let all = Errata {
        skd007: true,
        skz84: true,
        ..Errata::default()
    };
    for round in 0..400 {
        let len = usize::try_from(noise.next() % 300).unwrap();
        let mut trace = noise.bytes(len);
        // Sprinkle PSBs so that resyncing is exercised too.
        if round % 2 == 0 && len > 40 {
            let at = usize::try_from(noise.next() % (len as u64 - 16)).unwrap();
            trace[at..at + 16].copy_from_slice(&PSB);
        }
        for errata in [Errata::default(), all] {
            let items: Vec<_> = PacketDecoder::new(&trace, errata).collect();
            assert!(items.len() <= trace.len() + 1);
            for item in &items {
                let offset = match item {
                    Ok((offset, _)) => *offset,
                    Err(err) => err.offset(),
                };
                assert!(offset <= trace.len());
            }
            for offset in 0..=trace.len() {
                for block in [
                    BlockContext::None,
                    BlockContext::Items4,
                    BlockContext::Items8,
                ] {
                    if let Ok(decoded) = decode_packet(&trace, offset, errata, block) {
                        assert!(decoded.size >= 1 && offset + decoded.size <= trace.len());
                    }
                }
            }
        }
    }
}

/// Payloads read a word at once read as byte by byte: every length, at every position
/// up to the end of the bytes (where fewer than eight are left).
#[test]
fn payloads_read_alike_a_word_or_a_byte_at_a_time() {
    let bytes: Vec<u8> = (1..=20u8).map(|b| b.wrapping_mul(13)).collect();
    for at in 0..=bytes.len() {
        for len in 0..=8 {
            assert_eq!(
                le(&bytes, at, len),
                le_bytewise(&bytes, at, len),
                "at {at}, {len} bytes"
            );
        }
    }
    assert_eq!(le(&bytes, 0, 2), 0x1a0d);
}
