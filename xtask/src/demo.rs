//! `cargo xtask demo`: builds lookback and a small C workload, then records it with the
//! sampling backend and a latency trigger and writes `target/demo/demo.fxt.gz`, so a
//! newcomer sees the whole product in one command.
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::util::{BuildEnv, run};

pub fn demo(env: &BuildEnv) -> Result<()> {
    if !env.is_root {
        bail!("the demo loads BPF programs: run as root (sudo -E cargo xtask demo)");
    }
    run(env.cargo().args(["build", "--release", "-p", "lookback"]))?;
    let out = env.root.join("target/demo");
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let workload = out.join("demo-workload");
    let source = env.root.join("tests/workloads/demo.c");
    // Built as distributions build C (-O2, no frame pointers): the stacks come from
    // unwinding each sample's stack copy with the binary's .eh_frame.
    run(Command::new("cc")
        .args(["-O2", "-g", "-pthread", "-o"])
        .arg(&workload)
        .arg(&source))
    .context("building the demo workload (needs a C compiler)")?;
    let trace = out.join("demo.fxt.gz");
    println!();
    println!("xtask demo: the workload calls handle_request() 40 times; a few calls take 8 ms");
    println!("(a CPU-bound cold-cache scan), the rest under 1 ms. lookback samples the workload's");
    println!(
        "stacks into a ring buffer; uprobes on its entry and exits time each call in the kernel, and the"
    );
    println!("first slow one freezes the ring and turns the last milliseconds into a trace:");
    println!();
    println!(
        "$ lookback run --backend sampling --trigger 'func:handle_request>5ms' -o {} -- {}",
        trace.display(),
        workload.display()
    );
    let _ = std::fs::remove_file(&trace);
    run(Command::new(env.release_bin())
        .args([
            "run",
            "--backend",
            "sampling",
            "--trigger",
            "func:handle_request>5ms",
            "-o",
        ])
        .arg(&trace)
        .arg("--")
        .arg(&workload))?;
    let size = std::fs::metadata(&trace)
        .with_context(|| format!("lookback wrote no {}", trace.display()))?
        .len();
    println!();
    println!(
        "Wrote {} ({size} bytes): one track per thread, nested",
        trace.display()
    );
    println!("slices per function (handle_request → scan_cold_cache → hash_row, unwound");
    println!("without frame pointers: the workload is built with cc -O2, which also turned");
    println!("query_database's call of scan_cold_cache into a tail jump, so it has no frame),");
    println!("[off-cpu] slices where a thread slept (parse_request's nanosleep, args: reason and");
    println!("the function it blocked in), and an instant `trigger: func:handle_request>5ms`");
    println!(
        "where the slow call returned, with handle_request and its callers open. To look at it:"
    );
    println!(
        "  - https://ui.perfetto.dev → Open trace file → {}",
        trace.display()
    );
    println!("  - https://magic-trace.org → open the same file");
    println!("  - lookback run ... -o demo.json gives Chrome JSON (chrome://tracing, speedscope)");
    Ok(())
}
