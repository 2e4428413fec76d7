//! Clients of the controller API: [`ControllerClient`] (blocking, one call per endpoint) and
//! [`RemoteTask`], a [`TaskGenerator`] whose episodes ([`RemoteEnv`]) are played through a
//! controller, so a remote task plugs in wherever a local one does.
//!
//! The client is blocking (ureq, no async runtime), because [`Environment`] is a synchronous
//! trait called from environment threads; it is safe to use and to drop anywhere.
//!
//! # Remote episodes
//!
//! `reset` starts a session (`start_sample`): the instruction is the text of the messages the
//! task sent, the tools are its OpenAI tool list. `step` renders the call as an assistant message
//! in OpenAI's standard form and sends it (`interact`); the observation is the text of the
//! messages that come back, the reward and status are the step's. `success` is the final
//! response's `metrics.success` when the task reports one (Agentry workers do), else whether it
//! completed with a reward of at least 1. `oracle` is `None`: a remote task has no oracle here.
//!
//! **A failure never panics and is never silent.** A session that cannot start, or whose
//! worker fails mid-episode, ends with a [`Status::TaskError`] step whose observation says why,
//! is cancelled on the controller (best effort), and is counted in [`RemoteStats::aborted`].
//!
//! **Forks are replays.** `box_clone` (for Monte-Carlo rollouts from a mid-episode state) cannot
//! copy a session living on another machine. The copy records the calls made so far; on its
//! first use it starts a new session of the same instance and replays them, checking that every
//! observation comes back identical. For a deterministic task (every built-in one) the fork is
//! exact; if the replay diverges, the fork ends with a [`Status::TaskError`] step saying so.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use agentry_env::{
    Environment, RemoteTasks, Reset, Split, Status, Step, TaskGenerator, ToolCall, ToolSchema,
};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::auth::Token;
use crate::protocol::{
    InteractRequest, InteractResponse, MarkStale, SESSION_HEADER, StartRequest, StartResponse,
    TaskIndex, assistant_message, content_text, tools_from_json,
};
use crate::server;

/// Why a controller call failed.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// The controller answered an error status; `message` is its `message` (or the body).
    #[error("the controller answered {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// What it said.
        message: String,
    },
    /// The controller could not be reached, or the connection failed.
    #[error("cannot reach the controller: {0}")]
    Transport(String),
    /// The answer was not what the protocol says.
    #[error("unexpected answer from the controller: {0}")]
    Protocol(String),
    /// The token (`AGENTRY_TOKEN`) is not valid.
    #[error("{0}")]
    Token(String),
}

/// A started session.
#[derive(Clone, Debug, PartialEq)]
pub struct Started {
    /// The session id the controller chose.
    pub session_id: i64,
    /// The first messages.
    pub messages: Vec<Value>,
    /// The OpenAI tool list, if any.
    pub tools: Option<Vec<Value>>,
}

/// A blocking client of a controller's API.
///
/// A client [with a token](ControllerClient::with_token) sends it with every call
/// (`Authorization: Bearer <token>`); a controller that has a token refuses a client without it
/// (401).
#[derive(Clone, Debug)]
pub struct ControllerClient {
    base: String,
    agent: ureq::Agent,
    token: Option<Token>,
}

impl ControllerClient {
    /// A client of the controller at `base` (`http://host:5020/api`), with a 10-minute timeout
    /// per call (a worker may take the controller's 4-minute interaction timeout).
    pub fn new(base: &str) -> ControllerClient {
        ControllerClient::with_timeout(base, Duration::from_secs(600))
    }

    /// A client whose calls give up after `timeout`.
    pub fn with_timeout(base: &str, timeout: Duration) -> ControllerClient {
        let agent = ureq::AgentBuilder::new()
            .timeout(timeout)
            .max_idle_connections_per_host(64)
            .build();
        ControllerClient {
            base: base.trim_end_matches('/').to_string(),
            agent,
            token: None,
        }
    }

    /// The same client, sending `token` with every call (or none).
    pub fn with_token(mut self, token: Option<Token>) -> ControllerClient {
        self.token = token;
        self
    }

