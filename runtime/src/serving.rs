//! Serving a policy to chat clients: an [`Engine`] thread owns the weights and answers
//! conversations with continuous batching ([`ContinuousBatch`]), rendering them and reading
//! the replies' tool calls exactly as training does ([`ChatFormat`]). It knows no HTTP: the
//! `agentry` crate puts it behind `agentry-serve`'s OpenAI server, and the serving benchmark
//! calls it directly.
//!
//! A served conversation is rendered as an episode: the first user message is the instruction,
//! the tools (when shown) go where training puts them, each assistant message is the policy's
//! turn and each tool message (or later user message) an observation. So a policy answers a
//! client as it acted in training, and an assistant message the engine itself generated is
//! rendered back from the very tokens it generated ([`Engine`] remembers the latest replies),
//! not re-tokenized from its text.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::thread::JoinHandle;

use agentry_env::{Reset, ToolCall, ToolSchema};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use burn::backend::Flex;

use crate::export::{ExportError, trained_policy};
use crate::model::batch::{Request, Sampled};
use crate::model::hf::HfConfig;
use crate::model::{ContinuousBatch, End, Kernels, Policy, Sampling};
use crate::model::{LoadError, Pretrained};
use crate::text::{ChatFormat, Transcript};

/// A policy to serve, with its chat format and the name clients ask for it by.
#[derive(Debug)]
pub struct Served {
    /// The policy, on flex.
    pub policy: Policy<Flex>,
    /// How conversations become its tokens.
    pub chat: ChatFormat,
    /// Its name: the run directory's `EXPERIMENT/RUN-ID`, the checkpoint folder's name or the
    /// GGUF file's stem.
    pub name: String,
}

/// Why a model could not be loaded for serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeLoadError {
    /// A run directory's weights could not be read.
    #[error(transparent)]
    Run(#[from] ExportError),
    /// A pretrained checkpoint could not be read.
    #[error(transparent)]
    Pretrained(#[from] LoadError),
    /// The path is none of the three.
    #[error(
        "`{0}` is not a run directory (experiment.json), a Hugging Face checkpoint folder \
         (config.json) or a GGUF file (.gguf)"
    )]
    Unknown(std::path::PathBuf),
}

/// Loads what `path` holds: a run directory (its policy at RL step `step`, default the
/// final weights), a Hugging Face checkpoint folder or a GGUF file.
///
/// # Errors
/// If `path` is none of these, or its files cannot be read.
pub fn load_served(path: &std::path::Path, step: Option<u64>) -> Result<Served, ServeLoadError> {
    // A folder's whole name, a file's without its extension.
    let stem = |p: &std::path::Path| {
        let name = if p.is_dir() {
            p.file_name()
        } else {
            p.file_stem()
        };
        name.map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    };
    let device = Default::default();
    if path.join("experiment.json").is_file() {
        let (run, policy) = trained_policy(path, step)?;
        let name = match path.parent() {
            Some(parent) if parent.file_name().is_some() => {
                format!("{}/{}", stem(parent), stem(path))
            }
            _ => stem(path),
        };
        return Ok(Served {
            policy,
            chat: ChatFormat::new(run.tokenizer().map_err(ExportError::from)?.clone()),
            name,
        });
    }
    let pretrained = if path.join("config.json").is_file() {
        let declared = HfConfig::load(path)?.model_type;
        Pretrained::<Flex>::load(path, declared, &device)?
    } else if path.is_file() && path.extension().is_some_and(|e| e == "gguf") {
        Pretrained::<Flex>::from_gguf(path, &device)?
    } else {
        return Err(ServeLoadError::Unknown(path.to_path_buf()));
    };
    Ok(Served {
        policy: pretrained.policy,
        chat: ChatFormat::new(pretrained.tokenizer),
        name: stem(path),
    })
}

/// A message of a served conversation.
#[derive(Clone, Debug, PartialEq)]
pub enum ChatMessage {
    /// Instructions, placed before the tools' text in the system message.
    System(String),
    /// The user: the first is the instruction, later ones are rendered as observations.
    User(String),
    /// The model's turn: its text, or the calls it made.
    Assistant {
        /// Its text.
        content: String,
        /// Its calls (id, call).
        calls: Vec<(String, ToolCall)>,
    },
    /// A tool's answer to the call `call_id`.
    Tool {
        /// The call it answers.
        call_id: String,
        /// The answer.
        content: String,
    },
}

