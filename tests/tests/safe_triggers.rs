//! Latency rules (`func:SYMBOL>DURATION`) on programs built by real toolchains (Debian's g++
//! and golang-go, the Rust toolchain), whose functions are left by exceptions, panics,
//! longjmp, tail calls and several `ret`s, and whose goroutine stacks move: the target must
//! compute what it computes without lookback and exit 0, and the trigger count must equal
//! the number of calls the program itself measured above the threshold. Each of these
//! programs aborts, crashes or is refused under `--return-probe uretprobe` (checked in the
//! last tests). Needs root (run by `cargo xtask test` with --test-threads=1).
use std::{
    collections::BTreeSet,
    path::Path,
    process::{Command, Output},
};

use lookback_tests::{
    DryRun, dry_run_of, lookback_bin,
    toolchains::{c_exits, cxx_throw, go_program, measured, run_plain, rust_panic},
};

/// The threshold of every rule here; the programs' slow calls spin 20 ms, the others take
/// microseconds.
const THRESHOLD: &str = "10ms";
const THRESHOLD_US: &str = "10000";

/// A dry run of a latency rule on `symbol`, with the program's stdout.
fn traced(program: &Path, symbol: &str, args: &[&str]) -> (DryRun, String) {
    let run = dry_run_of(
        program,
        &["--trigger", &format!("func:{symbol}>{THRESHOLD}")],
        args,
    );
    let stdout = run.program_stdout.clone();
    (run, stdout)
}

/// The target exited 0 and printed the same result as without lookback.
fn assert_unharmed(run: &DryRun, stdout: &str, reference: &str) {
    assert_eq!(
        run.summary["exit"]["code"], 0,
        "the target did not exit 0: {}\n{}",
        run.summary["exit"], run.stderr
    );
    assert_eq!(
        measured(stdout, "result"),
        measured(reference, "result"),
        "the target computed something else under lookback"
    );
}

/// The exit sites lookback probed (`site` of the summary's probes other than the entry).
fn exit_sites(run: &DryRun) -> Vec<String> {
    run.summary["rules"][0]["probes"]
        .as_array()
        .expect("probes")
        .iter()
        .filter(|p| p["is_return"] == true)
        .map(|p| p["site"].as_str().unwrap_or("").to_owned())
        .collect()
}

fn durations_ms(run: &DryRun) -> Vec<f64> {
    run.of_rule(0)
        .iter()
        .map(|e| e["duration_ns"].as_f64().expect("duration") / 1e6)
        .collect()
}

#[test]
fn cxx_exceptions_through_the_probed_function_leave_the_program_unharmed() {
    let bin = cxx_throw();
    let args = ["500", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "_Z4worki", &args);
    assert_unharmed(&run, &out, &reference);
    let slow = measured(&out, "measured_slow");
    assert!(slow > 0, "{out}");
    assert_eq!(run.of_rule(0).len() as u64, slow, "{out}\n{}", run.summary);
    assert_eq!(run.counter(0, "met"), slow);
    // Every throw out of work() abandons its frame; the next call drops it (the last
    // throw may have no next call).
    let thrown = measured(&out, "thrown");
    let unwound = run.counter(0, "unwound");
    assert!(
        unwound <= thrown && unwound + 1 >= thrown,
        "{unwound} of {thrown}"
    );
    assert!(durations_ms(&run).iter().all(|&d| d >= 10.0));
}

#[test]
fn rust_panics_caught_by_catch_unwind_leave_the_program_unharmed() {
    let bin = rust_panic();
    let args = ["500", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "lb_panicky", &args);
    assert_unharmed(&run, &out, &reference);
    let slow = measured(&out, "measured_slow");
    assert!(slow > 0, "{out}");
    assert_eq!(run.of_rule(0).len() as u64, slow, "{out}\n{}", run.summary);
    let panicked = measured(&out, "panicked");
    let unwound = run.counter(0, "unwound");
    assert!(
        unwound <= panicked && unwound + 1 >= panicked,
        "{unwound} of {panicked}"
    );
}

