//! The time a decode from the start of a trace has at chosen PSBs, without decoding it.
//!
//! In: a trace, its [`EventConfig`] and PSB offsets (ascending). Out: for each offset
//! asked for ([`TimingScan::seed`]), the [`Time`] and [`TimeCal`] the event decoder
//! holds when it reaches that PSB, or `None` where this pass cannot tell (the offset is
//! not a packet boundary of the walk, or a packet or timing error came first: the
//! decoder's recovery from one resets time). The scan goes only as far as asked.
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

/// The scan, as far as it has gone: it goes on only as far as a seed asked for needs,
/// so that the parallel decode's workers run it between their pieces (each part once)
/// instead of a thread of its own competing with them for the cores.
pub(crate) struct TimingScan<'a> {
    trace: &'a [u8],
    config: EventConfig,
    /// The PSBs to give seeds for, ascending.
    psbs: Vec<usize>,
    /// The seeds of the PSBs the scan has passed, in order.
    seeds: Vec<Seed>,
    /// Where the scan reads next; `None` once it has ended (no PSB, or no PSB to go on
    /// at after an error): every PSB not passed is unknown.
    pos: Option<usize>,
    time: Time,
    tcal: TimeCal,
    block: BlockContext,
    in_psb: bool,
    /// CBR packets a local scan read ([`local_seed`]).
    cbrs: usize,
}

impl<'a> TimingScan<'a> {
    /// A scan of `trace` for the time at each of `psbs` (ascending), not started yet.
    pub(crate) fn new(trace: &'a [u8], config: EventConfig, psbs: Vec<usize>) -> Self {
        Self::starting_at(trace, config, psbs, sync::find_psb_forward(trace, 0))
    }

    /// A scan that starts at `pos` (a PSB) with fresh time.
    fn starting_at(
        trace: &'a [u8],
        config: EventConfig,
        psbs: Vec<usize>,
        pos: Option<usize>,
    ) -> Self {
        Self {
            trace,
            config,
            seeds: Vec::with_capacity(psbs.len()),
            psbs,
            pos,
            time: Time::new(),
            tcal: TimeCal::new(),
            block: BlockContext::None,
            in_psb: false,
            cbrs: 0,
        }
    }

    /// The event decoder's time at `psbs[i]` in a decode from the start (`None`:
    /// unknown), scanning on to it if the scan has not passed it yet.
    pub(crate) fn seed(&mut self, i: usize) -> Seed {
        if self.seeds.len() <= i && i < self.psbs.len() && !self.scan_past::<false>(i) {
            // The scan ended: every PSB it did not pass is unknown.
            self.pos = None;
            self.seeds.resize(self.psbs.len(), None);
        }
        self.seeds.get(i).copied().flatten()
    }

    /// Scans on until `psbs[i]` has its seed; false if the scan ended first. The state
    /// in locals while it runs, as one loop (kept in registers). `LOCAL`
    /// ([`local_seed`]): ends (false) at any timing packet but a CBR, at an overflow and
    /// at a packet it cannot read, and counts the CBRs in `cbrs`.
    fn scan_past<const LOCAL: bool>(&mut self, i: usize) -> bool {
        let (trace, config) = (self.trace, &self.config);
        let Some(mut pos) = self.pos else {
            return false;
        };
        let (mut time, mut tcal) = (self.time, self.tcal);
        let (mut block, mut in_psb) = (self.block, self.in_psb);
        let psbs = self.psbs.as_slice();
        let seeds = &mut self.seeds;
        while seeds.len() <= i {
            // (PSBs, whose header is 0x02, stop the skip.)
            pos = if block == BlockContext::None {
                skip_one_byte_packets(trace, pos)
            } else {
                skip_pads(trace, pos)
            };
            while psbs.get(seeds.len()).is_some_and(|&psb| psb < pos) {
                seeds.push(None);
            }
            if psbs.get(seeds.len()) == Some(&pos) {
                seeds.push(Some((time, tcal)));
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
                if LOCAL {
                    return false;
                }
                // The decoder synchronizes at the next PSB, with fresh time.
                let Some(psb) = sync::find_psb_forward(trace, pos + 1) else {
                    return false;
                };
                (pos, block, in_psb) = (psb, BlockContext::None, false);
                (time, tcal) = (Time::new(), TimeCal::new());
                continue;
            };
            let packet = decoded.packet;
            if LOCAL {
                match packet {
                    Packet::Cbr { .. } => self.cbrs += 1,
                    Packet::Tsc { .. }
                    | Packet::Tma { .. }
                    | Packet::Mtc { .. }
                    | Packet::Cyc { .. }
                    | Packet::Ovf => return false,
                    _ => {}
                }
            }
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
                // A timing error makes the decoder recover in ways this pass cannot
                // follow.
                Packet::Tsc { .. }
                | Packet::Tma { .. }
                | Packet::Mtc { .. }
                | Packet::Cyc { .. }
                | Packet::Cbr { .. }
                    if apply_timing(&mut time, &mut tcal, &config.timing, &packet, in_psb)
                        .is_err() =>
                {
                    return false;
                }
                _ => {}
            }
            block = block.after(&packet);
            pos += decoded.size;
        }
        self.pos = Some(pos);
        (self.time, self.tcal, self.block, self.in_psb) = (time, tcal, block, in_psb);
        true
    }
}

