//! Rules → the kernel's view of them (`RuleSpec`): bitmaps of syscalls, errnos and signals,
//! flags, durations in ns. Pure: no I/O, unit-tested.
use std::time::Duration;

use lookback_common::rule::{
    ERRNO_BITMAP_WORDS, FLAG_ANY_SYSCALL, FLAG_ERRNO, FLAG_FOLLOW_FORKS, FLAG_ON_ENTRY,
    FLAG_RUNNING, FLAG_SCOPE_RULE, KIND_FUNCTION, KIND_SIGNAL, KIND_SYSCALL, RuleSpec,
    SYSCALL_BITMAP_WORDS, set_bit,
};

use crate::rules::{Detect, SyscallSet, Trigger};

/// A rule as the trigger engine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRule {
    /// Index in the kernel's `RULES` map, `0..MAX_RULES`.
    pub id: u32,
    pub name: String,
    pub trigger: Trigger,
    /// Minimum time between two triggers that reach userspace.
    pub cooldown: Duration,
    /// Triggers per rolling hour that reach userspace; 0 = unlimited.
    pub max_per_hour: u32,
    /// Children forked by a target become targets.
    pub follow_forks: bool,
    /// The cooldown and hourly limit count per rule and process (`snapshot.scope:
    /// process`), not per rule.
    pub per_process: bool,
}

