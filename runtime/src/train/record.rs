//! An RL step's line of `metrics.jsonl`, composed in one place from the statistics each phase
//! of the step returns: the episode source's ([`RolloutStats`], and [`PipelineStats`] once the
//! step's weights are published), the preparation's ([`PreparedStats`]) and the update's
//! ([`UpdateStats`]). No phase writes the record itself, so each field has one source.

use crate::metrics::RlRecord;

use super::prepare::PreparedStats;
use super::source::{PipelineStats, RolloutStats};
use super::update::UpdateStats;

/// What one RL step measured up to its update, phase by phase.
#[derive(Clone, Debug)]
pub(super) struct StepStats {
    /// RL step, from 1.
    pub step: u64,
    /// The curriculum stage it drew its tasks from.
    pub stage: String,
    /// The SFT term's weight α this step.
    pub sft_alpha: f64,
    /// What the episode source measured of the rollout.
    pub rollout: RolloutStats,
    /// What preparing the batch for the update measured.
    pub prepared: PreparedStats,
    /// The update's statistics; `None` when it was skipped because every advantage was zero
    /// (and no critic target differed from its value).
    pub update: Option<UpdateStats>,
}

impl RlRecord {
    /// The record of a step from its phases' statistics and, for an asynchronous source, what
    /// it measured of the whole step (`pipeline`). No alerts: the monitor judges the record
    /// ([`RlRecord::signals`]) and adds them ([`RlRecord::with_alerts`]).
    pub(super) fn compose(stats: StepStats, pipeline: Option<PipelineStats>) -> Self {
        let StepStats {
            step,
            stage,
            sft_alpha,
            rollout,
            prepared,
            update,
        } = stats;
        let played = prepared.played;
        let advantages = prepared.advantages;
        let applied = update.as_ref().and_then(|u| u.applied);
        let terms = applied.map(|a| a.terms).unwrap_or_default();
        let value = update.as_ref().and_then(|u| u.value);
        let importance = update.as_ref().and_then(|u| u.importance);
        // Episodes dropped for staleness: by the asynchronous collector, then by the bound.
        let dropped = match &prepared.staleness {
            Some(staleness) => Some(rollout.dropped.unwrap_or(0) + staleness.dropped),
            None => rollout.dropped,
        };
        let (staleness, stale_turns, stale_tokens) = match prepared.staleness {
            Some(staleness) => (
                staleness.histogram,
                Some(staleness.stale_turns),
                Some(staleness.stale_tokens),
            ),
            None => Default::default(),
        };
        RlRecord {
            step,
            stage,
            tasks: played.tasks,
            success: played.success,
            mean_return: played.mean_return,
            reward_std: played.reward_std,
            flat_groups: played.flat_groups,
            advantage_mean: advantages.mean,
            advantage_std: advantages.std,
            advantage_min: advantages.min,
            advantage_max: advantages.max,
            loss: applied.map_or(0.0, |a| a.loss),
            policy_loss: terms.policy,
            entropy: terms.entropy,
            kl: terms.kl,
            sft_alpha,
            clip_low: terms.clip_low,
            clip_high: terms.clip_high,
            grad_norm: applied.map_or(0.0, |a| a.grad_norm),
            value_loss: value.map(|v| v.loss),
            explained_variance: prepared.explained_variance,
            value_clip_frac: value.map(|v| v.clip_frac),
            is_weight: importance.map(|i| i.mean),
            is_truncated: importance.map(|i| i.truncated),
            mc_continuations: rollout.monte_carlo.map(|mc| mc.continuations),
            mc_value: rollout.monte_carlo.and_then(|mc| mc.mean_return),
            stale_turns,
            stale_tokens,
            staleness,
            dropped,
            successes_kept: prepared.successes_kept,
            alerts: Vec::new(),
            agent_tokens: advantages.agent_tokens,
            groups_kept: prepared.groups_kept,
            skipped: update.is_none(),
            skipped_nonfinite: update.as_ref().map_or(0, |u| u.skipped_nonfinite),
            rollout_seconds: rollout.seconds,
            trajectories_per_second: pipeline.map_or(rollout.trajectories_per_second, |p| {
                p.trajectories_per_second
            }),
            weight_sync_seconds: pipeline.and_then(|p| p.weight_sync_seconds),
            trainer_idle: pipeline.map(|p| p.trainer_idle),
            rollout_idle: pipeline.map(|p| p.rollout_idle),
            update_seconds: update.map_or(0.0, |u| u.seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::prepare::Staleness;

    fn stats(update: Option<UpdateStats>) -> StepStats {
        StepStats {
            step: 4,
            stage: "main".into(),
            sft_alpha: 0.5,
            rollout: RolloutStats {
                seconds: 2.0,
                trajectories_per_second: 16.0,
                monte_carlo: None,
                dropped: Some(2),
            },
            prepared: PreparedStats {
                staleness: Some(Staleness {
                    dropped: 3,
                    ..Staleness::default()
                }),
                ..PreparedStats::default()
            },
            update,
        }
    }

    #[test]
    fn a_skipped_update_records_no_update_and_both_drops() {
        let record = RlRecord::compose(stats(None), None);
        assert!(record.skipped);
        assert_eq!((record.update_seconds, record.loss), (0.0, 0.0));
        assert_eq!(record.dropped, Some(5));
        assert_eq!(record.stale_turns, Some(0.0));
        assert_eq!(record.trajectories_per_second, 16.0);
        assert_eq!(record.trainer_idle, None);
    }

    #[test]
    fn the_pipeline_rate_replaces_the_rollout_rate() {
        let update = UpdateStats {
            skipped_nonfinite: 1,
            seconds: 1.5,
            ..UpdateStats::default()
        };
        let pipeline = PipelineStats {
            trainer_idle: 0.25,
            rollout_idle: 0.5,
            weight_sync_seconds: None,
            trajectories_per_second: 10.0,
        };
        let record = RlRecord::compose(stats(Some(update)), Some(pipeline));
        assert!(!record.skipped);
        assert_eq!((record.skipped_nonfinite, record.update_seconds), (1, 1.5));
        assert_eq!(record.trajectories_per_second, 10.0);
        assert_eq!(
            (record.trainer_idle, record.rollout_idle),
            (Some(0.25), Some(0.5))
        );
        assert_eq!(record.rollout_seconds, 2.0);
    }
}
