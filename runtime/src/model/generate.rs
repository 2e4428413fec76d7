//! Batched sampling, with a KV cache and without one.
//!
//! Prompts of different lengths are left-padded into one batch; a key mask hides the pads and
//! each row has its own position ids, so a row's tokens get exactly the logits they would get
//! alone. The prompts are prefilled once, then every unfinished row advances one token per
//! step, reusing the cached keys and values. Finished rows leave the batch.
//!
//! [`generate_uncached`] recomputes the whole sequence at every step instead: the reference
//! the cache is tested against, and the baseline `bench_policy` measures it against. Both share
//! the per-token bookkeeping ([`Decoder`]), so they differ only in how the logits are computed.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use std::ops::Deref;

use rand::Rng;

use super::kernels::{AttentionMask, Kernels};
use super::transformer::{LayerCache, Policy, Positions};

/// How to sample.
///
/// The filters apply in the usual order (Hugging Face's and vLLM's): temperature, then top-k,
/// then top-p over what top-k kept. They only decide which tokens may be drawn; the recorded
/// log-probability is always the tempered, untruncated one (see [`Generation::logprobs`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Sampling {
    /// Softmax temperature (> 0); ignored when `greedy`.
    pub temperature: f32,
    /// Nucleus sampling: sample among the most likely tokens whose probabilities sum to at
    /// least `top_p` of the mass top-k kept; `1.0` disables it.
    pub top_p: f32,
    /// Sample among the `k` most likely tokens only (ties broken by the lower id); `None`, or
    /// a `k` of at least the vocabulary, disables it. `Some(1)` picks what greedy picks.
    pub top_k: Option<usize>,
    /// Most tokens generated per sequence.
    pub max_new_tokens: usize,
    /// Tokens that end a sequence (kept as its last token).
    pub stop: Vec<u32>,
    /// Token sequences that end a sequence as soon as the generated tokens end with one (kept
    /// as its last tokens). Only generated tokens are matched, never the prompt; empty
    /// sequences are ignored.
    pub stop_sequences: Vec<Vec<u32>>,
    /// Take the most likely token instead of sampling.
    pub greedy: bool,
}

impl Default for Sampling {
    /// Plain sampling at temperature 1 from the whole vocabulary, 64 new tokens, no stops.
    fn default() -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 64,
            stop: Vec::new(),
            stop_sequences: Vec::new(),
            greedy: false,
        }
    }
}

impl Sampling {
    /// These settings decoding greedily. Greedy decoding reads neither temperature nor top-p
    /// nor top-k, so they take their neutral values (1, 1, none): the record of a greedy
    /// evaluation then says nothing of how the run samples elsewhere, and runs that differ only
    /// there write the same records (and share a warm-up, see `crate::shared_warmup`).
    pub fn into_greedy(self) -> Self {
        Sampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            greedy: true,
            ..self
        }
    }

    /// These settings as an evaluation decodes: [`Sampling::into_greedy`] when `greedy`,
    /// unchanged otherwise.
    pub fn greedy_if(self, greedy: bool) -> Self {
        if greedy { self.into_greedy() } else { self }
    }

    /// The temperature the recorded log-probabilities are under (greedy records
    /// temperature 1, see [`Generation::logprobs`]).
    pub fn scoring_temperature(&self) -> f64 {
        if self.greedy {
            1.0
        } else {
            f64::from(self.temperature)
        }
    }
}

/// Why a sequence stopped generating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// It generated a stop token or a stop sequence.
    Stop,
    /// It reached `max_new_tokens` or the context.
    Length,
}

impl Sampling {
    /// Whether a sequence whose prompt has `prompt_len` tokens ends after generating
    /// `generated`, and why (a stop wins when both apply).
    pub fn end(&self, generated: &[u32], prompt_len: usize, context: usize) -> Option<End> {
        let last = generated.last()?;
        if self.stop.contains(last)
            || self
                .stop_sequences
                .iter()
                .any(|s| !s.is_empty() && generated.ends_with(s))
        {
            Some(End::Stop)
        } else if generated.len() >= self.max_new_tokens || prompt_len + generated.len() >= context
        {
            Some(End::Length)
        } else {
            None
        }
    }
}

