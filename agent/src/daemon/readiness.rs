//! The `/readyz` decision: is every installed rule able to fire? Kept apart from the
//! daemon loop so that the rule is a pure function of what the tracer reports, and tested
//! as one.

/// One installed rule, as readiness sees it.
#[derive(Debug, Clone, Copy)]
pub struct RuleProbes<'a> {
    pub rule: &'a str,
    /// A function rule that must have uprobes to fire: it targets processes, or it names
    /// its binary (then it is probed at install, before any process runs).
    pub needs_probes: bool,
    /// Uprobes attached for it now.
    pub probes: usize,
    /// The last attach or symbol-resolution failure.
    pub error: Option<&'a str>,
}

/// Why the agent is not ready, or `None` when it is. Not ready when no rule could be
/// installed at all, or when a function rule that needs probes has none because attaching
/// failed (a missing symbol, say): such a rule can never fire, and a rollout should stop
/// there rather than report a healthy agent that records nothing. A rule with at least one
/// probe is fine even if another binary lacked the symbol.
pub fn not_ready_reason(installed: &[RuleProbes<'_>], failed: &[String]) -> Option<String> {
    if installed.is_empty() && !failed.is_empty() {
        return Some(format!("no rule could be installed: {}", failed.join(", ")));
    }
    let broken: Vec<String> = installed
        .iter()
        .filter(|r| r.needs_probes && r.probes == 0)
        .filter_map(|r| {
            r.error
                .map(|e| format!("rule {}: no probe attached: {e}", r.rule))
        })
        .collect();
    if broken.is_empty() {
        None
    } else {
        Some(broken.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(needs: bool, probes: usize, error: Option<&str>) -> RuleProbes<'_> {
        RuleProbes {
            rule: "slow",
            needs_probes: needs,
            probes,
            error,
        }
    }

    #[test]
    fn a_function_rule_without_probes_after_a_failure_is_not_ready() {
        let reason = not_ready_reason(
            &[
                rule(true, 0, Some("symbol lb_nope not found")),
                RuleProbes {
                    rule: "usr1",
                    needs_probes: false,
                    probes: 0,
                    error: None,
                },
            ],
            &[],
        );
        assert_eq!(
            reason.as_deref(),
            Some("rule slow: no probe attached: symbol lb_nope not found")
        );
    }

    #[test]
    fn probes_or_no_need_for_them_is_ready() {
        // One binary lacked the symbol, another has it: the rule fires.
        assert_eq!(
            not_ready_reason(&[rule(true, 2, Some("missing"))], &[]),
            None
        );
        // No target yet and no binary named: nothing to attach to, nothing failed.
        assert_eq!(
            not_ready_reason(&[rule(false, 0, Some("missing"))], &[]),
            None
        );
        // Targets, no probe yet, but no failure either (being attached).
        assert_eq!(not_ready_reason(&[rule(true, 0, None)], &[]), None);
        // Some rules failed to install, others run.
        assert_eq!(
            not_ready_reason(&[rule(true, 1, None)], &["bad".to_owned()]),
            None
        );
    }

    #[test]
    fn no_rule_installed_is_not_ready() {
        assert_eq!(
            not_ready_reason(&[], &["a".to_owned(), "b".to_owned()]).as_deref(),
            Some("no rule could be installed: a, b")
        );
        assert_eq!(not_ready_reason(&[], &[]), None);
    }
}
