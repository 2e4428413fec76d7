//! LoRA (`finetune = lora`): fresh adapters leave the model as it was, only the adapters train,
//! merging them computes what they compute, PEFT's file layout, and whole runs (warm-up, GRPO
//! with a KL reference, dropout) that resume exactly, checkpoint the adapters alone and refuse
//! a changed base model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::common::{self, experiment, seeded, serial};
use agentry_dsl::spec::{Lora, LoraTarget};
use agentry_runtime::checkpoint::Checkpoint;
use agentry_runtime::model::lora::save_peft;
use agentry_runtime::model::{Policy, PolicyConfig};
use agentry_runtime::optim::{PolicyOptimizer, descend};
use agentry_runtime::{Experiment, RunError, RunSummary};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::{Distribution, Int, Tensor, TensorData};

type Train = Autodiff<Flex>;

pub(crate) fn config() -> PolicyConfig {
    PolicyConfig {
        vocab: 40,
        layers: 2,
        d_model: 16,
        heads: 4,
        kv_heads: 2,
        ffn: 24,
        context: 32,
        tie_embeddings: true,
    }
}

pub(crate) fn lora(targets: &[LoraTarget]) -> Lora {
    Lora {
        rank: 4,
        alpha: 8.0,
        dropout: 0.0,
        targets: targets.to_vec(),
    }
}

pub(crate) fn tokens<B: burn::tensor::backend::Backend>(device: &B::Device) -> Tensor<B, 2, Int> {
    let ids: Vec<i64> = (0..2 * 9).map(|i| (i * 7 + 3) % 40).collect();
    Tensor::from_data(TensorData::new(ids, [2, 9]), device)
}

fn values<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().into_vec().unwrap()
}

/// The largest absolute difference between two equally long vectors.
fn max_gap(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
}

/// Every float parameter of `module`, in module order: its id and its bits.
fn parameters<B: burn::tensor::backend::Backend, M: Module<B>>(
    module: &M,
) -> Vec<(ParamId, Vec<u32>)> {
    struct Bits<B: burn::tensor::backend::Backend>(
        Vec<(ParamId, Vec<u32>)>,
        std::marker::PhantomData<B>,
    );
    impl<B: burn::tensor::backend::Backend> ModuleVisitor<B> for Bits<B> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            let bits = values(param.val()).into_iter().map(f32::to_bits).collect();
            self.0.push((param.id, bits));
        }
    }
    let mut bits = Bits(Vec::new(), std::marker::PhantomData);
    module.visit(&mut bits);
    bits.0
}

/// Sets every adapter's `B` (zero when fresh) to small random values, so the adapters change
/// what the model computes.
pub(crate) fn perturbed<B: burn::tensor::backend::Backend>(policy: Policy<B>) -> Policy<B> {
    struct Perturb;
    impl<B: burn::tensor::backend::Backend> ModuleMapper<B> for Perturb {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let noise = Tensor::random(
                tensor.shape(),
                Distribution::Normal(0.0, 0.3),
                &tensor.device(),
            );
            Param::from_mapped_value(id, tensor + noise, mapper)
        }
    }
    let mut trainable = policy.trainable();
    trainable.lora = trainable.lora.map(|lora| lora.map(&mut Perturb));
    policy.with_trainable(trainable)
}

