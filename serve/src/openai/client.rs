//! A blocking client of any OpenAI-compatible chat-completions endpoint (vLLM, llama.cpp,
//! `agentry serve`, a hosted API): what `agentry eval --endpoint` plays episodes through.
//!
//! The client is blocking (ureq, no async runtime) because evaluation plays episodes on plain
//! threads; one [`OpenAiClient`] is shared by all of them (it is `Send + Sync`, and its clones
//! share the connection pool and the counters).
//!
//! # Failures are retried or reported, never lost
//!
//! An evaluation must not lose an episode to a transient fault, nor hide one. Each call of
//! [`OpenAiClient::complete`] makes up to `1 + retries` attempts:
//!
//! - **retried** (after a delay of `backoff`, doubled each retry, at most 30 s): connection
//!   errors, timeouts (each attempt has the whole `timeout`), 408, 429, 5xx, and malformed 200
//!   replies; a 408, 429 or 5xx that gives `Retry-After` seconds is retried after those instead
//!   (at most 30 s), as the server asked;
//! - **refused at once** ([`EndpointError::Refused`]): every other 4xx (a bad request, a wrong
//!   key or model): retrying cannot help, and the server's OpenAI error message says why;
//! - after the last attempt, [`EndpointError::Failed`] says how many attempts were made and
//!   the last cause.
//!
//! A 200 reply is **malformed** when its body is not JSON (or is not HTTP at all), has no
//! `choices`, an empty `choices`, a first choice without a `message`, a `content` that is
//! neither a string, null nor a list of text parts, or a tool call without a function name or
//! whose `function.arguments` is not a string. Arguments that are a string but not valid JSON
//! are *not* malformed: that is the model's mistake, for evaluation to score, so they pass
//! through as sent. Lenient where servers differ harmlessly: a tool call without `id` gets
//! `call_<i>`, one without `type` is a function; a `usage` or `finish_reason` of the wrong
//! shape reads as absent.
//!
//! Every attempt is counted ([`EndpointStats`]), so a run can report how healthy its endpoint
//! was: each failed attempt in exactly one of `timeouts`, `server_errors`, `rate_limited`,
//! `malformed`, `connection_errors` or `refused`.

use std::fmt;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::wire::{FunctionCall, RawToolCall};

/// The longest wait between two attempts, whatever the backoff or `Retry-After` says.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// The largest reply body read; a longer one is malformed (no completion is that long).
pub const MAX_BODY: u64 = 64 << 20;
/// How much of a body an error message quotes.
const QUOTE: usize = 200;

/// Where and how to reach an endpoint.
///
/// Its `Debug` form hides the API key.
#[derive(Clone)]
pub struct EndpointConfig {
    /// The API base, e.g. `http://host:8000/v1` (a trailing slash is fine): requests go to
    /// `{base_url}/chat/completions` and `{base_url}/models`.
    pub base_url: String,
    /// The model name every request asks for (it replaces the body's `model`).
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when set (surrounding whitespace ignored, so a
    /// key read from a file with its newline works).
    pub api_key: Option<String>,
    /// The limit of one attempt, from connecting to the last byte of the reply.
    pub timeout: Duration,
    /// Attempts after the first, for faults that may pass.
    pub retries: u32,
    /// The delay before the first retry; doubled before each next one (at most [`MAX_DELAY`]).
    pub backoff: Duration,
}

impl EndpointConfig {
    /// The default attempt timeout: a long generation on a busy server takes minutes, a hung
    /// one should not stall an evaluation forever.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
    /// The default number of retries.
    pub const DEFAULT_RETRIES: u32 = 3;
    /// The default first retry delay.
    pub const DEFAULT_BACKOFF: Duration = Duration::from_millis(500);

    /// The endpoint at `base_url` serving `model`, without a key, with the default timeout
    /// (5 minutes), retries (3) and backoff (500 ms).
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        EndpointConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Self::DEFAULT_TIMEOUT,
            retries: Self::DEFAULT_RETRIES,
            backoff: Self::DEFAULT_BACKOFF,
        }
    }
}

