//! Tests of the daemon's metrics: the contract's names, types and labels as they appear in
//! the exposition text, and kernel counters that stay monotonic across resets.
#![expect(
    clippy::float_cmp,
    reason = "sample values are small integers, exact in f64"
)]
use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use super::*;

/// One family of the exposition text: its `# TYPE` and the label names of its samples.
#[derive(Debug, Default)]
struct Family {
    kind: String,
    labels: BTreeSet<String>,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

/// A small parser of the text format 0.0.4, enough for these tests.
fn parse(text: &str) -> BTreeMap<String, Family> {
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            families.entry(name.to_owned()).or_default().kind = kind.to_owned();
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample value");
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').expect("closing brace")),
            None => (series, ""),
        };
        let labels: BTreeMap<String, String> = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').expect("label=value");
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|base| families.get(*base).is_some_and(|f| f.kind == "histogram"))
            })
            .unwrap_or(name);
        let f = families
            .get_mut(family)
            .expect("sample after its TYPE line");
        f.labels
            .extend(labels.keys().filter(|k| *k != "le").cloned());
        f.samples
            .push((name.to_owned(), labels, value.parse().expect("number")));
    }
    families
}

fn value(families: &BTreeMap<String, Family>, name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let base = ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s).filter(|b| families.contains_key(*b)))
        .unwrap_or(name);
    families[base]
        .samples
        .iter()
        .find(|(n, l, _)| n == name && *l == want)
        .map_or_else(|| panic!("no sample {name}{labels:?}"), |s| s.2)
}

/// Every metric touched once, as the daemon would over a snapshot's life.
fn exercised() -> Metrics {
    let m = Metrics::new("intel-pt").expect("registry");
    m.set_rules_loaded(2);
    m.config_reload(true);
    m.config_reload(false);
    m.set_targets("slow-query", 3);
    m.set_probes("slow-query", 4);
    m.observe_rule_counters(
        "slow-query",
        &RuleCounters {
            met: 10,
            suppressed_cooldown: 3,
            suppressed_rate_limit: 2,
            lost_ringbuf_full: 1,
            unwound: 7,
            depth_overflow: 1,
            ..RuleCounters::default()
        },
    );
    m.suppressed_busy("slow-query");
    {
        use crate::upload::{ErrorCode, Observer as _};
        let up = m.upload();
        up.init_rule("slow-query");
        up.uploaded("slow-query", Duration::from_millis(200));
        up.failed(
            "slow-query",
            &ErrorCode {
                code: "NoSuchBucket".to_owned(),
                configuration: true,
                permanent: false,
            },
        );
        up.queue("slow-query", 2, 4096);
        up.dropped("slow-query", 1);
    }
    m.set_probe_error("slow-query", Some("ambiguous_symbol"));
    m.set_probe_error("fixed", Some("symbol_not_found"));
    m.set_probe_error("fixed", None);
    m.snapshot_done(
        "slow-query",
        "intel-pt",
        true,
        4096,
        Duration::from_millis(1500),
    );
    m.trigger_to_freeze("intel-pt", Duration::from_micros(40));
    m.decode_duration("intel-pt", Duration::from_millis(800));
    m.events_lost(LossSource::Aux, 2);
    m.events_lost(LossSource::Perf, 5);
    m.observe_program_stats(&[ProgramStats {
        name: "sys_exit".into(),
        run_count: 100,
        run_time_ns: 2_500,
    }]);
    let selected = |selected, lost| ExecSelected { selected, lost };
    m.observe_exec_selected(selected(5, 1));
    m.observe_exec_selected(selected(9, 2));
    for outcome in [Outcome::Traced, Outcome::Gone, Outcome::Gone] {
        m.count_exec_outcome(outcome);
    }
    m.count_late_probe("slow-query");
    m
}

