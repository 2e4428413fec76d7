//! The OpenAI chat-completions wire format: the request as clients send it, checked into a
//! [`ChatRequest`], and the bodies the server answers with (a completion, stream chunks, the
//! model list, the error object).
//!
//! Field names and shapes follow the OpenAI API reference as the official `openai` Python
//! package sends and parses them. Fields the server cannot honour are refused with a 400 rather
//! than ignored (a client asking for a frequency penalty must not get a silently different
//! distribution); fields that change nothing here (`user`, `metadata`, `store`) are accepted.

use agentry_env::ToolSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Most `stop` sequences a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// Most `top_logprobs` a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// Most completions (`n`) one request may ask for.
pub const MAX_N: u32 = 16;

/// `POST /v1/chat/completions`'s body, as sent. Unknown fields are ignored (clients add their
/// own, e.g. `extra_body`); known ones must have their documented types.
#[derive(Clone, Debug, Deserialize)]
pub struct RawRequest {
    /// The model name (checked against the served one).
    pub model: String,
    /// The conversation so far.
    pub messages: Vec<RawMessage>,
    /// Function tools the model may call.
    #[serde(default)]
    pub tools: Option<Vec<RawTool>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": …}}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Sampling temperature, 0 to 2 (0: greedy).
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus sampling mass, in (0, 1].
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Most new tokens (the older name).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Most new tokens (the newer name; wins over `max_tokens`).
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// A string or up to [`MAX_STOP`] strings that end the completion (not included).
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Seed of this request's sampling: the same seed gives the same completion.
    #[serde(default)]
    pub seed: Option<i64>,
    /// Completions to generate.
    #[serde(default)]
    pub n: Option<u32>,
    /// Whether to return each token's log-probability.
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// How many alternatives per token, with their log-probabilities (needs `logprobs`).
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    /// Whether to answer as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// `{"include_usage": bool}`: a last chunk with the usage counts.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Must be 0 when given: no repetition penalties here.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Must be 0 when given.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Must be empty when given.
    #[serde(default)]
    pub logit_bias: Option<Map<String, Value>>,
    /// Only `{"type": "text"}` is served.
    #[serde(default)]
    pub response_format: Option<Value>,
    /// Whether the model may call several tools in one turn (accepted either way: a turn's
    /// calls are all parsed).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
}

/// `stop`: one string or several.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// One message as sent.
#[derive(Clone, Debug, Deserialize)]
pub struct RawMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// A string, an array of content parts, or null (an assistant turn with tool calls).
    #[serde(default)]
    pub content: Option<Value>,
    /// An assistant's calls.
    #[serde(default)]
    pub tool_calls: Option<Vec<RawToolCall>>,
    /// A tool message's answer to this call id.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// One tool call of an assistant message, as sent back by a client.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct RawToolCall {
    /// The call's id.
    pub id: String,
    /// Always `"function"`.
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    /// The function and its arguments.
    pub function: FunctionCall,
}

fn function_type() -> String {
    "function".to_string()
}

/// A function call: its name and its arguments as a JSON text.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments, a JSON object serialized as a string.
    pub arguments: String,
}

/// One tool as declared.
#[derive(Clone, Debug, Deserialize)]
pub struct RawTool {
    /// Always `"function"`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's name, description and JSON-schema parameters.
    pub function: Value,
}

/// Who speaks a [`Message`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Instructions (`system`, or `developer`, its newer name).
    System,
    /// The user.
    User,
    /// The model.
    Assistant,
    /// A tool's answer.
    Tool,
}

/// A checked message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// Who speaks.
    pub role: Role,
    /// Its text (content parts joined).
    pub content: String,
    /// An assistant's calls.
    pub tool_calls: Vec<RawToolCall>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
}

/// Which tools the model may call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Text or calls, as the model chooses (the default when tools are given).
    Auto,
    /// No calls: the tools are not shown (the default without tools).
    None,
    /// At least one call.
    Required,
    /// This function.
    Function(String),
}

