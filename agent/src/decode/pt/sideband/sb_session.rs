//! ptxed's perf sideband session: process images built from MMAP records and switched
//! as the trace reaches exec, fork and context-switch records.
//!
//! In: the sideband streams (primary: the traced CPU's; secondary: other CPUs', which
//! only add mappings), the kernel's image (`--pevent:kcore`), a [`SectionLoader`] for the
//! files records map, and every event of the trace in order. Out: the records printed
//! as ptxed prints them (`--sb:*`), sideband errors (and warnings with `--sb:warn`),
//! `[context: pid-N]` on switches (`--sb:switch`), and per event a [`Change`] telling the
//! decoder which image to use now. Follows libipt's sideband library: a record is
//! applied once the trace's time reaches it, and a context switch it asks for waits
//! until the trace is (likely) in the kernel, where switches happen.

use std::fmt;
use std::sync::Arc;

use super::pevent::{
    Fetched, SidebandCursor, SidebandFlags, SidebandStream, insert_position, write_diagnostic,
};
use super::pevent_body::RecordBody;
use super::sb_context::{Abi, Context, Contexts, LoadError, SectionLoader};
use super::sb_location::Location;
use crate::decode::pt::events::event::Event;
use crate::decode::pt::flow::image::Image;

/// How the session prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionOutput {
    /// Which parts of each record to print (`--sb:*`).
    pub flags: SidebandFlags,
    /// Print warnings, not only errors (`--sb:warn`).
    pub warnings: bool,
    /// Print the new context's name on a switch (`--sb:switch`).
    pub switches: bool,
}

/// A record a stream cannot go on after; the stream is dropped. Messages are libipt's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// A fork record of a new process whose first thread is not the process.
    #[error("internal error")]
    Internal,
    /// A switch-in record without the pid sample it needs.
    #[error("bad configuration")]
    BadConfig,
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// What the session could not use, but went on without.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Warning {
    /// A `PERF_RECORD_LOST`.
    SidebandLost,
    /// An AUX record flagged truncated.
    TraceLost,
    /// A mapping of something that is not a file (`//anon`, a deleted file, `[heap]` ...).
    SectionLost,
    /// `[vdso]` without the matching `--pevent:vdso-*` file (libipt reports it as an error).
    NoVdso,
}

impl Warning {
    fn text(self) -> &'static str {
        match self {
            Self::SidebandLost => "sideband lost",
            Self::TraceLost => "trace lost",
            Self::SectionLost => "image section lost",
            Self::NoVdso => "bad configuration",
        }
    }
}

/// What an event changed for the decoder.
#[derive(Debug, Default)]
pub struct Change {
    /// Decode from this context's image from now on.
    pub switch_to: Option<Arc<Context>>,
    /// Some image got a new mapping (code the decoder cached may be gone).
    pub mapped: bool,
}

/// A stream and what it has asked for.
struct Stream<'a> {
    cursor: SidebandCursor<'a>,
    /// The stream's records are all applied (libipt's retired decoders).
    exhausted: bool,
    /// The context this stream switched to last, and the one it waits to switch to.
    context: Option<Arc<Context>>,
    next_context: Option<Arc<Context>>,
    location: Location,
}

/// What every stream works on.
struct Shared<'a> {
    contexts: Contexts,
    loader: &'a dyn SectionLoader,
    output: SessionOutput,
}

/// The sideband streams and the processes they describe.
pub struct Session<'a> {
    /// Streams with records left, ordered by the time of their next one.
    active: Vec<Stream<'a>>,
    /// Streams without records left that may still have a switch pending.
    retired: Vec<Stream<'a>>,
    shared: Shared<'a>,
}

impl<'a> Session<'a> {
    /// Reads the first record of each stream; read errors are printed to `out`.
    pub fn new(
        streams: Vec<SidebandStream<'a>>,
        kernel: Image,
        loader: &'a dyn SectionLoader,
        output: SessionOutput,
        out: &mut dyn fmt::Write,
    ) -> Result<Self, fmt::Error> {
        let mut session = Self {
            active: Vec::new(),
            retired: Vec::new(),
            shared: Shared {
                contexts: Contexts::new(kernel),
                loader,
                output,
            },
        };
        // libipt starts the streams last-given first.
        for stream in streams.into_iter().rev() {
            let mut cursor = SidebandCursor::new(stream);
            if cursor.fetch_reporting(out)? == Fetched::Record {
                session.insert(Stream {
                    cursor,
                    exhausted: false,
                    context: None,
                    next_context: None,
                    location: Location::Unknown,
                });
            }
        }
        Ok(session)
    }