/// A conversation to continue, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatJob {
    /// The conversation so far; it ends with a user or tool message.
    pub messages: Vec<ChatMessage>,
    /// The tools shown to the policy (none: no tools shown, replies are text).
    pub tools: Vec<ToolSchema>,
    /// Softmax temperature; 0 decodes greedily.
    pub temperature: f32,
    /// Nucleus sampling mass (1 disables it).
    pub top_p: f32,
    /// Most tokens per reply (default: what the context leaves).
    pub max_tokens: Option<usize>,
    /// Texts that end a reply (not included in it).
    pub stop: Vec<String>,
    /// The seed of the replies' randomness (default: drawn from the engine's seed).
    pub seed: Option<u64>,
    /// Replies to generate (each with its own random stream).
    pub n: usize,
    /// Alternatives to report per token; `None` reports no log-probabilities.
    pub top_logprobs: Option<usize>,
    /// Force a call of this tool (one of `tools`): each reply starts with the call's beginning
    /// in the policy's call form ([`agentry_env::ToolCallFormat::call_prefix`]) and the policy writes the
    /// arguments. They may still not parse, and the reply is then text.
    pub forced_call: Option<String>,
}

/// A generated token, for clients that asked for log-probabilities.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenInfo {
    /// Its text.
    pub text: String,
    /// Its log-probability under the tempered distribution (what training records).
    pub logprob: f32,
    /// The most likely tokens' texts and log-probabilities.
    pub top: Vec<(String, f32)>,
}

/// Why a reply ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// The end token or a stop text.
    Stop,
    /// `max_tokens` or the context.
    Length,
    /// It is a tool call.
    ToolCalls,
}

/// Progress of a job's replies, in order; [`ChatEvent::Finished`] comes last (should the
/// engine stop first, the sink is dropped without it).
#[derive(Clone, Debug, PartialEq)]
pub enum ChatEvent {
    /// More text of reply `index` (final: never part of a stop text or of a call).
    Delta {
        /// The reply.
        index: usize,
        /// Its new text (may be empty when only tokens advance).
        text: String,
        /// The tokens since the last delta, when log-probabilities were asked for.
        tokens: Vec<TokenInfo>,
    },
    /// Reply `index` ended.
    Done {
        /// The reply.
        index: usize,
        /// Why.
        finish: Finish,
        /// Its call (id, call), with [`Finish::ToolCalls`].
        calls: Vec<(String, ToolCall)>,
    },
    /// Every reply ended.
    Finished {
        /// Tokens of the rendered conversation.
        prompt_tokens: usize,
        /// Tokens generated over all replies.
        completion_tokens: usize,
    },
}

/// Where a job's events go; returns `false` once nobody listens (the job is then cancelled).
pub type Sink = Box<dyn FnMut(ChatEvent) -> bool + Send>;

/// Why a job was not started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full.
    Busy,
    /// The engine has stopped.
    Stopped,
    /// The job cannot be served as asked.
    Invalid {
        /// What is wrong.
        message: String,
        /// The request parameter at fault, in the OpenAI API's names.
        param: Option<&'static str>,
        /// A machine-readable code.
        code: Option<&'static str>,
    },
}

/// How an engine batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Most replies decoded together.
    pub max_batch: usize,
    /// Most jobs waiting for room in the batch before [`Refused::Busy`].
    pub queue: usize,
    /// The seed of replies whose job names none.
    pub seed: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            max_batch: 16,
            queue: 64,
            seed: 0,
        }
    }
}

