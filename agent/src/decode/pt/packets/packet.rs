//! Intel PT packets: the values the byte decoder ([`super::parse`]) produces.
//!
//! In: nothing (plain data). Out: [`Packet`], one variant per packet of the Intel SDM
//! (Vol. 3C, "Intel Processor Trace", packet definitions), with payloads already split
//! into their fields. Reserved bits are dropped; nothing here knows about the trace
//! stream around a packet (see [`super::last_ip`] for IP reconstruction and
//! [`crate::decode::pt::timing::time`] for time).

use std::fmt;

/// How an IP packet (TIP, TIP.PGE, TIP.PGD, FUP) encodes its address (the `IPBytes` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpCompression {
    /// `000`: no address; the IP is out of context.
    Suppressed,
    /// `001`: the low 16 bits replace those of the last IP.
    Update16,
    /// `010`: the low 32 bits replace those of the last IP.
    Update32,
    /// `011`: 48 bits, sign-extended to 64.
    Sext48,
    /// `100`: the low 48 bits replace those of the last IP.
    Update48,
    /// `110`: the full 64-bit address.
    Full,
}

impl IpCompression {
    /// Decodes the 3-bit `IPBytes` field; `None` for the reserved values 101 and 111.
    pub fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(Self::Suppressed),
            1 => Some(Self::Update16),
            2 => Some(Self::Update32),
            3 => Some(Self::Sext48),
            4 => Some(Self::Update48),
            6 => Some(Self::Full),
            _ => None,
        }
    }

    /// The 3-bit `IPBytes` field.
    pub fn bits(self) -> u8 {
        match self {
            Self::Suppressed => 0,
            Self::Update16 => 1,
            Self::Update32 => 2,
            Self::Sext48 => 3,
            Self::Update48 => 4,
            Self::Full => 6,
        }
    }

    /// Number of payload bytes after the header byte.
    pub fn payload_len(self) -> usize {
        match self {
            Self::Suppressed => 0,
            Self::Update16 => 2,
            Self::Update32 => 4,
            Self::Sext48 | Self::Update48 => 6,
            Self::Full => 8,
        }
    }
}

/// The payload of an IP packet, as it is in the trace (not yet combined with the last IP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpPayload {
    pub compression: IpCompression,
    /// The payload bytes, little-endian, zero-extended (not sign-extended for `Sext48`).
    pub ip: u64,
}

/// A TNT packet's branch outcomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tnt {
    /// The outcome bits without the stop bit; the oldest branch is bit `count - 1`.
    pub bits: u64,
    /// Number of branches (1–6 for TNT-8, 1–47 for TNT-64).
    pub count: u8,
}

impl Tnt {
    /// The outcomes oldest first; `true` is taken.
    pub fn outcomes(self) -> impl Iterator<Item = bool> {
        (0..self.count).rev().map(move |bit| {
            self.bits
                .checked_shr(u32::from(bit))
                .is_some_and(|b| b & 1 == 1)
        })
    }
}

/// Execution mode as told by MODE.Exec (CS.L and CS.D).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExecMode {
    Bits16,
    Bits32,
    Bits64,
    /// CS.L and CS.D both set: not a valid code segment.
    Unknown,
}

/// MODE.Exec payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModeExec {
    /// CS.L: 64-bit code segment.
    pub csl: bool,
    /// CS.D: default operand size 32.
    pub csd: bool,
    /// RFLAGS.IF (newer processors report it here).
    pub iflag: bool,
}

impl ModeExec {
    pub fn exec_mode(self) -> ExecMode {
        match (self.csl, self.csd) {
            (true, false) => ExecMode::Bits64,
            (true, true) => ExecMode::Unknown,
            (false, true) => ExecMode::Bits32,
            (false, false) => ExecMode::Bits16,
        }
    }
}

/// MODE.TSX payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ModeTsx {
    /// In a transaction.
    pub intx: bool,
    /// The transaction aborted.
    pub abrt: bool,
}

/// PIP payload: the new CR3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pip {
    /// CR3 with bits 4:0 clear (the packet carries bits 51:5).
    pub cr3: u64,
    /// Non-root: the guest of a VMM is running.
    pub nr: bool,
}

/// PTW (PTWRITE) payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ptw {
    pub payload: u64,
    /// The `PayloadBytes` field: 0 for 4 bytes, 1 for 8 bytes.
    pub plc: u8,
    /// A FUP with the IP of the PTWRITE instruction follows.
    pub ip: bool,
}

/// PWRE payload (the two payload bytes, little-endian).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pwre {
    pub payload: u16,
}

