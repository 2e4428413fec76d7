//! Hugging Face checkpoints against Python `transformers`: logits, greedy generation, rotary
//! frequencies and tokenizer ids of the tiny fixtures written by `scripts/make_hf_fixture.py`,
//! and a clear error (never a panic) for every kind of broken checkpoint.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{self, ids};
use agentry_env::{Reset, ToolCall};
use agentry_runtime::model::hf::{HfCheckpoint, HfConfig, HfError, ModelType, load_policy};
use agentry_runtime::model::{Policy, Sampling, generate};
use agentry_runtime::text::{ChatFormat, HfTokenizer, Tokenizer};
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde_json::Value;

type B = Flex;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn reference(name: &str) -> Value {
    common::json(&fixture(name).join("reference.json"))
}

fn load(dir: &Path) -> Result<Policy<B>, HfError> {
    load_policy::<B>(dir, &Default::default()).map(|(_, policy)| policy)
}

/// Largest absolute difference between our logits of the reference batch and transformers'.
fn logits_error(policy: &Policy<B>, reference: &Value) -> f32 {
    let rows: Vec<Vec<u32>> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let (b, t) = (rows.len(), rows[0].len());
    let data: Vec<i64> = rows.iter().flatten().map(|&x| i64::from(x)).collect();
    let tokens = Tensor::<B, 2, Int>::from_data(TensorData::new(data, [b, t]), &Default::default());
    let ours: Vec<f32> = policy.forward(tokens).into_data().into_vec().unwrap();
    let theirs: Vec<f32> = reference["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .flat_map(|pos| pos.as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(ours.len(), theirs.len());
    ours.iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

fn check_logits(name: &str) {
    let policy = load(&fixture(name)).unwrap();
    let error = logits_error(&policy, &reference(name));
    eprintln!("{name}: max |logit - transformers| = {error:e}");
    assert!(error < 1e-4, "{name}: logits differ by {error}");
}

#[test]
fn qwen2_logits_match_transformers() {
    check_logits("qwen2");
}

#[test]
fn llama_logits_match_transformers() {
    check_logits("llama");
}

fn check_greedy(name: &str) {
    let policy = load(&fixture(name)).unwrap();
    let reference = reference(name);
    let cases = reference["greedy"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = cases.iter().map(|c| ids(&c["prompt"])).collect();
    let sampling = Sampling {
        max_new_tokens: 16,
        greedy: true,
        ..Sampling::default()
    };
    // Both prompts in one batch: the shorter is left-padded, which must not change it.
    let out = generate(
        &policy,
        &prompts,
        &sampling,
        &mut ChaCha8Rng::seed_from_u64(0),
    );
    for (case, generation) in cases.iter().zip(&out) {
        assert_eq!(generation.tokens, ids(&case["tokens"]), "{name}");
    }
}

#[test]
fn qwen2_greedy_generation_matches_transformers() {
    check_greedy("qwen2");
}

#[test]
fn llama_greedy_generation_matches_transformers() {
    check_greedy("llama");
}

#[test]
fn rotary_frequencies_match_transformers() {
    for name in ["qwen2", "llama"] {
        let config = HfConfig::load(&fixture(name)).unwrap();
        let theirs = reference(name)["inv_freq"].clone();
        let theirs: Vec<f64> = theirs
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let ours = config.inv_freq();
        assert_eq!(ours.len(), theirs.len(), "{name}");
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-6 * b.abs(), "{name}: {a} vs {b}");
        }
    }
}

/// A run saves (and its checkpoints embed) the model's own `tokenizer.json`, and
/// `Tokenizer::load` reads it back as the same tokenizer, chat markers included.
#[test]
fn a_saved_checkpoint_tokenizer_loads_back_unchanged() {
    for name in ["qwen2", "llama"] {
        let path = fixture(name).join("tokenizer.json");
        let tokenizer = Tokenizer::from_hf(HfTokenizer::load(&path).unwrap()).unwrap();
        let dir = scratch(name);
        let saved = dir.join("saved-tokenizer.json");
        tokenizer.save(&saved).unwrap();
        let loaded = Tokenizer::load(&saved).unwrap();
        assert_eq!(loaded, tokenizer, "{name}");
        assert_eq!(
            loaded.hf().map(|(_, markers)| markers),
            tokenizer.hf().map(|(_, markers)| markers),
            "{name}"
        );
        let json = tokenizer.to_json().unwrap();
        assert_eq!(Tokenizer::from_json(&json, "memory").unwrap(), tokenizer);
    }
}

/// A checkpoint's `chat_template.jinja` comes with its tokenizer (with `tokenizer_config.json`'s
/// BOS and EOS tokens), so its policy calls tools in Hermes form; a saved tokenizer keeps it.
#[test]
fn the_chat_template_is_loaded_and_saved() {
    for (name, arch, bos) in [
        ("qwen2", ModelType::Qwen2, "<|im_start|>"),
        ("llama", ModelType::Llama, "<|begin_of_text|>"),
    ] {
        let model = HfCheckpoint::<B>::load(&fixture(name), arch, &Default::default()).unwrap();
        let tokenizer = model.tokenizer;
        let template = tokenizer
            .chat_template()
            .expect("the fixture has a template");
        let source = std::fs::read_to_string(fixture(name).join("chat_template.jinja")).unwrap();
        assert_eq!(
            (template.source(), template.bos_token()),
            (source.as_str(), bos)
        );
        let dir = scratch(name);
        let saved = dir.join("saved-tokenizer.json");
        tokenizer.save(&saved).unwrap();
        let loaded = Tokenizer::load(&saved).unwrap();
        assert_eq!(loaded, tokenizer, "{name}");
        let chat = ChatFormat::new(loaded);
        assert_eq!(chat.call_format(), agentry_env::ToolCallFormat::Hermes);
        let call = ToolCall::new("count", [("variable", serde_json::json!("#0"))]);
        assert_eq!(chat.parse_reply(&chat.demo_turn(&call)), Ok(call), "{name}");
    }
}

#[test]
fn tokenizers_match_transformers() {
    for name in ["qwen2", "llama"] {
        let tokenizer = HfTokenizer::load(fixture(name).join("tokenizer.json")).unwrap();
        let reference = reference(name);
        for case in reference["tokenizer"].as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let encoded = tokenizer.encode(text).unwrap();
            assert_eq!(encoded, ids(&case["ids"]), "{name}: {text:?}");
            assert_eq!(
                tokenizer.decode(&encoded).unwrap(),
                case["decoded"].as_str().unwrap(),
                "{name}: {text:?}"
            );
            // Plain text never becomes a special token, even text that spells one.
            assert!(
                encoded.iter().all(|&id| !tokenizer.is_special(id)),
                "{text:?}"
            );
        }
        for (token, id) in reference["specials"].as_object().unwrap() {
            let id = id.as_u64().unwrap() as u32;
            assert_eq!(tokenizer.token_id(token), Some(id), "{name}: {token}");
            assert!(tokenizer.is_special(id), "{name}: {token}");
        }
        let config = HfConfig::load(&fixture(name)).unwrap();
        assert_eq!(tokenizer.vocab_size(), config.vocab_size, "{name}");
    }
}

