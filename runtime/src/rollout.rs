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

use crate::algo::returns_to_go;
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
    /// Monte-Carlo credit: the estimated value of the state each turn started from (0 where
    /// none was estimated), filled in by the trainer; empty otherwise.
    pub turn_values: Vec<f32>,
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
    let (mut episodes, mut sessions) = start(chat, tasks, controller, specs);
    let turns = Turns {
        policy,
        chat,
        controller,
        sampling,
        context,
    };
    turns.run(&mut episodes, &mut sessions, None, rng);
    episodes
}

/// Where a rollout snapshots its episodes for Monte-Carlo value estimates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForkPlan {
    /// Turn boundaries to snapshot at: `b` is the state after `b` agent turns (0: right after
    /// the reset), before the next turn.
    pub boundaries: Vec<u32>,
    /// Continuations per snapshot.
    pub k: usize,
}

/// An episode snapshotted mid-way: independent copies of its environment and its transcript
/// so far, from which [`continue_forks`] plays continuations.
#[derive(Debug)]
pub struct Fork {
    /// Index of the episode in the rollout.
    pub episode: usize,
    /// Agent turns taken when it was snapshotted.
    pub boundary: u32,
    /// The episode as it stood (transcript, log-probabilities, turns).
    state: Episode,
    /// One forked session per continuation.
    sessions: Vec<SessionId>,
}

/// [`play`], snapshotting every episode still running at each boundary of `plan` (`k`
/// independent copies of its environment). Returns the episodes and the snapshots, in the
/// order they were taken.
#[allow(clippy::too_many_arguments)]
pub fn play_with_forks<B: Backend>(
    policy: &Policy<B>,
    chat: &ChatFormat,
    tasks: &[Box<dyn TaskGenerator>],
    controller: &Controller,
    specs: &[EpisodeSpec],
    sampling: &Sampling,
    context: usize,
    plan: &ForkPlan,
    rng: &mut impl Rng,
) -> (Vec<Episode>, Vec<Fork>) {
    let (mut episodes, mut sessions) = start(chat, tasks, controller, specs);
    let turns = Turns {
        policy,
        chat,
        controller,
        sampling,
        context,
    };
    let forks = turns.run(&mut episodes, &mut sessions, Some(plan), rng);
    (episodes, forks)
}

/// Plays every snapshot's continuations to the end (each from its own copy of the
/// environment, with the snapshot's transcript as the conversation so far), all batched
/// together. Returns, per snapshot, the discounted return each continuation earned after the
/// snapshot: `Σ_j γ^j r_{b+1+j}`.
#[allow(clippy::too_many_arguments)]
pub fn continue_forks<B: Backend>(
    policy: &Policy<B>,
    chat: &ChatFormat,
    controller: &Controller,
    forks: Vec<Fork>,
    sampling: &Sampling,
    context: usize,
    gamma: f64,
    rng: &mut impl Rng,
) -> Vec<Vec<f32>> {
    let mut owner = Vec::new();
    let mut episodes = Vec::new();
    let mut sessions = Vec::new();
    for (f, fork) in forks.iter().enumerate() {
        for &session in &fork.sessions {
            owner.push(f);
            let mut episode = fork.state.clone();
            episode.reward = 0.0;
            episode.turn_rewards.clear();
            episode.turn_tokens.clear();
            episodes.push(episode);
            sessions.push(Some(session));
        }
    }
    let turns = Turns {
        policy,
        chat,
        controller,
        sampling,
        context,
    };
    turns.run(&mut episodes, &mut sessions, None, rng);
    let mut returns = vec![Vec::new(); forks.len()];
    for (f, episode) in owner.into_iter().zip(episodes) {
        let ret = returns_to_go(&episode.turn_rewards, gamma)
            .first()
            .copied()
            .unwrap_or(0.0);
        returns[f].push(ret);
    }
    returns
}

/// Resets one environment per spec under the controller: the episodes at turn 0 and their
/// sessions (`None` where the reset failed, which ends that episode with `TaskError`).
fn start(
    chat: &ChatFormat,
    tasks: &[Box<dyn TaskGenerator>],
    controller: &Controller,
    specs: &[EpisodeSpec],
) -> (Vec<Episode>, Vec<Option<SessionId>>) {
    let envs: Vec<Box<dyn Environment>> = specs
        .iter()
        .map(|s| tasks[s.task].instance(s.split, s.difficulty, s.index))
        .collect();
    let mut sessions: Vec<Option<SessionId>> = Vec::with_capacity(specs.len());
    let episodes = specs
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
                turn_values: Vec::new(),
                success: false,
                turns: 0,
                status,
            }
        })
        .collect();
    (episodes, sessions)
}

/// What every turn of a rollout needs.
struct Turns<'a, B: Backend> {
    policy: &'a Policy<B>,
    chat: &'a ChatFormat,
    controller: &'a Controller,
    sampling: &'a Sampling,
    context: usize,
}

impl<B: Backend> Turns<'_, B> {
    /// Plays the episodes to the end, one batched generation per turn; with a plan, snapshots
    /// the running episodes at its boundaries.
    fn run(
        &self,
        episodes: &mut [Episode],
        sessions: &mut [Option<SessionId>],
        plan: Option<&ForkPlan>,
        rng: &mut impl Rng,
    ) -> Vec<Fork> {
        let (chat, controller, context) = (self.chat, self.controller, self.context);
        let mut forks = Vec::new();
        loop {
            // An instruction too long for the context leaves no room for a reply: the episode
            // ends before its first turn, with nothing to learn from (an empty transcript).
            for (i, episode) in episodes.iter_mut().enumerate() {
                if episode.is_running() && episode.transcript.tokens.len() + 2 > context {
                    episode.status = Status::TaskLimitReached;
                    episode.success = finish(controller, sessions[i]);
                    episode.transcript = Transcript::default();
                    episode.logprobs.clear();
                }
            }
            if let Some(plan) = plan {
                snapshot(controller, episodes, sessions, plan, &mut forks);
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
                max_new_tokens: self
                    .sampling
                    .max_new_tokens
                    .min(context.saturating_sub(longest)),
                ..self.sampling.clone()
            };
            let generations = generate(self.policy, &prompts, &turn_sampling, rng);

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
                        // No reply would fit after this observation: the episode ends here, and
                        // the observation, which no agent token would follow, is not kept
                        // (training never sees more than `context` tokens).
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
        forks
    }
}

/// Snapshots every running episode that has just reached one of the plan's boundaries.
fn snapshot(
    controller: &Controller,
    episodes: &[Episode],
    sessions: &[Option<SessionId>],
    plan: &ForkPlan,
    forks: &mut Vec<Fork>,
) {
    for (i, episode) in episodes.iter().enumerate() {
        let due = episode.is_running()
            && plan.boundaries.contains(&episode.turns)
            && episode.turns < episode.spec.max_turns
            && !forks
                .iter()
                .any(|f| f.episode == i && f.boundary == episode.turns);
        let Some(id) = sessions[i].filter(|_| due) else {
            continue;
        };
        // A copy that cannot be made is one continuation fewer, never a failed episode.
        let copies: Vec<SessionId> = (0..plan.k)
            .filter_map(|_| controller.fork(id).ok())
            .collect();
        if !copies.is_empty() {
            forks.push(Fork {
                episode: i,
                boundary: episode.turns,
                state: episode.clone(),
                sessions: copies,
            });
        }
    }
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
