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

use std::ops::Deref;
use std::sync::Arc;

use agentry_env::controller::{Controller, SessionId};
use agentry_env::{Environment, Split, Status, Step, TaskGenerator, ToolCall};
use rand::Rng;

use crate::algo::returns_to_go;
use crate::model::Kernels;
use crate::model::{
    Generation, KeptCache, Policy, Sampling, generate, generate_kept, generate_switching,
};
use crate::pool::{Engines, Pick, Versioned};
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

/// A finished episode: the token transcript, and each agent turn with what it earned.
///
/// Rollout makes it and nothing edits it afterwards: what training derives from it (a KL
/// penalty on the reward, Monte-Carlo values of its turns) lives beside it.
#[derive(Clone, Debug)]
pub struct Episode {
    /// What was played.
    pub spec: EpisodeSpec,
    /// Tokens and agent mask of the whole conversation.
    pub transcript: Transcript,
    /// Behaviour log-probability of each token (0 where the agent mask is false).
    pub logprobs: Vec<f32>,
    /// The agent turns, in order.
    pub turns: Vec<Turn>,
    /// Whether the environment judged the episode solved.
    pub success: bool,
    /// How it ended.
    pub status: Status,
}

/// One agent turn: the reply the policy generated, and the environment's answer.
#[derive(Clone, Debug)]
pub struct Turn {
    /// Agent tokens of the reply; the turns' counts sum to the transcript's agent tokens
    /// (unless the context cut the transcript, which then is empty).
    pub tokens: usize,
    /// The version of the policy that generated it (cross-policy sampling mixes them): with
    /// partial rollouts, the one that generated its first token.
    pub version: u64,
    /// Partial rollouts (`pool { interrupt = token }`): where newer weights took over the
    /// reply, as (index of the first token they generated, their version), in order.
    pub switches: Vec<(usize, u64)>,
    /// What the environment answered (the parser's error for a reply that is no call),
    /// including an observation the context could not hold: the transcript alone cannot give
    /// back the text, and a recorded trajectory needs it.
    pub step: Step,
}

impl Turn {
    /// The turn's reward.
    pub fn reward(&self) -> f32 {
        self.step.reward
    }

    /// The version of the policy that generated each of its tokens.
    pub fn token_versions(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.tokens).map(|k| {
            self.switches
                .iter()
                .rev()
                .find(|(from, _)| *from <= k)
                .map_or(self.version, |&(_, version)| version)
        })
    }
}

impl Episode {
    /// The sum of the turn rewards, added in turn order.
    pub fn reward(&self) -> f32 {
        self.turns.iter().fold(0.0, |sum, turn| sum + turn.reward())
    }

    /// Agent turns taken.
    pub fn turn_count(&self) -> u32 {
        self.turns.len() as u32
    }

    /// The reward of each turn, in order.
    pub fn turn_rewards(&self) -> Vec<f32> {
        self.turns.iter().map(Turn::reward).collect()
    }

    /// The agent tokens of each turn, in order.
    pub fn turn_tokens(&self) -> Vec<usize> {
        self.turns.iter().map(|turn| turn.tokens).collect()
    }

