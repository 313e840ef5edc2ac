//! Triggers: the userspace half of the in-kernel trigger engine.
//!
//! In: rules (`EngineRule`) and target processes. Out: a stream of [`TriggerEvent`]s — only
//! conditions that were met in the kernel and not suppressed there — plus per-rule counters.
//! `resolve` places function probes (`names`: which symbol a name means, `exits`: where a function can be left), `plan` turns rules into the kernel's `RuleSpec`,
//! `engine` owns the loaded programs and maps, `stream` reads the ring buffers with tokio,
//! `pump` reads the trigger ring on its own thread and freezes before anything else.

pub mod btf;
pub mod engine;
pub mod event;
pub mod exits;
pub mod inflight;
pub mod names;
pub mod plan;
pub mod pump;
pub mod resolve;
pub mod stream;
pub mod uprobe_multi;

pub use engine::{AttachedProbe, RuleCounters, TriggerEngine, TriggerError};
pub use event::{TriggerEvent, TriggerKind};
pub use plan::EngineRule;
pub use resolve::{ProbeKind, ProbePoint};
