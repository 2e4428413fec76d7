//! Generalized advantage estimation over an episode's agent tokens (PPO's critic).
//!
//! verl's token-level convention: the agent tokens of one episode, in order, are the time
//! steps; the reward is 0 on every token but the last, which carries the episode's reward;
//! the value after the last token is 0 (the episode ended). Tool results and prompt tokens are
//! not time steps (they are the environment's), so a multi-turn episode is one sequence of its
//! agent tokens across turns.

/// Token rewards of an episode of `tokens` agent tokens: 0 everywhere but `reward` on the last.
pub fn terminal_rewards(tokens: usize, reward: f32) -> Vec<f32> {
    let mut rewards = vec![0.0; tokens];
    if let Some(last) = rewards.last_mut() {
        *last = reward;
    }
    rewards
}

/// Token rewards of an episode whose turns had `turn_tokens` agent tokens and earned
/// `turn_rewards`: each turn's reward on its last token (a turn without tokens passes its
/// reward to the last token before it; with none before, there is nothing to credit).
pub fn turn_end_rewards(turn_tokens: &[usize], turn_rewards: &[f32]) -> Vec<f32> {
    let mut rewards = vec![0.0; turn_tokens.iter().sum()];
    let mut end = 0;
    for (tokens, reward) in turn_tokens.iter().zip(turn_rewards) {
        end += tokens;
        if let Some(last) = end.checked_sub(1).and_then(|i| rewards.get_mut(i)) {
            *last += reward;
        }
    }
    rewards
}

/// GAE advantages and returns of one episode's tokens.
///
/// `δ_t = r_t + γ V_{t+1} - V_t` (with `V_T = 0`), `A_t = Σ_k (γλ)^k δ_{t+k}` computed
/// backwards as `A_t = δ_t + γλ A_{t+1}`, and the return (the critic's target) `R_t = A_t +
/// V_t`. λ = 1 gives Monte-Carlo advantages `Σ γ^k r_{t+k} - V_t`; λ = 0 the one-step TD error.
/// Accumulates in f64. `rewards` and `values` have one entry per token (extra entries of the
/// longer one are ignored).
pub fn gae(rewards: &[f32], values: &[f32], gamma: f64, lambda: f64) -> (Vec<f32>, Vec<f32>) {
    let n = rewards.len().min(values.len());
    let mut advantages = vec![0.0; n];
    let mut returns = vec![0.0; n];
    let mut next_value = 0.0;
    let mut next_advantage = 0.0;
    for t in (0..n).rev() {
        let value = f64::from(values[t]);
        let delta = f64::from(rewards[t]) + gamma * next_value - value;
        let advantage = delta + gamma * lambda * next_advantage;
        advantages[t] = advantage as f32;
        returns[t] = (advantage + value) as f32;
        next_value = value;
        next_advantage = advantage;
    }
    (advantages, returns)
}

