//! Conformance test: our `ptxed` text against Intel libipt's expected `ptxed` output.
//!
//! In: `../shared/corpus/libipt/{core,pevent}` (or `$LOOKBACK_SHARED_DIR/corpus/libipt`):
//! for each test `NAME`, the trace `NAME.pt`, the code `NAME.bin` mapped at the `org`
//! of `MANIFEST.tsv`, the ptxed options of its fifth column, its perf sideband files
//! `NAME-pevent-<prio>,<k=v,...>.sb` (whose MMAP records map files of the suite), and
//! the expectations `NAME-ptxed.exp` / `NAME-ptxed-cpu_F_M[_S].exp`. Out: pass counts on stdout (also one
//! for ptdump and ptxed together), a short diff per failure, and a failed assertion when
//! more cases fail than [`ALLOWED_FAILURES`] (a ratchet that only goes down).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use super::conformance::{corpus_dir, has_extension, normalize, short_diff, sideband_args};
use super::files::{FileLoader, kernel_image, read_pevent};
use super::ptxed::{Sideband, ptxed_with_sideband};
use super::ptxed_opts::PtxedOptions;
use crate::decode::pt::flow::image::Image;
use crate::decode::pt::sideband::pevent::SidebandStream;

/// Cases deliberately not run, each with its reason.
const SKIPPED: &[(&str, &str)] = &[];

/// The most failures tolerated; lower it as cases get fixed.
const ALLOWED_FAILURES: usize = 0;

/// `name → (org, ptxed options)` from a suite's MANIFEST.tsv.
fn manifest(suite: &Path) -> HashMap<String, (String, String)> {
    let text = fs::read_to_string(suite.join("MANIFEST.tsv")).expect("read MANIFEST.tsv");
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            Some((
                (*cols.first()?).to_owned(),
                (
                    cols.get(1).copied().unwrap_or("").to_owned(),
                    cols.get(4).copied().unwrap_or("").to_owned(),
                ),
            ))
        })
        .collect()
}

fn run_case(suite: &Path, name: &str, args: &[String]) -> Result<String, String> {
    let opts = PtxedOptions::from_args(args).map_err(|e| format!("options: {e}"))?;
    let trace =
        fs::read(suite.join(format!("{name}.pt"))).map_err(|e| format!("{name}.pt: {e}"))?;
    let mut image = Image::new();
    for raw in &opts.raw {
        let bytes = fs::read(suite.join(&raw.path)).map_err(|e| format!("{}: {e}", raw.path))?;
        image.add(&raw.path, raw.slice(&bytes).to_vec(), raw.addr);
    }
    let data = opts
        .pevent
        .iter()
        .map(|f| read_pevent(suite, f).map_err(|e| format!("{}: {e}", f.path)))
        .collect::<Result<Vec<_>, _>>()?;
    let loader = FileLoader {
        root: suite.to_owned(),
    };
    let sideband = if opts.pevent.is_empty() {
        None
    } else {
        Some(Sideband {
            streams: opts
                .pevent
                .iter()
                .zip(&data)
                .map(|(f, data)| SidebandStream {
                    name: f.path.clone(),
                    data,
                    config: f.config.clone(),
                    primary: f.primary,
                })
                .collect(),
            kernel: kernel_image(suite, &opts.kcore).map_err(|e| format!("{e:#}"))?,
            loader: &loader,
        })
    };
    let mut out = String::new();
    ptxed_with_sideband(&trace, &image, sideband, &opts, &mut out)
        .map_err(|e| format!("write: {e}"))?;
    Ok(out)
}

/// Runs one suite's ptxed cases; returns (passed, failed, skipped).
fn run_suite(corpus: &Path, suite_name: &str, report: &mut String) -> (usize, usize, usize) {
    let suite = corpus.join(suite_name);
    let options = manifest(&suite);
    let mut exps: Vec<String> = fs::read_dir(&suite)
        .expect("read corpus dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| has_extension(f, "exp") && f.contains("-ptxed"))
        .collect();
    exps.sort();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for exp in exps {
        let stem = &exp[..exp.len() - 4];
        let Some(at) = stem.rfind("-ptxed") else {
            continue;
        };
        let (name, variant) = (&stem[..at], &stem[at + "-ptxed".len()..]);
        if let Some((_, why)) = SKIPPED.iter().find(|(case, _)| *case == stem) {
            println!("  skip {suite_name}/{stem}: {why}");
            skipped += 1;
            continue;
        }
        let (org, opts) = options.get(name).cloned().unwrap_or_default();
        let mut args: Vec<String> = Vec::new();
        if let Some(cpu) = variant.strip_prefix("-cpu_") {
            args.extend(["--cpu".to_owned(), cpu.replace('_', "/")]);
        }
        args.extend(["--raw".to_owned(), format!("{name}.bin:{org}")]);
        args.extend(["--no-inst".to_owned(), "--check".to_owned()]);
        args.extend(opts.split_whitespace().map(str::to_owned));
        for (_, sb) in sideband_args(&suite, name) {
            args.extend(sb);
        }
        let expected = normalize(&fs::read_to_string(suite.join(&exp)).expect("read .exp"));
        match run_case(&suite, name, &args) {
            Ok(out) if normalize(&out) == expected => passed += 1,
            Ok(out) => {
                failed += 1;
                let diff = short_diff(&expected, &normalize(&out));
                let _ = writeln!(
                    report,
                    "  FAIL {suite_name}/{stem} [{}]\n{diff}",
                    args.join(" ")
                );
            }
            Err(why) => {
                failed += 1;
                let _ = writeln!(report, "  FAIL {suite_name}/{stem}: {why}");
            }
        }
    }
    (passed, failed, skipped)
}

#[test]
fn libipt_ptxed_corpus() {
    let Some(corpus) = corpus_dir() else {
        println!("libipt ptxed corpus: skipped, corpus not found (set LOOKBACK_SHARED_DIR)");
        return;
    };
    let mut report = String::new();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for suite in ["core", "pevent"] {
        let (p, f, s) = run_suite(&corpus, suite, &mut report);
        passed += p;
        failed += f;
        skipped += s;
    }
    print!("{report}");
    println!("libipt ptxed corpus: {passed} passed, {failed} failed, {skipped} skipped");
    let (dp, df, ds) = super::conformance::ptdump_counts(&corpus);
    println!(
        "libipt corpus: {} passed, {} failed, {} skipped",
        passed + dp,
        failed + df,
        skipped + ds
    );
    assert!(
        failed.saturating_sub(ALLOWED_FAILURES) == 0,
        "{failed} libipt ptxed cases failed (ratchet: {ALLOWED_FAILURES})"
    );
}
