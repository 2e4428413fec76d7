//! The runtime's integration tests, as one test binary: every integration-test file is a
//! binary that links burn, so one binary for the crate links it once (the layout of
//! rust-analyzer's `tests/it/main.rs`). Each module was a file of its own under `tests/`.
//!
//! The modules' tests run as threads of one process: what they must not share (burn's global
//! weight-initialization RNG) is behind [`common::serial`]; see the `common` module docs.

mod common;
mod present;
mod pretrained;

mod checkpoint_resume;
mod curriculum;
mod data_parallel;
mod endpoint;
mod evaluation_only;
mod gguf;
mod hf_checkpoint;
mod lora;
mod model_batch;
mod model_copy;
mod model_policy;
mod model_sampling;
mod pipeline;
mod ppo;
mod quantized;
mod recompute;
mod replay;
mod report;
mod rollout;
mod serving;
mod shared_warmup;
mod text_chat;
mod text_template;
mod text_tokenizer;
mod warmup_from;