    /// A client of the controller at `base` with the token in `AGENTRY_TOKEN`, if it is set
    /// ([`Token::from_env`]).
    ///
    /// # Errors
    /// `AGENTRY_TOKEN` is set but is not a valid token.
    pub fn from_env(base: &str) -> Result<ControllerClient, ClientError> {
        let token = Token::from_env().map_err(ClientError::Token)?;
        Ok(ControllerClient::new(base).with_token(token))
    }

    /// The controller's API base.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A call to `endpoint`, carrying the token if there is one. Every call is built here.
    fn request(&self, method: &str, endpoint: &str) -> ureq::Request {
        let request = self
            .agent
            .request(method, &server::join(&self.base, endpoint));
        match &self.token {
            Some(token) => request.set("Authorization", &format!("Bearer {}", token.secret())),
            None => request,
        }
    }

    fn post(&self, endpoint: &str) -> ureq::Request {
        self.request("POST", endpoint)
    }

    fn get(&self, endpoint: &str) -> ureq::Request {
        self.request("GET", endpoint)
    }

    /// Starts a session of instance `index` of task `name`.
    ///
    /// # Errors
    /// As the controller answers: 400 for an unknown task or index or when no worker is free
    /// (`no workers available`), 500 when the worker failed; and transport errors.
    pub fn start_sample(&self, name: &str, index: &TaskIndex) -> Result<Started, ClientError> {
        let request = StartRequest {
            name: name.to_string(),
            index: index.clone(),
            custom_task: None,
        };
        let response = send(self.post("start_sample").send_json(json!(request)))?;
        let session_id = response
            .header(SESSION_HEADER)
            .and_then(|v| v.trim().parse::<i64>().ok())
            .ok_or_else(|| ClientError::Protocol("no session_id header".into()))?;
        let body: StartResponse = read(response)?;
        Ok(Started {
            session_id,
            messages: body.messages,
            tools: body.tools,
        })
    }

    /// Sends the agent's assistant messages of one turn.
    ///
    /// # Errors
    /// 400 for an unknown or finished session, 500 when the worker failed (the session
    /// stays: the call may be retried), and transport errors.
    pub fn interact(
        &self,
        session_id: i64,
        messages: Vec<Value>,
    ) -> Result<InteractResponse, ClientError> {
        let response = send(
            self.post("interact")
                .set(SESSION_HEADER, &session_id.to_string())
                .send_json(json!(InteractRequest { messages })),
        )?;
        read(response)
    }

    /// Cancels a session; the controller answers at once and stops it in the background.
    ///
    /// # Errors
    /// 400 for an unknown or finished session, and transport errors.
    pub fn cancel(&self, session_id: i64) -> Result<(), ClientError> {
        send(
            self.post("cancel")
                .set(SESSION_HEADER, &session_id.to_string())
                .send_json(json!({})),
        )
        .map(|_| ())
    }

    /// The indices task `name` serves.
    ///
    /// # Errors
    /// 400 for an unknown task, and transport errors.
    pub fn get_indices(&self, name: &str) -> Result<Vec<TaskIndex>, ClientError> {
        let response = send(self.get("get_indices").query("name", name).call())?;
        read(response)
    }

    /// Every task and its workers (`list_workers`), as JSON.
    ///
    /// # Errors
    /// Transport errors.
    pub fn list_workers(&self) -> Result<Value, ClientError> {
        read(send(self.get("list_workers").call())?)
    }

    /// The unfinished sessions (`list_sessions`), as JSON.
    ///
    /// # Errors
    /// Transport errors.
    pub fn list_sessions(&self) -> Result<Value, ClientError> {
        read(send(self.get("list_sessions").call())?)
    }

    /// Marks a worker stale (no new sessions) or fresh again.
    ///
    /// # Errors
    /// 400 for an unknown task or worker, and transport errors.
    pub fn mark_stale(&self, name: &str, worker_id: u32, stale: bool) -> Result<(), ClientError> {
        let body = MarkStale {
            name: name.to_string(),
            worker_id,
            stale,
        };
        send(self.post("mark_stale").send_json(json!(body))).map(|_| ())
    }

