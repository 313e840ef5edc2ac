//! x86 instructions as the flow layer needs them: length, class and branch target.
//!
//! In: code bytes from an [`ImageProvider`] at an address, and the execution mode.
//! Out: [`Insn`], the instruction's size, its [`InsnClass`] (what kind of control flow
//! it is: conditional, direct or indirect near branch, far transfer, PTWRITE, other),
//! the detail [`InsnKind`] that events bind to (MOV CR3, VMLAUNCH, IRET, SYSCALL, INT
//! ...) and, for direct branches, the displacement. Decoding is done with iced-x86; an
//! instruction whose bytes run past the end of one mapped piece is completed from the
//! next one (and marked `truncated`). Classes follow libipt's `ptic_*`, so output lines
//! up with Intel's tools.

use iced_x86::{Code, Decoder, DecoderError, DecoderOptions, Instruction, Mnemonic, Register};

use super::ild;
use super::image::ImageProvider;
use crate::decode::pt::events::event::FlowError;
use crate::decode::pt::packets::packet::ExecMode;

/// The longest x86 instruction.
pub const MAX_INSN_SIZE: usize = 15;

/// Control-flow class of an instruction (libipt's `ptic_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InsnClass {
    /// Not known (the class of a block whose end came from the block cache).
    #[default]
    Unknown,
    /// No change of control flow.
    Other,
    /// Near call.
    Call,
    /// Near return.
    Return,
    /// Near unconditional jump.
    Jump,
    /// Near conditional jump (`Jcc`, `JrCXZ`, `LOOPcc`).
    CondJump,
    /// Far call, software interrupt, `SYSCALL`/`SYSENTER`, `VMCALL`.
    FarCall,
    /// Far return, IRET, SYSRET/SYSEXIT, VMLAUNCH/VMRESUME, UIRET, ERETS/ERETU.
    FarReturn,
    /// Far jump.
    FarJump,
    PtWrite,
    /// Some indirect or far branch (from the block cache, which does not keep more).
    Indirect,
}

/// The instruction detail events bind to (libipt's `PTI_INST_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InsnKind {
    #[default]
    Other,
    Jcc,
    Jrcxz,
    Loop,
    CallDirect,
    CallIndirect,
    CallFar,
    JmpDirect,
    JmpIndirect,
    JmpFar,
    Ret,
    RetFar,
    Int,
    Int3,
    Int1,
    Into,
    Iret,
    Syscall,
    Sysenter,
    Sysexit,
    Sysret,
    Vmcall,
    Vmlaunch,
    Vmresume,
    Vmptrld,
    Uiret,
    Erets,
    Eretu,
    MovCr3,
    Ptwrite,
    /// APX JMPABS: direct, but traced with a TIP like an indirect jump.
    Jmpabs,
}

/// A decoded instruction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub ip: u64,
    pub mode: ExecMode,
    pub size: u8,
    pub raw: [u8; MAX_INSN_SIZE],
    pub class: InsnClass,
    pub kind: InsnKind,
    /// For direct branches: the target relative to the next instruction.
    pub displacement: Option<i64>,
    /// The section the first byte came from.
    pub isid: u32,
    /// The bytes span two mapped pieces.
    pub truncated: bool,
}

impl Insn {
    /// No instruction: a place to decode one into.
    pub(crate) const NONE: Self = Self {
        ip: 0,
        mode: ExecMode::Unknown,
        size: 0,
        raw: [0; MAX_INSN_SIZE],
        class: InsnClass::Unknown,
        kind: InsnKind::Other,
        displacement: None,
        isid: 0,
        truncated: false,
    };

