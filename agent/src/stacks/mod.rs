//! Stacks stage: consecutive sampled call stacks of one thread → properly nested duration
//! slices. ([`branches`] does the same from branch events, e.g. an Intel PT trace.)
//!
//! In: one thread's samples in time order, each a stack with the outermost frame first,
//! and the sample period. Out: [`StackEvent`]s — `Begin`/`End` pairs that nest — for the
//! writer.
//!
//! Rules: a frame lasts while consecutive samples have the same function (as the caller's
//! `same` says) at the same depth, with the same function at every depth above it (so
//! recursion and a change at depth 2 under an unchanged depth 1 come out right). When a
//! frame disappears between samples `a` and `b`, its slice ends at the midpoint of `a` and
//! `b`, or at `a` + one period when the samples are more than two periods apart (the thread
//! was not running, or samples were lost); frames that appear in `b` begin at that same
//! midpoint, or at `b` itself after such a gap. Frames present in the first sample begin at
//! its time; frames still open after the last sample end one period after it, so a single
//! sample becomes slices one period long. Such a gap is a [`StackEvent::Gap`] of its own,
//! nested in the frames both samples share.
//!
//! A sample taken as the thread left the CPU (a context switch) keeps its frames open until
//! the thread runs again, with a [`StackEvent::OffCpu`] slice inside them; the next sample
//! is reckoned from then. So a function that returned before the thread slept ends before
//! the sleep, and one that slept (its frame on the stack at the switch) spans it.
#![forbid(unsafe_code)]

pub mod branches;

/// One sample: when, and the stack (outermost frame first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSample<F> {
    pub time_ns: u64,
    pub frames: Vec<F>,
    /// The thread left the CPU at this sample (its stack then): until when, and whether
    /// it was preempted (else it blocked).
    pub off_cpu: Option<(u64, bool)>,
}

/// A slice boundary. Ends always close the innermost open slice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StackEvent<F> {
    Begin {
        ts: u64,
        frame: F,
    },
    End {
        ts: u64,
    },
    /// No samples from `start` to `end` (more than two periods apart: the thread was off
    /// the CPU, or samples were lost): a slice of its own inside the frames that are open,
    /// which the writer names `[untraced]`.
    Gap {
        start: u64,
        end: u64,
    },
    /// The thread was off the CPU from `start` to `end` (a context switch said so): a
    /// slice of its own inside the frames of its stack at the switch, which stay open
    /// across it.
    OffCpu {
        start: u64,
        end: u64,
        preempted: bool,
    },
}

/// Where slices that leave between a sample at `prev` and one at `next` end, and where the
/// ones that arrive begin.
fn boundary(prev: u64, next: u64, period_ns: u64) -> (u64, u64) {
    let gap = next.saturating_sub(prev);
    if gap > period_ns.saturating_mul(2) {
        (prev.saturating_add(period_ns), next)
    } else {
        let mid = prev + gap / 2;
        (mid, mid)
    }
}

/// The slices of one thread's `samples` (in time order; out-of-order samples are clamped
/// to the previous time). `same` says whether two frames are the same function.
pub fn slices<F: Clone>(
    samples: &[StackSample<F>],
    period_ns: u64,
    same: impl Fn(&F, &F) -> bool,
) -> Vec<StackEvent<F>> {
    let mut events = Vec::new();
    let mut open: Vec<F> = Vec::new();
    let mut prev: Option<u64> = None;
    for sample in samples {
        let time = prev.map_or(sample.time_ns, |p| sample.time_ns.max(p));
        let common = open
            .iter()
            .zip(&sample.frames)
            .take_while(|(a, b)| same(a, b))
            .count();
        let (end_ts, begin_ts) = prev.map_or((time, time), |p| boundary(p, time, period_ns));
        for _ in common..open.len() {
            events.push(StackEvent::End { ts: end_ts });
        }
        open.truncate(common);
        if begin_ts > end_ts {
            events.push(StackEvent::Gap {
                start: end_ts,
                end: begin_ts,
            });
        }
        for frame in &sample.frames[common..] {
            events.push(StackEvent::Begin {
                ts: begin_ts,
                frame: frame.clone(),
            });
            open.push(frame.clone());
        }
        prev = Some(time);
        if let Some((until, preempted)) = sample.off_cpu.filter(|&(until, _)| until > time) {
            // The next sample's boundary is reckoned from when the thread ran again.
            events.push(StackEvent::OffCpu {
                start: time,
                end: until,
                preempted,
            });
            prev = Some(until);
        }
    }
    if let Some(last) = prev {
        let end = last.saturating_add(period_ns);
        events.extend(open.iter().map(|_| StackEvent::End { ts: end }));
    }
    events
}

#[cfg(test)]
mod tests {
    use super::{StackEvent, StackSample, slices};

