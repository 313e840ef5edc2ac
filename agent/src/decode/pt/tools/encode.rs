//! A small Intel PT *encoder*, for tests and benchmarks: it writes x86-64 code with a
//! known control-flow graph, runs that program in its head and emits the packets a CPU
//! would have written for the run, with the branch events a correct decoder must find.
//!
//! In: a seed and a size. Out: [`SynthProgram`] (code bytes mapped at [`CODE_BASE`]) and
//! [`Encoded`] (the trace, and optionally the expected calls, returns and taken jumps).
//! The encoder never decodes its own bytes: it walks its own description of the program,
//! so a decoder that reproduces the branch list from the bytes and the trace agrees with
//! it independently.
//!
//! What the trace holds, close to what Linux `perf record -e intel_pt//u` writes with its
//! defaults less the MTC/TMA timing packets (time comes from TSC only): PSB+ (PSB, TSC,
//! MODE.Exec, FUP, PSBEND) about every 4 KiB, short and long
//! TNT for conditional branches and compressed returns, TIP with IP compression for
//! indirect calls and for returns whose call was before the last PSB, and PAD up to the
//! requested size. Return compression stack and last IP are reset at each PSB, as the
//! hardware does.

use crate::decode::pt::flow::branches::BranchKind;

/// Where the synthetic code is mapped.
pub const CODE_BASE: u64 = 0x40_0000;

/// Bytes of trace between PSBs (the hardware default `psb_period` is about 4 KiB).
const PSB_PERIOD: usize = 4096;
/// At most this many functions: calls only go to later functions, so this bounds the
/// call depth below the 64 entries of the return-compression stack.
const MAX_FUNCTIONS: usize = 48;
/// Long TNT carries at most 47 bits.
const LONG_TNT_BITS: u32 = 47;

/// Straight-line instructions the code is padded with (none of them branches).
const FILLERS: [&[u8]; 7] = [
    &[0x90],                         // nop
    &[0x48, 0x89, 0xc3],             // mov rbx, rax
    &[0x48, 0x83, 0xc0, 0x01],       // add rax, 1
    &[0x0f, 0x1f, 0x44, 0x00, 0x00], // nop dword [rax+rax]
    &[0x48, 0x8d, 0x44, 0x24, 0x08], // lea rax, [rsp+8]
    &[0x31, 0xc9],                   // xor ecx, ecx
    &[0x48, 0x8b, 0x04, 0x24],       // mov rax, [rsp]
];

/// What the encoder knows about one instruction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Plain,
    /// Conditional near jump; taken with probability `taken_per_256` / 256.
    Jcc {
        target: u64,
        taken_per_256: u32,
    },
    Jmp {
        target: u64,
    },
    Call {
        target: u64,
    },
    /// `call rax`, to one of `targets`.
    CallIndirect {
        targets: Vec<u64>,
    },
    Ret,
}

#[derive(Debug, Clone)]
struct SynthInsn {
    len: u8,
    op: Op,
}

/// A generated program: code bytes at [`CODE_BASE`] and what each instruction does.
#[derive(Debug, Clone)]
pub struct SynthProgram {
    pub code: Vec<u8>,
    /// By code offset; `None` between instructions and in padding.
    insns: Vec<Option<SynthInsn>>,
    entry: u64,
    /// The first address of each function, in code order.
    pub functions: Vec<u64>,
}

/// xorshift64*: deterministic, no dependency, good enough to pick branches.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() >> 33).unwrap_or(0) % n.max(1)
    }
}

/// Writes code and keeps the instruction table in step.
struct Writer {
    code: Vec<u8>,
    insns: Vec<Option<SynthInsn>>,
}

impl Writer {
    fn addr(&self) -> u64 {
        CODE_BASE + self.code.len() as u64
    }

    fn emit(&mut self, bytes: &[u8], op: Op) {
        let len = u8::try_from(bytes.len()).unwrap_or(u8::MAX);
        self.insns.push(Some(SynthInsn { len, op }));
        self.insns
            .extend(std::iter::repeat_n(None, bytes.len().saturating_sub(1)));
        self.code.extend_from_slice(bytes);
    }

    /// One to `max` straight-line instructions.
    fn fill(&mut self, rng: &mut Rng, max: usize) {
        for _ in 0..=rng.below(max) {
            self.emit(FILLERS[rng.below(FILLERS.len())], Op::Plain);
        }
    }

    /// A near branch with a rel32 displacement to `target`.
    fn rel32(&mut self, opcode: &[u8], target: u64, op: Op) {
        let end = self.addr() + opcode.len() as u64 + 4;
        let rel = i32::try_from(target.wrapping_sub(end).cast_signed()).unwrap_or(0);
        let mut bytes = opcode.to_vec();
        bytes.extend_from_slice(&rel.to_le_bytes());
        self.emit(&bytes, op);
    }

