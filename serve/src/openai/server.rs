//! The OpenAI-compatible HTTP server: `POST /v1/chat/completions` over any [`ChatModel`], so
//! the official clients (the `openai` Python package, vLLM's benchmarks, `agentry eval
//! --endpoint`) talk to an Agentry policy as they would to OpenAI or vLLM.
//!
//! Routes:
//!
//! - `POST /v1/chat/completions`: a [`Completion`], or with `stream` server-sent events of
//!   [`Chunk`]s ending with `data: [DONE]`;
//! - `GET /v1/models` and `GET /v1/models/{id}`: the one served model;
//! - `GET /health`: 200 with an empty body, never behind the token (for load balancers and
//!   readiness probes).
//!
//! Every error, including unknown routes (404), wrong methods (405), bodies that are not JSON
//! or have a field of the wrong type (400), oversized bodies (413) and a missing or wrong
//! bearer token (401), is answered with OpenAI's error object (`{"error": {"message", "type",
//! "param", "code"}}`), never a plain-text rejection, because clients parse it to raise their
//! typed exceptions. Statuses follow OpenAI and vLLM: a `model` other than the served one is
//! 404 `model_not_found`; a full queue ([`Refusal::Busy`]) is 429 `rate_limit_error` with
//! `Retry-After: 1`, which the `openai` client honours when it retries; a model failure is 500
//! `server_error`.
//!
//! The body is read as JSON whatever its `Content-Type` says: every OpenAI client sends
//! `application/json`, and a `curl -d` (which sends a form type) should work too.
//!
//! # What the model side must honour
//!
//! The server checks the [`Event`] contract and answers a breach with a 500 (or an error event
//! in a stream), so a model bug shows instead of producing a silently wrong completion: every
//! `Delta` and `Done` names a choice in `0..n` that has not ended, every choice ends with
//! exactly one `Done` before `Finished`, and the channel ends with `Finished` or `Failed`.
//! A choice's `content` is `null` exactly when it made tool calls and its text is empty (the
//! OpenAI convention); text beside calls is kept. A `Delta` may have empty text: in a stream
//! it sends a chunk only when it carries log-probabilities that were asked for.
//!
//! # Cancellation
//!
//! The event receiver lives in the response: the handler's future for a completion, the
//! body's stream for a stream. A client that disconnects makes the server drop it, which
//! [`ChatModel::submit`] documents as cancelling the request.

use std::collections::hash_map::RandomState;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use super::model::{ChatModel, Event, Refusal};
use super::wire::{
    AssistantMessage, Choice, Chunk, ChunkChoice, Completion, Delta, DeltaToolCall, ErrorBody,
    ErrorObject, FinishReason, Logprobs, ModelList, RawRequest, RawToolCall, TokenLogprob, Usage,
};
use crate::auth::{self, Token};
use crate::server::Server;

/// The default [`OpenAiConfig::max_body_bytes`]: 4 MiB, room for a long agent transcript with
/// its tool schemas.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Where and how the OpenAI server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// Where to listen; port 0 picks a free port.
    pub bind: SocketAddr,
    /// Threads of the HTTP runtime (generation runs on the model's own threads).
    pub http_threads: usize,
    /// When set, every `/v1` request without `Authorization: Bearer <token>` is refused (401)
    /// before its body is read; `/health` stays open.
    pub token: Option<Token>,
    /// Largest request body accepted; a larger one is answered 413.
    pub max_body_bytes: usize,
    /// Unix seconds the model list reports as the model's `created`.
    pub created: u64,
}

impl OpenAiConfig {
    /// Listening on `bind`, without a token, with [`DEFAULT_MAX_BODY_BYTES`], created now.
    pub fn new(bind: SocketAddr) -> OpenAiConfig {
        OpenAiConfig {
            bind,
            http_threads: std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(4),
            token: None,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            created: unix_now(),
        }
    }
}

/// Starts serving `model` over the OpenAI API in the background; it serves until the returned
/// [`Server`] is dropped. Clients take [`base_url`] as their base URL.
///
/// # Errors
/// If the runtime cannot start or the address cannot be bound (e.g. the port is in use).
pub fn serve_openai(config: OpenAiConfig, model: Arc<dyn ChatModel>) -> io::Result<Server> {
    let app = Arc::new(App {
        model,
        created: config.created,
        max_body_bytes: config.max_body_bytes,
        ids: Ids::new(),
    });
    Server::start(config.bind, config.http_threads, move |_| {
        (
            router(app, config.token.as_ref()),
            Vec::<std::future::Ready<()>>::new(),
        )
    })
}

