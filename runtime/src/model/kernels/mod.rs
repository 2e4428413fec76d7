//! The policy's fused operations as a backend extension (burn's pattern for custom kernels).
//!
//! [`Kernels`] names the operations a decoder block spends its time in: the linear layers'
//! products, attention, RMSNorm, SwiGLU, the rotary embedding, the LM head's log-softmax over
//! the vocabulary and the KV cache's writes. Each has a decomposed default built from burn's
//! tensor ops, which every backend can run and autodiff records op by op. A backend with its own kernels returns them from [`Kernels::fused`] as a
//! [`Fused`] table of forward/backward pairs: flex does (`agentry_kernels`: tiled attention
//! with an online softmax, one-pass norms, the vocabulary chunked so `[tokens, vocab]` logits
//! are never whole). `Autodiff<B>` then records each operation as one node whose backward is
//! the table's, instead of dozens of recorded primitives. wgpu and CUDA keep the decomposed
//! ops.
//!
//! Callers use the tensor-level functions of this module ([`attention`], [`rms_norm`], ...).

mod autodiff;
mod decomposed;
mod flex;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::sync::Arc;

use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::ops::{FloatTensor, IntTensor};
use burn::tensor::{Int, Tensor, TensorPrimitive};

thread_local! {
    /// Set inside [`with_decomposed_ops`].
    static DECOMPOSED: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with the decomposed ops on this thread even where a backend has fused kernels:
/// the reference the kernels are tested against, and a switch for bisecting a numerical
/// difference. Only operations recorded inside `f` are affected (a backward pass runs what
/// its forward recorded).
pub fn with_decomposed_ops<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            DECOMPOSED.set(self.0);
        }
    }
    let _restore = Restore(DECOMPOSED.replace(true));
    f()
}

/// Whether [`with_decomposed_ops`] is in force on this thread.
fn decomposed_only() -> bool {
    DECOMPOSED.get()
}

/// Which keys each query of an [`attention`] call sees.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttentionMask {
    /// Query `i` of `q_len` sits at position `kv_len - q_len + i` and sees keys up to it
    /// (bottom-right aligned: a prefill, or a chunk appended to a cache). When false every query
    /// sees every key (a one-token decode step).
    pub causal: bool,
    /// Per batch row, how many leading keys are hidden from every query (left padding).
    pub key_start: Option<Arc<[usize]>>,
    /// Keys in use when k and v are a preallocated cache longer than that (`None`: all rows).
    pub kv_len: Option<usize>,
}

/// How an LM head's weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadWeight {
    /// `[vocab, d_model]`: the token embedding, tied.
    Embedding,
    /// `[d_model, vocab]`: a `Linear` layer's weight.
    Linear,
}

/// A backend's fused forward/backward pairs: what `Autodiff<B>` records as single nodes.
///
/// All tensors are float primitives of `B`; shapes are those of the tensor-level functions.
pub trait Fused<B: Backend>: Sync {
    /// The product of `[m, k]` and `[k, n]` (either may be a transposed view). Also the
    /// backward pass of itself, on transposed operands.
    fn matmul(&self, lhs: FloatTensor<B>, rhs: FloatTensor<B>) -> FloatTensor<B>;
    /// Attention's output `[b, t, h, hd]` and the log-sum-exp of each query's scores
    /// (`[b, h, t]`, whatever encoding the backward reads).
    fn attention_forward(
        &self,
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        mask: &AttentionMask,
    ) -> (FloatTensor<B>, FloatTensor<B>);
    /// Gradients of q, k and v.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        q: FloatTensor<B>,
        k: FloatTensor<B>,
        v: FloatTensor<B>,
        out: FloatTensor<B>,
        lse: FloatTensor<B>,
        d_out: FloatTensor<B>,
        mask: &AttentionMask,
    ) -> [FloatTensor<B>; 3];
    /// RMSNorm's output and each row's `1 / rms`.
    fn rms_norm_forward(
        &self,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        eps: f64,
    ) -> (FloatTensor<B>, FloatTensor<B>);
    /// Gradients of x and gamma.
    fn rms_norm_backward(
        &self,
        x: FloatTensor<B>,
        gamma: FloatTensor<B>,
        inv_rms: FloatTensor<B>,
        dy: FloatTensor<B>,
    ) -> [FloatTensor<B>; 2];
    /// `silu(gate) * up`.
    fn swiglu_forward(&self, gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B>;
    /// Gradients of gate and up.
    fn swiglu_backward(
        &self,
        gate: FloatTensor<B>,
        up: FloatTensor<B>,
        d_out: FloatTensor<B>,
    ) -> [FloatTensor<B>; 2];
    /// The rotary embedding (or, with `inverse`, its inverse: also its backward).
    fn rope(
        &self,
        x: FloatTensor<B>,
        cos: FloatTensor<B>,
        sin: FloatTensor<B>,
        inverse: bool,
    ) -> FloatTensor<B>;
    /// `[1 or 2, n]` (log-probabilities, then entropies when asked) and each row's
    /// log-sum-exp.
    fn token_logprobs_forward(
        &self,
        hidden: FloatTensor<B>,
        weight: FloatTensor<B>,
        layout: HeadWeight,
        targets: &[u32],
        inv_temperature: f32,
        entropy: bool,
    ) -> (FloatTensor<B>, FloatTensor<B>);
    /// Gradients of hidden and weight, given the output's gradient `[1 or 2, n]`.
    #[allow(clippy::too_many_arguments)]
    fn token_logprobs_backward(
        &self,
        hidden: FloatTensor<B>,
        weight: FloatTensor<B>,
        layout: HeadWeight,
        targets: &[u32],
        inv_temperature: f32,
        lse: FloatTensor<B>,
        d_out: FloatTensor<B>,
    ) -> [FloatTensor<B>; 2];
}