    /// The transcript positions of each turn's reply, in turn order: turn `k`'s reply is the
    /// next `turns[k].tokens` agent positions. The one place turns map to token positions.
    pub fn reply_positions(&self) -> Vec<Vec<usize>> {
        let mask = &self.transcript.agent_mask;
        let mut agent = (0..mask.len()).filter(|&j| mask[j]);
        self.turns
            .iter()
            .map(|turn| agent.by_ref().take(turn.tokens).collect())
            .collect()
    }
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
pub fn play<B: Kernels>(
    policy: &Policy<B>,
    chat: &ChatFormat,
    tasks: &[Box<dyn TaskGenerator>],
    controller: &Controller,
    specs: &[EpisodeSpec],
    sampling: &Sampling,
    context: usize,
    rng: &mut (impl Rng + Send),
) -> Vec<Episode> {
    let engines = Engines::single(policy, 0);
    play_in_pool(
        &engines, chat, tasks, controller, specs, sampling, context, None, rng,
    )
    .0
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

/// [`play`] with a pool of engines: each turn of each episode is generated by the engine
/// [`Engines::pick`] draws (cross-policy sampling), and its version recorded. With a `plan`,
/// every episode still running at one of its boundaries is snapshotted (`k` independent
/// copies of its environment). Returns the episodes and the snapshots, in the order they were
/// taken; every snapshot must be handed to [`continue_forks`], which ends its sessions.
#[allow(clippy::too_many_arguments)]
pub fn play_in_pool<B: Kernels>(
    engines: &Engines<'_, B>,
    chat: &ChatFormat,
    tasks: &[Box<dyn TaskGenerator>],
    controller: &Controller,
    specs: &[EpisodeSpec],
    sampling: &Sampling,
    context: usize,
    plan: Option<&ForkPlan>,
    rng: &mut (impl Rng + Send),
) -> (Vec<Episode>, Vec<Fork>) {
    let (mut episodes, mut sessions) = start(chat, tasks, controller, specs);
    let turns = Turns {
        engines: *engines,
        chat,
        controller,
        sampling,
        context,
        newer: None,
    };
    let forks = turns.run(&mut episodes, &mut sessions, plan, rng);
    (episodes, forks)
}

/// Plays every snapshot's continuations to the end (each from its own copy of the
/// environment, with the snapshot's transcript as the conversation so far), all batched
/// together. Returns, per snapshot, the discounted return each continuation earned after the
/// snapshot: `Σ_j γ^j r_{b+1+j}`.
#[allow(clippy::too_many_arguments)]
pub fn continue_forks<B: Kernels>(
    policy: &Policy<B>,
    chat: &ChatFormat,
    controller: &Controller,
    forks: Vec<Fork>,
    sampling: &Sampling,
    context: usize,
    gamma: f64,
    rng: &mut (impl Rng + Send),
) -> Vec<Vec<f32>> {
    let mut owner = Vec::new();
    let mut episodes = Vec::new();
    let mut sessions = Vec::new();
    for (f, fork) in forks.iter().enumerate() {
        for &session in &fork.sessions {
            owner.push(f);
            episodes.push(fork.state.clone());
            sessions.push(Some(session));
        }
    }
    let turns = Turns {
        engines: Engines::single(policy, 0),
        chat,
        controller,
        sampling,
        context,
        newer: None,
    };
    turns.run(&mut episodes, &mut sessions, None, rng);
    let mut returns = vec![Vec::new(); forks.len()];
    for (f, episode) in owner.into_iter().zip(episodes) {
        // The turns after the snapshot are the continuation's.
        let after = episode.turn_rewards().split_off(forks[f].boundary as usize);
        let ret = returns_to_go(&after, gamma).first().copied().unwrap_or(0.0);
        returns[f].push(ret);
    }
    returns
}

/// Continuous batching, for asynchronous rollout: episodes join while others are under way,
/// and each finished episode leaves as soon as its last turn is played, so a short episode
/// never waits for a long one.
pub struct Stream<'a> {
    chat: &'a ChatFormat,
    tasks: &'a [Box<dyn TaskGenerator>],
    controller: &'a Controller,
    sampling: &'a Sampling,
    context: usize,
    episodes: Vec<Episode>,
    sessions: Vec<Option<SessionId>>,
    /// The version of the fresh weights each episode started with.
    started: Vec<u64>,
}

impl<'a> Stream<'a> {
    /// An empty stream.
    pub fn new(
        chat: &'a ChatFormat,
        tasks: &'a [Box<dyn TaskGenerator>],
        controller: &'a Controller,
        sampling: &'a Sampling,
        context: usize,
    ) -> Self {
        Stream {
            chat,
            tasks,
            controller,
            sampling,
            context,
            episodes: Vec::new(),
            sessions: Vec::new(),
            started: Vec::new(),
        }
    }