/// A request, checked: what the model side needs, in its own terms.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// The requested model name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// The declared tools, in Agentry's schema form (what the prompt shows).
    pub tools: Vec<ToolSchema>,
    /// The declared tools as sent (JSON schemas), for templates that render them verbatim.
    pub tools_json: Vec<Value>,
    /// Which tools may be called.
    pub tool_choice: ToolChoice,
    /// Sampling temperature (0: greedy).
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Most new tokens; `None`: up to the context.
    pub max_tokens: Option<usize>,
    /// Stop sequences.
    pub stop: Vec<String>,
    /// Sampling seed; `None`: drawn by the server.
    pub seed: Option<u64>,
    /// Completions to generate.
    pub n: usize,
    /// Alternatives per token with log-probabilities; `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// Whether to stream.
    pub stream: bool,
    /// Whether a stream ends with a usage chunk.
    pub stream_usage: bool,
}

/// Why a request is refused: a 400 with OpenAI's error object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// What is wrong, for a person.
    pub message: String,
    /// The offending parameter, when one is.
    pub param: Option<String>,
    /// A machine-readable code, when one applies.
    pub code: Option<&'static str>,
}

impl Invalid {
    fn param(param: &str, message: impl Into<String>) -> Self {
        Invalid {
            message: message.into(),
            param: Some(param.to_string()),
            code: None,
        }
    }

    fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Invalid {
            code: Some("unsupported_parameter"),
            ..Invalid::param(param, message)
        }
    }
}

impl RawRequest {
    /// The request checked: every range and combination OpenAI documents, and everything this
    /// server cannot honour, refused with the parameter named.
    pub fn check(self) -> Result<ChatRequest, Invalid> {
        if self.messages.is_empty() {
            return Err(Invalid::param("messages", "`messages` is empty"));
        }
        let messages = self
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, m)| m.check(i))
            .collect::<Result<Vec<_>, _>>()?;
        let temperature = match self.temperature {
            None => 1.0,
            Some(t) if (0.0..=2.0).contains(&t) => t as f32,
            Some(t) => {
                return Err(Invalid::param(
                    "temperature",
                    format!("`temperature` is {t}; it must be between 0 and 2"),
                ));
            }
        };
        let top_p = match self.top_p {
            None => 1.0,
            Some(p) if p > 0.0 && p <= 1.0 => p as f32,
            Some(p) => {
                return Err(Invalid::param(
                    "top_p",
                    format!("`top_p` is {p}; it must be above 0 and at most 1"),
                ));
            }
        };
        let max_tokens = match (self.max_completion_tokens, self.max_tokens) {
            (Some(0), _) => {
                return Err(Invalid::param(
                    "max_completion_tokens",
                    "must be at least 1",
                ));
            }
            (None, Some(0)) => return Err(Invalid::param("max_tokens", "must be at least 1")),
            (Some(m), _) | (None, Some(m)) => Some(m as usize),
            (None, None) => None,
        };
        let stop = match self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(s)) => s,
        };
        if stop.len() > MAX_STOP {
            return Err(Invalid::param(
                "stop",
                format!("{} stop sequences; at most {MAX_STOP}", stop.len()),
            ));
        }
        if stop.iter().any(String::is_empty) {
            return Err(Invalid::param("stop", "a stop sequence is empty"));
        }
        let n = match self.n {
            None => 1,
            Some(n) if (1..=MAX_N).contains(&n) => n as usize,
            Some(n) => {
                return Err(Invalid::param(
                    "n",
                    format!("`n` is {n}; it must be between 1 and {MAX_N}"),
                ));
            }
        };
        let logprobs = match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(k)) if k > MAX_TOP_LOGPROBS => {
                return Err(Invalid::param(
                    "top_logprobs",
                    format!("`top_logprobs` is {k}; at most {MAX_TOP_LOGPROBS}"),
                ));
            }
            (false, Some(k)) if k > 0 => {
                return Err(Invalid::param(
                    "top_logprobs",
                    "`top_logprobs` needs `logprobs` set to true",
                ));
            }
            (true, k) => Some(k.unwrap_or(0) as usize),
            (false, _) => None,
        };
        for (name, value) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            if value.is_some_and(|v| v != 0.0) {
                return Err(Invalid::unsupported(
                    name,
                    format!("`{name}` is not supported by this server (only 0)"),
                ));
            }
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(Invalid::unsupported(
                "logit_bias",
                "`logit_bias` is not supported by this server",
            ));
        }
        if let Some(format) = &self.response_format
            && format.get("type").and_then(Value::as_str) != Some("text")
        {
            return Err(Invalid::unsupported(
                "response_format",
                "only `{\"type\": \"text\"}` is supported by this server",
            ));
        }
        let raw_tools = self.tools.unwrap_or_default();
        let mut tools_json = Vec::with_capacity(raw_tools.len());
        for (i, tool) in raw_tools.into_iter().enumerate() {
            if tool.kind != "function" {
                return Err(Invalid::param(
                    &format!("tools[{i}].type"),
                    format!(
                        "tool type `{}`; only `function` tools are served",
                        tool.kind
                    ),
                ));
            }
            match tool.function.get("name").and_then(Value::as_str) {
                Some(name) if !name.is_empty() => {}
                _ => {
                    return Err(Invalid::param(
                        &format!("tools[{i}].function.name"),
                        "a tool's function has no name",
                    ));
                }
            }
            tools_json.push(serde_json::json!({"type": "function", "function": tool.function}));
        }
        let tools = crate::protocol::tools_from_json(&tools_json);
        let tool_choice = tool_choice(self.tool_choice.as_ref(), &tools)?;
        Ok(ChatRequest {
            model: self.model,
            messages,
            tools,
            tools_json,
            tool_choice,
            temperature,
            top_p,
            max_tokens,
            stop,
            seed: self.seed.map(|s| s as u64),
            n,
            logprobs,
            stream: self.stream.unwrap_or(false),
            stream_usage: self.stream_options.unwrap_or_default().include_usage,
        })
    }
}

