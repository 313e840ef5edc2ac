//! Conformance test: our `ptdump` against Intel libipt's expected `ptdump` output.
//!
//! In: `../shared/corpus/libipt/{core,pevent}` (or `$LOOKBACK_SHARED_DIR/corpus/libipt`):
//! for each test `NAME`, the trace `NAME.pt`, the options in `MANIFEST.tsv`, perf sideband
//! files `NAME-pevent-<prio>,<k=v,...>.sb`, and the expectations `NAME-ptdump.exp` and
//! `NAME-ptdump-cpu_F_M[_S].exp` (the latter run with `--cpu F/M[/S]`). Out: a pass count
//! on stdout, a short diff per failure, and a failed assertion when any case fails.
//! Output is compared the way libipt's test script does (`diff -b`: the amount of
//! whitespace does not matter).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use super::files::read_pevent;
use super::ptdump::ptdump_with_sideband;
use super::ptdump_opts::PtdumpOptions;
use crate::decode::pt::sideband::pevent::SidebandStream;

/// Cases deliberately not run, each with its reason.
const SKIPPED: &[(&str, &str)] = &[];

pub(super) fn corpus_dir() -> Option<PathBuf> {
    crate::test_support::shared_corpus("libipt", "core/MANIFEST.tsv")
}

pub(super) fn has_extension(file: &str, ext: &str) -> bool {
    Path::new(file).extension().is_some_and(|e| e == ext)
}

/// `name → ptdump options` from a suite's MANIFEST.tsv.
fn manifest(suite: &Path) -> HashMap<String, String> {
    let text = fs::read_to_string(suite.join("MANIFEST.tsv")).expect("read MANIFEST.tsv");
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split('\t').collect();
            Some((
                (*cols.first()?).to_owned(),
                cols.get(3).copied().unwrap_or("").to_owned(),
            ))
        })
        .collect()
}

/// `diff -b`: runs of whitespace compare equal, trailing whitespace is ignored.
pub(super) fn normalize(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.starts_with(';'))
        .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// The ptdump arguments libipt's test script passes for the sideband files of `name`.
pub(super) fn sideband_args(suite: &Path, name: &str) -> Vec<(String, Vec<String>)> {
    let prefix = format!("{name}-pevent-");
    let mut files: Vec<String> = fs::read_dir(suite)
        .expect("read corpus dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|f| f.starts_with(&prefix) && has_extension(f, "sb"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let spec = &file[prefix.len()..file.len() - 3];
            let mut parts = spec.split(',');
            let prio = parts.next().unwrap_or("primary").to_owned();
            let mut args = Vec::new();
            for kv in parts {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                args.push(format!("--pevent:{k}"));
                args.push(v.to_owned());
            }
            args.push(format!("--pevent:{prio}"));
            args.push(file.clone());
            (file, args)
        })
        .collect()
}

fn run_case(suite: &Path, name: &str, args: &[String]) -> Result<String, String> {
    let (opts, pevent) = PtdumpOptions::from_args(args).map_err(|e| format!("options: {e}"))?;
    let trace =
        fs::read(suite.join(format!("{name}.pt"))).map_err(|e| format!("{name}.pt: {e}"))?;
    let sb_data = pevent
        .iter()
        .map(|f| read_pevent(suite, f).map_err(|e| format!("{}: {e}", f.path)))
        .collect::<Result<Vec<_>, String>>()?;
    let streams = pevent
        .iter()
        .zip(&sb_data)
        .map(|(f, data)| SidebandStream {
            name: f.path.clone(),
            data,
            config: f.config.clone(),
            primary: f.primary,
        })
        .collect();
    let mut out = String::new();
    ptdump_with_sideband(&trace, streams, &opts, &mut out).map_err(|e| format!("write: {e}"))?;
    Ok(out)
}

/// A few lines around the first difference.
pub(super) fn short_diff(expected: &[String], actual: &[String]) -> String {
    let first = expected
        .iter()
        .zip(actual)
        .position(|(e, a)| e != a)
        .unwrap_or(expected.len().min(actual.len()));
    let mut text = String::new();
    let from = first.saturating_sub(2);
    for i in from..(first + 4) {
        if let Some(line) = expected.get(i) {
            let _ = writeln!(text, "    -{line}");
        }
        if let Some(line) = actual.get(i) {
            let _ = writeln!(text, "    +{line}");
        }
    }
    let _ = write!(
        text,
        "    ({} expected lines, {} actual)",
        expected.len(),
        actual.len()
    );
    text
}

/// Runs every ptdump case; returns (passed, failed, skipped) and the failure report.
fn run_ptdump(corpus: &Path, verbose: bool) -> (usize, usize, usize, String) {
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut report = String::new();
    for suite_name in ["core", "pevent"] {
        let suite = corpus.join(suite_name);
        let options = manifest(&suite);
        let mut exps: Vec<String> = fs::read_dir(&suite)
            .expect("read corpus dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|f| has_extension(f, "exp") && f.contains("-ptdump"))
            .collect();
        exps.sort();
        for exp in exps {
            let stem = &exp[..exp.len() - 4];
            let Some(at) = stem.rfind("-ptdump") else {
                continue;
            };
            let (name, variant) = (&stem[..at], &stem[at + "-ptdump".len()..]);
            if let Some((_, why)) = SKIPPED.iter().find(|(case, _)| *case == stem) {
                if verbose {
                    println!("  skip {suite_name}/{stem}: {why}");
                }
                skipped += 1;
                continue;
            }
            let mut args: Vec<String> = Vec::new();
            if let Some(cpu) = variant.strip_prefix("-cpu_") {
                args.extend(["--cpu".to_owned(), cpu.replace('_', "/")]);
            }
            let opts = options.get(name).map_or("", String::as_str);
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
    }
    (passed, failed, skipped, report)
}

/// The ptdump counts, for the combined corpus line.
pub(super) fn ptdump_counts(corpus: &Path) -> (usize, usize, usize) {
    let (passed, failed, skipped, _) = run_ptdump(corpus, false);
    (passed, failed, skipped)
}

#[test]
fn libipt_ptdump_corpus() {
    let Some(corpus) = corpus_dir() else {
        println!("libipt ptdump corpus: skipped, corpus not found (set LOOKBACK_SHARED_DIR)");
        return;
    };
    let (passed, failed, skipped, report) = run_ptdump(&corpus, true);
    print!("{report}");
    println!("libipt ptdump corpus: {passed} passed, {failed} failed, {skipped} skipped");
    assert_eq!(failed, 0, "{failed} libipt ptdump cases failed");
}
