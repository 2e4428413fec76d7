//! Text for the policy: a lossless word-level tokenizer with byte fallback, and the chat format
//! that renders episodes (system tools, user instruction, agent tool calls, tool observations)
//! into token sequences with an agent mask. [`HfTokenizer`] reads a Hugging Face checkpoint's
//! `tokenizer.json`, and [`ChatTemplate`] renders a pretrained model's own Jinja chat template.

pub mod chat;
pub mod hf;
pub mod template;
pub mod tokenizer;

pub use chat::{ChatFormat, Transcript};
pub use hf::HfTokenizer;
pub use template::ChatTemplate;
pub use tokenizer::{Special, Tokenizer, TokenizerError};
