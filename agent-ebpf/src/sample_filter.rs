//! The sampling recorder's filter, set on each of its perf events with
//! `PERF_EVENT_IOC_SET_BPF`: drops every sample of a process in `FROZEN`, so a trigger stops
//! its process's recording in the kernel, at the trigger, instead of when userspace gets to
//! pause the rings (tens to hundreds of µs later). The kernel keeps a sample only when a
//! perf event program returns nonzero (`__perf_event_overflow`); threads and children
//! inherit the program with the event.
use core::ffi::c_void;

use aya_ebpf::helpers::bpf_get_current_pid_tgid;

use crate::maps::{FROZEN, config, current_rules};

/// Written without `#[perf_event]`: that macro ignores the function's result and returns 0,
/// which would drop every sample.
#[unsafe(no_mangle)]
#[unsafe(link_section = "perf_event")]
pub extern "C" fn sample_filter(_ctx: *mut c_void) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: only tested for presence.
    u32::from(unsafe { FROZEN.get(tgid) }.is_none())
}

/// The filter of the agent's per-CPU recorders (one event per CPU for every process, set
/// with `PERF_EVENT_IOC_SET_BPF`): keeps a sample only when its process is a target of a
/// rule recorded that way (`shared_record_rules`; `TARGET_TGIDS`, filled at fork and exec
/// in the kernel, or `TARGET_CGROUPS`) and is not frozen. A process the kernel selects at
/// exec is recorded from its first instruction, with no userspace work; every other
/// process on the CPU costs one or two hash lookups per sample and leaves nothing.
#[unsafe(no_mangle)]
#[unsafe(link_section = "perf_event")]
pub extern "C" fn target_filter(_ctx: *mut c_void) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(config) = config() else {
        return 0;
    };
    if current_rules(tgid, config) & config.shared_record_rules == 0 {
        return 0;
    }
    // SAFETY: only tested for presence.
    u32::from(unsafe { FROZEN.get(tgid) }.is_none())
}
