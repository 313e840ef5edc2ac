//! Project tasks. `cargo xtask test` and `cargo xtask demo` work on a fresh machine: they run
//! `setup` first, which installs what the build needs into the project (`.tools/`) and mounts
//! tracefs.
#![expect(
    clippy::print_stdout,
    reason = "xtask reports progress to the terminal"
)]
#![expect(
    clippy::print_stderr,
    reason = "xtask reports progress to the terminal"
)]

mod bench;
mod bench_agent_scale;
mod bench_decode;
mod bench_decode_real;
mod bench_sampling;
mod bench_startup;
mod bench_upload;
mod demo;
mod pt_smoke;
mod setup;
mod soak;
mod test;
mod util;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// lookback's project tasks.
#[derive(Debug, Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install rust-src and bpf-linker into .tools/, mount tracefs (idempotent).
    Setup,
    /// setup, then build the workspace (debug) and the release binary.
    Build,
    /// setup, then run unit tests and the privileged integration tests (needs root).
    Test {
        /// Extra arguments for the test binaries (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// setup, build, and run lookback on a built-in demo workload.
    Demo,
    /// rustfmt --check and clippy -D warnings (userspace and eBPF crates).
    Lint,
    /// Trigger overhead on the traced process, side by side with bpftrace, the start-up
    /// delay of `run` beside perf record and bpftrace, then the trigger → freeze latency of
    /// the sampling backend (needs root).
    Bench {
        /// Only the trigger → freeze latency table.
        #[arg(long)]
        freeze_only: bool,
        /// Only the start-up table: the delay before the command's first instruction
        /// under `lookback run`, `perf record` and `bpftrace -c`.
        #[arg(long, conflicts_with = "freeze_only")]
        startup_only: bool,
        /// Only the agent at scale: one sampling rule matching 10, 100, 500 idle processes
        /// (1 and 20 threads): attach time, ring memory, fds, RSS, idle CPU.
        #[arg(long, conflicts_with_all = ["freeze_only", "startup_only"])]
        agent_scale: bool,
        /// Only the upload table: trigger → snapshot visible in a real S3 server
        /// (`SeaweedFS` on loopback), the agent's upload time, CPU and RSS, beside curl
        /// uploading the same files.
        #[arg(long, conflicts_with_all = ["freeze_only", "startup_only", "agent_scale"])]
        upload_only: bool,
        /// Only the trigger overhead table (function and syscall rules beside bpftrace).
        #[arg(long, conflicts_with_all = ["freeze_only", "startup_only", "agent_scale", "upload_only"])]
        overhead_only: bool,
        /// Triggers in the latency table (default 1000; with --upload-only, 60).
        #[arg(long)]
        triggers: Option<usize>,
    },
    /// Intel PT decode throughput on a synthetic 16 MiB trace, beside libipt if installed;
    /// then a 4 MiB PT snapshot decoded, symbolized and written as a trace (time, memory).
    BenchDecode {
        /// Only the snapshot-to-trace part.
        #[arg(long)]
        snapshot_only: bool,
        /// Instead: real captures in DIR (nyx-fuzz/libxdc_experiments' `test_data`),
        /// beside libipt's block decoder.
        #[arg(long, value_name = "DIR")]
        real_traces: Option<std::path::PathBuf>,
        /// With --real-traces: libxdc's source (nyx-fuzz/libxdc), built and run beside.
        #[arg(long, value_name = "DIR", requires = "real_traces")]
        libxdc: Option<std::path::PathBuf>,
        /// With --real-traces: libipt's source (intel/libipt), built with cmake and used
        /// as the reference instead of Debian's older libipt-dev.
        #[arg(long, value_name = "DIR", requires = "real_traces")]
        libipt: Option<std::path::PathBuf>,
    },
    /// The sampling recorder's cost to the traced program (1 kHz, 10 kHz; stack copies
    /// and frame pointers) and its decode cost per sample, beside perf record (fp, dwarf).
    BenchSampling,
    /// On a machine with Intel PT: `lookback check`, then PT captures of the test workload
    /// through run and attach (function, syscall, signal triggers; with and without an
    /// address filter), each compared with the workload's own calls; exits 1 on a mismatch.
    /// Without PT it says so and exits 0. Needs no network: uses `LOOKBACK_BIN` if set.
    PtSmoke {
        /// `sampling` runs the same captures with the sampling recorder (to try the script
        /// where PT is missing; calls are not counted then).
        #[arg(long, default_value = "intel-pt")]
        backend: String,
    },
    /// Build and run `lookback-pt`, the decoder's developer views (Intel's ptdump and
    /// ptxed, packet-stats): `cargo xtask pt ptxed --pt FILE --raw CODE:ADDR -- --event:ip`.
    Pt {
        /// `lookback-pt`'s arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The agent under continuous triggers; RSS, CPU and fds sampled every 10 s (needs root).
    Soak {
        /// How long.
        #[arg(long, default_value_t = 30)]
        minutes: u64,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result: Result<()> = match cli.command {
        Command::Setup => setup::setup().map(|_| ()),
        Command::Build => setup::setup().and_then(|env| util::build(&env, true)),
        Command::Test { args } => setup::setup().and_then(|env| test::test(&env, &args)),
        Command::Demo => setup::setup().and_then(|env| demo::demo(&env)),
        Command::Lint => setup::setup().and_then(|env| test::lint(&env)),
        Command::Bench {
            freeze_only,
            startup_only,
            agent_scale,
            upload_only,
            overhead_only,
            triggers,
        } => setup::setup().and_then(|env| {
            let only = bench::Only {
                freeze: freeze_only,
                startup: startup_only,
                agent_scale,
                upload: upload_only,
                overhead: overhead_only,
            };
            let triggers = triggers.unwrap_or(if upload_only { 60 } else { 1000 });
            bench::bench(&env, only, triggers)
        }),
        Command::BenchDecode {
            snapshot_only,
            real_traces,
            libxdc,
            libipt,
        } => setup::setup().and_then(|env| match real_traces {
            Some(dir) => {
                bench_decode_real::bench_real(&env, &dir, libxdc.as_deref(), libipt.as_deref())
            }
            None => bench_decode::bench_decode(&env, snapshot_only),
        }),
        Command::BenchSampling => {
            setup::setup().and_then(|env| bench_sampling::bench_sampling(&env))
        }
        Command::PtSmoke { backend } => {
            util::workspace_root().and_then(|root| pt_smoke::pt_smoke(&root, &backend))
        }
        Command::Soak { minutes } => setup::setup().and_then(|env| soak::soak(&env, minutes)),
        Command::Pt { args } => {
            return setup::setup()
                .and_then(|env| util::pt_tool(&env, &args))
                .unwrap_or_else(|err| {
                    eprintln!("xtask: error: {err:#}");
                    std::process::ExitCode::FAILURE
                });
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("xtask: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
