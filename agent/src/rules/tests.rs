//! Bad rules files: each test pins the exact `LINE:COL` of the error and a key part of its
//! message. Hostile input (size, nesting, aliases, mutations) is in `tests_robust`, good
//! files in `tests_good`.

use super::*;

/// Lines 1–3 of most documents below; the rule's other fields start on line 4.
pub(super) const HEAD: &str = "version: 1\nrules:\n  - name: r\n";
/// A valid target and trigger, lines 4–5 after [`HEAD`].
pub(super) const BODY: &str = "    target: {pid: 1}\n    trigger: {signal: {signals: [SIGSEGV]}}\n";

/// The error of `text` as `(line, column, message)`, checking the `FILE:LINE:COL: ` form.
pub(super) fn error_of(text: &str) -> (usize, usize, String) {
    let err = match RuleSet::from_str(text, "t.yaml") {
        Ok(rules) => panic!("expected an error for {text:?}, got {rules:?}"),
        Err(err) => err,
    };
    let (line, column) = err
        .location()
        .unwrap_or_else(|| panic!("no location in {err}"));
    let display = err.to_string();
    let prefix = format!("t.yaml:{line}:{column}: ");
    assert!(display.starts_with(&prefix), "{display:?} lacks {prefix:?}");
    assert!(!display.contains('\n'), "multi-line message {display:?}");
    (line, column, err.message())
}

#[track_caller]
pub(super) fn assert_error(text: &str, line: usize, column: usize, needle: &str) {
    let (got_line, got_column, message) = error_of(text);
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert_eq!(
        (got_line, got_column),
        (line, column),
        "wrong position for {message:?}"
    );
}

fn doc(rest: &str) -> String {
    format!("{HEAD}{rest}")
}

#[test]
fn unknown_top_level_key_names_it_and_the_expected_ones() {
    assert_error(
        "version: 1\nrulez: []\n",
        2,
        1,
        "unknown field `rulez`, expected one of `version`, `defaults`, `rules`",
    );
}

#[test]
fn unknown_key_in_rule() {
    let text = doc(&format!("{BODY}    bogus: 1\n"));
    assert_error(
        &text,
        6,
        5,
        "rules[0]: unknown field `bogus`, expected one of `name`, `target`",
    );
}

#[test]
fn unknown_key_in_trigger() {
    let text = doc("    target: {pid: 1}\n    trigger:\n      sycall: {names: [read]}\n");
    assert_error(
        &text,
        6,
        7,
        "unknown field `sycall`, expected one of `function`, `syscall`, `signal`",
    );
}

#[test]
fn unknown_key_in_function_trigger() {
    let text =
        doc("    target: {pid: 1}\n    trigger: {function: {symbol: f, min_duraton: 2ms}}\n");
    assert_error(
        &text,
        5,
        37,
        "unknown field `min_duraton`, expected one of `symbol`",
    );
}

#[test]
fn unknown_key_in_defaults() {
    let text =
        format!("version: 1\ndefaults:\n  capture:\n    buffer: 4MiB\nrules:\n  - name: r\n{BODY}");
    assert_error(&text, 4, 5, "defaults.capture: unknown field `buffer`");
}

#[test]
fn merge_keys_point_to_defaults() {
    let text = doc("    <<: {pid: 1}\n");
    assert_error(
        &text,
        4,
        5,
        "YAML merge keys are not supported; shared settings go in `defaults:`",
    );
}

#[test]
fn duplicate_yaml_key() {
    let text = doc(&format!("{BODY}    name: s\n"));
    assert_error(&text, 3, 5, "duplicate field `name`");
}

#[test]
fn wrong_types() {
    let text = doc("    target: {pid: abc}\n    trigger: {signal: {signals: [SIGSEGV]}}\n");
    assert_error(
        &text,
        4,
        19,
        "rules[0].target.pid: expected a positive integer",
    );
    let text = doc(&format!("{BODY}    capture: {{include_kernel: yes}}\n"));
    assert_error(
        &text,
        6,
        31,
        "invalid type: string \"yes\", expected a boolean",
    );
    assert_error("version: 1\nrules: x\n", 2, 8, "expected a sequence");
    let text = "version: 1\nrules:\n  - just a string\n";
    assert_error(
        text,
        3,
        5,
        "expected a rule: a mapping with name, target, trigger",
    );
    let text = doc("    target: [1]\n    trigger: {signal: {signals: [SIGSEGV]}}\n");
    assert_error(&text, 4, 13, "invalid type: sequence, expected a target");
}