    /// The controller's `version`.
    ///
    /// # Errors
    /// Transport errors.
    pub fn version(&self) -> Result<Value, ClientError> {
        read(send(self.get("version").call())?)
    }
}

fn send(result: Result<ureq::Response, ureq::Error>) -> Result<ureq::Response, ClientError> {
    match result {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(status, response)) => {
            let body = response.into_string().unwrap_or_default();
            let message = serde_json::from_str::<Value>(&body)
                .ok()
                .and_then(|v| v.get("message").and_then(Value::as_str).map(String::from))
                .unwrap_or(body);
            Err(ClientError::Http { status, message })
        }
        Err(e) => Err(ClientError::Transport(e.to_string())),
    }
}

fn read<T: DeserializeOwned>(response: ureq::Response) -> Result<T, ClientError> {
    response
        .into_json()
        .map_err(|e| ClientError::Protocol(e.to_string()))
}

/// Counters of a remote task's episodes, shared by all its sessions.
#[derive(Debug, Default)]
pub struct RemoteStats {
    started: AtomicU64,
    finished: AtomicU64,
    aborted: AtomicU64,
}

impl RemoteStats {
    /// Sessions started.
    pub fn started(&self) -> u64 {
        self.started.load(Ordering::Relaxed)
    }

    /// Sessions that reached a final status reported by their worker.
    pub fn finished(&self) -> u64 {
        self.finished.load(Ordering::Relaxed)
    }

    /// Episodes aborted by a failure: a session that could not start, a worker or controller
    /// that failed mid-episode, or a fork whose replay diverged.
    pub fn aborted(&self) -> u64 {
        self.aborted.load(Ordering::Relaxed)
    }
}

/// A task served by workers behind a controller.
///
/// The train and test splits are a partition of the task's advertised indices by content hash
/// (`Split::of_hash` of the index's JSON text: about one in five is test), so a trainer never
/// evaluates on what it trained on, whatever the workers serve. Instance `i` of a split is
/// that split's `i`-th index (modulo their number); a split with no index gives an episode
/// that fails at once, saying so. The difficulty is the workers' to decide (an Agentry worker
/// serves one difficulty, set when it is started), so [`TaskGenerator::instance`] ignores it.
#[derive(Clone, Debug)]
pub struct RemoteTask {
    client: ControllerClient,
    name: String,
    version: String,
    indices: Arc<Vec<TaskIndex>>,
    train: Arc<Vec<TaskIndex>>,
    test: Arc<Vec<TaskIndex>>,
    stats: Arc<RemoteStats>,
}

/// The split of an advertised index: decided from its content, so the splits are disjoint.
fn split_of(index: &TaskIndex) -> Split {
    let text = serde_json::to_string(index).unwrap_or_default();
    Split::of_hash(agentry_env::content_hash::content_hash(&[], &text))
}

impl RemoteTask {
    /// Connects to task `name` on the controller at `base`, reading its indices. The token in
    /// `AGENTRY_TOKEN`, if set, is sent with every call ([`ControllerClient::from_env`]): that
    /// is how a `remote` task of an experiment file reaches a controller that has a token,
    /// with no secret in the file.
    ///
    /// # Errors
    /// If `AGENTRY_TOKEN` is not a valid token, the controller cannot be reached or refuses the
    /// token (401), does not know the task, or the task has no index.
    pub fn connect(base: &str, name: &str) -> Result<RemoteTask, ClientError> {
        RemoteTask::with_client(ControllerClient::from_env(base)?, name)
    }

    /// As [`RemoteTask::connect`], through a configured client.
    ///
    /// # Errors
    /// As [`RemoteTask::connect`].
    pub fn with_client(client: ControllerClient, name: &str) -> Result<RemoteTask, ClientError> {
        let indices: Vec<TaskIndex> = client
            .get_indices(name)?
            .into_iter()
            .filter(|i| !i.is_custom())
            .collect();
        if indices.is_empty() {
            return Err(ClientError::Protocol(format!("task {name} has no index")));
        }
        let (test, train): (Vec<TaskIndex>, Vec<TaskIndex>) = indices
            .iter()
            .cloned()
            .partition(|i| split_of(i) == Split::Test);
        Ok(RemoteTask {
            version: format!("remote:{name}@{}", client.base()),
            client,
            name: name.to_string(),
            indices: Arc::new(indices),
            train: Arc::new(train),
            test: Arc::new(test),
            stats: Arc::default(),
        })
    }

