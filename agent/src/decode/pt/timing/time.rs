//! Time from Intel PT timing packets: TSC, TMA, MTC, CYC and CBR to an estimated TSC.
//!
//! In: the timing packets in trace order and the [`TimingConfig`] of the recording (MTC
//! frequency, CPUID leaf 0x15 crystal ratio, nominal frequency). Out: an estimated
//! time-stamp counter value at each packet ([`Time`]) and the cycles-to-TSC calibration
//! ([`TimeCal`]) that CYC packets need. The estimation follows libipt's, so `ptdump
//! --time` output matches Intel's:
//! - TSC gives the full time; TMA then says where in the current MTC period it was.
//! - Each MTC advances time by the crystal clock (CTC) ticks since the last MTC, converted
//!   to TSC ticks by `ebx / eax` of CPUID leaf 0x15.
//! - CYC counts core cycles; the fast-counter-to-cycles ratio ("fcr", in 1/256 units) is
//!   calibrated from MTC or TSC periods, or from `nom_freq / cbr`.

use crate::decode::pt::packets::cpu::Errata;

/// What the recording was configured with (`IA32_RTIT_CTL`, CPUID, `MSR_PLATFORM_INFO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TimingConfig {
    /// `IA32_RTIT_CTL.MTCFreq`: an MTC every `2^mtc_freq` crystal clock ticks.
    pub mtc_freq: u8,
    /// `MSR_PLATFORM_INFO[15:8]`, the nominal core:bus ratio; 0 if unknown.
    pub nom_freq: u8,
    /// CPUID.(EAX=0x15).EAX: denominator of the TSC:crystal clock ratio.
    pub cpuid_0x15_eax: u32,
    /// CPUID.(EAX=0x15).EBX: numerator of the TSC:crystal clock ratio.
    pub cpuid_0x15_ebx: u32,
    /// Errata of the recording CPU (SKL168 matters here).
    pub errata: Errata,
}

/// Why time or calibration could not be updated or reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TimeError {
    /// No TSC packet (or no calibration) yet.
    #[error("no timing information")]
    NoTime,
    /// A CBR packet with a zero ratio.
    #[error("zero core:bus ratio")]
    ZeroCbr,
    /// The crystal clock went back by more than one wrap of the MTC bits.
    #[error("crystal clock value went backwards")]
    CtcBackwards,
    /// The TSC went back by more than one 56-bit wrap.
    #[error("time-stamp counter went backwards")]
    TscBackwards,
    /// A TMA without a preceding TSC.
    #[error("TMA without a TSC")]
    TmaWithoutTsc,
    /// A second TMA for the same TSC.
    #[error("second TMA for one TSC")]
    DuplicateTma,
    /// Converting crystal clock to TSC ticks needs CPUID leaf 0x15.
    #[error("CPUID leaf 0x15 (TSC:crystal clock ratio) not configured")]
    NoCrystalRatio,
    /// An internal inconsistency or an intermediate value that would overflow.
    #[error("inconsistent timing state")]
    Inconsistent,
}

/// Shift of the fixed-point fast-counter:cycles ratio.
pub const FCR_SHIFT: u32 = 8;

fn shl32(value: u32, shift: u32) -> u32 {
    value.checked_shl(shift).unwrap_or(0)
}

/// CTC ticks from `last` to `now`, allowing for one wrap of the bits MTC carries.
fn ctc_delta(now: u32, last: u32, config: &TimingConfig) -> Result<u32, TimeError> {
    let mut now = now;
    if now < last {
        now = now.wrapping_add(shl32(1, u32::from(config.mtc_freq) + 8));
        if now < last {
            return Err(TimeError::CtcBackwards);
        }
    }
    Ok(now - last)
}

/// CTC ticks to TSC (fast counter) ticks.
fn ctc_to_fc(ctc: u32, config: &TimingConfig) -> Result<u64, TimeError> {
    let (eax, ebx) = (config.cpuid_0x15_eax, config.cpuid_0x15_ebx);
    if eax == 0 || ebx == 0 {
        return Err(TimeError::NoCrystalRatio);
    }
    Ok(u64::from(ctc).wrapping_mul(u64::from(ebx)) / u64::from(eax))
}

