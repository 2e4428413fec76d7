//! From played episodes to what an update trains on: statistics of the batch as played, the KL
//! penalty on the reward, the staleness bound, group filtering and token advantages.
//!
//! Everything here is a pure function of its arguments (the model-dependent inputs, the KL of
//! each episode and PPO's rollout values, are computed by the caller), so each rule is tested
//! on a table of episodes.

use std::collections::{BTreeMap, BTreeSet};

use agentry_dsl::spec::{self, AdvantageNorm, AlgorithmKind, Credit as CreditKind};

use crate::algo::{
    Trajectory, credited_advantages, gae, normalize_by_key, std_dev, terminal_rewards,
    turn_end_rewards, weigh_negatives, whiten,
};
use crate::metrics::TaskStats;
use crate::pool::fresh_groups;
use crate::rollout::Episode;

/// An episode's rewards as training credits them: the rollout's, less the KL penalty when the
/// penalty is on the reward, with the Monte-Carlo values of its turns.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Credit {
    /// The episode's reward, less the penalty.
    pub reward: f32,
    /// Each turn's reward; the penalty is the last turn's (the KL is of the whole episode).
    pub turn_rewards: Vec<f32>,
    /// Each turn's agent tokens.
    pub turn_tokens: Vec<usize>,
    /// Monte-Carlo credit: the estimated value of the state each turn started from (0 where
    /// none was estimated); empty otherwise.
    pub turn_values: Vec<f32>,
}

/// A played episode and its credit: one item of an update.
#[derive(Clone, Debug)]
pub(super) struct Example {
    /// As played; never edited.
    pub episode: Episode,
    /// As credited.
    pub credit: Credit,
}

/// The batch as played, before anything is dropped: what the run's success curves show.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Played {
    /// Per task, by name (tasks without episodes left out).
    pub tasks: BTreeMap<String, TaskStats>,
    /// Fraction of episodes solved.
    pub success: f64,
    /// Mean episode reward.
    pub mean_return: f64,
    /// Its standard deviation.
    pub reward_std: f64,
    /// Fraction of groups whose members all earned the same reward ([`flat_groups`]).
    pub flat_groups: f64,
}

/// Success, returns and per-task statistics of `episodes`; `task_names` are the experiment's
/// tasks in order.
pub(super) fn played(task_names: &[&str], episodes: &[Episode]) -> Played {
    let returns: Vec<f64> = episodes.iter().map(|e| f64::from(e.reward())).collect();
    Played {
        tasks: task_stats(task_names, episodes),
        success: episodes.iter().filter(|e| e.success).count() as f64 / episodes.len() as f64,
        mean_return: returns.iter().sum::<f64>() / returns.len() as f64,
        reward_std: std_dev(&returns),
        flat_groups: flat_groups(episodes),
    }
}

/// Success and return of each task's episodes, by task name; tasks without episodes are left
/// out.
pub(crate) fn task_stats(task_names: &[&str], episodes: &[Episode]) -> BTreeMap<String, TaskStats> {
    task_names
        .iter()
        .enumerate()
        .filter_map(|(t, name)| {
            let stats = TaskStats::of(
                episodes
                    .iter()
                    .filter(|e| e.spec.task == t)
                    .map(|e| (e.success, e.reward(), e.turn_count())),
            );
            (stats.episodes > 0).then(|| (name.to_string(), stats))
        })
        .collect()
}

/// Pairs each episode with its credit: `penalties` (one per episode, `coef · KL`) are taken
/// from the reward and from its last turn's; `turn_values` (one list per episode) are the
/// Monte-Carlo values.
pub(super) fn credit(
    episodes: Vec<Episode>,
    penalties: Option<&[f32]>,
    turn_values: Option<Vec<Vec<f32>>>,
) -> Vec<Example> {
    let mut values = turn_values.map(Vec::into_iter);
    episodes
        .into_iter()
        .enumerate()
        .map(|(i, episode)| {
            let penalty = penalties.and_then(|p| p.get(i)).copied();
            let mut reward = episode.reward();
            let mut turn_rewards = episode.turn_rewards();
            if let Some(penalty) = penalty {
                reward -= penalty;
                if let Some(last) = turn_rewards.last_mut() {
                    *last -= penalty;
                }
            }
            let credit = Credit {
                reward,
                turn_rewards,
                turn_tokens: episode.turn_tokens(),
                turn_values: values.as_mut().and_then(Iterator::next).unwrap_or_default(),
            };
            Example { episode, credit }
        })
        .collect()
}

