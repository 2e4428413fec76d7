//! The client against a scripted stub: a plain TCP server that reads each request and answers
//! as its script says, down to bytes that are not HTTP and connections that hang or drop.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use super::*;

/// The longest a hanging stub connection stays silent (it closes earlier when the stub is
/// dropped): far past [`SHORT`].
const HANG: Duration = Duration::from_secs(10);
/// The tests' attempt timeout: long enough that a loaded machine never times out a scripted
/// answer, which would change the counts.
const TIMEOUT: Duration = Duration::from_secs(5);
/// The attempt timeout of the tests of timeouts.
const SHORT: Duration = Duration::from_millis(500);

/// What the stub does with one connection.
#[derive(Clone, Debug)]
enum Act {
    /// A well-formed HTTP response.
    Answer {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// These bytes, whatever they are, then the connection closes.
    Raw(Vec<u8>),
    /// Nothing until the stub is dropped (at most [`HANG`]), then the connection closes.
    Hang,
    /// The connection closes at once, unanswered.
    Close,
}

fn ok(body: Value) -> Act {
    answer(200, body.to_string())
}

fn answer(status: u16, body: impl Into<String>) -> Act {
    Act::Answer {
        status,
        headers: Vec::new(),
        body: body.into(),
    }
}

/// A completion with one text choice.
fn completion(text: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
            "logprobs": null, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}})
}

fn openai_error(message: &str, code: &str) -> String {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": null,
        "code": code}})
    .to_string()
}

/// A request as the stub read it.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    /// Lower-case names.
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.body).expect("the client sends JSON")
    }
}

type Script = dyn Fn(usize, &Seen) -> Act + Send + Sync;

/// A scripted server on loopback; stops accepting when dropped.
struct Stub {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
}

impl Stub {
    /// Connection `i` gets `script[i]`, the last act repeating.
    fn start(script: Vec<Act>) -> Stub {
        assert!(!script.is_empty());
        Stub::with(move |i, _| script[i.min(script.len() - 1)].clone())
    }

    /// Connection `i` (counting from 0), having sent `seen`, gets `act(i, seen)`.
    fn with(act: impl Fn(usize, &Seen) -> Act + Send + Sync + 'static) -> Stub {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let act: Arc<Script> = Arc::new(act);
        let (log, stopped) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            let count = AtomicUsize::new(0);
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let i = count.fetch_add(1, Ordering::SeqCst);
                let (act, log, stopped) = (act.clone(), log.clone(), stopped.clone());
                std::thread::spawn(move || serve(stream, i, &*act, &log, &stopped));
            }
        });
        Stub { port, seen, stop }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Reads one request from `stream` and acts on it.
fn serve(stream: TcpStream, i: usize, act: &Script, log: &Mutex<Vec<Seen>>, stop: &AtomicBool) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or_default().to_string(),
        parts.next().unwrap_or_default().to_string(),
    );
    let mut headers = Vec::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.push((name.trim().to_lowercase(), value.trim().to_string()));
        }
    }
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    if reader.read_exact(&mut body).is_err() {
        return;
    }
    let seen = Seen {
        method,
        path,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let act = act(i, &seen);
    log.lock().unwrap().push(seen);
    let mut stream = stream;
    match act {
        Act::Answer {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} Scripted\r\nContent-Type: application/json\r\n\
                 Content-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body.as_bytes());
        }
        Act::Raw(bytes) => {
            let _ = stream.write_all(&bytes);
        }
        Act::Hang => {
            let start = std::time::Instant::now();
            while !stop.load(Ordering::SeqCst) && start.elapsed() < HANG {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Act::Close => {}
    }
    let _ = stream.flush();
    let _ = stream.shutdown(Shutdown::Both);
}

/// A client of `stub` for model `m`, with 3 retries and a 5 ms backoff.
fn client(stub: &Stub) -> OpenAiClient {
    OpenAiClient::new(config(&stub.url()))
}

fn config(url: &str) -> EndpointConfig {
    EndpointConfig {
        timeout: TIMEOUT,
        retries: 3,
        backoff: Duration::from_millis(5),
        ..EndpointConfig::new(url, "m")
    }
}

fn request() -> Value {
    json!({"model": "whatever", "messages": [{"role": "user", "content": "hi"}]})
}

