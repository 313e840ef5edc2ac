//! Good rules files: defaults and their merging, every trigger kind, the example configs in
//! `configs/`. Bad files are in `tests`.

use std::{path::PathBuf, time::Duration};

use super::*;

fn parse(text: &str) -> RuleSet {
    RuleSet::from_str(text, "good.yaml").unwrap_or_else(|err| panic!("{err}"))
}

fn only_rule(text: &str) -> Rule {
    let mut set = parse(text);
    assert_eq!(set.rules.len(), 1, "{set:?}");
    set.rules.remove(0)
}

#[test]
fn minimal_rule_gets_documented_defaults() {
    let rule = only_rule(
        "version: 1\nrules:\n  - name: crash\n    target: {pid: 1234}\n    \
         trigger: {signal: {signals: [SIGSEGV]}}\n",
    );
    assert_eq!(rule.name, "crash");
    assert_eq!(
        rule.target,
        Target {
            pid: Some(1234),
            ..Target::default()
        }
    );
    assert_eq!(
        rule.trigger,
        Trigger::Signal(SignalTrigger { signals: vec![11] })
    );
    assert_eq!(rule.capture, Capture::default());
    assert_eq!(rule.snapshot, SnapshotPolicy::default());
    assert_eq!(rule.output, OutputPolicy::default());
    // The documented values.
    assert_eq!(rule.capture.backend, Backend::Auto);
    assert_eq!(rule.capture.buffer_size, 4 << 20);
    assert_eq!(rule.capture.sample_frequency, 10_000);
    assert!(!rule.capture.include_kernel);
    assert_eq!(rule.snapshot.cooldown, Duration::from_secs(10));
    assert_eq!(rule.snapshot.max_per_hour, 60);
    assert_eq!(rule.snapshot.post_trigger, Duration::ZERO);
    assert_eq!(rule.output.format, OutputFormat::Fxt);
    assert!(rule.output.keep_raw);
    assert_eq!(
        rule.output.retention,
        Retention {
            max_files: 200,
            max_bytes: 2 << 30
        }
    );
    assert_eq!(rule.output.dir, None);
}

const MERGE: &str = "\
version: 1
defaults:
  capture: { backend: intel-pt, buffer_size: 8MiB }
  snapshot: { cooldown: 1min, post_trigger: 2ms }
  output:
    dir: /var/lib/lookback
    format: chrome-json
    retention: { max_files: 10, max_bytes: 1GiB }
rules:
  - name: plain
    target: { comm: app }
    trigger: { syscall: { names: any, min_duration: 1.5s } }
  - name: override
    target: { comm: app }
    trigger: { syscall: { names: [any] } }
    capture: { buffer_size: 64MiB, include_kernel: true }
    snapshot: { max_per_hour: 5 }
    output:
      keep_raw: false
      retention: { max_files: 3 }
";

#[test]
fn defaults_are_merged_into_every_rule() {
    let set = parse(MERGE);
    let plain = &set.rules[0];
    assert_eq!(plain.capture.backend, Backend::IntelPt);
    assert_eq!(plain.capture.buffer_size, 8 << 20);
    assert_eq!(
        plain.capture.sample_frequency, 10_000,
        "built-in default kept"
    );
    assert_eq!(plain.snapshot.cooldown, Duration::from_mins(1));
    assert_eq!(plain.snapshot.post_trigger, Duration::from_millis(2));
    assert_eq!(plain.snapshot.max_per_hour, 60);
    assert_eq!(
        plain.output.dir.as_deref(),
        Some(Path::new("/var/lib/lookback"))
    );
    assert_eq!(plain.output.format, OutputFormat::ChromeJson);
    assert_eq!(
        plain.output.retention,
        Retention {
            max_files: 10,
            max_bytes: 1 << 30
        }
    );
    let Trigger::Syscall(syscall) = &plain.trigger else {
        panic!("not a syscall trigger: {:?}", plain.trigger);
    };
    assert_eq!(syscall.syscalls, SyscallSet::Any);
    assert_eq!(syscall.min_duration, Some(Duration::from_millis(1500)));
}

