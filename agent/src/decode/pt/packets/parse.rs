//! The Intel PT byte decoder: the bytes of one packet in, a [`Packet`] out.
//!
//! Sans-IO: [`decode_packet`] reads the packet at an offset of a byte slice it is given
//! and says how many bytes it took, or why there is no packet there ([`PacketError`]:
//! the offset plus what was wrong). It never indexes out of bounds and every packet takes
//! at least one byte. [`super::decoder::PacketDecoder`] walks whole traces with it.

use std::fmt;

use super::cpu::Errata;
use super::packet::{
    Bbp, Bip, Cfe, Evd, IpCompression, IpPayload, ModeExec, ModeTsx, Mwait, Packet, PacketKind,
    Pip, Ptw, Pwre, Pwrx, Tnt, Trig,
};
use super::sync;

/// Up to three opcode bytes (opcode, extended opcode, second extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opcode {
    bytes: [u8; 3],
    len: usize,
}

impl Opcode {
    fn new(bytes: &[u8]) -> Self {
        let mut out = [0; 3];
        let len = bytes.len().min(3);
        out[..len].copy_from_slice(&bytes[..len]);
        Self { bytes: out, len }
    }

    /// The opcode bytes as they are in the trace.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.bytes().iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{b:#04x}")?;
        }
        Ok(())
    }
}

/// Why the packet layer could not decode at some offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// No packet starts with these bytes.
    #[error("unknown opcode {opcode} at offset {offset:#x}")]
    UnknownOpcode { offset: usize, opcode: Opcode },
    /// The trace ends inside the packet.
    #[error(
        "truncated {what} at offset {offset:#x}: needs {needed} bytes, {available} left in the trace"
    )]
    Truncated {
        offset: usize,
        what: &'static str,
        needed: usize,
        available: usize,
    },
    /// The opcode is known but the payload is not valid for it.
    #[error("bad {kind} packet at offset {offset:#x}: {reason}")]
    BadPayload {
        offset: usize,
        kind: PacketKind,
        reason: &'static str,
    },
    /// No PSB from this offset to the end of the trace.
    #[error("no PSB at or after offset {offset:#x}")]
    NoSync { offset: usize },
    /// An offset past the end of the trace was asked for.
    #[error("offset {offset:#x} is past the end of the trace ({len:#x} bytes)")]
    OutOfRange { offset: usize, len: usize },
}

impl PacketError {
    /// Where in the trace the problem is.
    pub fn offset(&self) -> usize {
        match *self {
            Self::UnknownOpcode { offset, .. }
            | Self::Truncated { offset, .. }
            | Self::BadPayload { offset, .. }
            | Self::NoSync { offset }
            | Self::OutOfRange { offset, .. } => offset,
        }
    }

    /// The trace ended inside a packet (more bytes would have helped).
    pub fn is_truncated(&self) -> bool {
        matches!(self, Self::Truncated { .. })
    }
}

/// Whether BIP packets are expected: set by BBP, cleared by most other packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BlockContext {
    #[default]
    None,
    /// Inside a block whose items carry 4 (`Items4`) or 8 (`Items8`) bytes.
    Items4,
    Items8,
}

impl BlockContext {
    fn item_len(self) -> Option<usize> {
        match self {
            Self::None => None,
            Self::Items4 => Some(4),
            Self::Items8 => Some(8),
        }
    }

    /// The context after `packet` (the SDM's block rules, as Linux perf applies them).
    #[must_use]
    pub fn after(self, packet: &Packet) -> Self {
        match packet {
            Packet::Bbp(bbp) if bbp.four_byte_items => Self::Items4,
            Packet::Bbp(_) => Self::Items8,
            Packet::Pad
            | Packet::Tsc { .. }
            | Packet::Tma { .. }
            | Packet::Mtc { .. }
            | Packet::Fup(_)
            | Packet::Cyc { .. }
            | Packet::Cbr { .. }
            | Packet::Mnt { .. }
            | Packet::Exstop { .. }
            | Packet::Pwre(_)
            | Packet::Pwrx(_)
            | Packet::Bip(_)
            | Packet::Corrupted => self,
            _ => Self::None,
        }
    }
}

/// A packet and the number of trace bytes it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub packet: Packet,
    pub size: usize,
}

