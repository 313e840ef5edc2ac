//! What a function probe is (its attach cookie) and how an indirect exit jump finds its
//! target (`JUMP_SITES` map).
//!
//! A latency rule never touches the target's stack: it puts one uprobe on the function's
//! entry and one on each instruction that leaves it (`ret`, a jump out of the function),
//! found by disassembling the function in userspace. The kernel tells the programs only
//! "this probe was hit", so each probe's attach cookie says which rule it belongs to, what
//! kind of site it is, and, for the sites that need it, how to decide whether it leaves.
//!
//! Cookie layout (bits): `0..8` rule id, `8..12` [`SITE_*`](SITE_ENTRY), `12` [`COOKIE_GO`],
//! `16..20` condition code of a conditional jump, `32..64` index into `JUMP_SITES`.
#![expect(
    clippy::inline_always,
    reason = "BPF: the decoding must inline into the program so the verifier sees it"
)]

/// The function's entry.
pub const SITE_ENTRY: u32 = 0;
/// A `ret`: the function returns.
pub const SITE_RET: u32 = 1;
/// A direct `jmp` to outside the function: a tail call, always an exit.
pub const SITE_JUMP: u32 = 2;
/// A conditional jump to outside the function: an exit when its condition holds (the
/// condition code is in the cookie; the flags are read from the probed registers).
pub const SITE_COND_JUMP: u32 = 3;
/// `jmp reg` / `jmp [mem]`: an exit when its target, computed from the registers and
/// memory it names ([`JumpSite`]), is outside the function (a switch's jump table is not).
pub const SITE_INDIRECT_JUMP: u32 = 4;
/// A uretprobe (explicit `return_probe: uretprobe`): the stack pointer is one slot above
/// the entry's, the return address having been popped.
pub const SITE_URETPROBE: u32 = 5;

/// The probe is in a Go binary: entries are keyed by goroutine (`g`, in R14 under Go's
/// register ABI) and matched by the frame's distance from the goroutine stack's top,
/// because goroutines move between threads and their stacks are copied as they grow.
pub const COOKIE_GO: u64 = 1 << 12;

/// No register (`JumpSite::base`, `JumpSite::index`).
pub const REG_NONE: u8 = 0xff;
/// The instruction pointer of the probed instruction (RIP-relative memory operands: the
/// displacement is then relative to the probed instruction's address).
pub const REG_RIP: u8 = 16;

/// Pieces of one function that an indirect jump may stay within (the body and its
/// compiler-split `.cold` parts).
pub const MAX_CODE_RANGES: usize = 4;

/// Capacity of the `JUMP_SITES` array map.
pub const MAX_JUMP_SITES: u32 = 16384;

/// Encodes a probe's attach cookie.
#[must_use]
pub const fn cookie(rule_id: u32, site: u32, go: bool, condition: u8, jump_site: u32) -> u64 {
    (rule_id as u64 & 0xff)
        | ((site as u64 & 0xf) << 8)
        | if go { COOKIE_GO } else { 0 }
        | ((condition as u64 & 0xf) << 16)
        | ((jump_site as u64) << 32)
}

/// The rule id of a cookie.
#[inline(always)]
#[must_use]
pub const fn cookie_rule(cookie: u64) -> u32 {
    (cookie & 0xff) as u32
}

/// The `SITE_*` of a cookie.
#[inline(always)]
#[must_use]
pub const fn cookie_site(cookie: u64) -> u32 {
    ((cookie >> 8) & 0xf) as u32
}

/// Whether the cookie's probe is in a Go binary.
#[inline(always)]
#[must_use]
pub const fn cookie_go(cookie: u64) -> bool {
    cookie & COOKIE_GO != 0
}

/// The condition code (Intel's `tttn`, 0 = O … 15 = G) of a conditional-jump cookie.
#[inline(always)]
#[must_use]
pub const fn cookie_condition(cookie: u64) -> u8 {
    ((cookie >> 16) & 0xf) as u8
}

