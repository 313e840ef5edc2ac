//! The time a decode from the start of a trace has at chosen PSBs, without decoding it.
//!
//! In: a trace, its [`EventConfig`] and PSB offsets (ascending). Out: for each offset,
//! the [`Time`] and [`TimeCal`] the event decoder holds when it reaches that PSB, or
//! `None` where this pass cannot tell (the offset is not a packet boundary of the walk,
//! or a packet or timing error came first: the decoder's recovery from one resets time).
//!
//! Why: a parallel decode's worker starts at a PSB, whose PSB+ restates everything but
//! the time (MTC and CYC count from the last TSC, the calibration from the whole trace
//! so far). This pass applies only the timing packets, reading TNT and TIP packets with
//! the fast path's parser, so it costs a fraction of a decode. A wrong seed costs only
//! speed: the parallel decoder takes a worker's events only when its state, time
//! included, equals the sequential decoder's.

use super::evdec::{EventConfig, apply_timing};
use crate::decode::pt::packets::packet::Packet;
use crate::decode::pt::packets::parse::{BlockContext, decode_packet};
use crate::decode::pt::packets::parse_hot::{Hot, hot_packet, skip_one_byte_packets, skip_pads};
use crate::decode::pt::packets::sync;
use crate::decode::pt::timing::time::{Time, TimeCal};

/// What the event decoder's time is at each of `psbs` in a decode from the start.
pub(crate) fn timing_at(
    trace: &[u8],
    config: &EventConfig,
    psbs: &[usize],
) -> Vec<Option<(Time, TimeCal)>> {
    let mut seeds = vec![None; psbs.len()];
    let Some(mut pos) = sync::find_psb_forward(trace, 0) else {
        return seeds;
    };
    let (mut time, mut tcal) = (Time::new(), TimeCal::new());
    let mut block = BlockContext::None;
    let mut in_psb = false;
    let mut next = 0;
    while next < psbs.len() {
        // (PSBs, whose header is 0x02, stop the skip.)
        pos = if block == BlockContext::None {
            skip_one_byte_packets(trace, pos)
        } else {
            skip_pads(trace, pos)
        };
        while psbs.get(next).is_some_and(|&psb| psb < pos) {
            next += 1;
        }
        if psbs.get(next) == Some(&pos) {
            if let Some(seed) = seeds.get_mut(next) {
                *seed = Some((time, tcal));
            }
            next += 1;
        }
        if block == BlockContext::None {
            match hot_packet(trace, pos) {
                Hot::Tnt { size, .. } | Hot::Tip { size, .. } => {
                    pos += size;
                    continue;
                }
                Hot::Other => {}
            }
        }
        let Ok(decoded) = decode_packet(trace, pos, config.errata(), block) else {
            // The decoder synchronizes at the next PSB, with fresh time.
            let Some(psb) = sync::find_psb_forward(trace, pos + 1) else {
                break;
            };
            (pos, block, in_psb) = (psb, BlockContext::None, false);
            (time, tcal) = (Time::new(), TimeCal::new());
            continue;
        };
        let packet = decoded.packet;
        match packet {
            Packet::Psb => in_psb = true,
            Packet::PsbEnd => in_psb = false,
            // The overflow decoder starts over, keeping time (and, on request, the
            // calibration).
            Packet::Ovf => {
                in_psb = false;
                if config.keep_tcal_on_ovf {
                    tcal.update_ovf();
                } else {
                    tcal = TimeCal::new();
                }
            }
            // A timing error makes the decoder recover in ways this pass cannot follow.
            Packet::Tsc { .. }
            | Packet::Tma { .. }
            | Packet::Mtc { .. }
            | Packet::Cyc { .. }
            | Packet::Cbr { .. }
                if apply_timing(&mut time, &mut tcal, &config.timing, &packet, in_psb).is_err() =>
            {
                break;
            }
            _ => {}
        }
        block = block.after(&packet);
        pos += decoded.size;
    }
    seeds
}
