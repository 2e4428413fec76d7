//! `Autodiff<B>` over a backend with fused kernels: each operation is one recorded node whose
//! backward is the backend's own, instead of the dozens of primitives the decomposed form
//! records (and the `[b, h, t, t]` scores it keeps for attention's backward).

use std::fmt;
use std::sync::Arc;

use burn::backend::Autodiff;
use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::tensor::backend::Backend;
use burn::tensor::ops::{FloatTensor, FloatTensorOps, IntTensor};

use super::{AttentionMask, Fused, HeadWeight, Kernels, decomposed, host_targets};

/// A backend's kernel table inside a backward node (which must be `Debug + Send + 'static`).
struct Table<B: Backend>(&'static dyn Fused<B>);

impl<B: Backend> fmt::Debug for Table<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fused kernels")
    }
}

/// Hands each input's gradient to its node, for the inputs that require one.
fn register<B: Backend, const N: usize>(
    grads: &mut Gradients,
    parents: [Option<NodeId>; N],
    values: [FloatTensor<B>; N],
) {
    for (node, value) in parents.into_iter().zip(values) {
        if let Some(node) = node {
            grads.register::<B>(node, value);
        }
    }
}

/// Adds one input per parent node of `ops`, as ids.
macro_rules! parent_ids {
    ($ops:expr) => {
        $ops.parents
            .each_ref()
            .map(|p| p.as_ref().map(|node| node.id))
    };
}

#[derive(Debug)]
struct MatmulBackward<B: Backend>(Table<B>);

impl<B: Backend> Backward<B, 2> for MatmulBackward<B> {
    type State = [FloatTensor<B>; 2]; // lhs, rhs

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [lhs, rhs] = ops.state.clone();
        let d_out = grads.consume::<B>(&ops.node);
        let [lhs_node, rhs_node] = parent_ids!(ops);
        // The operands' own products, on transposed views: d_lhs = d_out · rhsᵀ and
        // d_rhs = lhsᵀ · d_out, each only when its input takes a gradient.
        if let Some(node) = lhs_node {
            let d_lhs = self.0.0.matmul(d_out.clone(), B::float_transpose(rhs));
            grads.register::<B>(node, d_lhs);
        }
        if let Some(node) = rhs_node {
            let d_rhs = self.0.0.matmul(B::float_transpose(lhs), d_out);
            grads.register::<B>(node, d_rhs);
        }
    }
}

#[derive(Debug)]
struct AttentionBackward<B: Backend>(Table<B>);

impl<B: Backend> Backward<B, 3> for AttentionBackward<B> {
    type State = (
        [FloatTensor<B>; 5], // q, k, v, out, lse
        AttentionMask,
    );

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let ([q, k, v, out, lse], mask) = ops.state.clone();
        let d_out = grads.consume::<B>(&ops.node);
        let values = self.0.0.attention_backward(q, k, v, out, lse, d_out, &mask);
        register::<B, 3>(grads, parent_ids!(ops), values);
    }
}

#[derive(Debug)]
struct RmsNormBackward<B: Backend>(Table<B>);

impl<B: Backend> Backward<B, 2> for RmsNormBackward<B> {
    type State = [FloatTensor<B>; 3]; // x, gamma, inv_rms

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [x, gamma, inv_rms] = ops.state.clone();
        let dy = grads.consume::<B>(&ops.node);
        let values = self.0.0.rms_norm_backward(x, gamma, inv_rms, dy);
        register::<B, 2>(grads, parent_ids!(ops), values);
    }
}

#[derive(Debug)]
struct SwigluBackward<B: Backend>(Table<B>);

impl<B: Backend> Backward<B, 2> for SwigluBackward<B> {
    type State = [FloatTensor<B>; 2]; // gate, up

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [gate, up] = ops.state.clone();
        let d_out = grads.consume::<B>(&ops.node);
        let values = self.0.0.swiglu_backward(gate, up, d_out);
        register::<B, 2>(grads, parent_ids!(ops), values);
    }
}

#[derive(Debug)]
struct RopeBackward<B: Backend>(Table<B>);

impl<B: Backend> Backward<B, 1> for RopeBackward<B> {
    type State = [FloatTensor<B>; 2]; // cos, sin

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [cos, sin] = ops.state.clone();
        let d_out = grads.consume::<B>(&ops.node);
        let dx = self.0.0.rope(d_out, cos, sin, true);
        register::<B, 1>(grads, parent_ids!(ops), [dx]);
    }
}

/// What the LM head's backward needs besides the two inputs' values.
#[derive(Clone, Debug)]
struct HeadState<B: Backend> {
    hidden: FloatTensor<B>,
    weight: FloatTensor<B>,
    layout: HeadWeight,
    targets: Arc<[u32]>,
    inv_temperature: f32,
    lse: FloatTensor<B>,
}

#[derive(Debug)]
struct TokenLogprobsBackward<B: Backend>(Table<B>);

