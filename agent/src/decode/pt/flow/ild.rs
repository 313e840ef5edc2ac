//! The common x86 instructions' length and branch kind, without iced-x86.
//!
//! In: the bytes at an instruction's address, the address and the execution mode. Out:
//! the same size, class, kind and displacement as [`super::insn`]'s iced-x86 decode, or
//! `None` where this decoder does not know the instruction (VEX, EVEX, the 0F 38 and
//! 0F 3A maps, far transfers, system and rare instructions, 16-bit code or addressing,
//! prefixes after REX, too few bytes ...); then iced-x86 decides.
//!
//! Why: the first visit of code decodes each instruction once, and that is most of a
//! short trace's decode. iced-x86's full decode (operands, registers, memory) costs
//! ~500 instructions where the length and the branch kind need a few dozen; Intel's own
//! decoder has a length decoder of this kind (libipt's `pt_ild`) for the same reason.
//! Exact by test, not by review: every prefix set × opcode × `ModRM` (with each SIB and
//! displacement form) this decoder accepts is compared with iced-x86 in both modes, and
//! so is every byte offset of the real traces' code when they are at hand (`tests`).

use super::insn::{Classified, InsnClass, InsnKind, MAX_INSN_SIZE};
use crate::decode::pt::packets::packet::ExecMode;

/// The branches this decoder knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rel {
    Jcc,
    Loop,
    Jrcxz,
    Jmp,
    Call,
}

/// What follows an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// Not known here: iced-x86 decides.
    No,
    /// Nothing.
    Bare,
    /// `ModRM` (with SIB and displacement).
    M,
    /// `ModRM` with a memory operand (LEA): a register there is no instruction.
    Lea,
    /// `ModRM` and an 8-bit immediate.
    MI8,
    /// `ModRM` and an immediate of the operand size (16 or 32 bits).
    MIz,
    /// An 8-bit immediate.
    I8,
    /// A 16- or 32-bit immediate.
    Iz,
    /// MOV r, imm: 16, 32 or, with REX.W, 64 bits.
    Iv,
    /// A memory offset of the address size (MOV AL/eAX to or from moffs).
    Moffs,
    /// ENTER: a 16-bit and an 8-bit immediate.
    Enter,
    /// A near branch with an 8-bit displacement.
    Rel8(Rel),
    /// A near branch with a 32-bit displacement.
    Rel32(Rel),
    /// RET, and RET imm16.
    Ret,
    RetImm,
    /// F6/F7: TEST (/0, /1) has an immediate, NOT, NEG, MUL, DIV ... none.
    Grp3b,
    Grp3v,
    /// FE: INC and DEC only.
    Grp4,
    /// FF: INC, DEC, PUSH; near indirect CALL (/2) and JMP (/4).
    Grp5,
    /// C6/C7: MOV (/0) only.
    Grp11b,
    Grp11v,
    /// 0F BA: BT, BTS, BTR, BTC with an 8-bit immediate (/4 to /7).
    Grp8,
}

/// The one-byte opcode map of 64-bit mode.
const ONE: [Form; 256] = one_byte_map(true);
/// The one-byte opcode map of 32-bit mode.
const ONE32: [Form; 256] = one_byte_map(false);
/// The 0F opcode map (both modes).
const TWO: [Form; 256] = two_byte_map();

