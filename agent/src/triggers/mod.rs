//! Triggers: loads the eBPF programs, attaches them to targets, delivers trigger events.
