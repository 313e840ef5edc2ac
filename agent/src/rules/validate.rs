//! From file bytes to a [`RuleSet`]: the size cap and UTF-8 check, `serde_yaml` into `Raw*`
//! structs, then the checks across values (unique names, non-empty targets, exactly one
//! trigger kind) and the merge of `defaults` into each rule.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::guard;
use super::leaf::SyscallNames;
use super::locate::{self, Problem, Step};
use super::raw::{
    RawCapture, RawDefaults, RawFile, RawKubernetes, RawOutput, RawRule, RawSnapshot, RawTarget,
    RawTrigger,
};
use super::upload;
use super::{
    Capture, DetectConflict, FunctionTrigger, KubernetesSelector, MAX_FILE_BYTES, OutputPolicy,
    Retention, Rule, RuleSet, RulesError, SignalTrigger, SnapshotPolicy, SyscallSet,
    SyscallTrigger, Target, Trigger,
};

/// Reads at most [`MAX_FILE_BYTES`] + 1 bytes of `path` and validates them.
pub(super) fn load_file(path: &Path) -> Result<RuleSet, RulesError> {
    let file = path.display().to_string();
    let read_error = |source| RulesError::Read {
        file: file.clone(),
        source,
    };
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|handle| handle.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(guard::too_large(&file));
    }
    match std::str::from_utf8(&bytes) {
        Ok(text) => load_str(text, &file),
        Err(err) => Err(guard::not_utf8(&file, &bytes, err)),
    }
}

/// Validates `text`, naming it `file` in messages.
pub(super) fn load_str(text: &str, file: &str) -> Result<RuleSet, RulesError> {
    guard::check(text, file)?;
    // libyaml reads a byte-order mark as content; editors do not show it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let raw: RawFile =
        serde_yaml::from_str(text).map_err(|err| locate::from_yaml(text, file, &err))?;
    build(raw).map_err(|problem| locate::from_problem(text, file, problem))
}

/// How many rules one file may hold: the kernel engine's rule slots.
pub const MAX_RULES_PER_FILE: usize = lookback_common::MAX_RULES as usize;

/// The checks across values, and the merge of defaults.
fn build(raw: RawFile) -> Result<RuleSet, Problem> {
    if raw.rules.is_empty() {
        return Err(Problem::at_key(
            vec![Step::Key("rules")],
            "no rules; expected a list of at least one rule",
        ));
    }
    let defaults = raw.defaults.unwrap_or_default();
    let mut first_index: HashMap<String, usize> = HashMap::new();
    let mut rules = Vec::with_capacity(raw.rules.len());
    for (index, rule) in raw.rules.into_iter().enumerate() {
        let here = [Step::Key("rules"), Step::Index(index)];
        if index == MAX_RULES_PER_FILE {
            // The same limit for `rules validate`, `run --rules` and the agent: a file
            // that validates is one the agent loads.
            return Err(Problem::at_key(
                vec![Step::Key("name")],
                format!(
                    "rule {} of more than {MAX_RULES_PER_FILE}: at most \
                     {MAX_RULES_PER_FILE} rules can be loaded at once",
                    index + 1
                ),
            )
            .under(&here));
        }
        if let Some(&first) = first_index.get(&rule.name.0) {
            let message = format!(
                "duplicate rule name `{}`; rule names must be unique",
                rule.name.0
            );
            return Err(Problem::at_value(vec![Step::Key("name")], message)
                .under(&here)
                .first_at(vec![
                    Step::Key("rules"),
                    Step::Index(first),
                    Step::Key("name"),
                ]));
        }
        first_index.insert(rule.name.0.clone(), index);
        rules.push(build_rule(rule, &defaults).map_err(|problem| problem.under(&here))?);
    }
    Ok(RuleSet { rules })
}

