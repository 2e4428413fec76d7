//! Rollout: many episodes at once, the policy generating one turn for all of them per call.
//!
//! Each turn, the conversation so far of every unfinished episode is a prompt; the policy
//! generates all their replies in one batched call; each reply is parsed as a tool call and
//! stepped in its environment (a reply that does not parse is answered with the parser's error,
//! as an observation, without touching the environment). Every generated token keeps the
//! log-probability it was sampled with, which the loss uses as the behaviour policy.
//!
//! Environments run under a [`Controller`]: each turn's steps run in parallel on its workers,
//! and an environment that panics or hangs ends only its own episode, with
//! [`Status::TaskError`].

use agentry_env::controller::{Controller, SessionId};
use agentry_env::{Environment, Split, Status, Step, TaskGenerator, ToolCall, parse_call};
use burn::tensor::backend::Backend;
use rand::Rng;

use crate::model::{Policy, Sampling, generate};
use crate::text::{ChatFormat, Transcript};

/// Which instance an episode plays, and under what budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpisodeSpec {
    /// Index into the experiment's tasks.
    pub task: usize,
    /// Train or test instances.
    pub split: Split,
    /// Difficulty level, 1..=3.
    pub difficulty: u8,
    /// Instance index within the split.
    pub index: u64,
    /// Turn budget.
    pub max_turns: u32,
    /// Group id: episodes of one group play the same instance (GRPO, RLOO).
    pub group: usize,
}

/// A finished episode: the token transcript and what it earned.
#[derive(Clone, Debug)]
pub struct Episode {
    /// What was played.
    pub spec: EpisodeSpec,
    /// Tokens and agent mask of the whole conversation.
    pub transcript: Transcript,
    /// Behaviour log-probability of each token (0 where the agent mask is false).
    pub logprobs: Vec<f32>,
    /// Sum of the turn rewards.
    pub reward: f32,
    /// The reward of each agent turn, in order (0 for a turn that earned nothing).
    pub turn_rewards: Vec<f32>,
    /// The agent tokens of each turn, in order; they sum to the transcript's agent tokens.
    pub turn_tokens: Vec<usize>,
    /// Whether the environment judged the episode solved.
    pub success: bool,
    /// Agent turns taken.
    pub turns: u32,
    /// How it ended.
    pub status: Status,
}

