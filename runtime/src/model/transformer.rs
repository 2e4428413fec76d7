//! The transformer itself: configuration, modules and the forward passes.

use agentry_dsl::spec::TransformerArch;
use burn::module::{Initializer, Module};
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig, RmsNorm, RmsNormConfig};
use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::backend::Backend;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// Base of the rotary position embedding frequencies.
const ROPE_THETA: f64 = 10_000.0;
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
        if self.d_model % self.heads != 0 {
            return Err(format!(
                "d_model {} is not a multiple of heads {}",
                self.d_model, self.heads
            ));
        }
        if self.heads % self.kv_heads != 0 {
            return Err(format!(
                "kv_heads {} does not divide heads {}",
                self.kv_heads, self.heads
            ));
        }
        if self.head_dim() % 2 != 0 {
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
                qkv: linear(
                    self.d_model,
                    (self.heads + 2 * self.kv_heads) * hd,
                    INIT_STD,
                ),
                out: linear(self.heads * hd, self.d_model, out_std),
                ffn_norm: RmsNormConfig::new(self.d_model).init(device),
                gate_up: linear(self.d_model, 2 * self.ffn, INIT_STD),
                down: linear(self.ffn, self.d_model, out_std),
                heads: self.heads,
                kv_heads: self.kv_heads,
                head_dim: hd,
                ffn: self.ffn,
            })
            .collect();
        Policy {
            embed: EmbeddingConfig::new(self.vocab, self.d_model)
                .with_initializer(normal(INIT_STD))
                .init(device),
            blocks,
            norm: RmsNormConfig::new(self.d_model).init(device),
            head: linear(self.d_model, self.vocab, INIT_STD),
            vocab: self.vocab,
            context: self.context,
            head_dim: hd,
        }
    }
}

/// One pre-norm decoder block: `x + attn(norm(x))`, then `x + swiglu(norm(x))`.
#[derive(Module, Debug)]
pub struct DecoderBlock<B: Backend> {
    /// Norm before attention.
    pub attn_norm: RmsNorm<B>,
    /// Fused query, key and value projection: `heads + 2 * kv_heads` head-wide outputs.
    pub qkv: Linear<B>,
    /// Attention output projection.
    pub out: Linear<B>,
    /// Norm before the feed-forward.
    pub ffn_norm: RmsNorm<B>,
    /// Fused SwiGLU gate and up projection (`2 * ffn` outputs: gate, then up).
    pub gate_up: Linear<B>,
    /// Feed-forward down projection.
    pub down: Linear<B>,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Feed-forward width.
    pub ffn: usize,
}

/// Keys and values of one block for the tokens seen so far: `[batch, kv_heads, len, head_dim]`.
pub(crate) type LayerCache<B> = Option<(Tensor<B, 4>, Tensor<B, 4>)>;

/// Rotary tables and masks for one forward call.
pub(crate) struct Positions<B: Backend> {
    /// `[batch or 1, 1, len, head_dim]`.
    pub cos: Tensor<B, 4>,
    /// `[batch or 1, 1, len, head_dim]`.
    pub sin: Tensor<B, 4>,
    /// `[batch, 1, len, kv_len]`, `true` where a key must be ignored.
    pub mask: Option<Tensor<B, 4, Bool>>,
    /// Whether queries may not see later keys (prefill), aligned at the bottom-right.
    pub causal: bool,
}