/// The counters, checked to account for every attempt.
fn stats(client: &OpenAiClient) -> EndpointStats {
    let s = client.stats();
    assert_eq!(
        s.attempts,
        s.requests - s.failed
            + s.timeouts
            + s.server_errors
            + s.rate_limited
            + s.malformed
            + s.connection_errors
            + s.refused,
        "an attempt is not accounted for: {s:?}"
    );
    s
}

#[test]
fn a_reply_is_read_and_the_model_is_set() {
    let stub = Stub::start(vec![ok(completion("hello"))]);
    let client = client(&stub);
    let reply = client.complete(request()).unwrap();
    assert_eq!(reply.content.as_deref(), Some("hello"));
    assert_eq!(reply.finish_reason.as_deref(), Some("stop"));
    assert_eq!(
        reply.usage,
        Some(TokenUsage {
            prompt_tokens: 7,
            completion_tokens: 2
        })
    );
    assert_eq!((reply.attempts, reply.tool_calls.len()), (1, 0));
    let seen = stub.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        (seen[0].method.as_str(), seen[0].path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(seen[0].header("content-type"), Some("application/json"));
    assert_eq!(seen[0].header("authorization"), None);
    assert_eq!(
        seen[0].json(),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
    assert_eq!(
        stats(&client),
        EndpointStats {
            requests: 1,
            attempts: 1,
            ..EndpointStats::default()
        }
    );
}

#[test]
fn the_model_is_added_and_a_trailing_slash_is_fine() {
    let stub = Stub::start(vec![ok(completion("x"))]);
    let client = OpenAiClient::new(config(&format!("{}/", stub.url())));
    client
        .complete(json!({"messages": [{"role": "user", "content": "hi"}]}))
        .unwrap();
    let seen = stub.seen();
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].json()["model"], json!("m"));
}

#[test]
fn the_key_is_sent_as_a_bearer_token_and_never_shown() {
    let stub = Stub::with(|_, seen| match seen.header("authorization") {
        Some("Bearer sk-test") => ok(completion("in")),
        _ => answer(401, openai_error("bad key", "invalid_api_key")),
    });
    let config = EndpointConfig {
        api_key: Some("sk-test\n".into()),
        ..config(&stub.url())
    };
    assert!(!format!("{config:?}").contains("sk-test"));
    let client = OpenAiClient::new(config);
    assert!(!format!("{client:?}").contains("sk-test"));
    assert_eq!(
        client.complete(request()).unwrap().content.as_deref(),
        Some("in")
    );
    let seen = stub.seen();
    assert!(
        seen.iter()
            .all(|s| s.header("authorization") == Some("Bearer sk-test"))
    );

    let unkeyed = OpenAiClient::new(config_of(&stub));
    let err = unkeyed.complete(request()).unwrap_err();
    assert_eq!(
        err,
        EndpointError::Refused {
            status: 401,
            message: "bad key".into(),
            code: Some("invalid_api_key".into())
        }
    );
    assert_eq!(
        err.to_string(),
        "the endpoint refused the request (HTTP 401): bad key (check the API key)"
    );
}

fn config_of(stub: &Stub) -> EndpointConfig {
    config(&stub.url())
}

#[test]
fn a_key_that_cannot_be_sent_is_refused_before_sending() {
    let stub = Stub::start(vec![ok(completion("x"))]);
    for key in ["", "  ", "two words", "clé"] {
        let client = OpenAiClient::new(EndpointConfig {
            api_key: Some(key.into()),
            ..config_of(&stub)
        });
        let err = client.complete(request()).unwrap_err();
        assert!(matches!(err, EndpointError::Invalid(_)), "{key:?}: {err}");
        assert!(matches!(
            client.models().unwrap_err(),
            EndpointError::Invalid(_)
        ));
        let s = stats(&client);
        assert_eq!((s.requests, s.attempts, s.failed), (1, 0, 1));
    }
    assert!(stub.seen().is_empty());
}

