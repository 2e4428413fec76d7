//! Evaluating a model behind a chat endpoint (`agentry eval --endpoint`): an experiment's
//! evaluation episodes played by any model that speaks the OpenAI chat API, written as the
//! same run directory an Agentry evaluation writes (metrics, report, intervals, replayable
//! episodes) as the experiment's configuration `endpoint.MODEL`, so `agentry compare` puts it
//! beside trained runs.
//!
//! Each episode is a conversation: the instruction as the user message, the tasks' tools as
//! `tools`, each reply's call executed by the environment and answered as a tool message (an
//! answer to a reply that is no call goes back as a user message). A reply's call is the
//! endpoint's `tool_calls`, else its text read in the policy's call form
//! ([`EndpointOptions::call_format`]), whose parser's error is the agent's next observation,
//! exactly as in an Agentry rollout. So a policy served by `agentry serve` plays the same
//! episodes here as in its own evaluation, turn for turn.
//!
//! The runtime knows no HTTP: a [`ChatEndpoint`] makes the requests (the `agentry` crate's over
//! `agentry-serve`'s OpenAI client, which retries what can be retried and counts it).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use agentry_env::controller::{Controller, ControllerConfig};
use agentry_env::{Status, Step, ToolCall, ToolCallFormat, ToolSchema};

use crate::error::RunError;
use crate::experiment::Experiment;
use crate::metrics::{EvalPoint, Progress, RunConfig, RunDir};
use crate::model::Sampling;
use crate::replay::{Replay, ReplayError, outcome_difference, step_difference};
use crate::rollout::{Episode, EpisodeSpec, Turn, failed, finish, unparsed};
use crate::serving::ChatMessage;
use crate::spec::{self, Decoding};
use crate::train::{
    RunOptions, RunSummary, eval_specs, evaluation_of, repeated_instance_warnings, split_name,
};
use crate::trajectory::{self, Trajectory};

/// The file of an endpoint evaluation's run directory that says which endpoint it played, how
/// replies were read, and the requests' counts: its presence marks such a run.
pub const FILE: &str = "endpoint.json";

/// A call form's name in [`FILE`].
fn format_name(format: ToolCallFormat) -> &'static str {
    match format {
        ToolCallFormat::Compact => "compact",
        ToolCallFormat::Hermes => "hermes",
    }
}

/// A model behind a chat endpoint.
pub trait ChatEndpoint: Sync {
    /// The model's name, for the run's configuration label (`endpoint.MODEL`).
    fn model(&self) -> String;

    /// What it is, for the run directory and the progress lines (`MODEL at URL`).
    fn describe(&self) -> String;

    /// The model's reply to a conversation.
    ///
    /// # Errors
    /// [`EndpointFailure::ContextFull`] when the conversation no longer fits the model's
    /// context (the episode ends as an Agentry rollout's does when no reply fits), else
    /// [`EndpointFailure::Failed`] once retrying is over.
    fn reply(&self, request: &EndpointRequest<'_>) -> Result<EndpointReply, EndpointFailure>;

    /// Counts of requests, retries and failures, written into the run directory.
    fn stats(&self) -> serde_json::Value;
}

/// One request: the conversation and how to sample.
#[derive(Clone, Debug)]
pub struct EndpointRequest<'a> {
    /// The conversation so far.
    pub messages: &'a [ChatMessage],
    /// The episode's tools.
    pub tools: &'a [ToolSchema],
    /// Temperature; 0 for greedy decoding.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// Most tokens in the reply (`train.max_new_tokens`).
    pub max_tokens: usize,
    /// Texts that end a reply (`train.stop`).
    pub stop: &'a [String],
    /// The request's seed, for sampled decoding.
    pub seed: u64,
}

/// A reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointReply {
    /// Its text.
    pub content: String,
    /// Its calls (id, call), when the endpoint parsed them.
    pub calls: Vec<(String, ToolCall)>,
    /// Tokens it took, when the endpoint said.
    pub completion_tokens: usize,
}

