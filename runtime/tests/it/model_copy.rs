//! The policy can learn to copy from its context: the capability tool calls need (an entity
//! named in the question must be written back as an argument).

use crate::common;
use agentry_runtime::model::PolicyConfig;
use burn::backend::{Autodiff, Flex};
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::{Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

type B = Autodiff<Flex>;

#[test]
fn learns_to_copy_a_random_word_from_the_prompt() {
    let device = Default::default();
    let vocab = 64;
    let config = PolicyConfig {
        vocab,
        layers: 2,
        d_model: 64,
        heads: 4,
        kv_heads: 4,
        ffn: 128,
        context: 32,
        tie_embeddings: true,
    };
    let mut policy = common::seeded::<B, _>(&device, 1, |device| config.init::<B>(device));
    let mut optim = AdamWConfig::new().init();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    // Row: filler words, the word to copy after marker 1, more filler, marker 2, the word.
    let batch = |rng: &mut ChaCha8Rng| {
        let mut rows = Vec::new();
        for _ in 0..32 {
            let word = rng.random_range(10..vocab as i64);
            let mut row: Vec<i64> = (0..12)
                .map(|_| rng.random_range(10..vocab as i64))
                .collect();
            let at = rng.random_range(0..10);
            row[at] = 1;
            row[at + 1] = word;
            row.extend([2, word]);
            rows.extend(row);
        }
        Tensor::<B, 2, Int>::from_data(TensorData::new(rows, [32, 14]), &device)
    };
    let mut last = f32::MAX;
    for step in 0..300 {
        let tokens = batch(&mut rng);
        let (logp, _) = policy.token_logprobs(tokens);
        let loss = logp.narrow(1, 12, 1).mean().neg();
        last = loss.clone().into_data().iter::<f32>().next().unwrap();
        if step % 50 == 0 {
            eprintln!("step {step}: copy loss {last:.3}");
        }
        let grads = GradientsParams::from_grads(loss.backward(), &policy);
        policy = optim.step(3e-3, policy, grads);
    }
    assert!(last < 0.5, "copy loss stayed at {last}");
}