/// How stale the turns of a batch were.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Staleness {
    /// Turns by how many versions they lag the fresh policy.
    pub histogram: BTreeMap<u64, usize>,
    /// Fraction of turns from an older policy (by their first token).
    pub stale_turns: f64,
    /// Fraction of agent tokens from an older policy.
    pub stale_tokens: f64,
    /// Episodes dropped (whole groups) for a turn more than `max_staleness` versions old.
    pub dropped: usize,
}

/// The staleness bound, with its statistics: keeps the groups whose every turn is within
/// `max_staleness` versions of `fresh_version` ([`fresh_groups`], the rule the asynchronous
/// collector applies too).
pub(super) fn within_staleness(
    examples: Vec<Example>,
    fresh_version: u64,
    max_staleness: u64,
) -> (Vec<Example>, Staleness) {
    let mut histogram = BTreeMap::new();
    for turn in examples.iter().flat_map(|e| &e.episode.turns) {
        *histogram.entry(fresh_version - turn.version).or_insert(0) += 1;
    }
    let turns: usize = histogram.values().sum();
    let stale: usize = histogram
        .iter()
        .filter(|(behind, _)| **behind > 0)
        .map(|(_, n)| n)
        .sum();
    let fraction = |part: usize, whole: usize| {
        if whole == 0 {
            0.0
        } else {
            part as f64 / whole as f64
        }
    };
    let stale_turns = fraction(stale, turns);
    let (mut tokens, mut stale_tokens) = (0, 0);
    for version in examples
        .iter()
        .flat_map(|e| &e.episode.turns)
        .flat_map(|turn| turn.token_versions())
    {
        tokens += 1;
        stale_tokens += usize::from(version < fresh_version);
    }
    let stale_tokens = fraction(stale_tokens, tokens);
    let (kept, dropped) = fresh_groups(
        examples,
        |e| e.episode.spec.group,
        |e| {
            e.episode
                .turns
                .iter()
                .map(|turn| turn.version)
                .collect::<Vec<_>>()
        },
        fresh_version,
        max_staleness,
    );
    let staleness = Staleness {
        histogram,
        stale_turns,
        stale_tokens,
        dropped,
    };
    (kept, staleness)
}

/// The examples of the groups with the largest spread of credited reward (StarPO-S), or all
/// of them.
pub(super) fn filter_groups(examples: Vec<Example>, filter: spec::Filter) -> Vec<Example> {
    let spec::Filter::RewardStd { keep } = filter else {
        return examples;
    };
    let mut groups: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for e in &examples {
        groups
            .entry(e.episode.spec.group)
            .or_default()
            .push(f64::from(e.credit.reward));
    }
    let mut spread: Vec<(usize, f64)> = groups.iter().map(|(g, r)| (*g, std_dev(r))).collect();
    spread.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let count = ((spread.len() as f64 * keep).ceil() as usize).clamp(1, spread.len());
    let kept: Vec<usize> = spread[..count].iter().map(|(g, _)| *g).collect();
    examples
        .into_iter()
        .filter(|e| kept.contains(&e.episode.spec.group))
        .collect()
}

/// Groups with at least one example.
pub(super) fn groups(examples: &[Example]) -> usize {
    examples
        .iter()
        .map(|e| e.episode.spec.group)
        .collect::<BTreeSet<_>>()
        .len()
}

/// Fraction of the groups of two or more episodes whose members all earned the same reward;
/// 0 without such groups.
fn flat_groups(episodes: &[Episode]) -> f64 {
    let mut rewards: BTreeMap<usize, Vec<f32>> = BTreeMap::new();
    for e in episodes {
        rewards.entry(e.spec.group).or_default().push(e.reward());
    }
    let sized: Vec<&Vec<f32>> = rewards.values().filter(|r| r.len() >= 2).collect();
    if sized.is_empty() {
        return 0.0;
    }
    let flat = sized
        .iter()
        .filter(|r| r.iter().all(|x| *x == r[0]))
        .count();
    flat as f64 / sized.len() as f64
}

/// Token advantages: per example, one per agent token, in order; and for PPO the GAE returns,
/// the critic's targets.
pub(super) struct Advantages {
    /// Per example.
    pub advantages: Vec<Vec<f32>>,
    /// PPO: per example, the return of each agent token.
    pub returns: Option<Vec<Vec<f32>>>,
}