#[test]
fn rule_values_override_defaults_field_by_field() {
    let set = parse(MERGE);
    let rule = &set.rules[1];
    assert_eq!(rule.capture.backend, Backend::IntelPt, "from defaults");
    assert_eq!(rule.capture.buffer_size, 64 << 20, "from the rule");
    assert!(rule.capture.include_kernel);
    assert_eq!(
        rule.snapshot.cooldown,
        Duration::from_mins(1),
        "from defaults"
    );
    assert_eq!(rule.snapshot.max_per_hour, 5, "from the rule");
    assert!(!rule.output.keep_raw);
    assert_eq!(rule.output.format, OutputFormat::ChromeJson);
    assert_eq!(
        rule.output.retention,
        Retention {
            max_files: 3,
            max_bytes: 1 << 30
        }
    );
    assert_eq!(rule.trigger.describe(), "syscall:any");
}

#[test]
fn every_trigger_kind_and_its_description() {
    let text = "\
version: 1
rules:
  - name: slow
    target: { exe: /usr/bin/server }
    trigger: { function: { symbol: slow, binary: /usr/lib/libslow.so, min_duration: 5ms } }
  - name: fsync
    target: { comm: db }
    trigger: { syscall: { names: [fsync, fdatasync, fsync], min_duration: 50ms } }
  - name: missing-file
    target: { comm: db }
    trigger: { syscall: { names: openat, errno: ENOENT } }
  - name: crash
    target: { comm: db }
    trigger: { signal: { signals: [sigsegv, ABRT, SIGRTMIN+2, SIGIOT] } }
  - name: enter
    target: { comm: db }
    trigger: { function: { symbol: \"std::vector<int>::push_back\" } }
";
    let set = parse(text);
    let described: Vec<String> = set
        .rules
        .iter()
        .map(|rule| rule.trigger.describe())
        .collect();
    assert_eq!(
        described,
        [
            "func:slow>5ms",
            "syscall:fsync,fdatasync>50ms",
            "syscall:openat=ENOENT",
            "signal:SIGSEGV,SIGABRT,SIGRTMIN+2",
            "func:std::vector<int>::push_back",
        ]
    );
    let Trigger::Function(function) = &set.rules[0].trigger else {
        panic!("not a function trigger");
    };
    assert_eq!(
        function.binary.as_deref(),
        Some(Path::new("/usr/lib/libslow.so"))
    );
    assert_eq!(
        set.rules[2].trigger,
        Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![257]),
            min_duration: None,
            errnos: vec![2],
            detect: Detect::Returned,
        })
    );
}

#[test]
fn yaml_trigger_equals_the_spec_trigger() {
    let text = "version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    trigger:\n      \
                syscall: {names: [read, write], min_duration: 2ms, errno: [EAGAIN, EWOULDBLOCK]}\n";
    let rule = only_rule(text);
    let spec = parse_trigger_spec("syscall:read,write>2ms=EAGAIN").expect("valid spec");
    assert_eq!(rule.trigger, spec);
}