#[test]
fn fresh_adapters_leave_the_model_unchanged_and_only_they_train() {
    let device = Default::default();
    let x = tokens::<Train>(&device);
    let base: Policy<Train> = seeded::<Train, _>(&device, 3, |d| config().init(d));
    let logits = values(base.forward(x.clone()));
    let adapted = seeded::<Train, _>(&device, 4, |_| {
        base.clone().with_lora(&lora(&LoraTarget::ALL))
    });
    assert_eq!(
        logits,
        values(adapted.forward(x.clone())),
        "B = 0: the adapters add exactly nothing"
    );
    let lora_ids: Vec<ParamId> = parameters(&adapted.trainable())
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(
        lora_ids.len(),
        2 * 7 * 2,
        "A and B for 7 targets in 2 blocks"
    );

    // Two optimizer steps (the second moves A too, once B is not zero): every base weight is
    // bit for bit what it was; every adapter matrix moved.
    let before = parameters(&adapted);
    let mut optimizer = PolicyOptimizer::new(&agentry_dsl::spec::Optimizer::default());
    let mut policy = adapted;
    for _ in 0..2 {
        let (logprobs, _) = policy.token_logprobs(x.clone());
        let loss = logprobs.sum().neg();
        let (next, descent) = descend(policy, &mut optimizer, loss, 1e-2, None);
        assert!(matches!(
            descent,
            agentry_runtime::optim::Descent::Applied { .. }
        ));
        policy = next;
    }
    let after: BTreeMap<ParamId, Vec<u32>> = parameters(&policy).into_iter().collect();
    for (id, bits) in &before {
        if lora_ids.contains(id) {
            assert_ne!(&after[id], bits, "an adapter matrix did not train");
        } else {
            assert_eq!(&after[id], bits, "a base weight changed");
        }
    }
}

#[test]
fn merged_adapters_compute_what_the_adapters_compute() {
    let device = Default::default();
    let policy: Policy<Flex> = seeded::<Flex, _>(&device, 5, |d| {
        perturbed(config().init(d).with_lora(&lora(&[
            LoraTarget::Q,
            LoraTarget::O,
            LoraTarget::Down,
        ])))
    });
    let x = tokens::<Flex>(&device);
    let adapted = values(policy.forward(x.clone()));
    let base = values(policy.clone().without_lora().forward(x.clone()));
    let merged = policy.clone().merged();
    assert!(merged.lora.is_none());
    let merged = values(merged.forward(x));
    let gap = max_gap;
    assert!(
        gap(&adapted, &base) > 1e-3,
        "the adapters change the logits"
    );
    assert!(
        gap(&adapted, &merged) < 1e-5,
        "merged differs by {}",
        gap(&adapted, &merged)
    );
}

#[test]
fn adapters_are_written_in_peft_layout() {
    let device = Default::default();
    let policy: Policy<Flex> = seeded::<Flex, _>(&device, 6, |d| {
        perturbed(config().init(d).with_lora(&lora(&[
            LoraTarget::V,
            LoraTarget::Q,
            LoraTarget::Gate,
        ])))
    });
    let dir = common::scratch_in("lora", "peft");
    let lora = policy.lora.as_ref().unwrap();
    save_peft(lora, "models/base.gguf", &dir).unwrap();
    let config_json = common::json(&dir.join("adapter_config.json"));
    assert_eq!(config_json["peft_type"], "LORA");
    assert_eq!(config_json["task_type"], "CAUSAL_LM");
    assert_eq!(config_json["r"], 4);
    assert_eq!(config_json["lora_alpha"], 8.0);
    assert_eq!(config_json["base_model_name_or_path"], "models/base.gguf");
    assert_eq!(
        config_json["target_modules"],
        serde_json::json!(["gate_proj", "q_proj", "v_proj"])
    );
    let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = file.names().into_iter().map(str::to_string).collect();
    names.sort();
    let mut expected = Vec::new();
    for layer in 0..2 {
        for module in ["mlp.gate_proj", "self_attn.q_proj", "self_attn.v_proj"] {
            for ab in ["lora_A", "lora_B"] {
                expected.push(format!(
                    "base_model.model.model.layers.{layer}.{module}.{ab}.weight"
                ));
            }
        }
    }
    expected.sort();
    assert_eq!(names, expected);
    // torch layout: A is `[rank, in]`, B is `[out, rank]`; the values are burn's transposed.
    let q_b = file
        .tensor("base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight")
        .unwrap();
    assert_eq!(q_b.shape(), [16, 4]);
    let v_a = file
        .tensor("base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight")
        .unwrap();
    assert_eq!(v_a.shape(), [4, 16]);
    let gate_b = file
        .tensor("base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight")
        .unwrap();
    assert_eq!(gate_b.shape(), [24, 4]);
    let stored: Vec<f32> = gate_b
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let burn_b = values(lora.blocks[0].gate.as_ref().unwrap().b.val()); // [4, 24]
    for out in 0..24 {
        for r in 0..4 {
            assert_eq!(stored[out * 4 + r], burn_b[r * 24 + out]);
        }
    }
}

