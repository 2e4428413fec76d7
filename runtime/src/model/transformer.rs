//! The transformer itself: configuration, modules and the forward passes.

use std::sync::Arc;

use agentry_dsl::spec::TransformerArch;
use burn::module::{Initializer, Module};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::kernels::{self, AttentionMask, HeadWeight, Kernels};
use super::lora::Lora;
use super::quantized::{QuantizedBase, block_linear};
use super::recompute::{self, DropoutSeeds};
use agentry_dsl::spec::LoraTarget;

/// Base of the rotary position embedding frequencies.
pub(crate) const ROPE_THETA: f64 = 10_000.0;
/// Standard deviation of the initial weights.
const INIT_STD: f64 = 0.02;

/// The shape of a [`Policy`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyConfig {
    /// Vocabulary size (token ids are `0..vocab`).
    pub vocab: usize,
    /// Number of decoder blocks.
    pub layers: usize,
    /// Residual width; a multiple of `heads` with an even head width.
    pub d_model: usize,
    /// Attention (query) heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention); divides `heads`.
    pub kv_heads: usize,
    /// Hidden width of the SwiGLU feed-forward.
    pub ffn: usize,
    /// Longest sequence the policy handles (prompt plus generated tokens).
    pub context: usize,
    /// Whether the LM head reuses the token embedding.
    pub tie_embeddings: bool,
}

impl PolicyConfig {
    /// The configuration of an experiment file's `arch = transformer { ... }`.
    pub fn from_arch(arch: &TransformerArch, vocab: usize) -> Self {
        PolicyConfig {
            vocab,
            layers: arch.layers,
            d_model: arch.d_model,
            heads: arch.heads,
            kv_heads: arch.kv_heads,
            ffn: arch.ffn,
            context: arch.context,
            tie_embeddings: arch.tie_embeddings,
        }
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.heads.max(1)
    }

    /// Checks that the shape is buildable; the error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("vocab", self.vocab),
            ("layers", self.layers),
            ("d_model", self.d_model),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("ffn", self.ffn),
            ("context", self.context),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("policy `{name}` must be positive"));
        }
        if !self.d_model.is_multiple_of(self.heads) {
            return Err(format!(
                "d_model {} is not a multiple of heads {}",
                self.d_model, self.heads
            ));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "kv_heads {} does not divide heads {}",
                self.kv_heads, self.heads
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "head width d_model / heads = {} must be even for rotary embeddings",
                self.head_dim()
            ));
        }
        Ok(())
    }

    /// A freshly initialized policy: normal weights with std 0.02, the output projections of
    /// each block scaled by `1 / sqrt(2 * layers)`, norms at one. Seed the backend
    /// (`B::seed`) first for reproducible weights.
    ///
    /// # Panics
    ///
    /// If the configuration is invalid (see [`PolicyConfig::validate`]).
    pub fn init<B: Backend>(&self, device: &B::Device) -> Policy<B> {
        if let Err(e) = self.validate() {
            panic!("invalid policy configuration: {e}");
        }
        let normal = |std: f64| Initializer::Normal { mean: 0.0, std };
        let linear = |d_in: usize, d_out: usize, std: f64| {
            LinearConfig::new(d_in, d_out)
                .with_bias(false)
                .with_initializer(normal(std))
                .init(device)
        };
        let hd = self.head_dim();
        let out_std = INIT_STD / (2.0 * self.layers as f64).sqrt();
        let blocks = (0..self.layers)
            .map(|_| DecoderBlock {
                attn_norm: RmsNormConfig::new(self.d_model).init(device),
                q: linear(self.d_model, self.heads * hd, INIT_STD),
                k: linear(self.d_model, self.kv_heads * hd, INIT_STD),
                v: linear(self.d_model, self.kv_heads * hd, INIT_STD),
                out: linear(self.heads * hd, self.d_model, out_std),
                ffn_norm: RmsNormConfig::new(self.d_model).init(device),
                gate: linear(self.d_model, self.ffn, INIT_STD),
                up: linear(self.d_model, self.ffn, INIT_STD),
                down: linear(self.ffn, self.d_model, out_std),
                heads: self.heads,
                kv_heads: self.kv_heads,
                head_dim: hd,
            })
            .collect();
        Policy {
            embed: EmbeddingConfig::new(self.vocab, self.d_model)
                .with_initializer(normal(INIT_STD))
                .init(device),
            blocks,
            norm: RmsNormConfig::new(self.d_model).init(device),
            head: (!self.tie_embeddings).then(|| linear(self.d_model, self.vocab, INIT_STD)),
            value: None,
            lora: None,
            vocab: self.vocab,
            context: self.context,
            head_dim: hd,
            rope: Rope::new(ROPE_THETA, hd),
            recompute: false,
            quantized: None,
        }
    }
}

