//! The processes each rule selected lately, gone ones included, for `capture.peers: true`:
//! a snapshot of the per-CPU rings keeps the records of the triggering rule's processes
//! and of no one else's (another tenant's process on the same CPUs stays out).
//!
//! In: `(pid, rule mask)` as the agent learns them (the kernel's exec events, which also
//! name processes gone before the agent could read them, and each match). Out: the pids
//! with a rule's bit. Bounded: the oldest entries go first (a ring of a few MiB holds far
//! fewer processes than that).

use std::collections::{BTreeSet, HashMap, VecDeque};

/// How many processes are remembered.
pub const KEPT: usize = 4096;

/// pid → the rules (bit = id) that selected it last.
#[derive(Debug, Default)]
pub struct Selected {
    masks: HashMap<u32, u64>,
    order: VecDeque<u32>,
}

impl Selected {
    /// `pid` is selected by the rules of `mask` (its current selection: a reused pid or a
    /// new exec replaces what was known).
    pub fn note(&mut self, pid: u32, mask: u64) {
        if mask == 0 {
            return;
        }
        if self.masks.insert(pid, mask).is_none() {
            self.order.push_back(pid);
            while self.order.len() > KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.masks.remove(&old);
                }
            }
        }
    }

    /// The processes rule `id` selected.
    pub fn of_rule(&self, id: u32) -> BTreeSet<u32> {
        let bit = 1u64 << id;
        self.masks
            .iter()
            .filter(|&(_, mask)| mask & bit != 0)
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Rule `id` is gone: its bit may name another rule later.
    pub fn drop_rule(&mut self, id: u32) {
        let bit = 1u64 << id;
        for mask in self.masks.values_mut() {
            *mask &= !bit;
        }
        self.masks.retain(|_, mask| *mask != 0);
        let masks = &self.masks;
        self.order.retain(|pid| masks.contains_key(pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_selection_of_each_pid_and_forgets_the_oldest() {
        let mut selected = Selected::default();
        selected.note(10, 0b01);
        selected.note(11, 0b10);
        selected.note(12, 0b11);
        selected.note(13, 0);
        assert_eq!(selected.of_rule(0), BTreeSet::from([10, 12]));
        assert_eq!(selected.of_rule(1), BTreeSet::from([11, 12]));
        // Pid 10 reused by a process of rule 1 only.
        selected.note(10, 0b10);
        assert_eq!(selected.of_rule(0), BTreeSet::from([12]));
        selected.drop_rule(1);
        assert_eq!(selected.of_rule(1), BTreeSet::new());
        assert_eq!(selected.of_rule(0), BTreeSet::from([12]));
        for pid in 100..100 + u32::try_from(KEPT).unwrap() {
            selected.note(pid, 0b01);
        }
        assert!(!selected.of_rule(0).contains(&12), "the oldest went");
        assert_eq!(selected.of_rule(0).len(), KEPT);
    }
}