/// Where a 0F opcode with a `ModRM` is a valid instruction: bit `p` for register operands
/// (`ModRM`.mod 3), bit `4 + p` for memory operands, where `p` is the mandatory prefix (0
/// none, 1 66, 2 F3, 3 F2). The SSE opcodes are valid with some prefixes only, and
/// some with one kind of operand only (MOVMSKPS takes a register, MOVNTI memory). Made
/// from iced-x86's decoder and checked against it by a test.
#[rustfmt::skip]
const TWO_VALID: [u8; 256] = [
    0x00, 0x40, 0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0xff, 0x00, 0xff, 0xff, 0x00,
    0xff, 0xff, 0xfd, 0x30, 0x33, 0x33, 0x75, 0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x33, 0x33, 0xff, 0xf0, 0xff, 0xff, 0x33, 0x33,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0x03, 0xff, 0x55, 0x55, 0x33, 0x33, 0x33, 0x33, 0xff, 0xff, 0xff, 0x77, 0xff, 0xff, 0xff, 0xff,
    0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x22, 0x22, 0x33, 0x77,
    0xff, 0x00, 0x00, 0x00, 0x33, 0x33, 0x33, 0x11, 0x19, 0x1b, 0x00, 0x00, 0xaa, 0xaa, 0x77, 0x77,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x04, 0x04, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x10, 0xff,
    0xff, 0xff, 0xf0, 0xff, 0xf0, 0xf0, 0xff, 0xff, 0x44, 0xff, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0x10, 0x33, 0x03, 0x33, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
    0xaa, 0x33, 0x33, 0x33, 0x33, 0x33, 0x2e, 0x03, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33,
    0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0xee, 0x30, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33,
    0x80, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x03, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0xff,
];

const fn one_byte_map(long: bool) -> [Form; 256] {
    use Form::{
        Bare, Enter, Grp3b, Grp3v, Grp4, Grp5, Grp11b, Grp11v, I8, Iv, Iz, Lea, M, MI8, MIz, Moffs,
        No, Rel8, Rel32, Ret, RetImm,
    };
    let mut t = [No; 256];
    // ADD, OR, ADC, SBB, AND, SUB, XOR, CMP: r/m forms, then AL/eAX with an immediate.
    let mut op = 0;
    while op < 0x40 {
        t = filled(
            t,
            &[(op, op + 3, M), (op + 4, op + 4, I8), (op + 5, op + 5, Iz)],
        );
        op += 8;
    }
    if !long {
        // PUSH/POP of segment registers, DAA, DAS, AAA, AAS, INC/DEC r, PUSHA, POPA.
        t = filled(
            t,
            &[
                (0x06, 0x07, Bare),
                (0x0e, 0x0e, Bare),
                (0x16, 0x17, Bare),
                (0x1e, 0x1f, Bare),
                (0x27, 0x27, Bare),
                (0x2f, 0x2f, Bare),
                (0x37, 0x37, Bare),
                (0x3f, 0x3f, Bare),
                (0x40, 0x4f, Bare),
                (0x60, 0x61, Bare),
            ],
        );
    }
    filled(
        t,
        &[
            (0x50, 0x5f, Bare),
            (0x63, 0x63, M),
            (0x68, 0x68, Iz),
            (0x69, 0x69, MIz),
            (0x6a, 0x6a, I8),
            (0x6b, 0x6b, MI8),
            (0x6c, 0x6f, Bare),
            (0x70, 0x7f, Rel8(Rel::Jcc)),
            (0x80, 0x80, MI8),
            (0x81, 0x81, MIz),
            (0x83, 0x83, MI8),
            (0x84, 0x8e, M),
            // MOV to and from segment registers: not every register field is one.
            (0x8c, 0x8c, No),
            (0x8d, 0x8d, Lea),
            (0x8e, 0x8e, No),
            (0x90, 0x99, Bare),
            (0x9b, 0x9f, Bare),
            (0xa0, 0xa3, Moffs),
            (0xa4, 0xa7, Bare),
            (0xa8, 0xa8, I8),
            (0xa9, 0xa9, Iz),
            (0xaa, 0xaf, Bare),
            (0xb0, 0xb7, I8),
            (0xb8, 0xbf, Iv),
            (0xc0, 0xc1, MI8),
            (0xc2, 0xc2, RetImm),
            (0xc3, 0xc3, Ret),
            (0xc6, 0xc6, Grp11b),
            (0xc7, 0xc7, Grp11v),
            (0xc8, 0xc8, Enter),
            (0xc9, 0xc9, Bare),
            (0xd0, 0xd3, M),
            (0xd7, 0xd7, Bare),
            (0xe0, 0xe2, Rel8(Rel::Loop)),
            (0xe3, 0xe3, Rel8(Rel::Jrcxz)),
            (0xe4, 0xe7, I8),
            (0xe8, 0xe8, Rel32(Rel::Call)),
            (0xe9, 0xe9, Rel32(Rel::Jmp)),
            (0xeb, 0xeb, Rel8(Rel::Jmp)),
            (0xec, 0xef, Bare),
            (0xf4, 0xf5, Bare),
            (0xf6, 0xf6, Grp3b),
            (0xf7, 0xf7, Grp3v),
            (0xf8, 0xfd, Bare),
            (0xfe, 0xfe, Grp4),
            (0xff, 0xff, Grp5),
        ],
    )
}

