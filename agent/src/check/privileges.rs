//! Privileges: `perf_event_paranoid` and the effective capabilities and uid from
//! `/proc/self/status`.

use serde::Serialize;

use super::Paths;

/// Capability numbers (`linux/capability.h`).
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_IPC_LOCK: u32 = 14;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const CAP_CHECKPOINT_RESTORE: u32 = 40;

/// The effective privileges of this process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "one JSON boolean per capability is the report's contract"
)]
pub struct Capabilities {
    /// Effective uid 0.
    pub root: bool,
    /// Effective uid; `None` when `/proc/self/status` is unreadable.
    pub euid: Option<u32>,
    /// The `CapEff` mask as `/proc/self/status` prints it (hex).
    pub cap_eff: Option<String>,
    pub cap_sys_admin: bool,
    pub cap_bpf: bool,
    pub cap_perfmon: bool,
    pub cap_sys_ptrace: bool,
    /// Read files and search directories whatever their modes (targets' files inside
    /// containers, through `/proc/PID/root`).
    pub cap_dac_read_search: bool,
    /// Lock perf ring memory beyond `kernel.perf_event_mlock_kb`.
    pub cap_ipc_lock: bool,
    /// Open `/proc/PID/map_files/` (the very file a process mapped, even deleted).
    pub cap_checkpoint_restore: bool,
}

impl Capabilities {
    /// The capabilities held, as the kernel names them (`CAP_BPF`, ...), of those this
    /// report knows.
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.cap_sys_admin, "CAP_SYS_ADMIN"),
            (self.cap_bpf, "CAP_BPF"),
            (self.cap_perfmon, "CAP_PERFMON"),
            (self.cap_sys_ptrace, "CAP_SYS_PTRACE"),
            (self.cap_dac_read_search, "CAP_DAC_READ_SEARCH"),
            (self.cap_ipc_lock, "CAP_IPC_LOCK"),
            (self.cap_checkpoint_restore, "CAP_CHECKPOINT_RESTORE"),
        ]
        .into_iter()
        .filter_map(|(has, name)| has.then_some(name))
        .collect()
    }

    /// Parses the text of `/proc/PID/status`. Missing or malformed lines leave the
    /// corresponding fields unset/false.
    pub fn parse_status(status: &str) -> Self {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name)?.strip_prefix(':').map(str::trim))
        };
        // `Uid:	real	effective	saved	fs`
        let euid = field("Uid").and_then(|uids| uids.split_whitespace().nth(1)?.parse().ok());
        let cap_eff = field("CapEff").map(str::to_owned);
        let mask = cap_eff
            .as_deref()
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        let has = |cap: u32| mask.is_some_and(|m| m & (1u64 << cap) != 0);
        Self {
            root: euid == Some(0),
            euid,
            cap_eff: mask.and(cap_eff),
            cap_sys_admin: has(CAP_SYS_ADMIN),
            cap_bpf: has(CAP_BPF),
            cap_perfmon: has(CAP_PERFMON),
            cap_sys_ptrace: has(CAP_SYS_PTRACE),
            cap_dac_read_search: has(CAP_DAC_READ_SEARCH),
            cap_ipc_lock: has(CAP_IPC_LOCK),
            cap_checkpoint_restore: has(CAP_CHECKPOINT_RESTORE),
        }
    }
}

/// This process's own effective capabilities (`/proc/self/status`).
pub fn own_capabilities() -> Capabilities {
    read_capabilities(&Paths::default())
}

pub(super) fn read_capabilities(paths: &Paths) -> Capabilities {
    std::fs::read_to_string(paths.proc.join("self/status"))
        .map(|status| Capabilities::parse_status(&status))
        .unwrap_or_default()
}

/// `/proc/sys/kernel/perf_event_paranoid`: -1 (anything) … 2 (user-space only for the
/// unprivileged; Debian's 3 forbids them everything). `None` when unreadable or garbage.
pub(super) fn read_perf_event_paranoid(paths: &Paths) -> Option<i32> {
    std::fs::read_to_string(paths.proc.join("sys/kernel/perf_event_paranoid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT_STATUS: &str = "Name:\tlookback\nUmask:\t0022\nState:\tR (running)\n\
        Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nCapInh:\t0000000000000000\n\
        CapPrm:\t000001fffeffffff\nCapEff:\t000001fffeffffff\nCapBnd:\t000001fffeffffff\n";

    #[test]
    fn root_without_cap_sys_resource() {
        // This VM: root with every capability but CAP_SYS_RESOURCE (bit 24).
        let caps = Capabilities::parse_status(ROOT_STATUS);
        assert!(caps.root);
        assert_eq!(caps.euid, Some(0));
        assert_eq!(caps.cap_eff.as_deref(), Some("000001fffeffffff"));
        assert!(caps.cap_sys_admin && caps.cap_bpf && caps.cap_perfmon && caps.cap_sys_ptrace);
    }

    #[test]
    fn the_daemonsets_set() {
        // BPF PERFMON SYS_PTRACE DAC_READ_SEARCH IPC_LOCK, as `setpriv` leaves it.
        let status = "Uid:\t0\t0\t0\t0\nCapEff:\t000000c000084004\n";
        let caps = Capabilities::parse_status(status);
        assert!(caps.cap_bpf && caps.cap_perfmon && caps.cap_sys_ptrace);
        assert!(caps.cap_dac_read_search && caps.cap_ipc_lock);
        assert!(!caps.cap_sys_admin && !caps.cap_checkpoint_restore);
    }

    #[test]
    fn unprivileged_user_with_cap_bpf_only() {
        let status = "Uid:\t1000\t1001\t1000\t1000\nCapEff:\t0000008000000000\n";
        let caps = Capabilities::parse_status(status);
        assert!(!caps.root);
        assert_eq!(caps.euid, Some(1001));
        assert!(caps.cap_bpf);
        assert!(!caps.cap_perfmon && !caps.cap_sys_admin && !caps.cap_sys_ptrace);
    }

    #[test]
    fn garbage_status_gives_nothing() {
        for status in [
            "",
            "Uid:\nCapEff:\tzzzz\n",
            "CapEff\t00ff\nUid 0 0 0 0",
            "\u{0}\u{ff}",
        ] {
            let caps = Capabilities::parse_status(status);
            assert_eq!(caps, Capabilities::default(), "{status:?}");
        }
    }

    #[test]
    fn paranoid_from_fixture() {
        let root = tempfile::tempdir().expect("tempdir");
        let paths = Paths::under(root.path());
        assert_eq!(read_perf_event_paranoid(&paths), None);
        let dir = root.path().join("proc/sys/kernel");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("perf_event_paranoid"), "2\n").expect("write");
        assert_eq!(read_perf_event_paranoid(&paths), Some(2));
        std::fs::write(dir.join("perf_event_paranoid"), "-1\n").expect("write");
        assert_eq!(read_perf_event_paranoid(&paths), Some(-1));
        std::fs::write(dir.join("perf_event_paranoid"), "lots\n").expect("write");
        assert_eq!(read_perf_event_paranoid(&paths), None);
    }
}