#[test]
fn bad_duration() {
    let text = doc("    target: {pid: 1}\n    trigger: {function: {symbol: f, min_duration: 5}}\n");
    assert_error(
        &text,
        5,
        51,
        "invalid duration `5`: expected a number and a unit (ns, us, ms, s, m or min, h)",
    );
    let text = doc(&format!(
        "{BODY}    snapshot:\n      cooldown: 10 seconds\n"
    ));
    assert_error(&text, 7, 17, "invalid duration `10 seconds`");
}

#[test]
fn bad_size() {
    let text = doc(&format!(
        "{BODY}    output: {{retention: {{max_bytes: 2GiBs}}}}\n"
    ));
    assert_error(
        &text,
        6,
        37,
        "invalid size `2GiBs`: expected a byte count (4096)",
    );
}

#[test]
fn buffer_size_must_be_a_power_of_two() {
    let text = doc(&format!("{BODY}    capture: {{buffer_size: 3MiB}}\n"));
    assert_error(&text, 6, 28, "is not a power of two; try 2MiB or 4MiB");
    let text = doc(&format!("{BODY}    capture: {{buffer_size: 1000}}\n"));
    assert_error(&text, 6, 28, "below one page");
}

#[test]
fn unknown_syscall_points_at_the_name() {
    let text = doc("    target: {pid: 1}\n    trigger:\n      syscall: {names: [fsync, fsyn]}\n");
    assert_error(
        &text,
        6,
        32,
        "unknown syscall `fsyn` (did you mean `fsync`?)",
    );
}

#[test]
fn unknown_errno_points_at_the_name() {
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      syscall:\n        names: write\n        \
         errno: [EIO, ENOPE]\n",
    );
    assert_error(
        &text,
        8,
        22,
        "unknown errno `ENOPE`; expected a Linux errno name",
    );
}

#[test]
fn unknown_signal_points_at_the_name() {
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      signal:\n        signals:\n          \
                    - SIGSEGV\n          - SIGWHAT\n",
    );
    assert_error(&text, 9, 13, "unknown signal `SIGWHAT`");
}

#[test]
fn duplicate_rule_name_points_at_the_second() {
    let text = format!("{HEAD}{BODY}  - name: other\n{BODY}  - name: r\n{BODY}");
    assert_error(
        &text,
        9,
        11,
        "rules[2].name: duplicate rule name `r`; rule names must be unique (first at line 3)",
    );
}

#[test]
fn two_trigger_kinds_point_at_the_later_one() {
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      signal: {signals: [SIGSEGV]}\n      \
                    function: {symbol: f}\n",
    );
    assert_error(
        &text,
        7,
        7,
        "rules[0].trigger.function: trigger has two kinds, `function` and `signal`",
    );
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      function: {symbol: f}\n      \
                    syscall: {names: any}\n",
    );
    assert_error(
        &text,
        7,
        7,
        "expected exactly one of function, syscall, signal",
    );
}

#[test]
fn no_trigger() {
    let text = doc("    target: {pid: 1}\n    trigger: {}\n");
    assert_error(
        &text,
        5,
        5,
        "rules[0].trigger: trigger has no kind; expected exactly one of",
    );
    let text = doc("    target: {pid: 1}\n    trigger:\n      function:\n");
    assert_error(&text, 5, 5, "trigger has no kind");
    assert_error(
        &doc("    target: {pid: 1}\n"),
        3,
        5,
        "rules[0]: missing field `trigger`",
    );
}

#[test]
fn empty_target() {
    let trigger = "    trigger: {signal: {signals: [SIGSEGV]}}\n";
    let expected = "rules[0].target: empty target; expected at least one of pid, comm, exe";
    assert_error(
        &doc(&format!("    target: {{}}\n{trigger}")),
        4,
        5,
        expected,
    );
    assert_error(&doc(&format!("    target:\n{trigger}")), 4, 5, expected);
    assert_error(
        &doc(&format!("    target: {{comm: ~}}\n{trigger}")),
        4,
        5,
        expected,
    );
    let text = doc(&format!("    target:\n      kubernetes: {{}}\n{trigger}"));
    assert_error(&text, 5, 7, "empty kubernetes selector");
}

