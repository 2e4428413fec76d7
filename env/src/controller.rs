//! The environment controller: many environment sessions served concurrently by a fixed pool of
//! worker threads, with per-call timeouts, panic isolation and cancellation.
//!
//! A [`Controller`] owns every live session's environment. A session is started from a
//! `Box<dyn Environment>` ([`Controller::start`], [`Controller::start_many`]), which resets it on
//! a worker and gives it a [`SessionId`]; each agent turn is then a [`Controller::step`], or one
//! [`Controller::step_many`] for all live episodes of a rollout turn, run in parallel on the pool.
//! The API is synchronous and the controller is `Send + Sync`: share it behind an `Arc` to serve
//! it from several threads (an HTTP layer speaking AgentRL's `start_sample` / `interact` /
//! `cancel` maps one to one onto [`Controller::start`], [`Controller::step`] and
//! [`Controller::cancel`], with [`ControllerError::Busy`] as its "task executing" answer).
//!
//! # Invariants
//!
//! - **Nothing an environment does reaches the caller as a panic.** Every call into an
//!   environment (`reset`, `step`, `oracle`, `success`, `box_clone`) runs on a worker under
//!   `catch_unwind`. A panic ends that session: a step or reset answers a [`Step`] with
//!   [`Status::TaskError`] and an observation naming the panic message; `oracle`, `success` and
//!   `fork` answer [`ControllerError::Failed`]. The environment is dropped (its state is not to
//!   be trusted), the worker thread lives on, and other sessions are unaffected.
//! - **A call that runs past the timeout ends its session**, the same way, with an observation
//!   saying it timed out. The clock starts when a worker begins the call, so time spent queued
//!   behind other sessions does not count. The stuck thread is abandoned: a replacement is
//!   spawned at once, so the pool keeps serving with its full number of workers, and the late
//!   result, if it ever comes, is discarded together with the environment.
//! - **Batches answer in input order.** `step_many(calls)[i]` is the answer to `calls[i]`,
//!   whatever order the workers finish in. Each session's own calls run one at a time, in the
//!   order submitted, so a session's transcript does not depend on scheduling: driving sessions
//!   through the controller gives the same transcripts as driving them one after another.
//! - **One call per session at a time.** A call on a session that is already busy (a second
//!   entry for the same id in one batch, or a call from another thread) is answered
//!   [`ControllerError::Busy`] and does not disturb the running call.
//! - **Ended sessions are removed.** A step with a terminal status, a timeout, a panic or a
//!   cancel removes the session and drops its environment; ids are never reused. Later calls on
//!   it get a clear error: [`ControllerError::Finished`] or [`ControllerError::Cancelled`]; an
//!   id never handed out is [`ControllerError::UnknownSession`]. The one exception is
//!   [`Controller::success`], which still answers for a finished session (the worker records
//!   `success()` right after the terminal step), since that is when a trainer asks.
//! - **Cancellation is immediate.** [`Controller::cancel`] removes the session at once; if a call
//!   is in flight its result is discarded when it comes back and that call answers
//!   [`ControllerError::Cancelled`].
//! - **Shutdown** ([`Controller::shutdown`], or dropping the controller) drops every live
//!   session, answers calls still queued with [`ControllerError::ShutDown`], waits (at most one
//!   timeout) for calls in progress, joins the workers and returns; it never waits on abandoned
//!   stuck threads. Every later call answers [`ControllerError::ShutDown`].
//!
//! Bookkeeping per ended session is two bits (cancelled, succeeded), indexed by id.
//!
//! # Threads
//!
//! `workers` threads take jobs from one shared queue (std `mpsc`; no async runtime: environment
//! calls are synchronous, CPU-bound Rust). A job carries the environment itself, moved out of
//! the session table while it runs, so no lock is held during a call. One supervisor thread
//! watches the deadlines of running jobs and abandons and replaces workers that overrun.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::{Environment, Reset, Status, Step, ToolCall};

