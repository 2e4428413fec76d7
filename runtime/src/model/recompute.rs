//! Recomputed blocks (`train { recompute = true }`): activation checkpointing per decoder block.
//!
//! A training forward pass under autodiff keeps every operation's inputs for the backward
//! pass: on SmolLM2-135M about 36 KB per position per block, 4.4 GB for a batch of 8 × 512
//! over its 30 blocks. With [`Policy::recompute`] on, the forward pass runs the blocks without
//! recording them, keeps only each block's input (one `[batch, len, d_model]` tensor per
//! block) and hands the rest of the network the last block's output as a fresh leaf. The
//! `Trunk` that remembers this waits on this thread's tape until [`gradients`] runs: it
//! backpropagates the loss to that leaf, then walks the blocks from the last to the first,
//! each time recomputing one block from its kept input under autodiff and backpropagating the
//! gradient it received through it alone. Only one block's activations are alive at a time.
//!
//! Each block's backward pass is a separate `backward()` call on a graph of its own, not a
//! step inside the loss's backward pass: burn's autodiff holds its graph's lock while it
//! runs a step, and a nested `backward()` would wait on it. The gradients are the same as
//! the plain pass's (the same kernels on the same values), summed in another order.
//!
//! LoRA dropout draws its masks from the backend's RNG; a recomputed block must draw the
//! masks its forward pass drew, so under autodiff every block reseeds the RNG from one draw
//! per forward pass and its index (`DropoutSeeds`), recomputed or not.

use std::any::Any;
use std::cell::RefCell;

use burn::module::{AutodiffModule, Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};

use super::kernels::{Kernels, TrainBackend};
use super::transformer::{Policy, Positions};

