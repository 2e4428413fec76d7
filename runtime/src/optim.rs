//! The optimizer an experiment declares, and global gradient-norm clipping.

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
