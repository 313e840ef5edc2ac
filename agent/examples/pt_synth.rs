//! Writes a synthetic Intel PT trace and the code it runs over, for `cargo xtask
//! bench-decode`: `pt_synth OUT_DIR MEGABYTES [SEED]` writes `OUT_DIR/synth.pt` and
//! `OUT_DIR/synth.bin` (mapped at 0x400000), see `lookback::decode::pt::encode`.
#![expect(
    clippy::print_stdout,
    reason = "a command-line tool reports what it wrote"
)]

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use lookback::decode::pt::encode::{CODE_BASE, SynthProgram, encode};

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: pt_synth OUT_DIR MEGABYTES [SEED]")?,
    );
    let megabytes: usize = args
        .next()
        .context("missing MEGABYTES")?
        .parse()
        .context("MEGABYTES")?;
    let seed: u64 = match args.next() {
        Some(seed) => seed.parse().context("SEED")?,
        None => 1,
    };
    let program = SynthProgram::generate(seed, 40);
    let encoded = encode(&program, seed, megabytes << 20, false);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pt = dir.join("synth.pt");
    let bin = dir.join("synth.bin");
    std::fs::write(&pt, &encoded.trace).with_context(|| format!("writing {}", pt.display()))?;
    std::fs::write(&bin, &program.code).with_context(|| format!("writing {}", bin.display()))?;
    println!(
        "trace={} code={}:{CODE_BASE:#x} bytes={} code_bytes={} instructions={}",
        pt.display(),
        bin.display(),
        encoded.trace.len(),
        program.code.len(),
        encoded.instructions
    );
    Ok(())
}
