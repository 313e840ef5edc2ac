//! `ptxed`-compatible text of the instruction flow, for debugging the decoder.
//!
//! In: trace bytes, an [`ImageProvider`] with the code, [`PtxedOptions`], and optionally
//! perf sideband ([`Sideband`]). Out: the text Intel's `ptxed --no-inst` prints for the
//! same input: one line per executed instruction address (`? ` marks speculative ones),
//! `[event]` lines (`[enabled]`, `[disabled]`, `[interrupt]`, `[overflow]`,
//! `[exec mode: 64-bit]` ...), errors as `[offset, ip: error: why]`, `[block]` markers
//! and statistics on request, and the sideband records as the trace passes them. It
//! drives a [`BlockDecoder`] exactly like ptxed drives libipt's block decoder (sync,
//! drain events, next block, resync on error), and hands every event to the sideband
//! session, which may switch the decoder to another process's image; so it is checked
//! against libipt's corpus.

use std::fmt::{self, Write as _};

use super::ptxed_opts::PtxedOptions;
use crate::decode::pt::events::event::{Event, EventKind, FlowError};
use crate::decode::pt::flow::block::{Block, BlockDecoder, Status};
use crate::decode::pt::flow::image::{Image, ImageProvider};
use crate::decode::pt::flow::insn;
use crate::decode::pt::packets::cpu::Errata;
use crate::decode::pt::packets::packet::ExecMode;
use crate::decode::pt::sideband::pevent::SidebandStream;
use crate::decode::pt::sideband::sb_context::{ActiveImage, SectionLoader};
use crate::decode::pt::sideband::sb_session::{Session, SessionOutput};

/// Errors in a row without trace progress after which a segment is given up.
const MAX_REPEATED_ERRORS: u32 = 16;

/// Counts ptxed reports with `--stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PtxedStats {
    pub insn: u64,
    pub blocks: u64,
}

/// Perf sideband for [`ptxed_with_sideband`] (`--pevent:*`).
pub struct Sideband<'a> {
    /// The loaded sideband files, in command-line order.
    pub streams: Vec<SidebandStream<'a>>,
    /// The kernel's code (`--pevent:kcore`), part of every process's image.
    pub kernel: Image,
    /// Reads the files MMAP records map.
    pub loader: &'a dyn SectionLoader,
}

/// Writes the ptxed text for `trace` to `out`; returns the statistics.
pub fn ptxed(
    trace: &[u8],
    image: &dyn ImageProvider,
    opts: &PtxedOptions,
    out: &mut impl fmt::Write,
) -> Result<PtxedStats, fmt::Error> {
    ptxed_with_sideband(trace, image, None, opts, out)
}

/// [`ptxed`] with perf sideband: `image` (the `--raw` code) is decoded until the
/// sideband switches to a process, then that process's image.
pub fn ptxed_with_sideband(
    trace: &[u8],
    image: &dyn ImageProvider,
    sideband: Option<Sideband<'_>>,
    opts: &PtxedOptions,
    out: &mut impl fmt::Write,
) -> Result<PtxedStats, fmt::Error> {
    let mut flow = opts.flow;
    if let Some(cpu) = opts.cpu {
        match Errata::for_cpu(cpu) {
            Ok(errata) => flow.events.timing.errata = errata,
            Err(_) => writeln!(out, "[0, 0: config error: {}]", FlowError::BadCpu)?,
        }
    }
    let session = match sideband {
        Some(sideband) => {
            let output = SessionOutput {
                flags: opts.sideband.sideband,
                warnings: opts.sideband.sideband_warnings,
                switches: opts.print_switches,
            };
            Some(Session::new(
                sideband.streams,
                sideband.kernel,
                sideband.loader,
                output,
                out,
            )?)
        }
        None => None,
    };
    let active = ActiveImage::new(image);
    let mut run = Run {
        dec: BlockDecoder::new(trace, &active, flow),
        image: &active,
        session,
        opts,
        out,
        stats: PtxedStats::default(),
        time: 0,
    };
    run.decode()?;
    let stats = run.stats;
    if opts.print_stats {
        if opts.stat_insn {
            writeln!(out, "insn: {}.", stats.insn)?;
        }
        if opts.stat_blocks {
            writeln!(out, "blocks:\t{}.", stats.blocks)?;
        }
    }
    Ok(stats)
}

