//! flex's fused kernels: `agentry_kernels` on the tensors' f32 storage.

use agentry_kernels::blocks::BlockMatrix;
use agentry_kernels::matmul::{self, MatMut, MatRef, Threads};
use agentry_kernels::memory::zeroed;
use agentry_kernels::{attention as attn, logits, norm};
use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::tensor::{DType, TensorData};

use super::super::quantized::BLOCK_ROWS;
use super::{AttentionMask, Fused, HeadWeight, Kernels, decomposed_only};

impl Kernels for Flex {
    fn fused() -> Option<&'static dyn Fused<Self>> {
        (!decomposed_only()).then_some(&FlexKernels)
    }

    fn on_cpu_threads() -> bool {
        true
    }

    fn block_product(x: FlexTensor, w: &BlockMatrix) -> Option<FlexTensor> {
        // Prefill's many rows go to the f32 weights before anything is done with them.
        if decomposed_only() || dims(&x).first().is_none_or(|&m| m > BLOCK_ROWS) {
            return None;
        }
        let x = viewable(x);
        let rows = matrix(&x)?;
        if rows.cols() != w.cols() {
            return None;
        }
        let shape = vec![rows.rows(), w.rows()];
        Some(new_tensor(w.product(rows, Threads::Pool), shape))
    }

    fn cache_write(buffer: FlexTensor, start: usize, rows: FlexTensor) -> FlexTensor {
        if decomposed_only() {
            return super::decomposed::cache_write::<Self>(buffer, start, rows);
        }
        let (shape, row_shape) = (dims(&buffer), dims(&rows));
        let (b, capacity, width) = (shape[0], shape[1], shape[2] * shape[3]);
        let t = row_shape[1];
        assert!(
            row_shape[0] == b && row_shape[2] * row_shape[3] == width && start + t <= capacity,
            "cache_write: rows {row_shape:?} at {start} do not fit a buffer {shape:?}"
        );
        // `dense` returns a dense buffer as it is (its only holder stays its only holder).
        let (mut buffer, rows) = (dense(buffer), dense(rows));
        // Copy-on-write: a copy only if someone else still holds the buffer.
        let dst = buffer.storage_mut::<f32>();
        for (r, src) in values(&rows).chunks_exact(t * width).enumerate() {
            let at = (r * capacity + start) * width;
            dst[at..at + t * width].copy_from_slice(src);
        }
        buffer
    }
}

/// The [`Fused`] table of flex.
struct FlexKernels;

/// `t` as a dense row-major f32 buffer of exactly its elements (a copy only when it is a
/// strided or offset view): the layout the kernels read.
fn dense(t: FlexTensor) -> FlexTensor {
    assert_eq!(
        t.dtype(),
        DType::F32,
        "flex's fused kernels run in f32; got a {:?} tensor",
        t.dtype()
    );
    t.to_contiguous()
}

/// The elements of a tensor made [`dense`].
fn values(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("dense f32 tensors are slices")
}

/// A 2-D f32 tensor as a matrix view of its storage, strides and all (a transposed weight is
/// read in place); `None` for a layout the view cannot express (negative strides).
fn matrix(t: &FlexTensor) -> Option<MatRef<'_>> {
    let layout = t.layout();
    let (shape, strides) = (layout.shape(), layout.strides());
    if t.dtype() != DType::F32 || shape.num_dims() != 2 {
        return None;
    }
    let row_stride = usize::try_from(strides[0]).ok()?;
    let col_stride = usize::try_from(strides[1]).ok()?;
    let data = &t.storage::<f32>()[layout.start_offset()..];
    Some(MatRef::new(
        data, shape[0], shape[1], row_stride, col_stride,
    ))
}

/// `t` unchanged when [`matrix`] can view it, else [`dense`].
fn viewable(t: FlexTensor) -> FlexTensor {
    if matrix(&t).is_some() { t } else { dense(t) }
}

fn dims(t: &FlexTensor) -> Vec<usize> {
    t.layout().shape().to_vec()
}

fn new_tensor(data: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(data, shape))
}

fn attention_shape(q: &FlexTensor, k: &FlexTensor, mask: &AttentionMask) -> attn::Shape {
    let (q, k) = (dims(q), dims(k));
    attn::Shape {
        batch: q[0],
        heads: q[2],
        kv_heads: k[2],
        q_len: q[1],
        kv_len: mask.kv_len.unwrap_or(k[1]),
        kv_capacity: k[1],
        head_dim: q[3],
    }
}