impl fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<hidden>"))
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("backoff", &self.backoff)
            .finish()
    }
}

/// Why a call failed, worded for a person reading a terminal.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// The endpoint refused the request with a 4xx other than 408 and 429 (or an unexpected
    /// non-error status): not retried, since the same request would be refused again.
    #[error("the endpoint refused the request (HTTP {status}): {message}{}", hint(*status))]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The OpenAI error object's `message` when the body has one, else the body's first
        /// 200 characters.
        message: String,
        /// The error object's `code` (e.g. `model_not_found`), when it is a string.
        code: Option<String>,
    },
    /// Every attempt failed with a fault that may pass (timeouts, 5xx, 429, connection
    /// errors, malformed replies).
    #[error("the endpoint failed {attempts} {}; the last time: {cause}", times(*attempts))]
    Failed {
        /// Attempts made.
        attempts: u32,
        /// The last attempt's fault, e.g. `timed out after 2 s`, `HTTP 503: …`,
        /// ``malformed reply: no `choices` ``.
        cause: String,
    },
    /// The request cannot be sent at all (a bad URL or key, a body that is not a JSON object
    /// or asks to stream); nothing was sent.
    #[error("cannot send the request: {0}")]
    Invalid(String),
}

fn hint(status: u16) -> &'static str {
    match status {
        401 | 403 => " (check the API key)",
        404 => " (check the endpoint URL, usually ending in /v1, and the model name)",
        _ => "",
    }
}

fn times(n: u32) -> &'static str {
    if n == 1 { "time" } else { "times" }
}

/// Token counts of a reply, when the server reports them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenUsage {
    /// Tokens of the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
}

/// The first choice of a completion.
#[derive(Clone, Debug, PartialEq)]
pub struct Reply {
    /// The text; `None` when the server sent `null` (a turn of only tool calls).
    pub content: Option<String>,
    /// The tool calls, arguments as sent (not checked to be JSON).
    pub tool_calls: Vec<RawToolCall>,
    /// `stop`, `length`, `tool_calls`…, when given.
    pub finish_reason: Option<String>,
    /// Token counts, when given.
    pub usage: Option<TokenUsage>,
    /// Attempts this call took (1 when the first succeeded).
    pub attempts: u32,
}

/// Counters of a client's completion calls ([`OpenAiClient::complete`]; not
/// [`OpenAiClient::models`]), over all threads.
///
/// Every attempt either succeeds or is counted in exactly one fault counter, so once no call
/// is in flight `attempts == requests - failed + timeouts + server_errors + rate_limited +
/// malformed + connection_errors + refused` (a call refused before sending,
/// [`EndpointError::Invalid`], makes no attempt).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointStats {
    /// Calls.
    pub requests: u64,
    /// Attempts, over all calls.
    pub attempts: u64,
    /// Attempts after a call's first.
    pub retries: u64,
    /// Attempts that timed out (or got 408).
    pub timeouts: u64,
    /// Attempts answered with a 5xx.
    pub server_errors: u64,
    /// Attempts answered with 429.
    pub rate_limited: u64,
    /// Attempts answered with a malformed reply.
    pub malformed: u64,
    /// Attempts that could not connect or lost the connection.
    pub connection_errors: u64,
    /// Attempts refused with another 4xx.
    pub refused: u64,
    /// Calls that returned an error.
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    attempts: AtomicU64,
    retries: AtomicU64,
    timeouts: AtomicU64,
    server_errors: AtomicU64,
    rate_limited: AtomicU64,
    malformed: AtomicU64,
    connection_errors: AtomicU64,
    refused: AtomicU64,
    failed: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// What went wrong in one attempt.
