//! Continuous batching at the token level, for serving: sequences join a running batch between
//! two decode steps and leave the step they finish, each with its own sampling settings and its
//! own random stream.
//!
//! [`generate`](super::generate) serves a batch known in advance, with one setting for all.
//! A server instead gets requests while others are being answered; making a new request wait
//! for the whole batch would cost it the longest neighbour's time. Here a joining sequence is
//! prefilled on its own, then its keys and values are merged into the batch's cache
//! (right-aligned, the shorter side left-padded and masked), and from the next step on it is
//! decoded with the others. Each row samples from its own logits with its own [`Sampling`] and
//! RNG, so what a row generates does not depend on its neighbours (up to floating-point
//! rounding in the shared products): a seeded request gets the same answer alone or under load.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rand::Rng;

use super::generate::{
    End, Sampling, feed, host, last_logits, normalizer, prefill_chunk, retain_rows, sample,
};
use super::kernels::Kernels;
use super::transformer::{LayerCache, Policy};

/// A sequence to generate.
#[derive(Clone, Debug)]
pub struct Request<K, R> {
    /// The caller's name for it, returned with each of its tokens.
    pub key: K,
    /// The prompt (non-empty, shorter than the policy's context).
    pub prompt: Vec<u32>,
    /// How to sample it.
    pub sampling: Sampling,
    /// Its randomness.
    pub rng: R,
    /// How many of the most likely alternatives to report with each token (0 for none).
    pub top_logprobs: usize,
}

/// One token a sequence generated.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled<K> {
    /// The sequence's key.
    pub key: K,
    /// The token.
    pub token: u32,
    /// Its log-probability, as [`Generation::logprobs`](super::Generation::logprobs) records
    /// it (tempered, untruncated).
    pub logprob: f32,
    /// The most likely tokens under the same distribution, most likely first (ties by the
    /// lower id), as many as the request asked for.
    pub top: Vec<(u32, f32)>,
    /// Set on the sequence's last token: why it ended. The sequence has left the batch.
    pub end: Option<End>,
}

/// A sequence in the batch.
struct Row<K, R> {
    key: K,
    prompt_len: usize,
    generated: Vec<u32>,
    sampling: Sampling,
    rng: R,
    top_logprobs: usize,
}

/// Sequences being decoded together over one KV cache; see the module docs.
pub struct ContinuousBatch<'p, B: Kernels, K, R> {
    policy: &'p Policy<B>,
    /// Per block, the keys and values of every row, right-aligned.
    caches: Vec<LayerCache<B>>,
    /// Per row, the leading cache columns that are padding.
    pads: Vec<usize>,
    /// The rows, in cache order; each has sampled a token not yet fed.
    rows: Vec<Row<K, R>>,
}

