//! Training-stability alarms: gradient spikes, entropy collapse, the echo trap, and updates
//! skipped for a non-finite loss or gradient.
//!
//! Multi-turn RL fails in recognisable ways (RAGEN's StarPO analysis): a gradient norm that
//! jumps far above its recent level precedes divergence; an entropy that falls to a small
//! fraction of where RL started means the policy stopped exploring; and rewards whose spread
//! collapses — every episode of a group earning the same — leave group-relative estimators
//! without signal, the "echo trap" where the agent repeats one reasoning pattern. The monitor
//! watches each step's record, lists the conditions that hold (`alerts` in `metrics.jsonl`) and
//! reports when one starts, so a researcher sees it as it happens rather than in the curves
//! afterwards. It only observes: training is never changed by it.
//!
//! Its state is part of every checkpoint, so a resumed run raises the same alarms.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Steps of recent gradient norms a spike is measured against.
pub const GRAD_WINDOW: usize = 20;
/// Norms needed in the window before spikes are judged.
pub const GRAD_MIN_HISTORY: usize = 5;
/// A gradient norm above this multiple of the window's median is a spike.
pub const GRAD_SPIKE_FACTOR: f32 = 5.0;
/// RL steps whose mean entropy and reward spread are each one's baseline.
pub const BASELINE_STEPS: usize = 5;
/// Entropy below this fraction of its baseline is a collapse.
pub const ENTROPY_COLLAPSE_FRACTION: f64 = 0.1;
/// Reward spread below this fraction of its baseline is the echo trap…
pub const ECHO_SPREAD_FRACTION: f64 = 0.1;
/// …and so is a step where at least this fraction of the groups have no reward spread at all…
pub const ECHO_FLAT_GROUPS: f64 = 0.9;
/// …for this many consecutive steps (one flat batch is chance; a run of them is a collapse).
pub const ECHO_PATIENCE: u32 = 3;

/// What the monitor reads of one RL step's record (`metrics::RlRecord::signals`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Signals {
    /// The RL step.
    pub step: u64,
    /// Whether the step's update was skipped because every advantage was zero.
    pub skipped: bool,
    /// Updates of the step skipped for a non-finite loss or gradient norm.
    pub skipped_nonfinite: usize,
    /// The gradient norm of the step's last applied update.
    pub grad_norm: f32,
    /// The policy's mean entropy over the agent tokens.
    pub entropy: f32,
    /// The standard deviation of the batch's rewards.
    pub reward_std: f64,
    /// Fraction of groups whose members all earned one reward.
    pub flat_groups: f64,
}

/// One instability the monitor recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Alert {
    /// The gradient norm jumped above [`GRAD_SPIKE_FACTOR`] × the median of the last
    /// [`GRAD_WINDOW`] steps.
    GradSpike,
    /// The entropy fell below [`ENTROPY_COLLAPSE_FRACTION`] of its mean over the first
    /// [`BASELINE_STEPS`] RL steps.
    EntropyCollapse,
    /// Reward-variance collapse: for [`ECHO_PATIENCE`] steps in a row, the batch's reward std
    /// was below [`ECHO_SPREAD_FRACTION`] of its baseline, or at least [`ECHO_FLAT_GROUPS`] of
    /// the groups (of two or more episodes) earned one reward each.
    EchoTrap,
    /// An update of the step had a non-finite loss or gradient norm and was skipped
    /// (`skipped_nonfinite` in the record); the trainer stops the run after
    /// `train.max_nonfinite_skips` such updates in a row.
    Nonfinite,
}

impl Alert {
    /// The name used in `metrics.jsonl` and messages.
    pub fn name(self) -> &'static str {
        match self {
            Alert::GradSpike => "grad_spike",
            Alert::EntropyCollapse => "entropy_collapse",
            Alert::EchoTrap => "echo_trap",
            Alert::Nonfinite => "nonfinite",
        }
    }

    /// What a researcher reads when the alert starts.
    fn explain(self, record: &Signals, monitor: &Monitor) -> String {
        match self {
            Alert::GradSpike => format!(
                "gradient spike: norm {:.3} is over {GRAD_SPIKE_FACTOR}× the recent median {:.3} \
                 (a lower learning rate or `grad_clip` keeps it from moving the policy far)",
                record.grad_norm,
                median(&monitor.grad_norms)
            ),
            Alert::EntropyCollapse => format!(
                "entropy collapse: {:.4} is under {:.0}% of its early level {:.4}; the policy has \
                 nearly stopped exploring (an `entropy` bonus or a higher temperature helps)",
                record.entropy,
                ENTROPY_COLLAPSE_FRACTION * 100.0,
                monitor.entropy.value().unwrap_or(0.0)
            ),
            Alert::EchoTrap => format!(
                "echo trap: for {ECHO_PATIENCE} steps the rewards barely differed (now: reward \
                 std {:.4}{}, {:.0}% of groups without any spread); group-relative advantages \
                 are vanishing (`filter = reward_std(...)` trains on the groups that still \
                 differ; a higher temperature restores exploration)",
                record.reward_std,
                monitor
                    .reward_std
                    .value()
                    .map(|early| format!(" against {early:.4} early on"))
                    .unwrap_or_default(),
                record.flat_groups * 100.0
            ),
            Alert::Nonfinite => format!(
                "non-finite update: {} update(s) of this step had a NaN or infinite loss or \
                 gradient norm and were skipped, weights and optimizer unchanged (the run stops \
                 after `train.max_nonfinite_skips` in a row; a lower learning rate or \
                 `grad_clip` helps)",
                record.skipped_nonfinite
            ),
        }
    }
}