#[test]
fn names_types_and_labels_follow_the_contract() {
    let text = exercised().encode().expect("encode");
    let families = parse(&text);
    let contract: &[(&str, &str, &[&str])] = &[
        ("lookback_build_info", "gauge", &["backend", "version"]),
        ("lookback_rules_loaded", "gauge", &[]),
        ("lookback_config_reloads_total", "counter", &["result"]),
        ("lookback_targets", "gauge", &["rule"]),
        ("lookback_probes_attached", "gauge", &["rule"]),
        ("lookback_triggers_total", "counter", &["rule"]),
        (
            "lookback_triggers_suppressed_total",
            "counter",
            &["reason", "rule"],
        ),
        (
            "lookback_snapshots_total",
            "counter",
            &["backend", "result", "rule"],
        ),
        ("lookback_snapshot_bytes_total", "counter", &["rule"]),
        ("lookback_snapshot_duration_seconds", "histogram", &["rule"]),
        (
            "lookback_trigger_to_freeze_seconds",
            "histogram",
            &["backend"],
        ),
        (
            "lookback_decode_duration_seconds",
            "histogram",
            &["backend"],
        ),
        ("lookback_events_lost_total", "counter", &["source"]),
        // Added 2026-12 (contract.md): object storage.
        ("lookback_uploads_total", "counter", &["result", "rule"]),
        ("lookback_upload_queue_files", "gauge", &["rule"]),
        ("lookback_upload_queue_bytes", "gauge", &["rule"]),
        ("lookback_upload_duration_seconds", "histogram", &[]),
        ("lookback_upload_dropped_total", "counter", &["rule"]),
        // Extensions (documented in metrics.rs).
        (
            "lookback_function_calls_unmeasured_total",
            "counter",
            &["reason", "rule"],
        ),
        ("lookback_bpf_program_runs_total", "counter", &["program"]),
        ("lookback_rule_probe_errors", "gauge", &["reason", "rule"]),
        ("lookback_errors_total", "counter", &["errno", "op"]),
        ("lookback_kernel_targets", "gauge", &[]),
        ("lookback_held_files", "gauge", &[]),
        ("lookback_http_connections", "gauge", &[]),
        ("lookback_http_rejected_total", "counter", &["reason"]),
        ("lookback_held_files_refused_total", "counter", &[]),
        ("lookback_exec_selected_total", "counter", &[]),
        (
            "lookback_exec_selected_outcomes_total",
            "counter",
            &["outcome"],
        ),
        ("lookback_function_probes_late_total", "counter", &["rule"]),
        (
            "lookback_bpf_program_run_seconds_total",
            "counter",
            &["program"],
        ),
    ];
    for (name, kind, labels) in contract {
        let f = families
            .get(*name)
            .unwrap_or_else(|| panic!("{name} missing from\n{text}"));
        assert_eq!(f.kind, *kind, "type of {name}");
        let labels: BTreeSet<String> = labels.iter().map(|l| (*l).to_owned()).collect();
        assert_eq!(f.labels, labels, "labels of {name}");
    }
    let names: BTreeSet<&str> = contract.iter().map(|c| c.0).collect();
    let extra: Vec<_> = families
        .keys()
        .filter(|k| !names.contains(k.as_str()))
        .collect();
    assert!(extra.is_empty(), "metrics outside the contract: {extra:?}");
}

#[test]
fn upload_reports_land_in_their_series() {
    let text = exercised().encode().expect("encode");
    let f = parse(&text);
    let v = |name, labels: &[(&str, &str)]| value(&f, name, labels);
    let rule = ("rule", "slow-query");
    assert_eq!(v("lookback_uploads_total", &[rule, ("result", "ok")]), 1.0);
    assert_eq!(
        v("lookback_uploads_total", &[rule, ("result", "error")]),
        1.0
    );
    assert_eq!(
        v(
            "lookback_errors_total",
            &[("op", "upload"), ("errno", "NoSuchBucket")]
        ),
        1.0
    );
    assert_eq!(v("lookback_upload_queue_files", &[rule]), 2.0);
    assert_eq!(v("lookback_upload_queue_bytes", &[rule]), 4096.0);
    assert_eq!(v("lookback_upload_dropped_total", &[rule]), 1.0);
}

