//! The report engine on slices whose causes the test wrote down.
use super::*;

const T: (u32, u32) = (10, 11);
const BIN: Option<&str> = Some("/srv/app");
const LIBC: Option<&str> = Some("/lib/libc.so.6");

/// A trigger of `handle` returning at 30 ms after a 20 ms call.
fn trigger() -> TriggerInfo {
    TriggerInfo {
        rule: "func:handle>10ms".into(),
        kind: "function".into(),
        detail: "return, duration 20.000ms".into(),
        pid: T.0,
        tid: T.1,
        comm: "app".into(),
        time_ns: 30_000_000,
        duration_ns: Some(20_000_000),
        stack: vec!["main".into(), "handle".into()],
    }
}

/// `main` from 0 to 40 ms, `handle` from 9 to 31 ms (sampled edges), inside it `helper`
/// from 10 to 30 ms, whose body `inner` is called by the test.
fn collect(inner: impl FnOnce(&mut Collector)) -> Collector {
    collect_over(trigger().interval(DEFAULT_WINDOW_NS), inner)
}

/// [`collect`] over `interval`.
fn collect_over(interval: (u64, u64), inner: impl FnOnce(&mut Collector)) -> Collector {
    let mut c = Collector::new(T, interval);
    c.begin(T, 0, "main", BIN, false);
    c.begin(T, 9_000_000, "handle", BIN, false);
    c.begin(T, 10_000_000, "helper", BIN, false);
    inner(&mut c);
    c.end(T, 30_000_000);
    c.end(T, 31_000_000);
    c.end(T, 40_000_000);
    c
}

#[test]
fn a_sleep_in_a_helper_is_off_cpu_sleep_named_to_the_helper() {
    let c = collect(|c| {
        c.begin(T, 10_000_000, "__GI___nanosleep", LIBC, false);
        c.begin(T, 10_000_000, "__GI___clock_nanosleep", LIBC, false);
        c.begin(T, 10_500_000, OFF_CPU, None, false);
        c.end(T, 29_500_000);
        c.end(T, 30_000_000);
        c.end(T, 30_000_000);
        // Another thread's slices are not this report's.
        c.begin((10, 12), 12_000_000, "spin", BIN, false);
        c.end((10, 12), 28_000_000);
    });
    let r = c.report(&trigger(), DEFAULT_DEPTH);
    assert_eq!(
        (r.interval_start_ns, r.interval_ns),
        (10_000_000, 20_000_000)
    );
    assert_eq!(r.covered_ns, 20_000_000);
    assert_eq!((r.off_cpu_ns, r.on_cpu_ns), (19_000_000, 1_000_000));
    let top = &r.breakdown[0];
    assert_eq!(top.state, State::OffCpu);
    assert_eq!(top.reason, Some(Reason::Sleep));
    assert_eq!(top.ns, 19_000_000);
    assert_eq!(
        top.frames,
        [
            "handle",
            "helper",
            "__GI___nanosleep",
            "__GI___clock_nanosleep"
        ]
    );
    assert_eq!(
        r.verdict,
        "handle 20.0 ms: 95 % off-CPU, sleeping in clock_nanosleep ← nanosleep ← helper ← handle"
    );
    assert_eq!(r.tree[0].name, "handle");
    assert_eq!(
        (r.tree[0].ns, r.tree[0].off_cpu_ns),
        (20_000_000, 19_000_000)
    );
}

#[test]
fn computing_in_a_helper_is_on_cpu_down_the_path_that_holds_most_of_it() {
    let c = collect(|c| {
        c.begin(T, 10_000_000, "checksum", BIN, false);
        c.end(T, 26_000_000);
        c.begin(T, 26_000_000, "log_line", BIN, false);
        c.end(T, 30_000_000);
    });
    let r = c.report(&trigger(), DEFAULT_DEPTH);
    assert_eq!(r.on_cpu_ns, 20_000_000);
    assert_eq!(r.breakdown[0].frames, ["handle", "helper", "checksum"]);
    assert_eq!(r.breakdown[0].state, State::OnCpu);
    assert_eq!(r.breakdown[0].reason, None);
    assert_eq!(
        r.verdict,
        "handle 20.0 ms: 100 % on-CPU, in checksum ← helper ← handle"
    );
}

#[test]
fn a_preempted_switch_is_preempted_whatever_the_frames() {
    let c = collect(|c| {
        c.begin(T, 10_000_000, "__GI___libc_write", LIBC, false);
        c.begin(T, 11_000_000, OFF_CPU, None, true);
        c.end(T, 29_000_000);
        c.end(T, 30_000_000);
    });
    let r = c.report(&trigger(), DEFAULT_DEPTH);
    assert_eq!(r.breakdown[0].reason, Some(Reason::Preempted));
    assert!(r.verdict.contains("preempted"), "{}", r.verdict);
}

