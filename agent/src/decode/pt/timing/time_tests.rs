//! Unit tests of time estimation and calibration, with values from libipt's corpus.

use super::*;

fn config(mtc_freq: u8, nom_freq: u8, eax: u32, ebx: u32) -> TimingConfig {
    TimingConfig {
        mtc_freq,
        nom_freq,
        cpuid_0x15_eax: eax,
        cpuid_0x15_ebx: ebx,
        errata: Errata::default(),
    }
}

#[test]
fn no_time_before_the_first_tsc() {
    let time = Time::new();
    assert_eq!(time.tsc(), Err(TimeError::NoTime));
    assert_eq!(TimeCal::new().fcr(), Err(TimeError::NoTime));
}

#[test]
fn mtc_advances_time_by_crystal_ticks() {
    // libipt tsc-tma-mtc_infreq_wrap: MTC every 2^12 CTC ticks, TSC:CTC = 1:2.
    let cfg = config(12, 0, 2, 1);
    let mut time = Time::new();
    time.update_tsc(0xa0018);
    time.update_tma(0xf020, 8, &cfg).unwrap();
    assert_eq!(time.tsc(), Ok(0xa0018));
    time.update_mtc(0xa0, &cfg).unwrap();
    assert_eq!(time.tsc(), Ok(0xa0800));
    time.update_mtc(0xa1, &cfg).unwrap();
    assert_eq!(time.tsc(), Ok(0xa1000));
}

#[test]
fn tma_rules() {
    let cfg = config(4, 0, 1, 1);
    let mut time = Time::new();
    assert_eq!(time.update_tma(1, 1, &cfg), Err(TimeError::TmaWithoutTsc));
    time.update_tsc(100);
    time.update_tma(1, 1, &cfg).unwrap();
    assert_eq!(time.update_tma(1, 1, &cfg), Err(TimeError::DuplicateTma));
    let mut time = Time::new();
    time.update_tsc(100);
    time.update_tma(1, 1, &config(4, 0, 0, 0)).unwrap();
    assert_eq!(
        time.update_mtc(2, &config(4, 0, 0, 0)),
        Err(TimeError::NoCrystalRatio)
    );
}

#[test]
fn cbr_with_nominal_frequency_calibrates_cyc() {
    // libipt cbr-cyc: nominal ratio 4, CBR 2 → 2 TSC ticks per cycle.
    let cfg = config(0, 4, 0, 0);
    let mut tcal = TimeCal::new();
    tcal.header_cbr(2, &cfg).unwrap();
    assert_eq!(tcal.fcr(), Ok(2 << FCR_SHIFT));
    let mut time = Time::new();
    time.update_tsc(0x1000);
    time.update_cyc(3, &cfg, tcal.fcr().unwrap()).unwrap();
    assert_eq!(time.tsc(), Ok(0x1006));
    // A CBR outside PSB+ starts over: CBR 1 → 4 ticks per cycle.
    tcal.update_cbr(1, &cfg).unwrap();
    assert_eq!(tcal.fcr(), Ok(4 << FCR_SHIFT));
    assert_eq!(tcal.update_cbr(0, &cfg), Err(TimeError::ZeroCbr));
}

#[test]
fn mtc_periods_calibrate_cyc() {
    // Two MTCs 16 CTC ticks apart (mtc_freq 4) with 32 cycles between them and
    // TSC:CTC = 4:1 → 64 TSC ticks / 32 cycles = 2.0.
    let cfg = config(4, 0, 1, 4);
    let mut tcal = TimeCal::new();
    tcal.update_mtc(1, &cfg).unwrap();
    tcal.update_cyc(32);
    tcal.update_mtc(2, &cfg).unwrap();
    assert_eq!(tcal.fcr(), Ok(2 << FCR_SHIFT));
}

#[test]
fn uncalibrated_cyc_is_counted_as_lost() {
    let cfg = config(0, 0, 1, 1);
    let mut time = Time::new();
    time.update_tsc(10);
    time.update_cyc(5, &cfg, 0).unwrap();
    assert_eq!(time.lost(), (0, 1));
    assert_eq!(time.tsc(), Ok(10));
}

#[test]
fn extreme_values_do_not_panic() {
    for mtc_freq in [0, 15, 31, 32, 200, 255] {
        let cfg = config(mtc_freq, 255, 1, u32::MAX);
        let mut time = Time::new();
        let mut tcal = TimeCal::new();
        time.update_tsc(u64::MAX >> 8);
        let _ = time.update_tma(u16::MAX, 0x1ff, &cfg);
        for ctc in [0xff, 0, 0x80, 1] {
            let _ = time.update_mtc(ctc, &cfg);
            let _ = tcal.update_mtc(ctc, &cfg);
            tcal.update_cyc(u64::MAX);
            let _ = time.update_cyc(u64::MAX, &cfg, u64::MAX);
        }
        let _ = tcal.header_tsc(1);
        let _ = tcal.header_tsc(u64::MAX >> 8);
    }
}