/// Why an endpoint gave no reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EndpointFailure {
    /// The conversation does not fit the model's context.
    ContextFull,
    /// Anything else, after retries: the message says what.
    Failed(String),
}

/// How an endpoint evaluation plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointOptions {
    /// How a reply without `tool_calls` is read as a call: Agentry's compact form (which also
    /// reads a bare JSON call), or Hermes' `<tool_call>` tags.
    pub call_format: ToolCallFormat,
    /// Episodes played at once (concurrent requests).
    pub concurrency: usize,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        EndpointOptions {
            call_format: ToolCallFormat::Compact,
            concurrency: 8,
        }
    }
}

/// An episode played through an endpoint: the episode as an Agentry rollout records it (no
/// tokens: the endpoint's are not known) and each reply's text.
struct Played {
    episode: Episode,
    replies: Vec<String>,
    /// The conversation, for the samples file.
    messages: Vec<ChatMessage>,
}

/// Plays `experiment`'s evaluation episodes (its tasks, `eval.episodes` of each, each decoding
/// `eval.decoding` asks for) against `endpoint`, and writes a run directory under
/// `options.out` as an evaluation-only run does.
///
/// # Errors
/// If the experiment's tasks cannot be resolved or the run directory cannot be written. An
/// endpoint that fails does not fail the evaluation: its episodes end with `TaskError` and an
/// observation saying why, and `endpoint.json` counts them.
pub fn evaluate_endpoint(
    experiment: &dyn Experiment,
    options: &RunOptions,
    endpoint: &dyn ChatEndpoint,
    settings: &EndpointOptions,
) -> Result<RunSummary, RunError> {
    let spec = options.overridden(experiment.spec())?.into_inner();
    let remote = options.remote_tasks.as_deref();
    let tasks = crate::tasks::resolve(&|name| experiment.user_task(name), remote, &spec)?;
    let task_versions: std::collections::BTreeMap<String, String> = spec
        .tasks
        .iter()
        .zip(&tasks)
        .map(|(task, generator)| (task.name.clone(), generator.version().to_string()))
        .collect();
    let mut run_dir = RunDir::create(
        &options.out,
        &RunConfig {
            experiment: spec.name.clone(),
            // Its own configuration, so `agentry compare` puts it beside the experiment's runs
            // (a `/` in a model's name would nest folders).
            config: format!("endpoint.{}", endpoint.model().replace(['/', '\\'], "-")),
            seed: spec.seed,
        },
    )?;
    run_dir.write_json("experiment.json", &spec)?;
    run_dir.write_json("task_versions.json", &task_versions)?;
    let controller = crate::tasks::controller(&spec).map_err(RunError::Controller)?;
    let specs = eval_specs(&spec);
    let task_names: Vec<&str> = spec.tasks.iter().map(|t| t.name.as_str()).collect();
    let out = Progress::new(0, "", options.quiet);
    for line in repeated_instance_warnings(&spec, &tasks) {
        out.println(line);
    }
    let mut evaluations = Vec::new();
    for &decoding in spec.eval.decoding.each() {
        let greedy = decoding == Decoding::Greedy;
        let train = &spec.train;
        let sampling = Sampling {
            temperature: train.temperature as f32,
            top_p: train.top_p as f32,
            top_k: train.top_k,
            max_new_tokens: train.max_new_tokens,
            stop: Vec::new(),
            stop_sequences: Vec::new(),
            greedy: false,
        }
        .greedy_if(greedy);
        let request = |messages: &[ChatMessage], tools: &[ToolSchema], i: usize| {
            endpoint.reply(&EndpointRequest {
                messages,
                tools,
                temperature: if greedy { 0.0 } else { sampling.temperature },
                top_p: sampling.top_p,
                max_tokens: sampling.max_new_tokens,
                stop: &train.stop,
                // OpenAI's seed is a signed 64-bit integer.
                seed: (spec.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)) >> 1,
            })
        };
        let played = play_all(&specs, settings, |i, spec| {
            let env = tasks[spec.task].instance(spec.split, spec.difficulty, spec.index);
            play(&controller, env, *spec, settings.call_format, |m, t| {
                request(m, t, i)
            })
        });
        let label = match decoding {
            Decoding::Greedy => EvalPoint::Final.name().to_string(),
            Decoding::Sampled => format!("{}-sampled", EvalPoint::Final.name()),
        };
        write_episodes(
            &run_dir,
            &spec,
            &task_versions,
            &played,
            &label,
            &sampling,
            decoding,
        )?;
        let episodes: Vec<Episode> = played.into_iter().map(|p| p.episode).collect();
        let evaluation = evaluation_of(&task_names, &episodes);
        run_dir.record(&evaluation.record(0, EvalPoint::Final, decoding))?;
        out.println(format!(
            "{}: {} success {:.3} [95% CI {:.3}, {:.3}] {}",
            endpoint.describe(),
            split_name(spec.eval.split),
            evaluation.success,
            evaluation.success_ci[0],
            evaluation.success_ci[1],
            decoding.name()
        ));
        evaluations.push(evaluation);
    }
    run_dir.write_json(
        FILE,
        &serde_json::json!({
            "endpoint": endpoint.describe(),
            "call_format": format_name(settings.call_format),
            "requests": endpoint.stats(),
        }),
    )?;
    let mut evaluations = evaluations.into_iter();
    let summary = RunSummary {
        run_dir: run_dir.path().to_path_buf(),
        device: format!("endpoint: {}", endpoint.describe()),
        cpu_threads: crate::device::cpu_threads(),
        matmul_precision: "none here: the endpoint computes".to_string(),
        after_warmup: None,
        after_warmup_sampled: None,
        after_rl: evaluations
            .next()
            .expect("every eval.decoding has a decoding"),
        after_rl_sampled: evaluations.next(),
        steps: 0,
        skipped_steps: 0,
        warmup_from: None,
    };
    run_dir.write_json(RunSummary::FILE, &summary)?;
    let report = crate::report::write(run_dir.path())?;
    out.println(format!("report: {}", report.display()));
    out.println(format!("run directory: {}", summary.run_dir.display()));
    Ok(summary)
}

