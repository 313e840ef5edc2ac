//! The online CPUs (`/sys/devices/system/cpu/online`): the recorders open one event and
//! map one ring per online CPU, and `lookback check` sizes the lock budget by their count.
//!
//! In: the kernel's CPU list (`0-3,6`). Out: the CPU numbers, or their count.
use std::{io, path::Path};

/// Where the kernel lists the online CPUs.
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// The online CPUs ([`ONLINE_CPUS`]); an `InvalidData` error when it is not a CPU list.
pub fn online_cpus() -> io::Result<Vec<u32>> {
    let text = std::fs::read_to_string(Path::new(ONLINE_CPUS))?;
    parse_cpu_list(&text)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not a CPU list"))
}

/// The number of online CPUs (`/sys/devices/system/cpu/online`); `None` when unreadable.
pub fn online_cpu_count() -> Option<usize> {
    online_cpus().ok().map(|cpus| cpus.len())
}

/// Parses a kernel CPU list (`0-3,6`); `None` when malformed or empty.
fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
        if lo > hi || hi - lo > 65_536 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    (!cpus.is_empty()).then_some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(parse_cpu_list("0-3,6\n"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        for bad in ["", "a", "3-1", "0-", ",", "0-999999"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
        assert!(!online_cpus().unwrap().is_empty());
    }
}
