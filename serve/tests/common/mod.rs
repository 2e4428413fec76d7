//! Shared pieces of the HTTP tests: fast configurations, a cheap task, polling and raw calls.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry_env::{
    Environment, Param, ParamKind, Reset, Split, Status, Step, TaskGenerator, ToolCall, ToolSchema,
};
use agentry_serve::{ControllerConfig, Server, WorkerConfig};
use serde_json::{Value, json};

pub fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// A controller with test-sized timeouts.
pub fn controller() -> Server {
    controller_with_token(None)
}

/// A controller with test-sized timeouts and an optional shared token.
pub fn controller_with_token(token: Option<&str>) -> Server {
    let mut config = ControllerConfig::new(loopback());
    config.token = token.map(|t| agentry_serve::Token::new(t).unwrap());
    config.heartbeat_timeout = Duration::from_secs(2);
    config.clean_every = Duration::from_millis(200);
    config.call_timeout = Duration::from_secs(2);
    config.interaction_timeout = Duration::from_secs(20);
    config.http_threads = 2;
    agentry_serve::controller::serve(config).unwrap()
}

/// A worker config for task `name`, heartbeating to `controller` every 200 ms.
pub fn worker_config(name: &str, controller: Option<&Server>, concurrency: usize) -> WorkerConfig {
    let mut config = WorkerConfig::new(name, loopback());
    config.controller = controller.map(Server::url);
    config.concurrency = concurrency;
    config.instances = 20;
    config.heartbeat_every = Duration::from_millis(200);
    config.step_timeout = Duration::from_secs(10);
    config.env_threads = 2;
    config.http_threads = 2;
    config
}

/// Polls `check` every 20 ms until it holds; panics after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the controller lists an ALIVE worker of `task` at `address`.
pub fn wait_for_worker(controller: &Server, task: &str, address: &str) {
    wait_until(
        &format!("worker {address} of {task}"),
        Duration::from_secs(20),
        || {
            let Ok((200, workers)) = get(&format!("{}/list_workers", controller.url())) else {
                return false;
            };
            workers[task]["workers"].as_object().is_some_and(|w| {
                w.values()
                    .any(|w| w["address"] == address && w["status"] == "ALIVE")
            })
        },
    );
}

/// A raw call's status, `session_id` and `WWW-Authenticate` headers and body (JSON, or the
/// text as a JSON string).
pub struct Answer {
    pub status: u16,
    pub session: Option<i64>,
    pub authenticate: Option<String>,
    pub body: Value,
}

fn answer(result: Result<ureq::Response, ureq::Error>) -> Answer {
    let response = match result {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport error: {e}"),
    };
    let status = response.status();
    let session = response.header("session_id").and_then(|v| v.parse().ok());
    let authenticate = response.header("www-authenticate").map(String::from);
    let text = response.into_string().unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Answer {
        status,
        session,
        authenticate,
        body,
    }
}

/// A raw call with an optional bearer token, `session_id` header and JSON body.
pub fn call(
    method: &str,
    url: &str,
    token: Option<&str>,
    session: Option<i64>,
    body: Option<Value>,
) -> Answer {
    let mut request = ureq::request(method, url);
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    if let Some(id) = session {
        request = request.set("session_id", &id.to_string());
    }
    answer(match body {
        Some(body) => request
            .set("Content-Type", "application/json")
            .send_string(&body.to_string()),
        None => request.call(),
    })
}

/// Waits until the controller, asked with `token`, lists an ALIVE worker of `task` at
/// `address`.
pub fn wait_for_worker_with(controller: &Server, token: &str, task: &str, address: &str) {
    let url = format!("{}/list_workers", controller.url());
    wait_until(
        &format!("worker {address} of {task}"),
        Duration::from_secs(20),
        || {
            let answer = call("GET", &url, Some(token), None, None);
            answer.status == 200
                && answer.body[task]["workers"].as_object().is_some_and(|w| {
                    w.values()
                        .any(|w| w["address"] == address && w["status"] == "ALIVE")
                })
        },
    );
}