    /// The instruction's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.raw[..usize::from(self.size).min(MAX_INSN_SIZE)]
    }

    /// The address after the instruction.
    pub fn end(&self) -> u64 {
        self.ip.wrapping_add(u64::from(self.size))
    }

    /// The next IP when it follows from the code alone; [`FlowError::BadQuery`] when
    /// trace is needed (conditional and indirect branches, returns, far transfers).
    pub fn next_ip(&self) -> Result<u64, FlowError> {
        match self.class {
            InsnClass::Other | InsnClass::PtWrite => Ok(self.end()),
            InsnClass::Jump | InsnClass::Call => match self.displacement {
                Some(disp) => Ok(self.end().wrapping_add_signed(disp)),
                None => Err(FlowError::BadQuery),
            },
            InsnClass::Unknown => Err(FlowError::BadInsn),
            _ => Err(FlowError::BadQuery),
        }
    }

    /// Whether this is a branch of any kind.
    pub fn is_branch(&self) -> bool {
        !matches!(
            self.class,
            InsnClass::Other | InsnClass::PtWrite | InsnClass::Unknown
        )
    }

    pub fn is_far_branch(&self) -> bool {
        matches!(
            self.class,
            InsnClass::FarCall | InsnClass::FarReturn | InsnClass::FarJump
        )
    }

    pub fn changes_cr3(&self) -> bool {
        self.kind == InsnKind::MovCr3
    }

    /// A PIP (CR3 change) may bind to this instruction.
    pub fn binds_to_pip(&self) -> bool {
        matches!(
            self.kind,
            InsnKind::MovCr3 | InsnKind::Vmlaunch | InsnKind::Vmresume
        ) || self.is_far_branch()
    }

    /// A VMCS change may bind to this instruction.
    pub fn binds_to_vmcs(&self) -> bool {
        matches!(
            self.kind,
            InsnKind::Vmptrld | InsnKind::Vmlaunch | InsnKind::Vmresume
        ) || self.is_far_branch()
    }

    pub fn is_iret(&self) -> bool {
        matches!(
            self.kind,
            InsnKind::Iret
                | InsnKind::Sysret
                | InsnKind::Sysexit
                | InsnKind::Erets
                | InsnKind::Eretu
        )
    }

    pub fn is_vmentry(&self) -> bool {
        matches!(self.kind, InsnKind::Vmlaunch | InsnKind::Vmresume)
    }

    pub fn is_swint(&self) -> bool {
        matches!(
            self.kind,
            InsnKind::Int | InsnKind::Int3 | InsnKind::Int1 | InsnKind::Into
        )
    }

    pub fn is_syscall(&self) -> bool {
        matches!(self.kind, InsnKind::Syscall | InsnKind::Sysenter)
    }
}

fn bitness(mode: ExecMode) -> u32 {
    match mode {
        ExecMode::Bits64 => 64,
        ExecMode::Bits32 => 32,
        // Like libipt's length decoder, an unknown mode decodes with 16-bit defaults.
        ExecMode::Bits16 | ExecMode::Unknown => 16,
    }
}

/// Size, class, kind and direct displacement of a decoded instruction.
pub(super) type Classified = (u8, InsnClass, InsnKind, Option<i64>);

/// Why `classify` could not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Undecodable {
    /// The bytes end inside the instruction.
    NeedMore,
    Invalid,
}

/// Decodes the instruction at the start of `bytes`: size, class, kind, displacement.
/// The common instructions by our own length decoder ([`ild`]), the others by iced-x86.
#[inline]
pub(super) fn classify(bytes: &[u8], ip: u64, mode: ExecMode) -> Result<Classified, Undecodable> {
    match ild::classify(bytes, ip, mode) {
        Some(known) => Ok(known),
        None => classify_iced(bytes, ip, mode),
    }
}

/// [`classify`] by iced-x86 alone.
pub(super) fn classify_iced(
    bytes: &[u8],
    ip: u64,
    mode: ExecMode,
) -> Result<Classified, Undecodable> {
    if let Some(jmpabs) = jmpabs(bytes, mode) {
        return jmpabs;
    }
    let mut decoder = Decoder::with_ip(bitness(mode), bytes, ip, DecoderOptions::NO_INVALID_CHECK);
    let mut instr = Instruction::default();
    decoder.decode_out(&mut instr);
    if instr.is_invalid() {
        return Err(if decoder.last_error() == DecoderError::NoMoreBytes {
            Undecodable::NeedMore
        } else {
            Undecodable::Invalid
        });
    }
    let size = u8::try_from(instr.len()).map_err(|_| Undecodable::Invalid)?;
    let (class, kind) = class_of(&instr);
    let displacement = match kind {
        InsnKind::Jcc
        | InsnKind::Jrcxz
        | InsnKind::Loop
        | InsnKind::CallDirect
        | InsnKind::JmpDirect => Some(
            instr
                .near_branch_target()
                .wrapping_sub(instr.next_ip())
                .cast_signed(),
        ),
        _ => None,
    };
    Ok((size, class, kind, displacement))
}