    /// Episodes under way.
    pub fn len(&self) -> usize {
        self.episodes.len()
    }

    /// Whether no episode is under way.
    pub fn is_empty(&self) -> bool {
        self.episodes.is_empty()
    }

    /// Starts the episodes of `specs` (their environments reset now), on fresh weights of
    /// version `version`.
    pub fn admit(&mut self, specs: &[EpisodeSpec], version: u64) {
        let (episodes, sessions) = start(self.chat, self.tasks, self.controller, specs);
        self.episodes.extend(episodes);
        self.sessions.extend(sessions);
        self.started.resize(self.episodes.len(), version);
    }

    /// The versions of fresh weights the episodes under way started with, oldest first.
    pub fn started_versions(&self) -> Vec<u64> {
        let mut versions = self.started.clone();
        versions.sort_unstable();
        versions.dedup();
        versions
    }

    /// Plays one turn of every episode under way with `engines` (and, with `newer`, newer
    /// fresh weights from the next token once some are published), and returns the episodes
    /// that ended (in the order they joined).
    pub fn turn<B: Kernels>(
        &mut self,
        engines: &Engines<'_, B>,
        newer: Option<Newer<'_, B>>,
        rng: &mut (impl Rng + Send),
    ) -> Vec<Episode> {
        // Nothing is kept between calls: each may bring other weights (a new version).
        self.turns(engines, newer).turn(
            &mut self.episodes,
            &mut self.sessions,
            None,
            &mut Vec::new(),
            None,
            rng,
        );
        self.take_finished()
    }

    /// Plays one turn of every episode under way with the weights it started with
    /// (`pool { interrupt = never }`): those that started on version `v` with `engines(v)`,
    /// one batch per version. Returns the episodes that ended (in the order they joined).
    pub fn turn_pinned<'w, B: Kernels + 'w>(
        &mut self,
        engines: impl Fn(u64) -> Engines<'w, B>,
        rng: &mut (impl Rng + Send),
    ) -> Vec<Episode> {
        for version in self.started_versions() {
            let members: Vec<bool> = self.started.iter().map(|&v| v == version).collect();
            self.turn_of(&members, &engines(version), rng);
        }
        self.take_finished()
    }

    /// What a turn of this stream's episodes needs, with `engines` (and `newer`).
    fn turns<'t, B: Kernels>(
        &self,
        engines: &Engines<'t, B>,
        newer: Option<Newer<'t, B>>,
    ) -> Turns<'t, B>
    where
        'a: 't,
    {
        Turns {
            engines: *engines,
            chat: self.chat,
            controller: self.controller,
            sampling: self.sampling,
            context: self.context,
            newer,
        }
    }

    /// One turn of the episodes `members` marks, with `engines`.
    fn turn_of<B: Kernels>(
        &mut self,
        members: &[bool],
        engines: &Engines<'_, B>,
        rng: &mut (impl Rng + Send),
    ) {
        let turns = self.turns(engines, None);
        let mut episodes = Vec::new();
        let mut others = Vec::new();
        for (i, episode) in std::mem::take(&mut self.episodes).into_iter().enumerate() {
            if members[i] {
                episodes.push(episode);
            } else {
                others.push(episode);
            }
        }
        let mut sessions: Vec<Option<SessionId>> = (0..members.len())
            .filter(|&i| members[i])
            .map(|i| self.sessions[i])
            .collect();
        turns.turn(
            &mut episodes,
            &mut sessions,
            None,
            &mut Vec::new(),
            None,
            rng,
        );
        let (mut played, mut others) = (episodes.into_iter(), others.into_iter());
        let mut sessions = sessions.into_iter();
        for (i, &member) in members.iter().enumerate() {
            let next = if member {
                self.sessions[i] = sessions.next().flatten();
                played.next()
            } else {
                others.next()
            };
            self.episodes.extend(next);
        }
    }

