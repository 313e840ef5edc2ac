//! TEMPORARY stub of the rules model (replaced by the real one from the `rules` branch).
use std::{path::PathBuf, time::Duration};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    Function(FunctionTrigger),
    Syscall(SyscallTrigger),
    Signal(SignalTrigger),
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionTrigger {
    pub symbol: String,
    pub binary: Option<PathBuf>,
    pub min_duration: Option<Duration>,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyscallSet {
    Any,
    Numbers(Vec<u32>),
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyscallTrigger {
    pub syscalls: SyscallSet,
    pub min_duration: Option<Duration>,
    pub errnos: Vec<u32>,
}
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalTrigger {
    pub signals: Vec<u32>,
}
impl Trigger {
    pub fn describe(&self) -> String {
        format!("{self:?}")
    }
}
#[derive(Debug)]
pub struct SpecError(pub String);
impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for SpecError {}
pub fn parse_trigger_spec(spec: &str) -> Result<Trigger, SpecError> {
    let (kind, rest) = spec
        .split_once(':')
        .ok_or_else(|| SpecError("no kind".into()))?;
    let (body, dur) = match rest.split_once('>') {
        Some((b, d)) => (b, Some(parse_duration(d)?)),
        None => (rest, None),
    };
    match kind {
        "func" => Ok(Trigger::Function(FunctionTrigger {
            symbol: body.to_owned(),
            binary: None,
            min_duration: dur,
        })),
        "syscall" => {
            let (names, errnos) = match body.split_once('=') {
                Some((n, e)) => (
                    n,
                    e.split(',')
                        .map(|e| match e {
                            "ENOENT" => 2,
                            "EIO" => 5,
                            _ => 0,
                        })
                        .collect(),
                ),
                None => (body, Vec::new()),
            };
            let set = if names == "any" {
                SyscallSet::Any
            } else {
                SyscallSet::Numbers(
                    names
                        .split(',')
                        .map(|n| syscall_number(n).unwrap_or(9999))
                        .collect(),
                )
            };
            Ok(Trigger::Syscall(SyscallTrigger {
                syscalls: set,
                min_duration: dur,
                errnos,
            }))
        }
        "signal" => Ok(Trigger::Signal(SignalTrigger {
            signals: body
                .split(',')
                .map(|s| signal_number(s).unwrap_or(0))
                .collect(),
        })),
        _ => Err(SpecError("kind".into())),
    }
}
pub fn syscall_number(name: &str) -> Option<u32> {
    Some(match name {
        "fsync" => 74,
        "fdatasync" => 75,
        "nanosleep" => 35,
        "openat" => 257,
        "getpid" => 39,
        "clock_nanosleep" => 230,
        _ => return None,
    })
}
pub fn syscall_name(nr: u32) -> Option<&'static str> {
    Some(match nr {
        74 => "fsync",
        35 => "nanosleep",
        257 => "openat",
        39 => "getpid",
        230 => "clock_nanosleep",
        _ => return None,
    })
}
pub fn signal_number(name: &str) -> Option<u32> {
    Some(match name {
        "SIGSEGV" => 11,
        "SIGABRT" => 6,
        "SIGKILL" => 9,
        "SIGUSR1" => 10,
        _ => return None,
    })
}
pub fn signal_name(nr: u32) -> Option<&'static str> {
    Some(match nr {
        11 => "SIGSEGV",
        6 => "SIGABRT",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        _ => return None,
    })
}
pub fn errno_name(nr: u32) -> Option<&'static str> {
    Some(match nr {
        2 => "ENOENT",
        5 => "EIO",
        _ => return None,
    })
}
pub fn parse_duration(s: &str) -> Result<Duration, SpecError> {
    let split = s.find(|c: char| c.is_alphabetic()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: f64 = n.parse().map_err(|_| SpecError("dur".into()))?;
    let ns = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" | "" => 1e6,
        "s" => 1e9,
        "h" => 3.6e12,
        _ => return Err(SpecError("unit".into())),
    };
    Ok(Duration::from_nanos((n * ns) as u64))
}
