//! One OS episode: the shell over the instance's file system, scoring and the oracle.

use std::sync::Arc;

use super::shell::Shell;
use super::tasks::{Goal, Task};
use super::tools::{ANSWER, BASH, FINISH};
use crate::tool::{ToolSchema, find};
use crate::{Environment, Reset, Status, Step, ToolCall};

/// The observation of a script that printed nothing.
pub const NO_OUTPUT: &str = "(no output)";
/// The observation that ends an episode (the reward says whether it was solved).
pub const DONE: &str = "done";

/// The observation of a call after the episode ended.
pub const OVER: &str = "Error: the episode is over.";
/// The observation of an empty `answer_action`.
pub const EMPTY_ANSWER: &str = "Error: the answer is empty.";
/// The observation of `answer_action` on a task that asks for a change.
pub const NOT_A_QUESTION: &str =
    "Error: this task changes files; call finish_action() when they are right.";
/// The observation of `finish_action` on a question.
pub const NOT_A_CHANGE: &str =
    "Error: this task asks a question; answer it with answer_action(answer).";

/// Error observations of the episode itself (calls that do not fit the task), for the
/// vocabulary.
pub(crate) const ERRORS: [&str; 4] = [OVER, EMPTY_ANSWER, NOT_A_QUESTION, NOT_A_CHANGE];

/// One episode of an OS task.
#[derive(Clone, Debug)]
pub struct OsEnv {
    task: Arc<Task>,
    tools: Arc<[ToolSchema]>,
    shell: Shell,
    /// How many of the oracle's planned calls have been made, in order.
    plan_done: usize,
    /// Whether the episode was solved, once it has ended.
    outcome: Option<bool>,
}

impl OsEnv {
    /// An episode of `task`, offering `tools`.
    pub fn new(task: Arc<Task>, tools: Arc<[ToolSchema]>) -> OsEnv {
        let shell = Shell::new(task.fs.clone());
        OsEnv {
            task,
            tools,
            shell,
            plan_done: 0,
            outcome: None,
        }
    }

    /// The instance.
    pub fn task(&self) -> &Task {
        &self.task
    }

    /// The shell, with the file system as the agent left it.
    pub fn shell(&self) -> &Shell {
        &self.shell
    }

    /// Whether the agent has answered or finished.
    pub fn finished(&self) -> bool {
        self.outcome.is_some()
    }

    fn invalid(observation: &str) -> Step {
        Step {
            observation: observation.to_string(),
            reward: 0.0,
            status: Status::InvalidAction,
        }
    }

    fn end(&mut self, solved: bool) -> Step {
        self.outcome = Some(solved);
        Step {
            observation: DONE.to_string(),
            reward: f32::from(u8::from(solved)),
            status: Status::Completed,
        }
    }
}

impl Environment for OsEnv {
    fn reset(&mut self) -> Reset {
        self.shell = Shell::new(self.task.fs.clone());
        self.plan_done = 0;
        self.outcome = None;
        Reset {
            instruction: self.task.instruction.clone(),
            tools: self.tools.to_vec(),
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        if self.finished() {
            return Step {
                observation: OVER.to_string(),
                reward: 0.0,
                status: Status::Completed,
            };
        }
        let schema = match find(&self.tools, call) {
            Ok(s) => s,
            Err(message) => return OsEnv::invalid(&message),
        };
        if let Err(message) = schema.validate(call) {
            return OsEnv::invalid(&message);
        }
        let planned = self.task.plan.get(self.plan_done) == Some(call);
        match (call.name.as_str(), &self.task.goal) {
            (BASH, _) => {
                let output = self.shell.run(call.str_arg("script"));
                if planned {
                    self.plan_done += 1;
                }
                let output = output.trim_end_matches('\n');
                Step {
                    observation: if output.is_empty() {
                        NO_OUTPUT.to_string()
                    } else {
                        output.to_string()
                    },
                    reward: 0.0,
                    status: Status::Running,
                }
            }
            (ANSWER, Goal::Answer(expected)) => {
                let given = call.str_arg("answer").trim();
                if given.is_empty() {
                    return OsEnv::invalid(EMPTY_ANSWER);
                }
                let solved = given == expected.trim();
                self.end(solved)
            }
            (ANSWER, Goal::State(_)) => OsEnv::invalid(NOT_A_QUESTION),
            (FINISH, Goal::State(expect)) => {
                let solved = expect.check(self.shell.fs());
                self.end(solved)
            }
            (FINISH, Goal::Answer(_)) => OsEnv::invalid(NOT_A_CHANGE),
            // `find` accepted only the three tools above.
            _ => OsEnv::invalid("Error: unknown tool."),
        }
    }

    /// The instance's planned calls in order; a bash call off the plan does not move it, so
    /// the oracle resumes where the agent left the plan.
    fn oracle(&self) -> Option<ToolCall> {
        if self.finished() {
            return None;
        }
        self.task.plan.get(self.plan_done).cloned()
    }

    fn success(&self) -> bool {
        self.outcome == Some(true)
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}
