//! Replay: plays a recorded episode ([`crate::trajectory`]) again and checks that it comes out
//! the same.
//!
//! A trajectory is named `FILE.jsonl:N`, line `N` (from 1) of an `episodes/*.jsonl` file of a
//! run directory. The replay
//!
//! 1. rebuilds the instance from the run directory's `experiment.json` and
//!    `task_versions.json` (refusing when the task's generator has another version now), steps
//!    a fresh environment with the recorded replies, and checks every observation, reward and
//!    status, where the episode ends, and its reward, success and status;
//! 2. when the run directory holds the weights of the recorded policy version (`policy.mpk`
//!    for the final version, else the checkpoint `checkpoints/rl-NNNNNN.ckpt` of that step;
//!    version 0 of a run without a warm-up is the model as declared, rebuilt from the spec),
//!    re-scores the recorded agent tokens with them and compares the log-probabilities with
//!    the recorded behaviour ones (within [`LOGPROB_TOLERANCE`]), and for a greedy episode
//!    regenerates every turn from its prompt and checks the tokens are the recorded ones.
//!
//! A sampled episode cannot be regenerated alone: one RNG served the whole evaluation batch,
//! so its draws depend on every other episode. Its tokens are checked by the re-scoring only.
//! Rollout and replay share the turn logic (`Episode::record_turn`), so the replayed episode
//! ends exactly where a played one would.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use agentry_dsl::spec::{self, Device};
use agentry_env::controller::{Controller, ControllerConfig};
use agentry_env::{Step, TaskGenerator};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::{Int, Tensor, TensorData};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::checkpoint::{Checkpoint, Phase};
use crate::device::{self, OnBackend};
use crate::error::RunError;
use crate::model::Kernels;
use crate::model::Origin;
use crate::model::TrainBackend;
use crate::model::{Generation, Policy, PolicyConfig, Sampling, generate};
use crate::rollout::{Episode, TurnEnd, failed, finish, start, unparsed};
use crate::tasks::RemoteTasks;
use crate::text::{ChatFormat, Tokenizer};
use crate::trajectory::{self, Trajectory, render};

/// Largest |Δ log-probability| between the recorded behaviour log-probabilities and the
/// re-scored ones that still counts as identical: generation (KV cache, left padding, a
/// batch) and scoring (one right-padded pass) sum in different orders, a few ulps apart.
pub const LOGPROB_TOLERANCE: f32 = 1e-4;

/// Why a replay could not be done at all (a replay that ran and found a difference is a
/// [`Replay`] with a `mismatch`). Each says what was wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trajectory's name or its line is not usable.
    #[error("{0}")]
    Trajectory(String),
    /// A file of the run directory is missing or unreadable.
    #[error("cannot replay from `{path}`: {reason}")]
    RunFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The task's generator has another version than when the episode was played, so the
    /// instance may differ.
    #[error(
        "task `{task}` was played with generator version `{recorded}` but this build has \
         `{now}`: its instances may differ, so the episode cannot be replayed; use the \
         Agentry that played it"
    )]
    TaskChanged {
        /// The task.
        task: String,
        /// The recorded version.
        recorded: String,
        /// This build's version.
        now: String,
    },
    /// Setting up the task, the device or the weights failed.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// What a replay found.
#[derive(Debug)]
pub struct Replay {
    /// What is replayed: the instance, the evaluation, the policy version, the decoding.
    pub header: String,
    /// The replayed episode as the samples files show it.
    pub transcript: String,
    /// One line per check: what was compared and how it came out.
    pub checks: Vec<String>,
    /// The first difference, if any.
    pub mismatch: Option<String>,
}

impl Replay {
    /// Whether every check found the episode identical.
    pub fn identical(&self) -> bool {
        self.mismatch.is_none()
    }

    /// The verdict line.
    pub fn verdict(&self) -> String {
        match &self.mismatch {
            None => "verdict: identical".to_string(),
            Some(first) => format!("verdict: MISMATCH: {first}"),
        }
    }
}

