//! Hostile rules files: over the size cap, not UTF-8, alias bombs, deep nesting, and
//! thousands of mutations of a valid file. Each must give a positioned error or a result,
//! quickly and without panicking.

use std::fmt::Write as _;
use std::io::Write as _;

use super::tests::{BODY, assert_error, error_of};
use super::*;

#[test]
fn invalid_utf8_file_points_at_the_first_bad_byte() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(b"version: 1\nrules:\n  - name: ab\xff\xfe\n")
        .expect("write temp file");
    let err = RuleSet::from_file(file.path()).expect_err("invalid UTF-8");
    assert_eq!(err.location(), Some((3, 13)), "{err}");
    assert!(err.message().contains("not valid UTF-8"), "{err}");
}

#[test]
fn non_string_keys_do_not_panic() {
    let text = "version: 1\n1: 2\n[a]: b\n";
    let (line, _, message) = error_of(text);
    assert_eq!(line, 2, "{message}");
}

#[test]
fn ten_megabyte_file_is_refused_quickly() {
    let mut text = String::with_capacity(10 << 20);
    text.push_str("version: 1\nrules:\n");
    let mut index = 0;
    while text.len() < 10 << 20 {
        let _ = write!(text, "  - name: r{index}\n{BODY}");
        index += 1;
    }
    assert_error(&text, 1, 1, "file is larger than 4 MiB");
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(text.as_bytes()).expect("write temp file");
    let err = RuleSet::from_file(file.path()).expect_err("a 10 MB file");
    assert_eq!(err.location(), Some((1, 1)), "{err}");
}

#[test]
fn big_file_under_the_cap_is_parsed() {
    // The most rules a file may hold, padded with comments to ~3 MiB: a result, not a
    // hang (and a position in the last rule).
    let pad = format!("# {}\n", "x".repeat(1000)).repeat(50);
    let mut text = String::from("version: 1\nrules:\n");
    let mut lines = 2;
    for index in 0..validate::MAX_RULES_PER_FILE {
        let _ = write!(text, "  - name: r{index}\n{BODY}{pad}");
        lines += 3 + 50;
    }
    assert!(text.len() > 3 << 20);
    let rules = RuleSet::from_str(&text, "big.yaml").expect("valid big file");
    assert_eq!(rules.rules.len(), validate::MAX_RULES_PER_FILE);
    // One more: refused, at its line.
    let _ = write!(text, "  - name: r64\n{BODY}");
    let (line, column, message) = error_of(&text);
    assert_eq!((line, column), (lines + 1, 5), "{message}");
}

#[test]
fn more_rules_than_the_engine_holds_are_refused_at_the_first_one_too_many() {
    // `rules validate` accepted 20,000 rules that the agent then refused at start.
    let mut text = String::from("version: 1\nrules:\n");
    for index in 0..=validate::MAX_RULES_PER_FILE {
        let _ = write!(text, "  - name: r{index}\n{BODY}");
    }
    let (line, column, message) = error_of(&text);
    let max = validate::MAX_RULES_PER_FILE;
    assert_eq!((line, column), (max * 3 + 3, 5), "{message}");
    assert!(
        message.contains(&format!("at most {max} rules")),
        "{message}"
    );
}

#[test]
fn alias_bomb_errors_cleanly() {
    // Billion laughs: 9^8 strings if expanded. The schema has no place for nested lists,
    // so `serde_yaml` stops at the first alias it would have to expand.
    let mut text = String::from("version: 1\nrules: &a [x, x, x, x, x, x, x, x, x]\n");
    for level in 1..8 {
        let prev = level - 1;
        let _ = writeln!(
            text,
            "defaults: &l{level} [*l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}]"
        );
    }
    let text = text.replace("&a", "&l0");
    let (line, _, message) = error_of(&text);
    assert_eq!(line, 2, "{message}");
    // The same bomb inside a list the schema does read: signals.
    let mut text = String::from("version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n");
    text.push_str("    trigger:\n      signal:\n        signals: &l0 [SEGV, SEGV, SEGV, SEGV]\n");
    for level in 1..10 {
        let prev = level - 1;
        let _ = writeln!(
            text,
            "    snapshot: &l{level} [*l{prev}, *l{prev}, *l{prev}, *l{prev}, *l{prev}]"
        );
    }
    let (line, column, message) = error_of(&text);
    assert_eq!((line, column), (8, 15), "{message}");
    assert!(message.contains("duplicate field `snapshot`") || message.contains("invalid type"));
}