/// Per-token advantages of every example's agent tokens, normalized as `algorithm` says; for
/// PPO (`values` are the critic's rollout values of each example's agent tokens) also the GAE
/// returns.
///
/// PPO's advantages are GAE over each episode's agent tokens ([`gae`]) whitened over the
/// batch's agent tokens, as REINFORCE++'s returns are; `advantage_norm = batch` is that
/// whitening (not applied twice), `group` and `per_task` normalize the whitened values
/// further, `none` keeps them whitened. `negative_weight` applies to every algorithm last.
pub(super) fn token_advantages(
    algorithm: &spec::Algorithm,
    examples: &[Example],
    values: Option<&[Vec<f32>]>,
) -> Advantages {
    // Per agent token: its advantage, and the example it belongs to.
    let mut flat = Vec::new();
    let mut owner = Vec::new();
    let mut returns = None;
    match values {
        Some(values) => {
            let mut per_example = Vec::with_capacity(examples.len());
            for (i, (example, values)) in examples.iter().zip(values).enumerate() {
                let credit = &example.credit;
                let rewards = match algorithm.credit {
                    CreditKind::Outcome => terminal_rewards(values.len(), credit.reward),
                    CreditKind::Turn | CreditKind::MonteCarlo { .. } => {
                        turn_end_rewards(&credit.turn_tokens, &credit.turn_rewards)
                    }
                };
                let (advantages, example_returns) =
                    gae(&rewards, values, algorithm.gamma, algorithm.lambda);
                owner.extend(std::iter::repeat_n(i, advantages.len()));
                flat.extend(advantages);
                per_example.push(example_returns);
            }
            returns = Some(per_example);
        }
        None => {
            let trajectories: Vec<Trajectory<'_>> = examples
                .iter()
                .map(|e| Trajectory {
                    group: e.episode.spec.group,
                    reward: e.credit.reward,
                    turn_rewards: &e.credit.turn_rewards,
                    turn_tokens: &e.credit.turn_tokens,
                    turn_values: &e.credit.turn_values,
                })
                .collect();
            let per_example = credited_advantages(
                algorithm.kind,
                algorithm.credit,
                algorithm.gamma,
                &trajectories,
            )
            .unwrap_or_default();
            for (i, advantages) in per_example.into_iter().enumerate() {
                owner.extend(std::iter::repeat_n(i, advantages.len()));
                flat.extend(advantages);
            }
        }
    }
    let whitened = algorithm.kind.whitens();
    if whitened {
        whiten(&mut flat);
    }
    let key = |f: &dyn Fn(&Example) -> usize| -> Vec<usize> {
        owner.iter().map(|&i| f(&examples[i])).collect()
    };
    match algorithm.advantage_norm {
        AdvantageNorm::None => {}
        AdvantageNorm::Group if algorithm.kind == AlgorithmKind::Grpo => {}
        AdvantageNorm::Group => normalize_by_key(&mut flat, &key(&|e| e.episode.spec.group)),
        AdvantageNorm::Batch if whitened => {}
        AdvantageNorm::Batch => {
            let one_key = vec![0; flat.len()];
            normalize_by_key(&mut flat, &one_key);
        }
        AdvantageNorm::PerTask => normalize_by_key(&mut flat, &key(&|e| e.episode.spec.task)),
    }
    weigh_negatives(&mut flat, algorithm.negative_weight);
    let mut advantages: Vec<Vec<f32>> = vec![Vec::new(); examples.len()];
    for (value, i) in flat.into_iter().zip(owner) {
        advantages[i].push(value);
    }
    Advantages {
        advantages,
        returns,
    }
}

/// What preparing one step's batch measured, from the batch as played to its advantages.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct PreparedStats {
    /// The batch as played, before anything was dropped.
    pub played: Played,
    /// `sft_from = successes`: solved episodes held for the SFT term after this step.
    pub successes_kept: Option<usize>,
    /// The staleness bound's statistics, when turns may come from older weights.
    pub staleness: Option<Staleness>,
    /// Groups kept by the filter ([`groups`]).
    pub groups_kept: usize,
    /// The token advantages trained on.
    pub advantages: AdvantageStats,
    /// PPO: how well the rollout values fit the returns (`algo::explained_variance`).
    pub explained_variance: Option<f64>,
}

/// Summary statistics of a batch's token advantages (all 0 without agent tokens).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct AdvantageStats {
    /// Agent tokens trained on.
    pub agent_tokens: usize,
    /// Mean advantage.
    pub mean: f64,
    /// Its standard deviation.
    pub std: f64,
    /// Smallest advantage.
    pub min: f32,
    /// Largest advantage.
    pub max: f32,
}

impl AdvantageStats {
    /// The statistics of `advantages`.
    pub fn of(advantages: &[Vec<f32>]) -> Self {
        let flat: Vec<f64> = advantages.iter().flatten().map(|a| f64::from(*a)).collect();
        if flat.is_empty() {
            return AdvantageStats::default();
        }
        AdvantageStats {
            agent_tokens: flat.len(),
            mean: flat.iter().sum::<f64>() / flat.len() as f64,
            std: std_dev(&flat),
            min: flat.iter().copied().fold(f64::INFINITY, f64::min) as f32,
            max: flat.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32,
        }
    }
}

#[cfg(test)]
mod tests;