/// The name ptxed prints for an execution mode.
pub fn exec_mode_name(mode: ExecMode) -> &'static str {
    match mode {
        ExecMode::Bits16 => "16-bit",
        ExecMode::Bits32 => "32-bit",
        ExecMode::Bits64 => "64-bit",
        ExecMode::Unknown => "<unknown>",
    }
}

struct Run<'a, 'o, W: fmt::Write> {
    dec: BlockDecoder<'a>,
    /// What `dec` reads; the sideband session switches what it shows.
    image: &'a ActiveImage<'a>,
    session: Option<Session<'a>>,
    opts: &'o PtxedOptions,
    out: &'o mut W,
    stats: PtxedStats,
    /// The time of the last event, for `--time`.
    time: u64,
}

/// How a decode segment ended.
enum End {
    /// The trace ended: stop.
    Done,
    /// An error: sync again (or resync).
    Error(FlowError),
}

impl<W: fmt::Write> Run<'_, '_, W> {
    fn decode(&mut self) -> fmt::Result {
        let mut sync = 0usize;
        let mut synced: Option<usize> = None;
        loop {
            let status = match self.dec.sync_forward() {
                Ok(status) => {
                    // Never decode the same segment twice (errors inside PSB+ could
                    // otherwise bring us back to it).
                    let at = self.dec.sync_offset();
                    if synced.is_some_and(|last| at <= last) {
                        return Ok(());
                    }
                    synced = Some(at);
                    status
                }
                Err(FlowError::Eos) => return Ok(()),
                Err(err) => {
                    self.diagnose(0, "sync error", err)?;
                    // Give up unless the decoder made progress.
                    let offset = self.dec.offset();
                    if offset <= sync {
                        return Ok(());
                    }
                    sync = offset;
                    continue;
                }
            };
            if !self.segment(status)? {
                return Ok(());
            }
        }
    }

