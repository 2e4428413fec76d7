//! The burn runtime of Agentry: it runs a checked experiment.
//!
//! A run goes: resolve the experiment's tasks to environment generators ([`tasks`]); train a
//! tokenizer on the text of oracle episodes and build the policy ([`text`], [`model`]); clone
//! the oracle's demonstrations into the policy (supervised warm-up); then repeat RL steps — roll
//! out groups of episodes with the current policy ([`rollout`]), turn rewards into token
//! advantages and minimize the clipped policy loss over the agent's tokens only ([`algo`]) —
//! drawing tasks and turn budgets from the curriculum ([`curriculum`]), and evaluate on held-out
//! instances. Everything a run records goes to `runs/<experiment>/<run-id>/` ([`metrics`]),
//! including checkpoints a run resumes from exactly ([`checkpoint`]), the stability alarms
//! raised along the way ([`monitor`]), every evaluation episode, recorded ([`trajectory`])
//! so that `agentry replay` can play it again and check it ([`replay`]), and a report with
//! tables and learning curves read back from those files ([`report`]).
//!
//! The runtime is generic over the burn backend; [`device`] is the one place that names
//! concrete backends. All randomness flows from the experiment's seed through explicit RNGs.

pub mod algo;
pub mod checkpoint;
pub mod compare;
pub mod curriculum;
pub mod device;
pub mod endpoint;
pub mod error;
pub mod experiment;
pub mod export;
pub mod metrics;
pub mod model;
pub mod monitor;
pub mod optim;
pub mod pipeline;
pub mod pool;
pub mod replay;
pub mod report;
pub mod rollout;
pub mod serving;
pub mod shared_warmup;
pub mod sweep;
pub mod tasks;
pub mod text;
pub mod train;
pub mod trajectory;

pub use agentry_dsl::spec;
pub use agentry_env as env;
pub use error::RunError;
pub use experiment::{Experiment, Interpreted};
pub use train::{RunOptions, RunSummary, run, run_configuration};