/// `tool_choice` checked against the declared tools.
fn tool_choice(choice: Option<&Value>, tools: &[ToolSchema]) -> Result<ToolChoice, Invalid> {
    let invalid = |message: String| Invalid::param("tool_choice", message);
    let choice = match choice {
        None | Some(Value::Null) if tools.is_empty() => ToolChoice::None,
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(format!(
                    "`tool_choice` `{other}`; expected `none`, `auto`, `required` or a function"
                )));
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("`tool_choice` names no function".to_string()))?;
            ToolChoice::Function(name.to_string())
        }
        Some(other) => return Err(invalid(format!("`tool_choice` is {other}"))),
    };
    match &choice {
        ToolChoice::Required | ToolChoice::Function(_) if tools.is_empty() => Err(invalid(
            "`tool_choice` asks for a call but no `tools` are declared".to_string(),
        )),
        ToolChoice::Function(name) if !tools.iter().any(|t| &t.name == name) => Err(invalid(
            format!("`tool_choice` names `{name}`, which is not among the declared tools"),
        )),
        _ => Ok(choice),
    }
}

impl RawMessage {
    fn check(self, i: usize) -> Result<Message, Invalid> {
        let param = |field: &str| format!("messages[{i}].{field}");
        let role = match self.role.as_str() {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            other => {
                return Err(Invalid::param(
                    &param("role"),
                    format!("role `{other}`; expected system, developer, user, assistant or tool"),
                ));
            }
        };
        let content = match self.content {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s,
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for (j, part) in parts.iter().enumerate() {
                    match (part.get("type").and_then(Value::as_str), part.get("text")) {
                        (Some("text"), Some(Value::String(s))) => text.push_str(s),
                        (kind, _) => {
                            return Err(Invalid::param(
                                &param(&format!("content[{j}]")),
                                format!(
                                    "content part of type {}; only text parts are served",
                                    kind.unwrap_or("(none)")
                                ),
                            ));
                        }
                    }
                }
                text
            }
            Some(other) => {
                return Err(Invalid::param(
                    &param("content"),
                    format!("content is {other}; expected a string or an array of parts"),
                ));
            }
        };
        let tool_calls = self.tool_calls.unwrap_or_default();
        if !tool_calls.is_empty() && role != Role::Assistant {
            return Err(Invalid::param(
                &param("tool_calls"),
                "only assistant messages carry `tool_calls`",
            ));
        }
        if role == Role::Tool && self.tool_call_id.is_none() {
            return Err(Invalid::param(
                &param("tool_call_id"),
                "a tool message needs the `tool_call_id` it answers",
            ));
        }
        Ok(Message {
            role,
            content,
            tool_calls,
            tool_call_id: self.tool_call_id,
        })
    }
}