    /// `jne target`, short form when it reaches.
    fn jcc(&mut self, target: u64, taken_per_256: u32) {
        let op = Op::Jcc {
            target,
            taken_per_256,
        };
        let rel8 = target.wrapping_sub(self.addr() + 2).cast_signed();
        match i8::try_from(rel8) {
            Ok(rel) => self.emit(&[0x75, rel.to_le_bytes()[0]], op),
            Err(_) => self.rel32(&[0x0f, 0x85], target, op),
        }
    }

    fn align(&mut self) {
        while !self.code.len().is_multiple_of(16) {
            self.code.push(0xcc);
            self.insns.push(None);
        }
    }
}

impl SynthProgram {
    /// Generates a program of `functions` functions (at least 2). Function 0 loops
    /// forever calling the others; function `i` only calls functions after it, so the
    /// call depth is bounded; loops end with probability 1.
    pub fn generate(seed: u64, functions: usize) -> Self {
        let functions = functions.clamp(2, MAX_FUNCTIONS);
        let mut rng = Rng::new(seed);
        // Two passes: the first lays out the functions to learn their addresses.
        let mut starts = vec![CODE_BASE; functions];
        let mut writer = Writer {
            code: Vec::new(),
            insns: Vec::new(),
        };
        for _ in 0..2 {
            let mut pass_rng = rng.clone();
            writer = Writer {
                code: Vec::new(),
                insns: Vec::new(),
            };
            let mut new_starts = Vec::with_capacity(functions);
            for index in 0..functions {
                new_starts.push(writer.addr());
                write_function(&mut writer, &mut pass_rng, index, &starts);
                writer.align();
            }
            starts = new_starts;
        }
        rng.next();
        Self {
            code: writer.code,
            insns: writer.insns,
            entry: starts[0],
            functions: starts,
        }
    }

    fn insn(&self, ip: u64) -> Option<&SynthInsn> {
        let offset = usize::try_from(ip.checked_sub(CODE_BASE)?).ok()?;
        self.insns.get(offset)?.as_ref()
    }
}

fn write_function(w: &mut Writer, rng: &mut Rng, index: usize, starts: &[u64]) {
    let callees = &starts[index + 1..];
    if index == 0 {
        let top = w.addr();
        for _ in 0..8 {
            w.fill(rng, 3);
            let target = callees[rng.below(callees.len())];
            w.rel32(&[0xe8], target, Op::Call { target });
        }
        let targets: Vec<u64> = (0..4).map(|_| callees[rng.below(callees.len())]).collect();
        w.emit(&[0xff, 0xd0], Op::CallIndirect { targets });
        w.rel32(&[0xe9], top, Op::Jmp { target: top });
        return;
    }
    for _ in 0..4 + rng.below(8) {
        match rng.below(6) {
            0 | 1 => w.fill(rng, 4),
            2 => {
                // if: jne over a few instructions (their length is known up front).
                let picks: Vec<usize> = (0..=rng.below(4))
                    .map(|_| rng.below(FILLERS.len()))
                    .collect();
                let skip: usize = picks.iter().map(|&i| FILLERS[i].len()).sum();
                let target = w.addr() + 2 + skip as u64;
                w.jcc(target, 128);
                for i in picks {
                    w.emit(FILLERS[i], Op::Plain);
                }
            }
            3 => {
                // loop: a body, then jne back to its start (taken 3 times in 4).
                let top = w.addr();
                w.fill(rng, 6);
                w.jcc(top, 192);
            }
            4 if !callees.is_empty() => {
                let target = callees[rng.below(callees.len())];
                w.rel32(&[0xe8], target, Op::Call { target });
            }
            5 if !callees.is_empty() => {
                let targets = (0..=rng.below(3))
                    .map(|_| callees[rng.below(callees.len())])
                    .collect();
                w.emit(&[0xff, 0xd0], Op::CallIndirect { targets });
            }
            _ => w.fill(rng, 1),
        }
    }
    w.emit(&[0xc3], Op::Ret);
}

/// A trace of a run of a [`SynthProgram`].
#[derive(Debug, Clone, Default)]
pub struct Encoded {
    pub trace: Vec<u8>,
    /// Calls, returns and taken jumps as `(kind, from, to)`, when asked for.
    pub branches: Vec<(BranchKind, u64, u64)>,
    pub instructions: u64,
}

