//! `agentry serve`: the runtime's serving engine ([`crate::serving::Engine`]) behind
//! `agentry-serve`'s OpenAI server. Only translation lives here: the engine knows no HTTP and
//! the server no policy, as with [`crate::serve::HttpRemoteTasks`] the other way round.

use std::io;
use std::sync::Arc;

use agentry_runtime::env::ToolCall;
use agentry_runtime::serving::{
    ChatEvent, ChatJob, ChatMessage, Engine, Finish, Refused, TokenInfo,
};
use agentry_serve::Server;
use agentry_serve::openai::model::{ChatModel, Event, Refusal};
use agentry_serve::openai::wire::{
    ChatRequest, FinishReason, FunctionCall, Invalid, RawToolCall, Role, ToolChoice,
    TokenLogprob, TopLogprob,
};
use agentry_serve::openai::{OpenAiConfig, serve_openai};
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
    let unsupported = |message: &str| Invalid {
        message: message.to_string(),
        param: Some("tool_choice".to_string()),
        code: Some("unsupported_parameter"),
    };
    let tools = match request.tool_choice {
        ToolChoice::None => Vec::new(),
        ToolChoice::Auto => request.tools,
        ToolChoice::Required | ToolChoice::Function(_) => {
            return Err(unsupported(
                "this server cannot force a tool call (it does not constrain decoding); use \
                 `auto`, with which the policy calls tools as it was trained to",
            ));
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
                            param: Some(format!("messages[{i}].tool_calls[{j}].function.arguments")),
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