    /// Decodes from a sync point; false when the whole trace is done.
    fn segment(&mut self, mut status: Status) -> Result<bool, fmt::Error> {
        let mut block = Block::default();
        // Errors that keep coming back at the same place end the segment.
        let mut repeats = (usize::MAX, 0u32);
        loop {
            match self.blocks(status, &mut block)? {
                End::Done => return Ok(false),
                End::Error(err) => {
                    self.diagnose_block("error", err, &block)?;
                    if !self.opts.resync_on_error {
                        return Ok(true);
                    }
                    let offset = self.dec.offset();
                    repeats = if offset > repeats.0 || repeats.0 == usize::MAX {
                        (offset, 0)
                    } else {
                        (repeats.0, repeats.1 + 1)
                    };
                    if repeats.1 > MAX_REPEATED_ERRORS {
                        return Ok(true);
                    }
                    match self.resync() {
                        Ok(resynced) => {
                            status = resynced?;
                            if status.ip_suppressed && !self.opts.quiet {
                                writeln!(self.out, "[disabled]")?;
                            }
                        }
                        Err(err) => {
                            self.diagnose_block("resync error", err, &block)?;
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }

    fn resync(&mut self) -> Result<Result<Status, fmt::Error>, FlowError> {
        loop {
            match self.dec.resync() {
                Ok(status) => return Ok(Ok(status)),
                Err(FlowError::EventIgnored) => match self.one_event() {
                    Ok(Ok(_)) => {}
                    Ok(Err(fmt)) => return Ok(Err(fmt)),
                    Err(err) => return Err(err),
                },
                Err(err) => return Err(err),
            }
        }
    }

    fn blocks(&mut self, mut status: Status, block: &mut Block) -> Result<End, fmt::Error> {
        // Code that loops without producing trace (only in corrupt traces) would keep
        // us here forever: give up on the segment after too many such instructions.
        let mut stalled = (usize::MAX, 0u64);
        loop {
            while status.event_pending {
                status = match self.one_event() {
                    Ok(status) => status?,
                    Err(FlowError::Eos) => return Ok(End::Done),
                    Err(err) => return Ok(End::Error(err)),
                };
            }
            if status.eos {
                if !status.ip_suppressed && !self.opts.quiet {
                    writeln!(self.out, "[end of trace]")?;
                }
                return Ok(End::Done);
            }
            let offset = self.dec.offset();
            let (next, result) = self.dec.next_block();
            *block = next;
            self.stats.insn += u64::from(block.ninsn);
            self.stats.blocks += 1;
            if !self.opts.quiet {
                self.print_block(block, offset)?;
            }
            status = match result {
                Ok(status) => status,
                Err(FlowError::Eos) => return Ok(End::Done),
                Err(err) => return Ok(End::Error(err)),
            };
            if offset == stalled.0 && !status.event_pending {
                stalled.1 += u64::from(block.ninsn) + 1;
                if stalled.1 > crate::decode::pt::flow::branches::MAX_STALLED_INSNS {
                    return Ok(End::Error(FlowError::NoSync));
                }
            } else {
                stalled = (offset, 0);
            }
        }
    }

    fn one_event(&mut self) -> Result<Result<Status, fmt::Error>, FlowError> {
        let offset = self.dec.offset();
        let (event, status) = self.dec.next_event()?;
        self.time = event.tsc;
        if !self.opts.quiet
            && !event.status_update
            && let Err(err) = self.print_event(&event, offset)
        {
            return Ok(Err(err));
        }
        Ok(self.apply_sideband(&event).map(|()| status))
    }

    /// Lets the sideband session see `event`; decodes from the image it says from now.
    fn apply_sideband(&mut self, event: &Event) -> fmt::Result {
        let Some(session) = &mut self.session else {
            return Ok(());
        };
        let change = session.on_event(event, self.out)?;
        let switched = change.switch_to.is_some();
        if let Some(context) = change.switch_to {
            self.image.switch_to(context);
        }
        // Code the decoder cached may have changed under it.
        if switched || change.mapped {
            self.dec.set_image(self.image);
        }
        Ok(())
    }

    fn diagnose(&mut self, ip: u64, what: &str, err: FlowError) -> fmt::Result {
        let offset = self.dec.offset();
        writeln!(self.out, "[{offset:x}, {ip:x}: {what}: {err}]")
    }

    /// Reports an error at the instruction after the block, where it can be told.
    fn diagnose_block(&mut self, what: &str, err: FlowError, block: &Block) -> fmt::Result {
        let mut ip = block.ip;
        if block.ninsn != 0 {
            ip = block.end_ip;
            if err != FlowError::BadQuery
                && let Some(next) = self.next_ip(block, block.end_ip)
            {
                ip = next;
            }
        }
        self.diagnose(ip, what, err)
    }

    /// The instruction after the one at `ip` (its branch target for direct branches).
    fn next_ip(&self, block: &Block, ip: u64) -> Option<u64> {
        let insn = if ip == block.end_ip && block.truncated {
            let image = Image::new();
            let mut one = image;
            one.add("", block.raw[..usize::from(block.size)].to_vec(), ip);
            insn::decode(&one, ip, block.mode).ok()?
        } else {
            insn::decode(self.image, ip, block.mode).ok()?
        };
        Some(
            insn.end()
                .wrapping_add_signed(insn.displacement.unwrap_or(0)),
        )
    }

    fn print_block(&mut self, block: &Block, offset: usize) -> fmt::Result {
        if self.opts.show_blocks {
            if self.opts.print_stats {
                writeln!(self.out, "[block {:x}]", self.stats.blocks)?;
            } else {
                writeln!(self.out, "[block]")?;
            }
        }
        let mut ip = block.ip;
        for left in (0..block.ninsn).rev() {
            if self.opts.print_offset {
                write!(self.out, "{offset:016x}  ")?;
            }
            if self.opts.print_time {
                write!(self.out, "{:016x}  ", self.time)?;
            }
            if block.speculative {
                write!(self.out, "? ")?;
            }
            writeln!(self.out, "{ip:016x}")?;
            if left == 0 {
                break;
            }
            let Some(next) = self.next_ip(block, ip) else {
                self.diagnose(ip, "reconstruct error", FlowError::BadInsn)?;
                return Ok(());
            };
            ip = next;
        }
        if block.ninsn != 0 && ip != block.end_ip {
            self.diagnose(ip, "reconstruct error", FlowError::NoSync)?;
        }
        Ok(())
    }

    fn print_event(&mut self, event: &Event, offset: usize) -> fmt::Result {
        let mut text = String::from("[");
        if self.opts.print_offset {
            let _ = write!(text, "{offset:016x}  ");
        }
        if self.opts.print_event_time && event.has_tsc {
            let _ = write!(text, "{:016x}  ", event.tsc);
        }
        event_text(event, self.opts.print_event_ip, &mut text);
        text.push(']');
        writeln!(self.out, "{text}")
    }
}

/// An event as ptxed prints it (without brackets).
#[expect(
    clippy::too_many_lines,
    reason = "one arm per event type, each its ptxed format; splitting hides the table"
)]
pub fn event_text(event: &Event, with_ip: bool, text: &mut String) {
    let ip = |text: &mut String, ip: u64| {
        if with_ip && !event.ip_suppressed {
            let _ = write!(text, ", ip: {ip:016x}");
        }
    };
    match event.kind {
        EventKind::Enabled { ip: at, resumed } => {
            text.push_str(if resumed { "resumed" } else { "enabled" });
            if with_ip {
                let _ = write!(text, ", ip: {at:016x}");
            }
        }
        EventKind::Disabled { ip: at } => {
            text.push_str("disabled");
            ip(text, at);
        }
        EventKind::AsyncDisabled { at, ip: to } => {
            text.push_str("disabled");
            if with_ip {
                let _ = write!(text, ", at: {at:016x}");
                ip(text, to);
            }
        }
        EventKind::AsyncBranch { from, to } => {
            text.push_str("interrupt");
            if with_ip {
                let _ = write!(text, ", from: {from:016x}");
                if !event.ip_suppressed {
                    let _ = write!(text, ", to: {to:016x}");
                }
            }
        }
        EventKind::Paging { cr3, non_root } => {
            let _ = write!(
                text,
                "paging, cr3: {cr3:016x}{}",
                if non_root { ", nr" } else { "" }
            );
        }
        EventKind::AsyncPaging {
            cr3,
            non_root,
            ip: at,
        } => {
            let _ = write!(
                text,
                "paging, cr3: {cr3:016x}{}",
                if non_root { ", nr" } else { "" }
            );
            if with_ip {
                let _ = write!(text, ", ip: {at:016x}");
            }
        }
        EventKind::Overflow { ip: at } => {
            text.push_str("overflow");
            ip(text, at);
        }
        EventKind::ExecMode { mode, ip: at } => {
            let _ = write!(text, "exec mode: {}", exec_mode_name(mode));
            ip(text, at);
        }
        EventKind::Tsx {
            speculative,
            aborted,
            ip: at,
        } => {
            text.push_str(if aborted {
                "aborted"
            } else if speculative {
                "begin transaction"
            } else {
                "committed"
            });
            ip(text, at);
        }
        EventKind::Stop => text.push_str("stopped"),
        EventKind::Vmcs { base } => {
            let _ = write!(text, "vmcs, base: {base:016x}");
        }
        EventKind::AsyncVmcs { base, ip: at } => {
            let _ = write!(text, "vmcs, base: {base:016x}");
            if with_ip {
                let _ = write!(text, ", ip: {at:016x}");
            }
        }
        EventKind::Exstop { ip: at } => {
            text.push_str("exstop");
            ip(text, at);
        }
        EventKind::Mwait { hints, ext, ip: at } => {
            let _ = write!(text, "mwait {hints:x} {ext:x}");
            ip(text, at);
        }
        EventKind::Pwre {
            state,
            sub_state,
            hw,
        } => {
            let _ = write!(
                text,
                "pwre c{}.{}{}",
                (state + 1) & 0xf,
                (sub_state + 1) & 0xf,
                if hw { " hw" } else { "" }
            );
        }
        EventKind::Pwrx {
            last,
            deepest,
            interrupt,
            store,
            autonomous,
        } => {
            text.push_str("pwrx ");
            for (on, what) in [(interrupt, "int: "), (store, "st: "), (autonomous, "hw: ")] {
                if on {
                    text.push_str(what);
                }
            }
            let _ = write!(text, "c{} (c{})", (last + 1) & 0xf, (deepest + 1) & 0xf);
        }
        EventKind::Ptwrite {
            payload, ip: at, ..
        } => {
            let _ = write!(text, "ptwrite: {payload:x}");
            ip(text, at);
        }
        EventKind::Tick { ip: at } => {
            text.push_str("tick");
            ip(text, at);
        }
        EventKind::Cbr { ratio } => {
            let _ = write!(text, "cbr: {ratio:x}");
        }
        EventKind::Mnt { payload } => {
            let _ = write!(text, "mnt: {payload:x}");
        }
        EventKind::Tip { ip: at } => {
            let _ = write!(text, "tip: {at:x}");
        }
        EventKind::Tnt { bits, size } => {
            text.push_str("tnt: ");
            for bit in (0..size).rev() {
                text.push(if bits >> bit & 1 == 1 { '!' } else { '.' });
            }
        }
        EventKind::Iflags { iflag, ip: at } => {
            let _ = write!(
                text,
                "interrupts {}",
                if iflag { "enabled" } else { "disabled" }
            );
            ip(text, at);
        }
        EventKind::Interrupt {
            vector,
            cr2,
            ip: at,
        } => {
            let _ = write!(text, "interrupt {vector}");
            if let Some(cr2) = cr2 {
                let _ = write!(text, ", cr2: {cr2:016x}");
            }
            ip(text, at);
        }
        EventKind::Iret { ip: at } => named(text, "iret", at, &ip),
        EventKind::Smi { ip: at } => named(text, "smi", at, &ip),
        EventKind::Rsm { ip: at } => named(text, "rsm", at, &ip),
        EventKind::Sipi { vector } => {
            let _ = write!(text, "sipi: {vector:x}");
        }
        EventKind::Init { ip: at } => named(text, "init", at, &ip),
        EventKind::Vmentry { ip: at } => named(text, "vmentry", at, &ip),
        EventKind::Vmexit {
            vector,
            vmxr,
            vmxq,
            ip: at,
        } => {
            text.push_str("vmexit");
            if let Some(vector) = vector {
                let _ = write!(text, ", intr: {vector}");
            }
            if let Some(vmxr) = vmxr {
                let _ = write!(text, ", vmxr: {vmxr:016x}");
            }
            if let Some(vmxq) = vmxq {
                let _ = write!(text, ", vmxq: {vmxq:016x}");
            }
            ip(text, at);
        }
        EventKind::Shutdown { ip: at } => named(text, "shutdown", at, &ip),
        EventKind::Uintr { vector, ip: at } => {
            let _ = write!(text, "uintr {vector}");
            ip(text, at);
        }
        EventKind::Uiret { ip: at } => named(text, "uiret", at, &ip),
        EventKind::Trig {
            trbv,
            mult,
            icnt,
            ip: at,
        } => {
            let _ = write!(text, "trig {trbv:02x}");
            if mult {
                text.push_str(", mult");
            }
            ip(text, at);
            if icnt != 0 {
                let _ = write!(text, ", icnt: {icnt}");
            }
        }
        EventKind::Swintr { vector, ip: at } => {
            let _ = write!(text, "swintr {vector}");
            ip(text, at);
        }
        EventKind::Syscall { ip: at } => named(text, "syscall", at, &ip),
        EventKind::Ignore => text.push_str("ignore"),
    }
}

fn named(text: &mut String, name: &str, at: u64, ip: &dyn Fn(&mut String, u64)) {
    text.push_str(name);
    ip(text, at);
}
