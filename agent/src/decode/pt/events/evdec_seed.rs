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

/// A seed: the event decoder's time and calibration at a PSB.
pub(crate) type Seed = Option<(Time, TimeCal)>;

/// What the event decoder's time is at each of `psbs` in a decode from the start, given
/// to `each` with the PSB's index as soon as the scan has passed it (every index once,
/// in order): the parallel decode's workers start while the scan goes on.
pub(crate) fn timing_each(
    trace: &[u8],
    config: &EventConfig,
    psbs: &[usize],
    each: &mut dyn FnMut(usize, Seed),
) {
    let mut next = 0;
    if let Some(pos) = sync::find_psb_forward(trace, 0) {
        next = scan(trace, config, psbs, pos, each);
    }
    for i in next..psbs.len() {
        each(i, None);
    }
}

/// [`timing_each`] from the first PSB at `pos`; how many of `psbs` it gave out.
fn scan(
    trace: &[u8],
    config: &EventConfig,
    psbs: &[usize],
    mut pos: usize,
    each: &mut dyn FnMut(usize, Seed),
) -> usize {
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
            each(next, None);
            next += 1;
        }
        if psbs.get(next) == Some(&pos) {
            each(next, Some((time, tcal)));
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
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every cut is given out once, in order, as the scan passes it: a PSB at a packet
    /// boundary with the time so far, one inside a packet or after a timing error or
    /// past the end as unknown.
    #[test]
    fn every_cut_is_given_out_once_in_order() {
        let psb: Vec<u8> = [0x02, 0x82].repeat(8);
        let psbend = [0x02, 0x23];
        // PSB+ | TNTs, PADs | PSB+ | a TSC, TNTs | PSB+ (at the end)
        let mut trace = psb.clone();
        trace.extend_from_slice(&psbend);
        trace.extend_from_slice(&[0x06, 0x00, 0x0a, 0x00, 0x00, 0x04]);
        let second = trace.len();
        trace.extend_from_slice(&psb);
        trace.extend_from_slice(&psbend);
        let tsc = trace.len();
        trace.extend_from_slice(&[0x19, 1, 0, 0, 0, 0, 0, 0]);
        trace.extend_from_slice(&[0x06, 0x06, 0x00]);
        let third = trace.len();
        trace.extend_from_slice(&psb);
        trace.extend_from_slice(&psbend);
        let cuts = [second, tsc + 1, third, trace.len() + 10];
        let mut given = Vec::new();
        timing_each(&trace, &EventConfig::default(), &cuts, &mut |i, seed| {
            given.push((i, seed.is_some()));
        });
        assert_eq!(given, [(0, true), (1, false), (2, true), (3, false)]);
        // The time at the third PSB has the TSC; at the second, none yet.
        let mut seeds = vec![None; cuts.len()];
        timing_each(&trace, &EventConfig::default(), &cuts, &mut |i, seed| {
            seeds[i] = seed;
        });
        let (at_second, at_third) = (seeds[0], seeds[2]);
        assert_ne!(at_second, at_third);
        assert_eq!(at_second, Some((Time::new(), TimeCal::new())));
        // No PSB at all: every cut unknown.
        let mut none = Vec::new();
        timing_each(
            &[0x06; 64],
            &EventConfig::default(),
            &cuts,
            &mut |i, seed| {
                none.push((i, seed.is_some()));
            },
        );
        assert_eq!(none, [(0, false), (1, false), (2, false), (3, false)]);
    }
}
