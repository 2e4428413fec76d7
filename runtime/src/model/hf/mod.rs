//! Hugging Face Qwen2 and Llama checkpoints as a [`Policy`].
//!
//! A checkpoint directory holds `config.json` ([`HfConfig`]), the weights (`model.safetensors`,
//! or shards listed by `model.safetensors.index.json`, stored as f32, f16 or bf16 and read as
//! f32) and `tokenizer.json` ([`crate::text::HfTokenizer`]). The architecture is the one
//! [`Policy`] already computes: pre-norm RMSNorm blocks, rotate-half RoPE, SwiGLU and
//! grouped-query attention where query head `h` reads key/value head
//! `h / (heads / kv_heads)`; so the weights load as they are, with no permutation. Only the
//! linear layers are transposed, since burn stores `[in, out]` and torch `[out, in]`.
//!
//! Loading is strict, because a silently wrong model still produces plausible text: every
//! tensor must be present with exactly the shape `config.json` implies, hold finite floats,
//! and no tensor may be left over (a leftover means the config and the weights disagree).
//! Each failure is an [`HfError`] naming the file and the tensor or key.

mod config;
mod export;
mod weights;

use std::collections::HashMap;
use std::path::Path;

use burn::module::Param;
use burn::nn::{Embedding, Linear, RmsNorm};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

pub use config::{HfConfig, ModelType, RopeScaling};
pub use export::save_hf;
pub(crate) use export::{f32_values, write_f32_safetensors};
pub use weights::{F32Tensor, INDEX_FILE, SINGLE_FILE, Weights};

use super::transformer::{DecoderBlock, Policy, Rope};
use super::{LoadError, Pretrained};
use crate::text::{ChatTemplate, HfTokenizer, Tokenizer};

/// Why a checkpoint could not be loaded: the loaders' shared [`LoadError`].
pub type HfError = LoadError;

/// A Hugging Face checkpoint ready for a run: the [`Pretrained`] policy and tokenizer that
/// [`HfCheckpoint::load`] reads from a checkpoint directory.
pub type HfCheckpoint<B> = Pretrained<B>;

impl<B: Backend> Pretrained<B> {
    /// Loads the checkpoint an experiment's `arch = qwen2 { weights = "DIR" }` or
    /// `llama { ... }` names; `declared` is the architecture the experiment declares, which
    /// the checkpoint's `config.json` must agree with.
    pub fn load(dir: &Path, declared: ModelType, device: &B::Device) -> Result<Self, HfError> {
        let config = HfConfig::load(dir)?;
        if config.model_type != declared {
            return Err(HfError::Invalid {
                path: dir.join("config.json"),
                reason: format!(
                    "model_type is `{}`, but the experiment declares `arch = {}`",
                    config.model_type.name(),
                    declared.name()
                ),
            });
        }
        let path = dir.join("tokenizer.json");
        let invalid = |reason: String| HfError::Invalid {
            path: path.clone(),
            reason,
        };
        let hf = HfTokenizer::load(&path).map_err(|e| invalid(e.to_string()))?;
        let mut tokenizer = Tokenizer::from_hf(hf).map_err(invalid)?;
        if let Some(template) = chat_template(dir)? {
            tokenizer =
                tokenizer
                    .with_chat_template(template)
                    .map_err(|reason| HfError::Invalid {
                        path: dir.join("tokenizer_config.json"),
                        reason,
                    })?;
        }
        let (_, policy) = load_policy(dir, device)?;
        Pretrained::paired(policy, tokenizer, |size| format!("vocab_size is {size}"))
            .map_err(invalid)
    }
}

