//! The decomposed form of each operation in burn's tensor ops: what backends without fused
//! kernels run (and autodiff records op by op), and the reference the fused kernels are
//! tested against.

use burn::tensor::activation::{log_softmax, silu};
use burn::tensor::backend::Backend;
use burn::tensor::module::attention as sdpa;
use burn::tensor::ops::{AttentionModuleOptions, FloatTensor, IntTensor};
use burn::tensor::{Bool, Int, Tensor, TensorData};

use super::{AttentionMask, HeadWeight, prim, tensor};

/// Swaps to `[b, heads, len, hd]`, repeats key/value heads for grouped-query attention,
/// builds the padding mask, and runs burn's attention.
pub(super) fn attention<B: Backend>(
    q: FloatTensor<B>,
    k: FloatTensor<B>,
    v: FloatTensor<B>,
    mask: &AttentionMask,
) -> FloatTensor<B> {
    let q: Tensor<B, 4> = tensor(q);
    let (mut k, mut v): (Tensor<B, 4>, Tensor<B, 4>) = (tensor(k), tensor(v));
    if let Some(len) = mask.kv_len {
        k = k.narrow(1, 0, len);
        v = v.narrow(1, 0, len);
    }
    let [b, t, h, hd] = q.dims();
    let [_, s, kvh, _] = k.dims();
    let device = q.device();
    let q = q.swap_dims(1, 2);
    let (mut k, mut v) = (k.swap_dims(1, 2), v.swap_dims(1, 2));
    if kvh != h {
        let rep = h / kvh;
        let expand = |x: Tensor<B, 4>| {
            x.unsqueeze_dim::<5>(2)
                .expand([b, kvh, rep, s, hd])
                .reshape([b, h, s, hd])
        };
        k = expand(k);
        v = expand(v);
    }
    let bool_mask = mask.key_start.as_ref().map(|starts| {
        let hidden: Vec<bool> = starts
            .iter()
            .flat_map(|&p| (0..t).flat_map(move |_| (0..s).map(move |j| j < p)))
            .collect();
        Tensor::<B, 4, Bool>::from_data(TensorData::new(hidden, [b, 1, t, s]), &device)
            .expand([b, h, t, s])
    });
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal: mask.causal,
    };
    prim(sdpa(q, k, v, bool_mask, None, options).swap_dims(1, 2))
}

/// burn's `RmsNorm::forward`, on primitives.
pub(super) fn rms_norm<B: Backend>(
    x: FloatTensor<B>,
    gamma: FloatTensor<B>,
    eps: f64,
) -> FloatTensor<B> {
    let x: Tensor<B, 3> = tensor(x);
    let gamma: Tensor<B, 1> = tensor(gamma);
    let rms = (x.clone().square().mean_dim(2) + eps).sqrt();
    prim((x / rms) * gamma.unsqueeze())
}

/// `silu(gate) * up`.
pub(super) fn swiglu<B: Backend>(gate: FloatTensor<B>, up: FloatTensor<B>) -> FloatTensor<B> {
    let gate: Tensor<B, 3> = tensor(gate);
    let up: Tensor<B, 3> = tensor(up);
    prim(silu(gate) * up)
}

/// Rotate-half: `x cos + rotate(x) sin`, with the half tables widened to `[b, t, heads, hd]`.
pub(super) fn rope<B: Backend>(
    x: FloatTensor<B>,
    cos: FloatTensor<B>,
    sin: FloatTensor<B>,
) -> FloatTensor<B> {
    let x: Tensor<B, 4> = tensor(x);
    let [b, t, h, hd] = x.dims();
    let widen = |half: FloatTensor<B>| {
        let half: Tensor<B, 2> = tensor(half);
        Tensor::cat(vec![half.clone(), half], 1)
            .reshape([b, t, 1, hd])
            .expand([b, t, h, hd])
    };
    let (cos, sin) = (widen(cos), widen(sin));
    let x1 = x.clone().narrow(3, 0, hd / 2);
    let x2 = x.clone().narrow(3, hd / 2, hd / 2);
    let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
    prim(x * cos + rotated * sin)
}

/// The LM head, log-softmax and gather, with the entropy when asked: `[1 or 2, n]`.
pub(super) fn token_logprobs<B: Backend>(
    hidden: FloatTensor<B>,
    weight: FloatTensor<B>,
    layout: HeadWeight,
    targets: IntTensor<B>,
    inv_temperature: f32,
    entropy: bool,
) -> FloatTensor<B> {
    let hidden: Tensor<B, 2> = tensor(hidden);
    let weight: Tensor<B, 2> = tensor(weight);
    let [n, _] = hidden.dims();
    let logits = match layout {
        HeadWeight::Embedding => hidden.matmul(weight.transpose()),
        HeadWeight::Linear => hidden.matmul(weight),
    };
    let logp = log_softmax(logits * inv_temperature, 1);
    let targets: Tensor<B, 1, Int> = Tensor::from_primitive(targets);
    let chosen = logp
        .clone()
        .gather(1, targets.reshape([n, 1]))
        .reshape([1, n]);
    if !entropy {
        return prim(chosen);
    }
    let h = (logp.clone().exp() * logp).sum_dim(1).neg().reshape([1, n]);
    prim(Tensor::cat(vec![chosen, h], 0))
}

/// burn's `slice_assign` of the rows into the buffer.
pub(super) fn cache_write<B: Backend>(
    buffer: FloatTensor<B>,
    start: usize,
    rows: FloatTensor<B>,
) -> FloatTensor<B> {
    let [b, t, h, hd] = burn::tensor::TensorMetadata::shape(&rows).dims();
    B::float_slice_assign(
        buffer,
        &[
            (0..b).into(),
            (start..start + t).into(),
            (0..h).into(),
            (0..hd).into(),
        ],
        rows,
    )
}
