//! How much ring memory an unprivileged recorder may lock, and PT ring sizes that fit it
//! (issue 18 item 5). In `check/`, under the capture stage, because both the PT recorder
//! (which shrinks its rings) and `lookback check` (which says so in advance) use it.
//!
//! In: `perf_event_mlock_kb`, the online CPUs, `RLIMIT_MEMLOCK`, whether the process has
//! `CAP_IPC_LOCK` and `perf_event_paranoid`. Out: a [`LockBudget`] and [`fit`], the AUX and
//! data ring sizes to map.
//!
//! Why: `perf_mmap` (kernel/events/core.c) lets each user lock `perf_event_mlock_kb` KiB
//! per online CPU for perf rings; what goes beyond is charged to the mm's pinned pages,
//! and past `RLIMIT_MEMLOCK` the mmap fails with `EPERM` unless the process has
//! `CAP_IPC_LOCK` or `perf_event_paranoid` is -1. The defaults (4 MiB AUX + 512 KiB data per
//! CPU) are far beyond the 516 KiB × CPUs a `CAP_PERFMON`-only user gets, so such a user
//! saw an `EPERM` that read like a missing capability. Like perf (which drops to 128 KiB
//! AUX / 256 KiB data when unprivileged) the recorder shrinks the rings to fit, and says so.

/// Bytes this process may lock for its perf rings; `None`: no limit applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockBudget(pub Option<u64>);

impl LockBudget {
    /// From the kernel's inputs: `mlock_kb` (`perf_event_mlock_kb`), `cpus` online,
    /// `memlock` (the soft `RLIMIT_MEMLOCK`, bytes), `cap_ipc_lock`, `paranoid`.
    pub fn new(
        mlock_kb: u64,
        cpus: usize,
        memlock: u64,
        cap_ipc_lock: bool,
        paranoid: i32,
    ) -> Self {
        if cap_ipc_lock || paranoid <= -1 {
            return Self(None);
        }
        let per_user = mlock_kb.saturating_mul(1024).saturating_mul(cpus as u64);
        Self(Some(per_user.saturating_add(memlock)))
    }

    /// This process's budget, read from `/proc` and `getrlimit`; `None` inside when a
    /// limit does not apply or cannot be read (then nothing is shrunk: the kernel decides).
    pub fn of_this_process(cpus: usize) -> Self {
        let read = |path: &str| -> Option<String> { std::fs::read_to_string(path).ok() };
        let Some(mlock_kb) =
            read("/proc/sys/kernel/perf_event_mlock_kb").and_then(|t| t.trim().parse::<u64>().ok())
        else {
            return Self(None);
        };
        let paranoid = read("/proc/sys/kernel/perf_event_paranoid")
            .and_then(|t| t.trim().parse::<i32>().ok())
            .unwrap_or(2);
        let cap_ipc_lock = read("/proc/self/status").is_none_or(|status| has_cap_ipc_lock(&status));
        let Ok(memlock) = crate::sys::rlimit::locked_memory() else {
            return Self(None);
        };
        if memlock == libc::RLIM_INFINITY {
            return Self(None);
        }
        Self::new(mlock_kb, cpus, memlock, cap_ipc_lock, paranoid)
    }
}

/// Whether a `/proc/PID/status` text's `CapEff` holds `CAP_IPC_LOCK` (14).
fn has_cap_ipc_lock(status: &str) -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << CAP_IPC_LOCK) != 0)
}

/// The ring sizes chosen by [`fit`], in pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fitted {
    pub aux_pages: usize,
    pub data_pages: usize,
}

/// The smallest rings worth recording into: 128 KiB of AUX, 256 KiB of data (perf's
/// unprivileged defaults) are shrunk below only when even those do not fit.
const MIN_AUX_PAGES: usize = 2;
const MIN_DATA_PAGES: usize = 2;

/// AUX and data pages (powers of two) per CPU that fit `budget` on `cpus` CPUs: the
/// requested ones when they fit; else the AUX area halves down to 128 KiB, then the data
/// ring down to 256 KiB, then both down to 2 pages. `None` when not even that fits. The
/// data ring costs one page more (its header page), the AUX area does not.
pub fn fit(
    aux_pages: usize,
    data_pages: usize,
    cpus: usize,
    page: usize,
    budget: LockBudget,
) -> Option<Fitted> {
    let mut f = Fitted {
        aux_pages,
        data_pages,
    };
    let Some(budget) = budget.0 else {
        return Some(f);
    };
    let cost = |f: &Fitted| -> u64 {
        ((f.aux_pages + f.data_pages + 1) as u64)
            .saturating_mul(page as u64)
            .saturating_mul(cpus as u64)
    };
    let (aux_floor, data_floor) = ((128 << 10) / page, (256 << 10) / page);
    // (shrink the AUX area?, down to this many pages), in order.
    let steps = [
        (true, aux_floor),
        (false, data_floor),
        (true, MIN_AUX_PAGES),
        (false, MIN_DATA_PAGES),
    ];
    for (aux, floor) in steps {
        while cost(&f) > budget {
            let pages = if aux {
                &mut f.aux_pages
            } else {
                &mut f.data_pages
            };
            if *pages <= floor {
                break;
            }
            *pages /= 2;
        }
    }
    (cost(&f) <= budget).then_some(f)
}

