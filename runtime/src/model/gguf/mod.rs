//! llama.cpp's GGUF files of Llama and Qwen2 models as a [`Pretrained`] policy and tokenizer.
//!
//! One file holds everything: the hyperparameters and the tokenizer as metadata
//! ([`file`](mod@file)), and the weights, quantized or not ([`quant`] dequantizes F32, F16, BF16,
//! Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K to f32, as ggml does). The tensors are renamed to
//! the Hugging Face names (`blk.N.attn_q.weight` is `model.layers.N.self_attn.q_proj.weight`),
//! and the policy is assembled by the same code as a Hugging Face checkpoint
//! ([`super::hf`]), so the two loaders cannot drift apart.
//! Q4_1 and Q8_0 linear weights and the head are also kept in their blocks
//! ([`Policy::quantized`]), which decode steps multiply by.
//!
//! One transformation is undone: llama.cpp's converter permutes the rows of a Llama model's
//! query and key projections (each head's two rotary halves interleaved, for its
//! pairwise RoPE); the policy rotates halves, as transformers does, so the rows are put back.
//! Qwen2 files are not permuted (llama.cpp runs Qwen2 with the halves' RoPE).
//!
//! Loading is as strict as the Hugging Face loader: every tensor present, shaped as the
//! metadata implies, finite, and none left over; each failure is a [`GgufError`] naming the
//! file and the tensor or key.

pub mod file;
pub mod quant;
pub mod tokenizer;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use agentry_dsl::spec::LoraTarget;
use agentry_kernels::blocks::{BlockFormat, BlockMatrix};
use burn::tensor::backend::Backend;

pub use file::{GgmlType, GgufFile, TensorInfo, Value, Writer};

use super::hf::{F32Tensor, HfConfig, ModelType, RopeScaling, build, expected_tensors};
use super::quantized::QuantizedBase;
use super::transformer::Policy;
use super::{LoadError, Pretrained};
use crate::text::{ChatTemplate, Tokenizer};

/// Why a GGUF file could not be loaded: the loaders' shared [`LoadError`].
pub type GgufError = LoadError;

/// Reads and parses a GGUF file (header, metadata and tensor infos; the data is checked to
/// lie inside the file but not decoded).
pub fn open(path: &Path) -> Result<GgufFile, GgufError> {
    let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    GgufFile::parse(bytes).map_err(|reason| GgufError::Invalid {
        path: path.to_path_buf(),
        reason,
    })
}

impl<B: Backend> Pretrained<B> {
    /// Loads the GGUF file an experiment's `arch = gguf { file = "PATH" }` names: the policy
    /// from its weights and hyperparameters, the tokenizer from its metadata with its
    /// `tokenizer.chat_template` (ChatML or Llama 3 turn markers), which lays out episodes.
    pub fn from_gguf(path: &Path, device: &B::Device) -> Result<Self, GgufError> {
        let file = open(path)?;
        let invalid = |reason: String| GgufError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        // The architecture and hyperparameters first: a file of another architecture is best
        // told so, whatever else it lacks.
        config(&file).map_err(invalid)?;
        let hf = tokenizer::build(&file.metadata, &path.display().to_string()).map_err(invalid)?;
        let tokenizer = Tokenizer::from_hf(hf).map_err(invalid)?;
        let template = check_chat_template(&file, &tokenizer).map_err(invalid)?;
        let tokenizer = tokenizer.with_chat_template(template).map_err(invalid)?;
        let (_, policy) = load_policy(&file, path, device)?;
        Pretrained::paired(policy, tokenizer, |rows| {
            format!("embedding has {rows} rows")
        })
        .map_err(invalid)
    }
}

