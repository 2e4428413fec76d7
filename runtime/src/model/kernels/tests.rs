//! flex's fused kernels against the decomposed ops, values and gradients, under autodiff.

use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::module::Module;
use burn::tensor::{Distribution, Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::model::{Policy, PolicyConfig};

type A = Autodiff<Flex>;

fn random<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<A, D> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    let data: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    Tensor::from_data(TensorData::new(data, shape), &Default::default())
}

/// Largest absolute difference relative to the reference's largest magnitude.
fn relative<const D: usize>(got: Tensor<Flex, D>, want: Tensor<Flex, D>) -> f32 {
    let got = got.into_data().into_vec::<f32>().unwrap();
    let want = want.into_data().into_vec::<f32>().unwrap();
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(1e-3f32, |m, w| m.max(w.abs()));
    got.iter()
        .zip(&want)
        .map(|(g, w)| {
            assert!(g.is_finite(), "non-finite value {g}");
            (g - w).abs() / scale
        })
        .fold(0.0, f32::max)
}

/// Runs `op` on fresh leaves made from `inputs`, fused and decomposed, and compares the
/// outputs and the gradients of `Σ out ∘ w` for a random `w`.
fn compare<const D: usize, const O: usize>(
    name: &str,
    inputs: Vec<Tensor<A, D>>,
    op: impl Fn(&[Tensor<A, D>]) -> Tensor<A, O>,
) {
    let run = |decomposed: bool| {
        let leaves: Vec<Tensor<A, D>> = inputs
            .iter()
            .map(|t| Tensor::from_data(t.to_data(), &Default::default()).require_grad())
            .collect();
        let out = match decomposed {
            true => with_decomposed_ops(|| op(&leaves)),
            false => op(&leaves),
        };
        let weights = random(out.dims(), 99);
        let grads = (out.clone() * weights).sum().backward();
        let grads: Vec<Tensor<Flex, D>> = leaves
            .iter()
            .map(|l| l.grad(&grads).expect("every input gets a gradient"))
            .collect();
        (out.inner(), grads)
    };
    let (fused, fused_grads) = run(false);
    let (reference, reference_grads) = run(true);
    let err = relative(fused, reference);
    assert!(err < 1e-4, "{name}: outputs differ by {err}");
    for (i, (g, r)) in fused_grads.into_iter().zip(reference_grads).enumerate() {
        let err = relative(g, r);
        assert!(err < 1e-4, "{name}: gradient of input {i} differs by {err}");
    }
}

#[test]
fn attention_matches_the_decomposed_ops() {
    // (batch, q_len, kv_len, heads, kv_heads, head_dim, causal, left pads)
    #[allow(clippy::type_complexity)]
    let cases: [(
        usize,
        usize,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<Vec<usize>>,
    ); 6] = [
        (2, 7, 7, 4, 4, 8, true, None),
        (3, 5, 5, 6, 2, 6, true, Some(vec![0, 2, 4])),
        (1, 1, 1, 2, 1, 4, true, None),
        (2, 1, 9, 3, 3, 8, false, Some(vec![3, 0])),
        (2, 4, 11, 4, 2, 16, true, None),
        (2, 33, 33, 2, 1, 32, true, Some(vec![1, 5])),
    ];
    for (i, (b, t, s, h, kvh, hd, causal, pads)) in cases.into_iter().enumerate() {
        let mask = AttentionMask {
            causal,
            key_start: pads.map(Arc::from),
            kv_len: None,
        };
        let inputs = vec![
            random([b, t, h, hd], 3 * i as u64),
            random([b, s, kvh, hd], 3 * i as u64 + 1),
            random([b, s, kvh, hd], 3 * i as u64 + 2),
        ];
        compare(&format!("attention case {i}"), inputs, |x| {
            attention(x[0].clone(), x[1].clone(), x[2].clone(), &mask)
        });
    }
}