#[test]
fn the_contract_example_validates() {
    let text = "\
version: 1
defaults:                     # optional, merged into every rule
  capture:
    backend: auto             # auto | intel-pt | sampling
    buffer_size: 4MiB         # PT AUX buffer per traced thread/CPU; power of two
    sample_frequency: 10000   # Hz, sampling backend
    include_kernel: false
  snapshot:
    cooldown: 10s             # minimum time between two snapshots of one rule
    max_per_hour: 60
    post_trigger: 0ms         # keep recording this long after the trigger
  output:
    dir: /var/lib/lookback    # agent default; --output-dir overrides
    format: fxt               # fxt | chrome-json
    keep_raw: true
    retention: { max_files: 200, max_bytes: 2GiB }
rules:
  - name: slow-handler        # [a-z0-9_-]{1,63}, unique; the `rule` metric label
    target:                   # all given fields must match
      pid: 1234
      comm: myserver          # /proc/PID/comm, exact
      exe: /usr/bin/myserver  # /proc/PID/exe, resolved path (inside the process's root)
      cgroup: /kubepods.slice # prefix of the process's cgroup v2 path
      kubernetes: { namespace: prod, pod_labels: { app: api }, container: server }
    trigger:                  # exactly one kind
      function: { symbol: handle_request, binary: /usr/bin/myserver, min_duration: 2ms }
      # syscall: { names: [fsync, fdatasync], min_duration: 50ms, errno: [EIO] }
      # signal:  { signals: [SIGSEGV, SIGABRT, SIGBUS] }
    capture: { }              # per-rule overrides of defaults
    snapshot: { }
";
    let rule = only_rule(text);
    assert_eq!(
        rule.target.to_string(),
        "pid=1234 comm=myserver exe=/usr/bin/myserver cgroup=/kubepods.slice \
         k8s:namespace=prod,app=api,container=server"
    );
    assert_eq!(rule.trigger.describe(), "func:handle_request>2ms");
    assert_eq!(rule.capture, Capture::default());
    assert_eq!(rule.snapshot, SnapshotPolicy::default());
    assert_eq!(
        rule.output.dir.as_deref(),
        Some(Path::new("/var/lib/lookback"))
    );
}

#[test]
fn scalars_read_as_strings_where_names_are_expected() {
    let text = "version: 1\nrules:\n  - name: '123'\n    target: {comm: 123, pid: '42'}\n    \
                trigger: {signal: {signals: 'SIGBUS'}}\n";
    let rule = only_rule(text);
    assert_eq!(rule.name, "123");
    assert_eq!(rule.target.comm.as_deref(), Some("123"));
    assert_eq!(rule.target.pid, Some(42));
}

#[test]
fn byte_order_mark_and_file_reading() {
    let text = "\u{feff}version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    \
                trigger: {signal: {signals: [SIGSEGV]}}\n";
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, text).expect("write rules");
    let set = RuleSet::from_file(&path).expect("valid rules file");
    assert_eq!(set.rules[0].name, "r");
    let bad = text.replace("SIGSEGV", "SIGNOPE");
    std::fs::write(&path, bad).expect("write rules");
    let err = RuleSet::from_file(&path).expect_err("unknown signal");
    let want = format!(
        "{}:5:34: rules[0].trigger.signal.signals[0]: unknown signal",
        path.display()
    );
    assert!(err.to_string().starts_with(&want), "{err} vs {want}");
}