/// The file's chat template, which lays out its episodes ([`Tokenizer::with_chat_template`]),
/// with the BOS and EOS tokens' texts it may print. It must use the turn markers of the
/// tokenizer ([`Tokenizer::from_hf`]), whose turn end stops generation.
fn check_chat_template(file: &GgufFile, tokenizer: &Tokenizer) -> Result<ChatTemplate, String> {
    use crate::text::hf::TurnMarkers;
    let Some(template) = file.metadata.get("tokenizer.chat_template") else {
        return Err("has no `tokenizer.chat_template`, so its chat format is unknown".into());
    };
    let template = template
        .as_str()
        .ok_or("`tokenizer.chat_template` is not a string")?;
    let markers = tokenizer.hf().map(|(_, markers)| markers);
    let (wanted, family) = if template.contains("<|im_start|>") {
        (
            matches!(markers, Some(TurnMarkers::ChatMl { .. })),
            "ChatML",
        )
    } else if template.contains("<|start_header_id|>") {
        (
            matches!(markers, Some(TurnMarkers::Llama3 { .. })),
            "Llama 3",
        )
    } else {
        return Err(
            "its `tokenizer.chat_template` uses neither ChatML's <|im_start|> nor Llama 3's \
             <|start_header_id|>; other chat templates are not supported yet"
                .into(),
        );
    };
    if wanted {
        // The ids are checked against the vocabulary; a missing or unknown one prints nothing.
        let token = |key: &str| {
            let id = file.metadata.get(key).and_then(Value::as_u64);
            let id = id.and_then(|id| u32::try_from(id).ok());
            id.filter(|&id| (id as usize) < tokenizer.vocab_size())
                .map(|id| tokenizer.decode(&[id]))
                .unwrap_or_default()
        };
        ChatTemplate::new(
            template,
            &token("tokenizer.ggml.bos_token_id"),
            &token("tokenizer.ggml.eos_token_id"),
        )
    } else {
        Err(format!(
            "its chat template is {family}, but the tokenizer's special tokens are another \
             family's turn markers"
        ))
    }
}

/// The hyperparameters in a file's metadata, as the Hugging Face config they correspond to.
pub fn config(file: &GgufFile) -> Result<HfConfig, String> {
    let meta = |key: &str| file.metadata.get(key);
    let arch = meta("general.architecture")
        .and_then(Value::as_str)
        .ok_or("has no string `general.architecture`")?;
    let model_type = match arch {
        "llama" => ModelType::Llama,
        "qwen2" => ModelType::Qwen2,
        other => {
            return Err(format!(
                "general.architecture is `{other}`; llama and qwen2 are supported"
            ));
        }
    };
    let uint = |key: &str| -> Result<usize, String> {
        let full = format!("{arch}.{key}");
        match meta(&full) {
            None => Err(format!("has no `{full}`")),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("`{full}` is {v:?}, not a positive integer")),
        }
    };
    let float = |key: &str| -> Result<f64, String> {
        let full = format!("{arch}.{key}");
        match meta(&full) {
            None => Err(format!("has no `{full}`")),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| format!("`{full}` is {v:?}, not a positive float")),
        }
    };
    let hidden_size = uint("embedding_length")?;
    let heads = uint("attention.head_count")?;
    let kv_heads = uint("attention.head_count_kv").or_else(|e| {
        // Files of models without grouped-query attention may leave it out.
        meta(&format!("{arch}.attention.head_count_kv")).map_or(Ok(heads), |_| Err(e))
    })?;
    if !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "{heads} attention heads are not a multiple of {kv_heads} key/value heads"
        ));
    }
    let head_dim = match meta(&format!("{arch}.attention.key_length")) {
        Some(_) => uint("attention.key_length")?,
        None if hidden_size.is_multiple_of(heads) => hidden_size / heads,
        None => {
            return Err(format!(
                "the embedding length {hidden_size} is not a multiple of {heads} heads"
            ));
        }
    };
    for key in ["attention.value_length", "rope.dimension_count"] {
        if meta(&format!("{arch}.{key}")).is_some() && uint(key)? != head_dim {
            return Err(format!(
                "`{arch}.{key}` is {}, but heads are {head_dim} wide (partial rotary and \
                 differing value widths are not supported)",
                uint(key)?
            ));
        }
    }
    if !head_dim.is_multiple_of(2) {
        return Err(format!("heads are {head_dim} wide, which RoPE cannot pair"));
    }
    match meta(&format!("{arch}.rope.scaling.type")) {
        Some(scaling) if scaling.as_str() != Some("none") => {
            return Err(format!(
                "`{arch}.rope.scaling.type` is {scaling:?}; RoPE scaling from GGUF is not \
                 supported yet"
            ));
        }
        _ => {}
    }
    let embed = file
        .tensor("token_embd.weight")
        .ok_or("has no tensor `token_embd.weight`")?;
    let vocab_size = match embed.dims.as_slice() {
        [d, vocab] if *d as usize == hidden_size => *vocab as usize,
        dims => {
            return Err(format!(
                "tensor `token_embd.weight` has dims {dims:?}, expected [{hidden_size}, vocab]"
            ));
        }
    };
    let has = |name: &str| file.tensor(name).is_some();
    Ok(HfConfig {
        model_type,
        vocab_size,
        hidden_size,
        intermediate_size: uint("feed_forward_length")?,
        num_hidden_layers: uint("block_count")?,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: float("attention.layer_norm_rms_epsilon")?,
        rope_theta: match meta(&format!("{arch}.rope.freq_base")) {
            Some(_) => float("rope.freq_base")?,
            None => 10_000.0,
        },
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: !has("output.weight"),
        max_position_embeddings: uint("context_length")?,
        qkv_bias: model_type == ModelType::Qwen2 || has("blk.0.attn_q.bias"),
        o_bias: has("blk.0.attn_output.bias"),
        mlp_bias: has("blk.0.ffn_gate.bias"),
    })
}

