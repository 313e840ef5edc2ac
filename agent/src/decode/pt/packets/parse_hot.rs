//! The packets of the decode fast path, read straight from the trace bytes.
//!
//! In: a trace and an offset at a packet boundary outside a BBP block. Out: TNT and TIP
//! packets ([`Hot`]), the only ones that carry control flow between two PSBs in a typical
//! trace, decoded exactly as [`super::parse::decode_packet`] would, without its error
//! reporting or the `Packet` enum; [`Hot::Other`] for anything else (the caller then
//! leaves the packet to the general decoder). [`skip_pads`] steps over PAD bytes.

use super::packet::{IpCompression, IpPayload};

/// A packet the fast path handles itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hot {
    /// A short or long TNT: `count` outcomes in the low bits of `bits`, oldest highest.
    Tnt { bits: u64, count: u8, size: usize },
    /// A TIP (possibly with a suppressed IP).
    Tip { payload: IpPayload, size: usize },
    /// Any other packet, a truncated one, or the end of the trace.
    Other,
}

/// Reads the packet at `pos`, if it is a TNT or a TIP.
#[expect(
    clippy::inline_always,
    reason = "called once per trace event in the decode fast loop, which keeps its \
              registers only if this is inlined"
)]
#[inline(always)]
pub(crate) fn hot_packet(trace: &[u8], pos: usize) -> Hot {
    let Some(&opc) = trace.get(pos) else {
        return Hot::Other;
    };
    if opc & 1 == 0 {
        // 0x00 is PAD, 0x02 the extended opcode; any other even byte is a short TNT.
        if opc > 2 {
            return tnt(u64::from(opc >> 1), 1);
        }
        if opc == 2
            && let Some(bytes) = trace.get(pos..pos.saturating_add(8))
            && bytes[1] == 0xa3
        {
            let mut word = [0u8; 8];
            word[..6].copy_from_slice(&bytes[2..8]);
            return tnt(u64::from_le_bytes(word), 8);
        }
        return Hot::Other;
    }
    if opc & 0x1f != TIP {
        return Hot::Other;
    }
    match ip_payload(trace, pos, opc) {
        Some((payload, size)) => Hot::Tip { payload, size },
        None => Hot::Other,
    }
}

/// The low five bits of a TIP's header byte (the top three give the IP compression).
pub(crate) const TIP: u8 = 0x0d;
/// ... of a TIP.PGE's.
pub(crate) const TIP_PGE: u8 = 0x11;
/// ... of a TIP.PGD's.
pub(crate) const TIP_PGD: u8 = 0x01;

/// Reads the packet at `pos` if it is the IP packet whose header byte has `code` in its
/// low five bits ([`TIP`], [`TIP_PGE`], [`TIP_PGD`]): its payload and size; `None` for
/// any other packet, a reserved compression, or a truncated one (as the general decoder
/// reads it; `ip_packets_decode_as_the_general_decoder_does`).
#[inline]
pub(crate) fn ip_packet(trace: &[u8], pos: usize, code: u8) -> Option<(IpPayload, usize)> {
    let &opc = trace.get(pos)?;
    if opc & 0x1f != code {
        return None;
    }
    ip_payload(trace, pos, opc)
}

/// The payload and size of the IP packet at `pos`, whose header byte is `opc`.
#[expect(
    clippy::inline_always,
    reason = "part of `hot_packet`, which the fast loop keeps its registers around"
)]
#[inline(always)]
fn ip_payload(trace: &[u8], pos: usize, opc: u8) -> Option<(IpPayload, usize)> {
    let compression = IpCompression::from_bits(opc >> 5)?;
    let len = compression.payload_len();
    let bytes = trace.get(pos + 1..pos.saturating_add(1 + len))?;
    // One 8-byte load where the trace goes on that far (a copy of `len` bytes was a
    // memcpy call per TIP).
    let ip = match trace
        .get(pos + 1..pos.saturating_add(9))
        .map(<[u8; 8]>::try_from)
    {
        Some(Ok(word)) => {
            let bits = u32::try_from(8 * len).unwrap_or(64);
            u64::from_le_bytes(word) & u64::MAX.checked_shr(64 - bits).unwrap_or(0)
        }
        _ => bytes.iter().rev().fold(0, |ip, &b| ip << 8 | u64::from(b)),
    };
    Some((IpPayload { compression, ip }, 1 + len))
}

/// A TNT payload ends with a stop bit; the bits below it are the outcomes.
#[inline]
fn tnt(payload: u64, size: usize) -> Hot {
    if payload < 2 {
        return Hot::Other;
    }
    let count = payload.ilog2();
    Hot::Tnt {
        bits: payload & !(1 << count),
        count: u8::try_from(count).unwrap_or(u8::MAX),
        size,
    }
}

/// The offset of the first byte at or after `pos` that is not a PAD.
#[inline]
pub(crate) fn skip_pads(trace: &[u8], mut pos: usize) -> usize {
    while trace.get(pos) == Some(&0) {
        pos += 1;
    }
    pos
}