/// The checkpoint's chat template: `chat_template.jinja` (where transformers 4.43 and later
/// save it), else `tokenizer_config.json`'s `chat_template` (a string, or named templates of
/// which the `default` one is taken), with the `bos_token` and `eos_token` it may print. `None`
/// when the checkpoint has none: then the chat format frames turns by hand.
fn chat_template(dir: &Path) -> Result<Option<ChatTemplate>, HfError> {
    let config_path = dir.join("tokenizer_config.json");
    let invalid = |path: &Path, reason: String| HfError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|source| HfError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let config: serde_json::Value = if config_path.exists() {
        serde_json::from_str(&read(&config_path)?)
            .map_err(|e| invalid(&config_path, format!("not JSON: {e}")))?
    } else {
        serde_json::Value::Null
    };
    let jinja = dir.join("chat_template.jinja");
    let (source, origin) = if jinja.exists() {
        (read(&jinja)?, jinja)
    } else {
        let source = match &config["chat_template"] {
            serde_json::Value::Null => return Ok(None),
            serde_json::Value::String(source) => source.clone(),
            serde_json::Value::Array(named) => named
                .iter()
                .find(|t| t["name"] == "default")
                .and_then(|t| t["template"].as_str())
                .ok_or_else(|| invalid(&config_path, "no `default` chat template".into()))?
                .to_string(),
            _ => {
                return Err(invalid(
                    &config_path,
                    "`chat_template` is not a string".into(),
                ));
            }
        };
        (source, config_path.clone())
    };
    // A special token is written as its text, or as an added token's `{"content": ...}`.
    let token = |key: &str| {
        let value = &config[key];
        value["content"]
            .as_str()
            .or(value.as_str())
            .unwrap_or_default()
            .to_string()
    };
    ChatTemplate::new(&source, &token("bos_token"), &token("eos_token"))
        .map(Some)
        .map_err(|reason| invalid(&origin, reason))
}

/// Loads `dir` (see the module docs) as a policy on `device`, with its checked config.
pub fn load_policy<B: Backend>(
    dir: &Path,
    device: &B::Device,
) -> Result<(HfConfig, Policy<B>), HfError> {
    let config = HfConfig::load(dir)?;
    let weights = Weights::open(dir)?;
    let wanted = expected_tensors(&config);
    let expected: std::collections::HashSet<&str> =
        wanted.iter().map(|(n, _)| n.as_str()).collect();
    // Tolerated leftovers: the rotary table some exporters save (recomputed here), and a head
    // saved beside tied embeddings (transformers ignores it too: the embedding is the head).
    let tolerated = |name: &str| {
        name.ends_with(".rotary_emb.inv_freq")
            || (config.tie_word_embeddings && name == "lm_head.weight")
    };
    let leftover = weights
        .names()
        .find(|name| !expected.contains(name) && !tolerated(name));
    if let Some(name) = leftover {
        return Err(HfError::Tensor {
            path: weights.listing().to_path_buf(),
            tensor: name.to_string(),
            reason: format!(
                "is not part of a {} model with {} layers{} (config.json and the weights disagree)",
                config.model_type.name(),
                config.num_hidden_layers,
                if config.tie_word_embeddings {
                    " and tied embeddings"
                } else {
                    ""
                },
            ),
        });
    }
    let mut tensors = weights.read(&wanted)?;
    let policy = build(&config, &mut tensors, device);
    Ok((config, policy))
}

/// Every tensor the config implies, with its shape in the checkpoint (torch layout).
pub fn expected_tensors(config: &HfConfig) -> Vec<(String, Vec<usize>)> {
    let (d, hd) = (config.hidden_size, config.head_dim);
    let q = config.num_attention_heads * hd;
    let kv = config.num_key_value_heads * hd;
    let ffn = config.intermediate_size;
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![config.vocab_size, d],
    )];
    for i in 0..config.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let mut push = |name: &str, shape: Vec<usize>| out.push((format!("{p}.{name}"), shape));
        push("input_layernorm.weight", vec![d]);
        for (proj, width) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            push(&format!("self_attn.{proj}.weight"), vec![width, d]);
            if config.qkv_bias {
                push(&format!("self_attn.{proj}.bias"), vec![width]);
            }
        }
        push("self_attn.o_proj.weight", vec![d, q]);
        if config.o_bias {
            push("self_attn.o_proj.bias", vec![d]);
        }
        push("post_attention_layernorm.weight", vec![d]);
        for (proj, shape) in [
            ("gate_proj", vec![ffn, d]),
            ("up_proj", vec![ffn, d]),
            ("down_proj", vec![d, ffn]),
        ] {
            let width = shape[0];
            push(&format!("mlp.{proj}.weight"), shape);
            if config.mlp_bias {
                push(&format!("mlp.{proj}.bias"), vec![width]);
            }
        }
    }
    out.push(("model.norm.weight".to_string(), vec![d]));
    if !config.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![config.vocab_size, d]));
    }
    out
}

