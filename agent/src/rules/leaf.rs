//! Leaf values of the rules file: types that check themselves while they are deserialized,
//! so that `serde_yaml` puts the position of the offending scalar on the error. In: one YAML
//! scalar (or a list of them). Out: a checked value (`HumanDuration`, `Syscall`, ...) or a
//! message saying what was expected.

use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use super::names::{
    errno_number, signal_number, syscall_number, unknown_errno, unknown_signal, unknown_syscall,
};
use super::spec::{dedup, valid_symbol};
use super::units::{format_size, parse_duration, parse_size};
use super::{Backend, Detect, OutputFormat, Peers, ReturnProbe, SnapshotScope, error::snippet};

/// A leaf read from one YAML scalar (as a string) and checked by `parse`.
pub(super) trait Scalar: Sized {
    /// What the value should look like, for serde's "expected ..." messages.
    const EXPECTING: &'static str;
    fn parse(text: &str) -> Result<Self, String>;
}

struct ScalarVisitor<T>(PhantomData<T>);

impl<T: Scalar> Visitor<'_> for ScalarVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        T::parse(text).map_err(E::custom)
    }
}

/// Deserializes a [`Scalar`] defined outside this module (as the macro below does here).
pub(super) fn deserialize_with_scalar<'de, D: Deserializer<'de>, T: Scalar>(
    deserializer: D,
) -> Result<T, D::Error> {
    deserializer.deserialize_str(ScalarVisitor::<T>(PhantomData))
}

/// Implements `Deserialize` for [`Scalar`] types: `serde_yaml` hands every scalar (`4096`,
/// `true`, `1.5s`) to `visit_str`, and marks any error with the scalar's position.
macro_rules! deserialize_scalar {
    ($($ty:ty),* $(,)?) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                deserializer.deserialize_str(ScalarVisitor::<$ty>(PhantomData))
            }
        }
    )*};
}

deserialize_scalar!(
    Version,
    RuleName,
    Text,
    Symbol,
    Comm,
    AbsolutePath,
    CgroupPath,
    HumanDuration,
    Size,
    BufferSize,
    StackSize,
    Positive,
    Syscall,
    Errno,
    Signal,
    Backend,
    OutputFormat,
    ReturnProbe,
    Detect,
    SnapshotScope,
    Peers,
);

/// `version: 1`, the only version.
#[derive(Debug)]
pub(super) struct Version;

impl Scalar for Version {
    const EXPECTING: &'static str = "version 1";

    fn parse(text: &str) -> Result<Self, String> {
        if text.trim() == "1" {
            Ok(Self)
        } else {
            Err(format!(
                "unsupported version `{}`; this lookback reads `version: 1`",
                snippet(text)
            ))
        }
    }
}

/// `[a-z0-9_-]{1,63}`.
#[derive(Debug)]
pub(super) struct RuleName(pub String);

impl Scalar for RuleName {
    const EXPECTING: &'static str = "a rule name";

    fn parse(text: &str) -> Result<Self, String> {
        let valid = (1..=63).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
        if valid {
            Ok(Self(text.to_owned()))
        } else {
            Err(format!(
                "invalid rule name `{}`: expected 1 to 63 of a-z, 0-9, `_` and `-`",
                snippet(text)
            ))
        }
    }
}

/// A non-empty string without control characters.
#[derive(Debug)]
pub(super) struct Text(pub String);

impl Scalar for Text {
    const EXPECTING: &'static str = "a string";

    fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            Err("expected a non-empty string".to_owned())
        } else if text.chars().any(char::is_control) {
            Err(format!("`{}` contains control characters", snippet(text)))
        } else {
            Ok(Self(text.to_owned()))
        }
    }
}

/// A function symbol, as [`valid_symbol`] allows.
#[derive(Debug)]
pub(super) struct Symbol(pub String);

impl Scalar for Symbol {
    const EXPECTING: &'static str = "a function symbol";

    fn parse(text: &str) -> Result<Self, String> {
        if valid_symbol(text) {
            Ok(Self(text.trim().to_owned()))
        } else {
            Err("expected a function symbol, e.g. handle_request".to_owned())
        }
    }
}

/// `/proc/PID/comm`: 1 to 15 bytes (`TASK_COMM_LEN` is 16 with the NUL).
#[derive(Debug)]
pub(super) struct Comm(pub String);

