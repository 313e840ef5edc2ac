//! What the agent's own privileges allow, said once at start: for each rule kind, how it
//! is installed or why it cannot be, and what each missing capability costs. A rule whose
//! kind the privileges cannot serve is then not ready with reason `capability` (log,
//! `/readyz`, `lookback_rule_probe_errors`), never a silent gap.
//!
//! In: how the trigger engine places function probes ([`AttachPath`]), this process's
//! effective capabilities, and a way to try a uprobe perf event. Out: an [`Assessment`].

use crate::check::{Capabilities, Probe};
use crate::triggers::engine::AttachPath;

/// The `reason` label of `lookback_rule_probe_errors` for a rule these privileges cannot
/// serve.
pub const CAPABILITY: &str = "capability";

/// What this process may install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    /// How function probes are placed (`Ok`), or why they cannot be.
    pub function: Result<&'static str, String>,
    /// One line per missing capability that narrows what can be traced.
    pub notes: Vec<String>,
    /// The capabilities, as `lookback check` names them.
    pub held: Vec<&'static str>,
}

/// Judges `caps` for the engine's `path`; `perf_uprobe` tries a uprobe perf event (called
/// only when `uprobe_multi` links are not available).
pub fn assess(
    path: &AttachPath,
    caps: &Capabilities,
    perf_uprobe: impl FnOnce() -> Probe,
) -> Assessment {
    let function = match path {
        AttachPath::UprobeMulti => Ok("uprobe_multi links (CAP_BPF + CAP_PERFMON)"),
        AttachPath::PerfEvent { why_not_multi } => {
            let perf = perf_uprobe();
            if perf.ok {
                Ok("uprobe perf events")
            } else {
                Err(format!(
                    "function probes cannot be placed with this process's privileges: \
                     uprobe_multi link: {why_not_multi}; uprobe perf event: {} (it needs \
                     CAP_SYS_ADMIN since Linux 6.16; uprobe_multi links need Linux 6.6 and \
                     CAP_BPF + CAP_PERFMON)",
                    perf.reason.as_deref().unwrap_or("refused")
                ))
            }
        }
    };
    let mut notes = Vec::new();
    if !caps.cap_sys_ptrace && !caps.cap_sys_admin {
        notes.push(
            "no CAP_SYS_PTRACE: processes of other users (and non-dumpable ones) cannot be \
             traced: their /proc/PID/maps, exe and root and their perf events are refused"
                .to_owned(),
        );
    }
    if !caps.cap_dac_read_search {
        notes.push(
            "no CAP_DAC_READ_SEARCH: binaries and libraries whose file modes keep root out \
             (root without DAC capabilities obeys them) cannot be probed or symbolized"
                .to_owned(),
        );
    }
    if !caps.cap_ipc_lock {
        notes.push(
            "no CAP_IPC_LOCK: perf ring buffers beyond kernel.perf_event_mlock_kb count \
             against RLIMIT_MEMLOCK; large or many recorders may fail to open"
                .to_owned(),
        );
    }
    let held = caps.names();
    Assessment {
        function,
        notes,
        held,
    }
}

impl Assessment {
    /// Logs the assessment: the capabilities, each rule kind, each note.
    pub fn log(&self) {
        log::info!("privileges: {}", self.held.join(" "));
        match &self.function {
            Ok(how) => log::info!("function rules: probes through {how}"),
            Err(why) => log::error!("function rules: {why}"),
        }
        log::info!("syscall and signal rules: raw tracepoints (CAP_BPF + CAP_PERFMON)");
        for note in &self.notes {
            log::warn!("{note}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_caps() -> Capabilities {
        Capabilities::parse_status("Uid:\t0\t0\t0\t0\nCapEff:\t000000c000084004\n")
    }

    #[test]
    fn multi_links_serve_function_rules_without_trying_perf() {
        let a = assess(&AttachPath::UprobeMulti, &manifest_caps(), || {
            panic!("perf uprobe tried")
        });
        assert!(a.function.is_ok());
        assert!(a.notes.is_empty(), "{:?}", a.notes);
        assert_eq!(
            a.held,
            [
                "CAP_BPF",
                "CAP_PERFMON",
                "CAP_SYS_PTRACE",
                "CAP_DAC_READ_SEARCH",
                "CAP_IPC_LOCK"
            ]
        );
    }

    #[test]
    fn without_multi_links_a_refused_perf_uprobe_is_a_capability_gap() {
        let path = AttachPath::PerfEvent {
            why_not_multi: "Linux 6.1".to_owned(),
        };
        let a = assess(&path, &manifest_caps(), || Probe::fail("EACCES"));
        let why = a.function.expect_err("refused");
        assert!(why.contains("Linux 6.1") && why.contains("EACCES"), "{why}");
        let a = assess(&path, &manifest_caps(), || Probe::pass("opened"));
        assert_eq!(a.function, Ok("uprobe perf events"));
    }

    #[test]
    fn missing_capabilities_are_each_explained() {
        let caps = Capabilities::parse_status("Uid:\t0\t0\t0\t0\nCapEff:\t000000c000000000\n");
        let a = assess(&AttachPath::UprobeMulti, &caps, || Probe::pass("x"));
        assert_eq!(a.notes.len(), 3, "{:?}", a.notes);
        for cap in ["CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH", "CAP_IPC_LOCK"] {
            assert!(
                a.notes.iter().any(|n| n.contains(cap)),
                "{cap}: {:?}",
                a.notes
            );
        }
    }
}