impl Pwre {
    /// The resolved thread C-state, as MWAIT encodes it (bits 15:12).
    pub fn state(self) -> u8 {
        ((self.payload >> 12) & 0xf) as u8
    }

    /// The resolved thread sub C-state (bits 11:8).
    pub fn sub_state(self) -> u8 {
        ((self.payload >> 8) & 0xf) as u8
    }

    /// Hardware initiated the C-state entry (SDM: byte 2, bit 7).
    pub fn hw(self) -> bool {
        self.payload & 0x80 != 0
    }
}

/// PWRX payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pwrx {
    /// Core C-state at the wake (MWAIT encoding).
    pub last: u8,
    /// Deepest core C-state reached.
    pub deepest: u8,
    /// One-hot wake reason: bit 0 interrupt, bit 1 timer deadline, bit 2 store to the
    /// monitored address, bit 3 hardware (autonomous) wake.
    pub wake_reason: u8,
}

/// MWAIT payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mwait {
    pub hints: u32,
    pub ext: u32,
}

/// CFE (control flow event) payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cfe {
    /// The event type (5 bits); see [`Cfe::type_name`].
    pub kind: u8,
    /// The vector, for interrupt-like types.
    pub vector: u8,
    /// A FUP with the IP of the event follows.
    pub ip: bool,
}

impl Cfe {
    /// The name libipt gives the type (`"unknown"` for reserved types).
    pub fn type_name(self) -> &'static str {
        match self.kind {
            0x01 => "intr",
            0x02 => "iret",
            0x03 => "smi",
            0x04 => "rsm",
            0x05 => "sipi",
            0x06 => "init",
            0x07 => "vmentry",
            0x08 => "vmexit",
            0x09 => "vmexit_intr",
            0x0a => "shutdown",
            0x0c => "uintr",
            0x0d => "uiret",
            0x0e => "swintr",
            0x0f => "syscall",
            _ => "unknown",
        }
    }
}

/// EVD (event data) payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Evd {
    /// 0: CR2 of a page fault, 1: VMX exit qualification, 2: VMX exit reason.
    pub kind: u8,
    pub payload: u64,
}

impl Evd {
    pub fn type_name(self) -> &'static str {
        match self.kind {
            0 => "cr2",
            1 => "vmxq",
            2 => "vmxr",
            _ => "unknown",
        }
    }
}

/// TRIG (trigger) payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Trig {
    /// Which trigger conditions hit (TRBV).
    pub trbv: u8,
    /// A FUP with the IP follows.
    pub ip: bool,
    /// More than one trigger hit on the same instruction.
    pub mult: bool,
    /// The instruction count, when the packet carries one (ICNTV).
    pub icnt: Option<u16>,
}

/// BBP (block begin) payload: starts a block of BIP packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bbp {
    /// The block type (5 bits), e.g. 4 for general-purpose registers of a PEBS record.
    pub kind: u8,
    /// BIPs in this block carry 4 bytes (SZ=1) instead of 8.
    pub four_byte_items: bool,
}

/// BIP (block item) payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bip {
    /// The item ID (5 bits).
    pub id: u8,
    pub value: u64,
}

/// One Intel PT packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Packet {
    Pad,
    Psb,
    PsbEnd,
    Ovf,
    Stop,
    Tnt8(Tnt),
    Tnt64(Tnt),
    Tip(IpPayload),
    TipPge(IpPayload),
    TipPgd(IpPayload),
    Fup(IpPayload),
    ModeExec(ModeExec),
    ModeTsx(ModeTsx),
    Pip(Pip),
    /// VMCS base address (bits 11:0 clear).
    Vmcs {
        base: u64,
    },
    /// The low 56 bits of the time-stamp counter.
    Tsc {
        tsc: u64,
    },
    /// Core:bus ratio.
    Cbr {
        ratio: u8,
    },
    /// CTC (crystal clock) bits 15:0 and fast counter at the preceding TSC.
    Tma {
        ctc: u16,
        fc: u16,
    },
    /// CTC bits `mtc_freq + 7 .. mtc_freq`.
    Mtc {
        ctc: u8,
    },
    /// Core cycles since the last CYC-eligible packet.
    Cyc {
        value: u64,
    },
    /// Maintenance packet (model specific payload).
    Mnt {
        payload: u64,
    },
    Ptw(Ptw),
    Pwre(Pwre),
    Pwrx(Pwrx),
    Exstop {
        ip: bool,
    },
    Mwait(Mwait),
    Bbp(Bbp),
    Bip(Bip),
    Bep {
        ip: bool,
    },
    Cfe(Cfe),
    Evd(Evd),
    Trig(Trig),
    /// Bytes a processor erratum is known to corrupt, skipped as a unit (SKZ84: a TMA
    /// with reserved bits set, taken to be 8 bytes).
    Corrupted,
}

