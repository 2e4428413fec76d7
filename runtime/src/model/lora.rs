//! Low-rank adapters (LoRA, Hu et al. 2021) over a frozen policy: `finetune = lora { ... }`.
//!
//! Each targeted linear layer `W` of every block computes `W x + s · B A dropout(x)` with
//! `s = alpha / rank`. `A` (`[d_in, rank]`) is drawn as PEFT draws `lora_A`
//! (Kaiming-uniform with `a = √5`, so `U(±1/√d_in)`) and `B` (`[rank, d_out]`) is zero, so a
//! fresh adapter leaves the model exactly as it was. [`Policy::with_lora`] freezes every base
//! weight: gradients, the optimizer's state and checkpoints then cover the adapters (and a
//! shared value head) alone, [`Trainable`].
//!
//! The KL reference is [`Policy::without_lora`], the base with the adapters off. burn's tensors
//! are reference-counted, so it shares the base's weights with the policy instead of copying
//! them; and since the base is frozen, it never drifts from them.
//!
//! [`save_peft`] writes the adapters as PEFT does (`adapter_config.json`,
//! `adapter_model.safetensors` with its tensor names), for `PeftModel.from_pretrained`;
//! [`Policy::merged`] folds them into the base weights.

use std::path::Path;

use agentry_dsl::spec::{self, LoraTarget};
use burn::module::{Initializer, Module, ModuleVisitor, Param};
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::record::{Recorder, RecorderError};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use super::hf::{f32_values, write_f32_safetensors};
use super::kernels::{self, Kernels};
use super::transformer::{DecoderBlock, Policy};

/// One adapter: `x ↦ B A x`, stored in burn's `[in, out]` layout.
#[derive(Module, Debug)]
pub struct Adapter<B: Backend> {
    /// Down projection `[d_in, rank]` (PEFT's `lora_A.weight`, transposed).
    pub a: Param<Tensor<B, 2>>,
    /// Up projection `[rank, d_out]`, zero at the start (PEFT's `lora_B.weight`, transposed).
    pub b: Param<Tensor<B, 2>>,
}

impl<B: Backend> Adapter<B> {
    fn init(d_in: usize, d_out: usize, rank: usize, device: &B::Device) -> Self {
        let bound = 1.0 / (d_in as f64).sqrt();
        Adapter {
            a: Initializer::Uniform {
                min: -bound,
                max: bound,
            }
            .init([d_in, rank], device),
            b: Initializer::Zeros.init([rank, d_out], device),
        }
    }

    /// `B A` as an `[in, out]` matrix: the change the adapter makes to the layer's weight,
    /// before scaling.
    fn product(&self) -> Tensor<B, 2> {
        self.a.val().matmul(self.b.val())
    }
}

/// The adapters of one decoder block, one per target (`None` where the file targets nothing).
#[derive(Module, Debug)]
pub struct BlockAdapters<B: Backend> {
    /// On the query projection.
    pub q: Option<Adapter<B>>,
    /// On the key projection.
    pub k: Option<Adapter<B>>,
    /// On the value projection.
    pub v: Option<Adapter<B>>,
    /// On the attention output projection.
    pub o: Option<Adapter<B>>,
    /// On the SwiGLU gate projection.
    pub gate: Option<Adapter<B>>,
    /// On the SwiGLU up projection.
    pub up: Option<Adapter<B>>,
    /// On the feed-forward down projection.
    pub down: Option<Adapter<B>>,
}

impl<B: Backend> BlockAdapters<B> {
    /// The adapter on `target`, if any.
    pub fn get(&self, target: LoraTarget) -> Option<&Adapter<B>> {
        match target {
            LoraTarget::Q => self.q.as_ref(),
            LoraTarget::K => self.k.as_ref(),
            LoraTarget::V => self.v.as_ref(),
            LoraTarget::O => self.o.as_ref(),
            LoraTarget::Gate => self.gate.as_ref(),
            LoraTarget::Up => self.up.as_ref(),
            LoraTarget::Down => self.down.as_ref(),
        }
    }
}

/// The base layer `target` names in `block`.
pub(crate) fn layer<B: Backend>(block: &DecoderBlock<B>, target: LoraTarget) -> &Linear<B> {
    match target {
        LoraTarget::Q => &block.q,
        LoraTarget::K => &block.k,
        LoraTarget::V => &block.v,
        LoraTarget::O => &block.out,
        LoraTarget::Gate => &block.gate,
        LoraTarget::Up => &block.up,
        LoraTarget::Down => &block.down,
    }
}

