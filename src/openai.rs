//! The OpenAI chat API wired to the runtime, both ways: `agentry serve` puts the runtime's
//! serving engine ([`crate::serving::Engine`]) behind `agentry-serve`'s OpenAI server, and
//! `agentry eval --endpoint` plays the runtime's endpoint evaluation
//! ([`crate::endpoint::evaluate_endpoint`]) through `agentry-serve`'s OpenAI client. Only
//! translation lives here: the runtime knows no HTTP and `agentry-serve` no policy, as with
//! [`crate::serve::HttpRemoteTasks`].

use std::io;
use std::sync::Arc;

use agentry_runtime::endpoint::{ChatEndpoint, EndpointFailure, EndpointReply, EndpointRequest};
use agentry_runtime::env::{ToolCall, ToolSchema};
use agentry_runtime::serving::{
    ChatEvent, ChatJob, ChatMessage, Engine, Finish, Refused, TokenInfo,
};
use agentry_serve::Server;
use agentry_serve::openai::model::{ChatModel, Event, Refusal};
use agentry_serve::openai::wire::{
    ChatRequest, FinishReason, FunctionCall, Invalid, RawToolCall, Role, TokenLogprob, ToolChoice,
    TopLogprob,
};
use agentry_serve::openai::{
    EndpointConfig, EndpointError, OpenAiClient, OpenAiConfig, serve_openai,
};
use tokio::sync::mpsc;

/// A serving engine as the OpenAI server's model.
pub struct EngineModel {
    engine: Engine,
    id: String,
}

impl std::fmt::Debug for EngineModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineModel").field("id", &self.id).finish()
    }
}

impl EngineModel {
    /// `engine`, listed and echoed as `id`.
    pub fn new(engine: Engine, id: impl Into<String>) -> Self {
        EngineModel {
            engine,
            id: id.into(),
        }
    }
}

/// Serves `model` over the OpenAI API until the returned server is dropped.
///
/// # Errors
/// If the address cannot be bound.
pub fn serve(config: OpenAiConfig, model: EngineModel) -> io::Result<Server> {
    serve_openai(config, Arc::new(model))
}

impl ChatModel for EngineModel {
    fn id(&self) -> &str {
        &self.id
    }

    fn submit(&self, request: ChatRequest) -> Result<mpsc::UnboundedReceiver<Event>, Refusal> {
        let job = job(request).map_err(Refusal::Invalid)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = Box::new(move |event: ChatEvent| tx.send(event_of(event)).is_ok());
        match self.engine.submit(job, sink) {
            Ok(()) => Ok(rx),
            Err(Refused::Busy) => Err(Refusal::Busy),
            Err(Refused::Stopped) => {
                // Answered as a server failure (500): the engine thread is gone.
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(Event::Failed("the model's engine has stopped".to_string()));
                Ok(rx)
            }
            Err(Refused::Invalid {
                message,
                param,
                code,
            }) => Err(Refusal::Invalid(Invalid {
                message,
                param: param.map(str::to_string),
                code,
            })),
        }
    }
}

/// The engine's job for a checked request.
fn job(request: ChatRequest) -> Result<ChatJob, Invalid> {
    // A named function is forced by starting the reply with its call's beginning; `required`
    // can be forced so only when one tool is declared (decoding is not constrained otherwise).
    let (tools, forced_call) = match request.tool_choice {
        ToolChoice::None => (Vec::new(), None),
        ToolChoice::Auto => (request.tools, None),
        ToolChoice::Function(name) => (request.tools, Some(name)),
        ToolChoice::Required if request.tools.len() == 1 => {
            let name = request.tools[0].name.clone();
            (request.tools, Some(name))
        }
        ToolChoice::Required => {
            return Err(Invalid {
                message: "`required` with several tools needs constrained decoding, which this \
                          server does not do; name the function, or use `auto`, with which the \
                          policy calls tools as it was trained to"
                    .to_string(),
                param: Some("tool_choice".to_string()),
                code: Some("unsupported_parameter"),
            });
        }
    };
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.into_iter().enumerate() {
        messages.push(match m.role {
            Role::System => ChatMessage::System(m.content),
            Role::User => ChatMessage::User(m.content),
            Role::Tool => ChatMessage::Tool {
                call_id: m.tool_call_id.unwrap_or_default(),
                content: m.content,
            },
            Role::Assistant => {
                let mut calls = Vec::with_capacity(m.tool_calls.len());
                for (j, call) in m.tool_calls.into_iter().enumerate() {
                    let arguments = serde_json::from_str(&call.function.arguments)
                        .ok()
                        .and_then(|v: serde_json::Value| v.as_object().cloned())
                        .ok_or_else(|| Invalid {
                            message: format!(
                                "the arguments of call {j} are not a JSON object: {}",
                                call.function.arguments
                            ),
                            param: Some(format!(
                                "messages[{i}].tool_calls[{j}].function.arguments"
                            )),
                            code: None,
                        })?;
                    calls.push((
                        call.id,
                        ToolCall {
                            name: call.function.name,
                            arguments,
                        },
                    ));
                }
                ChatMessage::Assistant {
                    content: m.content,
                    calls,
                }
            }
        });
    }
    Ok(ChatJob {
        messages,
        tools,
        temperature: request.temperature,
        top_p: request.top_p,
        max_tokens: request.max_tokens,
        stop: request.stop,
        seed: request.seed,
        n: request.n,
        top_logprobs: request.logprobs,
        forced_call,
    })
}