impl Scalar for Comm {
    const EXPECTING: &'static str = "a process name (comm)";

    fn parse(text: &str) -> Result<Self, String> {
        let Text(text) = Text::parse(text)?;
        if text.len() > 15 {
            return Err(format!(
                "comm `{}` is {} bytes; the kernel keeps at most 15 (match a longer name with exe)",
                snippet(&text),
                text.len()
            ));
        }
        Ok(Self(text))
    }
}

/// An absolute path.
#[derive(Debug)]
pub(super) struct AbsolutePath(pub PathBuf);

impl Scalar for AbsolutePath {
    const EXPECTING: &'static str = "an absolute path";

    fn parse(text: &str) -> Result<Self, String> {
        let Text(text) = Text::parse(text)?;
        if text.starts_with('/') {
            Ok(Self(PathBuf::from(text)))
        } else {
            Err(format!(
                "expected an absolute path, got `{}`",
                snippet(&text)
            ))
        }
    }
}

/// A cgroup v2 path prefix such as `/kubepods.slice`.
#[derive(Debug)]
pub(super) struct CgroupPath(pub String);

impl Scalar for CgroupPath {
    const EXPECTING: &'static str = "a cgroup path";

    fn parse(text: &str) -> Result<Self, String> {
        let Text(text) = Text::parse(text)?;
        if text.starts_with('/') {
            Ok(Self(text))
        } else {
            Err(format!(
                "expected a cgroup v2 path starting with `/`, e.g. /kubepods.slice, got `{}`",
                snippet(&text)
            ))
        }
    }
}

/// `500us`, `2ms`, `1.5s`, `0`.
#[derive(Debug, Clone, Copy)]
pub(super) struct HumanDuration(pub Duration);

impl Scalar for HumanDuration {
    const EXPECTING: &'static str = "a duration such as 500us, 2ms or 1.5s";

    fn parse(text: &str) -> Result<Self, String> {
        parse_duration(text)
            .map(Self)
            .map_err(|err| err.to_string())
    }
}

/// A byte count of at least 1: `4096`, `4MiB`, `2GB`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Size(pub u64);

impl Scalar for Size {
    const EXPECTING: &'static str = "a size such as 4096, 512KiB or 2GiB";

    fn parse(text: &str) -> Result<Self, String> {
        match parse_size(text) {
            Ok(0) => Err("expected a size of at least 1 byte".to_owned()),
            Ok(bytes) => Ok(Self(bytes)),
            Err(err) => Err(err.to_string()),
        }
    }
}

/// A PT buffer size: a power of two, at least 4 KiB (one page).
#[derive(Debug, Clone, Copy)]
pub(super) struct BufferSize(pub u64);

impl Scalar for BufferSize {
    const EXPECTING: &'static str = "a power-of-two size such as 4MiB";

    fn parse(text: &str) -> Result<Self, String> {
        let bytes = parse_size(text).map_err(|err| err.to_string())?;
        if bytes < 4096 {
            return Err(format!(
                "buffer_size {bytes} is below one page; expected at least 4KiB"
            ));
        }
        if !bytes.is_power_of_two() {
            let below = 1u64 << bytes.ilog2();
            return Err(format!(
                "buffer_size `{}` ({bytes} bytes) is not a power of two; try {} or {}",
                snippet(text),
                format_size(below),
                format_size(below.saturating_mul(2)),
            ));
        }
        Ok(Self(bytes))
    }
}

/// Bytes of user stack copied with each sample, for unwinding without frame pointers:
/// `0` (off: frame-pointer callchains) or a multiple of 8 up to 60 KiB (a perf record
/// holds at most 64 KiB).
#[derive(Debug, Clone, Copy)]
pub(super) struct StackSize(pub u32);

/// The largest `stack_size`: a sample record's size is a `u16`, and the registers and
/// other fields need room beside the stack.
pub(super) const MAX_STACK_SIZE: u64 = 60 << 10;

impl Scalar for StackSize {
    const EXPECTING: &'static str = "a size such as 8KiB (0: frame pointers only)";

