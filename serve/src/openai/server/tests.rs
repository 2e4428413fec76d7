//! The server over real HTTP on loopback, against a scripted model: the last user message
//! says what the model does (see [`Fake`]).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Mutex;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::*;
use crate::openai::wire::{ChatRequest, FunctionCall, Invalid, Role, TopLogprob};

/// The served model's name (with a slash, as real ones have).
const ID: &str = "fake/model-1";
/// The model list's `created`.
const CREATED: u64 = 1_700_000_000;
/// Longest any test waits for anything.
const PATIENCE: Duration = Duration::from_secs(10);

/// A model scripted by the last user message:
///
/// - `busy`: refused as busy; `too long`: refused as invalid;
/// - `call`: every choice calls `ls` (no text);
/// - `fail`: some text, then `Failed`; `vanish`: some text, then the channel closes;
///   `stray`: a delta for choice `n`;
/// - `hang`: reports on `started`, then sends ` tick` every 5 ms until the receiver is
///   dropped, which it reports on `cancelled`;
/// - anything else: choice 0 echoes it word by word (choice `i > 0` adds ` (i)`), the choices
///   interleaved in reverse order, each word with a log-probability when asked, and an empty
///   delta before each `Done`.
struct Fake {
    started: Mutex<std_mpsc::Sender<()>>,
    cancelled: Mutex<std_mpsc::Sender<()>>,
}

impl ChatModel for Fake {
    fn id(&self) -> &str {
        ID
    }

    fn submit(&self, request: ChatRequest) -> Result<mpsc::UnboundedReceiver<Event>, Refusal> {
        let last = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        match last.as_str() {
            "busy" => return Err(Refusal::Busy),
            "too long" => {
                return Err(Refusal::Invalid(Invalid {
                    message: "the conversation does not fit the context".into(),
                    param: Some("messages".into()),
                    code: Some("context_length_exceeded"),
                }));
            }
            _ => {}
        }
        let (events, receiver) = mpsc::unbounded_channel();
        let started = self.started.lock().unwrap().clone();
        let cancelled = self.cancelled.lock().unwrap().clone();
        std::thread::spawn(move || script(&request, &last, &events, &started, &cancelled));
        Ok(receiver)
    }
}

fn script(
    request: &ChatRequest,
    last: &str,
    events: &mpsc::UnboundedSender<Event>,
    started: &std_mpsc::Sender<()>,
    cancelled: &std_mpsc::Sender<()>,
) {
    // A send fails only once the server dropped the receiver, which the scripts ignore
    // (except `hang`, which is about exactly that).
    let send = |event| drop(events.send(event));
    let delta = |index, text: &str| Event::Delta {
        index,
        text: text.to_string(),
        logprobs: Vec::new(),
    };
    let n = request.n;
    let prompt_tokens = request
        .messages
        .iter()
        .map(|m| m.content.split_whitespace().count())
        .sum();
    match last {
        "call" => {
            for index in 0..n {
                send(Event::Done {
                    index,
                    finish_reason: FinishReason::ToolCalls,
                    tool_calls: vec![RawToolCall {
                        id: format!("call_{index}"),
                        kind: "function".into(),
                        function: FunctionCall {
                            name: "ls".into(),
                            arguments: r#"{"path": "."}"#.into(),
                        },
                    }],
                });
            }
            send(Event::Finished {
                prompt_tokens,
                completion_tokens: 7 * n,
            });
        }
        "fail" => {
            send(delta(0, "partial"));
            send(Event::Failed("the accelerator fell over".into()));
        }
        "vanish" => send(delta(0, "partial")),
        "stray" => send(delta(n, "lost")),
        "hang" => {
            let _ = started.send(());
            let deadline = Instant::now() + PATIENCE;
            while !events.is_closed() && Instant::now() < deadline {
                send(delta(0, " tick"));
                std::thread::sleep(Duration::from_millis(5));
            }
            if events.is_closed() {
                let _ = cancelled.send(());
            }
        }
        text => {
            let pieces = |index: usize| {
                let mut pieces = words(text);
                if index > 0 {
                    pieces.push(format!(" ({index})"));
                }
                pieces
            };
            let longest = (0..n).map(|i| pieces(i).len()).max().unwrap_or(0);
            let mut completion_tokens = 0;
            for j in 0..longest {
                for index in (0..n).rev() {
                    if let Some(piece) = pieces(index).get(j) {
                        completion_tokens += 1;
                        send(Event::Delta {
                            index,
                            text: piece.clone(),
                            logprobs: request
                                .logprobs
                                .map_or(Vec::new(), |k| vec![logprob(piece, k)]),
                        });
                    }
                }
            }
            for index in (0..n).rev() {
                send(delta(index, ""));
                send(Event::Done {
                    index,
                    finish_reason: FinishReason::Stop,
                    tool_calls: Vec::new(),
                });
            }
            send(Event::Finished {
                prompt_tokens,
                completion_tokens,
            });
        }
    }
}

