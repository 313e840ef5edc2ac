//! `ptdump`-compatible text dump of an Intel PT trace, for debugging the decoder.
//!
//! In: trace bytes, [`PtdumpOptions`] and optionally perf sideband streams. Out: the text
//! Intel's `ptdump` prints for the same input: one line per packet (offset, packet name,
//! payload, and with `--lastip`/`--time`/`--tcal` the tracked IP, time or calibration),
//! `[offset: what: why]` lines for problems, and sideband records placed by time. The
//! output matches libipt's test expectations up to the amount of whitespace; where
//! libipt differs from the SDM (the PWRE hardware bit) the dump follows libipt.

use std::fmt::{self, Write as _};

use super::ptdump_opts::PtdumpOptions;
use crate::decode::pt::packets::cpu::Errata;
use crate::decode::pt::packets::decoder::PacketDecoder;
use crate::decode::pt::packets::last_ip::{LastIp, LastIpError, sign_extend};
use crate::decode::pt::packets::packet::{ExecMode, IpCompression, IpPayload, Packet, Tnt};
use crate::decode::pt::packets::parse::{Decoded, PacketError};
use crate::decode::pt::sideband::pevent::{SidebandSession, SidebandStream};
use crate::decode::pt::timing::clock::{TimeTracker, TrackerOptions};
use crate::decode::pt::timing::time::{FCR_SHIFT, TimeError, TimingConfig};

/// Writes the dump of `trace` to `out`.
pub fn ptdump(trace: &[u8], opts: &PtdumpOptions, out: &mut impl fmt::Write) -> fmt::Result {
    ptdump_with_sideband(trace, Vec::new(), opts, out)
}

/// Like [`ptdump`], with perf sideband records interleaved by time (`--pevent`).
pub fn ptdump_with_sideband(
    trace: &[u8],
    sideband: Vec<SidebandStream<'_>>,
    opts: &PtdumpOptions,
    out: &mut impl fmt::Write,
) -> fmt::Result {
    let out: &mut dyn fmt::Write = out;
    let mut errata = Errata::default();
    if let Some(cpu) = opts.cpu {
        match Errata::for_cpu(cpu) {
            Ok(found) => errata = found,
            Err(_) => diag(out, 0, "failed to determine errata", Some("unknown cpu"))?,
        }
    }
    let have_sideband = !sideband.is_empty();
    let session = if have_sideband {
        Some(SidebandSession::new(sideband, opts.sideband, out)?)
    } else {
        None
    };
    let config = TimingConfig {
        errata,
        ..opts.timing
    };
    let mut dumper = Dumper {
        opts,
        config,
        track_time: opts.track_time(have_sideband),
        out,
        decoder: PacketDecoder::new(trace, errata),
        session,
        state: Tracking::new(config, opts),
    };
    dumper.run()?;
    if let Some(session) = dumper.session.as_mut() {
        session.print_until(u64::MAX, dumper.out)?;
    }
    Ok(())
}

/// Prints a `[offset: what: why]` line.
fn diag(out: &mut dyn fmt::Write, offset: usize, what: &str, why: Option<&str>) -> fmt::Result {
    match why {
        Some(why) => writeln!(out, "[{offset:x}: {what}: {why}]"),
        None => writeln!(out, "[{offset:x}: {what}]"),
    }
}

/// libipt's text for a packet error.
fn packet_errstr(err: &PacketError) -> &'static str {
    match err {
        PacketError::UnknownOpcode { .. } => "unknown opcode",
        PacketError::BadPayload { .. } => "unknown packet",
        PacketError::Truncated { .. } => "reached end of trace stream",
        PacketError::NoSync { .. } => "decoder out of sync",
        PacketError::OutOfRange { .. } => "invalid argument",
    }
}