/// A tiny LoRA run with everything that could go wrong on resume: a warm-up, GRPO with a KL
/// penalty (its reference is the base, rebuilt rather than stored), an SFT term, dropout
/// (masks from the backend's RNG), AdamW, periodic evaluations and checkpoints.
pub(crate) const TINY_LORA: &str = r#"
experiment tiny_lora {
    seed = 9
    device = flex
    model policy {
        arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }
        finetune = lora { rank = 4, alpha = 8, dropout = 0.1, targets = [q, v, up] }
    }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2, kl = k1(0.1, as = reward), sft = constant(0.1) }
    train {
        steps = 4, batch = 4, lr = 1e-2, max_new_tokens = 8, top_k = 20
        warmup = sft { steps = 3, demonstrations = 8, batch = 2 }
        checkpoint_every = 2
    }
    eval { every = 2, episodes = 2 }
}
"#;

fn run(
    source: &str,
    out: &Path,
    steps: u64,
    resume: Option<&Path>,
) -> Result<RunSummary, RunError> {
    let _guard = serial();
    common::run_on_flex(&experiment(source), out, Some(steps), resume)
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("lora", name)
}

#[test]
fn a_lora_run_trains_the_adapters_alone_and_resumes_exactly() {
    let straight = run(TINY_LORA, &scratch("straight"), 4, None).unwrap();
    let out = scratch("split");
    let first = run(TINY_LORA, &out, 2, None).unwrap();
    let resumed = run(TINY_LORA, &out, 4, Some(&first.run_dir)).unwrap();
    let metrics = common::metrics_without_timings(&straight.run_dir);
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), metrics);
    let rl: Vec<&serde_json::Value> = metrics.iter().filter(|l| l["phase"] == "rl").collect();
    assert!(
        rl.iter().all(|l| l["grad_norm"].as_f64() > Some(0.0)),
        "every RL step updates the adapters: {rl:?}"
    );

    // The checkpoint holds the adapters, not the base, and no reference.
    let device = Default::default();
    let tokenizer =
        agentry_runtime::text::Tokenizer::load(straight.run_dir.join("tokenizer.json")).unwrap();
    let spec = experiment(TINY_LORA).spec().clone().into_inner();
    let agentry_dsl::spec::Finetune::Lora(settings) = &spec.model.finetune else {
        panic!("lora")
    };
    let fresh = || {
        seeded::<Flex, _>(&device, spec.seed, |d| {
            let arch = match &spec.model.arch {
                agentry_dsl::spec::Arch::Transformer(arch) => arch,
                _ => unreachable!(),
            };
            PolicyConfig::from_arch(arch, tokenizer.vocab_size())
                .init::<Flex>(d)
                .with_lora(settings)
        })
    };
    let path = straight.run_dir.join("checkpoints/rl-000004.ckpt");
    let checkpoint = Checkpoint::read(&path).unwrap();
    assert!(
        checkpoint
            .restore_reference(fresh(), &device)
            .unwrap()
            .is_none()
    );
    let restored = checkpoint.restore_policy(fresh(), &device).unwrap();
    let resumed_checkpoint =
        Checkpoint::read(&resumed.run_dir.join("checkpoints/rl-000004.ckpt")).unwrap();
    let again = resumed_checkpoint.restore_policy(fresh(), &device).unwrap();
    assert!(
        parameters(&restored)
            .into_iter()
            .map(|(_, bits)| bits)
            .eq(parameters(&again).into_iter().map(|(_, bits)| bits))
    );
    // The base of the trained policy is the base drawn from the seed, bit for bit; the
    // adapters moved away from a fresh draw.
    let initial = fresh();
    assert!(
        parameters(&restored.clone().without_lora())
            .into_iter()
            .map(|(_, bits)| bits)
            .eq(parameters(&initial.clone().without_lora())
                .into_iter()
                .map(|(_, bits)| bits)),
        "the base weights changed"
    );
    assert!(
        !parameters(&restored.trainable())
            .into_iter()
            .map(|(_, bits)| bits)
            .eq(parameters(&initial.trainable())
                .into_iter()
                .map(|(_, bits)| bits)),
        "the adapters did not train"
    );
    // A full policy of this size is ~10x the adapters; the checkpoint stores only these.
    let full = std::fs::metadata(straight.run_dir.join("policy.mpk"))
        .unwrap()
        .len();
    assert!(
        full < 40_000,
        "policy.mpk holds the adapters alone ({full} bytes)"
    );
    // The PEFT adapter is written at the end.
    assert!(
        straight
            .run_dir
            .join("adapter/adapter_model.safetensors")
            .is_file()
    );
    // Exported merged as a Llama checkpoint, it loads back computing what the adapted policy
    // computes; exported as PEFT, it is the adapter the run wrote at its end.
    let merged_dir = scratch("export-merged");
    agentry_runtime::export::export(
        &straight.run_dir,
        None,
        agentry_runtime::export::Format::Merged,
        &merged_dir,
    )
    .unwrap();
    let (config, loaded) =
        agentry_runtime::model::hf::load_policy::<Flex>(&merged_dir, &device).unwrap();
    assert_eq!(
        config.model_type,
        agentry_runtime::model::hf::ModelType::Llama
    );
    let final_policy = fresh()
        .load_trained(
            &burn::record::NamedMpkFileRecorder::<burn::record::FullPrecisionSettings>::new(),
            straight.run_dir.join("policy.mpk"),
            &device,
        )
        .unwrap();
    let x = tokens::<Flex>(&device);
    let gap = max_gap(
        &values(loaded.forward(x.clone())),
        &values(final_policy.forward(x)),
    );
    assert!(gap < 1e-5, "the merged export differs by {gap}");
    let peft_dir = scratch("export-peft");
    agentry_runtime::export::export(
        &straight.run_dir,
        None,
        agentry_runtime::export::Format::Peft,
        &peft_dir,
    )
    .unwrap();
    for file in ["adapter_model.safetensors", "adapter_config.json"] {
        assert_eq!(
            std::fs::read(peft_dir.join(file)).unwrap(),
            std::fs::read(straight.run_dir.join("adapter").join(file)).unwrap(),
            "{file}"
        );
    }
    let message = agentry_runtime::export::export(
        &straight.run_dir,
        Some(3),
        agentry_runtime::export::Format::Peft,
        &peft_dir,
    )
    .unwrap_err()
    .to_string();
    assert!(
        message.contains("kept no weights of RL step 3"),
        "{message}"
    );

    // Replay rebuilds the base from the seed and loads the adapters from `policy.mpk`: the
    // greedy evaluation episodes regenerate identically.
    let file = straight.run_dir.join("episodes/final.jsonl");
    let line = std::fs::read_to_string(&file)
        .unwrap()
        .lines()
        .position(|l| !serde_json::from_str::<serde_json::Value>(l).unwrap()["turns"][0].is_null())
        .expect("a final episode took a turn")
        + 1;
    let replayed = {
        let _guard = serial();
        agentry_runtime::replay::replay(&format!("{}:{line}", file.display()), None, None).unwrap()
    };
    assert!(
        replayed.identical(),
        "{}\n{:?}",
        replayed.verdict(),
        replayed.checks
    );
    assert!(
        replayed.checks.iter().any(|c| c.contains("regenerat")),
        "{:?}",
        replayed.checks
    );
}