/// The base URL OpenAI clients are given for `server`: `http://127.0.0.1:PORT/v1`.
pub fn base_url(server: &Server) -> String {
    format!("{}/v1", server.origin())
}

/// What every handler shares.
struct App {
    model: Arc<dyn ChatModel>,
    created: u64,
    max_body_bytes: usize,
    ids: Ids,
}

fn router(app: Arc<App>, token: Option<&Token>) -> Router {
    let max_body_bytes = app.max_body_bytes;
    let v1 = Router::new()
        .route(
            "/v1/chat/completions",
            post(chat_completions).layer(DefaultBodyLimit::max(max_body_bytes)),
        )
        .route("/v1/models", get(models))
        // Served model names often hold a slash (`Qwen/Qwen3-8B`), hence the wildcard.
        .route("/v1/models/{*id}", get(model_card))
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app);
    let v1 = auth::protect(v1, token, |reason| {
        json!({"error": {"message": reason, "type": "authentication_error", "param": null,
            "code": "invalid_api_key"}})
    });
    Router::new()
        .route("/health", get(health))
        .method_not_allowed_fallback(method_not_allowed)
        .merge(v1)
        .fallback(not_found)
}

// ------------------------------------------------------------------------------------------
// Errors

/// An OpenAI error object with `status`.
fn error(
    status: StatusCode,
    kind: &'static str,
    message: impl Into<String>,
    param: Option<&str>,
    code: Option<&'static str>,
) -> Response {
    let body = ErrorBody {
        error: ErrorObject {
            message: message.into(),
            kind,
            param: param.map(str::to_string),
            code,
        },
    };
    (status, axum::Json(body)).into_response()
}

fn invalid_request(status: StatusCode, message: impl Into<String>) -> Response {
    error(status, "invalid_request_error", message, None, None)
}

fn server_error(message: impl Into<String>) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        message,
        None,
        None,
    )
}

fn model_not_found(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("The model `{name}` does not exist."),
        Some("model"),
        Some("model_not_found"),
    )
}

async fn not_found(method: Method, uri: Uri) -> Response {
    invalid_request(
        StatusCode::NOT_FOUND,
        format!("Unknown request URL: {method} {}", uri.path()),
    )
}

async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    invalid_request(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("Method {method} is not allowed for {}", uri.path()),
    )
}

// ------------------------------------------------------------------------------------------
// Handlers

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(ModelList::one(app.model.id(), app.created)).into_response()
}

async fn model_card(
    State(app): State<Arc<App>>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    match id {
        Ok(Path(id)) if id == app.model.id() => {
            let mut list = ModelList::one(&id, app.created);
            axum::Json(list.data.remove(0)).into_response()
        }
        Ok(Path(id)) => model_not_found(&id),
        Err(rejection) => invalid_request(StatusCode::NOT_FOUND, rejection.body_text()),
    }
}

async fn chat_completions(
    State(app): State<Arc<App>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return invalid_request(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "The request body is larger than this server's limit of {} bytes.",
                    app.max_body_bytes
                ),
            );
        }
        Err(rejection) => return invalid_request(rejection.status(), rejection.body_text()),
    };
    let raw: RawRequest = match serde_json::from_slice(&body) {
        Ok(raw) => raw,
        Err(e) => {
            return invalid_request(
                StatusCode::BAD_REQUEST,
                format!("The request body is not a valid chat completion request: {e}"),
            );
        }
    };
    if raw.model != app.model.id() {
        return model_not_found(&raw.model);
    }
    let request = match raw.check() {
        Ok(request) => request,
        Err(invalid) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(ErrorBody::from(invalid)),
            )
                .into_response();
        }
    };
    let shape = Shape {
        n: request.n,
        logprobs: request.logprobs.is_some(),
        stream: request.stream,
        usage: request.stream_usage,
    };
    let events = match app.model.submit(request) {
        Ok(events) => events,
        Err(Refusal::Busy) => {
            let mut response = error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "The server is busy; retry shortly.",
                None,
                None,
            );
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
        Err(Refusal::Invalid(invalid)) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(ErrorBody::from(invalid)),
            )
                .into_response();
        }
    };
    let head = Head {
        id: app.ids.next(),
        created: unix_now(),
        model: app.model.id().to_string(),
    };
    if shape.stream {
        stream(head, shape, events)
    } else {
        complete(head, shape, events).await
    }
}

/// What a checked request asked for that shapes the answer.
#[derive(Clone, Copy)]
struct Shape {
    n: usize,
    logprobs: bool,
    stream: bool,
    usage: bool,
}

/// What every chunk of a completion repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
}

