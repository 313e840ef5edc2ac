//! Rust panics out of and through a probed function, for the in-flight latency tests
//! (`--detect running`): a call a panic ended must not be taken for one still running when
//! the code that caught it then makes a slow call at the same stack height.
//! Build: rustc --edition 2021 -C opt-level=2 -g -o inflight_panic inflight_panic.rs
//!
//!   inflight_panic ROUNDS
//!
//! Round i calls, through one `catch_unwind` closure (one call instruction for both, the
//! function read from a table through `black_box`), lb_panics(i) then lb_slow_after(i).
//! lb_panics makes a fast call (lb_fast_step), then panics itself (i even) or calls
//! lb_panic_below, which panics through it (i odd, dropping a guard in lb_panics's frame);
//! it never returns. lb_slow_after sleeps 120 ms, then spins 30 ms. A silent panic hook
//! keeps stderr quiet. Prints on stdout
//!   panicked=N        calls that ended in a panic (ROUNDS)
//!   slow_calls=N      slow calls of lb_slow_after (ROUNDS)
//!   result=CHECKSUM   a function of the return values and the panic payloads only
//! and exits 0 (2 on bad arguments, 3 when the counts are not the expected ones).
use std::hint::black_box;
use std::panic;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

static GUARDS_DROPPED: AtomicU64 = AtomicU64::new(0);

struct Guard(u64);

impl Drop for Guard {
    fn drop(&mut self) {
        GUARDS_DROPPED.fetch_add(self.0, Ordering::Relaxed);
    }
}

#[no_mangle]
#[inline(never)]
pub fn lb_fast_step(i: u64) -> u64 {
    black_box(i * 7 + 1)
}

/// Panics from below lb_panics, so the unwind goes through its frame.
#[no_mangle]
#[inline(never)]
pub fn lb_panic_below(i: u64) -> u64 {
    if black_box(i) != u64::MAX {
        panic::panic_any(i * 3);
    }
    i
}

/// The probed function: a fast call, then a panic out of it or through it.
#[no_mangle]
#[inline(never)]
pub fn lb_panics(i: u64) -> u64 {
    let guard = Guard(i);
    let mut r = lb_fast_step(i);
    if i % 2 == 1 {
        r += lb_panic_below(i);
    }
    if black_box(r) != u64::MAX {
        panic::panic_any(r);
    }
    drop(guard);
    r
}

/// The slow sibling: off the CPU, then on it.
#[no_mangle]
#[inline(never)]
pub fn lb_slow_after(i: u64) -> u64 {
    std::thread::sleep(Duration::from_millis(120));
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(30) {
        black_box(());
    }
    i * 13 + 2
}

static TABLE: [fn(u64) -> u64; 2] = [lb_panics, lb_slow_after];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(rounds) = args.get(1).and_then(|r| r.parse::<u64>().ok()) else {
        eprintln!("usage: inflight_panic ROUNDS");
        std::process::exit(2);
    };
    if args.len() != 2 {
        eprintln!("usage: inflight_panic ROUNDS");
        std::process::exit(2);
    }
    panic::set_hook(Box::new(|_| {}));
    let mut checksum: u64 = 1_469_598_103_934_665_603;
    let (mut panicked, mut slow) = (0u64, 0u64);
    for i in 0..rounds {
        for k in 0..black_box(TABLE.len()) {
            let f = black_box(TABLE[k]);
            let value = match panic::catch_unwind(|| f(black_box(i))) {
                Ok(v) => {
                    slow += 1;
                    v
                }
                Err(payload) => {
                    panicked += 1;
                    1_000_000 + payload.downcast_ref::<u64>().copied().unwrap_or(u64::MAX)
                }
            };
            checksum = (checksum ^ value).wrapping_mul(1_099_511_628_211);
        }
    }
    println!("panicked={panicked}");
    println!("slow_calls={slow}");
    println!(
        "result={}",
        checksum ^ GUARDS_DROPPED.load(Ordering::Relaxed)
    );
    if panicked != rounds || slow != rounds {
        std::process::exit(3);
    }
}