/// One sampled continuation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Generation {
    /// The generated tokens, ending with the stop token or stop sequence when one was hit.
    pub tokens: Vec<u32>,
    /// For each token, its log-probability under the policy's tempered distribution
    /// (`log_softmax(logits / temperature)`), the behaviour log-probability the loss's ratio is
    /// taken against. Top-k and top-p decide which tokens may be drawn but do not renormalize
    /// this value: the trainer recomputes exactly this quantity
    /// ([`Policy::scored_logprobs`] at the same temperature), so a fresh token's ratio is 1,
    /// and a renormalized value could not be recomputed differentiably (the kept set is not a
    /// smooth function of the weights). With temperature 1 it equals
    /// [`Policy::token_logprobs`]. Greedy decoding records the temperature-1 log-probability.
    pub logprobs: Vec<f32>,
    /// Where the generation went on with newer weights ([`generate_switching`]): the index of
    /// the first token each newer policy sampled, in order. Empty for one policy throughout.
    pub switches: Vec<usize>,
}

/// Samples one continuation per prompt, all in one batch, with a KV cache.
///
/// Each sequence stops at a stop token or stop sequence, after `max_new_tokens`, or when prompt
/// plus generation reach the policy's context. Empty prompts and prompts already at the
/// context get empty generations. Sampling happens on the CPU from the last position's logits,
/// with `rng` as the only randomness, so equal seeds give equal generations.
///
/// Use an inference backend (for an autodiff policy, pass `policy.valid()`), or the whole
/// generation is recorded for backpropagation.
///
/// Runs on a thread of rayon's pool (the caller waits): each of a decode step's several
/// hundred parallel operations then starts on a thread that is already awake and takes part
/// in it, instead of waking the pool and putting the caller to sleep. On two threads,
/// SmolLM2's decode step with Q4_1 blocks took 26.6 ms this way against 28.7 at batch 4 (three
/// alternating runs) and 70.5 against 74.0 at batch 16 (two). [`generate_switching`] stays on
/// the caller's thread: its `newer` need not be `Send`.
pub fn generate<B: Kernels>(
    policy: &Policy<B>,
    prompts: &[Vec<u32>],
    sampling: &Sampling,
    rng: &mut (impl Rng + Send),
) -> Vec<Generation> {
    rayon::scope(|_| decode(policy, prompts, None, sampling, rng, None))
}

/// Like [`generate`], but asks `newer` between decode steps for newer weights, and goes on
/// with them as soon as it gets some (partial rollouts, `pool { interrupt = token }`): every
/// unfinished sequence is prefilled again under the new policy (prompt and tokens so far) and
/// its next token sampled from it. Each token's log-probability is the one of the policy that
/// sampled it; [`Generation::switches`] says where each newer policy took over.
pub fn generate_switching<B: Kernels, P: Deref<Target = Policy<B>>>(
    policy: P,
    newer: &mut dyn FnMut() -> Option<P>,
    prompts: &[Vec<u32>],
    sampling: &Sampling,
    rng: &mut impl Rng,
) -> Vec<Generation> {
    decode(policy, prompts, None, sampling, rng, Some(newer))
}

/// A sequence's keys and values, kept from the generation that produced them so that a
/// continuation of the sequence (the next turn of a conversation) prefills only its new
/// tokens: per block, `[1, len, kv_heads, head_dim]`.
///
/// Keys and values depend on the weights: keep them only for the policy that computed them.
#[derive(Clone, Debug)]
pub struct KeptCache<B: Backend> {
    /// The tokens the keys and values are of.
    tokens: Vec<u32>,
    /// Per block, keys and values.
    layers: Vec<(Tensor<B, 4>, Tensor<B, 4>)>,
}

impl<B: Backend> KeptCache<B> {
    /// Tokens covered.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether no token is covered.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Bytes the keys and values take.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|(k, v)| (k.shape().num_elements() + v.shape().num_elements()) * 4)
            .sum()
    }

    /// How many leading tokens of `prompt` this covers: the prefix the two share (a token's
    /// key and value depend only on the tokens up to it).
    fn reusable_for(&self, prompt: &[u32]) -> usize {
        self.tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count()
    }
}