/// The rotary position embedding's inverse frequencies, one per rotated pair of dimensions
/// (dimension `i` is paired with `i + head_dim / 2`, the rotate-half layout).
///
/// A from-scratch policy uses `theta^(-2i / head_dim)` with theta 10 000; a Hugging Face
/// checkpoint brings its own theta and scaling ([`crate::model::hf`]), so the frequencies are
/// data, not a formula fixed in the attention code.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    inv_freq: Vec<f64>,
}

impl Rope {
    /// The standard frequencies `theta^(-2i / head_dim)` for `i < head_dim / 2`.
    pub fn new(theta: f64, head_dim: usize) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| theta.powf(-((2 * i) as f64) / head_dim as f64))
            .collect();
        Rope { inv_freq }
    }

    /// Frequencies computed elsewhere (for example with a checkpoint's scaling rule); one per
    /// pair, so `head_dim / 2` of them.
    pub fn from_inv_freq(inv_freq: Vec<f64>) -> Self {
        Rope { inv_freq }
    }

    /// The inverse frequencies.
    pub fn inv_freq(&self) -> &[f64] {
        &self.inv_freq
    }
}

/// One pre-norm decoder block: `x + attn(norm(x))`, then `x + swiglu(norm(x))`.
#[derive(Module, Debug)]
pub struct DecoderBlock<B: Backend> {
    /// Norm before attention.
    pub attn_norm: RmsNorm<B>,
    /// Query projection (`heads * head_dim` outputs).
    pub q: Linear<B>,
    /// Key projection (`kv_heads * head_dim` outputs).
    pub k: Linear<B>,
    /// Value projection (`kv_heads * head_dim` outputs).
    pub v: Linear<B>,
    /// Attention output projection.
    pub out: Linear<B>,
    /// Norm before the feed-forward.
    pub ffn_norm: RmsNorm<B>,
    /// SwiGLU gate projection.
    pub gate: Linear<B>,
    /// SwiGLU up projection.
    pub up: Linear<B>,
    /// Feed-forward down projection.
    pub down: Linear<B>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

/// Keys and values of one block for the tokens seen so far, in buffers allocated once for the
/// whole generation (`[batch, capacity, kv_heads, head_dim]`, the first `len` rows in use):
/// each step writes its rows in place instead of concatenating a new cache.
#[derive(Clone, Debug)]
pub(crate) struct LayerCache<B: Backend> {
    /// Keys and values, allocated at the first write.
    kv: Option<(Tensor<B, 4>, Tensor<B, 4>)>,
    /// Rows in use.
    len: usize,
    /// Rows each sequence may reach.
    capacity: usize,
}

impl<B: Kernels> LayerCache<B> {
    /// An empty cache for sequences of up to `capacity` tokens.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        LayerCache {
            kv: None,
            len: 0,
            capacity,
        }
    }

    /// Columns in use (the longest row's tokens, with the padding that aligns the others).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends `[batch, t, kv_heads, head_dim]` keys and values; returns the whole buffers and
    /// the rows now in use.
    fn append(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) -> (Tensor<B, 4>, Tensor<B, 4>, usize) {
        let [b, t, kvh, hd] = k.dims();
        let end = self.len + t;
        let (ck, cv) = match self.kv.take() {
            Some(kv) if kv.0.dims()[1] >= end => kv,
            // Absent, or too small (a caller that under-estimated): a larger buffer holding
            // what was there.
            previous => {
                let capacity = self.capacity.max(end);
                let device = k.device();
                let fresh = || Tensor::<B, 4>::zeros([b, capacity, kvh, hd], &device);
                let (mut ck, mut cv) = (fresh(), fresh());
                if let Some((pk, pv)) = previous.filter(|_| self.len > 0) {
                    ck = kernels::cache_write(ck, 0, pk.narrow(1, 0, self.len));
                    cv = kernels::cache_write(cv, 0, pv.narrow(1, 0, self.len));
                }
                (ck, cv)
            }
        };
        // In place on flex: the cache holds the only reference between steps.
        let ck = kernels::cache_write(ck, self.len, k);
        let cv = kernels::cache_write(cv, self.len, v);
        self.kv = Some((ck.clone(), cv.clone()));
        self.len = end;
        (ck, cv, end)
    }

    /// Starts the cache with `[batch, t, kv_heads, head_dim]` keys and values computed
    /// earlier (a kept prefix), as if a prefill of `t` tokens had written them.
    pub(crate) fn prefill_with(&mut self, k: Tensor<B, 4>, v: Tensor<B, 4>) {
        debug_assert_eq!(self.len, 0, "a prefix goes into an empty cache");
        self.append(k, v);
    }

    /// Row `row`'s keys and values at positions `start .. start + len`, copied out of the
    /// batch's buffers (`[1, len, kv_heads, head_dim]` each), so keeping them does not keep
    /// the buffers alive or stop the next step from writing them in place.
    pub(crate) fn row(&self, row: usize, start: usize, len: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = self
            .kv
            .as_ref()
            .expect("a cache holds what its prefill wrote");
        debug_assert_eq!(
            start + len,
            self.len,
            "a row's tokens end where the cache does"
        );
        let copy = |t: &Tensor<B, 4>| {
            let [_, _, kvh, hd] = t.dims();
            let out = Tensor::<B, 4>::zeros([1, len, kvh, hd], &t.device());
            kernels::cache_write(out, 0, t.clone().narrow(0, row, 1).narrow(1, start, len))
        };
        (copy(k), copy(v))
    }

    /// Appends the rows of `other` (a cache of the same block, prefilled separately) after this
    /// cache's rows. Rows are right-aligned: every row's tokens end at the last column in use,
    /// so the shorter side gains left padding; returns how many columns of padding this
    /// cache's rows and `other`'s rows gained. The buffers are reallocated for `capacity`
    /// columns (at least those in use).
    pub(crate) fn join(&mut self, other: LayerCache<B>, capacity: usize) -> (usize, usize) {
        let Some((ok, ov)) = other.kv else {
            return (0, 0);
        };
        let Some((sk, sv)) = self.kv.take() else {
            let (ok, ov) = (ok.narrow(1, 0, other.len), ov.narrow(1, 0, other.len));
            *self = LayerCache::with_capacity(capacity);
            self.append(ok, ov);
            return (0, 0);
        };
        let width = self.len.max(other.len);
        // A row's tokens in use, behind the blank columns that align it.
        let aligned = |t: Tensor<B, 4>, len: usize| {
            let [b, _, kvh, hd] = t.dims();
            let tokens = t.narrow(1, 0, len);
            match width - len {
                0 => tokens,
                pad => Tensor::cat(
                    vec![Tensor::zeros([b, pad, kvh, hd], &tokens.device()), tokens],
                    1,
                ),
            }
        };
        let k = Tensor::cat(vec![aligned(sk, self.len), aligned(ok, other.len)], 0);
        let v = Tensor::cat(vec![aligned(sv, self.len), aligned(ov, other.len)], 0);
        let gained = (width - self.len, width - other.len);
        *self = LayerCache::with_capacity(capacity.max(width));
        self.append(k, v);
        gained
    }

    /// Keeps the batch rows `keep` (indices into the current batch) and drops the first `trim`
    /// positions of every row.
    pub(crate) fn retain(&mut self, keep: &Tensor<B, 1, burn::tensor::Int>, trim: usize) {
        if let Some((k, v)) = self.kv.take() {
            let width = k.dims()[1] - trim;
            self.kv = Some((
                k.select(0, keep.clone()).narrow(1, trim, width),
                v.select(0, keep.clone()).narrow(1, trim, width),
            ));
        }
        self.len -= trim;
        self.capacity -= trim;
    }
}