/// What `lookback check` says when the default PT rings (4 MiB AUX + 512 KiB sideband
/// per CPU) do not fit `budget` on `cpus` CPUs; `None` when they do.
pub fn default_rings_note(budget: LockBudget, cpus: usize, page: usize) -> Option<String> {
    let (aux, data) = ((4 << 20) / page, (512 << 10) / page);
    let f = fit(aux, data, cpus, page, budget);
    if f == Some(Fitted {
        aux_pages: aux,
        data_pages: data,
    }) {
        return None;
    }
    let limit = budget.0.unwrap_or(0) >> 10;
    Some(match f {
        Some(f) => format!(
            "this process may lock {limit} KiB of rings (perf_event_mlock_kb × CPUs + \
             RLIMIT_MEMLOCK, no CAP_IPC_LOCK): PT records into {} KiB AUX + {} KiB sideband \
             per CPU instead of 4096 + 512 (grant CAP_IPC_LOCK for the full history)",
            (f.aux_pages * page) >> 10,
            (f.data_pages * page) >> 10
        ),
        None => format!(
            "this process may lock only {limit} KiB of rings: PT cannot record (grant \
             CAP_IPC_LOCK or raise RLIMIT_MEMLOCK)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 4096;

    #[test]
    fn the_budget_follows_the_kernels_rules() {
        // Debian's defaults for a CAP_PERFMON-only user: 516 KiB per CPU, 8 MiB memlock.
        assert_eq!(
            LockBudget::new(516, 2, 8 << 20, false, 2),
            LockBudget(Some(2 * 516 * 1024 + (8 << 20)))
        );
        assert_eq!(LockBudget::new(516, 2, 0, true, 2), LockBudget(None));
        assert_eq!(LockBudget::new(516, 2, 0, false, -1), LockBudget(None));
        let status = "Name:\tx\nCapEff:\t0000000000004000\n";
        assert!(has_cap_ipc_lock(status));
        assert!(!has_cap_ipc_lock("CapEff:\t000001c000000000\n"));
        assert!(!has_cap_ipc_lock("Name:\tx\n"));
    }

    #[test]
    fn the_default_rings_shrink_to_what_an_unprivileged_user_may_lock() {
        let (aux, data) = ((4 << 20) / PAGE, (512 << 10) / PAGE);
        // No limit: as asked.
        assert_eq!(
            fit(aux, data, 8, PAGE, LockBudget(None)),
            Some(Fitted {
                aux_pages: aux,
                data_pages: data
            })
        );
        // 516 KiB per CPU and a 64 KiB memlock on 8 CPUs (4.09 MiB): the defaults (4.5 MiB
        // a CPU) fail with EPERM in the kernel; 128 KiB AUX + 256 KiB data + the header
        // page fit (3.0 MiB), as perf chooses when unprivileged.
        let budget = LockBudget::new(516, 8, 64 << 10, false, 2);
        let f = fit(aux, data, 8, PAGE, budget).expect("fits");
        assert_eq!(
            (f.aux_pages * PAGE, f.data_pages * PAGE),
            (128 << 10, 256 << 10)
        );
        // A bigger allowance keeps more AUX: the largest power of two that fits.
        let budget = LockBudget::new(2052, 8, 0, false, 2);
        let f = fit(aux, data, 8, PAGE, budget).expect("fits");
        assert_eq!(
            (f.aux_pages * PAGE, f.data_pages * PAGE),
            (1 << 20, 512 << 10)
        );
        // Below perf's floor: down to 2 pages each; nothing at all: None.
        let budget = LockBudget(Some(5 * PAGE as u64));
        assert_eq!(
            fit(aux, data, 1, PAGE, budget),
            Some(Fitted {
                aux_pages: 2,
                data_pages: 2
            })
        );
        assert_eq!(
            fit(aux, data, 1, PAGE, LockBudget(Some(4 * PAGE as u64))),
            None
        );
    }

    #[test]
    fn check_names_the_shrink_and_the_capability() {
        assert_eq!(default_rings_note(LockBudget(None), 8, PAGE), None);
        let note = default_rings_note(LockBudget::new(516, 8, 64 << 10, false, 2), 8, PAGE)
            .expect("a note");
        assert!(note.contains("128 KiB AUX + 256 KiB"), "{note}");
        assert!(note.contains("CAP_IPC_LOCK"), "{note}");
        let note = default_rings_note(LockBudget(Some(0)), 8, PAGE).expect("a note");
        assert!(note.contains("cannot record"), "{note}");
    }
}
