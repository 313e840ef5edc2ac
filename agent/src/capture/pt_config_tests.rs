//! Config packing against sysfs fixture trees written with the kernel's real format
//! strings (arch/x86/events/intel/pt.c) and caps of a Skylake-class CPU.

use std::path::Path;

use super::*;
use crate::check::read_pmu;

/// The kernel's format files (the fixture's fields beyond these are unused here).
const FORMAT: &[(&str, &str)] = crate::check::INTEL_PT_FORMAT;

const CAPS: &[(&str, &str)] = &[
    ("psb_cyc", "1"),
    ("mtc", "1"),
    ("ip_filtering", "1"),
    ("ptwrite", "0"),
    ("power_event_trace", "0"),
    ("mtc_periods", "249"),       // 0, 3, 6, 9
    ("cycle_thresholds", "3fff"), // 0..=13
    ("psb_periods", "3f"),        // 0..=5
];

fn fixture(root: &Path, format: &[(&str, &str)], caps: &[(&str, &str)]) -> PmuInfo {
    let dir = root.join("intel_pt");
    std::fs::create_dir_all(dir.join("format")).unwrap();
    std::fs::create_dir_all(dir.join("caps")).unwrap();
    std::fs::write(dir.join("type"), "8\n").unwrap();
    for (name, text) in format {
        std::fs::write(dir.join("format").join(name), format!("{text}\n")).unwrap();
    }
    for (name, text) in caps {
        std::fs::write(dir.join("caps").join(name), format!("{text}\n")).unwrap();
    }
    read_pmu(root, "intel_pt").unwrap()
}

#[test]
fn defaults_pack_into_the_kernel_bit_positions() {
    let root = tempfile::tempdir().unwrap();
    let pmu = fixture(root.path(), FORMAT, CAPS);
    let cfg = pack(&pmu, &PtOptions::default()).unwrap();
    assert_eq!(cfg.pmu_type, 8);
    let want = 1 << 0 | 1 << 13 | 1 << 10 | 1 << 9 | 1 << 1 | 1 << 19;
    assert_eq!(cfg.config, want, "{:#x} vs {want:#x}", cfg.config);
    assert!(cfg.notes.is_empty(), "{:?}", cfg.notes);
    assert_eq!(cfg.fields.get("cyc_thresh"), Some(&1));
    assert_eq!(cfg.fields.get("mtc_period"), Some(&0));
}

#[test]
fn every_option_lands_in_its_field() {
    let root = tempfile::tempdir().unwrap();
    let pmu = fixture(root.path(), FORMAT, CAPS);
    let opts = PtOptions {
        branch: true,
        tsc: false,
        mtc_period: Some(9),
        cyc_thresh: Some(13),
        noretcomp: true,
        psb_period: Some(5),
        ptw: true,
        pwr_evt: true,
        strict: true,
        trace_binaries: Vec::new(),
        pause_on: Vec::new(),
    };
    let cfg = pack(&pmu, &opts).unwrap();
    let want = 1 << 0 // pt
        | 1 << 13 // branch
        | 1 << 11 // noretcomp
        | 1 << 12 // ptw
        | 1 << 4 // pwr_evt
        | 1 << 9 | 9 << 14 // mtc, mtc_period
        | 1 << 1 | 13 << 19 // cyc, cyc_thresh
        | 5 << 24; // psb_period
    assert_eq!(cfg.config, want, "{:#x} vs {want:#x}", cfg.config);
}

#[test]
fn unsupported_values_fail_when_strict_and_are_dropped_otherwise() {
    let root = tempfile::tempdir().unwrap();
    let pmu = fixture(root.path(), FORMAT, CAPS);
    let opts = PtOptions {
        mtc_period: Some(2), // not in 0,3,6,9
        strict: true,
        ..PtOptions::default()
    };
    assert_eq!(
        pack(&pmu, &opts),
        Err(PtConfigError::Unsupported {
            field: "mtc_period",
            value: 2,
            allowed: vec![0, 3, 6, 9]
        })
    );
    let cfg = pack(
        &pmu,
        &PtOptions {
            strict: false,
            ..opts
        },
    )
    .unwrap();
    assert_eq!(cfg.config & (1 << 9), 0, "mtc dropped with its period");
    assert_eq!(cfg.notes.len(), 1);
    assert!(
        cfg.notes[0].starts_with("mtc_period left out"),
        "{:?}",
        cfg.notes
    );
}