const fn two_byte_map() -> [Form; 256] {
    use Form::{Bare, Grp8, M, MI8, Rel32};
    filled(
        [Form::No; 256],
        &[
            (0x0d, 0x0d, M),
            (0x10, 0x17, M),
            (0x18, 0x1f, M),
            (0x28, 0x2f, M),
            (0x40, 0x4f, M),
            (0x50, 0x6f, M),
            (0x70, 0x70, MI8),
            (0x74, 0x76, M),
            (0x80, 0x8f, Rel32(Rel::Jcc)),
            (0x90, 0x9f, M),
            (0xa2, 0xa2, Bare),
            (0xa3, 0xa3, M),
            (0xa4, 0xa4, MI8),
            (0xa5, 0xa5, M),
            (0xab, 0xab, M),
            (0xac, 0xac, MI8),
            (0xad, 0xad, M),
            (0xaf, 0xaf, M),
            (0xb0, 0xb1, M),
            (0xb3, 0xb3, M),
            (0xb6, 0xb8, M),
            (0xba, 0xba, Grp8),
            (0xbb, 0xbf, M),
            (0xc0, 0xc1, M),
            (0xc2, 0xc2, MI8),
            (0xc3, 0xc3, M),
            (0xc4, 0xc6, MI8),
            (0xc8, 0xcf, Bare),
            (0xd0, 0xfe, M),
        ],
    )
}

/// `t` with each `(first, last, form)` range of opcodes set to its form, in order (a
/// later range overrides an earlier one).
const fn filled(mut t: [Form; 256], ranges: &[(usize, usize, Form)]) -> [Form; 256] {
    let mut i = 0;
    while i < ranges.len() {
        let (first, last, form) = ranges[i];
        let mut op = first;
        while op <= last {
            t[op] = form;
            op += 1;
        }
        i += 1;
    }
    t
}

/// The prefixes before an opcode, as far as length and kind go.
#[derive(Clone, Copy, Default)]
struct Prefixes {
    /// 66: 16-bit operands.
    opsize: bool,
    /// 67: the other address size.
    adsize: bool,
    /// REX.W: 64-bit operands.
    rex_w: bool,
    /// The last of F3 and F2, if any.
    rep: u8,
}

impl Prefixes {
    /// The mandatory prefix of an SSE opcode, as [`TWO_VALID`] numbers it: the last F3
    /// or F2, else 66.
    fn mandatory(self) -> u8 {
        match (self.rep, self.opsize) {
            (0xf3, _) => 2,
            (0xf2, _) => 3,
            (_, true) => 1,
            _ => 0,
        }
    }
}

/// Size, class, kind and displacement of the instruction at the start of `bytes`, where
/// this decoder knows it; `None` leaves it to iced-x86.
#[inline]
pub(super) fn classify(bytes: &[u8], ip: u64, mode: ExecMode) -> Option<Classified> {
    if mode == ExecMode::Bits64
        && let Some(common) = classify_common(bytes)
    {
        return Some(common);
    }
    classify_general(bytes, ip, mode)
}

