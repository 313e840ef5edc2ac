//! Where a function can be left: a linear walk of its code (the ELF symbol's extent, plus
//! its compiler-split `.cold` parts) with iced-x86, listing every `ret` and every jump
//! whose target may be outside the function. A latency rule puts a uprobe on each of them
//! instead of a uretprobe, so the return address on the target's stack is never touched
//! (see `agent-ebpf/src/function.rs`).
//!
//! In: the function's pieces as (ELF virtual address, bytes). Out: the exit sites, or an
//! error naming the first instruction the walk cannot classify safely — never a guess,
//! since a probe put off an instruction boundary would corrupt the target's code.
use iced_x86::{
    ConditionCode, Decoder, DecoderOptions, FlowControl, Instruction, Mnemonic, OpKind, Register,
};
use lookback_common::probe::{CodeRange, JumpSite, MAX_CODE_RANGES, REG_NONE, REG_RIP};

/// One piece of a function's code.
#[derive(Debug, Clone, Copy)]
pub struct CodePiece<'a> {
    /// ELF virtual address of `bytes[0]`.
    pub address: u64,
    pub bytes: &'a [u8],
}

/// How an exit site leaves the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// `ret` / `ret imm16`.
    Ret,
    /// A direct `jmp` out of the function (a tail call).
    Jump,
    /// A conditional jump out of the function; `condition` is Intel's `tttn` (0 = O … 15 = G).
    CondJump { condition: u8 },
    /// `jmp reg` / `jmp [mem]`: the BPF program computes the target and decides.
    IndirectJump(JumpSite),
}

impl ExitKind {
    /// Short name, for logs and `--json`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Ret => "ret",
            Self::Jump => "jump",
            Self::CondJump { .. } => "cond_jump",
            Self::IndirectJump(_) => "indirect_jump",
        }
    }
}

/// An instruction that leaves (or may leave) the function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitSite {
    /// ELF virtual address of the instruction.
    pub address: u64,
    pub kind: ExitKind,
}

/// Why a function's exits cannot be found safely.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WalkError {
    #[error("its symbol has no size, so its end is unknown")]
    NoSize,
    #[error("its code is not in the file (a size of {size} bytes at {address:#x})")]
    NoCode { address: u64, size: u64 },
    #[error("the instruction at {address:#x} cannot be decoded")]
    Undecodable { address: u64 },
    #[error("the instruction at {address:#x} runs past the function's end")]
    PastEnd { address: u64 },
    #[error("the `{text}` at {address:#x} may leave the function in a way lookback cannot follow")]
    Unsupported { address: u64, text: String },
    #[error("it has no instruction that leaves it (no ret or jump out)")]
    NoExit,
    #[error("it has more than {MAX_CODE_RANGES} code pieces")]
    TooManyPieces,
}

/// The exit sites of the function made of `pieces` (`pieces[0]` is its body, starting at
/// the function's entry).
///
/// # Errors
/// [`WalkError`] when an instruction cannot be decoded or classified, or nothing leaves.
pub fn function_exits(pieces: &[CodePiece<'_>]) -> Result<Vec<ExitSite>, WalkError> {
    if pieces.len() > MAX_CODE_RANGES {
        return Err(WalkError::TooManyPieces);
    }
    let inside = |target: u64| {
        pieces
            .iter()
            .any(|p| target >= p.address && target - p.address < p.bytes.len() as u64)
    };
    let mut exits = Vec::new();
    for piece in pieces {
        let end = piece.address + piece.bytes.len() as u64;
        let mut decoder = Decoder::with_ip(64, piece.bytes, piece.address, DecoderOptions::NONE);
        let mut insn = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut insn);
            let address = insn.ip();
            if insn.is_invalid() {
                // A truncated instruction at the end decodes as invalid too.
                return Err(if decoder.can_decode() {
                    WalkError::Undecodable { address }
                } else {
                    WalkError::PastEnd { address }
                });
            }
            if insn.next_ip() > end {
                return Err(WalkError::PastEnd { address });
            }
            if let Some(kind) = classify(&insn, pieces, &inside)? {
                exits.push(ExitSite { address, kind });
            }
        }
    }
    if exits.is_empty() {
        return Err(WalkError::NoExit);
    }
    Ok(exits)
}

