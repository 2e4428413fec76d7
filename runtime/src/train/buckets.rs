//! Transcripts as padded tensors, in buckets of similar length.
//!
//! A batch of transcripts is scored as `[n, width]` tokens right-padded to its longest, and
//! the model's work grows with that width (the attention's with its square). Transcripts in
//! one batch differ in length several times over: a KG answer in two turns, a WebShop
//! episode of 700 tokens. So a batch is scored in buckets of transcripts of similar length,
//! each padded only to its own longest ([`length_buckets`]). Padding never changes the
//! scores of the real tokens before it (the attention is causal), so whatever the buckets,
//! the scores are the whole batch's, and a loss summed over the buckets is the batch's loss.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::model::{Kernels, Policy, Scores, Want};
use crate::text::Transcript;

/// What one more bucket costs besides its padded tokens, in tokens: the fixed work of a
/// forward and backward pass. Small against the tokens padding wastes: on `pilot8`'s warm-up
/// (results page), whose batches of 8 mix 60- and 700-token demonstrations, 0, 32, 64 and 128
/// ran within the run-to-run noise of each other, all about 1.6× the steps a minute of one
/// padded batch.
const BUCKET_COST: usize = 64;

/// For each predicted position `1..width` of a transcript padded to `width`, whether the
/// token there is the agent's: the one place agent tokens map to the rows of the loss
/// tensors (`[n, width - 1]`, position `j` at column `j - 1`).
pub(super) fn predicted_agent(
    transcript: &Transcript,
    width: usize,
) -> impl Iterator<Item = bool> + '_ {
    (1..width).map(|j| transcript.agent_mask.get(j).copied().unwrap_or(false))
}

/// Right-padded transcripts `[n, width]` and which predicted tokens `[n, width - 1]` are the
/// agent's, as a tensor (`mask`) and on the host (`scored`).
pub(super) struct Padded<B: Backend> {
    pub tokens: Tensor<B, 2, Int>,
    pub mask: Tensor<B, 2>,
    pub scored: Vec<bool>,
    pub width: usize,
}

impl<B: Kernels> Padded<B> {
    /// The padded width of `transcripts`: the longest, at least 2.
    pub(super) fn width(transcripts: &[&Transcript]) -> usize {
        transcripts
            .iter()
            .map(|t| t.tokens.len())
            .max()
            .unwrap_or(2)
            .max(2)
    }

    pub(super) fn new(transcripts: &[&Transcript], pad: u32, device: &B::Device) -> Self {
        let width = Self::width(transcripts);
        let mut tokens = Vec::with_capacity(transcripts.len() * width);
        let mut scored = Vec::with_capacity(transcripts.len() * (width - 1));
        for t in transcripts {
            tokens.extend(t.tokens.iter().map(|&x| i64::from(x)));
            tokens.extend(std::iter::repeat_n(i64::from(pad), width - t.tokens.len()));
            scored.extend(predicted_agent(t, width));
        }
        let n = transcripts.len();
        let mask: Vec<f32> = scored.iter().map(|&m| f32::from(u8::from(m))).collect();
        Padded {
            tokens: Tensor::from_data(TensorData::new(tokens, [n, width]), device),
            mask: Tensor::from_data(TensorData::new(mask, [n, width - 1]), device),
            scored,
            width,
        }
    }
}

/// [`Policy::score`] of `transcripts` (padded with `pad`), `[n, width - 1]` in their order
/// (`width` at least the longest transcript), computed in length buckets (each padded to its own
/// longest, cut where the fewest tokens are scored); the values (when wanted and the policy has a
/// value head) come back in the same shape and order.
pub fn score_in_buckets<C: Kernels>(
    policy: &Policy<C>,
    transcripts: &[&Transcript],
    pad: u32,
    width: usize,
    temperature: f64,
    want: Want,
) -> Scores<C> {
    let device = policy.device();
    let (order, buckets) = padded_buckets::<C>(transcripts, pad, &device);
    let (mut logprobs, mut entropies, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for padded in buckets {
        let [members, _] = padded.tokens.dims();
        let scores = policy.score(padded.tokens, &padded.scored, temperature, want);
        let widen = |t: Tensor<C, 2>| match width - padded.width {
            0 => t,
            extra => {
                let zeros = Tensor::zeros([members, extra], &device);
                Tensor::cat(vec![t, zeros], 1)
            }
        };
        logprobs.push(widen(scores.logprobs));
        entropies.push(widen(scores.entropy));
        values.extend(scores.values.map(widen));
    }
    let mut back = vec![0i64; order.len()];
    for (row, &i) in order.iter().enumerate() {
        back[i] = row as i64;
    }
    let back = Tensor::<C, 1, Int>::from_data(TensorData::new(back, [order.len()]), &device);
    let restore = |parts: Vec<Tensor<C, 2>>| Tensor::cat(parts, 0).select(0, back.clone());
    let has_values = !values.is_empty() && values.len() == logprobs.len();
    Scores {
        logprobs: restore(logprobs),
        entropy: restore(entropies),
        values: has_values.then(|| restore(values)),
    }
}

/// `transcripts` padded in [`length_buckets`], with the order they are in (indices of
/// `transcripts`, shortest first).
fn padded_buckets<B: Kernels>(
    transcripts: &[&Transcript],
    pad: u32,
    device: &B::Device,
) -> (Vec<usize>, Vec<Padded<B>>) {
    let order = by_length(transcripts);
    let buckets = length_buckets(&order, transcripts)
        .into_iter()
        .map(|bucket| {
            let members: Vec<&Transcript> = order[bucket].iter().map(|&i| transcripts[i]).collect();
            Padded::new(&members, pad, device)
        })
        .collect();
    (order, buckets)
}

/// The indices of `transcripts`, shortest first (stable, so equal lengths keep their order).
fn by_length(transcripts: &[&Transcript]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..transcripts.len()).collect();
    order.sort_by_key(|&i| transcripts[i].tokens.len());
    order
}