/// [`classify`] for every form this decoder knows (prefixes, 32-bit code, the 0F map,
/// the groups).
#[inline(never)]
fn classify_general(bytes: &[u8], ip: u64, mode: ExecMode) -> Option<Classified> {
    let long = match mode {
        ExecMode::Bits64 => true,
        // Above this, a 32-bit IP wraps inside the instruction.
        ExecMode::Bits32 if ip < 0xffff_ff00 => false,
        _ => return None,
    };
    let (pre, op_at) = prefixes(bytes, long)?;
    let (form, at) = form(bytes, op_at, pre, long)?;
    let (operands, (class, kind), rel) = operands(bytes, at, form, pre, long)?;
    let size = at + operands;
    if size > MAX_INSN_SIZE || size > bytes.len() {
        return None;
    }
    let size = u8::try_from(size).ok()?;
    // The displacement to the target as iced-x86 gives it: in 32-bit code the target
    // wraps at 4 GiB.
    let displacement = rel.map(|disp| {
        let next = ip.wrapping_add(u64::from(size));
        let target = next.wrapping_add_signed(disp);
        let target = if long { target } else { target & 0xffff_ffff };
        target.wrapping_sub(next).cast_signed()
    });
    Some((size, class, kind, displacement))
}

/// The operand bytes after a one-byte opcode of 64-bit code without legacy prefixes,
/// as [`Form`] gives them ([`COMMON`]): only the forms whose length needs nothing but a
/// `ModRM` and REX.W.
mod common {
    /// Not taken here: [`super::classify`]'s general path decides.
    pub const NO: u8 = 0;
    pub const BARE: u8 = 1;
    pub const M: u8 = 2;
    pub const M_I8: u8 = 3;
    pub const M_I32: u8 = 4;
    pub const I8: u8 = 5;
    pub const I32: u8 = 6;
    /// MOV r, imm: 64 bits with REX.W, else 32.
    pub const IV: u8 = 7;
    /// LEA: a `ModRM` with a memory operand.
    pub const LEA: u8 = 8;
}

/// [`ONE`]'s forms as [`common`] codes (the branches, groups and rarer forms are not).
const COMMON: [u8; 256] = common_map();

const fn common_map() -> [u8; 256] {
    let mut t = [common::NO; 256];
    let mut op = 0;
    while op < 256 {
        t[op] = match ONE[op] {
            Form::Bare => common::BARE,
            Form::M => common::M,
            Form::MI8 => common::M_I8,
            Form::MIz => common::M_I32,
            Form::I8 => common::I8,
            Form::Iz => common::I32,
            Form::Iv => common::IV,
            Form::Lea => common::LEA,
            _ => common::NO,
        };
        op += 1;
    }
    t
}

/// [`classify`] for what compilers emit most, in 64-bit code: no legacy prefix, maybe
/// REX, a one-byte opcode of a plain form, a near relative branch (Jcc, JMP, CALL, the
/// 0F Jcc), RET, or an FF group instruction; `None` for anything else (the general path
/// then decides, as before). Why: a first visit of code decodes every instruction once,
/// and the general path's prefix loop, form dispatch and checks cost ~125 instructions
/// an instruction (callgrind, foo's trace), most of a short trace's first visits.
#[inline(never)]
fn classify_common(bytes: &[u8]) -> Option<Classified> {
    let b0 = *bytes.first()?;
    let (rex_w, at) = if b0 & 0xf0 == 0x40 {
        (b0 & 0x08 != 0, 1)
    } else {
        (false, 0)
    };
    let op = *bytes.get(at)?;
    let at = at + 1;
    let (operands, kind, disp) = match COMMON[usize::from(op)] {
        common::NO => match op {
            0x70..=0x7f | 0xeb => {
                let disp = i64::from(i8::from_le_bytes([*bytes.get(at)?]));
                let kind = if op == 0xeb {
                    (InsnClass::Jump, InsnKind::JmpDirect)
                } else {
                    (InsnClass::CondJump, InsnKind::Jcc)
                };
                (1, kind, Some(disp))
            }
            0xe8 | 0xe9 => {
                let kind = if op == 0xe8 {
                    (InsnClass::Call, InsnKind::CallDirect)
                } else {
                    (InsnClass::Jump, InsnKind::JmpDirect)
                };
                (4, kind, Some(rel32(bytes, at)?))
            }
            0xc3 => (0, (InsnClass::Return, InsnKind::Ret), None),
            0x0f => match *bytes.get(at)? {
                0x80..=0x8f => (
                    5,
                    (InsnClass::CondJump, InsnKind::Jcc),
                    Some(rel32(bytes, at + 1)?),
                ),
                _ => return None,
            },
            0xff => {
                let kind = match *bytes.get(at)? >> 3 & 7 {
                    0 | 1 | 6 => OTHER,
                    2 => (InsnClass::Call, InsnKind::CallIndirect),
                    4 => (InsnClass::Jump, InsnKind::JmpIndirect),
                    _ => return None,
                };
                (modrm_len(bytes, at)?, kind, None)
            }
            _ => return None,
        },
        common::BARE => (0, OTHER, None),
        common::M => (modrm_len(bytes, at)?, OTHER, None),
        common::M_I8 => (modrm_len(bytes, at)? + 1, OTHER, None),
        common::M_I32 => (modrm_len(bytes, at)? + 4, OTHER, None),
        common::I8 => (1, OTHER, None),
        common::I32 => (4, OTHER, None),
        common::IV => (if rex_w { 8 } else { 4 }, OTHER, None),
        _ if *bytes.get(at)? >> 6 != 3 => (modrm_len(bytes, at)?, OTHER, None),
        _ => return None,
    };
    let size = at + operands;
    if size > bytes.len() {
        return None;
    }
    // (At most 1 + 1 + 5 + 8 bytes: within MAX_INSN_SIZE.)
    let size = u8::try_from(size).ok()?;
    Some((size, kind.0, kind.1, disp))
}

