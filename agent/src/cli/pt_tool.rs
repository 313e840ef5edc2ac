//! `lookback-pt`: the developer's view of lookback's Intel PT decoder, as Intel's libipt
//! tools show theirs. Not a user command: it serves the libipt conformance work, decoder
//! debugging and the decode benchmarks (`cargo xtask bench-decode*`).
//!
//! In: a raw trace (`--pt`), its code (`--raw`, `--elf`) and the tools' own options after
//! `--` (ptdump's `--lastip`, ptxed's `--event:ip`, perf sideband `--pevent:*` ...).
//! Out: on stdout, `ptdump` (one line per packet, as Intel's ptdump), `ptxed` (one line
//! per instruction and event, as `ptxed --no-inst`) or `packet-stats` (packets counted
//! in a pass of their own, timed apart, then the decode's counts and throughput). The
//! decoding itself is `lookback decode`'s ([`super::decode::run_request`]): one engine.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use super::decode::{DecodeRequest, run_request};
use super::{finish, init_logger, parse_or_exit};

/// Intel's ptdump and ptxed views of lookback's Intel PT decoder, for its developers.
/// Users decode with `lookback decode`.
#[derive(Debug, Parser)]
#[command(name = "lookback-pt", version, long_about = None)]
#[command(after_help = "Examples:\n  \
lookback-pt ptdump --pt trace.pt -- --lastip --time\n  \
lookback-pt ptxed --pt trace.pt --raw code.bin:0x400000 -- --event:ip --block:show-blocks\n  \
lookback-pt packet-stats --pt trace.pt --raw code.bin:0x400000 --threads 1")]
pub struct PtCli {
    /// More log output (-v debug, -vv trace); `RUST_LOG` overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    #[command(subcommand)]
    pub view: View,
}

/// What to print.
#[derive(Debug, Subcommand)]
pub enum View {
    /// The packets, like Intel's ptdump (its options after `--`).
    Ptdump(ToolArgs),
    /// Instructions and events, like Intel's `ptxed --no-inst` (its options after `--`).
    Ptxed(ToolArgs),
    /// The packets counted in a pass of their own, timed apart, then the decode's counts
    /// and throughput (`lookback decode --pt ... --stats` without the packet pass).
    PacketStats(PacketStatsArgs),
}

/// The trace and its code, as `lookback decode --pt` takes them.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The raw Intel PT trace (the AUX data, oldest byte first).
    #[arg(long, value_name = "FILE")]
    pub pt: String,
    /// Code at an address: FILE[:OFFSET[-END]]:ADDR. Repeatable; later files shadow.
    #[arg(long, value_name = "FILE:ADDR")]
    pub raw: Vec<String>,
    /// An ELF file the trace ran, its lowest loadable segment at BASE if given.
    #[arg(long, value_name = "FILE[:BASE]")]
    pub elf: Vec<String>,
    /// The CPU that recorded the trace, for its errata: FAMILY/MODEL[/STEPPING].
    #[arg(long, value_name = "F/M[/S]")]
    pub cpu: Option<String>,
}

/// `ptdump` and `ptxed`.
#[derive(Debug, Args)]
pub struct ToolArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Options of Intel's tool (e.g. `--event:ip`, `--mtc-freq 4`, `--pevent:primary F`).
    #[arg(last = true, value_name = "TOOL-OPTIONS")]
    pub tool_args: Vec<String>,
}

/// `packet-stats`.
#[derive(Debug, Args)]
pub struct PacketStatsArgs {
    #[command(flatten)]
    pub trace: TraceArgs,
    /// Decode on N threads (default: every core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Options of ptxed that set up the decoder (e.g. `--mtc-freq 4`), after `--`.
    #[arg(last = true, value_name = "TOOL-OPTIONS")]
    pub tool_args: Vec<String>,
}

impl View {
    /// The decode this view asks for.
    #[must_use]
    pub fn request(self) -> DecodeRequest {
        let (trace, tool_args, mut request) = match self {
            View::Ptdump(args) => (
                args.trace,
                args.tool_args,
                DecodeRequest {
                    ptdump: true,
                    ..DecodeRequest::default()
                },
            ),
            View::Ptxed(args) => (
                args.trace,
                args.tool_args,
                DecodeRequest {
                    ptxed: true,
                    ..DecodeRequest::default()
                },
            ),
            View::PacketStats(args) => (
                args.trace,
                args.tool_args,
                DecodeRequest {
                    stats: true,
                    packet_stats: true,
                    threads: args.threads,
                    ..DecodeRequest::default()
                },
            ),
        };
        request.pt = vec![trace.pt];
        request.raw = trace.raw;
        request.elf = trace.elf;
        request.cpu = trace.cpu;
        request.tool_args = tool_args;
        request
    }
}

/// `lookback-pt`'s `main`: parses, decodes, prints errors with their causes (exit 2 for
/// usage, 1 at run time, as `lookback`).
pub fn main() -> ExitCode {
    let cli = match parse_or_exit::<PtCli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    init_logger(cli.verbose, cli.quiet);
    finish("lookback-pt", run_request(&cli.view.request()))
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        PtCli::command().debug_assert();
    }

    #[test]
    fn each_view_asks_for_its_mode_with_the_tools_options() {
        let cli = PtCli::try_parse_from([
            "lookback-pt",
            "ptxed",
            "--pt",
            "t.pt",
            "--raw",
            "c.bin:0x1000",
            "--",
            "--event:ip",
        ])
        .unwrap();
        let request = cli.view.request();
        assert!(request.ptxed && !request.ptdump && !request.stats);
        assert_eq!(request.tool_args, ["--event:ip"]);
        assert_eq!(request.raw, ["c.bin:0x1000"]);
        let cli =
            PtCli::try_parse_from(["lookback-pt", "packet-stats", "--pt", "t", "--threads", "1"])
                .unwrap();
        let request = cli.view.request();
        assert!(request.stats && request.packet_stats && request.threads == Some(1));
        // No trace file out of these views.
        assert!(PtCli::try_parse_from(["lookback-pt", "ptdump", "--pt", "t", "-o", "x"]).is_err());
    }
}