#[test]
fn values_land_in_the_right_series() {
    let text = exercised().encode().expect("encode");
    let f = parse(&text);
    let version = env!("CARGO_PKG_VERSION");
    let v = |name, labels: &[(&str, &str)]| value(&f, name, labels);
    assert_eq!(
        v(
            "lookback_build_info",
            &[("version", version), ("backend", "intel-pt")]
        ),
        1.0
    );
    assert_eq!(v("lookback_rules_loaded", &[]), 2.0);
    assert_eq!(v("lookback_config_reloads_total", &[("result", "ok")]), 1.0);
    assert_eq!(
        v("lookback_config_reloads_total", &[("result", "error")]),
        1.0
    );
    assert_eq!(
        v("lookback_triggers_total", &[("rule", "slow-query")]),
        10.0
    );
    for (reason, n) in [("cooldown", 3.0), ("rate_limit", 2.0), ("busy", 1.0)] {
        assert_eq!(
            v(
                "lookback_triggers_suppressed_total",
                &[("rule", "slow-query"), ("reason", reason)]
            ),
            n,
            "{reason}"
        );
    }
    for (reason, n) in [
        ("unwound", 7.0),
        ("depth_overflow", 1.0),
        ("unmatched_return", 0.0),
    ] {
        assert_eq!(
            v(
                "lookback_function_calls_unmeasured_total",
                &[("rule", "slow-query"), ("reason", reason)]
            ),
            n,
            "{reason}"
        );
    }
    assert_eq!(
        v(
            "lookback_rule_probe_errors",
            &[("rule", "slow-query"), ("reason", "ambiguous_symbol")]
        ),
        1.0
    );
    // A rule whose probe was placed after all has no series left.
    assert!(!text.contains("rule=\"fixed\""), "{text}");
    for (source, n) in [("ringbuf", 1.0), ("aux", 2.0), ("perf", 5.0)] {
        assert_eq!(
            v("lookback_events_lost_total", &[("source", source)]),
            n,
            "{source}"
        );
    }
    assert_eq!(
        v(
            "lookback_snapshots_total",
            &[
                ("rule", "slow-query"),
                ("backend", "intel-pt"),
                ("result", "ok")
            ]
        ),
        1.0
    );
    assert_eq!(
        v("lookback_snapshot_bytes_total", &[("rule", "slow-query")]),
        4096.0
    );
    assert_eq!(
        v(
            "lookback_snapshot_duration_seconds_count",
            &[("rule", "slow-query")]
        ),
        1.0
    );
    assert_eq!(
        v(
            "lookback_bpf_program_runs_total",
            &[("program", "sys_exit")]
        ),
        100.0
    );
    let secs = v(
        "lookback_bpf_program_run_seconds_total",
        &[("program", "sys_exit")],
    );
    assert!((secs - 2.5e-6).abs() < 1e-12, "{secs}");
}

#[test]
fn histogram_buckets_span_the_expected_ranges() {
    let f = parse(&exercised().encode().expect("encode"));
    let bounds = |name: &str| -> Vec<String> {
        f[name]
            .samples
            .iter()
            .filter_map(|(_, l, _)| l.get("le").cloned())
            .collect()
    };
    let freeze = bounds("lookback_trigger_to_freeze_seconds");
    assert_eq!(freeze.first().map(String::as_str), Some("0.00001"));
    assert!(freeze.contains(&"1".to_owned()), "{freeze:?}");
    for name in [
        "lookback_decode_duration_seconds",
        "lookback_snapshot_duration_seconds",
    ] {
        let b = bounds(name);
        assert_eq!(b.first().map(String::as_str), Some("0.001"), "{name}");
        assert!(b.contains(&"60".to_owned()), "{name}: {b:?}");
    }
    // 40 µs falls in the 50 µs bucket, not the 25 µs one.
    let bucket = |le| {
        value(
            &f,
            "lookback_trigger_to_freeze_seconds_bucket",
            &[("backend", "intel-pt"), ("le", le)],
        )
    };
    assert_eq!(bucket("0.000025"), 0.0);
    assert_eq!(bucket("0.00005"), 1.0);
}

fn triggers(m: &Metrics, rule: &str) -> f64 {
    value(
        &parse(&m.encode().expect("encode")),
        "lookback_triggers_total",
        &[("rule", rule)],
    )
}

fn met(n: u64) -> RuleCounters {
    RuleCounters {
        met: n,
        ..RuleCounters::default()
    }
}