/// Plays every spec on `settings.concurrency` threads; the results in spec order.
fn play_all(
    specs: &[EpisodeSpec],
    settings: &EndpointOptions,
    play_one: impl Fn(usize, &EpisodeSpec) -> Played + Sync,
) -> Vec<Played> {
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Played>>> = Mutex::new((0..specs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..settings.concurrency.clamp(1, specs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(spec) = specs.get(i) else { break };
                    let played = play_one(i, spec);
                    done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(played);
                }
            });
        }
    });
    done.into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|p| p.expect("every episode was played"))
        .collect()
}

/// Plays one episode (see the module docs); `reply` asks the endpoint.
fn play(
    controller: &Controller,
    env: Box<dyn agentry_env::Environment>,
    spec: EpisodeSpec,
    call_format: ToolCallFormat,
    reply: impl Fn(&[ChatMessage], &[ToolSchema]) -> Result<EndpointReply, EndpointFailure>,
) -> Played {
    let mut episode = Episode {
        spec,
        transcript: Default::default(),
        logprobs: Vec::new(),
        turns: Vec::new(),
        success: false,
        status: Status::Running,
    };
    let mut replies = Vec::new();
    let (session, reset) = match controller.start(env) {
        Ok(agentry_env::controller::Started {
            id,
            reset: Ok(reset),
        }) => (id, reset),
        Ok(_) | Err(_) => {
            episode.status = Status::TaskError;
            return Played {
                episode,
                replies,
                messages: Vec::new(),
            };
        }
    };
    let mut messages = vec![ChatMessage::User(reset.instruction.clone())];
    loop {
        let answer = match reply(&messages, &reset.tools) {
            Ok(answer) => answer,
            Err(EndpointFailure::ContextFull) => {
                episode.status = Status::TaskLimitReached;
                episode.success = finish(controller, Some(session));
                break;
            }
            Err(EndpointFailure::Failed(why)) => {
                // Counted as a failed episode, with the reason where the reply would be.
                episode.status = Status::TaskError;
                replies.push(String::new());
                episode.turns.push(Turn {
                    tokens: 0,
                    version: 0,
                    switches: Vec::new(),
                    step: Step {
                        observation: format!("Error: the endpoint failed: {why}"),
                        reward: 0.0,
                        status: Status::TaskError,
                    },
                });
                let _ = controller.cancel(session);
                break;
            }
        };
        let call: Result<(Option<String>, ToolCall), String> = match answer.calls.first() {
            Some((id, call)) => Ok((Some(id.clone()), call.clone())),
            None => call_format.parse(&answer.content).map(|call| (None, call)),
        };
        let step = match &call {
            Ok((_, call)) => controller
                .step(session, call)
                .unwrap_or_else(|e| failed(e.to_string())),
            Err(message) => unparsed(message.clone()),
        };
        replies.push(reply_text(&answer, call_format));
        let observation = step.observation.clone();
        let done = step.done();
        episode.turns.push(Turn {
            tokens: answer.completion_tokens,
            version: 0,
            switches: Vec::new(),
            step: step.clone(),
        });
        messages.push(ChatMessage::Assistant {
            content: answer.content.clone(),
            calls: answer.calls.clone(),
        });
        if done {
            episode.status = step.status;
            episode.success = finish(controller, Some(session));
            break;
        }
        if episode.turn_count() >= spec.max_turns {
            episode.status = Status::TaskLimitReached;
            episode.success = finish(controller, Some(session));
            break;
        }
        messages.push(match call {
            Ok((Some(call_id), _)) => ChatMessage::Tool {
                call_id,
                content: observation,
            },
            _ => ChatMessage::User(observation),
        });
    }
    Played {
        episode,
        replies,
        messages,
    }
}