#[test]
fn bad_rule_names() {
    let tail = BODY;
    let text = format!("version: 1\nrules:\n  - name: Slow Handler\n{tail}");
    assert_error(
        &text,
        3,
        11,
        "invalid rule name `Slow Handler`: expected 1 to 63 of a-z",
    );
    let long = "a".repeat(64);
    let text = format!("version: 1\nrules:\n  - name: {long}\n{tail}");
    assert_error(&text, 3, 11, "invalid rule name");
    let text = format!("version: 1\nrules:\n  - name: ''\n{tail}");
    assert_error(&text, 3, 11, "invalid rule name ``");
}

#[test]
fn missing_or_wrong_version() {
    assert_error(
        &format!("rules:\n  - name: r\n{BODY}"),
        1,
        1,
        "missing field `version`",
    );
    let text = format!("version: 2\nrules:\n  - name: r\n{BODY}");
    assert_error(
        &text,
        1,
        10,
        "unsupported version `2`; this lookback reads `version: 1`",
    );
}

#[test]
fn empty_file_and_empty_rules() {
    assert_error("", 1, 1, "empty rules file");
    assert_error("\n# just a comment\n   \n", 1, 1, "empty rules file");
    assert_error("version: 1\nrules: []\n", 2, 1, "rules: no rules");
    assert_error("version: 1\nrules:\n", 2, 1, "rules: no rules");
}

#[test]
fn unicode_junk() {
    let text = format!("version: 1\nrules:\n  - name: \u{2603}\u{fe0f}\n{BODY}");
    assert_error(&text, 3, 11, "invalid rule name");
    assert_error(
        "version: 1\n\u{43a}\u{43b}\u{44e}\u{447}: 1\n",
        2,
        1,
        "unknown field",
    );
    assert_error(
        "\u{feff}\u{1f600}\u{0}",
        1,
        2,
        "control characters are not allowed",
    );
    let text = doc("    target: {comm: \"a\\u0007b\"}\n    trigger: {signal: {signals: SEGV}}\n");
    assert_error(&text, 4, 20, "contains control characters");
}

#[test]
fn tabs_are_reported_as_such() {
    let text = "version: 1\nrules:\n\t- name: r\n";
    assert_error(text, 3, 1, "(a tab: YAML indents with spaces only)");
}

#[test]
fn syntax_errors() {
    assert_error(
        "version: 1\nrules: [\n",
        3,
        1,
        "did not find expected node content",
    );
    assert_error("version: 1\nrules: *nowhere\n", 2, 8, "unknown anchor");
    assert_error("version: 1: 2\n", 1, 11, "mapping values are not allowed");
    assert_error(
        "version: 1\nrules: [\"unterminated]\n",
        3,
        1,
        "found unexpected end of stream",
    );
}

#[test]
fn several_documents() {
    let one = format!("version: 1\nrules:\n  - name: r\n{BODY}");
    assert_error(
        &format!("{one}---\n{one}"),
        1,
        1,
        "more than one YAML document",
    );
}

#[test]
fn list_checks() {
    let text = doc("    target: {pid: 1}\n    trigger: {syscall: {names: [read, any]}}\n");
    assert_error(&text, 5, 32, "`any` cannot be combined with syscall names");
    let text = doc("    target: {pid: 1}\n    trigger: {signal: {signals: []}}\n");
    assert_error(&text, 5, 33, "empty list; expected a signal name");
    let text = doc("    target: {pid: 1}\n    trigger: {signal: {signals: 11}}\n");
    assert_error(&text, 5, 33, "invalid type: integer `11`");
    let text = doc("    target: {pid: 1}\n    trigger: {syscall: {min_duration: 1s}}\n");
    assert_error(&text, 5, 24, "missing field `names`");
}

#[test]
fn target_field_checks() {
    let trigger = "    trigger: {signal: {signals: [SIGSEGV]}}\n";
    let text = doc(&format!(
        "    target: {{comm: a-very-long-process-name}}\n{trigger}"
    ));
    assert_error(&text, 4, 20, "the kernel keeps at most 15");
    let text = doc(&format!("    target: {{exe: bin/server}}\n{trigger}"));
    assert_error(&text, 4, 19, "expected an absolute path, got `bin/server`");
    let text = doc(&format!("    target: {{cgroup: kubepods}}\n{trigger}"));
    assert_error(&text, 4, 22, "expected a cgroup v2 path starting with `/`");
    let text = doc(&format!("    target: {{pid: 0}}\n{trigger}"));
    assert_error(&text, 4, 19, "expected a positive integer, got 0");
    let text = doc(&format!("    target: {{pid: -5}}\n{trigger}"));
    assert_error(&text, 4, 19, "got `-5`");
    let text = doc(&format!("    target: {{pid: 99999999999}}\n{trigger}"));
    assert_error(&text, 4, 19, "up to 4294967295");
}

