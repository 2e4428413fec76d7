//! A task worker: serves one [`TaskGenerator`]'s instances with the worker API of AgentRL's
//! protocol (§3), and heartbeats to a controller (§4.1).
//!
//! # Indices
//!
//! The worker advertises the integer indices `0..instances`; index `i` is instance `i` of the
//! configured split and difficulty (`generator.instance(split, difficulty, i)`). The split
//! defaults to [`Split::Test`], since a worker usually serves held-out instances to an
//! evaluator; a trainer wanting training instances starts a worker with `--split train`.
//! Serving two difficulties means two workers under two task names. Custom tasks (index `-1`)
//! are not offered: an Agentry instance is a pure function of its index.
//!
//! # Episodes on the wire
//!
//! `start_sample` resets the instance and answers one `user` message (the instruction) and the
//! tools in OpenAI's form. Each `interact` takes the agent's assistant messages: the first tool
//! call is stepped and answered by a `tool` message carrying its `tool_call_id`; further calls
//! in the same turn are answered with an error message and not executed (an Agentry turn is one
//! call). A turn without tool calls is parsed as text (`name(arg="value")`). A call that does
//! not parse is an error observation with status `running`, exactly as in the in-process
//! rollout, and counts as a turn; after `max_turns` turns the episode ends with
//! `task limit reached`.
//!
//! Each response's `reward` is that step's reward (built-in tasks reward only the last step,
//! so the final response carries the episode's reward, as AgentRL's trainers read it). The
//! final response's `metric` is `{"success": bool, "return": sum of rewards, "turns": n}`.
//!
//! # Invariants
//!
//! - **Environment code never runs on the async runtime.** Every reset and step goes through
//!   an [`agentry_env::controller::Controller`] (its own thread pool, per-call timeouts, panic
//!   isolation), awaited from `spawn_blocking`; a panicking or hanging environment ends its own
//!   session with `task error`, never the worker.
//! - **The worker counts its own sessions**: a session holds a slot from the moment
//!   `start_sample` is accepted until its final response or its cancellation; `406` is the
//!   answer when every slot is taken.
//! - **A session is removed before its final response is sent**, so a later call on it gets
//!   `400 No such session`, as in the Python worker.
//! - **A malformed message never ends a session**: it gets `500` (as the Python worker's
//!   validation does) and the session waits for a valid one.
//! - **With a [`Token`], no unauthenticated request changes anything**: a request without
//!   `Authorization: Bearer <token>` is answered `401 {"detail"}` before its handler runs; the
//!   worker sends the same token with its heartbeats and cancel notices (`Worker::post`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use agentry_env::controller::{Controller, ControllerConfig, ControllerError, SessionId};
use agentry_env::{Split, Status, Step, TaskGenerator};
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Map, Value, json};

use crate::auth::{self, Token};
use crate::protocol::{
    EnvOut, Heartbeat, SESSION_HEADER, SampleStatus, SessionBody, TaskIndex, WorkerInteractRequest,
    WorkerInteractResponse, WorkerStartRequest, WorkerStatus, parse_calls,
};
use crate::server::{self, Server};

/// How a worker runs.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerConfig {
    /// The task name the controller and its clients use.
    pub name: String,
    /// Where to listen; port 0 picks a free port.
    pub bind: SocketAddr,
    /// The controller's API base (`http://host:5020/api`) to heartbeat to; `None` serves
    /// without a controller (tests, or a client talking to the worker directly).
    pub controller: Option<String>,
    /// The URL advertised in heartbeats (`--self`, ending in `/api`); `None` advertises the
    /// bound address (loopback when bound to all interfaces).
    pub advertise: Option<String>,
    /// Most sessions at once; the next one is refused with 406.
    pub concurrency: usize,
    /// The split instances are drawn from.
    pub split: Split,
    /// The difficulty (1..=3) of every instance.
    pub difficulty: u8,
    /// How many instances are offered: indices `0..instances`.
    pub instances: u64,
    /// The turn limit of an episode (the task's own limits apply too).
    pub max_turns: u32,
    /// Time between heartbeats (AgentRL: 8 s).
    pub heartbeat_every: Duration,
    /// Longest one environment call may run before its session ends with `task error`.
    pub step_timeout: Duration,
    /// Threads stepping environments.
    pub env_threads: usize,
    /// Threads of the HTTP runtime.
    pub http_threads: usize,
    /// The shared bearer token: when set, every request without it is refused (401, changing
    /// nothing), and the worker sends it with its heartbeats and cancel notices.
    pub token: Option<Token>,
}