pub(super) fn layer_mut<B: Backend>(
    block: &mut DecoderBlock<B>,
    target: LoraTarget,
) -> &mut Linear<B> {
    match target {
        LoraTarget::Q => &mut block.q,
        LoraTarget::K => &mut block.k,
        LoraTarget::V => &mut block.v,
        LoraTarget::O => &mut block.out,
        LoraTarget::Gate => &mut block.gate,
        LoraTarget::Up => &mut block.up,
        LoraTarget::Down => &mut block.down,
    }
}

/// A policy's adapters: one [`BlockAdapters`] per block, and the settings they were made with.
#[derive(Module, Debug)]
pub struct Lora<B: Backend> {
    /// Per decoder block, in order.
    pub blocks: Vec<BlockAdapters<B>>,
    /// Dropout on the adapters' input; active only under autodiff (training).
    pub dropout: Dropout,
    /// Rank, alpha, dropout and targets, as the experiment declared them.
    #[module(skip)]
    pub settings: spec::Lora,
}

impl<B: Backend> Lora<B> {
    /// Fresh adapters for `blocks` (their layers' shapes), drawn from the backend's RNG.
    fn init(settings: &spec::Lora, blocks: &[DecoderBlock<B>], device: &B::Device) -> Self {
        let blocks = blocks
            .iter()
            .map(|block| {
                let adapter = |target: LoraTarget| {
                    settings.targets.contains(&target).then(|| {
                        let [d_in, d_out] = layer(block, target).weight.dims();
                        Adapter::init(d_in, d_out, settings.rank, device)
                    })
                };
                BlockAdapters {
                    q: adapter(LoraTarget::Q),
                    k: adapter(LoraTarget::K),
                    v: adapter(LoraTarget::V),
                    o: adapter(LoraTarget::O),
                    gate: adapter(LoraTarget::Gate),
                    up: adapter(LoraTarget::Up),
                    down: adapter(LoraTarget::Down),
                }
            })
            .collect();
        Lora {
            blocks,
            dropout: DropoutConfig::new(settings.dropout).init(),
            settings: settings.clone(),
        }
    }

    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.settings.scale()
    }
}

impl<B: Kernels> Lora<B> {
    /// The adapter's contribution `s · B A dropout(x)` for rows `x` (`[n, d_in]`) of `target`
    /// in block `block`, or `None` where that layer has no adapter.
    pub(crate) fn delta(
        &self,
        block: usize,
        target: LoraTarget,
        x: &Tensor<B, 2>,
    ) -> Option<Tensor<B, 2>> {
        let adapter = self.blocks[block].get(target)?;
        let x = self.dropout.forward(x.clone());
        let low = kernels::matmul(x, adapter.a.val()) * self.scale();
        Some(kernels::matmul(low, adapter.b.val()))
    }
}

/// What training changes in a policy: its adapters and its value head. With LoRA this is all
/// an optimizer step updates and all a checkpoint stores; the base comes from its file.
#[derive(Module, Debug)]
pub struct Trainable<B: Backend> {
    /// The adapters.
    pub lora: Option<Lora<B>>,
    /// PPO's shared value head.
    pub value: Option<Linear<B>>,
}

impl<B: Backend> Policy<B> {
    /// This policy with fresh adapters as `settings` declare (drawn from the backend's RNG:
    /// seed it first) and every base weight frozen. A value head, present or added later,
    /// stays trainable.
    ///
    /// burn draws a parameter's initial value when it is first read, not when it is built;
    /// every weight is read here, base first, so the base and the adapters are the draws that
    /// follow the seed, whatever later reseeds the RNG (dropout) or clones the policy.
    pub fn with_lora(self, settings: &spec::Lora) -> Self {
        materialize(&self);
        let device = self.embed.weight.val().device();
        let lora = Lora::init(settings, &self.blocks, &device);
        materialize(&lora);
        Policy {
            embed: self.embed.no_grad(),
            blocks: self.blocks.into_iter().map(Module::no_grad).collect(),
            norm: self.norm.no_grad(),
            head: self.head.map(Module::no_grad),
            lora: Some(lora),
            ..self
        }
    }

    /// The base model: this policy with its adapters off (and its value head kept). The
    /// weights are shared with `self`, not copied.
    pub fn without_lora(self) -> Self {
        Policy { lora: None, ..self }
    }

    /// The part training changes ([`Trainable`]), sharing its tensors with `self`.
    pub fn trainable(&self) -> Trainable<B> {
        Trainable {
            lora: self.lora.clone(),
            value: self.value.clone(),
        }
    }

