//! AUX sizes a PT PMU without multi-entry `ToPA` can take, for the snapshot recorder and
//! for `lookback check`, which says what the limit means (hence in `check/`, under the
//! capture stage).
//!
//! In: the AUX pages per CPU asked for, the PMU's `caps/topa_multiple_entries`, the
//! kernel's largest page order (`/proc/buddyinfo`). Out: the pages to map, and the next
//! smaller size to try after the kernel refused one. Why: where `ToPA` holds one entry only
//! (the first PT CPUs, e.g. Broadwell), the kernel marks the PMU `PERF_PMU_CAP_AUX_NO_SG`
//! and `rb_alloc_aux` (`kernel/events/ring_buffer.c`) needs an overwrite-mode AUX area to be
//! one physically contiguous allocation: its first chunk must have the order
//! `ilog2(pages)`, and no chunk is larger than `MAX_PAGE_ORDER` (2^10 pages: 4 MiB with
//! 4 KiB pages). A larger area is refused with ENOMEM every time, and one of 4 MiB when
//! memory is too fragmented to hand out such a block. perf's `intel_pt` snapshot mode
//! meets the same limit; lookback caps the area there and halves it on ENOMEM, saying so.

/// The largest page order where `/proc/buddyinfo` cannot be read (x86's default
/// `MAX_PAGE_ORDER`).
const DEFAULT_MAX_ORDER: u32 = 10;

/// The smallest AUX area the halving goes down to: 64 KiB of 4 KiB pages (perf's
/// unprivileged default is 128 KiB).
const MIN_PAGES: usize = 16;

/// How the AUX area of a PT PMU can be allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuxLimit {
    /// One contiguous allocation (`topa_multiple_entries` is 0).
    pub single_chunk: bool,
    /// The kernel's largest page order.
    pub max_order: u32,
}

impl AuxLimit {
    /// From the PMU's caps flag (unknown: not limited, as the kernel treats a PMU whose
    /// caps it cannot read) and the text of `/proc/buddyinfo`.
    pub fn new(topa_multiple_entries: Option<bool>, buddyinfo: &str) -> Self {
        Self {
            single_chunk: topa_multiple_entries == Some(false),
            max_order: max_order(buddyinfo).unwrap_or(DEFAULT_MAX_ORDER),
        }
    }

    /// [`Self::new`] with this kernel's `/proc/buddyinfo` (the recorder and `check`).
    pub fn of_this_kernel(topa_multiple_entries: Option<bool>) -> Self {
        Self::new(
            topa_multiple_entries,
            &std::fs::read_to_string("/proc/buddyinfo").unwrap_or_default(),
        )
    }

    /// The pages to map for `pages` asked for: at most one largest chunk where the area
    /// must be a single one.
    pub fn cap(self, pages: usize) -> usize {
        if !self.single_chunk {
            return pages;
        }
        pages.min(1usize << self.max_order.min(usize::BITS - 1))
    }

    /// The size to try after the kernel refused `pages` with ENOMEM: half of it, where the
    /// area must be one chunk (a smaller block is more likely free) and is above the
    /// floor. `None`: the error stands (with scatter-gather ENOMEM is a lack of memory,
    /// not of a contiguous block).
    pub fn after_enomem(self, pages: usize) -> Option<usize> {
        (self.single_chunk && pages > MIN_PAGES).then_some(pages / 2)
    }
}

/// The largest page order in `/proc/buddyinfo` (its free-block counts per order, one
/// column per order from 0).
fn max_order(buddyinfo: &str) -> Option<u32> {
    let line = buddyinfo.lines().find(|l| l.contains("zone"))?;
    let (_, counts) = line.split_once("zone")?;
    // The zone's name, then one count per order.
    let columns = counts.split_whitespace().skip(1).count();
    u32::try_from(columns).ok()?.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/buddyinfo` of a Debian 12 x86-64 guest (Linux 6.18): orders 0-10.
    const BUDDYINFO: &str = "\
Node 0, zone      DMA      0      0      0      0      0      0      0      0      1      1      2 
Node 0, zone    DMA32    634    512    401    322    276    204    152     93     60     37    412 
Node 0, zone   Normal   2011   1630   1240    953    612    401    211    102     51     19    940 
";

    #[test]
    fn the_largest_order_is_the_last_buddyinfo_column() {
        assert_eq!(max_order(BUDDYINFO), Some(10));
        // A kernel built with a larger MAX_PAGE_ORDER has more columns.
        assert_eq!(
            max_order("Node 0, zone   Normal 1 2 3 4 5 6 7 8 9 10 11 12 13\n"),
            Some(12)
        );
        assert_eq!(max_order(""), None);
        assert_eq!(AuxLimit::new(Some(false), "").max_order, DEFAULT_MAX_ORDER);
    }

    #[test]
    fn a_single_entry_topa_gets_one_largest_chunk_at_most() {
        let single = AuxLimit::new(Some(false), BUDDYINFO);
        // 16 MiB of 4 KiB pages asked for: the kernel would refuse it every time.
        assert_eq!(single.cap(4096), 1024);
        assert_eq!(single.cap(1024), 1024);
        assert_eq!(single.cap(64), 64);
        // Multi-entry ToPA (or caps not readable): what was asked for.
        assert_eq!(AuxLimit::new(Some(true), BUDDYINFO).cap(4096), 4096);
        assert_eq!(AuxLimit::new(None, BUDDYINFO).cap(4096), 4096);
    }

    #[test]
    fn enomem_halves_a_single_chunk_down_to_the_floor_only() {
        let single = AuxLimit::new(Some(false), BUDDYINFO);
        let mut sizes = vec![1024];
        while let Some(next) = single.after_enomem(*sizes.last().unwrap()) {
            sizes.push(next);
        }
        assert_eq!(sizes, [1024, 512, 256, 128, 64, 32, 16]);
        // Scatter-gather: ENOMEM is not about contiguity; no retry.
        assert_eq!(
            AuxLimit::new(Some(true), BUDDYINFO).after_enomem(1024),
            None
        );
    }
}