/// A reply as the episode records it: its text, or its call in the call form.
fn reply_text(answer: &EndpointReply, call_format: ToolCallFormat) -> String {
    match answer.calls.first() {
        Some((_, call)) if answer.content.is_empty() => call_format.render(call),
        _ => answer.content.clone(),
    }
}

/// `samples-LABEL.txt` (the first episodes of each task, readable) and `episodes/`.
fn write_episodes(
    run_dir: &RunDir,
    spec: &spec::Experiment,
    task_versions: &std::collections::BTreeMap<String, String>,
    played: &[Played],
    label: &str,
    sampling: &Sampling,
    decoding: Decoding,
) -> Result<(), RunError> {
    let mut text = String::new();
    for (t, task) in spec.tasks.iter().enumerate() {
        for p in played.iter().filter(|p| p.episode.spec.task == t).take(4) {
            text.push_str(&render(&task.name, p));
            text.push('\n');
        }
    }
    let path = run_dir.path().join(format!("samples-{label}.txt"));
    std::fs::write(&path, text).map_err(RunError::io(path))?;
    let mut lines = String::new();
    for p in played {
        let e = &p.episode;
        let task = &spec.tasks[e.spec.task].name;
        let line = Trajectory {
            task: task.clone(),
            task_version: task_versions.get(task).cloned().unwrap_or_default(),
            split: e.spec.split,
            difficulty: e.spec.difficulty,
            index: e.spec.index,
            max_turns: e.spec.max_turns,
            context: 0,
            evaluation: label.to_string(),
            decoding: sampling.clone(),
            policy_versions: vec![0; e.turns.len()],
            turns: e
                .turns
                .iter()
                .zip(&p.replies)
                .map(|(turn, reply)| trajectory::Turn {
                    reply: reply.clone(),
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    observation: turn.step.observation.clone(),
                    reward: turn.step.reward,
                    status: turn.step.status,
                })
                .collect(),
            reward: e.reward(),
            success: e.success,
            status: e.status,
        };
        let json = serde_json::to_string(&line).map_err(|e| RunError::Io {
            path: run_dir.path().join(trajectory::DIR),
            source: std::io::Error::other(e.to_string()),
        })?;
        lines.push_str(&json);
        lines.push('\n');
    }
    let dir = run_dir.path().join(trajectory::DIR);
    std::fs::create_dir_all(&dir).map_err(RunError::io(&dir))?;
    let path = dir.join(trajectory::file_name(EvalPoint::Final, decoding, 0));
    std::fs::write(&path, lines).map_err(RunError::io(path))
}