#[derive(Debug)]
enum Fault {
    Timeout(String),
    Server(String),
    RateLimited(String),
    Malformed(String),
    Connection(String),
    /// Not retried.
    Refused {
        status: u16,
        message: String,
        code: Option<String>,
    },
    /// Not sent.
    Invalid(String),
}

/// One failed attempt: the fault, and how long the server asked to wait before the next.
struct AttemptError {
    fault: Fault,
    retry_after: Option<Duration>,
}

impl From<Fault> for AttemptError {
    fn from(fault: Fault) -> Self {
        AttemptError {
            fault,
            retry_after: None,
        }
    }
}

/// A blocking client of an OpenAI-compatible endpoint. See the [module documentation](self).
#[derive(Clone)]
pub struct OpenAiClient {
    config: Arc<EndpointConfig>,
    agent: ureq::Agent,
    /// `Bearer <key>`, when a key is set.
    authorization: Option<String>,
    counters: Arc<Counters>,
}

impl fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl OpenAiClient {
    /// A client of the endpoint `config` describes. Nothing is checked or sent yet: a bad URL
    /// or key shows as [`EndpointError::Invalid`] on the first call.
    pub fn new(config: EndpointConfig) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout(config.timeout)
            .timeout_connect(config.timeout)
            .max_idle_connections_per_host(64)
            .build();
        let authorization = config
            .api_key
            .as_deref()
            .map(|key| format!("Bearer {}", key.trim()));
        OpenAiClient {
            config: Arc::new(config),
            agent,
            authorization,
            counters: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EndpointConfig {
        &self.config
    }

    /// The counters so far (exact once no call is in flight).
    pub fn stats(&self) -> EndpointStats {
        let c = &self.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EndpointStats {
            requests: load(&c.requests),
            attempts: load(&c.attempts),
            retries: load(&c.retries),
            timeouts: load(&c.timeouts),
            server_errors: load(&c.server_errors),
            rate_limited: load(&c.rate_limited),
            malformed: load(&c.malformed),
            connection_errors: load(&c.connection_errors),
            refused: load(&c.refused),
            failed: load(&c.failed),
        }
    }

    /// Asks for a completion: POSTs `body` (a chat-completions request without `stream`) to
    /// `{base_url}/chat/completions`, its `model` set to the configured one, and reads the
    /// first choice, retrying as the [module documentation](self) says.
    ///
    /// # Errors
    /// [`EndpointError::Refused`] for a 4xx other than 408 and 429, at once;
    /// [`EndpointError::Failed`] once every attempt failed; [`EndpointError::Invalid`] if the
    /// body is not a JSON object or asks to stream, or the URL or key cannot be used.
    pub fn complete(&self, body: Value) -> Result<Reply, EndpointError> {
        bump(&self.counters.requests);
        let result = self.prepare(body).and_then(|payload| {
            self.retrying(&self.counters, || {
                let response = self
                    .request("POST", "chat/completions")
                    .send_bytes(&payload);
                parse_completion(&read_reply(response, self.config.timeout)?)
            })
        });
        match result {
            Ok((mut reply, attempts)) => {
                reply.attempts = attempts;
                Ok(reply)
            }
            Err(e) => {
                bump(&self.counters.failed);
                Err(e)
            }
        }
    }

    /// The ids of the models the endpoint serves (`GET {base_url}/models`), retried as
    /// completions are but not counted in [`OpenAiClient::stats`]: for checking the model
    /// exists before an evaluation starts.
    ///
    /// # Errors
    /// As [`OpenAiClient::complete`]; a list without `data` is malformed.
    pub fn models(&self) -> Result<Vec<String>, EndpointError> {
        self.check_key()?;
        let scratch = Counters::default();
        self.retrying(&scratch, || {
            let response = self.request("GET", "models").call();
            parse_models(&read_reply(response, self.config.timeout)?)
        })
        .map(|(ids, _)| ids)
    }

    /// The request's JSON text: `body` with the configured model.
    fn prepare(&self, body: Value) -> Result<Vec<u8>, EndpointError> {
        let Value::Object(mut body) = body else {
            return Err(EndpointError::Invalid(
                "the request body is not a JSON object".into(),
            ));
        };
        if body.get("stream").and_then(Value::as_bool) == Some(true) {
            return Err(EndpointError::Invalid(
                "the request asks to stream, which this client does not read".into(),
            ));
        }
        self.check_key()?;
        body.insert("model".into(), Value::String(self.config.model.clone()));
        serde_json::to_vec(&body).map_err(|e| EndpointError::Invalid(e.to_string()))
    }

    /// A key that cannot travel in a header is refused before anything is sent.
    fn check_key(&self) -> Result<(), EndpointError> {
        match self.config.api_key.as_deref().map(str::trim) {
            Some(key) if key.is_empty() || !key.bytes().all(|b| b.is_ascii_graphic()) => {
                Err(EndpointError::Invalid(
                    "the API key is empty or has a space, a control or a non-ASCII character"
                        .into(),
                ))
            }
            _ => Ok(()),
        }
    }

    fn request(&self, method: &str, endpoint: &str) -> ureq::Request {
        let url = format!("{}/{endpoint}", self.config.base_url.trim_end_matches('/'));
        let request = self
            .agent
            .request(method, &url)
            .set("Content-Type", "application/json")
            .set("Accept", "application/json");
        match &self.authorization {
            Some(authorization) => request.set("Authorization", authorization),
            None => request,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or the retries are spent; counts
    /// into `counters`. Returns the result and the attempts made.
    fn retrying<T>(
        &self,
        counters: &Counters,
        mut attempt: impl FnMut() -> Result<T, AttemptError>,
    ) -> Result<(T, u32), EndpointError> {
        let mut made = 0;
        loop {
            let error = match attempt() {
                Ok(value) => {
                    bump(&counters.attempts);
                    return Ok((value, made + 1));
                }
                Err(error) => error,
            };
            let (counter, cause) = match error.fault {
                Fault::Invalid(message) => return Err(EndpointError::Invalid(message)),
                Fault::Refused {
                    status,
                    message,
                    code,
                } => {
                    bump(&counters.attempts);
                    bump(&counters.refused);
                    return Err(EndpointError::Refused {
                        status,
                        message,
                        code,
                    });
                }
                Fault::Timeout(cause) => (&counters.timeouts, cause),
                Fault::Server(cause) => (&counters.server_errors, cause),
                Fault::RateLimited(cause) => (&counters.rate_limited, cause),
                Fault::Malformed(cause) => (&counters.malformed, cause),
                Fault::Connection(cause) => (&counters.connection_errors, cause),
            };
            bump(&counters.attempts);
            bump(counter);
            made += 1;
            if made > self.config.retries {
                return Err(EndpointError::Failed {
                    attempts: made,
                    cause,
                });
            }
            bump(&counters.retries);
            let delay = error
                .retry_after
                .unwrap_or_else(|| backoff(self.config.backoff, made - 1));
            std::thread::sleep(delay.min(MAX_DELAY));
        }
    }
}

/// The delay before retry `retry` (0 for the first): `first` doubled `retry` times, at most
/// [`MAX_DELAY`].
fn backoff(first: Duration, retry: u32) -> Duration {
    2u32.checked_pow(retry)
        .and_then(|factor| first.checked_mul(factor))
        .unwrap_or(MAX_DELAY)
        .min(MAX_DELAY)
}

/// `Retry-After` in seconds (an integer or decimal; an HTTP date is ignored), at most
/// [`MAX_DELAY`].
fn retry_after(value: Option<&str>) -> Option<Duration> {
    let seconds: f64 = value?.trim().parse().ok()?;
    (seconds.is_finite() && seconds >= 0.0)
        .then(|| Duration::from_secs_f64(seconds.min(MAX_DELAY.as_secs_f64())))
}

/// A duration as a person writes it: `2 s`, `300 ms`, `1.5 s`.
fn human(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Whether `error` or one of its sources is an I/O timeout.
fn is_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            )
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The body of a 2xx reply, or the attempt's fault.
fn read_reply(
    response: Result<ureq::Response, ureq::Error>,
    timeout: Duration,
) -> Result<Vec<u8>, AttemptError> {
    let timed_out = || Fault::Timeout(format!("timed out after {}", human(timeout)));
    let response = match response {
        Ok(response) => response,
        Err(ureq::Error::Status(status, response)) => {
            let wait = retry_after(response.header("Retry-After"));
            let (message, code) = error_message(&read_body(response).unwrap_or_default());
            let fault = match status {
                408 => Fault::Timeout(format!("HTTP 408: {message}")),
                429 => Fault::RateLimited(format!("HTTP 429: {message}")),
                500.. => Fault::Server(format!("HTTP {status}: {message}")),
                _ => Fault::Refused {
                    status,
                    message,
                    code,
                },
            };
            return Err(AttemptError {
                fault,
                retry_after: wait,
            });
        }
        Err(ureq::Error::Transport(transport)) => {
            let fault = match transport.kind() {
                ureq::ErrorKind::InvalidUrl
                | ureq::ErrorKind::UnknownScheme
                | ureq::ErrorKind::InsecureRequestHttpsOnly
                | ureq::ErrorKind::InvalidProxyUrl => Fault::Invalid(transport.to_string()),
                _ if is_timeout(&transport) => timed_out(),
                ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader => {
                    Fault::Malformed(format!("malformed reply: not valid HTTP ({transport})"))
                }
                _ => Fault::Connection(format!("connection error: {transport}")),
            };
            return Err(fault.into());
        }
    };
    let status = response.status();
    if !(200..300).contains(&status) {
        let (message, code) = error_message(&read_body(response).unwrap_or_default());
        return Err(Fault::Refused {
            status,
            message: format!("unexpected status: {message}"),
            code,
        }
        .into());
    }
    match read_body(response) {
        Ok(body) if body.len() as u64 > MAX_BODY => Err(Fault::Malformed(format!(
            "malformed reply: the body is over {} MiB",
            MAX_BODY >> 20
        ))
        .into()),
        Ok(body) => Ok(body),
        Err(e) if is_timeout(&e) => Err(timed_out().into()),
        Err(e) => {
            Err(Fault::Connection(format!("connection lost while reading the reply: {e}")).into())
        }
    }
}

/// A body, read up to one byte past [`MAX_BODY`] (so an oversized one shows).
fn read_body(response: ureq::Response) -> std::io::Result<Vec<u8>> {
    let mut body = Vec::new();
    response
        .into_reader()
        .take(MAX_BODY + 1)
        .read_to_end(&mut body)?;
    Ok(body)
}

/// The first [`QUOTE`] characters of `text`, trimmed, marked when cut.
fn quote(text: &str) -> String {
    let text = text.trim();
    if text.is_empty() {
        return "(empty body)".into();
    }
    match text.char_indices().nth(QUOTE) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// The message and code of an error body: OpenAI's `{"error": {"message", "code"}}`, vLLM's
/// older top-level `{"message"}`, `{"error": "text"}`, FastAPI's `{"detail"}`; else a quote of
/// the body.
fn error_message(body: &[u8]) -> (String, Option<String>) {
    let text = String::from_utf8_lossy(body);
    let Ok(Value::Object(json)) = serde_json::from_slice::<Value>(body) else {
        return (quote(&text), None);
    };
    let object = match json.get("error") {
        Some(Value::Object(error)) => error,
        _ => &json,
    };
    let code = object.get("code").and_then(Value::as_str).map(String::from);
    let message = [object.get("message"), json.get("error"), json.get("detail")]
        .into_iter()
        .flatten()
        .find_map(|m| match m {
            Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Value::Array(_) => Some(m.to_string()),
            _ => None,
        });
    (message.unwrap_or_else(|| quote(&text)), code)
}

fn malformed(what: impl fmt::Display) -> AttemptError {
    Fault::Malformed(format!("malformed reply: {what}")).into()
}

/// The JSON object of a 200 body.
fn json_object(body: &[u8]) -> Result<Map<String, Value>, AttemptError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(object)) => Ok(object),
        Ok(other) => Err(malformed(format!(
            "the body is not a JSON object: {}",
            quote(&other.to_string())
        ))),
        Err(e) => Err(malformed(format!(
            "the body is not JSON ({e}): {}",
            quote(&String::from_utf8_lossy(body))
        ))),
    }
}

/// The first choice of a completion body.
fn parse_completion(body: &[u8]) -> Result<Reply, AttemptError> {
    let json = json_object(body)?;
    let choices = match json.get("choices") {
        Some(Value::Array(choices)) => choices,
        Some(_) => return Err(malformed("`choices` is not a list")),
        None => {
            let (message, _) = error_message(body);
            return Err(match json.get("error") {
                Some(_) => malformed(format!("no `choices`, but an error: {message}")),
                None => malformed("no `choices`"),
            });
        }
    };
    let Some(choice) = choices.first() else {
        return Err(malformed("`choices` is empty"));
    };
    let Some(Value::Object(message)) = choice.get("message") else {
        return Err(malformed("`choices[0]` has no `message`"));
    };
    let content = match message.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => Some(text_parts(parts)?),
        Some(_) => return Err(malformed("`choices[0].message.content` is not a string")),
    };
    let tool_calls = match message.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(i, call)| tool_call(i, call))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(malformed("`choices[0].message.tool_calls` is not a list")),
    };
    Ok(Reply {
        content,
        tool_calls,
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(String::from),
        usage: json
            .get("usage")
            .and_then(|u| TokenUsage::deserialize(u).ok()),
        attempts: 0,
    })
}