/// JMPABS (`REX2 A1 imm64` with map 0 and W=0, 64-bit mode), which iced-x86 does not
/// decode.
fn jmpabs(bytes: &[u8], mode: ExecMode) -> Option<Result<Classified, Undecodable>> {
    let [0xd5, rex2, 0xa1, ..] = *bytes else {
        return None;
    };
    if mode != ExecMode::Bits64 || rex2 & 0x88 != 0 {
        return None;
    }
    if bytes.len() < 11 {
        return Some(Err(Undecodable::NeedMore));
    }
    Some(Ok((11, InsnClass::Jump, InsnKind::Jmpabs, None)))
}

fn class_of(instr: &Instruction) -> (InsnClass, InsnKind) {
    use InsnClass as C;
    use InsnKind as K;
    if instr.is_jcc_short_or_near() {
        return (C::CondJump, K::Jcc);
    }
    if instr.is_jcx_short() {
        return (C::CondJump, K::Jrcxz);
    }
    if instr.is_loop() || instr.is_loopcc() {
        return (C::CondJump, K::Loop);
    }
    if instr.is_call_near() {
        return (C::Call, K::CallDirect);
    }
    if instr.is_call_near_indirect() {
        return (C::Call, K::CallIndirect);
    }
    if instr.is_call_far() || instr.is_call_far_indirect() {
        return (C::FarCall, K::CallFar);
    }
    if instr.is_jmp_short_or_near() {
        return (C::Jump, K::JmpDirect);
    }
    if instr.is_jmp_near_indirect() {
        return (C::Jump, K::JmpIndirect);
    }
    if instr.is_jmp_far() || instr.is_jmp_far_indirect() {
        return (C::FarJump, K::JmpFar);
    }
    match instr.mnemonic() {
        Mnemonic::Ret => (C::Return, K::Ret),
        Mnemonic::Retf => (C::FarReturn, K::RetFar),
        Mnemonic::Int => (C::FarCall, K::Int),
        Mnemonic::Int3 => (C::FarCall, K::Int3),
        Mnemonic::Int1 => (C::FarCall, K::Int1),
        Mnemonic::Into => (C::FarCall, K::Into),
        Mnemonic::Syscall => (C::FarCall, K::Syscall),
        Mnemonic::Sysenter => (C::FarCall, K::Sysenter),
        Mnemonic::Vmcall => (C::FarCall, K::Vmcall),
        Mnemonic::Iret | Mnemonic::Iretd | Mnemonic::Iretq => (C::FarReturn, K::Iret),
        Mnemonic::Sysexit | Mnemonic::Sysexitq => (C::FarReturn, K::Sysexit),
        Mnemonic::Sysret | Mnemonic::Sysretq => (C::FarReturn, K::Sysret),
        Mnemonic::Vmlaunch => (C::FarReturn, K::Vmlaunch),
        Mnemonic::Vmresume => (C::FarReturn, K::Vmresume),
        Mnemonic::Uiret => (C::FarReturn, K::Uiret),
        Mnemonic::Erets => (C::FarReturn, K::Erets),
        Mnemonic::Eretu => (C::FarReturn, K::Eretu),
        Mnemonic::Ptwrite => (C::PtWrite, K::Ptwrite),
        Mnemonic::Vmptrld => (C::Other, K::Vmptrld),
        Mnemonic::Mov
            if matches!(instr.code(), Code::Mov_cr_r32 | Code::Mov_cr_r64)
                && instr.op0_register() == Register::CR3 =>
        {
            (C::Other, K::MovCr3)
        }
        _ => (C::Other, K::Other),
    }
}

/// Makes iced-x86 build its decoder tables now (it does at its first decode, ~0.5 ms and
/// ~17,000 allocations, once per process): `--stats` times them apart from the decode, as
/// libipt's tables are static data and its decode time holds none of that.
pub fn build_decoder_tables() {
    let mut decoder = Decoder::with_ip(64, &[0x90], 0, DecoderOptions::NO_INVALID_CHECK);
    let _ = decoder.decode();
}

