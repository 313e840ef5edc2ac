//! `lookback decode` on a PT bundle: a libipt corpus case made into an `.lbsnap` by the
//! writer's PT tests ([`crate::writer::pt_tests`]), decoded by the subcommand's own entry,
//! must nest in the trace as the case's expected flow says. In `cli/`, not beside those
//! tests: a library stage does not import `cli`, not even in tests.

use std::fs;

use serde_json::Value;

use crate::test_support::shared_corpus;
use crate::writer::pt_tests::{bundle, expected, ids, load_case, slices_by_thread};

#[test]
fn lookback_decode_turns_a_pt_lbsnap_into_a_trace() {
    use clap::Parser as _;
    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: crate::cli::decode::DecodeArgs,
    }
    let Some(dir) = shared_corpus("libipt/core", "MANIFEST.tsv") else {
        println!("skipped: ../shared/corpus/libipt not found");
        return;
    };
    let case = load_case(&dir, "call_indirect-ret_uncompressed", 0x0010_0000).expect("corpus case");
    let snap = bundle(std::slice::from_ref(&case), true);
    let tmp = tempfile::tempdir().expect("tempdir");
    let raw = tmp.path().join("pt.lbsnap");
    crate::snapshot::write_atomic(&raw, &snap).expect("write .lbsnap");
    let out = tmp.path().join("pt.json");
    let cli = Cli::try_parse_from([
        "decode".as_ref(),
        raw.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ])
    .expect("arguments");
    crate::cli::decode::run(&cli.args).expect("lookback decode");
    let doc: Value = serde_json::from_slice(&fs::read(&out).expect("trace")).expect("JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    let threads = slices_by_thread(events);
    let (_, got) = threads.get(&u64::from(ids(0).1)).expect("the thread");
    assert_eq!(got, &expected(&case.flow, true));
    assert_eq!(got, &["+[unknown @ 0x100004]", "-"]);
}