fn kernel_mask(mask: &AttentionMask) -> attn::Mask<'_> {
    attn::Mask {
        causal: mask.causal,
        key_start: mask.key_start.as_deref(),
    }
}

fn scale(head_dim: usize) -> f32 {
    1.0 / (head_dim as f32).sqrt()
}

/// The head weight as the `[vocab, d]` view the logits kernel reads.
fn head_view<'a>(weight: &'a [f32], shape: &[usize], layout: HeadWeight) -> MatRef<'a> {
    match layout {
        HeadWeight::Embedding => MatRef::row_major(weight, shape[0], shape[1]),
        HeadWeight::Linear => MatRef::row_major(weight, shape[0], shape[1]).t(),
    }
}

impl Fused<Flex> for FlexKernels {
    fn matmul(&self, lhs: FlexTensor, rhs: FlexTensor) -> FlexTensor {
        let (lhs, rhs) = (viewable(lhs), viewable(rhs));
        let view = |t| matrix(t).expect("a dense 2-D f32 tensor is a matrix");
        let (a, b) = (view(&lhs), view(&rhs));
        let shape = vec![a.rows(), b.cols()];
        new_tensor(matmul::product(a, b, Threads::Pool), shape)
    }

    fn attention_forward(
        &self,
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        mask: &AttentionMask,
    ) -> (FlexTensor, FlexTensor) {
        let (q, k, v) = (dense(q), dense(k), dense(v));
        let shape = attention_shape(&q, &k, mask);
        let mut out = zeroed(values(&q).len());
        let mut lse = vec![0.0; shape.batch * shape.heads * shape.q_len];
        attn::forward(
            shape,
            kernel_mask(mask),
            scale(shape.head_dim),
            values(&q),
            values(&k),
            values(&v),
            &mut out,
            &mut lse,
        );
        (
            new_tensor(out, dims(&q)),
            new_tensor(lse, vec![shape.batch, shape.heads, shape.q_len]),
        )
    }

    fn attention_backward(
        &self,
        q: FlexTensor,
        k: FlexTensor,
        v: FlexTensor,
        out: FlexTensor,
        lse: FlexTensor,
        d_out: FlexTensor,
        mask: &AttentionMask,
    ) -> [FlexTensor; 3] {
        let (q, k, v, out, lse, d_out) = (
            dense(q),
            dense(k),
            dense(v),
            dense(out),
            dense(lse),
            dense(d_out),
        );
        let shape = attention_shape(&q, &k, mask);
        let mut dq = zeroed(values(&q).len());
        let mut dk = zeroed(values(&k).len());
        let mut dv = zeroed(values(&v).len());
        attn::backward(
            shape,
            kernel_mask(mask),
            scale(shape.head_dim),
            values(&q),
            values(&k),
            values(&v),
            values(&out),
            values(&lse),
            values(&d_out),
            &mut dq,
            &mut dk,
            &mut dv,
        );
        [
            new_tensor(dq, dims(&q)),
            new_tensor(dk, dims(&k)),
            new_tensor(dv, dims(&v)),
        ]
    }

    fn rms_norm_forward(
        &self,
        x: FlexTensor,
        gamma: FlexTensor,
        eps: f64,
    ) -> (FlexTensor, FlexTensor) {
        let (x, gamma) = (dense(x), dense(gamma));
        let shape = dims(&x);
        let width = shape.last().copied().unwrap_or(1);
        let rows = values(&x).len() / width.max(1);
        let mut y = zeroed(values(&x).len());
        let mut inv_rms = vec![0.0; rows];
        norm::rms_norm_forward(values(&x), values(&gamma), eps as f32, &mut y, &mut inv_rms);
        (new_tensor(y, shape), new_tensor(inv_rms, vec![rows]))
    }

    fn rms_norm_backward(
        &self,
        x: FlexTensor,
        gamma: FlexTensor,
        inv_rms: FlexTensor,
        dy: FlexTensor,
    ) -> [FlexTensor; 2] {
        let (x, gamma, inv_rms, dy) = (dense(x), dense(gamma), dense(inv_rms), dense(dy));
        let mut dx = zeroed(values(&x).len());
        let mut d_gamma = vec![0.0; values(&gamma).len()];
        norm::rms_norm_backward(
            values(&x),
            values(&gamma),
            values(&inv_rms),
            values(&dy),
            &mut dx,
            &mut d_gamma,
        );
        [new_tensor(dx, dims(&x)), new_tensor(d_gamma, dims(&gamma))]
    }