/// A recorded episode's place: line `line` (from 1) of `file`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The `episodes/*.jsonl` file.
    pub file: PathBuf,
    /// The line, from 1.
    pub line: usize,
}

impl Target {
    /// Parses `FILE.jsonl:N`.
    pub fn parse(name: &str) -> Result<Self, ReplayError> {
        let bad = |why: &str| {
            ReplayError::Trajectory(format!(
                "`{name}` {why}: name a recorded episode as `RUN_DIR/episodes/FILE.jsonl:N`, \
                 line N from 1"
            ))
        };
        let (file, line) = name.rsplit_once(':').ok_or_else(|| bad("names no line"))?;
        let line: usize = line
            .parse()
            .map_err(|_| bad("does not end in a line number"))?;
        if line == 0 || file.is_empty() {
            return Err(bad("names no line (lines count from 1)"));
        }
        Ok(Target {
            file: PathBuf::from(file),
            line,
        })
    }

    /// The run directory: the parent of the file's `episodes` folder.
    fn run_dir(&self) -> Result<PathBuf, ReplayError> {
        let folder = self.file.parent();
        match folder.and_then(|f| Some((f.file_name()?, f.parent()?))) {
            Some((name, run_dir)) if name == trajectory::DIR => Ok(run_dir.to_path_buf()),
            _ => Err(ReplayError::Trajectory(format!(
                "`{}` is not in the `{}` folder of a run directory",
                self.file.display(),
                trajectory::DIR
            ))),
        }
    }

    /// The recorded episode on the line.
    pub fn read(&self) -> Result<Trajectory, ReplayError> {
        let text = std::fs::read_to_string(&self.file).map_err(|e| {
            ReplayError::Trajectory(format!("cannot read `{}`: {e}", self.file.display()))
        })?;
        let count = text.lines().count();
        let line = text.lines().nth(self.line - 1).ok_or_else(|| {
            ReplayError::Trajectory(format!(
                "`{}` has {count} episodes (lines); there is no line {}",
                self.file.display(),
                self.line
            ))
        })?;
        let trajectory: Trajectory = serde_json::from_str(line).map_err(|e| {
            ReplayError::Trajectory(format!(
                "`{}:{}` is not a recorded episode: {e}",
                self.file.display(),
                self.line
            ))
        })?;
        if !(1..=3).contains(&trajectory.difficulty) {
            return Err(ReplayError::Trajectory(format!(
                "`{}:{}` records difficulty {}, but difficulties are 1 to 3",
                self.file.display(),
                self.line,
                trajectory.difficulty
            )));
        }
        Ok(trajectory)
    }
}

/// Replays the episode `name` (`FILE.jsonl:N`) on `device` (flex unless given). `remote`
/// connects the episode's task when it is a `remote = "URL"` one, as in the run
/// ([`crate::train::RunOptions::remote_tasks`]); a replay of a built-in or user task needs none.
pub fn replay(
    name: &str,
    device: Option<Device>,
    remote: Option<&dyn RemoteTasks>,
) -> Result<Replay, ReplayError> {
    let target = Target::parse(name)?;
    let recorded = target.read()?;
    let run = RunFiles::read(&target.run_dir()?)?;
    let generator = run.generator(&recorded, remote)?;
    let header = format!(
        "replaying {} {} instance {} difficulty {} ({} evaluation, policy version {}, {}) from \
         {}:{}",
        recorded.task,
        split_name(recorded.split),
        recorded.index,
        recorded.difficulty,
        recorded.evaluation,
        versions(&recorded.policy_versions),
        if recorded.decoding.greedy {
            "greedy"
        } else {
            "sampled"
        },
        target.file.display(),
        target.line
    );
    if run.tokenizer.is_none() {
        return crate::endpoint::replay(&run.dir, &recorded, generator, header);
    }
    let chat = ChatFormat::new(run.tokenizer()?.clone());
    let mut checks = Vec::new();
    let played = play_recorded(&recorded, generator, &chat)?;
    let transcript = render(&recorded.task, &played.episode, chat.tokenizer());
    if let Some(first) = played.mismatch {
        checks.push("environment: differs; weights not checked".to_string());
        return Ok(Replay {
            header,
            transcript,
            checks,
            mismatch: Some(first),
        });
    }
    checks.push(format!(
        "environment: {} turns, every observation, reward and status identical; success {} \
         and status {:?} as recorded",
        recorded.turns.len(),
        recorded.success,
        recorded.status
    ));

    let mut mismatch = None;
    let mut weights = BTreeMap::new();
    for &version in recorded.policy_versions.iter().collect::<BTreeSet<_>>() {
        match run.weights_of(version) {
            Some(found) => {
                weights.insert(version, found);
            }
            None => checks.push(format!(
                "weights: none for policy version {version} in the run directory (`policy.mpk` \
                 holds the final version, `checkpoints/rl-NNNNNN.ckpt` step N): log-probs and \
                 tokens of its turns not checked"
            )),
        }
    }
    if !weights.is_empty() {
        let work = PolicyChecks {
            spec: &run.spec,
            recorded: &recorded,
            episode: &played.episode,
            prompts: &played.prompts,
            chat: &chat,
            weights: &weights,
        };
        // The run's own products, so its log-probs are re-scored as it computed them.
        device::set_matmul_precision(run.spec.matmul_precision);
        let (lines, first) =
            device::dispatch(device.unwrap_or(Device::Flex), work).map_err(RunError::from)??;
        checks.extend(lines);
        mismatch = first;
    }
    Ok(Replay {
        header,
        transcript,
        checks,
        mismatch,
    })
}

