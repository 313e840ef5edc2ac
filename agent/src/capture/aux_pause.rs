//! `aux_pause` (Linux 6.13): pausing Intel PT in the kernel at the trigger itself, from
//! another perf event of the PT event's group. This module decides which lookback
//! triggers can be such an event and packs its `perf_event_attr`; the PT recorder does not
//! open these events yet (see "Not wired" below and docs/verification.md).
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
//! - `func:SYMBOL` (entry, no duration) → a uprobe perf event at the resolved probe point.
//! - Not mappable: a `min_duration` on a syscall (needs the entry time: state, hence BPF,
//!   and a BPF program on a tracepoint perf event is shared by every perf event of that
//!   tracepoint, results and-ed, so it would silence other tools) and on a function (a
//!   uretprobe perf event with its own BPF duration check would work, design.md verified
//!   the mechanism, but it needs a second program sharing the engine's entry-time map).
//!   These keep the userspace freeze (the trigger pump).
//!
//! Not wired, and why: (1) the kernel pauses on *every* match, including the ones the
//! engine suppresses by cooldown or rate limit, and (2) nothing but an `aux_resume`
//! overflow in the traced thread restarts a paused trace, so after each snapshot (or
//! suppressed match) the recorder would have to reopen its PT events or keep an
//! `aux_resume` member that fires on demand. Both need PT hardware to get right.

use perf_event_open_sys::bindings::{
    PERF_SAMPLE_IDENTIFIER, PERF_SAMPLE_TID, PERF_SAMPLE_TIME, PERF_TYPE_TRACEPOINT,
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
    /// A uprobe (uprobe PMU) at the function's entry; the path and offset come from the
    /// trigger engine's probe resolution.
    FunctionEntry { symbol: String },
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
        });
        assert!(matches!(
            pause_source(&any).unwrap(),
            PauseSource::Tracepoint { filter: None, .. }
        ));
        let slow = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Any,
            min_duration: Some(Duration::from_millis(5)),
            errnos: Vec::new(),
        });
        assert_eq!(pause_source(&slow), Err(NotMappable::SyscallDuration));
        let entry = FunctionTrigger {
            symbol: "handle".to_owned(),
            binary: None,
            min_duration: None,
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
}