/// A session's id: handed out by [`Controller::start`] and [`Controller::fork`], increasing,
/// never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why the controller could not serve a call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControllerError {
    /// No session was ever started with this id.
    #[error("unknown session {0}")]
    UnknownSession(SessionId),
    /// The session has ended (terminal status, timeout or panic) and was removed.
    #[error("session {0} has finished")]
    Finished(SessionId),
    /// The session was cancelled.
    #[error("session {0} was cancelled")]
    Cancelled(SessionId),
    /// Another call on this session is in progress.
    #[error("session {0} is busy with another call")]
    Busy(SessionId),
    /// The environment panicked or timed out in `oracle`, `success` or `fork`; the session has
    /// ended. (In `reset` and `step` the same failure is a [`Status::TaskError`] step.)
    #[error("session {id} failed: {message}")]
    Failed {
        /// The session.
        id: SessionId,
        /// What happened.
        message: String,
    },
    /// The controller has been shut down.
    #[error("the controller is shut down")]
    ShutDown,
}

/// How a controller runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Worker threads: how many environment calls run at once (at least 1).
    pub workers: usize,
    /// Longest an environment call (`reset`, `step`, `oracle`, `success`, `box_clone`) may run
    /// once a worker has started it. `Duration::MAX` means no limit.
    pub timeout: Duration,
}

impl Default for ControllerConfig {
    /// One worker per available CPU, and a one-minute timeout.
    fn default() -> Self {
        ControllerConfig {
            workers: thread::available_parallelism().map_or(1, usize::from),
            timeout: Duration::from_secs(60),
        }
    }
}

/// A started session: its id and what `reset` gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Started {
    /// The session's id.
    pub id: SessionId,
    /// The reset, or the [`Status::TaskError`] step of a reset that panicked or timed out; in
    /// that case the session has already ended.
    pub reset: Result<Reset, Step>,
}

/// Counters, for observability.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stats {
    /// Worker threads serving now (the configured number, unless a replacement failed to spawn).
    pub workers: usize,
    /// Abandoned threads still stuck in an environment call.
    pub stuck_threads: usize,
    /// Sessions alive now.
    pub live_sessions: usize,
    /// Sessions started (not counting forks).
    pub started: u64,
    /// Sessions created by [`Controller::fork`].
    pub forked: u64,
    /// Steps answered (including [`Status::TaskError`] steps of timeouts and panics).
    pub steps: u64,
    /// Sessions that ended on their own: terminal status, timeout or panic.
    pub finished: u64,
    /// Sessions cancelled.
    pub cancelled: u64,
    /// Environment calls that timed out.
    pub timeouts: u64,
    /// Environment calls that panicked.
    pub panics: u64,
}