    /// The task's indices, as the controller advertises them.
    pub fn indices(&self) -> &[TaskIndex] {
        &self.indices
    }

    /// The indices of one split (disjoint from the other's).
    pub fn split(&self, split: Split) -> &[TaskIndex] {
        match split {
            Split::Train => &self.train,
            Split::Test => &self.test,
        }
    }

    /// The counters of this task's episodes.
    pub fn stats(&self) -> &RemoteStats {
        &self.stats
    }

    /// The episode of the advertised index `index`.
    pub fn episode(&self, index: TaskIndex) -> RemoteEnv {
        RemoteEnv {
            client: self.client.clone(),
            name: self.name.clone(),
            index,
            stats: self.stats.clone(),
            state: State::Fresh,
            history: Vec::new(),
            success: false,
        }
    }
}

/// Remote tasks over HTTP: what the runtime connects an experiment's `remote = "URL"` tasks
/// through (`RunOptions::remote_tasks`, supplied by the `agentry` crate's CLI and recipes). Each
/// task is a [`RemoteTask`] of the controller at the URL ([`RemoteTask::connect`], so the token
/// in `AGENTRY_TOKEN` is sent when set).
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpRemoteTasks;

impl RemoteTasks for HttpRemoteTasks {
    fn connect(
        &self,
        url: &str,
        name: &str,
    ) -> Result<Box<dyn TaskGenerator>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(Box::new(RemoteTask::connect(url, name)?))
    }
}

impl TaskGenerator for RemoteTask {
    fn version(&self) -> &str {
        &self.version
    }

    fn instance(&self, split: Split, _difficulty: u8, index: u64) -> Box<dyn Environment> {
        let indices = self.split(split);
        if indices.is_empty() {
            let mut env = self.episode(TaskIndex::Int(-1));
            env.state = State::Failed(format!(
                "task {} has no index in the {split:?} split ({} indices in all)",
                self.name,
                self.indices.len()
            ));
            return Box::new(env);
        }
        let position = (index % indices.len() as u64) as usize;
        Box::new(self.episode(indices[position].clone()))
    }

    /// The controller's indices of the split, whatever the difficulty.
    fn instances(&self, split: Split, _difficulty: u8) -> Option<u64> {
        Some(self.split(split).len() as u64)
    }
}

/// One episode of a [`RemoteTask`], played through the controller. See the
/// [module documentation](self).
#[derive(Debug)]
pub struct RemoteEnv {
    client: ControllerClient,
    name: String,
    index: TaskIndex,
    stats: Arc<RemoteStats>,
    state: State,
    /// The calls made so far and their observations, for forks.
    history: Vec<(ToolCall, String)>,
    success: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    /// Not reset yet.
    Fresh,
    /// A fork that has not replayed its history yet.
    Unreplayed,
    /// A live session.
    Live { session_id: i64 },
    /// The episode ended normally.
    Done,
    /// The episode was aborted; the message says why.
    Failed(String),
}

impl RemoteEnv {
    /// The controller's id of the live session, if any.
    pub fn session_id(&self) -> Option<i64> {
        match self.state {
            State::Live { session_id } => Some(session_id),
            _ => None,
        }
    }

    fn start(&mut self) -> Result<Reset, String> {
        let started = self
            .client
            .start_sample(&self.name, &self.index)
            .map_err(|e| format!("the remote session could not start: {e}"))?;
        self.stats.started.fetch_add(1, Ordering::Relaxed);
        // The controller answers 200 with no messages when the task ended during its start.
        if started.messages.is_empty() {
            return Err("the remote task ended while starting".to_string());
        }
        self.state = State::Live {
            session_id: started.session_id,
        };
        Ok(Reset {
            instruction: text_of(&started.messages),
            tools: tools_from_json(started.tools.as_deref().unwrap_or_default()),
        })
    }

