//! `cargo xtask demo`: builds lookback and a small C workload, then runs lookback on it with
//! a latency trigger, so a newcomer sees the whole product in one command.
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
    run(Command::new("cc")
        .args(["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
        .arg(&workload)
        .arg(&source))
    .context("building the demo workload (needs a C compiler)")?;
    println!();
    println!("xtask demo: the workload calls handle_request() 40 times; a few calls take 8 ms,");
    println!("the rest under 1 ms. lookback's uretprobe measures each call in the kernel and");
    println!("only the slow ones reach userspace:");
    println!();
    println!(
        "$ lookback run --dry-run --max-snapshots 0 --trigger 'func:handle_request>5ms' -- {}",
        workload.display()
    );
    run(Command::new(env.release_bin())
        .args([
            "run",
            "--dry-run",
            "--max-snapshots",
            "0",
            "--trigger",
            "func:handle_request>5ms",
            "--",
        ])
        .arg(&workload))?;
    println!();
    println!("Each line above is one trigger decided in the kernel (rule, pid/tid, duration).");
    Ok(())
}