/// libipt's text for a timing error.
fn time_errstr(err: TimeError) -> &'static str {
    match err {
        TimeError::NoTime => "no timing information",
        TimeError::ZeroCbr | TimeError::CtcBackwards | TimeError::TscBackwards => "unknown packet",
        TimeError::TmaWithoutTsc | TimeError::DuplicateTma => "unexpected packet context",
        TimeError::NoCrystalRatio => "bad configuration",
        TimeError::Inconsistent => "internal error",
    }
}

/// What the dump keeps track of between packets; reset after a decode error.
#[derive(Debug)]
struct Tracking {
    last_ip: LastIp,
    clock: TimeTracker,
    /// The last printed TSC and calibration (for `--time-delta`).
    tsc: u64,
    fcr: u64,
}

impl Tracking {
    fn new(config: TimingConfig, opts: &PtdumpOptions) -> Self {
        let options = TrackerOptions {
            calibrate: !opts.no_tcal,
            keep_calibration_on_overflow: opts.keep_tcal_on_ovf,
        };
        Self {
            last_ip: LastIp::new(),
            clock: TimeTracker::new(config, options),
            tsc: 0,
            fcr: 0,
        }
    }
}

/// The columns of one output line (libipt's fixed-size fields: longer text is cut).
#[derive(Debug, Default)]
struct Line {
    raw: String,
    opcode: &'static str,
    payload: String,
    track_id: &'static str,
    track: String,
    skip: bool,
    skip_time: bool,
    skip_tcal: bool,
}

/// Cuts `text` to what a C buffer of `size` bytes holds.
fn field(mut text: String, size: usize) -> String {
    if let Some((cut, _)) = text.char_indices().nth(size.saturating_sub(1)) {
        text.truncate(cut);
    }
    text
}

fn ip_payload(ip: IpPayload) -> String {
    let bits = ip.compression.bits();
    match ip.compression {
        IpCompression::Suppressed => format!("{bits:x}: ????????????????"),
        IpCompression::Update16 => format!("{bits:x}: ????????????{:04x}", ip.ip),
        IpCompression::Update32 => format!("{bits:x}: ????????{:08x}", ip.ip),
        IpCompression::Update48 => format!("{bits:x}: ????{:012x}", ip.ip),
        IpCompression::Sext48 => format!("{bits:x}: {:016x}", sign_extend(ip.ip, 48)),
        IpCompression::Full => format!("{bits:x}: {:016x}", ip.ip),
    }
}

fn tnt_payload(tnt: Tnt) -> String {
    tnt.outcomes()
        .map(|taken| if taken { '!' } else { '.' })
        .collect()
}

fn joined(parts: &[(bool, &str)]) -> String {
    let set: Vec<&str> = parts
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, s)| *s)
        .collect();
    set.join(", ")
}