// ------------------------------------------------------------------------------------------
// The event contract

/// Which choices have ended, to hold the model to the [`Event`] contract.
struct Tracker {
    ended: Vec<bool>,
}

impl Tracker {
    fn new(n: usize) -> Tracker {
        Tracker {
            ended: vec![false; n],
        }
    }

    /// `Ok` when `event` may come now; else what the model did wrong.
    fn accept(&mut self, event: &Event) -> Result<(), String> {
        match event {
            Event::Delta { index, .. } => self.open(*index),
            Event::Done { index, .. } => {
                self.open(*index)?;
                self.ended[*index] = true;
                Ok(())
            }
            Event::Finished { .. } => match self.ended.iter().position(|ended| !ended) {
                Some(i) => Err(format!("the model finished without ending choice {i}")),
                None => Ok(()),
            },
            Event::Failed(_) => Ok(()),
        }
    }

    fn open(&self, index: usize) -> Result<(), String> {
        match self.ended.get(index) {
            None => Err(format!(
                "the model reported choice {index} of a request for {}",
                self.ended.len()
            )),
            Some(true) => Err(format!(
                "the model continued choice {index} after ending it"
            )),
            Some(false) => Ok(()),
        }
    }
}

const UNFINISHED: &str = "the model stopped without finishing the request";

// ------------------------------------------------------------------------------------------
// Without `stream`

/// A choice as its events arrive.
#[derive(Default)]
struct Partial {
    text: String,
    logprobs: Vec<TokenLogprob>,
    end: Option<(FinishReason, Vec<RawToolCall>)>,
}

/// The completion once every event is in (the receiver is dropped with this future, so a
/// client that disconnects cancels the request).
async fn complete(
    head: Head,
    shape: Shape,
    mut events: mpsc::UnboundedReceiver<Event>,
) -> Response {
    let mut tracker = Tracker::new(shape.n);
    let mut partials: Vec<Partial> = (0..shape.n).map(|_| Partial::default()).collect();
    while let Some(event) = events.recv().await {
        if let Err(breach) = tracker.accept(&event) {
            return server_error(breach);
        }
        match event {
            Event::Delta {
                index,
                text,
                logprobs,
            } => {
                partials[index].text.push_str(&text);
                partials[index].logprobs.extend(logprobs);
            }
            Event::Done {
                index,
                finish_reason,
                tool_calls,
            } => partials[index].end = Some((finish_reason, tool_calls)),
            Event::Finished {
                prompt_tokens,
                completion_tokens,
            } => {
                let choices = partials
                    .into_iter()
                    .enumerate()
                    .map(|(index, partial)| choice(index, partial, shape.logprobs))
                    .collect();
                let completion = Completion {
                    id: head.id,
                    object: "chat.completion",
                    created: head.created,
                    model: head.model,
                    choices,
                    usage: usage(prompt_tokens, completion_tokens),
                };
                return axum::Json(completion).into_response();
            }
            Event::Failed(message) => return server_error(message),
        }
    }
    server_error(UNFINISHED)
}