/// POSTs raw bytes as JSON, with an optional `session_id` header.
pub fn post_raw(url: &str, session: Option<&str>, body: &str) -> Answer {
    let mut request = ureq::post(url).set("Content-Type", "application/json");
    if let Some(id) = session {
        request = request.set("session_id", id);
    }
    answer(request.send_string(body))
}

/// POSTs JSON.
pub fn post(url: &str, session: Option<i64>, body: Value) -> Answer {
    post_raw(
        url,
        session.map(|s| s.to_string()).as_deref(),
        &body.to_string(),
    )
}

/// GETs JSON; `Err` on transport errors.
pub fn get(url: &str) -> Result<(u16, Value), String> {
    match ureq::get(url).call() {
        Ok(r) => Ok((r.status(), r.into_json().map_err(|e| e.to_string())?)),
        Err(ureq::Error::Status(code, r)) => Ok((code, r.into_json().unwrap_or(Value::Null))),
        Err(e) => Err(e.to_string()),
    }
}

/// An assistant message calling `name` with `arguments`.
pub fn call_message(id: &str, name: &str, arguments: Value) -> Value {
    json!({"role": "assistant", "content": "", "tool_calls": [{
        "id": id, "type": "function",
        "function": {"name": name, "arguments": arguments.to_string()}
    }]})
}

/// A cheap task: instance `i` is solved by calling `tick()` `1 + i % 3` times; `boom()`
/// panics (to test isolation) and `wait(ms)` sleeps (to test timeouts and cancellation).
#[derive(Default)]
pub struct Countdown;

impl TaskGenerator for Countdown {
    fn version(&self) -> &str {
        "countdown-1"
    }

    fn instance(&self, _split: Split, _difficulty: u8, index: u64) -> Box<dyn Environment> {
        Box::new(CountdownEnv {
            left: 1 + index % 3,
            solved: false,
        })
    }
}

#[derive(Clone)]
pub struct CountdownEnv {
    left: u64,
    solved: bool,
}

impl CountdownEnv {
    fn tools() -> Vec<ToolSchema> {
        vec![
            ToolSchema::new("tick", "Counts one down.", vec![]),
            ToolSchema::new("boom", "Panics.", vec![]),
            ToolSchema::new(
                "wait",
                "Sleeps.",
                vec![Param::required("ms", ParamKind::Integer, "milliseconds")],
            ),
        ]
    }
}

impl Environment for CountdownEnv {
    fn reset(&mut self) -> Reset {
        Reset {
            instruction: format!("Call tick() {} times.", self.left),
            tools: Self::tools(),
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        let tools = Self::tools();
        let checked = agentry_env::tool::find(&tools, call).and_then(|t| t.validate(call));
        if let Err(message) = checked {
            return Step {
                observation: message,
                reward: 0.0,
                status: Status::InvalidAction,
            };
        }
        match call.name.as_str() {
            "boom" => panic!("boom was called"),
            "wait" => {
                let ms = call.arguments["ms"].as_u64().unwrap_or(0);
                std::thread::sleep(Duration::from_millis(ms));
                Step {
                    observation: "waited".into(),
                    reward: 0.0,
                    status: Status::Running,
                }
            }
            _ => {
                self.left -= 1;
                if self.left == 0 {
                    self.solved = true;
                    Step {
                        observation: "done".into(),
                        reward: 1.0,
                        status: Status::Completed,
                    }
                } else {
                    Step {
                        observation: format!("{} to go", self.left),
                        reward: 0.0,
                        status: Status::Running,
                    }
                }
            }
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        (self.left > 0).then(|| ToolCall::new("tick", []))
    }

    fn success(&self) -> bool {
        self.solved
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}

pub fn countdown() -> Arc<dyn TaskGenerator> {
    Arc::new(Countdown)
}