/// Decodes the instruction at `ip` in `mode` from `image`.
///
/// [`FlowError::NoMap`] when no code is mapped at `ip`, [`FlowError::BadInsn`] when the
/// bytes are not a valid instruction (or run into unmapped memory).
pub fn decode(image: &dyn ImageProvider, ip: u64, mode: ExecMode) -> Result<Insn, FlowError> {
    let mut raw = [0u8; MAX_INSN_SIZE];
    let (mut len, mapping) = image.read(ip, &mut raw).map_err(|_| FlowError::NoMap)?;
    let mut truncated = false;
    loop {
        match classify(&raw[..len], ip, mode) {
            Ok((size, class, kind, displacement)) => {
                return Ok(Insn {
                    ip,
                    mode,
                    size,
                    raw,
                    class,
                    kind,
                    displacement,
                    isid: mapping.isid,
                    truncated,
                });
            }
            Err(Undecodable::Invalid) => return Err(FlowError::BadInsn),
            Err(Undecodable::NeedMore) => {
                // Complete the instruction from the next mapped piece, if any.
                if len >= MAX_INSN_SIZE {
                    return Err(FlowError::BadInsn);
                }
                let next = ip.wrapping_add(len as u64);
                let (extra, _) = image
                    .read(next, &mut raw[len..])
                    .map_err(|_| FlowError::BadInsn)?;
                len += extra;
                truncated = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::pt::flow::image::Image;

    fn at(bytes: &[u8], mode: ExecMode) -> Insn {
        let mut image = Image::new();
        image.add("t", bytes.to_vec(), 0x1000);
        decode(&image, 0x1000, mode).unwrap()
    }

    #[test]
    fn classifies_branches_and_event_anchors() {
        let m = ExecMode::Bits64;
        let call = at(&[0xe8, 0x10, 0, 0, 0], m);
        assert_eq!(
            (call.class, call.size, call.next_ip()),
            (InsnClass::Call, 5, Ok(0x1015))
        );
        let jcc = at(&[0x74, 0xfe], m);
        assert_eq!(
            (jcc.class, jcc.displacement),
            (InsnClass::CondJump, Some(-2))
        );
        assert_eq!(jcc.next_ip(), Err(FlowError::BadQuery));
        assert_eq!(at(&[0xff, 0xd0], m).kind, InsnKind::CallIndirect);
        assert_eq!(at(&[0xc3], m).class, InsnClass::Return);
        assert_eq!(at(&[0x0f, 0x05], m).kind, InsnKind::Syscall);
        assert_eq!(at(&[0x48, 0xcf], m).kind, InsnKind::Iret);
        assert_eq!(at(&[0x0f, 0x22, 0xd8], m).kind, InsnKind::MovCr3);
        assert_eq!(at(&[0x0f, 0x01, 0xc2], m).class, InsnClass::FarReturn);
        assert_eq!(at(&[0xf3, 0x0f, 0xae, 0xe0], m).class, InsnClass::PtWrite);
        assert_eq!(at(&[0x90], m).next_ip(), Ok(0x1001));
        // A 16-bit call has a 16-bit displacement.
        assert_eq!(at(&[0xe8, 0x10, 0], ExecMode::Bits16).size, 3);
    }

    #[test]
    fn instructions_continue_into_the_next_section_and_fail_at_the_end() {
        let mut image = Image::new();
        image.add("a", vec![0xe8, 0x00], 0x1000);
        image.add("b", vec![0x00, 0x00, 0x00], 0x1002);
        let insn = decode(&image, 0x1000, ExecMode::Bits64).unwrap();
        assert!(insn.truncated && insn.size == 5);
        let mut image = Image::new();
        image.add("a", vec![0xe8, 0x00], 0x1000);
        assert_eq!(
            decode(&image, 0x1000, ExecMode::Bits64),
            Err(FlowError::BadInsn)
        );
        assert_eq!(
            decode(&image, 0x2000, ExecMode::Bits64),
            Err(FlowError::NoMap)
        );
    }
}