/// The 32-bit displacement at `at`, sign-extended.
fn rel32(bytes: &[u8], at: usize) -> Option<i64> {
    let raw = bytes.get(at..at + 4)?;
    Some(i64::from(i32::from_le_bytes([
        raw[0], raw[1], raw[2], raw[3],
    ])))
}

/// The prefixes and where the opcode is; `None` for more than four legacy prefixes, a
/// prefix after REX or 16-bit addressing.
fn prefixes(bytes: &[u8], long: bool) -> Option<(Prefixes, usize)> {
    let mut pre = Prefixes::default();
    let mut at = 0;
    let mut op = loop {
        let byte = *bytes.get(at)?;
        match byte {
            0x66 => pre.opsize = true,
            0x67 => pre.adsize = true,
            0xf2 | 0xf3 => pre.rep = byte,
            0xf0 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65 => {}
            _ => break byte,
        }
        at += 1;
        if at > 4 {
            return None;
        }
    };
    if long && op & 0xf0 == 0x40 {
        pre.rex_w = op & 0x08 != 0;
        at += 1;
        op = *bytes.get(at)?;
        // A prefix after REX cancels it, a second REX replaces it: iced-x86's business.
        if is_prefix(op) || op & 0xf0 == 0x40 {
            return None;
        }
    }
    // 16-bit addressing in 32-bit code.
    if pre.adsize && !long {
        return None;
    }
    Some((pre, at))
}

/// The form of the opcode at `at` and where its operands start; `None` for an SSE
/// opcode that is no instruction with these prefixes and operands.
fn form(bytes: &[u8], at: usize, pre: Prefixes, long: bool) -> Option<(Form, usize)> {
    let op = *bytes.get(at)?;
    if op != 0x0f {
        let map = if long { &ONE } else { &ONE32 };
        return Some((map[usize::from(op)], at + 1));
    }
    let op2 = usize::from(*bytes.get(at + 1)?);
    let form = TWO[op2];
    if matches!(form, Form::M | Form::MI8) {
        let memory = *bytes.get(at + 2)? >> 6 != 3;
        let bit = pre.mandatory() + if memory { 4 } else { 0 };
        if TWO_VALID[op2] >> bit & 1 == 0 {
            return None;
        }
    }
    Some((form, at + 2))
}

/// Not a branch.
const OTHER: (InsnClass, InsnKind) = (InsnClass::Other, InsnKind::Other);

/// The operand bytes of `form` at `at`, the class and kind, and a relative branch's
/// displacement.
type Operands = (usize, (InsnClass, InsnKind), Option<i64>);