impl<'p, B: Kernels, K: Clone + PartialEq, R: Rng> ContinuousBatch<'p, B, K, R> {
    /// An empty batch decoding with `policy` (use an inference backend).
    pub fn new(policy: &'p Policy<B>) -> Self {
        ContinuousBatch {
            policy,
            caches: Vec::new(),
            pads: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// Sequences being decoded.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no sequence is being decoded.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Prefills `requests` together and samples their first tokens; those that go on join the
    /// batch. A request whose prompt is empty or fills the context, or that may generate
    /// nothing, ends at once with an empty generation (its key is not returned).
    pub fn admit(&mut self, requests: Vec<Request<K, R>>) -> Vec<Sampled<K>> {
        let context = self.policy.context;
        let mut rows: Vec<Row<K, R>> = Vec::with_capacity(requests.len());
        let mut prompts = Vec::with_capacity(requests.len());
        for request in requests {
            let len = request.prompt.len();
            if len == 0 || len >= context || request.sampling.max_new_tokens == 0 {
                continue;
            }
            prompts.push(request.prompt);
            rows.push(Row {
                key: request.key,
                prompt_len: len,
                generated: Vec::new(),
                sampling: request.sampling,
                rng: request.rng,
                top_logprobs: request.top_logprobs,
            });
        }
        if rows.is_empty() {
            return Vec::new();
        }
        let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let mut pads: Vec<usize> = prompts.iter().map(|p| width - p.len()).collect();
        let slices: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
        let (tokens, pos) = prefill_chunk(self.policy, &slices, width, &pads);
        let mut caches = vec![LayerCache::<B>::with_capacity(width); self.policy.blocks.len()];
        let hidden = self.policy.hidden_with(tokens, &pos, Some(&mut caches));
        let logits = last_logits(self.policy, hidden);
        let (out, keep) = sample_rows(&mut rows, logits, context);
        if keep.is_empty() {
            return out;
        }
        if keep.len() < rows.len() {
            retain_rows(&mut caches, &mut pads, &keep, &self.policy.device());
            rows = keep_rows(rows, &keep);
        }
        // Room for every row's remaining tokens, so no step reallocates.
        let joined_width = caches[0]
            .len()
            .max(self.caches.first().map_or(0, |c| c.len()));
        let capacity = joined_width
            + self
                .rows
                .iter()
                .chain(&rows)
                .map(remaining)
                .max()
                .unwrap_or(0);
        if self.caches.is_empty() {
            self.caches = vec![LayerCache::<B>::with_capacity(capacity); caches.len()];
        }
        let mut gained = (0, 0);
        for (batch, joining) in self.caches.iter_mut().zip(caches) {
            gained = batch.join(joining, capacity);
        }
        self.pads.iter_mut().for_each(|p| *p += gained.0);
        self.pads.extend(pads.into_iter().map(|p| p + gained.1));
        self.rows.extend(rows);
        out
    }

    /// Feeds every row its last token and samples the next; rows that end leave the batch.
    pub fn step(&mut self) -> Vec<Sampled<K>> {
        if self.rows.is_empty() {
            return Vec::new();
        }
        let (last, positions): (Vec<u32>, Vec<usize>) = self
            .rows
            .iter()
            .map(|row| {
                let last = *row.generated.last().expect("a row has sampled a token");
                (last, row.prompt_len + row.generated.len() - 1)
            })
            .unzip();
        let logits = feed(self.policy, &last, &positions, &self.pads, &mut self.caches);
        let (out, keep) = sample_rows(&mut self.rows, logits, self.policy.context);
        self.retain(&keep);
        out
    }

    /// Ends the sequence `key` now (a cancelled request, or one its caller saw end, e.g. at a
    /// stop string); unknown keys are ignored.
    pub fn remove(&mut self, key: &K) {
        let keep: Vec<usize> = (0..self.rows.len())
            .filter(|&r| &self.rows[r].key != key)
            .collect();
        self.retain(&keep);
    }

    /// Keeps the rows at positions `keep`.
    fn retain(&mut self, keep: &[usize]) {
        if keep.len() == self.rows.len() {
            return;
        }
        if keep.is_empty() {
            // Nothing to select from: start over with no rows and no buffers.
            self.caches.clear();
            self.pads.clear();
            self.rows.clear();
            return;
        }
        retain_rows(
            &mut self.caches,
            &mut self.pads,
            keep,
            &self.policy.device(),
        );
        self.rows = keep_rows(std::mem::take(&mut self.rows), keep);
    }
}

/// Tokens row `row` may still generate.
fn remaining<K, R>(row: &Row<K, R>) -> usize {
    row.sampling
        .max_new_tokens
        .saturating_sub(row.generated.len())
}

/// The rows at positions `keep`, in that order.
fn keep_rows<K, R>(rows: Vec<Row<K, R>>, keep: &[usize]) -> Vec<Row<K, R>> {
    let mut rows: Vec<Option<Row<K, R>>> = rows.into_iter().map(Some).collect();
    keep.iter()
        .map(|&r| rows[r].take().expect("each row kept once"))
        .collect()
}

/// Samples each row's next token from its logits (`[rows, vocab]`); returns the tokens and the
/// positions of the rows that go on.
fn sample_rows<B: Backend, K: Clone, R: Rng>(
    rows: &mut [Row<K, R>],
    logits: Tensor<B, 2>,
    context: usize,
) -> (Vec<Sampled<K>>, Vec<usize>) {
    let vocab = logits.dims()[1];
    let logits = host(logits);
    let mut out = Vec::with_capacity(rows.len());
    let mut keep = Vec::with_capacity(rows.len());
    for (r, row) in rows.iter_mut().enumerate() {
        let logits = &logits[r * vocab..(r + 1) * vocab];
        let (token, logprob) = sample(logits, &row.sampling, &mut row.rng);
        row.generated.push(token);
        let end = row.sampling.end(&row.generated, row.prompt_len, context);
        if end.is_none() {
            keep.push(r);
        }
        let top = most_likely(logits, row.sampling.scoring_temperature(), row.top_logprobs);
        out.push(Sampled {
            key: row.key.clone(),
            token,
            logprob,
            top,
            end,
        });
    }
    (out, keep)
}

/// The `k` most likely tokens and their log-probabilities at `temperature`, most likely first
/// (ties by the lower id).
pub(super) fn most_likely(logits: &[f32], temperature: f64, k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    let k = k.min(logits.len());
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let most_likely = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    order.select_nth_unstable_by(k - 1, most_likely);
    order.truncate(k);
    order.sort_by(most_likely);
    let (max, log_z) = normalizer(logits, temperature);
    order
        .into_iter()
        .map(|i| {
            (
                i as u32,
                ((logits[i] as f64 - max) / temperature - log_z) as f32,
            )
        })
        .collect()
}
