//! The kernel/user ABI of lookback's trigger engine.
//!
//! Everything here crosses the boundary between the eBPF programs (`lookback-ebpf`) and the
//! agent: map value layouts and the ring-buffer record. All types are `#[repr(C)]`, valid for
//! every bit pattern (kinds are plain `u32` constants, converted with `TryFrom` on the user
//! side), and each field names its unit.
#![no_std]

pub mod probe;
pub mod process;
pub mod rule;
pub mod trigger;

/// Most rules one agent can load: rule sets are `u64` bitmasks in the target maps.
pub const MAX_RULES: u32 = 64;
