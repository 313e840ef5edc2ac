//! `aux_pause` (Linux 6.13): pausing Intel PT in the kernel at the trigger itself, from
//! another perf event of the PT event's group. This module decides which lookback
//! triggers can be such an event and builds the group members the PT recorder opens next
//! to each PT event ([`members`]): one pause event per trigger that maps, and one resume
//! event. Never run on PT hardware (see docs/verification.md).
//!
//! How the kernel does it (kernel/events/core.c, the patch "perf/core: Add `aux_pause`,
//! `aux_resume`, `aux_start_paused`"): `perf_event_attr.aux_action` (the former `__reserved_3`, a u32 at
//! byte 116, inside `PERF_ATTR_SIZE_VER6`) has bits `aux_start_paused` (0), `aux_pause`
//! (1) and `aux_resume` (2). An event with `aux_pause` must be a member of a group whose
//! leader is the AUX event, on a PMU with `PERF_PMU_CAP_AUX_PAUSE` (`perf_get_aux_event`;
//! otherwise `perf_event_open` fails with `EINVAL`). Each time the member *overflows*
//! (`__perf_event_overflow`; with `sample_period = 1`, every hit that reaches perf), the
//! kernel calls `perf_event_aux_pause(event->aux_event, true)` → `pmu->stop(PERF_EF_PAUSE)`:
//! PT stops in the triggering thread's own context, no wakeup, no userspace. The pause is
//! sticky (`hw.aux_paused`): context switches and `PERF_EVENT_IOC_ENABLE` do not restart
//! the trace; only an `aux_resume` event's overflow does.
//!
//! Which triggers map onto a group member (per traced thread and CPU, like the PT event):
//! - `signal:` → the `signal:signal_deliver` tracepoint (it fires in the receiving
//!   thread; `signal_generate` fires in the sender's, which a per-task event never sees),
//!   with a tracepoint filter `sig == N || ...` (`PERF_EVENT_IOC_SET_FILTER`; per event, it
//!   does not touch other tools).
//! - `syscall:` without `min_duration` → `raw_syscalls:sys_exit` with the filter
//!   `(id == N || ...) && (ret == -E || ...)` (the errno part only with `errno`).
//! - `func:SYMBOL` (entry, no duration) → a uprobe perf event (uprobe PMU) at the entry
//!   probe the trigger engine placed ([`resolve_entries`]).
//! - Not mappable: a `min_duration` on a syscall (needs the entry time: state, hence BPF,
//!   and a BPF program on a tracepoint perf event is shared by every perf event of that
//!   tracepoint, results and-ed, so it would silence other tools) and on a function (a
//!   uretprobe perf event with its own BPF duration check would work, design.md verified
//!   the mechanism, but it needs a second program sharing the engine's entry-time map).
//!   These keep the userspace freeze (the trigger pump).
//!
//! Suppressed matches and the sticky pause: the kernel pauses on *every* match, including
//! the ones the engine then drops (cooldown, rate limit, a snapshot already in progress),
//! and nothing but an `aux_resume` overflow in the traced thread restarts a paused trace
//! (not `PERF_EVENT_IOC_ENABLE` after the snapshot). So every group also gets a resume
//! member: a `cpu-clock` event of the thread that overflows every [`RESUME_PERIOD_NS`] of
//! its CPU time. A dropped match costs that thread at most that much trace; after a
//! snapshot, its trace restarts within that time. The userspace freeze still follows every
//! trigger (other threads, other CPUs' buffers). Only with `post_trigger` zero (no trace
//! is asked for after the trigger): `run`/`attach`, and `lookback agent` for a process none
//! of whose rules has a `post_trigger` (signals and plain syscalls; function entries there
//! still freeze from userspace).

use std::{
    ffi::CString,
    path::{Path, PathBuf},
};

use perf_event_open_sys::bindings::{
    PERF_COUNT_SW_CPU_CLOCK, PERF_SAMPLE_IDENTIFIER, PERF_SAMPLE_TID, PERF_SAMPLE_TIME,
    PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT,
};

use crate::{
    rules::{SyscallSet, Trigger},
    sys::perf::perf_event_attr,
};