#[test]
fn a_lora_run_refuses_to_resume_on_another_base_model() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2");
    let model = scratch("base-model");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    let source = TINY_LORA
        .replace(
            "arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }",
            &format!("arch = qwen2 {{ weights = \"{}\" }}", model.display()),
        )
        .replace(
            "warmup = sft { steps = 3, demonstrations = 8, batch = 2 }",
            "",
        );
    let out = scratch("base-changed");
    let first = run(&source, &out, 1, None).unwrap();
    // The same shapes, one weight different: only the digest can tell.
    let weights = std::fs::read_dir(&model)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&weights, bytes).unwrap();
    let message = run(&source, &out, 2, Some(&first.run_dir))
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("adapters were trained on a base model with digest sha256:")
            && message.contains("LoRA adapters belong to the base they were trained on"),
        "{message}"
    );
}

/// `scripts/make_lora_reference.py`'s formula for entry (`row`, `col`) of `lora_A` (`matrix`
/// 0, torch's `[rank, in]`) or `lora_B` (1, `[out, rank]`) of target `target` of block `layer`.
fn reference_value(layer: usize, target: usize, matrix: usize, row: usize, col: usize) -> f32 {
    let phase = 1.0
        + 7.0 * layer as f64
        + 13.0 * target as f64
        + 29.0 * matrix as f64
        + 0.37 * row as f64
        + 0.11 * col as f64;
    (0.05 * phase.sin()) as f32
}