/// [`generate`] that reuses and keeps each sequence's keys and values across calls: `kept[i]`
/// holds, on entry, what an earlier call kept for a sequence that `prompts[i]` may continue
/// (the tokens it shares with the prompt's start are not computed again) and, on return, the
/// keys and values of `prompts[i]` and its generation (all but the last token, which was never
/// fed), or `None` for a prompt that generated nothing.
///
/// The result is [`generate`]'s, up to floating-point rounding: the prompts' new tokens are
/// prefilled as one chunk against the kept prefixes, at the positions and under the mask a
/// whole prefill would use.
pub fn generate_kept<B: Kernels>(
    policy: &Policy<B>,
    prompts: &[Vec<u32>],
    kept: &mut [Option<KeptCache<B>>],
    sampling: &Sampling,
    rng: &mut (impl Rng + Send),
) -> Vec<Generation> {
    assert_eq!(kept.len(), prompts.len(), "one kept cache slot per prompt");
    // On a pool thread, as `generate` runs.
    rayon::scope(|_| decode(policy, prompts, Some(kept), sampling, rng, None))
}

/// [`generate`], [`generate_kept`] and [`generate_switching`]: prefill, then one token per
/// unfinished row per step (with `newer`'s weights once it has some; never with `kept`, whose
/// keys and values must come from one policy).
fn decode<B: Kernels, P: Deref<Target = Policy<B>>>(
    mut policy: P,
    prompts: &[Vec<u32>],
    mut kept: Option<&mut [Option<KeptCache<B>>]>,
    sampling: &Sampling,
    rng: &mut impl Rng,
    mut newer: Option<&mut dyn FnMut() -> Option<P>>,
) -> Vec<Generation> {
    debug_assert!(
        kept.is_none() || newer.is_none(),
        "kept caches hold one policy's keys"
    );
    let mut decoder = Decoder::new(prompts, sampling, policy.context);
    if let Some(kept) = kept.as_deref_mut() {
        for (i, slot) in kept.iter_mut().enumerate() {
            if !decoder.rows.contains(&i) {
                *slot = None;
            }
        }
    }
    if decoder.rows.is_empty() {
        return decoder.out;
    }
    let device = policy.device();
    // Room for every token a row may add (at most the context).
    let room = sampling.max_new_tokens.min(policy.context);
    let (mut caches, mut pads, mut logits) = {
        let rows: Vec<&[u32]> = decoder
            .rows
            .iter()
            .map(|&i| prompts[i].as_slice())
            .collect();
        let held: Vec<Option<&KeptCache<B>>> = match kept.as_deref() {
            Some(kept) => decoder.rows.iter().map(|&i| kept[i].as_ref()).collect(),
            None => vec![None; rows.len()],
        };
        prefill(&policy, &rows, &held, room)
    };

    loop {
        let keep = decoder.advance(&host(logits), policy.vocab, rng);
        if let Some(kept) = kept.as_deref_mut() {
            keep_finished(&decoder, &keep, &caches, &pads, kept);
        }
        if keep.is_empty() {
            return decoder.out;
        }
        // Drop finished rows from the batch and the cache, and cache columns that are padding
        // for every remaining row.
        if keep.len() < decoder.rows.len() {
            decoder.retain(&keep);
            retain_rows(&mut caches, &mut pads, &keep, &device);
        }
        // Newer weights: the rows go on from their tokens so far, prefilled under them.
        if let Some(next) = newer.as_deref_mut().and_then(|newer| newer()) {
            policy = next;
            let sequences: Vec<Vec<u32>> = decoder
                .rows
                .iter()
                .map(|&i| {
                    let out = &mut decoder.out[i];
                    out.switches.push(out.tokens.len());
                    [prompts[i].as_slice(), &out.tokens].concat()
                })
                .collect();
            let room = sampling.max_new_tokens - decoder.out[decoder.rows[0]].tokens.len();
            let rows: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
            (caches, pads, logits) = prefill(&policy, &rows, &vec![None; rows.len()], room);
            continue;
        }
        // Feed the new tokens.
        let (last, positions): (Vec<u32>, Vec<usize>) = decoder
            .rows
            .iter()
            .map(|&i| {
                let tokens = &decoder.out[i].tokens;
                let last = *tokens.last().expect("sampled");
                (last, prompts[i].len() + tokens.len() - 1)
            })
            .unzip();
        logits = feed(&policy, &last, &positions, &pads, &mut caches);
    }
}

