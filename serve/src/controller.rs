//! The controller: AgentRL's controller API (§4), routing sessions from trainers and evaluators
//! to the task workers that heartbeat to it.
//!
//! Workers register by heartbeat (`receive_heartbeat`); a client starts a session by task name
//! and index (`start_sample`), plays it (`interact`) and may abandon it (`cancel`). The controller
//! picks the worker, chooses the session id, forwards every call, and keeps per-worker
//! bookkeeping of live sessions. It behaves as the Go controller does (codes, bodies, timeouts),
//! with these documented differences:
//!
//! - A worker counts as ALIVE only once the controller has synchronised with it
//!   (`GET get_sessions`). A new worker whose first heartbeat arrives before it listens (the
//!   Python worker does that, §6) is retried with a short backoff instead of waiting for the
//!   next heartbeat, so it becomes usable within a second of listening, and no session is
//!   routed to a worker that is not listening yet.
//! - A worker that refuses connections is taken out of routing at once (COMA) rather than
//!   after its heartbeat times out, and a call whose connection breaks is followed at once by
//!   a sync with that worker (before the client gets its 500), which does the same if the
//!   worker is gone; its next heartbeat brings it back.
//! - An `interact` body without a `messages` list is answered `400 invalid request` (the Go
//!   controller would forward it as a second `start_sample` and answer 500).
//!
//! # Invariants
//!
//! - **A session is never silently lost.** Every call on a session whose worker fails answers
//!   an error (`500 failed to interact with session`); the session stays until the client
//!   cancels it, it expires, or a sync finds the worker no longer has it.
//! - **The tables are behind one lock that is never held across an await**; every worker call
//!   runs with a timeout, and `cancel` aborts a session's in-flight call.
//! - **Routing only picks ALIVE, non-stale workers heard from within `heartbeat_timeout`**,
//!   the one with the most free capacity; none is `400 no workers available for task X`.
//! - **With a [`Token`], no unauthenticated request changes anything**: a request without
//!   `Authorization: Bearer <token>` is answered `401 {"message"}` before its handler runs,
//!   and every call to a worker carries the token (`Hub::call`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;

use crate::auth::{self, Token};
use crate::protocol::{
    EnvOut, ErrorBody, InteractResponse, MarkStale, SESSION_HEADER, SessionBody, StartRequest,
    StartResponse, TaskIndex, WorkerInteractRequest, WorkerInteractResponse, WorkerStartRequest,
};
use crate::server::{self, Server};

/// The controller's timeouts and address. The defaults are the Go controller's (§6); tests
/// shorten them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Where to listen; port 0 picks a free port.
    pub bind: SocketAddr,
    /// A worker not heard from for this long gets no new sessions (11 s).
    pub heartbeat_timeout: Duration,
    /// A silent worker with no sessions is forgotten after this long (5 min).
    pub worker_remove: Duration,
    /// How often workers and sessions are swept (20 s).
    pub clean_every: Duration,
    /// How often every worker's sessions are compared with the controller's (1 min).
    pub sync_every: Duration,
    /// Longest a worker's `start_sample` or `interact` may take (4 min).
    pub interaction_timeout: Duration,
    /// An idle session is cancelled after this long (5 min).
    pub session_expire: Duration,
    /// A finished session is forgotten after this long (10 min).
    pub session_remove: Duration,
    /// Longest a worker's `cancel`, `cancel_with_notice` or `get_sessions` may take (5 s).
    pub call_timeout: Duration,
    /// Threads of the HTTP runtime.
    pub http_threads: usize,
    /// The shared bearer token: when set, every request without it is refused (401, changing
    /// nothing), and the controller sends it on its calls to workers.
    pub token: Option<Token>,
}

impl ControllerConfig {
    /// The Go controller's defaults, listening on `bind`.
    pub fn new(bind: SocketAddr) -> ControllerConfig {
        ControllerConfig {
            bind,
            heartbeat_timeout: Duration::from_secs(11),
            worker_remove: Duration::from_secs(300),
            clean_every: Duration::from_secs(20),
            sync_every: Duration::from_secs(60),
            interaction_timeout: Duration::from_secs(240),
            session_expire: Duration::from_secs(300),
            session_remove: Duration::from_secs(600),
            call_timeout: Duration::from_secs(5),
            http_threads: std::thread::available_parallelism()
                .map_or(1, usize::from)
                .min(4),
            token: None,
        }
    }
}

