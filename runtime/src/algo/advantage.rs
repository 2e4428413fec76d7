//! Outcome advantages per trajectory, and token-level normalization.

use agentry_dsl::spec::{AlgorithmKind, Credit};

/// Added to the standard deviation in group and task normalization (verl, AgentRL).
pub const STD_EPS: f64 = 1e-6;
/// Added to the variance inside the square root when whitening (verl's `masked_whiten`).
pub const WHITEN_EPS: f64 = 1e-8;

/// What an outcome estimator makes of a trajectory's return `x`: `(x - shift) / scale`.
///
/// The baseline and scale come from the group's (or the batch's) episode returns, so the same
/// pair applies to any return of that trajectory: its total (outcome credit) or the return
/// from one of its turns on (turn credit).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Baseline {
    /// Subtracted from the return.
    pub shift: f64,
    /// The difference is divided by it.
    pub scale: f64,
}

impl Baseline {
    /// The advantage of return `x`.
    pub fn apply(self, x: f32) -> f32 {
        ((f64::from(x) - self.shift) / self.scale) as f32
    }
}

/// The baseline of each trajectory from the episode returns of its group.
///
/// `groups[i]` names the group (same prompt) of trajectory `i`. GRPO: shift `mean_g`, scale
/// `std_g + 1e-6` with an unbiased std. Dr. GRPO and REINFORCE++-baseline: shift `mean_g`,
/// scale 1 (the latter is whitened over the batch afterwards). RLOO: shift the mean of the
/// other members. REINFORCE++: shift 0, scale 1 (whitening over the batch's tokens happens in
/// [`whiten`]). PPO needs a critic and is not an outcome estimator, so it returns `None`.
///
/// **A group of one** (`group_size = 1`, or a group the variance filter or a fault left with
/// one member) has no one to compare with. Every group-baseline estimator then follows verl's
/// rule: mean 0 and, for GRPO, std 1, so the episode's advantage is its own return (GRPO:
/// divided by `1 + 1e-6`). RLOO's leave-one-out mean over no one is 0 as well, as in verl.
/// Subtracting the episode's own return instead would give it advantage 0 and, for
/// REINFORCE++-baseline, shift the batch whitening of every other token.
pub fn outcome_baselines(
    kind: AlgorithmKind,
    returns: &[f32],
    groups: &[usize],
) -> Option<Vec<Baseline>> {
    let members = |g: usize| -> Vec<f64> {
        returns
            .iter()
            .zip(groups)
            .filter(|(_, gi)| **gi == g)
            .map(|(r, _)| f64::from(*r))
            .collect()
    };
    let mean = |m: &[f64]| m.iter().sum::<f64>() / m.len() as f64;
    let baseline = |r: f32, g: usize| -> Baseline {
        let m = members(g);
        match kind {
            AlgorithmKind::Grpo if m.len() == 1 => Baseline {
                shift: 0.0,
                scale: 1.0 + STD_EPS,
            },
            AlgorithmKind::DrGrpo | AlgorithmKind::ReinforcePpBaseline | AlgorithmKind::Rloo
                if m.len() == 1 =>
            {
                Baseline {
                    shift: 0.0,
                    scale: 1.0,
                }
            }
            AlgorithmKind::Grpo => {
                let (mean, std) = mean_std(&m);
                Baseline {
                    shift: mean,
                    scale: std + STD_EPS,
                }
            }
            AlgorithmKind::DrGrpo | AlgorithmKind::ReinforcePpBaseline => Baseline {
                shift: mean(&m),
                scale: 1.0,
            },
            AlgorithmKind::Rloo => Baseline {
                shift: (m.iter().sum::<f64>() - f64::from(r)) / (m.len() as f64 - 1.0),
                scale: 1.0,
            },
            AlgorithmKind::ReinforcePp | AlgorithmKind::Ppo => Baseline {
                shift: 0.0,
                scale: 1.0,
            },
        }
    };
    (kind != AlgorithmKind::Ppo).then(|| {
        returns
            .iter()
            .zip(groups)
            .map(|(r, g)| baseline(*r, *g))
            .collect()
    })
}

/// The advantage of each trajectory from its scalar reward: [`outcome_baselines`] applied to
/// the rewards themselves.
pub fn outcome_advantages(
    kind: AlgorithmKind,
    rewards: &[f32],
    groups: &[usize],
) -> Option<Vec<f32>> {
    let baselines = outcome_baselines(kind, rewards, groups)?;
    Some(
        rewards
            .iter()
            .zip(baselines)
            .map(|(r, b)| b.apply(*r))
            .collect(),
    )
}