/// `1 - Var(returns - values) / Var(returns)`, over paired entries: the fraction of the
/// returns' variance the critic's values explain (1 is perfect, 0 no better than a constant,
/// negative worse). `1e-8` is added to the denominator (verl), so constant returns give a
/// finite number; empty input gives 0.
pub fn explained_variance(returns: &[f32], values: &[f32]) -> f64 {
    let n = returns.len().min(values.len());
    if n == 0 {
        return 0.0;
    }
    let variance = |xs: &mut dyn Iterator<Item = f64>| {
        let xs: Vec<f64> = xs.collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64
    };
    let var_returns = variance(&mut returns[..n].iter().map(|r| f64::from(*r)));
    let var_residual = variance(
        &mut returns[..n]
            .iter()
            .zip(&values[..n])
            .map(|(r, v)| f64::from(*r) - f64::from(*v)),
    );
    1.0 - var_residual / (var_returns + 1e-8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f64]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((f64::from(*x) - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn turn_end_rewards_sit_on_each_turns_last_token() {
        assert_eq!(
            turn_end_rewards(&[2, 0, 3], &[0.5, 0.25, 1.0]),
            [0.0, 0.75, 0.0, 0.0, 1.0]
        );
        assert_eq!(turn_end_rewards(&[0, 1], &[2.0, 1.0]), [1.0]);
        assert!(turn_end_rewards(&[], &[]).is_empty());
    }

    #[test]
    fn terminal_rewards_sit_on_the_last_token() {
        assert_eq!(terminal_rewards(3, 2.0), [0.0, 0.0, 2.0]);
        assert_eq!(terminal_rewards(1, -1.0), [-1.0]);
        assert!(terminal_rewards(0, 1.0).is_empty());
    }

    #[test]
    fn hand_computed_gamma_1_lambda_0_95() {
        // V = [0.5, 0.2, 0.1], r = [0, 0, 1].
        // δ = [0 + 0.2 - 0.5, 0 + 0.1 - 0.2, 1 + 0 - 0.1] = [-0.3, -0.1, 0.9]
        // A2 = 0.9; A1 = -0.1 + 0.95·0.9 = 0.755; A0 = -0.3 + 0.95·0.755 = 0.41725
        let (a, r) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.2, 0.1], 1.0, 0.95);
        close(&a, &[0.41725, 0.755, 0.9]);
        close(&r, &[0.91725, 0.955, 1.0]);
    }

    #[test]
    fn hand_computed_gamma_0_9_lambda_0_5() {
        // δ0 = 0 + 0.9·0.2 - 0.5 = -0.32; δ1 = 0 + 0.9·0.1 - 0.2 = -0.11; δ2 = 1 - 0.1 = 0.9
        // A2 = 0.9; A1 = -0.11 + 0.45·0.9 = 0.295; A0 = -0.32 + 0.45·0.295 = -0.18725
        let (a, r) = gae(&[0.0, 0.0, 1.0], &[0.5, 0.2, 0.1], 0.9, 0.5);
        close(&a, &[-0.18725, 0.295, 0.9]);
        close(&r, &[0.31275, 0.495, 1.0]);
    }

    #[test]
    fn lambda_0_is_the_one_step_td_error() {
        let values = [0.5, 0.2, 0.1];
        let (a, r) = gae(&[0.0, 0.0, 1.0], &values, 0.9, 0.0);
        close(&a, &[-0.32, -0.11, 0.9]);
        // The return is the one-step target r + γ V_{t+1}.
        close(&r, &[0.18, 0.09, 1.0]);
    }

    #[test]
    fn lambda_1_is_the_monte_carlo_return_minus_the_value() {
        // Returns Σ γ^k r_{t+k} with r = [0, 0, 1], γ = 0.9: [0.81, 0.9, 1].
        let values = [0.5, 0.2, 0.1];
        let (a, r) = gae(&[0.0, 0.0, 1.0], &values, 0.9, 1.0);
        close(&a, &[0.31, 0.7, 0.9]);
        close(&r, &[0.81, 0.9, 1.0]);
        // With γ = 1 every token's return is the episode's reward.
        let (a, r) = gae(&terminal_rewards(4, -2.0), &[1.0, 0.0, -1.0, 0.5], 1.0, 1.0);
        close(&a, &[-3.0, -2.0, -1.0, -2.5]);
        close(&r, &[-2.0; 4]);
    }

    #[test]
    fn rewards_on_several_tokens_and_a_perfect_critic() {
        // A critic that predicts the discounted return exactly has zero advantages.
        let (gamma, lambda) = (0.5, 0.7);
        let rewards = [1.0, 0.0, 2.0];
        let values = [1.5, 1.0, 2.0];
        let (a, r) = gae(&rewards, &values, gamma, lambda);
        close(&a, &[0.0, 0.0, 0.0]);
        close(&r, &[1.5, 1.0, 2.0]);
    }

    #[test]
    fn empty_and_single_token_episodes() {
        let (a, r) = gae(&[], &[], 1.0, 0.95);
        assert!(a.is_empty() && r.is_empty());
        let (a, r) = gae(&[1.0], &[0.25], 0.9, 0.95);
        close(&a, &[0.75]);
        close(&r, &[1.0]);
    }

    #[test]
    fn explained_variance_of_perfect_constant_and_bad_critics() {
        let returns = [1.0, 2.0, 3.0, 4.0];
        assert!((explained_variance(&returns, &returns) - 1.0).abs() < 1e-6);
        // A constant value explains nothing: Var(R - c) = Var(R).
        assert!(explained_variance(&returns, &[7.0; 4]).abs() < 1e-6);
        // Var(R) = 1.25, residual [1, 2, 3, 4] - [2, 2, 2, 2] has the same variance, while
        // values anti-correlated double the residual's spread: Var = 5.
        let worse = explained_variance(&returns, &[4.0, 3.0, 2.0, 1.0]);
        assert!((worse - (1.0 - 5.0 / 1.25)).abs() < 1e-6, "{worse}");
        assert!(explained_variance(&[1.0; 3], &[0.0; 3]).is_finite());
        assert_eq!(explained_variance(&[], &[]), 0.0);
    }
}
