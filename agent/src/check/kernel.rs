//! The running kernel: `uname` release and machine, and the version parsed from the
//! release string (`6.18.44-fc-v669` → 6.18.44).

use std::fmt;

use serde::Serialize;

use super::{Probe, error_chain};
use crate::sys;

/// The oldest kernel every part of lookback works on: BPF ring buffers arrived in 5.8.
pub const MIN_VERSION: KernelVersion = KernelVersion {
    major: 5,
    minor: 8,
    patch: 0,
};

/// The kernel that added `aux_pause`/`aux_resume`/`aux_start_paused` to `perf_event_attr`.
pub const AUX_PAUSE_VERSION: KernelVersion = KernelVersion {
    major: 6,
    minor: 13,
    patch: 0,
};

/// `major.minor.patch` of a kernel release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl KernelVersion {
    /// Parses the leading `MAJOR.MINOR[.PATCH]` of a release string; anything after the
    /// numbers (`-rc1`, `-generic`, `+`) is ignored. `None` without at least two numbers.
    pub fn parse_release(release: &str) -> Option<Self> {
        let mut numbers = release.trim().split('.').map(|part| {
            let digits = part.bytes().take_while(u8::is_ascii_digit).count();
            part.get(..digits).and_then(|d| d.parse::<u32>().ok())
        });
        let major = numbers.next().flatten()?;
        let minor_part = release.trim().split('.').nth(1)?;
        let minor = numbers.next().flatten()?;
        // A patch level only follows a minor that is made of digits alone (`6.18.44`, not
        // `6.18-rc1.x`).
        let patch = if minor_part.bytes().all(|b| b.is_ascii_digit()) {
            numbers.next().flatten().unwrap_or(0)
        } else {
            0
        };
        Some(Self {
            major,
            minor,
            patch,
        })
    }
}

/// `uname` and the parsed version. `status.ok` when the version is at least
/// [`MIN_VERSION`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct KernelInfo {
    #[serde(flatten)]
    pub status: Probe,
    /// `uname -r`.
    pub release: Option<String>,
    /// `uname -m`.
    pub machine: Option<String>,
    pub version: Option<KernelVersion>,
}

impl KernelInfo {
    /// Builds the report for a release string (the testable half of [`probe`]).
    pub fn from_release(release: &str, machine: &str) -> Self {
        let version = KernelVersion::parse_release(release);
        let status = match version {
            Some(v) if v >= MIN_VERSION => Probe::pass(format!("Linux {v} ({release}, {machine})")),
            Some(v) => Probe::fail(format!(
                "Linux {v} is older than {MIN_VERSION} (BPF ring buffers); upgrade the kernel"
            )),
            None => Probe::fail(format!("cannot parse the kernel release {release:?}")),
        };
        Self {
            status,
            release: Some(release.to_owned()),
            machine: Some(machine.to_owned()),
            version,
        }
    }
}

/// Calls `uname`.
pub(super) fn probe() -> KernelInfo {
    match sys::uname() {
        Ok(u) => KernelInfo::from_release(&u.release, &u.machine),
        Err(err) => KernelInfo {
            status: Probe::fail(error_chain(&err)),
            ..KernelInfo::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32, patch: u32) -> KernelVersion {
        KernelVersion {
            major,
            minor,
            patch,
        }
    }

    #[test]
    fn parses_release_strings() {
        assert_eq!(
            KernelVersion::parse_release("6.18.44-fc-v669"),
            Some(v(6, 18, 44))
        );
        assert_eq!(
            KernelVersion::parse_release("6.1.0-27-amd64"),
            Some(v(6, 1, 0))
        );
        assert_eq!(KernelVersion::parse_release("6.13"), Some(v(6, 13, 0)));
        assert_eq!(KernelVersion::parse_release("6.13-rc1"), Some(v(6, 13, 0)));
        assert_eq!(KernelVersion::parse_release("5.15.0+"), Some(v(5, 15, 0)));
        assert_eq!(
            KernelVersion::parse_release("4.19.0-rc1.2"),
            Some(v(4, 19, 0))
        );
        assert_eq!(
            KernelVersion::parse_release(" 6.8.0-45-generic\n"),
            Some(v(6, 8, 0))
        );
    }

    #[test]
    fn garbage_releases_do_not_parse() {
        for bad in ["", "linux", "6", "6.", ".6", "x.y.z", "99999999999.1"] {
            assert_eq!(KernelVersion::parse_release(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn versions_order_numerically() {
        assert!(v(6, 18, 44) > v(6, 13, 0));
        assert!(v(6, 9, 0) < v(6, 13, 0));
        assert!(KernelVersion::parse_release("5.4.0").expect("v") < MIN_VERSION);
    }

    #[test]
    fn old_or_unparsable_kernels_fail() {
        assert!(
            KernelInfo::from_release("6.18.44-fc-v669", "x86_64")
                .status
                .ok
        );
        let old = KernelInfo::from_release("5.4.0", "x86_64");
        assert!(!old.status.ok);
        assert!(
            old.status
                .reason
                .expect("reason")
                .contains("older than 5.8.0")
        );
        assert!(!KernelInfo::from_release("weird", "x86_64").status.ok);
    }

    #[test]
    fn live_uname_parses() {
        let info = probe();
        assert!(info.version.is_some(), "{info:?}");
    }
}