/// `order` (indices of `transcripts`, shortest first) cut into contiguous buckets, as ranges
/// of `order`: the cut that scores the fewest tokens, padding included, counting
/// [`BUCKET_COST`] more for each bucket. A function of the lengths alone, so a run's buckets
/// (and the order of its sums) are the same every time.
fn length_buckets(order: &[usize], transcripts: &[&Transcript]) -> Vec<Range<usize>> {
    let widths: Vec<usize> = order
        .iter()
        .map(|&i| transcripts[i].tokens.len().max(2))
        .collect();
    cut_sorted(&widths, BUCKET_COST)
}

/// The cut of `widths` (ascending) into contiguous ranges minimizing the sum over ranges of
/// `len × its widest + cost`: exact, by dynamic programming over where the last range starts
/// (ties to the longer last range).
fn cut_sorted(widths: &[usize], cost: usize) -> Vec<Range<usize>> {
    let n = widths.len();
    // best[j]: the least cost of the first j widths; start[j]: where its last range starts.
    let mut best = vec![0usize; n + 1];
    let mut start = vec![0usize; n + 1];
    for j in 1..=n {
        let widest = widths[j - 1];
        (best[j], start[j]) = (0..j)
            .map(|i| (best[i] + (j - i) * widest + cost, i))
            .min()
            .unwrap_or((0, 0));
    }
    let mut ranges = Vec::new();
    let mut end = n;
    while end > 0 {
        ranges.push(start[end]..end);
        end = start[end];
    }
    ranges.reverse();
    ranges
}