#[test]
fn every_example_config_validates() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).expect("read configs/") {
        let path = entry.expect("configs/ entry").path();
        if path.extension().is_some_and(|ext| ext == "yaml") {
            let set = RuleSet::from_file(&path).unwrap_or_else(|err| panic!("{err}"));
            assert!(!set.rules.is_empty(), "{} has no rules", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} example configs in {dir}");
}

#[test]
fn backend_and_format_spellings() {
    for backend in [Backend::Auto, Backend::IntelPt, Backend::Sampling] {
        assert_eq!(backend.to_string().parse::<Backend>(), Ok(backend));
    }
    assert_eq!(Backend::IntelPt.to_string(), "intel-pt");
    assert!("intel_pt".parse::<Backend>().is_err());
    for format in [OutputFormat::Fxt, OutputFormat::ChromeJson] {
        assert_eq!(format.to_string().parse::<OutputFormat>(), Ok(format));
    }
    assert_eq!(OutputFormat::ChromeJson.to_string(), "chrome-json");
}

#[test]
fn trace_binaries_are_absolute_paths_merged_like_the_rest() {
    let set = parse(
        "version: 1\ndefaults:\n  capture: { trace_binaries: [/usr/bin/myserver] }\nrules:\n  \
         - name: a\n    target: {comm: app}\n    trigger: {signal: {signals: [SIGSEGV]}}\n  \
         - name: b\n    target: {comm: app}\n    trigger: {signal: {signals: [SIGSEGV]}}\n    \
         capture: { trace_binaries: [/usr/bin/myserver, /usr/lib/libssl.so.3] }\n",
    );
    assert_eq!(
        set.rules[0].capture.trace_binaries,
        vec![PathBuf::from("/usr/bin/myserver")],
        "from defaults"
    );
    assert_eq!(
        set.rules[1].capture.trace_binaries.len(),
        2,
        "from the rule"
    );
    let err = RuleSet::from_str(
        "version: 1\nrules:\n  - name: a\n    target: {comm: app}\n    \
         trigger: {signal: {signals: [SIGSEGV]}}\n    capture: { trace_binaries: [bin/x] }\n",
        "bad.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("absolute path"), "{err}");
}

#[test]
fn return_probe_defaults_to_exits_and_takes_uretprobe_on_request() {
    let text = |extra: &str| {
        format!(
            "version: 1\nrules:\n  - name: slow\n    target: {{comm: app}}\n    \
             trigger: {{function: {{symbol: f, min_duration: 2ms{extra}}}}}\n"
        )
    };
    let return_probe = |rule: Rule| match rule.trigger {
        Trigger::Function(f) => f.return_probe,
        other => panic!("{other:?}"),
    };
    assert_eq!(return_probe(only_rule(&text(""))), ReturnProbe::Exits);
    assert_eq!(
        return_probe(only_rule(&text(", return_probe: exits"))),
        ReturnProbe::Exits
    );
    assert_eq!(
        return_probe(only_rule(&text(", return_probe: uretprobe"))),
        ReturnProbe::Uretprobe
    );
}

#[test]
fn all_and_debug_dirs_of_a_function_rule() {
    let text = |extra: &str| {
        format!(
            "version: 1\nrules:\n  - name: slow\n    target: {{comm: app}}\n    \
             trigger: {{function: {{symbol: f{extra}}}}}\n"
        )
    };
    let function = |rule: Rule| match rule.trigger {
        Trigger::Function(f) => f,
        other => panic!("{other:?}"),
    };
    let plain = function(only_rule(&text("")));
    assert!(!plain.all && plain.debug_dirs.is_empty());
    let f = function(only_rule(&text(
        ", all: true, debug_dirs: [/srv/debug, /opt/debug]",
    )));
    assert!(f.all);
    assert_eq!(
        f.debug_dirs,
        [PathBuf::from("/srv/debug"), PathBuf::from("/opt/debug")]
    );
    // One directory stands for a list of one; relative paths are refused.
    let one = function(only_rule(&text(", debug_dirs: /srv/debug")));
    assert_eq!(one.debug_dirs.len(), 1);
    let err = RuleSet::from_str(&text(", debug_dirs: debug"), "r.yaml").unwrap_err();
    assert!(err.to_string().contains("absolute path"), "{err}");
}

#[test]
fn debuginfod_of_a_function_rule_and_of_the_defaults() {
    use crate::elf::debuginfod::Servers;
    let text = |defaults: &str, extra: &str, trigger: &str| {
        let trigger = if trigger.is_empty() {
            format!("{{function: {{symbol: f{extra}}}}}")
        } else {
            trigger.to_owned()
        };
        format!(
            "version: 1\n{defaults}rules:\n  - name: slow\n    target: {{comm: app}}\n    \
             trigger: {trigger}\n"
        )
    };
    let servers = |defaults: &str, extra: &str| only_rule(&text(defaults, extra, "")).debuginfod;
    assert_eq!(servers("", ""), Servers::FromEnv);
    assert_eq!(servers("", ", debuginfod: false"), Servers::Off);
    assert_eq!(servers("", ", debuginfod: true"), Servers::FromEnv);
    assert_eq!(
        servers(
            "",
            ", debuginfod: [\"http://127.0.0.1:8002/\", https://d.example]"
        ),
        Servers::Urls(vec![
            "http://127.0.0.1:8002".into(),
            "https://d.example".into()
        ])
    );
    assert_eq!(
        servers("", ", debuginfod: https://d.example"),
        Servers::Urls(vec!["https://d.example".into()])
    );
    // The defaults apply to every rule, a syscall rule too; a function's own wins.
    let off = "defaults: {debuginfod: false}\n";
    assert_eq!(servers(off, ""), Servers::Off);
    assert_eq!(servers(off, ", debuginfod: true"), Servers::FromEnv);
    let syscall = only_rule(&text(
        off,
        "",
        "{syscall: {names: read, min_duration: 5ms}}",
    ));
    assert_eq!(syscall.debuginfod, Servers::Off);
    // Not a URL: refused where it stands.
    let err = RuleSet::from_str(&text("", ", debuginfod: [ftp://x]", ""), "r.yaml").unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.contains("r.yaml:5:50:") && shown.contains("not a debuginfod server URL"),
        "{shown}"
    );
    let err = RuleSet::from_str(&text("", ", debuginfod: []", ""), "r.yaml").unwrap_err();
    assert!(err.to_string().contains("empty list"), "{err}");
}

#[test]
fn peers_are_false_true_rule_or_all() {
    for (word, peers) in [
        ("false", Peers::None),
        ("true", Peers::Rule),
        ("rule", Peers::Rule),
        ("all", Peers::All),
    ] {
        let text = format!(
            "version: 1\nrules:\n  - name: r\n    target: {{pid: 1}}\n    trigger: {{signal: {{signals: [SIGSEGV]}}}}\n    capture: {{peers: {word}}}\n"
        );
        let rules = parse(&text);
        assert_eq!(rules.rules[0].capture.peers, peers, "{word}");
    }
    let text = "version: 1\nrules:\n  - name: r\n    target: {pid: 1}\n    trigger: {signal: {signals: [SIGSEGV]}}\n    capture: {peers: everyone}\n";
    tests::assert_error(
        text,
        6,
        22,
        "unknown peers `everyone`: expected false, true",
    );
}

#[test]
fn detect_defaults_to_returned_and_takes_running_with_min_duration() {
    let function = |extra: &str| {
        format!(
            "version: 1\nrules:\n  - name: hung\n    target: {{comm: app}}\n    \
             trigger: {{function: {{symbol: f, min_duration: 5s{extra}}}}}\n"
        )
    };
    let syscall = |extra: &str| {
        format!(
            "version: 1\nrules:\n  - name: hung\n    target: {{comm: app}}\n    \
             trigger: {{syscall: {{names: [read, futex], min_duration: 5s{extra}}}}}\n"
        )
    };
    let detect = |rule: Rule| match rule.trigger {
        Trigger::Function(f) => f.detect,
        Trigger::Syscall(s) => s.detect,
        other @ Trigger::Signal(_) => panic!("{other:?}"),
    };
    for text in [function, syscall] {
        assert_eq!(detect(only_rule(&text(""))), Detect::Returned);
        assert_eq!(
            detect(only_rule(&text(", detect: returned"))),
            Detect::Returned
        );
        assert_eq!(
            detect(only_rule(&text(", detect: running"))),
            Detect::Running
        );
    }
    // The return probe stays free to choose with `returned`; `exits` (the default) goes
    // with `running` too.
    let rule = only_rule(&function(", detect: returned, return_probe: uretprobe"));
    assert_eq!(detect(rule), Detect::Returned);
    let rule = only_rule(&function(", detect: running, return_probe: exits"));
    assert_eq!(detect(rule), Detect::Running);
    // An entry trigger and an errno rule detect at the return, as ever.
    let rule = only_rule(&syscall(", errno: EIO, detect: returned"));
    assert_eq!(detect(rule), Detect::Returned);
}

#[test]
fn detect_spellings_round_trip() {
    for detect in [Detect::Returned, Detect::Running] {
        assert_eq!(detect.as_str().parse::<Detect>(), Ok(detect));
        assert_eq!(detect.to_string(), detect.as_str());
    }
    assert_eq!(Detect::default(), Detect::Returned);
    assert!("Running".parse::<Detect>().is_err());
}
