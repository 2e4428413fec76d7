//! Agentry's environments over HTTP, compatible with AgentRL's controller ⇄ worker protocol.
//!
//! Three roles, as in AgentRL:
//!
//! - a [`worker`] serves one task's instances (any [`agentry_env::TaskGenerator`]: a built-in
//!   task or a user's own) and heartbeats to a controller;
//! - the [`controller`] routes sessions from trainers and evaluators to the workers that
//!   heartbeat to it, and interoperates with AgentRL's Python workers (`agentrl-worker`);
//! - the [`client`] plays sessions through a controller, and [`client::RemoteTask`] turns a
//!   remote task into a [`agentry_env::TaskGenerator`], so it can be trained on like a local one
//!   ([`HttpRemoteTasks`] is how the runtime reaches it: `agentry-runtime` itself has no HTTP
//!   stack).
//!
//! [`protocol`] holds the wire format. Every body and status code follows AgentRL's HTTP
//! transport as its Go controller and Python worker (agentrl-worker 0.4.0) implement it; the
//! book's deployment chapter describes it and the few documented differences.
//!
//! Environment code never runs on an async runtime thread: workers step environments on
//! [`agentry_env::controller::Controller`]'s thread pool. Servers run on their own tokio
//! runtime inside a [`Server`], which stops everything when dropped.
//!
//! A controller or worker given a [`Token`] refuses (401) every request that does not carry it
//! as `Authorization: Bearer <token>`; everything of ours that calls them sends it ([`auth`]).

#![warn(missing_docs)]

pub mod auth;
pub mod client;
pub mod controller;
pub mod openai;
pub mod protocol;
mod server;
pub mod worker;

pub use auth::Token;
pub use client::{ClientError, ControllerClient, HttpRemoteTasks, RemoteEnv, RemoteTask};
pub use controller::ControllerConfig;
pub use server::Server;
pub use worker::WorkerConfig;
