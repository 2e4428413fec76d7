//! Writing a policy as a Hugging Face checkpoint: `config.json`, `model.safetensors` (f32,
//! torch's `[out, in]` layout, the names [`super::expected_tensors`] lists) and, with a Hugging
//! Face tokenizer, `tokenizer.json` (and its `chat_template.jinja`). What
//! [`super::load_policy`] and `transformers` read back.

use std::collections::HashMap;
use std::path::Path;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use serde_json::{Value, json};

use super::config::{HfConfig, ModelType, RopeScaling};
use super::expected_tensors;
use crate::model::lora::{self, hf_module};
use crate::model::{Policy, PolicyConfig};
use crate::text::Tokenizer;
use agentry_dsl::spec::LoraTarget;

impl HfConfig {
    /// A from-scratch policy's shape as a Llama configuration: its rotary base, no scaling,
    /// no biases, the norms' `rms_norm_eps`.
    pub fn llama_of(config: &PolicyConfig, rms_norm_eps: f64) -> Self {
        HfConfig {
            model_type: ModelType::Llama,
            vocab_size: config.vocab,
            hidden_size: config.d_model,
            intermediate_size: config.ffn,
            num_hidden_layers: config.layers,
            num_attention_heads: config.heads,
            num_key_value_heads: config.kv_heads,
            head_dim: config.head_dim(),
            rms_norm_eps,
            rope_theta: crate::model::transformer::ROPE_THETA,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: config.tie_embeddings,
            max_position_embeddings: config.context,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
        }
    }

    /// The `config.json` of this configuration, as `transformers` writes one.
    pub fn to_json(&self) -> Value {
        let (architecture, bias) = match self.model_type {
            ModelType::Qwen2 => ("Qwen2ForCausalLM", json!({})),
            ModelType::Llama => (
                "LlamaForCausalLM",
                json!({"attention_bias": self.qkv_bias, "mlp_bias": self.mlp_bias}),
            ),
        };
        let rope_scaling = match &self.rope_scaling {
            RopeScaling::None => Value::Null,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        };
        let mut config = json!({
            "architectures": [architecture],
            "model_type": self.model_type.name(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "torch_dtype": "float32",
        });
        if let (Value::Object(config), Value::Object(bias)) = (&mut config, bias) {
            config.extend(bias);
        }
        config
    }
}

/// Writes `policy` (without adapters: [`Policy::merged`] folds them in first) as a Hugging
/// Face checkpoint of shape `config` into `dir` (created if needed), with `tokenizer.json`
/// when `tokenizer` is a Hugging Face one.
pub fn save_hf<B: Backend>(
    policy: &Policy<B>,
    config: &HfConfig,
    tokenizer: &Tokenizer,
    dir: &Path,
) -> std::io::Result<()> {
    let invalid = |reason: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, reason);
    if policy.lora.is_some() {
        return Err(invalid(
            "the policy has adapters: merge them into the weights first".into(),
        ));
    }
    let mut tensors = torch_tensors(policy);
    let mut named = Vec::new();
    for (name, shape) in expected_tensors(config) {
        let (found, values) = tensors
            .remove(&name)
            .ok_or_else(|| invalid(format!("the policy has no tensor for `{name}`")))?;
        if found != shape {
            return Err(invalid(format!(
                "`{name}` is {found:?} in the policy but {shape:?} in the config"
            )));
        }
        named.push((name, shape, values));
    }
    std::fs::create_dir_all(dir)?;
    write_f32_safetensors(&dir.join("model.safetensors"), &named)?;
    let text = serde_json::to_string_pretty(&config.to_json()).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("config.json"), text + "\n")?;
    if let Some((hf, _)) = tokenizer.hf() {
        std::fs::write(dir.join("tokenizer.json"), hf.to_json().map_err(invalid)?)?;
    }
    // transformers 5 reads the template from its own file; this project's loader too.
    if let Some(template) = tokenizer.chat_template() {
        std::fs::write(dir.join("chat_template.jinja"), template.source())?;
    }
    Ok(())
}

/// Every weight of `policy` under its Hugging Face name, in torch's layout, as f32 values.
fn torch_tensors<B: Backend>(policy: &Policy<B>) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let mut out = HashMap::new();
    out.insert(
        "model.embed_tokens.weight".to_string(),
        f32_values(policy.embed.weight.val()),
    );
    let mut linear = |name: String, layer: &burn::nn::Linear<B>| {
        // burn multiplies by `[in, out]`; torch stores `[out, in]`.
        out.insert(
            format!("{name}.weight"),
            f32_values(layer.weight.val().transpose()),
        );
        if let Some(bias) = &layer.bias {
            out.insert(format!("{name}.bias"), f32_values(bias.val()));
        }
    };
    for (i, block) in policy.blocks.iter().enumerate() {
        for target in LoraTarget::ALL {
            linear(
                format!("model.layers.{i}.{}", hf_module(target)),
                lora::layer(block, target),
            );
        }
    }
    if let Some(head) = &policy.head {
        linear("lm_head".to_string(), head);
    }
    for (i, block) in policy.blocks.iter().enumerate() {
        let p = format!("model.layers.{i}");
        out.insert(
            format!("{p}.input_layernorm.weight"),
            f32_values(block.attn_norm.gamma.val()),
        );
        out.insert(
            format!("{p}.post_attention_layernorm.weight"),
            f32_values(block.ffn_norm.gamma.val()),
        );
    }
    out.insert(
        "model.norm.weight".to_string(),
        f32_values(policy.norm.gamma.val()),
    );
    out
}

/// A tensor's shape and values as f32, for a safetensors file.
pub(crate) fn f32_values<B: Backend, const D: usize>(t: Tensor<B, D>) -> (Vec<usize>, Vec<f32>) {
    let shape = t.dims().to_vec();
    let values = t
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("the data was converted to f32 just above");
    (shape, values)
}

/// Writes f32 tensors (name, shape, values) as one safetensors file, marked as PyTorch's
/// (`format: pt`), as `save_pretrained` writes them: a Hugging Face checkpoint's weights and a
/// PEFT adapter alike.
pub(crate) fn write_f32_safetensors(
    path: &Path,
    tensors: &[(String, Vec<usize>, Vec<f32>)],
) -> std::io::Result<()> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|x| x.to_le_bytes()).collect())
        .collect();
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|e| std::io::Error::other(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
    let file = safetensors::serialize(views, Some(metadata))
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    std::fs::write(path, file)
}
