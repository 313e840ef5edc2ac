//! Options of the `ptdump` text dump, and parsing them from ptdump's command line.
//!
//! In: Intel `ptdump` arguments (`--no-pad`, `--time`, `--cpu 6/85`, `--pevent FILE` ...).
//! Out: [`PtdumpOptions`] plus the sideband files the caller has to load (the dump itself
//! never opens files). Used by `lookback-pt ptdump --pt FILE` and by the corpus
//! conformance test, which runs libipt's expectations with their original options.

use crate::decode::pt::packets::cpu::{Cpu, parse_c_uint};
use crate::decode::pt::sideband::pevent::{PeventConfig, SidebandFlags};
use crate::decode::pt::timing::time::TimingConfig;

/// What `ptdump` prints and how it tracks state; the defaults are ptdump's.
#[expect(
    clippy::struct_excessive_bools,
    reason = "mirrors ptdump's independent command-line switches"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PtdumpOptions {
    /// Print the trace offset as the first column (off with `--no-offset`).
    pub show_offset: bool,
    /// Print the packet bytes (`--raw`).
    pub show_raw_bytes: bool,
    /// Print the reconstructed IP on IP packets (`--lastip`).
    pub show_last_ip: bool,
    /// Print the execution mode on MODE.Exec (`--exec-mode`).
    pub show_exec_mode: bool,
    /// Print the estimated TSC on timing packets (`--time`).
    pub show_time: bool,
    /// Print the calibration on timing packets (`--tcal`).
    pub show_tcal: bool,
    /// Print time and calibration as deltas (`--time-delta`).
    pub time_as_delta: bool,
    /// Keep the calibration over an OVF (`--keep-tcal-on-ovf`).
    pub keep_tcal_on_ovf: bool,
    /// Print errors only (`--quiet`).
    pub quiet: bool,
    /// Hide PAD packets (`--no-pad`).
    pub no_pad: bool,
    /// Decode from offset 0 without looking for a PSB (`--no-sync`).
    pub no_sync: bool,
    /// Do not calibrate CYC (`--no-tcal`).
    pub no_tcal: bool,
    /// Print time relative to the start when there is no TSC (`--no-wall-clock`).
    pub no_wall_clock: bool,
    /// Hide timing packets (`--no-timing`).
    pub no_timing: bool,
    /// Hide CYC and ignore it for time (`--no-cyc`).
    pub no_cyc: bool,
    /// The recording CPU, for errata (`--cpu F/M[/S]`).
    pub cpu: Option<Cpu>,
    /// MTC frequency, nominal frequency, CPUID 0x15 (`--mtc-freq`, `--nom-freq`,
    /// `--cpuid-0x15.eax`, `--cpuid-0x15.ebx`). Its errata come from `cpu`.
    pub timing: TimingConfig,
    /// Sideband output switches.
    pub sideband: SidebandFlags,
    /// Print sideband warnings (`--sb:warn`).
    pub sideband_warnings: bool,
    /// The `--pevent:*` options in effect after the last argument: how files named by
    /// other means (`lookback decode --sideband FILE`) are read.
    pub pevent: PeventConfig,
}

impl Default for PtdumpOptions {
    fn default() -> Self {
        Self {
            show_offset: true,
            show_raw_bytes: false,
            show_last_ip: false,
            show_exec_mode: false,
            show_time: false,
            show_tcal: false,
            time_as_delta: false,
            keep_tcal_on_ovf: false,
            quiet: false,
            no_pad: false,
            no_sync: false,
            no_tcal: false,
            no_wall_clock: false,
            no_timing: false,
            no_cyc: false,
            cpu: None,
            timing: TimingConfig::default(),
            sideband: SidebandFlags::default(),
            sideband_warnings: false,
            pevent: PeventConfig::default(),
        }
    }
}

/// A `perf_event` sideband file named on the command line (`--pevent[:primary|:secondary]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeventFile {
    /// The path as given, without a `:from-to` range suffix.
    pub path: String,
    /// Byte range of the file to use (`path:from[-to]`); `None` for "to the end".
    pub range: (u64, Option<u64>),
    /// Options in effect when the file was named (later options do not apply to it).
    pub config: PeventConfig,
    pub primary: bool,
}

/// A ptdump command line lookback does not understand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtdumpArgsError {
    #[error("unknown option {0}")]
    UnknownOption(String),
    #[error("{option}: missing argument")]
    MissingArgument { option: String },
    #[error("{option}: bad argument {value:?}")]
    BadArgument { option: String, value: String },
    #[error("specify either --time or --tcal")]
    TimeAndTcal,
    #[error(
        "--pevent:sample-config {0:?}: want ID:TYPE, TYPE a sample_type with SAMPLE_IDENTIFIER (0x10000)"
    )]
    SampleConfig(String),
    #[error(transparent)]
    Cpu(#[from] crate::decode::pt::packets::cpu::CpuParseError),
}