impl WorkerConfig {
    /// A worker for task `name` on `bind`, with AgentRL's defaults (concurrency 16, heartbeats
    /// every 8 s) and 100 test instances of difficulty 1, 20 turns each.
    pub fn new(name: &str, bind: SocketAddr) -> WorkerConfig {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        WorkerConfig {
            name: name.to_string(),
            bind,
            controller: None,
            advertise: None,
            concurrency: 16,
            split: Split::Test,
            difficulty: 1,
            instances: 100,
            max_turns: 20,
            heartbeat_every: Duration::from_secs(8),
            step_timeout: Duration::from_secs(60),
            env_threads: cpus,
            http_threads: cpus.min(4),
            token: None,
        }
    }
}

/// Starts a worker serving `generator` in the background (on its own runtime); it serves until
/// the returned [`Server`] is dropped. This is how a user's own [`TaskGenerator`] is deployed.
///
/// # Errors
/// If the environment threads or the runtime cannot start, or the address cannot be bound.
pub fn serve(generator: Arc<dyn TaskGenerator>, config: WorkerConfig) -> std::io::Result<Server> {
    let envs = Arc::new(Controller::new(ControllerConfig {
        workers: config.env_threads.max(1),
        timeout: config.step_timeout,
    })?);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(std::io::Error::other)?;
    Server::start(config.bind, config.http_threads, move |addr| {
        let address = config
            .advertise
            .clone()
            .unwrap_or_else(|| server::api_url(addr));
        let state = Arc::new(Worker {
            generator,
            address,
            envs,
            sessions: Mutex::new(HashMap::new()),
            http,
            config,
        });
        let mut jobs = Vec::new();
        if state.config.controller.is_some() {
            jobs.push(heartbeats(state.clone()));
        }
        let token = state.config.token.clone();
        (
            auth::protect(router(state), token.as_ref(), |m| json!({ "detail": m })),
            jobs,
        )
    })
}

/// The routes of the worker API, all under `/api`.
fn router(state: Arc<Worker>) -> Router {
    Router::new()
        .route("/api/start_sample", post(start_sample))
        .route("/api/interact", post(interact))
        .route("/api/cancel", post(cancel))
        .route("/api/cancel_with_notice", post(cancel_with_notice))
        .route("/api/cancel_all", post(cancel_all))
        .route("/api/cancel_all_with_notice", post(cancel_all_with_notice))
        .route("/api/get_sessions", get(get_sessions))
        .route("/api/get_indices", get(get_indices))
        .route("/api/worker_status", get(worker_status))
        .with_state(state)
}

/// The worker's state, shared by its handlers.
struct Worker {
    generator: Arc<dyn TaskGenerator>,
    config: WorkerConfig,
    address: String,
    envs: Arc<Controller>,
    sessions: Mutex<HashMap<i64, Session>>,
    http: reqwest::Client,
}

/// One live session.
struct Session {
    index: TaskIndex,
    /// The environment's session; `None` while it is being reset.
    env: Option<SessionId>,
    /// A reset or step is in flight.
    busy: bool,
    tools: Vec<Value>,
    turns: u32,
    reward: f64,
}

impl Worker {
    fn sessions(&self) -> MutexGuard<'_, HashMap<i64, Session>> {
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn indices(&self) -> Vec<TaskIndex> {
        (0..self.config.instances)
            .map(|i| TaskIndex::Int(i as i64))
            .collect()
    }

    /// Removes a session and ends its environment; false if there was no such session.
    fn cancel(&self, id: i64) -> bool {
        let Some(session) = self.sessions().remove(&id) else {
            return false;
        };
        if let Some(env) = session.env {
            // An in-flight step on it answers `Cancelled`; an ended one is already gone.
            let _ = self.envs.cancel(env);
        }
        true
    }

    /// A POST to `endpoint` of the controller, carrying the token if there is one; `None`
    /// without a controller. Every call to the controller is built here.
    fn post(&self, endpoint: &str) -> Option<reqwest::RequestBuilder> {
        let controller = self.config.controller.as_deref()?;
        let request = self.http.post(server::join(controller, endpoint));
        Some(match &self.config.token {
            Some(token) => request.header(AUTHORIZATION, token.header_value()),
            None => request,
        })
    }