/// The GGUF name of a Hugging Face tensor name (`None` for a name no GGUF tensor maps to).
pub fn gguf_name(hf: &str) -> Option<String> {
    const LAYER_PARTS: [(&str, &str); 9] = [
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    match hf {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (part, kind) = rest.rsplit_once('.')?;
    let (_, gguf) = LAYER_PARTS.iter().find(|(h, _)| *h == part)?;
    Some(format!("blk.{layer}.{gguf}.{kind}"))
}

/// Loads the policy from a parsed file (`path` names it in errors), with its config.
pub fn load_policy<B: Backend>(
    file: &GgufFile,
    path: &Path,
    device: &B::Device,
) -> Result<(HfConfig, Policy<B>), GgufError> {
    let config = config(file).map_err(|reason| GgufError::Invalid {
        path: path.to_path_buf(),
        reason,
    })?;
    let wanted = expected_tensors(&config);
    let mut tensors = HashMap::with_capacity(wanted.len());
    let mut used = HashSet::with_capacity(wanted.len());
    let mut quantized = QuantizedBase {
        layers: vec![Default::default(); config.num_hidden_layers],
        head: None,
    };
    for (hf, shape) in &wanted {
        let name = gguf_name(hf).unwrap_or_else(|| hf.clone());
        let error = |reason: String| GgufError::Tensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            reason,
        };
        let info = file
            .tensor(&name)
            .ok_or_else(|| error("is missing from the file".to_string()))?;
        if info.shape() != *shape {
            return Err(error(format!(
                "has shape {:?}, expected {shape:?} from the metadata",
                info.shape()
            )));
        }
        let mut values =
            quant::dequantize(info.ty, file.data(info), info.elements()).map_err(&error)?;
        if let Some(i) = values.iter().position(|x| !x.is_finite()) {
            return Err(error(format!(
                "holds a non-finite value ({}) at flat index {i}",
                values[i]
            )));
        }
        let permuted_heads = if config.model_type != ModelType::Llama {
            None
        } else if hf.contains(".self_attn.q_proj.") {
            Some(config.num_attention_heads)
        } else if hf.contains(".self_attn.k_proj.") {
            Some(config.num_key_value_heads)
        } else {
            None
        };
        if let Some(heads) = permuted_heads {
            values = unpermute_rows(&values, heads, config.head_dim);
        }
        let slot = BlockSlot::of(hf, config.tie_word_embeddings);
        if let (Some(format), Some(slot), &[rows, cols]) = (block_format(info.ty), slot, &shape[..])
        {
            // The file's blocks, kept for decode steps: the values above are theirs.
            let mut blocks =
                BlockMatrix::from_ggml(format, rows, cols, file.data(info)).map_err(&error)?;
            if let Some(heads) = permuted_heads {
                blocks = blocks.with_rows(&unpermuted_order(heads, config.head_dim));
            }
            match slot {
                BlockSlot::Layer(i, target) => quantized.set_layer(i, target, blocks),
                BlockSlot::Head => quantized.head = Some(blocks),
            }
        }
        used.insert(name.clone());
        tensors.insert(
            hf.clone(),
            F32Tensor {
                shape: shape.clone(),
                values,
            },
        );
    }
    if let Some(extra) = file.tensors.iter().find(|t| !used.contains(&t.name)) {
        let reason = if extra.name == "rope_freqs.weight" {
            "holds RoPE frequency factors (Llama 3.1-style scaling), which are not supported yet"
                .to_string()
        } else {
            format!(
                "is not part of a {} model with {} layers{} (the metadata and the tensors \
                 disagree)",
                config.model_type.name(),
                config.num_hidden_layers,
                if config.tie_word_embeddings {
                    " and tied embeddings"
                } else {
                    ""
                }
            )
        };
        return Err(GgufError::Tensor {
            path: path.to_path_buf(),
            tensor: extra.name.clone(),
            reason,
        });
    }
    let mut policy = build(&config, &mut tensors, device);
    if quantized.bytes() > 0 {
        policy.quantized = Some(Arc::new(quantized));
    }
    Ok((config, policy))
}

/// Undoes llama.cpp's permutation of a Llama query or key projection (weight `[rows, cols]`
/// or bias `[rows]`, `rows = heads * head_dim`). `convert_hf_to_gguf.py` reorders each head's
/// rows from halves `[x_0 .. x_{h/2}, y_0 .. y_{h/2}]` to pairs `[x_0, y_0, x_1, y_1, ..]`:
/// GGUF row `2i + j` of a head is Hugging Face row `j * head_dim / 2 + i`.
pub fn unpermute_rows(values: &[f32], heads: usize, head_dim: usize) -> Vec<f32> {
    let order = unpermuted_order(heads, head_dim);
    let cols = values.len() / order.len();
    order
        .iter()
        .flat_map(|&from| &values[from * cols..(from + 1) * cols])
        .copied()
        .collect()
}

/// [`unpermute_rows`]' order: the GGUF row that each Hugging Face row of a permuted
/// projection comes from.
fn unpermuted_order(heads: usize, head_dim: usize) -> Vec<usize> {
    let half = head_dim / 2;
    let mut order = vec![0; heads * head_dim];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                order[h * head_dim + j * half + i] = h * head_dim + 2 * i + j;
            }
        }
    }
    order
}

