//! Rust panics through a probed function, for the `func:lb_panicky>DURATION` latency
//! tests: a return probe that rewrites the return address (uretprobe) breaks the
//! unwinder, probes on the function's own `ret`s must not.
//! Build: rustc --edition 2021 -C opt-level=1 -g -o panic panic.rs
//!
//!   panic CALLS THRESHOLD_US
//!
//! Call i of lb_panicky(i), i = 0..CALLS-1, is exactly one of:
//!   i % 10 == 3   lb_panicky panics itself (fast);
//!   i % 10 == 7   lb_panicky calls lb_panic_below, which panics: the unwind goes THROUGH
//!                 lb_panicky, dropping a guard in its frame (fast);
//!   i % 25 == 5   lb_panicky spins 20 ms (busy loop on Instant) and returns normally;
//!   otherwise     lb_panicky returns at once.
//! main catches every panic (catch_unwind around the call; a silent panic hook keeps
//! stderr quiet), measures each call itself and prints on stdout:
//!   measured_slow=N   calls that lasted more than THRESHOLD_US
//!   panicked=N        calls that ended in a panic
//!   result=CHECKSUM   a function of the return values and the panic payloads only
//! and exits 0 (2 on bad arguments, 3 when the counts are not the expected ones).
use std::hint::black_box;
use std::panic;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const SLOW: Duration = Duration::from_millis(20);

static GUARDS_DROPPED: AtomicU64 = AtomicU64::new(0);

struct Guard(u64);

impl Drop for Guard {
    fn drop(&mut self) {
        GUARDS_DROPPED.fetch_add(self.0, Ordering::Relaxed);
    }
}

/// Busy-waits (never sleeps): the call stays on CPU.
#[inline(never)]
fn spin(d: Duration) {
    let start = Instant::now();
    while start.elapsed() < d {
        black_box(());
    }
}

/// Panics from below lb_panicky, so the unwind propagates through its frame.
#[no_mangle]
#[inline(never)]
pub fn lb_panic_below(i: u64) -> u64 {
    if black_box(i) != u64::MAX {
        panic::panic_any(i * 3);
    }
    i
}

/// The probed function.
#[no_mangle]
#[inline(never)]
pub fn lb_panicky(i: u64) -> u64 {
    if i % 10 == 3 {
        panic::panic_any(i * 5);
    }
    let mut guard = Guard(i);
    let mut r = black_box(i * 7 + 1);
    if i % 10 == 7 {
        r += lb_panic_below(i);
    }
    if i % 25 == 5 {
        spin(SLOW);
    }
    guard.0 = 1;
    r
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let parsed = match args.as_slice() {
        [_, calls, threshold] => calls.parse::<u64>().ok().zip(threshold.parse::<u64>().ok()),
        _ => None,
    };
    let Some((calls, threshold_us)) = parsed else {
        eprintln!("usage: panic CALLS THRESHOLD_US");
        std::process::exit(2);
    };
    let threshold = Duration::from_micros(threshold_us);
    panic::set_hook(Box::new(|_| {}));
    let mut checksum: u64 = 1_469_598_103_934_665_603;
    let (mut slow, mut panicked, mut expected_panics, mut expected_slow) = (0u64, 0u64, 0u64, 0u64);
    for i in 0..calls {
        let start = Instant::now();
        let outcome = panic::catch_unwind(|| lb_panicky(black_box(i)));
        let took = start.elapsed();
        let value = match outcome {
            Ok(v) => v,
            Err(payload) => {
                panicked += 1;
                1_000_000 + payload.downcast_ref::<u64>().copied().unwrap_or(u64::MAX)
            }
        };
        if took > threshold {
            slow += 1;
        }
        checksum = (checksum ^ value).wrapping_mul(1_099_511_628_211);
        if i % 10 == 3 || i % 10 == 7 {
            expected_panics += 1;
        } else if i % 25 == 5 {
            expected_slow += 1;
        }
    }
    println!("measured_slow={slow}");
    println!("panicked={panicked}");
    println!("slow_calls={expected_slow}");
    println!(
        "result={}",
        checksum ^ GUARDS_DROPPED.load(Ordering::Relaxed)
    );
    if panicked != expected_panics {
        std::process::exit(3);
    }
}
