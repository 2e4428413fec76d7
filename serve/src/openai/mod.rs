//! Serving a policy over the OpenAI chat-completions API (`agentry serve`), and the wire
//! format `agentry eval --endpoint` speaks to any such server.
//!
//! Work in progress (issue 19): only the wire format exists so far.

pub mod model;
pub mod wire;
