//! Policy network: shapes, padding, KV-cache generation against full recomputation,
//! recorded log-probabilities, and a tiny overfitting run.

use crate::common;
use agentry_runtime::model::{Generation, Policy, PolicyConfig, Sampling, generate};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

type B = Flex;
type AD = Autodiff<Flex>;

fn config(kv_heads: usize) -> PolicyConfig {
    PolicyConfig {
        vocab: 50,
        layers: 2,
        d_model: 32,
        heads: 4,
        kv_heads,
        ffn: 64,
        context: 64,
        // Both LM heads are covered: the tests run kv_heads 4, 2 and 1.
        tie_embeddings: kv_heads != 2,
    }
}

fn policy(kv_heads: usize, seed: u64) -> Policy<B> {
    common::seeded::<B, _>(&Default::default(), seed, |device| {
        config(kv_heads).init::<B>(device)
    })
}

fn batch<Bk: Backend>(rows: &[Vec<u32>]) -> Tensor<Bk, 2, Int> {
    let t = rows.iter().map(Vec::len).max().unwrap();
    let data: Vec<i64> = rows
        .iter()
        .flat_map(|r| (0..t).map(move |j| r.get(j).copied().unwrap_or(0) as i64))
        .collect();
    Tensor::from_data(TensorData::new(data, [rows.len(), t]), &Default::default())
}

fn to_vec<const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec::<f32>().unwrap()
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 7, 9, 3, 22, 4, 5, 6, 30, 31, 2],
        vec![1, 8],
        vec![1, 40, 41, 42, 43, 44],
        vec![3],
    ]
}

#[test]
fn forward_shapes() {
    let p = policy(4, 0);
    let tokens = batch::<B>(&[vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10]]);
    assert_eq!(p.forward(tokens.clone()).dims(), [2, 5, 50]);
    let (lp, ent) = p.token_logprobs(tokens);
    assert_eq!(lp.dims(), [2, 4]);
    assert_eq!(ent.dims(), [2, 4]);
    let lp = to_vec(lp);
    let ent = to_vec(ent);
    assert!(lp.iter().all(|&x| x < 0.0 && x.is_finite()));
    let max_entropy = (50f32).ln();
    assert!(ent.iter().all(|&e| e > 0.0 && e <= max_entropy + 1e-4));
}

/// Scoring a subset of positions gives exactly the full computation there, zero elsewhere,
/// at any temperature, and gradients flow through the scored positions.
#[test]
fn scored_logprobs_match_the_full_computation() {
    for kv_heads in [4, 2] {
        let p = policy(kv_heads, 5);
        let tokens = batch::<B>(&[vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 0, 0, 0]]);
        let scored = [
            false, true, true, false, true, //
            true, false, false, false, false,
        ];
        for temperature in [1.0, 0.7] {
            let logits = p.forward(tokens.clone()).narrow(1, 0, 5) / temperature;
            let full = burn::tensor::activation::log_softmax(logits, 2);
            let targets = tokens.clone().narrow(1, 1, 5).reshape([2, 5, 1]);
            let full = to_vec(full.gather(2, targets).reshape([2, 5]));
            let (lp, ent) = p.scored_logprobs_and_entropy(tokens.clone(), &scored, temperature);
            let (lp, ent) = (to_vec(lp), to_vec(ent));
            for (i, &on) in scored.iter().enumerate() {
                if on {
                    assert!(
                        (lp[i] - full[i]).abs() < 1e-5,
                        "{i}: {} vs {}",
                        lp[i],
                        full[i]
                    );
                    assert!(ent[i] > 0.0);
                } else {
                    assert_eq!((lp[i], ent[i]), (0.0, 0.0), "{i}");
                }
            }
        }
        let (lp, ent) = p.scored_logprobs_and_entropy(tokens.clone(), &[false; 10], 1.0);
        assert!(to_vec(lp).iter().chain(&to_vec(ent)).all(|&x| x == 0.0));

        // One gradient step on the scored log-likelihood raises it: gradients flow through
        // the scatter back to the parameters.
        let device = Default::default();
        let trainable =
            common::seeded::<AD, _>(&device, 5, |device| config(kv_heads).init::<AD>(device));
        let tokens = batch::<AD>(&[vec![1, 2, 3, 4, 5, 6], vec![7, 8, 9, 0, 0, 0]]);
        let score = |p: &Policy<AD>| p.scored_logprobs(tokens.clone(), &scored, 1.0).sum();
        let before = score(&trainable);
        let grads = GradientsParams::from_grads(before.clone().neg().backward(), &trainable);
        let stepped = AdamWConfig::new().init().step(1e-2, trainable, grads);
        let (before, after) = (before.into_scalar(), score(&stepped).into_scalar());
        assert!(after > before + 0.1, "{before} -> {after}");
    }
}

#[test]
fn right_padding_does_not_change_real_logits() {
    let p = policy(2, 1);
    let short = vec![5, 6, 7];
    let alone = to_vec(p.forward(batch::<B>(std::slice::from_ref(&short))));
    let padded = to_vec(p.forward(batch::<B>(&[short.clone(), vec![1; 9]])));
    // Row 0 of the padded batch is `short` followed by six pads.
    for (i, a) in alone.iter().enumerate() {
        let (pos, v) = (i / 50, i % 50);
        assert!((a - padded[pos * 50 + v]).abs() < 1e-5);
    }
}