/// The files of a run directory a replay (or an export) reads.
pub(crate) struct RunFiles {
    dir: PathBuf,
    pub(crate) spec: spec::Experiment,
    task_versions: BTreeMap<String, String>,
    /// The policy's tokenizer; an endpoint evaluation's run ([`crate::endpoint`]) has none.
    tokenizer: Option<Tokenizer>,
    /// The RL steps of the finished run (`summary.json`): `policy.mpk` holds that version.
    pub(crate) final_version: Option<u64>,
}

impl RunFiles {
    pub(crate) fn read(dir: &Path) -> Result<Self, ReplayError> {
        fn json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, ReplayError> {
            let fail = |reason: String| ReplayError::RunFile {
                path: path.to_path_buf(),
                reason,
            };
            let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
            serde_json::from_str(&text).map_err(|e| fail(format!("unreadable: {e}")))
        }
        let spec: spec::Experiment = json(&dir.join("experiment.json"))?;
        let task_versions = json(&dir.join("task_versions.json"))?;
        let path = dir.join("tokenizer.json");
        let tokenizer = if dir.join(crate::endpoint::FILE).is_file() && !path.exists() {
            None
        } else {
            Some(Tokenizer::load(&path).map_err(|e| ReplayError::RunFile {
                path: path.clone(),
                reason: e.to_string(),
            })?)
        };
        let final_version = match dir.join(crate::RunSummary::FILE) {
            summary if summary.is_file() => json::<serde_json::Value>(&summary)?
                .get("steps")
                .and_then(serde_json::Value::as_u64),
            _ => None,
        };
        Ok(RunFiles {
            dir: dir.to_path_buf(),
            spec,
            task_versions,
            tokenizer,
            final_version,
        })
    }

    /// The policy's tokenizer.
    ///
    /// # Errors
    /// For the run of an endpoint evaluation, which played no policy of its own.
    pub(crate) fn tokenizer(&self) -> Result<&Tokenizer, ReplayError> {
        self.tokenizer.as_ref().ok_or_else(|| ReplayError::RunFile {
            path: self.dir.join(crate::endpoint::FILE),
            reason: "the run evaluated a model behind an endpoint: it has no weights or \
                     tokenizer of its own"
                .to_string(),
        })
    }

