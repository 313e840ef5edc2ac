//! The rules file as serde reads it: `Raw*` structs with `deny_unknown_fields` and an
//! `expecting` text each, built from the self-checking leaf types of `leaf`. Checks across
//! values, and the conversion into domain types, happen in `validate`.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::leaf::{
    AbsolutePath, BufferSize, CgroupPath, Comm, DebuginfodServers, Errno, HumanDuration, List,
    Positive, RuleName, Signal, Size, StackSize, Symbol, SyscallNames, Text, Version,
};
use super::upload::RawUpload;
use super::{Backend, Detect, OutputFormat, Peers, ReturnProbe, SnapshotScope};

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rules file: a mapping with `version: 1` and `rules:`"
)]
pub(super) struct RawFile {
    #[expect(
        dead_code,
        reason = "checked while deserializing; only version 1 exists"
    )]
    pub version: Version,
    pub defaults: Option<RawDefaults>,
    pub rules: Vec<RawRule>,
}

/// `defaults:`, merged field by field into every rule.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of capture, snapshot, output, debuginfod"
)]
pub(super) struct RawDefaults {
    pub capture: Option<RawCapture>,
    pub snapshot: Option<RawSnapshot>,
    pub output: Option<RawOutput>,
    pub debuginfod: Option<DebuginfodServers>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a rule: a mapping with name, target, trigger"
)]
pub(super) struct RawRule {
    pub name: RuleName,
    pub target: RawTarget,
    pub trigger: RawTrigger,
    pub capture: Option<RawCapture>,
    pub snapshot: Option<RawSnapshot>,
    pub output: Option<RawOutput>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a target: a mapping of pid, comm, exe, cgroup, kubernetes"
)]
pub(super) struct RawTarget {
    pub pid: Option<Positive>,
    pub comm: Option<Comm>,
    pub exe: Option<AbsolutePath>,
    pub cgroup: Option<CgroupPath>,
    pub kubernetes: Option<RawKubernetes>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of namespace, pod_labels, container"
)]
pub(super) struct RawKubernetes {
    pub namespace: Option<Text>,
    pub pod_labels: Option<BTreeMap<String, String>>,
    pub container: Option<Text>,
}

/// `trigger:`; `validate` checks that exactly one kind is given.
#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a trigger: a mapping with one of function, syscall, signal"
)]
pub(super) struct RawTrigger {
    pub function: Option<RawFunction>,
    pub syscall: Option<RawSyscall>,
    pub signal: Option<RawSignal>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with symbol and optional binary, min_duration, detect, return_probe, \
                 all, debug_dirs, debuginfod"
)]
pub(super) struct RawFunction {
    pub symbol: Symbol,
    pub binary: Option<AbsolutePath>,
    #[serde(default, deserialize_with = "present")]
    pub min_duration: Option<HumanDuration>,
    pub detect: Option<Detect>,
    pub return_probe: Option<ReturnProbe>,
    pub all: Option<bool>,
    pub debug_dirs: Option<List<AbsolutePath>>,
    pub debuginfod: Option<DebuginfodServers>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping with names and optional min_duration, detect, errno"
)]
pub(super) struct RawSyscall {
    pub names: SyscallNames,
    #[serde(default, deserialize_with = "present")]
    pub min_duration: Option<HumanDuration>,
    pub detect: Option<Detect>,
    pub errno: Option<List<Errno>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with signals")]
pub(super) struct RawSignal {
    pub signals: List<Signal>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of backend, buffer_size, sample_frequency, stack_size, include_kernel, trace_binaries, isolate, peers"
)]
pub(super) struct RawCapture {
    pub backend: Option<Backend>,
    pub buffer_size: Option<BufferSize>,
    pub sample_frequency: Option<Positive>,
    pub stack_size: Option<StackSize>,
    pub include_kernel: Option<bool>,
    pub trace_binaries: Option<List<AbsolutePath>>,
    pub isolate: Option<bool>,
    pub peers: Option<Peers>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of cooldown, max_per_hour, post_trigger, scope"
)]
pub(super) struct RawSnapshot {
    #[serde(default, deserialize_with = "present")]
    pub cooldown: Option<HumanDuration>,
    pub max_per_hour: Option<Positive>,
    #[serde(default, deserialize_with = "present")]
    pub post_trigger: Option<HumanDuration>,
    pub scope: Option<SnapshotScope>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of dir, format, keep_raw, retention, upload"
)]
pub(super) struct RawOutput {
    pub dir: Option<Text>,
    pub format: Option<OutputFormat>,
    pub keep_raw: Option<bool>,
    pub retention: Option<RawRetention>,
    pub upload: Option<RawUpload>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping of max_files, max_bytes")]
pub(super) struct RawRetention {
    pub max_files: Option<Positive>,
    pub max_bytes: Option<Size>,
}

/// An optional field that, when written, holds a value: `min_duration:` with nothing after
/// it is YAML null, and read as "absent" it silently made a latency rule fire on every
/// call. Absent fields get `default`; a null is refused like any wrong value, at its
/// line and column.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}