/// One rule; problems are relative to the rule.
fn build_rule(mut rule: RawRule, defaults: &RawDefaults) -> Result<Rule, Problem> {
    let target = build_target(rule.target)?;
    // The function's own `debuginfod:`, else the defaults', else DEBUGINFOD_URLS.
    let debuginfod = rule
        .trigger
        .function
        .as_mut()
        .and_then(|f| f.debuginfod.take())
        .map(|servers| servers.0)
        .or_else(|| {
            defaults
                .debuginfod
                .as_ref()
                .map(|servers| servers.0.clone())
        })
        .unwrap_or_default();
    let trigger = build_trigger(rule.trigger)?;
    Ok(Rule {
        name: rule.name.0,
        target,
        trigger,
        debuginfod,
        capture: merge_capture(rule.capture.as_ref(), defaults.capture.as_ref()),
        snapshot: merge_snapshot(rule.snapshot.as_ref(), defaults.snapshot.as_ref()),
        output: merge_output(rule.output.as_ref(), defaults.output.as_ref())?,
    })
}

fn build_target(raw: RawTarget) -> Result<Target, Problem> {
    let kubernetes = raw.kubernetes.map(build_kubernetes);
    if kubernetes
        .as_ref()
        .is_some_and(KubernetesSelector::is_empty)
    {
        return Err(Problem::at_key(
            vec![Step::Key("target"), Step::Key("kubernetes")],
            "empty kubernetes selector; expected at least one of namespace, pod_labels, container",
        ));
    }
    let target = Target {
        pid: raw.pid.map(|pid| pid.0),
        comm: raw.comm.map(|comm| comm.0),
        exe: raw.exe.map(|exe| exe.0),
        cgroup: raw.cgroup.map(|cgroup| cgroup.0),
        kubernetes,
    };
    if target.is_empty() {
        return Err(Problem::at_key(
            vec![Step::Key("target")],
            "empty target; expected at least one of pid, comm, exe, cgroup, kubernetes",
        ));
    }
    Ok(target)
}

fn build_kubernetes(raw: RawKubernetes) -> KubernetesSelector {
    KubernetesSelector {
        namespace: raw.namespace.map(|text| text.0),
        pod_labels: raw.pod_labels.unwrap_or_default(),
        container: raw.container.map(|text| text.0),
    }
}

fn build_trigger(raw: RawTrigger) -> Result<Trigger, Problem> {
    let mut kinds = Vec::new();
    if let Some(function) = raw.function {
        let trigger = FunctionTrigger {
            symbol: function.symbol.0,
            binary: function.binary.map(|binary| binary.0),
            min_duration: function.min_duration.map(|duration| duration.0),
            return_probe: function.return_probe.unwrap_or_default(),
            detect: function.detect.unwrap_or_default(),
            all: function.all.unwrap_or(false),
            debug_dirs: function
                .debug_dirs
                .map(|dirs| dirs.0.into_iter().map(|dir| dir.0).collect())
                .unwrap_or_default(),
        };
        kinds.push(("function", Trigger::Function(trigger)));
    }
    if let Some(syscall) = raw.syscall {
        let syscalls = match syscall.names {
            SyscallNames::Any => SyscallSet::Any,
            SyscallNames::Names(names) => SyscallSet::Numbers(names.numbers()),
        };
        let trigger = SyscallTrigger {
            syscalls,
            min_duration: syscall.min_duration.map(|duration| duration.0),
            errnos: syscall.errno.map(|list| list.numbers()).unwrap_or_default(),
            detect: syscall.detect.unwrap_or_default(),
        };
        kinds.push(("syscall", Trigger::Syscall(trigger)));
    }
    if let Some(signal) = raw.signal {
        let signals = signal.signals.numbers();
        kinds.push(("signal", Trigger::Signal(SignalTrigger { signals })));
    }
    let mut kinds = kinds.into_iter();
    match (kinds.next(), kinds.next()) {
        (Some((kind, trigger)), None) => check_detect(kind, trigger),
        (None, _) => Err(Problem::at_key(
            vec![Step::Key("trigger")],
            "trigger has no kind; expected exactly one of function, syscall, signal",
        )),
        (Some((first, _)), Some((second, _))) => {
            let message = format!(
                "trigger has two kinds, `{first}` and `{second}`; expected exactly one of \
                 function, syscall, signal (write one rule per trigger)"
            );
            Err(
                Problem::at_key(vec![Step::Key("trigger"), Step::Key(second)], message)
                    .or_later(vec![Step::Key("trigger"), Step::Key(first)]),
            )
        }
    }
}