    /// Tells the controller that session `id` has stopped.
    async fn notify(&self, id: i64) {
        let Some(request) = self.post("cancel_notice") else {
            return;
        };
        let sent = request
            .header(SESSION_HEADER, id.to_string())
            .json(&SessionBody { session_id: id })
            .send()
            .await;
        if let Err(e) = sent.and_then(|r| r.error_for_status()) {
            eprintln!("agentry worker: cancel notice for session {id} failed: {e}");
        }
    }
}

/// FastAPI's error shape: `{"detail": "..."}`.
fn detail(code: StatusCode, message: impl Into<String>) -> Response {
    (code, axum::Json(json!({"detail": message.into()}))).into_response()
}

/// A body that is not the expected JSON: FastAPI's 422.
fn unprocessable(e: impl std::fmt::Display) -> Response {
    detail(
        StatusCode::UNPROCESSABLE_ENTITY,
        format!("invalid body: {e}"),
    )
}

fn with_session_header(mut response: Response, id: i64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

fn env_out(messages: Vec<Value>, tools: &[Value], status: SampleStatus) -> EnvOut {
    EnvOut {
        messages,
        tools: Some(tools.to_vec()),
        status,
        finish: status.is_finished(),
        reward: 0.0,
        metric: Map::new(),
    }
}

async fn start_sample(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    let request: WorkerStartRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return unprocessable(e),
    };
    let id = request.session_id;
    let instance = match &request.index {
        TaskIndex::Int(i) if (0..worker.config.instances as i64).contains(i) => *i as u64,
        other => {
            return detail(
                StatusCode::BAD_REQUEST,
                format!(
                    "No such index: {other} (this worker serves 0..{})",
                    worker.config.instances
                ),
            );
        }
    };
    {
        let mut sessions = worker.sessions();
        if sessions.contains_key(&id) {
            return detail(StatusCode::BAD_REQUEST, "Session ID already exists");
        }
        if sessions.len() >= worker.config.concurrency {
            return detail(
                StatusCode::NOT_ACCEPTABLE,
                format!(
                    "Sample concurrency limit reached: {}",
                    worker.config.concurrency
                ),
            );
        }
        sessions.insert(
            id,
            Session {
                index: request.index.clone(),
                env: None,
                busy: true,
                tools: Vec::new(),
                turns: 0,
                reward: 0.0,
            },
        );
    }
    let started = {
        let worker = worker.clone();
        tokio::task::spawn_blocking(move || {
            let (split, difficulty) = (worker.config.split, worker.config.difficulty);
            // Generating an instance is the task's code too: a panic there is a task error.
            let env = catch_unwind(AssertUnwindSafe(|| {
                worker.generator.instance(split, difficulty, instance)
            }))
            .map_err(|_| "the task's instance generator panicked".to_string())?;
            worker.envs.start(env).map_err(|e| e.to_string())
        })
        .await
    };
    let started = match started {
        Ok(Ok(started)) => started,
        failed => {
            let message = match failed {
                Ok(Err(message)) => message,
                _ => "the reset was abandoned".to_string(),
            };
            worker.sessions().remove(&id);
            eprintln!("agentry worker: session {id} failed to start: {message}");
            let out = env_out(Vec::new(), &[], SampleStatus::TaskError);
            return with_session_header(axum::Json(out).into_response(), id);
        }
    };
    let mut sessions = worker.sessions();
    let Some(session) = sessions.get_mut(&id) else {
        // Cancelled while resetting.
        drop(sessions);
        let _ = worker.envs.cancel(started.id);
        let out = env_out(Vec::new(), &[], SampleStatus::Cancelled);
        return with_session_header(axum::Json(out).into_response(), id);
    };
    let out = match started.reset {
        Ok(reset) => {
            let tools: Vec<Value> = reset.tools.iter().map(|t| t.to_json()).collect();
            session.env = Some(started.id);
            session.busy = false;
            session.tools = tools.clone();
            let messages = vec![json!({"role": "user", "content": reset.instruction})];
            env_out(messages, &tools, SampleStatus::Running)
        }
        Err(step) => {
            sessions.remove(&id);
            eprintln!(
                "agentry worker: session {id} failed to reset: {}",
                step.observation
            );
            env_out(Vec::new(), &[], SampleStatus::TaskError)
        }
    };
    with_session_header(axum::Json(out).into_response(), id)
}