/// Starts a controller in the background; it serves until the returned [`Server`] is dropped.
///
/// # Errors
/// If the runtime cannot start or the address cannot be bound (e.g. the port is in use).
pub fn serve(config: ControllerConfig) -> std::io::Result<Server> {
    // Fail now rather than on the first worker call if the client cannot be built.
    reqwest::Client::builder()
        .build()
        .map_err(std::io::Error::other)?;
    let hub = Arc::new(Hub {
        config: config.clone(),
        clients: Mutex::new(BTreeMap::new()),
        tables: Mutex::new(Tables {
            tasks: BTreeMap::new(),
            sessions: BTreeMap::new(),
            next_session: 1,
        }),
    });
    Server::start(config.bind, config.http_threads, move |_| {
        let jobs = vec![
            Box::pin(cleaner(hub.clone())) as std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
            Box::pin(syncer(hub.clone())),
        ];
        let token = hub.config.token.clone();
        (
            auth::protect(router(hub), token.as_ref(), |m| json!({ "message": m })),
            jobs,
        )
    })
}

fn router(hub: Arc<Hub>) -> Router {
    Router::new()
        .route("/api/receive_heartbeat", post(receive_heartbeat))
        .route("/api/cancel_notice", post(cancel_notice))
        .route("/api/start_sample", post(start_sample))
        .route("/api/interact", post(interact))
        .route("/api/cancel", post(cancel))
        .route("/api/cancel_all", post(cancel_all))
        .route("/api/get_indices", get(get_indices))
        .route("/api/list_workers", get(list_workers))
        .route("/api/list_sessions", get(list_sessions))
        .route("/api/mark_stale", post(mark_stale))
        .route("/api/clean_worker", post(clean_worker))
        .route("/api/clean_session", post(clean_session))
        .route("/api/sync_all", post(sync_all))
        .route("/api/version", get(version))
        .with_state(hub)
}

struct Hub {
    config: ControllerConfig,
    /// One HTTP client (connection pool) per worker address; see [`Hub::client`].
    clients: Mutex<BTreeMap<String, reqwest::Client>>,
    tables: Mutex<Tables>,
}

struct Tables {
    tasks: BTreeMap<String, Task>,
    sessions: BTreeMap<i64, Session>,
    next_session: i64,
}

struct Task {
    indices: Vec<TaskIndex>,
    workers: BTreeMap<u32, Worker>,
    next_worker: u32,
}

struct Worker {
    id: u32,
    address: String,
    capacity: i64,
    current: i64,
    last_visit: Instant,
    last_visit_wall: SystemTime,
    /// ALIVE (synchronised and heard from) or COMA.
    alive: bool,
    stale: bool,
    /// A sync is running; heartbeats do not start another.
    syncing: bool,
}

struct Session {
    name: String,
    index: TaskIndex,
    custom_task: Option<Value>,
    start: SystemTime,
    last_update: Instant,
    last_update_wall: SystemTime,
    worker_id: u32,
    /// A `start_sample` or `interact` is in flight.
    interacting: bool,
    cancelling: bool,
    finished: Option<Instant>,
    /// Aborts the in-flight worker call.
    abort: Arc<Notify>,
}

impl Hub {
    fn tables(&self) -> MutexGuard<'_, Tables> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The client for calls to the worker at `address`. Each worker has its own connection
    /// pool so that [`Hub::forget_connections`] can drop one worker's connections: uvicorn
    /// closes a connection after an unhandled error (the Python worker's 500 for a bad
    /// message), and reusing it would fail the next call.
    fn client(&self, address: &str) -> reqwest::Client {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.entry(address.to_string()).or_default().clone()
    }

    /// A call to `endpoint` of the worker at `address`, carrying the token if there is one.
    /// Every call to a worker is built here.
    fn call(&self, method: Method, address: &str, endpoint: &str) -> reqwest::RequestBuilder {
        let request = self
            .client(address)
            .request(method, server::join(address, endpoint));
        match &self.config.token {
            Some(token) => request.header(AUTHORIZATION, token.header_value()),
            None => request,
        }
    }

    /// Drops the pooled connections to a worker after a failed call.
    fn forget_connections(&self, address: &str) {
        let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.remove(address);
    }
}

impl Tables {
    fn worker_mut(&mut self, name: &str, id: u32) -> Option<&mut Worker> {
        self.tasks.get_mut(name)?.workers.get_mut(&id)
    }

