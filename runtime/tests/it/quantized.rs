//! A base kept in ggml blocks: decode steps multiply by the blocks, everything else by the
//! f32 weights, and both compute with the same weights.

use std::sync::Arc;

use crate::common::seeded;
use crate::lora::lora;
use agentry_dsl::spec::LoraTarget;
use agentry_kernels::blocks::BlockFormat;
use agentry_runtime::model::{Policy, PolicyConfig, Sampling, generate};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

type B = Flex;

/// Widths that are whole blocks of 32 (the blocks' requirement on every input width).
fn config() -> PolicyConfig {
    PolicyConfig {
        vocab: 48,
        layers: 2,
        d_model: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 96,
        context: 64,
        tie_embeddings: true,
    }
}

fn quantized(seed: u64) -> Policy<B> {
    seeded(&Default::default(), seed, |device| {
        config().init::<B>(device)
    })
    .with_quantized_base(BlockFormat::Q4_1)
    .unwrap()
}

fn tokens(rows: usize, len: usize) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = (0..rows * len).map(|i| (i as i64 * 7 + 3) % 48).collect();
    Tensor::from_data(TensorData::new(ids, [rows, len]), &Default::default())
}

fn logits(policy: &Policy<B>, tokens: Tensor<B, 2, Int>) -> Vec<f32> {
    policy.forward(tokens).into_data().into_vec().unwrap()
}

fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn quantizing_a_base_keeps_its_blocks_and_their_values() {
    let policy = quantized(1);
    let base = policy.quantized.clone().expect("blocks");
    let d = config().d_model;
    for layer in 0..2 {
        for target in LoraTarget::ALL {
            let blocks = base.layer(layer, target).expect("every layer quantized");
            assert_eq!(blocks.format(), BlockFormat::Q4_1);
        }
        // The f32 weight (`[d_in, d_out]`) holds the blocks' values (`[d_out, d_in]`).
        let q = base.layer(layer, LoraTarget::Q).unwrap().dequantize();
        let weight: Vec<f32> = policy.blocks[layer]
            .q
            .weight
            .val()
            .into_data()
            .into_vec()
            .unwrap();
        for i in 0..d {
            for o in 0..d {
                assert_eq!(weight[i * d + o], q[o * d + i]);
            }
        }
    }
    let head = base.head().expect("the tied head");
    assert_eq!(
        (head.format(), head.rows(), head.cols()),
        (BlockFormat::Q8_0, 48, d)
    );
    let embed: Vec<f32> = policy.embed.weight.val().into_data().into_vec().unwrap();
    assert_eq!(embed, head.dequantize());
    // A width that is not whole blocks cannot be quantized.
    let odd = PolicyConfig {
        d_model: 48,
        ..config()
    }
    .init::<B>(&Default::default());
    let err = odd.with_quantized_base(BlockFormat::Q4_1).unwrap_err();
    assert!(
        err.contains("block 0's q weight") && err.contains("multiple of 32"),
        "{err}"
    );
}

/// The policy without its blocks: every product by the f32 weights.
fn without_blocks(policy: &Policy<B>) -> Policy<B> {
    Policy {
        quantized: None,
        ..policy.clone()
    }
}

#[test]
fn decode_steps_read_the_blocks() {
    let policy = quantized(2);
    let plain = without_blocks(&policy);
    // Two rows of one token: a decode step's products, through the blocks; the same weights
    // in another order of sums.
    let (step, prefill) = (tokens(2, 1), tokens(2, 9));
    let f32_step = logits(&plain, step.clone());
    let gap = max_gap(&f32_step, &logits(&policy, step.clone()));
    assert!(gap < 1e-4, "blocks and f32 differ by {gap}");
    // Eighteen rows: above `BLOCK_ROWS`, the f32 weights, bit for bit.
    assert_eq!(
        logits(&plain, prefill.clone()),
        logits(&policy, prefill.clone())
    );

    // Other blocks in place of the policy's own show which path ran: the decode step reads
    // them, the prefill does not.
    let mut other = policy.clone();
    other.quantized = quantized(3).quantized;
    assert!(max_gap(&f32_step, &logits(&other, step.clone())) > 1e-2);
    assert_eq!(logits(&policy, prefill.clone()), logits(&other, prefill));

    // Adapters keep the frozen base's blocks (sharing them); merging them into the base, or
    // declaring a full fine-tune, drops them.
    let adapted = policy.clone().with_lora(&lora(&LoraTarget::ALL));
    assert!(Arc::ptr_eq(
        adapted.quantized.as_ref().unwrap(),
        policy.quantized.as_ref().unwrap()
    ));
    assert!(max_gap(&f32_step, &logits(&adapted, step.clone())) < 1e-4);
    assert!(adapted.merged().quantized.is_none());
    let full = agentry_dsl::spec::Model {
        name: "full".into(),
        arch: agentry_dsl::spec::Arch::Gguf {
            file: "unused.gguf".into(),
        },
        value_head: agentry_dsl::spec::ValueHead::None,
        finetune: agentry_dsl::spec::Finetune::Full,
    };
    assert!(policy.as_declared(&full).quantized.is_none());
}

#[test]
fn generating_through_the_blocks_matches_the_f32_weights() {
    let policy = quantized(4);
    let plain = without_blocks(&policy);
    let prompts: Vec<Vec<u32>> = vec![vec![1, 5, 9, 2], vec![7, 3], vec![11, 12, 13]];
    let sampling = Sampling {
        max_new_tokens: 12,
        greedy: true,
        ..Sampling::default()
    };
    let run = |p: &Policy<B>| generate(p, &prompts, &sampling, &mut ChaCha8Rng::seed_from_u64(0));
    for (f32_path, blocks) in run(&plain).iter().zip(run(&policy)) {
        assert_eq!(f32_path.tokens, blocks.tokens);
        let gap = max_gap(&f32_path.logprobs, &blocks.logprobs);
        assert!(gap < 1e-4, "log-probabilities differ by {gap}");
    }
}