async fn interact(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    let request: WorkerInteractRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return unprocessable(e),
    };
    let id = request.session_id;
    let (env, turn) = {
        let mut sessions = worker.sessions();
        let Some(session) = sessions.get_mut(&id) else {
            return detail(StatusCode::BAD_REQUEST, "No such session");
        };
        let Some(env) = session.env.filter(|_| !session.busy) else {
            return detail(
                StatusCode::BAD_REQUEST,
                "Task Executing, please do not send new request.",
            );
        };
        // The Python worker validates every message as an OpenAI assistant message and answers
        // a failure with a plain-text 500; the session is not touched.
        let valid = !request.messages.is_empty()
            && request.messages.iter().all(|m| {
                m.get("role").and_then(Value::as_str) == Some("assistant")
                    && matches!(
                        m.get("content"),
                        None | Some(Value::Null | Value::String(_) | Value::Array(_))
                    )
            });
        if !valid {
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal Server Error: `messages` must be a non-empty list of assistant messages",
            )
                .into_response();
        }
        session.busy = true;
        session.turns += 1;
        (env, session.turns)
    };
    let calls = parse_calls(&request.messages);
    let first = calls[0].call.clone();
    let limit = turn >= worker.config.max_turns;
    let step = {
        let worker = worker.clone();
        tokio::task::spawn_blocking(move || {
            let step = match first {
                Ok(call) => worker.envs.step(env, &call),
                Err(message) => Ok(Step {
                    observation: message,
                    reward: 0.0,
                    status: Status::InvalidAction,
                }),
            };
            let success = match &step {
                Ok(s) if s.done() => worker.envs.success(env).unwrap_or(false),
                Ok(_) if limit => {
                    // The rollout's rule: at the turn limit the episode counts as solved if
                    // the task says so; then it ends.
                    let success = worker.envs.success(env).unwrap_or(false);
                    let _ = worker.envs.cancel(env);
                    success
                }
                _ => false,
            };
            (step, success)
        })
        .await
        .unwrap_or_else(|_| {
            let message = "the step was abandoned".to_string();
            (Err(ControllerError::Failed { id: env, message }), false)
        })
    };
    let (step, success) = match step {
        (Ok(step), success) => (step, success),
        (Err(ControllerError::Cancelled(_)), _) => {
            let out = env_out(Vec::new(), &[], SampleStatus::Cancelled);
            let response = WorkerInteractResponse {
                session_id: id,
                env_out: out,
            };
            return axum::Json(response).into_response();
        }
        (Err(e), _) => (
            Step {
                observation: format!("Error: the environment failed: {e}"),
                reward: 0.0,
                status: Status::TaskError,
            },
            false,
        ),
    };

    let mut status = SampleStatus::from_status(step.status);
    let mut sessions = worker.sessions();
    let Some(session) = sessions.get_mut(&id) else {
        // Cancelled while stepping.
        drop(sessions);
        let response = WorkerInteractResponse {
            session_id: id,
            env_out: env_out(Vec::new(), &[], SampleStatus::Cancelled),
        };
        return axum::Json(response).into_response();
    };
    session.reward += f64::from(step.reward);
    if !status.is_finished() && limit {
        status = SampleStatus::TaskLimitReached;
    }
    let messages: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, call)| {
            let content = if i == 0 {
                step.observation.clone()
            } else {
                "Error: one tool call per turn; this call was not executed.".to_string()
            };
            match &call.id {
                Some(call_id) => {
                    json!({"role": "tool", "content": content, "tool_call_id": call_id})
                }
                None => json!({"role": "user", "content": content}),
            }
        })
        .collect();
    let mut out = env_out(messages, &session.tools, status);
    out.reward = f64::from(step.reward);
    if status.is_finished() {
        out.metric.insert("success".into(), json!(success));
        out.metric.insert("return".into(), json!(session.reward));
        out.metric.insert("turns".into(), json!(turn));
        sessions.remove(&id);
    } else {
        session.busy = false;
    }
    drop(sessions);
    axum::Json(WorkerInteractResponse {
        session_id: id,
        env_out: out,
    })
    .into_response()
}

