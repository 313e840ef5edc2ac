//! An earlier TSC ↔ `CLOCK_MONOTONIC` pair for each freeze, so that PT times follow the
//! clock's rate, not only its value at the freeze.
//!
//! In: [`ClockPair`]s read now and then while recording (each `poll`). Out: at a freeze,
//! the newest pair at least [`MIN_SPAN_NS`] older than the freeze's own. Why: PT times are
//! TSCs, turned into the perf clock by the mmap page's fixed `time_mult` and anchored to
//! `CLOCK_MONOTONIC` (the trigger clock) by the pair read at the freeze. `CLOCK_MONOTONIC`
//! is steered by NTP: ±500 ppm through the frequency, and chrony slews through the tick
//! length at up to 83,333 ppm after a step. At a slew of that size, a branch 10 ms
//! before the freeze is placed 0.8 ms off. Two pairs give the rate between the clocks
//! over the last poll interval, and [`super::ClockConversion::tsc_to_monotonic_ns`]
//! scales by it.

use super::ClockPair;

/// The least time between the two pairs: each is read within a few µs
/// (`ClockPair::now`'s tightest bracket), so 100 ms keep the rate's error near 20 ppm.
pub const MIN_SPAN_NS: u64 = 100_000_000;

/// The last two pairs kept, at least [`MIN_SPAN_NS`] apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClockHistory {
    newest: Option<ClockPair>,
    older: Option<ClockPair>,
}

impl ClockHistory {
    /// Remembers `pair` when it is at least [`MIN_SPAN_NS`] after the newest kept one.
    pub fn observe(&mut self, pair: ClockPair) {
        if pair.tsc.is_none() {
            return;
        }
        match self.newest {
            Some(newest) if pair.monotonic_ns < newest.monotonic_ns + MIN_SPAN_NS => {}
            _ => {
                self.older = self.newest;
                self.newest = Some(pair);
            }
        }
    }

    /// The newest kept pair at least [`MIN_SPAN_NS`] before `freeze`.
    pub fn before(&self, freeze: ClockPair) -> Option<ClockPair> {
        [self.newest, self.older]
            .into_iter()
            .flatten()
            .find(|p| p.monotonic_ns + MIN_SPAN_NS <= freeze.monotonic_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ms: u64) -> ClockPair {
        ClockPair {
            tsc: Some(ms * 3_000_000),
            monotonic_ns: ms * 1_000_000,
        }
    }

    #[test]
    fn the_earlier_pair_is_the_newest_far_enough_back() {
        let mut history = ClockHistory::default();
        assert_eq!(history.before(pair(1000)), None);
        // Polls every 250 ms from 0 (the one at 50 ms is too close to keep).
        for ms in [0, 50, 250, 500] {
            history.observe(pair(ms));
        }
        assert_eq!(history.older, Some(pair(250)));
        assert_eq!(history.newest, Some(pair(500)));
        // A freeze 120 ms after the last poll takes it; 30 ms after, the one before.
        assert_eq!(history.before(pair(620)), Some(pair(500)));
        assert_eq!(history.before(pair(530)), Some(pair(250)));
        // A freeze right after the start has none.
        let mut fresh = ClockHistory::default();
        fresh.observe(pair(0));
        assert_eq!(fresh.before(pair(40)), None);
        // Without a TSC there is nothing to scale with.
        let mut no_tsc = ClockHistory::default();
        no_tsc.observe(ClockPair {
            tsc: None,
            monotonic_ns: 0,
        });
        assert_eq!(no_tsc.before(pair(1000)), None);
    }
}