/// Splits `file:from[-to]` the way ptdump does (a suffix that does not parse is part of
/// the name).
fn split_range(arg: &str) -> (String, (u64, Option<u64>)) {
    let whole = (arg.to_owned(), (0, None));
    let Some((name, range)) = arg.rsplit_once(':') else {
        return whole;
    };
    let parsed = match range.split_once('-') {
        None => parse_c_uint(range).map(|from| (from, None)),
        Some((from, to)) => parse_c_uint(from)
            .zip(parse_c_uint(to))
            .filter(|(from, to)| to > from)
            .map(|(from, to)| (from, Some(to))),
    };
    match parsed {
        Some(range) => (name.to_owned(), range),
        None => whole,
    }
}

/// Parses an option's numeric argument into `T` (C syntax: decimal, `0x` hex, octal).
fn number<T: TryFrom<u64>>(option: &str, value: String) -> Result<T, PtdumpArgsError> {
    parse_c_uint(&value)
        .and_then(|n| T::try_from(n).ok())
        .ok_or(PtdumpArgsError::BadArgument {
            option: option.to_owned(),
            value,
        })
}

/// `ID:TYPE` of `--pevent:sample-config`; TYPE must have `SAMPLE_IDENTIFIER` (bit 16),
/// or a record could not say which it is (libipt refuses it too).
fn sample_config(value: String) -> Result<(u64, u64), PtdumpArgsError> {
    const SAMPLE_IDENTIFIER: u64 = 1 << 16;
    value
        .split_once(':')
        .and_then(|(id, kind)| parse_c_uint(id).zip(parse_c_uint(kind)))
        .filter(|(_, kind)| kind & SAMPLE_IDENTIFIER != 0)
        .ok_or(PtdumpArgsError::SampleConfig(value))
}

impl PtdumpOptions {
    /// Parses ptdump's options (everything but the trace file name).
    pub fn from_args<S: AsRef<str>>(
        args: &[S],
    ) -> Result<(Self, Vec<PeventFile>), PtdumpArgsError> {
        let mut opts = Self::default();
        let mut pevent = PeventConfig::default();
        let mut files = Vec::new();
        let mut args = args.iter().map(AsRef::as_ref);
        while let Some(arg) = args.next() {
            let mut value = |option: &str| {
                args.next()
                    .map(str::to_owned)
                    .ok_or_else(|| PtdumpArgsError::MissingArgument {
                        option: option.to_owned(),
                    })
            };
            match arg {
                "--no-sync" => opts.no_sync = true,
                "--quiet" => {
                    opts.quiet = true;
                    opts.sideband = SidebandFlags::default();
                }
                "--no-pad" => opts.no_pad = true,
                "--no-timing" => opts.no_timing = true,
                "--no-cyc" => opts.no_cyc = true,
                "--no-offset" => opts.show_offset = false,
                "--raw" => opts.show_raw_bytes = true,
                "--lastip" => opts.show_last_ip = true,
                "--exec-mode" => opts.show_exec_mode = true,
                "--time" if opts.show_tcal => return Err(PtdumpArgsError::TimeAndTcal),
                "--time" => opts.show_time = true,
                "--tcal" if opts.show_time => return Err(PtdumpArgsError::TimeAndTcal),
                "--tcal" => opts.show_tcal = true,
                "--time-delta" => opts.time_as_delta = true,
                "--no-tcal" => opts.no_tcal = true,
                "--no-wall-clock" => opts.no_wall_clock = true,
                "--keep-tcal-on-ovf" => opts.keep_tcal_on_ovf = true,
                "--sb:compact" | "--sb" => {
                    opts.sideband.verbose = false;
                    opts.sideband.compact = true;
                }
                "--sb:verbose" => {
                    opts.sideband.compact = false;
                    opts.sideband.verbose = true;
                }
                "--sb:filename" => opts.sideband.filename = true,
                "--sb:offset" => opts.sideband.offset = true,
                "--sb:time" => opts.sideband.time = true,
                "--sb:warn" => opts.sideband_warnings = true,
                "--pevent" | "--pevent:primary" | "--pevent:secondary" => {
                    let (path, range) = split_range(&value(arg)?);
                    files.push(PeventFile {
                        path,
                        range,
                        config: pevent.clone(),
                        primary: arg != "--pevent:secondary",
                    });
                }
                "--pevent:sample-type" => pevent.sample_type = number(arg, value(arg)?)?,
                "--pevent:sample-config" => {
                    pevent.sample_config.push(sample_config(value(arg)?)?);
                }
                "--pevent:time-zero" => pevent.time_zero = number(arg, value(arg)?)?,
                "--pevent:time-shift" => {
                    pevent.time_shift = number(arg, value(arg)?)?;
                }
                "--pevent:time-mult" => {
                    pevent.time_mult = number(arg, value(arg)?)?;
                }
                "--pevent:tsc-offset" => pevent.tsc_offset = number(arg, value(arg)?)?,
                "--pevent:kernel-start" => {
                    pevent.kernel_start = number(arg, value(arg)?)?;
                }
                "--pevent:sysroot" => pevent.sysroot = Some(value(arg)?),
                "--pevent:vdso-x64" => pevent.vdso_x64 = Some(value(arg)?),
                "--pevent:vdso-x32" => pevent.vdso_x32 = Some(value(arg)?),
                "--pevent:vdso-ia32" => pevent.vdso_ia32 = Some(value(arg)?),
                // Code images only matter to ptxed (see `PtxedOptions::kcore`).
                "--pevent:kcore" => {
                    value(arg)?;
                }
                "--cpu" => {
                    let cpu = value(arg)?;
                    opts.cpu = if cpu == "none" {
                        None
                    } else {
                        Some(cpu.parse()?)
                    };
                }
                "--mtc-freq" => opts.timing.mtc_freq = number(arg, value(arg)?)?,
                "--nom-freq" => opts.timing.nom_freq = number(arg, value(arg)?)?,
                "--cpuid-0x15.eax" => {
                    opts.timing.cpuid_0x15_eax = number(arg, value(arg)?)?;
                }
                "--cpuid-0x15.ebx" => {
                    opts.timing.cpuid_0x15_ebx = number(arg, value(arg)?)?;
                }
                other => return Err(PtdumpArgsError::UnknownOption(other.to_owned())),
            }
        }
        opts.pevent = pevent;
        Ok((opts, files))
    }