    /// The recorded task's generator, once its version is known to be the recorded one.
    fn generator(
        &self,
        recorded: &Trajectory,
        remote: Option<&dyn RemoteTasks>,
    ) -> Result<Box<dyn TaskGenerator>, ReplayError> {
        let task = self
            .spec
            .tasks
            .iter()
            .position(|t| t.name == recorded.task)
            .ok_or_else(|| {
                ReplayError::Trajectory(format!(
                    "the episode's task `{}` is not a task of experiment `{}`",
                    recorded.task, self.spec.name
                ))
            })?;
        // Only this task is resolved: another task's Rust type or server is not needed.
        let mut one = self.spec.clone();
        one.tasks = vec![self.spec.tasks[task].clone()];
        let generator = crate::tasks::resolve(&|_| None, remote, &one)
            .map_err(RunError::from)?
            .remove(0);
        let run_version =
            self.task_versions
                .get(&recorded.task)
                .ok_or_else(|| ReplayError::RunFile {
                    path: self.dir.join("task_versions.json"),
                    reason: format!("no version for task `{}`", recorded.task),
                })?;
        for recorded_version in [run_version, &recorded.task_version] {
            if recorded_version != generator.version() {
                return Err(ReplayError::TaskChanged {
                    task: recorded.task.clone(),
                    recorded: recorded_version.clone(),
                    now: generator.version().to_string(),
                });
            }
        }
        Ok(generator)
    }

    /// Where the weights of policy `version` are, if the run kept them.
    pub(crate) fn weights_of(&self, version: u64) -> Option<Weights> {
        // Before any update and without a warm-up, the policy is the model as declared, which
        // the files rebuild (a run that only evaluates keeps no weights of its own).
        if version == 0 && self.spec.train.warmup.is_none() {
            return Some(Weights::Declared);
        }
        let policy = self.dir.join("policy.mpk");
        if self.final_version == Some(version) && policy.is_file() {
            return Some(Weights::Final(policy));
        }
        let checkpoint = self
            .dir
            .join(crate::checkpoint::DIR)
            .join(Phase::Rl { step: version }.file_name());
        checkpoint
            .is_file()
            .then_some(Weights::Checkpoint(checkpoint))
    }
}

/// Where a version's weights are.
pub(crate) enum Weights {
    /// The model as the experiment declares it, untrained: the pretrained files, or the
    /// from-scratch initialization drawn from the seed.
    Declared,
    /// `policy.mpk`, the final weights alone.
    Final(PathBuf),
    /// A checkpoint of the version's step.
    Checkpoint(PathBuf),
}

impl Weights {
    /// Where the weights come from, for messages.
    fn describe(&self) -> String {
        match self {
            Weights::Declared => "the model as declared".to_string(),
            Weights::Final(path) | Weights::Checkpoint(path) => {
                format!("`{}`", path.display())
            }
        }
    }

    /// The policy with these weights, built as the run built it.
    pub(crate) fn load<B: Kernels>(
        &self,
        spec: &spec::Experiment,
        vocab: usize,
        device: &B::Device,
    ) -> Result<Policy<B>, ReplayError> {
        // Seeded as the run seeded it: with LoRA, a from-scratch base is not in the files.
        B::seed(device, spec.seed);
        let policy = match Origin::of(&spec.model.arch, device).map_err(RunError::from)? {
            Origin::Scratch(arch) => PolicyConfig::from_arch(arch, vocab).init(device),
            Origin::Pretrained(pretrained) => pretrained.policy,
        }
        .as_declared(&spec.model);
        let fail = |path: &Path, reason: String| ReplayError::RunFile {
            path: path.to_path_buf(),
            reason,
        };
        match self {
            Weights::Declared => Ok(policy),
            Weights::Final(path) => policy
                .load_trained(
                    &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
                    path.clone(),
                    device,
                )
                .map_err(|e| fail(path, e.to_string())),
            Weights::Checkpoint(path) => Checkpoint::read(path)
                .and_then(|checkpoint| checkpoint.restore_policy(policy, device))
                .map_err(|e| fail(path, e.to_string())),
        }
    }
}

/// The environment's replay of a recorded episode.
struct Played {
    /// The episode as replayed (recorded replies, fresh observations).
    episode: Episode,
    /// The prompt of each turn (the transcript before its reply).
    prompts: Vec<Vec<u32>>,
    /// The first difference from the record.
    mismatch: Option<String>,
}