/// `"hello big world"` as `["hello", " big", " world"]`.
fn words(text: &str) -> Vec<String> {
    text.split(' ')
        .enumerate()
        .map(|(i, w)| {
            if i == 0 {
                w.to_string()
            } else {
                format!(" {w}")
            }
        })
        .collect()
}

fn logprob(token: &str, top: usize) -> TokenLogprob {
    TokenLogprob {
        token: token.to_string(),
        logprob: -0.5,
        bytes: token.as_bytes().to_vec(),
        top_logprobs: (0..top)
            .map(|_| TopLogprob {
                token: "x".into(),
                logprob: -2.0,
                bytes: b"x".to_vec(),
            })
            .collect(),
    }
}

/// A running server over [`Fake`].
struct Fixture {
    server: Server,
    started: std_mpsc::Receiver<()>,
    cancelled: std_mpsc::Receiver<()>,
    agent: ureq::Agent,
}

impl Fixture {
    fn start() -> Fixture {
        Fixture::with(|_| {})
    }

    fn with(configure: impl FnOnce(&mut OpenAiConfig)) -> Fixture {
        let mut config = OpenAiConfig::new("127.0.0.1:0".parse().unwrap());
        config.http_threads = 2;
        config.created = CREATED;
        configure(&mut config);
        let (started_tx, started) = std_mpsc::channel();
        let (cancelled_tx, cancelled) = std_mpsc::channel();
        let model = Arc::new(Fake {
            started: Mutex::new(started_tx),
            cancelled: Mutex::new(cancelled_tx),
        });
        Fixture {
            server: serve_openai(config, model).unwrap(),
            started,
            cancelled,
            agent: ureq::AgentBuilder::new().timeout(PATIENCE).build(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.origin())
    }

    /// A raw call: `path` under the origin, an optional token, content type and body.
    fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<(&str, &str)>,
    ) -> Answer {
        let mut request = self.agent.request(method, &self.url(path));
        if let Some(token) = token {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        let result = match body {
            Some((content_type, body)) => {
                request.set("Content-Type", content_type).send_string(body)
            }
            None => request.call(),
        };
        let response = match result {
            Ok(response) | Err(ureq::Error::Status(_, response)) => response,
            Err(e) => panic!("transport error: {e}"),
        };
        let header = |name| response.header(name).map(str::to_string);
        let (content_type, retry_after, authenticate) = (
            header("content-type"),
            header("retry-after"),
            header("www-authenticate"),
        );
        let status = response.status();
        let text = response.into_string().unwrap();
        Answer {
            status,
            content_type,
            retry_after,
            authenticate,
            json: serde_json::from_str(&text).unwrap_or(Value::Null),
            text,
        }
    }

    /// POSTs `body` to the chat completions.
    fn chat(&self, body: Value) -> Answer {
        self.chat_raw(&body.to_string())
    }

    fn chat_raw(&self, body: &str) -> Answer {
        self.call(
            "POST",
            "/v1/chat/completions",
            None,
            Some(("application/json", body)),
        )
    }
}

struct Answer {
    status: u16,
    content_type: Option<String>,
    retry_after: Option<String>,
    authenticate: Option<String>,
    text: String,
    json: Value,
}

impl Answer {
    /// The `data:` payloads of a stream, `[DONE]` checked last and left out, each parsed.
    fn events(&self) -> Vec<Value> {
        assert_eq!(self.status, 200, "{}", self.text);
        assert_eq!(self.content_type.as_deref(), Some("text/event-stream"));
        let mut data: Vec<&str> = self
            .text
            .split("\n\n")
            .filter(|event| !event.is_empty())
            .map(|event| event.strip_prefix("data: ").expect(event))
            .collect();
        assert_eq!(data.pop(), Some("[DONE]"), "{}", self.text);
        assert!(self.text.ends_with("data: [DONE]\n\n"));
        data.iter()
            .map(|d| serde_json::from_str(d).expect(d))
            .collect()
    }

