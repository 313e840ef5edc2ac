//! Options of the `ptxed`-style instruction dump, parsed from ptxed's command line.
//!
//! In: Intel `ptxed` arguments (`--raw FILE:ADDR`, `--cpu 6/85`, `--event:ip`,
//! `--block:show-blocks`, `--stat`, `--mtc-freq 4`, `--pevent:primary FILE` ...). Out:
//! [`PtxedOptions`]: what to print, how to configure the flow layer, and the code,
//! sideband and kernel core files the caller has to load (the dump itself never opens
//! files). Used by `lookback-pt ptxed`
//! and by the corpus conformance test, which runs libipt's expectations with their
//! original options.

use super::ptdump_opts::{PeventFile, PtdumpOptions};
use crate::decode::pt::flow::block::FlowConfig;
use crate::decode::pt::flow::image::{RawSpec, RawSpecError};
use crate::decode::pt::packets::cpu::{Cpu, parse_c_uint};

/// What `ptxed` prints and how it decodes; the defaults are ptxed's.
#[expect(
    clippy::struct_excessive_bools,
    reason = "mirrors ptxed's independent command-line switches"
)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PtxedOptions {
    /// The flow layer's configuration (timing, errata, filters, tick/iflags events).
    pub flow: FlowConfig,
    /// The recording CPU (`--cpu F/M[/S]`); its errata are looked up at decode time.
    pub cpu: Option<Cpu>,
    /// Emulate libipt's instruction-flow decoder instead of its block decoder.
    pub insn_decoder: bool,
    /// Print `[block]` before each block (`--block:show-blocks`).
    pub show_blocks: bool,
    /// Print only errors and statistics (`--quiet`).
    pub quiet: bool,
    /// Print the trace offset before each instruction and event (`--offset`).
    pub print_offset: bool,
    /// Print the time before each instruction (`--time`).
    pub print_time: bool,
    /// Print the time of events (`--event:time`).
    pub print_event_time: bool,
    /// Print the IP of events (`--event:ip`).
    pub print_event_ip: bool,
    /// Go on after errors where an event gives an IP (`--resync-on-error`).
    pub resync_on_error: bool,
    /// Print statistics at the end (`--stat`, `--stat:insn`, `--stat:blocks`).
    pub print_stats: bool,
    pub stat_insn: bool,
    pub stat_blocks: bool,
    /// Code to map (`--raw FILE[:OFFSET[-END]]:ADDR`), in order.
    pub raw: Vec<RawSpec>,
    /// The trace file (`--pt FILE`).
    pub pt: Option<String>,
    /// Perf sideband files and how to print their records (`--pevent:*`, `--sb:*`).
    pub sideband: PtdumpOptions,
    pub pevent: Vec<PeventFile>,
    /// Kernel core dumps whose code every process's image starts with (`--pevent:kcore`).
    pub kcore: Vec<String>,
    /// Print context switches (`--sb:switch`).
    pub print_switches: bool,
}