    /// Marks a session finished and frees its worker slot; idempotent.
    fn finish(&mut self, id: i64) {
        let Some(session) = self.sessions.get_mut(&id) else {
            return;
        };
        if session.finished.is_some() {
            return;
        }
        session.finished = Some(Instant::now());
        session.interacting = false;
        let (name, worker) = (session.name.clone(), session.worker_id);
        if let Some(w) = self.worker_mut(&name, worker) {
            w.current = (w.current - 1).max(0);
        }
    }

    /// Forgets a session that never properly started.
    fn drop_session(&mut self, id: i64) {
        self.finish(id);
        self.sessions.remove(&id);
    }

    /// A live (unfinished) session.
    fn live(&mut self, id: i64) -> Option<&mut Session> {
        self.sessions.get_mut(&id).filter(|s| s.finished.is_none())
    }

    fn address(&self, name: &str, worker: u32) -> Option<String> {
        Some(self.tasks.get(name)?.workers.get(&worker)?.address.clone())
    }
}

fn message(code: StatusCode, text: impl Into<String>) -> Response {
    (
        code,
        axum::Json(ErrorBody {
            message: text.into(),
        }),
    )
        .into_response()
}

fn null() -> Response {
    axum::Json(Value::Null).into_response()
}

fn with_session_header(mut response: Response, id: i64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&id.to_string()) {
        response.headers_mut().insert(SESSION_HEADER, value);
    }
    response
}

/// The `session_id` header's value, if it is an integer.
fn session_header(headers: &HeaderMap) -> Option<i64> {
    headers
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok())
}

fn invalid_session_id() -> Response {
    message(StatusCode::BAD_REQUEST, "invalid session id")
}

fn invalid_request() -> Response {
    message(StatusCode::BAD_REQUEST, "invalid request")
}

// ------------------------------------------------------------------------------------------
// Called by workers

async fn receive_heartbeat(State(hub): State<Arc<Hub>>, body: Bytes) -> Response {
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&body) else {
        return invalid_request();
    };
    let name = body.get("name").and_then(Value::as_str).unwrap_or_default();
    let address = body
        .get("address")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let concurrency = body.get("concurrency").and_then(Value::as_i64).unwrap_or(0);
    let indices: Vec<TaskIndex> = match body.get("indices") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => match serde_json::from_value(v.clone()) {
            Ok(indices) => indices,
            Err(_) => return invalid_request(),
        },
    };
    if name.is_empty() || indices.is_empty() {
        return message(
            StatusCode::BAD_REQUEST,
            "task name and indices cannot be empty",
        );
    }
    if address.is_empty() {
        return message(StatusCode::BAD_REQUEST, "worker address cannot be empty");
    }
    if concurrency <= 0 {
        return message(
            StatusCode::BAD_REQUEST,
            "worker capacity must be a positive integer",
        );
    }
    let mut tables = hub.tables();
    if let Some(task) = tables.tasks.get(name)
        && !task.workers.is_empty()
        && task.indices != indices
    {
        return message(
            StatusCode::BAD_REQUEST,
            format!("task {name} already exists with different indices"),
        );
    }
    // The same address under another task: that registration is replaced by this one.
    let others: Vec<String> = tables
        .tasks
        .iter()
        .filter(|(n, t)| *n != name && t.workers.values().any(|w| w.address == address))
        .map(|(n, _)| n.clone())
        .collect();
    for other in others {
        if let Some(task) = tables.tasks.get_mut(&other) {
            task.workers.retain(|_, w| w.address != address);
            if task.workers.is_empty() {
                tables.tasks.remove(&other);
            }
        }
    }
    let task = tables
        .tasks
        .entry(name.to_string())
        .or_insert_with(|| Task {
            indices: indices.clone(),
            workers: BTreeMap::new(),
            next_worker: 1,
        });
    if task.workers.is_empty() {
        task.indices = indices;
    }
    let now = (Instant::now(), SystemTime::now());
    let existing = task.workers.values_mut().find(|w| w.address == address);
    let (id, sync) = match existing {
        Some(worker) => {
            worker.capacity = concurrency;
            worker.last_visit = now.0;
            worker.last_visit_wall = now.1;
            let sync = !worker.alive && !worker.syncing;
            worker.syncing |= sync;
            (worker.id, sync)
        }
        None => {
            let id = task.next_worker;
            task.next_worker += 1;
            task.workers.insert(
                id,
                Worker {
                    id,
                    address: address.to_string(),
                    capacity: concurrency,
                    current: 0,
                    last_visit: now.0,
                    last_visit_wall: now.1,
                    alive: false,
                    stale: false,
                    syncing: true,
                },
            );
            (id, true)
        }
    };
    drop(tables);
    if sync {
        let (hub, name) = (hub.clone(), name.to_string());
        tokio::spawn(async move { sync_worker(&hub, &name, id, true).await });
    }
    null()
}