/// Text for packets whose line depends only on the packet.
fn plain_payload(packet: &Packet) -> String {
    let flag = |on: bool, text: &'static str| if on { text } else { "" };
    match *packet {
        Packet::Pip(pip) => format!("{:x}{}", pip.cr3, flag(pip.nr, ", nr")),
        Packet::Vmcs { base } => format!("{base:x}"),
        Packet::ModeExec(m) => {
            let bits = joined(&[(m.csd, "cs.d"), (m.csl, "cs.l")]);
            let sep = flag(m.iflag && !bits.is_empty(), ", ");
            format!("{bits}{sep}{}", flag(m.iflag, "if"))
        }
        Packet::ModeTsx(m) => joined(&[(m.intx, "intx"), (m.abrt, "abrt")]),
        Packet::Tsc { tsc } => format!("{tsc:x}"),
        Packet::Cbr { ratio } => format!("{ratio:x}"),
        Packet::Tma { ctc, fc } => format!("{ctc:x}, {fc:x}"),
        Packet::Mtc { ctc } => format!("{ctc:x}"),
        Packet::Cyc { value } => format!("{value:x}"),
        Packet::Mnt { payload } => format!("{payload:x}"),
        Packet::Exstop { ip } | Packet::Bep { ip } => flag(ip, "ip").to_owned(),
        Packet::Mwait(m) => format!("{:08x}, {:08x}", m.hints, m.ext),
        // libipt reads the HW flag from bit 3 of the first payload byte (the SDM says bit 7).
        Packet::Pwre(p) => format!(
            "c{}.{}{}",
            (p.state() + 1) & 0xf,
            (p.sub_state() + 1) & 0xf,
            flag(p.payload & 0x08 != 0, ", hw")
        ),
        Packet::Pwrx(p) => {
            let reasons = [(1, "int"), (4, " st"), (8, " hw")];
            let set: Vec<&str> = reasons
                .iter()
                .filter(|(bit, _)| p.wake_reason & bit != 0)
                .map(|(_, name)| *name)
                .collect();
            let wr = if set.len() == 1 { set[0] } else { "bad" };
            format!("{wr}: c{}, c{}", (p.last + 1) & 0xf, (p.deepest + 1) & 0xf)
        }
        Packet::Ptw(p) => format!("{:x}: {:x}{}", p.plc, p.payload, flag(p.ip, ", ip")),
        Packet::Cfe(c) => match c.kind {
            0x01 | 0x09 | 0x0c | 0x0e => format!("{}: {}{}", c.kind, c.vector, flag(c.ip, ", ip")),
            0x05 => format!("{}: {:x}{}", c.kind, c.vector, flag(c.ip, ", ip")),
            _ => format!("{}{}", c.kind, flag(c.ip, ", ip")),
        },
        Packet::Evd(e) => format!("{}: {:x}", e.kind, e.payload),
        Packet::Trig(t) => {
            let icnt = t.icnt.map(|n| format!(", icnt: {n}")).unwrap_or_default();
            format!(
                "{:02x}{}{}{icnt}",
                t.trbv,
                flag(t.ip, ", ip"),
                flag(t.mult, ", mult")
            )
        }
        Packet::Bbp(b) => format!(
            "{:x}, sz: {}",
            b.kind,
            if b.four_byte_items { 4 } else { 8 }
        ),
        Packet::Bip(b) => format!("{:x}: {:x}", b.id, b.value),
        Packet::Tnt8(tnt) | Packet::Tnt64(tnt) => tnt_payload(tnt),
        Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) | Packet::Fup(ip) => {
            ip_payload(ip)
        }
        Packet::Pad
        | Packet::Psb
        | Packet::PsbEnd
        | Packet::Ovf
        | Packet::Stop
        | Packet::Corrupted => String::new(),
    }
}

struct Dumper<'a, 'o> {
    opts: &'o PtdumpOptions,
    config: TimingConfig,
    track_time: bool,
    out: &'o mut dyn fmt::Write,
    decoder: PacketDecoder<'a>,
    session: Option<SidebandSession<'a>>,
    state: Tracking,
}

impl Dumper<'_, '_> {
    fn diag(&mut self, offset: usize, what: &str, why: Option<&str>) -> fmt::Result {
        diag(self.out, offset, what, why)
    }

    fn run(&mut self) -> fmt::Result {
        if self.opts.no_sync {
            if let Err(err) = self.decoder.sync_set(0) {
                return self.diag(0, "sync error", Some(packet_errstr(&err)));
            }
        } else if self.decoder.sync_forward().is_err() {
            return Ok(());
        }
        loop {
            if let Some((offset, err)) = self.dump_packets()? {
                self.diag(offset, "error decoding packet", Some(packet_errstr(&err)))?;
            } else {
                return Ok(());
            }
            if self.decoder.sync_forward().is_err() {
                return Ok(());
            }
            self.state = Tracking::new(self.config, self.opts);
        }
    }

    /// Dumps packets up to the end of the trace (`None`) or an error.
    fn dump_packets(&mut self) -> Result<Option<(usize, PacketError)>, fmt::Error> {
        loop {
            let offset = self.decoder.position();
            match self.decoder.next_decoded() {
                None => return Ok(None),
                // Running out of trace inside a packet is the normal end.
                Some(Err(err)) if err.is_truncated() => return Ok(None),
                Some(Err(err)) => return Ok(Some((offset, err))),
                Some(Ok((offset, decoded))) => self.dump_one(offset, decoded)?,
            }
        }
    }

