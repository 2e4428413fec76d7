//! A pretrained model ready for a run, whichever format it came from.

use std::io::Read;
use std::path::{Path, PathBuf};

use agentry_dsl::spec::{Arch, TransformerArch};
use sha2::{Digest, Sha256};

use super::hf::HfConfig;

use burn::tensor::backend::Backend;

use super::transformer::Policy;
use crate::text::Tokenizer;

/// A pretrained policy and its tokenizer (with chat turn markers): what a Hugging Face
/// checkpoint directory ([`super::hf::HfCheckpoint::load`]) and a GGUF file
/// ([`Pretrained::from_gguf`]) both load to, so a run treats them alike.
#[derive(Debug)]
pub struct Pretrained<B: Backend> {
    /// The policy, with the pretrained weights.
    pub policy: Policy<B>,
    /// The model's tokenizer, for [`crate::text::ChatFormat`].
    pub tokenizer: Tokenizer,
}

impl<B: Backend> Pretrained<B> {
    /// Pairs a loaded policy with its tokenizer, refusing a tokenizer with more ids than the
    /// embedding has rows (the policy could not embed them). On refusal, the reason to report;
    /// `rows` words the embedding's size as the model's file does.
    pub(super) fn paired(
        policy: Policy<B>,
        tokenizer: Tokenizer,
        rows: impl FnOnce(usize) -> String,
    ) -> Result<Self, String> {
        if tokenizer.vocab_size() > policy.vocab {
            return Err(format!(
                "{} token ids, but the model's {}",
                tokenizer.vocab_size(),
                rows(policy.vocab)
            ));
        }
        Ok(Pretrained { policy, tokenizer })
    }
}

/// Where an experiment's policy comes from: what a run and a replay both build it from.
pub enum Origin<'a, B: Backend> {
    /// `arch = transformer { ... }`: initialized from the seed, with a tokenizer trained on
    /// the tasks' text.
    Scratch(&'a TransformerArch),
    /// `arch = qwen2/llama { weights = ... }` (a Hugging Face checkpoint) or `gguf { file =
    /// ... }`: a pretrained model with its tokenizer.
    Pretrained(Box<Pretrained<B>>),
}

impl<'a, B: Backend> Origin<'a, B> {
    /// The origin `arch` declares, with a pretrained model loaded.
    pub fn of(arch: &'a Arch, device: &B::Device) -> Result<Self, LoadError> {
        use super::hf::ModelType;
        let pretrained = match arch {
            Arch::Transformer(arch) => return Ok(Origin::Scratch(arch)),
            Arch::Qwen2 { weights } => {
                Pretrained::load(Path::new(weights), ModelType::Qwen2, device)?
            }
            Arch::Llama { weights } => {
                Pretrained::load(Path::new(weights), ModelType::Llama, device)?
            }
            Arch::Gguf { file } => Pretrained::from_gguf(Path::new(file), device)?,
        };
        Ok(Origin::Pretrained(Box::new(pretrained)))
    }
}

/// Why a pretrained model (a Hugging Face checkpoint or a GGUF file) could not be loaded. Each
/// variant names the file concerned.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// A file could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file is malformed or describes something this loader does not support.
    #[error("{}: {reason}", path.display())]
    Invalid {
        /// The file (or the checkpoint directory, when a file is missing).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// One tensor is missing, misshapen, of an unsupported type or not finite.
    #[error("{}: tensor `{tensor}` {reason}", path.display())]
    Tensor {
        /// The file that holds (or should hold) the tensor.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
}

/// The Hugging Face configuration of the pretrained model `arch` names (a GGUF file's metadata
/// mapped to one), read without its weights; `arch` is `qwen2`, `llama` or `gguf`.
pub fn pretrained_config(arch: &Arch) -> Result<HfConfig, LoadError> {
    match arch {
        Arch::Gguf { file } => {
            let path = Path::new(file);
            super::gguf::config(&super::gguf::open(path)?).map_err(|reason| LoadError::Invalid {
                path: path.to_path_buf(),
                reason,
            })
        }
        Arch::Qwen2 { weights } | Arch::Llama { weights } => HfConfig::load(Path::new(weights)),
        Arch::Transformer(_) => Err(LoadError::Invalid {
            path: PathBuf::new(),
            reason: "a model built from the seed has no model files".into(),
        }),
    }
}

/// The SHA-256 of a pretrained model's weight files, as `sha256:HEX`: the GGUF file, or a
/// Hugging Face directory's `*.safetensors` files in name order (names included). `None` for a
/// model built from the seed, which the experiment itself pins down.
///
/// LoRA checkpoints record it: adapters mean something only on the base they were trained on.
pub fn base_digest(arch: &Arch) -> Result<Option<String>, LoadError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LoadError::Io { path, source }
    };
    let files = match arch {
        Arch::Transformer(_) => return Ok(None),
        Arch::Gguf { file } => vec![PathBuf::from(file)],
        Arch::Qwen2 { weights } | Arch::Llama { weights } => {
            let dir = Path::new(weights);
            let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(io(dir))?
                .map(|entry| entry.map(|e| e.path()))
                .collect::<Result<_, _>>()
                .map_err(io(dir))?;
            files.retain(|p| p.extension().is_some_and(|e| e == "safetensors"));
            files.sort();
            files
        }
    };
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    for path in &files {
        if files.len() > 1 {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            hasher.update((name.len() as u64).to_le_bytes());
            hasher.update(name.as_bytes());
        }
        let mut file = std::fs::File::open(path).map_err(io(path))?;
        loop {
            let n = file.read(&mut buffer).map_err(io(path))?;
            if n == 0 {
                break;
            }
            hasher.update(&buffer[..n]);
        }
    }
    let hex: String = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(Some(format!("sha256:{hex}")))
}