/// Rotary angles and the attention mask of one forward call.
#[derive(Clone)]
pub(crate) struct Positions<B: Backend> {
    /// Cosines of each token's rotary angles, `[batch * len, head_dim / 2]`.
    pub cos: Tensor<B, 2>,
    /// Sines of the same angles.
    pub sin: Tensor<B, 2>,
    /// Which keys each query sees.
    pub mask: AttentionMask,
}

impl<B: Backend> Positions<B> {
    /// Rotary tables for explicit position ids (one per token of the batch, row-major), and
    /// the attention mask.
    pub(crate) fn new(
        positions: &[usize],
        rope: &Rope,
        mask: AttentionMask,
        device: &B::Device,
    ) -> Self {
        let inv = rope.inv_freq();
        let table = |f: fn(f64) -> f64| {
            let out: Vec<f32> = positions
                .iter()
                .flat_map(|&p| inv.iter().map(move |w| f(p as f64 * w) as f32))
                .collect();
            Tensor::<B, 2>::from_data(TensorData::new(out, [positions.len(), inv.len()]), device)
        };
        Positions {
            cos: table(f64::cos),
            sin: table(f64::sin),
            mask,
        }
    }
}

/// Block `index` of a policy with its adapters, if it has any: what runs a linear layer.
struct Adapted<'a, B: Backend> {
    lora: Option<&'a Lora<B>>,
    /// The base's blocks, which a decode step multiplies by ([`Policy::quantized`]).
    blocks: Option<&'a QuantizedBase>,
    index: usize,
}