async fn cancel_notice(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    let Some(id) = session_header(&headers) else {
        return invalid_session_id();
    };
    let mut tables = hub.tables();
    if tables.sessions.contains_key(&id) {
        tables.finish(id);
    } else {
        eprintln!("agentry controller: cancel notice for unknown session {id}");
    }
    null()
}

// ------------------------------------------------------------------------------------------
// Called by clients

async fn start_sample(State(hub): State<Arc<Hub>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<StartRequest>(&body) else {
        return invalid_request();
    };
    let custom_task = if request.index.is_custom() {
        match request.custom_task {
            Some(Value::Null) | None => {
                return message(StatusCode::BAD_REQUEST, "no custom task provided");
            }
            task => task,
        }
    } else {
        None
    };
    let name = request.name;
    let (id, index, address, abort) = {
        let mut tables = hub.tables();
        let Some(task) = tables.tasks.get_mut(&name) else {
            return message(
                StatusCode::BAD_REQUEST,
                format!("task {name} does not exist"),
            );
        };
        let Some(index) = resolve_index(&task.indices, &request.index) else {
            return message(
                StatusCode::BAD_REQUEST,
                format!("task {name} does not support index {}", request.index),
            );
        };
        let timeout = hub.config.heartbeat_timeout;
        let Some(worker) = task
            .workers
            .values_mut()
            .filter(|w| {
                w.alive && !w.stale && w.last_visit.elapsed() <= timeout && w.capacity > w.current
            })
            .max_by_key(|w| (w.capacity - w.current, std::cmp::Reverse(w.id)))
        else {
            return message(
                StatusCode::BAD_REQUEST,
                format!("no workers available for task {name}"),
            );
        };
        worker.current += 1;
        let (worker_id, address) = (worker.id, worker.address.clone());
        let id = tables.next_session;
        tables.next_session += 1;
        let abort = Arc::new(Notify::new());
        let now = SystemTime::now();
        tables.sessions.insert(
            id,
            Session {
                name: name.clone(),
                index: index.clone(),
                custom_task: custom_task.clone(),
                start: now,
                last_update: Instant::now(),
                last_update_wall: now,
                worker_id,
                interacting: true,
                cancelling: false,
                finished: None,
                abort: abort.clone(),
            },
        );
        (id, index, (worker_id, address), abort)
    };
    let request = WorkerStartRequest {
        index,
        custom_task,
        session_id: id,
    };
    let call = hub
        .call(Method::POST, &address.1, "start_sample")
        .timeout(hub.config.interaction_timeout)
        .json(&request)
        .send();
    let answer: Result<EnvOut, CallError> = tokio::select! {
        response = call => read_json(response).await,
        () = abort.notified() => Err(CallError::Aborted),
    };
    let answer = answer.and_then(|out| {
        if !out.status.is_finished() && out.messages.is_empty() {
            Err(CallError::Protocol(
                "a running sample with no messages".into(),
            ))
        } else {
            Ok(out)
        }
    });
    let out = match answer {
        Ok(out) => out,
        Err(e) => {
            hub.forget_connections(&address.1);
            {
                let mut tables = hub.tables();
                tables.drop_session(id);
                if e.is_unreachable()
                    && let Some(w) = tables.worker_mut(&name, address.0)
                {
                    w.alive = false;
                }
            }
            eprintln!("agentry controller: session {id} of {name} failed to start: {e}");
            if e.is_transport() {
                // The connection broke: find out now whether the worker is still there.
                sync_worker(&hub, &name, address.0, false).await;
            }
            if matches!(e, CallError::Status(406, _)) {
                let hub = hub.clone();
                tokio::spawn(async move { sync_worker(&hub, &name, address.0, false).await });
            }
            return with_session_header(
                message(StatusCode::INTERNAL_SERVER_ERROR, "failed to start sample"),
                id,
            );
        }
    };
    {
        let mut tables = hub.tables();
        if let Some(session) = tables.sessions.get_mut(&id) {
            session.interacting = false;
            session.last_update = Instant::now();
            session.last_update_wall = SystemTime::now();
        }
        if out.finish || out.status.is_finished() {
            tables.finish(id);
        }
    }
    let body = StartResponse {
        messages: out.messages,
        tools: out.tools,
    };
    with_session_header(axum::Json(body).into_response(), id)
}