/// Recomputes each generation on the full sequence and compares log-probabilities; with
/// `greedy`, also checks every chosen token is a maximum of the recomputed logits.
fn check_against_recompute(p: &Policy<B>, prompts: &[Vec<u32>], gens: &[Generation], greedy: bool) {
    for (prompt, g) in prompts.iter().zip(gens) {
        assert_eq!(g.tokens.len(), g.logprobs.len());
        let full: Vec<u32> = prompt.iter().chain(&g.tokens).copied().collect();
        let (lp, _) = p.token_logprobs(batch::<B>(std::slice::from_ref(&full)));
        let lp = to_vec(lp);
        let logits = to_vec(p.forward(batch::<B>(std::slice::from_ref(&full))));
        for (k, (&tok, &recorded)) in g.tokens.iter().zip(&g.logprobs).enumerate() {
            let pos = prompt.len() - 1 + k;
            assert!(
                (lp[pos] - recorded).abs() < 1e-4,
                "token {k}: recorded {recorded}, recomputed {}",
                lp[pos]
            );
            if greedy {
                let row = &logits[pos * 50..(pos + 1) * 50];
                let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                assert!(max - row[tok as usize] < 1e-4);
            }
        }
    }
}

#[test]
fn cached_greedy_generation_matches_recompute() {
    for kv_heads in [4, 2, 1] {
        let p = policy(kv_heads, 2);
        let sampling = Sampling {
            max_new_tokens: 12,
            greedy: true,
            ..Sampling::default()
        };
        let prompts = prompts();
        let gens = generate(&p, &prompts, &sampling, &mut ChaCha8Rng::seed_from_u64(0));
        assert!(gens.iter().all(|g| g.tokens.len() == 12));
        check_against_recompute(&p, &prompts, &gens, true);
        // Each prompt alone gives the same tokens as in the batch.
        for (prompt, g) in prompts.iter().zip(&gens) {
            let alone = generate(
                &p,
                std::slice::from_ref(prompt),
                &sampling,
                &mut ChaCha8Rng::seed_from_u64(0),
            );
            assert_eq!(alone[0].tokens, g.tokens);
        }
    }
}

#[test]
fn sampled_logprobs_match_recompute_with_stops() {
    let p = policy(2, 3);
    let sampling = Sampling {
        max_new_tokens: 20,
        stop: vec![10, 11, 12, 13, 14],
        ..Sampling::default()
    };
    let prompts = prompts();
    let gens = generate(&p, &prompts, &sampling, &mut ChaCha8Rng::seed_from_u64(7));
    // Rows finish at different times (stop tokens or the budget), exercising compaction.
    for g in &gens {
        let stopped = g.tokens.iter().position(|t| sampling.stop.contains(t));
        match stopped {
            Some(i) => assert_eq!(i + 1, g.tokens.len()),
            None => assert_eq!(g.tokens.len(), 20),
        }
    }
    check_against_recompute(&p, &prompts, &gens, false);
    // Deterministic under the same seed.
    let again = generate(&p, &prompts, &sampling, &mut ChaCha8Rng::seed_from_u64(7));
    assert_eq!(gens, again);
}

#[test]
fn generation_respects_context_and_edge_cases() {
    let p = policy(4, 4);
    let sampling = Sampling {
        temperature: 0.7,
        top_p: 0.9,
        max_new_tokens: 100,
        ..Sampling::default()
    };
    let long = vec![1u32; 60];
    let full = vec![1u32; 64];
    let gens = generate(
        &p,
        &[long, vec![], full, vec![2, 3]],
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    assert_eq!(gens[0].tokens.len(), 4);
    assert!(gens[1].tokens.is_empty());
    assert!(gens[2].tokens.is_empty());
    assert_eq!(gens[3].tokens.len(), 62);
    assert!(gens[3].logprobs.iter().all(|&l| l <= 0.0 && l.is_finite()));
    assert!(generate(&p, &[], &sampling, &mut ChaCha8Rng::seed_from_u64(0)).is_empty());
}

#[test]
fn tiny_model_overfits_a_sequence() {
    let device = Default::default();
    let mut p: Policy<AD> = common::seeded::<AD, _>(&device, 5, |device| config(2).init(device));
    let mut optim = AdamWConfig::new().init::<AD, Policy<AD>>();
    let seq: Vec<u32> = vec![1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 2, 4, 6, 8];
    let tokens = batch::<AD>(&[seq.clone(), seq.iter().rev().copied().collect()]);
    let mut losses = Vec::new();
    for _ in 0..40 {
        let (lp, _) = p.token_logprobs(tokens.clone());
        let loss = lp.mean().neg();
        losses.push(loss.clone().into_scalar());
        let grads = GradientsParams::from_grads(loss.backward(), &p);
        p = optim.step(3e-3, p, grads);
    }
    let (first, last) = (losses[0], *losses.last().unwrap());
    assert!(last < 0.2 * first, "loss {first} -> {last}");
    // The trained weights generate the sequence greedily on the inference backend.
    let inference = p.valid();
    let sampling = Sampling {
        max_new_tokens: seq.len() - 4,
        greedy: true,
        ..Sampling::default()
    };
    let g = generate(
        &inference,
        &[seq[..4].to_vec()],
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    assert_eq!(g[0].tokens, seq[4..]);
}