/// The running time estimate.
#[expect(
    clippy::struct_excessive_bools,
    reason = "which timing packets have been seen, one flag each"
)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Time {
    tsc: u64,
    /// TSC at the last TSC or MTC.
    base: u64,
    /// Fast counter ticks since `base`.
    fc: u64,
    /// CTC at the last MTC/TMA.
    ctc: u32,
    /// CTC when `fc` was last cleared.
    ctc_cyc: u32,
    lost_mtc: u32,
    lost_cyc: u32,
    cbr: u8,
    have_tsc: bool,
    have_cbr: bool,
    have_tma: bool,
    have_mtc: bool,
}

impl Time {
    pub fn new() -> Self {
        Self::default()
    }

    /// The estimated TSC; [`TimeError::NoTime`] before the first TSC packet.
    pub fn tsc(&self) -> Result<u64, TimeError> {
        if self.have_tsc {
            Ok(self.tsc)
        } else {
            Err(TimeError::NoTime)
        }
    }

    /// The estimate even without a TSC packet (relative time, `--no-wall-clock`).
    pub fn relative_tsc(&self) -> u64 {
        self.tsc
    }

    /// MTC and CYC packets that could not be used since the last TSC.
    pub fn lost(&self) -> (u32, u32) {
        (self.lost_mtc, self.lost_cyc)
    }

    /// The last core:bus ratio.
    pub fn cbr(&self) -> Option<u8> {
        self.have_cbr.then_some(self.cbr)
    }

    pub fn update_tsc(&mut self, tsc: u64) {
        self.have_tsc = true;
        self.have_tma = false;
        self.have_mtc = false;
        self.tsc = tsc;
        self.base = tsc;
        self.ctc = 0;
        self.fc = 0;
        self.lost_mtc = 0;
        self.lost_cyc = 0;
    }

    pub fn update_cbr(&mut self, ratio: u8) -> Result<(), TimeError> {
        if ratio == 0 {
            return Err(TimeError::ZeroCbr);
        }
        self.have_cbr = true;
        self.cbr = ratio;
        Ok(())
    }

    pub fn update_tma(
        &mut self,
        ctc: u16,
        fc: u16,
        config: &TimingConfig,
    ) -> Result<(), TimeError> {
        if !self.have_tsc {
            return Err(TimeError::TmaWithoutTsc);
        }
        if self.have_tma {
            return Err(TimeError::DuplicateTma);
        }
        if self.have_mtc {
            return Err(TimeError::Inconsistent);
        }
        let mtc_hi = u32::from(config.mtc_freq) + 8;
        let ctc_mask = shl32(1, mtc_hi).wrapping_sub(1);
        self.have_tma = true;
        self.base = self.base.wrapping_sub(u64::from(fc));
        self.fc = self.fc.wrapping_add(u64::from(fc));
        // With few enough MTC bits the TMA carries the whole CTC and acts as an MTC;
        // otherwise the next MTC fills in the high bits.
        if mtc_hi <= 16 {
            self.have_mtc = true;
        }
        self.ctc = u32::from(ctc) & ctc_mask;
        self.ctc_cyc = self.ctc;
        Ok(())
    }

    pub fn update_mtc(&mut self, payload: u8, config: &TimingConfig) -> Result<(), TimeError> {
        let (have_tsc, have_tma, have_mtc) = (self.have_tsc, self.have_tma, self.have_mtc);
        // MTCs between TSC and TMA would look like CTC overflows: ignore them.
        if have_tsc && !have_tma {
            return Ok(());
        }
        let mut last_ctc = self.ctc;
        let mtc_freq = u32::from(config.mtc_freq);
        let ctc = shl32(u32::from(payload), mtc_freq);
        if self.fc != 0 || self.lost_cyc != 0 || !have_mtc {
            self.ctc_cyc = ctc;
        }
        self.have_mtc = true;
        self.fc = 0;
        self.ctc = ctc;
        self.lost_cyc = 0;
        if !have_mtc {
            // Without a TMA the first MTC only sets the phase.
            if !have_tma {
                return Ok(());
            }
            if last_ctc & !0xffff != 0 {
                return Err(TimeError::Inconsistent);
            }
            // Estimate the CTC bits above the TMA's 16 from this MTC.
            let ctc_lo = ctc & 0xffff;
            let mut ctc_hi = ctc & !0xffff;
            if ctc_lo < last_ctc {
                ctc_hi = ctc_hi.wrapping_sub(1 << 16) & shl32(0xff, mtc_freq);
            }
            last_ctc |= ctc_hi;
        }
        let delta = ctc_delta(ctc, last_ctc, config).inspect_err(|_| {
            self.lost_mtc = self.lost_mtc.wrapping_add(1);
        })?;
        let ticks = ctc_to_fc(delta, config)?;
        self.base = self.base.wrapping_add(ticks);
        self.tsc = self.base;
        Ok(())
    }