/// A finished choice (the tracker saw its `Done`).
fn choice(index: usize, partial: Partial, logprobs: bool) -> Choice {
    let (finish_reason, tool_calls) = partial.end.unwrap_or((FinishReason::Stop, Vec::new()));
    let content = if partial.text.is_empty() && !tool_calls.is_empty() {
        None
    } else {
        Some(partial.text)
    };
    Choice {
        index,
        message: AssistantMessage {
            role: "assistant",
            content,
            tool_calls,
        },
        logprobs: logprobs.then_some(Logprobs {
            content: partial.logprobs,
        }),
        finish_reason,
    }
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Usage {
    Usage {
        prompt_tokens,
        completion_tokens,
        total_tokens: prompt_tokens + completion_tokens,
    }
}

// ------------------------------------------------------------------------------------------
// With `stream`

/// A `text/event-stream` response whose body owns `events`: when the client disconnects,
/// the server drops the body, and with it the receiver.
fn stream(head: Head, shape: Shape, events: mpsc::UnboundedReceiver<Event>) -> Response {
    let chunks = Chunks {
        head,
        shape,
        tracker: Tracker::new(shape.n),
        events: Some(events),
        started: false,
    };
    let body = Body::from_stream(futures_util::stream::unfold(
        chunks,
        |mut chunks| async move {
            let bytes = chunks.next().await?;
            Some((Ok::<_, Infallible>(bytes), chunks))
        },
    ));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The server-sent events of one streamed completion.
struct Chunks {
    head: Head,
    shape: Shape,
    tracker: Tracker,
    /// `None` once the stream has ended (dropping the receiver cancels what is left).
    events: Option<mpsc::UnboundedReceiver<Event>>,
    started: bool,
}

impl Chunks {
    /// The next piece of the body: one or more whole events; `None` after `[DONE]`.
    async fn next(&mut self) -> Option<Bytes> {
        if !self.started {
            self.started = true;
            let mut out = String::new();
            for index in 0..self.shape.n {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Delta::default()
                };
                self.push(&mut out, index, delta, None, None);
            }
            return Some(Bytes::from(out));
        }
        loop {
            let event = self.events.as_mut()?.recv().await;
            let mut out = String::new();
            let ended = match event {
                Some(event) => match self.tracker.accept(&event) {
                    Ok(()) => self.translate(&mut out, event),
                    Err(breach) => {
                        push_error(&mut out, breach);
                        true
                    }
                },
                None => {
                    push_error(&mut out, UNFINISHED.to_string());
                    true
                }
            };
            if ended {
                out.push_str("data: [DONE]\n\n");
                self.events = None;
            }
            if !out.is_empty() {
                return Some(Bytes::from(out));
            }
        }
    }

    /// Writes `event`'s chunks into `out`; whether it was the last event.
    fn translate(&self, out: &mut String, event: Event) -> bool {
        match event {
            Event::Delta {
                index,
                text,
                logprobs,
            } => {
                let logprobs = if self.shape.logprobs && !logprobs.is_empty() {
                    Some(Logprobs { content: logprobs })
                } else {
                    None
                };
                if !text.is_empty() || logprobs.is_some() {
                    let delta = Delta {
                        content: (!text.is_empty()).then_some(text),
                        ..Delta::default()
                    };
                    self.push(out, index, delta, logprobs, None);
                }
                false
            }
            Event::Done {
                index,
                finish_reason,
                tool_calls,
            } => {
                if !tool_calls.is_empty() {
                    let delta = Delta {
                        tool_calls: tool_calls
                            .into_iter()
                            .enumerate()
                            .map(|(i, call)| DeltaToolCall {
                                index: i,
                                id: call.id,
                                kind: "function",
                                function: call.function,
                            })
                            .collect(),
                        ..Delta::default()
                    };
                    self.push(out, index, delta, None, None);
                }
                self.push(out, index, Delta::default(), None, Some(finish_reason));
                false
            }
            Event::Finished {
                prompt_tokens,
                completion_tokens,
            } => {
                if self.shape.usage {
                    let chunk =
                        self.chunk(Vec::new(), Some(usage(prompt_tokens, completion_tokens)));
                    push_data(out, &chunk);
                }
                true
            }
            Event::Failed(message) => {
                push_error(out, message);
                true
            }
        }
    }

    /// Writes a chunk advancing one choice.
    fn push(
        &self,
        out: &mut String,
        index: usize,
        delta: Delta,
        logprobs: Option<Logprobs>,
        finish_reason: Option<FinishReason>,
    ) {
        let choice = ChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason,
        };
        push_data(out, &self.chunk(vec![choice], None));
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: Option<Usage>) -> Chunk {
        Chunk {
            id: self.head.id.clone(),
            object: "chat.completion.chunk",
            created: self.head.created,
            model: self.head.model.clone(),
            choices,
            usage,
        }
    }
}

/// Writes one server-sent event, `data: <json>`.
fn push_data(out: &mut String, value: &impl Serialize) {
    out.push_str("data: ");
    // These bodies are structs with string keys: serializing cannot fail.
    out.push_str(&serde_json::to_string(value).expect("a chunk serializes"));
    out.push_str("\n\n");
}

/// Writes the error event a failed stream ends with (as vLLM does; `[DONE]` still follows),
/// which the `openai` client raises as an `APIError`.
fn push_error(out: &mut String, message: String) {
    let body = ErrorBody {
        error: ErrorObject {
            message,
            kind: "server_error",
            param: None,
            code: None,
        },
    };
    push_data(out, &body);
}

// ------------------------------------------------------------------------------------------
// Ids and clocks

/// Completion ids, `chatcmpl-` and at least 24 hex digits: a random prefix per server (so ids differ
/// across restarts) and a counter (so they never repeat within one).
struct Ids {
    prefix: u64,
    next: AtomicU64,
}

impl Ids {
    fn new() -> Ids {
        // `RandomState` is seeded from the OS's randomness: enough for ids, without a
        // dependency.
        let prefix = RandomState::new().build_hasher().finish();
        Ids {
            prefix,
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("chatcmpl-{:016x}{:08x}", self.prefix, n)
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests;
