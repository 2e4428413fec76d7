//! Serving a policy over the OpenAI chat-completions API (`agentry serve`), and the wire
//! format `agentry eval --endpoint` speaks to any such server.
//!
//! Work in progress (issue 19): the wire format, the [`model::ChatModel`] seam and the
//! [`server`] exist. [`serve_openai`] serves any [`model::ChatModel`] at `/v1`, with OpenAI's
//! statuses and error objects.

pub mod model;
pub mod server;
pub mod wire;

pub use server::{OpenAiConfig, base_url, serve_openai};
