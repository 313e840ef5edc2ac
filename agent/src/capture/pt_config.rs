//! Intel PT event configuration: options → `perf_event_attr.config`, with every bit
//! position taken from the PMU's sysfs `format/` files and every value checked against its
//! `caps/` (never hard-coded: the layout differs across kernels and CPUs).
//!
//! In: [`PmuInfo`] (from [`crate::check::read_pmu`]) and [`PtOptions`]. Out: [`PtConfig`]:
//! the PMU type, the config word, the fields that were set, and notes on defaults that this
//! CPU cannot honour (dropped, not fatal). An option the user asked for explicitly
//! (`strict`) that the CPU cannot do is an error.
#![forbid(unsafe_code)]

use std::{collections::BTreeMap, path::PathBuf};

use crate::check::{ConfigWord, FormatField, IntelPtCaps, PmuInfo};

/// What to ask of Intel PT. The default is fine-grained timing for call timelines:
/// branches, TSC, MTC at the highest rate (`mtc_period=0`) and cycle-accurate mode with
/// the smallest threshold (`cyc_thresh=1`), return compression on, PSB period left to the
/// driver — in the spirit of magic-trace's timer-resolution presets.
#[derive(Debug, Clone, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one flag per Intel PT format field, as perf's event syntax has them"
)]
pub struct PtOptions {
    pub branch: bool,
    pub tsc: bool,
    /// MTC packets at this period (`mtc=1,mtc_period=N`); `None`: no MTC.
    pub mtc_period: Option<u32>,
    /// CYC packets with this threshold (`cyc=1,cyc_thresh=N`); `None`: no CYC.
    pub cyc_thresh: Option<u32>,
    /// Disable return compression (every RET gets a TIP: bigger trace, simpler decode).
    pub noretcomp: bool,
    /// PSB every 2^(N+11) bytes; `None`: the driver's default.
    pub psb_period: Option<u32>,
    pub ptw: bool,
    pub pwr_evt: bool,
    /// Options were given explicitly: refuse what the CPU cannot do instead of dropping it.
    pub strict: bool,
    /// Trace only the code of these binaries (address filters; empty: everything). See
    /// [`super::pt_filter`].
    pub trace_binaries: Vec<PathBuf>,
    /// Triggers that also pause the trace in the kernel, at the event itself (`aux_pause`,
    /// Linux 6.13): each becomes a member of every PT event's group. See
    /// [`super::aux_pause`].
    pub pause_on: Vec<super::aux_pause::PauseSource>,
}

impl Default for PtOptions {
    fn default() -> Self {
        Self {
            branch: true,
            tsc: true,
            mtc_period: Some(0),
            cyc_thresh: Some(1),
            noretcomp: false,
            psb_period: None,
            ptw: false,
            pwr_evt: false,
            strict: false,
            trace_binaries: Vec::new(),
            pause_on: Vec::new(),
        }
    }
}

/// The packed configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtConfig {
    pub pmu_type: u32,
    pub config: u64,
    /// Field name → value, for the snapshot metadata.
    pub fields: BTreeMap<String, u64>,
    /// Defaults that were dropped because this CPU or kernel lacks them.
    pub notes: Vec<String>,
}

/// Why the options cannot be packed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtConfigError {
    #[error("intel_pt PMU type unusable: {reason}")]
    BadType { reason: String },
    #[error("intel_pt has no format field `{field}` (kernel too old?)")]
    MissingField { field: &'static str },
    #[error("intel_pt format field `{field}` cannot be used: {text:?}")]
    BadField { field: &'static str, text: String },
    #[error("{field}={value} does not fit its format field")]
    TooLarge { field: &'static str, value: u64 },
    #[error("{field}={value} is not supported by this CPU (allowed: {allowed:?})")]
    Unsupported {
        field: &'static str,
        value: u32,
        allowed: Vec<u32>,
    },
    #[error("{field} needs the intel_pt capability `{cap}`, which this CPU lacks")]
    MissingCap {
        field: &'static str,
        cap: &'static str,
    },
}

struct Packer<'a> {
    pmu: &'a PmuInfo,
    out: PtConfig,
}

impl Packer<'_> {
    fn field(&self, name: &'static str) -> Result<FormatField, PtConfigError> {
        let text = self
            .pmu
            .format
            .get(name)
            .ok_or(PtConfigError::MissingField { field: name })?;
        match FormatField::parse(text) {
            Some(f) if f.word == ConfigWord::Config => Ok(f),
            _ => Err(PtConfigError::BadField {
                field: name,
                text: text.clone(),
            }),
        }
    }

    fn set(&mut self, name: &'static str, value: u64) -> Result<(), PtConfigError> {
        let bits = self
            .field(name)?
            .encode(value)
            .ok_or(PtConfigError::TooLarge { field: name, value })?;
        self.out.config |= bits;
        self.out.fields.insert(name.to_owned(), value);
        Ok(())
    }
}