#[test]
fn bodies_that_cannot_be_sent_are_refused_before_sending() {
    let stub = Stub::start(vec![ok(completion("x"))]);
    let client = client(&stub);
    for body in [json!([1, 2]), json!({"messages": [], "stream": true})] {
        let err = client.complete(body.clone()).unwrap_err();
        assert!(matches!(err, EndpointError::Invalid(_)), "{body}: {err}");
    }
    let bad_url = OpenAiClient::new(config("not a url"));
    let err = bad_url.complete(request()).unwrap_err();
    assert!(matches!(err, EndpointError::Invalid(_)), "{err}");
    assert!(
        err.to_string().starts_with("cannot send the request: "),
        "{err}"
    );
    assert!(stub.seen().is_empty());
    let s = stats(&client);
    assert_eq!((s.requests, s.attempts, s.failed), (2, 0, 2));
}

#[test]
fn a_tool_call_reply_is_read() {
    let reply = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": null, "tool_calls": [
            {"id": "call_a", "type": "function",
                "function": {"name": "ls", "arguments": "{\"path\": \"/\"}"}},
            {"function": {"name": "cat", "arguments": "not json, the model's problem"}}]}}]});
    let stub = Stub::start(vec![ok(reply)]);
    let reply = client(&stub).complete(request()).unwrap();
    assert_eq!(reply.content, None);
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(reply.usage, None);
    assert_eq!(
        reply.tool_calls,
        vec![
            RawToolCall {
                id: "call_a".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "ls".into(),
                    arguments: "{\"path\": \"/\"}".into()
                }
            },
            RawToolCall {
                id: "call_1".into(),
                kind: "function".into(),
                function: FunctionCall {
                    name: "cat".into(),
                    arguments: "not json, the model's problem".into()
                }
            }
        ]
    );
}