/// `rows` prefilled into one left-padded batch with room for `room` more tokens each: the
/// blocks' caches, each row's padding and the logits of every row's next token. A row with a
/// kept cache (`held[r]`) takes the keys and values of its kept prefix from it and computes
/// only the rest (at least its last token, for its logits).
fn prefill<B: Kernels>(
    policy: &Policy<B>,
    rows: &[&[u32]],
    held: &[Option<&KeptCache<B>>],
    room: usize,
) -> (Vec<LayerCache<B>>, Vec<usize>, Tensor<B, 2>) {
    let device = policy.device();
    let lens: Vec<usize> = rows.iter().map(|row| row.len()).collect();
    let width = lens.iter().copied().max().unwrap_or(0);
    // Tokens of each row already in its kept cache (at least one is left to compute, for the
    // logits of the first new token).
    let reused: Vec<usize> = rows
        .iter()
        .zip(held)
        .map(|(row, kept)| kept.map_or(0, |c| c.reusable_for(row)).min(row.len() - 1))
        .collect();
    // The prefill chunk: the last `chunk` tokens of every row, so every row's new tokens are
    // in it (a row with a longer kept prefix recomputes a few it had). Left-padded as a whole
    // prefill is: row `r`'s tokens end at column `width`, its first at `pads[r]`.
    let chunk = lens
        .iter()
        .zip(&reused)
        .map(|(len, reused)| len - reused)
        .max()
        .unwrap_or(width);
    let pads: Vec<usize> = lens.iter().map(|&len| width - len).collect();
    let (tokens, pos) = prefill_chunk(policy, rows, chunk, &pads);
    let mut caches = vec![LayerCache::<B>::with_capacity(width + room); policy.blocks.len()];
    if chunk < width {
        let before = width - chunk;
        for (l, cache) in caches.iter_mut().enumerate() {
            // Some row reuses a prefix (or the chunk would be the whole width): its shape.
            let [_, _, kvh, hd] = held
                .iter()
                .find_map(|kept| kept.map(|c| c.layers[l].0.dims()))
                .expect("a row reuses a kept prefix");
            let blank = |columns: usize| Tensor::<B, 4>::zeros([1, columns, kvh, hd], &device);
            let (k, v): (Vec<_>, Vec<_>) = held
                .iter()
                .enumerate()
                .map(|(r, kept)| {
                    // Row `r`'s columns before the chunk: padding, then its first tokens.
                    let known = before.saturating_sub(pads[r]);
                    // No zero-width blank: not every backend allocates empty buffers.
                    let row = |t: &Tensor<B, 4>| {
                        let tokens = t.clone().narrow(1, 0, known);
                        match before - known {
                            0 => tokens,
                            pad => Tensor::cat(vec![blank(pad), tokens], 1),
                        }
                    };
                    match kept {
                        Some(c) if known > 0 => (row(&c.layers[l].0), row(&c.layers[l].1)),
                        _ => (blank(before), blank(before)),
                    }
                })
                .unzip();
            cache.prefill_with(Tensor::cat(k, 0), Tensor::cat(v, 0));
        }
    }
    let hidden = policy.hidden_with(tokens, &pos, Some(&mut caches));
    (caches, pads, last_logits(policy, hidden))
}

/// Keeps the batch rows at positions `keep` (in that order) in every block's cache and in
/// `pads`, and drops the cache columns that are padding for every remaining row.
pub(super) fn retain_rows<B: Kernels>(
    caches: &mut [LayerCache<B>],
    pads: &mut Vec<usize>,
    keep: &[usize],
    device: &B::Device,
) {
    *pads = keep.iter().map(|&r| pads[r]).collect();
    let idx = Tensor::<B, 1, Int>::from_data(
        TensorData::new(keep.iter().map(|&r| r as i64).collect(), [keep.len()]),
        device,
    );
    let trim = pads.iter().copied().min().unwrap_or(0);
    for cache in caches.iter_mut() {
        cache.retain(&idx, trim);
    }
    pads.iter_mut().for_each(|p| *p -= trim);
}

