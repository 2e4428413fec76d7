//! The optimizer an experiment declares, global gradient-norm clipping, and the one descent
//! step every update goes through (it refuses non-finite updates).

use agentry_dsl::spec;
use burn::module::{AutodiffModule, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{
    Adam, AdamConfig, AdamW, AdamWConfig, GradientsParams, Optimizer, Sgd, SgdConfig,
};
use burn::tensor::Tensor;
use burn::tensor::backend::AutodiffBackend;

use crate::algo::loss::scalar;
use crate::model::TrainBackend;
use crate::model::recompute;

/// One of the optimizers of the language, over module `M`.
#[derive(Clone)]
pub enum PolicyOptimizer<M: AutodiffModule<B>, B: AutodiffBackend> {
    /// `adamw { ... }`.
    AdamW(OptimizerAdaptor<AdamW, M, B>),
    /// `adam { ... }`.
    Adam(OptimizerAdaptor<Adam, M, B>),
    /// `sgd { ... }`.
    Sgd(OptimizerAdaptor<Sgd<B::InnerBackend>, M, B>),
}

impl<M: AutodiffModule<B>, B: AutodiffBackend> PolicyOptimizer<M, B> {
    /// The optimizer the spec declares.
    pub fn new(spec: &spec::Optimizer) -> Self {
        match *spec {
            spec::Optimizer::AdamW {
                weight_decay,
                beta1,
                beta2,
            } => PolicyOptimizer::AdamW(
                AdamWConfig::new()
                    .with_weight_decay(weight_decay as f32)
                    .with_beta_1(beta1 as f32)
                    .with_beta_2(beta2 as f32)
                    .init(),
            ),
            spec::Optimizer::Adam { beta1, beta2 } => PolicyOptimizer::Adam(
                AdamConfig::new()
                    .with_beta_1(beta1 as f32)
                    .with_beta_2(beta2 as f32)
                    .init(),
            ),
            spec::Optimizer::Sgd { momentum } => {
                let momentum =
                    (momentum > 0.0).then(|| MomentumConfig::new().with_momentum(momentum));
                PolicyOptimizer::Sgd(SgdConfig::new().with_momentum(momentum).init())
            }
        }
    }

    /// One update of `module` with learning rate `lr`.
    pub fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        match self {
            PolicyOptimizer::AdamW(o) => o.step(lr, module, grads),
            PolicyOptimizer::Adam(o) => o.step(lr, module, grads),
            PolicyOptimizer::Sgd(o) => o.step(lr, module, grads),
        }
    }
}

/// What one [`descend`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Descent {
    /// The optimizer stepped.
    Applied {
        /// The loss.
        loss: f32,
        /// The global gradient norm before clipping.
        grad_norm: f32,
    },
    /// The loss or the gradient norm was not finite: the module and the optimizer's state are
    /// exactly as they were.
    Skipped {
        /// The loss (possibly not finite).
        loss: f32,
        /// The gradient norm, when the loss was finite and a backward pass ran.
        grad_norm: Option<f32>,
    },
}

impl Descent {
    /// The loss of the update, applied or not.
    pub fn loss(self) -> f32 {
        match self {
            Descent::Applied { loss, .. } | Descent::Skipped { loss, .. } => loss,
        }
    }
}

/// Backward, global-norm clip and optimizer step of `module`, unless the loss or the global
/// gradient norm is not finite.
///
/// A NaN or infinity that reached the weights or Adam's moments would stay there for the rest
/// of the run, so such an update is dropped whole: no optimizer step, the module returned as it
/// came. The norm is the sum of every gradient element's square, so a single non-finite element
/// anywhere makes it non-finite. The policy and PPO's separate critic share this step.
pub fn descend<B: TrainBackend, M: AutodiffModule<B>>(
    module: M,
    optimizer: &mut PolicyOptimizer<M, B>,
    loss: Tensor<B, 1>,
    lr: f64,
    grad_clip: Option<f64>,
) -> (M, Descent) {
    match descend_summed(module, optimizer, Some(loss), lr, grad_clip, &mut Alone) {
        Ok(done) => done,
        Err(never) => match never {},
    }
}

/// How an update's loss and gradients are combined before the step: [`Alone`], or summed with
/// other trainer replicas' (data-parallel training, where every replica must take part in every
/// sum, and then reaches the same decision on the same numbers).
pub trait GradientSum<B: AutodiffBackend> {
    /// Why a sum failed.
    type Error;