/// Reads little-endian `len` (≤ 8) bytes; the caller has checked the bounds.
fn le(bytes: &[u8], at: usize, len: usize) -> u64 {
    // A word at once where the trace has eight bytes there: IP payloads are read for
    // every TIP, FUP and TIP.PGE/PGD the event layer decodes.
    if len <= 8
        && let Some(word) = bytes
            .get(at..at + 8)
            .and_then(|word| <[u8; 8]>::try_from(word).ok())
    {
        let word = u64::from_le_bytes(word);
        return if len == 8 {
            word
        } else {
            word & ((1 << (8 * len)) - 1)
        };
    }
    le_bytewise(bytes, at, len)
}

/// [`le`] one byte at a time, up to the end of `bytes`.
fn le_bytewise(bytes: &[u8], at: usize, len: usize) -> u64 {
    bytes
        .iter()
        .skip(at)
        .take(len)
        .enumerate()
        .fold(0, |acc, (i, &b)| acc | (u64::from(b) << (8 * i)))
}

fn byte(bytes: &[u8], at: usize) -> u8 {
    bytes.get(at).copied().unwrap_or(0)
}

fn le16(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([byte(bytes, at), byte(bytes, at + 1)])
}

fn le32(bytes: &[u8], at: usize) -> u32 {
    u32::from(le16(bytes, at)) | (u32::from(le16(bytes, at + 2)) << 16)
}

/// Extended packets that are just the two opcode bytes.
fn two_byte_ext(ext: u8) -> Option<Packet> {
    Some(match ext {
        0xf3 => Packet::Ovf,
        0x23 => Packet::PsbEnd,
        0x83 => Packet::Stop,
        0x62 | 0xe2 => Packet::Exstop {
            ip: ext & 0x80 != 0,
        },
        0x33 | 0xb3 => Packet::Bep {
            ip: ext & 0x80 != 0,
        },
        _ => return None,
    })
}

/// The bytes of one packet being decoded.
struct At<'a> {
    /// The trace from the packet's first byte on.
    bytes: &'a [u8],
    offset: usize,
}

