//! lookback's in-kernel trigger engine.
//!
//! Evaluates rule conditions where they happen — function returns (uprobes), syscall exits
//! and signal generation (raw tracepoints) — and sends only the triggers that are met *and*
//! not suppressed to userspace through one ring buffer. Raw tracepoints, not perf-event
//! tracepoint programs: the latter's return value would silence every other perf user of the
//! tracepoint (see design.md). Needs kernel ≥ 5.15 (attach cookies, ring buffer, cmpxchg).
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "atomic add on map values, see emit.rs")]
#![expect(
    clippy::inline_always,
    reason = "BPF: helpers inline into each program so the verifier sees bounds in one frame"
)]
#![expect(
    clippy::cast_possible_truncation,
    reason = "pid_tgid halves and raw tracepoint u64 arguments are narrowed on purpose"
)]
#![expect(
    clippy::needless_pass_by_value,
    reason = "aya-ebpf's program macros hand the context over by value"
)]

mod emit;
mod function;
mod inflight;
mod maps;
mod process;
mod sample_filter;
mod signal;
mod syscall;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that can reach a real panic; this is never called.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