/// `aux_action` bit 0: create the AUX event paused.
pub const AUX_START_PAUSED: u32 = 1 << 0;
/// `aux_action` bit 1: on overflow, pause the group leader's AUX tracing.
pub const AUX_PAUSE: u32 = 1 << 1;
/// `aux_action` bit 2: on overflow, resume it.
pub const AUX_RESUME: u32 = 1 << 2;

/// The perf event that could pause PT at a trigger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PauseSource {
    /// A tracepoint (`events/SYSTEM/NAME/id` in tracefs) with a filter in ftrace syntax.
    Tracepoint {
        system: &'static str,
        name: &'static str,
        filter: Option<String>,
    },
    /// A function's entry, before its probe point is known ([`resolve_entries`] turns it
    /// into an [`Self::Uprobe`] with the trigger engine's probe).
    FunctionEntry { symbol: String },
    /// A uprobe (uprobe PMU) at `offset` in the file at `path`.
    Uprobe { path: PathBuf, offset: u64 },
}

/// Replaces each [`PauseSource::FunctionEntry`] with a [`PauseSource::Uprobe`] at the
/// entry probe `probe_of` gives for the symbol (the one the trigger engine attached);
/// entries without one stay as they are (and [`members`] notes them).
pub fn resolve_entries(
    sources: &mut [PauseSource],
    probe_of: impl Fn(&str) -> Option<(PathBuf, u64)>,
) {
    for source in sources {
        if let PauseSource::FunctionEntry { symbol } = source
            && let Some((path, offset)) = probe_of(symbol)
        {
            *source = PauseSource::Uprobe { path, offset };
        }
    }
}

/// Why a trigger cannot pause PT in the kernel (it keeps the userspace freeze).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotMappable {
    #[error(
        "a syscall duration needs the entry time (BPF state), and BPF on tracepoint perf \
         events is shared with every other tool"
    )]
    SyscallDuration,
    #[error("a function duration needs a BPF duration check on a uretprobe perf event")]
    FunctionDuration,
}

/// The pause event for `trigger`, or why there is none.
pub fn pause_source(trigger: &Trigger) -> Result<PauseSource, NotMappable> {
    match trigger {
        Trigger::Signal(s) => Ok(PauseSource::Tracepoint {
            system: "signal",
            name: "signal_deliver",
            filter: any_of("sig", s.signals.iter().map(|&n| i64::from(n))),
        }),
        Trigger::Syscall(s) if s.min_duration.is_some() => Err(NotMappable::SyscallDuration),
        Trigger::Syscall(s) => {
            let ids = match &s.syscalls {
                SyscallSet::Any => None,
                SyscallSet::Numbers(n) => any_of("id", n.iter().map(|&n| i64::from(n))),
            };
            let rets = any_of("ret", s.errnos.iter().map(|&e| -i64::from(e)));
            let filter = match (ids, rets) {
                (Some(i), Some(r)) => Some(format!("({i}) && ({r})")),
                (one, other) => one.or(other),
            };
            Ok(PauseSource::Tracepoint {
                system: "raw_syscalls",
                name: "sys_exit",
                filter,
            })
        }
        Trigger::Function(f) if f.min_duration.is_some() => Err(NotMappable::FunctionDuration),
        Trigger::Function(f) => Ok(PauseSource::FunctionEntry {
            symbol: f.symbol.clone(),
        }),
    }
}

/// `FIELD == A || FIELD == B ...`; `None` for no values.
fn any_of(field: &str, values: impl Iterator<Item = i64>) -> Option<String> {
    let parts: Vec<String> = values.map(|v| format!("{field} == {v}")).collect();
    (!parts.is_empty()).then(|| parts.join(" || "))
}

/// The attr of a group member that pauses its leader's AUX trace on every hit: counting
/// each hit as an overflow (`sample_period = 1`), inherited like the PT event, with
/// `aux_action = AUX_PAUSE` written into the raw u32 (byte 116).
pub fn pause_attr(type_: u32, config: u64) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_,
        config,
        sample_type: u64::from(PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_IDENTIFIER),
        ..perf_event_attr::default()
    };
    attr.__bindgen_anon_1.sample_period = 1;
    attr.__bindgen_anon_5.aux_action = AUX_PAUSE;
    attr.set_inherit(1);
    attr.set_sample_id_all(1);
    attr.set_exclude_hv(1);
    attr
}

