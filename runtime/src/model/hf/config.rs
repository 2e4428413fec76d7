//! `config.json`: the shape and conventions of a Hugging Face Qwen2 or Llama checkpoint.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::HfError;

/// The two model families this loader reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelType {
    /// `model_type = "qwen2"`: biases on the query, key and value projections.
    Qwen2,
    /// `model_type = "llama"`: optional biases (`attention_bias`, `mlp_bias`).
    Llama,
}

impl ModelType {
    /// The `model_type` string of `config.json`.
    pub fn name(self) -> &'static str {
        match self {
            ModelType::Qwen2 => "qwen2",
            ModelType::Llama => "llama",
        }
    }
}

/// How the rotary frequencies are derived from the base ones.
#[derive(Clone, Debug, PartialEq)]
pub enum RopeScaling {
    /// `theta^(-2i / head_dim)` as they are.
    None,
    /// Llama 3's static per-frequency rule: high frequencies kept, low ones divided by
    /// `factor`, the band between smoothly interpolated.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are divided.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context the model was pre-trained with.
        original_max_position_embeddings: f64,
    },
}

/// The parts of `config.json` the policy needs, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    /// Qwen2 or Llama.
    pub model_type: ModelType,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// SwiGLU hidden width.
    pub intermediate_size: usize,
    /// Decoder blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention).
    pub num_key_value_heads: usize,
    /// Width of one head (`hidden_size / num_attention_heads` unless given).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Whether the LM head is the embedding (then the checkpoint has no `lm_head.weight`).
    pub tie_word_embeddings: bool,
    /// Longest sequence the model was configured for; the policy's context.
    pub max_position_embeddings: usize,
    /// Biases on the query, key and value projections (always for Qwen2).
    pub qkv_bias: bool,
    /// Bias on the attention output projection (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on the feed-forward projections (Llama's `mlp_bias`).
    pub mlp_bias: bool,
}

impl HfConfig {
    /// Reads and checks `dir/config.json`.
    pub fn load(dir: &Path) -> Result<Self, HfError> {
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|source| HfError::Io {
            path: path.clone(),
            source,
        })?;
        Self::parse(&text, &path)
    }

    /// Parses and checks the text of a `config.json` (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, HfError> {
        let value: Value = serde_json::from_str(text).map_err(|e| HfError::Invalid {
            path: path.to_path_buf(),
            reason: format!("not valid JSON: {e}"),
        })?;
        let Value::Object(map) = value else {
            return Err(HfError::Invalid {
                path: path.to_path_buf(),
                reason: "expected a JSON object".to_string(),
            });
        };
        Fields { map: &map, path }.config()
    }

    /// The rotary inverse frequencies, computed as `transformers` does: in f32, then scaled.
    pub fn inv_freq(&self) -> Vec<f64> {
        let dim = self.head_dim;
        let base: Vec<f32> = (0..dim / 2)
            .map(|i| {
                let exponent = (2 * i) as f32 / dim as f32;
                1.0 / (self.rope_theta as f32).powf(exponent)
            })
            .collect();
        match &self.rope_scaling {
            RopeScaling::None => base.into_iter().map(f64::from).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let (factor, low, high, old) = (
                    *factor as f32,
                    *low_freq_factor as f32,
                    *high_freq_factor as f32,
                    *old as f32,
                );
                let low_freq_wavelen = old / low;
                let high_freq_wavelen = old / high;
                base.into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f32::consts::PI / f;
                        let scaled = if wavelen > low_freq_wavelen {
                            f / factor
                        } else {
                            f
                        };
                        // transformers: `~(wavelen < high) * ~(wavelen > low)`; wavelengths are
                        // never NaN (theta is checked positive and finite).
                        let medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                        let out = if medium {
                            let smooth = (old / wavelen - low) / (high - low);
                            (1.0 - smooth) * scaled / factor + smooth * scaled
                        } else {
                            scaled
                        };
                        f64::from(out)
                    })
                    .collect()
            }
        }
    }
}

/// Typed access to the keys of a `config.json` object, with errors naming the file and key.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    path: &'a Path,
}

