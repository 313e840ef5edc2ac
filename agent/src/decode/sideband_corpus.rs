//! Sideband records from real inputs: the perf sideband (`.sb`) files of Intel libipt's
//! corpus (`shared/corpus/libipt/pevent/`), read with the capture stage's record walker
//! and its `sample_id_all` trailer parser (`capture::records`), checked against
//! `decode::pt::sideband::pevent` (which the ptdump conformance test checks against
//! libipt's expected output). A test of the decode stage: it imports capture, not the
//! other way round.

use std::path::PathBuf;

use super::pt::sideband::pevent::{PeventConfig, PeventError, read_record};
use crate::capture::records::{self, id_trailer};

fn pevent_dir() -> Option<PathBuf> {
    crate::test_support::shared_corpus("libipt/pevent", "MANIFEST.tsv")
}

/// `sample-type=0x102c6` from a corpus file name.
fn sample_type_of(name: &str) -> Option<u64> {
    let rest = name.split("sample-type=0x").nth(1)?;
    let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
    u64::from_str_radix(&hex, 16).ok()
}

#[test]
fn libipt_sideband_files_walk_like_the_pevent_reader() {
    let Some(dir) = pevent_dir() else {
        println!("libipt sideband corpus: skipped, corpus not found (set LOOKBACK_SHARED_DIR)");
        return;
    };
    let mut files = 0;
    let mut total = 0;
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(&dir).expect("read pevent dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        if path.extension().is_none_or(|e| e != "sb") {
            continue;
        }
        let sample_type = sample_type_of(&name).expect("sample-type in the name");
        let bytes = std::fs::read(&path).expect("read .sb");
        let config = PeventConfig {
            sample_type,
            ..PeventConfig::default()
        };
        let mut expected = Vec::new();
        let mut at = 0;
        loop {
            match read_record(&bytes[at..], &config) {
                Ok((rec, size)) => {
                    expected.push((rec.kind, rec.misc, rec.samples.pid_tid, rec.samples.time));
                    at += size;
                }
                Err(PeventError::End) => break,
                Err(err) => panic!("{name}: pevent reader: {err}"),
            }
        }
        let walked: Vec<_> = records::records(&bytes)
            .map(|rec| {
                let (pid_tid, time) = id_trailer(sample_type, rec.body).expect("trailer");
                (rec.kind, rec.misc, pid_tid, time)
            })
            .collect();
        assert_eq!(walked, expected, "{name}");
        assert!(!walked.is_empty(), "{name}: no records");
        kinds.extend(walked.iter().map(|r| r.0));
        files += 1;
        total += walked.len();
    }
    assert!(files >= 10, "only {files} .sb files in {}", dir.display());
    // MMAP, LOST, COMM, EXIT, FORK, AUX, ITRACE_START, LOST_SAMPLES, SWITCH,
    // SWITCH_CPU_WIDE (the corpus has no MMAP2; its layout is tested in pevent_tests).
    for kind in [1, 2, 3, 4, 7, 11, 12, 13, 14, 15] {
        assert!(
            kinds.contains(&kind),
            "record type {kind} not covered: {kinds:?}"
        );
    }
    println!("libipt sideband corpus: {files} files, {total} records, types {kinds:?}");
}