    fn parse(text: &str) -> Result<Self, String> {
        let bytes = parse_size(text).map_err(|err| err.to_string())?;
        if bytes > MAX_STACK_SIZE {
            return Err(format!(
                "stack_size {bytes} is above the {} a perf record can hold",
                format_size(MAX_STACK_SIZE)
            ));
        }
        if bytes % 8 != 0 {
            return Err(format!(
                "stack_size {bytes} is not a multiple of 8 bytes; try {}",
                bytes.next_multiple_of(8)
            ));
        }
        u32::try_from(bytes)
            .map(Self)
            .map_err(|_| "stack_size out of range".to_owned())
    }
}

/// An integer from 1 to `u32::MAX`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Positive(pub u32);

impl Scalar for Positive {
    const EXPECTING: &'static str = "a positive integer";

    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        match text.parse::<u32>() {
            Ok(0) => Err("expected a positive integer, got 0".to_owned()),
            Ok(value) if text.bytes().all(|b| b.is_ascii_digit()) => Ok(Self(value)),
            _ => Err(format!(
                "expected a positive integer up to {}, got `{}`",
                u32::MAX,
                snippet(text)
            )),
        }
    }
}

/// A syscall name, as its x86-64 number.
#[derive(Debug, Clone, Copy)]
pub(super) struct Syscall(pub u32);

impl Scalar for Syscall {
    const EXPECTING: &'static str = "a syscall name";

    fn parse(text: &str) -> Result<Self, String> {
        syscall_number(text.trim())
            .map(Self)
            .ok_or_else(|| unknown_syscall(text))
    }
}

/// An errno name, as its number.
#[derive(Debug, Clone, Copy)]
pub(super) struct Errno(pub u32);

impl Scalar for Errno {
    const EXPECTING: &'static str = "an errno name such as EIO";

    fn parse(text: &str) -> Result<Self, String> {
        errno_number(text)
            .map(Self)
            .ok_or_else(|| unknown_errno(text))
    }
}

/// A signal name, as its number.
#[derive(Debug, Clone, Copy)]
pub(super) struct Signal(pub u32);

impl Scalar for Signal {
    const EXPECTING: &'static str = "a signal name such as SIGSEGV";

    fn parse(text: &str) -> Result<Self, String> {
        signal_number(text)
            .map(Self)
            .ok_or_else(|| unknown_signal(text))
    }
}

impl Scalar for Backend {
    const EXPECTING: &'static str = "a backend: auto, intel-pt or sampling";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: super::ParseBackendError| err.to_string())
    }
}

impl Scalar for ReturnProbe {
    const EXPECTING: &'static str = "a return probe: exits or uretprobe";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: super::ParseReturnProbeError| err.to_string())
    }
}

impl Scalar for Detect {
    const EXPECTING: &'static str = "detect: returned or running";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: super::ParseDetectError| err.to_string())
    }
}

impl Scalar for SnapshotScope {
    const EXPECTING: &'static str = "a scope: process or rule";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: super::ParseScopeError| err.to_string())
    }
}

impl Scalar for Peers {
    const EXPECTING: &'static str = "peers: false, true or all";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: super::ParsePeersError| err.to_string())
    }
}

impl Scalar for OutputFormat {
    const EXPECTING: &'static str = "an output format: fxt or chrome-json";

    fn parse(text: &str) -> Result<Self, String> {
        text.parse()
            .map_err(|err: super::ParseOutputFormatError| err.to_string())
    }
}

/// A non-empty list of scalars, or one scalar standing for a list of one. Repeats are
/// dropped, the first occurrence kept.
#[derive(Debug)]
pub(super) struct List<T>(pub Vec<T>);

impl<T: Copy + Into<u32>> List<T> {
    pub fn numbers(&self) -> Vec<u32> {
        dedup(self.0.iter().map(|&item| item.into()).collect())
    }
}

struct ListVisitor<T>(PhantomData<T>);

impl<'de, T: Scalar + Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
    type Value = List<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "one or a list of: {}", T::EXPECTING)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
        T::parse(text)
            .map(|item| List(vec![item]))
            .map_err(E::custom)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        if items.is_empty() {
            return Err(de::Error::custom(format_args!(
                "empty list; expected {}",
                T::EXPECTING
            )));
        }
        Ok(List(items))
    }
}

impl<'de, T: Scalar + Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ListVisitor(PhantomData))
    }
}

macro_rules! number_newtype {
    ($($ty:ident),*) => {$(
        impl From<$ty> for u32 {
            fn from(value: $ty) -> u32 {
                value.0
            }
        }
    )*};
}