/// The mean of the first [`BASELINE_STEPS`] observations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Baseline {
    sum: f64,
    count: usize,
}

impl Baseline {
    fn observe(&mut self, x: f64) {
        if self.count < BASELINE_STEPS && x.is_finite() {
            self.sum += x;
            self.count += 1;
        }
    }

    /// Known once the baseline steps have all been seen.
    fn value(&self) -> Option<f64> {
        (self.count == BASELINE_STEPS).then(|| self.sum / self.count as f64)
    }
}

/// The monitor's state: baselines, recent gradient norms, and the alerts in force.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Monitor {
    grad_norms: VecDeque<f32>,
    entropy: Baseline,
    reward_std: Baseline,
    /// Consecutive steps whose rewards barely differed.
    flat_streak: u32,
    active: Vec<Alert>,
}

impl Monitor {
    /// Judges one step's record (skipped updates have no gradient or entropy and are judged
    /// on rewards only). Returns the alerts that hold, and a message for each that just began.
    pub fn observe(&mut self, record: &Signals) -> (Vec<Alert>, Vec<String>) {
        let mut holding = Vec::new();
        // A step with a skipped update says nothing reliable about gradients or entropy.
        let updated = !record.skipped && record.skipped_nonfinite == 0;
        if record.skipped_nonfinite > 0 {
            holding.push(Alert::Nonfinite);
        }
        if updated
            && self.grad_norms.len() >= GRAD_MIN_HISTORY
            && record.grad_norm > GRAD_SPIKE_FACTOR * median(&self.grad_norms)
        {
            holding.push(Alert::GradSpike);
        }
        if updated
            && let Some(early) = self.entropy.value()
            && f64::from(record.entropy) < ENTROPY_COLLAPSE_FRACTION * early
        {
            holding.push(Alert::EntropyCollapse);
        }
        let spread_gone = self
            .reward_std
            .value()
            .is_some_and(|early| early > 0.0 && record.reward_std < ECHO_SPREAD_FRACTION * early);
        if spread_gone || record.flat_groups >= ECHO_FLAT_GROUPS {
            self.flat_streak += 1;
        } else {
            self.flat_streak = 0;
        }
        if self.flat_streak >= ECHO_PATIENCE {
            holding.push(Alert::EchoTrap);
        }
        let messages = holding
            .iter()
            .filter(|a| !self.active.contains(a))
            .map(|a| format!("step {}: {}", record.step, a.explain(record, self)))
            .collect();

        if updated && record.grad_norm.is_finite() {
            self.grad_norms.push_back(record.grad_norm);
            if self.grad_norms.len() > GRAD_WINDOW {
                self.grad_norms.pop_front();
            }
            self.entropy.observe(f64::from(record.entropy));
        }
        self.reward_std.observe(record.reward_std);
        self.active.clone_from(&holding);
        (holding, messages)
    }
}

