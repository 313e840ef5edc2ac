//! TSC to perf time and back: the conversion the perf mmap page publishes.
//!
//! In: `time_zero`, `time_mult` and `time_shift` of a `perf_event_mmap_page` (valid when
//! `cap_user_time_zero` is set). Out: [`TscConversion`], which turns TSC ticks into the
//! perf clock's nanoseconds and back. It lives with capture, which reads the page, so
//! capture needs nothing from decode; the PT decoder's sideband reader and the snapshot
//! decoder import it from here.

/// perf's conversion between TSC and perf time (`perf_event_mmap_page`: `time_zero`,
/// `time_mult`, `time_shift`; `cap_user_time_zero` must be set for it to apply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TscConversion {
    pub time_zero: u64,
    pub time_mult: u32,
    pub time_shift: u16,
}

impl TscConversion {
    /// TSC ticks to perf time (ns of the perf clock).
    pub fn tsc_to_ns(&self, tsc: u64) -> u64 {
        let shift = u32::from(self.time_shift);
        let mult = u64::from(self.time_mult);
        let quot = tsc.checked_shr(shift).unwrap_or(0);
        let rem = tsc & 1u64.checked_shl(shift).map_or(u64::MAX, |bit| bit - 1);
        let rem_ns = rem.wrapping_mul(mult).checked_shr(shift).unwrap_or(0);
        self.time_zero
            .wrapping_add(quot.wrapping_mul(mult))
            .wrapping_add(rem_ns)
    }

    /// Perf time to TSC ticks; `None` when `time_mult` is 0.
    pub fn ns_to_tsc(&self, ns: u64) -> Option<u64> {
        if self.time_mult == 0 {
            return None;
        }
        let time = ns.wrapping_sub(self.time_zero);
        let mult = u64::from(self.time_mult);
        let shift = u32::from(self.time_shift);
        let quot = (time / mult).checked_shl(shift).unwrap_or(0);
        let rem = (time % mult).checked_shl(shift).unwrap_or(0) / mult;
        Some(quot.wrapping_add(rem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsc_and_perf_time_convert_both_ways() {
        // A 3 GHz TSC: mult/2^shift = 1/3 ns per tick.
        let conv = TscConversion {
            time_zero: 1_000_000,
            time_mult: 0x5555_5555,
            time_shift: 32,
        };
        let ns = conv.tsc_to_ns(3_000_000_000);
        assert!((1_000_999_999..=1_001_000_000).contains(&ns), "{ns}");
        let tsc = conv.ns_to_tsc(ns).unwrap();
        assert!(tsc.abs_diff(3_000_000_000) <= 3, "{tsc}");
        assert_eq!(
            TscConversion {
                time_mult: 0,
                ..conv
            }
            .ns_to_tsc(5),
            None
        );
    }
}