fn operands(bytes: &[u8], at: usize, form: Form, pre: Prefixes, long: bool) -> Option<Operands> {
    let z = if pre.opsize && !pre.rex_w { 2 } else { 4 };
    let modrm = || modrm_len(bytes, at);
    let reg = || bytes.get(at).map(|modrm| modrm >> 3 & 7);
    Some(match form {
        Form::Bare => (0, OTHER, None),
        Form::M => (modrm()?, OTHER, None),
        Form::Lea if *bytes.get(at)? >> 6 != 3 => (modrm()?, OTHER, None),
        Form::MI8 => (modrm()? + 1, OTHER, None),
        Form::MIz => (modrm()? + z, OTHER, None),
        Form::I8 => (1, OTHER, None),
        Form::Iz => (z, OTHER, None),
        Form::Iv => (if pre.rex_w { 8 } else { z }, OTHER, None),
        Form::Moffs => (if long && !pre.adsize { 8 } else { 4 }, OTHER, None),
        Form::Enter => (3, OTHER, None),
        Form::Grp3b | Form::Grp3v => {
            let imm = match (reg()? < 2, form == Form::Grp3b) {
                (false, _) => 0,
                (true, true) => 1,
                (true, false) => z,
            };
            (modrm()? + imm, OTHER, None)
        }
        Form::Grp4 if reg()? < 2 => (modrm()?, OTHER, None),
        Form::Grp11b if reg()? == 0 => (modrm()? + 1, OTHER, None),
        Form::Grp11v if reg()? == 0 => (modrm()? + z, OTHER, None),
        Form::Grp8 if reg()? >= 4 => (modrm()? + 1, OTHER, None),
        Form::No | Form::Lea | Form::Grp4 | Form::Grp11b | Form::Grp11v | Form::Grp8 => {
            return None;
        }
        Form::Grp5 => match reg()? {
            0 | 1 | 6 => (modrm()?, OTHER, None),
            // Near indirect branches; 66 makes them 16-bit, which Intel and AMD differ on.
            2 if !pre.opsize => (modrm()?, (InsnClass::Call, InsnKind::CallIndirect), None),
            4 if !pre.opsize => (modrm()?, (InsnClass::Jump, InsnKind::JmpIndirect), None),
            _ => return None,
        },
        // The same with returns and relative branches.
        _ if pre.opsize => return None,
        Form::Ret => (0, (InsnClass::Return, InsnKind::Ret), None),
        Form::RetImm => (2, (InsnClass::Return, InsnKind::Ret), None),
        Form::Rel8(rel) => {
            let disp = i64::from(i8::from_le_bytes([*bytes.get(at)?]));
            (1, rel_kind(rel), Some(disp))
        }
        Form::Rel32(rel) => (4, rel_kind(rel), Some(rel32(bytes, at)?)),
    })
}

fn is_prefix(byte: u8) -> bool {
    matches!(
        byte,
        0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3 | 0x2e | 0x36 | 0x3e | 0x26 | 0x64 | 0x65
    )
}

fn rel_kind(rel: Rel) -> (InsnClass, InsnKind) {
    match rel {
        Rel::Jcc => (InsnClass::CondJump, InsnKind::Jcc),
        Rel::Loop => (InsnClass::CondJump, InsnKind::Loop),
        Rel::Jrcxz => (InsnClass::CondJump, InsnKind::Jrcxz),
        Rel::Jmp => (InsnClass::Jump, InsnKind::JmpDirect),
        Rel::Call => (InsnClass::Call, InsnKind::CallDirect),
    }
}