impl<B: Kernels> Adapted<'_, B> {
    /// `layer` (the block's `target`) on `[batch, len, d]` as one `[batch * len, d]` product,
    /// plus its adapter's contribution: burn's `Linear` on a rank-3 input multiplies batch by
    /// batch, so a decode step (`len` 1) would read the whole weight once per sequence.
    fn rows(&self, layer: &Linear<B>, target: LoraTarget, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, t, d] = x.dims();
        let x = x.reshape([b * t, d]);
        let delta = self
            .lora
            .and_then(|lora| lora.delta(self.index, target, &x));
        let by_blocks = self
            .blocks
            .and_then(|blocks| blocks.layer(self.index, target))
            .and_then(|w| block_linear(Some(layer), w, x.clone()));
        let y = by_blocks.unwrap_or_else(|| kernels::linear(layer, x));
        let y = match delta {
            Some(delta) => y + delta,
            None => y,
        };
        let out = y.dims()[1];
        y.reshape([b, t, out])
    }
}

impl<B: Kernels> DecoderBlock<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: &Positions<B>,
        cache: Option<&mut LayerCache<B>>,
        adapted: Adapted<'_, B>,
    ) -> Tensor<B, 3> {
        let [b, t, _] = x.dims();
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let rows = |layer, target, x| adapted.rows(layer, target, x);
        let normed = kernels::rms_norm(x.clone(), &self.attn_norm);
        let q = rows(&self.q, LoraTarget::Q, normed.clone()).reshape([b, t, h, hd]);
        let k = rows(&self.k, LoraTarget::K, normed.clone()).reshape([b, t, kvh, hd]);
        let mut v = rows(&self.v, LoraTarget::V, normed).reshape([b, t, kvh, hd]);
        let q = kernels::rope(q, &pos.cos, &pos.sin);
        let mut k = kernels::rope(k, &pos.cos, &pos.sin);
        let mut mask = pos.mask.clone();
        if let Some(cache) = cache {
            let (ck, cv, len) = cache.append(k, v);
            (k, v) = (ck, cv);
            mask.kv_len = Some(len);
        }
        let attn = kernels::attention(q, k, v, &mask).reshape([b, t, h * hd]);
        let x = x + rows(&self.out, LoraTarget::O, attn);
        let normed = kernels::rms_norm(x.clone(), &self.ffn_norm);
        let gated = kernels::swiglu(
            rows(&self.gate, LoraTarget::Gate, normed.clone()),
            rows(&self.up, LoraTarget::Up, normed),
        );
        x + rows(&self.down, LoraTarget::Down, gated)
    }
}

/// Which outputs [`Policy::score`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// Log-probabilities only (SFT, the KL reference): the entropy costs several passes over
    /// `[scored, vocab]` that they would throw away.
    LogProbs,
    /// Log-probabilities and entropies (an RL update reports and regularizes the entropy).
    Policy,
    /// Values (the value head) only: a critic never needs the LM head.
    Values,
    /// Log-probabilities, entropies and values, from one pass of the trunk (a shared-trunk
    /// PPO update).
    Both,
}

impl Want {
    fn logprobs(self) -> bool {
        self != Want::Values
    }

    fn entropy(self) -> bool {
        matches!(self, Want::Policy | Want::Both)
    }

    fn values(self) -> bool {
        matches!(self, Want::Values | Want::Both)
    }
}