/// The fused product and its backward equal burn's bit for bit (the same gemm sums in the
/// same order), also on a transposed operand (the tied LM head) and under a thread pool that
/// cuts the product into blocks.
#[test]
fn matmul_equals_burns_bit_for_bit() {
    // (m, k, n, transposed rhs)
    let cases = [
        (7, 5, 3, false),
        (300, 64, 200, false),
        (512, 96, 300, true),
        (16, 40, 900, true),
    ];
    for (i, (m, k, n, transposed)) in cases.into_iter().enumerate() {
        let lhs = random([m, k], 2 * i as u64);
        let rhs_data = if transposed {
            random([n, k], 2 * i as u64 + 1)
        } else {
            random([k, n], 2 * i as u64 + 1)
        };
        let run = |decomposed: bool| {
            let lhs = Tensor::<A, 2>::from_data(lhs.to_data(), &Default::default()).require_grad();
            let leaf =
                Tensor::<A, 2>::from_data(rhs_data.to_data(), &Default::default()).require_grad();
            let rhs = if transposed {
                leaf.clone().transpose()
            } else {
                leaf.clone()
            };
            let out = match decomposed {
                true => with_decomposed_ops(|| matmul(lhs.clone(), rhs)),
                false => matmul(lhs.clone(), rhs),
            };
            let grads = (out.clone() * random(out.dims(), 99)).sum().backward();
            let bits = |t: Tensor<Flex, 2>| t.into_data().into_vec::<f32>().unwrap();
            [
                out.inner(),
                lhs.grad(&grads).unwrap(),
                leaf.grad(&grads).unwrap(),
            ]
            .map(bits)
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        let fused = pool.install(|| run(false));
        let reference = run(true);
        for (what, (f, r)) in ["product", "lhs gradient", "rhs gradient"]
            .iter()
            .zip(fused.iter().zip(&reference))
        {
            assert!(
                f.iter().zip(r).all(|(a, b)| a.to_bits() == b.to_bits()),
                "case {i}: the {what} differs from burn's"
            );
        }
    }
}

/// Rows written into a KV-cache buffer land where burn's `slice_assign` puts them, and the
/// write is in place when the buffer is not shared (and a copy when it is).
#[test]
fn cache_writes_equal_slice_assign_and_are_in_place() {
    let buffer = random::<4>([2, 6, 3, 4], 1).inner();
    let rows = random::<4>([2, 2, 3, 4], 2).inner();
    let want = with_decomposed_ops(|| cache_write(buffer.clone(), 3, rows.clone()));
    let shared = buffer.clone();
    let got = cache_write(buffer, 3, rows.clone());
    assert_eq!(got.to_data(), want.to_data());
    // The shared copy kept its old rows.
    assert_ne!(shared.to_data(), got.to_data());
    let before = got.clone().into_primitive().tensor().data_arc();
    let pointer = before.as_ptr();
    drop(before);
    let again = cache_write(got, 0, rows);
    let after = again.clone().into_primitive().tensor().data_arc();
    assert_eq!(
        after.as_ptr(),
        pointer,
        "an unshared buffer is written in place"
    );
}

#[test]
fn a_query_that_sees_no_key_gets_zeros_and_finite_gradients() {
    // Left padding under a causal mask: the first two queries of row 0 see only pads.
    let mask = AttentionMask {
        causal: true,
        key_start: Some(Arc::from(vec![2, 0])),
        kv_len: None,
    };
    let q = random::<4>([2, 4, 2, 4], 1).require_grad();
    let k = random::<4>([2, 4, 2, 4], 2).require_grad();
    let v = random::<4>([2, 4, 2, 4], 3).require_grad();
    let out = attention(q.clone(), k.clone(), v, &mask);
    let first: Vec<f32> = out
        .clone()
        .narrow(0, 0, 1)
        .narrow(1, 0, 2)
        .into_data()
        .to_vec()
        .unwrap();
    assert!(first.iter().all(|&x| x == 0.0), "{first:?}");
    let grads = out.sum().backward();
    for g in [q.grad(&grads).unwrap(), k.grad(&grads).unwrap()] {
        let g: Vec<f32> = g.into_data().to_vec().unwrap();
        assert!(g.iter().all(|x| x.is_finite()));
    }
}

#[test]
fn rms_norm_swiglu_and_rope_match_the_decomposed_ops() {
    for (i, (b, t, d)) in [(2, 5, 8), (1, 1, 6), (3, 7, 130)].into_iter().enumerate() {
        let norm = burn::nn::RmsNormConfig::new(d).init::<A>(&Default::default());
        let gamma = random::<1>([d], 50 + i as u64);
        let inputs = vec![random([b, t, d], i as u64)];
        compare(&format!("rms_norm case {i}"), inputs, |x| {
            let mut norm = norm.clone();
            norm.gamma = burn::module::Param::from_tensor(gamma.clone());
            rms_norm(x[0].clone(), &norm)
        });
        let inputs = vec![
            random([b, t, d], 10 + i as u64),
            random([b, t, d], 20 + i as u64),
        ];
        compare(&format!("swiglu case {i}"), inputs, |x| {
            swiglu(x[0].clone(), x[1].clone())
        });
    }
    for (i, (b, t, h, hd)) in [(2, 5, 3, 8), (1, 1, 1, 2), (2, 9, 9, 64)]
        .into_iter()
        .enumerate()
    {
        let cos = random::<2>([b * t, hd / 2], 30 + i as u64).inner();
        let sin = random::<2>([b * t, hd / 2], 40 + i as u64).inner();
        let (cos, sin) = (
            Tensor::<A, 2>::from_inner(cos),
            Tensor::<A, 2>::from_inner(sin),
        );
        compare(
            &format!("rope case {i}"),
            vec![random([b, t, h, hd], i as u64)],
            |x| rope(x[0].clone(), &cos, &sin),
        );
    }
}

#[test]
fn token_logprobs_match_the_decomposed_ops_for_both_head_layouts() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (i, (n, d, vocab, entropy, temperature)) in [
        (1, 8, 17, true, 1.0f32),
        (9, 16, 300, true, 0.7),
        (20, 8, 64, false, 1.3),
    ]
    .into_iter()
    .enumerate()
    {
        let ids: Vec<i64> = (0..n).map(|_| rng.random_range(0..vocab as i64)).collect();
        let targets =
            Tensor::<A, 1, Int>::from_data(TensorData::new(ids, [n]), &Default::default());
        for layout in [HeadWeight::Embedding, HeadWeight::Linear] {
            let shape = match layout {
                HeadWeight::Embedding => [vocab, d],
                HeadWeight::Linear => [d, vocab],
            };
            let inputs = vec![random([n, d], 60 + i as u64), random(shape, 70 + i as u64)];
            compare(
                &format!("token_logprobs case {i} {layout:?}"),
                inputs,
                |x| {
                    let (logprobs, h) = token_logprobs(
                        x[0].clone(),
                        x[1].clone(),
                        layout,
                        targets.clone(),
                        1.0 / temperature,
                        entropy,
                    );
                    match h {
                        Some(h) => Tensor::cat(vec![logprobs, h], 0),
                        None => logprobs,
                    }
                },
            );
        }
    }
}