/// Plays `specs` to the end with `policy`, all episodes batched together, their environments
/// stepped by `controller`.
///
/// Episodes end when the environment says so, at their turn budget, or when the context is
/// full (`TaskLimitReached`). No transcript is longer than `context`: an observation after
/// which no reply would fit is dropped, and an episode whose instruction does not fit is left
/// empty. An environment that fails to reset ends its episode at once with
/// `TaskError` and an empty transcript (nothing to learn from).
#[allow(clippy::too_many_arguments)]
pub fn play<B: Backend>(
    policy: &Policy<B>,
    chat: &ChatFormat,
    tasks: &[Box<dyn TaskGenerator>],
    controller: &Controller,
    specs: &[EpisodeSpec],
    sampling: &Sampling,
    context: usize,
    rng: &mut impl Rng,
) -> Vec<Episode> {
    let envs: Vec<Box<dyn Environment>> = specs
        .iter()
        .map(|s| tasks[s.task].instance(s.split, s.difficulty, s.index))
        .collect();
    let mut sessions: Vec<Option<SessionId>> = Vec::with_capacity(specs.len());
    let mut episodes: Vec<Episode> = specs
        .iter()
        .zip(controller.start_many(envs))
        .map(|(spec, started)| {
            let (session, transcript, status) = match started {
                Ok(agentry_env::controller::Started {
                    id,
                    reset: Ok(reset),
                }) => (Some(id), chat.begin(&reset), Status::Running),
                Ok(_) | Err(_) => (None, Transcript::default(), Status::TaskError),
            };
            sessions.push(session);
            Episode {
                spec: *spec,
                logprobs: vec![0.0; transcript.tokens.len()],
                transcript,
                reward: 0.0,
                turn_rewards: Vec::new(),
                turn_tokens: Vec::new(),
                success: false,
                turns: 0,
                status,
            }
        })
        .collect();

    loop {
        // An instruction too long for the context leaves no room for a reply: the episode ends
        // before its first turn, with nothing to learn from (an empty transcript).
        for (i, episode) in episodes.iter_mut().enumerate() {
            if episode.is_running() && episode.transcript.tokens.len() + 2 > context {
                episode.status = Status::TaskLimitReached;
                episode.success = finish(controller, sessions[i]);
                episode.transcript = Transcript::default();
                episode.logprobs.clear();
            }
        }
        let active: Vec<usize> = (0..episodes.len())
            .filter(|&i| episodes[i].is_running())
            .collect();
        if active.is_empty() {
            break;
        }
        let prompts: Vec<Vec<u32>> = active
            .iter()
            .map(|&i| episodes[i].transcript.tokens.clone())
            .collect();
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let turn_sampling = Sampling {
            max_new_tokens: sampling.max_new_tokens.min(context.saturating_sub(longest)),
            ..sampling.clone()
        };
        let generations = generate(policy, &prompts, &turn_sampling, rng);

        // Parse every reply; the parsed calls of this turn are stepped together.
        let parsed: Vec<Result<ToolCall, String>> = generations
            .iter()
            .map(|g| parse_call(&chat.agent_text(&g.tokens)))
            .collect();
        let calls: Vec<(SessionId, ToolCall)> = active
            .iter()
            .zip(&parsed)
            .filter_map(|(&i, call)| Some((sessions[i]?, call.as_ref().ok()?.clone())))
            .collect();
        let mut answers = controller.step_many(&calls).into_iter();

        for ((&i, generation), call) in active.iter().zip(generations).zip(parsed) {
            let episode = &mut episodes[i];
            chat.push_agent(&mut episode.transcript, &generation.tokens);
            episode.logprobs.extend_from_slice(&generation.logprobs);
            episode.turn_tokens.push(generation.tokens.len());
            episode.turns += 1;
            let step = match call {
                Ok(_) => match answers.next() {
                    Some(Ok(step)) => step,
                    Some(Err(e)) => failed(e.to_string()),
                    None => failed("the controller gave no answer".to_string()),
                },
                Err(message) => Step {
                    observation: message,
                    reward: 0.0,
                    status: Status::InvalidAction,
                },
            };
            episode.reward += step.reward;
            episode.turn_rewards.push(step.reward);
            if step.done() {
                episode.status = step.status;
                episode.success = sessions[i]
                    .and_then(|id| controller.success(id).ok())
                    .unwrap_or(false);
            } else if episode.turns >= episode.spec.max_turns {
                episode.status = Status::TaskLimitReached;
                episode.success = finish(controller, sessions[i]);
            } else {
                let before = episode.transcript.tokens.len();
                chat.push_observation(&mut episode.transcript, &step.observation);
                if episode.transcript.tokens.len() + 2 > context {
                    // No reply would fit after this observation: the episode ends here, and the
                    // observation, which no agent token would follow, is not kept (training
                    // never sees more than `context` tokens).
                    episode.transcript.tokens.truncate(before);
                    episode.transcript.agent_mask.truncate(before);
                    episode.status = Status::TaskLimitReached;
                    episode.success = finish(controller, sessions[i]);
                } else {
                    let added = episode.transcript.tokens.len() - before;
                    episode.logprobs.extend(std::iter::repeat_n(0.0, added));
                }
            }
        }
    }
    episodes
}

/// Ends a session the runtime stops (turn budget, context); returns whether it was solved.
fn finish(controller: &Controller, session: Option<SessionId>) -> bool {
    let Some(id) = session else {
        return false;
    };
    let success = controller.success(id).unwrap_or(false);
    let _ = controller.cancel(id);
    success
}

/// The step of an environment call the controller could not serve.
fn failed(reason: String) -> Step {
    Step {
        observation: format!("Error: the environment failed: {reason}"),
        reward: 0.0,
        status: Status::TaskError,
    }
}

impl Episode {
    fn is_running(&self) -> bool {
        matches!(self.status, Status::Running | Status::InvalidAction)
    }
}

/// The oracle's episode of an instance, as the transcript the policy should have produced.
///
/// Returns `None` if the task has no oracle or the oracle does not solve the instance within the
/// turn budget and context (such a demonstration would teach failure).
pub fn demonstration(
    chat: &ChatFormat,
    env: &mut dyn Environment,
    max_turns: u32,
    context: usize,
) -> Option<Transcript> {
    let mut transcript = chat.begin(&env.reset());
    for _ in 0..max_turns {
        let call = env.oracle()?;
        chat.push_agent(&mut transcript, &chat.demo_turn(&call));
        let step = env.step(&call);
        if step.done() {
            return (env.success() && transcript.tokens.len() <= context).then_some(transcript);
        }
        chat.push_observation(&mut transcript, &step.observation);
    }
    None
}

/// The text of the oracle's episode of an instance (instruction, tools, calls, observations),
/// for training a tokenizer on what the policy will read and write.
pub fn oracle_text(env: &mut dyn Environment, max_turns: u32) -> Vec<String> {
    let reset = env.reset();
    let mut turns = Vec::new();
    for _ in 0..max_turns {
        let Some(call) = env.oracle() else { break };
        let step = env.step(&call);
        let done = step.done();
        turns.push((call, step.observation));
        if done {
            break;
        }
    }
    ChatFormat::corpus_text(&reset, &turns)
}
