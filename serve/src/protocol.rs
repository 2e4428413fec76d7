//! The wire format of AgentRL's controller ⇄ worker protocol (HTTP transport).
//!
//! Every struct here is one JSON body of `/work/shared/agentrl-protocol.md` (§2–§4), with the
//! field names the Python worker (agentrl-worker 0.4.0) and the Go controller use. Two easy
//! mistakes are made impossible by the types: the worker's [`EnvOut`] carries `metric`
//! (singular) while the controller's [`InteractResponse`] carries `metrics`, and a
//! [`TaskIndex`] keeps its JSON type (`5` and `"5"` are different indices).
//!
//! The conversions between OpenAI chat messages and Agentry's [`ToolCall`] live here too, so
//! the worker and the client render and parse calls the same way.

use std::fmt;

use agentry_env::{Status, ToolCall, ToolSchema};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The HTTP header carrying a session id between client and controller (an underscore, not a
/// dash; header names are matched case-insensitively).
pub const SESSION_HEADER: &str = "session_id";

/// An instance index: an integer or a string, and the JSON type matters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TaskIndex {
    /// An integer index (`-1` means a custom task).
    Int(i64),
    /// A string index.
    Str(String),
}

impl TaskIndex {
    /// Whether this is `-1` (or `"-1"`), the index of a custom task.
    pub fn is_custom(&self) -> bool {
        match self {
            TaskIndex::Int(i) => *i == -1,
            TaskIndex::Str(s) => s == "-1",
        }
    }
}

impl fmt::Display for TaskIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskIndex::Int(i) => write!(f, "{i}"),
            TaskIndex::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<i64> for TaskIndex {
    fn from(i: i64) -> Self {
        TaskIndex::Int(i)
    }
}

/// Where a sample stands, as AgentRL spells it (with spaces).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SampleStatus {
    /// The episode goes on.
    #[serde(rename = "running")]
    Running,
    /// The task ended normally (the reward says how well).
    #[serde(rename = "completed")]
    Completed,
    /// The agent ran out of context.
    #[serde(rename = "agent context limit")]
    AgentContextLimit,
    /// The agent's output failed validation.
    #[serde(rename = "agent validation failed")]
    AgentValidationFailed,
    /// The agent's action was invalid and ended the episode.
    #[serde(rename = "agent invalid action")]
    AgentInvalidAction,
    /// The turn limit was reached.
    #[serde(rename = "task limit reached")]
    TaskLimitReached,
    /// Unknown.
    #[serde(rename = "unknown")]
    Unknown,
    /// The task failed.
    #[serde(rename = "task error")]
    TaskError,
    /// The session was cancelled.
    #[serde(rename = "cancelled")]
    Cancelled,
}

impl SampleStatus {
    /// Whether the episode has ended (AgentRL's `finish`).
    pub fn is_finished(self) -> bool {
        self != SampleStatus::Running
    }

    /// The wire status of an Agentry step. [`Status::InvalidAction`] does not end an episode,
    /// so it is `running`.
    pub fn from_status(status: Status) -> SampleStatus {
        match status {
            Status::Running | Status::InvalidAction => SampleStatus::Running,
            Status::Completed => SampleStatus::Completed,
            Status::TaskLimitReached => SampleStatus::TaskLimitReached,
            Status::ValidationFailed => SampleStatus::AgentValidationFailed,
            Status::TaskError => SampleStatus::TaskError,
        }
    }

    /// The Agentry status of a wire status. Agentry has no terminal invalid-action status:
    /// `agent invalid action` and `agent validation failed` are both the agent's fault and map
    /// to [`Status::ValidationFailed`]; `agent context limit` is a limit like the turn limit;
    /// `unknown`, `task error` and `cancelled` are failures of the task, not of the agent.
    pub fn to_status(self) -> Status {
        match self {
            SampleStatus::Running => Status::Running,
            SampleStatus::Completed => Status::Completed,
            SampleStatus::AgentContextLimit | SampleStatus::TaskLimitReached => {
                Status::TaskLimitReached
            }
            SampleStatus::AgentValidationFailed | SampleStatus::AgentInvalidAction => {
                Status::ValidationFailed
            }
            SampleStatus::Unknown | SampleStatus::TaskError | SampleStatus::Cancelled => {
                Status::TaskError
            }
        }
    }
}

/// What a worker's `start_sample` and `interact` return: the messages injected since the
/// agent's previous action, and how the episode stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EnvOut {
    /// Environment → agent messages (OpenAI chat format).
    #[serde(default)]
    pub messages: Vec<Value>,
    /// The OpenAI tool list, or `null`.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Where the episode stands.
    pub status: SampleStatus,
    /// `status != running`.
    #[serde(default)]
    pub finish: bool,
    /// The reward of this step.
    #[serde(default)]
    pub reward: f64,
    /// This step's metrics (singular key on the worker side).
    #[serde(default)]
    pub metric: Map<String, Value>,
}

/// Controller → worker `start_sample`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerStartRequest {
    /// The instance.
    pub index: TaskIndex,
    /// A custom task (only with index `-1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_task: Option<Value>,
    /// The session id the controller chose.
    pub session_id: i64,
}