/// The policy's operations on a backend: fused where the backend has kernels, decomposed
/// elsewhere. Implemented for flex, for `Autodiff<B>` of any implementor, and for the GPU
/// backends compiled in.
pub trait Kernels: Backend {
    /// The backend's fused kernels; `None` (the default) keeps the decomposed ops.
    fn fused() -> Option<&'static dyn Fused<Self>> {
        None
    }

    /// Whether the backend computes on this process's CPU threads (rayon's pool), so that
    /// work split over disjoint pools of them runs at once without contending (data-parallel
    /// replicas on a CPU); `false` (the default) for a device of its own.
    fn on_cpu_threads() -> bool {
        false
    }

    /// Writes `rows` (`[b, t, heads, hd]`) into a KV-cache buffer (`[b, capacity, heads, hd]`)
    /// at positions `start..start + t` and returns the buffer. In place on flex when the
    /// buffer is not shared (burn's `slice_assign` copies the whole buffer first: a copy of
    /// every layer's cache at every decode step).
    fn cache_write(
        buffer: FloatTensor<Self>,
        start: usize,
        rows: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        decomposed::cache_write::<Self>(buffer, start, rows)
    }

    /// `x · Wᵀ` for rows `x` (`[m, k]`) and a weight kept in ggml blocks (`[n, k]`), when the
    /// backend multiplies by the blocks directly and `m` is small enough for that to pay (a
    /// decode step, [`BLOCK_ROWS`](super::quantized::BLOCK_ROWS)); `None` (the default)
    /// multiplies by the layer's f32 weight instead. No gradient flows through it: only
    /// inference backends implement it.
    fn block_product(
        x: FloatTensor<Self>,
        w: &agentry_kernels::blocks::BlockMatrix,
    ) -> Option<FloatTensor<Self>> {
        let _ = (x, w);
        None
    }

    /// The product of `[m, k]` and `[k, n]`: every linear layer of the policy (on `[tokens,
    /// d]` rows) and the tied LM head.
    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        match Self::fused() {
            Some(f) => f.matmul(lhs, rhs),
            None => Self::float_matmul(lhs, rhs),
        }
    }

    /// Scaled dot-product attention, `1/sqrt(hd)`: q `[b, t, h, hd]`, k and v
    /// `[b, s, kv_heads, hd]` (query head `i` reads key head `i / (h / kv_heads)`; only the
    /// first `mask.kv_len` of the `s` rows when set), output `[b, t, h, hd]`. A query that
    /// sees no key outputs zeros.
    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttentionMask,
    ) -> FloatTensor<Self> {
        match Self::fused() {
            Some(f) => f.attention_forward(q, k, v, mask).0,
            None => decomposed::attention::<Self>(q, k, v, mask),
        }
    }

    /// RMSNorm over the last dimension of x (`[b, t, d]`) with gain `[d]`.
    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        match Self::fused() {
            Some(f) => f.rms_norm_forward(x, gamma, eps).0,
            None => decomposed::rms_norm::<Self>(x, gamma, eps),
        }
    }

    /// `silu(gate) * up`, both `[b, t, ffn]`.
    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        match Self::fused() {
            Some(f) => f.swiglu_forward(gate, up),
            None => decomposed::swiglu::<Self>(gate, up),
        }
    }

    /// Rotate-half rotary embedding of x `[b, t, heads, hd]`, with the angles' cosines and
    /// sines `[b * t, hd / 2]`.
    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        match Self::fused() {
            Some(f) => f.rope(x, cos, sin, false),
            None => decomposed::rope::<Self>(x, cos, sin),
        }
    }

    /// For hidden states `[n, d]` and an LM head, the log-probability of each row's target
    /// at temperature `1 / inv_temperature` and, with `entropy`, the entropy of each row's
    /// distribution: `[1, n]` or `[2, n]`.
    fn token_logprobs(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        layout: HeadWeight,
        targets: IntTensor<Self>,
        inv_temperature: f32,
        entropy: bool,
    ) -> FloatTensor<Self> {
        match Self::fused() {
            Some(f) => {
                let targets = host_targets::<Self>(targets);
                f.token_logprobs_forward(hidden, weight, layout, &targets, inv_temperature, entropy)
                    .0
            }
            None => decomposed::token_logprobs::<Self>(
                hidden,
                weight,
                layout,
                targets,
                inv_temperature,
                entropy,
            ),
        }
    }
}