/// A tracepoint pause event (`config` = the tracepoint id from tracefs).
pub fn tracepoint_pause_attr(tracepoint_id: u64) -> perf_event_attr {
    pause_attr(PERF_TYPE_TRACEPOINT, tracepoint_id)
}

/// CPU time of a traced thread after which the resume member restarts a trace the kernel
/// paused. The pause is sticky, so without it a thread would stay untraced after its first
/// snapshot (`PERF_EVENT_IOC_ENABLE` does not clear it) and after every match the engine
/// then suppressed (cooldown, rate limit, busy). Longer: a thread's trace after a snapshot
/// starts later; shorter: more often the resume comes before the userspace freeze
/// (50–300 µs after the trigger) and the trace runs on until then, as without `aux_pause`.
pub const RESUME_PERIOD_NS: u64 = 10_000_000;

/// The member that resumes the leader's trace: a `cpu-clock` event of the traced thread
/// that overflows every [`RESUME_PERIOD_NS`] of its CPU time (`aux_action = AUX_RESUME`).
pub fn resume_attr() -> perf_event_attr {
    let mut attr = pause_attr(PERF_TYPE_SOFTWARE, u64::from(PERF_COUNT_SW_CPU_CLOCK));
    attr.__bindgen_anon_1.sample_period = RESUME_PERIOD_NS;
    attr.__bindgen_anon_5.aux_action = AUX_RESUME;
    attr
}

/// One event to open in every PT event's group (same thread, same CPU).
#[derive(Debug, Clone)]
pub struct Member {
    pub name: &'static str,
    /// For a uprobe, `config1` points into `keep`.
    pub attr: perf_event_attr,
    /// The tracepoint filter (`PERF_EVENT_IOC_SET_FILTER`).
    pub filter: Option<CString>,
    /// Memory `attr` points to (a uprobe's path): kept as long as the member may be
    /// opened (new threads). A `CString`'s bytes stay put when it moves.
    pub keep: Option<CString>,
}

/// The attr of a uprobe pause event (uprobe PMU `type_`): `config1` is the path
/// (`uprobe_path`), `config2` the file offset (`probe_offset`), `config` 0 (entry).
pub fn uprobe_pause_attr(type_: u32, path: &CString, offset: u64) -> perf_event_attr {
    let mut attr = pause_attr(type_, 0);
    attr.__bindgen_anon_3.config1 = path.as_ptr() as u64;
    attr.__bindgen_anon_4.config2 = offset;
    attr
}