/// One decode step: feeds each row's last sampled token (`last[r]`, at position
/// `positions[r]`) through the cached batch and returns the next logits, `[rows, vocab]`.
pub(super) fn feed<B: Kernels>(
    policy: &Policy<B>,
    last: &[u32],
    positions: &[usize],
    pads: &[usize],
    caches: &mut [LayerCache<B>],
) -> Tensor<B, 2> {
    let device = policy.device();
    let ids = last.iter().map(|&t| t as i64).collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [last.len(), 1]), &device);
    let pos = Positions::new(positions, &policy.rope, padded(pads, false), &device);
    let hidden = policy.hidden_with(tokens, &pos, Some(caches));
    last_logits(policy, hidden)
}

/// The last `chunk` tokens of each prompt, left-padded into `[prompts, chunk]` ids, with their
/// positions and the mask of a batch whose row `r` starts at column `pads[r]` of the whole
/// (unchunked) prefill.
pub(super) fn prefill_chunk<B: Kernels>(
    policy: &Policy<B>,
    prompts: &[&[u32]],
    chunk: usize,
    pads: &[usize],
) -> (Tensor<B, 2, Int>, Positions<B>) {
    let device = policy.device();
    let n = prompts.len();
    let mut ids = Vec::with_capacity(n * chunk);
    let mut positions = Vec::with_capacity(n * chunk);
    for prompt in prompts {
        let len = prompt.len();
        let blank = chunk.saturating_sub(len);
        ids.extend(std::iter::repeat_n(0i64, blank));
        ids.extend(prompt[len + blank - chunk..].iter().map(|&t| t as i64));
        positions.extend((0..chunk).map(|j| (len + j).saturating_sub(chunk)));
    }
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [n, chunk]), &device);
    let pos = Positions::new(&positions, &policy.rope, padded(pads, true), &device);
    (tokens, pos)
}

/// Keeps the keys and values of the rows that just finished (batch positions not in `going`):
/// the prompt and every generated token but the last, copied out of the batch's buffers.
fn keep_finished<B: Kernels>(
    decoder: &Decoder<'_>,
    going: &[usize],
    caches: &[LayerCache<B>],
    pads: &[usize],
    kept: &mut [Option<KeptCache<B>>],
) {
    for (r, &i) in decoder.rows.iter().enumerate() {
        if going.contains(&r) {
            continue;
        }
        let generated = &decoder.out[i].tokens;
        let mut tokens = decoder.prompts[i].clone();
        tokens.extend_from_slice(&generated[..generated.len() - 1]);
        let layers = caches
            .iter()
            .map(|cache| cache.row(r, pads[r], tokens.len()))
            .collect();
        kept[i] = Some(KeptCache { tokens, layers });
    }
}

/// The mask of a left-padded batch: row `r`'s first `pads[r]` keys hidden.
pub(super) fn padded(pads: &[usize], causal: bool) -> AttentionMask {
    AttentionMask {
        causal,
        key_start: pads.iter().any(|&p| p > 0).then(|| pads.into()),
        kv_len: None,
    }
}

/// Like [`generate`], but without a KV cache: every step runs the whole prompt and everything
/// generated so far through the policy again (right-padded, so each row's positions start at
/// 0) and samples from each row's last real position.
///
/// Same arguments, same stopping rules, same draws from `rng`: it returns what [`generate`]
/// returns, up to floating-point rounding. It exists as the reference the cache is tested
/// against and the baseline the cache is benchmarked against; each step costs a full forward
/// pass over the sequence, so do not use it to train.
pub fn generate_uncached<B: Kernels>(
    policy: &Policy<B>,
    prompts: &[Vec<u32>],
    sampling: &Sampling,
    rng: &mut impl Rng,
) -> Vec<Generation> {
    let mut decoder = Decoder::new(prompts, sampling, policy.context);
    let device = policy.device();
    loop {
        let rows = &decoder.rows;
        if rows.is_empty() {
            return decoder.out;
        }
        let lengths: Vec<usize> = rows
            .iter()
            .map(|&i| prompts[i].len() + decoder.out[i].tokens.len())
            .collect();
        let (n, width) = (rows.len(), lengths.iter().copied().max().unwrap_or(1));
        let mut ids = Vec::with_capacity(n * width);
        for (&i, &len) in rows.iter().zip(&lengths) {
            ids.extend(
                prompts[i]
                    .iter()
                    .chain(&decoder.out[i].tokens)
                    .map(|&t| t as i64),
            );
            ids.extend(std::iter::repeat_n(0i64, width - len));
        }
        let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [n, width]), &device);
        let hidden = policy.hidden_states(tokens);
        let d = hidden.dims()[2];
        let last: Vec<i64> = lengths
            .iter()
            .enumerate()
            .map(|(r, &len)| (r * width + len - 1) as i64)
            .collect();
        let last = Tensor::<B, 1, Int>::from_data(TensorData::new(last, [n]), &device);
        let hidden = hidden
            .reshape([n * width, d])
            .select(0, last)
            .reshape([n, 1, d]);
        let logits = policy.logits(hidden).reshape([n, policy.vocab]);
        let keep = decoder.advance(&host(logits), policy.vocab, rng);
        decoder.retain(&keep);
    }
}

