//! Batched sampling with a KV cache.
//!
//! Prompts of different lengths are left-padded into one batch; a key mask hides the pads and
//! each row has its own position ids, so a row's tokens get exactly the logits they would get
//! alone. The prompts are prefilled once, then every unfinished row advances one token per
//! step, reusing the cached keys and values. Finished rows leave the batch.

use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use rand::Rng;

use super::transformer::{LayerCache, Policy, Positions};

/// How to sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    /// Softmax temperature (> 0); ignored when `greedy`.
    pub temperature: f32,
    /// Nucleus sampling: sample among the most likely tokens whose probabilities sum to at
    /// least `top_p`; `1.0` disables it.
    pub top_p: f32,
    /// Most tokens generated per sequence.
    pub max_new_tokens: usize,
    /// Tokens that end a sequence (kept as its last token).
    pub stop: Vec<u32>,
    /// Take the most likely token instead of sampling.
    pub greedy: bool,
}

/// One sampled continuation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generation {
    /// The generated tokens, ending with the stop token when one was hit.
    pub tokens: Vec<u32>,
    /// For each token, its log-probability under the policy's tempered distribution
    /// (`log_softmax(logits / temperature)`), the behaviour log-probability the loss's ratio is
    /// taken against. Top-p decides which tokens may be drawn but does not renormalize this
    /// value, so that a fresh token's ratio is exactly 1. With temperature 1 it equals
    /// [`Policy::token_logprobs`]. Greedy decoding records the temperature-1 log-probability.
    pub logprobs: Vec<f32>,
}

/// Samples one continuation per prompt, all in one batch.
///
/// Each sequence stops at a stop token, after `max_new_tokens`, or when prompt plus
/// generation reach the policy's context. Empty prompts and prompts already at the context get
/// empty generations. Sampling happens on the CPU from the last position's logits, with `rng`
/// as the only randomness, so equal seeds give equal generations.
///
/// Use an inference backend (for an autodiff policy, pass `policy.valid()`), or the whole
/// generation is recorded for backpropagation.
pub fn generate<B: Backend>(
    policy: &Policy<B>,
    prompts: &[Vec<u32>],
    sampling: &Sampling,
    rng: &mut impl Rng,
) -> Vec<Generation> {
    let mut out = vec![Generation::default(); prompts.len()];
    let context = policy.context;
    // Rows still generating: original index, prompt length.
    let mut rows: Vec<usize> = (0..prompts.len())
        .filter(|&i| !prompts[i].is_empty() && prompts[i].len() < context)
        .collect();
    if rows.is_empty() || sampling.max_new_tokens == 0 {
        return out;
    }
    let device = policy.device();
    let heads = policy.heads();
    let vocab = policy.vocab;

    // Prefill: left-pad to the longest prompt.
    let width = rows.iter().map(|&i| prompts[i].len()).max().unwrap_or(0);
    let mut pads: Vec<usize> = rows.iter().map(|&i| width - prompts[i].len()).collect();
    let n = rows.len();
    let mut ids = Vec::with_capacity(n * width);
    let mut positions = Vec::with_capacity(n * width);
    let mut mask = Vec::with_capacity(n * width * width);
    for (r, &i) in rows.iter().enumerate() {
        ids.extend(std::iter::repeat_n(0i64, pads[r]));
        ids.extend(prompts[i].iter().map(|&t| t as i64));
        positions.extend((0..width).map(|j| j.saturating_sub(pads[r])));
        for _ in 0..width {
            mask.extend((0..width).map(|j| j < pads[r]));
        }
    }
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [n, width]), &device);
    let any_pad = pads.iter().any(|&p| p > 0);
    let mask = any_pad.then(|| {
        Tensor::<B, 4, Bool>::from_data(TensorData::new(mask, [n, 1, width, width]), &device)
    });
    let pos = Positions::new(&positions, n, heads, mask, true, &device);
    let mut caches: Vec<LayerCache<B>> = vec![None; policy.blocks.len()];
    let hidden = policy.hidden_with(tokens, &pos, Some(&mut caches));
    let mut logits = last_logits(policy, hidden);
    let mut cache_len = width;

    loop {
        // Sample one token for every active row.
        let data: Vec<f32> = logits
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("f32 logits");
        let mut keep = Vec::with_capacity(rows.len());
        for (r, &i) in rows.iter().enumerate() {
            let (token, logprob) = sample(&data[r * vocab..(r + 1) * vocab], sampling, rng);
            let g = &mut out[i];
            g.tokens.push(token);
            g.logprobs.push(logprob);
            let finished = sampling.stop.contains(&token)
                || g.tokens.len() >= sampling.max_new_tokens
                || prompts[i].len() + g.tokens.len() >= context;
            if !finished {
                keep.push(r);
            }
        }
        if keep.is_empty() {
            return out;
        }
        // Drop finished rows from the batch and the cache, and cache columns that are padding
        // for every remaining row.
        if keep.len() < rows.len() {
            rows = keep.iter().map(|&r| rows[r]).collect();
            pads = keep.iter().map(|&r| pads[r]).collect();
            let idx = Tensor::<B, 1, Int>::from_data(
                TensorData::new(keep.iter().map(|&r| r as i64).collect(), [keep.len()]),
                &device,
            );
            let trim = pads.iter().copied().min().unwrap_or(0);
            for cache in caches.iter_mut() {
                if let Some((k, v)) = cache.take() {
                    let k = k.select(0, idx.clone());
                    let v = v.select(0, idx.clone());
                    *cache = Some(if trim > 0 {
                        (
                            k.narrow(2, trim, cache_len - trim),
                            v.narrow(2, trim, cache_len - trim),
                        )
                    } else {
                        (k, v)
                    });
                }
            }
            cache_len -= trim;
            pads.iter_mut().for_each(|p| *p -= trim);
        }
        // Feed the new tokens.
        let n = rows.len();
        let ids: Vec<i64> = rows
            .iter()
            .map(|&i| *out[i].tokens.last().expect("sampled") as i64)
            .collect();
        let positions: Vec<usize> = rows
            .iter()
            .map(|&i| prompts[i].len() + out[i].tokens.len() - 1)
            .collect();
        let kv_len = cache_len + 1;
        let mask: Vec<bool> = pads
            .iter()
            .flat_map(|&p| (0..kv_len).map(move |j| j < p))
            .collect();
        let any_pad = pads.iter().any(|&p| p > 0);
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [n, 1]), &device);
        let mask = any_pad.then(|| {
            Tensor::<B, 4, Bool>::from_data(TensorData::new(mask, [n, 1, 1, kv_len]), &device)
        });
        let pos = Positions::new(&positions, n, heads, mask, false, &device);
        let hidden = policy.hidden_with(tokens, &pos, Some(&mut caches));
        logits = last_logits(policy, hidden);
        cache_len = kv_len;
    }
}

