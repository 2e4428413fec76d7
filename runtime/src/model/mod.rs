//! The policy network: a decoder-only transformer on burn, generic over the backend.
//!
//! Pre-norm decoder blocks (RMSNorm, causal multi-head attention with rotary position
//! embeddings and optional grouped-query key/value heads, SwiGLU feed-forward), a final RMSNorm
//! and an LM head, tied to the token embedding by default. [`Policy::forward`] and [`Policy::token_logprobs`] serve training on
//! right-padded batches; [`generate`] samples batches of continuations with a KV cache.
//! [`hf`] loads Hugging Face Qwen2 and Llama checkpoints into the same [`Policy`], and [`gguf`]
//! llama.cpp's GGUF files of those families; both return a [`Pretrained`].
//! [`kernels`] is where the blocks' operations run: fused kernels on flex, burn's ops elsewhere.

pub mod batch;
mod generate;
pub mod gguf;
pub mod hf;
pub mod kernels;
pub mod lora;
mod pretrained;
mod quantized;
pub mod recompute;
mod transformer;

pub use batch::ContinuousBatch;
pub use generate::{
    End, Generation, KeptCache, Sampling, generate, generate_kept, generate_switching,
    generate_uncached,
};
pub use kernels::{Kernels, TrainBackend};
pub use pretrained::{LoadError, Origin, Pretrained, base_digest, pretrained_config};
pub use quantized::{BLOCK_ROWS, QuantizedBase};
pub use transformer::{DecoderBlock, Policy, PolicyConfig, Rope, Scores, Want};

/// Draws every parameter of `module` now, in module order. burn gives a parameter its
/// initial value lazily, at its first use, from the backend's global RNG, and a copy of a
/// module not used yet draws its own: drawing first fixes the weights whatever uses the module
/// (or a copy of it) first, and whatever else draws from that RNG meanwhile.
pub fn draw_weights<B: burn::tensor::backend::Backend, M: burn::module::Module<B>>(module: &M) {
    struct Draw;
    impl<B: burn::tensor::backend::Backend> burn::module::ModuleVisitor<B> for Draw {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
        ) {
            let _ = param.val();
        }
    }
    module.visit(&mut Draw);
}