/// The uprobe PMU's type, from `EVENT_SOURCES/uprobe/type`.
fn uprobe_type(event_sources: &Path) -> Option<u32> {
    std::fs::read_to_string(event_sources.join("uprobe/type"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The group members for `sources`: one pause event per distinct source, then the resume
/// event (none at all when no source maps). Sources that cannot be opened here come back
/// as notes (why), not errors: their triggers keep the userspace freeze.
///
/// `event_sources`: the PMUs (`/sys/bus/event_source/devices`, for the uprobe PMU);
/// tracefs is looked for beside it ([`tracing_dirs`]).
pub fn members(sources: &[PauseSource], event_sources: &Path) -> (Vec<Member>, Vec<String>) {
    let dirs = tracing_dirs(event_sources);
    let mut out: Vec<Member> = Vec::new();
    let mut notes = Vec::new();
    let mut seen: Vec<&PauseSource> = Vec::new();
    for source in sources {
        if seen.contains(&source) {
            continue;
        }
        seen.push(source);
        match source {
            PauseSource::Tracepoint {
                system,
                name,
                filter,
            } => {
                let Some(id) = dirs.iter().find_map(|dir| tracepoint_id(dir, system, name)) else {
                    notes.push(format!(
                        "{system}:{name}: no tracepoint id in tracefs (not mounted?)"
                    ));
                    continue;
                };
                let Ok(filter) = filter.as_deref().map(CString::new).transpose() else {
                    notes.push(format!("{system}:{name}: filter contains a NUL byte"));
                    continue;
                };
                out.push(Member {
                    name: "aux_pause (tracepoint)",
                    attr: tracepoint_pause_attr(id),
                    filter,
                    keep: None,
                });
            }
            PauseSource::FunctionEntry { symbol } => {
                notes.push(format!("func:{symbol}: no entry probe was placed for it"));
            }
            PauseSource::Uprobe { path, offset } => {
                let Some(type_) = uprobe_type(event_sources) else {
                    notes.push(format!("{}: no uprobe PMU", path.display()));
                    continue;
                };
                let Ok(c_path) = CString::new(path.as_os_str().as_encoded_bytes()) else {
                    notes.push(format!("{}: path contains a NUL byte", path.display()));
                    continue;
                };
                out.push(Member {
                    name: "aux_pause (uprobe)",
                    attr: uprobe_pause_attr(type_, &c_path, *offset),
                    filter: None,
                    keep: Some(c_path),
                });
            }
        }
    }
    if !out.is_empty() {
        out.push(Member {
            name: "aux_resume (cpu-clock)",
            attr: resume_attr(),
            filter: None,
            keep: None,
        });
    }
    (out, notes)
}

/// `DIR/events/SYSTEM/NAME/id`.
fn tracepoint_id(dir: &Path, system: &str, name: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join("events").join(system).join(name).join("id"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Where tracefs may be mounted, for the sysfs tree of `event_sources`
/// (`SYS/bus/event_source/devices`): `SYS/kernel/tracing`, `SYS/kernel/debug/tracing`.
pub fn tracing_dirs(event_sources: &Path) -> Vec<PathBuf> {
    event_sources
        .ancestors()
        .nth(3)
        .map(|sys| vec![sys.join("kernel/tracing"), sys.join("kernel/debug/tracing")])
        .unwrap_or_default()
}

/// Whether `attr` is a resume member ([`resume_attr`]).
pub fn is_resume(attr: &perf_event_attr) -> bool {
    // SAFETY: both union members are a plain u32 (the word and its bitfield view).
    let bits = unsafe { attr.__bindgen_anon_5.aux_action };
    bits & AUX_RESUME != 0
}

/// The members a kernel takes, and those it refused with why.
#[derive(Debug)]
pub struct Accepted<T, E> {
    /// The pause members the kernel took, then the resume member; empty when no pause
    /// member was taken (a resume alone has nothing to do) or the resume member was not
    /// (a pause that nothing resumes would leave its thread untraced for good).
    pub kept: Vec<T>,
    /// The members refused, each with the kernel's answer.
    pub refused: Vec<(T, E)>,
}

/// Tries each pause member on its own, with the resume member, through `takes` (which
/// opens the given members in a PT group and closes them again), so that one member the
/// kernel refuses (a uprobe member needs `CAP_SYS_ADMIN`; a tracepoint one does not)
/// costs only its own trigger the in-kernel pause, not every other trigger's. `is_resume`
/// picks the resume member out of `members` (at most one; [`members`] puts it last).
pub fn accepted<T, E>(
    members: Vec<T>,
    is_resume: impl Fn(&T) -> bool,
    mut takes: impl FnMut(&[&T]) -> Result<(), E>,
) -> Accepted<T, E> {
    let (mut resume, pauses): (Vec<T>, Vec<T>) = members.into_iter().partition(|m| is_resume(m));
    let mut out = Accepted {
        kept: Vec::new(),
        refused: Vec::new(),
    };
    let Some(resume) = resume.pop() else {
        return out;
    };
    if let Err(e) = takes(&[&resume]) {
        out.refused.push((resume, e));
        return out;
    }
    for pause in pauses {
        match takes(&[&pause, &resume]) {
            Ok(()) => out.kept.push(pause),
            Err(e) => out.refused.push((pause, e)),
        }
    }
    if !out.kept.is_empty() {
        out.kept.push(resume);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{mem::offset_of, time::Duration};

    use perf_event_open_sys::bindings::{PERF_ATTR_SIZE_VER5, PERF_ATTR_SIZE_VER6};

    use super::*;
    use crate::rules::{FunctionTrigger, SignalTrigger, SyscallTrigger};

    #[test]
    fn aux_action_sits_where_the_kernel_reads_it() {
        // The u32 after aux_sample_size (bytes 112..116): the old __reserved_3, which
        // kernels before 6.13 require to be zero. It lies inside PERF_ATTR_SIZE_VER6,
        // so every kernel that knows the bits reads them.
        let at = offset_of!(perf_event_attr, __bindgen_anon_5);
        assert_eq!(at, 116);
        assert_eq!(offset_of!(perf_event_attr, aux_sample_size), 112);
        assert!(at >= PERF_ATTR_SIZE_VER5 as usize && at + 4 <= PERF_ATTR_SIZE_VER6 as usize);
        assert!(is_resume(&resume_attr()));
        assert!(!is_resume(&tracepoint_pause_attr(321)));
        let attr = tracepoint_pause_attr(321);
        // SAFETY: both union members are a plain u32 (the word and its bitfield view).
        let (bits, view) = unsafe {
            (
                attr.__bindgen_anon_5.aux_action,
                attr.__bindgen_anon_5.__bindgen_anon_1,
            )
        };
        assert_eq!(bits, 0b010);
        // The kernel's bitfield view agrees: pause only, never start paused or resume.
        assert_eq!(
            (view.aux_start_paused(), view.aux_pause(), view.aux_resume()),
            (0, 1, 0)
        );
        assert_eq!((attr.type_, attr.config), (PERF_TYPE_TRACEPOINT, 321));
        // SAFETY: sample_period/sample_freq are both u64.
        assert_eq!(unsafe { attr.__bindgen_anon_1.sample_period }, 1);
        assert_eq!(attr.freq(), 0);
        assert_eq!(attr.inherit(), 1);
        for (bit, want) in [(AUX_START_PAUSED, 0), (AUX_PAUSE, 1), (AUX_RESUME, 2)] {
            assert_eq!(bit, 1 << want);
        }
    }

    /// A sysfs tree whose tracefs lists `signal:signal_deliver` (id 181) and
    /// `raw_syscalls:sys_exit` (id 22), under `debug/tracing` as on older mounts.
    fn fixture() -> (tempfile::TempDir, PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let sys = root.path().join("sys");
        for (event, id) in [
            ("signal/signal_deliver", "181\n"),
            ("raw_syscalls/sys_exit", "22\n"),
        ] {
            let dir = sys.join("kernel/debug/tracing/events").join(event);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("id"), id).unwrap();
        }
        let sources = sys.join("bus/event_source/devices");
        assert_eq!(tracing_dirs(&sources)[1], sys.join("kernel/debug/tracing"));
        (root, sources)
    }

    fn signal(filter: &str) -> PauseSource {
        PauseSource::Tracepoint {
            system: "signal",
            name: "signal_deliver",
            filter: Some(filter.to_owned()),
        }
    }

    #[test]
    fn members_are_one_pause_event_per_source_then_the_resume_event() {
        let (_root, dirs) = fixture();
        let exit = PauseSource::Tracepoint {
            system: "raw_syscalls",
            name: "sys_exit",
            filter: None,
        };
        let sources = [
            signal("sig == 11"),
            exit.clone(),
            signal("sig == 11"),
            PauseSource::FunctionEntry {
                symbol: "handle".to_owned(),
            },
        ];
        let (members, notes) = members(&sources, &dirs);
        // The repeated source once, the function entry as a note, the resume event last.
        assert_eq!(members.len(), 3, "{members:?}");
        assert_eq!(notes.len(), 1);
        assert!(notes[0].starts_with("func:handle:"), "{notes:?}");
        let configs: Vec<(u32, u64)> = members
            .iter()
            .map(|m| (m.attr.type_, m.attr.config))
            .collect();
        assert_eq!(
            configs,
            [
                (PERF_TYPE_TRACEPOINT, 181),
                (PERF_TYPE_TRACEPOINT, 22),
                (PERF_TYPE_SOFTWARE, u64::from(PERF_COUNT_SW_CPU_CLOCK)),
            ]
        );
        assert_eq!(members[0].filter.as_deref(), Some(c"sig == 11"));
        assert_eq!(members[1].filter, None);
        // SAFETY: aux_action and sample_period are plain integers in their unions.
        let (actions, periods): (Vec<u32>, Vec<u64>) = members
            .iter()
            .map(|m| unsafe {
                (
                    m.attr.__bindgen_anon_5.aux_action,
                    m.attr.__bindgen_anon_1.sample_period,
                )
            })
            .unzip();
        assert_eq!(actions, [AUX_PAUSE, AUX_PAUSE, AUX_RESUME]);
        assert_eq!(periods, [1, 1, RESUME_PERIOD_NS]);
        // Inherited like the PT event, so new threads get them too; never paused at start.
        assert!(
            members
                .iter()
                .all(|m| m.attr.inherit() == 1 && m.attr.freq() == 0)
        );
        // A tracepoint member must see kernel context: that is where tracepoints fire.
        assert!(members.iter().all(|m| m.attr.exclude_kernel() == 0));
    }

    #[test]
    fn without_tracefs_nothing_pauses_not_even_a_lone_resume_event() {
        let root = tempfile::tempdir().unwrap();
        let (members, notes) = members(
            &[signal("sig == 6")],
            &root.path().join("sys/bus/event_source/devices"),
        );
        assert!(members.is_empty());
        assert!(notes[0].contains("no tracepoint id"), "{notes:?}");
        assert!(tracing_dirs(Path::new("devices")).is_empty());
    }

    /// The function the uprobe test probes (exported, so the test finds its symbol).
    #[unsafe(no_mangle)]
    #[inline(never)]
    pub extern "C" fn lookback_aux_pause_probe_target(x: u64) -> u64 {
        std::hint::black_box(x).wrapping_add(1)
    }

    #[test]
    fn entry_sources_take_the_engines_probe_and_become_uprobe_members() {
        let mut sources = vec![
            PauseSource::FunctionEntry {
                symbol: "handle".to_owned(),
            },
            PauseSource::FunctionEntry {
                symbol: "elsewhere".to_owned(),
            },
            signal("sig == 11"),
        ];
        resolve_entries(&mut sources, |symbol| {
            (symbol == "handle").then(|| (PathBuf::from("/srv/app"), 0x1234))
        });
        assert_eq!(
            sources[0],
            PauseSource::Uprobe {
                path: PathBuf::from("/srv/app"),
                offset: 0x1234
            }
        );
        assert!(matches!(&sources[1], PauseSource::FunctionEntry { .. }));
        assert_eq!(sources[2], signal("sig == 11"));
        // Members: the uprobe PMU's type from sysfs, the path behind config1.
        let (root, event_sources) = fixture();
        std::fs::create_dir_all(event_sources.join("uprobe")).unwrap();
        std::fs::write(event_sources.join("uprobe/type"), "8\n").unwrap();
        let (members, notes) = members(&sources[..2], &event_sources);
        assert_eq!(notes, ["func:elsewhere: no entry probe was placed for it"]);
        assert_eq!(members.len(), 2, "{members:?}");
        let uprobe = &members[0];
        assert_eq!((uprobe.attr.type_, uprobe.attr.config), (8, 0));
        let keep = uprobe.keep.as_ref().unwrap();
        assert_eq!(keep.as_c_str(), c"/srv/app");
        // SAFETY: config1/config2 are plain u64s in their unions.
        let (config1, config2) = unsafe {
            (
                uprobe.attr.__bindgen_anon_3.config1,
                uprobe.attr.__bindgen_anon_4.config2,
            )
        };
        assert_eq!(config1, keep.as_ptr() as u64);
        assert_eq!(config2, 0x1234);
        drop(root);
    }

    #[test]
    fn a_uprobe_member_attr_counts_the_calls_of_its_function() {
        // The pause member's attr without its aux_action (no PT leader here), opened on
        // this thread at this test's own function: the kernel must take the path and the
        // offset where the member puts them, and count each call.
        let exe = std::env::current_exe().unwrap();
        let point = crate::triggers::resolve::resolve_symbol(
            &exe,
            &crate::triggers::resolve::Lookup::name("lookback_aux_pause_probe_target"),
        )
        .unwrap()
        .remove(0);
        let type_ = uprobe_type(Path::new("/sys/bus/event_source/devices")).unwrap();
        let path = CString::new(point.path.as_os_str().as_encoded_bytes()).unwrap();
        let mut attr = uprobe_pause_attr(type_, &path, point.file_offset);
        attr.__bindgen_anon_5.aux_action = 0;
        let fd = crate::sys::perf::perf_event_open(
            &attr,
            crate::sys::perf::Target::CurrentThread,
            None,
            None,
            0,
        )
        .unwrap();
        let mut sum = 0;
        for i in 0..5 {
            sum += lookback_aux_pause_probe_target(i);
        }
        assert_eq!(sum, 15);
        assert_eq!(
            crate::sys::perf::read_count(std::os::fd::AsFd::as_fd(&fd)).unwrap(),
            5
        );
    }

    #[test]
    fn signals_and_plain_syscalls_map_durations_do_not() {
        let signal = Trigger::Signal(SignalTrigger {
            signals: vec![11, 6],
        });
        assert_eq!(
            pause_source(&signal).unwrap(),
            PauseSource::Tracepoint {
                system: "signal",
                name: "signal_deliver",
                filter: Some("sig == 11 || sig == 6".to_owned()),
            }
        );
        let fsync_eio = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![74, 75]),
            min_duration: None,
            errnos: vec![5],
            detect: crate::rules::Detect::Returned,
        });
        assert_eq!(
            pause_source(&fsync_eio).unwrap(),
            PauseSource::Tracepoint {
                system: "raw_syscalls",
                name: "sys_exit",
                filter: Some("(id == 74 || id == 75) && (ret == -5)".to_owned()),
            }
        );
        let any = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Any,
            min_duration: None,
            errnos: Vec::new(),
            detect: crate::rules::Detect::Returned,
        });
        assert!(matches!(
            pause_source(&any).unwrap(),
            PauseSource::Tracepoint { filter: None, .. }
        ));
        let slow = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Any,
            min_duration: Some(Duration::from_millis(5)),
            errnos: Vec::new(),
            detect: crate::rules::Detect::Returned,
        });
        assert_eq!(pause_source(&slow), Err(NotMappable::SyscallDuration));
        let entry = FunctionTrigger {
            symbol: "handle".to_owned(),
            binary: None,
            min_duration: None,
            ..FunctionTrigger::default()
        };
        assert_eq!(
            pause_source(&Trigger::Function(entry.clone())).unwrap(),
            PauseSource::FunctionEntry {
                symbol: "handle".to_owned()
            }
        );
        let slow_fn = Trigger::Function(FunctionTrigger {
            min_duration: Some(Duration::from_millis(2)),
            ..entry
        });
        assert_eq!(pause_source(&slow_fn), Err(NotMappable::FunctionDuration));
    }

    #[test]
    fn a_refused_member_costs_only_its_own_pause() {
        let resume = |m: &&str| m.starts_with("resume");
        // The kernel refuses the uprobe member (no CAP_SYS_ADMIN), takes the others: before,
        // one group of all members was tried and every pause was dropped.
        let mut tried = Vec::new();
        let got = accepted(
            vec!["signal", "uprobe", "syscall", "resume"],
            resume,
            |group: &[&&str]| {
                tried.push(group.iter().map(|m| **m).collect::<Vec<_>>());
                if group.contains(&&"uprobe") {
                    Err("EACCES")
                } else {
                    Ok(())
                }
            },
        );
        assert_eq!(got.kept, ["signal", "syscall", "resume"]);
        assert_eq!(got.refused, [("uprobe", "EACCES")]);
        assert_eq!(
            tried,
            [
                vec!["resume"],
                vec!["signal", "resume"],
                vec!["uprobe", "resume"],
                vec!["syscall", "resume"],
            ]
        );
        // No resume taken: no pause either (it would stay paused for good).
        let got = accepted(vec!["signal", "resume"], resume, |group: &[&&str]| {
            if group.contains(&&"resume") {
                Err("EINVAL")
            } else {
                Ok(())
            }
        });
        assert!(got.kept.is_empty());
        assert_eq!(got.refused, [("resume", "EINVAL")]);
        // Every pause refused: the resume alone is not kept.
        let got = accepted(vec!["uprobe", "resume"], resume, |group: &[&&str]| {
            if group.len() > 1 {
                Err("EACCES")
            } else {
                Ok(())
            }
        });
        assert!(got.kept.is_empty());
        assert_eq!(got.refused, [("uprobe", "EACCES")]);
        // No members, or no resume member: nothing to try.
        let got = accepted(Vec::<&str>::new(), resume, |_: &[&&str]| Ok::<(), ()>(()));
        assert!(got.kept.is_empty() && got.refused.is_empty());
    }
}