/// The index a client asked for, as the task advertises it: an advertised index as is, or
/// (Go's `mapIndicesToInt`) position `i` of the list when the task advertises no integer index
/// other than -1.
fn resolve_index(indices: &[TaskIndex], asked: &TaskIndex) -> Option<TaskIndex> {
    if indices.contains(asked) {
        return Some(asked.clone());
    }
    let all_strings = indices
        .iter()
        .all(|i| matches!(i, TaskIndex::Str(_)) || *i == TaskIndex::Int(-1));
    if !all_strings {
        return None;
    }
    let position = match asked {
        TaskIndex::Int(i) => usize::try_from(*i).ok()?,
        TaskIndex::Str(s) => s.parse::<usize>().ok()?,
    };
    let strings: Vec<&TaskIndex> = indices
        .iter()
        .filter(|i| matches!(i, TaskIndex::Str(_)))
        .collect();
    strings.get(position).map(|i| (*i).clone())
}

async fn interact(State(hub): State<Arc<Hub>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(id) = session_header(&headers) else {
        return invalid_session_id();
    };
    let messages = match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(mut body)) => match body.remove("messages") {
            Some(Value::Array(messages)) => messages,
            _ => {
                return message(
                    StatusCode::BAD_REQUEST,
                    "invalid request: `messages` must be a list of assistant messages",
                );
            }
        },
        _ => return invalid_request(),
    };
    let (name, worker, address, abort) = {
        let mut tables = hub.tables();
        let Some(session) = tables.live(id) else {
            return message(StatusCode::BAD_REQUEST, "session not found");
        };
        if session.interacting || session.cancelling {
            return message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to interact with session",
            );
        }
        session.interacting = true;
        session.last_update = Instant::now();
        session.last_update_wall = SystemTime::now();
        let (name, worker, abort) = (
            session.name.clone(),
            session.worker_id,
            session.abort.clone(),
        );
        let address = tables.address(&name, worker);
        (name, worker, address, abort)
    };
    let answer = match address {
        None => Err(CallError::Protocol("the session's worker is gone".into())),
        Some(address) => {
            let call = hub
                .call(Method::POST, &address, "interact")
                .timeout(hub.config.interaction_timeout)
                .json(&WorkerInteractRequest {
                    session_id: id,
                    messages,
                })
                .send();
            let answer = tokio::select! {
                response = call => read_json::<WorkerInteractResponse>(response).await,
                () = abort.notified() => Err(CallError::Aborted),
            };
            if answer.is_err() {
                hub.forget_connections(&address);
            }
            answer
        }
    };
    let answer = answer.and_then(|r| {
        if !r.env_out.status.is_finished() && r.env_out.messages.is_empty() {
            Err(CallError::Protocol(
                "a running step with no messages".into(),
            ))
        } else {
            Ok(r.env_out)
        }
    });
    let transport_failed = {
        let mut tables = hub.tables();
        if let Some(session) = tables.sessions.get_mut(&id) {
            session.interacting = false;
            session.last_update = Instant::now();
            session.last_update_wall = SystemTime::now();
        }
        match &answer {
            Ok(out) if out.status.is_finished() => tables.finish(id),
            Ok(_) => {}
            Err(e) if e.is_unreachable() => {
                if let Some(w) = tables.worker_mut(&name, worker) {
                    w.alive = false;
                }
            }
            Err(_) => {}
        }
        matches!(answer, Err(CallError::Transport(_)))
    };
    match answer {
        Ok(out) => axum::Json(InteractResponse::from(out)).into_response(),
        Err(e) => {
            eprintln!("agentry controller: session {id} of {name}: interact failed: {e}");
            if transport_failed {
                // The connection broke: find out now whether the worker is still there, so
                // that a dead one leaves routing before the client hears of the failure.
                sync_worker(&hub, &name, worker, false).await;
            }
            message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "failed to interact with session",
            )
        }
    }
}

async fn cancel(State(hub): State<Arc<Hub>>, headers: HeaderMap) -> Response {
    let Some(id) = session_header(&headers) else {
        return invalid_session_id();
    };
    if hub.tables().live(id).is_none() {
        return message(StatusCode::BAD_REQUEST, "session not found");
    }
    begin_cancel(&hub, id);
    null()
}