/// The packet types, without payloads: for names and error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketKind {
    Pad,
    Psb,
    PsbEnd,
    Ovf,
    Stop,
    Tnt8,
    Tnt64,
    Tip,
    TipPge,
    TipPgd,
    Fup,
    Mode,
    ModeExec,
    ModeTsx,
    Pip,
    Vmcs,
    Tsc,
    Cbr,
    Tma,
    Mtc,
    Cyc,
    Mnt,
    Ptw,
    Pwre,
    Pwrx,
    Exstop,
    Mwait,
    Bbp,
    Bip,
    Bep,
    Cfe,
    Evd,
    Trig,
    Corrupted,
}

impl PacketKind {
    /// The lower-case name ptdump prints (`tip.pge`, `mode.exec`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::Pad => "pad",
            Self::Psb => "psb",
            Self::PsbEnd => "psbend",
            Self::Ovf => "ovf",
            Self::Stop => "stop",
            Self::Tnt8 => "tnt.8",
            Self::Tnt64 => "tnt.64",
            Self::Tip => "tip",
            Self::TipPge => "tip.pge",
            Self::TipPgd => "tip.pgd",
            Self::Fup => "fup",
            Self::Mode => "mode",
            Self::ModeExec => "mode.exec",
            Self::ModeTsx => "mode.tsx",
            Self::Pip => "pip",
            Self::Vmcs => "vmcs",
            Self::Tsc => "tsc",
            Self::Cbr => "cbr",
            Self::Tma => "tma",
            Self::Mtc => "mtc",
            Self::Cyc => "cyc",
            Self::Mnt => "mnt",
            Self::Ptw => "ptw",
            Self::Pwre => "pwre",
            Self::Pwrx => "pwrx",
            Self::Exstop => "exstop",
            Self::Mwait => "mwait",
            Self::Bbp => "bbp",
            Self::Bip => "bip",
            Self::Bep => "bep",
            Self::Cfe => "cfe",
            Self::Evd => "evd",
            Self::Trig => "trig",
            Self::Corrupted => "<invalid>",
        }
    }
}

impl fmt::Display for PacketKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Packet {
    pub fn kind(&self) -> PacketKind {
        match self {
            Self::Pad => PacketKind::Pad,
            Self::Psb => PacketKind::Psb,
            Self::PsbEnd => PacketKind::PsbEnd,
            Self::Ovf => PacketKind::Ovf,
            Self::Stop => PacketKind::Stop,
            Self::Tnt8(_) => PacketKind::Tnt8,
            Self::Tnt64(_) => PacketKind::Tnt64,
            Self::Tip(_) => PacketKind::Tip,
            Self::TipPge(_) => PacketKind::TipPge,
            Self::TipPgd(_) => PacketKind::TipPgd,
            Self::Fup(_) => PacketKind::Fup,
            Self::ModeExec(_) => PacketKind::ModeExec,
            Self::ModeTsx(_) => PacketKind::ModeTsx,
            Self::Pip(_) => PacketKind::Pip,
            Self::Vmcs { .. } => PacketKind::Vmcs,
            Self::Tsc { .. } => PacketKind::Tsc,
            Self::Cbr { .. } => PacketKind::Cbr,
            Self::Tma { .. } => PacketKind::Tma,
            Self::Mtc { .. } => PacketKind::Mtc,
            Self::Cyc { .. } => PacketKind::Cyc,
            Self::Mnt { .. } => PacketKind::Mnt,
            Self::Ptw(_) => PacketKind::Ptw,
            Self::Pwre(_) => PacketKind::Pwre,
            Self::Pwrx(_) => PacketKind::Pwrx,
            Self::Exstop { .. } => PacketKind::Exstop,
            Self::Mwait(_) => PacketKind::Mwait,
            Self::Bbp(_) => PacketKind::Bbp,
            Self::Bip(_) => PacketKind::Bip,
            Self::Bep { .. } => PacketKind::Bep,
            Self::Cfe(_) => PacketKind::Cfe,
            Self::Evd(_) => PacketKind::Evd,
            Self::Trig(_) => PacketKind::Trig,
            Self::Corrupted => PacketKind::Corrupted,
        }
    }

    /// The IP payload of TIP, TIP.PGE, TIP.PGD and FUP.
    pub fn ip_payload(&self) -> Option<IpPayload> {
        match self {
            Self::Tip(ip) | Self::TipPge(ip) | Self::TipPgd(ip) | Self::Fup(ip) => Some(*ip),
            _ => None,
        }
    }
}