/// What [`Policy::score`] returns, each `[batch, len - 1]`, zero at unscored positions.
pub struct Scores<B: Backend> {
    /// Log-probability of each next token (zeros when not wanted).
    pub logprobs: Tensor<B, 2>,
    /// Entropy of each predicted distribution (zeros when not wanted).
    pub entropy: Tensor<B, 2>,
    /// The value of the state each token is generated from; `None` when not wanted or when
    /// the policy has no value head.
    pub values: Option<Tensor<B, 2>>,
}

/// The policy network; build it with [`PolicyConfig::init`].
#[derive(Module, Debug)]
pub struct Policy<B: Backend> {
    /// Token embedding.
    pub embed: Embedding<B>,
    /// The decoder blocks.
    pub blocks: Vec<DecoderBlock<B>>,
    /// Final norm.
    pub norm: RmsNorm<B>,
    /// LM head; `None` when tied to the embedding (logits are `hidden · embedᵀ`).
    pub head: Option<Linear<B>>,
    /// Value head, PPO's critic on this trunk: `Linear(d_model -> 1)` on the final-normed hidden
    /// states. `None` unless added with [`Policy::with_value_head`].
    pub value: Option<Linear<B>>,
    /// Low-rank adapters over the frozen blocks (`finetune = lora`); `None` unless added with
    /// [`Policy::with_lora`].
    pub lora: Option<Lora<B>>,
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest sequence handled.
    pub context: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Rotary frequencies; configuration, not a parameter (never trained or saved).
    #[module(skip)]
    pub rope: Rope,
    /// Whether a forward pass under autodiff keeps only each block's input and recomputes
    /// the block in the backward pass (`train { recompute = true }`, [`recompute`]): the
    /// memory of one block's activations instead of all of them, for about one more forward
    /// pass of compute. Set it with [`Policy::with_recompute`].
    #[module(skip)]
    pub recompute: bool,
    /// The base's weights in ggml blocks ([`QuantizedBase`]), whose values the f32 weights
    /// hold: a GGUF file's Q4_1 and Q8_0 tensors, or [`Policy::with_quantized_base`]'s.
    /// Decode steps on flex read them. Never saved; whatever changes a base weight drops them
    /// (full fine-tuning in [`Policy::as_declared`], [`Policy::merged`]).
    #[module(skip)]
    pub quantized: Option<Arc<QuantizedBase>>,
}

impl<B: Kernels> Policy<B> {
    /// The device holding the weights.
    pub fn device(&self) -> B::Device {
        self.embed.weight.val().device()
    }