/// Why a choice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model ended its turn, or a stop sequence was met.
    Stop,
    /// `max_tokens`, or the context, ran out.
    Length,
    /// The model called tools.
    ToolCalls,
}

/// `usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens of the rendered prompt.
    pub prompt_tokens: usize,
    /// New tokens over all choices.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

/// An alternative token and its log-probability.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
}

/// One generated token with its log-probability and alternatives.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability under the sampled distribution.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely alternatives, most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// A choice's `logprobs`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Logprobs {
    /// Per generated token.
    pub content: Vec<TokenLogprob>,
}

/// The assistant message of a completion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text (`null` when the turn is only calls).
    pub content: Option<String>,
    /// The calls, when any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<RawToolCall>,
}

/// One choice of a completion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// Its index among the `n`.
    pub index: usize,
    /// The reply.
    pub message: AssistantMessage,
    /// Log-probabilities when asked, else `null`.
    pub logprobs: Option<Logprobs>,
    /// Why it ended.
    pub finish_reason: FinishReason,
}

/// A completion: the answer to a request without `stream`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Completion {
    /// `chatcmpl-…`.
    pub id: String,
    /// Always `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices.
    pub choices: Vec<Choice>,
    /// Token counts.
    pub usage: Usage,
}

/// One server-sent event of a streamed completion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Chunk {
    /// The completion's id, the same in every chunk.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds, the same in every chunk.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The choices this chunk advances (none in the closing usage chunk).
    pub choices: Vec<ChunkChoice>,
    /// Token counts: only in the closing chunk of a stream asked to include them, `null`
    /// before it.
    pub usage: Option<Usage>,
}

/// What one chunk adds to one choice.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChunkChoice {
    /// The choice's index.
    pub index: usize,
    /// The new part of the message.
    pub delta: Delta,
    /// The new tokens' log-probabilities, when asked.
    pub logprobs: Option<Logprobs>,
    /// Set in the choice's last chunk.
    pub finish_reason: Option<FinishReason>,
}

/// A part of an assistant message.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Delta {
    /// `assistant`, in a choice's first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Calls, each whole in one chunk (a call is only known once its text is parsed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<DeltaToolCall>,
}

/// A tool call in a chunk: its position among the turn's calls and the call.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeltaToolCall {
    /// Its index among the turn's calls.
    pub index: usize,
    /// The call's id.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// `GET /v1/models`'s body.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served models (one).
    pub data: Vec<ModelCard>,
}

/// One served model.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelCard {
    /// The name requests give as `model`.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix seconds the server started.
    pub created: u64,
    /// Always `agentry`.
    pub owned_by: &'static str,
}

impl ModelList {
    /// The list of one model.
    pub fn one(id: &str, created: u64) -> Self {
        ModelList {
            object: "list",
            data: vec![ModelCard {
                id: id.to_string(),
                object: "model",
                created,
                owned_by: "agentry",
            }],
        }
    }
}

/// OpenAI's error body: `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorObject,
}

/// The error object.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorObject {
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `rate_limit_error`, `server_error`…
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The offending parameter.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
}