/// The LM head on the last position: `[batch, vocab]`.
fn last_logits<B: Backend>(policy: &Policy<B>, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
    let [b, t, _] = hidden.dims();
    let last = hidden.narrow(1, t - 1, 1);
    policy.logits(last).reshape([b, policy.vocab])
}

/// The maximum of `logits` and `ln(sum(exp((x - max) / temperature)))`, in f64.
fn normalizer(logits: &[f32], temperature: f64) -> (f64, f64) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .map(|&x| ((x as f64 - max) / temperature).exp())
        .sum();
    (max, sum.ln())
}

/// Picks a token from one row of logits; returns it with its log-probability (see
/// [`Generation::logprobs`]).
fn sample(logits: &[f32], sampling: &Sampling, rng: &mut impl Rng) -> (u32, f32) {
    let last = logits.len() - 1;
    if sampling.greedy {
        let (best, _) = logits
            .iter()
            .enumerate()
            .fold(
                (0, f32::NEG_INFINITY),
                |acc, (i, &x)| {
                    if x > acc.1 { (i, x) } else { acc }
                },
            );
        let (max, log_z) = normalizer(logits, 1.0);
        return (best as u32, (logits[best] as f64 - max - log_z) as f32);
    }
    let temperature = (sampling.temperature as f64).max(1e-6);
    let (max, log_z) = normalizer(logits, temperature);
    let logp = |i: usize| (logits[i] as f64 - max) / temperature - log_z;
    if sampling.top_p < 1.0 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let mut mass = 0.0;
        let mut kept = 0;
        for &i in &order {
            mass += logp(i).exp();
            kept += 1;
            if mass >= sampling.top_p as f64 {
                break;
            }
        }
        let nucleus = &order[..kept];
        let u = rng.random::<f64>() * mass;
        let mut acc = 0.0;
        let mut choice = nucleus[kept - 1];
        for &i in nucleus {
            acc += logp(i).exp();
            if u < acc {
                choice = i;
                break;
            }
        }
        // The log-probability under the full tempered distribution, which is what the trainer
        // recomputes; renormalizing over the nucleus would make fresh ratios differ from 1.
        return (choice as u32, logp(choice) as f32);
    }
    // Inverse CDF on unnormalized weights.
    let u = rng.random::<f64>() * log_z.exp();
    let mut acc = 0.0;
    let mut choice = last;
    for (i, &x) in logits.iter().enumerate() {
        acc += ((x as f64 - max) / temperature).exp();
        if u < acc {
            choice = i;
            break;
        }
    }
    (choice as u32, logp(choice) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn cfg(greedy: bool, top_p: f32) -> Sampling {
        Sampling {
            temperature: 1.0,
            top_p,
            max_new_tokens: 1,
            stop: vec![],
            greedy,
        }
    }

    #[test]
    fn greedy_is_argmax() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let (t, lp) = sample(&[0.0, 3.0, 1.0], &cfg(true, 1.0), &mut rng);
        assert_eq!(t, 1);
        assert!(lp < 0.0);
    }

    #[test]
    fn tiny_top_p_is_argmax_with_its_full_logprob() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let (_, full) = sample(&[0.0, 3.0, 1.0], &cfg(true, 1.0), &mut rng);
        for _ in 0..20 {
            let (t, lp) = sample(&[0.0, 3.0, 1.0], &cfg(false, 0.01), &mut rng);
            assert_eq!(t, 1);
            // Not renormalized over the nucleus: the trainer recomputes the full distribution.
            assert!((lp - full).abs() < 1e-6);
        }
    }

    #[test]
    fn sampling_follows_probabilities() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let logits = [0.0f32, (3.0f32).ln()];
        let ones = (0..4000)
            .filter(|_| sample(&logits, &cfg(false, 1.0), &mut rng).0 == 1)
            .count();
        assert!((2800..3200).contains(&ones), "{ones}");
    }
}
