//! `--trigger SPEC` of `run`/`attach` (contract.md, "Common options"): a spec string in, a
//! [`Trigger`] out; and back, [`Trigger::describe`], the same short form for summaries.
//!
//! ```text
//! func:SYMBOL[>DURATION]
//! syscall:NAME[,NAME...][>DURATION][=ERRNO[,ERRNO...]]     (NAME may be `any`)
//! signal:SIG[,SIG...]
//! ```

use std::fmt;

use super::error::{SpecError, snippet};
use super::names::{
    errno_name, errno_number, signal_name, signal_number, syscall_name, syscall_number,
    unknown_errno, unknown_signal, unknown_syscall,
};
use super::units::{format_duration, parse_duration};
use super::{Detect, FunctionTrigger, SignalTrigger, SyscallSet, SyscallTrigger, Trigger};

/// Parses a `--trigger` spec. `func:` specs leave `binary` as `None` (the traced program).
pub fn parse_trigger_spec(spec: &str) -> Result<Trigger, SpecError> {
    let quoted = || snippet(spec);
    let (kind, body) = spec
        .trim()
        .split_once(':')
        .ok_or_else(|| SpecError::Kind { spec: quoted() })?;
    match kind.trim() {
        "func" => parse_function(spec, body).map(Trigger::Function),
        "syscall" => parse_syscall(spec, body).map(Trigger::Syscall),
        "signal" => parse_signal(spec, body).map(Trigger::Signal),
        _ => Err(SpecError::Kind { spec: quoted() }),
    }
}

/// Whether `symbol` can name a function: not empty, no control characters. Demangled C++
/// names may contain spaces, `<`, `>` and `::`.
pub(crate) fn valid_symbol(symbol: &str) -> bool {
    !symbol.trim().is_empty() && !symbol.chars().any(char::is_control)
}

fn parse_function(spec: &str, body: &str) -> Result<FunctionTrigger, SpecError> {
    // `>` may also close a C++ template argument list: it starts a threshold only when a
    // number follows, or when the symbol has no `<` that it could close.
    let (symbol, min_duration) = match body.rsplit_once('>') {
        Some((symbol, tail)) if tail.trim_start().starts_with(|c: char| c.is_ascii_digit()) => {
            (symbol, Some(duration(spec, tail)?))
        }
        Some((symbol, _)) if !symbol.contains('<') => {
            return Err(SpecError::Duration {
                spec: snippet(spec),
                message: "expected a DURATION after `>`, e.g. 500us, 2ms, 1.5s".to_owned(),
            });
        }
        _ => (body, None),
    };
    let symbol = symbol.trim();
    if !valid_symbol(symbol) {
        return Err(SpecError::Symbol {
            spec: snippet(spec),
        });
    }
    Ok(FunctionTrigger {
        symbol: symbol.to_owned(),
        binary: None,
        min_duration,
        ..FunctionTrigger::default()
    })
}