    /// Runs the blocks with explicit positions and optional caches; returns the final-normed
    /// hidden states `[batch, len, d_model]`.
    pub(crate) fn hidden_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        pos: &Positions<B>,
        mut caches: Option<&mut [LayerCache<B>]>,
    ) -> Tensor<B, 3> {
        let device = tokens.device();
        if caches.is_none() && self.recompute && B::ad_enabled(&device) {
            return self.norm.forward(recompute::trunk(self, tokens, pos));
        }
        let dropout = DropoutSeeds::draw(self, &device);
        let mut x = self.embed.forward(tokens);
        for i in 0..self.blocks.len() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            dropout.seed::<B>(i, &device);
            x = self.block(i, x, pos, cache);
        }
        self.norm.forward(x)
    }

    /// Block `i` with its adapters on `x` (`[batch, len, d_model]`).
    pub(super) fn block(
        &self,
        i: usize,
        x: Tensor<B, 3>,
        pos: &Positions<B>,
        cache: Option<&mut LayerCache<B>>,
    ) -> Tensor<B, 3> {
        let adapted = Adapted {
            lora: self.lora.as_ref(),
            blocks: self.quantized.as_deref(),
            index: i,
        };
        self.blocks[i].forward(x, pos, cache, adapted)
    }

    /// This policy, recomputing its blocks' activations in the backward pass when `on`
    /// ([`Policy::recompute`]).
    pub fn with_recompute(self, on: bool) -> Self {
        Policy {
            recompute: on,
            ..self
        }
    }

    /// Final-normed hidden states `[batch, len, d_model]` of a right-padded batch (a value
    /// head can read these).
    pub fn hidden_states(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, t] = tokens.dims();
        let positions: Vec<usize> = (0..b).flat_map(|_| 0..t).collect();
        let causal = AttentionMask {
            causal: true,
            ..AttentionMask::default()
        };
        let pos = Positions::new(&positions, &self.rope, causal, &tokens.device());
        self.hidden_with(tokens, &pos, None)
    }

    /// Logits `[batch, len, vocab]` of a batch `[batch, len]`; position `i` predicts token
    /// `i + 1`. Batches are right-padded: with the causal mask, padding never changes the
    /// logits of the real tokens before it.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.logits(self.hidden_states(tokens))
    }

    /// Logits of final-normed hidden states `[batch, len, d_model]`.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, t, d] = hidden.dims();
        self.project(hidden.reshape([b * t, d]))
            .reshape([b, t, self.vocab])
    }

    /// The LM head on rows of hidden states `[rows, d_model]`.
    fn project(&self, rows: Tensor<B, 2>) -> Tensor<B, 2> {
        if let Some(logits) = self.head_by_blocks(rows.clone()) {
            return logits;
        }
        match &self.head {
            Some(head) => kernels::linear(head, rows),
            None => kernels::matmul(rows, self.embed.weight.val().transpose()),
        }
    }

    /// For predicting `tokens[:, 1..]`: the log-probability of each next token and the entropy
    /// of the full predicted distribution, both `[batch, len - 1]` (temperature 1).
    /// Differentiable under autodiff. `len` must be at least 2.
    pub fn token_logprobs(&self, tokens: Tensor<B, 2, Int>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        assert!(t >= 2, "token_logprobs needs at least two tokens per row");
        self.scored_logprobs_and_entropy(tokens, &vec![true; b * (t - 1)], 1.0)
    }

    /// Like [`Policy::token_logprobs`] at `temperature`, but only the log-probabilities, and
    /// only the predictions where `scored` (row-major `[batch, len - 1]`) is set are computed;
    /// the others are zero.
    ///
    /// Training scores only the agent's tokens, a fraction of a transcript; projecting just
    /// those hidden states onto the vocabulary (and normalizing them) is most of the saving.
    pub fn scored_logprobs(
        &self,
        tokens: Tensor<B, 2, Int>,
        scored: &[bool],
        temperature: f64,
    ) -> Tensor<B, 2> {
        self.score(tokens, scored, temperature, Want::LogProbs)
            .logprobs
    }

    /// [`Policy::scored_logprobs`] and the entropy of each scored prediction's distribution.
    pub fn scored_logprobs_and_entropy(
        &self,
        tokens: Tensor<B, 2, Int>,
        scored: &[bool],
        temperature: f64,
    ) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let scores = self.score(tokens, scored, temperature, Want::Policy);
        (scores.logprobs, scores.entropy)
    }

    /// This policy as the experiment's `model` block trains it: with a shared value head and
    /// LoRA adapters when it declares them. A shared-trunk critic is part of the policy from
    /// the start, so the optimizer and every checkpoint cover it (the warm-up's loss never
    /// reads it). Adapters are drawn from the backend's RNG: seed it first.
    pub fn as_declared(self, model: &agentry_dsl::spec::Model) -> Self {
        use agentry_dsl::spec::{Finetune, ValueHead};
        let policy = match model.value_head {
            ValueHead::Shared => self.with_value_head(),
            ValueHead::None | ValueHead::Separate => self,
        };
        match &model.finetune {
            Finetune::Lora(lora) => policy.with_lora(lora),
            // Training changes the base, which its blocks would then no longer hold.
            Finetune::Full => Policy {
                quantized: None,
                ..policy
            },
        }
    }

    /// This policy with a value head `Linear(d_model -> 1)` (with bias), all zeros: every
    /// state starts at value 0, the head is the same for every seed, and building it draws
    /// nothing from the backend's RNG (so adding it changes no other weight).
    pub fn with_value_head(mut self) -> Self {
        let d_model = self.embed.weight.dims()[1];
        self.value = Some(
            LinearConfig::new(d_model, 1)
                .with_initializer(Initializer::Zeros)
                .init(&self.device()),
        );
        self
    }

    /// [`Policy::scored_logprobs`] and/or the values at the same positions: column `j` of row
    /// `b` scores token `j + 1` from the hidden state at position `j`, so its value is that of
    /// the state the token is generated from (PPO's `V(s_t)`), aligned with its log-probability.
    pub fn score(
        &self,
        tokens: Tensor<B, 2, Int>,
        scored: &[bool],
        temperature: f64,
        want: Want,
    ) -> Scores<B> {
        let [b, t] = tokens.dims();
        let device = tokens.device();
        assert!(t >= 2, "scored_logprobs needs at least two tokens per row");
        let positions = b * (t - 1);
        assert_eq!(scored.len(), positions, "one flag per predicted token");
        let value_head = self.value.as_ref().filter(|_| want.values());
        let picked: Vec<i64> = (0..positions as i64)
            .filter(|&i| scored[i as usize])
            .collect();
        let k = picked.len();
        if k == 0 {
            let zeros = Tensor::zeros([b, t - 1], &device);
            return Scores {
                logprobs: zeros.clone(),
                entropy: zeros.clone(),
                values: value_head.map(|_| zeros),
            };
        }
        let picked = Tensor::<B, 1, Int>::from_data(TensorData::new(picked, [k]), &device);
        let hidden = self.hidden_states(tokens.clone().narrow(1, 0, t - 1));
        let rows = hidden
            .reshape([positions, self.embed.weight.dims()[1]])
            .select(0, picked.clone());
        let scatter = |values: Tensor<B, 1>| {
            Tensor::zeros([positions], &device)
                .select_assign(0, picked.clone(), values, IndexingUpdateOp::Add)
                .reshape([b, t - 1])
        };
        let values = value_head.map(|head| scatter(head.forward(rows.clone()).reshape([k])));
        if !want.logprobs() {
            let zeros = Tensor::zeros([b, t - 1], &device);
            return Scores {
                logprobs: zeros.clone(),
                entropy: zeros,
                values,
            };
        }
        let targets = tokens
            .narrow(1, 1, t - 1)
            .reshape([positions])
            .select(0, picked.clone());
        let (weight, layout) = match &self.head {
            Some(head) => (head.weight.val(), HeadWeight::Linear),
            None => (self.embed.weight.val(), HeadWeight::Embedding),
        };
        let inv_temperature = (1.0 / temperature) as f32;
        let (chosen, entropy) = kernels::token_logprobs(
            rows,
            weight,
            layout,
            targets,
            inv_temperature,
            want.entropy(),
        );
        let entropy = match entropy {
            Some(entropy) => scatter(entropy),
            None => Tensor::zeros([b, t - 1], &device),
        };
        Scores {
            logprobs: scatter(chosen),
            entropy,
            values,
        }
    }
}

