//! Rollout under the controller: an environment that panics ends only its own episode; context
//! limits; snapshots and their continuations for Monte-Carlo credit.

use std::sync::Arc;

use crate::common;
use agentry_env::controller::{Controller, ControllerConfig};
use agentry_env::kg::Kg;
use agentry_env::{Environment, Reset, Split, Status, Step, TaskGenerator, ToolCall};
use agentry_runtime::model::{Policy, PolicyConfig, Sampling};
use agentry_runtime::pool::{Engine, Engines, Versioned};
use agentry_runtime::rollout::{
    Episode, EpisodeSpec, ForkPlan, Stream, Unfit, continue_forks, demonstration, play,
    play_in_pool,
};
use agentry_runtime::text::{ChatFormat, Tokenizer};
use burn::backend::Flex;
use burn::tensor::{Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A task every instance of which is a copy of one episode: the tests' tasks need no
/// instances of their own.
struct Always<E> {
    version: &'static str,
    episode: E,
}

impl<E: Environment + Clone + Sync + 'static> TaskGenerator for Always<E> {
    fn version(&self) -> &str {
        self.version
    }

    fn instance(&self, _: Split, _: u8, _: u64) -> Box<dyn Environment> {
        Box::new(self.episode.clone())
    }
}

/// A task whose episodes panic as soon as they start.
const BROKEN: Always<BrokenEnv> = Always {
    version: "broken-1",
    episode: BrokenEnv,
};

#[derive(Clone)]
struct BrokenEnv;

impl Environment for BrokenEnv {
    fn reset(&mut self) -> Reset {
        panic!("the world is on fire")
    }

    fn step(&mut self, _: &ToolCall) -> Step {
        panic!("unreachable in this test")
    }

    fn oracle(&self) -> Option<ToolCall> {
        None
    }