impl<B: Backend> Backward<B, 2> for TokenLogprobsBackward<B> {
    type State = HeadState<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let s = ops.state.clone();
        let d_out = grads.consume::<B>(&ops.node);
        let values = self.0.0.token_logprobs_backward(
            s.hidden,
            s.weight,
            s.layout,
            &s.targets,
            s.inv_temperature,
            s.lse,
            d_out,
        );
        register::<B, 2>(grads, parent_ids!(ops), values);
    }
}

impl<B: Kernels, C: CheckpointStrategy> Kernels for Autodiff<B, C> {
    fn on_cpu_threads() -> bool {
        B::on_cpu_threads()
    }

    fn matmul(lhs: FloatTensor<Self>, rhs: FloatTensor<Self>) -> FloatTensor<Self> {
        let Some(f) = B::fused() else {
            return Self::float_matmul(lhs, rhs);
        };
        let prep = MatmulBackward(Table(f))
            .prepare::<C>([lhs.node.clone(), rhs.node.clone()])
            .compute_bound()
            .stateful();
        let (lhs, rhs) = (lhs.primitive, rhs.primitive);
        let out = f.matmul(lhs.clone(), rhs.clone());
        match prep {
            OpsKind::Tracked(prep) => prep.finish([lhs, rhs], out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn attention(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        mask: &AttentionMask,
    ) -> FloatTensor<Self> {
        let Some(f) = B::fused() else {
            return decomposed::attention::<Self>(q, k, v, mask);
        };
        let prep = AttentionBackward(Table(f))
            .prepare::<C>([q.node.clone(), k.node.clone(), v.node.clone()])
            .compute_bound()
            .stateful();
        let (q, k, v) = (q.primitive, k.primitive, v.primitive);
        let (out, lse) = f.attention_forward(q.clone(), k.clone(), v.clone(), mask);
        match prep {
            OpsKind::Tracked(prep) => prep.finish(([q, k, v, out.clone(), lse], mask.clone()), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn rms_norm(x: FloatTensor<Self>, gamma: FloatTensor<Self>, eps: f64) -> FloatTensor<Self> {
        let Some(f) = B::fused() else {
            return decomposed::rms_norm::<Self>(x, gamma, eps);
        };
        let prep = RmsNormBackward(Table(f))
            .prepare::<C>([x.node.clone(), gamma.node.clone()])
            .compute_bound()
            .stateful();
        let (x, gamma) = (x.primitive, gamma.primitive);
        let (y, inv_rms) = f.rms_norm_forward(x.clone(), gamma.clone(), eps);
        match prep {
            OpsKind::Tracked(prep) => prep.finish([x, gamma, inv_rms], y),
            OpsKind::UnTracked(prep) => prep.finish(y),
        }
    }

    fn swiglu(gate: FloatTensor<Self>, up: FloatTensor<Self>) -> FloatTensor<Self> {
        let Some(f) = B::fused() else {
            return decomposed::swiglu::<Self>(gate, up);
        };
        let prep = SwigluBackward(Table(f))
            .prepare::<C>([gate.node.clone(), up.node.clone()])
            .compute_bound()
            .stateful();
        let (gate, up) = (gate.primitive, up.primitive);
        let out = f.swiglu_forward(gate.clone(), up.clone());
        match prep {
            OpsKind::Tracked(prep) => prep.finish([gate, up], out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn rope(
        x: FloatTensor<Self>,
        cos: FloatTensor<Self>,
        sin: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let Some(f) = B::fused() else {
            return decomposed::rope::<Self>(x, cos, sin);
        };
        let prep = RopeBackward(Table(f))
            .prepare::<C>([x.node.clone()])
            .compute_bound()
            .stateful();
        let (cos, sin) = (cos.primitive, sin.primitive);
        let out = f.rope(x.primitive, cos.clone(), sin.clone(), false);
        match prep {
            OpsKind::Tracked(prep) => prep.finish([cos, sin], out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    fn token_logprobs(
        hidden: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        layout: HeadWeight,
        targets: IntTensor<Self>,
        inv_temperature: f32,
        entropy: bool,
    ) -> FloatTensor<Self> {
        let Some(f) = B::fused() else {
            return decomposed::token_logprobs::<Self>(
                hidden,
                weight,
                layout,
                targets,
                inv_temperature,
                entropy,
            );
        };
        let prep = TokenLogprobsBackward(Table(f))
            .prepare::<C>([hidden.node.clone(), weight.node.clone()])
            .compute_bound()
            .stateful();
        let targets: Arc<[u32]> = host_targets::<B>(targets).into();
        let (hidden, weight) = (hidden.primitive, weight.primitive);
        let (out, lse) = f.token_logprobs_forward(
            hidden.clone(),
            weight.clone(),
            layout,
            &targets,
            inv_temperature,
            entropy,
        );
        match prep {
            OpsKind::Tracked(prep) => prep.finish(
                HeadState {
                    hidden,
                    weight,
                    layout,
                    targets,
                    inv_temperature,
                    lse,
                },
                out,
            ),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }
}