#[test]
fn a_cpu_without_psb_cyc_gets_no_cyc() {
    let root = tempfile::tempdir().unwrap();
    let caps: Vec<(&str, &str)> = CAPS
        .iter()
        .map(|&(k, v)| if k == "psb_cyc" { (k, "0") } else { (k, v) })
        .collect();
    let pmu = fixture(root.path(), FORMAT, &caps);
    let cfg = pack(&pmu, &PtOptions::default()).unwrap();
    assert_eq!(cfg.config & (1 << 1 | 0xf << 19), 0);
    assert_eq!(cfg.notes.len(), 1, "{:?}", cfg.notes);
    let strict = PtOptions {
        strict: true,
        ..PtOptions::default()
    };
    assert_eq!(
        pack(&pmu, &strict),
        Err(PtConfigError::MissingCap {
            field: "cyc_thresh",
            cap: "psb_cyc"
        })
    );
}

#[test]
fn an_old_kernel_without_fields_or_with_garbage() {
    let root = tempfile::tempdir().unwrap();
    // Only tsc and noretcomp (Linux 4.1's format), no caps at all.
    let pmu = fixture(
        root.path(),
        &[("tsc", "config:10"), ("noretcomp", "config:11")],
        &[],
    );
    // The defaults: branch left out (that driver always traces branches), not an error
    // (issue 18: it was `MissingField { field: "branch" }`, no recorder on such kernels).
    let cfg = pack(&pmu, &PtOptions::default()).unwrap();
    assert_eq!(cfg.config, 1 << 10);
    assert_eq!(
        cfg.notes.len(),
        3,
        "branch, mtc and cyc left out: {:?}",
        cfg.notes
    );
    let opts = PtOptions {
        branch: false,
        ..PtOptions::default()
    };
    let cfg = pack(&pmu, &opts).unwrap();
    assert_eq!(cfg.config, 1 << 10);
    assert_eq!(cfg.notes.len(), 2, "mtc and cyc dropped: {:?}", cfg.notes);

    let root = tempfile::tempdir().unwrap();
    let pmu = fixture(
        root.path(),
        &[("branch", "config1:70"), ("tsc", "config:10")],
        &[],
    );
    assert!(matches!(
        pack(&pmu, &PtOptions::default()),
        Err(PtConfigError::BadField {
            field: "branch",
            ..
        })
    ));
    std::fs::write(root.path().join("intel_pt/type"), "x").unwrap();
    let pmu = read_pmu(root.path(), "intel_pt").unwrap();
    assert!(matches!(
        pack(&pmu, &PtOptions::default()),
        Err(PtConfigError::BadType { .. })
    ));
}

#[test]
fn values_too_wide_for_their_field() {
    let root = tempfile::tempdir().unwrap();
    let pmu = fixture(root.path(), FORMAT, &[]); // no caps: let the kernel decide
    let opts = PtOptions {
        psb_period: Some(16),
        strict: true,
        ..PtOptions::default()
    };
    assert_eq!(
        pack(&pmu, &opts),
        Err(PtConfigError::TooLarge {
            field: "psb_period",
            value: 16
        })
    );
}

#[test]
fn a_kernel_without_the_pt_and_branch_fields_gets_neither() {
    let root = tempfile::tempdir().unwrap();
    let old: Vec<(&str, &str)> = FORMAT
        .iter()
        .copied()
        .filter(|(name, _)| !matches!(*name, "pt" | "branch"))
        .collect();
    let pmu = fixture(root.path(), &old, CAPS);
    let cfg = pack(&pmu, &PtOptions::default()).unwrap();
    assert_eq!(cfg.config & (1 << 0 | 1 << 13), 0, "{:#x}", cfg.config);
    assert!(!cfg.fields.contains_key("branch"));
    assert!(
        cfg.notes.iter().any(|n| n.starts_with("branch left out")),
        "{:?}",
        cfg.notes
    );
}