fn median(values: &VecDeque<f32>) -> f32 {
    let mut sorted: Vec<f32> = values.iter().copied().collect();
    sorted.sort_by(f32::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64, grad_norm: f32, entropy: f32, reward_std: f64) -> Signals {
        Signals {
            step,
            grad_norm,
            entropy,
            reward_std,
            ..Signals::default()
        }
    }

    #[test]
    fn a_skipped_nonfinite_update_is_alerted_and_kept_out_of_the_baselines() {
        let mut monitor = Monitor::default();
        for i in 1..=6 {
            monitor.observe(&step(i, 1.0, 2.0, 0.4));
        }
        let before = monitor.clone();
        let mut skipped = step(7, 0.0, 0.0, 0.4);
        skipped.skipped_nonfinite = 1;
        let (alerts, messages) = monitor.observe(&skipped);
        assert_eq!(alerts, vec![Alert::Nonfinite]);
        assert_eq!(messages.len(), 1);
        assert!(messages[0].contains("non-finite"), "{}", messages[0]);
        // Its zero gradient norm and entropy entered no window or baseline.
        assert_eq!(monitor.grad_norms, before.grad_norms);
        assert_eq!(monitor.entropy, before.entropy);
        // The next finite step clears it.
        assert!(monitor.observe(&step(8, 1.0, 2.0, 0.4)).0.is_empty());
    }

    #[test]
    fn steady_training_raises_nothing() {
        let mut monitor = Monitor::default();
        for i in 1..=40 {
            let wobble = (i % 3) as f32 * 0.1;
            let (alerts, messages) = monitor.observe(&step(i, 1.0 + wobble, 2.0, 0.4));
            assert!(
                alerts.is_empty() && messages.is_empty(),
                "step {i}: {alerts:?}"
            );
        }
    }

    #[test]
    fn a_gradient_spike_is_reported_once_when_it_starts() {
        let mut monitor = Monitor::default();
        // Too little history: a large norm on the fourth step is not judged.
        for i in 1..=3 {
            monitor.observe(&step(i, 1.0, 2.0, 0.4));
        }
        assert!(monitor.observe(&step(4, 50.0, 2.0, 0.4)).0.is_empty());
        for i in 5..=10 {
            monitor.observe(&step(i, 1.0, 2.0, 0.4));
        }
        // Median 1.0: 5.0 is not above 5×, 5.5 is.
        assert!(monitor.observe(&step(11, 5.0, 2.0, 0.4)).0.is_empty());
        let (alerts, messages) = monitor.observe(&step(12, 30.0, 2.0, 0.4));
        assert_eq!(alerts, vec![Alert::GradSpike]);
        assert_eq!(messages.len(), 1);
        assert!(
            messages[0].starts_with("step 12: gradient spike"),
            "{messages:?}"
        );
        // Still spiking: held, not announced again.
        let (alerts, messages) = monitor.observe(&step(13, 40.0, 2.0, 0.4));
        assert_eq!((alerts, messages.len()), (vec![Alert::GradSpike], 0));
        assert!(monitor.observe(&step(14, 1.0, 2.0, 0.4)).0.is_empty());
    }

    #[test]
    fn entropy_collapse_is_judged_against_the_first_steps() {
        let mut monitor = Monitor::default();
        for i in 1..=5 {
            monitor.observe(&step(i, 1.0, 2.0, 0.4));
        }
        // Baseline 2.0: 0.21 is above 10% of it, 0.19 below.
        assert!(monitor.observe(&step(6, 1.0, 0.21, 0.4)).0.is_empty());
        let (alerts, messages) = monitor.observe(&step(7, 1.0, 0.19, 0.4));
        assert_eq!(alerts, vec![Alert::EntropyCollapse]);
        assert!(messages[0].contains("entropy collapse"));
    }

    #[test]
    fn the_echo_trap_is_a_collapse_of_reward_spread() {
        let mut monitor = Monitor::default();
        for i in 1..=5 {
            monitor.observe(&step(i, 1.0, 2.0, 0.5));
        }
        // 0.06 is above 10% of the baseline 0.5; 0.04 is below, but only the third such step
        // in a row is the trap.
        assert!(monitor.observe(&step(6, 1.0, 2.0, 0.06)).0.is_empty());
        assert!(monitor.observe(&step(7, 1.0, 2.0, 0.04)).0.is_empty());
        assert!(monitor.observe(&step(8, 1.0, 2.0, 0.04)).0.is_empty());
        let (alerts, messages) = monitor.observe(&step(9, 1.0, 2.0, 0.04));
        assert_eq!(alerts, vec![Alert::EchoTrap]);
        assert!(
            messages[0].contains("against 0.5000 early on"),
            "{messages:?}"
        );
        // A step with spread again breaks the streak.
        assert!(monitor.observe(&step(10, 1.0, 2.0, 0.5)).0.is_empty());
        assert!(monitor.observe(&step(11, 1.0, 2.0, 0.04)).0.is_empty());
        // Flat groups alone are enough, even with spread across groups.
        let mut monitor = Monitor::default();
        let mut record = step(1, 1.0, 2.0, 0.5);
        record.flat_groups = 0.95;
        assert!(monitor.observe(&record).0.is_empty());
        assert!(monitor.observe(&record).0.is_empty());
        assert_eq!(monitor.observe(&record).0, vec![Alert::EchoTrap]);
    }

    #[test]
    fn skipped_updates_do_not_feed_the_gradient_or_entropy_history() {
        let mut monitor = Monitor::default();
        for i in 1..=10 {
            let mut record = step(i, 0.0, 0.0, 0.0);
            record.skipped = true;
            monitor.observe(&record);
        }
        assert!(monitor.grad_norms.is_empty());
        assert_eq!(monitor.entropy.value(), None);
    }

    #[test]
    fn the_state_round_trips_through_json() {
        let mut monitor = Monitor::default();
        for i in 1..=7 {
            monitor.observe(&step(i, 1.0 + i as f32, 2.0, 0.3));
        }
        let json = serde_json::to_string(&monitor).unwrap();
        let back: Monitor = serde_json::from_str(&json).unwrap();
        assert_eq!(back, monitor);
    }
}