#[test]
fn time_before_the_first_slice_is_not_explained_and_says_so() {
    let mut c = Collector::new(T, trigger().interval(DEFAULT_WINDOW_NS));
    c.begin(T, 28_000_000, "handle", BIN, false);
    c.end(T, 30_000_000);
    let r = c.report(&trigger(), DEFAULT_DEPTH);
    assert_eq!(r.covered_ns, 2_000_000);
    assert!(
        r.verdict.ends_with("(samples cover 10 % of it)"),
        "{}",
        r.verdict
    );
    let empty = Collector::new(T, (10_000_000, 30_000_000)).report(&trigger(), DEFAULT_DEPTH);
    assert!(
        empty.verdict.contains("holds nothing of thread 11"),
        "{}",
        empty.verdict
    );
    assert!(empty.breakdown.is_empty());
}

#[test]
fn a_signal_is_explained_over_the_window_before_it() {
    let t = TriggerInfo {
        kind: "signal".into(),
        detail: "SIGSEGV from pid 0".into(),
        duration_ns: None,
        ..trigger()
    };
    let c = collect_over(t.interval(5_000_000), |_| {});
    let r = c.report(&t, 1);
    assert_eq!(
        (r.interval_start_ns, r.interval_ns),
        (25_000_000, 5_000_000)
    );
    assert!(
        r.verdict
            .starts_with("signal (SIGSEGV from pid 0): the last 5.00 ms: 100 % on-CPU"),
        "{}",
        r.verdict
    );
    // Depth 1: the root and one level below it.
    assert!(r.tree.iter().all(|n| n.depth <= 1), "{:?}", r.tree);
}

#[test]
fn a_syscall_is_named_by_its_syscall() {
    let c = collect(|c| {
        c.begin(T, 10_000_000, "__GI___libc_read", LIBC, false);
        c.begin(T, 10_000_000, OFF_CPU, None, false);
        c.end(T, 30_000_000);
        c.end(T, 30_000_000);
    });
    let t = TriggerInfo {
        kind: "syscall".into(),
        detail: "read = 5, duration 20.000ms".into(),
        stack: vec![
            "main".into(),
            "handle".into(),
            "helper".into(),
            "read".into(),
        ],
        ..trigger()
    };
    let r = c.report(&t, DEFAULT_DEPTH);
    assert_eq!(
        r.verdict,
        "read 20.0 ms: 100 % off-CPU, waiting for I/O in read ← helper ← handle ← main"
    );
    // No probed function: frames from the deepest frame every stack shares, keeping four.
    assert_eq!(
        r.breakdown[0].frames,
        ["main", "handle", "helper", "__GI___libc_read"]
    );
}

#[test]
fn events_out_of_order_count_no_time_twice_and_an_unmatched_end_is_harmless() {
    let mut c = Collector::new(T, (0, 100));
    c.begin(T, 10, "a", BIN, false);
    c.begin(T, 30, "b", BIN, false);
    c.end(T, 20); // before the previous event: counts as 30
    c.end(T, 40);
    c.end(T, 50); // nothing open
    c.begin(T, 60, "c", BIN, false);
    c.end(T, 400); // beyond the interval: cut at 100
    let t = TriggerInfo {
        time_ns: 100,
        duration_ns: Some(100),
        ..trigger()
    };
    let r = c.report(&t, DEFAULT_DEPTH);
    assert_eq!(r.covered_ns, 20 + 10 + 40);
    assert!(r.covered_ns <= r.interval_ns);
    let empty = Collector::new(T, (0, u64::MAX));
    assert_eq!(empty.report(&t, usize::MAX).covered_ns, 0);
}

#[test]
fn several_off_cpu_reasons_say_the_largest_ones_share() {
    let c = collect(|c| {
        c.begin(T, 10_000_000, "pthread_mutex_lock", LIBC, false);
        c.begin(T, 10_000_000, OFF_CPU, None, false);
        c.end(T, 20_000_000);
        c.end(T, 20_000_000);
        c.begin(T, 20_000_000, "__GI___libc_read", LIBC, false);
        c.begin(T, 20_000_000, OFF_CPU, None, false);
        c.end(T, 29_000_000);
        c.end(T, 30_000_000);
    });
    let r = c.report(&trigger(), DEFAULT_DEPTH);
    assert!(
        r.verdict
            .contains("95 % off-CPU, most (50 %) waiting for a lock in pthread_mutex_lock"),
        "{}",
        r.verdict
    );
}