    /// Removes the episodes that ended, in the order they joined.
    fn take_finished(&mut self) -> Vec<Episode> {
        let mut finished = Vec::new();
        let mut running = (Vec::new(), Vec::new(), Vec::new());
        let all = self
            .episodes
            .drain(..)
            .zip(self.sessions.drain(..))
            .zip(self.started.drain(..));
        for ((episode, session), started) in all {
            if episode.is_running() {
                running.0.push(episode);
                running.1.push(session);
                running.2.push(started);
            } else {
                finished.push(episode);
            }
        }
        (self.episodes, self.sessions, self.started) = running;
        finished
    }

    /// Ends every episode under way (their sessions cancelled) and drops them.
    pub fn cancel(&mut self) {
        for session in self.sessions.drain(..).flatten() {
            let _ = self.controller.cancel(session);
        }
        self.episodes.clear();
        self.started.clear();
    }
}

/// Resets one environment per spec under the controller: the episodes at turn 0 and their
/// sessions (`None` where the reset failed, which ends that episode with `TaskError`).
pub(crate) fn start(
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
                turns: Vec::new(),
                success: false,
                status,
            }
        })
        .collect();
    (episodes, sessions)
}

/// What every turn of a rollout needs.
struct Turns<'a, B: Kernels> {
    engines: Engines<'a, B>,
    chat: &'a ChatFormat,
    controller: &'a Controller,
    sampling: &'a Sampling,
    context: usize,
    /// Partial rollouts: where the fresh engine's replies get newer weights mid-reply.
    newer: Option<Newer<'a, B>>,
}

/// Newer weights than the given version, once some are published: what a reply under way
/// goes on with at its next token (`pool { interrupt = token }`).
pub type Newer<'a, B> = &'a dyn Fn(u64) -> Option<Arc<Versioned<Policy<B>>>>;

/// A policy a generation runs on: an engine's, or newer weights it took up on the way.
enum Held<'a, B: Kernels> {
    Engine(&'a Policy<B>),
    Newer(Arc<Versioned<Policy<B>>>),
}

impl<B: Kernels> Deref for Held<'_, B> {
    type Target = Policy<B>;

    fn deref(&self) -> &Policy<B> {
        match self {
            Held::Engine(policy) => policy,
            Held::Newer(weights) => &weights.weights,
        }
    }
}