impl From<Invalid> for ErrorBody {
    fn from(invalid: Invalid) -> Self {
        ErrorBody {
            error: ErrorObject {
                message: invalid.message,
                kind: "invalid_request_error",
                param: invalid.param,
                code: invalid.code,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(body: Value) -> Result<ChatRequest, Invalid> {
        serde_json::from_value::<RawRequest>(body)
            .expect("parses")
            .check()
    }

    fn request(extra: Value) -> Value {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    }

    #[test]
    fn defaults_are_openais() {
        let r = check(request(json!({}))).unwrap();
        assert_eq!((r.temperature, r.top_p, r.n), (1.0, 1.0, 1));
        assert_eq!(r.max_tokens, None);
        assert_eq!(r.tool_choice, ToolChoice::None);
        assert_eq!(r.logprobs, None);
        assert!(!r.stream);
        assert_eq!(r.messages[0].role, Role::User);
    }

    #[test]
    fn the_newer_max_tokens_wins() {
        let r = check(request(
            json!({"max_tokens": 5, "max_completion_tokens": 7}),
        ))
        .unwrap();
        assert_eq!(r.max_tokens, Some(7));
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        for (extra, param) in [
            (json!({"temperature": 2.5}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"n": 0}), "n"),
            (json!({"max_tokens": 0}), "max_tokens"),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"top_logprobs": 3}), "top_logprobs"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (json!({"frequency_penalty": 0.5}), "frequency_penalty"),
            (json!({"logit_bias": {"1": 5}}), "logit_bias"),
            (
                json!({"response_format": {"type": "json_object"}}),
                "response_format",
            ),
            (json!({"tool_choice": "required"}), "tool_choice"),
        ] {
            let err = check(request(extra.clone())).expect_err(&extra.to_string());
            assert_eq!(err.param.as_deref(), Some(param), "{extra}: {err:?}");
        }
    }

    #[test]
    fn tool_choice_must_name_a_declared_tool() {
        let tools = json!([{"type": "function", "function": {"name": "ls", "parameters":
            {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]);
        let r = check(request(json!({"tools": tools}))).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Auto);
        assert_eq!(r.tools[0].name, "ls");
        let named = json!({"type": "function", "function": {"name": "ls"}});
        let r = check(request(json!({"tools": tools, "tool_choice": named}))).unwrap();
        assert_eq!(r.tool_choice, ToolChoice::Function("ls".into()));
        let other = json!({"type": "function", "function": {"name": "rm"}});
        let err = check(request(json!({"tools": tools, "tool_choice": other}))).unwrap_err();
        assert!(err.message.contains("`rm`"), "{}", err.message);
    }

    #[test]
    fn messages_are_checked_one_by_one() {
        let bad_role = json!({"messages": [{"role": "robot", "content": "x"}]});
        let err = check(request(bad_role)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].role"));
        let orphan = json!({"messages": [{"role": "tool", "content": "x"}]});
        let err = check(request(orphan)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].tool_call_id"));
        let image = json!({"messages": [{"role": "user", "content":
            [{"type": "image_url", "image_url": {"url": "x"}}]}]});
        let err = check(request(image)).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages[0].content[0]"));
        let parts = json!({"messages": [{"role": "developer", "content":
            [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]});
        let r = check(request(parts)).unwrap();
        assert_eq!(
            (r.messages[0].role, r.messages[0].content.as_str()),
            (Role::System, "ab")
        );
    }

    #[test]
    fn a_wrong_type_is_a_parse_error_not_a_default() {
        let body = request(json!({"temperature": "hot"}));
        assert!(serde_json::from_value::<RawRequest>(body).is_err());
    }

    #[test]
    fn chunks_leave_out_what_they_do_not_carry() {
        let chunk = Chunk {
            id: "chatcmpl-1".into(),
            object: "chat.completion.chunk",
            created: 7,
            model: "m".into(),
            choices: vec![ChunkChoice {
                index: 0,
                delta: Delta {
                    content: Some("hi".into()),
                    ..Delta::default()
                },
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        };
        assert_eq!(
            serde_json::to_value(chunk).unwrap(),
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 7,
                "model": "m", "choices": [{"index": 0, "delta": {"content": "hi"},
                "logprobs": null, "finish_reason": null}], "usage": null})
        );
        let done = serde_json::to_value(FinishReason::ToolCalls).unwrap();
        assert_eq!(done, json!("tool_calls"));
        let list = serde_json::to_value(ModelList::one("m", 7)).unwrap();
        assert_eq!(list["data"][0]["object"], json!("model"));
    }

    #[test]
    fn errors_serialize_as_openai_does() {
        let body = ErrorBody::from(Invalid::param("n", "bad"));
        assert_eq!(
            serde_json::to_value(body).unwrap(),
            json!({"error": {"message": "bad", "type": "invalid_request_error", "param": "n",
                "code": null}})
        );
    }
}