    /// Estimates the part of a CYC payload that falls into the current MTC period when
    /// the CYC spans several.
    fn cyc_in_this_period(
        &self,
        cyc: u64,
        config: &TimingConfig,
        fcr: u64,
    ) -> Result<u64, TimeError> {
        if self.ctc == self.ctc_cyc {
            return Ok(cyc);
        }
        let delta = ctc_delta(self.ctc, self.ctc_cyc, config)?;
        let fc = ctc_to_fc(delta, config)?;
        let old_cyc = (fc << FCR_SHIFT) / fcr;
        // Rather run slow than fast: give everything to the earlier periods.
        Ok(cyc.max(old_cyc) - old_cyc)
    }

    /// Applies a CYC with the calibration `fcr` (0: uncalibrated, the CYC is lost).
    pub fn update_cyc(
        &mut self,
        cyc: u64,
        config: &TimingConfig,
        fcr: u64,
    ) -> Result<(), TimeError> {
        if fcr == 0 {
            self.lost_cyc = self.lost_cyc.wrapping_add(1);
            return Ok(());
        }
        let cyc = if self.fc == 0 {
            self.cyc_in_this_period(cyc, config, fcr)?
        } else {
            cyc
        };
        self.fc = self.fc.wrapping_add(cyc.wrapping_mul(fcr) >> FCR_SHIFT);
        self.tsc = self.base.wrapping_add(self.fc);
        Ok(())
    }
}

/// Calibration of CYC (core cycles) against TSC ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeCal {
    /// Fast-counter ticks per cycle, shifted left by [`FCR_SHIFT`].
    fcr: u64,
    min_fcr: u64,
    max_fcr: u64,
    /// The last TSC, for calibrating at the next TSC in PSB+.
    tsc: u64,
    /// Cycles since `tsc`.
    cyc_tsc: u64,
    /// Cycles since the last MTC.
    cyc_mtc: u64,
    /// CTC at the last MTC.
    ctc: u32,
    lost_mtc: u32,
    have_mtc: bool,
    check_skl168: bool,
}

impl Default for TimeCal {
    fn default() -> Self {
        Self {
            fcr: 0,
            min_fcr: u64::MAX,
            max_fcr: 0,
            tsc: 0,
            cyc_tsc: 0,
            cyc_mtc: 0,
            ctc: 0,
            lost_mtc: 0,
            have_mtc: false,
            check_skl168: false,
        }
    }
}

impl TimeCal {
    pub fn new() -> Self {
        Self::default()
    }

    fn have_fcr(&self) -> bool {
        self.min_fcr <= self.max_fcr
    }

    /// The current ratio (shifted by [`FCR_SHIFT`]); [`TimeError::NoTime`] if none yet.
    pub fn fcr(&self) -> Result<u64, TimeError> {
        if self.have_fcr() {
            Ok(self.fcr)
        } else {
            Err(TimeError::NoTime)
        }
    }

    pub fn set_fcr(&mut self, fcr: u64) {
        self.fcr = fcr;
        self.min_fcr = self.min_fcr.min(fcr);
        self.max_fcr = self.max_fcr.max(fcr);
    }

    /// A PSB: arms the SKL168 check for the next MTC.
    pub fn update_psb(&mut self, config: &TimingConfig) {
        if config.errata.skl168 {
            self.check_skl168 = true;
        }
    }

    /// A TSC outside PSB+: may follow lost time, so it only starts a new period.
    pub fn update_tsc(&mut self, tsc: u64) {
        self.tsc = tsc;
        self.cyc_tsc = 0;
    }