/// The `JUMP_SITES` index of an indirect-jump cookie.
#[inline(always)]
#[must_use]
pub const fn cookie_jump_site(cookie: u64) -> u32 {
    (cookie >> 32) as u32
}

/// Whether condition code `cc` holds for the flags `eflags` (Intel SDM Vol. 2, "Jcc").
#[inline(always)]
#[must_use]
pub const fn condition_holds(cc: u8, eflags: u64) -> bool {
    let cf = eflags & 1 != 0;
    let pf = eflags & (1 << 2) != 0;
    let zf = eflags & (1 << 6) != 0;
    let sf = eflags & (1 << 7) != 0;
    let of = eflags & (1 << 11) != 0;
    let base = match cc >> 1 {
        0 => of,
        1 => cf,
        2 => zf,
        3 => cf || zf,
        4 => sf,
        5 => pf,
        6 => sf != of,
        _ => zf || (sf != of),
    };
    // Odd codes are the negations of the even ones.
    base != (cc & 1 != 0)
}

/// A code range of a function, relative to a probed instruction's address: `[start, end)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeRange {
    pub start: i64,
    pub end: i64,
}

/// How an indirect jump computes its target: `[base + index * scale + disp]` (read 8
/// bytes there when `memory`), or the register `base` itself. Ranges and a RIP-relative
/// displacement are relative to the probed instruction, so one entry serves every process
/// the binary is loaded in, wherever it is loaded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JumpSite {
    /// The function's code; a target inside any of them is not an exit.
    pub ranges: [CodeRange; MAX_CODE_RANGES],
    pub disp: i64,
    /// Number of valid `ranges`.
    pub range_count: u8,
    /// Register number (0 RAX, 1 RCX, 2 RDX, 3 RBX, 4 RSP, 5 RBP, 6 RSI, 7 RDI, 8–15 R8–R15),
    /// [`REG_RIP`] or [`REG_NONE`].
    pub base: u8,
    pub index: u8,
    /// 1, 2, 4 or 8.
    pub scale: u8,
    /// Nonzero: the target is read from memory at the computed address.
    pub memory: u8,
    pub reserved: [u8; 3],
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: #[repr(C)] of integers; every bit pattern is valid.
    unsafe impl aya::Pod for super::JumpSite {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_round_trip() {
        let c = cookie(63, SITE_INDIRECT_JUMP, true, 0xc, 16383);
        assert_eq!(cookie_rule(c), 63);
        assert_eq!(cookie_site(c), SITE_INDIRECT_JUMP);
        assert!(cookie_go(c));
        assert_eq!(cookie_condition(c), 0xc);
        assert_eq!(cookie_jump_site(c), 16383);
        let c = cookie(0, SITE_ENTRY, false, 0, 0);
        assert_eq!(
            (cookie_rule(c), cookie_site(c), cookie_go(c)),
            (0, 0, false)
        );
    }

    #[test]
    fn conditions_follow_the_flags() {
        const CF: u64 = 1;
        const ZF: u64 = 1 << 6;
        const SF: u64 = 1 << 7;
        const OF: u64 = 1 << 11;
        // je / jne
        assert!(condition_holds(4, ZF) && !condition_holds(4, 0));
        assert!(condition_holds(5, 0) && !condition_holds(5, ZF));
        // jb / jae / jbe / ja
        assert!(condition_holds(2, CF) && condition_holds(3, 0));
        assert!(condition_holds(6, ZF) && !condition_holds(7, CF));
        // jl: SF != OF; jge; jle; jg
        assert!(condition_holds(0xc, SF) && !condition_holds(0xc, SF | OF));
        assert!(condition_holds(0xd, SF | OF));
        assert!(condition_holds(0xe, ZF) && !condition_holds(0xf, ZF));
        assert!(condition_holds(0xf, 0));
        // jo / js / jp
        assert!(condition_holds(0, OF) && condition_holds(8, SF) && condition_holds(0xa, 1 << 2));
    }
}
