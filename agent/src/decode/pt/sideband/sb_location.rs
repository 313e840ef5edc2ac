//! Whether the trace is in the kernel or in user space, as far as its events tell.
//!
//! In: each trace event and the start address of the kernel. Out: a [`Location`].
//! ptxed's sideband session ([`super::sb_session`]) applies a pending context switch
//! only where the trace is (likely) in the kernel or nobody knows where, because that is
//! where the switch happens: the process the sideband switched away from may still run
//! until it enters the kernel. The rules are libipt's sideband library's.

use crate::decode::pt::events::event::{Event, EventKind};

/// Where the trace is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Location {
    #[default]
    Unknown,
    User,
    Kernel,
    /// Guessed from an event without an IP (tracing stopped on entering the kernel ...).
    LikelyUser,
    LikelyKernel,
}

impl Location {
    fn of_ip(ip: u64, kernel_start: u64) -> Self {
        if ip < kernel_start {
            Self::User
        } else {
            Self::Kernel
        }
    }

    /// Tracing stopped without an IP: typically on a switch between user and kernel.
    fn after_suppressed(self) -> Self {
        match self {
            Self::Kernel | Self::LikelyKernel => Self::LikelyUser,
            Self::User | Self::LikelyUser => Self::LikelyKernel,
            Self::Unknown => Self::Unknown,
        }
    }

    /// Where a context switch may be applied.
    pub fn allows_switch(self) -> bool {
        matches!(self, Self::Kernel | Self::LikelyKernel | Self::Unknown)
    }

    /// The location after `event`; `self` is the location before it.
    pub fn after(self, event: &Event, kernel_start: u64) -> Self {
        let at = |ip: u64| Self::of_ip(ip, kernel_start);
        let suppressed = event.ip_suppressed;
        match event.kind {
            EventKind::Enabled { ip, .. } | EventKind::Tip { ip } => at(ip),
            EventKind::AsyncBranch { to, .. } => at(to),
            EventKind::Disabled { ip } => {
                if suppressed {
                    self.after_suppressed()
                } else {
                    at(ip)
                }
            }
            EventKind::AsyncDisabled { at: from, ip } => {
                if suppressed {
                    at(from).after_suppressed()
                } else {
                    at(ip)
                }
            }
            EventKind::AsyncPaging { ip, .. } if !suppressed => at(ip),
            EventKind::Paging { .. } | EventKind::AsyncPaging { .. } => Self::LikelyKernel,
            EventKind::Overflow { ip }
            | EventKind::ExecMode { ip, .. }
            | EventKind::Tsx { ip, .. }
            | EventKind::Exstop { ip }
            | EventKind::Mwait { ip, .. }
            | EventKind::Ptwrite { ip, .. }
            | EventKind::Tick { ip }
            | EventKind::Iflags { ip, .. }
            | EventKind::Interrupt { ip, .. }
            | EventKind::Iret { ip }
            | EventKind::Smi { ip }
            | EventKind::Rsm { ip }
            | EventKind::Init { ip }
            | EventKind::Vmentry { ip }
            | EventKind::Vmexit { ip, .. }
            | EventKind::Shutdown { ip }
            | EventKind::Uintr { ip, .. }
            | EventKind::Uiret { ip }
                if !suppressed =>
            {
                at(ip)
            }
            _ => Self::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNEL: u64 = 0xffff_ffff_8000_0000;

    #[test]
    fn ips_tell_kernel_from_user_and_suppressed_ips_guess() {
        let enabled = Event::new(EventKind::Enabled {
            ip: KERNEL,
            resumed: false,
        });
        let here = Location::Unknown.after(&enabled, KERNEL);
        assert_eq!(here, Location::Kernel);
        let mut disabled = Event::new(EventKind::Disabled { ip: 0 });
        disabled.ip_suppressed = true;
        assert_eq!(here.after(&disabled, KERNEL), Location::LikelyUser);
        let tick = Event::new(EventKind::Tick { ip: 0x1000 });
        assert_eq!(here.after(&tick, KERNEL), Location::User);
        assert_eq!(here.after(&tick, u64::MAX), Location::User);
        assert!(!Location::User.allows_switch() && Location::Unknown.allows_switch());
        assert_eq!(
            here.after(&Event::new(EventKind::Stop), KERNEL),
            Location::Unknown
        );
    }
}