/// Controller → worker `interact`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerInteractRequest {
    /// The session.
    pub session_id: i64,
    /// The agent's assistant messages (a non-empty list).
    pub messages: Vec<Value>,
}

/// Worker → controller answer to `interact`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerInteractResponse {
    /// The session.
    pub session_id: i64,
    /// The environment's answer.
    pub env_out: EnvOut,
}

/// A body naming one session (`cancel`, `cancel_with_notice`, `cancel_notice`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBody {
    /// The session.
    pub session_id: i64,
}

/// A worker's `worker_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Most sessions at once.
    pub concurrency: usize,
    /// Live sessions now.
    pub current: usize,
}

/// Worker → controller heartbeat: exactly these four keys.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The task name clients ask for.
    pub name: String,
    /// The worker's API base URL (ends in `/api`).
    pub address: String,
    /// Most sessions at once.
    pub concurrency: i64,
    /// The indices the worker serves.
    pub indices: Vec<TaskIndex>,
}

/// Client → controller `start_sample`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StartRequest {
    /// The task.
    pub name: String,
    /// The instance.
    pub index: TaskIndex,
    /// A custom task (only with index `-1`).
    #[serde(default)]
    pub custom_task: Option<Value>,
}

/// Controller → client answer to `start_sample` (the session id is in the header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StartResponse {
    /// The first messages (system prompt, instruction).
    pub messages: Vec<Value>,
    /// The OpenAI tool list, or `null`.
    pub tools: Option<Vec<Value>>,
}

/// Client → controller `interact` body (the session id is in the header).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InteractRequest {
    /// The agent's assistant messages.
    pub messages: Vec<Value>,
}

/// Controller → client answer to `interact`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InteractResponse {
    /// `status != running`.
    pub finish: bool,
    /// The reward of this step.
    pub reward: f64,
    /// Where the episode stands.
    pub status: SampleStatus,
    /// Environment → agent messages of this step.
    pub messages: Vec<Value>,
    /// This step's metrics (plural key on the controller side).
    pub metrics: Map<String, Value>,
}

impl From<EnvOut> for InteractResponse {
    fn from(out: EnvOut) -> Self {
        InteractResponse {
            finish: out.status.is_finished(),
            reward: out.reward,
            status: out.status,
            messages: out.messages,
            metrics: out.metric,
        }
    }
}

/// Client → controller `mark_stale`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkStale {
    /// The task.
    pub name: String,
    /// The worker's id within the task.
    pub worker_id: u32,
    /// Stale workers get no new sessions.
    pub stale: bool,
}

/// The controller's error body, in echo's shape.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub message: String,
}

/// The text of a message's `content`: a string, or the text parts of a content list.
pub fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The assistant message of one Agentry call, in OpenAI's standard form (`type: "function"`,
/// `arguments` a JSON string), with call id `id`.
pub fn assistant_message(call: &ToolCall, id: &str) -> Value {
    json!({
        "role": "assistant",
        "content": "",
        "tool_calls": [{
            "id": id,
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": Value::Object(call.arguments.clone()).to_string(),
            },
        }],
    })
}

/// One tool call of an assistant message, parsed: its id (if any) and the call, or the error
/// observation for the agent.
#[derive(Clone, Debug, PartialEq)]
pub struct ParsedCall {
    /// The call's `id`, answered in the tool message's `tool_call_id`.
    pub id: Option<String>,
    /// The call, or why it is not one.
    pub call: Result<ToolCall, String>,
}

/// The calls of an agent turn. Each OpenAI tool call is parsed by the one parser the runtime
/// uses (`agentry_env::parse_call`, which accepts `arguments` as an object or as a JSON string);
/// a turn with no tool calls at all falls back to parsing the text content, so an agent that
/// writes calls as text (`name(arg="value")`) is served too.
pub fn parse_calls(messages: &[Value]) -> Vec<ParsedCall> {
    let mut calls = Vec::new();
    for message in messages {
        let Some(tool_calls) = message.get("tool_calls").and_then(Value::as_array) else {
            continue;
        };
        for tool_call in tool_calls {
            let id = tool_call
                .get("id")
                .and_then(|id| match id {
                    Value::String(s) => Some(s.clone()),
                    Value::Number(n) => Some(n.to_string()),
                    _ => None,
                })
                .filter(|id| !id.is_empty());
            let function = tool_call.get("function").unwrap_or(&Value::Null);
            let call = match function.get("name").and_then(Value::as_str) {
                None => Err("Error: a tool call without a function name.".to_string()),
                Some(name) => {
                    let arguments = match function.get("arguments") {
                        None | Some(Value::Null) => Value::Object(Map::new()),
                        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Map::new()),
                        Some(a) => a.clone(),
                    };
                    let text = json!({"name": name, "arguments": arguments}).to_string();
                    agentry_env::parse_call(&text)
                }
            };
            calls.push(ParsedCall { id, call });
        }
    }
    if calls.is_empty() {
        let text = messages
            .iter()
            .map(content_text)
            .collect::<Vec<_>>()
            .join("\n");
        let call = if text.trim().is_empty() {
            Err("Error: no tool call; call one of the tools.".to_string())
        } else {
            agentry_env::parse_call(text.trim())
        };
        calls.push(ParsedCall { id: None, call });
    }
    calls
}