/// An episode as readable text: its header as an Agentry sample's, then the conversation.
fn render(task: &str, p: &Played) -> String {
    let e = &p.episode;
    let mut out = format!(
        "== {} instance {} difficulty {}: success {} reward {} turns {} ({:?})\n",
        task,
        e.spec.index,
        e.spec.difficulty,
        e.success,
        e.reward(),
        e.turn_count(),
        e.status
    );
    let mut replies = p.replies.iter();
    for m in &p.messages {
        let line = match m {
            ChatMessage::System(s) => format!("system: {s}"),
            ChatMessage::User(s) => format!("user: {s}"),
            ChatMessage::Tool { content, .. } => format!("tool: {content}"),
            ChatMessage::Assistant { .. } => {
                format!("assistant: {}", replies.next().map_or("", String::as_str))
            }
        };
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Replays a recorded episode of an endpoint evaluation: the recorded replies, read in the
/// run's call form, stepped in a fresh instance, and every answer compared with the record.
/// There are no weights to check: the model was the endpoint's.
pub(crate) fn replay(
    run_dir: &std::path::Path,
    recorded: &Trajectory,
    generator: Box<dyn agentry_env::TaskGenerator>,
    header: String,
) -> Result<Replay, ReplayError> {
    let path = run_dir.join(FILE);
    let fail = |reason: String| ReplayError::RunFile {
        path: path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
    let file: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("unreadable: {e}")))?;
    let call_format = match file.get("call_format").and_then(serde_json::Value::as_str) {
        Some("compact") => ToolCallFormat::Compact,
        Some("hermes") => ToolCallFormat::Hermes,
        other => {
            return Err(fail(format!(
                "`call_format` is {other:?}, not compact or hermes"
            )));
        }
    };
    let controller = Controller::new(ControllerConfig::default()).map_err(RunError::Controller)?;
    let spec = recorded.episode_spec();
    let env = generator.instance(recorded.split, recorded.difficulty, recorded.index);
    let next = AtomicUsize::new(0);
    let played = play(&controller, env, spec, call_format, |_, _| {
        match recorded.turns.get(next.fetch_add(1, Ordering::Relaxed)) {
            // An endpoint's failure was recorded as a turn without a reply: it fails again.
            Some(turn) if turn.status == Status::TaskError && turn.reply.is_empty() => {
                Err(EndpointFailure::Failed(
                    turn.observation
                        .trim_start_matches("Error: the endpoint failed: ")
                        .to_string(),
                ))
            }
            Some(turn) => Ok(EndpointReply {
                content: turn.reply.clone(),
                calls: Vec::new(),
                completion_tokens: 0,
            }),
            None => Err(EndpointFailure::Failed(
                "the recording ends here".to_string(),
            )),
        }
    });
    let mut mismatch = None;
    for (k, (turn, replayed)) in recorded.turns.iter().zip(&played.episode.turns).enumerate() {
        if let Some(difference) = step_difference(turn, &replayed.step) {
            mismatch = Some(format!("turn {}: {difference}", k + 1));
            break;
        }
    }
    let turns = played.episode.turns.len();
    if mismatch.is_none() && turns != recorded.turns.len() {
        mismatch = Some(format!(
            "the replayed episode took {turns} turns, {} were recorded",
            recorded.turns.len()
        ));
    }
    if mismatch.is_none() {
        mismatch = outcome_difference(recorded, &played.episode, false);
    }
    let checks = vec![match &mismatch {
        Some(_) => "environment: differs (an endpoint's run has no weights to check)".to_string(),
        None => format!(
            "environment: {} turns, every observation, reward and status identical; success {} \
             and status {:?} as recorded (an endpoint's run has no weights to check)",
            recorded.turns.len(),
            recorded.success,
            recorded.status
        ),
    }];
    Ok(Replay {
        header,
        transcript: render(&recorded.task, &played),
        checks,
        mismatch,
    })
}
