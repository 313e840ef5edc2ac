//! The only module that makes raw syscalls (perf_event_open, ioctl, mmap, bpf).
