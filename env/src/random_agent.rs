//! A seeded random agent: well-typed calls to the episode's tools with arguments drawn from the
//! task's vocabulary.
//!
//! It is the baseline of `bench_envs` (environment speed without a policy) and a cheap fuzzer
//! for a new environment: its calls are valid JSON of the right types, so they exercise the
//! environment's own logic rather than argument checking.

use rand::Rng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value};

use crate::{ParamKind, Reset, ToolCall};

/// Draws calls for the tools of a [`Reset`], with words from a vocabulary.
#[derive(Clone, Debug)]
pub struct RandomAgent {
    words: Vec<String>,
}

impl RandomAgent {
    /// An agent that fills string arguments with words of `vocabulary` (typically
    /// [`TaskGenerator::vocabulary`](crate::TaskGenerator::vocabulary)); an empty vocabulary
    /// falls back to a few generic words.
    pub fn new(vocabulary: Vec<String>) -> Self {
        let words = if vocabulary.is_empty() {
            ["a", "b", "1", "#0", "x"].map(String::from).to_vec()
        } else {
            vocabulary
        };
        RandomAgent { words }
    }

    /// One call: a uniformly drawn tool of `reset.tools` with every parameter given a value of
    /// its type (strings of one to three words). `None` when the episode offers no tool.
    pub fn call(&self, reset: &Reset, rng: &mut ChaCha8Rng) -> Option<ToolCall> {
        let tool = reset.tools.choose(rng)?;
        let arguments: Map<String, Value> = tool
            .parameters
            .iter()
            .map(|p| (p.name.clone(), self.value(p.kind, rng)))
            .collect();
        Some(ToolCall {
            name: tool.name.clone(),
            arguments,
        })
    }

    fn value(&self, kind: ParamKind, rng: &mut ChaCha8Rng) -> Value {
        match kind {
            ParamKind::String => Value::String(self.phrase(rng)),
            ParamKind::Integer => Value::from(rng.random_range(0..100)),
            ParamKind::Number => Value::from(rng.random_range(0.0..100.0)),
            ParamKind::Boolean => Value::Bool(rng.random()),
            ParamKind::StringArray => {
                let n = rng.random_range(1..=2);
                Value::Array((0..n).map(|_| Value::String(self.phrase(rng))).collect())
            }
        }
    }

    fn phrase(&self, rng: &mut ChaCha8Rng) -> String {
        let n = rng.random_range(1..=3);
        let words: Vec<&str> = (0..n)
            .filter_map(|_| self.words.choose(rng).map(String::as_str))
            .collect();
        words.join(" ")
    }
}