/// Marks a session cancelling, aborts its in-flight call, and in the background asks its
/// worker to cancel with notice (falling back to a plain cancel and finishing it here).
fn begin_cancel(hub: &Arc<Hub>, id: i64) {
    let address = {
        let mut tables = hub.tables();
        let Some(session) = tables.live(id) else {
            return;
        };
        session.cancelling = true;
        session.abort.notify_one();
        let (name, worker) = (session.name.clone(), session.worker_id);
        tables.address(&name, worker)
    };
    let hub = hub.clone();
    tokio::spawn(async move {
        let body = SessionBody { session_id: id };
        if let Some(address) = &address {
            let with_notice = hub
                .call(Method::POST, address, "cancel_with_notice")
                .timeout(hub.config.call_timeout)
                .json(&body)
                .send()
                .await
                .and_then(|r| r.error_for_status());
            if with_notice.is_ok() {
                // The worker's cancel_notice finishes the session.
                return;
            }
            hub.forget_connections(address);
            let _ = hub
                .call(Method::POST, address, "cancel")
                .timeout(hub.config.call_timeout)
                .json(&body)
                .send()
                .await;
        }
        hub.tables().finish(id);
    });
}

#[derive(Deserialize)]
struct CancelAllQuery {
    name: Option<String>,
    force: Option<bool>,
}

async fn cancel_all(State(hub): State<Arc<Hub>>, Query(query): Query<CancelAllQuery>) -> Response {
    let ids: Vec<i64> = {
        let tables = hub.tables();
        let running: BTreeSet<&str> = tables
            .sessions
            .values()
            .filter(|s| s.finished.is_none())
            .map(|s| s.name.as_str())
            .collect();
        if let Some(name) = &query.name
            && !tables.tasks.contains_key(name)
        {
            return message(
                StatusCode::BAD_REQUEST,
                format!("task {name} does not exist"),
            );
        }
        if query.name.is_none() && running.len() > 1 && query.force != Some(true) {
            return message(
                StatusCode::FORBIDDEN,
                "multiple tasks are running! confirmation required.",
            );
        }
        tables
            .sessions
            .iter()
            .filter(|(_, s)| s.finished.is_none())
            .filter(|(_, s)| query.name.as_ref().is_none_or(|n| *n == s.name))
            .map(|(id, _)| *id)
            .collect()
    };
    for id in ids {
        begin_cancel(&hub, id);
    }
    null()
}

#[derive(Deserialize)]
struct NameQuery {
    name: Option<String>,
}

async fn get_indices(State(hub): State<Arc<Hub>>, Query(query): Query<NameQuery>) -> Response {
    let name = query.name.unwrap_or_default();
    match hub.tables().tasks.get(&name) {
        Some(task) => axum::Json(task.indices.clone()).into_response(),
        None => message(
            StatusCode::BAD_REQUEST,
            format!("task {name} does not exist"),
        ),
    }
}

async fn list_workers(State(hub): State<Arc<Hub>>) -> Response {
    let tables = hub.tables();
    let tasks: Map<String, Value> = tables
        .tasks
        .iter()
        .map(|(name, task)| {
            let workers: Map<String, Value> = task
                .workers
                .values()
                .map(|w| {
                    let locked = tables
                        .sessions
                        .values()
                        .any(|s| s.finished.is_none() && s.interacting && s.worker_id == w.id);
                    let status = if w.alive { "ALIVE" } else { "COMA" };
                    let worker = json!({
                        "id": w.id, "address": w.address, "capacity": w.capacity,
                        "current": w.current, "last_visit": shanghai_time(w.last_visit_wall),
                        "status": status, "stale": w.stale, "locked": locked,
                    });
                    (w.id.to_string(), worker)
                })
                .collect();
            (
                name.clone(),
                json!({"indices": task.indices, "workers": workers}),
            )
        })
        .collect();
    axum::Json(tasks).into_response()
}

async fn list_sessions(State(hub): State<Arc<Hub>>) -> Response {
    let tables = hub.tables();
    let sessions: Map<String, Value> = tables
        .sessions
        .iter()
        .filter(|(_, s)| s.finished.is_none())
        .map(|(id, s)| {
            let session = json!({
                "name": s.name, "index": s.index, "custom_task": s.custom_task,
                "start": shanghai_time(s.start), "last_update": shanghai_time(s.last_update_wall),
                "worker_id": s.worker_id, "locked": s.interacting, "cancelling": s.cancelling,
            });
            (id.to_string(), session)
        })
        .collect();
    axum::Json(sessions).into_response()
}