/// Plays the recorded replies in a fresh instance, under a controller as the rollout does,
/// and compares every answer with the record.
fn play_recorded(
    recorded: &Trajectory,
    generator: Box<dyn TaskGenerator>,
    chat: &ChatFormat,
) -> Result<Played, ReplayError> {
    let controller = Controller::new(ControllerConfig::default()).map_err(RunError::Controller)?;
    let spec = recorded.episode_spec();
    let tasks = [generator];
    let (mut started, sessions) = start(chat, &tasks, &controller, &[spec]);
    let (mut episode, session) = (started.remove(0), sessions[0]);
    let mut prompts = Vec::new();
    let mut mismatch = None;
    if episode.cut_before_turn(recorded.context) {
        episode.success = finish(&controller, session);
    }
    for (k, turn) in recorded.turns.iter().enumerate() {
        let at = format!("turn {}", k + 1);
        if !episode.is_running() {
            mismatch = Some(format!(
                "the replayed episode ended ({:?}) before {at}, but {} turns were recorded",
                episode.status,
                recorded.turns.len()
            ));
            break;
        }
        if turn.logprobs.len() != turn.tokens.len() {
            mismatch = Some(format!(
                "{at}: {} tokens but {} log-probabilities recorded",
                turn.tokens.len(),
                turn.logprobs.len()
            ));
            break;
        }
        let vocab = chat.tokenizer().vocab_size();
        if let Some(&id) = turn.tokens.iter().find(|&&id| id as usize >= vocab) {
            mismatch = Some(format!(
                "{at}: token id {id} is not in the run's vocabulary ({vocab} ids)"
            ));
            break;
        }
        let reply = chat.agent_text(&turn.tokens);
        if reply != turn.reply {
            mismatch = Some(format!(
                "{at}: the recorded reply text {:?} is not what its tokens decode to ({reply:?})",
                turn.reply
            ));
            break;
        }
        prompts.push(episode.transcript.tokens.clone());
        let step = match (chat.parse_reply(&turn.tokens), session) {
            (Ok(call), Some(id)) => controller
                .step(id, &call)
                .unwrap_or_else(|e| failed(e.to_string())),
            (Ok(_), None) => failed("the controller gave no answer".to_string()),
            (Err(message), _) => unparsed(message),
        };
        if let Some(difference) = step_difference(turn, &step) {
            mismatch = Some(format!("{at}: {difference}"));
        }
        let generation = Generation {
            tokens: turn.tokens.clone(),
            logprobs: turn.logprobs.clone(),
            switches: Vec::new(),
        };
        let version = recorded.policy_versions.get(k).copied().unwrap_or(0);
        match episode.record_turn(chat, &generation, version, &[], step, recorded.context) {
            TurnEnd::Running => {}
            TurnEnd::Environment => {
                episode.success = session
                    .and_then(|id| controller.success(id).ok())
                    .unwrap_or(false);
            }
            TurnEnd::Runtime => episode.success = finish(&controller, session),
        }
        if mismatch.is_some() {
            break;
        }
    }
    if mismatch.is_none() {
        mismatch = outcome_difference(recorded, &episode, episode.is_running());
    }
    if let Some(id) = session {
        let _ = controller.cancel(id);
    }
    Ok(Played {
        episode,
        prompts,
        mismatch,
    })
}

/// How a replayed step differs from the recorded turn, if it does.
pub(crate) fn step_difference(turn: &trajectory::Turn, step: &Step) -> Option<String> {
    if step.observation != turn.observation {
        Some(format!(
            "observation differs:\n  recorded: {:?}\n  replayed: {:?}",
            turn.observation, step.observation
        ))
    } else if step.reward != turn.reward {
        Some(format!(
            "reward differs: recorded {}, replayed {}",
            turn.reward, step.reward
        ))
    } else if step.status != turn.status {
        Some(format!(
            "status differs: recorded {:?}, replayed {:?}",
            turn.status, step.status
        ))
    } else {
        None
    }
}