/// Rotary tables for explicit position ids: `rows` rows of `len` positions each.
pub(crate) fn rope_tables<B: Backend>(
    positions: &[usize],
    rows: usize,
    head_dim: usize,
    device: &B::Device,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    let half = head_dim / 2;
    let len = positions.len() / rows.max(1);
    let mut cos = Vec::with_capacity(positions.len() * head_dim);
    let mut sin = Vec::with_capacity(positions.len() * head_dim);
    let inv: Vec<f64> = (0..half)
        .map(|i| ROPE_THETA.powf(-((2 * i) as f64) / head_dim as f64))
        .collect();
    for &p in positions {
        for _ in 0..2 {
            for f in &inv {
                let angle = p as f64 * f;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
    }
    let shape = [rows, 1, len, head_dim];
    (
        Tensor::from_data(TensorData::new(cos, shape), device),
        Tensor::from_data(TensorData::new(sin, shape), device),
    )
}

fn rotate<B: Backend>(x: Tensor<B, 4>, cos: &Tensor<B, 4>, sin: &Tensor<B, 4>) -> Tensor<B, 4> {
    let hd = x.dims()[3];
    let half = hd / 2;
    let x1 = x.clone().narrow(3, 0, half);
    let x2 = x.clone().narrow(3, half, half);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    x * cos.clone() + rotated * sin.clone()
}

impl<B: Backend> DecoderBlock<B> {
    fn forward(
        &self,
        x: Tensor<B, 3>,
        pos: &Positions<B>,
        cache: Option<&mut LayerCache<B>>,
    ) -> Tensor<B, 3> {
        let [b, t, _] = x.dims();
        let (h, kvh, hd) = (self.heads, self.kv_heads, self.head_dim);
        let qkv = self.qkv.forward(self.attn_norm.forward(x.clone()));
        let split = |start: usize, n: usize| {
            qkv.clone()
                .narrow(2, start * hd, n * hd)
                .reshape([b, t, n, hd])
                .swap_dims(1, 2)
        };
        let q = rotate(split(0, h), &pos.cos, &pos.sin);
        let mut k = rotate(split(h, kvh), &pos.cos, &pos.sin);
        let mut v = split(h + kvh, kvh);
        if let Some(cache) = cache {
            if let Some((pk, pv)) = cache.take() {
                k = Tensor::cat(vec![pk, k], 2);
                v = Tensor::cat(vec![pv, v], 2);
            }
            *cache = Some((k.clone(), v.clone()));
        }
        if kvh != h {
            let rep = h / kvh;
            let expand = |x: Tensor<B, 4>| {
                let [b, _, l, _] = x.dims();
                x.unsqueeze_dim::<5>(2)
                    .expand([b, kvh, rep, l, hd])
                    .reshape([b, h, l, hd])
            };
            k = expand(k);
            v = expand(v);
        }
        let mask = pos.mask.clone().map(|m| {
            let [mb, _, mq, mk] = m.dims();
            m.expand([mb, h, mq, mk])
        });
        let options = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: pos.causal,
        };
        let attn = attention(q, k, v, mask, None, options)
            .swap_dims(1, 2)
            .reshape([b, t, h * hd]);
        let x = x + self.out.forward(attn);
        let gu = self.gate_up.forward(self.ffn_norm.forward(x.clone()));
        let gate = gu.clone().narrow(2, 0, self.ffn);
        let up = gu.narrow(2, self.ffn, self.ffn);
        x.clone() + self.down.forward(silu(gate) * up)
    }
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
    /// LM head (untied from the embedding).
    pub head: Linear<B>,
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest sequence handled.
    pub context: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl<B: Backend> Policy<B> {
    /// The device holding the weights.
    pub fn device(&self) -> B::Device {
        self.head.weight.val().device()
    }

    /// Runs the blocks with explicit positions and optional caches; returns the final-normed
    /// hidden states `[batch, len, d_model]`.
    pub(crate) fn hidden_with(
        &self,
        tokens: Tensor<B, 2, Int>,
        pos: &Positions<B>,
        mut caches: Option<&mut [LayerCache<B>]>,
    ) -> Tensor<B, 3> {
        let mut x = self.embed.forward(tokens);
        for (i, block) in self.blocks.iter().enumerate() {
            let cache = caches.as_deref_mut().map(|c| &mut c[i]);
            x = block.forward(x, pos, cache);
        }
        self.norm.forward(x)
    }

    /// Final-normed hidden states `[batch, len, d_model]` of a right-padded batch (a value
    /// head can read these).
    pub fn hidden_states(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [_, t] = tokens.dims();
        let positions: Vec<usize> = (0..t).collect();
        let (cos, sin) = rope_tables::<B>(&positions, 1, self.head_dim, &tokens.device());
        let pos = Positions {
            cos,
            sin,
            mask: None,
            causal: true,
        };
        self.hidden_with(tokens, &pos, None)
    }

    /// Logits `[batch, len, vocab]` of a batch `[batch, len]`; position `i` predicts token
    /// `i + 1`. Batches are right-padded: with the causal mask, padding never changes the
    /// logits of the real tokens before it.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        self.head.forward(self.hidden_states(tokens))
    }

    /// For predicting `tokens[:, 1..]`: the log-probability of each next token and the entropy
    /// of the full predicted distribution, both `[batch, len - 1]` (temperature 1).
    /// Differentiable under autodiff. `len` must be at least 2.
    pub fn token_logprobs(&self, tokens: Tensor<B, 2, Int>) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let [b, t] = tokens.dims();
        assert!(t >= 2, "token_logprobs needs at least two tokens per row");
        let logits = self.forward(tokens.clone()).narrow(1, 0, t - 1);
        let logp = log_softmax(logits, 2);
        let targets = tokens.narrow(1, 1, t - 1).reshape([b, t - 1, 1]);
        let chosen = logp.clone().gather(2, targets).reshape([b, t - 1]);
        let entropy = (logp.clone().exp() * logp).sum_dim(2).neg().reshape([b, t - 1]);
        (chosen, entropy)
    }
}
