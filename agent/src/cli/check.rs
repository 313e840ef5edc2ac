//! `lookback check [--json]`: runs the probes of [`crate::check`] and prints a ✓/✗ table
//! (or one JSON object), then which backend `auto` picks and why. Exit 0 when a capture
//! backend and the BPF triggers are usable, 1 otherwise.
#![forbid(unsafe_code)]

use std::{fmt::Write as _, io::Write as _, process::ExitCode};

use anyhow::Context as _;
use clap::Args;

use super::{CliError, CliResult, EXIT_RUNTIME};
use crate::check::{self, MachineReport, Probe};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Machine-readable output (one JSON object).
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &CheckArgs) -> CliResult {
    let report = check::probe();
    let text = if args.json {
        let mut json = serde_json::to_string_pretty(&report).context("serialising the report")?;
        json.push('\n');
        json
    } else {
        render(&report)
    };
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .context("writing to stdout")
        .map_err(CliError::runtime)?;
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_RUNTIME)
    })
}

/// One row of the table: glyph, name, text, then indented `note:`/`fix:` lines.
fn row(out: &mut String, name: &str, probe: &Probe) {
    let glyph = if probe.ok { '✓' } else { '✗' };
    let text = if probe.ok {
        probe.detail.as_deref()
    } else {
        probe.reason.as_deref()
    };
    let _ = writeln!(out, "  {glyph} {name:<16} {}", text.unwrap_or(""));
    if let (false, Some(detail)) = (probe.ok, &probe.detail) {
        let _ = writeln!(out, "    {:<16} note: {detail}", "");
    }
    if let Some(fix) = &probe.fix {
        let _ = writeln!(out, "    {:<16} fix: {fix}", "");
    }
}

/// Root or `CAP_BPF` + `CAP_PERFMON`, with `perf_event_paranoid`.
fn privileges(report: &MachineReport) -> Probe {
    let caps = &report.capabilities;
    let names = caps.names();
    let who = match caps.euid {
        Some(0) => "root".to_owned(),
        Some(uid) => format!("uid {uid}"),
        None => "uid unknown".to_owned(),
    };
    let paranoid = report
        .perf_event_paranoid
        .map_or_else(|| "unknown".to_owned(), |p| p.to_string());
    let caps_text = if names.is_empty() {
        "no capabilities".to_owned()
    } else {
        names.join(" ")
    };
    let text = format!("{who}; {caps_text}; perf_event_paranoid {paranoid}");
    if caps.root || (caps.cap_bpf && caps.cap_perfmon) || caps.cap_sys_admin {
        Probe {
            ok: true,
            detail: Some(text),
            ..Probe::default()
        }
    } else {
        Probe {
            ok: false,
            reason: Some(format!("{text}: BPF triggers need CAP_BPF and CAP_PERFMON")),
            fix: Some("run as root (or grant CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE)".to_owned()),
            ..Probe::default()
        }
    }
}

/// The `intel_pt` row: on success, its caps in one line.
fn intel_pt_row(report: &MachineReport) -> Probe {
    let pt = &report.intel_pt;
    if !pt.status.ok {
        return pt.status.clone();
    }
    let caps = &pt.caps;
    let flags: Vec<&str> = [
        (caps.psb_cyc, "psb_cyc"),
        (caps.cyc, "cyc"),
        (caps.mtc, "mtc"),
        (caps.ip_filtering, "ip_filtering"),
    ]
    .into_iter()
    .filter_map(|(has, name)| (has == Some(true)).then_some(name))
    .collect();
    let filters = caps
        .nr_addr_filters
        .map_or_else(String::new, |n| format!(", {n} address filters"));
    let detail = format!(
        "{}; caps: {}{filters}",
        pt.status.detail.as_deref().unwrap_or("opened"),
        if flags.is_empty() {
            "none".to_owned()
        } else {
            flags.join(" ")
        },
    );
    Probe {
        detail: Some(detail),
        ..pt.status.clone()
    }
}

/// The human-readable table.
pub fn render(report: &MachineReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "lookback check\n");
    row(&mut out, "kernel", &report.kernel.status);
    row(&mut out, "bpf", &report.bpf);
    row(&mut out, "btf", &report.btf);
    row(&mut out, "ringbuf", &report.ringbuf);
    row(&mut out, "raw tracepoints", &report.raw_tracepoints);
    row(&mut out, "tracefs", &report.tracefs.status);
    row(&mut out, "uprobes", &report.uprobes.status);
    row(&mut out, "uprobe_multi", &report.uprobe_multi);
    row(
        &mut out,
        "uprobe NOP5 opt",
        &report.uprobe_nop5_optimization,
    );
    row(&mut out, "privileges", &privileges(report));
    row(&mut out, "intel_pt", &intel_pt_row(report));
    row(&mut out, "aux_pause", &report.aux_pause.status);
    row(&mut out, "hardware PMU", &report.hardware_pmu);
    row(&mut out, "cpu-clock", &report.software_clock);
    let _ = writeln!(out);
    let _ = writeln!(out, "rule kinds, with this process's own privileges:");
    row(&mut out, "function", &report.rule_kinds.function);
    row(&mut out, "syscall", &report.rule_kinds.syscall);
    row(&mut out, "signal", &report.rule_kinds.signal);
    let _ = writeln!(out);
    let triggers = if report.bpf_triggers_usable {
        "usable (function, syscall and signal triggers)"
    } else {
        "NOT usable for every rule kind: see the ✗ rows above"
    };
    let _ = writeln!(out, "BPF triggers: {triggers}");
    let backend = report.auto_backend.map_or("none", check::Backend::as_str);
    let _ = writeln!(
        out,
        "backend auto → {backend} ({})",
        report.auto_backend_reason
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_row_per_item_and_the_backend_line() {
        let report = check::probe();
        let text = render(&report);
        for name in [
            "kernel",
            "bpf",
            "btf",
            "ringbuf",
            "tracefs",
            "uprobes",
            "intel_pt",
            "hardware PMU",
        ] {
            assert!(
                text.lines().any(|l| l.contains(name)),
                "no {name} row in\n{text}"
            );
        }
        let last = text.lines().last().expect("lines");
        assert!(last.starts_with("backend auto → "), "{last}");
    }

    #[test]
    fn failed_rows_show_reason_note_and_fix() {
        let mut out = String::new();
        let probe = Probe {
            ok: false,
            detail: Some("why it matters".to_owned()),
            reason: Some("it broke".to_owned()),
            errno: Some("EPERM".to_owned()),
            fix: Some("do this".to_owned()),
        };
        row(&mut out, "thing", &probe);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "  ✗ thing            it broke");
        assert!(lines[1].ends_with("note: why it matters"));
        assert!(lines[2].ends_with("fix: do this"));
    }
}