impl<B: Kernels> Turns<'_, B> {
    /// Plays the episodes to the end, one batched generation per turn; with a plan, snapshots
    /// the running episodes at its boundaries.
    fn run(
        &self,
        episodes: &mut [Episode],
        sessions: &mut [Option<SessionId>],
        plan: Option<&ForkPlan>,
        rng: &mut (impl Rng + Send),
    ) -> Vec<Fork> {
        let mut forks = Vec::new();
        let mut kept = KeptCaches::new(episodes.len());
        while self.turn(episodes, sessions, plan, &mut forks, Some(&mut kept), rng) {}
        forks
    }

    /// One turn of every running episode (one batched generation per engine); `false` when
    /// none was running.
    fn turn(
        &self,
        episodes: &mut [Episode],
        sessions: &mut [Option<SessionId>],
        plan: Option<&ForkPlan>,
        forks: &mut Vec<Fork>,
        mut kept: Option<&mut KeptCaches<B>>,
        rng: &mut (impl Rng + Send),
    ) -> bool {
        let (chat, controller, context) = (self.chat, self.controller, self.context);
        // An instruction too long for the context leaves no room for a reply: the episode
        // ends before its first turn, with nothing to learn from (an empty transcript).
        for (i, episode) in episodes.iter_mut().enumerate() {
            if episode.cut_before_turn(context) {
                episode.success = finish(controller, sessions[i]);
            }
        }
        if let Some(plan) = plan {
            snapshot(controller, episodes, sessions, plan, forks);
        }
        let active: Vec<usize> = (0..episodes.len())
            .filter(|&i| episodes[i].is_running())
            .collect();
        if active.is_empty() {
            return false;
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
        let picks: Vec<Pick> = active.iter().map(|_| self.engines.pick(rng)).collect();
        let (generations, taken) = self.generate(
            &prompts,
            &active,
            &picks,
            kept.as_deref_mut(),
            &turn_sampling,
            rng,
        );

        // Parse every reply; the parsed calls of this turn are stepped together.
        let parsed: Vec<Result<ToolCall, String>> = generations
            .iter()
            .map(|g| chat.parse_reply(&g.tokens))
            .collect();
        let calls: Vec<(SessionId, ToolCall)> = active
            .iter()
            .zip(&parsed)
            .filter_map(|(&i, call)| Some((sessions[i]?, call.as_ref().ok()?.clone())))
            .collect();
        let mut answers = controller.step_many(&calls).into_iter();

        for (((&i, generation), call), pick) in
            active.iter().zip(generations).zip(parsed).zip(picks)
        {
            let episode = &mut episodes[i];
            let step = match call {
                Ok(_) => match answers.next() {
                    Some(Ok(step)) => step,
                    Some(Err(e)) => failed(e.to_string()),
                    None => failed("the controller gave no answer".to_string()),
                },
                Err(message) => unparsed(message),
            };
            let version = self.engines.engine(pick).version;
            let end = episode.record_turn(chat, &generation, version, &taken, step, context);
            if end != TurnEnd::Running
                && let Some(kept) = kept.as_deref_mut()
            {
                kept.forget(i);
            }
            match end {
                TurnEnd::Running => {}
                TurnEnd::Environment => {
                    episode.success = sessions[i]
                        .and_then(|id| controller.success(id).ok())
                        .unwrap_or(false);
                }
                TurnEnd::Runtime => episode.success = finish(controller, sessions[i]),
            }
        }
        true
    }

    /// One turn's replies: each prompt (of episode `episodes[i]`) generated by the engine
    /// picked for it, one batched call per engine (fresh first), the replies back in prompt
    /// order; and the versions of the newer weights the fresh engine's replies took up on the
    /// way, in order (a reply's switches are a prefix of them).
    fn generate(
        &self,
        prompts: &[Vec<u32>],
        episodes: &[usize],
        picks: &[Pick],
        mut kept: Option<&mut KeptCaches<B>>,
        sampling: &Sampling,
        rng: &mut (impl Rng + Send),
    ) -> (Vec<Generation>, Vec<u64>) {
        if picks.iter().all(|p| *p == Pick::Fresh) {
            return self.generate_on(Pick::Fresh, prompts, episodes, kept, sampling, rng);
        }
        let mut out: Vec<Option<Generation>> = vec![None; prompts.len()];
        let mut taken = Vec::new();
        for pick in [Pick::Fresh, Pick::Stale] {
            let members: Vec<usize> = (0..prompts.len()).filter(|&i| picks[i] == pick).collect();
            if members.is_empty() {
                continue;
            }
            let subset: Vec<Vec<u32>> = members.iter().map(|&i| prompts[i].clone()).collect();
            let of: Vec<usize> = members.iter().map(|&i| episodes[i]).collect();
            let (generations, newer) =
                self.generate_on(pick, &subset, &of, kept.as_deref_mut(), sampling, rng);
            taken.extend(newer);
            for (i, generation) in members.into_iter().zip(generations) {
                out[i] = Some(generation);
            }
        }
        (
            out.into_iter().map(Option::unwrap_or_default).collect(),
            taken,
        )
    }

    /// The replies of engine `pick` to `prompts` (of episodes `episodes`). With `kept`, each
    /// episode's keys and values from its previous turn on this engine are reused, so only the
    /// turn's new tokens are prefilled, and this turn's are kept for the next.
    fn generate_on(
        &self,
        pick: Pick,
        prompts: &[Vec<u32>],
        episodes: &[usize],
        kept: Option<&mut KeptCaches<B>>,
        sampling: &Sampling,
        rng: &mut (impl Rng + Send),
    ) -> (Vec<Generation>, Vec<u64>) {
        let engine = self.engines.engine(pick);
        let policy = engine.weights;
        if let (Pick::Fresh, Some(newer), None) = (pick, self.newer, &kept) {
            let mut version = engine.version;
            let mut taken = Vec::new();
            let mut next = || {
                let weights = newer(version)?;
                version = weights.version;
                taken.push(version);
                Some(Held::Newer(weights))
            };
            let generations =
                generate_switching(Held::Engine(policy), &mut next, prompts, sampling, rng);
            return (generations, taken);
        }
        let Some(kept) = kept else {
            return (generate(policy, prompts, sampling, rng), Vec::new());
        };
        let mut slots: Vec<_> = episodes.iter().map(|&e| kept.take(e, pick)).collect();
        let generations = generate_kept(policy, prompts, &mut slots, sampling, rng);
        for (&e, slot) in episodes.iter().zip(slots) {
            kept.put(e, pick, slot);
        }
        kept.trim();
        (generations, Vec::new())
    }
}