/// The server's event for the engine's.
fn event_of(event: ChatEvent) -> Event {
    match event {
        ChatEvent::Delta {
            index,
            text,
            tokens,
        } => Event::Delta {
            index,
            text,
            logprobs: tokens.into_iter().map(token_logprob).collect(),
        },
        ChatEvent::Done {
            index,
            finish,
            calls,
        } => Event::Done {
            index,
            finish_reason: match finish {
                Finish::Stop => FinishReason::Stop,
                Finish::Length => FinishReason::Length,
                Finish::ToolCalls => FinishReason::ToolCalls,
            },
            tool_calls: calls
                .into_iter()
                .map(|(id, call)| RawToolCall {
                    id,
                    kind: "function".to_string(),
                    function: FunctionCall {
                        name: call.name,
                        arguments: serde_json::Value::Object(call.arguments).to_string(),
                    },
                })
                .collect(),
        },
        ChatEvent::Finished {
            prompt_tokens,
            completion_tokens,
        } => Event::Finished {
            prompt_tokens,
            completion_tokens,
        },
    }
}

fn token_logprob(token: TokenInfo) -> TokenLogprob {
    TokenLogprob {
        bytes: token.text.as_bytes().to_vec(),
        token: token.text,
        logprob: token.logprob,
        top_logprobs: token
            .top
            .into_iter()
            .map(|(text, logprob)| TopLogprob {
                bytes: text.as_bytes().to_vec(),
                token: text,
                logprob,
            })
            .collect(),
    }
}

/// An OpenAI-compatible endpoint as the evaluation's [`ChatEndpoint`].
pub struct OpenAiEndpoint {
    client: OpenAiClient,
    describe: String,
}

impl std::fmt::Debug for OpenAiEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiEndpoint")
            .field("endpoint", &self.describe)
            .finish()
    }
}

impl OpenAiEndpoint {
    /// A client of `config`'s endpoint, once its model list says it serves `config.model` (so
    /// a wrong URL, key or name fails here, not as hundreds of failed episodes).
    ///
    /// # Errors
    /// If the endpoint cannot be reached, refuses the key, or does not list the model.
    pub fn connect(config: EndpointConfig) -> Result<Self, String> {
        let describe = format!("{} at {}", config.model, config.base_url);
        let model = config.model.clone();
        let client = OpenAiClient::new(config);
        let models = client
            .models()
            .map_err(|e| format!("cannot list the models of {describe}: {e}"))?;
        if !models.contains(&model) {
            return Err(format!(
                "{describe}: the endpoint does not serve `{model}`; it lists {}",
                models.join(", ")
            ));
        }
        Ok(OpenAiEndpoint { client, describe })
    }
}

impl ChatEndpoint for OpenAiEndpoint {
    fn model(&self) -> String {
        self.client.config().model.clone()
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn reply(&self, request: &EndpointRequest<'_>) -> Result<EndpointReply, EndpointFailure> {
        let mut body = serde_json::json!({
            "messages": request.messages.iter().map(message_json).collect::<Vec<_>>(),
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_tokens": request.max_tokens,
            "seed": request.seed,
        });
        if !request.tools.is_empty() {
            body["tools"] = request.tools.iter().map(ToolSchema::to_json).collect();
        }
        if !request.stop.is_empty() {
            body["stop"] = serde_json::json!(request.stop);
        }
        let reply = self.client.complete(body).map_err(|e| match e {
            EndpointError::Refused { message, code, .. }
                if code.as_deref() == Some("context_length_exceeded")
                    || message.contains("maximum context length") =>
            {
                EndpointFailure::ContextFull
            }
            other => EndpointFailure::Failed(other.to_string()),
        })?;
        let mut calls = Vec::with_capacity(reply.tool_calls.len());
        for call in reply.tool_calls {
            let arguments = serde_json::from_str::<serde_json::Value>(&call.function.arguments)
                .ok()
                .and_then(|v| v.as_object().cloned());
            match arguments {
                Some(arguments) => calls.push((
                    call.id,
                    ToolCall {
                        name: call.function.name,
                        arguments,
                    },
                )),
                // A call whose arguments are not an object is no call the environment can
                // take: the reply is read as text instead, and the parser says what is wrong.
                None => {
                    return Ok(EndpointReply {
                        content: format!("{}({})", call.function.name, call.function.arguments),
                        calls: Vec::new(),
                        completion_tokens: reply.usage.map_or(0, |u| u.completion_tokens as usize),
                    });
                }
            }
        }
        Ok(EndpointReply {
            content: reply.content.unwrap_or_default(),
            calls,
            completion_tokens: reply.usage.map_or(0, |u| u.completion_tokens as usize),
        })
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::to_value(self.client.stats()).unwrap_or_default()
    }
}

/// A conversation message as the OpenAI API writes it.
fn message_json(message: &ChatMessage) -> serde_json::Value {
    use serde_json::json;
    match message {
        ChatMessage::System(text) => json!({"role": "system", "content": text}),
        ChatMessage::User(text) => json!({"role": "user", "content": text}),
        ChatMessage::Tool { call_id, content } => {
            json!({"role": "tool", "tool_call_id": call_id, "content": content})
        }
        ChatMessage::Assistant { content, calls } if calls.is_empty() => {
            json!({"role": "assistant", "content": content})
        }
        ChatMessage::Assistant { content, calls } => json!({
            "role": "assistant",
            "content": if content.is_empty() { serde_json::Value::Null } else { json!(content) },
            "tool_calls": calls.iter().map(|(id, call)| json!({
                "id": id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": serde_json::Value::Object(call.arguments.clone()).to_string(),
                },
            })).collect::<Vec<_>>(),
        }),
    }
}