    /// The sums over every replica of `loss` and of `module`'s gradients (`None`: this replica
    /// computed none, as for a non-finite loss or an empty share; it still takes part). A
    /// non-finite loss anywhere makes the summed loss non-finite.
    fn sum<M: AutodiffModule<B>>(
        &mut self,
        module: &M,
        loss: f32,
        grads: Option<GradientsParams>,
    ) -> Result<(f32, Option<GradientsParams>), Self::Error>;
}

/// One trainer: the sums are its own loss and gradients.
pub struct Alone;

impl<B: AutodiffBackend> GradientSum<B> for Alone {
    type Error = std::convert::Infallible;

    fn sum<M: AutodiffModule<B>>(
        &mut self,
        _module: &M,
        loss: f32,
        grads: Option<GradientsParams>,
    ) -> Result<(f32, Option<GradientsParams>), Self::Error> {
        Ok((loss, grads))
    }
}

/// [`descend`] on the loss and gradients `sum` makes of this replica's `loss` (`None`: an empty
/// share, which contributes nothing). A loss that is not finite here skips the backward pass;
/// the update is then skipped everywhere, since the summed loss is not finite either.
pub fn descend_summed<B: TrainBackend, M: AutodiffModule<B>, S: GradientSum<B>>(
    module: M,
    optimizer: &mut PolicyOptimizer<M, B>,
    loss: Option<Tensor<B, 1>>,
    lr: f64,
    grad_clip: Option<f64>,
    sum: &mut S,
) -> Result<(M, Descent), S::Error> {
    let (value, grads) = match loss {
        Some(loss) => {
            let value = scalar(loss.clone());
            if value.is_finite() {
                (value, Some(recompute::gradients(loss, &module)))
            } else {
                recompute::forget();
                (value, None)
            }
        }
        None => (0.0, None),
    };
    let (value, grads) = sum.sum(&module, value, grads)?;
    let mut grads = match grads {
        Some(grads) if value.is_finite() => grads,
        _ => {
            return Ok((
                module,
                Descent::Skipped {
                    loss: value,
                    grad_norm: None,
                },
            ));
        }
    };
    let grad_norm = clip_global_norm(&module, &mut grads, grad_clip);
    if !grad_norm.is_finite() {
        return Ok((
            module,
            Descent::Skipped {
                loss: value,
                grad_norm: Some(grad_norm),
            },
        ));
    }
    Ok((
        optimizer.step(lr, module, grads),
        Descent::Applied {
            loss: value,
            grad_norm,
        },
    ))
}

/// The global L2 norm of all gradients of `module`; when `max_norm` is given and exceeded, every
/// gradient is scaled by `max_norm / norm` (clipping the whole update, not each parameter).
/// Returns the norm before clipping.
pub fn clip_global_norm<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: &mut GradientsParams,
    max_norm: Option<f64>,
) -> f32 {
    let mut squares = SquaredNorm::<B> {
        grads,
        total: 0.0,
        _backend: std::marker::PhantomData,
    };
    module.visit(&mut squares);
    let norm = squares.total.sqrt();
    if let Some(max) = max_norm
        && norm > max
        && norm.is_finite()
    {
        let mut scale = Scale::<B> {
            grads,
            factor: max / norm,
            _backend: std::marker::PhantomData,
        };
        module.visit(&mut scale);
    }
    norm as f32
}

struct SquaredNorm<'a, B: AutodiffBackend> {
    grads: &'a GradientsParams,
    total: f64,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for SquaredNorm<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.get::<B::InnerBackend, D>(param.id) {
            let sum: f32 = scalar(grad.powi_scalar(2).sum());
            self.total += f64::from(sum);
        }
    }
}

struct Scale<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    factor: f64,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Scale<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.grads.remove::<B::InnerBackend, D>(param.id) {
            self.grads.register(param.id, grad * self.factor);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::loss::{PolicyLossConfig, PolicyLossInput, policy_loss};
    use agentry_dsl::spec::{Aggregation, Clip, KlEstimator};
    use burn::backend::{Autodiff, Flex};
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::TensorData;

    type B = Autodiff<Flex>;

    fn adamw() -> PolicyOptimizer<Linear<B>, B> {
        PolicyOptimizer::new(&spec::Optimizer::AdamW {
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999,
        })
    }

    fn row(values: &[f32]) -> Tensor<B, 2> {
        Tensor::from_data(
            TensorData::new(values.to_vec(), [1, values.len()]),
            &Default::default(),
        )
    }

