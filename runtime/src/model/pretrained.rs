//! A pretrained model ready for a run, whichever format it came from.

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