/// `Some(kind)` when `insn` leaves (or may leave) the function.
fn classify(
    insn: &Instruction,
    pieces: &[CodePiece<'_>],
    inside: &dyn Fn(u64) -> bool,
) -> Result<Option<ExitKind>, WalkError> {
    let unsupported = || WalkError::Unsupported {
        address: insn.ip(),
        text: format!("{:?}", insn.mnemonic()).to_lowercase(),
    };
    Ok(match insn.flow_control() {
        FlowControl::Next
        | FlowControl::Call
        | FlowControl::IndirectCall
        | FlowControl::Interrupt
        | FlowControl::Exception
        | FlowControl::XbeginXabortXend => None,
        FlowControl::Return => {
            if insn.mnemonic() != Mnemonic::Ret {
                return Err(unsupported());
            }
            Some(ExitKind::Ret)
        }
        FlowControl::UnconditionalBranch => {
            if !is_near_branch(insn) {
                return Err(unsupported());
            }
            (!inside(insn.near_branch_target())).then_some(ExitKind::Jump)
        }
        FlowControl::ConditionalBranch => {
            if inside(insn.near_branch_target()) {
                None
            } else {
                // jrcxz/loop out of a function: no flags to evaluate them from.
                let condition = tttn(insn.condition_code()).ok_or_else(unsupported)?;
                Some(ExitKind::CondJump { condition })
            }
        }
        FlowControl::IndirectBranch => Some(ExitKind::IndirectJump(
            jump_site(insn, pieces).ok_or_else(unsupported)?,
        )),
    })
}

fn is_near_branch(insn: &Instruction) -> bool {
    matches!(
        insn.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    )
}

/// Intel's condition encoding of a `Jcc`.
fn tttn(cc: ConditionCode) -> Option<u8> {
    Some(match cc {
        ConditionCode::o => 0,
        ConditionCode::no => 1,
        ConditionCode::b => 2,
        ConditionCode::ae => 3,
        ConditionCode::e => 4,
        ConditionCode::ne => 5,
        ConditionCode::be => 6,
        ConditionCode::a => 7,
        ConditionCode::s => 8,
        ConditionCode::ns => 9,
        ConditionCode::p => 10,
        ConditionCode::np => 11,
        ConditionCode::l => 12,
        ConditionCode::ge => 13,
        ConditionCode::le => 14,
        ConditionCode::g => 15,
        ConditionCode::None => return None,
    })
}

/// The register numbering of `JumpSite` (64-bit general registers only).
fn reg_number(reg: Register) -> Option<u8> {
    const ORDER: [Register; 16] = [
        Register::RAX,
        Register::RCX,
        Register::RDX,
        Register::RBX,
        Register::RSP,
        Register::RBP,
        Register::RSI,
        Register::RDI,
        Register::R8,
        Register::R9,
        Register::R10,
        Register::R11,
        Register::R12,
        Register::R13,
        Register::R14,
        Register::R15,
    ];
    if reg == Register::None {
        return Some(REG_NONE);
    }
    ORDER
        .iter()
        .position(|&r| r == reg)
        .and_then(|i| u8::try_from(i).ok())
}

/// How the BPF program computes the target of `jmp reg` / `jmp qword [mem]`; `None` for
/// forms it cannot (far jumps, segment overrides, 32-bit addressing).
fn jump_site(insn: &Instruction, pieces: &[CodePiece<'_>]) -> Option<JumpSite> {
    let here = insn.ip();
    let mut ranges = [CodeRange::default(); MAX_CODE_RANGES];
    for (slot, piece) in ranges.iter_mut().zip(pieces) {
        let start = i64::try_from(piece.address).ok()? - i64::try_from(here).ok()?;
        let len = i64::try_from(piece.bytes.len()).ok()?;
        *slot = CodeRange {
            start,
            end: start + len,
        };
    }
    let mut site = JumpSite {
        ranges,
        range_count: u8::try_from(pieces.len()).ok()?,
        base: REG_NONE,
        index: REG_NONE,
        scale: 1,
        ..JumpSite::default()
    };
    match insn.op0_kind() {
        OpKind::Register => {
            site.base = reg_number(insn.op0_register())?;
            (site.base != REG_NONE).then_some(site)
        }
        OpKind::Memory => {
            if insn.memory_size().size() != 8
                || !matches!(insn.memory_segment(), Register::DS | Register::SS)
                || insn.segment_prefix() != Register::None
            {
                return None;
            }
            site.memory = 1;
            if insn.is_ip_rel_memory_operand() {
                site.base = REG_RIP;
                let target = insn.ip_rel_memory_address();
                site.disp = i64::try_from(target).ok()? - i64::try_from(here).ok()?;
                return Some(site);
            }
            site.base = reg_number(insn.memory_base())?;
            site.index = reg_number(insn.memory_index())?;
            site.scale = u8::try_from(insn.memory_index_scale()).ok()?;
            // iced sign-extends a 64-bit displacement into the u64.
            #[expect(clippy::cast_possible_wrap, reason = "the displacement is signed")]
            {
                site.disp = insn.memory_displacement64() as i64;
            }
            Some(site)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exits_of(address: u64, bytes: &[u8]) -> Result<Vec<ExitSite>, WalkError> {
        function_exits(&[CodePiece { address, bytes }])
    }

    #[test]
    fn every_ret_is_an_exit() {
        // test edi,edi; je +1; ret; xor eax,eax; ret
        let code = [0x85, 0xff, 0x74, 0x01, 0xc3, 0x31, 0xc0, 0xc3];
        let exits = exits_of(0x1000, &code).expect("walkable");
        let at: Vec<_> = exits.iter().map(|e| (e.address, e.kind)).collect();
        assert_eq!(at, [(0x1004, ExitKind::Ret), (0x1007, ExitKind::Ret)]);
    }

    #[test]
    fn jumps_inside_are_not_exits_and_tail_calls_are() {
        // jmp +0 (inside); jne 0x2000 (outside); jmp 0x3000 (outside)
        let mut code = vec![0xeb, 0x00];
        code.extend([0x0f, 0x85]);
        code.extend((0x2000i32 - 0x1008).to_le_bytes());
        code.push(0xe9);
        code.extend((0x3000i32 - 0x100d).to_le_bytes());
        let exits = exits_of(0x1000, &code).expect("walkable");
        assert_eq!(
            exits,
            [
                ExitSite {
                    address: 0x1002,
                    kind: ExitKind::CondJump { condition: 5 }
                },
                ExitSite {
                    address: 0x1008,
                    kind: ExitKind::Jump
                },
            ]
        );
    }

    #[test]
    fn a_jump_into_a_cold_part_is_internal_and_its_ret_counts() {
        // body: jmp 0x5000 (the cold part); cold: ret
        let mut body = vec![0xe9];
        body.extend((0x5000i32 - 0x1005).to_le_bytes());
        let cold = [0xc3];
        let exits = function_exits(&[
            CodePiece {
                address: 0x1000,
                bytes: &body,
            },
            CodePiece {
                address: 0x5000,
                bytes: &cold,
            },
        ])
        .expect("walkable");
        assert_eq!(exits.len(), 1);
        assert_eq!((exits[0].address, exits[0].kind), (0x5000, ExitKind::Ret));
    }

    #[test]
    fn indirect_jumps_describe_their_target() {
        // jmp rax; jmp qword [rip+0x10]; jmp qword [rdx+rcx*8+0x20]
        let code = [
            0xff, 0xe0, 0xff, 0x25, 0x10, 0, 0, 0, 0xff, 0x64, 0xca, 0x20,
        ];
        let exits = exits_of(0x1000, &code).expect("walkable");
        let sites: Vec<JumpSite> = exits
            .iter()
            .map(|e| match e.kind {
                ExitKind::IndirectJump(s) => s,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!((sites[0].base, sites[0].memory), (0, 0));
        assert_eq!(sites[0].ranges[0], CodeRange { start: 0, end: 12 });
        assert_eq!((sites[1].base, sites[1].memory), (REG_RIP, 1));
        // The operand is relative to the next instruction (0x1008): 0x1018 - 0x1002.
        assert_eq!(sites[1].disp, 0x16);
        assert_eq!(sites[1].ranges[0], CodeRange { start: -2, end: 10 });
        assert_eq!(
            (sites[2].base, sites[2].index, sites[2].scale, sites[2].disp),
            (2, 1, 8, 0x20)
        );
    }

    #[test]
    fn what_cannot_be_followed_is_an_error() {
        // jmp far [rax]
        let err = exits_of(0x1000, &[0xff, 0x28]).expect_err("far jump");
        assert!(matches!(err, WalkError::Unsupported { .. }), "{err}");
        // jmp qword fs:[rax]
        let err = exits_of(0x1000, &[0x64, 0xff, 0x20]).expect_err("segment");
        assert!(matches!(err, WalkError::Unsupported { .. }), "{err}");
        // jrcxz out of the function
        let err = exits_of(0x1000, &[0xe3, 0x40]).expect_err("jrcxz");
        assert!(err.to_string().contains("jrcxz"), "{err}");
        // mov eax, imm32 cut short
        let err = exits_of(0x1000, &[0xc3, 0xb8, 0x01]).expect_err("truncated");
        assert_eq!(err, WalkError::PastEnd { address: 0x1001 });
        // no way out
        let err = exits_of(0x1000, &[0x90, 0x90]).expect_err("no exit");
        assert_eq!(err, WalkError::NoExit);
    }
}