/// A thread serving one policy; see the module docs. Dropping it stops the thread once the
/// jobs under way are answered.
pub struct Engine {
    jobs: Option<SyncSender<Admitted>>,
    thread: Option<JoinHandle<()>>,
    chat: ChatFormat,
    context: usize,
    memo: std::sync::Arc<std::sync::Mutex<Memo>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

/// A job rendered and checked, waiting for the batch.
struct Admitted {
    prompt: Vec<u32>,
    job: ChatJob,
    sink: Sink,
}

impl Engine {
    /// Starts the thread that owns `policy` (use an inference backend).
    pub fn start<B: Kernels>(policy: Policy<B>, chat: ChatFormat, options: EngineOptions) -> Self
    where
        Policy<B>: Send + 'static,
    {
        let (jobs, queue) = sync_channel(options.queue.max(1));
        let context = policy.context;
        let memo = std::sync::Arc::new(std::sync::Mutex::new(Memo::default()));
        let worker = Worker {
            chat: chat.clone(),
            memo: memo.clone(),
            options,
        };
        let thread = std::thread::Builder::new()
            .name("agentry-engine".into())
            .spawn(move || worker.run(&policy, queue))
            .expect("cannot start the engine thread");
        Engine {
            jobs: Some(jobs),
            thread: Some(thread),
            chat,
            context,
            memo,
        }
    }

    /// The policy's context, in tokens.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Renders `job`'s conversation and queues it; its events go to `sink` (from the engine
    /// thread).
    ///
    /// # Errors
    /// [`Refused::Invalid`] for a conversation the chat format cannot render or that leaves
    /// no room in the context, [`Refused::Busy`] when the queue is full.
    pub fn submit(&self, job: ChatJob, sink: Sink) -> Result<(), Refused> {
        let prompt = self.render(&job)?;
        let jobs = self.jobs.as_ref().ok_or(Refused::Stopped)?;
        match jobs.try_send(Admitted { prompt, job, sink }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(Refused::Busy),
            Err(TrySendError::Disconnected(_)) => Err(Refused::Stopped),
        }
    }