/// An OpenAI tool list in Agentry's schema form. Parameter types Agentry has no kind for
/// (objects, arrays of non-strings) are kept as strings, so the agent still sees the tool; the
/// remote task validates its own arguments.
pub fn tools_from_json(tools: &[Value]) -> Vec<ToolSchema> {
    use agentry_env::{Param, ParamKind};
    tools
        .iter()
        .filter_map(|tool| {
            let function = tool.get("function").unwrap_or(tool);
            let name = function.get("name")?.as_str()?;
            let description = function
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let schema = function.get("parameters").unwrap_or(&Value::Null);
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let parameters = schema
                .get("properties")
                .and_then(Value::as_object)
                .map(|properties| {
                    properties
                        .iter()
                        .map(|(pname, p)| {
                            let kind = match p.get("type").and_then(Value::as_str) {
                                Some("integer") => ParamKind::Integer,
                                Some("number") => ParamKind::Number,
                                Some("boolean") => ParamKind::Boolean,
                                Some("array") => ParamKind::StringArray,
                                _ => ParamKind::String,
                            };
                            Param {
                                name: pname.clone(),
                                kind,
                                description: p
                                    .get("description")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_string(),
                                required: required.contains(&pname.as_str()),
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(ToolSchema::new(name, description, parameters))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_index_keeps_its_json_type() {
        let int: TaskIndex = serde_json::from_str("5").unwrap();
        let string: TaskIndex = serde_json::from_str("\"5\"").unwrap();
        assert_eq!(int, TaskIndex::Int(5));
        assert_eq!(string, TaskIndex::Str("5".into()));
        assert_ne!(int, string);
        assert_eq!(serde_json::to_string(&string).unwrap(), "\"5\"");
        assert!(TaskIndex::Str("-1".into()).is_custom());
    }

    #[test]
    fn sample_status_spells_spaces() {
        let s = serde_json::to_string(&SampleStatus::TaskLimitReached).unwrap();
        assert_eq!(s, "\"task limit reached\"");
        let back: SampleStatus = serde_json::from_str("\"agent invalid action\"").unwrap();
        assert_eq!(back, SampleStatus::AgentInvalidAction);
        assert!(back.to_status().is_terminal());
        assert_eq!(
            SampleStatus::from_status(Status::InvalidAction),
            SampleStatus::Running
        );
    }

    #[test]
    fn metric_becomes_metrics() {
        let out: EnvOut = serde_json::from_value(json!({
            "messages": [{"role": "tool", "content": "ok"}], "tools": null,
            "status": "completed", "finish": true, "reward": 1, "metric": {"success": true}
        }))
        .unwrap();
        let response = serde_json::to_value(InteractResponse::from(out)).unwrap();
        assert_eq!(response["metrics"], json!({"success": true}));
        assert!(response.get("metric").is_none());
        assert_eq!(response["reward"], json!(1.0));
    }

    #[test]
    fn calls_round_trip_through_openai_messages() {
        let call = ToolCall::new("count", [("variable", json!("#0"))]);
        let parsed = parse_calls(&[assistant_message(&call, "call_3")]);
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].id.as_deref(), Some("call_3"));
        assert_eq!(parsed[0].call, Ok(call));
    }

    #[test]
    fn object_arguments_and_text_calls_are_accepted() {
        let message = json!({"role": "assistant", "tool_calls": [
            {"id": 0, "function": {"name": "count", "arguments": {"variable": "#1"}}}
        ]});
        let parsed = parse_calls(&[message]);
        assert_eq!(parsed[0].id.as_deref(), Some("0"));
        assert_eq!(parsed[0].call.as_ref().unwrap().str_arg("variable"), "#1");
        let text = json!({"role": "assistant", "content": "count(variable=\"#2\")"});
        let parsed = parse_calls(&[text]);
        assert_eq!(parsed[0].id, None);
        assert_eq!(parsed[0].call.as_ref().unwrap().str_arg("variable"), "#2");
    }

    #[test]
    fn bad_calls_are_messages_for_the_agent() {
        let parsed = parse_calls(&[json!({"role": "assistant", "content": ""})]);
        assert!(parsed[0].call.as_ref().unwrap_err().starts_with("Error"));
        let message = json!({"role": "assistant", "tool_calls": [
            {"id": "a", "function": {"name": "count", "arguments": "{not json"}},
            {"id": "b", "function": {}}
        ]});
        let parsed = parse_calls(&[message]);
        assert_eq!(parsed.len(), 2);
        assert!(parsed.iter().all(|p| p.call.is_err()));
    }

    #[test]
    fn tools_survive_the_openai_form() {
        let tool = agentry_env::ToolSchema::new(
            "lookup",
            "Looks a key up.",
            vec![agentry_env::Param::required(
                "key",
                agentry_env::ParamKind::String,
                "the key",
            )],
        );
        assert_eq!(tools_from_json(&[tool.to_json()]), vec![tool]);
    }
}