/// The per-token bookkeeping of both samplers: which prompts are still generating, what each
/// has produced, and whether a row is finished.
struct Decoder<'a> {
    prompts: &'a [Vec<u32>],
    sampling: &'a Sampling,
    context: usize,
    /// One generation per prompt, in prompt order.
    out: Vec<Generation>,
    /// Prompt indices of the rows still generating, in batch order.
    rows: Vec<usize>,
}

impl<'a> Decoder<'a> {
    fn new(prompts: &'a [Vec<u32>], sampling: &'a Sampling, context: usize) -> Self {
        let rows = if sampling.max_new_tokens == 0 {
            Vec::new()
        } else {
            (0..prompts.len())
                .filter(|&i| !prompts[i].is_empty() && prompts[i].len() < context)
                .collect()
        };
        Decoder {
            prompts,
            sampling,
            context,
            out: vec![Generation::default(); prompts.len()],
            rows,
        }
    }

    /// Samples one token for every row from `logits` (`[rows, vocab]`, row-major) and returns
    /// the batch positions of the rows that go on.
    fn advance(&mut self, logits: &[f32], vocab: usize, rng: &mut impl Rng) -> Vec<usize> {
        let mut keep = Vec::with_capacity(self.rows.len());
        for (r, &i) in self.rows.iter().enumerate() {
            let (token, logprob) = sample(&logits[r * vocab..(r + 1) * vocab], self.sampling, rng);
            let g = &mut self.out[i];
            g.tokens.push(token);
            g.logprobs.push(logprob);
            if self
                .sampling
                .end(&g.tokens, self.prompts[i].len(), self.context)
                .is_none()
            {
                keep.push(r);
            }
        }
        keep
    }

    /// Keeps the rows at batch positions `keep`, in that order.
    fn retain(&mut self, keep: &[usize]) {
        self.rows = keep.iter().map(|&r| self.rows[r]).collect();
    }
}

/// The logits on the host, as `f32`.
pub(super) fn host<B: Backend>(logits: Tensor<B, 2>) -> Vec<f32> {
    logits
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("f32 logits")
}

/// The LM head on the last position: `[batch, vocab]`.
pub(super) fn last_logits<B: Kernels>(policy: &Policy<B>, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
    let [b, t, _] = hidden.dims();
    let last = hidden.narrow(1, t - 1, 1);
    policy.logits(last).reshape([b, policy.vocab])
}

/// The maximum of `logits` and `ln(sum(exp((x - max) / temperature)))`, in f64.
pub(super) fn normalizer(logits: &[f32], temperature: f64) -> (f64, f64) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits
        .iter()
        .map(|&x| ((x as f64 - max) / temperature).exp())
        .sum();
    (max, sum.ln())
}

