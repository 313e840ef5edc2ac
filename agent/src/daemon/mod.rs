//! The daemon (`lookback agent`): rules from a YAML file applied to every matching process
//! on the machine, snapshots to disk, Prometheus metrics. The last pipeline stage: it drives
//! triggers → capture → snapshot → decode → writer for many targets at once.
//!
//! - [`discovery`]: which processes match a rule's target (pid, comm, exe, cgroup), found by
//!   a `/proc` scan at start and by exec/exit events from the kernel afterwards.
//! - [`kubernetes`]: the `kubernetes` target selector (pods on this node → cgroups, PIDs).
//! - [`metrics`] and [`http`]: the Prometheus registry and the `/metrics`, `/healthz`,
//!   `/readyz` server.

pub mod discovery;
pub mod http;
pub mod kubernetes;
pub mod metrics;
