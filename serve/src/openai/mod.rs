//! Serving a policy over the OpenAI chat-completions API (`agentry serve`), and the client
//! `agentry eval --endpoint` plays episodes through against any such server.
//!
//! [`wire`] holds the wire format and [`model::ChatModel`] the seam to whatever generates.
//! [`serve_openai`] serves any [`model::ChatModel`] at `/v1`, with OpenAI's statuses and error
//! objects; [`OpenAiClient`] calls any OpenAI-compatible endpoint, retrying what may pass and
//! counting every fault.

pub mod client;
pub mod model;
pub mod server;
pub mod wire;

pub use client::{EndpointConfig, EndpointError, EndpointStats, OpenAiClient, Reply, TokenUsage};
pub use server::{OpenAiConfig, base_url, serve_openai};