/// Per episode of a rollout, the keys and values its last turn left (with the engine that
/// computed them: another engine's weights give other keys), within a memory budget.
struct KeptCaches<B: Kernels> {
    slots: Vec<Option<(Pick, KeptCache<B>)>>,
}

impl<B: Kernels> KeptCaches<B> {
    /// Bytes the kept keys and values may take together; beyond it the longest are dropped
    /// (their episodes prefill their whole transcript again next turn). A quarter of what a
    /// 24 GB machine has: evaluations of many long episodes keep what fits.
    const BUDGET: usize = 6 << 30;

    fn new(episodes: usize) -> Self {
        KeptCaches {
            slots: (0..episodes).map(|_| None).collect(),
        }
    }

    /// Episode `episode`'s cache, if `pick` computed it.
    fn take(&mut self, episode: usize, pick: Pick) -> Option<KeptCache<B>> {
        match self.slots[episode].take() {
            Some((by, cache)) if by == pick => Some(cache),
            _ => None,
        }
    }

    fn put(&mut self, episode: usize, pick: Pick, cache: Option<KeptCache<B>>) {
        self.slots[episode] = cache.map(|cache| (pick, cache));
    }

    /// Drops an ended episode's cache: it has no next turn.
    fn forget(&mut self, episode: usize) {
        self.slots[episode] = None;
    }

    /// Drops the longest caches until the rest fit in [`KeptCaches::BUDGET`].
    fn trim(&mut self) {
        let mut sizes: Vec<(usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| Some((slot.as_ref()?.1.bytes(), i)))
            .collect();
        let mut total: usize = sizes.iter().map(|(bytes, _)| bytes).sum();
        sizes.sort_unstable();
        while total > Self::BUDGET {
            let Some((bytes, i)) = sizes.pop() else { break };
            self.slots[i] = None;
            total -= bytes;
        }
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
        // A running episode takes one turn between two calls, so it meets each boundary once.
        let due = episode.is_running()
            && plan.boundaries.contains(&episode.turn_count())
            && episode.turn_count() < episode.spec.max_turns;
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
                boundary: episode.turn_count(),
                state: episode.clone(),
                sessions: copies,
            });
        }
    }
}

/// Ends a session the runtime stops (turn budget, context); returns whether it was solved.
pub(crate) fn finish(controller: &Controller, session: Option<SessionId>) -> bool {
    let Some(id) = session else {
        return false;
    };
    let success = controller.success(id).unwrap_or(false);
    let _ = controller.cancel(id);
    success
}

/// The step of an environment call the controller could not serve.
pub(crate) fn failed(reason: String) -> Step {
    Step {
        observation: format!("Error: the environment failed: {reason}"),
        reward: 0.0,
        status: Status::TaskError,
    }
}

/// How a turn left its episode (see [`Episode::record_turn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TurnEnd {
    /// The episode goes on.
    Running,
    /// The environment ended it: whether it was solved is the environment's to say.
    Environment,
    /// The runtime ended it (turn budget, or no room for another reply): the session must be
    /// asked whether it was solved, then ended.
    Runtime,
}