/// Picks a token from one row of logits; returns it with its log-probability (see
/// [`Generation::logprobs`]).
pub(super) fn sample(logits: &[f32], sampling: &Sampling, rng: &mut impl Rng) -> (u32, f32) {
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
    let top_k = sampling.top_k.filter(|&k| k < logits.len());
    if top_k.is_some() || sampling.top_p < 1.0 {
        // Candidates from most to least likely, ties by the lower id (greedy's choice first).
        let most_likely = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
        let mut order: Vec<usize> = (0..logits.len()).collect();
        if let Some(k) = top_k {
            order.select_nth_unstable_by(k.max(1) - 1, most_likely);
            order.truncate(k.max(1));
        }
        order.sort_by(most_likely);
        // Top-p over the distribution renormalized to what top-k kept (the whole distribution
        // when top-k is off, where that mass is 1 exactly).
        let kept_mass = match top_k {
            Some(_) => order.iter().map(|&i| logp(i).exp()).sum(),
            None => 1.0,
        };
        let mut mass = 0.0;
        let mut kept = 0;
        for &i in &order {
            mass += logp(i).exp();
            kept += 1;
            if mass >= sampling.top_p as f64 * kept_mass {
                break;
            }
        }
        let candidates = &order[..kept];
        let u = rng.random::<f64>() * mass;
        let mut acc = 0.0;
        let mut choice = candidates[kept - 1];
        for &i in candidates {
            acc += logp(i).exp();
            if u < acc {
                choice = i;
                break;
            }
        }
        // The log-probability under the full tempered distribution, which is what the trainer
        // recomputes; renormalizing over the candidates would make fresh ratios differ from 1.
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
            top_p,
            max_new_tokens: 1,
            greedy,
            ..Sampling::default()
        }
    }

    fn counts(logits: &[f32], sampling: &Sampling, draws: usize, seed: u64) -> Vec<usize> {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut counts = vec![0; logits.len()];
        for _ in 0..draws {
            counts[sample(logits, sampling, &mut rng).0 as usize] += 1;
        }
        counts
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

    #[test]
    fn top_k_draws_only_the_k_most_likely_with_full_logprobs() {
        let logits = [1.0f32, 3.0, 2.5, -1.0, 2.9];
        let sampling = Sampling {
            top_k: Some(2),
            temperature: 0.8,
            ..cfg(false, 1.0)
        };
        let counts = counts(&logits, &sampling, 4000, 2);
        assert_eq!((counts[0], counts[2], counts[3]), (0, 0, 0), "{counts:?}");
        // Renormalized over the two kept tokens: p(1) / p(4) = exp(0.1 / 0.8).
        let ratio = counts[1] as f64 / counts[4] as f64;
        assert!((ratio - (0.1f64 / 0.8).exp()).abs() < 0.1, "{ratio}");
        // The recorded value is the tempered, untruncated log-probability.
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let (t, lp) = sample(&logits, &sampling, &mut rng);
        let (max, log_z) = normalizer(&logits, 0.8);
        let expected = (logits[t as usize] as f64 - max) / 0.8 - log_z;
        assert!((f64::from(lp) - expected).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy_and_ties_go_to_the_lower_id() {
        let logits = [0.5f32, 2.0, 2.0, 1.0];
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let greedy = sample(&logits, &cfg(true, 1.0), &mut rng);
        let one = Sampling {
            top_k: Some(1),
            ..cfg(false, 1.0)
        };
        for _ in 0..20 {
            assert_eq!(sample(&logits, &one, &mut rng), greedy);
        }
        // A k of at least the vocabulary samples from everything.
        let all = Sampling {
            top_k: Some(4),
            ..cfg(false, 1.0)
        };
        assert!(counts(&logits, &all, 2000, 1).iter().all(|&c| c > 0));
    }

    #[test]
    fn top_p_applies_to_what_top_k_kept() {
        // Probabilities 0.4, 0.3, 0.2, 0.1.
        let logits = [4.0f32.ln(), 3.0f32.ln(), 2.0f32.ln(), 1.0f32.ln()];
        // Alone, top-p 0.75 needs three tokens (0.4 + 0.3 < 0.75).
        let nucleus = counts(&logits, &cfg(false, 0.75), 3000, 4);
        assert!(nucleus[2] > 0 && nucleus[3] == 0, "{nucleus:?}");
        // After top-k 3 the kept mass is 0.9, and (0.4 + 0.3) / 0.9 >= 0.75: two tokens.
        let both = Sampling {
            top_k: Some(3),
            ..cfg(false, 0.75)
        };
        let both = counts(&logits, &both, 3000, 4);
        assert!(
            both[0] > 0 && both[1] > 0 && both[2] == 0 && both[3] == 0,
            "{both:?}"
        );
    }
}