impl At<'_> {
    fn need(&self, size: usize, what: &'static str) -> Result<(), PacketError> {
        if self.bytes.len() < size {
            return Err(PacketError::Truncated {
                offset: self.offset,
                what,
                needed: size,
                available: self.bytes.len(),
            });
        }
        Ok(())
    }

    fn fixed(&self, size: usize, kind: PacketKind, packet: Packet) -> Result<Decoded, PacketError> {
        self.need(size, kind.name())?;
        Ok(Decoded { packet, size })
    }

    fn bad(&self, kind: PacketKind, reason: &'static str) -> PacketError {
        PacketError::BadPayload {
            offset: self.offset,
            kind,
            reason,
        }
    }

    fn unknown(&self, opcode_len: usize) -> PacketError {
        PacketError::UnknownOpcode {
            offset: self.offset,
            opcode: Opcode::new(&self.bytes[..opcode_len.min(self.bytes.len())]),
        }
    }

    fn ip(&self, kind: PacketKind) -> Result<Decoded, PacketError> {
        let ipc = byte(self.bytes, 0) >> 5;
        let compression = IpCompression::from_bits(ipc)
            .ok_or_else(|| self.bad(kind, "reserved IP compression"))?;
        let size = 1 + compression.payload_len();
        self.need(size, kind.name())?;
        let payload = IpPayload {
            compression,
            ip: le(self.bytes, 1, compression.payload_len()),
        };
        let packet = match kind {
            PacketKind::Tip => Packet::Tip(payload),
            PacketKind::TipPge => Packet::TipPge(payload),
            PacketKind::TipPgd => Packet::TipPgd(payload),
            _ => Packet::Fup(payload),
        };
        Ok(Decoded { packet, size })
    }

    fn tnt(&self, kind: PacketKind, payload: u64, size: usize) -> Result<Decoded, PacketError> {
        // The payload ends with a stop bit; the bits below it are the outcomes.
        if payload < 2 {
            return Err(self.bad(kind, "no stop bit"));
        }
        let count = u8::try_from(payload.ilog2()).unwrap_or(u8::MAX);
        let tnt = Tnt {
            bits: payload & !(1 << count),
            count,
        };
        let packet = if kind == PacketKind::Tnt8 {
            Packet::Tnt8(tnt)
        } else {
            Packet::Tnt64(tnt)
        };
        Ok(Decoded { packet, size })
    }

    fn mode(&self) -> Result<Decoded, PacketError> {
        self.need(2, "mode")?;
        let payload = byte(self.bytes, 1);
        let packet = match payload >> 5 {
            0 => Packet::ModeExec(ModeExec {
                csl: payload & 0x01 != 0,
                csd: payload & 0x02 != 0,
                iflag: payload & 0x04 != 0,
            }),
            1 => Packet::ModeTsx(ModeTsx {
                intx: payload & 0x01 != 0,
                abrt: payload & 0x02 != 0,
            }),
            _ => return Err(self.bad(PacketKind::Mode, "unknown mode leaf")),
        };
        Ok(Decoded { packet, size: 2 })
    }

    fn cyc(&self, errata: Errata) -> Result<Decoded, PacketError> {
        let first = byte(self.bytes, 0);
        let mut value = u64::from(first >> 3);
        let mut more = first & 0x04 != 0;
        let mut shift = 5u32;
        let mut size = 1;
        while more {
            self.need(size + 1, "cyc")?;
            let ext = byte(self.bytes, size);
            size += 1;
            more = ext & 0x01 != 0;
            value |= u64::from(ext >> 1) << shift;
            shift += 7;
            if shift > 64 {
                return Err(self.bad(PacketKind::Cyc, "more than 64 payload bits"));
            }
        }
        // SKD007: an OVF may be split into a 2-byte CYC whose second byte looks like an
        // extended opcode, followed by the OVF's 0xf3.
        if errata.skd007 && size == 2 && (value & !0x1f) == 0x20 && self.bytes.get(2) == Some(&0xf3)
        {
            return Ok(Decoded {
                packet: Packet::Ovf,
                size: 3,
            });
        }
        Ok(Decoded {
            packet: Packet::Cyc { value },
            size,
        })
    }

    fn trig(&self) -> Result<Decoded, PacketError> {
        self.need(3, "trig")?;
        let flags = byte(self.bytes, 1);
        let icntv = flags & 0x40 != 0;
        let size = if icntv { 5 } else { 3 };
        self.need(size, "trig")?;
        let trig = Trig {
            trbv: byte(self.bytes, 2),
            ip: flags & 0x80 != 0,
            mult: flags & 0x20 != 0,
            icnt: icntv.then(|| le16(self.bytes, 3)),
        };
        Ok(Decoded {
            packet: Packet::Trig(trig),
            size,
        })
    }

    fn tma(&self, errata: Errata) -> Result<Decoded, PacketError> {
        self.need(7, "tma")?;
        let ctc = le16(self.bytes, 2);
        let fc = le16(self.bytes, 5);
        if fc & !0x1ff != 0 || byte(self.bytes, 4) != 0 {
            // SKZ84: such a TMA is corrupted; skip it and the byte after it.
            if errata.skz84 {
                return Ok(Decoded {
                    packet: Packet::Corrupted,
                    size: 8,
                });
            }
            return Err(self.bad(PacketKind::Tma, "reserved bits set"));
        }
        Ok(Decoded {
            packet: Packet::Tma { ctc, fc },
            size: 7,
        })
    }

    fn ptw(&self) -> Result<Decoded, PacketError> {
        let header = byte(self.bytes, 1);
        let plc = (header >> 5) & 0x3;
        let len = match plc {
            0 => 4,
            1 => 8,
            _ => return Err(self.bad(PacketKind::Ptw, "reserved payload size")),
        };
        self.need(2 + len, "ptw")?;
        let ptw = Ptw {
            payload: le(self.bytes, 2, len),
            plc,
            ip: header & 0x80 != 0,
        };
        Ok(Decoded {
            packet: Packet::Ptw(ptw),
            size: 2 + len,
        })
    }

    fn bip(&self, len: usize) -> Result<Decoded, PacketError> {
        self.need(1 + len, "bip")?;
        let bip = Bip {
            id: byte(self.bytes, 0) >> 3,
            value: le(self.bytes, 1, len),
        };
        Ok(Decoded {
            packet: Packet::Bip(bip),
            size: 1 + len,
        })
    }

    /// Packets starting with the extended opcode 0x02.
    fn ext(&self, errata: Errata) -> Result<Decoded, PacketError> {
        use PacketKind as K;
        self.need(2, "extended opcode")?;
        let b = self.bytes;
        let ext = byte(b, 1);
        if let Some(packet) = two_byte_ext(ext) {
            return Ok(Decoded { packet, size: 2 });
        }
        match ext {
            0x82 => self.psb(),
            0x03 => self.fixed(4, K::Cbr, Packet::Cbr { ratio: byte(b, 2) }),
            0x73 => self.tma(errata),
            0x43 => {
                let payload = le(b, 2, 6);
                let pip = Pip {
                    cr3: (payload >> 1) << 5,
                    nr: payload & 1 != 0,
                };
                self.fixed(8, K::Pip, Packet::Pip(pip))
            }
            0xc8 => self.fixed(
                7,
                K::Vmcs,
                Packet::Vmcs {
                    base: le(b, 2, 5) << 12,
                },
            ),
            0xa3 => {
                self.need(8, "tnt.64")?;
                self.tnt(K::Tnt64, le(b, 2, 6), 8)
            }
            0xc2 | 0x22 | 0xa2 => self.power(ext),
            0x13 => {
                let cfe = Cfe {
                    kind: byte(b, 2) & 0x1f,
                    vector: byte(b, 3),
                    ip: byte(b, 2) & 0x80 != 0,
                };
                self.fixed(4, K::Cfe, Packet::Cfe(cfe))
            }
            0x53 => {
                let evd = Evd {
                    kind: byte(b, 2) & 0x1f,
                    payload: le(b, 3, 8),
                };
                self.fixed(11, K::Evd, Packet::Evd(evd))
            }
            0x63 => {
                let bbp = Bbp {
                    kind: byte(b, 2) & 0x1f,
                    four_byte_items: byte(b, 2) & 0x80 != 0,
                };
                self.fixed(3, K::Bbp, Packet::Bbp(bbp))
            }
            0xc3 => {
                self.need(3, "extended opcode")?;
                match byte(b, 2) {
                    0x88 => self.fixed(
                        11,
                        K::Mnt,
                        Packet::Mnt {
                            payload: le(b, 3, 8),
                        },
                    ),
                    _ => Err(self.unknown(3)),
                }
            }
            _ if ext & 0x1f == 0x12 => self.ptw(),
            _ => Err(self.unknown(2)),
        }
    }

    /// MWAIT, PWRE and PWRX.
    fn power(&self, ext: u8) -> Result<Decoded, PacketError> {
        let b = self.bytes;
        match ext {
            0xc2 => {
                let mwait = Mwait {
                    hints: le32(b, 2),
                    ext: le32(b, 6),
                };
                self.fixed(10, PacketKind::Mwait, Packet::Mwait(mwait))
            }
            0x22 => {
                let pwre = Pwre {
                    payload: le16(b, 2),
                };
                self.fixed(4, PacketKind::Pwre, Packet::Pwre(pwre))
            }
            _ => {
                let pwrx = Pwrx {
                    last: byte(b, 2) >> 4,
                    deepest: byte(b, 2) & 0xf,
                    wake_reason: byte(b, 3) & 0xf,
                };
                self.fixed(7, PacketKind::Pwrx, Packet::Pwrx(pwrx))
            }
        }
    }

    fn psb(&self) -> Result<Decoded, PacketError> {
        self.need(sync::PSB_LEN, "psb")?;
        if !sync::is_psb(self.bytes) {
            return Err(self.bad(PacketKind::Psb, "broken PSB pattern"));
        }
        Ok(Decoded {
            packet: Packet::Psb,
            size: sync::PSB_LEN,
        })
    }
}