#[test]
fn go_goroutines_whose_stacks_move_are_measured_exactly() {
    let bin = go_program();
    let args = ["100", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "main.slow", &args);
    assert_unharmed(&run, &out, &reference);
    // The hazard was there: main.slow's frame moved while it ran.
    assert!(measured(&out, "stack_moves") > 0, "{out}");
    // Every call that spun (20 ms) fires, and nothing fires that the program itself did
    // not measure as slow. (On a loaded machine a call that returns at once can still take
    // over 10 ms by the program's clock, which also spans the time around the call: the
    // kernel, timing entry to return, rightly does not fire for it.)
    let spun = measured(&out, "slow_calls");
    let slow = measured(&out, "measured_slow");
    let fired = run.of_rule(0).len() as u64;
    assert!(spun > 0, "{out}");
    assert!(
        spun <= fired && fired <= slow,
        "{fired} triggers for {spun} spun calls, {slow} measured slow:\n{out}\n{}",
        run.summary
    );
    assert_eq!(run.counter(0, "unmatched_return"), 0, "{}", run.summary);
    // main.slow has one RET per return statement.
    assert_eq!(exit_sites(&run), ["ret"; 3]);
}

#[test]
fn ten_thousand_longjmps_per_thread_never_wedge_the_entry_stack() {
    let bin = c_exits();
    let args = ["longjmp", "4", "10000", "5", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "lb_jumpy", &args);
    assert_unharmed(&run, &out, &reference);
    assert_eq!(measured(&out, "measured_slow"), 20, "{out}");
    assert_eq!(run.of_rule(0).len(), 20, "{}", run.summary);
    assert_eq!(run.counter(0, "depth_overflow"), 0);
    // Each thread's 10,000 abandoned frames are dropped by its next entry.
    assert_eq!(run.counter(0, "unwound"), 40_000, "{}", run.summary);
    let tids: BTreeSet<_> = run.of_rule(0).iter().map(|e| e["tid"].as_u64()).collect();
    assert_eq!(tids.len(), 4);
    assert!(
        run.stderr.contains("40000 call(s) abandoned"),
        "{}",
        run.stderr
    );
}

#[test]
fn several_threads_are_each_measured_against_their_own_entries() {
    let bin = c_exits();
    let args = ["threads", "4", "200", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "lb_jumpy", &args);
    assert_unharmed(&run, &out, &reference);
    // 80 calls spin past the threshold; a fast call the machine's load stretches past it
    // is slow too, by the program's own clock and by lookback's: every spun call fires,
    // and none the program did not measure as slow.
    assert_eq!(measured(&out, "slow_calls"), 80, "{out}");
    let slow = measured(&out, "measured_slow");
    let fired = run.of_rule(0).len() as u64;
    assert!((80..=slow).contains(&fired), "{fired} fired\n{out}");
    assert_eq!(run.counter(0, "unwound"), 0);
    assert_eq!(run.counter(0, "unmatched_return"), 0);
}

#[test]
fn a_tail_call_ends_the_call_at_the_jump() {
    // lb_tailer's frame is gone at its `jmp`: its duration is its own part, and the calls
    // slow only after the jump (in lb_tail_target) are not its calls any more.
    for (symbol, mode, site) in [
        ("lb_tailer", "tail", "jump"),
        ("lb_tailer_indirect", "tail-indirect", "indirect_jump"),
    ] {
        let bin = c_exits();
        let args = [mode, "200", THRESHOLD_US];
        let reference = run_plain(&bin, &args);
        let (run, out) = traced(&bin, symbol, &args);
        assert_unharmed(&run, &out, &reference);
        assert_eq!(exit_sites(&run), [site], "{symbol}");
        let before = measured(&out, "slow_before_jump");
        assert!(before > 0 && measured(&out, "slow_in_target") > 0, "{out}");
        assert_eq!(
            run.of_rule(0).len() as u64,
            before,
            "{symbol}: {}",
            run.summary
        );
        assert_eq!(run.counter(0, "unmatched_return"), 0);
        assert!(durations_ms(&run).iter().all(|&d| d >= 10.0));
    }
}