/// [`skip_pads`] eight bytes at a time, for the event layer: KVM-PT pads its PSB+ with
/// runs of PADs (a third of qemu's trace), where the fast path sees one or two PADs
/// between TNTs and TIPs and is quicker byte by byte.
pub(crate) fn skip_pad_runs(trace: &[u8], mut pos: usize) -> usize {
    while let Some(word) = trace
        .get(pos..pos + 8)
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
    {
        let word = u64::from_le_bytes(word);
        if word != 0 {
            return pos + (word.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    // The last bytes, fewer than eight.
    skip_pads(trace, pos)
}

/// Steps over PADs and short TNTs (every even byte but 0x02, the extended opcode), eight
/// bytes at a time: for passes that need no TNT outcome, such as the parallel decode's
/// timing scan (`evdec_seed`), where qemu's real trace is mostly these one-byte packets
/// (a third of it PAD) and a packet at a time cost ~12 instructions a byte. Only outside
/// a BBP block, where every byte is a packet header.
pub(crate) fn skip_one_byte_packets(trace: &[u8], mut pos: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    while let Some(word) = trace
        .get(pos..pos + 8)
        .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
    {
        let word = u64::from_le_bytes(word);
        // Bit 7 of each byte that stops the run: odd, or 0x02 (a zero byte of
        // `word ^ 0x02..`, found by the borrow of a subtraction; it can also mark the
        // bytes above a true one, never one below, so the lowest mark is right).
        let twos = word ^ (ONES * 2);
        let stops = ((word & ONES) << 7) | (twos.wrapping_sub(ONES) & !twos & (ONES << 7));
        if stops != 0 {
            return pos + (stops.trailing_zeros() / 8) as usize;
        }
        pos += 8;
    }
    while trace.get(pos).is_some_and(|&b| b & 1 == 0 && b != 2) {
        pos += 1;
    }
    pos
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pt::packets::cpu::Errata;
    use crate::decode::pt::packets::packet::Packet;
    use crate::decode::pt::packets::parse::{BlockContext, decode_packet};

    /// What the general decoder makes of the bytes, in the fast path's terms.
    fn general(trace: &[u8]) -> Hot {
        match decode_packet(trace, 0, Errata::default(), BlockContext::None) {
            Ok(d) => match d.packet {
                Packet::Tnt8(t) | Packet::Tnt64(t) => Hot::Tnt {
                    bits: t.bits,
                    count: t.count,
                    size: d.size,
                },
                Packet::Tip(payload) => Hot::Tip {
                    payload,
                    size: d.size,
                },
                _ => Hot::Other,
            },
            Err(_) => Hot::Other,
        }
    }

    #[test]
    fn hot_packets_decode_as_the_general_decoder_does() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for first in 0..=255u8 {
            for len in 0..10 {
                let mut bytes = vec![first];
                bytes.extend((1..len).map(|_| next().to_le_bytes()[0]));
                cases.push(bytes.clone());
                // Long TNTs, with payloads of every length.
                bytes[0] = 2;
                if let Some(b) = bytes.get_mut(1) {
                    *b = 0xa3;
                }
                for zero in 2..bytes.len() {
                    let mut short = bytes.clone();
                    short[zero..].fill(0);
                    cases.push(short);
                }
                cases.push(bytes);
            }
        }
        for bytes in &cases {
            assert_eq!(hot_packet(bytes, 0), general(bytes), "{bytes:02x?}");
        }
    }

    #[test]
    fn ip_packets_decode_as_the_general_decoder_does() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for first in 0..=255u8 {
            for len in 0..12 {
                let mut bytes = vec![first];
                bytes.extend((1..len).map(|_| next().to_le_bytes()[0]));
                let general = decode_packet(&bytes, 0, Errata::default(), BlockContext::None)
                    .ok()
                    .map(|d| (d.packet, d.size));
                for (code, make) in [
                    (TIP, Packet::Tip as fn(IpPayload) -> Packet),
                    (TIP_PGE, Packet::TipPge),
                    (TIP_PGD, Packet::TipPgd),
                ] {
                    let want = general.filter(|(p, _)| {
                        std::mem::discriminant(p)
                            == std::mem::discriminant(&make(IpPayload {
                                compression: IpCompression::Suppressed,
                                ip: 0,
                            }))
                    });
                    let got =
                        ip_packet(&bytes, 0, code).map(|(payload, size)| (make(payload), size));
                    assert_eq!(got, want, "{bytes:02x?} as {code:#x}");
                }
            }
        }
    }

    #[test]
    fn pads_are_skipped_up_to_the_next_packet_or_the_end() {
        assert_eq!(skip_pads(&[0, 0, 4], 0), 2);
        assert_eq!(skip_pads(&[4, 0], 1), 2);
        assert_eq!(skip_pads(&[], 0), 0);
        // Runs of every length, ending at every byte position of a word, or at the end.
        for len in 0..40 {
            for start in 0..3 {
                let mut trace = vec![0u8; start + len];
                assert_eq!(skip_pad_runs(&trace, start), start + len);
                trace.extend([0x02, 0x00, 0x00]);
                assert_eq!(skip_pad_runs(&trace, start), start + len);
                assert_eq!(skip_pad_runs(&trace, start), skip_pads(&trace, start));
            }
        }
    }

    #[test]
    fn one_byte_packets_are_skipped_as_a_byte_at_a_time_would() {
        let slow = |trace: &[u8], mut pos: usize| {
            while trace.get(pos).is_some_and(|&b| b & 1 == 0 && b != 2) {
                pos += 1;
            }
            pos
        };
        // A linear congruential generator, its high bits taken.
        let mut state = 1u64;
        let mut next = move || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            state >> 33
        };
        for round in 0..2000 {
            let len = usize::try_from(next() % 40).unwrap_or(0);
            // Mostly stepping bytes (short TNTs, PADs), with 0x02 and odd bytes between.
            let trace: Vec<u8> = (0..len)
                .map(|_| match next() % 16 {
                    0 => 0x02,
                    1 => 0x03 | u8::try_from(next() % 0x80).unwrap_or(0) << 1,
                    2..=5 => 0x00,
                    _ => u8::try_from(next() % 0x7e + 2).unwrap_or(4) << 1,
                })
                .collect();
            for pos in 0..=len {
                assert_eq!(
                    skip_one_byte_packets(&trace, pos),
                    slow(&trace, pos),
                    "round {round}: {trace:02x?} from {pos}"
                );
            }
        }
    }
}