/// Loaded weights are parameters like any other: gradients reach the embedding, the biases
/// Qwen2 adds and the norms, so SFT and RL update a checkpoint as they do a fresh policy.
#[test]
fn checkpoint_parameters_receive_gradients() {
    let (_, policy) =
        load_policy::<Autodiff<Flex>>(&fixture("qwen2"), &Default::default()).unwrap();
    let rows: Vec<Vec<u32>> = reference("qwen2")["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let data: Vec<i64> = rows.iter().flatten().map(|&x| i64::from(x)).collect();
    let tokens = Tensor::<Autodiff<Flex>, 2, Int>::from_data(
        TensorData::new(data, [rows.len(), rows[0].len()]),
        &Default::default(),
    );
    let (logprobs, _) = policy.token_logprobs(tokens);
    let grads = logprobs.sum().backward();
    let norm = |g: Option<Tensor<Flex, 1>>| -> f32 {
        let g = g.expect("a gradient");
        g.clone().mul(g).sum().sqrt().into_scalar()
    };
    let block = &policy.blocks[1];
    for (name, value) in [
        ("q bias", norm(block.q.bias.as_ref().unwrap().grad(&grads))),
        ("v bias", norm(block.v.bias.as_ref().unwrap().grad(&grads))),
        ("attention norm", norm(block.attn_norm.gamma.grad(&grads))),
        ("final norm", norm(policy.norm.gamma.grad(&grads))),
    ] {
        assert!(value > 0.0 && value.is_finite(), "{name}: {value}");
    }
    let embed = policy.embed.weight.grad(&grads).expect("a gradient");
    assert!(embed.abs().sum().into_scalar() > 0.0);
}

/// One turn of an episode renders exactly as the checkpoint's chat template (ChatML for Qwen2,
/// Llama 3 headers) renders the same messages in transformers.
#[test]
fn chat_format_renders_like_the_chat_template() {
    let tools = common::kg_tools();
    for name in ["qwen2", "llama"] {
        let reference = reference(name);
        let messages = reference["chat"]["messages"].as_array().unwrap();
        let content = |i: usize| messages[i]["content"].as_str().unwrap().to_string();
        let hf = HfTokenizer::load(fixture(name).join("tokenizer.json")).unwrap();
        let chat = ChatFormat::new(Tokenizer::from_hf(hf).unwrap());
        let reset = Reset {
            instruction: content(1),
            tools: tools.clone(),
        };
        assert_eq!(ChatFormat::system_text(&reset.tools), content(0));
        let call = ToolCall::new("count", [("variable", serde_json::json!("#0"))]);
        let mut transcript = chat.begin(&reset);
        let turn = chat.demo_turn(&call);
        chat.push_agent(&mut transcript, &turn);
        chat.push_observation(&mut transcript, &content(3));
        assert_eq!(transcript.tokens, ids(&reference["chat"]["ids"]), "{name}");
        assert_eq!(
            chat.tokenizer().decode(&transcript.tokens),
            reference["chat"]["text"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(chat.agent_text(&turn), content(2), "{name}");
        let agent: Vec<u32> = transcript
            .tokens
            .iter()
            .zip(&transcript.agent_mask)
            .filter(|(_, m)| **m)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(
            agent, turn,
            "{name}: the mask covers the call and its end marker only"
        );
        let end = reference["specials"][if name == "qwen2" {
            "<|im_end|>"
        } else {
            "<|eot_id|>"
        }]
        .as_u64()
        .unwrap() as u32;
        assert_eq!(chat.end_token(), end, "{name}");
    }
}

#[test]
fn the_declared_arch_must_match_the_checkpoint() {
    let err = HfCheckpoint::<Flex>::load(&fixture("llama"), ModelType::Qwen2, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("config.json") && err.contains("declares `arch = qwen2`"),
        "{err}"
    );
    // A tokenizer without chat turn markers cannot frame episodes.
    let plain = scratch("qwen2");
    let path = plain.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("<|im_start|>", "<|xx_start|>")).unwrap();
    let err = HfCheckpoint::<Flex>::load(&plain, ModelType::Qwen2, &Default::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("no chat turn markers"),
        "{err}"
    );
}

/// An experiment with `arch = qwen2 { weights = ... }` runs end to end: checkpoint policy and
/// tokenizer, its chat template and Hermes calls, warm-up on oracle demonstrations, two RL
/// steps, evaluations, run directory.
#[test]
fn an_experiment_trains_the_qwen2_checkpoint() {
    let model = long_context_copy();
    let source = format!(
        r#"
experiment hf_tiny {{
    seed = 3
    model policy {{ arch = qwen2 {{ weights = "{}" }} }}
    task kg {{ env = kg, max_turns = 3, difficulty = 1 }}
    algorithm grpo {{ group_size = 4, kl = low_var_kl(0.01) }}
    train {{
        steps = 2, batch = 8, lr = 1e-3, max_new_tokens = 16
        warmup = sft {{ steps = 2, demonstrations = 8, batch = 4 }}
    }}
    eval {{ episodes = 4 }}
}}
"#,
        model.display()
    );
    let out = scratch("qwen2");
    // The run seeds burn's global RNG and draws from it.
    let summary = {
        let _guard = common::serial();
        common::run_on_flex(&common::experiment(&source), &out, None, None).unwrap()
    };
    assert_eq!(summary.steps, 2);
    let metrics = std::fs::read_to_string(summary.run_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    // `eval.decoding = both` (the default): a greedy and a sampled evaluation at each point.
    assert_eq!(
        phases,
        ["sft", "sft", "eval", "eval", "rl", "rl", "eval", "eval"]
    );
    for line in lines.iter().filter(|l| l["phase"] == "sft") {
        let (loss, grad) = (
            line["loss"].as_f64().unwrap(),
            line["grad_norm"].as_f64().unwrap(),
        );
        eprintln!("sft step {}: loss {loss}, grad norm {grad}", line["step"]);
        assert!(loss.is_finite() && loss > 0.0 && grad > 0.0, "{line}");
    }
    for line in lines.iter().filter(|l| l["phase"] == "rl") {
        eprintln!(
            "rl step {}: success {}, loss {}, grad norm {}, skipped {}",
            line["step"], line["success"], line["loss"], line["grad_norm"], line["skipped"]
        );
    }
    // The run keeps the checkpoint's tokenizer with its chat template, and its samples are in
    // ChatML, the tools' schemas in the system turn.
    let saved = Tokenizer::load(summary.run_dir.join("tokenizer.json")).unwrap();
    let original = HfTokenizer::load(fixture("qwen2").join("tokenizer.json")).unwrap();
    assert!(*saved.hf().unwrap().0 == original);
    let source = std::fs::read_to_string(fixture("qwen2").join("chat_template.jinja")).unwrap();
    assert_eq!(saved.chat_template().unwrap().source(), source);
    let samples = std::fs::read_to_string(summary.run_dir.join("samples-final.txt")).unwrap();
    assert!(samples.contains("<|im_start|>assistant\n"), "{samples}");
    assert!(samples.contains("<tools>"), "{samples}");
}

// ---------------------------------------------------------------------------------------------
// Broken checkpoints: each gives an error that names the file and what is wrong.

/// A private copy of a fixture to break, removed when dropped.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(name: &str) -> Scratch {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "agentry-hf-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    Scratch(dir)
}

/// A copy of the Qwen2 fixture with a 4096-token context: its toy vocabulary spells the
/// KG task's Hermes prompt (the tools' JSON schemas) almost byte by byte, about 2500 tokens,
/// past the fixture's 2048 (SmolLM2's vocabulary takes about a third of that).
fn long_context_copy() -> Scratch {
    let dir = scratch("qwen2");
    edit_config(&dir, |config| {
        config.insert("max_position_embeddings".into(), 4096.into());
    });
    dir
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut config = common::json(&path);
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

/// Rewrites a safetensors file through `edit`, which gets (name, dtype, shape, bytes) entries.
fn edit_tensors(path: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let bytes = std::fs::read(path).unwrap();
    let file = SafeTensors::deserialize(&bytes).unwrap();
    let mut entries: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = file
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut entries);
    let views: Vec<(String, TensorView<'_>)> = entries
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// Loads `dir`, expecting an error whose message contains every one of `parts`.
fn expect_error(dir: &Path, parts: &[&str]) -> String {
    let message = match load(dir) {
        Ok(_) => panic!("loading {} succeeded", dir.display()),
        Err(e) => e.to_string(),
    };
    for part in parts {
        assert!(message.contains(part), "`{part}` not in: {message}");
    }
    message
}

#[test]
fn config_errors_name_the_file_and_key() {
    let dir = scratch("llama");
    edit_config(&dir, |c| {
        c.insert("model_type".into(), "mistral".into());
    });
    expect_error(
        &dir,
        &["config.json", "model_type `mistral` is not supported"],
    );

    let dir = scratch("llama");
    edit_config(&dir, |c| {
        c.remove("hidden_size");
    });
    expect_error(&dir, &["config.json", "`hidden_size` is missing"]);

    let dir = scratch("llama");
    edit_config(&dir, |c| {
        c.insert("num_key_value_heads".into(), 3.into());
    });
    expect_error(
        &dir,
        &["config.json", "num_key_value_heads 3 does not divide"],
    );

    let dir = scratch("llama");
    edit_config(&dir, |c| {
        c.insert("hidden_act".into(), "gelu".into());
    });
    expect_error(
        &dir,
        &["config.json", "hidden_act \"gelu\" is not supported"],
    );

    let dir = scratch("qwen2");
    edit_config(&dir, |c| {
        c.insert("use_sliding_window".into(), true.into());
    });
    expect_error(&dir, &["config.json", "use_sliding_window"]);

    let dir = scratch("qwen2");
    edit_config(&dir, |c| {
        c.insert(
            "layer_types".into(),
            serde_json::json!(["full_attention", "sliding_attention"]),
        );
    });
    expect_error(&dir, &["config.json", "layer_types", "not supported"]);

    let dir = scratch("qwen2");
    std::fs::write(dir.join("config.json"), "{\"model_type\": \"qwen2\",").unwrap();
    expect_error(&dir, &["config.json", "not valid JSON"]);

    let dir = scratch("qwen2");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    expect_error(&dir, &["config.json"]);
}

#[test]
fn unsupported_rope_scaling_is_refused() {
    for kind in ["yarn", "dynamic", "longrope", "linear"] {
        let dir = scratch("llama");
        edit_config(&dir, |c| {
            let scaling = serde_json::json!({"rope_type": kind, "factor": 4.0});
            c.insert("rope_parameters".into(), scaling.clone());
            c.insert("rope_scaling".into(), scaling);
        });
        expect_error(
            &dir,
            &[
                "config.json",
                &format!("rope scaling `{kind}` is not supported"),
            ],
        );
    }
    let dir = scratch("llama");
    edit_config(&dir, |c| {
        let scaling = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
        c.insert("rope_parameters".into(), scaling.clone());
        c.insert("rope_scaling".into(), scaling);
    });
    expect_error(&dir, &["config.json", "`low_freq_factor` is missing"]);
}

/// Checkpoints from transformers 4 spell the rope and dtype keys differently; same model.
#[test]
fn legacy_config_keys_load_the_same_model() {
    for name in ["qwen2", "llama"] {
        let dir = scratch(name);
        edit_config(&dir, |c| {
            let params = c.remove("rope_parameters");
            if let Some(Value::Object(mut params)) = params {
                let theta = params.remove("rope_theta").unwrap();
                c.insert("rope_theta".into(), theta);
                let kind = params.get("rope_type").cloned();
                let scaling = match kind.as_ref().and_then(Value::as_str) {
                    Some("default") | None => Value::Null,
                    Some(_) => Value::Object(params),
                };
                c.insert("rope_scaling".into(), scaling);
            }
            if let Some(dtype) = c.remove("dtype") {
                c.insert("torch_dtype".into(), dtype);
            }
        });
        let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
        assert!(!text.contains("rope_parameters"), "{text}");
        assert_eq!(
            HfConfig::load(&dir).unwrap(),
            HfConfig::load(&fixture(name)).unwrap()
        );
    }
}

#[test]
fn tensor_errors_name_the_file_and_tensor() {
    let single = |dir: &Path| dir.join("model.safetensors");

    let dir = scratch("llama");
    edit_tensors(&single(&dir), |t| {
        t.retain(|e| e.0 != "model.layers.1.mlp.up_proj.weight")
    });
    expect_error(
        &dir,
        &[
            "model.safetensors",
            "`model.layers.1.mlp.up_proj.weight`",
            "missing",
        ],
    );

    let dir = scratch("llama");
    edit_config(&dir, |c| {
        c.insert("intermediate_size".into(), 95.into());
    });
    expect_error(
        &dir,
        &[
            "model.safetensors",
            "`model.layers.0.mlp.gate_proj.weight`",
            "shape [96, 64], expected [95, 64]",
        ],
    );

    // The config says one layer, the weights hold two.
    let dir = scratch("llama");
    edit_config(&dir, |c| {
        c.insert("num_hidden_layers".into(), 1.into());
    });
    expect_error(
        &dir,
        &[
            "model.safetensors",
            "`model.layers.1.",
            "config.json and the weights disagree",
        ],
    );

    // An untied config needs `lm_head.weight`.
    let dir = scratch("qwen2");
    edit_config(&dir, |c| {
        c.insert("tie_word_embeddings".into(), false.into());
    });
    expect_error(
        &dir,
        &[
            "model.safetensors.index.json",
            "`lm_head.weight`",
            "missing",
        ],
    );

    let dir = scratch("llama");
    edit_tensors(&single(&dir), |t| {
        let e = t.iter_mut().find(|e| e.0 == "model.norm.weight").unwrap();
        e.3[2..4].copy_from_slice(&0x7FC0u16.to_le_bytes()); // bf16 NaN
    });
    expect_error(
        &dir,
        &["model.safetensors", "`model.norm.weight`", "non-finite"],
    );

    let dir = scratch("llama");
    edit_tensors(&single(&dir), |t| {
        let e = t.iter_mut().find(|e| e.0 == "model.norm.weight").unwrap();
        e.1 = Dtype::I16;
    });
    expect_error(
        &dir,
        &[
            "model.safetensors",
            "`model.norm.weight`",
            "I16",
            "not supported",
        ],
    );
}

#[test]
fn truncated_and_corrupt_files_are_errors() {
    let path = |dir: &Path| dir.join("model.safetensors");

    let dir = scratch("llama");
    let bytes = std::fs::read(path(&dir)).unwrap();
    std::fs::write(path(&dir), &bytes[..bytes.len() - 100]).unwrap();
    expect_error(&dir, &["model.safetensors", "truncated or corrupt"]);

    let dir = scratch("llama");
    std::fs::write(path(&dir), &bytes[..5]).unwrap();
    expect_error(&dir, &["model.safetensors", "truncated or corrupt"]);

    let dir = scratch("llama");
    let mut huge = bytes.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(path(&dir), &huge).unwrap();
    expect_error(&dir, &["model.safetensors", "truncated or corrupt"]);

    let dir = scratch("llama");
    std::fs::write(path(&dir), b"not a safetensors file at all, just some text").unwrap();
    expect_error(&dir, &["model.safetensors", "truncated or corrupt"]);

    let dir = scratch("llama");
    std::fs::remove_file(path(&dir)).unwrap();
    expect_error(
        &dir,
        &["no model.safetensors or model.safetensors.index.json"],
    );
}

/// Random truncations and byte flips of a checkpoint: loading returns, it never panics.
#[test]
fn mangled_safetensors_never_panic() {
    let dir = scratch("llama");
    let path = dir.join("model.safetensors");
    let original = std::fs::read(&path).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (mut errors, mut loaded) = (0, 0);
    for round in 0..60 {
        let mut bytes = original.clone();
        let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        match round % 3 {
            0 => bytes.truncate(rng.random_range(0..bytes.len())),
            // Flips in the header, where parsing can go wrong...
            1 => {
                for _ in 0..rng.random_range(1..4) {
                    let at = rng.random_range(0..header);
                    bytes[at] ^= 1 << rng.random_range(0..8);
                }
            }
            // ... and in the data, which may load, or hold a NaN or infinity.
            _ => {
                for _ in 0..rng.random_range(1..20) {
                    let at = rng.random_range(header..bytes.len());
                    bytes[at] ^= 1 << rng.random_range(0..8);
                }
            }
        }
        std::fs::write(&path, &bytes).unwrap();
        match load(&dir) {
            Ok(_) => loaded += 1,
            Err(e) => {
                assert!(e.to_string().contains("model.safetensors"), "{e}");
                errors += 1;
            }
        }
    }
    eprintln!("mangled checkpoints: {errors} errors, {loaded} loaded");
    assert!(errors >= 40, "{errors} errors, {loaded} loaded");
}

#[test]
fn broken_shard_indexes_are_errors() {
    let index = |dir: &Path| dir.join("model.safetensors.index.json");
    let edit_index = |dir: &Path, edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut value = common::json(&index(dir));
        edit(value["weight_map"].as_object_mut().unwrap());
        std::fs::write(index(dir), value.to_string()).unwrap();
    };
    let shards = |dir: &Path| -> Vec<String> {
        let mut files = common::entry_names(dir);
        files.retain(|f| f.ends_with(".safetensors"));
        files
    };
    let dir = scratch("qwen2");
    assert!(
        shards(&dir).len() >= 2,
        "the qwen2 fixture is sharded: {:?}",
        shards(&dir)
    );

    // A shard the index lists is gone.
    let dir = scratch("qwen2");
    let first = shards(&dir)[0].clone();
    std::fs::remove_file(dir.join(&first)).unwrap();
    expect_error(
        &dir,
        &["model.safetensors.index.json", &first, "does not exist"],
    );

    // A shard name that leaves the directory.
    let dir = scratch("qwen2");
    edit_index(&dir, &|map| {
        map.insert("model.norm.weight".into(), "../model.safetensors".into());
    });
    expect_error(
        &dir,
        &[
            "model.safetensors.index.json",
            "`../model.safetensors`",
            "not a file name",
        ],
    );

    // The index puts a tensor in the wrong shard.
    let dir = scratch("qwen2");
    let files = shards(&dir);
    let mut wrong = String::new();
    edit_index(&dir, &|map| {
        let actual = map["model.norm.weight"].as_str().unwrap().to_string();
        let other = files.iter().find(|f| **f != actual).unwrap();
        map.insert("model.norm.weight".into(), other.clone().into());
    });
    let value = common::json(&index(&dir));
    wrong.push_str(value["weight_map"]["model.norm.weight"].as_str().unwrap());
    expect_error(
        &dir,
        &[&wrong, "`model.norm.weight`", "missing from this file"],
    );

    // A tensor the index does not list.
    let dir = scratch("qwen2");
    edit_index(&dir, &|map| {
        map.remove("model.layers.0.self_attn.k_proj.bias");
    });
    expect_error(
        &dir,
        &[
            "model.safetensors.index.json",
            "`model.layers.0.self_attn.k_proj.bias`",
            "missing",
        ],
    );

    let dir = scratch("qwen2");
    std::fs::write(index(&dir), "{\"metadata\": {}}").unwrap();
    expect_error(&dir, &["model.safetensors.index.json", "weight_map"]);
}

#[test]
fn broken_tokenizers_are_errors() {
    let dir = scratch("qwen2");
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, "{\"model\": {\"type\": \"BPE\"").unwrap();
    let err = HfTokenizer::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("tokenizer.json") && err.contains("not a Hugging Face tokenizer"),
        "{err}"
    );
    let err = HfTokenizer::load(dir.join("missing.json"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing.json"), "{err}");
}