fn parse_syscall(spec: &str, body: &str) -> Result<SyscallTrigger, SpecError> {
    let (rest, errnos) = match body.split_once('=') {
        Some((rest, list)) => {
            let errnos = list_items(spec, list, "an errno name after `=`", "=EIO,ENOSPC")?
                .into_iter()
                .map(|name| {
                    errno_number(name).ok_or_else(|| SpecError::Name {
                        spec: snippet(spec),
                        message: unknown_errno(name),
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            (rest, dedup(errnos))
        }
        None => (body, Vec::new()),
    };
    let (names, min_duration) = match rest.split_once('>') {
        Some((names, tail)) => (names, Some(duration(spec, tail)?)),
        None => (rest, None),
    };
    let names = list_items(spec, names, "a syscall name", "syscall:fsync,fdatasync")?;
    let syscalls = if names.iter().any(|name| name.eq_ignore_ascii_case("any")) {
        if names.len() > 1 {
            return Err(SpecError::Name {
                spec: snippet(spec),
                message: "`any` cannot be combined with syscall names".to_owned(),
            });
        }
        SyscallSet::Any
    } else {
        let numbers = names
            .into_iter()
            .map(|name| {
                syscall_number(name).ok_or_else(|| SpecError::Name {
                    spec: snippet(spec),
                    message: unknown_syscall(name),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        SyscallSet::Numbers(dedup(numbers))
    };
    Ok(SyscallTrigger {
        syscalls,
        min_duration,
        errnos,
        detect: Detect::Returned,
    })
}

fn parse_signal(spec: &str, body: &str) -> Result<SignalTrigger, SpecError> {
    if body.contains(['>', '=']) {
        return Err(SpecError::Unsupported {
            spec: snippet(spec),
            message: "a signal trigger takes no DURATION or ERRNO; expected signal:SIG[,SIG...]"
                .to_owned(),
        });
    }
    let signals = list_items(spec, body, "a signal name", "signal:SIGSEGV,SIGABRT")?
        .into_iter()
        .map(|name| {
            signal_number(name).ok_or_else(|| SpecError::Name {
                spec: snippet(spec),
                message: unknown_signal(name),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(SignalTrigger {
        signals: dedup(signals),
    })
}

fn duration(spec: &str, text: &str) -> Result<std::time::Duration, SpecError> {
    parse_duration(text).map_err(|err| SpecError::Duration {
        spec: snippet(spec),
        message: err.to_string(),
    })
}

/// The trimmed, non-empty items of a comma-separated list.
fn list_items<'a>(
    spec: &str,
    list: &'a str,
    what: &'static str,
    example: &'static str,
) -> Result<Vec<&'a str>, SpecError> {
    list.split(',')
        .map(str::trim)
        .map(|item| {
            if item.is_empty() {
                Err(SpecError::Empty {
                    spec: snippet(spec),
                    what,
                    example,
                })
            } else {
                Ok(item)
            }
        })
        .collect()
}

/// `values` without repeats, first occurrence kept.
pub(crate) fn dedup(values: Vec<u32>) -> Vec<u32> {
    let mut out = Vec::with_capacity(values.len());
    for value in values {
        if !out.contains(&value) {
            out.push(value);
        }
    }
    out
}

fn join_names(numbers: &[u32], name: fn(u32) -> Option<&'static str>) -> String {
    let names: Vec<String> = numbers
        .iter()
        .map(|&number| name(number).map_or_else(|| number.to_string(), str::to_owned))
        .collect();
    names.join(",")
}

impl Trigger {
    /// The short human form, in `--trigger` syntax: `func:slow>5ms`,
    /// `syscall:fsync,fdatasync>50ms`, `syscall:openat=ENOENT`, `signal:SIGSEGV`. A
    /// function trigger's `binary` is not part of it.
    pub fn describe(&self) -> String {
        match self {
            Self::Function(function) => {
                let mut text = format!("func:{}", function.symbol);
                if let Some(min) = function.min_duration {
                    text.push('>');
                    text.push_str(&format_duration(min));
                }
                text
            }
            Self::Syscall(syscall) => {
                let mut text = match &syscall.syscalls {
                    SyscallSet::Any => "syscall:any".to_owned(),
                    SyscallSet::Numbers(numbers) => {
                        format!("syscall:{}", join_names(numbers, syscall_name))
                    }
                };
                if let Some(min) = syscall.min_duration {
                    text.push('>');
                    text.push_str(&format_duration(min));
                }
                if !syscall.errnos.is_empty() {
                    text.push('=');
                    text.push_str(&join_names(&syscall.errnos, errno_name));
                }
                text
            }
            Self::Signal(signal) => format!("signal:{}", join_names(&signal.signals, signal_name)),
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn parse(spec: &str) -> Trigger {
        parse_trigger_spec(spec).unwrap_or_else(|err| panic!("{spec:?} failed: {err}"))
    }

    fn parse_err(spec: &str) -> SpecError {
        match parse_trigger_spec(spec) {
            Ok(trigger) => panic!("{spec:?} parsed as {trigger:?}"),
            Err(err) => err,
        }
    }

    #[test]
    fn function_specs() {
        let Trigger::Function(f) = parse("func:handle_request>2ms") else {
            panic!("not a function trigger");
        };
        assert_eq!(f.symbol, "handle_request");
        assert_eq!(f.min_duration, Some(Duration::from_millis(2)));
        assert_eq!(f.binary, None);
        let Trigger::Function(f) = parse("func:slow") else {
            panic!("not a function trigger");
        };
        assert_eq!((f.symbol.as_str(), f.min_duration), ("slow", None));
        let Trigger::Function(f) = parse("func:std::vector<int>::push_back>1.5s") else {
            panic!("not a function trigger");
        };
        assert_eq!(f.symbol, "std::vector<int>::push_back");
        assert_eq!(f.min_duration, Some(Duration::from_millis(1500)));
        let Trigger::Function(f) = parse("func:std::less<int>") else {
            panic!("not a function trigger");
        };
        assert_eq!(
            (f.symbol.as_str(), f.min_duration),
            ("std::less<int>", None)
        );
    }

    #[test]
    fn syscall_specs() {
        let want = SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![74, 75]),
            min_duration: Some(Duration::from_millis(50)),
            errnos: vec![],
            detect: Detect::Returned,
        };
        assert_eq!(
            parse("syscall:fsync,fdatasync>50ms"),
            Trigger::Syscall(want)
        );
        let want = SyscallTrigger {
            syscalls: SyscallSet::Numbers(vec![257]),
            min_duration: None,
            errnos: vec![2, 13],
            detect: Detect::Returned,
        };
        assert_eq!(
            parse("syscall:openat=ENOENT,EACCES"),
            Trigger::Syscall(want)
        );
        let Trigger::Syscall(any) = parse("syscall:any>1s") else {
            panic!("not a syscall trigger");
        };
        assert_eq!(any.syscalls, SyscallSet::Any);
        let Trigger::Syscall(both) = parse("syscall:read, read ,write>5ms=EIO") else {
            panic!("not a syscall trigger");
        };
        assert_eq!(both.syscalls, SyscallSet::Numbers(vec![0, 1]));
        assert_eq!(both.errnos, vec![5]);
    }

    #[test]
    fn signal_specs() {
        assert_eq!(
            parse("signal:SIGSEGV,abrt,SIGBUS"),
            Trigger::Signal(SignalTrigger {
                signals: vec![11, 6, 7]
            })
        );
    }

    #[test]
    fn bad_specs_say_what_was_expected() {
        let cases: &[(&str, &str)] = &[
            ("", "expected func:SYMBOL[>DURATION]"),
            ("fsync", "expected func:SYMBOL[>DURATION]"),
            ("probe:foo", "expected func:SYMBOL[>DURATION]"),
            ("func:", "expected a function symbol after `func:`"),
            ("func:>5ms", "expected a function symbol"),
            ("func:foo>", "expected a DURATION after `>`"),
            ("func:foo>fast", "expected a DURATION after `>`"),
            ("func:foo>5", "invalid duration `5`"),
            ("func:foo>5 parsecs", "e.g. 500us, 2ms, 1.5s"),
            ("syscall:", "expected a syscall name"),
            ("syscall:read,,write", "expected a syscall name"),
            (
                "syscall:fsyn>5ms",
                "unknown syscall `fsyn` (did you mean `fsync`?)",
            ),
            ("syscall:any,read", "`any` cannot be combined"),
            ("syscall:openat=", "expected an errno name after `=`"),
            ("syscall:openat=ENOPE", "unknown errno `ENOPE`"),
            ("syscall:read>2xs", "invalid duration `2xs`"),
            ("signal:", "expected a signal name"),
            (
                "signal:SIGSEGVV",
                "unknown signal `SIGSEGVV` (did you mean `SIGSEGV`?)",
            ),
            ("signal:SIGSEGV>5ms", "takes no DURATION or ERRNO"),
        ];
        for (spec, want) in cases {
            let message = parse_err(spec).to_string();
            assert!(
                message.contains(want),
                "{spec:?}: {message:?} lacks {want:?}"
            );
            assert!(message.starts_with("invalid trigger `"), "{message}");
        }
    }

    #[test]
    fn with_detect_sets_latency_kinds_and_names_conflicts() {
        use crate::rules::{DetectConflict, ReturnProbe};
        let running = |spec: &str| parse(spec).with_detect(Detect::Running);
        assert_eq!(running("func:f>5s").detect_conflict(), None);
        assert_eq!(running("syscall:read,futex>1s").detect_conflict(), None);
        let Trigger::Syscall(s) = running("syscall:read>1s") else {
            panic!("not a syscall trigger");
        };
        assert_eq!(s.detect, Detect::Running);
        for spec in ["func:f", "syscall:read", "syscall:openat=ENOENT"] {
            assert_eq!(
                running(spec).detect_conflict(),
                Some(DetectConflict::NoDuration),
                "{spec}"
            );
        }
        assert_eq!(
            running("syscall:read>1s=EIO").detect_conflict(),
            Some(DetectConflict::Errno)
        );
        let Trigger::Function(f) = running("func:f>1s") else {
            panic!("not a function trigger");
        };
        let uretprobe = Trigger::Function(FunctionTrigger {
            return_probe: ReturnProbe::Uretprobe,
            ..f
        });
        assert_eq!(uretprobe.detect_conflict(), Some(DetectConflict::Uretprobe));
        // A signal has no call in flight: left as it is; `returned` conflicts with nothing.
        assert_eq!(running("signal:SIGSEGV"), parse("signal:SIGSEGV"));
        for spec in ["func:f", "syscall:read=EIO"] {
            let returned = parse(spec).with_detect(Detect::Returned);
            assert_eq!(returned.detect_conflict(), None, "{spec}");
        }
    }

    #[test]
    fn describe_is_the_spec_form_and_round_trips() {
        for spec in [
            "func:slow>5ms",
            "func:handle_request",
            "syscall:fsync,fdatasync>50ms",
            "syscall:openat=ENOENT",
            "syscall:any>1.5s",
            "syscall:read>5ms=EIO,EAGAIN",
            "signal:SIGSEGV",
            "signal:SIGSEGV,SIGABRT,SIGRTMIN+3",
        ] {
            let trigger = parse(spec);
            assert_eq!(trigger.describe(), spec);
            assert_eq!(trigger.to_string(), spec);
            assert_eq!(parse(&trigger.describe()), trigger);
        }
        assert_eq!(parse("signal:segv").describe(), "signal:SIGSEGV");
    }
}