/// The whole policy: the SFT loss and every parameter's gradient, fused against decomposed.
#[test]
fn the_policy_loss_and_gradients_match_the_decomposed_ops() {
    for (tie_embeddings, kv_heads) in [(true, 4), (false, 2)] {
        let config = PolicyConfig {
            vocab: 97,
            layers: 2,
            d_model: 32,
            heads: 4,
            kv_heads,
            ffn: 48,
            context: 64,
            tie_embeddings,
        };
        let device = Default::default();
        A::seed(&device, 11);
        let policy: Policy<A> = config.init(&device);
        let tokens =
            Tensor::<A, 2, Int>::random([3, 13], Distribution::Uniform(0.0, 97.0), &device);
        let scored: Vec<bool> = (0..3 * 12).map(|i| i % 3 != 0).collect();
        let run = |decomposed: bool| {
            let loss = || {
                let (logprobs, entropy) =
                    policy.scored_logprobs_and_entropy(tokens.clone(), &scored, 0.9);
                logprobs.sum().neg() + entropy.sum() * 0.1
            };
            let loss = if decomposed {
                with_decomposed_ops(loss)
            } else {
                loss()
            };
            let grads = loss.backward();
            let mut flat = Vec::new();
            let mut visitor = Collect {
                grads: &grads,
                out: &mut flat,
            };
            policy.visit(&mut visitor);
            (loss.into_scalar(), flat)
        };
        let (fused_loss, fused) = run(false);
        let (reference_loss, reference) = run(true);
        assert!(
            (fused_loss - reference_loss).abs() <= 1e-4 * reference_loss.abs(),
            "loss {fused_loss} vs {reference_loss}"
        );
        assert_eq!(fused.len(), reference.len());
        for (i, (g, r)) in fused.iter().zip(&reference).enumerate() {
            let scale = r.iter().fold(1e-6f32, |m, x| m.max(x.abs()));
            let err = g
                .iter()
                .zip(r)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max)
                / scale;
            assert!(
                err < 1e-4,
                "parameter {i}: gradients differ by {err} (tied {tie_embeddings})"
            );
        }
    }
}

struct Collect<'a> {
    grads: &'a <A as burn::tensor::backend::AutodiffBackend>::Gradients,
    out: &'a mut Vec<Vec<f32>>,
}

impl burn::module::ModuleVisitor<A> for Collect<'_> {
    fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<A, D>>) {
        if let Some(g) = param.val().grad(self.grads) {
            self.out.push(g.into_data().to_vec().unwrap());
        }
    }
}
