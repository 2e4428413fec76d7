//! The OS task's tools: `bash_action`, `answer_action` and `finish_action`, as in
//! AgentBench-FC's OS task.

use crate::tool::{Param, ParamKind, ToolSchema};

/// `bash_action(script)`: runs a shell script in the sandbox.
pub const BASH: &str = "bash_action";
/// `answer_action(answer)`: answers a question task and ends the episode.
pub const ANSWER: &str = "answer_action";
/// `finish_action()`: ends a state-changing task, which is then checked.
pub const FINISH: &str = "finish_action";

/// Descriptions of the tools and their parameters, in plain words.
pub(crate) const DESCRIPTIONS: [&str; 5] = [
    "run a bash script in the sandbox and see its output",
    "the commands to run",
    "give the answer to the question and end the task",
    "the answer",
    "end a task that changes files and have the result checked",
];

/// The schemas of the OS tools, in a fixed order.
pub fn schemas() -> Vec<ToolSchema> {
    let [bash, script, answer, text, finish] = DESCRIPTIONS;
    vec![
        ToolSchema::new(
            BASH,
            bash,
            vec![Param::required("script", ParamKind::String, script)],
        ),
        ToolSchema::new(
            ANSWER,
            answer,
            vec![Param::required("answer", ParamKind::String, text)],
        ),
        ToolSchema::new(FINISH, finish, Vec::new()),
    ]
}
