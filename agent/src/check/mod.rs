//! What this machine supports: probes of BPF, tracefs, uprobes, perf PMUs.
