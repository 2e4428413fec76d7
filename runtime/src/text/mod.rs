//! Text for the policy: a lossless word-level tokenizer with byte fallback, and the chat format
//! that renders episodes (system tools, user instruction, agent tool calls, tool observations)
//! into token sequences with an agent mask.

pub mod chat;
pub mod tokenizer;

pub use chat::{ChatFormat, Transcript};
pub use tokenizer::{Special, Tokenizer, TokenizerError};