async fn mark_stale(State(hub): State<Arc<Hub>>, body: Bytes) -> Response {
    let Ok(request) = serde_json::from_slice::<MarkStale>(&body) else {
        return invalid_request();
    };
    let mut tables = hub.tables();
    let Some(task) = tables.tasks.get_mut(&request.name) else {
        return message(
            StatusCode::BAD_REQUEST,
            format!("task {} does not exist", request.name),
        );
    };
    let Some(worker) = task.workers.get_mut(&request.worker_id) else {
        return message(
            StatusCode::BAD_REQUEST,
            format!(
                "worker {} of task {} does not exist",
                request.worker_id, request.name
            ),
        );
    };
    worker.stale = request.stale;
    null()
}

async fn clean_worker(State(hub): State<Arc<Hub>>) -> Response {
    clean_workers(&hub);
    null()
}

async fn clean_session(State(hub): State<Arc<Hub>>) -> Response {
    clean_sessions(&hub);
    null()
}

async fn sync_all(State(hub): State<Arc<Hub>>) -> Response {
    sync_everyone(&hub).await;
    null()
}

async fn version() -> Response {
    // The Go controller's answer, so clients that check it accept this controller.
    axum::Json(json!({"variant": "nova", "version": 1})).into_response()
}

// ------------------------------------------------------------------------------------------
// Worker calls and background jobs

/// Why a call to a worker failed.
#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error("the worker could not be reached: {0}")]
    Unreachable(reqwest::Error),
    #[error("transport error: {0}")]
    Transport(reqwest::Error),
    #[error("the worker answered {0}: {1}")]
    Status(u16, String),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("cancelled")]
    Aborted,
}

impl CallError {
    fn is_unreachable(&self) -> bool {
        matches!(self, CallError::Unreachable(_))
    }

    /// The connection failed after it was made (reset, closed, timed out).
    fn is_transport(&self) -> bool {
        matches!(self, CallError::Transport(_))
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(
    response: Result<reqwest::Response, reqwest::Error>,
) -> Result<T, CallError> {
    let response = response.map_err(|e| {
        if e.is_connect() {
            CallError::Unreachable(e)
        } else {
            CallError::Transport(e)
        }
    })?;
    let status = response.status();
    let body = response.bytes().await.map_err(CallError::Transport)?;
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body).chars().take(300).collect();
        return Err(CallError::Status(status.as_u16(), text));
    }
    serde_json::from_slice(&body).map_err(|e| CallError::Protocol(e.to_string()))
}