/// The bytes of a `ModRM` at `at` with its SIB and displacement (32- and 64-bit
/// addressing).
fn modrm_len(bytes: &[u8], at: usize) -> Option<usize> {
    let modrm = *bytes.get(at)?;
    let md = modrm >> 6;
    if md == 3 {
        return Some(1);
    }
    let mut len = 1;
    let mut base = modrm & 7;
    if base == 4 {
        base = *bytes.get(at + 1)? & 7;
        len += 1;
    }
    len += match md {
        0 if base == 5 => 4,
        0 => 0,
        1 => 1,
        _ => 4,
    };
    Some(len)
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use super::super::insn::classify_iced;
    use super::*;

    /// Legacy prefix sets, in the orders compilers and hand-written code use and some
    /// they do not (several of F2, F3 and 66: the last F2/F3 is the mandatory one).
    const PREFIXES: &[&[u8]] = &[
        &[],
        &[0x66],
        &[0x67],
        &[0xf2],
        &[0xf3],
        &[0xf0],
        &[0x2e],
        &[0x64],
        &[0x66, 0xf2],
        &[0xf3, 0x66],
        &[0x66, 0x67],
        &[0xf0, 0x66],
        &[0x26, 0x36, 0x3e, 0x65],
        &[0x66, 0x66, 0x66, 0x66, 0x66],
        &[0xf2, 0xf3],
        &[0xf3, 0xf2],
        &[0xf2, 0x66],
        &[0x66, 0xf3, 0x67],
    ];

    /// REX bytes: W changes lengths, R, X and B do not (one of them stands for all).
    const REX: &[&[u8]] = &[&[], &[0x48], &[0x41], &[0x4d], &[0x40]];

    /// `ModRM` bytes: all of them, or every reg with every kind of addressing (register,
    /// SIB, RIP-relative or absolute, 8- and 32-bit displacements).
    fn modrms(all: bool) -> Vec<u8> {
        if all {
            return (0..=255).collect();
        }
        let rm = [0x00, 0x04, 0x05, 0x44, 0x41, 0x84, 0x80, 0xc0, 0xc7];
        (0..8u8)
            .flat_map(|reg| rm.iter().map(move |m| m | reg << 3))
            .collect()
    }

    /// SIB bytes that matter after `modrm`: the base-5 forms take a displacement.
    fn sibs(modrm: u8) -> &'static [u8] {
        if modrm >> 6 != 3 && modrm & 7 == 4 {
            &[0x00, 0x05, 0x25, 0xe5, 0x24]
        } else {
            &[0x00]
        }
    }

    /// Compares this decoder with iced-x86 on `bytes` (15 at most, as the flow layer
    /// reads them) where it takes them; counts what it took.
    fn same_as_iced(bytes: &[u8], ip: u64, mode: ExecMode, taken: &mut u64) {
        let Some(ours) = classify(bytes, ip, mode) else {
            return;
        };
        *taken += 1;
        assert_eq!(
            classify_iced(bytes, ip, mode),
            Ok(ours),
            "{mode:?} at {ip:#x}: {bytes:02x?}"
        );
        // One byte short is never taken: iced-x86 asks for more.
        let short = &bytes[..usize::from(ours.0) - 1];
        assert_eq!(classify(short, ip, mode), None, "{mode:?}: {short:02x?}");
    }

    /// Every opcode of the one-byte and 0F maps, after every prefix set and REX byte,
    /// with every `ModRM` (all 256 without prefixes, every reg × addressing kind with),
    /// the SIB forms, positive and negative displacements, in 64-bit code (also at the
    /// top of the address space, where branch targets wrap) and 32-bit code: whatever
    /// the length decoder takes, iced-x86 decodes alike (size, class, kind, target).
    #[test]
    fn the_length_decoder_agrees_with_iced_on_every_form_it_takes() {
        let tails: [[u8; 15]; 2] = [
            [
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e,
                0x0f,
            ],
            [
                0x91, 0xa2, 0xb3, 0xc4, 0xd5, 0xe6, 0xf7, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee,
                0xff,
            ],
        ];
        let mut taken = 0;
        for (mode, ip) in [
            (ExecMode::Bits64, 0x5555_5555_1000),
            (ExecMode::Bits32, 0x0804_8000),
            (ExecMode::Bits64, 0xffff_ffff_ffff_fff0),
            (ExecMode::Bits32, 0xffff_fe00),
        ] {
            let rexes: &[&[u8]] = if mode == ExecMode::Bits64 {
                REX
            } else {
                &[&[]]
            };
            let wraps = ip > 0xffff_0000;
            for (p, prefix) in PREFIXES.iter().enumerate() {
                for (r, rex) in rexes.iter().enumerate() {
                    // Near the top, only the plain forms: what wraps is the target.
                    if wraps && p + r > 0 {
                        continue;
                    }
                    for escape in [&[][..], &[0x0f]] {
                        for op in 0..=255u8 {
                            for modrm in modrms(p == 0 && r == 0) {
                                for &sib in sibs(modrm) {
                                    // Either sign for each ModRM, both for each opcode.
                                    let tail = &tails[usize::from((modrm ^ sib) & 1)];
                                    let mut bytes = Vec::with_capacity(32);
                                    bytes.extend_from_slice(prefix);
                                    bytes.extend_from_slice(rex);
                                    bytes.extend_from_slice(escape);
                                    bytes.extend([op, modrm, sib]);
                                    bytes.extend_from_slice(tail);
                                    bytes.truncate(MAX_INSN_SIZE);
                                    same_as_iced(&bytes, ip, mode, &mut taken);
                                }
                            }
                        }
                    }
                }
            }
        }
        // It takes most of what it was made for.
        assert!(taken > 500_000, "{taken}");
    }

    /// [`TWO_VALID`] is iced-x86's: every 0F opcode with every register field, with
    /// each mandatory prefix, register and memory operands, both modes.
    #[test]
    fn the_sse_validity_table_is_iceds() {
        let mut table = [0u8; 256];
        for (op, valid) in (0..=255u8).zip(table.iter_mut()) {
            for (p, prefix) in [&[][..], &[0x66], &[0xf3], &[0xf2]].iter().enumerate() {
                for (m, modrm) in [0xc0u8, 0x00].iter().enumerate() {
                    let all = [ExecMode::Bits64, ExecMode::Bits32].iter().all(|&mode| {
                        (0..8u8).all(|reg| {
                            let mut bytes = prefix.to_vec();
                            bytes.extend([0x0f, op, modrm | reg << 3]);
                            bytes.extend([0; 12]);
                            classify_iced(&bytes, 0x1000, mode).is_ok()
                        })
                    });
                    *valid |= u8::from(all) << (p + 4 * m);
                }
            }
        }
        assert_eq!(table, TWO_VALID);
    }

    /// The real traces' code, where it is at hand (`LOOKBACK_REAL_TRACES/libxdc` or
    /// `../real-traces/libxdc`: nyx-fuzz/libxdc_experiments' page dumps of mruby, qemu,
    /// foo ...): every byte offset of every page, as 64-bit and as 32-bit code, decodes
    /// alike wherever the length decoder takes it; and it takes most instructions of
    /// real 64-bit code (the point of it).
    #[test]
    fn the_length_decoder_agrees_with_iced_on_real_code() {
        let given = std::env::var_os("LOOKBACK_REAL_TRACES");
        let dir = given.clone().map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../real-traces"),
            PathBuf::from,
        );
        assert!(
            given.is_none() || dir.is_dir(),
            "LOOKBACK_REAL_TRACES={} is not a directory",
            dir.display()
        );
        let dumps: Vec<PathBuf> = fs::read_dir(dir.join("libxdc"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|case| fs::read_dir(case.path()).ok())
            .flatten()
            .flatten()
            .map(|file| file.path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "dump"))
            .collect();
        if dumps.is_empty() {
            println!("no real code under {}: skipped", dir.display());
            return;
        }
        let (mut offsets, mut taken) = (0u64, 0u64);
        for dump in &dumps {
            let code = fs::read(dump).expect("readable dump");
            for at in 0..code.len() {
                let bytes = &code[at..code.len().min(at + MAX_INSN_SIZE)];
                let ip = 0x40_0000 + at as u64;
                offsets += 1;
                same_as_iced(bytes, ip, ExecMode::Bits64, &mut taken);
                let mut unused = 0;
                same_as_iced(bytes, ip, ExecMode::Bits32, &mut unused);
            }
        }
        println!(
            "{} dumps, {offsets} offsets, {taken} taken in 64-bit mode",
            dumps.len()
        );
        assert!(taken * 10 > offsets * 7, "{taken} of {offsets}");
    }
}