    /// Ends the episode with a failure: counted, cancelled on the controller, and a
    /// [`Status::TaskError`] step for the agent.
    fn abort(&mut self, why: String) -> Step {
        if let State::Live { session_id } = self.state {
            let _ = self.client.cancel(session_id);
        }
        self.stats.aborted.fetch_add(1, Ordering::Relaxed);
        self.state = State::Failed(why.clone());
        Step {
            observation: format!("Error: {why}"),
            reward: 0.0,
            status: Status::TaskError,
        }
    }

    fn interact(&mut self, session_id: i64, call: &ToolCall) -> Result<Step, String> {
        let id = format!("call_{}", self.history.len());
        let response = self
            .client
            .interact(session_id, vec![assistant_message(call, &id)])
            .map_err(|e| format!("the remote session failed: {e}"))?;
        let status = response.status.to_status();
        let step = Step {
            observation: text_of(&response.messages),
            reward: response.reward as f32,
            status,
        };
        if response.finish || status.is_terminal() {
            self.stats.finished.fetch_add(1, Ordering::Relaxed);
            self.success = match response.metrics.get("success").and_then(Value::as_bool) {
                Some(success) => success,
                None => status == Status::Completed && response.reward >= 1.0,
            };
            self.state = State::Done;
        }
        Ok(step)
    }

    /// Starts a new session of the same instance and replays the recorded calls.
    fn replay(&mut self) -> Result<(), String> {
        self.start()?;
        let history = std::mem::take(&mut self.history);
        for (i, (call, observation)) in history.iter().enumerate() {
            let State::Live { session_id } = self.state else {
                return Err("the replayed episode ended early".to_string());
            };
            self.history = history[..i].to_vec();
            let step = self.interact(session_id, call)?;
            if step.observation != *observation {
                return Err(format!(
                    "the fork's replay diverged at turn {}: the remote task is not deterministic",
                    i + 1
                ));
            }
        }
        self.history = history;
        Ok(())
    }
}

impl Environment for RemoteEnv {
    fn reset(&mut self) -> Reset {
        if let State::Failed(why) = &self.state {
            self.stats.aborted.fetch_add(1, Ordering::Relaxed);
            return Reset {
                instruction: format!("Error: {why}"),
                tools: Vec::new(),
            };
        }
        match self.start() {
            Ok(reset) => reset,
            Err(why) => {
                let step = self.abort(why);
                Reset {
                    instruction: step.observation,
                    tools: Vec::<ToolSchema>::new(),
                }
            }
        }
    }

    fn step(&mut self, call: &ToolCall) -> Step {
        if self.state == State::Unreplayed
            && let Err(why) = self.replay()
        {
            return self.abort(why);
        }
        match self.state.clone() {
            State::Live { session_id } => match self.interact(session_id, call) {
                Ok(step) => {
                    self.history.push((call.clone(), step.observation.clone()));
                    step
                }
                Err(why) => self.abort(why),
            },
            State::Fresh | State::Unreplayed => Step {
                observation: "Error: the episode has not started (reset first).".into(),
                reward: 0.0,
                status: Status::TaskError,
            },
            State::Done => Step {
                observation: "Error: the episode is over.".into(),
                reward: 0.0,
                status: Status::TaskError,
            },
            State::Failed(why) => Step {
                observation: format!("Error: {why}"),
                reward: 0.0,
                status: Status::TaskError,
            },
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        None
    }

    fn success(&self) -> bool {
        self.success
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        let state = match &self.state {
            State::Live { .. } | State::Unreplayed => State::Unreplayed,
            other => other.clone(),
        };
        Box::new(RemoteEnv {
            client: self.client.clone(),
            name: self.name.clone(),
            index: self.index.clone(),
            stats: self.stats.clone(),
            state,
            history: self.history.clone(),
            success: self.success,
        })
    }
}

impl Drop for RemoteEnv {
    /// An abandoned live session is cancelled, so it does not hold a worker slot until it
    /// expires.
    fn drop(&mut self) {
        if let State::Live { session_id } = self.state {
            let _ = self.client.cancel(session_id);
        }
    }
}

/// The text of messages, one per paragraph.
fn text_of(messages: &[Value]) -> String {
    messages
        .iter()
        .map(content_text)
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}