#[test]
fn content_parts_are_joined() {
    let reply = json!({"choices": [{"message": {"role": "assistant", "content":
        [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}}]});
    let stub = Stub::start(vec![ok(reply)]);
    let reply = client(&stub).complete(request()).unwrap();
    assert_eq!(reply.content.as_deref(), Some("ab"));
    assert_eq!(reply.finish_reason, None);
}

#[test]
fn a_5xx_is_retried() {
    let stub = Stub::start(vec![
        answer(503, openai_error("overloaded", "busy")),
        ok(completion("fine")),
    ]);
    let client = client(&stub);
    let reply = client.complete(request()).unwrap();
    assert_eq!(
        (reply.content.as_deref(), reply.attempts),
        (Some("fine"), 2)
    );
    assert_eq!(
        stats(&client),
        EndpointStats {
            requests: 1,
            attempts: 2,
            retries: 1,
            server_errors: 1,
            ..EndpointStats::default()
        }
    );
    assert_eq!(stub.seen().len(), 2);
}

#[test]
fn a_timeout_is_retried() {
    let stub = Stub::start(vec![Act::Hang, ok(completion("late"))]);
    let client = OpenAiClient::new(EndpointConfig {
        timeout: SHORT,
        ..config_of(&stub)
    });
    let reply = client.complete(request()).unwrap();
    assert_eq!(
        (reply.content.as_deref(), reply.attempts),
        (Some("late"), 2)
    );
    let s = stats(&client);
    assert_eq!((s.timeouts, s.retries, s.failed), (1, 1, 0));
}

#[test]
fn timeouts_exhaust_the_retries_and_say_so() {
    let stub = Stub::start(vec![Act::Hang]);
    let client = OpenAiClient::new(EndpointConfig {
        retries: 1,
        timeout: SHORT,
        ..config_of(&stub)
    });
    let err = client.complete(request()).unwrap_err();
    assert_eq!(
        err,
        EndpointError::Failed {
            attempts: 2,
            cause: "timed out after 500 ms".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "the endpoint failed 2 times; the last time: timed out after 500 ms"
    );
    let s = stats(&client);
    assert_eq!((s.timeouts, s.attempts, s.failed), (2, 2, 1));
}

#[test]
fn retries_exhausted_fail_naming_the_cause_and_the_attempts() {
    let stub = Stub::start(vec![answer(500, openai_error("the model crashed", "x"))]);
    let client = client(&stub);
    let err = client.complete(request()).unwrap_err();
    assert_eq!(
        err,
        EndpointError::Failed {
            attempts: 4,
            cause: "HTTP 500: the model crashed".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "the endpoint failed 4 times; the last time: HTTP 500: the model crashed"
    );
    assert_eq!(
        stats(&client),
        EndpointStats {
            requests: 1,
            attempts: 4,
            retries: 3,
            server_errors: 4,
            failed: 1,
            ..EndpointStats::default()
        }
    );
    assert_eq!(stub.seen().len(), 4);
}

#[test]
fn no_retries_means_one_attempt() {
    let stub = Stub::start(vec![answer(502, "Bad Gateway")]);
    let client = OpenAiClient::new(EndpointConfig {
        retries: 0,
        ..config_of(&stub)
    });
    let err = client.complete(request()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the endpoint failed 1 time; the last time: HTTP 502: Bad Gateway"
    );
}

#[test]
fn a_body_that_is_not_json_is_malformed() {
    let stub = Stub::start(vec![answer(200, "not json")]);
    let client = client(&stub);
    let EndpointError::Failed { attempts, cause } = client.complete(request()).unwrap_err() else {
        panic!("not a failure");
    };
    assert_eq!(attempts, 4);
    assert!(
        cause.starts_with("malformed reply: the body is not JSON (") && cause.ends_with("not json"),
        "{cause}"
    );
    let s = stats(&client);
    assert_eq!((s.malformed, s.retries, s.failed), (4, 3, 1));
}

#[test]
fn malformed_replies_are_named() {
    let call = |function: Value| {
        json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function", "function": function}]}}]})
    };
    let cases = [
        (ok(json!({"choices": []})), "`choices` is empty"),
        (ok(json!({"id": "x"})), "no `choices`"),
        (
            ok(json!({"error": {"message": "boom"}})),
            "no `choices`, but an error: boom",
        ),
        (ok(json!({"choices": {}})), "`choices` is not a list"),
        (ok(json!([1])), "the body is not a JSON object: [1]"),
        (
            ok(json!({"choices": [{}]})),
            "`choices[0]` has no `message`",
        ),
        (
            ok(json!({"choices": [{"message": {"content": 3}}]})),
            "`choices[0].message.content` is not a string",
        ),
        (
            ok(json!({"choices": [{"message": {"tool_calls": "ls"}}]})),
            "`choices[0].message.tool_calls` is not a list",
        ),
        (
            ok(call(json!({"name": "ls", "arguments": {"path": "/"}}))),
            "`choices[0].message.tool_calls[0].function.arguments` is not a string",
        ),
        (
            ok(call(json!({"arguments": "{}"}))),
            "`choices[0].message.tool_calls[0].function.name` is missing",
        ),
        (Act::Raw(b"garbage\r\n\r\n".to_vec()), "not valid HTTP"),
        (
            Act::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n\xff\xfe\x00{".to_vec()),
            "the body is not JSON",
        ),
    ];
    for (act, expected) in cases {
        let stub = Stub::start(vec![act.clone(), ok(completion("good"))]);
        let once = OpenAiClient::new(EndpointConfig {
            retries: 0,
            ..config_of(&stub)
        });
        let err = once.complete(request()).unwrap_err();
        let EndpointError::Failed { attempts: 1, cause } = &err else {
            panic!("{act:?}: {err:?}");
        };
        assert!(cause.starts_with("malformed reply: "), "{cause}");
        assert!(cause.contains(expected), "{act:?}: {cause}");
        assert_eq!(stats(&once).malformed, 1);
        // The next attempt is answered properly: a retrying client gets it.
        let stub = Stub::start(vec![act, ok(completion("good"))]);
        let retrying = client(&stub);
        let reply = retrying.complete(request()).unwrap();
        assert_eq!(
            (reply.content.as_deref(), reply.attempts),
            (Some("good"), 2)
        );
        assert_eq!(stats(&retrying).malformed, 1);
    }
}

#[test]
fn a_4xx_is_refused_at_once_with_the_servers_message() {
    let stub = Stub::start(vec![
        answer(400, openai_error("`n` is 0", "bad_n")),
        ok(completion("never")),
    ]);
    let client = client(&stub);
    let err = client.complete(request()).unwrap_err();
    assert_eq!(
        err,
        EndpointError::Refused {
            status: 400,
            message: "`n` is 0".into(),
            code: Some("bad_n".into())
        }
    );
    assert_eq!(
        err.to_string(),
        "the endpoint refused the request (HTTP 400): `n` is 0"
    );
    assert_eq!(
        stats(&client),
        EndpointStats {
            requests: 1,
            attempts: 1,
            refused: 1,
            failed: 1,
            ..EndpointStats::default()
        }
    );
    assert_eq!(stub.seen().len(), 1);
}

#[test]
fn error_bodies_of_every_shape_are_read() {
    let long = "x".repeat(300);
    let cases = [
        (
            404,
            json!({"object": "error", "message": "The model `m` does not exist.",
                "type": "NotFoundError", "code": 404})
            .to_string(),
            "The model `m` does not exist.",
        ),
        (413, json!({"error": "too big"}).to_string(), "too big"),
        (
            422,
            json!({"detail": "field required"}).to_string(),
            "field required",
        ),
        (403, "Forbidden\n".to_string(), "Forbidden"),
        (400, String::new(), "(empty body)"),
        (400, long.clone(), &*format!("{}…", &long[..200])),
    ];
    for (status, body, message) in cases {
        let stub = Stub::start(vec![answer(status, body)]);
        let err = client(&stub).complete(request()).unwrap_err();
        assert_eq!(
            err,
            EndpointError::Refused {
                status,
                message: message.to_string(),
                code: None
            }
        );
    }
    let stub = Stub::start(vec![answer(
        404,
        openai_error("no such model", "model_not_found"),
    )]);
    let err = client(&stub).complete(request()).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("(check the endpoint URL, usually ending in /v1, and the model name)"),
        "{err}"
    );
}

#[test]
fn a_429_waits_as_told() {
    let stub = Stub::start(vec![
        Act::Answer {
            status: 429,
            headers: vec![("Retry-After", "0".into())],
            body: openai_error("slow down", "rate_limit_exceeded"),
        },
        ok(completion("ok")),
    ]);
    let client = OpenAiClient::new(EndpointConfig {
        // Retry-After 0 wins over the backoff: the test would take a minute otherwise.
        backoff: Duration::from_secs(60),
        ..config_of(&stub)
    });
    let reply = client.complete(request()).unwrap();
    assert_eq!(reply.attempts, 2);
    let s = stats(&client);
    assert_eq!((s.rate_limited, s.retries, s.failed), (1, 1, 0));
}

#[test]
fn a_408_is_a_timeout() {
    let stub = Stub::start(vec![answer(408, ""), ok(completion("ok"))]);
    let client = client(&stub);
    client.complete(request()).unwrap();
    assert_eq!(stats(&client).timeouts, 1);
}

#[test]
fn retry_after_is_read_and_capped() {
    assert_eq!(retry_after(Some("0")), Some(Duration::ZERO));
    assert_eq!(retry_after(Some(" 5 ")), Some(Duration::from_secs(5)));
    assert_eq!(retry_after(Some("1.5")), Some(Duration::from_millis(1500)));
    assert_eq!(retry_after(Some("3600")), Some(MAX_DELAY));
    assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
    assert_eq!(retry_after(Some("-1")), None);
    assert_eq!(retry_after(None), None);
}

#[test]
fn the_backoff_doubles_up_to_its_cap() {
    let first = Duration::from_millis(500);
    let delays: Vec<_> = (0..4).map(|r| backoff(first, r)).collect();
    assert_eq!(
        delays,
        [500, 1000, 2000, 4000].map(Duration::from_millis).to_vec()
    );
    assert_eq!(backoff(first, 10), MAX_DELAY);
    assert_eq!(backoff(first, 1000), MAX_DELAY);
}

#[test]
fn durations_read_as_people_write_them() {
    assert_eq!(human(Duration::from_secs(2)), "2 s");
    assert_eq!(human(Duration::from_millis(300)), "300 ms");
    assert_eq!(human(Duration::from_millis(1500)), "1.5 s");
}

#[test]
fn an_unreachable_endpoint_fails_after_its_retries() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = OpenAiClient::new(config(&format!("http://127.0.0.1:{port}/v1")));
    let err = client.complete(request()).unwrap_err();
    let EndpointError::Failed { attempts: 4, cause } = &err else {
        panic!("{err:?}");
    };
    assert!(cause.starts_with("connection error: "), "{cause}");
    assert!(cause.contains(&port.to_string()), "{cause}");
    let s = stats(&client);
    assert_eq!((s.connection_errors, s.failed), (4, 1));
    // https is built in: the same port over TLS is unreachable, not an unknown scheme.
    let tls = OpenAiClient::new(EndpointConfig {
        retries: 0,
        ..config(&format!("https://127.0.0.1:{port}/v1"))
    });
    let err = tls.complete(request()).unwrap_err();
    assert!(
        matches!(err, EndpointError::Failed { attempts: 1, .. }),
        "{err}"
    );
}

#[test]
fn a_dropped_connection_is_retried() {
    let stub = Stub::start(vec![
        Act::Close,
        // Promises more body than it sends.
        Act::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"choices\"".to_vec()),
        ok(completion("ok")),
    ]);
    let client = client(&stub);
    let reply = client.complete(request()).unwrap();
    assert_eq!(reply.attempts, 3);
    let s = stats(&client);
    assert_eq!((s.connection_errors, s.retries), (2, 2));
}

#[test]
fn concurrent_calls_all_succeed_and_the_counters_add_up() {
    const THREADS: usize = 8;
    const CALLS: usize = 10;
    // Every other connection is a 503: a call can lose at most one race per other call, so
    // with that many retries every call succeeds, whatever the interleaving.
    let stub = Stub::with(|i, seen| {
        if i % 2 == 0 {
            answer(503, "busy")
        } else {
            let text = seen.json()["messages"][0]["content"].clone();
            ok(completion(text.as_str().unwrap()))
        }
    });
    let client = OpenAiClient::new(EndpointConfig {
        retries: (THREADS * CALLS) as u32,
        backoff: Duration::from_millis(1),
        ..config_of(&stub)
    });
    std::thread::scope(|scope| {
        for t in 0..THREADS {
            let client = &client;
            scope.spawn(move || {
                for c in 0..CALLS {
                    let text = format!("{t}/{c}");
                    let reply = client
                        .complete(json!({"messages": [{"role": "user", "content": text}]}))
                        .unwrap();
                    assert_eq!(reply.content, Some(text));
                }
            });
        }
    });
    let seen = stub.seen().len() as u64;
    let s = stats(&client);
    let calls = (THREADS * CALLS) as u64;
    assert_eq!((s.requests, s.failed), (calls, 0));
    assert_eq!(s.attempts, seen);
    assert_eq!(s.server_errors, seen - calls);
    assert_eq!(s.retries, s.server_errors);
}

#[test]
fn models_lists_the_ids() {
    let stub = Stub::start(vec![
        answer(503, ""),
        ok(
            json!({"object": "list", "data": [{"id": "a", "object": "model"},
            {"id": "org/b", "object": "model"}]}),
        ),
    ]);
    let client = OpenAiClient::new(EndpointConfig {
        api_key: Some("k".into()),
        ..config(&format!("{}/", stub.url()))
    });
    assert_eq!(client.models().unwrap(), ["a", "org/b"]);
    let seen = stub.seen();
    assert_eq!(
        (seen[1].method.as_str(), seen[1].path.as_str()),
        ("GET", "/v1/models")
    );
    assert_eq!(seen[1].header("authorization"), Some("Bearer k"));
    // Not a completion: not counted.
    assert_eq!(stats(&client), EndpointStats::default());

    let stub = Stub::start(vec![ok(json!({"models": []}))]);
    let err = client_with_no_retries(&stub).models().unwrap_err();
    assert_eq!(
        err.to_string(),
        "the endpoint failed 1 time; the last time: malformed reply: the model list has no \
         `data` list"
    );
}

fn client_with_no_retries(stub: &Stub) -> OpenAiClient {
    OpenAiClient::new(EndpointConfig {
        retries: 0,
        ..config_of(stub)
    })
}

#[test]
fn the_client_is_shareable() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<OpenAiClient>();
    shareable::<EndpointError>();
}

#[test]
fn the_stats_serialize_as_a_flat_object() {
    let value = serde_json::to_value(EndpointStats {
        requests: 2,
        ..EndpointStats::default()
    })
    .unwrap();
    assert_eq!(value["requests"], json!(2));
    assert_eq!(value.as_object().unwrap().len(), 10);
}