/// Where a tensor's blocks serve a decode step ([`QuantizedBase`]).
enum BlockSlot {
    /// A decoder block's linear layer.
    Layer(usize, LoraTarget),
    /// The LM head (the tied embedding when the head is tied).
    Head,
}

impl BlockSlot {
    /// The slot of the Hugging Face tensor `hf`, if its blocks serve one.
    fn of(hf: &str, tied: bool) -> Option<BlockSlot> {
        match hf {
            "lm_head.weight" => return Some(BlockSlot::Head),
            "model.embed_tokens.weight" if tied => return Some(BlockSlot::Head),
            _ => {}
        }
        let (layer, part) = hf.strip_prefix("model.layers.")?.split_once('.')?;
        let target = match part {
            "self_attn.q_proj.weight" => LoraTarget::Q,
            "self_attn.k_proj.weight" => LoraTarget::K,
            "self_attn.v_proj.weight" => LoraTarget::V,
            "self_attn.o_proj.weight" => LoraTarget::O,
            "mlp.gate_proj.weight" => LoraTarget::Gate,
            "mlp.up_proj.weight" => LoraTarget::Up,
            "mlp.down_proj.weight" => LoraTarget::Down,
            _ => return None,
        };
        Some(BlockSlot::Layer(layer.parse().ok()?, target))
    }
}

/// The block format of a ggml type that [`BlockMatrix`] multiplies by.
fn block_format(ty: GgmlType) -> Option<BlockFormat> {
    match ty {
        GgmlType::Q4_1 => Some(BlockFormat::Q4_1),
        GgmlType::Q8_0 => Some(BlockFormat::Q8_0),
        _ => None,
    }
}