impl Fields<'_> {
    fn invalid(&self, reason: impl Into<String>) -> HfError {
        HfError::Invalid {
            path: PathBuf::from(self.path),
            reason: reason.into(),
        }
    }

    /// A key that is absent or `null` reads as `None`.
    fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn count(&self, key: &str, default: Option<usize>) -> Result<usize, HfError> {
        match self.get(key) {
            None => default.ok_or_else(|| self.invalid(format!("`{key}` is missing"))),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| {
                    self.invalid(format!("`{key}` must be a positive integer, found {v}"))
                }),
        }
    }

    fn number(
        &self,
        map: &Map<String, Value>,
        key: &str,
        default: Option<f64>,
    ) -> Result<f64, HfError> {
        match map.get(key).filter(|v| !v.is_null()) {
            None => default.ok_or_else(|| self.invalid(format!("`{key}` is missing"))),
            Some(v) => v
                .as_f64()
                .filter(|x| x.is_finite() && *x > 0.0)
                .ok_or_else(|| {
                    self.invalid(format!("`{key}` must be a positive number, found {v}"))
                }),
        }
    }

    fn flag(&self, key: &str, default: bool) -> Result<bool, HfError> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.invalid(format!("`{key}` must be true or false, found {v}"))),
        }
    }

    fn config(&self) -> Result<HfConfig, HfError> {
        let model_type = match self.get("model_type").and_then(Value::as_str) {
            Some("qwen2") => ModelType::Qwen2,
            Some("llama") => ModelType::Llama,
            Some(other) => {
                return Err(self.invalid(format!(
                    "model_type `{other}` is not supported (qwen2 and llama are)"
                )));
            }
            None => return Err(self.invalid("`model_type` is missing or not a string")),
        };
        if let Some(act) = self.get("hidden_act")
            && act.as_str() != Some("silu")
        {
            return Err(self.invalid(format!(
                "hidden_act {act} is not supported (the feed-forward is SwiGLU: \"silu\")"
            )));
        }
        if model_type == ModelType::Qwen2 && self.flag("use_sliding_window", false)? {
            return Err(self.invalid(
                "use_sliding_window = true is not supported (attention is over the whole context)",
            ));
        }
        // transformers 5 lists each layer's attention; only full attention is implemented.
        if let Some(types) = self.get("layer_types") {
            let all_full = types
                .as_array()
                .is_some_and(|t| t.iter().all(|k| k.as_str() == Some("full_attention")));
            if !all_full {
                return Err(self.invalid(format!(
                    "layer_types {types} is not supported (only \"full_attention\" layers are)"
                )));
            }
        }
        let vocab_size = self.count("vocab_size", None)?;
        let hidden_size = self.count("hidden_size", None)?;
        let intermediate_size = self.count("intermediate_size", None)?;
        let num_hidden_layers = self.count("num_hidden_layers", None)?;
        let num_attention_heads = self.count("num_attention_heads", None)?;
        let num_key_value_heads = self.count("num_key_value_heads", Some(num_attention_heads))?;
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(self.invalid(format!(
                "num_key_value_heads {num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"
            )));
        }
        let head_dim = match self.get("head_dim") {
            Some(_) => self.count("head_dim", None)?,
            None if hidden_size.is_multiple_of(num_attention_heads) => {
                hidden_size / num_attention_heads
            }
            None => {
                return Err(self.invalid(format!(
                    "hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads} and no head_dim is given"
                )));
            }
        };
        if !head_dim.is_multiple_of(2) {
            return Err(self.invalid(format!(
                "head_dim {head_dim} must be even for rotary embeddings"
            )));
        }
        if num_attention_heads.checked_mul(head_dim).is_none() {
            return Err(self.invalid("num_attention_heads * head_dim overflows"));
        }
        let (rope_theta, rope_scaling) = self.rope()?;
        let (qkv_bias, o_bias, mlp_bias) = match model_type {
            ModelType::Qwen2 => (true, false, false),
            ModelType::Llama => {
                let attention = self.flag("attention_bias", false)?;
                (attention, attention, self.flag("mlp_bias", false)?)
            }
        };
        Ok(HfConfig {
            model_type,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: self.number(self.map, "rms_norm_eps", Some(1e-6))?,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: self.flag("tie_word_embeddings", false)?,
            max_position_embeddings: self.count("max_position_embeddings", Some(2048))?,
            qkv_bias,
            o_bias,
            mlp_bias,
        })
    }

    /// RoPE base and scaling. transformers 5 writes one `rope_parameters` object (with
    /// `rope_theta` inside); older versions write `rope_theta` and `rope_scaling` at the top.
    fn rope(&self) -> Result<(f64, RopeScaling), HfError> {
        let empty = Map::new();
        let (params, theta) = match self.get("rope_parameters") {
            Some(Value::Object(params)) => {
                let theta = match params.get("rope_theta").filter(|v| !v.is_null()) {
                    Some(_) => self.number(params, "rope_theta", None)?,
                    None => self.number(self.map, "rope_theta", Some(10_000.0))?,
                };
                (params, theta)
            }
            Some(other) => {
                return Err(self.invalid(format!(
                    "`rope_parameters` must be an object, found {other}"
                )));
            }
            None => {
                let theta = self.number(self.map, "rope_theta", Some(10_000.0))?;
                match self.get("rope_scaling") {
                    Some(Value::Object(scaling)) => (scaling, theta),
                    Some(other) => {
                        return Err(self.invalid(format!(
                            "`rope_scaling` must be an object or null, found {other}"
                        )));
                    }
                    None => (&empty, theta),
                }
            }
        };
        if let Some(partial) = params
            .get("partial_rotary_factor")
            .or_else(|| self.get("partial_rotary_factor"))
            .filter(|v| !v.is_null())
            && partial.as_f64() != Some(1.0)
        {
            return Err(self.invalid(format!(
                "partial_rotary_factor {partial} is not supported (the whole head is rotated)"
            )));
        }
        let kind = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .filter(|v| !v.is_null());
        let scaling = match kind.map(|k| k.as_str()) {
            None | Some(Some("default")) => RopeScaling::None,
            Some(Some("llama3")) => {
                let number = |key: &str| self.number(params, key, None);
                let scaling = RopeScaling::Llama3 {
                    factor: number("factor")?,
                    low_freq_factor: number("low_freq_factor")?,
                    high_freq_factor: number("high_freq_factor")?,
                    original_max_position_embeddings: number("original_max_position_embeddings")?,
                };
                if let RopeScaling::Llama3 {
                    low_freq_factor,
                    high_freq_factor,
                    ..
                } = scaling
                    && high_freq_factor <= low_freq_factor
                {
                    return Err(self.invalid(format!(
                        "llama3 rope scaling needs high_freq_factor ({high_freq_factor}) > low_freq_factor ({low_freq_factor})"
                    )));
                }
                scaling
            }
            Some(Some(other)) => {
                return Err(self.invalid(format!(
                    "rope scaling `{other}` is not supported (default and llama3 are)"
                )));
            }
            Some(None) => {
                return Err(self.invalid(format!(
                    "rope type {} must be a string",
                    kind.map_or(Value::Null, Clone::clone)
                )));
            }
        };
        Ok((theta, scaling))
    }
}
