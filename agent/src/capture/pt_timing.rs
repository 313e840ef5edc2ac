//! Capture stage: what a decoder needs to turn Intel PT's MTC and CYC packets into time,
//! read where the recording happens and kept in the snapshot (issue 18 item 2).
//!
//! In: the `intel_pt` PMU's sysfs directory and `/proc/cpuinfo`. Out: [`PtTiming`], stored
//! in `RecorderParams::pt_timing` and turned into the decoder's `TimingConfig` by
//! `decode::pt_snapshot`.
//!
//! Why: an MTC carries crystal-clock (ART) ticks; converting them to TSC needs CPUID leaf
//! 0x15 (`tsc_art_ratio`, which the kernel prints as `"%u:%u"` of `tsc_art_num` = EBX and
//! `tsc_art_den` = EAX, arch/x86/events/intel/pt.c `pt_timing_attr_show`). CYC packets count
//! core cycles, calibrated against MTC/TSC or at first from the nominal ratio
//! (`max_nonturbo_ratio`, `MSR_PLATFORM_INFO[15:8]`, printed `"%lu"`). The CPU's
//! family/model/stepping selects the errata workarounds. A snapshot without them decodes
//! with time moving only at TSC packets, every MTC an error.
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The timing parameters of the CPU a PT snapshot was recorded on.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct PtTiming {
    /// CPUID.(EAX=0x15): `(EBX, EAX)`, the TSC:crystal-clock ratio's numerator and
    /// denominator; `None` when the PMU does not say (or says 0: not enumerated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tsc_art_ratio: Option<(u32, u32)>,
    /// `MSR_PLATFORM_INFO[15:8]`, the nominal core:bus ratio (ptdump's `--nom-freq`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_nonturbo_ratio: Option<u8>,
    /// `family/model/stepping` of the first CPU in `/proc/cpuinfo` (`GenuineIntel` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
}

impl PtTiming {
    /// Reads the PMU's `tsc_art_ratio` and `max_nonturbo_ratio` under `pmu_dir` and the CPU
    /// from `cpuinfo` (the text of `/proc/cpuinfo`); what is missing stays `None`.
    pub fn read(pmu_dir: &Path, cpuinfo: &str) -> Self {
        let file = |name: &str| std::fs::read_to_string(pmu_dir.join(name)).ok();
        Self {
            tsc_art_ratio: file("tsc_art_ratio").as_deref().and_then(parse_ratio),
            max_nonturbo_ratio: file("max_nonturbo_ratio")
                .and_then(|t| t.trim().parse::<u64>().ok())
                .and_then(|r| u8::try_from(r).ok())
                .filter(|&r| r > 0),
            cpu: cpu_of(cpuinfo),
        }
    }
}

/// `"NUM:DEN\n"` → `(NUM, DEN)`; `None` when malformed or either is 0.
fn parse_ratio(text: &str) -> Option<(u32, u32)> {
    let (num, den) = text.trim().split_once(':')?;
    let (num, den) = (num.trim().parse().ok()?, den.trim().parse().ok()?);
    (num != 0 && den != 0).then_some((num, den))
}

/// `family/model/stepping` of the first processor block of a `/proc/cpuinfo` text, when
/// it is an Intel CPU.
fn cpu_of(cpuinfo: &str) -> Option<String> {
    let block = cpuinfo.split("\n\n").next()?;
    let field = |name: &str| {
        block.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name).then(|| value.trim())
        })
    };
    if field("vendor_id")? != "GenuineIntel" {
        return None;
    }
    let num = |name| field(name)?.parse::<u32>().ok();
    Some(format!(
        "{}/{}/{}",
        num("cpu family")?,
        num("model")?,
        num("stepping")?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pmus_timing_files_and_the_cpu_are_read_as_the_kernel_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        // An Ice Lake server's values: TSC = crystal × 84 / 2, nominal ratio 26.
        std::fs::write(dir.path().join("tsc_art_ratio"), "84:2\n").unwrap();
        std::fs::write(dir.path().join("max_nonturbo_ratio"), "26\n").unwrap();
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n\
                       model\t\t: 106\nmodel name\t: Intel(R) Xeon(R)\nstepping\t: 6\n\n\
                       processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n";
        let t = PtTiming::read(dir.path(), cpuinfo);
        assert_eq!(
            t,
            PtTiming {
                tsc_art_ratio: Some((84, 2)),
                max_nonturbo_ratio: Some(26),
                cpu: Some("6/106/6".to_owned()),
            }
        );
        // Not enumerated (0:0), missing files, another vendor: nothing invented.
        std::fs::write(dir.path().join("tsc_art_ratio"), "0:0\n").unwrap();
        std::fs::remove_file(dir.path().join("max_nonturbo_ratio")).unwrap();
        let amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n";
        assert_eq!(PtTiming::read(dir.path(), amd), PtTiming::default());
        assert_eq!(parse_ratio("84"), None);
    }
}