/// A ptxed command line lookback does not understand.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PtxedArgsError {
    #[error("unknown option {0}")]
    UnknownOption(String),
    #[error("{option}: missing argument")]
    MissingArgument { option: String },
    #[error("{option}: bad argument {value:?}")]
    BadArgument { option: String, value: String },
    #[error(transparent)]
    Raw(#[from] RawSpecError),
    #[error(transparent)]
    Cpu(#[from] crate::decode::pt::packets::cpu::CpuParseError),
    #[error(transparent)]
    Sideband(#[from] super::ptdump_opts::PtdumpArgsError),
}

fn number<T: TryFrom<u64>>(option: &str, value: &str) -> Result<T, PtxedArgsError> {
    parse_c_uint(value)
        .and_then(|n| T::try_from(n).ok())
        .ok_or_else(|| PtxedArgsError::BadArgument {
            option: option.to_owned(),
            value: value.to_owned(),
        })
}

/// Options that only matter for instruction disassembly, which lookback does not print
/// (`--check` compares libipt's instruction classes with XED's; ours come from iced-x86
/// in the first place).
const IGNORED_FLAGS: &[&str] = &[
    "--no-inst",
    "--check",
    "--att",
    "--raw-insn",
    "-v",
    "--verbose",
];

impl PtxedOptions {
    /// Parses ptxed's options.
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Self, PtxedArgsError> {
        let mut opts = Self::default();
        let mut sideband_args: Vec<String> = Vec::new();
        let mut args = args.iter().map(AsRef::as_ref);
        while let Some(arg) = args.next() {
            let mut value = || {
                args.next().ok_or_else(|| PtxedArgsError::MissingArgument {
                    option: arg.to_owned(),
                })
            };
            let flow = &mut opts.flow;
            match arg {
                _ if IGNORED_FLAGS.contains(&arg) => {}
                "--pt" => opts.pt = Some(value()?.to_owned()),
                "--raw" => opts.raw.push(RawSpec::parse(value()?)?),
                "--quiet" | "-q" => opts.quiet = true,
                "--offset" => opts.print_offset = true,
                "--time" => opts.print_time = true,
                "--event:time" => opts.print_event_time = true,
                "--event:ip" => opts.print_event_ip = true,
                "--event:tick" => flow.tick_events = true,
                "--event:iflags" => flow.events.iflags_events = true,
                "--resync-on-error" => opts.resync_on_error = true,
                "--stat" => opts.print_stats = true,
                "--stat:insn" => {
                    opts.print_stats = true;
                    opts.stat_insn = true;
                }
                "--stat:blocks" => {
                    opts.print_stats = true;
                    opts.stat_blocks = true;
                }
                "--insn-decoder" => opts.insn_decoder = true,
                "--block-decoder" => opts.insn_decoder = false,
                "--block:show-blocks" => opts.show_blocks = true,
                "--block:end-on-call" => flow.end_on_call = true,
                "--block:end-on-jump" => flow.end_on_jump = true,
                "--insn:keep-tcal-on-ovf" | "--block:keep-tcal-on-ovf" => {
                    flow.events.keep_tcal_on_ovf = true;
                }
                "--cpu" => {
                    let cpu = value()?;
                    opts.cpu = if cpu == "none" {
                        None
                    } else {
                        Some(cpu.parse()?)
                    };
                }
                "--mtc-freq" => flow.events.timing.mtc_freq = number(arg, value()?)?,
                "--nom-freq" => flow.events.timing.nom_freq = number(arg, value()?)?,
                "--cpuid-0x15.eax" => flow.events.timing.cpuid_0x15_eax = number(arg, value()?)?,
                "--cpuid-0x15.ebx" => flow.events.timing.cpuid_0x15_ebx = number(arg, value()?)?,
                "--iscache-limit" => {
                    number::<u64>(arg, value()?)?;
                }
                "--sb:switch" => opts.print_switches = true,
                "--pevent:kcore" => opts.kcore.push(value()?.to_owned()),
                _ if arg.starts_with("--filter:addr") => {
                    let v: u64 = number(arg, value()?)?;
                    set_filter(&mut flow.events.filter, arg, v)?;
                }
                _ if arg.starts_with("--sb") || arg.starts_with("--pevent") => {
                    sideband_args.push(arg.to_owned());
                    if arg.starts_with("--pevent") {
                        sideband_args.push(value()?.to_owned());
                    }
                }
                other => return Err(PtxedArgsError::UnknownOption(other.to_owned())),
            }
        }
        let (sideband, pevent) = PtdumpOptions::from_args(&sideband_args)?;
        opts.sideband = sideband;
        opts.pevent = pevent;
        if opts.print_stats && !opts.stat_insn && !opts.stat_blocks {
            opts.stat_insn = true;
            opts.stat_blocks = !opts.insn_decoder;
        }
        Ok(opts)
    }
}

/// `--filter:addrN_cfg`, `--filter:addrN_a`, `--filter:addrN_b`.
fn set_filter(
    filter: &mut crate::decode::pt::events::evdec::AddrFilter,
    option: &str,
    value: u64,
) -> Result<(), PtxedArgsError> {
    let bad = || PtxedArgsError::UnknownOption(option.to_owned());
    let rest = option.strip_prefix("--filter:addr").ok_or_else(bad)?;
    let (n, field) = rest.split_once('_').ok_or_else(bad)?;
    let n: usize = n.parse().map_err(|_| bad())?;
    if n >= filter.cfg.len() {
        return Err(bad());
    }
    match field {
        "cfg" => {
            filter.cfg[n] = u8::try_from(value)
                .ok()
                .filter(|&v| v <= 15)
                .ok_or_else(|| PtxedArgsError::BadArgument {
                    option: option.to_owned(),
                    value: value.to_string(),
                })?;
        }
        "a" => filter.ranges[n].0 = value,
        "b" => filter.ranges[n].1 = value,
        _ => return Err(bad()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_corpus_options() {
        let args = "--raw a.bin:0x1000 --no-inst --check --event:tick --event:time --mtc-freq 4 \
                    --cpuid-0x15.eax 1 --cpuid-0x15.ebx 4 --block:keep-tcal-on-ovf --cpu 6/85 \
                    --filter:addr0_cfg 1 --filter:addr0_a 0x1000 --filter:addr0_b 0x10ff --stat";
        let args: Vec<&str> = args.split_whitespace().collect();
        let opts = PtxedOptions::from_args(&args).unwrap();
        assert_eq!(opts.raw[0].addr, 0x1000);
        assert!(
            opts.flow.tick_events && opts.print_event_time && opts.flow.events.keep_tcal_on_ovf
        );
        assert_eq!(opts.flow.events.timing.mtc_freq, 4);
        assert_eq!(opts.flow.events.filter.cfg[0], 1);
        assert_eq!(opts.flow.events.filter.ranges[0], (0x1000, 0x10ff));
        assert!(opts.stat_insn && opts.stat_blocks);
        assert!(PtxedOptions::from_args(&["--frobnicate"]).is_err());
        assert!(PtxedOptions::from_args(&["--raw"]).is_err());
    }
}