/// The tiny Qwen2 fixture with the reference's adapters (rank 2, alpha 3, every target).
fn reference_policy() -> Policy<Flex> {
    let device = Default::default();
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2");
    let (_, policy) = agentry_runtime::model::hf::load_policy::<Flex>(&base, &device).unwrap();
    let settings = Lora {
        rank: 2,
        alpha: 3.0,
        dropout: 0.0,
        targets: LoraTarget::ALL.to_vec(),
    };
    let policy = seeded::<Flex, _>(&device, 0, |_| policy.with_lora(&settings));
    let mut trainable = policy.trainable();
    let lora = trainable.lora.as_mut().unwrap();
    for (layer, block) in lora.blocks.iter_mut().enumerate() {
        for (t, adapter) in [
            &mut block.q,
            &mut block.k,
            &mut block.v,
            &mut block.o,
            &mut block.gate,
            &mut block.up,
            &mut block.down,
        ]
        .into_iter()
        .enumerate()
        {
            let adapter = adapter.as_mut().unwrap();
            // burn's A is `[in, rank]` (torch's transposed), B `[rank, out]`.
            let [d_in, rank] = adapter.a.dims();
            let [_, d_out] = adapter.b.dims();
            let a: Vec<f32> = (0..d_in)
                .flat_map(|i| (0..rank).map(move |r| reference_value(layer, t, 0, r, i)))
                .collect();
            let b: Vec<f32> = (0..rank)
                .flat_map(|r| (0..d_out).map(move |o| reference_value(layer, t, 1, o, r)))
                .collect();
            adapter.a =
                Param::from_tensor(Tensor::from_data(TensorData::new(a, [d_in, rank]), &device));
            adapter.b = Param::from_tensor(Tensor::from_data(
                TensorData::new(b, [rank, d_out]),
                &device,
            ));
        }
    }
    policy.with_trainable(trainable)
}

fn safetensors_map(path: &Path) -> BTreeMap<String, (Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| (name, (view.shape().to_vec(), view.data().to_vec())))
        .collect()
}