/// A `{"session_id": N}` body, or FastAPI's 422 for anything else.
fn session_body(body: &Bytes) -> Result<i64, Box<Response>> {
    serde_json::from_slice::<SessionBody>(body)
        .map(|b| b.session_id)
        .map_err(|e| Box::new(unprocessable(e)))
}

async fn cancel(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    let id = match session_body(&body) {
        Ok(id) => id,
        Err(response) => return *response,
    };
    if worker.cancel(id) {
        axum::Json(SessionBody { session_id: id }).into_response()
    } else {
        detail(StatusCode::BAD_REQUEST, "No such session")
    }
}

async fn cancel_with_notice(State(worker): State<Arc<Worker>>, body: Bytes) -> Response {
    let id = match session_body(&body) {
        Ok(id) => id,
        Err(response) => return *response,
    };
    if !worker.sessions().contains_key(&id) {
        return detail(StatusCode::BAD_REQUEST, "No such session");
    }
    tokio::spawn(async move {
        worker.cancel(id);
        worker.notify(id).await;
    });
    axum::Json(SessionBody { session_id: id }).into_response()
}

async fn cancel_all(State(worker): State<Arc<Worker>>) -> Response {
    let ids: Vec<i64> = worker.sessions().keys().copied().collect();
    for id in ids {
        worker.cancel(id);
    }
    axum::Json(Value::Null).into_response()
}

async fn cancel_all_with_notice(State(worker): State<Arc<Worker>>) -> Response {
    let ids: Vec<i64> = worker.sessions().keys().copied().collect();
    tokio::spawn(async move {
        for id in ids {
            if worker.cancel(id) {
                worker.notify(id).await;
            }
        }
    });
    axum::Json(Value::Null).into_response()
}

async fn get_sessions(State(worker): State<Arc<Worker>>) -> Response {
    let sessions: Map<String, Value> = worker
        .sessions()
        .iter()
        .map(|(id, s)| (id.to_string(), json!(s.index)))
        .collect();
    axum::Json(sessions).into_response()
}

async fn get_indices(State(worker): State<Arc<Worker>>) -> Response {
    axum::Json(worker.indices()).into_response()
}

async fn worker_status(State(worker): State<Arc<Worker>>) -> Response {
    axum::Json(WorkerStatus {
        concurrency: worker.config.concurrency,
        current: worker.sessions().len(),
    })
    .into_response()
}

/// Sends a heartbeat every `heartbeat_every`, forever; a failure is logged once until the
/// controller answers again.
async fn heartbeats(worker: Arc<Worker>) {
    let Some(controller) = worker.config.controller.clone() else {
        return;
    };
    let url = server::join(&controller, "receive_heartbeat");
    let heartbeat = Heartbeat {
        name: worker.config.name.clone(),
        address: worker.address.clone(),
        concurrency: worker.config.concurrency as i64,
        indices: worker.indices(),
    };
    let mut failing = false;
    loop {
        let Some(request) = worker.post("receive_heartbeat") else {
            return;
        };
        let sent = request.json(&heartbeat).send().await;
        match sent.and_then(|r| r.error_for_status()) {
            Ok(_) => failing = false,
            Err(e) => {
                if !failing {
                    eprintln!("agentry worker: heartbeat to {url} failed: {e}");
                }
                failing = true;
            }
        }
        tokio::time::sleep(worker.config.heartbeat_every).await;
    }
}

/// The names of the built-in tasks a worker can serve.
pub const BUILTIN_TASKS: [&str; 5] = ["alfworld", "db", "kg", "os", "webshop"];

/// A built-in task's generator (its standard seed) and its turn limit (AgentBench-FC's).
///
/// # Errors
/// An unknown name, with the list of known ones.
pub fn builtin(name: &str) -> Result<(Arc<dyn TaskGenerator>, u32), String> {
    use agentry_env::{alfworld, db, kg, os, webshop};
    Ok(match name {
        "alfworld" => (Arc::new(alfworld::Alfworld::default()), 20),
        "db" => (Arc::new(db::Db::default()), 15),
        "kg" => (Arc::new(kg::Kg::default()), 15),
        "os" => (Arc::new(os::Os::default()), 8),
        "webshop" => (Arc::new(webshop::Webshop::default()), 20),
        other => {
            return Err(format!(
                "unknown task `{other}`; the built-in tasks are {}",
                BUILTIN_TASKS.join(", ")
            ));
        }
    })
}