/// How the replayed episode's end differs from the recorded one, if it does.
pub(crate) fn outcome_difference(
    recorded: &Trajectory,
    episode: &Episode,
    running: bool,
) -> Option<String> {
    if running {
        Some(format!(
            "the replayed episode goes on after the {} recorded turns",
            recorded.turns.len()
        ))
    } else if episode.status != recorded.status {
        Some(format!(
            "final status differs: recorded {:?}, replayed {:?}",
            recorded.status, episode.status
        ))
    } else if episode.reward() != recorded.reward {
        Some(format!(
            "episode reward differs: recorded {}, replayed {}",
            recorded.reward,
            episode.reward()
        ))
    } else if episode.success != recorded.success {
        Some(format!(
            "success differs: recorded {}, replayed {}",
            recorded.success, episode.success
        ))
    } else if recorded.policy_versions.len() != recorded.turns.len() {
        Some(format!(
            "{} policy versions recorded for {} turns",
            recorded.policy_versions.len(),
            recorded.turns.len()
        ))
    } else {
        None
    }
}

/// The checks that need the weights, run on the chosen backend.
struct PolicyChecks<'a> {
    spec: &'a spec::Experiment,
    recorded: &'a Trajectory,
    episode: &'a Episode,
    prompts: &'a [Vec<u32>],
    chat: &'a ChatFormat,
    weights: &'a BTreeMap<u64, Weights>,
}

impl OnBackend for PolicyChecks<'_> {
    type Output = Result<(Vec<String>, Option<String>), ReplayError>;

    fn run<B: TrainBackend>(self, device: B::Device) -> Self::Output {
        let mut lines = Vec::new();
        let mut first = None;
        let vocab = self.chat.tokenizer().vocab_size();
        for (&version, weights) in self.weights {
            let policy: Policy<B::InnerBackend> = weights.load(self.spec, vocab, &device)?;
            let turns: Vec<usize> = (0..self.recorded.turns.len())
                .filter(|&k| self.recorded.policy_versions[k] == version)
                .collect();
            let (line, difference) = self.rescore(&policy, version, &weights.describe(), &turns);
            lines.push(line);
            first = first.or(difference);
            if self.recorded.decoding.greedy {
                let (line, difference) = self.regenerate(&policy, &turns);
                lines.push(line);
                first = first.or(difference);
            }
        }
        if !self.recorded.decoding.greedy {
            lines.push(
                "regeneration: not possible for a sampled episode (one RNG served the whole \
                 evaluation batch); its tokens are checked by the re-scoring"
                    .to_string(),
            );
        }
        Ok((lines, first))
    }
}