/// Compares a worker's sessions with the controller's: sessions the worker no longer has are
/// finished, sessions only the worker has are adopted under their id. A failure takes the
/// worker out of routing; a new worker (`retry`) is retried with a backoff for a few seconds,
/// since it may heartbeat before it listens.
async fn sync_worker(hub: &Arc<Hub>, name: &str, worker: u32, retry: bool) {
    let mut backoff = Duration::from_millis(50);
    let mut waited = Duration::ZERO;
    loop {
        let Some(address) = hub.tables().address(name, worker) else {
            return;
        };
        let answer = hub
            .call(Method::GET, &address, "get_sessions")
            .timeout(hub.config.call_timeout)
            .send()
            .await;
        let answer: Result<BTreeMap<String, TaskIndex>, CallError> = read_json(answer).await;
        if answer.is_err() {
            hub.forget_connections(&address);
        }
        {
            let mut tables = hub.tables();
            match answer {
                Ok(on_worker) => {
                    apply_sync(&mut tables, name, worker, &on_worker);
                    if let Some(w) = tables.worker_mut(name, worker) {
                        w.alive = true;
                        w.syncing = false;
                    }
                    return;
                }
                Err(e) => {
                    let give_up = !retry || waited >= Duration::from_secs(5);
                    if let Some(w) = tables.worker_mut(name, worker) {
                        w.alive = false;
                        w.syncing = !give_up;
                    }
                    if give_up {
                        eprintln!(
                            "agentry controller: worker {worker} of {name} is unreachable: {e}"
                        );
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(backoff).await;
        waited += backoff;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

fn apply_sync(
    tables: &mut Tables,
    name: &str,
    worker: u32,
    on_worker: &BTreeMap<String, TaskIndex>,
) {
    let on_worker: BTreeMap<i64, &TaskIndex> = on_worker
        .iter()
        .filter_map(|(id, index)| Some((id.parse().ok()?, index)))
        .collect();
    let lost: Vec<i64> = tables
        .sessions
        .iter()
        .filter(|(id, s)| {
            s.name == name
                && s.worker_id == worker
                && s.finished.is_none()
                && !s.interacting
                && !on_worker.contains_key(id)
        })
        .map(|(id, _)| *id)
        .collect();
    for id in lost {
        tables.finish(id);
    }
    let now = SystemTime::now();
    for (&id, index) in &on_worker {
        if tables.sessions.contains_key(&id) {
            continue;
        }
        tables.sessions.insert(
            id,
            Session {
                name: name.to_string(),
                index: (*index).clone(),
                custom_task: None,
                start: now,
                last_update: Instant::now(),
                last_update_wall: now,
                worker_id: worker,
                interacting: false,
                cancelling: false,
                finished: None,
                abort: Arc::new(Notify::new()),
            },
        );
        tables.next_session = tables.next_session.max(id + 1);
    }
    let current = tables
        .sessions
        .values()
        .filter(|s| s.name == name && s.worker_id == worker && s.finished.is_none())
        .count() as i64;
    if let Some(w) = tables.worker_mut(name, worker) {
        w.current = current;
    }
}

async fn sync_everyone(hub: &Arc<Hub>) {
    let workers: Vec<(String, u32)> = hub
        .tables()
        .tasks
        .iter()
        .flat_map(|(name, task)| {
            task.workers
                .values()
                .filter(|w| w.alive)
                .map(|w| (name.clone(), w.id))
        })
        .collect();
    for (name, worker) in workers {
        sync_worker(hub, &name, worker, false).await;
    }
}

/// Silent workers leave routing; silent idle ones are forgotten, and a task with them.
fn clean_workers(hub: &Hub) {
    let config = &hub.config;
    let mut tables = hub.tables();
    for task in tables.tasks.values_mut() {
        for worker in task.workers.values_mut() {
            if worker.last_visit.elapsed() > config.heartbeat_timeout {
                worker.alive = false;
            }
        }
        task.workers.retain(|_, w| {
            w.alive || w.current > 0 || w.last_visit.elapsed() <= config.worker_remove
        });
    }
    tables.tasks.retain(|_, task| !task.workers.is_empty());
}

/// Idle sessions are cancelled; long-finished ones are forgotten.
fn clean_sessions(hub: &Arc<Hub>) {
    let config = &hub.config;
    let expired: Vec<i64> = {
        let mut tables = hub.tables();
        tables.sessions.retain(|_, s| {
            s.finished
                .is_none_or(|at| at.elapsed() <= config.session_remove)
        });
        tables
            .sessions
            .iter()
            .filter(|(_, s)| {
                s.finished.is_none()
                    && !s.interacting
                    && !s.cancelling
                    && s.last_update.elapsed() > config.session_expire
            })
            .map(|(id, _)| *id)
            .collect()
    };
    for id in expired {
        begin_cancel(hub, id);
    }
}

async fn cleaner(hub: Arc<Hub>) {
    loop {
        tokio::time::sleep(hub.config.clean_every).await;
        clean_workers(&hub);
        clean_sessions(&hub);
    }
}

async fn syncer(hub: Arc<Hub>) {
    loop {
        tokio::time::sleep(hub.config.sync_every).await;
        sync_everyone(&hub).await;
    }
}

/// `YYYY-MM-DD HH:MM:SS` in Asia/Shanghai (UTC+8, no daylight saving), as the Go controller
/// prints times.
fn shanghai_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
        + 8 * 3600;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_printed_in_shanghai() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(shanghai_time(t), "2023-11-15 06:13:20");
        assert_eq!(shanghai_time(SystemTime::UNIX_EPOCH), "1970-01-01 08:00:00");
    }

    #[test]
    fn string_indices_accept_positions() {
        let indices = vec![TaskIndex::Str("a".into()), TaskIndex::Str("b".into())];
        assert_eq!(
            resolve_index(&indices, &TaskIndex::Int(1)),
            Some(TaskIndex::Str("b".into()))
        );
        assert_eq!(
            resolve_index(&indices, &TaskIndex::Str("0".into())),
            Some(TaskIndex::Str("a".into()))
        );
        assert_eq!(resolve_index(&indices, &TaskIndex::Int(2)), None);
        let ints = vec![TaskIndex::Int(0), TaskIndex::Int(1)];
        assert_eq!(resolve_index(&ints, &TaskIndex::Str("1".into())), None);
        assert_eq!(
            resolve_index(&ints, &TaskIndex::Int(1)),
            Some(TaskIndex::Int(1))
        );
    }
}