    fn success(&self) -> bool {
        false
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}

fn chat() -> ChatFormat {
    ChatFormat::new(Tokenizer::train(
        ["get_neighbors(variable, relation) count(variable)"],
        300,
    ))
}

fn policy(chat: &ChatFormat) -> Policy<Flex> {
    policy_seeded(chat, 1)
}

fn policy_seeded(chat: &ChatFormat, seed: u64) -> Policy<Flex> {
    let config = PolicyConfig {
        vocab: chat.tokenizer().vocab_size(),
        layers: 1,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        context: 256,
        tie_embeddings: true,
    };
    common::seeded::<Flex, _>(&Default::default(), seed, |device| {
        config.init::<Flex>(device)
    })
}

fn sampling(chat: &ChatFormat) -> Sampling {
    Sampling {
        max_new_tokens: 8,
        stop: vec![chat.end_token()],
        ..Sampling::default()
    }
}

fn specs(tasks: usize, max_turns: u32) -> Vec<EpisodeSpec> {
    (0..8)
        .map(|i| EpisodeSpec {
            task: i % tasks,
            split: Split::Train,
            difficulty: 1,
            index: i as u64,
            max_turns,
            group: i,
        })
        .collect()
}

/// A demonstration is the oracle's episode when it is solved within the turn budget and fits
/// in the context; its longest reply is what a turn must be allowed to generate.
#[test]
fn a_demonstration_is_solved_within_the_turns_and_the_context() {
    let chat = chat();
    let kg = Kg::default();
    let demo = |max_turns, context| {
        let mut env = kg.instance(Split::Train, 1, 3);
        demonstration(&chat, env.as_mut(), max_turns, context)
    };
    let full = demo(6, 100_000).expect("the oracle solves a KG instance");
    let turns = full.agent_mask.windows(2).filter(|w| !w[0] && w[1]).count() as u32;
    assert!(turns >= 2, "a KG episode takes several calls");
    let calls: Vec<usize> = full
        .agent_mask
        .chunk_by(|a, b| a == b)
        .filter(|run| run[0])
        .map(<[bool]>::len)
        .collect();
    assert_eq!(calls.len(), turns as usize);
    assert_eq!(full.longest_reply(), *calls.iter().max().unwrap());

    // Exactly enough of each keeps it; one less leaves it out, saying why.
    assert_eq!(demo(turns, full.len()), Ok(full.clone()));
    assert_eq!(
        demo(turns, full.len() - 1),
        Err(Unfit::Context { tokens: full.len() })
    );
    assert_eq!(demo(turns - 1, full.len()), Err(Unfit::Unsolved));
}

#[test]
fn a_panicking_environment_ends_only_its_episode() {
    let tasks: Vec<Box<dyn TaskGenerator>> = vec![Box::new(Kg::default()), Box::new(BROKEN)];
    let chat = chat();
    let policy = policy(&chat);
    let controller = Controller::new(ControllerConfig::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let episodes = play(
        &policy,
        &chat,
        &tasks,
        &controller,
        &specs(2, 2),
        &sampling(&chat),
        256,
        &mut rng,
    );
    for episode in &episodes {
        if episode.spec.task == 1 {
            assert_eq!(episode.status, Status::TaskError);
            assert!(episode.transcript.is_empty() && episode.turns.is_empty());
        } else {
            assert_ne!(episode.status, Status::TaskError);
            assert!(!episode.turns.is_empty() && !episode.transcript.is_empty());
        }
    }
    assert_eq!(controller.stats().panics, 4);
    assert_eq!(
        controller.stats().live_sessions,
        0,
        "every session is closed"
    );
}

#[test]
fn transcripts_never_exceed_the_context() {
    let tasks: Vec<Box<dyn TaskGenerator>> = vec![Box::new(Kg::default())];
    let chat = chat();
    let policy = policy(&chat);
    let controller = Controller::new(ControllerConfig::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let context = 400;
    let episodes = play(
        &policy,
        &chat,
        &tasks,
        &controller,
        &specs(1, 50),
        &sampling(&chat),
        context,
        &mut rng,
    );
    for episode in &episodes {
        assert!(
            episode.transcript.len() <= context,
            "{}",
            episode.transcript.len()
        );
        assert_eq!(episode.transcript.len(), episode.logprobs.len());
        assert_eq!(episode.status, Status::TaskLimitReached);
        assert!(!episode.turns.is_empty());
        // Turn credit relies on the turns' token counts covering the agent tokens exactly.
        let agent: Vec<usize> = (0..episode.transcript.len())
            .filter(|&j| episode.transcript.agent_mask[j])
            .collect();
        assert_eq!(episode.reply_positions().concat(), agent);
        assert_eq!(episode.turn_tokens().iter().sum::<usize>(), agent.len());
        let turn_rewards = episode.turn_rewards();
        assert_eq!(turn_rewards.len(), episode.turns.len());
        assert_eq!(
            turn_rewards.iter().fold(0.0, |a, r| a + r),
            episode.reward()
        );
    }
    assert_eq!(controller.stats().live_sessions, 0);

    // An instruction longer than the context: the episode ends before its first turn.
    let episodes = play(
        &policy,
        &chat,
        &tasks,
        &controller,
        &specs(1, 50),
        &sampling(&chat),
        24,
        &mut rng,
    );
    for episode in &episodes {
        assert!(episode.transcript.is_empty() && episode.logprobs.is_empty());
        assert_eq!(
            (episode.status, episode.turns.len()),
            (Status::TaskLimitReached, 0)
        );
    }
    assert_eq!(controller.stats().live_sessions, 0);
}

/// A task with a short instruction whose episodes only end at their turn limit.
const PATIENT: Always<PatientEnv> = Always {
    version: "patient-1",
    episode: PatientEnv,
};

#[derive(Clone)]
struct PatientEnv;

impl Environment for PatientEnv {
    fn reset(&mut self) -> Reset {
        Reset {
            instruction: "wait".into(),
            tools: Vec::new(),
        }
    }

    fn step(&mut self, _: &ToolCall) -> Step {
        Step {
            observation: "waited".into(),
            reward: 0.5,
            status: Status::Running,
        }
    }

    fn oracle(&self) -> Option<ToolCall> {
        None
    }

    fn success(&self) -> bool {
        false
    }

    fn box_clone(&self) -> Box<dyn Environment> {
        Box::new(self.clone())
    }
}

#[test]
fn snapshots_are_taken_at_their_boundaries_and_their_continuations_end_every_session() {
    let tasks: Vec<Box<dyn TaskGenerator>> = vec![Box::new(PATIENT)];
    let chat = chat();
    let policy = policy(&chat);
    let controller = Controller::new(ControllerConfig::default()).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let plan = ForkPlan {
        boundaries: vec![0, 2],
        k: 3,
    };
    // Three turns each: episodes are snapshotted at the start and after their second turn
    // (never after the third, the last).
    let (episodes, forks) = play_in_pool(
        &Engines::single(&policy, 0),
        &chat,
        &tasks,
        &controller,
        &specs(1, 3),
        &sampling(&chat),
        256,
        Some(&plan),
        &mut rng,
    );
    // Every episode at the start; after turn 2, those that went on to a third turn.
    let places: Vec<(usize, u32)> = forks.iter().map(|f| (f.episode, f.boundary)).collect();
    let went_on: Vec<(usize, u32)> = (0..8)
        .filter(|&i| episodes[i].turns.len() == 3)
        .map(|i| (i, 2))
        .collect();
    assert_eq!(went_on.len(), 8, "every episode runs to its limit");
    let expected: Vec<(usize, u32)> = (0..8).map(|i| (i, 0)).chain(went_on).collect();
    assert_eq!(places, expected);
    // The snapshots' copies are live sessions until their continuations are played.
    let snapshots = places.len();
    assert_eq!(controller.stats().live_sessions, snapshots * 3);
    let returns = continue_forks(
        &policy,
        &chat,
        &controller,
        forks,
        &sampling(&chat),
        256,
        1.0,
        &mut rng,
    );
    assert_eq!(returns.len(), snapshots);
    assert!(returns.iter().all(|r| r.len() == 3));
    assert_eq!(controller.stats().live_sessions, 0);
}

#[test]
fn cross_policy_sampling_records_each_turns_engine_and_its_log_probabilities() {
    let tasks: Vec<Box<dyn TaskGenerator>> = vec![Box::new(PATIENT)];
    let chat = chat();
    let fresh = policy_seeded(&chat, 1);
    let stale = policy_seeded(&chat, 2);
    let controller = Controller::new(ControllerConfig::default()).unwrap();
    let engines = |cross_policy: f64| Engines {
        fresh: Engine {
            weights: &fresh,
            version: 7,
        },
        stale: Some(Engine {
            weights: &stale,
            version: 5,
        }),
        cross_policy,
    };
    let play_with = |cross_policy: f64, seed: u64| {
        play_in_pool(
            &engines(cross_policy),
            &chat,
            &tasks,
            &controller,
            &specs(1, 4),
            &sampling(&chat),
            256,
            None,
            &mut ChaCha8Rng::seed_from_u64(seed),
        )
        .0
    };
    // Without cross-policy sampling every turn is the fresh engine's; with probability 1, the
    // stale one's.
    let versions = |episodes: &[agentry_runtime::rollout::Episode]| -> Vec<u64> {
        episodes
            .iter()
            .flat_map(|e| e.turns.iter().map(|turn| turn.version))
            .collect()
    };
    assert!(versions(&play_with(0.0, 3)).iter().all(|v| *v == 7));
    assert!(versions(&play_with(1.0, 3)).iter().all(|v| *v == 5));
    let episodes = play_with(0.5, 3);
    let mixed = versions(&episodes);
    let turns: usize = episodes.iter().map(|e| e.turns.len()).sum();
    assert_eq!(mixed.len(), turns);
    let stale_turns = mixed.iter().filter(|v| **v == 5).count();
    assert!(
        (turns / 4..=turns * 3 / 4).contains(&stale_turns),
        "{stale_turns} of {turns} turns stale"
    );
    assert!(
        episodes
            .iter()
            .any(|e| e.turns.iter().any(|t| t.version == 5)
                && e.turns.iter().any(|t| t.version == 7)),
        "some trajectory mixes versions"
    );
    // Each turn's tokens carry the log-probabilities of the engine that generated them.
    let device = Default::default();
    for episode in &episodes {
        let tokens = &episode.transcript.tokens;
        let row = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(
                tokens.iter().map(|&t| i64::from(t)).collect(),
                [1, tokens.len()],
            ),
            &device,
        );
        let all = vec![true; tokens.len() - 1];
        let under = |policy: &Policy<Flex>| -> Vec<f32> {
            policy
                .scored_logprobs(row.clone(), &all, 1.0)
                .into_data()
                .into_vec()
                .unwrap()
        };
        let (by_fresh, by_stale) = (under(&fresh), under(&stale));
        assert!(
            by_fresh != by_stale,
            "the engines differ, so the check can fail"
        );
        for (turn, positions) in episode.reply_positions().into_iter().enumerate() {
            let scores = if episode.turns[turn].version == 7 {
                &by_fresh
            } else {
                &by_stale
            };
            for j in positions {
                let (recorded, scored) = (episode.logprobs[j], scores[j - 1]);
                assert!(
                    (recorded - scored).abs() < 1e-4,
                    "turn {turn}, token {j}: recorded {recorded}, its engine gives {scored}"
                );
            }
        }
    }
}

/// Each agent token's log-probability under `policy`, by transcript position (`None` where
/// the mask says it is not the agent's).
fn agent_logprobs(episode: &Episode, policy: &Policy<Flex>) -> Vec<f32> {
    let tokens = &episode.transcript.tokens;
    let row = Tensor::<Flex, 2, Int>::from_data(
        TensorData::new(
            tokens.iter().map(|&t| i64::from(t)).collect(),
            [1, tokens.len()],
        ),
        &Default::default(),
    );
    let all = vec![true; tokens.len() - 1];
    policy
        .scored_logprobs(row, &all, 1.0)
        .into_data()
        .into_vec()
        .unwrap()
}

/// Partial rollouts in a stream (`interrupt = token`): a reply under way when newer weights
/// come goes on with them from its next token; each token keeps the log-probability and the
/// version of the weights that sampled it. `interrupt = never`: every episode plays each turn
/// with the weights it started with, whatever came since.
#[test]
fn a_stream_switches_weights_mid_reply_or_keeps_each_episodes_own() {
    let tasks: Vec<Box<dyn TaskGenerator>> = vec![Box::new(PATIENT)];
    let chat = chat();
    let old = policy_seeded(&chat, 1);
    // Not a clone of a policy: burn draws a parameter's initial value at its first use, and a
    // clone taken before it draws its own.
    let newer = Arc::new(Versioned {
        weights: policy_seeded(&chat, 2),
        version: 4,
    });
    let new = &newer.weights;
    let controller = Controller::new(ControllerConfig::default()).unwrap();
    let sampling = Sampling {
        max_new_tokens: 12,
        ..Sampling::default()
    };
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let fresh = |policy, version| Engines {
        fresh: Engine {
            weights: policy,
            version,
        },
        stale: None,
        cross_policy: 0.0,
    };

    // Token: newer weights are offered at the third decode step of every turn.
    let mut stream = Stream::new(&chat, &tasks, &controller, &sampling, 256);
    stream.admit(&specs(1, 3)[..4], 3);
    let asked = std::sync::atomic::AtomicUsize::new(0);
    let offer = |version: u64| {
        let calls = asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        (version < 4 && calls.is_multiple_of(3)).then(|| Arc::clone(&newer))
    };
    let mut episodes = Vec::new();
    while !stream.is_empty() {
        episodes.extend(stream.turn(&fresh(&old, 3), Some(&offer), &mut rng));
    }
    assert_eq!(episodes.len(), 4);
    let mut switched = 0;
    for episode in &episodes {
        let (by_old, by_new) = (agent_logprobs(episode, &old), agent_logprobs(episode, new));
        for (turn, positions) in episode.turns.iter().zip(episode.reply_positions()) {
            assert_eq!(turn.version, 3);
            assert!(turn.switches.len() <= 1, "{:?}", turn.switches);
            switched += turn.switches.len();
            if let Some(&(at, version)) = turn.switches.first() {
                assert_eq!(version, 4);
                assert!(0 < at && at < turn.tokens, "{at} of {}", turn.tokens);
            }
            for (k, (j, version)) in positions.into_iter().zip(turn.token_versions()).enumerate() {
                let scores = if version == 4 { &by_new } else { &by_old };
                let (recorded, scored) = (episode.logprobs[j], scores[j - 1]);
                assert!(
                    (recorded - scored).abs() < 1e-4,
                    "reply token {k} (version {version}): recorded {recorded}, scored {scored}"
                );
            }
        }
    }
    assert!(switched > 0, "some reply took the newer weights");

    // Never: episodes that started on version 3 keep it after version 4 arrives; those
    // admitted since play on version 4.
    let mut stream = Stream::new(&chat, &tasks, &controller, &sampling, 256);
    stream.admit(&specs(1, 3)[..2], 3);
    let pinned = |version| match version {
        3 => fresh(&old, 3),
        4 => fresh(new, 4),
        other => panic!("no episode started on version {other}"),
    };
    let mut episodes = stream.turn_pinned(pinned, &mut rng);
    stream.admit(&specs(1, 3)[2..4], 4);
    assert_eq!(stream.started_versions().last(), Some(&4));
    while !stream.is_empty() {
        episodes.extend(stream.turn_pinned(pinned, &mut rng));
    }
    assert_eq!(episodes.len(), 4);
    for episode in &episodes {
        let started = if episode.spec.index < 2 { 3 } else { 4 };
        assert!(
            episode
                .turns
                .iter()
                .all(|t| t.version == started && t.switches.is_empty()),
            "episode {}: {:?}",
            episode.spec.index,
            episode.turns.iter().map(|t| t.version).collect::<Vec<_>>()
        );
    }
    assert_eq!(controller.stats().live_sessions, 0);
}