    fn weights(module: &Linear<B>) -> Vec<f32> {
        let mut all: Vec<f32> = module.weight.val().into_data().iter::<f32>().collect();
        if let Some(bias) = &module.bias {
            all.extend(bias.val().into_data().iter::<f32>());
        }
        all
    }

    /// A finite loss: the module's outputs pulled towards 1.
    fn ordinary_loss(module: &Linear<B>) -> Tensor<B, 1> {
        (module.forward(row(&[0.5, -1.0, 2.0])) - 1.0)
            .powi_scalar(2)
            .sum()
    }

    #[test]
    fn log_ratios_of_plus_minus_100_leave_every_weight_finite() {
        // The module's outputs are the log-probabilities of four tokens; the behaviour and
        // reference log-probabilities sit 100 nats away on either side, except the last token.
        let mut module = LinearConfig::new(3, 4).init::<B>(&Default::default());
        let mut optimizer = adamw();
        let start = weights(&module);
        let config = PolicyLossConfig {
            clip: Clip {
                low: 0.2,
                high: 0.28,
            },
            dual_clip: Some(3.0),
            aggregation: Aggregation::TokenMean,
            entropy_coef: 0.01,
            kl: Some((KlEstimator::K3, 0.1)),
        };
        for _ in 0..3 {
            let logprobs = module.forward(row(&[0.5, -1.0, 2.0]));
            let detached = logprobs.clone().detach();
            let (loss, _) = policy_loss(
                PolicyLossInput {
                    logprobs: logprobs.clone(),
                    old_logprobs: detached.clone() + row(&[100.0, -100.0, 100.0, 0.0]),
                    is_weights: None,
                    advantages: row(&[1.0, -1.0, -1.0, 1.0]),
                    mask: row(&[1.0; 4]),
                    entropy: row(&[0.5; 4]),
                    ref_logprobs: Some(detached + row(&[-100.0, 100.0, 0.0, 0.0])),
                },
                &config,
            );
            let (next, descent) = descend(module, &mut optimizer, loss, 1e-2, None);
            assert!(
                matches!(descent, Descent::Applied { grad_norm, .. } if grad_norm.is_finite()),
                "{descent:?}"
            );
            module = next;
        }
        let end = weights(&module);
        assert!(end.iter().all(|w| w.is_finite()), "{end:?}");
        assert_ne!(start, end, "the ordinary token still trains");
    }

    #[test]
    fn a_nonfinite_update_changes_neither_weights_nor_optimizer_state() {
        let mut module = LinearConfig::new(3, 4).init::<B>(&Default::default());
        let mut optimizer = adamw();
        // One ordinary step first, so Adam has moments and a step count to protect.
        let loss = ordinary_loss(&module);
        let (next, _) = descend(module, &mut optimizer, loss, 1e-2, None);
        module = next;
        let (kept_module, mut kept_optimizer) = (module.clone(), optimizer.clone());

        // A finite loss whose gradient is NaN: a saturated clamp (gradient 0) times an infinite
        // factor, the shape of the bug an unclamped ratio had.
        let infinite = module.forward(row(&[0.5, -1.0, 2.0])) * f32::INFINITY;
        let loss = infinite.clamp(-1.0, 1.0).sum();
        let (next, descent) = descend(module, &mut optimizer, loss, 1e-2, None);
        assert!(
            matches!(descent, Descent::Skipped { grad_norm: Some(n), .. } if !n.is_finite()),
            "{descent:?}"
        );
        assert!(descent.loss().is_finite());
        module = next;
        // A NaN loss is refused before any backward pass.
        let loss = ordinary_loss(&module) * f32::NAN;
        let (next, descent) = descend(module, &mut optimizer, loss, 1e-2, None);
        assert!(
            matches!(descent, Descent::Skipped { grad_norm: None, loss } if loss.is_nan()),
            "{descent:?}"
        );
        module = next;
        assert_eq!(weights(&module), weights(&kept_module));

        // The optimizer's state is untouched too: the same next step from either gives
        // bit-identical weights (a moment or step count moved by the skips would not).
        let (after_skips, _) = descend(
            module.clone(),
            &mut optimizer,
            ordinary_loss(&module),
            1e-2,
            None,
        );
        let (never_skipped, _) = descend(
            kept_module.clone(),
            &mut kept_optimizer,
            ordinary_loss(&kept_module),
            1e-2,
            None,
        );
        assert_eq!(weights(&after_skips), weights(&never_skipped));
        assert_ne!(weights(&after_skips), weights(&kept_module));
    }
}