    /// A TSC inside PSB+: calibrates from the cycles since the last TSC unless MTCs do.
    pub fn header_tsc(&mut self, tsc: u64) -> Result<(), TimeError> {
        let (last_tsc, cyc) = (self.tsc, self.cyc_tsc);
        self.tsc = tsc;
        self.cyc_tsc = 0;
        if last_tsc == 0 || cyc == 0 || self.have_mtc {
            return Ok(());
        }
        let mut tsc = tsc;
        if tsc < last_tsc {
            // The packet carries 56 bits: allow for one wrap.
            tsc = tsc
                .checked_add(1 << 56)
                .filter(|&tsc| tsc >= last_tsc)
                .ok_or(TimeError::TscBackwards)?;
        }
        let delta = tsc - last_tsc;
        if delta & !(u64::MAX >> FCR_SHIFT) != 0 {
            return Err(TimeError::Inconsistent);
        }
        self.set_fcr((delta << FCR_SHIFT) / cyc);
        Ok(())
    }

    /// A CBR outside PSB+: the frequency changed, start over.
    pub fn update_cbr(&mut self, ratio: u8, config: &TimingConfig) -> Result<(), TimeError> {
        *self = Self::new();
        self.header_cbr(ratio, config)
    }

    /// A CBR inside PSB+: with a known nominal frequency, calibrates directly.
    pub fn header_cbr(&mut self, ratio: u8, config: &TimingConfig) -> Result<(), TimeError> {
        if config.nom_freq == 0 {
            return Ok(());
        }
        if ratio == 0 {
            return Err(TimeError::ZeroCbr);
        }
        self.set_fcr((u64::from(config.nom_freq) << FCR_SHIFT) / u64::from(ratio));
        Ok(())
    }

    pub fn update_mtc(&mut self, payload: u8, config: &TimingConfig) -> Result<(), TimeError> {
        let (last_ctc, have_mtc, cyc) = (self.ctc, self.have_mtc, self.cyc_mtc);
        let check_skl168 = std::mem::take(&mut self.check_skl168);
        let mtc_freq = u32::from(config.mtc_freq);
        let ctc = shl32(u32::from(payload), mtc_freq);
        if !have_mtc {
            self.cyc_mtc = 0;
            self.ctc = ctc;
            self.have_mtc = true;
            return Ok(());
        }
        // Without cycles, spread the next ones over both MTC periods.
        if cyc == 0 {
            return Ok(());
        }
        self.cyc_mtc = 0;
        self.ctc = ctc;
        // Counted as lost until the calibration below succeeds.
        self.lost_mtc = self.lost_mtc.wrapping_add(1);
        let delta = ctc_delta(ctc, last_ctc, config)?;
        let fc = ctc_to_fc(delta, config)?;
        if fc & !(u64::MAX >> FCR_SHIFT) != 0 {
            return Err(TimeError::Inconsistent);
        }
        let fcr = (fc << FCR_SHIFT) / cyc;
        // SKL168: CYCs right before a PSB may be dropped. Skip the first MTC after PSB
        // if MTCs were lost or it looks like a wrap CYC (every 4096 cycles) was.
        if check_skl168 {
            if shl32(1, mtc_freq) < delta {
                return Ok(());
            }
            if mtc_freq < 10 && self.have_fcr() {
                let expected = self.fcr.wrapping_mul(cyc.wrapping_add(0xf00)) >> FCR_SHIFT;
                if expected < fc {
                    return Ok(());
                }
            }
        }
        self.set_fcr(fcr);
        self.lost_mtc = 0;
        Ok(())
    }

    pub fn update_cyc(&mut self, cyc: u64) {
        self.cyc_mtc = self.cyc_mtc.wrapping_add(cyc);
        self.cyc_tsc = self.cyc_tsc.wrapping_add(cyc);
    }

    /// An overflow, keeping the calibration itself (`--keep-tcal-on-ovf`).
    pub fn update_ovf(&mut self) {
        self.tsc = 0;
        self.cyc_tsc = 0;
        self.cyc_mtc = 0;
        self.ctc = 0;
        self.have_mtc = false;
    }
}

#[cfg(test)]
#[path = "time_tests.rs"]
mod tests;