/// A rule the kernel cannot represent.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("rule {rule}: syscall number {nr} is out of range (max {max})")]
    SyscallRange { rule: String, nr: u32, max: usize },
    #[error("rule {rule}: errno {errno} is out of range (max {max})")]
    ErrnoRange {
        rule: String,
        errno: u32,
        max: usize,
    },
    #[error("rule {rule}: signal {signal} is out of range (1..=63)")]
    SignalRange { rule: String, signal: u32 },
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Builds the kernel rule.
pub fn rule_spec(rule: &EngineRule) -> Result<RuleSpec, PlanError> {
    let mut spec = RuleSpec {
        cooldown_ns: ns(rule.cooldown),
        max_per_hour: u64::from(rule.max_per_hour),
        ..RuleSpec::default()
    };
    if rule.follow_forks {
        spec.flags |= FLAG_FOLLOW_FORKS;
    }
    if !rule.per_process {
        spec.flags |= FLAG_SCOPE_RULE;
    }
    match &rule.trigger {
        Trigger::Function(f) => {
            spec.kind = KIND_FUNCTION;
            match f.min_duration {
                Some(d) => spec.min_duration_ns = ns(d),
                None => spec.flags |= FLAG_ON_ENTRY,
            }
            if f.detect == Detect::Running {
                spec.flags |= FLAG_RUNNING;
            }
        }
        Trigger::Syscall(s) => {
            spec.kind = KIND_SYSCALL;
            match &s.syscalls {
                SyscallSet::Any => spec.flags |= FLAG_ANY_SYSCALL,
                SyscallSet::Numbers(nrs) => {
                    for &nr in nrs {
                        if !set_bit(&mut spec.syscalls, u64::from(nr)) {
                            return Err(PlanError::SyscallRange {
                                rule: rule.name.clone(),
                                nr,
                                max: SYSCALL_BITMAP_WORDS * 64 - 1,
                            });
                        }
                    }
                }
            }
            for &errno in &s.errnos {
                if !set_bit(&mut spec.errnos, u64::from(errno)) {
                    return Err(PlanError::ErrnoRange {
                        rule: rule.name.clone(),
                        errno,
                        max: ERRNO_BITMAP_WORDS * 64 - 1,
                    });
                }
            }
            if !s.errnos.is_empty() {
                spec.flags |= FLAG_ERRNO;
            }
            match s.min_duration {
                Some(d) => spec.min_duration_ns = ns(d),
                None if s.errnos.is_empty() => spec.flags |= FLAG_ON_ENTRY,
                None => {}
            }
            if s.detect == Detect::Running {
                spec.flags |= FLAG_RUNNING;
            }
        }
        Trigger::Signal(s) => {
            spec.kind = KIND_SIGNAL;
            for &signal in &s.signals {
                if !(1..64).contains(&signal) {
                    return Err(PlanError::SignalRange {
                        rule: rule.name.clone(),
                        signal,
                    });
                }
                spec.signals |= 1 << signal;
            }
        }
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{FunctionTrigger, SignalTrigger, SyscallTrigger};

    fn slow_function(detect: Detect) -> Trigger {
        Trigger::Function(FunctionTrigger {
            symbol: "slow".into(),
            min_duration: Some(Duration::from_secs(5)),
            detect,
            ..FunctionTrigger::default()
        })
    }

    fn slow_read(detect: Detect) -> Trigger {
        Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![0]),
            min_duration: Some(Duration::from_secs(5)),
            errnos: vec![],
            detect,
        })
    }

    fn rule(trigger: Trigger) -> EngineRule {
        EngineRule {
            id: 0,
            name: "r".into(),
            trigger,
            cooldown: Duration::from_secs(10),
            max_per_hour: 60,
            follow_forks: true,
            per_process: true,
        }
    }

    #[test]
    fn the_cooldown_is_per_process_unless_the_rule_scope_is_asked_for() {
        let trigger = Trigger::Signal(SignalTrigger { signals: vec![11] });
        let spec = rule_spec(&rule(trigger.clone())).expect("spec");
        assert_eq!(spec.flags & FLAG_SCOPE_RULE, 0);
        let spec = rule_spec(&EngineRule {
            per_process: false,
            ..rule(trigger)
        })
        .expect("spec");
        assert_ne!(spec.flags & FLAG_SCOPE_RULE, 0);
    }

    #[test]
    fn function_latency_and_entry() {
        let t = Trigger::Function(FunctionTrigger {
            symbol: "slow".into(),
            binary: None,
            min_duration: Some(Duration::from_millis(5)),
            ..FunctionTrigger::default()
        });
        let s = rule_spec(&rule(t)).expect("valid");
        assert_eq!((s.kind, s.min_duration_ns), (KIND_FUNCTION, 5_000_000));
        assert_eq!(s.flags & FLAG_ON_ENTRY, 0);
        assert_eq!(s.cooldown_ns, 10_000_000_000);
        assert_eq!(s.max_per_hour, 60);
        assert_ne!(s.flags & FLAG_FOLLOW_FORKS, 0);
        let t = Trigger::Function(FunctionTrigger {
            symbol: "f".into(),
            binary: None,
            min_duration: None,
            ..FunctionTrigger::default()
        });
        assert_ne!(rule_spec(&rule(t)).expect("valid").flags & FLAG_ON_ENTRY, 0);
    }

    #[test]
    fn syscall_sets_errnos_and_entry_mode() {
        let t = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![74, 257, 450]),
            min_duration: None,
            errnos: vec![2, 5],
            detect: Detect::Returned,
        });
        let s = rule_spec(&rule(t)).expect("valid");
        assert!(s.has_syscall(74) && s.has_syscall(257) && s.has_syscall(450));
        assert!(!s.has_syscall(0) && !s.has_syscall(75));
        assert!(s.errno_matches(-2) && s.errno_matches(-5));
        assert!(!s.errno_matches(-1) && !s.errno_matches(0) && !s.errno_matches(2));
        assert_eq!(s.flags & FLAG_ON_ENTRY, 0, "errno rules decide on exit");
        let any = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Any,
            min_duration: None,
            errnos: vec![],
            detect: Detect::Returned,
        });
        let s = rule_spec(&rule(any)).expect("valid");
        assert!(s.has_syscall(0) && s.has_syscall(400));
        assert!(s.errno_matches(0), "no errno filter");
        assert_ne!(s.flags & FLAG_ON_ENTRY, 0);
        let bad = Trigger::Syscall(SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![512]),
            min_duration: None,
            errnos: vec![],
            detect: Detect::Returned,
        });
        assert!(matches!(
            rule_spec(&rule(bad)),
            Err(PlanError::SyscallRange { .. })
        ));
    }

    #[test]
    fn signals() {
        let t = Trigger::Signal(SignalTrigger {
            signals: vec![6, 11],
        });
        let s = rule_spec(&rule(t)).expect("valid");
        assert!(s.has_signal(6) && s.has_signal(11) && !s.has_signal(9));
        let bad = Trigger::Signal(SignalTrigger { signals: vec![0] });
        assert!(rule_spec(&rule(bad)).is_err());
    }

    #[test]
    fn running_detection_sets_the_running_flag_for_functions_and_syscalls() {
        for (trigger, kind) in [
            (slow_function as fn(Detect) -> Trigger, KIND_FUNCTION),
            (slow_read, KIND_SYSCALL),
        ] {
            let running = rule_spec(&rule(trigger(Detect::Running))).expect("valid");
            assert_eq!(running.kind, kind);
            assert_ne!(running.flags & FLAG_RUNNING, 0, "kind {kind}");
            assert_eq!(running.flags & FLAG_ON_ENTRY, 0, "kind {kind}");
            assert_eq!(running.min_duration_ns, 5_000_000_000);
            let returned = rule_spec(&rule(trigger(Detect::Returned))).expect("valid");
            assert_eq!(returned.flags & FLAG_RUNNING, 0, "kind {kind}");
            assert_eq!(returned.flags, running.flags & !FLAG_RUNNING);
        }
        let signal = Trigger::Signal(SignalTrigger { signals: vec![11] });
        let spec = rule_spec(&rule(signal)).expect("valid");
        assert_eq!(spec.flags & FLAG_RUNNING, 0);
    }
}