#[test]
fn kernel_counters_never_go_backwards_across_a_reset() {
    let m = Metrics::new("sampling").expect("registry");
    m.observe_rule_counters("r", &met(5));
    m.observe_rule_counters("r", &met(8));
    assert_eq!(triggers(&m, "r"), 8.0);
    // Same value again: no change.
    m.observe_rule_counters("r", &met(8));
    assert_eq!(triggers(&m, "r"), 8.0);
    // The kernel slot was cleared (rule re-added without remove_rule): a drop is a reset,
    // the 3 new triggers count.
    m.observe_rule_counters("r", &met(3));
    assert_eq!(triggers(&m, "r"), 11.0);
    // Removed and re-added through the daemon: the last value is forgotten.
    m.remove_rule("r");
    m.observe_rule_counters("r", &met(20));
    assert_eq!(triggers(&m, "r"), 31.0);
}

#[test]
fn a_rule_that_never_fired_reads_zero() {
    let m = Metrics::new("sampling").expect("registry");
    m.observe_rule_counters("quiet", &RuleCounters::default());
    assert_eq!(triggers(&m, "quiet"), 0.0);
}

#[test]
fn program_stats_reset_counts_the_new_values() {
    let m = Metrics::new("sampling").expect("registry");
    let stats = |runs, ns| {
        [ProgramStats {
            name: "function_entry".into(),
            run_count: runs,
            run_time_ns: ns,
        }]
    };
    m.observe_program_stats(&stats(10, 1_000));
    m.observe_program_stats(&stats(4, 3_000));
    let f = parse(&m.encode().expect("encode"));
    let l = [("program", "function_entry")];
    assert_eq!(value(&f, "lookback_bpf_program_runs_total", &l), 14.0);
    let secs = value(&f, "lookback_bpf_program_run_seconds_total", &l);
    assert!((secs - 4e-6).abs() < 1e-12, "{secs}");
}

#[test]
fn unmeasured_programs_have_no_series() {
    let m = Metrics::new("sampling").expect("registry");
    m.observe_program_stats(&[ProgramStats {
        name: "sys_exit".into(),
        run_count: 0,
        run_time_ns: 0,
    }]);
    let text = m.encode().expect("encode");
    assert!(!text.contains("lookback_bpf_program_runs_total{"), "{text}");
}

#[test]
fn remove_rule_drops_gauges_and_keeps_counters() {
    let m = exercised();
    m.remove_rule("slow-query");
    let text = m.encode().expect("encode");
    assert!(!text.contains("lookback_targets{"), "{text}");
    assert!(!text.contains("lookback_probes_attached{"), "{text}");
    assert_eq!(triggers(&m, "slow-query"), 10.0);
}

#[test]
fn busy_is_counted_per_rule() {
    let m = Metrics::new("sampling").expect("registry");
    m.suppressed_busy("a");
    m.suppressed_busy("a");
    m.suppressed("b", Suppression::Busy);
    let f = parse(&m.encode().expect("encode"));
    let busy = |rule| {
        value(
            &f,
            "lookback_triggers_suppressed_total",
            &[("rule", rule), ("reason", "busy")],
        )
    };
    assert_eq!((busy("a"), busy("b")), (2.0, 1.0));
}

#[test]
fn an_observed_rule_exposes_every_suppression_reason_from_zero() {
    let m = Metrics::new("sampling").expect("registry");
    m.observe_rule_counters("quiet", &RuleCounters::default());
    let text = m.encode().expect("encode");
    // Present at 0, so a dashboard (or test) can tell "never suppressed" from "no such rule".
    for reason in ["cooldown", "rate_limit", "busy"] {
        let line =
            format!("lookback_triggers_suppressed_total{{reason=\"{reason}\",rule=\"quiet\"}} 0");
        assert!(text.contains(&line), "{line} missing:\n{text}");
    }
}

#[test]
fn processes_selected_at_exec_and_late_probes_are_counted() {
    let f = parse(&exercised().encode().expect("encode"));
    let v = |name, labels: &[(&str, &str)]| value(&f, name, labels);
    // Absolute kernel counts turned into increments; the kernel's drops are an outcome.
    assert_eq!(v("lookback_exec_selected_total", &[]), 9.0);
    for (outcome, n) in [
        ("traced", 1.0),
        ("gone", 2.0),
        ("not_matching", 0.0),
        ("failed", 0.0),
        ("lost", 2.0),
    ] {
        assert_eq!(
            v(
                "lookback_exec_selected_outcomes_total",
                &[("outcome", outcome)]
            ),
            n,
            "{outcome}"
        );
    }
    assert_eq!(
        v(
            "lookback_function_probes_late_total",
            &[("rule", "slow-query")]
        ),
        1.0
    );
}
