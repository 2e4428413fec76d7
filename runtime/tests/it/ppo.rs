//! PPO's critic: values are read where the log-probabilities are, and a few updates on the
//! clipped value loss fit a fixed batch (the shared trunk with the policy loss beside it, and
//! a separate critic on its own).

use crate::common::serial;
use agentry_runtime::algo::loss::{PolicyLossConfig, scalar};
use agentry_runtime::algo::{PolicyLossInput, policy_loss, value_loss};
use agentry_runtime::model::{Policy, PolicyConfig, Want};
use agentry_runtime::spec::{Aggregation, Clip};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

type AD = Autodiff<Flex>;

fn config() -> PolicyConfig {
    PolicyConfig {
        vocab: 32,
        layers: 1,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        context: 32,
        tie_embeddings: true,
    }
}

/// Four rows of ten tokens; the last five predicted tokens of each row are the agent's.
fn batch<B: Backend>(device: &B::Device) -> (Tensor<B, 2, Int>, Vec<bool>, Tensor<B, 2>) {
    let tokens: Vec<i64> = (0..40).map(|i| (i * 7 + 3) % 32).collect();
    let scored: Vec<bool> = (0..4).flat_map(|_| (0..9).map(|j| j >= 4)).collect();
    let mask: Vec<f32> = scored.iter().map(|&s| f32::from(u8::from(s))).collect();
    (
        Tensor::from_data(TensorData::new(tokens, [4, 10]), device),
        scored,
        Tensor::from_data(TensorData::new(mask, [4, 9]), device),
    )
}

/// Returns that differ by row and token, so a constant cannot fit them.
fn returns<B: Backend>(device: &B::Device) -> Tensor<B, 2> {
    let r: Vec<f32> = (0..36)
        .map(|i| if (i / 9 + i % 9) % 3 == 0 { 1.0 } else { -0.5 })
        .collect();
    Tensor::from_data(TensorData::new(r, [4, 9]), device)
}

#[test]
fn values_are_read_at_the_scored_positions_and_start_at_zero() {
    let _guard = serial();
    let device = Default::default();
    <Flex as Backend>::seed(&device, 3);
    let policy: Policy<Flex> = config().init(&device).with_value_head();
    let (tokens, scored, mask) = batch::<Flex>(&device);
    let both = policy.score(tokens.clone(), &scored, 1.0, Want::Both);
    let values = both.values.expect("a value head");
    assert_eq!(values.dims(), [4, 9]);
    // Zero-initialized head: every value is 0 before training.
    assert_eq!(scalar(values.abs().sum()), 0.0);
    // The log-probabilities are those of `scored_logprobs`, from the same pass.
    let (lp, entropy) = policy.scored_logprobs_and_entropy(tokens.clone(), &scored, 1.0);
    let diff = scalar((both.logprobs - lp.clone()).abs().sum());
    assert_eq!(diff, 0.0);
    assert_eq!(scalar((both.entropy - entropy).abs().sum()), 0.0);
    // Log-probabilities alone: the same, and no entropy computed.
    let alone = policy.score(tokens.clone(), &scored, 1.0, Want::LogProbs);
    assert_eq!(scalar((alone.logprobs - lp).abs().sum()), 0.0);
    assert_eq!(scalar(alone.entropy.abs().sum()), 0.0);
    // Values only: no LM head work, and no values without a head.
    let only = policy.score(tokens.clone(), &scored, 1.0, Want::Values);
    assert_eq!(scalar(only.logprobs.abs().sum()), 0.0);
    assert!(only.values.is_some());
    let plain: Policy<Flex> = config().init(&device);
    assert!(
        plain
            .score(tokens, &scored, 1.0, Want::Both)
            .values
            .is_none()
    );
    drop(mask);
}

/// The value loss on the fixed batch before and after `updates` AdamW steps, with the
/// policy loss added (shared trunk, coefficient 1) or not (a separate critic).
fn fit(with_policy_loss: bool, updates: usize) -> (f32, f32) {
    let _guard = serial();
    let device = Default::default();
    <AD as Backend>::seed(&device, 11);
    let mut critic: Policy<AD> = config().init(&device).with_value_head();
    let mut optimizer = AdamWConfig::new().init();
    let (tokens, scored, mask) = batch::<AD>(&device);
    let targets = returns::<AD>(&device);
    let old_values = critic
        .valid()
        .score(tokens.clone().inner(), &scored, 1.0, Want::Values)
        .values
        .unwrap();
    let old_values = Tensor::<AD, 2>::from_inner(old_values);
    let old_logprobs = critic
        .valid()
        .scored_logprobs(tokens.clone().inner(), &scored, 1.0);
    let old_logprobs = Tensor::<AD, 2>::from_inner(old_logprobs);
    let loss_now = |critic: &Policy<AD>| {
        let values = critic
            .valid()
            .score(tokens.clone().inner(), &scored, 1.0, Want::Values)
            .values
            .unwrap();
        let (loss, _) = value_loss(
            values,
            old_values.clone().inner(),
            targets.clone().inner(),
            mask.clone().inner(),
            // Unclipped, to measure the fit itself.
            f64::INFINITY,
        );
        scalar(loss)
    };
    let before = loss_now(&critic);
    for _ in 0..updates {
        let want = if with_policy_loss {
            Want::Both
        } else {
            Want::Values
        };
        let scores = critic.score(tokens.clone(), &scored, 1.0, want);
        // The rollout values move with the critic between updates in a real run; here the clip
        // is measured from the first values, as within one PPO batch.
        let (mut loss, _) = value_loss(
            scores.values.unwrap(),
            old_values.clone(),
            targets.clone(),
            mask.clone(),
            10.0,
        );
        if with_policy_loss {
            let config = PolicyLossConfig {
                clip: Clip {
                    low: 0.2,
                    high: 0.2,
                },
                dual_clip: None,
                aggregation: Aggregation::TokenMean,
                entropy_coef: 0.0,
                kl: None,
            };
            let (policy, _) = policy_loss(
                PolicyLossInput {
                    logprobs: scores.logprobs,
                    old_logprobs: old_logprobs.clone(),
                    is_weights: None,
                    advantages: targets.clone(),
                    mask: mask.clone(),
                    entropy: scores.entropy,
                    ref_logprobs: None,
                },
                &config,
            );
            loss = loss + policy;
        }
        let grads = GradientsParams::from_grads(loss.backward(), &critic);
        critic = optimizer.step(1e-2, critic, grads);
    }
    (before, loss_now(&critic))
}

#[test]
fn a_separate_critic_fits_a_fixed_batch() {
    let (before, after) = fit(false, 30);
    assert!(after.is_finite());
    assert!(after < 0.5 * before, "value loss {before} -> {after}");
}

#[test]
fn a_shared_value_head_fits_a_fixed_batch_beside_the_policy_loss() {
    let (before, after) = fit(true, 30);
    assert!(after.is_finite());
    assert!(after < 0.5 * before, "value loss {before} -> {after}");
}