/// Target ids on the host, for kernels that index with them.
fn host_targets<B: Backend>(targets: IntTensor<B>) -> Vec<u32> {
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    targets
        .into_data()
        .iter::<i64>()
        .map(|t| u32::try_from(t).expect("token ids fit in u32"))
        .collect()
}

fn prim<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

fn tensor<B: Backend, const D: usize>(p: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// [`Kernels::cache_write`] on tensors.
pub(crate) fn cache_write<B: Kernels>(
    buffer: Tensor<B, 4>,
    start: usize,
    rows: Tensor<B, 4>,
) -> Tensor<B, 4> {
    tensor(B::cache_write(prim(buffer), start, prim(rows)))
}

/// [`Kernels::matmul`] on tensors.
pub fn matmul<B: Kernels>(lhs: Tensor<B, 2>, rhs: Tensor<B, 2>) -> Tensor<B, 2> {
    tensor(B::matmul(prim(lhs), prim(rhs)))
}

/// A burn `Linear` layer on rows `[n, d_in]`, through [`Kernels::matmul`].
pub fn linear<B: Kernels>(layer: &burn::nn::Linear<B>, x: Tensor<B, 2>) -> Tensor<B, 2> {
    let y = matmul(x, layer.weight.val());
    match &layer.bias {
        Some(bias) => y + bias.val().unsqueeze_dim(0),
        None => y,
    }
}

/// [`Kernels::attention`] on tensors.
pub fn attention<B: Kernels>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: &AttentionMask,
) -> Tensor<B, 4> {
    tensor(<B as Kernels>::attention(prim(q), prim(k), prim(v), mask))
}

/// [`Kernels::rms_norm`] with a burn `RmsNorm`'s gain and epsilon.
pub fn rms_norm<B: Kernels>(x: Tensor<B, 3>, norm: &burn::nn::RmsNorm<B>) -> Tensor<B, 3> {
    tensor(B::rms_norm(prim(x), prim(norm.gamma.val()), norm.epsilon))
}

/// [`Kernels::swiglu`] on tensors.
pub fn swiglu<B: Kernels>(gate: Tensor<B, 3>, up: Tensor<B, 3>) -> Tensor<B, 3> {
    tensor(B::swiglu(prim(gate), prim(up)))
}

/// [`Kernels::rope`] on tensors.
pub fn rope<B: Kernels>(x: Tensor<B, 4>, cos: &Tensor<B, 2>, sin: &Tensor<B, 2>) -> Tensor<B, 4> {
    tensor(B::rope(prim(x), prim(cos.clone()), prim(sin.clone())))
}

/// [`Kernels::token_logprobs`] on tensors: the log-probabilities `[n]` and, when asked, the
/// entropies `[n]`.
pub fn token_logprobs<B: Kernels>(
    hidden: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    layout: HeadWeight,
    targets: Tensor<B, 1, Int>,
    inv_temperature: f32,
    entropy: bool,
) -> (Tensor<B, 1>, Option<Tensor<B, 1>>) {
    let [n, _] = hidden.dims();
    let out: Tensor<B, 2> = tensor(B::token_logprobs(
        prim(hidden),
        prim(weight),
        layout,
        targets.into_primitive(),
        inv_temperature,
        entropy,
    ));
    let logprobs = out.clone().narrow(0, 0, 1).reshape([n]);
    let entropy = entropy.then(|| out.narrow(0, 1, 1).reshape([n]));
    (logprobs, entropy)
}

#[cfg(feature = "wgpu")]
impl Kernels for burn::backend::Wgpu {}
#[cfg(feature = "vulkan")]
impl Kernels for burn::backend::Vulkan {}
#[cfg(feature = "cuda")]
impl Kernels for burn::backend::Cuda {}

/// What training runs on: autodiff over a backend, both with the policy's kernels (rollout
/// generates on the inner backend).
pub trait TrainBackend: AutodiffBackend<InnerBackend: Kernels> + Kernels {}

impl<B> TrainBackend for B
where
    B: AutodiffBackend + Kernels,
    B::InnerBackend: Kernels,
{
}