/// Content given as a list of parts: their texts joined.
fn text_parts(parts: &[Value]) -> Result<String, AttemptError> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            part.get("text").and_then(Value::as_str).ok_or_else(|| {
                malformed(format!(
                    "`choices[0].message.content[{j}]` is not a text part"
                ))
            })
        })
        .collect()
}

/// Tool call `i` of the first choice.
fn tool_call(i: usize, call: &Value) -> Result<RawToolCall, AttemptError> {
    let at = |field: &str| format!("`choices[0].message.tool_calls[{i}]{field}`");
    let Some(function) = call.get("function").filter(|f| f.is_object()) else {
        return Err(malformed(format!("{} has no function", at(""))));
    };
    let name = match function.get("name") {
        Some(Value::String(name)) if !name.is_empty() => name.clone(),
        _ => return Err(malformed(format!("{} is missing", at(".function.name")))),
    };
    let arguments = match function.get("arguments") {
        Some(Value::String(arguments)) => arguments.clone(),
        _ => {
            return Err(malformed(format!(
                "{} is not a string",
                at(".function.arguments")
            )));
        }
    };
    Ok(RawToolCall {
        id: match call.get("id") {
            Some(Value::String(id)) if !id.is_empty() => id.clone(),
            _ => format!("call_{i}"),
        },
        kind: call
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("function")
            .to_string(),
        function: FunctionCall { name, arguments },
    })
}

/// The ids of a model list.
fn parse_models(body: &[u8]) -> Result<Vec<String>, AttemptError> {
    let json = json_object(body)?;
    let Some(Value::Array(data)) = json.get("data") else {
        return Err(malformed("the model list has no `data` list"));
    };
    data.iter()
        .enumerate()
        .map(|(i, model)| {
            model
                .get("id")
                .and_then(Value::as_str)
                .map(String::from)
                .ok_or_else(|| malformed(format!("`data[{i}]` has no `id`")))
        })
        .collect()
}

#[cfg(test)]
mod tests;