/// Decodes the packet at `offset`.
///
/// `block` says whether a BBP opened a block (then BIP headers take precedence); `errata`
/// switches on the packet-level workarounds (SKD007, SKZ84). An offset at or past the end
/// is a [`PacketError::Truncated`] with nothing available.
pub fn decode_packet(
    trace: &[u8],
    offset: usize,
    errata: Errata,
    block: BlockContext,
) -> Result<Decoded, PacketError> {
    use PacketKind as K;
    let at = At {
        bytes: trace.get(offset..).unwrap_or_default(),
        offset,
    };
    at.need(1, "packet")?;
    let opc = byte(at.bytes, 0);
    if let Some(len) = block.item_len()
        && opc & 0x7 == 0x4
    {
        return at.bip(len);
    }
    match opc {
        0x00 => Ok(Decoded {
            packet: Packet::Pad,
            size: 1,
        }),
        0x02 => at.ext(errata),
        0x99 => at.mode(),
        0x59 => at.fixed(
            2,
            K::Mtc,
            Packet::Mtc {
                ctc: byte(at.bytes, 1),
            },
        ),
        0x19 => at.fixed(
            8,
            K::Tsc,
            Packet::Tsc {
                tsc: le(at.bytes, 1, 7),
            },
        ),
        0xd9 => at.trig(),
        _ if opc & 0x3 == 0x3 => at.cyc(errata),
        _ if opc & 0x1 == 0 => at.tnt(K::Tnt8, u64::from(opc >> 1), 1),
        _ => match opc & 0x1f {
            0x1d => at.ip(K::Fup),
            0x0d => at.ip(K::Tip),
            0x11 => at.ip(K::TipPge),
            0x01 => at.ip(K::TipPgd),
            _ => Err(at.unknown(1)),
        },
    }
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
