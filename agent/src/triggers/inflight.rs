//! The kernel side of in-flight latency (`detect: running`) as the agent holds it: the
//! programs (loaded at the first such rule), and the handles the watcher
//! ([`crate::inflight`]) scans and fires with. See agent-ebpf's `inflight` for what the
//! programs do.
//!
//! In: the loaded [`Ebpf`] object. Out: [`Handles`] (its own descriptors of the maps and
//! programs, so the watcher's thread owns them), and [`Shared`], where the watcher leaves
//! a look's stack for the pump to join to the trigger record it fired.

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, OwnedFd},
    sync::{Mutex, OnceLock, PoisonError},
};

use aya::{
    Btf as AyaBtf, Ebpf,
    maps::{Array, HashMap as BpfHashMap, Map, MapData, MapError},
    programs::{Iter, PerfEvent, ProgramError, RawTracePoint},
};
use lookback_common::rule::{EngineConfig, EntryKey, Look, RuleSpec, RunningStack, SyscallStart};

use super::{
    engine::{TriggerError, map_err, prog_err, program},
    event::StackCopy,
};

/// The fire program (never attached: run with `BPF_PROG_TEST_RUN`).
pub const PROG_INFLIGHT_FIRE: &str = "inflight_fire";
/// The task iterator that looks at threads off CPU.
pub const PROG_INFLIGHT_LOOK: &str = "inflight_look";
/// The CPU tick that looks at threads on CPU.
pub const PROG_INFLIGHT_TICK: &str = "inflight_tick";

/// Loads the in-flight programs if they are not yet (the iterator needs the kernel's BTF;
/// the look needs `task_struct.on_cpu`, `nvcsw` and `nivcsw`, whose offsets the engine
/// wrote into `config`).
pub fn load_programs(ebpf: &mut Ebpf, config: &EngineConfig) -> Result<(), TriggerError> {
    if config.task_on_cpu_offset == 0 || config.task_nvcsw_offset == 0 {
        return Err(TriggerError::MissingProgram {
            name: "inflight_look (task_struct has no on_cpu or nvcsw in this kernel's BTF)",
        });
    }
    let fire: &mut RawTracePoint = program(ebpf, PROG_INFLIGHT_FIRE)?;
    if fire.fd().is_err() {
        fire.load().map_err(prog_err(PROG_INFLIGHT_FIRE))?;
    }
    let tick: &mut PerfEvent = program(ebpf, PROG_INFLIGHT_TICK)?;
    if tick.fd().is_err() {
        tick.load().map_err(prog_err(PROG_INFLIGHT_TICK))?;
    }
    let look: &mut Iter = program(ebpf, PROG_INFLIGHT_LOOK)?;
    if look.fd().is_err() {
        let btf = AyaBtf::from_sys_fs()
            .map_err(|e| prog_err(PROG_INFLIGHT_LOOK)(ProgramError::Btf(e)))?;
        look.load("task", &btf)
            .map_err(prog_err(PROG_INFLIGHT_LOOK))?;
    }
    Ok(())
}

/// The watcher's own descriptors of the maps and programs it uses.
pub struct Handles {
    pub config: Array<MapData, EngineConfig>,
    pub rules: Array<MapData, RuleSpec>,
    pub running_times: BpfHashMap<MapData, EntryKey, RunningStack>,
    pub syscall_start: BpfHashMap<MapData, u32, SyscallStart>,
    pub looks: Array<MapData, Look>,
    pub want_look: BpfHashMap<MapData, u32, u32>,
    pub fire: OwnedFd,
    pub look: OwnedFd,
    pub tick: OwnedFd,
}

impl Handles {
    /// Duplicates the descriptors out of `ebpf` (whose programs [`load_programs`] loaded).
    pub fn new(ebpf: &Ebpf) -> Result<Self, TriggerError> {
        let prog_fd = |name: &'static str| -> Result<OwnedFd, TriggerError> {
            let prog = ebpf
                .program(name)
                .ok_or(TriggerError::MissingProgram { name })?;
            prog.fd()
                .map_err(prog_err(name))?
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| prog_err(name)(ProgramError::IOError(e)))
        };
        Ok(Self {
            config: Array::try_from(dup(ebpf, "CONFIG", Map::Array)?).map_err(map_err("CONFIG"))?,
            rules: Array::try_from(dup(ebpf, "RULES", Map::Array)?).map_err(map_err("RULES"))?,
            running_times: BpfHashMap::try_from(dup(ebpf, "RUNNING_TIMES", Map::LruHashMap)?)
                .map_err(map_err("RUNNING_TIMES"))?,
            syscall_start: BpfHashMap::try_from(dup(ebpf, "SYSCALL_START", Map::LruHashMap)?)
                .map_err(map_err("SYSCALL_START"))?,
            looks: Array::try_from(dup(ebpf, "LOOKS", Map::Array)?).map_err(map_err("LOOKS"))?,
            want_look: BpfHashMap::try_from(dup(ebpf, "WANT_LOOK", Map::HashMap)?)
                .map_err(map_err("WANT_LOOK"))?,
            fire: prog_fd(PROG_INFLIGHT_FIRE)?,
            look: prog_fd(PROG_INFLIGHT_LOOK)?,
            tick: prog_fd(PROG_INFLIGHT_TICK)?,
        })
    }
}

/// A new descriptor of map `name`, as the `aya` map kind `kind`.
fn dup(ebpf: &Ebpf, name: &'static str, kind: fn(MapData) -> Map) -> Result<Map, TriggerError> {
    let map = ebpf.map(name).ok_or(TriggerError::MissingMap { name })?;
    let fd = match map {
        Map::Array(d) | Map::HashMap(d) | Map::LruHashMap(d) => d.fd().as_fd().try_clone_to_owned(),
        _ => return Err(TriggerError::MissingMap { name }),
    }
    .map_err(|e| map_err(name)(MapError::IoError(e)))?;
    let data = MapData::from_fd(fd).map_err(map_err(name))?;
    Ok(kind(data))
}

/// What the watcher and the trigger pump share ([`stacks`]).
#[derive(Default)]
pub struct Shared {
    /// The look behind each in-flight trigger being fired, by (tid, entry time): the
    /// fire program cannot take another thread's stack, so the pump joins this one to
    /// the record.
    stacks: Mutex<HashMap<(u32, u64), StackCopy>>,
}

/// The process's one [`Shared`] (one trigger ring, one pump, one watcher per session).
pub fn stacks() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(Shared::default)
}

impl Shared {
    /// Leaves the `stack` of the call of thread `tid` that entered at `entry_ns`.
    pub fn put(&self, tid: u32, entry_ns: u64, stack: StackCopy) {
        let mut stacks = self.stacks.lock().unwrap_or_else(PoisonError::into_inner);
        // Bounded: a fired record takes its stack; what no record took is old.
        if stacks.len() >= 4096 {
            stacks.clear();
        }
        stacks.insert((tid, entry_ns), stack);
    }

    /// Takes the stack left for the call of `tid` that entered at `entry_ns`.
    pub fn take(&self, tid: u32, entry_ns: u64) -> Option<StackCopy> {
        self.stacks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(tid, entry_ns))
    }
}
