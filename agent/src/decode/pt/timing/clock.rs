//! Time along a packet stream.
//!
//! In: packets in trace order (from [`crate::decode::pt::packets::decoder::PacketDecoder`])
//! and the recording's [`TimingConfig`]. Out: [`TimeTracker`], the estimated TSC after
//! each packet (the rules `ptdump --time` shows: calibration inside and outside PSB+,
//! overflow handling). TSC to perf time is [`crate::capture::tsc::TscConversion`].

use super::time::{Time, TimeCal, TimeError, TimingConfig};
use crate::decode::pt::packets::packet::Packet;

/// How a [`TimeTracker`] treats calibration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackerOptions {
    /// Calibrate CYC at all (`ptdump --no-tcal` turns this off; CYCs are then lost).
    pub calibrate: bool,
    /// Keep the calibration over an OVF instead of starting over.
    pub keep_calibration_on_overflow: bool,
}

impl Default for TrackerOptions {
    fn default() -> Self {
        Self {
            calibrate: true,
            keep_calibration_on_overflow: false,
        }
    }
}

/// What went wrong while applying one packet (all `None`/`false`: nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimingStep {
    /// The calibration could not use the packet; for a CYC: there was no calibration.
    pub calibration: Option<TimeError>,
    /// The time estimate could not use the packet.
    pub time: Option<TimeError>,
    /// A CYC was dropped for lack of calibration.
    pub uncalibrated: bool,
}

/// The time estimate and calibration, fed one packet at a time.
#[derive(Debug, Clone)]
pub struct TimeTracker {
    config: TimingConfig,
    options: TrackerOptions,
    time: Time,
    tcal: TimeCal,
    /// Between PSB and PSBEND, where TSC and CBR restate the current state.
    in_header: bool,
}

impl TimeTracker {
    pub fn new(config: TimingConfig, options: TrackerOptions) -> Self {
        Self {
            config,
            options,
            time: Time::new(),
            tcal: TimeCal::new(),
            in_header: false,
        }
    }

    /// Forgets all time (after a decode error, before resyncing).
    pub fn reset(&mut self) {
        *self = Self::new(self.config, self.options);
    }

    /// The estimated TSC after the packets so far.
    pub fn tsc(&self) -> Result<u64, TimeError> {
        self.time.tsc()
    }

    /// The estimate even before the first TSC packet (time since an unknown start).
    pub fn relative_tsc(&self) -> u64 {
        self.time.relative_tsc()
    }

    /// The current CYC calibration (fast counter per cycle, fixed point).
    pub fn fcr(&self) -> Result<u64, TimeError> {
        self.tcal.fcr()
    }

    pub fn time(&self) -> &Time {
        &self.time
    }

    /// Applies `packet`; packets without timing meaning change nothing.
    pub fn update(&mut self, packet: &Packet) -> TimingStep {
        let cfg = self.config;
        let calibrate = self.options.calibrate;
        let mut step = TimingStep::default();
        match *packet {
            Packet::Psb => {
                self.tcal.update_psb(&cfg);
                self.in_header = true;
            }
            Packet::PsbEnd => self.in_header = false,
            Packet::Ovf if self.options.keep_calibration_on_overflow => self.tcal.update_ovf(),
            Packet::Ovf => self.tcal = TimeCal::new(),
            Packet::Tsc { tsc } => {
                if calibrate && self.in_header {
                    step.calibration = self.tcal.header_tsc(tsc).err();
                } else if calibrate {
                    self.tcal.update_tsc(tsc);
                }
                self.time.update_tsc(tsc);
            }
            Packet::Cbr { ratio } => {
                if calibrate {
                    let cal = if self.in_header {
                        self.tcal.header_cbr(ratio, &cfg)
                    } else {
                        self.tcal.update_cbr(ratio, &cfg)
                    };
                    step.calibration = cal.err();
                }
                step.time = self.time.update_cbr(ratio).err();
            }
            Packet::Tma { ctc, fc } => step.time = self.time.update_tma(ctc, fc, &cfg).err(),
            Packet::Mtc { ctc } => {
                if calibrate {
                    step.calibration = self.tcal.update_mtc(ctc, &cfg).err();
                }
                step.time = self.time.update_mtc(ctc, &cfg).err();
            }
            Packet::Cyc { value } => {
                let mut fcr = 0;
                if calibrate {
                    match self.tcal.fcr() {
                        Ok(value) => fcr = value,
                        Err(err) => step.calibration = Some(err),
                    }
                    self.tcal.update_cyc(value);
                }
                step.time = self.time.update_cyc(value, &cfg, fcr).err();
                step.uncalibrated = step.time.is_none() && fcr == 0;
            }
            _ => {}
        }
        step
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pt::timing::time::FCR_SHIFT;

    #[test]
    fn tracker_follows_cbr_calibrated_cyc() {
        // libipt's cbr-cyc: --nom-freq 4; CBR 2 in PSB+, CYC 3, CYC 1, CBR 1, CYC 2.
        let config = TimingConfig {
            nom_freq: 4,
            ..TimingConfig::default()
        };
        let mut tracker = TimeTracker::new(config, TrackerOptions::default());
        let steps: Vec<(Packet, u64)> = vec![
            (Packet::Psb, 0),
            (Packet::Cbr { ratio: 2 }, 0),
            (Packet::PsbEnd, 0),
            (Packet::Cyc { value: 3 }, 6),
            (Packet::Cyc { value: 1 }, 8),
            (Packet::Cbr { ratio: 1 }, 8),
            (Packet::Cyc { value: 2 }, 16),
        ];
        for (packet, tsc) in steps {
            assert_eq!(tracker.update(&packet), TimingStep::default(), "{packet:?}");
            assert_eq!(tracker.relative_tsc(), tsc, "{packet:?}");
        }
        assert_eq!(tracker.tsc(), Err(TimeError::NoTime));
        assert_eq!(tracker.fcr(), Ok(4 << FCR_SHIFT));
    }

    #[test]
    fn tracker_reports_uncalibrated_cyc_and_resets() {
        let mut tracker = TimeTracker::new(TimingConfig::default(), TrackerOptions::default());
        tracker.update(&Packet::Tsc { tsc: 0x100 });
        let step = tracker.update(&Packet::Cyc { value: 4 });
        assert_eq!(step.calibration, Some(TimeError::NoTime));
        assert!(step.uncalibrated);
        assert_eq!(tracker.tsc(), Ok(0x100));
        tracker.reset();
        assert_eq!(tracker.tsc(), Err(TimeError::NoTime));
    }
}