number_newtype!(Syscall, Errno, Signal);

/// `names:` of a syscall trigger: `any`, one name, or a list of names.
#[derive(Debug)]
pub(super) enum SyscallNames {
    Any,
    Names(List<Syscall>),
}

impl<'de> Deserialize<'de> for SyscallNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NamesVisitor;

        impl<'de> Visitor<'de> for NamesVisitor {
            type Value = SyscallNames;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("`any` or a list of syscall names")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<SyscallNames, E> {
                if text.trim().eq_ignore_ascii_case("any") {
                    return Ok(SyscallNames::Any);
                }
                ListVisitor(PhantomData)
                    .visit_str(text)
                    .map(SyscallNames::Names)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<SyscallNames, A::Error> {
                let list = ListVisitor::<AnyOrSyscall>(PhantomData).visit_seq(seq)?;
                match list.0.as_slice() {
                    [AnyOrSyscall(None)] => Ok(SyscallNames::Any),
                    items if items.iter().any(|item| item.0.is_none()) => Err(de::Error::custom(
                        "`any` cannot be combined with syscall names",
                    )),
                    items => Ok(SyscallNames::Names(List(
                        items
                            .iter()
                            .filter_map(|item| item.0.map(Syscall))
                            .collect(),
                    ))),
                }
            }
        }

        deserializer.deserialize_any(NamesVisitor)
    }
}

/// A list element of `names:`: `any` (`None`) or a syscall.
#[derive(Debug)]
struct AnyOrSyscall(Option<u32>);

impl Scalar for AnyOrSyscall {
    const EXPECTING: &'static str = "a syscall name";

    fn parse(text: &str) -> Result<Self, String> {
        if text.trim().eq_ignore_ascii_case("any") {
            Ok(Self(None))
        } else {
            Syscall::parse(text).map(|Syscall(number)| Self(Some(number)))
        }
    }
}

deserialize_scalar!(AnyOrSyscall);

/// `debuginfod:` — `false` (never ask), `true` (the servers of `DEBUGINFOD_URLS`), or one
/// server URL or a list of them (`http://` or `https://`).
#[derive(Debug)]
pub(super) struct DebuginfodServers(pub crate::elf::debuginfod::Servers);

/// One server URL of `debuginfod:`.
#[derive(Debug)]
struct ServerUrl(String);

impl Scalar for ServerUrl {
    const EXPECTING: &'static str = "a debuginfod server URL (http:// or https://)";

    fn parse(text: &str) -> Result<Self, String> {
        let url = text.trim().trim_end_matches('/');
        let rest = url
            .strip_prefix("http://")
            .or_else(|| url.strip_prefix("https://"));
        match rest {
            Some(host) if !host.is_empty() && !url.contains(char::is_whitespace) => {
                Ok(Self(url.to_owned()))
            }
            _ => Err(format!(
                "{text:?} is not a debuginfod server URL; expected http://HOST[:PORT] or https://..."
            )),
        }
    }
}

deserialize_scalar!(ServerUrl);

impl<'de> Deserialize<'de> for DebuginfodServers {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use crate::elf::debuginfod::Servers;

        struct ServersVisitor;

        impl<'de> Visitor<'de> for ServersVisitor {
            type Value = DebuginfodServers;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "debuginfod: false, true (DEBUGINFOD_URLS), or a server URL or a list of them",
                )
            }

            fn visit_bool<E: de::Error>(self, on: bool) -> Result<Self::Value, E> {
                Ok(DebuginfodServers(if on {
                    Servers::FromEnv
                } else {
                    Servers::Off
                }))
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
                let url = ServerUrl::parse(text).map_err(E::custom)?;
                Ok(DebuginfodServers(Servers::Urls(vec![url.0])))
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut urls = Vec::new();
                while let Some(ServerUrl(url)) = seq.next_element()? {
                    if !urls.contains(&url) {
                        urls.push(url);
                    }
                }
                if urls.is_empty() {
                    return Err(de::Error::custom(
                        "empty list; expected a debuginfod server URL (or false)",
                    ));
                }
                Ok(DebuginfodServers(Servers::Urls(urls)))
            }
        }

        deserializer.deserialize_any(ServersVisitor)
    }
}