/// Runs environment sessions concurrently on a pool of worker threads. See the
/// [module documentation](self) for its guarantees.
pub struct Controller {
    shared: Arc<Shared>,
    sessions: Mutex<Sessions>,
    supervisor: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Controller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Controller")
            .field("timeout", &self.shared.timeout)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Controller {
    /// Starts `config.workers` worker threads (at least one) and the supervisor.
    ///
    /// # Errors
    /// If a thread cannot be spawned.
    pub fn new(config: ControllerConfig) -> io::Result<Controller> {
        let (jobs, queue) = mpsc::channel();
        let shared = Arc::new(Shared {
            queue: Mutex::new(queue),
            monitor: Mutex::new(Monitor::default()),
            wake: Condvar::new(),
            exits: Condvar::new(),
            shutting_down: AtomicBool::new(false),
            timeout: config.timeout,
        });
        let supervisor = {
            let shared = shared.clone();
            thread::Builder::new()
                .name("agentry-env-supervisor".into())
                .spawn(move || supervise(&shared))?
        };
        let controller = Controller {
            shared: shared.clone(),
            sessions: Mutex::new(Sessions::new(jobs, config.timeout)),
            supervisor: Mutex::new(Some(supervisor)),
        };
        {
            let mut monitor = lock(&shared.monitor);
            for _ in 0..config.workers.max(1) {
                // On failure, dropping `controller` shuts down what was started.
                spawn_worker(&shared, &mut monitor)?;
            }
        }
        Ok(controller)
    }

    /// The timeout of environment calls.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Starts a session: resets `env` on a worker.
    ///
    /// # Errors
    /// [`ControllerError::ShutDown`], or [`ControllerError::Cancelled`] if the new id was
    /// cancelled while resetting.
    pub fn start(&self, env: Box<dyn Environment>) -> Result<Started, ControllerError> {
        self.start_many(vec![env]).remove(0)
    }

    /// Starts many sessions, resetting them in parallel; answers in input order.
    pub fn start_many(
        &self,
        envs: Vec<Box<dyn Environment>>,
    ) -> Vec<Result<Started, ControllerError>> {
        let requests = envs.into_iter().map(Request::New).collect();
        self.execute(requests)
            .into_iter()
            .map(|(id, answer)| {
                let reset = match answer {
                    Ok(Reply::Reset(reset)) => Ok(reset),
                    Ok(_) => unreachable!("a reset job answers a reset"),
                    Err(Failure::Env(message)) => Err(task_error(message)),
                    Err(Failure::Controller(e)) => return Err(e),
                };
                Ok(Started { id, reset })
            })
            .collect()
    }

    /// One agent turn of one session.
    ///
    /// A terminal step ends the session. A panic or a timeout in the environment is answered as
    /// a [`Status::TaskError`] step, and ends the session too.
    ///
    /// # Errors
    /// When the session is unknown, finished, cancelled or busy, or the controller is shut down.
    pub fn step(&self, id: SessionId, call: &ToolCall) -> Result<Step, ControllerError> {
        self.step_many(&[(id, call.clone())]).remove(0)
    }

    /// One agent turn of many sessions, run in parallel; `answer[i]` is the answer to
    /// `calls[i]`. Each entry behaves as [`Controller::step`]; a session named twice gets
    /// [`ControllerError::Busy`] for its second entry.
    pub fn step_many(&self, calls: &[(SessionId, ToolCall)]) -> Vec<Result<Step, ControllerError>> {
        let requests = calls
            .iter()
            .map(|(id, call)| Request::Existing(*id, Op::Step(call.clone())))
            .collect();
        let answers: Vec<Result<Step, ControllerError>> = self
            .execute(requests)
            .into_iter()
            .map(|(_, answer)| match answer {
                Ok(Reply::Step(step, _)) => Ok(step),
                Ok(_) => unreachable!("a step job answers a step"),
                Err(Failure::Env(message)) => Ok(task_error(message)),
                Err(Failure::Controller(e)) => Err(e),
            })
            .collect();
        let served = answers.iter().filter(|a| a.is_ok()).count();
        lock(&self.sessions).counts.steps += served as u64;
        answers
    }

    /// The oracle's next call for a session (`None` when the task has none).
    ///
    /// # Errors
    /// As [`Controller::step`], and [`ControllerError::Failed`] if the environment panicked or
    /// timed out (the session has then ended).
    pub fn oracle(&self, id: SessionId) -> Result<Option<ToolCall>, ControllerError> {
        match self.one(id, Op::Oracle)? {
            Reply::Oracle(call) => Ok(call),
            _ => unreachable!("an oracle job answers an oracle call"),
        }
    }

    /// The oracle's next calls for many sessions, in parallel; `answer[i]` is for `ids[i]`.
    /// Each entry behaves as [`Controller::oracle`].
    pub fn oracle_many(&self, ids: &[SessionId]) -> Vec<Result<Option<ToolCall>, ControllerError>> {
        let requests = ids
            .iter()
            .map(|&id| Request::Existing(id, Op::Oracle))
            .collect();
        self.execute(requests)
            .into_iter()
            .map(|(id, answer)| match answer {
                Ok(Reply::Oracle(call)) => Ok(call),
                Ok(_) => unreachable!("an oracle job answers an oracle call"),
                Err(Failure::Env(message)) => Err(ControllerError::Failed { id, message }),
                Err(Failure::Controller(e)) => Err(e),
            })
            .collect()
    }

    /// Whether a session counts as solved so far. For a session that finished on its own this is
    /// the answer recorded at its terminal step (`false` after a timeout or panic).
    ///
    /// # Errors
    /// As [`Controller::oracle`]; a finished session is not an error here.
    pub fn success(&self, id: SessionId) -> Result<bool, ControllerError> {
        {
            let sessions = lock(&self.sessions);
            if !sessions.live.contains_key(&id) {
                return match sessions.ended_error(id) {
                    ControllerError::Finished(_) => Ok(sessions.succeeded.get(id.0)),
                    e => Err(e),
                };
            }
        }
        match self.one(id, Op::Success)? {
            Reply::Success(success) => Ok(success),
            _ => unreachable!("a success job answers a success call"),
        }
    }

    /// Snapshots a session (`box_clone` on a worker) into a new, independent session with the
    /// same history, for Monte-Carlo rollouts from a mid-episode state.
    ///
    /// # Errors
    /// As [`Controller::oracle`].
    pub fn fork(&self, id: SessionId) -> Result<SessionId, ControllerError> {
        let Reply::Fork(copy) = self.one(id, Op::Fork)? else {
            unreachable!("a fork job answers a fork")
        };
        let mut sessions = lock(&self.sessions);
        if sessions.shut_down {
            drop(sessions);
            discard(copy);
            return Err(ControllerError::ShutDown);
        }
        let new = sessions.new_id();
        sessions.live.insert(new, Slot::Idle(copy));
        sessions.counts.forked += 1;
        Ok(new)
    }

    /// Ends a session and drops its environment. If a call on it is in flight, that call
    /// answers [`ControllerError::Cancelled`] and its result is discarded.
    ///
    /// # Errors
    /// When the session is unknown, finished or already cancelled, or the controller is shut
    /// down.
    pub fn cancel(&self, id: SessionId) -> Result<(), ControllerError> {
        let mut sessions = lock(&self.sessions);
        if sessions.shut_down {
            return Err(ControllerError::ShutDown);
        }
        let Some(slot) = sessions.live.remove(&id) else {
            return Err(sessions.ended_error(id));
        };
        sessions.cancelled.set(id.0);
        sessions.counts.cancelled += 1;
        drop(sessions);
        if let Slot::Idle(env) = slot {
            discard(env);
        }
        Ok(())
    }

    /// The live sessions' ids, in increasing order.
    pub fn sessions(&self) -> Vec<SessionId> {
        let mut ids: Vec<SessionId> = lock(&self.sessions).live.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        let (counts, live_sessions) = {
            let sessions = lock(&self.sessions);
            (sessions.counts.clone(), sessions.live.len())
        };
        let monitor = lock(&self.shared.monitor);
        Stats {
            workers: monitor.serving,
            stuck_threads: monitor.stuck,
            live_sessions,
            ..counts
        }
    }

    /// Shuts down: drops every live session, answers queued calls with
    /// [`ControllerError::ShutDown`], waits at most one timeout for calls in progress, joins the
    /// workers and the supervisor. Abandoned stuck threads are left behind, not waited for.
    /// Idempotent; also done on drop.
    pub fn shutdown(&self) {
        let envs: Vec<Box<dyn Environment>> = {
            let mut sessions = lock(&self.sessions);
            if sessions.shut_down {
                return;
            }
            sessions.shut_down = true;
            self.shared.shutting_down.store(true, Ordering::SeqCst);
            // Workers drain what is queued (answering "shut down"), then see the queue closed.
            sessions.jobs = None;
            sessions
                .live
                .drain()
                .filter_map(|(_, slot)| match slot {
                    Slot::Idle(env) => Some(env),
                    Slot::Busy => None,
                })
                .collect()
        };
        envs.into_iter().for_each(discard);
        let (handles, all_left) = {
            let mut monitor = lock(&self.shared.monitor);
            monitor.shutting_down = true;
            // The supervisor abandons calls that overrun, so this takes at most one timeout.
            monitor = self
                .shared
                .exits
                .wait_timeout_while(monitor, self.shared.timeout, |m| m.serving > 0)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            let handles: Vec<JoinHandle<()>> = monitor.handles.drain().map(|(_, h)| h).collect();
            (handles, monitor.serving == 0)
        };
        for handle in handles {
            // Joining a worker that has left its loop is immediate; one still running after the
            // wait (possible only if that wait timed out) is left detached.
            if all_left || handle.is_finished() {
                let _ = handle.join();
            }
        }
        lock(&self.shared.monitor).stop = true;
        self.shared.wake.notify_all();
        if let Some(supervisor) = lock(&self.supervisor).take() {
            let _ = supervisor.join();
        }
    }

    /// Runs one operation on one existing session.
    fn one(&self, id: SessionId, op: Op) -> Result<Reply, ControllerError> {
        match self.execute(vec![Request::Existing(id, op)]).remove(0).1 {
            Ok(reply) => Ok(reply),
            Err(Failure::Env(message)) => Err(ControllerError::Failed { id, message }),
            Err(Failure::Controller(e)) => Err(e),
        }
    }

    /// Sends the requests to the workers, waits for every answer, settles the sessions, and
    /// answers in input order.
    fn execute(&self, requests: Vec<Request>) -> Vec<(SessionId, Result<Reply, Failure>)> {
        let n = requests.len();
        let mut ids = Vec::with_capacity(n);
        let mut answers: Vec<Option<Result<Reply, Failure>>> = (0..n).map(|_| None).collect();
        let mut sent = Vec::with_capacity(n);
        let (reply, replies) = mpsc::channel();
        {
            let mut sessions = lock(&self.sessions);
            for (tag, request) in requests.into_iter().enumerate() {
                let taken = match request {
                    Request::New(env) => sessions.insert_busy(env),
                    Request::Existing(id, op) => sessions.take(id).map(|env| (id, env, op)),
                };
                match taken {
                    Ok((id, env, op)) => {
                        ids.push(id);
                        let job = Job {
                            tag,
                            env,
                            op,
                            reply: reply.clone(),
                        };
                        // The queue closes only at shutdown, after which nothing is taken;
                        // and its receiver lives as long as the controller. A job that could
                        // not be queued anyway settles below as lost.
                        match &sessions.jobs {
                            Some(jobs) => {
                                if let Err(mpsc::SendError(job)) = jobs.send(job) {
                                    discard(job.env);
                                }
                            }
                            None => discard(job.env),
                        }
                        sent.push(tag);
                    }
                    Err((id, e)) => {
                        ids.push(id);
                        answers[tag] = Some(Err(Failure::Controller(e)));
                    }
                }
            }
        }
        drop(reply);
        let mut outcomes: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
        for _ in 0..sent.len() {
            match replies.recv() {
                Ok((tag, outcome)) => outcomes[tag] = Some(outcome),
                Err(_) => break,
            }
        }
        let mut drops = Vec::new();
        {
            let mut sessions = lock(&self.sessions);
            for tag in sent {
                let outcome = outcomes[tag].take().unwrap_or(Outcome::Lost);
                answers[tag] = Some(sessions.settle(ids[tag], outcome, &mut drops));
            }
        }
        drops.into_iter().for_each(discard);
        ids.into_iter()
            .zip(answers)
            .map(|(id, answer)| {
                let answer = answer.unwrap_or(Err(Failure::Controller(ControllerError::ShutDown)));
                (id, answer)
            })
            .collect()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A step ending the episode because the environment failed.
fn task_error(message: String) -> Step {
    Step {
        observation: message,
        reward: 0.0,
        status: Status::TaskError,
    }
}

/// Drops an environment, containing a panic in its `Drop`.
fn discard<T>(value: T) {
    let _ = catch_unwind(AssertUnwindSafe(move || drop(value)));
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a caller asks for.
enum Request {
    /// A new session: reset it.
    New(Box<dyn Environment>),
    /// An operation on a live session.
    Existing(SessionId, Op),
}

/// An environment call.
enum Op {
    Reset,
    Step(ToolCall),
    Oracle,
    Success,
    Fork,
}

/// An environment call's result.
enum Reply {
    Reset(Reset),
    /// The step, and `success()` right after it when it was terminal.
    Step(Step, Option<bool>),
    Oracle(Option<ToolCall>),
    Success(bool),
    Fork(Box<dyn Environment>),
}

/// How a job ended.
enum Outcome {
    /// The call returned; here is the environment back.
    Done(Box<dyn Environment>, Reply),
    /// The call panicked with this message; the environment was dropped.
    Panicked(String),
    /// The call overran the timeout; the thread was abandoned.
    TimedOut,
    /// The job was still queued at shutdown.
    ShutDown,
    /// No answer came (the worker vanished); not expected to happen.
    Lost,
}

/// Why a request got no reply.
enum Failure {
    /// The environment failed (panic, timeout); the message is the observation.
    Env(String),
    /// The controller refused.
    Controller(ControllerError),
}

struct Job {
    tag: usize,
    env: Box<dyn Environment>,
    op: Op,
    reply: Sender<(usize, Outcome)>,
}

enum Slot {
    /// Waiting for a call.
    Idle(Box<dyn Environment>),
    /// A worker has its environment.
    Busy,
}

/// Counters kept under the session lock.
type Counts = Stats;

/// The session table.
struct Sessions {
    next_id: u64,
    live: HashMap<SessionId, Slot>,
    /// Ended sessions that were cancelled (the others finished).
    cancelled: Bits,
    /// Finished sessions that succeeded.
    succeeded: Bits,
    shut_down: bool,
    jobs: Option<Sender<Job>>,
    counts: Counts,
    /// The timeout, for the observation of a call that overran it.
    timeout: Duration,
}

impl Sessions {
    fn new(jobs: Sender<Job>, timeout: Duration) -> Sessions {
        Sessions {
            next_id: 0,
            live: HashMap::new(),
            cancelled: Bits::default(),
            succeeded: Bits::default(),
            shut_down: false,
            jobs: Some(jobs),
            counts: Counts::default(),
            timeout,
        }
    }

    fn new_id(&mut self) -> SessionId {
        let id = SessionId(self.next_id);
        self.next_id += 1;
        id
    }

    /// The error for a session that is not live.
    fn ended_error(&self, id: SessionId) -> ControllerError {
        if self.shut_down {
            ControllerError::ShutDown
        } else if self.live.contains_key(&id) {
            ControllerError::Busy(id)
        } else if id.0 >= self.next_id {
            ControllerError::UnknownSession(id)
        } else if self.cancelled.get(id.0) {
            ControllerError::Cancelled(id)
        } else {
            ControllerError::Finished(id)
        }
    }

    /// Registers a new, busy session for `env`'s reset.
    #[allow(clippy::type_complexity)]
    fn insert_busy(
        &mut self,
        env: Box<dyn Environment>,
    ) -> Result<(SessionId, Box<dyn Environment>, Op), (SessionId, ControllerError)> {
        if self.shut_down {
            return Err((SessionId(u64::MAX), ControllerError::ShutDown));
        }
        let id = self.new_id();
        self.live.insert(id, Slot::Busy);
        self.counts.started += 1;
        Ok((id, env, Op::Reset))
    }

    /// Takes a live, idle session's environment, marking it busy.
    fn take(
        &mut self,
        id: SessionId,
    ) -> Result<Box<dyn Environment>, (SessionId, ControllerError)> {
        if !self.shut_down
            && let Some(slot) = self.live.get_mut(&id)
            && let Slot::Idle(env) = std::mem::replace(slot, Slot::Busy)
        {
            return Ok(env);
        }
        Err((id, self.ended_error(id)))
    }

    /// Ends a live session on its own (not cancelled).
    fn finish(&mut self, id: SessionId, success: bool) {
        self.live.remove(&id);
        if success {
            self.succeeded.set(id.0);
        }
        self.counts.finished += 1;
    }

    /// Puts a job's outcome into the table and turns it into the caller's answer.
    fn settle(
        &mut self,
        id: SessionId,
        outcome: Outcome,
        drops: &mut Vec<Box<dyn Environment>>,
    ) -> Result<Reply, Failure> {
        let failure = match outcome {
            Outcome::Done(env, reply) => {
                if !matches!(self.live.get(&id), Some(Slot::Busy)) {
                    // Cancelled (or shut down) while the call ran: discard the result.
                    drops.push(env);
                    if let Reply::Fork(copy) = reply {
                        drops.push(copy);
                    }
                    return Err(Failure::Controller(self.ended_error(id)));
                }
                if let Reply::Step(step, success) = &reply
                    && step.done()
                {
                    self.finish(id, success.unwrap_or(false));
                    drops.push(env);
                } else {
                    self.live.insert(id, Slot::Idle(env));
                }
                return Ok(reply);
            }
            Outcome::Panicked(message) => {
                self.counts.panics += 1;
                format!("Error: the environment panicked: {message}. The episode has ended.")
            }
            Outcome::TimedOut => {
                self.counts.timeouts += 1;
                format!(
                    "Error: the environment timed out (no answer within {:?}). The episode has \
                     ended.",
                    self.timeout
                )
            }
            Outcome::Lost => {
                "Error: the environment's worker was lost. The episode has ended.".to_string()
            }
            Outcome::ShutDown => {
                self.live.remove(&id);
                return Err(Failure::Controller(ControllerError::ShutDown));
            }
        };
        if !matches!(self.live.get(&id), Some(Slot::Busy)) {
            return Err(Failure::Controller(self.ended_error(id)));
        }
        self.finish(id, false);
        Err(Failure::Env(failure))
    }
}

/// A growable bit set indexed by session id.
#[derive(Default)]
struct Bits(Vec<u64>);

impl Bits {
    fn set(&mut self, i: u64) {
        let (word, bit) = ((i / 64) as usize, i % 64);
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << bit;
    }

    fn get(&self, i: u64) -> bool {
        let (word, bit) = ((i / 64) as usize, i % 64);
        self.0.get(word).is_some_and(|w| w & (1 << bit) != 0)
    }
}

/// What the workers and the supervisor share.
struct Shared {
    queue: Mutex<Receiver<Job>>,
    monitor: Mutex<Monitor>,
    /// Wakes the supervisor: a job started, or stop.
    wake: Condvar,
    /// Signals that a serving worker left.
    exits: Condvar,
    /// Set at shutdown: queued jobs are answered "shut down" rather than run.
    shutting_down: AtomicBool,
    timeout: Duration,
}

/// A running job's deadline and where its answer goes.
struct Watch {
    deadline: Option<Instant>,
    tag: usize,
    reply: Sender<(usize, Outcome)>,
}

/// The pool's state: whoever removes a job's [`Watch`] (its worker on return, or the
/// supervisor on timeout) owns its answer.
#[derive(Default)]
struct Monitor {
    /// Running jobs by worker.
    running: HashMap<u64, Watch>,
    /// Serving workers' threads (abandoned ones are detached).
    handles: HashMap<u64, JoinHandle<()>>,
    next_worker: u64,
    serving: usize,
    stuck: usize,
    shutting_down: bool,
    stop: bool,
}

fn spawn_worker(shared: &Arc<Shared>, monitor: &mut Monitor) -> io::Result<()> {
    let me = monitor.next_worker;
    let handle = {
        let shared = shared.clone();
        thread::Builder::new()
            .name(format!("agentry-env-worker-{me}"))
            .spawn(move || work(&shared, me))?
    };
    monitor.next_worker += 1;
    monitor.handles.insert(me, handle);
    monitor.serving += 1;
    Ok(())
}

/// A worker's loop: take a job, run it, answer, unless the supervisor abandoned it meanwhile.
fn work(shared: &Shared, me: u64) {
    loop {
        let job = lock(&shared.queue).recv();
        let Ok(Job {
            tag,
            env,
            op,
            reply,
        }) = job
        else {
            break;
        };
        if shared.shutting_down.load(Ordering::SeqCst) {
            let _ = reply.send((tag, Outcome::ShutDown));
            discard(env);
            continue;
        }
        let deadline = Instant::now().checked_add(shared.timeout);
        let first = {
            let mut monitor = lock(&shared.monitor);
            let first = monitor.running.is_empty();
            let watch = Watch {
                deadline,
                tag,
                reply,
            };
            monitor.running.insert(me, watch);
            first
        };
        // Deadlines only grow (start time plus a fixed timeout), so the supervisor needs waking
        // only when it sleeps with nothing to watch.
        if first {
            shared.wake.notify_all();
        }
        let outcome = run(env, op);
        let watch = lock(&shared.monitor).running.remove(&me);
        if let Some(watch) = watch {
            let _ = watch.reply.send((watch.tag, outcome));
        } else {
            // Abandoned: a replacement serves in this thread's place. Discard the late result
            // and leave.
            discard(outcome);
            lock(&shared.monitor).stuck -= 1;
            return;
        }
    }
    lock(&shared.monitor).serving -= 1;
    shared.exits.notify_all();
}

/// Runs one environment call, containing a panic.
fn run(mut env: Box<dyn Environment>, op: Op) -> Outcome {
    let result = catch_unwind(AssertUnwindSafe(|| match op {
        Op::Reset => Reply::Reset(env.reset()),
        Op::Step(call) => {
            let step = env.step(&call);
            let success = step.done().then(|| env.success());
            Reply::Step(step, success)
        }
        Op::Oracle => Reply::Oracle(env.oracle()),
        Op::Success => Reply::Success(env.success()),
        Op::Fork => Reply::Fork(env.box_clone()),
    }));
    match result {
        Ok(reply) => Outcome::Done(env, reply),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(a panic without a message)".to_string());
            discard(payload);
            discard(env);
            Outcome::Panicked(message)
        }
    }
}

/// The supervisor's loop: abandon and replace workers whose job overran its deadline.
fn supervise(shared: &Arc<Shared>) {
    let mut monitor = lock(&shared.monitor);
    loop {
        if monitor.stop {
            return;
        }
        let now = Instant::now();
        let overdue: Vec<u64> = monitor
            .running
            .iter()
            .filter(|(_, w)| w.deadline.is_some_and(|d| d <= now))
            .map(|(&worker, _)| worker)
            .collect();
        for worker in overdue {
            let Some(watch) = monitor.running.remove(&worker) else {
                continue;
            };
            let _ = watch.reply.send((watch.tag, Outcome::TimedOut));
            // Detach the stuck thread; it exits by itself if its call ever returns.
            monitor.handles.remove(&worker);
            monitor.serving -= 1;
            monitor.stuck += 1;
            if monitor.shutting_down {
                shared.exits.notify_all();
            } else {
                // On failure the pool has one worker fewer, which `Stats::workers` shows.
                let _ = spawn_worker(shared, &mut monitor);
            }
        }
        let next = monitor.running.values().filter_map(|w| w.deadline).min();
        monitor = match next {
            Some(deadline) => {
                shared
                    .wake
                    .wait_timeout(monitor, deadline.saturating_duration_since(now))
                    .unwrap_or_else(PoisonError::into_inner)
                    .0
            }
            None => shared
                .wake
                .wait(monitor)
                .unwrap_or_else(PoisonError::into_inner),
        };
    }
}