    fn insert(&mut self, stream: Stream<'a>) {
        let at = insert_position(&self.active, stream.cursor.tsc, |s| s.cursor.tsc);
        self.active.insert(at, stream);
    }

    /// Applies the records due at `event`'s time, then lets every stream see the event
    /// (to place pending context switches).
    pub fn on_event(
        &mut self,
        event: &Event,
        out: &mut dyn fmt::Write,
    ) -> Result<Change, fmt::Error> {
        let mut change = Change::default();
        while self
            .active
            .first()
            .is_some_and(|s| s.cursor.tsc <= event.tsc)
        {
            let mut stream = self.active.remove(0);
            stream.cursor.print_current(self.shared.output.flags, out)?;
            if let Err(err) = stream.apply_record(&mut self.shared, &mut change, out)? {
                stream.report(&err.to_string(), true, out)?;
                continue;
            }
            match stream.cursor.fetch_reporting(out)? {
                Fetched::Record => self.insert(stream),
                Fetched::End => {
                    stream.exhausted = true;
                    // Newest first, as libipt keeps them.
                    self.retired.insert(0, stream);
                }
                Fetched::Failed => {}
            }
        }
        for list in [&mut self.active, &mut self.retired] {
            let mut i = 0;
            while let Some(stream) = list.get_mut(i) {
                if stream.track(event, &self.shared, &mut change, out)? {
                    i += 1;
                } else {
                    list.remove(i);
                }
            }
        }
        Ok(change)
    }
}