    fn dump_one(&mut self, offset: usize, decoded: Decoded) -> fmt::Result {
        let packet = decoded.packet;
        let mut line = Line {
            opcode: packet.kind().name(),
            ..Line::default()
        };
        if self.opts.show_raw_bytes {
            // libipt reports the SKD007 OVF with the size of an OVF.
            let size = if packet == Packet::Ovf {
                2
            } else {
                decoded.size
            };
            let bytes = self
                .decoder
                .trace()
                .get(offset..offset + size)
                .unwrap_or_default();
            let hex = bytes.iter().fold(String::new(), |mut hex, b| {
                let _ = write!(hex, "{b:02x}");
                hex
            });
            line.raw = field(hex, 33);
        }
        // TNT and TRIG go into libipt's wider payload buffer.
        let wide = matches!(packet, Packet::Tnt8(_) | Packet::Tnt64(_) | Packet::Trig(_));
        line.payload = field(plain_payload(&packet), if wide { 48 } else { 25 });
        self.track(offset, &packet, &mut line)?;
        self.print_line(offset, &line)
    }

    /// Updates the tracked state for `packet` and fills in the tracking column.
    fn track(&mut self, offset: usize, packet: &Packet, line: &mut Line) -> fmt::Result {
        let opts = self.opts;
        match *packet {
            Packet::Psb | Packet::PsbEnd | Packet::Ovf if self.track_time => {
                self.state.clock.update(packet);
            }
            Packet::Pad => line.skip = opts.no_pad,
            Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) | Packet::Fup(ip)
                if opts.show_last_ip =>
            {
                line.track_id = "ip";
                line.track = match self.state.last_ip.apply(ip) {
                    Ok(ip) => format!("{ip:016x}"),
                    Err(LastIpError::Suppressed) => "<suppressed>".to_owned(),
                    Err(LastIpError::NoIp) => {
                        self.diag(offset, "error tracking last-ip", Some("no ip"))?;
                        "<unavailable>".to_owned()
                    }
                };
            }
            Packet::Pip(pip) => {
                line.track_id = "cr3";
                line.track = format!("{:016x}", pip.cr3);
            }
            Packet::Vmcs { base } => {
                line.track_id = "vmcs";
                line.track = format!("{base:016x}");
            }
            Packet::ModeExec(mode) if opts.show_exec_mode => {
                line.track_id = "em";
                let name = match mode.exec_mode() {
                    ExecMode::Bits64 => "64-bit",
                    ExecMode::Bits32 => "32-bit",
                    ExecMode::Bits16 => "16-bit",
                    ExecMode::Unknown => "unknown",
                };
                name.clone_into(&mut line.track);
            }
            Packet::Cfe(cfe) => {
                line.track_id = "type";
                cfe.type_name().clone_into(&mut line.track);
            }
            Packet::Evd(evd) => {
                line.track_id = "type";
                evd.type_name().clone_into(&mut line.track);
            }
            Packet::Tsc { .. } | Packet::Cbr { .. } | Packet::Tma { .. } | Packet::Mtc { .. } => {
                if self.track_time {
                    self.track_timing(offset, packet, line)?;
                }
                line.skip = opts.no_timing;
            }
            Packet::Cyc { .. } => {
                if self.track_time && !opts.no_cyc {
                    self.track_timing(offset, packet, line)?;
                }
                line.skip = opts.no_timing || opts.no_cyc;
            }
            _ => {}
        }
        Ok(())
    }

    /// TSC, CBR, TMA, MTC and CYC: calibration first, then time.
    fn track_timing(&mut self, offset: usize, packet: &Packet, line: &mut Line) -> fmt::Result {
        let step = self.state.clock.update(packet);
        let is_cyc = matches!(packet, Packet::Cyc { .. });
        if let Some(err) = step.calibration {
            let what = if is_cyc {
                "calibration error"
            } else {
                "error calibrating time"
            };
            self.diag(offset, what, Some(time_errstr(err)))?;
        }
        if let Some(err) = step.time {
            self.diag(offset, "error updating time", Some(time_errstr(err)))?;
        } else if step.uncalibrated {
            self.diag(offset, "error updating time: no calibration", None)?;
        }
        match packet {
            // These packets do not change time or calibration respectively.
            Packet::Cbr { .. } => line.skip_time = true,
            Packet::Tma { .. } | Packet::Cyc { .. } => line.skip_tcal = true,
            _ => {}
        }
        self.show_time(offset, line)
    }

    /// Fills in calibration or time and prints sideband records up to now.
    fn show_time(&mut self, offset: usize, line: &mut Line) -> fmt::Result {
        if self.opts.show_tcal && !line.skip_tcal {
            self.show_tcal(offset, line)?;
        }
        if self.opts.show_time && !line.skip_time {
            self.show_tsc(offset, line)?;
        }
        if let Some(session) = self.session.as_mut() {
            session.print_until(self.state.clock.relative_tsc(), self.out)?;
        }
        Ok(())
    }

    #[expect(
        clippy::cast_precision_loss,
        reason = "ptdump prints the fixed-point ratio as a double"
    )]
    fn show_tcal(&mut self, offset: usize, line: &mut Line) -> fmt::Result {
        line.track_id = "fcr";
        let fcr = match self.state.clock.fcr() {
            Ok(fcr) => fcr,
            Err(err) => {
                "<unavailable>".clone_into(&mut line.track);
                return self.diag(offset, "error printing time", Some(time_errstr(err)));
            }
        };
        let scale = f64::from(1u32 << FCR_SHIFT);
        let value = fcr as f64 / scale;
        line.track = if self.opts.time_as_delta {
            let old = self.state.fcr as f64 / scale;
            self.state.fcr = fcr;
            field(format!("{:+.3}", value - old), 17)
        } else {
            field(format!("{value:.3}"), 17)
        };
        Ok(())
    }

    fn show_tsc(&mut self, offset: usize, line: &mut Line) -> fmt::Result {
        line.track_id = "tsc";
        let tsc = match self.state.clock.tsc() {
            Ok(tsc) => tsc,
            Err(TimeError::NoTime) if self.opts.no_wall_clock => self.state.clock.relative_tsc(),
            Err(err) => {
                self.diag(offset, "error printing time", Some(time_errstr(err)))?;
                "<unavailable>".clone_into(&mut line.track);
                return Ok(());
            }
        };
        line.track = if self.opts.time_as_delta {
            let old = std::mem::replace(&mut self.state.tsc, tsc);
            if old <= tsc {
                field(format!("+{:x}", tsc - old), 17)
            } else {
                field(format!("-{:x}", old - tsc), 17)
            }
        } else {
            format!("{tsc:016x}")
        };
        Ok(())
    }

    fn print_line(&mut self, offset: usize, line: &Line) -> fmt::Result {
        if line.skip || self.opts.quiet {
            return Ok(());
        }
        let out = &mut *self.out;
        let mut sep = "";
        if self.opts.show_offset {
            write!(out, "{:<17}", format!("{offset:016x}"))?;
            sep = " ";
        }
        if !line.raw.is_empty() {
            write!(out, "{sep}{:<33}", line.raw)?;
            sep = " ";
        }
        if line.payload.is_empty() {
            write!(out, "{sep}{}", line.opcode)?;
        } else {
            write!(out, "{sep}{:<10}", line.opcode)?;
        }
        if !line.track_id.is_empty() {
            write!(
                out,
                " {:<25} {:<5}{}",
                line.payload, line.track_id, line.track
            )?;
        } else if !line.payload.is_empty() {
            write!(out, " {}", line.payload)?;
        }
        out.write_char('\n')
    }
}

#[cfg(test)]
#[path = "ptdump_tests.rs"]
mod tests;