/// A capability check: `Ok` when allowed (or unknown: let the kernel decide).
fn check_value(
    field: &'static str,
    cap: &'static str,
    have_cap: Option<bool>,
    allowed: Option<&Vec<u32>>,
    value: u32,
) -> Result<(), PtConfigError> {
    if have_cap == Some(false) {
        return Err(PtConfigError::MissingCap { field, cap });
    }
    match allowed {
        Some(allowed) if !allowed.contains(&value) => Err(PtConfigError::Unsupported {
            field,
            value,
            allowed: allowed.clone(),
        }),
        _ => Ok(()),
    }
}

/// A timing option: value, enable field (empty: none), value field, capability name,
/// whether the CPU has it, and the values it allows.
type Timed<'c> = (
    Option<u32>,
    &'static str,
    &'static str,
    &'static str,
    Option<bool>,
    Option<&'c Vec<u32>>,
);

/// Packs `opts` for the PMU described by `pmu`.
pub fn pack(pmu: &PmuInfo, opts: &PtOptions) -> Result<PtConfig, PtConfigError> {
    let pmu_type = pmu
        .pmu_type
        .clone()
        .map_err(|reason| PtConfigError::BadType { reason })?;
    let caps = IntelPtCaps::from_pmu(pmu);
    let mut p = Packer {
        pmu,
        out: PtConfig {
            pmu_type,
            config: 0,
            fields: BTreeMap::new(),
            notes: Vec::new(),
        },
    };
    // `pt` (trace enable) exists on newer kernels only; the driver sets it otherwise.
    if pmu.format.contains_key("pt") {
        p.set("pt", 1)?;
    }
    // `branch` likewise: a kernel without the `pt` and `branch` format fields always sets
    // BranchEn itself (pt.c's config, "BRANCH_EN on by default"), so there is nothing to
    // ask for; asking failed the recorder on such kernels.
    let branch = opts.branch && pmu.format.contains_key("branch");
    if opts.branch && !branch {
        p.out.notes.push(
            "branch left out: not in this kernel's intel_pt format (its driver always \
             traces branches)"
                .to_owned(),
        );
    }
    for (on, name) in [
        (branch, "branch"),
        (opts.tsc, "tsc"),
        (opts.noretcomp, "noretcomp"),
        (opts.ptw, "ptw"),
        (opts.pwr_evt, "pwr_evt"),
    ] {
        if on {
            p.set(name, 1)?;
        }
    }
    let timed: [Timed<'_>; 3] = [
        (
            opts.mtc_period,
            "mtc",
            "mtc_period",
            "mtc",
            caps.mtc,
            caps.mtc_periods.as_ref(),
        ),
        (
            opts.cyc_thresh,
            "cyc",
            "cyc_thresh",
            "psb_cyc",
            caps.cyc,
            caps.cycle_thresholds.as_ref(),
        ),
        (
            opts.psb_period,
            "",
            "psb_period",
            "psb_cyc",
            caps.psb_cyc,
            caps.psb_periods.as_ref(),
        ),
    ];
    for (value, enable, field, cap, have, allowed) in timed {
        let Some(value) = value else { continue };
        let fields_exist = pmu.format.contains_key(field)
            && (enable.is_empty() || pmu.format.contains_key(enable));
        let checked = if fields_exist {
            check_value(field, cap, have, allowed, value)
        } else {
            Err(PtConfigError::MissingField { field })
        };
        match checked {
            Ok(()) => {
                if !enable.is_empty() {
                    p.set(enable, 1)?;
                }
                p.set(field, u64::from(value))?;
            }
            Err(err) if opts.strict => return Err(err),
            Err(err) => p.out.notes.push(format!("{field} left out: {err}")),
        }
    }
    Ok(p.out)
}

#[cfg(test)]
#[path = "pt_config_tests.rs"]
mod tests;