    /// Asserts an OpenAI error object with this status and type; returns the object.
    fn error(&self, status: u16, kind: &str) -> &Value {
        assert_eq!(self.status, status, "{}", self.text);
        assert_eq!(
            self.content_type.as_deref(),
            Some("application/json"),
            "{}",
            self.text
        );
        let error = &self.json["error"];
        assert_eq!(error["type"], kind, "{}", self.text);
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
        let mut keys: Vec<&String> = error.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["code", "message", "param", "type"], "{}", self.text);
        error
    }
}

/// A request saying `text`, with `extra` fields.
fn says(text: &str, extra: Value) -> Value {
    let mut body = json!({"model": ID, "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": text},
    ]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn streamed(text: &str, extra: Value) -> Value {
    let mut body = says(text, extra);
    body["stream"] = json!(true);
    body
}

/// Each choice's text, reassembled from a stream's chunks.
fn reassemble(chunks: &[Value]) -> Vec<String> {
    let mut texts = Vec::new();
    for chunk in chunks {
        for choice in chunk["choices"].as_array().unwrap() {
            let index = choice["index"].as_u64().unwrap() as usize;
            if texts.len() <= index {
                texts.resize(index + 1, String::new());
            }
            if let Some(text) = choice["delta"]["content"].as_str() {
                texts[index].push_str(text);
            }
        }
    }
    texts
}

// ------------------------------------------------------------------------------------------
// Completions

#[test]
fn a_completion_has_exactly_the_fields_clients_parse() {
    let fixture = Fixture::start();
    let before = unix_now();
    let answer = fixture.chat(says("hello big world", json!({})));
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.content_type.as_deref(), Some("application/json"));
    let mut body = answer.json;
    let id = body["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("chatcmpl-") && id.len() >= 33, "{id}");
    let created = body["created"].as_u64().unwrap();
    assert!((before..=unix_now()).contains(&created));
    let object = body.as_object_mut().unwrap();
    object.remove("id");
    object.remove("created");
    assert_eq!(
        body,
        json!({
            "object": "chat.completion",
            "model": ID,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": "hello big world"},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
        })
    );
    let again = fixture.chat(says("hello", json!({})));
    assert_ne!(again.json["id"].as_str(), Some(id.as_str()));
}

#[test]
fn n_choices_come_sorted_by_index() {
    let fixture = Fixture::start();
    let answer = fixture.chat(says("hi there", json!({"n": 2})));
    assert_eq!(answer.status, 200, "{}", answer.text);
    let choices = answer.json["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, text) in ["hi there", "hi there (1)"].iter().enumerate() {
        assert_eq!(choices[i]["index"], i);
        assert_eq!(choices[i]["message"]["content"], *text);
        assert_eq!(choices[i]["finish_reason"], "stop");
    }
    assert_eq!(answer.json["usage"]["completion_tokens"], 5);
}

#[test]
fn tool_calls_leave_the_content_null() {
    let fixture = Fixture::start();
    let tools = json!([{"type": "function", "function": {"name": "ls", "parameters":
        {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    let answer = fixture.chat(says("call", json!({"tools": tools})));
    assert_eq!(answer.status, 200, "{}", answer.text);
    let choice = &answer.json["choices"][0];
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_0",
            "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]})
    );
    assert_eq!(choice["finish_reason"], "tool_calls");
}

#[test]
fn logprobs_come_only_when_asked() {
    let fixture = Fixture::start();
    let plain = fixture.chat(says("hello world", json!({"logprobs": false})));
    assert_eq!(plain.json["choices"][0]["logprobs"], Value::Null);
    let asked = fixture.chat(says(
        "hello world",
        json!({"logprobs": true, "top_logprobs": 2}),
    ));
    assert_eq!(asked.status, 200, "{}", asked.text);
    let content = asked.json["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let tokens: Vec<&str> = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens, ["hello", " world"]);
    assert_eq!(content[1]["logprob"], -0.5);
    assert_eq!(content[1]["bytes"], json!(b" world".to_vec()));
    assert_eq!(content[1]["top_logprobs"].as_array().unwrap().len(), 2);
}

// ------------------------------------------------------------------------------------------
// Streams

#[test]
fn a_stream_reassembles_to_the_completion() {
    let fixture = Fixture::start();
    let whole = fixture.chat(says("one two three", json!({"n": 2})));
    let chunks = fixture
        .chat(streamed("one two three", json!({"n": 2})))
        .events();
    let texts: Vec<&str> = whole.json["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(reassemble(&chunks), texts);
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for chunk in &chunks {
        assert_eq!(chunk["id"], id);
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["created"], chunks[0]["created"]);
        assert_eq!(chunk["model"], ID);
        assert_eq!(chunk.get("usage"), Some(&Value::Null), "{chunk}");
        assert_eq!(chunk["choices"].as_array().unwrap().len(), 1, "{chunk}");
    }
    for index in 0..2 {
        let mine: Vec<&Value> = chunks
            .iter()
            .map(|c| &c["choices"][0])
            .filter(|c| c["index"] == index)
            .collect();
        assert_eq!(
            mine[0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        let last = mine.last().unwrap();
        assert_eq!(last["delta"], json!({}));
        assert_eq!(last["finish_reason"], "stop");
        for middle in &mine[1..mine.len() - 1] {
            // The empty delta before each `Done` sends no chunk.
            assert!(
                middle["delta"]["content"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            );
            assert_eq!(middle["finish_reason"], Value::Null);
            assert_eq!(middle["logprobs"], Value::Null);
        }
    }
}

#[test]
fn a_streamed_call_arrives_whole_and_usage_comes_last() {
    let fixture = Fixture::start();
    let chunks = fixture
        .chat(streamed(
            "call",
            json!({"stream_options": {"include_usage": true}}),
        ))
        .events();
    let choices: Vec<&Value> = chunks[..3].iter().map(|c| &c["choices"][0]).collect();
    assert_eq!(
        choices[0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(
        choices[1]["delta"],
        json!({"tool_calls": [{"index": 0, "id": "call_0", "type": "function",
            "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]})
    );
    assert_eq!(choices[1]["finish_reason"], Value::Null);
    assert_eq!(choices[2]["delta"], json!({}));
    assert_eq!(choices[2]["finish_reason"], "tool_calls");
    assert_eq!(chunks.len(), 4);
    assert_eq!(chunks[3]["choices"], json!([]));
    assert_eq!(
        chunks[3]["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10})
    );
}

#[test]
fn streamed_logprobs_ride_with_their_text() {
    let fixture = Fixture::start();
    let chunks = fixture
        .chat(streamed("a b", json!({"logprobs": true})))
        .events();
    let choices: Vec<&Value> = chunks.iter().map(|c| &c["choices"][0]).collect();
    assert_eq!(choices.len(), 4, "{chunks:?}");
    assert_eq!(choices[0]["logprobs"], Value::Null);
    for (choice, token) in choices[1..3].iter().zip(["a", " b"]) {
        assert_eq!(choice["delta"]["content"], token);
        assert_eq!(choice["logprobs"]["content"][0]["token"], token);
        assert_eq!(choice["logprobs"]["content"][0]["top_logprobs"], json!([]));
    }
    assert_eq!(choices[3]["logprobs"], Value::Null);
}

#[test]
fn a_failing_stream_ends_with_an_error_event_then_done() {
    let fixture = Fixture::start();
    let chunks = fixture.chat(streamed("fail", json!({}))).events();
    assert_eq!(reassemble(&chunks[..chunks.len() - 1]), ["partial"]);
    assert_eq!(
        chunks.last().unwrap(),
        &json!({"error": {"message": "the accelerator fell over", "type": "server_error",
            "param": null, "code": null}})
    );
    // A model that breaks the event contract is reported the same way.
    for script in ["vanish", "stray"] {
        let chunks = fixture.chat(streamed(script, json!({}))).events();
        let last = chunks.last().unwrap();
        assert_eq!(last["error"]["type"], "server_error", "{script}: {last}");
    }
}

#[test]
fn a_disconnected_stream_cancels_the_request() {
    let fixture = Fixture::start();
    let response = fixture
        .agent
        .post(&fixture.url("/v1/chat/completions"))
        .send_json(streamed("hang", json!({})))
        .unwrap();
    let mut lines = BufReader::new(response.into_reader()).lines();
    let tick = lines.find(|line| line.as_ref().unwrap().contains("tick"));
    assert!(tick.is_some(), "the stream ended before its first tick");
    drop(lines);
    fixture
        .cancelled
        .recv_timeout(PATIENCE)
        .expect("the model's sender closes once the client is gone");
}

#[test]
fn a_disconnected_completion_cancels_the_request() {
    let fixture = Fixture::start();
    // A raw connection, so the client leaves exactly once the model has started.
    let mut connection = TcpStream::connect(fixture.server.addr()).unwrap();
    let body = says("hang", json!({})).to_string();
    write!(
        connection,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    fixture
        .started
        .recv_timeout(PATIENCE)
        .expect("the model starts");
    drop(connection);
    fixture
        .cancelled
        .recv_timeout(PATIENCE)
        .expect("the model's sender closes once the client is gone");
}

// ------------------------------------------------------------------------------------------
// Errors

#[test]
fn a_body_that_is_not_a_request_is_a_400_error_object() {
    let fixture = Fixture::start();
    for (body, expected) in [
        ("{", "EOF while parsing"),
        ("", "EOF while parsing"),
        (r#"{"model": "x", "messages": "hi"}"#, "invalid type"),
        (
            &says("hi", json!({"temperature": "hot"})).to_string(),
            "invalid type",
        ),
        (r#"{"model": "x"}"#, "missing field `messages`"),
        (r#"{"messages": []}"#, "missing field `model`"),
    ] {
        let answer = fixture.chat_raw(body);
        let error = answer.error(400, "invalid_request_error");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(expected) && message.contains("line 1 column"),
            "{body}: {message}"
        );
        assert_eq!(error["param"], Value::Null);
    }
}

#[test]
fn any_content_type_is_read_as_json() {
    let fixture = Fixture::start();
    let body = says("hello", json!({})).to_string();
    for content_type in ["text/plain", "application/x-www-form-urlencoded"] {
        let answer = fixture.call(
            "POST",
            "/v1/chat/completions",
            None,
            Some((content_type, &body)),
        );
        assert_eq!(answer.status, 200, "{content_type}: {}", answer.text);
    }
}

#[test]
fn a_refused_request_names_its_parameter() {
    let fixture = Fixture::start();
    let empty = fixture.chat(json!({"model": ID, "messages": []}));
    assert_eq!(
        empty.error(400, "invalid_request_error")["param"],
        "messages"
    );
    let zero = fixture.chat(says("hi", json!({"n": 0})));
    assert_eq!(zero.error(400, "invalid_request_error")["param"], "n");
    let penalty = fixture.chat(says("hi", json!({"presence_penalty": 1})));
    let error = penalty.error(400, "invalid_request_error");
    assert_eq!(error["code"], "unsupported_parameter");
    // The model's own refusal.
    let long = fixture.chat(says("too long", json!({})));
    let error = long.error(400, "invalid_request_error");
    assert_eq!(
        (&error["param"], &error["code"]),
        (&json!("messages"), &json!("context_length_exceeded"))
    );
}

#[test]
fn an_oversized_body_is_413() {
    let fixture = Fixture::with(|config| config.max_body_bytes = 1024);
    let small = fixture.chat(says(&"a".repeat(500), json!({})));
    assert_eq!(small.status, 200, "{}", small.text);
    let large = fixture.chat(says(&"a".repeat(2000), json!({})));
    let error = large.error(413, "invalid_request_error");
    assert!(error["message"].as_str().unwrap().contains("1024"));
}

#[test]
fn a_busy_model_is_429_with_retry_after() {
    let fixture = Fixture::start();
    let answer = fixture.chat(says("busy", json!({})));
    answer.error(429, "rate_limit_error");
    assert_eq!(answer.retry_after.as_deref(), Some("1"));
}

#[test]
fn an_unknown_model_is_404_model_not_found() {
    let fixture = Fixture::start();
    let mut body = says("hi", json!({}));
    body["model"] = json!("gpt-4o");
    let answer = fixture.chat(body);
    let error = answer.error(404, "invalid_request_error");
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["param"], "model");
    assert!(error["message"].as_str().unwrap().contains("gpt-4o"));
}

#[test]
fn a_model_failure_is_a_500_server_error() {
    let fixture = Fixture::start();
    let failed = fixture.chat(says("fail", json!({})));
    let error = failed.error(500, "server_error");
    assert_eq!(error["message"], "the accelerator fell over");
    let vanished = fixture.chat(says("vanish", json!({})));
    vanished.error(500, "server_error");
    let stray = fixture.chat(says("stray", json!({})));
    let error = stray.error(500, "server_error");
    assert!(error["message"].as_str().unwrap().contains("choice 1"));
}

#[test]
fn the_token_guards_v1_but_not_health() {
    let fixture = Fixture::with(|config| config.token = Some(Token::new("sk-test").unwrap()));
    let body = says("hi", json!({})).to_string();
    let chat = |token| {
        fixture.call(
            "POST",
            "/v1/chat/completions",
            token,
            Some(("application/json", &body)),
        )
    };
    for token in [None, Some("sk-wrong")] {
        let answer = chat(token);
        let error = answer.error(401, "authentication_error");
        assert_eq!(error["code"], "invalid_api_key");
        assert_eq!(answer.authenticate.as_deref(), Some("Bearer"));
        let models = fixture.call("GET", "/v1/models", token, None);
        models.error(401, "authentication_error");
    }
    assert_eq!(chat(Some("sk-test")).status, 200);
    assert_eq!(
        fixture
            .call("GET", "/v1/models", Some("sk-test"), None)
            .status,
        200
    );
    let health = fixture.call("GET", "/health", None, None);
    assert_eq!((health.status, health.text.as_str()), (200, ""));
}

#[test]
fn the_model_list_holds_the_served_model() {
    let fixture = Fixture::start();
    assert_eq!(base_url(&fixture.server), fixture.url("/v1"));
    let card = json!({"id": ID, "object": "model", "created": CREATED, "owned_by": "agentry"});
    let list = fixture.call("GET", "/v1/models", None, None);
    assert_eq!(list.json, json!({"object": "list", "data": [card]}));
    let one = fixture.call("GET", &format!("/v1/models/{ID}"), None, None);
    assert_eq!(one.json, card);
    let other = fixture.call("GET", "/v1/models/gpt-4o", None, None);
    assert_eq!(
        other.error(404, "invalid_request_error")["code"],
        "model_not_found"
    );
}

#[test]
fn unknown_routes_and_methods_answer_error_objects() {
    let fixture = Fixture::start();
    for path in ["/v1/completions", "/api/version", "/"] {
        fixture
            .call("GET", path, None, None)
            .error(404, "invalid_request_error");
    }
    for (method, path) in [
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/models"),
        ("DELETE", "/health"),
    ] {
        fixture
            .call(method, path, None, None)
            .error(405, "invalid_request_error");
    }
}