/// The mean negative log-likelihood of the agent tokens of `transcripts` under `policy`
/// (temperature 1), computed in [`length_buckets`]: the SFT loss. `None` for no transcripts.
pub(super) fn nll<B: Kernels>(
    policy: &Policy<B>,
    transcripts: &[&Transcript],
    pad: u32,
) -> Option<Tensor<B, 1>> {
    let (_, buckets) = padded_buckets::<B>(transcripts, pad, &policy.device());
    let tokens: usize = buckets
        .iter()
        .map(|b| b.scored.iter().filter(|s| **s).count())
        .sum();
    buckets
        .into_iter()
        .map(|b| {
            let logprobs = policy.scored_logprobs(b.tokens, &b.scored, 1.0);
            (logprobs * b.mask).sum()
        })
        .reduce(|a, b| a + b)
        .map(|sum| sum.neg() / tokens.max(1) as f32)
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};

    use super::*;
    use crate::model::PolicyConfig;

    type A = Autodiff<Flex>;

    fn policy() -> Policy<A> {
        let device = Default::default();
        A::seed(&device, 3);
        PolicyConfig {
            vocab: 50,
            layers: 2,
            d_model: 32,
            heads: 4,
            kv_heads: 2,
            ffn: 64,
            context: 512,
            tie_embeddings: false,
        }
        .init(&device)
    }

    /// Transcripts of `lengths` (out of order; one empty), agent tokens scattered.
    fn transcripts(lengths: &[usize]) -> Vec<Transcript> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| Transcript {
                tokens: (0..n).map(|j| 1 + ((i * 7 + j * 3) % 48) as u32).collect(),
                agent_mask: (0..n).map(|j| (i + j) % 3 != 0).collect(),
            })
            .collect()
    }

    const LENGTHS: [usize; 12] = [5, 300, 2, 9, 0, 13, 260, 11, 7, 290, 4, 120];

    fn flat<Bk: Backend, const D: usize>(t: Tensor<Bk, D>) -> Vec<f32> {
        t.into_data().into_vec::<f32>().unwrap()
    }

    fn close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        let scale = want.iter().fold(1e-3f32, |m, w| m.max(w.abs()));
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-5 * scale.max(1.0), "{what}: {g} vs {w}");
        }
    }

    #[test]
    fn scoring_in_buckets_equals_scoring_the_whole_batch() {
        let policy = policy();
        let owned = transcripts(&LENGTHS);
        let all: Vec<&Transcript> = owned.iter().collect();
        let buckets = length_buckets(&by_length(&all), &all);
        assert!(buckets.len() >= 3, "{buckets:?}");
        let whole = Padded::<A>::new(&all, 0, &Default::default());
        let (want_lp, want_ent) =
            policy.scored_logprobs_and_entropy(whole.tokens, &whole.scored, 0.8);
        let scores = score_in_buckets(&policy, &all, 0, whole.width, 0.8, Want::Policy);
        assert_eq!(scores.logprobs.dims(), [LENGTHS.len(), whole.width - 1]);
        close(&flat(scores.logprobs), &flat(want_lp), "log-probabilities");
        close(&flat(scores.entropy), &flat(want_ent), "entropies");
    }

    #[test]
    fn the_sft_loss_in_buckets_and_its_gradients_are_the_whole_batchs() {
        let policy = policy();
        let owned = transcripts(&LENGTHS);
        let all: Vec<&Transcript> = owned.iter().collect();
        let whole = Padded::<A>::new(&all, 0, &Default::default());
        let logprobs = policy.scored_logprobs(whole.tokens, &whole.scored, 1.0);
        let want = (logprobs * whole.mask.clone()).sum().neg() / whole.mask.sum();
        let got = nll(&policy, &all, 0).unwrap();
        close(&flat(got.clone()), &flat(want.clone()), "loss");
        let (got, want) = (got.backward(), want.backward());
        let head = &policy.head.as_ref().unwrap().weight;
        for (name, param) in [("embedding", &policy.embed.weight), ("head", head)] {
            let gradient = |grads| flat(param.val().grad(grads).unwrap());
            close(&gradient(&got), &gradient(&want), name);
        }
        assert!(nll(&policy, &[], 0).is_none());
    }

    fn cost(widths: &[usize], ranges: &[Range<usize>], bucket: usize) -> usize {
        ranges
            .iter()
            .map(|r| r.len() * widths[r.end - 1] + bucket)
            .sum()
    }

    /// Every way to cut `n` items into contiguous ranges.
    fn every_cut(n: usize) -> Vec<Vec<Range<usize>>> {
        (0..1usize << n.saturating_sub(1))
            .map(|mask| {
                let mut ranges = Vec::new();
                let mut start = 0;
                for i in 1..n {
                    if mask & (1 << (i - 1)) != 0 {
                        ranges.push(start..i);
                        start = i;
                    }
                }
                ranges.push(start..n);
                ranges
            })
            .collect()
    }

    #[test]
    fn the_cut_covers_every_item_once_in_order_and_costs_the_least() {
        let cases: [&[usize]; 6] = [
            &[2],
            &[5, 5, 5, 5],
            &[60, 70, 80, 650, 700, 720],
            &[2, 3, 40, 41, 300, 301, 302, 900],
            &[100, 101, 102, 103, 104, 105, 106, 107],
            &[10, 200, 400, 600, 800, 1000, 1200, 1400, 1600],
        ];
        for widths in cases {
            for bucket in [0, 128, 10_000] {
                let ranges = cut_sorted(widths, bucket);
                let flat: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
                assert_eq!(flat, (0..widths.len()).collect::<Vec<_>>(), "{widths:?}");
                assert!(ranges.iter().all(|r| !r.is_empty()));
                let least = every_cut(widths.len())
                    .iter()
                    .map(|cut| cost(widths, cut, bucket))
                    .min()
                    .unwrap();
                assert_eq!(
                    cost(widths, &ranges, bucket),
                    least,
                    "{widths:?} at {bucket}"
                );
            }
        }
        assert!(cut_sorted(&[], 128).is_empty());
        // Short and long transcripts apart; near-equal ones together; one bucket when a pass
        // costs more than any padding.
        assert_eq!(
            cut_sorted(&[60, 70, 80, 650, 700, 720], 128),
            vec![0..3, 3..6]
        );
        assert_eq!(cut_sorted(&[100, 101, 102, 103], 128), vec![0..4]);
        assert_eq!(cut_sorted(&[2, 900], 10_000), vec![0..2]);
    }
}