impl Stream<'_> {
    fn primary(&self) -> bool {
        self.cursor.stream.primary
    }

    /// Prints a diagnostic at the current record (warnings only with `--sb:warn`).
    fn report(&self, what: &str, error: bool, out: &mut dyn fmt::Write) -> fmt::Result {
        let offset = self.cursor.current.as_ref().map_or(0, |(_, at)| *at);
        write_diagnostic(out, &self.cursor.stream.name, offset, error, what)
    }

    fn warn(&self, warning: Warning, shared: &Shared<'_>, out: &mut dyn fmt::Write) -> fmt::Result {
        let error = warning == Warning::NoVdso;
        if error || shared.output.warnings {
            self.report(warning.text(), error, out)?;
        }
        Ok(())
    }

    /// Applies the current record. The outer error is output's, the inner one ends the
    /// stream.
    fn apply_record(
        &mut self,
        shared: &mut Shared<'_>,
        change: &mut Change,
        out: &mut dyn fmt::Write,
    ) -> Result<Result<(), SessionError>, fmt::Error> {
        let Some((record, _)) = &self.cursor.current else {
            return Ok(Ok(()));
        };
        let sample_pid = record.samples.pid_tid.map(|(pid, _)| pid);
        let Some(body) = RecordBody::of(record) else {
            return Ok(Ok(()));
        };
        let primary = self.primary();
        match body {
            // Secondary streams (other CPUs) do not decide what this CPU runs.
            RecordBody::ItraceStart { pid } if primary => {
                self.prepare_switch(shared.contexts.get(pid));
                // Tracing just started: no reason to wait for a better place.
                self.switch(shared, change, out)?;
            }
            RecordBody::Fork { pid, ppid, tid } if ppid != pid => {
                // A new process (a new thread needs nothing): its first thread is it.
                if pid != tid {
                    return Ok(Err(SessionError::Internal));
                }
                shared.contexts.replace(pid, Some(ppid));
            }
            RecordBody::Comm { pid, exec: true } => {
                // A new context, so the old image stays while it is being decoded.
                let context = shared.contexts.replace(pid, None);
                if primary {
                    self.prepare_switch(context);
                }
            }
            RecordBody::Switch { out: false } if primary => {
                let Some(pid) = sample_pid else {
                    return Ok(Err(SessionError::BadConfig));
                };
                self.prepare_switch(shared.contexts.get(pid));
            }
            RecordBody::SwitchCpuWide {
                out: true,
                next_prev_pid,
            } if primary => {
                self.prepare_switch(shared.contexts.get(next_prev_pid));
            }
            RecordBody::SwitchCpuWide { out: false, .. } if primary => {
                if let Some(pid) = sample_pid {
                    self.prepare_switch(shared.contexts.get(pid));
                }
            }
            // Kernel mappings are left to the kernel core dump: the kernel and its
            // modules change when they are loaded, their files do not.
            RecordBody::Mmap {
                pid,
                addr,
                len,
                pgoff,
                filename,
                kernel: false,
            } => {
                if let Err(err) = self.map(shared, pid, &filename, pgoff, len, addr, out)? {
                    return Ok(Err(err));
                }
                change.mapped = true;
            }
            RecordBody::Lost => self.warn(Warning::SidebandLost, shared, out)?,
            RecordBody::Aux { truncated: true } if primary => {
                self.warn(Warning::TraceLost, shared, out)?;
            }
            _ => {}
        }
        Ok(Ok(()))
    }

    /// Maps `len` bytes of `filename` from `pgoff` at `addr` into `pid`'s image.
    #[expect(clippy::too_many_arguments, reason = "the fields of an MMAP record")]
    fn map(
        &self,
        shared: &mut Shared<'_>,
        pid: u32,
        filename: &str,
        pgoff: u64,
        len: u64,
        addr: u64,
        out: &mut dyn fmt::Write,
    ) -> Result<Result<(), SessionError>, fmt::Error> {
        let context = shared.contexts.get(pid);
        let config = &self.cursor.stream.config;
        let path = if filename.starts_with('[') {
            if filename != "[vdso]" {
                self.warn(Warning::SectionLost, shared, out)?;
                return Ok(Ok(()));
            }
            let vdso = match context.abi() {
                Abi::Unknown => None,
                Abi::X64 => config.vdso_x64.clone(),
                Abi::X32 => config.vdso_x32.clone(),
                Abi::Ia32 => config.vdso_ia32.clone(),
            };
            let Some(vdso) = vdso else {
                self.warn(Warning::NoVdso, shared, out)?;
                return Ok(Ok(()));
            };
            vdso
        } else if filename == "//anon" || filename.contains(" (deleted)") {
            // JIT code and files deleted since: nothing to read the code from.
            self.warn(Warning::SectionLost, shared, out)?;
            return Ok(Ok(()));
        } else if let Some(root) = &config.sysroot {
            format!("{root}{filename}")
        } else {
            filename.to_owned()
        };
        if context.abi() == Abi::Unknown
            && let Ok(header) = shared.loader.load(&path, 0, 64)
        {
            context.set_abi(Abi::of_elf(&header));
        }
        match shared.loader.load(&path, pgoff, len) {
            Ok(bytes) => {
                context.map(&path, bytes, addr);
                Ok(Ok(()))
            }
            Err(err) => Ok(Err(err.into())),
        }
    }

    /// Makes `context` the one to switch to at the next suitable event.
    fn prepare_switch(&mut self, context: Arc<Context>) {
        if self
            .next_context
            .as_ref()
            .is_some_and(|next| Arc::ptr_eq(next, &context))
        {
            return;
        }
        // A later switch overrides one still pending (timing is imprecise, and decoding
        // may have skipped trace after an error).
        self.next_context = None;
        if self
            .context
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, &context))
        {
            return;
        }
        self.next_context = Some(context);
    }

    /// Switches to the pending context, if any.
    fn switch(
        &mut self,
        shared: &Shared<'_>,
        change: &mut Change,
        out: &mut dyn fmt::Write,
    ) -> fmt::Result {
        let Some(next) = self.next_context.take() else {
            return Ok(());
        };
        if shared.output.switches {
            writeln!(out, "[context: {}]", next.name())?;
        }
        change.switch_to = Some(Arc::clone(&next));
        self.context = Some(next);
        Ok(())
    }

    /// Follows the trace's location and switches where a pending switch fits; false
    /// when the stream has nothing left to do.
    fn track(
        &mut self,
        event: &Event,
        shared: &Shared<'_>,
        change: &mut Change,
        out: &mut dyn fmt::Write,
    ) -> Result<bool, fmt::Error> {
        let before = self.location;
        self.location = before.after(event, self.cursor.stream.config.kernel_start);
        if self.next_context.is_none() {
            return Ok(!self.exhausted);
        }
        // Switch in the kernel, or where nobody knows (like just before tracing is
        // enabled again).
        if before.allows_switch() || self.location.allows_switch() {
            self.switch(shared, change, out)?;
        }
        Ok(true)
    }
}

#[cfg(test)]
#[path = "sb_session_tests.rs"]
mod tests;
