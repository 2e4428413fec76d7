//! `Present`: a task a tiny policy can win, for tests that need rewards which differ between
//! episodes (kg's are all 0 for an untrained policy). A `done()` call earns reward 1 and ends
//! the episode; anything else is an invalid action, reward 0, until the turn limit.

use agentry_env::{Environment, Reset, Split, Status, Step, TaskGenerator, ToolCall, ToolSchema};
use agentry_runtime::Experiment;

/// The task's generator.
#[derive(Clone, Copy, Default)]
pub struct Present {
    /// Every episode counts as solved, however it ends: even the tiny untrained policy then
    /// fills the buffer of `sft_from = successes`.
    pub solved_anyway: bool,
}

#[derive(Clone)]
struct PresentEpisode {
    task: Present,
    over: bool,
}

impl TaskGenerator for Present {
    fn version(&self) -> &str {
        "present-1"
    }

    fn instance(&self, _: Split, _: u8, _: u64) -> Box<dyn Environment> {
        Box::new(PresentEpisode {
            task: *self,
            over: false,
        })
    }
}

impl Environment for PresentEpisode {
    fn reset(&mut self) -> Reset {
        Reset {
            instruction: "say done".into(),
            tools: vec![ToolSchema::new("done", "end the episode", vec![])],
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        if call.name != "done" {
            return Step {
                observation: "Error: the only tool is done()".into(),
                reward: 0.0,
                status: Status::InvalidAction,
            };
        }
        self.over = true;
        Step {
            observation: "done".into(),
            reward: 1.0,
            status: Status::Completed,
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        (!self.over).then(|| ToolCall::new("done", []))
    }

    fn success(&self) -> bool {
        self.over || self.task.solved_anyway
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}

/// An experiment whose task `present` (`env = crate::Present`) is [`Present`].
pub struct WithPresent {
    spec: agentry_dsl::Checked<agentry_dsl::spec::Experiment>,
    task: Present,
}

impl WithPresent {
    /// The experiment `source`, its `present` episodes solved only by a `done()` call.
    pub fn new(source: &str) -> Self {
        Self::with(source, Present::default())
    }

    /// The experiment `source`, its `present` episodes all counted as solved.
    pub fn solved_anyway(source: &str) -> Self {
        Self::with(
            source,
            Present {
                solved_anyway: true,
            },
        )
    }

    fn with(source: &str, task: Present) -> Self {
        WithPresent {
            spec: agentry_dsl::check(source).expect("the experiment checks"),
            task,
        }
    }
}

impl Experiment for WithPresent {
    fn spec(&self) -> agentry_dsl::Checked<agentry_dsl::spec::Experiment> {
        self.spec.clone()
    }

    fn user_task(&self, name: &str) -> Option<Box<dyn TaskGenerator>> {
        (name == "present").then(|| Box::new(self.task) as Box<dyn TaskGenerator>)
    }
}