    /// This policy with `trainable`'s adapters and value head in place of its own.
    pub fn with_trainable(self, trainable: Trainable<B>) -> Self {
        Policy {
            lora: trainable.lora,
            value: trainable.value,
            ..self
        }
    }

    /// Records what training changed with `recorder`: every weight, or with LoRA only
    /// [`Trainable`] (the base is in its file). Checkpoints and `policy.mpk` are written so.
    pub fn record_trained<R: Recorder<B>>(
        &self,
        recorder: &R,
        args: R::RecordArgs,
    ) -> Result<R::RecordOutput, RecorderError> {
        match self.lora {
            Some(_) => recorder.record(self.trainable().into_record(), args),
            None => recorder.record(self.clone().into_record(), args),
        }
    }

    /// Loads what [`Policy::record_trained`] wrote into this policy, built as the experiment
    /// builds it (with adapters when it declares LoRA).
    pub fn load_trained<R: Recorder<B>>(
        self,
        recorder: &R,
        args: R::LoadArgs,
        device: &B::Device,
    ) -> Result<Self, RecorderError> {
        Ok(match self.lora {
            Some(_) => {
                let trainable = self.trainable().load_record(recorder.load(args, device)?);
                self.with_trainable(trainable)
            }
            None => self.load_record(recorder.load(args, device)?),
        })
    }

    /// The adapters folded into the base weights, `W + s · A B`, and removed: the same
    /// function as one dense policy (for export, or for serving without the adapters' cost).
    pub fn merged(self) -> Self {
        let Some(lora) = self.lora.clone() else {
            return self;
        };
        let scale = lora.scale();
        // The base changes: its blocks no longer hold its values.
        let mut policy = Policy {
            quantized: None,
            ..self.without_lora()
        };
        for (block, adapters) in policy.blocks.iter_mut().zip(&lora.blocks) {
            for target in LoraTarget::ALL {
                if let Some(adapter) = adapters.get(target) {
                    let linear = layer_mut(block, target);
                    let merged = linear.weight.val() + adapter.product() * scale;
                    linear.weight = Param::from_tensor(merged).set_require_grad(false);
                }
            }
        }
        policy
    }
}

/// Reads every float parameter of `module`, in module order, so each lazily initialized one
/// takes its value now.
fn materialize<B: Backend, M: Module<B>>(module: &M) {
    struct Read;
    impl<B: Backend> ModuleVisitor<B> for Read {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            param.val();
        }
    }
    module.visit(&mut Read);
}

/// The Hugging Face (and PEFT) module path of `target` inside `model.layers.N`.
pub fn hf_module(target: LoraTarget) -> &'static str {
    match target {
        LoraTarget::Q => "self_attn.q_proj",
        LoraTarget::K => "self_attn.k_proj",
        LoraTarget::V => "self_attn.v_proj",
        LoraTarget::O => "self_attn.o_proj",
        LoraTarget::Gate => "mlp.gate_proj",
        LoraTarget::Up => "mlp.up_proj",
        LoraTarget::Down => "mlp.down_proj",
    }
}

/// Writes `lora` as a PEFT adapter into `dir` (created if needed): `adapter_config.json` and
/// `adapter_model.safetensors`, with PEFT's names
/// (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`, `[rank, in]`, and
/// `lora_B.weight`, `[out, rank]`, in f32). `base_model` is recorded as
/// `base_model_name_or_path`.
pub fn save_peft<B: Backend>(lora: &Lora<B>, base_model: &str, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let settings = &lora.settings;
    let mut tensors = Vec::new();
    for (i, block) in lora.blocks.iter().enumerate() {
        for target in LoraTarget::ALL {
            let Some(adapter) = block.get(target) else {
                continue;
            };
            let prefix = format!("base_model.model.model.layers.{i}.{}", hf_module(target));
            // burn's `[in, rank]` and `[rank, out]` are torch's `[rank, in]` and `[out, rank]`
            // transposed.
            for (name, tensor) in [("lora_A", adapter.a.val()), ("lora_B", adapter.b.val())] {
                let (shape, values) = f32_values(tensor.transpose());
                tensors.push((format!("{prefix}.{name}.weight"), shape, values));
            }
        }
    }
    write_f32_safetensors(&dir.join("adapter_model.safetensors"), &tensors)?;
    let mut targets: Vec<&str> = settings
        .targets
        .iter()
        .map(|&t| hf_module(t).rsplit('.').next().unwrap_or_default())
        .collect();
    targets.sort_unstable();
    let config = serde_json::json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
    });
    let text = serde_json::to_string_pretty(&config).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("adapter_config.json"), text + "\n")
}
