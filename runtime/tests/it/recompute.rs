//! Recomputed blocks (`train { recompute = true }`): the gradients equal those of the whole
//! recorded graph, for a fully trained policy (tied embedding: its gradient comes from both
//! ends), for LoRA adapters with and without dropout, over several forward passes summed into
//! one loss; and a run with the key trains as one without it.

use std::collections::BTreeMap;

use crate::common::{self, experiment, seeded, serial};
use crate::lora::{config, lora, perturbed, tokens};
use agentry_dsl::spec::{Lora, LoraTarget};
use agentry_runtime::model::{Policy, Want, recompute};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor, TensorData};

type Train = Autodiff<Flex>;

/// Makes every parameter a leaf that takes a gradient.
struct Leaves;

impl ModuleMapper<Train> for Leaves {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<Tensor<Train, D>>,
    ) -> Param<Tensor<Train, D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.detach().require_grad(), mapper)
    }
}

/// Every parameter's gradient in `grads`, by id.
fn gradient_values(policy: &Policy<Train>, grads: &GradientsParams) -> BTreeMap<ParamId, Vec<f32>> {
    struct Collect<'a>(&'a GradientsParams, BTreeMap<ParamId, Vec<f32>>);
    impl ModuleVisitor<Train> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Train, D>>) {
            if let Some(grad) = self.0.get::<Flex, D>(param.id) {
                let values = grad.into_data().convert::<f32>().into_vec().unwrap();
                self.1.insert(param.id, values);
            }
        }
    }
    let mut collect = Collect(grads, BTreeMap::new());
    policy.visit(&mut collect);
    collect.1
}

/// The gradients of a loss built from two forward passes (two trunks when recomputing):
/// log-probabilities and entropies of one batch, and log-probabilities of another. The
/// backend is seeded first, so LoRA dropout draws the same masks in both modes.
fn gradients(policy: &Policy<Train>, recompute: bool) -> BTreeMap<ParamId, Vec<f32>> {
    let device = Default::default();
    let policy = policy.clone().with_recompute(recompute);
    let grads = common::seeded_run::<Train, _>(&device, 17, |device| {
        let first = tokens::<Train>(device);
        let ids: Vec<i64> = (0..3 * 6).map(|i| (i * 5 + 1) % 40).collect();
        let second = Tensor::<Train, 2, Int>::from_data(TensorData::new(ids, [3, 6]), device);
        let scored = |t: &Tensor<Train, 2, Int>| {
            let [b, len] = t.dims();
            (0..b * (len - 1)).map(|i| i % 3 != 1).collect::<Vec<_>>()
        };
        let a = policy.score(first.clone(), &scored(&first), 0.9, Want::Policy);
        let b = policy.score(second.clone(), &scored(&second), 1.0, Want::LogProbs);
        let loss = a.logprobs.sum().neg() + a.entropy.sum() * 0.1 - b.logprobs.sum() * 0.5;
        recompute::gradients(loss, &policy)
    });
    gradient_values(&policy, &grads)
}

fn assert_same_gradients(policy: &Policy<Train>, what: &str) {
    let whole = gradients(policy, false);
    let recomputed = gradients(policy, true);
    assert!(!whole.is_empty(), "{what}: something trains");
    assert_eq!(
        whole.keys().collect::<Vec<_>>(),
        recomputed.keys().collect::<Vec<_>>(),
        "{what}: the same parameters receive gradients"
    );
    for (id, expected) in &whole {
        let got = &recomputed[id];
        let scale = expected.iter().fold(1e-3f32, |m, v| m.max(v.abs()));
        let gap = expected
            .iter()
            .zip(got)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            gap <= 1e-5 * scale,
            "{what}: parameter {id}: gradients differ by {gap} (largest {scale})"
        );
    }
}

#[test]
fn recomputed_blocks_give_the_gradients_of_the_whole_graph() {
    let device = Default::default();
    let full: Policy<Train> = seeded::<Train, _>(&device, 5, |d| {
        let policy: Policy<Train> = config().init(d);
        // burn draws weights when first read: read them all under this seed.
        let _ = policy.forward(tokens::<Train>(d));
        policy
    });
    assert_same_gradients(&full, "full fine-tuning, tied embedding");

    // Adapters with `B` perturbed, so that `A` takes a gradient too; each a leaf again.
    let adapted = |settings: Lora, seed| {
        let policy = seeded::<Train, _>(&device, seed, |_| {
            perturbed(full.clone().with_lora(&settings))
        });
        let mut trainable = policy.trainable();
        trainable.lora = trainable.lora.map(|lora| lora.map(&mut Leaves));
        policy.with_trainable(trainable)
    };
    assert_same_gradients(
        &adapted(lora(&LoraTarget::ALL), 6),
        "LoRA on every projection",
    );
    let dropout = Lora {
        dropout: 0.3,
        ..lora(&[LoraTarget::Q, LoraTarget::V, LoraTarget::Down])
    };
    assert_same_gradients(&adapted(dropout, 7), "LoRA with dropout");
}

/// A run's recomputation is its `train` block's: the warm-up's first loss (before any update)
/// is the same bit for bit, and the updates after it train the same weights up to float
/// summation order.
#[test]
fn a_run_with_recomputed_blocks_trains_as_one_without() {
    let source = crate::lora::TINY_LORA;
    let with = source.replace(
        "checkpoint_every = 2",
        "checkpoint_every = 2, recompute = true",
    );
    assert_ne!(with, source);
    let losses = |source: &str, name: &str| -> Vec<f64> {
        let out = common::scratch_in("recompute", name);
        let summary = {
            let _guard = serial();
            common::run_on_flex(&experiment(source), &out, Some(0), None).unwrap()
        };
        common::metrics_without_timings(&summary.run_dir)
            .iter()
            .filter(|line| line["phase"] == "sft")
            .map(|line| line["loss"].as_f64().unwrap())
            .collect()
    };
    let plain = losses(source, "plain");
    let recomputed = losses(&with, "recomputed");
    assert_eq!(plain.len(), 3, "three warm-up steps: {plain:?}");
    assert_eq!(plain[0].to_bits(), recomputed[0].to_bits());
    for (a, b) in plain.iter().zip(&recomputed) {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "{plain:?} vs {recomputed:?}"
        );
    }
}
