//! A pretrained model ready for a run, whichever format it came from.

use std::path::PathBuf;

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