    fn sample(time_ns: u64, frames: &[&'static str]) -> StackSample<&'static str> {
        StackSample {
            time_ns,
            frames: frames.to_vec(),
            off_cpu: None,
        }
    }

    /// The events as text: `+name@ts` and `-@ts`.
    fn run(samples: &[StackSample<&'static str>], period: u64) -> Vec<String> {
        slices(samples, period, |a, b| a == b)
            .into_iter()
            .map(|e| match e {
                StackEvent::Begin { ts, frame } => format!("+{frame}@{ts}"),
                StackEvent::End { ts } => format!("-@{ts}"),
                StackEvent::Gap { start, end } => format!("gap@{start}-{end}"),
                StackEvent::OffCpu { start, end, .. } => format!("off@{start}-{end}"),
            })
            .collect()
    }

    /// Every End closes a Begin, and nothing stays open.
    fn assert_nested(events: &[String]) {
        let mut depth = 0i32;
        for e in events
            .iter()
            .filter(|e| !e.starts_with("gap") && !e.starts_with("off"))
        {
            depth += if e.starts_with('+') { 1 } else { -1 };
            assert!(depth >= 0, "{events:?}");
        }
        assert_eq!(depth, 0, "{events:?}");
    }

    #[test]
    fn single_sample_lasts_one_period() {
        let ev = run(&[sample(100, &["main", "work"])], 10);
        assert_eq!(ev, ["+main@100", "+work@100", "-@110", "-@110"]);
    }

    #[test]
    fn nesting_frames_end_at_the_midpoint() {
        let ev = run(
            &[
                sample(100, &["main", "a", "b"]),
                sample(110, &["main", "a", "b"]),
                sample(120, &["main", "a"]),
                sample(130, &["main"]),
            ],
            10,
        );
        assert_eq!(
            ev,
            ["+main@100", "+a@100", "+b@100", "-@115", "-@125", "-@140"]
        );
        assert_nested(&ev);
    }

    #[test]
    fn a_change_at_depth_two_keeps_depth_one() {
        let ev = run(
            &[
                sample(0, &["main", "loop", "read"]),
                sample(10, &["main", "loop", "parse"]),
                sample(20, &["main", "loop", "read"]),
            ],
            10,
        );
        assert_eq!(
            ev,
            [
                "+main@0", "+loop@0", "+read@0", "-@5", "+parse@5", "-@15", "+read@15", "-@30",
                "-@30", "-@30"
            ]
        );
        assert_nested(&ev);
    }

    #[test]
    fn recursion_is_one_slice_per_depth() {
        let ev = run(
            &[
                sample(0, &["main", "fib", "fib", "fib"]),
                sample(10, &["main", "fib", "fib"]),
                sample(20, &["main", "fib", "fib", "fib"]),
            ],
            10,
        );
        assert_eq!(
            ev,
            [
                "+main@0", "+fib@0", "+fib@0", "+fib@0", "-@5", "+fib@15", "-@30", "-@30", "-@30",
                "-@30"
            ]
        );
        assert_nested(&ev);
    }

    #[test]
    fn a_function_changing_above_ends_everything_below() {
        let ev = run(
            &[
                sample(0, &["main", "a", "x"]),
                sample(10, &["main", "b", "x"]),
            ],
            10,
        );
        assert_eq!(
            ev,
            [
                "+main@0", "+a@0", "+x@0", "-@5", "-@5", "+b@5", "+x@5", "-@20", "-@20", "-@20"
            ]
        );
    }

    #[test]
    fn after_a_gap_slices_end_one_period_after_the_last_sample() {
        let ev = run(
            &[sample(0, &["main", "a"]), sample(100, &["main", "b"])],
            10,
        );
        assert_eq!(
            ev,
            [
                "+main@0",
                "+a@0",
                "-@10",
                "gap@10-100",
                "+b@100",
                "-@110",
                "-@110"
            ]
        );
    }

    #[test]
    fn a_function_that_returned_before_a_sleep_ends_before_it() {
        // handle ran at 0 and 10; at 15 the thread slept in nanosleep (called from the
        // loop), ran again at 5000, and handle ran again at 5010.
        let mut out = sample(15, &["main", "loop", "nanosleep"]);
        out.off_cpu = Some((5000, false));
        let ev = run(
            &[
                sample(0, &["main", "loop", "handle"]),
                sample(10, &["main", "loop", "handle"]),
                out,
                sample(5010, &["main", "loop", "handle"]),
            ],
            10,
        );
        assert_eq!(
            ev,
            [
                "+main@0",
                "+loop@0",
                "+handle@0",
                "-@12",
                "+nanosleep@12",
                "off@15-5000",
                "-@5005",
                "+handle@5005",
                "-@5020",
                "-@5020",
                "-@5020"
            ]
        );
        assert_nested(&ev);
    }

    #[test]
    fn a_function_that_slept_spans_the_sleep() {
        let mut out = sample(20, &["main", "handle", "read"]);
        out.off_cpu = Some((900, true));
        let ev = run(
            &[
                sample(10, &["main", "handle"]),
                out,
                sample(905, &["main", "handle"]),
            ],
            10,
        );
        assert_eq!(
            ev,
            [
                "+main@10",
                "+handle@10",
                "+read@15",
                "off@20-900",
                "-@902",
                "-@915",
                "-@915"
            ]
        );
    }

    #[test]
    fn empty_stacks_and_no_samples() {
        assert!(run(&[], 10).is_empty());
        let ev = run(
            &[sample(0, &["main"]), sample(10, &[]), sample(20, &["main"])],
            10,
        );
        assert_eq!(ev, ["+main@0", "-@5", "+main@15", "-@30"]);
    }
}
