//! A call chain five deep (`main` → `level1` → `level2` → `level3` → `handle` →
//! `leaf_work`) for the unwinding tests, built as a release build (`rustc -C
//! opt-level=3`: no frame pointers, Rust's default on x86-64 Linux).
//!
//! Usage: `deep CALLS SLOW_INDEX [SLOW_ITERS]`; the slow call runs `leaf_work(SLOW_ITERS)`
//! until it has lasted at least 60 ms by the program's clock (the tests' latency rules fire
//! at 20 ms, whatever the CPU's speed); prints `measured_slow=NS` for it and `result=` at
//! the end.
use std::cell::Cell;
use std::hint::black_box;
use std::time::{Duration, Instant};

thread_local! {
    /// When the slow call may end; `None` for the other calls (one `leaf_work`).
    static SLOW_UNTIL: Cell<Option<Instant>> = const { Cell::new(None) };
}

#[inline(never)]
fn leaf_work(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = black_box(acc.wrapping_add(i.wrapping_mul(i)));
    }
    acc
}

// `black_box` on each result keeps the calls from becoming tail jumps.
#[inline(never)]
fn handle(n: u64) -> u64 {
    let mut acc = black_box(leaf_work(n));
    while SLOW_UNTIL.with(Cell::get).is_some_and(|t| Instant::now() < t) {
        acc ^= black_box(leaf_work(n));
    }
    acc ^ 1
}

#[inline(never)]
fn level3(n: u64) -> u64 {
    black_box(handle(n)) ^ 3
}

#[inline(never)]
fn level2(n: u64) -> u64 {
    black_box(level3(n)) ^ 2
}

#[inline(never)]
fn level1(n: u64) -> u64 {
    black_box(level2(n)) ^ 1
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let calls = arg(1, 200);
    let slow = arg(2, calls.saturating_sub(20));
    let slow_iters = arg(3, 60_000_000);
    let mut result = 0u64;
    for i in 0..calls {
        let n = if i == slow { slow_iters } else { 600_000 };
        let t0 = Instant::now();
        SLOW_UNTIL.with(|s| s.set((i == slow).then(|| t0 + Duration::from_millis(60))));
        result ^= level1(n);
        if i == slow {
            println!("measured_slow={}", t0.elapsed().as_nanos());
        }
    }
    println!("result={result}");
}