impl PolicyChecks<'_> {
    /// Re-scores the agent tokens of `turns` and compares with the recorded log-probabilities.
    fn rescore<B: Kernels>(
        &self,
        policy: &Policy<B>,
        version: u64,
        weights: &str,
        turns: &[usize],
    ) -> (String, Option<String>) {
        let transcript = &self.episode.transcript;
        let len = transcript.tokens.len();
        // The agent positions of each turn, in order.
        let mut positions = Vec::new();
        for (k, taken) in self.episode.reply_positions().into_iter().enumerate() {
            if turns.contains(&k) {
                positions.extend(taken.into_iter().map(|j| (k, j)));
            }
        }
        if len < 2 || positions.is_empty() {
            return (
                format!("log-probs: no agent tokens of version {version} to re-score"),
                None,
            );
        }
        let scored: Vec<bool> = (1..len).map(|j| transcript.agent_mask[j]).collect();
        let ids: Vec<i64> = transcript.tokens.iter().map(|&t| i64::from(t)).collect();
        let tokens =
            Tensor::<B, 2, Int>::from_data(TensorData::new(ids, [1, len]), &policy.device());
        let temperature = self.recorded.decoding.scoring_temperature();
        let rescored: Vec<f32> = policy
            .scored_logprobs(tokens, &scored, temperature)
            .into_data()
            .to_vec()
            .unwrap_or_default();
        let delta = |j: usize| {
            let now = rescored.get(j - 1).copied().unwrap_or(f32::NAN);
            let delta = (now - self.episode.logprobs[j]).abs();
            (now, if delta.is_nan() { f32::INFINITY } else { delta })
        };
        let worst = positions
            .iter()
            .map(|&(_, j)| delta(j).1)
            .fold(0.0f32, f32::max);
        let line = format!(
            "log-probs: re-scored {} agent tokens with {weights} (version {version}, temperature \
             {}): max |Δ| {worst:.2e} (tolerance {LOGPROB_TOLERANCE:.0e})",
            positions.len(),
            temperature as f32,
        );
        let difference = positions
            .iter()
            .enumerate()
            .find(|&(_, &(_, j))| delta(j).1 > LOGPROB_TOLERANCE)
            .map(|(n, &(k, j))| {
                let within = n - positions.iter().position(|&(t, _)| t == k).unwrap_or(0);
                let (now, d) = delta(j);
                format!(
                    "turn {}: token {} ({:?}) has recorded log-prob {} but the weights of \
                     version {version} give {now} (|Δ| {d:.2e} > {LOGPROB_TOLERANCE:.0e})",
                    k + 1,
                    within + 1,
                    self.chat.tokenizer().decode(&[transcript.tokens[j]]),
                    self.episode.logprobs[j],
                )
            });
        (line, difference)
    }

    /// Regenerates each of `turns` greedily from its prompt and compares the tokens.
    fn regenerate<B: Kernels>(
        &self,
        policy: &Policy<B>,
        turns: &[usize],
    ) -> (String, Option<String>) {
        let base = self.recorded.decoding.clone();
        let context = self.recorded.context;
        // Greedy decoding draws nothing; the RNG is there for the signature's sake.
        let mut rng = ChaCha8Rng::seed_from_u64(self.spec.seed);
        let mut cut = 0;
        for &k in turns {
            let prompt = &self.prompts[k];
            let recorded = &self.recorded.turns[k].tokens;
            let budget = base
                .max_new_tokens
                .min(context.saturating_sub(prompt.len()));
            let sampling = Sampling {
                max_new_tokens: budget,
                ..base.clone()
            };
            let again = generate(policy, std::slice::from_ref(prompt), &sampling, &mut rng)
                .pop()
                .unwrap_or_default()
                .tokens;
            if &again == recorded {
                continue;
            }
            // The rollout bounds a turn's replies by the batch's longest prompt: a reply cut
            // there is a prefix of what this prompt alone allows.
            if again.starts_with(recorded) && recorded.len() < budget && !stopped(recorded, &base) {
                cut += 1;
                continue;
            }
            let at = recorded
                .iter()
                .zip(&again)
                .position(|(a, b)| a != b)
                .unwrap_or(recorded.len().min(again.len()));
            let decode = |t: &[u32]| self.chat.tokenizer().decode(t);
            return (
                format!("regeneration: turn {} differs", k + 1),
                Some(format!(
                    "turn {}: greedy regeneration differs at token {}:\n  recorded:    \
                     {:?}\n  regenerated: {:?}",
                    k + 1,
                    at + 1,
                    decode(recorded),
                    decode(&again)
                )),
            );
        }
        let mut line = format!(
            "regeneration: {} greedy turns regenerated, tokens identical",
            turns.len()
        );
        if cut > 0 {
            line.push_str(&format!(
                " ({cut} recorded replies were cut by their batch's budget and are prefixes)"
            ));
        }
        (line, None)
    }
}

/// Whether a reply ended at a stop token or stop sequence.
fn stopped(tokens: &[u32], sampling: &Sampling) -> bool {
    tokens.last().is_some_and(|t| sampling.stop.contains(t))
        || sampling
            .stop_sequences
            .iter()
            .any(|s| !s.is_empty() && tokens.ends_with(s))
}

fn split_name(split: agentry_env::Split) -> &'static str {
    match split {
        agentry_env::Split::Train => "train",
        agentry_env::Split::Test => "test",
    }
}

/// The versions of the turns, as one number when they agree.
fn versions(versions: &[u64]) -> String {
    let distinct: BTreeSet<&u64> = versions.iter().collect();
    distinct
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}