/// The step of a reply that is no call: the parser's message, without touching the
/// environment.
pub(crate) fn unparsed(message: String) -> Step {
    Step {
        observation: message,
        reward: 0.0,
        status: Status::InvalidAction,
    }
}

impl Episode {
    pub(crate) fn is_running(&self) -> bool {
        matches!(self.status, Status::Running | Status::InvalidAction)
    }

    /// Ends a running episode whose transcript leaves no room for a reply (`TaskLimitReached`,
    /// an empty transcript: nothing to learn from); returns whether it did. The caller asks
    /// the session whether it was solved.
    pub(crate) fn cut_before_turn(&mut self, context: usize) -> bool {
        if !self.is_running() || self.transcript.tokens.len() + 2 <= context {
            return false;
        }
        self.status = Status::TaskLimitReached;
        self.transcript = Transcript::default();
        self.logprobs.clear();
        true
    }

    /// Appends one agent turn (the reply `generation` by policy `version`, and from each of its
    /// switches on by the version `later` gives in order) and the
    /// environment's answer `step`, and decides whether the episode goes on: it ends when the
    /// environment says so, at its turn budget, or when no reply would fit after the
    /// observation (which is then not kept: training never sees more than `context` tokens).
    /// Rollout and replay share it, so a replayed episode ends exactly where the played one
    /// did.
    pub(crate) fn record_turn(
        &mut self,
        chat: &ChatFormat,
        generation: &Generation,
        version: u64,
        later: &[u64],
        step: Step,
        context: usize,
    ) -> TurnEnd {
        chat.push_agent(&mut self.transcript, &generation.tokens);
        self.logprobs.extend_from_slice(&generation.logprobs);
        let turns = self.turn_count() + 1;
        let end = if step.done() {
            self.status = step.status;
            TurnEnd::Environment
        } else if turns >= self.spec.max_turns {
            self.status = Status::TaskLimitReached;
            TurnEnd::Runtime
        } else {
            let before = self.transcript.tokens.len();
            chat.push_observation(&mut self.transcript, &step.observation);
            if self.transcript.tokens.len() + 2 > context {
                self.transcript.tokens.truncate(before);
                self.transcript.agent_mask.truncate(before);
                self.status = Status::TaskLimitReached;
                TurnEnd::Runtime
            } else {
                let added = self.transcript.tokens.len() - before;
                self.logprobs.extend(std::iter::repeat_n(0.0, added));
                TurnEnd::Running
            }
        };
        self.turns.push(Turn {
            tokens: generation.tokens.len(),
            version,
            switches: generation
                .switches
                .iter()
                .copied()
                .zip(later.iter().copied())
                .collect(),
            step,
        });
        end
    }
}

/// Why an oracle episode is not a demonstration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfit {
    /// The task has no oracle, or the oracle does not solve the instance within the turn
    /// budget: such an episode would teach failure.
    Unsolved,
    /// The whole episode takes more tokens than the context holds.
    Context {
        /// The tokens of the episode.
        tokens: usize,
    },
}

/// The oracle's episode of an instance, as the transcript the policy should have produced:
/// solved within `max_turns`, the whole within `context`.
pub fn demonstration(
    chat: &ChatFormat,
    env: &mut dyn Environment,
    max_turns: u32,
    context: usize,
) -> Result<Transcript, Unfit> {
    let mut transcript = chat.begin(&env.reset());
    for _ in 0..max_turns {
        let call = env.oracle().ok_or(Unfit::Unsolved)?;
        chat.push_agent(&mut transcript, &chat.demo_turn(&call));
        let step = env.step(&call);
        if step.done() {
            return if !env.success() {
                Err(Unfit::Unsolved)
            } else if transcript.len() > context {
                Err(Unfit::Context {
                    tokens: transcript.len(),
                })
            } else {
                Ok(transcript)
            };
        }
        chat.push_observation(&mut transcript, &step.observation);
    }
    Err(Unfit::Unsolved)
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