#[test]
fn alias_repetition_limit_is_reported() {
    // Aliases of aliases that the schema does read: a list of signals, each an alias.
    let mut text = String::from("version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n");
    text.push_str("    trigger:\n      signal:\n        signals: [&s SEGV");
    for _ in 0..200_000 {
        text.push_str(", *s");
    }
    text.push_str("]\n");
    let rules = RuleSet::from_str(&text, "t.yaml").expect("aliases of one scalar are fine");
    let Trigger::Signal(signal) = &rules.rules[0].trigger else {
        panic!("not a signal trigger");
    };
    assert_eq!(signal.signals, vec![11]);
}

#[test]
fn deeply_nested_yaml() {
    // libyaml's scanner is quadratic in flow depth, so deep flow nesting is refused first.
    let depth = 1_000_000;
    let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert_error(&text, 1, 65, "YAML nested more than 64 levels deep");
    let text = format!(
        "version: 1\nrules: {}{}\n",
        "[".repeat(depth),
        "]".repeat(depth)
    );
    assert_error(&text, 2, 72, "YAML nested more than 64 levels deep");
    let text = format!("version: 1\nrules: {}\n", "{a: ".repeat(depth / 4));
    assert_error(&text, 2, 8 + 4 * 64, "YAML nested more than 64 levels deep");
    // Nesting within the cap reaches serde, which stops at the first wrong type.
    let text = format!("version: 1\nrules: {}{}\n", "[".repeat(64), "]".repeat(64));
    assert_error(&text, 2, 9, "expected a rule");
    // Deep block nesting is linear for libyaml; serde stops at the first wrong type.
    let mut text = String::from("version: 1\nrules:\n");
    for level in 0..2000 {
        let _ = writeln!(text, "{}-", "  ".repeat(level + 1));
    }
    assert_error(&text, 4, 5, "expected a rule");
    let text = format!("version: 1\nrules:\n  {}x\n", "- ".repeat(depth));
    assert_error(&text, 3, 5, "expected a rule");
}

/// Small deterministic generator (xorshift) for the no-panic tests.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn no_panic_on_prefixes_and_mutations_of_a_valid_file() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/kubernetes.yaml"
    ))
    .expect("read configs/kubernetes.yaml");
    for (end, _) in text.char_indices() {
        let _ = RuleSet::from_str(&text[..end], "prefix.yaml");
    }
    let tokens = [
        "",
        " ",
        "\t",
        "\n",
        ":",
        "- ",
        "[",
        "]",
        "{",
        "}",
        "&a ",
        "*a",
        "!!str ",
        "'",
        "\"",
        "#",
        "---",
        "...",
        "\u{2603}",
        "0",
        "-1",
        "1e9",
        "~",
        "? ",
        "|",
        ">",
        "%YAML 1.2\n",
        "\u{0}",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for _ in 0..3000 {
        let mut mutated = text.clone();
        for _ in 0..3 {
            let boundaries: Vec<usize> = mutated.char_indices().map(|(i, _)| i).collect();
            let at = boundaries
                [usize::try_from(next(&mut state) % boundaries.len() as u64).expect("index fits")];
            let token = tokens
                [usize::try_from(next(&mut state) % tokens.len() as u64).expect("index fits")];
            mutated.insert_str(at, token);
        }
        match RuleSet::from_str(&mutated, "fuzz.yaml") {
            Ok(_) => {}
            Err(err) => {
                let (line, column) = err.location().expect("content errors have a position");
                assert!(line >= 1 && column >= 1, "{err}");
                assert!(line <= mutated.lines().count() + 1, "{err} past the end");
            }
        }
    }
}

#[test]
fn an_empty_duration_is_refused_where_it_is_written() {
    // `min_duration:` alone is YAML null: read as absent it made a latency rule an
    // every-call rule. The error points where the value is missing (line:column).
    for (key, text, at) in [
        (
            "min_duration",
            "version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    trigger:\n      function: {symbol: f, min_duration: }\n",
            (6, 43),
        ),
        (
            "min_duration",
            "version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    trigger:\n      syscall:\n        names: [read]\n        min_duration:\n",
            (8, 22),
        ),
        (
            "cooldown",
            "version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    trigger: {signal: {signals: [SIGSEGV]}}\n    snapshot: {cooldown: null}\n",
            (6, 26),
        ),
        (
            "post_trigger",
            "version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    trigger: {signal: {signals: [SIGSEGV]}}\n    snapshot:\n      post_trigger:\n",
            (7, 20),
        ),
    ] {
        let (line, column, message) = error_of(text);
        assert_eq!((line, column), at, "{key}: {message}");
        assert!(
            message.contains(key) && message.contains("invalid duration"),
            "{key}: {message}"
        );
    }
}