/// Against PEFT itself (`scripts/make_lora_reference.py`): the same adapters on the same base
/// compute PEFT's logits, and `save_peft` writes exactly the tensors PEFT's `save_pretrained`
/// wrote, with the settings PEFT reads.
#[test]
fn adapters_match_peft_in_logits_and_in_the_file() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora");
    let reference = common::json(&fixture.join("reference.json"));
    let policy = reference_policy();
    let ids: Vec<i64> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|t| t.as_i64().unwrap()))
        .collect();
    let device = Default::default();
    let tokens = Tensor::<Flex, 2, Int>::from_data(TensorData::new(ids, [2, 8]), &device);
    let logits = values(policy.forward(tokens.clone()));
    let expected: Vec<f32> = reference["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(logits.len(), expected.len());
    let gap = max_gap(&logits, &expected);
    assert!(gap < 1e-4, "logits differ from PEFT's by {gap}");
    let merged = values(policy.clone().merged().forward(tokens));
    let gap = max_gap(&merged, &expected);
    assert!(gap < 1e-4, "merged logits differ from PEFT's by {gap}");

    let dir = common::scratch_in("lora", "peft-export");
    save_peft(policy.lora.as_ref().unwrap(), "base", &dir).unwrap();
    assert!(
        safetensors_map(&dir.join("adapter_model.safetensors"))
            == safetensors_map(&fixture.join("adapter_model.safetensors")),
        "the adapter file is not PEFT's"
    );
    let ours = common::json(&dir.join("adapter_config.json"));
    let peft = common::json(&fixture.join("adapter_config.json"));
    for key in [
        "peft_type",
        "task_type",
        "r",
        "lora_alpha",
        "lora_dropout",
        "bias",
        "fan_in_fan_out",
        "use_rslora",
        "use_dora",
        "modules_to_save",
    ] {
        assert_eq!(ours[key], peft[key], "`{key}`");
    }
    let sorted = |v: &serde_json::Value| {
        let mut names: Vec<String> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    };
    assert_eq!(
        sorted(&ours["target_modules"]),
        sorted(&peft["target_modules"])
    );
}

/// PPO with a shared value head over LoRA: the value head trains with the adapters (both are
/// [`agentry_runtime::model::lora::Trainable`]) and the run resumes exactly; RLOO and
/// REINFORCE++ train the adapters too.
#[test]
fn every_estimator_trains_the_adapters() {
    let ppo = TINY_LORA
        .replace(
            "finetune = lora {",
            "value_head = shared\n        finetune = lora {",
        )
        .replace(
            "algorithm grpo { group_size = 2, kl",
            "algorithm ppo { epochs = 2, value_clip = 0.1, kl",
        )
        .replace("steps = 4, batch", "steps = 2, batch");
    let straight = run(&ppo, &scratch("ppo-straight"), 2, None).unwrap();
    let out = scratch("ppo-split");
    let first = run(&ppo, &out, 1, None).unwrap();
    let resumed = run(&ppo, &out, 2, Some(&first.run_dir)).unwrap();
    let metrics = common::metrics_without_timings(&straight.run_dir);
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), metrics);
    let rl: Vec<&serde_json::Value> = metrics.iter().filter(|l| l["phase"] == "rl").collect();
    assert!(
        rl.iter().all(|l| l["value_loss"].as_f64().is_some()),
        "PPO trains its value head: {rl:?}"
    );
    for algorithm in ["rloo { group_size = 2", "reinforce_pp { group_size = 2"] {
        let source = TINY_LORA
            .replace("grpo { group_size = 2", algorithm)
            .replace("steps = 4, batch", "steps = 1, batch");
        let summary = run(&source, &scratch(&algorithm[..4]), 1, None).unwrap();
        let rl: Vec<serde_json::Value> = common::metrics(&summary.run_dir)
            .into_iter()
            .filter(|l| l["phase"] == "rl")
            .collect();
        assert!(
            rl.iter().all(|l| l["grad_norm"].as_f64() > Some(0.0)),
            "{algorithm}: {rl:?}"
        );
    }
}
