//! Freezing at the trigger, before the event loop sees it: the recorders' freeze switches
//! by process, for the trigger pump thread.
//!
//! The event loop freezes a recorder only once it gets to the trigger (after process
//! events, ticks, the previous snapshot's bookkeeping); the pump thread gets there within
//! a wakeup. It stops the rings of the triggering process's own recorder when the rule
//! freezes at once (`post_trigger: 0`); the pipeline then copies what the switch kept, or,
//! when it suppresses the trigger, resumes the recorder. Children recorded by a parent's
//! inherited events are not in the table: the event loop freezes those.
//!
//! For sampling rules this is the second line: the trigger's BPF program already stopped
//! the triggering process's samples in the kernel (`FROZEN`); the pause here still stops
//! the recorder's other processes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use lookback_common::trigger::TriggerRecord;

use crate::capture::freeze::FreezeSwitch;

#[derive(Default)]
struct Table {
    switches: HashMap<u32, Arc<FreezeSwitch>>,
    /// Kernel rule ids (bits) whose triggers freeze at once.
    immediate: u64,
}

/// Shared by the tracer (which keeps it current) and the pump thread (which reads it).
#[derive(Default)]
pub struct EarlyFreeze {
    table: Mutex<Table>,
}

impl EarlyFreeze {
    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A panic elsewhere while holding it leaves a table that is still consistent.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The pump's hook: stops the rings of the process that triggered, when its rule
    /// freezes at once. Returns whether it did.
    pub fn on_trigger(&self, record: &TriggerRecord) -> bool {
        let table = self.table();
        let immediate = 1u64
            .checked_shl(record.rule_id)
            .is_some_and(|bit| table.immediate & bit != 0);
        match table.switches.get(&record.pid) {
            Some(switch) if immediate => {
                switch.freeze();
                true
            }
            _ => false,
        }
    }

    pub fn insert(&self, pid: u32, switch: Arc<FreezeSwitch>) {
        self.table().switches.insert(pid, switch);
    }

    pub fn remove(&self, pid: u32) {
        self.table().switches.remove(&pid);
    }

    /// Keeps the processes `keep` says to keep.
    pub fn retain(&self, mut keep: impl FnMut(u32) -> bool) {
        self.table().switches.retain(|&pid, _| keep(pid));
    }

    pub fn set_immediate(&self, rule_bits: u64) {
        self.table().immediate = rule_bits;
    }
}

#[cfg(test)]
mod tests {
    use super::EarlyFreeze;
    use crate::capture::freeze::{FreezeSwitch, StopMethod};
    use lookback_common::trigger::TriggerRecord;
    use std::sync::Arc;

    fn record(rule_id: u32, pid: u32) -> TriggerRecord {
        TriggerRecord {
            rule_id,
            pid,
            tid: pid,
            ..TriggerRecord::default()
        }
    }

    #[test]
    fn only_immediate_rules_of_known_processes_freeze() {
        let table = EarlyFreeze::default();
        let switch = Arc::new(FreezeSwitch::new(StopMethod::PauseOutput, 0));
        table.insert(10, Arc::clone(&switch));
        table.set_immediate(1 << 3);
        assert!(
            !table.on_trigger(&record(2, 10)),
            "rule 2 waits (post_trigger)"
        );
        assert!(
            !table.on_trigger(&record(3, 11)),
            "process 11 has no switch here"
        );
        assert!(!table.on_trigger(&record(64, 10)), "no such rule bit");
        assert_eq!(switch.frozen_at(), None);
        assert!(table.on_trigger(&record(3, 10)));
        assert!(switch.frozen_at().is_some(), "the switch is frozen");
        switch.thaw().expect("thaw with no rings");
        table.retain(|pid| pid != 10);
        assert!(!table.on_trigger(&record(3, 10)), "forgotten");
    }
}