/// `trigger` if its `detect` can be honoured; otherwise the problem, at `detect:` or at the
/// field that conflicts with it, whichever comes later.
fn check_detect(kind: &'static str, trigger: Trigger) -> Result<Trigger, Problem> {
    let Some(conflict) = trigger.detect_conflict() else {
        return Ok(trigger);
    };
    let at = |field| vec![Step::Key("trigger"), Step::Key(kind), Step::Key(field)];
    let problem = Problem::at_value(at("detect"), conflict.message());
    Err(match conflict {
        DetectConflict::NoDuration => problem,
        DetectConflict::Errno => problem.or_later(at("errno")),
        DetectConflict::Uretprobe => problem.or_later(at("return_probe")),
    })
}

/// The rule's value of a field, else the defaults' value.
fn pick<R, T>(
    rule: Option<&R>,
    defaults: Option<&R>,
    field: impl Fn(&R) -> Option<T>,
) -> Option<T> {
    rule.and_then(&field).or_else(|| defaults.and_then(&field))
}

fn merge_capture(rule: Option<&RawCapture>, defaults: Option<&RawCapture>) -> Capture {
    let base = Capture::default();
    Capture {
        backend: pick(rule, defaults, |c| c.backend).unwrap_or(base.backend),
        buffer_size: pick(rule, defaults, |c| c.buffer_size).map_or(base.buffer_size, |s| s.0),
        sample_frequency: pick(rule, defaults, |c| c.sample_frequency)
            .map_or(base.sample_frequency, |hz| hz.0),
        stack_size: pick(rule, defaults, |c| c.stack_size).map_or(base.stack_size, |s| s.0),
        include_kernel: pick(rule, defaults, |c| c.include_kernel).unwrap_or(base.include_kernel),
        trace_binaries: pick(rule, defaults, |c| {
            c.trace_binaries
                .as_ref()
                .map(|l| l.0.iter().map(|p| p.0.clone()).collect())
        })
        .unwrap_or(base.trace_binaries),
        isolate: pick(rule, defaults, |c| c.isolate).unwrap_or(base.isolate),
        peers: pick(rule, defaults, |c| c.peers).unwrap_or(base.peers),
    }
}

fn merge_snapshot(rule: Option<&RawSnapshot>, defaults: Option<&RawSnapshot>) -> SnapshotPolicy {
    let base = SnapshotPolicy::default();
    SnapshotPolicy {
        cooldown: pick(rule, defaults, |s| s.cooldown).map_or(base.cooldown, |d| d.0),
        max_per_hour: pick(rule, defaults, |s| s.max_per_hour).map_or(base.max_per_hour, |n| n.0),
        post_trigger: pick(rule, defaults, |s| s.post_trigger).map_or(base.post_trigger, |d| d.0),
        scope: pick(rule, defaults, |s| s.scope).unwrap_or(base.scope),
    }
}

fn merge_output(
    rule: Option<&RawOutput>,
    defaults: Option<&RawOutput>,
) -> Result<OutputPolicy, Problem> {
    let base = OutputPolicy::default();
    let retention = Retention {
        max_files: pick(rule, defaults, |o| o.retention.as_ref()?.max_files)
            .map_or(base.retention.max_files, |n| n.0),
        max_bytes: pick(rule, defaults, |o| o.retention.as_ref()?.max_bytes)
            .map_or(base.retention.max_bytes, |size| size.0),
    };
    Ok(OutputPolicy {
        dir: pick(rule, defaults, |o| {
            o.dir.as_ref().map(|dir| PathBuf::from(&dir.0))
        }),
        format: pick(rule, defaults, |o| o.format).unwrap_or(base.format),
        keep_raw: pick(rule, defaults, |o| o.keep_raw).unwrap_or(base.keep_raw),
        retention,
        upload: upload::merge(
            rule.and_then(|o| o.upload.as_ref()),
            defaults.and_then(|o| o.upload.as_ref()),
        )?,
    })
}