/// A row-major `rows × cols` matrix's values transposed (`cols × rows`, row-major): torch's
/// `[out, in]` linear weights as burn's `[in, out]`, and back.
pub(crate) fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; values.len()];
    for (r, row) in values.chunks_exact(cols).enumerate() {
        for (c, &x) in row.iter().enumerate() {
            out[c * rows + r] = x;
        }
    }
    out
}

/// Assembles the policy from tensors already checked (present, shaped as
/// [`expected_tensors`] says, finite): by [`Weights::read`], or by the GGUF loader.
pub(crate) fn build<B: Backend>(
    config: &HfConfig,
    tensors: &mut HashMap<String, F32Tensor>,
    device: &B::Device,
) -> Policy<B> {
    let mut take = |name: &str| {
        tensors
            .remove(name)
            .unwrap_or_else(|| unreachable!("`{name}` was read with its checked shape"))
    };
    let vector = |t: F32Tensor| {
        Param::from_tensor(Tensor::<B, 1>::from_data(
            TensorData::new(t.values, t.shape),
            device,
        ))
    };
    let norm = |t: F32Tensor| RmsNorm {
        gamma: vector(t),
        epsilon: config.rms_norm_eps,
    };
    // torch stores `[out, in]`; burn's `Linear` multiplies by `[in, out]`.
    let linear = |weight: F32Tensor, bias: Option<F32Tensor>| {
        let (rows, cols) = (weight.shape[0], weight.shape[1]);
        Linear {
            weight: Param::from_tensor(Tensor::<B, 2>::from_data(
                TensorData::new(transposed(&weight.values, rows, cols), [cols, rows]),
                device,
            )),
            bias: bias.map(vector),
        }
    };
    let embed = take("model.embed_tokens.weight");
    let embed = Embedding {
        weight: Param::from_tensor(Tensor::<B, 2>::from_data(
            TensorData::new(embed.values, embed.shape),
            device,
        )),
    };
    let blocks = (0..config.num_hidden_layers)
        .map(|i| {
            let p = format!("model.layers.{i}");
            let mut proj = |name: &str, bias: bool| {
                let weight = take(&format!("{p}.{name}.weight"));
                let bias = bias.then(|| take(&format!("{p}.{name}.bias")));
                linear(weight, bias)
            };
            let q = proj("self_attn.q_proj", config.qkv_bias);
            let k = proj("self_attn.k_proj", config.qkv_bias);
            let v = proj("self_attn.v_proj", config.qkv_bias);
            let out = proj("self_attn.o_proj", config.o_bias);
            let gate = proj("mlp.gate_proj", config.mlp_bias);
            let up = proj("mlp.up_proj", config.mlp_bias);
            let down = proj("mlp.down_proj", config.mlp_bias);
            DecoderBlock {
                attn_norm: norm(take(&format!("{p}.input_layernorm.weight"))),
                q,
                k,
                v,
                out,
                ffn_norm: norm(take(&format!("{p}.post_attention_layernorm.weight"))),
                gate,
                up,
                down,
                heads: config.num_attention_heads,
                kv_heads: config.num_key_value_heads,
                head_dim: config.head_dim,
            }
        })
        .collect();
    let final_norm = norm(take("model.norm.weight"));
    let head = (!config.tie_word_embeddings).then(|| linear(take("lm_head.weight"), None));
    Policy {
        embed,
        blocks,
        norm: final_norm,
        head,
        value: None,
        lora: None,
        vocab: config.vocab_size,
        context: config.max_position_embeddings,
        head_dim: config.head_dim,
        rope: Rope::from_inv_freq(config.inv_freq()),
        recompute: false,
        quantized: None,
    }
}