    fn swiglu_forward(&self, gate: FlexTensor, up: FlexTensor) -> FlexTensor {
        let (gate, up) = (dense(gate), dense(up));
        let mut out = zeroed(values(&gate).len());
        norm::swiglu_forward(values(&gate), values(&up), &mut out);
        new_tensor(out, dims(&gate))
    }

    fn swiglu_backward(
        &self,
        gate: FlexTensor,
        up: FlexTensor,
        d_out: FlexTensor,
    ) -> [FlexTensor; 2] {
        let (gate, up, d_out) = (dense(gate), dense(up), dense(d_out));
        let mut d_gate = zeroed(values(&gate).len());
        let mut d_up = zeroed(values(&up).len());
        norm::swiglu_backward(
            values(&gate),
            values(&up),
            values(&d_out),
            &mut d_gate,
            &mut d_up,
        );
        [new_tensor(d_gate, dims(&gate)), new_tensor(d_up, dims(&up))]
    }

    fn rope(&self, x: FlexTensor, cos: FlexTensor, sin: FlexTensor, inverse: bool) -> FlexTensor {
        let (cos, sin) = (dense(cos), dense(sin));
        let shape = dims(&x);
        // In place when this call holds the only reference (copy-on-write otherwise).
        let mut x = dense(x);
        let data = x.storage_mut::<f32>();
        norm::rope_in_place(
            data,
            shape[2],
            shape[3],
            values(&cos),
            values(&sin),
            inverse,
        );
        x
    }

    fn token_logprobs_forward(
        &self,
        hidden: FlexTensor,
        weight: FlexTensor,
        layout: HeadWeight,
        targets: &[u32],
        inv_temperature: f32,
        entropy: bool,
    ) -> (FlexTensor, FlexTensor) {
        let (hidden, weight) = (dense(hidden), dense(weight));
        let [n, d] = [dims(&hidden)[0], dims(&hidden)[1]];
        let rows = if entropy { 2 } else { 1 };
        let mut out = vec![0.0; rows * n];
        let mut lse = vec![0.0; n];
        let (logprob, ent) = out.split_at_mut(n);
        logits::forward(
            MatRef::row_major(values(&hidden), n, d),
            head_view(values(&weight), &dims(&weight), layout),
            targets,
            inv_temperature,
            logits::Outputs {
                logprob,
                entropy: entropy.then_some(ent),
                lse: &mut lse,
            },
        );
        (new_tensor(out, vec![rows, n]), new_tensor(lse, vec![n]))
    }

    fn token_logprobs_backward(
        &self,
        hidden: FlexTensor,
        weight: FlexTensor,
        layout: HeadWeight,
        targets: &[u32],
        inv_temperature: f32,
        lse: FlexTensor,
        d_out: FlexTensor,
    ) -> [FlexTensor; 2] {
        let (hidden, weight, lse, d_out) = (dense(hidden), dense(weight), dense(lse), dense(d_out));
        let [n, d] = [dims(&hidden)[0], dims(&hidden)[1]];
        let w_shape = dims(&weight);
        let (d_logprob, d_entropy) = values(&d_out).split_at(n);
        let mut d_hidden = zeroed(n * d);
        let mut d_weight = zeroed(w_shape[0] * w_shape[1]);
        let d_weight_view = match layout {
            HeadWeight::Embedding => MatMut::row_major(&mut d_weight, w_shape[0], w_shape[1]),
            HeadWeight::Linear => MatMut::row_major(&mut d_weight, w_shape[0], w_shape[1]).t(),
        };
        logits::backward(
            MatRef::row_major(values(&hidden), n, d),
            head_view(values(&weight), &w_shape, layout),
            targets,
            inv_temperature,
            values(&lse),
            d_logprob,
            (!d_entropy.is_empty()).then_some(d_entropy),
            &mut d_hidden,
            d_weight_view,
        );
        [
            new_tensor(d_hidden, vec![n, d]),
            new_tensor(d_weight, w_shape),
        ]
    }
}