/// Packet writer state: pending TNT bits, last IP, bytes since the last PSB.
struct Packets {
    out: Vec<u8>,
    tnt: u64,
    tnt_bits: u32,
    last_ip: u64,
    psb_at: usize,
    tsc: u64,
}

impl Packets {
    fn tnt(&mut self, taken: bool) {
        self.tnt = self.tnt << 1 | u64::from(taken);
        self.tnt_bits += 1;
        if self.tnt_bits == LONG_TNT_BITS {
            self.flush_tnt();
        }
    }

    fn flush_tnt(&mut self) {
        let (bits, n) = (self.tnt, self.tnt_bits);
        match n {
            0 => return,
            1..=6 => self
                .out
                .push(u8::try_from((1 << n | bits) << 1).unwrap_or(0)),
            _ => {
                self.out.extend_from_slice(&[0x02, 0xa3]);
                self.out
                    .extend_from_slice(&(1 << n | bits).to_le_bytes()[..6]);
            }
        }
        self.tnt = 0;
        self.tnt_bits = 0;
    }

    /// A TIP (`opcode` 0x0d) or FUP (0x1d) with the shortest IP compression.
    fn ip_packet(&mut self, opcode: u8, ip: u64) {
        let diff = ip ^ self.last_ip;
        let (ipc, len) = if diff >> 16 == 0 {
            (1, 2)
        } else if diff >> 32 == 0 {
            (2, 4)
        } else {
            (3, 6)
        };
        self.out.push(ipc << 5 | opcode);
        self.out.extend_from_slice(&ip.to_le_bytes()[..len]);
        self.last_ip = ip;
    }

    fn psb_plus(&mut self, ip: u64) {
        self.flush_tnt();
        self.psb_at = self.out.len();
        for _ in 0..8 {
            self.out.extend_from_slice(&[0x02, 0x82]);
        }
        self.out.push(0x19);
        self.out.extend_from_slice(&self.tsc.to_le_bytes()[..7]);
        self.out.extend_from_slice(&[0x99, 0x01]);
        self.last_ip = 0;
        self.ip_packet(0x1d, ip);
        self.out.extend_from_slice(&[0x02, 0x23]);
    }
}

/// Runs `program` from its entry and returns a trace of at least `size` bytes (padded
/// with PAD to exactly `size` unless the last packets overshoot). With `record`, the
/// calls, returns and taken jumps are listed too (keep `size` small then).
pub fn encode(program: &SynthProgram, seed: u64, size: usize, record: bool) -> Encoded {
    let mut rng = Rng::new(seed.wrapping_add(1));
    let mut p = Packets {
        out: Vec::with_capacity(size + 64),
        tnt: 0,
        tnt_bits: 0,
        last_ip: 0,
        psb_at: 0,
        tsc: 0x1000,
    };
    let mut result = Encoded::default();
    let mut stack: Vec<u64> = Vec::new();
    // Returns that can be compressed: calls since the last PSB.
    let mut compressible = 0usize;
    let mut ip = program.entry;
    p.psb_plus(ip);
    while p.out.len() + 64 < size {
        if p.out.len() - p.psb_at >= PSB_PERIOD {
            p.psb_plus(ip);
            compressible = 0;
        }
        let Some(insn) = program.insn(ip) else {
            break;
        };
        result.instructions += 1;
        p.tsc += 1;
        let next = ip + u64::from(insn.len);
        let (branch, to) = match &insn.op {
            Op::Plain => (None, next),
            Op::Jcc {
                target,
                taken_per_256,
            } => {
                let taken = (rng.next() & 0xff) < u64::from(*taken_per_256);
                p.tnt(taken);
                if taken {
                    (Some(BranchKind::Jump), *target)
                } else {
                    (None, next)
                }
            }
            Op::Jmp { target } => (Some(BranchKind::Jump), *target),
            Op::Call { target } => {
                stack.push(next);
                compressible += 1;
                (Some(BranchKind::Call), *target)
            }
            Op::CallIndirect { targets } => {
                let target = targets[rng.below(targets.len())];
                stack.push(next);
                compressible += 1;
                p.flush_tnt();
                p.ip_packet(0x0d, target);
                (Some(BranchKind::Call), target)
            }
            Op::Ret => {
                let Some(back) = stack.pop() else {
                    break;
                };
                if compressible > 0 {
                    compressible -= 1;
                    p.tnt(true);
                } else {
                    p.flush_tnt();
                    p.ip_packet(0x0d, back);
                }
                (Some(BranchKind::Return), back)
            }
        };
        if record && let Some(kind) = branch {
            result.branches.push((kind, ip, to));
        }
        ip = to;
    }
    p.flush_tnt();
    p.out.resize(p.out.len().max(size), 0);
    result.trace = p.out;
    result
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
