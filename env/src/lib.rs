//! Agentry's environments: the contract every task implements, and the built-in tasks.
//!
//! An episode is a conversation between a policy and an [`Environment`]: `reset` gives the task
//! instruction and the tools the agent may call, and every agent turn is one [`ToolCall`] that
//! `step` answers with an observation, a reward and a [`Status`]. Tools are JSON-schema
//! functions, as in OpenAI function calling.
//!
//! **Invariant:** nothing a policy emits can make an environment panic. A malformed or unknown
//! call, a missing or mistyped argument, or an oversized input is answered with an error
//! observation and [`Status::InvalidAction`], so the agent can learn from it.
//!
//! Instances are generated from a seed by a [`TaskGenerator`], with disjoint train and test
//! splits and difficulty levels 1–3. Every built-in task has an oracle that solves every
//! instance; its actions are the demonstrations for supervised warm-up.
//!
//! Built-in tasks (AgentBench-FC's five, rebuilt natively):
//! - [`alfworld::Alfworld`]: a text household with ALFWorld's goals and commands;
//! - [`db::Db`]: SQL questions and edits over a real (in-memory) SQLite database;
//! - [`kg::Kg`]: question answering over a generated knowledge graph;
//! - [`os::Os`]: a sandboxed shell over an in-memory file system;
//! - [`webshop::Webshop`]: finding and buying a product in a generated web shop.
//!
//! [`controller::Controller`] serves many sessions concurrently on a pool of worker threads, with
//! per-call timeouts, panic isolation and cancellation.
//!
//! This crate does not depend on burn: environments are pure Rust and fast to test.

pub mod alfworld;
pub mod content_hash;
pub mod controller;
pub mod db;
pub mod kg;
pub mod os;
pub mod pieces;
pub mod random_agent;
pub mod syntax;
pub mod tool;
pub mod webshop;

pub use random_agent::RandomAgent;
pub use syntax::{ToolCallFormat, parse_call, render_call};
pub use tool::{Param, ParamKind, ToolCall, ToolSchema};

use serde::{Deserialize, Serialize};

/// Which instances a generator draws from. Train and test instances never overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// Instances trained on.
    Train,
    /// Held-out instances.
    Test,
}

/// Where an episode stands after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The episode goes on.
    Running,
    /// The agent finished (successfully or not; the reward says which).
    Completed,
    /// The turn limit was reached.
    TaskLimitReached,
    /// The agent's call could not be executed (malformed, unknown tool, bad arguments);
    /// the episode goes on unless the environment decides otherwise.
    InvalidAction,
    /// The agent's final answer was malformed.
    ValidationFailed,
    /// The environment itself failed; the episode ends.
    TaskError,
}

impl Status {
    /// Whether the episode has ended.
    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Running | Status::InvalidAction)
    }
}

/// What `reset` returns: the instruction and the tools.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reset {
    /// The task instruction, shown to the agent as the user message.
    pub instruction: String,
    /// The tools the agent may call this episode.
    pub tools: Vec<ToolSchema>,
}

/// What `step` returns.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Step {
    /// The tool result (or error message) shown to the agent.
    pub observation: String,
    /// Reward earned by this turn (turn-level rewards are allowed; outcome tasks put it all on
    /// the last turn).
    pub reward: f32,
    /// Where the episode stands.
    pub status: Status,
}

impl Step {
    /// Whether the episode has ended.
    pub fn done(&self) -> bool {
        self.status.is_terminal()
    }
}

/// One episode of a task instance.
///
/// Cloning (`box_clone`) snapshots the episode mid-way, for Monte-Carlo process rewards.
pub trait Environment: Send {
    /// Starts the episode; called once, before any `step`.
    fn reset(&mut self) -> Reset;
    /// Executes one agent call. Never panics on any call.
    fn step(&mut self, call: &ToolCall) -> Step;
    /// The oracle's next call from the current state, or `None` when the task has no oracle or
    /// the episode is over. Following it from `reset` solves every instance.
    fn oracle(&self) -> Option<ToolCall>;
    /// Whether the episode so far counts as solved (reward alone may be partial credit).
    fn success(&self) -> bool;
    /// A snapshot of the episode.
    fn box_clone(&self) -> Box<dyn Environment>;
}

/// A task: a seeded generator of instances.
///
/// A user's own task is a type implementing this trait and [`Default`], named by path in an
/// experiment file (`task mine { env = crate::envs::Maze }`).
pub trait TaskGenerator: Send + Sync {
    /// A version string recorded with every run, bumped whenever generated instances change.
    fn version(&self) -> &str;
    /// The episode of instance `index` of `split` at `difficulty` (1..=3). The same arguments
    /// always give the same instance, and no instance is in both splits.
    fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment>;
    /// Words that instances of this task use, for building a tokenizer vocabulary.
    fn vocabulary(&self) -> Vec<String> {
        Vec::new()
    }
    /// How many distinct instances `split` holds at `difficulty` when that is finite (a fixed
    /// set of questions, a remote task's indices): index `i` is then instance `i % count`.
    /// `None`, the default, says every index is an instance of its own. An evaluation that
    /// plays more episodes than this repeats instances, which the runtime warns about.
    fn instances(&self, _split: Split, _difficulty: u8) -> Option<u64> {
        None
    }
}

/// How an experiment's `remote = "URL"` tasks are reached: connects task `name` served at `url`
/// and returns it as a [`TaskGenerator`].
///
/// The runtime resolves remote tasks only through this trait, so a training binary links an
/// HTTP client only when its caller supplies one: `agentry-serve`'s `HttpRemoteTasks` (which
/// the `agentry` crate's CLI and recipes pass) speaks AgentRL's controller protocol; a test
/// can pass its own.
pub trait RemoteTasks: Send + Sync {
    /// Connects to task `name` at `url`, before any work: a server that is down or does not
    /// know the task is an error here, not a failure in the middle of a run.
    ///
    /// # Errors
    /// Whatever stops the connection, in words for the user (the runtime adds the task's name
    /// and address).
    fn connect(
        &self,
        url: &str,
        name: &str,
    ) -> Result<Box<dyn TaskGenerator>, Box<dyn std::error::Error + Send + Sync>>;
}

/// Options that hold a connector (`agentry_runtime::train::RunOptions`) derive `Debug`; the
/// connector has no state worth printing, so it shows as its trait.
impl std::fmt::Debug for dyn RemoteTasks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn RemoteTasks")
    }
}