#[test]
fn policy_field_checks() {
    let text = doc(&format!("{BODY}    capture: {{backend: pt}}\n"));
    assert_error(
        &text,
        6,
        24,
        "unknown backend `pt`: expected auto, intel-pt or sampling",
    );
    let text = doc(&format!("{BODY}    capture: {{sample_frequency: 0}}\n"));
    assert_error(&text, 6, 33, "expected a positive integer, got 0");
    let text = doc(&format!("{BODY}    snapshot: {{max_per_hour: 0}}\n"));
    assert_error(&text, 6, 30, "expected a positive integer, got 0");
    let text = doc(&format!("{BODY}    output: {{format: json}}\n"));
    assert_error(
        &text,
        6,
        22,
        "unknown output format `json`: expected fxt or chrome-json",
    );
    let text = doc(&format!(
        "{BODY}    output: {{retention: {{max_bytes: 0}}}}\n"
    ));
    assert_error(&text, 6, 37, "at least 1 byte");
    let text = doc(&format!("{BODY}    output: {{dir: ''}}\n"));
    assert_error(&text, 6, 19, "expected a non-empty string");
    let text = doc("    target: {pid: 1}\n    trigger: {function: {symbol: f, binary: lib.so}}\n");
    assert_error(&text, 5, 45, "expected an absolute path");
}

#[test]
fn missing_file_is_a_read_error() {
    let err = RuleSet::from_file(Path::new("/nonexistent/rules.yaml")).expect_err("missing file");
    assert!(matches!(err, RulesError::Read { .. }), "{err:?}");
    assert_eq!(err.location(), None);
    assert_eq!(
        err.to_string(),
        "cannot read rules file /nonexistent/rules.yaml"
    );
}

#[test]
fn a_bad_return_probe_names_the_choices() {
    let text = doc(
        "    target: {pid: 1}\n    trigger: {function: {symbol: f, min_duration: 2ms, \
         return_probe: trampoline}}\n",
    );
    let (line, _, message) = error_of(&text);
    assert_eq!(line, 5, "{message}");
    assert!(
        message.contains("exits or uretprobe") && message.contains("trampoline"),
        "{message}"
    );
}

#[test]
fn a_bad_detect_names_the_choices() {
    let text = doc(
        "    target: {pid: 1}\n    trigger: {function: {symbol: f, min_duration: 2ms, \
         detect: inflight}}\n",
    );
    assert_error(
        &text,
        5,
        64,
        "unknown detect `inflight`: expected returned or running",
    );
}

#[test]
fn detect_running_needs_min_duration() {
    let needle = "detect: running needs min_duration (a call is judged slow once it has run \
                  that long)";
    let text = doc("    target: {pid: 1}\n    trigger: {function: {symbol: f, detect: running}}\n");
    assert_error(&text, 5, 45, needle);
    let (_, _, message) = error_of(&text);
    assert!(
        message.starts_with("rules[0].trigger.function.detect: "),
        "{message}"
    );
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      syscall:\n        names: read\n        \
         detect: running\n",
    );
    assert_error(&text, 8, 17, needle);
}

#[test]
fn detect_running_refuses_an_errno_at_the_later_of_the_two() {
    let needle = "an errno is known only at the return: detect: running cannot test it";
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      syscall:\n        names: read\n        \
         min_duration: 1s\n        detect: running\n        errno: EIO\n",
    );
    assert_error(&text, 10, 16, needle);
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      syscall:\n        names: read\n        \
         errno: EIO\n        min_duration: 1s\n        detect: running\n",
    );
    assert_error(&text, 10, 17, needle);
}

#[test]
fn detect_running_refuses_a_uretprobe() {
    let text = doc(
        "    target: {pid: 1}\n    trigger:\n      function:\n        symbol: f\n        \
         min_duration: 1s\n        detect: running\n        return_probe: uretprobe\n",
    );
    assert_error(
        &text,
        10,
        23,
        "detect: running places no return probe: return_probe: uretprobe cannot go with it",
    );
}