/// Bytes before a cut where [`local_seed`] looks for a PSB to start at.
const LOCAL_WINDOWS: [usize; 2] = [4 << 10, 64 << 10];

/// The seed at the PSB at `cut` from the trace just before it alone, where that is what
/// a decode from the start has there too; `None` where it cannot tell (then
/// [`TimingScan`] scans from the start).
///
/// When: a scan from a PSB shortly before `cut`, with fresh time, that reads a CBR and
/// no other timing packet (no TSC, TMA, MTC or CYC: a trace without them, as KVM-PT's
/// are; a TSC-enabled trace has a TSC in every PSB+, a CYC-enabled one CYCs at almost
/// every branch), no overflow and nothing it cannot read, with no nominal frequency
/// configured (a CBR then leaves the calibration alone). The time such a trace has
/// anywhere is its last CBR, which every PSB+ restates. Why: the scan from the start
/// is 8 % of a two-thread decode's work on qemu's real trace (2 MiB), and the piece
/// after the first waits for it (mruby's: ~1 ms of its 5.5). A seed that is wrong
/// anyway (a trace whose MTCs are too sparse to show in the window) costs only speed:
/// the stitch compares the time.
pub(crate) fn local_seed(trace: &[u8], config: EventConfig, cut: usize) -> Option<Seed> {
    if config.timing.nom_freq != 0 {
        return None;
    }
    let from = LOCAL_WINDOWS.iter().find_map(|&window| {
        sync::find_psb_forward(trace, cut.saturating_sub(window)).filter(|&psb| psb < cut)
    })?;
    let mut scan = TimingScan::starting_at(trace, config, vec![cut], Some(from));
    let passed = scan.scan_past::<true>(0);
    match scan.seeds.first() {
        Some(&Some(seed)) if passed && scan.cbrs > 0 => Some(Some(seed)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PSB at a packet boundary gets the time so far, one inside a packet or after a
    /// timing error or past the end none; in whatever order the seeds are asked for.
    #[test]
    fn each_cut_gets_the_time_so_far_in_whatever_order_it_is_asked() {
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
        let seeds = |asked: &[usize]| {
            let mut scan = TimingScan::new(&trace, EventConfig::default(), cuts.to_vec());
            let mut seeds = vec![None; cuts.len()];
            for &i in asked {
                seeds[i] = scan.seed(i);
            }
            seeds
        };
        let all = seeds(&[0, 1, 2, 3]);
        let known: Vec<bool> = all.iter().map(Option::is_some).collect();
        assert_eq!(known, [true, false, true, false]);
        // Asked out of order, or for a later one first: the same seeds.
        assert_eq!(seeds(&[2, 0, 3, 1]), all);
        assert_eq!(seeds(&[3, 2, 1, 0]), all);
        // The time at the third PSB has the TSC; at the second, none yet.
        let (at_second, at_third) = (all[0], all[2]);
        assert_ne!(at_second, at_third);
        assert_eq!(at_second, Some((Time::new(), TimeCal::new())));
        // No PSB at all: every cut unknown.
        let mut scan = TimingScan::new(&[0x06; 64], EventConfig::default(), cuts.to_vec());
        assert!((0..cuts.len()).all(|i| scan.seed(i).is_none()));
    }

    /// PSB+ (with a CBR of `ratio`, if any), `pads` PADs, a TNT, then `extra`; returns
    /// where the PSB is.
    fn stretch(trace: &mut Vec<u8>, ratio: Option<u8>, pads: usize, extra: &[u8]) -> usize {
        let at = trace.len();
        trace.extend_from_slice(&[0x02, 0x82].repeat(8));
        if let Some(ratio) = ratio {
            trace.extend_from_slice(&[0x02, 0x03, ratio, 0x00]);
        }
        trace.extend_from_slice(&[0x02, 0x23]);
        trace.extend(std::iter::repeat_n(0x00, pads));
        trace.push(0x06);
        trace.extend_from_slice(extra);
        at
    }

    /// Where CBRs are all the timing, the seed from a PSB shortly before a cut is the
    /// scan from the start's: the last CBR (in PSB+ or not), at every cut, whether the
    /// local scan starts at the first PSB or at a later one (PSBs 3 KB apart, a window
    /// of 4 KiB).
    #[test]
    fn a_local_seed_is_the_seed_from_the_start_where_cbrs_are_all_the_timing() {
        let mut trace = Vec::new();
        let mut cuts = Vec::new();
        for (n, ratio) in [7u8, 9, 9, 12, 5, 5].into_iter().enumerate() {
            // A CBR outside PSB+ after every other stretch.
            let extra: &[u8] = if n % 2 == 1 {
                &[0x02, 0x03, 40, 0x00]
            } else {
                &[]
            };
            cuts.push(stretch(&mut trace, Some(ratio), 3000, extra));
        }
        let config = EventConfig::default();
        let mut scan = TimingScan::new(&trace, config, cuts.clone());
        assert_eq!(local_seed(&trace, config, cuts[0]), None, "no PSB before");
        for (i, &cut) in cuts.iter().enumerate().skip(1) {
            let from_start = scan.seed(i);
            assert!(from_start.is_some(), "cut {i}");
            assert_eq!(local_seed(&trace, config, cut), Some(from_start), "cut {i}");
        }
        // The seeds differ from cut to cut (fresh time would not do).
        let seeds: Vec<Seed> = (1..cuts.len()).map(|i| scan.seed(i)).collect();
        assert!(seeds.windows(2).any(|w| w[0] != w[1]));
        assert_ne!(seeds[0], Some((Time::new(), TimeCal::new())));
    }

    /// Where anything else may carry time from further back, the local seed cannot
    /// tell: an MTC, a TSC or an overflow in the window, no CBR at all, a nominal
    /// frequency (a CBR calibrates then).
    #[test]
    fn a_local_seed_cannot_tell_where_other_timing_packets_show() {
        let config = EventConfig::default();
        let cases: [(&str, &[u8], Option<u8>); 4] = [
            ("an MTC", &[0x59, 0x10], Some(7)),
            ("a TSC", &[0x19, 1, 0, 0, 0, 0, 0, 0], Some(7)),
            ("an overflow", &[0x02, 0xf3], Some(7)),
            ("no CBR", &[], None),
        ];
        for (what, extra, ratio) in cases {
            let mut trace = Vec::new();
            stretch(&mut trace, ratio, 100, extra);
            let cut = stretch(&mut trace, ratio, 100, &[]);
            assert_eq!(local_seed(&trace, config, cut), None, "{what}");
        }
        let mut trace = Vec::new();
        stretch(&mut trace, Some(7), 100, &[]);
        let cut = stretch(&mut trace, Some(7), 100, &[]);
        assert!(local_seed(&trace, config, cut).is_some(), "CBRs only");
        let mut calibrating = config;
        calibrating.timing.nom_freq = 20;
        assert_eq!(
            local_seed(&trace, calibrating, cut),
            None,
            "a nominal frequency"
        );
    }
}