#[test]
fn a_function_with_three_rets_is_measured_at_each() {
    let bin = c_exits();
    let args = ["rets", "200", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "lb_three_rets", &args);
    assert_unharmed(&run, &out, &reference);
    assert_eq!(exit_sites(&run), ["ret"; 3]);
    let slow = measured(&out, "measured_slow");
    assert_eq!(run.of_rule(0).len() as u64, slow, "{out}");
    // One slow call per path in every 20 calls: all three rets fired.
    let rets: BTreeSet<_> = run.of_rule(0).iter().map(|e| e["ret"].as_i64()).collect();
    assert!(rets.len() >= 3, "{rets:?}");
}

#[test]
fn a_jump_table_inside_the_function_is_not_an_exit() {
    let bin = c_exits();
    let args = ["switch", "200", THRESHOLD_US];
    let reference = run_plain(&bin, &args);
    let (run, out) = traced(&bin, "lb_switch", &args);
    assert_unharmed(&run, &out, &reference);
    // The `jmp *%rax` is probed, and the program decides in the kernel it stays inside.
    assert_eq!(exit_sites(&run), ["indirect_jump", "ret"]);
    let slow = measured(&out, "measured_slow");
    assert_eq!(run.of_rule(0).len() as u64, slow, "{out}");
    assert_eq!(run.counter(0, "unmatched_return"), 0, "{}", run.summary);
}

#[test]
fn a_function_without_a_size_is_refused_with_the_choices() {
    let bin = c_exits();
    let run = dry_run_of(
        &bin,
        &[
            "--trigger",
            "func:lb_unsized>1ms",
            "--trigger",
            "func:lb_three_rets>10ms",
            "--trigger",
            "func:lb_unsized",
        ],
        &["rets", "40", THRESHOLD_US],
    );
    assert!(
        run.stderr.contains("cannot find where lb_unsized")
            && run.stderr.contains("no size")
            && run.stderr.contains("entry trigger")
            && run.stderr.contains("uretprobe"),
        "{}",
        run.stderr
    );
    // The other rules run: the latency rule on lb_three_rets and the entry rule.
    let rules = run.summary["rules"].as_array().expect("rules");
    assert_eq!(rules.len(), 2, "{}", run.summary);
    assert_eq!(run.of_rule(2).len(), 1, "lb_unsized is called once");
}

/// `lookback run --dry-run --return-probe uretprobe`'s output.
fn with_uretprobe(program: &Path, symbol: &str, args: &[&str]) -> Output {
    Command::new(lookback_bin())
        .args(["run", "--dry-run", "--json", "--max-snapshots", "0"])
        .args(["--return-probe", "uretprobe"])
        .args(["--trigger", &format!("func:{symbol}>{THRESHOLD}"), "--"])
        .arg(program)
        .args(args)
        .output()
        .expect("running lookback")
}

#[test]
fn uretprobes_harm_these_programs_and_are_refused_for_go() {
    // What the default avoids: the same C++ and Rust runs abort under a uretprobe.
    for (bin, symbol) in [(cxx_throw(), "_Z4worki"), (rust_panic(), "lb_panicky")] {
        let out = with_uretprobe(&bin, symbol, &["200", THRESHOLD_US]);
        let run = DryRun::parse(&out);
        assert_eq!(
            run.summary["exit"]["signal"],
            libc::SIGABRT,
            "{symbol}: {}",
            run.summary
        );
        assert!(
            run.stderr.contains("uretprobe in"),
            "the warning: {}",
            run.stderr
        );
    }
    let out = with_uretprobe(&go_program(), "main.slow", &["10", THRESHOLD_US]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is a Go binary"), "{stderr}");
}