#[cfg(test)]
mod cache_tests {
    use burn::backend::Flex;
    use burn::tensor::{Int, Tensor, TensorData};

    use super::LayerCache;

    fn rows(start: usize, t: usize) -> Tensor<Flex, 4> {
        let data: Vec<f32> = (0..2 * t * 3 * 2)
            .map(|i| (start * 100 + i) as f32)
            .collect();
        Tensor::from_data(TensorData::new(data, [2, t, 3, 2]), &Default::default())
    }

    /// Appends past the capacity grow the buffers; what is in use always equals the
    /// concatenation of what was appended, also after dropping a row and trimming.
    #[test]
    fn the_cache_holds_what_was_appended_whatever_its_capacity() {
        let mut cache = LayerCache::<Flex>::with_capacity(4);
        let mut expected = Vec::new();
        for (start, t) in [(1, 3), (2, 1), (3, 2), (4, 1)] {
            let k = rows(start, t);
            let (ck, cv, len) = cache.append(k.clone(), k.clone() * 2.0);
            expected.push(k);
            let want = Tensor::cat(expected.clone(), 1);
            assert_eq!(len, want.dims()[1]);
            ck.narrow(1, 0, len)
                .into_data()
                .assert_eq(&want.clone().into_data(), true);
            cv.narrow(1, 0, len)
                .into_data()
                .assert_eq(&(want * 2.0).into_data(), true);
        }
        let keep = Tensor::<Flex, 1, Int>::from_data(
            TensorData::new(vec![1i64], [1]),
            &Default::default(),
        );
        cache.retain(&keep, 2);
        let want = Tensor::cat(expected, 1).narrow(0, 1, 1).narrow(1, 2, 5);
        let (ck, _, len) = cache.append(rows(5, 1).narrow(0, 0, 1), rows(5, 1).narrow(0, 0, 1));
        assert_eq!(len, 6);
        ck.narrow(1, 0, 5)
            .into_data()
            .assert_eq(&want.into_data(), true);
    }
}