    /// Whether time is tracked at all (showing it, or placing sideband records).
    pub(crate) fn track_time(&self, have_sideband: bool) -> bool {
        self.show_time || self.show_tcal || have_sideband
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_corpus_options() {
        let args = "--time --time-delta --nom-freq 4 --mtc-freq 0x8 --cpuid-0x15.eax 1 \
                    --cpuid-0x15.ebx 4 --cpu 6/85 --no-pad";
        let args: Vec<&str> = args.split_whitespace().collect();
        let (opts, files) = PtdumpOptions::from_args(&args).unwrap();
        assert!(opts.show_time && opts.time_as_delta && opts.no_pad && files.is_empty());
        assert_eq!(opts.timing.mtc_freq, 8);
        assert_eq!(opts.timing.nom_freq, 4);
        assert_eq!(opts.cpu.map(|c| (c.family, c.model)), Some((6, 85)));
    }

    #[test]
    fn rejects_unknown_options_and_time_with_tcal() {
        assert!(PtdumpOptions::from_args(&["--frobnicate"]).is_err());
        assert!(PtdumpOptions::from_args(&["--time", "--tcal"]).is_err());
        assert!(PtdumpOptions::from_args(&["--mtc-freq"]).is_err());
        assert!(PtdumpOptions::from_args(&["--mtc-freq", "256"]).is_err());
    }

    #[test]
    fn pevent_files_take_the_options_before_them() {
        let args = [
            "--pevent:sample-type",
            "0x4",
            "--pevent:primary",
            "a.sb:0x10-0x20",
            "--pevent:time-mult",
            "2",
            "--pevent:secondary",
            "b.sb",
        ];
        let (_, files) = PtdumpOptions::from_args(&args).unwrap();
        assert_eq!(files[0].path, "a.sb");
        assert_eq!(files[0].range, (0x10, Some(0x20)));
        assert_eq!(files[0].config.sample_type, 4);
        assert_eq!(files[0].config.time_mult, 1);
        assert!(files[0].primary && !files[1].primary);
        assert_eq!(files[1].config.time_mult, 2);
    }

    #[test]
    fn sample_configs_need_an_identifier_and_the_last_options_are_kept() {
        let args = [
            "--pevent:sample-config",
            "0:0x10086",
            "--pevent:sample-config",
            "42:0x10006",
            "--pevent:time-zero",
            "7",
        ];
        let (opts, files) = PtdumpOptions::from_args(&args).unwrap();
        assert!(files.is_empty());
        assert_eq!(opts.pevent.sample_config, [(0, 0x10086), (42, 0x10006)]);
        assert_eq!(opts.pevent.time_zero, 7);
        for bad in ["42:0x6", "42", "x:0x10006"] {
            assert!(
                PtdumpOptions::from_args(&["--pevent:sample-config", bad]).is_err(),
                "{bad}"
            );
        }
    }
}