thread_local! {
    /// The trunks forward passes left for [`gradients`], each a `Box<Trunk<B>>`.
    static TAPE: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// One recomputed forward pass of a policy's blocks: what their backward pass starts from.
struct Trunk<B: Backend> {
    /// The policy as it ran (its tensors shared, not copied).
    policy: Policy<B>,
    /// The tokens, to recompute the embedding when it is trained.
    tokens: Tensor<B, 2, Int>,
    /// The rotary tables and the mask.
    pos: Positions<B>,
    /// Each block's input, unrecorded.
    inputs: Vec<Tensor<B, 3>>,
    /// The last block's output, a leaf of the graph the loss is built on.
    output: Tensor<B, 3>,
    /// How the blocks' dropout was seeded.
    dropout: DropoutSeeds,
}

/// Seeds for LoRA dropout, one per block: `None` without dropout (nothing random runs).
#[derive(Clone, Copy, Debug)]
pub(super) struct DropoutSeeds(Option<u64>);

impl DropoutSeeds {
    /// One draw from the backend's RNG when `policy` has LoRA dropout and records a graph.
    pub(super) fn draw<B: Backend>(policy: &Policy<B>, device: &B::Device) -> Self {
        let active = B::ad_enabled(device)
            && policy
                .lora
                .as_ref()
                .is_some_and(|lora| lora.settings.dropout > 0.0);
        if !active {
            return DropoutSeeds(None);
        }
        let draw = Tensor::<B, 1>::random([2], Distribution::Default, device);
        let bits: Vec<f32> = draw.into_data().to_vec().unwrap_or_default();
        let word = |i: usize| u64::from(bits.get(i).map_or(0, |b| b.to_bits()));
        DropoutSeeds(Some((word(0) << 32) | word(1)))
    }

    /// Seeds the backend's RNG for block `index`'s dropout.
    pub(super) fn seed<B: Backend>(self, index: usize, device: &B::Device) {
        if let Some(base) = self.0 {
            // Distinct per block: an odd multiplier is a bijection on u64.
            B::seed(
                device,
                base ^ (index as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
            );
        }
    }
}

/// The blocks of `policy` on `tokens` without recording them; returns the last block's
/// output as a leaf that takes a gradient, and leaves a [`Trunk`] on this thread's tape.
pub(super) fn trunk<B: Kernels>(
    policy: &Policy<B>,
    tokens: Tensor<B, 2, Int>,
    pos: &Positions<B>,
) -> Tensor<B, 3> {
    let device = policy.device();
    let dropout = DropoutSeeds::draw(policy, &device);
    let unrecorded = policy.clone().no_grad();
    let mut x = unrecorded.embed.forward(tokens.clone());
    let mut inputs = Vec::with_capacity(policy.blocks.len());
    for i in 0..policy.blocks.len() {
        inputs.push(x.clone());
        dropout.seed::<B>(i, &device);
        x = unrecorded.block(i, x, pos, None);
    }
    let output = x.detach().require_grad();
    let trunk = Trunk {
        policy: policy.clone(),
        tokens,
        pos: pos.clone(),
        inputs,
        output: output.clone(),
        dropout,
    };
    TAPE.with_borrow_mut(|tape| tape.push(Box::new(trunk)));
    output
}

/// The trunks on this thread's tape recorded on backend `B`, oldest first; the tape is left
/// empty.
fn take<B: Backend>() -> Vec<Trunk<B>> {
    TAPE.with_borrow_mut(std::mem::take)
        .into_iter()
        .filter_map(|trunk| trunk.downcast::<Trunk<B>>().ok().map(|t| *t))
        .collect()
}

/// Drops the trunks waiting on this thread's tape: an update that is skipped before its
/// backward pass must not leave its blocks' inputs behind.
pub fn forget() {
    TAPE.with_borrow_mut(Vec::clear);
}

/// `loss.backward()` gathered as `module`'s parameter gradients, through every recomputed
/// trunk the loss was built from ([`GradientsParams::from_grads`] when there is none).
pub fn gradients<B: TrainBackend, M: AutodiffModule<B>>(
    loss: Tensor<B, 1>,
    module: &M,
) -> GradientsParams {
    let trunks = take::<B>();
    let mut grads = loss.backward();
    let received: Vec<_> = trunks
        .iter()
        .map(|trunk| trunk.output.grad_remove(&mut grads))
        .collect();
    let mut total = GradientsParams::from_grads(grads, module);
    for (trunk, d_out) in trunks.into_iter().zip(received) {
        if let Some(d_out) = d_out {
            trunk.backward(d_out, module, &mut total);
        }
    }
    total
}

impl<B: TrainBackend> Trunk<B> {
    /// Backpropagates `d_out`, the gradient of the trunk's output, through the blocks and
    /// the embedding, adding what each parameter of `module` receives to `total`.
    fn backward<M: AutodiffModule<B>>(
        self,
        d_out: Tensor<B::InnerBackend, 3>,
        module: &M,
        total: &mut GradientsParams,
    ) {
        let device = self.policy.device();
        let embedding_trained = self.policy.embed.weight.is_require_grad();
        let mut d = d_out;
        for (i, input) in self.inputs.into_iter().enumerate().rev() {
            // The first block's input needs a gradient only for a trained embedding.
            let x = match i > 0 || embedding_trained {
                true => input.detach().require_grad(),
                false => input.detach(),
            };
            let adapters = self.policy.lora.as_ref().map(|lora| &lora.blocks[i]);
            if !x.is_require_grad()
                && !trains(&self.policy.blocks[i])
                && !adapters.is_some_and(trains)
            {
                return; // nothing here or before it takes a gradient
            }
            self.dropout.seed::<B>(i, &device);
            let y = self.policy.block(i, x.clone(), &self.pos, None);
            let mut grads = (y * Tensor::from_inner(d)).sum().backward();
            let d_x = x.grad_remove(&mut grads);
            add_gradients(module, &mut grads, total);
            match d_x {
                Some(d_x) => d = d_x,
                None => return,
            }
        }
        if embedding_trained {
            let x = self.policy.embed.forward(self.tokens);
            let mut grads = (x * Tensor::from_inner(d)).sum().backward();
            add_gradients(module, &mut grads, total);
        }
    }
}

/// Whether any parameter of `module` takes a gradient.
fn trains<B: Backend, M: Module<B>>(module: &M) -> bool {
    struct Any(bool);
    impl<B: Backend> ModuleVisitor<B> for Any {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0 |= param.val().is_require_grad();
        }
    }
    let mut any = Any(false);
    module.visit(&mut any);
    any.0
}

/// Moves every gradient `grads` holds for a parameter of `module` into `total`, adding it to
/// what `total` already holds for that parameter.
fn add_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut B::Gradients,
    total: &mut GradientsParams,
) {
    struct Add<'a, B: AutodiffBackend> {
        grads: &'a mut B::Gradients,
        total: &'a mut GradientsParams,
    }
    impl<B: AutodiffBackend> ModuleVisitor<B> for Add<'_, B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let Some(grad) = param.val().grad_remove(self.grads) else {
                return;
            };
            let sum = match self.total.remove::<B::InnerBackend, D>(param.id) {
                Some(held) => held + grad,
                None => grad,
            };
            self.total.register::<B::InnerBackend, D>(param.id, sum);
        }
    }
    module.visit(&mut Add { grads, total });
}