    /// The tokens `job`'s conversation renders to, ending with the assistant header.
    ///
    /// # Errors
    /// As [`Engine::submit`].
    pub fn render(&self, job: &ChatJob) -> Result<Vec<u32>, Refused> {
        let memo = self.memo.lock().unwrap_or_else(|e| e.into_inner());
        let mut transcript = render(&self.chat, &job.messages, &job.tools, &memo)?;
        if let Some(name) = &job.forced_call {
            if !job.tools.iter().any(|t| &t.name == name) {
                return Err(Refused::Invalid {
                    message: format!("the forced call `{name}` is not among the tools"),
                    param: Some("tool_choice"),
                    code: None,
                });
            }
            let prefix = self.chat.call_format().call_prefix(name);
            transcript
                .tokens
                .extend(self.chat.tokenizer().encode(&prefix));
        }
        let len = transcript.tokens.len();
        if len >= self.context {
            return Err(Refused::Invalid {
                message: format!(
                    "the conversation renders to {len} tokens; the model's context is {}",
                    self.context
                ),
                param: Some("messages"),
                code: Some("context_length_exceeded"),
            });
        }
        Ok(transcript.tokens)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.jobs.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// An invalid conversation.
fn invalid(message: impl Into<String>) -> Refused {
    Refused::Invalid {
        message: message.into(),
        param: Some("messages"),
        code: None,
    }
}

/// Renders a conversation as an episode (see the module docs).
fn render(
    chat: &ChatFormat,
    messages: &[ChatMessage],
    tools: &[ToolSchema],
    memo: &Memo,
) -> Result<Transcript, Refused> {
    let mut rest = messages;
    let system = match rest.first() {
        Some(ChatMessage::System(s)) => {
            rest = &rest[1..];
            Some(s.as_str())
        }
        _ => None,
    };
    // The instruction: the leading user messages (several are joined by a line break).
    let users = rest
        .iter()
        .take_while(|m| matches!(m, ChatMessage::User(_)))
        .count();
    if users == 0 {
        return Err(invalid(
            "the conversation must start with a user message (after an optional system message)",
        ));
    }
    let instruction: Vec<&str> = rest[..users]
        .iter()
        .map(|m| match m {
            ChatMessage::User(text) => text.as_str(),
            _ => unreachable!("counted user messages"),
        })
        .collect();
    let reset = Reset {
        instruction: instruction.join("\n"),
        tools: tools.to_vec(),
    };
    let mut transcript = chat.begin_with_system(system, &reset);
    // What answers the last assistant turn (tool answers and user messages, joined), not yet
    // rendered.
    let mut pending: Vec<&str> = Vec::new();
    let mut assistant_last = false;
    for (i, message) in rest.iter().enumerate().skip(users) {
        match message {
            ChatMessage::System(_) => {
                return Err(invalid(format!(
                    "message {i} is a system message; one may only come first"
                )));
            }
            ChatMessage::User(text) | ChatMessage::Tool { content: text, .. } => {
                pending.push(text);
                assistant_last = false;
            }
            ChatMessage::Assistant { content, calls } => {
                if assistant_last {
                    return Err(invalid(format!(
                        "messages {} and {i} are both the assistant's",
                        i - 1
                    )));
                }
                if !pending.is_empty() {
                    chat.push_observation(&mut transcript, &pending.join("\n"));
                    pending.clear();
                }
                let tokens = memo
                    .tokens_of(content, calls)
                    .unwrap_or_else(|| reply_tokens(chat, content, calls));
                chat.push_agent(&mut transcript, &tokens);
                assistant_last = true;
            }
        }
    }
    if assistant_last {
        return Err(invalid(
            "the conversation ends with an assistant message; it must end with a user or tool \
             message for the model to answer",
        ));
    }
    if !pending.is_empty() {
        chat.push_observation(&mut transcript, &pending.join("\n"));
    }
    Ok(transcript)
}

/// The tokens of an assistant message the engine did not generate (or no longer remembers):
/// its call rendered in the policy's call form, else its text, then the end token.
fn reply_tokens(chat: &ChatFormat, content: &str, calls: &[(String, ToolCall)]) -> Vec<u32> {
    match calls.first() {
        Some((_, call)) => chat.demo_turn(call),
        None => {
            let mut tokens = chat.tokenizer().encode(content);
            tokens.push(chat.end_token());
            tokens
        }
    }
}

/// The latest replies' tokens, by what a client sends back for them, so a conversation
/// continued through the API renders each reply as generated.
#[derive(Default)]
struct Memo {
    tokens: HashMap<String, Vec<u32>>,
    order: VecDeque<String>,
}

/// Replies remembered.
const MEMO_CAPACITY: usize = 4096;

impl Memo {
    fn key(content: &str, calls: &[(String, ToolCall)]) -> String {
        let calls: Vec<_> = calls
            .iter()
            .map(|(_, c)| {
                (
                    c.name.as_str(),
                    serde_json::Value::Object(c.arguments.clone()),
                )
            })
            .collect();
        serde_json::json!([content, calls]).to_string()
    }

    fn tokens_of(&self, content: &str, calls: &[(String, ToolCall)]) -> Option<Vec<u32>> {
        self.tokens.get(&Self::key(content, calls)).cloned()
    }

    fn remember(&mut self, content: &str, calls: &[(String, ToolCall)], tokens: Vec<u32>) {
        let key = Self::key(content, calls);
        if self.tokens.insert(key.clone(), tokens).is_none() {
            self.order.push_back(key);
            if self.order.len() > MEMO_CAPACITY
                && let Some(old) = self.order.pop_front()
            {
                self.tokens.remove(&old);
            }
        }
    }
}

/// The engine thread's state.
struct Worker {
    chat: ChatFormat,
    memo: std::sync::Arc<std::sync::Mutex<Memo>>,
    options: EngineOptions,
}

/// A job under way.
struct Live {
    job: ChatJob,
    /// The forced call's beginning, which every reply starts with (empty when none), as text
    /// and as the tokens that end the prompt.
    prefix: (String, Vec<u32>),
    sink: Sink,
    prompt_tokens: usize,
    /// Per reply: its tokens, the text already sent, and the tokens not yet reported.
    replies: Vec<Reply>,
    open: usize,
    generated: usize,
    listening: bool,
}

#[derive(Default)]
struct Reply {
    tokens: Vec<u32>,
    sent: usize,
    unreported: Vec<TokenInfo>,
    done: bool,
}

impl Worker {
    fn run<B: Kernels>(self, policy: &Policy<B>, queue: Receiver<Admitted>) {
        let mut master = ChaCha8Rng::seed_from_u64(self.options.seed);
        let mut batch = ContinuousBatch::<B, (u64, usize), ChaCha8Rng>::new(policy);
        let mut live: HashMap<u64, Live> = HashMap::new();
        let mut next_id = 0u64;
        // The job taken from the queue that the batch had no room for yet. Jobs are taken only
        // when there is room, so the queue's bound is what holds the waiting ones (and what
        // answers `Busy`).
        let mut waiting: Option<Admitted> = None;
        loop {
            // Wait for work when idle.
            if batch.is_empty() && waiting.is_none() {
                match queue.recv() {
                    Ok(job) => waiting = Some(job),
                    Err(_) => return,
                }
            }
            let mut requests = Vec::new();
            loop {
                let room = self
                    .options
                    .max_batch
                    .max(1)
                    .saturating_sub(batch.len() + requests.len());
                if room == 0 {
                    break;
                }
                let next = match waiting.take() {
                    Some(job) => job,
                    None => match queue.try_recv() {
                        Ok(job) => job,
                        Err(_) => break,
                    },
                };
                // A job larger than the whole batch goes alone.
                if next.job.n > room && !(batch.is_empty() && requests.is_empty()) {
                    waiting = Some(next);
                    break;
                }
                let Admitted { prompt, job, sink } = next;
                let id = next_id;
                next_id += 1;
                for index in 0..job.n {
                    requests.push(self.request(
                        id,
                        index,
                        &prompt,
                        &job,
                        policy.context,
                        &mut master,
                    ));
                }
                live.insert(
                    id,
                    Live {
                        replies: (0..job.n).map(|_| Reply::default()).collect(),
                        open: job.n,
                        prompt_tokens: prompt.len(),
                        prefix: self.prefix(&job),
                        generated: 0,
                        listening: true,
                        job,
                        sink,
                    },
                );
            }
            if !requests.is_empty() {
                let first = batch.admit(requests);
                self.dispatch(first, &mut live, &mut batch);
            }
            let next = batch.step();
            self.dispatch(next, &mut live, &mut batch);
            // Jobs all of whose replies ended, or nobody listens to, leave.
            live.retain(|&id, job| {
                if job.open == 0 || !job.listening {
                    if job.listening {
                        let prompt_tokens = job.prompt_tokens;
                        let completion_tokens = job.generated;
                        (job.sink)(ChatEvent::Finished {
                            prompt_tokens,
                            completion_tokens,
                        });
                    }
                    for index in 0..job.replies.len() {
                        batch.remove(&(id, index));
                    }
                    false
                } else {
                    true
                }
            });
        }
    }

    /// The beginning of `job`'s forced call, as text and tokens (empty when none).
    fn prefix(&self, job: &ChatJob) -> (String, Vec<u32>) {
        match &job.forced_call {
            Some(name) => {
                let text = self.chat.call_format().call_prefix(name);
                let tokens = self.chat.tokenizer().encode(&text);
                (text, tokens)
            }
            None => (String::new(), Vec::new()),
        }
    }

    /// Hands each sampled token to its job; removes from the batch the replies that ended at a
    /// stop text.
    fn dispatch<B: Kernels>(
        &self,
        sampled: Vec<Sampled<(u64, usize)>>,
        live: &mut HashMap<u64, Live>,
        batch: &mut ContinuousBatch<'_, B, (u64, usize), ChaCha8Rng>,
    ) {
        for s in sampled {
            if let Some(job) = live.get_mut(&s.key.0)
                && let Some(key) = self.advance(job, s)
            {
                batch.remove(&key);
            }
        }
    }

    /// The batch request of reply `index` of job `id`.
    fn request(
        &self,
        id: u64,
        index: usize,
        prompt: &[u32],
        job: &ChatJob,
        context: usize,
        master: &mut ChaCha8Rng,
    ) -> Request<(u64, usize), ChaCha8Rng> {
        let rng = match job.seed {
            Some(seed) => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(index as u64);
                rng
            }
            None => ChaCha8Rng::seed_from_u64(master.random()),
        };
        Request {
            key: (id, index),
            prompt: prompt.to_vec(),
            sampling: Sampling {
                temperature: job.temperature.max(1e-6),
                top_p: job.top_p,
                top_k: None,
                max_new_tokens: job
                    .max_tokens
                    .unwrap_or(context)
                    .min(context.saturating_sub(prompt.len())),
                stop: vec![self.chat.end_token()],
                stop_sequences: Vec::new(),
                greedy: job.temperature == 0.0,
            },
            rng,
            top_logprobs: job.top_logprobs.unwrap_or(0),
        }
    }

    /// Takes one token of a reply; returns its batch key when the reply ends here by a stop
    /// text (the batch does not know those) so the caller removes it.
    fn advance(&self, job: &mut Live, s: Sampled<(u64, usize)>) -> Option<(u64, usize)> {
        let index = s.key.1;
        let tokenizer = self.chat.tokenizer();
        let reply = &mut job.replies[index];
        if reply.done {
            return None;
        }
        job.generated += 1;
        reply.tokens.push(s.token);
        if job.job.top_logprobs.is_some() {
            reply.unreported.push(TokenInfo {
                text: tokenizer.decode(&[s.token]),
                logprob: s.logprob,
                top: s
                    .top
                    .iter()
                    .map(|&(t, lp)| (tokenizer.decode(&[t]), lp))
                    .collect(),
            });
        }
        let text = self.chat.agent_text(&reply.tokens);
        let stop_at = job
            .job
            .stop
            .iter()
            .filter_map(|stop| text.find(stop.as_str()))
            .min();
        let finish = match (stop_at, s.end) {
            (Some(_), _) | (None, Some(End::Stop)) => Some(Finish::Stop),
            (None, Some(End::Length)) => Some(Finish::Length),
            (None, None) => None,
        };
        let text = format!("{}{}", job.prefix.0, &text[..stop_at.unwrap_or(text.len())]);
        let text = text.as_str();
        let tools_shown = !job.job.tools.is_empty();
        let Some(mut finish) = finish else {
            // Hold back what may yet turn into a stop text or (with tools shown) a call.
            if !tools_shown {
                let safe = safe_prefix(text, &job.job.stop);
                let delta = text.get(reply.sent..safe).unwrap_or_default().to_string();
                if !delta.is_empty() || !reply.unreported.is_empty() {
                    reply.sent += delta.len();
                    let tokens = std::mem::take(&mut reply.unreported);
                    job.listening &= (job.sink)(ChatEvent::Delta {
                        index,
                        text: delta,
                        tokens,
                    });
                }
            }
            return None;
        };
        reply.done = true;
        job.open -= 1;
        let mut calls = Vec::new();
        // Any reply that reads as a call is one, as in training: a call of a tool the client
        // did not declare goes back to it to answer (an environment answers it with an error).
        if tools_shown && let Ok(call) = self.chat.call_format().parse(text) {
            calls.push((format!("call_{}_{index}", s.key.0), call));
            finish = Finish::ToolCalls;
        }
        let content = if calls.is_empty() {
            text.to_string()
        } else {
            String::new()
        };
        // Remember the reply's tokens (as the client will send it back), end token included.
        let mut tokens = job.prefix.1.clone();
        tokens.extend_from_slice(&reply.tokens);
        if tokens.last() != Some(&self.chat.end_token()) {
            tokens.push(self.chat.end_token());
        }
        self.memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remember(&content, &calls, tokens);
        let delta = if calls.is_empty() {
            content.get(reply.sent..).unwrap_or_default().to_string()
        } else {
            String::new()
        };
        let tokens = std::mem::take(&mut reply.unreported);
        if !delta.is_empty() || !tokens.is_empty() {
            job.listening &= (job.sink)(ChatEvent::Delta {
                index,
                text: delta,
                tokens,
            });
        }
        job.listening &= (job.sink)(ChatEvent::Done {
            index,
            finish,
            calls,
        });
        (stop_at.is_some() && s.end.is_none()).then_some(s.key)
    }
}

/// How much of `text` can be sent: all of it but a suffix that may be the start of a stop
/// text, and no incomplete character (the tokenizer's replacement character at the end).
fn safe_prefix(text: &str, stops: &[String]) -> usize {
    let mut safe = text.len();
    for stop in stops {
        for (i, _) in text.char_indices().rev().take(stop.chars().count()) {
            if stop.starts_with(&text[i..]) {
                safe = safe.min(i);
            }
        }
    }
    let kept = &text[..safe];
    kept.trim_end_matches('\u{FFFD}').len()
}
