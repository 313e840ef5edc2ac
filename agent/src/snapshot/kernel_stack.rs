//! The trigger's kernel stack in a snapshot: kept and named where the recording included
//! kernel code, dropped where it did not.
//!
//! In: a [`Snapshot`] whose trigger carries the kernel stack the BPF program took, and
//! `/proc/kallsyms` ([`Kallsyms`]). Out: the same snapshot, its trigger's kernel stack
//! without the probe's own frames and its kernel symbols completed with the functions
//! that stack is in.

use super::Snapshot;
use crate::capture::kallsyms::{Kallsyms, KernelSymbol};

/// Keeps the kernel stack of `snap`'s trigger where the recording asked for kernel code
/// (`include_kernel`), adding the functions it is in to the snapshot's kernel symbols, so
/// that the trace names it like the samples' kernel frames; drops it otherwise (a
/// recording without kernel frames shows none at the trigger either). On the writer
/// thread: the first call reads `/proc/kallsyms`.
pub fn keep_trigger_kernel_stack(snap: &mut Snapshot) {
    let Some(trigger) = snap.meta.trigger.as_mut() else {
        return;
    };
    if !snap.meta.recorder.include_kernel {
        trigger.kernel_stack.clear();
    } else if !trigger.kernel_stack.is_empty() {
        name_kernel_stack(
            &mut trigger.kernel_stack,
            &mut snap.meta.kernel_symbols,
            Kallsyms::shared(),
        );
    }
}

/// Drops the leaf frames of `stack` that are the probe's own path (the tracepoint calling
/// the BPF program that took the stack: not what the thread was doing) and adds the
/// functions of the others to `known` (sorted by address, each once).
fn name_kernel_stack(stack: &mut Vec<u64>, known: &mut Vec<KernelSymbol>, kallsyms: &Kallsyms) {
    let machinery = stack
        .iter()
        .take_while(|&&a| {
            kallsyms
                .lookup(a)
                .is_some_and(|s| is_probe_machinery(&s.name))
        })
        .count();
    stack.drain(..machinery);
    for symbol in kallsyms.symbols_for(stack.iter().copied()) {
        if let Err(at) = known.binary_search_by_key(&symbol.address, |s| s.address) {
            known.insert(at, symbol);
        }
    }
}

/// Whether kernel function `name` belongs to the path from a tracepoint or probe into a
/// BPF program (`bpf_trace_run2`, `__bpf_trace_sys_exit`, `__traceiter_*`, `bpf_prog_*`).
fn is_probe_machinery(name: &str) -> bool {
    [
        "bpf_trace_run",
        "__bpf_trace_",
        "__traceiter_",
        "bpf_prog_",
        "__bpf_prog_run",
    ]
    .iter()
    .any(|prefix| name.starts_with(prefix))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trigger_kernel_stack_loses_the_probe_path_and_names_the_rest() {
        let k = Kallsyms::parse(
            "ffffffff81000000 t bpf_trace_run2\n\
             ffffffff81000100 t __bpf_trace_sys_exit\n\
             ffffffff81000200 t syscall_exit_work\n\
             ffffffff81000300 T do_syscall_64\n",
        );
        let mut stack = vec![
            0xffff_ffff_8100_0010,
            0xffff_ffff_8100_0110,
            0xffff_ffff_8100_0210,
            0xffff_ffff_8100_0310,
        ];
        let mut known = vec![KernelSymbol {
            address: 0xffff_ffff_8100_0300,
            name: "do_syscall_64".into(),
            module: None,
        }];
        name_kernel_stack(&mut stack, &mut known, &k);
        assert_eq!(stack, [0xffff_ffff_8100_0210, 0xffff_ffff_8100_0310]);
        let names: Vec<&str> = known.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            ["syscall_exit_work", "do_syscall_64"],
            "sorted, once"
        );
    }
}