/// The discounted return from each turn on: `G_k = r_k + γ G_{k+1}`, `G` after the last turn 0.
pub fn returns_to_go(rewards: &[f32], gamma: f64) -> Vec<f32> {
    let mut out = vec![0.0; rewards.len()];
    let mut next = 0.0f64;
    for (k, r) in rewards.iter().enumerate().rev() {
        next = f64::from(*r) + gamma * next;
        out[k] = next as f32;
    }
    out
}

/// What the outcome estimators need of one trajectory.
#[derive(Clone, Copy, Debug)]
pub struct Trajectory<'a> {
    /// Its group (same prompt).
    pub group: usize,
    /// Its total reward.
    pub reward: f32,
    /// The reward of each agent turn.
    pub turn_rewards: &'a [f32],
    /// The agent tokens of each turn.
    pub turn_tokens: &'a [usize],
    /// Monte-Carlo credit: the estimated value of the state each turn started from (0 where
    /// none was estimated); empty otherwise.
    pub turn_values: &'a [f32],
}

/// The advantage of every agent token of every trajectory, in order, before normalization.
///
/// Outcome credit gives each token its trajectory's outcome advantage. Turn credit gives the
/// tokens of turn `k` the estimator's advantage of `G_k`, the discounted return from turn `k`
/// on ([`returns_to_go`]), against the baseline of the trajectory's whole return `G_0`
/// ([`outcome_baselines`]): a turn is credited with what it and later turns earned, not with
/// rewards that came before it. With rewards only on the last turn and `gamma = 1`, `G_k` is
/// the outcome for every `k`, so both credits agree. Monte-Carlo credit is turn credit with the
/// estimated value of each turn's starting state subtracted, `G_k - V(s_k)`. `None` for PPO
/// (it needs a critic).
pub fn credited_advantages(
    kind: AlgorithmKind,
    credit: Credit,
    gamma: f64,
    trajectories: &[Trajectory<'_>],
) -> Option<Vec<Vec<f32>>> {
    // Per trajectory, the return of each credited span of tokens, and the span's length.
    let spans: Vec<Vec<(f32, usize)>> = trajectories
        .iter()
        .map(|t| match credit {
            Credit::Outcome => vec![(t.reward, t.turn_tokens.iter().sum())],
            Credit::Turn | Credit::MonteCarlo { .. } => returns_to_go(t.turn_rewards, gamma)
                .into_iter()
                .enumerate()
                .map(|(k, g)| g - t.turn_values.get(k).copied().unwrap_or(0.0))
                .zip(t.turn_tokens.iter().copied())
                .collect(),
        })
        .collect();
    let totals: Vec<f32> = trajectories
        .iter()
        .zip(&spans)
        .map(|(t, spans)| match credit {
            Credit::Outcome => t.reward,
            Credit::Turn | Credit::MonteCarlo { .. } => spans.first().map_or(0.0, |(g, _)| *g),
        })
        .collect();
    let groups: Vec<usize> = trajectories.iter().map(|t| t.group).collect();
    let baselines = outcome_baselines(kind, &totals, &groups)?;
    Some(
        spans
            .iter()
            .zip(baselines)
            .map(|(spans, baseline)| {
                spans
                    .iter()
                    .flat_map(|&(ret, n)| std::iter::repeat_n(baseline.apply(ret), n))
                    .collect()
            })
            .collect(),
    )
}

/// Normalizes token advantages to zero mean and unit variance within each key:
/// `(a - mean_k) / (std_k + 1e-6)`, std unbiased. With the task index as key this is AgentRL's
/// task advantage normalization; with one key for all tokens it is batch normalization.
/// A key with a single token is treated as verl treats a group of one: mean 0 and std 1, so
/// the token keeps its advantage (divided by `1 + 1e-6`) rather than being centred on itself
/// to 0, which would silently drop the only token of a task from the update.
pub fn normalize_by_key(values: &mut [f32], keys: &[usize]) {
    let mut distinct: Vec<usize> = keys.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    for key in distinct {
        let members: Vec<f64> = values
            .iter()
            .zip(keys)
            .filter(|(_, k)| **k == key)
            .map(|(v, _)| f64::from(*v))
            .collect();
        let (mean, std) = if members.len() == 1 {
            (0.0, 1.0)
        } else {
            mean_std(&members)
        };
        for (v, k) in values.iter_mut().zip(keys) {
            if *k == key {
                *v = ((f64::from(*v) - mean) / (std + STD_EPS)) as f32;
            }
        }
    }
}

/// Scales the negative advantages by `weight` (the `negative_weight` key), leaving the
/// positive ones as they are.
///
/// Pushing a sampled token down moves its embedding too; when the policy's head is tied to the
/// embedding, a wrongly copied name is pushed down in the very direction that copies it right
/// in other questions. A weight below 1 keeps more of the update for better-than-baseline
/// samples; 0 reinforces only those (rejection-sampling fine-tuning weighted by advantage).
pub fn weigh_negatives(values: &mut [f32], weight: f64) {
    if weight == 1.0 {
        return;
    }
    for v in values.iter_mut().filter(|v| **v < 0.0) {
        *v = (f64::from(*v) * weight) as f32;
    }
}

/// Whitens token values over the whole batch: `(a - mean) / sqrt(var + 1e-8)`, var unbiased
/// (verl's `masked_whiten`, used by REINFORCE++ and GAE).
pub fn whiten(values: &mut [f32]) {
    if values.len() < 2 {
        return;
    }
    let all: Vec<f64> = values.iter().map(|v| f64::from(*v)).collect();
    let (mean, std) = mean_std(&all);
    let scale = 1.0 / (std * std + WHITEN_EPS).sqrt();
    for v in values.iter_mut() {
        *v = ((f64::from(*v) - mean) * scale) as f32;
    }
}

/// Unbiased standard deviation; 0 for fewer than two values.
pub fn std_dev(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    mean_std(values).1
}

/// Mean and unbiased standard deviation of at least two values.
fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-4, "{a:?} != {b:?}");
        }
    }

    #[test]
    fn grpo_uses_group_mean_and_unbiased_std() {
        // Group 0: rewards 1, 0, 0, 1 -> mean 0.5, unbiased std sqrt(1/3) = 0.57735.
        let a =
            outcome_advantages(AlgorithmKind::Grpo, &[1.0, 0.0, 0.0, 1.0], &[0, 0, 0, 0]).unwrap();
        let z = 0.5 / (0.577_350_3 + 1e-6);
        close(&a, &[z as f32, -z as f32, -z as f32, z as f32]);
    }

    #[test]
    fn grpo_singleton_group_has_mean_zero_std_one() {
        let a = outcome_advantages(AlgorithmKind::Grpo, &[0.7, 1.0, 0.0], &[0, 1, 1]).unwrap();
        let z = 0.5 / (std::f32::consts::FRAC_1_SQRT_2 + 1e-6);
        close(&a, &[0.7 / (1.0 + 1e-6), z, -z]);
    }

    #[test]
    fn a_group_of_one_inside_a_batch_keeps_its_return_for_every_group_baseline() {
        // Group 0 is the singleton (0.7); group 1 holds 1.0 and 0.0 (mean 0.5). verl's rule: a
        // group of one has mean 0 (std 1), whichever estimator, so its advantage is its return.
        let (rewards, groups) = ([1.0, 0.7, 0.0], [1, 0, 1]);
        let grpo_z = 0.5 / (std::f32::consts::FRAC_1_SQRT_2 + 1e-6);
        let expected = [
            (AlgorithmKind::Grpo, [grpo_z, 0.7 / (1.0 + 1e-6), -grpo_z]),
            (AlgorithmKind::DrGrpo, [0.5, 0.7, -0.5]),
            (AlgorithmKind::ReinforcePpBaseline, [0.5, 0.7, -0.5]),
            (AlgorithmKind::Rloo, [1.0, 0.7, -1.0]),
            (AlgorithmKind::ReinforcePp, [1.0, 0.7, 0.0]),
        ];
        for (kind, want) in expected {
            let a = outcome_advantages(kind, &rewards, &groups).unwrap();
            close(&a, &want);
        }
        // REINFORCE++-baseline whitens the batch afterwards: the singleton's value must not be
        // 0 (its own return subtracted), which would move the mean every other token is
        // whitened against.
        let mut tokens =
            outcome_advantages(AlgorithmKind::ReinforcePpBaseline, &rewards, &groups).unwrap();
        whiten(&mut tokens);
        let all = [0.5f64, 0.7, -0.5];
        let mean = all.iter().sum::<f64>() / 3.0;
        let var = all.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 2.0;
        let want: Vec<f32> = all
            .iter()
            .map(|v| ((v - mean) / (var + WHITEN_EPS).sqrt()) as f32)
            .collect();
        close(&tokens, &want);
    }

    #[test]
    fn a_key_with_a_single_token_keeps_its_advantage() {
        // Task 1 has one agent token in the batch: mean 0, std 1 (the group-of-one rule), not
        // centred on itself to 0.
        let mut v = [1.0, 3.0, -0.8];
        normalize_by_key(&mut v, &[0, 0, 1]);
        let s = 1.0 / (2f64.sqrt() + 1e-6);
        close(&v, &[-s as f32, s as f32, (-0.8 / (1.0 + 1e-6)) as f32]);
    }

    #[test]
    fn negative_weight_scales_only_negative_advantages() {
        // Group rewards 1, 0, 0, 0: mean 0.25, unbiased std 0.5.
        let mut a =
            outcome_advantages(AlgorithmKind::Grpo, &[1.0, 0.0, 0.0, 0.0], &[0, 0, 0, 0]).unwrap();
        let (up, down) = (0.75 / (0.5 + 1e-6), -0.25 / (0.5 + 1e-6));
        weigh_negatives(&mut a, 1.0);
        close(&a, &[up as f32, down as f32, down as f32, down as f32]);
        weigh_negatives(&mut a, 0.25);
        let down = down * 0.25;
        close(&a, &[up as f32, down as f32, down as f32, down as f32]);
        weigh_negatives(&mut a, 0.0);
        close(&a, &[up as f32, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn grpo_group_of_equal_rewards_gives_zero() {
        let a = outcome_advantages(AlgorithmKind::Grpo, &[1.0, 1.0], &[0, 0]).unwrap();
        close(&a, &[0.0, 0.0]);
    }

    #[test]
    fn dr_grpo_and_reinforce_pp_baseline_subtract_the_group_mean_only() {
        // Group 0: 1, 0, 0, 0 (mean 0.25); group 1: 2, 4 (mean 3).
        for kind in [AlgorithmKind::DrGrpo, AlgorithmKind::ReinforcePpBaseline] {
            let a = outcome_advantages(kind, &[1.0, 0.0, 0.0, 0.0, 2.0, 4.0], &[0, 0, 0, 0, 1, 1])
                .unwrap();
            close(&a, &[0.75, -0.25, -0.25, -0.25, -1.0, 1.0]);
        }
    }

    #[test]
    fn turn_credit_gives_each_turn_its_return_from_there_on() {
        // One GRPO group of two: episode 0 earns 0.5 on turn 1 and 1.0 on turn 3 (tokens 2, 1,
        // 2); episode 1 earns nothing (tokens 3). γ = 0.5: G = 0.5 + 0.25·1 = 0.75, 0.5, 1.0.
        let trajectories = [
            Trajectory {
                group: 0,
                reward: 1.5,
                turn_rewards: &[0.5, 0.0, 1.0],
                turn_tokens: &[2, 1, 2],
                turn_values: &[],
            },
            Trajectory {
                group: 0,
                reward: 0.0,
                turn_rewards: &[0.0],
                turn_tokens: &[3],
                turn_values: &[],
            },
        ];
        let a = credited_advantages(AlgorithmKind::Grpo, Credit::Turn, 0.5, &trajectories).unwrap();
        // Baseline from G_0 = 0.75 and 0: mean 0.375, std 0.53033.
        let z = |g: f64| ((g - 0.375) / (0.530_330_1 + 1e-6)) as f32;
        close(&a[0], &[z(0.75), z(0.75), z(0.5), z(1.0), z(1.0)]);
        close(&a[1], &[z(0.0); 3]);
        // Outcome credit: every token the episode's advantage from its total reward.
        let a =
            credited_advantages(AlgorithmKind::Rloo, Credit::Outcome, 0.5, &trajectories).unwrap();
        close(&a[0], &[1.5; 5]);
        close(&a[1], &[-1.5; 3]);
        assert!(
            credited_advantages(AlgorithmKind::Ppo, Credit::Turn, 1.0, &trajectories).is_none()
        );
        // Monte-Carlo credit: the value of each turn's starting state is subtracted (turn 1's
        // start was not estimated). REINFORCE++ keeps the returns as they are (whitening
        // comes later).
        let mc = Credit::MonteCarlo {
            k: 4,
            first: 1,
            last: None,
        };
        let valued = [Trajectory {
            turn_values: &[0.0, 0.25, 0.5],
            ..trajectories[0]
        }];
        let a = credited_advantages(AlgorithmKind::ReinforcePp, mc, 0.5, &valued).unwrap();
        close(&a[0], &[0.75, 0.75, 0.25, 0.5, 0.5]);
    }

    #[test]
    fn returns_to_go_discount_later_rewards() {
        close(
            &returns_to_go(&[0.0, 1.0, 0.0, 2.0], 0.5),
            &[0.75, 1.5, 1.0, 2.0],
        );
        close(&returns_to_go(&[0.5, 0.5], 1.0), &[1.0, 0.5]);
        assert!(returns_to_go(&[], 0.9).is_empty());
    }

    #[test]
    fn baselines_apply_to_any_return_of_the_trajectory() {
        // GRPO group 1, 0: mean 0.5, std sqrt(0.5); a turn return of 0.25 of the first member.
        let b = outcome_baselines(AlgorithmKind::Grpo, &[1.0, 0.0], &[0, 0]).unwrap();
        let z = (0.25 - 0.5) / (0.5f64.sqrt() + 1e-6);
        close(&[b[0].apply(0.25)], &[z as f32]);
        // RLOO: each member's shift is the mean of the others.
        let b = outcome_baselines(AlgorithmKind::Rloo, &[1.0, 0.0, 0.5], &[0, 0, 0]).unwrap();
        assert_eq!(
            b.iter().map(|b| b.shift).collect::<Vec<_>>(),
            [0.25, 0.75, 0.5]
        );
    }

    #[test]
    fn rloo_subtracts_the_mean_of_the_others() {
        let a = outcome_advantages(AlgorithmKind::Rloo, &[1.0, 0.0, 0.5], &[0, 0, 0]).unwrap();
        close(&a, &[0.75, -0.75, 0.0]);
    }

    #[test]
    fn per_key_normalization_gives_zero_mean_unit_std_per_key() {
        let mut v = [1.0, 2.0, 3.0, 10.0, 30.0];
        normalize_by_key(&mut v, &[0, 0, 0, 1, 1]);
        // Key 0: mean 2, std 1. Key 1: mean 20, std sqrt(200) = 14.142.
        let s = 10.0 / (200f64.sqrt() + 1e-6);
        close(&v, &[-1.0, 0.0, 1.0, -s as f32, s as f32]);
    }

    #[test]
    fn whitening_matches_verl() {
        let mut v = [0.0, 1.0, 2.0];
        whiten(&mut v);
        // mean 1, unbiased var 1.
        let s = 1.0 / (1.0f64 + 1e-8).sqrt();
        close(&v, &[-s as f32, 0.0, s as f32]);
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        /// Rewards with their group ids: up to 6 groups of 2 to 6 members. Rewards are
        /// multiples of 1/8 in [-5, 5] (partial credit), so shifted sums stay exact in f32.
        fn grouped_rewards() -> impl Strategy<Value = (Vec<f32>, Vec<usize>)> {
            let reward = (-40i32..=40).prop_map(|k| k as f32 / 8.0);
            prop::collection::vec(prop::collection::vec(reward, 2..=6), 1..=6).prop_map(|groups| {
                let groups_of = groups
                    .iter()
                    .enumerate()
                    .flat_map(|(g, m)| std::iter::repeat_n(g, m.len()))
                    .collect();
                (groups.concat(), groups_of)
            })
        }

        /// Trajectories of up to 5 groups of 2 to 4, each of 1 to 4 turns of 0 to 5 tokens,
        /// with one reward (a multiple of 1/8) on the last turn.
        fn terminal_trajectories() -> impl Strategy<Value = Vec<(usize, f32, Vec<usize>)>> {
            let trajectory = (
                (-16i32..=16).prop_map(|k| k as f32 / 8.0),
                prop::collection::vec(0usize..=5, 1..=4),
            );
            prop::collection::vec(prop::collection::vec(trajectory, 2..=4), 1..=5).prop_map(
                |groups| {
                    groups
                        .into_iter()
                        .enumerate()
                        .flat_map(|(g, members)| {
                            members.into_iter().map(move |(r, tokens)| (g, r, tokens))
                        })
                        .collect()
                },
            )
        }

        proptest! {
            /// Turn credit reduces to outcome credit when the only reward is the last turn's
            /// and nothing is discounted.
            #[test]
            fn turn_credit_of_terminal_rewards_is_outcome_credit(
                trajectories in terminal_trajectories()
            ) {
                let rewards: Vec<Vec<f32>> = trajectories
                    .iter()
                    .map(|(_, r, tokens)| {
                        let mut turns = vec![0.0; tokens.len()];
                        turns[tokens.len() - 1] = *r;
                        turns
                    })
                    .collect();
                let view: Vec<Trajectory<'_>> = trajectories
                    .iter()
                    .zip(&rewards)
                    .map(|((g, r, tokens), turns)| Trajectory {
                        group: *g,
                        reward: *r,
                        turn_rewards: turns,
                        turn_tokens: tokens,
                        turn_values: &[],
                    })
                    .collect();
                for kind in [
                    AlgorithmKind::Grpo,
                    AlgorithmKind::DrGrpo,
                    AlgorithmKind::Rloo,
                    AlgorithmKind::ReinforcePp,
                    AlgorithmKind::ReinforcePpBaseline,
                ] {
                    let turn = credited_advantages(kind, Credit::Turn, 1.0, &view).unwrap();
                    let outcome = credited_advantages(kind, Credit::Outcome, 1.0, &view).unwrap();
                    prop_assert_eq!(turn, outcome);
                }
            }

            /// AgentRL's task advantage normalization: every task with at least two tokens of
            /// distinct values ends at mean 0 and unbiased standard deviation 1.
            #[test]
            fn per_task_normalization_gives_zero_mean_and_unit_std_per_task(
                tokens in prop::collection::vec((-50.0f32..50.0, 0usize..4), 2..200)
            ) {
                let (mut values, tasks): (Vec<f32>, Vec<usize>) = tokens.into_iter().unzip();
                let spread: Vec<bool> = (0..4)
                    .map(|t| {
                        let v: Vec<f64> = values.iter().zip(&tasks)
                            .filter(|(_, k)| **k == t).map(|(v, _)| f64::from(*v)).collect();
                        std_dev(&v) > 1e-2
                    })
                    .collect();
                normalize_by_key(&mut values, &tasks);
                for task in (0..4).filter(|t| spread[*t]) {
                    let v: Vec<f64> = values.iter().zip(&tasks)
                        .filter(|(_, k)| **k == task).map(|(v, _)| f64::from(*v)).collect();
                    let mean = v.iter().sum::<f64>() / v.len() as f64;
                    prop_assert!(mean.abs() < 1e-4, "task {task}: mean {mean}");
                    prop_assert!((std_dev(&v) - 1.0).abs() < 1e-3, "task {task}: std {}", std_dev(&v));
                }
            }

            /// The group-relative estimators see only differences within a group: adding a
            /// constant to every reward changes no advantage.
            #[test]
            fn group_relative_estimators_ignore_a_constant_reward_shift(
                (rewards, groups) in grouped_rewards(), shift in (-80i32..=80).prop_map(|k| k as f32 / 8.0)
            ) {
                let shifted: Vec<f32> = rewards.iter().map(|r| r + shift).collect();
                for kind in [
                    AlgorithmKind::Grpo,
                    AlgorithmKind::DrGrpo,
                    AlgorithmKind::Rloo,
                    AlgorithmKind::ReinforcePpBaseline,
                ] {
                    let a = outcome_advantages(kind, &rewards, &groups).unwrap();
                    let b = outcome_advantages(kind, &shifted, &groups).unwrap();
                    for (x, y) in a.iter().zip(&b) {
                        prop_assert!((x - y).abs() < 1e-5, "{}: {x} vs {y}", kind.name());
                    }
                }
            }

            /// GRPO's advantages within each group of distinct rewards have mean 0 and
            /// unbiased std 1 (up to the 1e-6 guard).
            #[test]
            fn grpo_advantages_are_standardized_within_each_group(
                (rewards, groups) in grouped_rewards()
            ) {
                let a = outcome_advantages(AlgorithmKind::Grpo, &rewards, &groups).unwrap();
                for g in 0..=*groups.iter().max().unwrap() {
                    let r: Vec<f64> = rewards.iter().zip(&groups)
                        .filter(|(_, k)| **k == g).map(|(v, _)| f64::from(*v)).collect();
                    if std_dev(&r) < 1e-2 {
                        continue;
                    }
                    let v: Vec<f64> = a.iter().zip(&groups)
                        .filter(|(_, k)| **k == g).map(|(v, _)| f64::from(*v)).collect();
                    let mean = v.iter().sum::<f64>() / v.len() as f64;
                    prop_assert!(mean.abs() < 1e-4);
                    prop_assert!((std_dev(&v) - 1.0).abs() < 1e-3);
                }
            }
        }
    }

    #[test]
    fn ppo_is_not_an_outcome_estimator() {
        assert!(outcome_advantages(AlgorithmKind::Ppo, &[1.0], &[0]).is_none());
    }
}
