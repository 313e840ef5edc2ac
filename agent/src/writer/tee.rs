//! A sink that feeds the trigger thread's events to the report collector on their way to
//! the encoder, so one pass over a snapshot yields both the trace and its report.
//!
//! In: [`TraceSink`] calls. Out: the same calls to the inner sink, and
//! [`Tee::report`] for the snapshot's trigger. Why a tee: the report reads the slices
//! exactly as the trace shows them, without a second decode.

use std::io;

use super::{Arg, ArgValue, TraceSink, TraceSummary};
use crate::report::{Collector, Options, Report, TriggerInfo};
use crate::snapshot::{Snapshot, TriggerMeta};

/// Forwards to `inner`, collecting the trigger thread's slices.
pub(super) struct Tee<'a, S: TraceSink> {
    inner: &'a mut S,
    collector: Option<Collector>,
    /// The report's call tree depth.
    depth: usize,
}

/// The report's view of a snapshot's trigger; `stack`: its functions, outermost first.
fn info(t: &TriggerMeta, stack: Vec<String>) -> TriggerInfo {
    TriggerInfo {
        rule: t.rule.clone(),
        kind: t.kind.clone(),
        detail: t.detail.clone(),
        pid: t.pid,
        tid: t.tid,
        comm: t.comm.clone(),
        time_ns: t.trigger_time_ns,
        duration_ns: t.duration_ns,
        stack,
    }
}

impl<'a, S: TraceSink> Tee<'a, S> {
    /// A tee for `snap`: collects when its trigger names a thread, over the interval
    /// `options` make of it.
    pub(super) fn new(inner: &'a mut S, snap: &Snapshot, options: Options) -> Self {
        let collector = snap.meta.trigger.as_ref().filter(|t| t.pid != 0).map(|t| {
            Collector::new(
                (t.pid, t.tid),
                info(t, Vec::new()).interval(options.window_ns),
            )
        });
        Self {
            inner,
            collector,
            depth: options.depth,
        }
    }

    /// The report of the snapshot's trigger over what was collected; the trigger stack's
    /// names from `summary`.
    pub(super) fn report(&self, snap: &Snapshot, summary: &TraceSummary) -> Option<Report> {
        let collector = self.collector.as_ref()?;
        let t = snap.meta.trigger.as_ref()?;
        let mut stack: Vec<String> = summary
            .trigger_stack
            .iter()
            .rev()
            .map(|f| f.function.clone())
            .collect();
        // Fired while the call ran: the stack goes on below the probed function (where
        // the call was at the look); the report's call ends at its innermost frame.
        if let Some(call) = &summary.call_name
            && let Some(at) = stack.iter().rposition(|f| f == call)
        {
            stack.truncate(at + 1);
        }
        Some(collector.report(&info(t, stack), self.depth))
    }
}

/// The string arg `name` of `args`.
fn str_arg<'a>(args: &'a [Arg<'_>], name: &str) -> Option<&'a str> {
    args.iter()
        .find(|a| a.name == name)
        .and_then(|a| match a.value {
            ArgValue::Str(s) => Some(s),
            _ => None,
        })
}

impl<S: TraceSink> TraceSink for Tee<'_, S> {
    fn process(&mut self, pid: u32, name: &str) -> io::Result<()> {
        self.inner.process(pid, name)
    }

    fn thread(&mut self, pid: u32, tid: u32, name: &str) -> io::Result<()> {
        self.inner.thread(pid, tid, name)
    }

    fn begin(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        if let Some(c) = self.collector.as_mut() {
            let preempted = str_arg(args, "reason") == Some("preempted");
            c.begin(thread, ts, name, str_arg(args, "module"), preempted);
        }
        self.inner.begin(thread, ts, name, args)
    }

    fn end(&mut self, thread: (u32, u32), ts: u64, name: &str) -> io::Result<()> {
        if let Some(c) = self.collector.as_mut() {
            c.end(thread, ts);
        }
        self.inner.end(thread, ts, name)
    }

    fn instant(
        &mut self,
        thread: (u32, u32),
        ts: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> io::Result<()> {
        self.inner.instant(thread, ts, name, args)
    }

    fn finish(&mut self) -> io::Result<()> {
        self.inner.finish()
    }
}

/// A sink that keeps nothing (a report without a trace file).
pub(super) struct NullSink;

impl TraceSink for NullSink {
    fn process(&mut self, _: u32, _: &str) -> io::Result<()> {
        Ok(())
    }

    fn thread(&mut self, _: u32, _: u32, _: &str) -> io::Result<()> {
        Ok(())
    }

    fn begin(&mut self, _: (u32, u32), _: u64, _: &str, _: &[Arg<'_>]) -> io::Result<()> {
        Ok(())
    }

    fn end(&mut self, _: (u32, u32), _: u64, _: &str) -> io::Result<()> {
        Ok(())
    }

    fn instant(&mut self, _: (u32, u32), _: u64, _: &str, _: &[Arg<'_>]) -> io::Result<()> {
        Ok(())
    }

    fn finish(&mut self) -> io::Result<()> {
        Ok(())
    }
}
