//! The training loop: supervised warm-up on oracle demonstrations, then RL.
//!
//! One [`Trainer`] owns everything a run mutates (policy, optimizer, RNG, run directory), so the
//! order of random draws, and therefore the whole run, is fixed by the experiment's seed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Instant;

use agentry_dsl::spec::{
    self, AdvantageNorm, AlgorithmKind, Credit, Decoding, Device, KlPlacement, SftSource, ValueHead,
};
use agentry_dsl::{Checked, OverrideError};
use agentry_env::controller::{Controller, ControllerConfig};
use agentry_env::{Split, TaskGenerator};
use burn::module::AutodiffModule;
use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::algo::loss::{PolicyLossConfig, kl_estimate, truncated_is_weights};
use crate::algo::{
    PolicyLossInput, Trajectory, ValueStats, credited_advantages, explained_variance, gae,
    normalize_by_key, policy_loss, std_dev, terminal_rewards, turn_end_rewards, value_loss,
    weigh_negatives, whiten,
};
use crate::checkpoint::{Checkpoint, Phase, Snapshot};
use crate::curriculum::Curriculum;
use crate::device::{self, OnBackend};
use crate::error::RunError;
use crate::experiment::Experiment;
use crate::metrics::{Progress, Record, RlRecord, RunConfig, RunDir, TaskStats, wilson};
use crate::model::hf::{HfCheckpoint, ModelType};
use crate::model::{Kernels, TrainBackend};
use crate::model::{Policy, PolicyConfig, Sampling, Scores, Want};
use crate::monitor::Monitor;
use crate::optim::{Descent, PolicyOptimizer, descend};
use crate::pipeline::{Board, Collector, Weights, Worker};
use crate::pool::{Engine, Engines, fresh_groups, refresh_due};
use crate::rollout::{
    Episode, EpisodeSpec, Fork, ForkPlan, continue_forks, demonstration, oracle_text, play,
    play_in_pool,
};
use crate::shared_warmup::SharedWarmups;
use crate::text::{ChatFormat, Tokenizer, Transcript};
use crate::trajectory::{self, Origin, render};

/// Largest tokenizer vocabulary trained for a from-scratch policy.
pub const TOKENIZER_VOCAB: usize = 2048;

/// Transcripts scored together in an RL update: sorted by length, so each bucket pads little.
pub const LENGTH_BUCKET: usize = 8;

/// How to run an experiment, beyond what its file says.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Overrides the file's `device`; it picks where the run goes and changes nothing in the
    /// spec, so no rule of the checker reads it.
    pub device: Option<Device>,
    /// Overrides `train.steps`, through the checker's rules ([`RunOptions::overridden`]).
    pub steps: Option<u64>,
    /// Root of run directories (`runs` by default).
    pub out: PathBuf,
    /// No progress bar (lines are still printed).
    pub quiet: bool,
    /// Resume from this run directory's latest checkpoint, or from this checkpoint file: the
    /// run goes on in its own directory, from the step after the checkpoint.
    pub resume: Option<PathBuf>,
    /// Warm-ups to share with the other runs of this invocation ([`crate::shared_warmup`]):
    /// a run whose warm-up is kept there starts from it, and a run that trains one keeps it.
    pub shared_warmups: Option<Arc<SharedWarmups>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: None,
            steps: None,
            out: PathBuf::from("runs"),
            quiet: false,
            resume: None,
            shared_warmups: None,
        }
    }
}

impl RunOptions {
    /// `spec` with the overrides of the file (`steps`) applied, re-checked by the rules that
    /// read them, so that `--steps` cannot skip a rule such as a curriculum stage's
    /// `until <= steps`. Every entry point applies it before any work.
    pub fn overridden(
        &self,
        spec: Checked<spec::Experiment>,
    ) -> Result<Checked<spec::Experiment>, OverrideError> {
        match self.steps {
            Some(steps) => spec.with_steps(steps),
            None => Ok(spec),
        }
    }
}

/// Oracle episodes the tokenizer is trained on when there is no warm-up (with one, its
/// `demonstrations`). The runtime's own choice, not a key of the language.
const TOKENIZER_EPISODES_WITHOUT_WARMUP: usize = 64;

/// Success per task on the evaluation split, with one decoding.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Evaluation {
    /// Per task.
    pub tasks: BTreeMap<String, TaskStats>,
    /// Mean success over tasks.
    pub success: f64,
    /// Its 95% interval (Wilson), pooled over the tasks' episodes (each task plays as many).
    #[serde(default)]
    pub success_ci: [f64; 2],
}

/// What a finished run reports (`summary.json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The device the run used.
    pub device: String,
    /// CPU threads of flex's kernels (and the host side of any device).
    pub cpu_threads: usize,
    /// Evaluation after the supervised warm-up (before any RL), when there was a warm-up:
    /// greedy, or sampled when `eval.decoding = sampled`.
    pub after_warmup: Option<Evaluation>,
    /// The sampled evaluation after the warm-up, when `eval.decoding = both`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_warmup_sampled: Option<Evaluation>,
    /// Evaluation at the end of RL: greedy, or sampled when `eval.decoding = sampled`.
    pub after_rl: Evaluation,
    /// The sampled evaluation at the end of RL, when `eval.decoding = both`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_rl_sampled: Option<Evaluation>,
    /// RL steps run.
    pub steps: u64,
    /// RL steps skipped because every advantage was zero.
    pub skipped_steps: u64,
    /// The run whose warm-up this one started from, when it shared one
    /// ([`crate::shared_warmup`]); its own warm-up would have been the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_from: Option<PathBuf>,
}

/// Runs an experiment to the end: warm-up, RL, evaluations, run directory.
///
/// The device is `options.device`, else the file's `device`, with `auto` resolved by
/// [`device::resolve`].
pub fn run(experiment: &dyn Experiment, options: &RunOptions) -> Result<RunSummary, RunError> {
    run_configuration(experiment, options, spec::Sweep::base_label())
}

/// Runs an experiment as configuration `config` of its sweep ([`crate::sweep`]): the same as
/// [`run`], with the label recorded in the run directory (`config.json`) and, for any
/// configuration but `base`, in its path. `experiment.spec()` is the configuration's own
/// experiment, its seed set.
pub fn run_configuration(
    experiment: &dyn Experiment,
    options: &RunOptions,
    config: &str,
) -> Result<RunSummary, RunError> {
    let mut job = Job::new(experiment, options, config)?;
    let device = device::resolve(options.device.unwrap_or(job.spec.device));
    job.device_name = device::name(device).to_string();
    device::dispatch(device, job)?
}

/// Runs an experiment on a backend and device chosen by the caller (for example the wgpu
/// adapter of kind CPU), ignoring the file's `device`.
pub fn run_on<B: TrainBackend>(
    experiment: &dyn Experiment,
    options: &RunOptions,
    device: B::Device,
) -> Result<RunSummary, RunError> {
    let mut job = Job::new(experiment, options, spec::Sweep::base_label())?;
    job.device_name = format!("{device:?}");
    job.run::<B>(device)
}

/// [`run_on`] with the rollout engines on `engines` (disaggregated placement, overriding the
/// file's `placement`): asynchronous worker `i` generates on `engines[i % engines.len()]`, the
/// trainer trains on `trainer`, and each new version of the weights is copied across.
pub fn run_on_devices<B: TrainBackend>(
    experiment: &dyn Experiment,
    options: &RunOptions,
    trainer: B::Device,
    engines: Vec<B::Device>,
) -> Result<RunSummary, RunError> {
    let mut job = Job::new(experiment, options, spec::Sweep::base_label())?;
    if engines.is_empty() || job.spec.pool.mode != spec::PoolMode::Async {
        return Err(RunError::Unsupported(
            "engines on their own devices need `pool { mode = async }` and at least one device"
                .to_string(),
        ));
    }
    job.device_name = format!("{trainer:?}, engines on {engines:?}");
    Trainer::<B>::new(job, trainer, Some(engines))?.run()
}

/// Rejects, before any work, what the file may declare but this runtime cannot run yet.
fn unsupported(spec: &spec::Experiment) -> Result<(), RunError> {
    let refuse = |what: &str| Err(RunError::Unsupported(what.to_string()));
    let monte_carlo = matches!(spec.algorithm.credit, spec::Credit::MonteCarlo { .. });
    if spec.pool.mode == spec::PoolMode::Async && monte_carlo {
        return refuse(
            "Monte-Carlo credit with `pool.mode = async` is not implemented yet: its \
             continuations run in synchronous steps; use `mode = sync`",
        );
    }
    Ok(())
}

struct Job {
    spec: spec::Experiment,
    tasks: Vec<Box<dyn TaskGenerator>>,
    /// Each task's generator version, by task name: instances are a function of it.
    task_versions: BTreeMap<String, String>,
    /// The checkpoint to resume from, already matched against the experiment.
    resume: Option<Checkpoint>,
    options: RunOptions,
    device_name: String,
    /// The sweep configuration's label (`base` outside a sweep), for a fresh run directory.
    config: String,
}

impl Job {
    fn new(
        experiment: &dyn Experiment,
        options: &RunOptions,
        config: &str,
    ) -> Result<Self, RunError> {
        let spec = options.overridden(experiment.spec())?.into_inner();
        unsupported(&spec)?;
        let tasks = crate::tasks::resolve(&|name| experiment.user_task(name), &spec)?;
        let task_versions: BTreeMap<String, String> = spec
            .tasks
            .iter()
            .zip(&tasks)
            .map(|(task, generator)| (task.name.clone(), generator.version().to_string()))
            .collect();
        // A checkpoint is read and matched before any work, so a bad one costs nothing.
        let resume = match &options.resume {
            Some(path) => {
                let checkpoint = Checkpoint::read(&Checkpoint::locate(path)?)?;
                checkpoint.check_matches(&spec, &task_versions)?;
                checkpoint.run_dir()?;
                Some(checkpoint)
            }
            None => None,
        };
        Ok(Job {
            spec,
            tasks,
            task_versions,
            resume,
            options: options.clone(),
            device_name: String::new(),
            config: config.to_string(),
        })
    }
}

impl OnBackend for Job {
    type Output = Result<RunSummary, RunError>;

    fn run<B: TrainBackend>(self, device: B::Device) -> Self::Output {
        Trainer::<B>::new(self, device, None)?.run()
    }
}

/// Where a run's policy and tokenizer come from.
enum Loaded<'a, B: Kernels> {
    /// `arch = transformer { ... }`: initialized from the seed, with a tokenizer trained on
    /// the tasks' text.
    Scratch(&'a spec::TransformerArch),
    /// `arch = qwen2/llama { weights = ... }`: a Hugging Face checkpoint.
    Checkpoint(Box<HfCheckpoint<B>>),
}

/// Everything a run mutates.
struct Trainer<B: TrainBackend> {
    spec: spec::Experiment,
    device_name: String,
    tasks: Arc<Vec<Box<dyn TaskGenerator>>>,
    /// Steps the environments of every rollout in parallel, isolating failures.
    controller: Arc<Controller>,
    chat: ChatFormat,
    policy: Policy<B>,
    optimizer: PolicyOptimizer<Policy<B>, B>,
    reference: Option<Policy<B::InnerBackend>>,
    /// PPO's separate critic (`value_head = separate`), from the start of RL on.
    critic: Option<Critic<B>>,
    context: usize,
    demos: Vec<Transcript>,
    /// Per task: oracle demonstrations drawn, and kept (they succeeded and fit the context).
    demo_counts: Vec<(usize, usize)>,
    curriculum: Curriculum,
    rng: ChaCha8Rng,
    device: B::Device,
    run_dir: RunDir,
    options: RunOptions,
    task_versions: BTreeMap<String, String>,
    /// Where the run stands: warm-up steps done, or RL steps done.
    phase: Phase,
    /// The phase of the latest checkpoint written (or resumed from).
    saved: Option<Phase>,
    /// The evaluations after the warm-up, once it ran (see [`Evaluated`]).
    after_warmup: Option<Evaluated>,
    skipped: u64,
    /// `sft_from = successes`: the latest solved training episodes, oldest first.
    successes: VecDeque<Transcript>,
    monitor: Monitor,
    /// Updates skipped in a row for a non-finite loss or gradient norm (checkpointed, so a
    /// resumed run stops where the uninterrupted one would).
    nonfinite_streak: u32,
    /// Cross-policy sampling: the stale engines' weights and their version.
    stale: Option<(Policy<B::InnerBackend>, u64)>,
    /// Disaggregated placement: the devices the rollout workers run on (empty: the trainer's).
    engine_devices: Vec<B::Device>,
    /// What the warm-up depends on, when another run may share it ([`SharedWarmups::key`]).
    warmup_key: Option<String>,
    /// The run whose shared warm-up this one started from.
    warmup_from: Option<PathBuf>,
}

impl<B: TrainBackend> Trainer<B> {
    /// `engine_devices` overrides the file's `placement` (see [`run_on_devices`]).
    fn new(
        job: Job,
        device: B::Device,
        engine_devices: Option<Vec<B::Device>>,
    ) -> Result<Self, RunError> {
        let Job {
            spec,
            tasks,
            task_versions,
            resume,
            options,
            device_name,
            config,
        } = job;
        // A Hugging Face checkpoint brings its policy and tokenizer; otherwise both are built.
        let loaded = match &spec.model.arch {
            spec::Arch::Transformer(arch) => Loaded::Scratch(arch),
            spec::Arch::Qwen2 { weights } => Loaded::Checkpoint(Box::new(HfCheckpoint::load(
                Path::new(weights),
                ModelType::Qwen2,
                &device,
            )?)),
            spec::Arch::Llama { weights } => Loaded::Checkpoint(Box::new(HfCheckpoint::load(
                Path::new(weights),
                ModelType::Llama,
                &device,
            )?)),
            spec::Arch::Gguf { file } => Loaded::Checkpoint(Box::new(
                crate::model::Pretrained::from_gguf(Path::new(file), &device)?,
            )),
        };
        let context = match &loaded {
            Loaded::Scratch(arch) => arch.context,
            Loaded::Checkpoint(checkpoint) => checkpoint.policy.context,
        };
        let engine_devices = match engine_devices {
            Some(devices) => devices,
            None => device::engine_devices::<B::InnerBackend>(&device, &spec.pool.placement)?,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);
        let curriculum = Curriculum::new(&spec);

        // The tokenizer is trained on the text of oracle episodes, so the words the policy
        // needs are single tokens; the same episodes are the warm-up demonstrations.
        let demo_count = spec
            .train
            .warmup
            .map_or(TOKENIZER_EPISODES_WITHOUT_WARMUP, |w| w.demonstrations);
        let demo_draws: Vec<EpisodeSpec> = (0..demo_count)
            .map(|_| training_draw(&spec, &curriculum, 0, 0, &mut rng))
            .collect();
        let tokenizer = match (&resume, &loaded) {
            // The weights were trained with the checkpoint's tokenizer (ours or the model's).
            (Some(resume), _) => resume.tokenizer().clone(),
            (None, Loaded::Checkpoint(checkpoint)) => checkpoint.tokenizer.clone(),
            (None, Loaded::Scratch(_)) => {
                let mut corpus: Vec<String> = tasks.iter().flat_map(|t| t.vocabulary()).collect();
                for draw in &demo_draws {
                    let mut env =
                        tasks[draw.task].instance(draw.split, draw.difficulty, draw.index);
                    corpus.extend(oracle_text(env.as_mut(), draw.max_turns));
                }
                Tokenizer::train(corpus.iter().map(String::as_str), TOKENIZER_VOCAB)
            }
        };
        let chat = ChatFormat::new(tokenizer);
        // Per task: demonstrations drawn, and those that succeeded and fit in the context.
        let mut demo_counts = vec![(0, 0); tasks.len()];
        let demos: Vec<Transcript> = demo_draws
            .iter()
            .filter_map(|draw| {
                let mut env = tasks[draw.task].instance(draw.split, draw.difficulty, draw.index);
                let demo = demonstration(&chat, env.as_mut(), draw.max_turns, context);
                let (drawn, kept) = &mut demo_counts[draw.task];
                *drawn += 1;
                *kept += usize::from(demo.is_some());
                demo
            })
            .collect();

        B::seed(&device, spec.seed);
        let mut policy = match loaded {
            Loaded::Checkpoint(checkpoint) => checkpoint.policy,
            Loaded::Scratch(arch) => {
                PolicyConfig::from_arch(arch, chat.tokenizer().vocab_size()).init(&device)
            }
        };
        // A shared-trunk critic is part of the policy from the start, so the optimizer and
        // every checkpoint cover it; the warm-up leaves it as it is (its loss never reads it).
        if spec.model.value_head == ValueHead::Shared {
            policy = policy.with_value_head();
        }
        let mut optimizer = PolicyOptimizer::new(&spec.train.optimizer);
        let fresh_phase = match spec.train.warmup {
            Some(_) => Phase::Warmup { step: 0 },
            None => Phase::Rl { step: 0 },
        };
        let (mut phase, mut saved, mut after_warmup, mut skipped) = (fresh_phase, None, None, 0);
        let mut reference = None;
        let mut critic = None;
        let mut successes = VecDeque::new();
        let mut monitor = Monitor::default();
        let mut nonfinite_streak = 0;
        let mut stale = None;
        // A warm-up another run of this invocation trained identically is taken as it ended,
        // exactly as a resumed run takes its checkpoint.
        let warmup_key = options
            .shared_warmups
            .as_ref()
            .and_then(|warmups| warmups.key(&spec, &device_name, &task_versions));
        let shared = match (&resume, &options.shared_warmups, &warmup_key) {
            (None, Some(warmups), Some(key)) => warmups.get(key),
            _ => None,
        };
        let shared_checkpoint = shared
            .as_ref()
            .map(|entry| Checkpoint::read(&entry.checkpoint))
            .transpose()?;
        if let Some(checkpoint) = resume.as_ref().or(shared_checkpoint.as_ref()) {
            policy = checkpoint.restore_policy(policy, &device)?;
            optimizer = checkpoint.restore_optimizer(optimizer, &device)?;
            reference = checkpoint.restore_reference(policy.valid(), &device)?;
            let fresh = Critic::fresh(&policy, &spec.train.optimizer);
            critic = checkpoint
                .restore_critic(fresh.net, fresh.optimizer, &device)?
                .map(|(net, optimizer)| Critic { net, optimizer });
            rng = checkpoint.rng();
            phase = checkpoint.phase();
            after_warmup = checkpoint.after_warmup().cloned().map(|first| Evaluated {
                first,
                first_decoding: spec.eval.decoding.each()[0],
                sampled: checkpoint.after_warmup_sampled().cloned(),
            });
            skipped = checkpoint.skipped_steps();
            successes = checkpoint.successes().iter().cloned().collect();
            monitor = checkpoint.monitor().clone();
            nonfinite_streak = checkpoint.nonfinite_streak();
            stale = checkpoint.restore_stale(policy.valid(), &device)?;
        }
        let run_dir = match &resume {
            Some(checkpoint) => {
                saved = Some(phase);
                let (run_dir, superseded) =
                    RunDir::reopen(&checkpoint.run_dir()?, checkpoint.metrics_len())?;
                let mut note = format!("resuming from {} ({phase})", checkpoint.path().display());
                if superseded > 0 {
                    note.push_str(&format!(
                        "; {superseded} bytes of metrics written after it moved to \
                         metrics-superseded.jsonl"
                    ));
                }
                println!("{note}");
                run_dir
            }
            None => {
                let mut run_dir = RunDir::create(
                    &options.out,
                    &RunConfig {
                        experiment: spec.name.clone(),
                        config,
                        seed: spec.seed,
                    },
                )?;
                // What the warm-up wrote, this run would have written the same.
                if let Some(entry) = &shared {
                    entry.copy_files_to(run_dir.path())?;
                    run_dir.append_recorded(&entry.metrics()?)?;
                }
                run_dir
            }
        };
        run_dir.write_json("experiment.json", &spec)?;
        // Instances are a function of each generator's version; recording it makes every
        // episode of the run replayable.
        run_dir.write_json("task_versions.json", &task_versions)?;
        chat.tokenizer()
            .save(run_dir.path().join("tokenizer.json"))
            .map_err(|e| RunError::Io {
                path: run_dir.path().join("tokenizer.json"),
                source: std::io::Error::other(e.to_string()),
            })?;
        let controller =
            Arc::new(Controller::new(ControllerConfig::default()).map_err(RunError::Controller)?);
        let tasks = Arc::new(tasks);
        Ok(Trainer {
            controller,
            context,
            device_name,
            spec,
            tasks,
            chat,
            policy,
            optimizer,
            reference,
            critic,
            demos,
            demo_counts,
            curriculum,
            rng,
            device,
            run_dir,
            options,
            task_versions,
            phase,
            saved,
            after_warmup,
            skipped,
            successes,
            monitor,
            nonfinite_streak,
            stale,
            engine_devices,
            warmup_key,
            warmup_from: shared.map(|entry| entry.trained_by),
        })
    }

    fn run(mut self) -> Result<RunSummary, RunError> {
        let mut out = Progress::new(0, "", true);
        out.println(format!(
            "experiment `{}` on {} | {} tasks | {} demonstrations | vocab {}",
            self.spec.name,
            self.device_name,
            self.tasks.len(),
            self.demos.len(),
            self.chat.tokenizer().vocab_size()
        ));
        if self.spec.train.warmup.is_some() {
            for line in self.unteachable_tasks() {
                out.println(line);
            }
        }
        let mut warmed_up = false;
        if let (Some(warmup), Phase::Warmup { step: done }) = (self.spec.train.warmup, self.phase) {
            self.warmup(&warmup, done)?;
            let evaluation = self.evaluate(0, "warmup")?;
            out.println(format!(
                "after SFT warm-up: {} success {}",
                split_name(self.spec.eval.split),
                evaluation.describe()
            ));
            self.after_warmup = Some(evaluation);
            self.phase = Phase::Rl { step: 0 };
            warmed_up = true;
            if let (Some(warmups), Some(key)) =
                (self.options.shared_warmups.clone(), &self.warmup_key)
            {
                let key = key.clone();
                let run_dir = self.run_dir.path().to_path_buf();
                warmups.keep(&key, &run_dir, |dir| self.save_checkpoint(dir))?;
            }
        } else if let (Some(from), Some(evaluation)) = (&self.warmup_from, &self.after_warmup) {
            out.println(format!(
                "after SFT warm-up: {} success {} (the warm-up of {}: the same computation, \
                 shared)",
                split_name(self.spec.eval.split),
                evaluation.describe(),
                from.display()
            ));
        }
        // The KL reference is the policy as RL starts; a resumed run has it from its checkpoint.
        if self.spec.algorithm.kl.estimator.is_some() && self.reference.is_none() {
            self.reference = Some(self.policy.valid());
        }
        // So is a separate critic: a copy of the policy (after the warm-up) with a value head.
        if self.spec.model.value_head == ValueHead::Separate
            && self.spec.algorithm.kind == AlgorithmKind::Ppo
            && self.critic.is_none()
        {
            self.critic = Some(Critic::fresh(&self.policy, &self.spec.train.optimizer));
        }
        if warmed_up && self.spec.train.checkpoint_every.is_some() {
            self.checkpoint()?;
        }

        let steps = self.spec.train.steps;
        let Phase::Rl { step: done } = self.phase else {
            unreachable!("the warm-up ends in the RL phase")
        };
        out = Progress::new(steps, "rl", self.options.quiet);
        out.update(done, String::new());
        // A checkpoint is written before the evaluation of its step, so a run resumed there
        // runs that evaluation (it was cut, or was the final one of a shorter run).
        if done > 0 && done < steps && self.periodic_eval_due(done) {
            let evaluation = self.evaluate(done, "periodic")?;
            out.println(format!("step {done}: success {}", evaluation.describe()));
        }
        match self.spec.pool.mode {
            spec::PoolMode::Sync => {
                for step in done + 1..=steps {
                    let record = self.rl_step(step)?;
                    self.finish_step(step, steps, record, &out)?;
                }
            }
            spec::PoolMode::Async => self.run_async(done, steps, &out)?,
        }
        out.finish();
        // The last checkpoint is taken before the final evaluation: a longer run resumed from
        // it goes on as if this one had not ended.
        if self.saved != Some(self.phase) {
            self.checkpoint()?;
        }
        let after_rl = self.evaluate(steps, "final")?;
        out.println(format!(
            "after RL ({steps} steps): {} success {}",
            split_name(self.spec.eval.split),
            after_rl.describe()
        ));
        self.save_weights("policy")?;
        let after_warmup = self.after_warmup.clone();
        let summary = RunSummary {
            run_dir: self.run_dir.path().to_path_buf(),
            device: self.device_name.clone(),
            cpu_threads: device::cpu_threads(),
            after_warmup_sampled: after_warmup.as_ref().and_then(|e| e.sampled.clone()),
            after_warmup: after_warmup.map(|e| e.first),
            after_rl_sampled: after_rl.sampled,
            after_rl: after_rl.first,
            steps,
            skipped_steps: self.skipped,
            warmup_from: self.warmup_from.clone(),
        };
        self.run_dir.write_json("summary.json", &summary)?;
        let report = crate::report::write(self.run_dir.path())?;
        out.println(format!("report: {}", report.display()));
        out.println(format!("run directory: {}", summary.run_dir.display()));
        Ok(summary)
    }

    /// Episodes per group, and groups per RL batch.
    fn batch_shape(&self) -> (usize, usize) {
        let group_size = self.spec.algorithm.group_size.max(1);
        (group_size, (self.spec.train.batch / group_size).max(1))
    }

    /// What follows every RL step's update: the stability monitor, the progress line, the
    /// metrics record, and the checkpoint and periodic evaluation when due.
    fn finish_step(
        &mut self,
        step: u64,
        steps: u64,
        mut record: RlRecord,
        out: &Progress,
    ) -> Result<(), RunError> {
        self.skipped += u64::from(record.skipped);
        let (alerts, started) = self.monitor.observe(&record);
        record.alerts = alerts;
        for message in started {
            out.println(format!("warning: {message}"));
        }
        let mut line = format!(
            "success {:.2} | return {:.2} | loss {:+.4} | entropy {:.2}",
            record.success, record.mean_return, record.loss, record.entropy
        );
        if let (Some(value), Some(ev)) = (record.value_loss, record.explained_variance) {
            line.push_str(&format!(" | value {value:.4} | ev {ev:+.2}"));
        }
        out.update(step, line);
        self.run_dir.record(&Record::Rl(Box::new(record)))?;
        self.phase = Phase::Rl { step };
        if self.checkpoint_due(step) {
            self.checkpoint()?;
        }
        if step < steps && self.periodic_eval_due(step) {
            let evaluation = self.evaluate(step, "periodic")?;
            out.println(format!("step {step}: success {}", evaluation.describe()));
        }
        Ok(())
    }

    /// RL steps `done + 1 ..= steps` with asynchronous rollout ([`crate::pipeline`]): `engines`
    /// workers play episodes continuously while this thread trains on complete groups.
    fn run_async(&mut self, done: u64, steps: u64, out: &Progress) -> Result<(), RunError> {
        let pool = self.spec.pool.clone();
        let (group_size, groups) = self.batch_shape();
        let workers = pool.engines.max(1);
        // The stale engines: restored with a resumed run, else the policy as it starts.
        if pool.cross_policy > 0.0 && self.stale.is_none() {
            self.stale = Some((self.policy.valid(), done));
        }
        let board = Arc::new(Board::new(
            Weights {
                policy: self.policy.valid(),
                version: done,
            },
            self.stale.as_ref().map(|(policy, version)| Weights {
                policy: policy.clone(),
                version: *version,
            }),
        ));
        // Room for a batch and a half of finished episodes: workers run ahead of the trainer
        // by that much, then wait.
        let (queue, finished) = mpsc::sync_channel(groups * group_size * 3 / 2);
        let sampling = self.sampling(false);
        std::thread::scope(|scope| {
            for index in 0..workers {
                let worker = Worker {
                    index,
                    workers,
                    spec: self.spec.clone(),
                    curriculum: self.curriculum.clone(),
                    tasks: Arc::clone(&self.tasks),
                    controller: Arc::clone(&self.controller),
                    chat: self.chat.clone(),
                    sampling: sampling.clone(),
                    context: self.context,
                    board: Arc::clone(&board),
                    queue: queue.clone(),
                    device: (!self.engine_devices.is_empty())
                        .then(|| self.engine_devices[index % self.engine_devices.len()].clone()),
                };
                scope.spawn(move || worker.run());
            }
            drop(queue);
            let result = self.train_async(done, steps, out, &board, &finished);
            board.stop();
            // Hang up, so that workers blocked on a full queue return.
            drop(finished);
            result
        })
    }

    /// The trainer's side of [`Trainer::run_async`].
    fn train_async(
        &mut self,
        done: u64,
        steps: u64,
        out: &Progress,
        board: &Board<B::InnerBackend>,
        finished: &mpsc::Receiver<Episode>,
    ) -> Result<(), RunError> {
        let pool = self.spec.pool.clone();
        let (group_size, groups) = self.batch_shape();
        let mut collector = Collector::default();
        let started = Instant::now();
        for step in done + 1..=steps {
            let step_started = Instant::now();
            let blocked_before = board.blocked_seconds();
            let synced_before = board.sync_seconds();
            let episodes = collector
                .batch(finished, groups, group_size, step - 1, pool.max_staleness)
                .map_err(|_| RunError::Unsupported("every rollout worker stopped".to_string()))?;
            let waited = step_started.elapsed().as_secs_f64();
            let record = RlRecord {
                rollout_seconds: waited,
                trajectories_per_second: episodes.len() as f64 / waited.max(1e-9),
                dropped: Some(std::mem::take(&mut collector.dropped)),
                ..RlRecord::default()
            };
            let mut record = self.learn(step, episodes, record, true)?;
            // Publish the new weights; the stale engines take them every `refresh_every`.
            let fresh = self.policy.valid();
            let refresh = pool.cross_policy > 0.0 && refresh_due(step, pool.refresh_every);
            if refresh {
                self.stale = Some((fresh.clone(), step));
            }
            board.publish(
                Weights {
                    policy: fresh.clone(),
                    version: step,
                },
                refresh.then(|| Weights {
                    policy: fresh,
                    version: step,
                }),
            );
            let wall = step_started.elapsed().as_secs_f64();
            record.trainer_idle = Some(waited / wall.max(1e-9));
            let workers = pool.engines.max(1) as f64;
            let blocked = board.blocked_seconds() - blocked_before;
            record.rollout_idle = Some((blocked / (wall * workers).max(1e-9)).min(1.0));
            if !self.engine_devices.is_empty() {
                record.weight_sync_seconds = Some(board.sync_seconds() - synced_before);
            }
            record.trajectories_per_second = (step - done) as f64 * (groups * group_size) as f64
                / started.elapsed().as_secs_f64().max(1e-9);
            self.finish_step(step, steps, record, out)?;
        }
        Ok(())
    }

    /// A warning for each task the warm-up drew demonstrations of but keeps none: its oracle
    /// episodes do not fit the context (or the turn budget), so the warm-up cannot teach it,
    /// which would otherwise show only as a task stuck at zero.
    fn unteachable_tasks(&self) -> Vec<String> {
        self.spec
            .tasks
            .iter()
            .zip(&self.demo_counts)
            .filter(|(_, (drawn, kept))| *drawn > 0 && *kept == 0)
            .map(|(task, (drawn, _))| {
                format!(
                    "warning: task `{}`: none of its {drawn} oracle demonstrations fits in the \
                     context ({} tokens) within its turn budget ({} turns), so the warm-up \
                     cannot teach it; raise the model's `context` or the task's `max_turns`",
                    task.name, self.context, task.max_turns
                )
            })
            .collect()
    }

    /// Behaviour cloning of the oracle demonstrations, from warm-up step `done + 1`.
    fn warmup(&mut self, warmup: &spec::Warmup, done: u64) -> Result<(), RunError> {
        if self.demos.is_empty() {
            return Err(RunError::Unsupported(
                "warm-up needs oracle demonstrations, but no task produced any".to_string(),
            ));
        }
        let progress = Progress::new(warmup.steps, "sft", self.options.quiet);
        progress.update(done, String::new());
        for step in done + 1..=warmup.steps {
            let batch: Vec<&Transcript> = (0..warmup.batch)
                .map(|_| &self.demos[self.rng.random_range(0..self.demos.len())])
                .collect();
            let batch = self.padded::<B>(&batch);
            let loss = batch.nll(&self.policy);
            let descent = self.apply(loss, warmup.lr);
            let record = match self.survive(descent, Update::Warmup { step })? {
                Some(grad_norm) => {
                    progress.update(step, format!("loss {:.4}", descent.loss()));
                    Record::Sft {
                        step,
                        loss: descent.loss(),
                        grad_norm,
                        skipped_nonfinite: false,
                    }
                }
                None => {
                    progress.println(format!(
                        "warning: warm-up step {step}: {}",
                        self.skip_notice(descent)
                    ));
                    Record::Sft {
                        step,
                        loss: 0.0,
                        grad_norm: 0.0,
                        skipped_nonfinite: true,
                    }
                }
            };
            self.run_dir.record(&record)?;
            self.phase = Phase::Warmup { step };
            if self.checkpoint_due(step) {
                self.checkpoint()?;
            }
        }
        progress.finish();
        Ok(())
    }

    /// Backward, clip, optimizer step of the policy, unless the update is not finite
    /// ([`descend`]).
    fn apply(&mut self, loss: Tensor<B, 1>, lr: f64) -> Descent {
        let (policy, descent) = descend(
            self.policy.clone(),
            &mut self.optimizer,
            loss,
            lr,
            self.spec.algorithm.grad_clip,
        );
        self.policy = policy;
        descent
    }

    /// Counts `descent` against `train.max_nonfinite_skips`: the gradient norm of an applied
    /// update, `None` for a skipped one, or the error that ends the run once that many updates
    /// in a row were skipped.
    fn survive(&mut self, descent: Descent, at: Update) -> Result<Option<f32>, RunError> {
        match descent {
            Descent::Applied { grad_norm, .. } => {
                self.nonfinite_streak = 0;
                Ok(Some(grad_norm))
            }
            Descent::Skipped { loss, grad_norm } => {
                self.nonfinite_streak += 1;
                let limit = self.spec.train.max_nonfinite_skips;
                if self.nonfinite_streak >= limit {
                    return Err(RunError::NonFinite {
                        skipped: self.nonfinite_streak,
                        at: at.to_string(),
                        loss,
                        grad_norm,
                    });
                }
                Ok(None)
            }
        }
    }

    /// What a skipped update's warning says.
    fn skip_notice(&self, descent: Descent) -> String {
        let what = match descent {
            Descent::Skipped {
                grad_norm: Some(norm),
                ..
            } => format!("the gradient norm is {norm}"),
            _ => format!("the loss is {}", descent.loss()),
        };
        format!(
            "{what}; the update was skipped, weights and optimizer unchanged ({} in a row; the \
             run stops at {}, `train.max_nonfinite_skips`)",
            self.nonfinite_streak, self.spec.train.max_nonfinite_skips
        )
    }

    fn sampling(&self, greedy: bool) -> Sampling {
        let train = &self.spec.train;
        Sampling {
            temperature: train.temperature as f32,
            top_p: train.top_p as f32,
            top_k: train.top_k,
            max_new_tokens: train.max_new_tokens,
            stop: vec![self.chat.end_token()],
            stop_sequences: train
                .stop
                .iter()
                .map(|s| self.chat.tokenizer().encode(s))
                .collect(),
            greedy,
        }
    }

    /// One RL step: roll out groups, compute advantages, update the policy.
    fn rl_step(&mut self, step: u64) -> Result<RlRecord, RunError> {
        let started = Instant::now();
        let algorithm = self.spec.algorithm.clone();
        let (group_size, groups) = self.batch_shape();
        let mut specs = Vec::with_capacity(groups * group_size);
        for group in 0..groups {
            let spec = training_draw(&self.spec, &self.curriculum, step - 1, group, &mut self.rng);
            specs.extend(std::iter::repeat_n(spec, group_size));
        }
        let sampling = self.sampling(false);
        let inference = self.policy.valid();
        // Cross-policy sampling: the stale engines take the newest weights every
        // `refresh_every` updates (and at the start of RL).
        let pool = &self.spec.pool;
        let fresh_version = step - 1;
        if pool.cross_policy > 0.0 && refresh_due(fresh_version, pool.refresh_every) {
            self.stale = Some((inference.clone(), fresh_version));
        }
        let engines = Engines {
            fresh: Engine {
                policy: &inference,
                version: fresh_version,
            },
            stale: self.stale.as_ref().map(|(policy, version)| Engine {
                policy,
                version: *version,
            }),
            cross_policy: pool.cross_policy,
        };
        let plan = match algorithm.credit {
            Credit::MonteCarlo { k, .. } => {
                let longest = specs.iter().map(|s| s.max_turns).max().unwrap_or(0);
                Some(ForkPlan {
                    boundaries: algorithm.credit.boundaries(longest),
                    k,
                })
            }
            _ => None,
        };
        let (mut episodes, forks) = play_in_pool(
            &engines,
            &self.chat,
            &self.tasks,
            &self.controller,
            &specs,
            &sampling,
            self.context,
            plan.as_ref(),
            &mut self.rng,
        );
        let estimates = plan
            .is_some()
            .then(|| self.monte_carlo_values(&inference, &mut episodes, forks));
        let rollout_seconds = started.elapsed().as_secs_f64();
        let record = RlRecord {
            rollout_seconds,
            trajectories_per_second: episodes.len() as f64 / rollout_seconds.max(1e-9),
            mc_continuations: estimates.map(|(n, _)| n),
            mc_value: estimates.and_then(|(_, v)| v),
            ..RlRecord::default()
        };
        let versioned = self.stale.is_some();
        self.learn(step, episodes, record, versioned)
    }

    /// The update of RL step `step` on `episodes`, filling in `record` (which holds what the
    /// rollout measured). `versioned`: the episodes' turns may come from older weights, so the
    /// staleness bound applies and the staleness metrics are recorded.
    fn learn(
        &mut self,
        step: u64,
        episodes: Vec<Episode>,
        record: RlRecord,
        versioned: bool,
    ) -> Result<RlRecord, RunError> {
        let mut episodes = episodes;
        let algorithm = self.spec.algorithm.clone();
        let group_size = algorithm.group_size.max(1);
        let fresh_version = step - 1;
        let mut record = RlRecord {
            step,
            stage: self.curriculum.stage_name(step - 1).to_string(),
            tasks: self.task_stats(&episodes),
            sft_alpha: algorithm.sft.at(step - 1),
            ..record
        };
        let returns: Vec<f64> = episodes.iter().map(|e| f64::from(e.reward)).collect();
        record.success =
            episodes.iter().filter(|e| e.success).count() as f64 / episodes.len() as f64;
        record.mean_return = returns.iter().sum::<f64>() / returns.len() as f64;
        record.reward_std = std_dev(&returns);
        record.flat_groups = flat_groups(&episodes);
        if let SftSource::Successes { keep } = algorithm.sft_from {
            let solved = episodes
                .iter()
                .filter(|e| e.success && !e.transcript.tokens.is_empty());
            self.successes.extend(solved.map(|e| e.transcript.clone()));
            let excess = self.successes.len().saturating_sub(keep);
            self.successes.drain(..excess);
            record.successes_kept = Some(self.successes.len());
        }

        if algorithm.kl.placement == KlPlacement::Reward {
            self.penalize_kl(&mut episodes);
        }
        // Like the filter below, the staleness bound decides what is trained on; the success and
        // return above describe every episode played.
        if versioned {
            let (kept, dropped) = self.within_staleness(episodes, fresh_version, &mut record);
            episodes = kept;
            record.dropped = Some(record.dropped.unwrap_or(0) + dropped);
        }
        let episodes = filter_groups(episodes, algorithm.filter);
        record.groups_kept = episodes
            .iter()
            .map(|e| e.spec.group)
            .collect::<BTreeSet<_>>()
            .len();
        // PPO: the critic's values at the rollout (no gradient), then GAE on them.
        let old_values = match algorithm.kind {
            AlgorithmKind::Ppo => Some(self.rollout_values(&episodes)),
            _ => None,
        };
        let (advantages, returns) = self.token_advantages(&episodes, old_values.as_deref());
        record.agent_tokens = advantages.iter().map(Vec::len).sum();
        let flat: Vec<f64> = advantages.iter().flatten().map(|a| f64::from(*a)).collect();
        if !flat.is_empty() {
            record.advantage_mean = flat.iter().sum::<f64>() / flat.len() as f64;
            record.advantage_std = std_dev(&flat);
            record.advantage_min = flat.iter().copied().fold(f64::INFINITY, f64::min) as f32;
            record.advantage_max = flat.iter().copied().fold(f64::NEG_INFINITY, f64::max) as f32;
        }
        let critic_targets = match (&old_values, &returns) {
            (Some(values), Some(returns)) => {
                let (values, returns): (Vec<f32>, Vec<f32>) = (values.concat(), returns.concat());
                record.explained_variance = Some(explained_variance(&returns, &values));
                values != returns
            }
            _ => false,
        };
        if advantages.iter().flatten().all(|a| *a == 0.0) && !critic_targets {
            record.skipped = true;
            return Ok(record);
        }

        let update_started = Instant::now();
        let batch = self.rl_tensors(&episodes, &advantages);
        let width = batch.width;
        // `[n, width - 1]` tensors of the rollout values and the returns, for the value loss.
        let value_targets = old_values.as_ref().zip(returns.as_ref()).map(|(v, r)| {
            (
                self.token_tensor::<B>(&episodes, v, width),
                self.token_tensor::<B>(&episodes, r, width),
            )
        });
        let loss_config = PolicyLossConfig {
            clip: algorithm.clip,
            dual_clip: algorithm.dual_clip,
            aggregation: algorithm.aggregation,
            entropy_coef: algorithm.entropy,
            kl: match (algorithm.kl.estimator, algorithm.kl.placement) {
                (Some(estimator), KlPlacement::Loss) => Some((estimator, algorithm.kl.coef)),
                _ => None,
            },
        };
        let temperature = self.spec.train.temperature;
        let ref_logprobs = match (&self.reference, loss_config.kl) {
            (Some(reference), Some(_)) => Some(Tensor::from_inner(reference.scored_logprobs(
                batch.tokens.clone().inner(),
                &batch.scored,
                temperature,
            ))),
            _ => None,
        };
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let pad = self.chat.tokenizer().pad();
        // Truncated importance sampling: the ratio is taken against the policy the update
        // starts from, and each token weighed by how much likelier that policy finds it than
        // the one that sampled it, capped.
        let (old_logprobs, is_weights) = match algorithm.is_cap {
            None => (batch.old_logprobs.clone(), None),
            Some(cap) => {
                let start = score_in_buckets(
                    &self.policy.valid(),
                    &transcripts,
                    pad,
                    width,
                    temperature,
                    Want::LogProbs,
                )
                .logprobs;
                let start = Tensor::<B, 2>::from_inner(start);
                let (weights, stats) = truncated_is_weights(
                    start.clone(),
                    batch.old_logprobs.clone(),
                    batch.mask.clone(),
                    cap,
                );
                record.is_weight = Some(stats.mean);
                record.is_truncated = Some(stats.truncated);
                (start, Some(weights))
            }
        };
        // A shared trunk reads the values in the policy's own forward pass.
        let shared = value_targets.is_some() && self.critic.is_none();
        let want = if shared { Want::Both } else { Want::Policy };
        for _ in 0..algorithm.epochs {
            let scores =
                score_in_buckets(&self.policy, &transcripts, pad, width, temperature, want);
            let (mut loss, stats) = policy_loss(
                PolicyLossInput {
                    logprobs: scores.logprobs,
                    old_logprobs: old_logprobs.clone(),
                    is_weights: is_weights.clone(),
                    advantages: batch.advantages.clone(),
                    mask: batch.mask.clone(),
                    entropy: scores.entropy,
                    ref_logprobs: ref_logprobs.clone(),
                },
                &loss_config,
            );
            if let (true, Some(values), Some((old, returns))) =
                (shared, scores.values, &value_targets)
            {
                let (value, value_stats) = value_loss(
                    values,
                    old.clone(),
                    returns.clone(),
                    batch.mask.clone(),
                    algorithm.value_clip,
                );
                loss = loss + value * algorithm.value_coef;
                record.value_loss = Some(value_stats.loss);
                record.value_clip_frac = Some(value_stats.clip_frac);
            }
            let pool: Vec<&Transcript> = match algorithm.sft_from {
                SftSource::Oracle => self.demos.iter().collect(),
                SftSource::Successes { .. } => self.successes.iter().collect(),
            };
            if record.sft_alpha > 0.0 && !pool.is_empty() {
                let demos: Vec<&Transcript> = (0..group_size.max(4))
                    .map(|_| pool[self.rng.random_range(0..pool.len())])
                    .collect();
                loss = loss + self.padded::<B>(&demos).nll(&self.policy) * record.sft_alpha;
            }
            let descent = self.apply(loss, self.spec.train.lr);
            // A skipped update leaves the step's loss terms as they were (0 if no epoch ran).
            let Some(grad_norm) = self.survive(descent, Update::Rl { step })? else {
                record.skipped_nonfinite += 1;
                continue;
            };
            record.loss = descent.loss();
            record.policy_loss = stats.policy;
            record.entropy = stats.entropy;
            record.kl = stats.kl;
            record.clip_low = stats.clip_low;
            record.clip_high = stats.clip_high;
            record.grad_norm = grad_norm;
            if let (false, Some((old, returns))) = (shared, &value_targets) {
                match self.critic_step(&transcripts, old, returns, &batch.mask, step)? {
                    Some(stats) => {
                        record.value_loss = Some(stats.loss);
                        record.value_clip_frac = Some(stats.clip_frac);
                    }
                    None => record.skipped_nonfinite += 1,
                }
            }
        }
        record.update_seconds = update_started.elapsed().as_secs_f64();
        Ok(record)
    }

    /// Cross-policy sampling: records how many turns each policy version generated, and keeps
    /// only the groups whose every turn is within `max_staleness` versions of the fresh one
    /// ([`fresh_groups`], the rule the asynchronous collector applies too). Returns the kept
    /// episodes and the count dropped.
    fn within_staleness(
        &self,
        episodes: Vec<Episode>,
        fresh_version: u64,
        record: &mut RlRecord,
    ) -> (Vec<Episode>, usize) {
        let mut histogram = BTreeMap::new();
        for version in episodes.iter().flat_map(|e| &e.turn_versions) {
            *histogram.entry(fresh_version - version).or_insert(0) += 1;
        }
        let turns: usize = histogram.values().sum();
        let stale: usize = histogram
            .iter()
            .filter(|(behind, _)| **behind > 0)
            .map(|(_, n)| n)
            .sum();
        record.stale_turns = Some(if turns == 0 {
            0.0
        } else {
            stale as f64 / turns as f64
        });
        record.staleness = histogram;
        fresh_groups(
            episodes,
            |e| e.spec.group,
            |e| &e.turn_versions,
            fresh_version,
            self.spec.pool.max_staleness,
        )
    }

    /// Monte-Carlo credit: plays the snapshots' continuations with the current policy and sets
    /// each episode's `turn_values` (the mean continuation return of each snapshotted turn
    /// boundary, 0 elsewhere). Returns the continuations played and their mean return.
    fn monte_carlo_values(
        &mut self,
        policy: &Policy<B::InnerBackend>,
        episodes: &mut [Episode],
        forks: Vec<Fork>,
    ) -> (usize, Option<f64>) {
        let places: Vec<(usize, u32)> = forks.iter().map(|f| (f.episode, f.boundary)).collect();
        let returns = continue_forks(
            policy,
            &self.chat,
            &self.controller,
            forks,
            &self.sampling(false),
            self.context,
            self.spec.algorithm.gamma,
            &mut self.rng,
        );
        for episode in episodes.iter_mut() {
            episode.turn_values = vec![0.0; episode.turn_rewards.len()];
        }
        let all: Vec<f64> = returns.iter().flatten().map(|r| f64::from(*r)).collect();
        for ((episode, boundary), returns) in places.into_iter().zip(&returns) {
            let value = returns.iter().map(|r| f64::from(*r)).sum::<f64>() / returns.len() as f64;
            if let Some(slot) = episodes[episode].turn_values.get_mut(boundary as usize) {
                *slot = value as f32;
            }
        }
        let mean = (!all.is_empty()).then(|| all.iter().sum::<f64>() / all.len() as f64);
        (all.len(), mean)
    }

    /// Subtracts `coef * KL` of each episode's agent tokens from its reward.
    fn penalize_kl(&self, episodes: &mut [Episode]) {
        let (Some(reference), Some(estimator)) =
            (&self.reference, self.spec.algorithm.kl.estimator)
        else {
            return;
        };
        let coef = self.spec.algorithm.kl.coef;
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let batch = self.padded::<B::InnerBackend>(&transcripts);
        let ref_logprobs =
            reference.scored_logprobs(batch.tokens, &batch.scored, self.spec.train.temperature);
        let old = self.behaviour_logprobs::<B::InnerBackend>(episodes, batch.width);
        let kl = (kl_estimate(old, ref_logprobs, estimator) * batch.mask).sum_dim(1);
        let kl = kl.into_data().into_vec::<f32>().unwrap_or_default();
        for (episode, kl) in episodes.iter_mut().zip(kl) {
            let penalty = (f64::from(kl) * coef) as f32;
            episode.reward -= penalty;
            // Turn credit: the penalty is the last turn's (the KL is of the whole episode).
            if let Some(last) = episode.turn_rewards.last_mut() {
                *last -= penalty;
            }
        }
    }

    /// Per-token advantages of every episode's agent tokens, normalized as the spec says; for
    /// PPO (`values` are the critic's rollout values of each episode's agent tokens) also the
    /// GAE returns, the critic's targets.
    ///
    /// PPO's advantages are GAE over each episode's agent tokens ([`gae`]) whitened over the
    /// batch's agent tokens, as REINFORCE++'s returns are; `advantage_norm = batch` is that
    /// whitening (not applied twice), `group` and `per_task` normalize the whitened values
    /// further, `none` keeps them whitened. `negative_weight` applies to every algorithm last.
    fn token_advantages(
        &self,
        episodes: &[Episode],
        values: Option<&[Vec<f32>]>,
    ) -> (Vec<Vec<f32>>, Option<Vec<Vec<f32>>>) {
        let algorithm = &self.spec.algorithm;
        // Per agent token: its advantage, and the episode it belongs to.
        let mut flat = Vec::new();
        let mut owner = Vec::new();
        let mut returns = None;
        match values {
            Some(values) => {
                let mut per_episode = Vec::with_capacity(episodes.len());
                for (i, (episode, values)) in episodes.iter().zip(values).enumerate() {
                    let rewards = match algorithm.credit {
                        Credit::Outcome => terminal_rewards(values.len(), episode.reward),
                        Credit::Turn | Credit::MonteCarlo { .. } => {
                            turn_end_rewards(&episode.turn_tokens, &episode.turn_rewards)
                        }
                    };
                    let (advantages, episode_returns) =
                        gae(&rewards, values, algorithm.gamma, algorithm.lambda);
                    owner.extend(std::iter::repeat_n(i, advantages.len()));
                    flat.extend(advantages);
                    per_episode.push(episode_returns);
                }
                returns = Some(per_episode);
            }
            None => {
                let trajectories: Vec<Trajectory<'_>> = episodes
                    .iter()
                    .map(|e| Trajectory {
                        group: e.spec.group,
                        reward: e.reward,
                        turn_rewards: &e.turn_rewards,
                        turn_tokens: &e.turn_tokens,
                        turn_values: &e.turn_values,
                    })
                    .collect();
                let per_episode = credited_advantages(
                    algorithm.kind,
                    algorithm.credit,
                    algorithm.gamma,
                    &trajectories,
                )
                .unwrap_or_default();
                for (i, advantages) in per_episode.into_iter().enumerate() {
                    owner.extend(std::iter::repeat_n(i, advantages.len()));
                    flat.extend(advantages);
                }
            }
        }
        let whitened = algorithm.kind.whitens();
        if whitened {
            whiten(&mut flat);
        }
        let key = |f: &dyn Fn(&Episode) -> usize| -> Vec<usize> {
            owner.iter().map(|&i| f(&episodes[i])).collect()
        };
        match algorithm.advantage_norm {
            AdvantageNorm::None => {}
            AdvantageNorm::Group if algorithm.kind == AlgorithmKind::Grpo => {}
            AdvantageNorm::Group => normalize_by_key(&mut flat, &key(&|e| e.spec.group)),
            AdvantageNorm::Batch if whitened => {}
            AdvantageNorm::Batch => {
                let one_key = vec![0; flat.len()];
                normalize_by_key(&mut flat, &one_key);
            }
            AdvantageNorm::PerTask => normalize_by_key(&mut flat, &key(&|e| e.spec.task)),
        }
        weigh_negatives(&mut flat, algorithm.negative_weight);
        let mut out: Vec<Vec<f32>> = vec![Vec::new(); episodes.len()];
        for (value, i) in flat.into_iter().zip(owner) {
            out[i].push(value);
        }
        (out, returns)
    }

    /// The critic's values (the shared trunk's head, or the separate critic) of each episode's
    /// agent tokens, computed without a gradient before the update: PPO's `V_old`.
    fn rollout_values(&self, episodes: &[Episode]) -> Vec<Vec<f32>> {
        let critic = match &self.critic {
            Some(critic) => critic.net.valid(),
            None => self.policy.valid(),
        };
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let width = Padded::<B::InnerBackend>::width(&transcripts);
        let pad = self.chat.tokenizer().pad();
        let values = score_in_buckets(&critic, &transcripts, pad, width, 1.0, Want::Values)
            .values
            .map(|v| v.into_data().into_vec::<f32>().unwrap_or_default())
            .unwrap_or_default();
        episodes
            .iter()
            .enumerate()
            .map(|(i, episode)| {
                (1..width)
                    .filter(|&j| agent_at(episode, j))
                    .map(|j| values.get(i * (width - 1) + j - 1).copied().unwrap_or(0.0))
                    .collect()
            })
            .collect()
    }

    /// One update of the separate critic on the clipped value loss, with its own optimizer at
    /// the train learning rate and the algorithm's gradient clip; `None` when it was skipped as
    /// not finite.
    fn critic_step(
        &mut self,
        transcripts: &[&Transcript],
        old_values: &Tensor<B, 2>,
        returns: &Tensor<B, 2>,
        mask: &Tensor<B, 2>,
        step: u64,
    ) -> Result<Option<ValueStats>, RunError> {
        let pad = self.chat.tokenizer().pad();
        let (lr, clip, grad_clip) = (
            self.spec.train.lr,
            self.spec.algorithm.value_clip,
            self.spec.algorithm.grad_clip,
        );
        let Some(critic) = self.critic.as_mut() else {
            return Err(RunError::Unsupported(
                "internal: PPO with a separate critic reached an update without its critic"
                    .to_string(),
            ));
        };
        let width = old_values.dims()[1] + 1;
        let values = score_in_buckets(&critic.net, transcripts, pad, width, 1.0, Want::Values)
            .values
            .unwrap_or_else(|| Tensor::zeros(old_values.dims(), &self.device));
        let (loss, stats) = value_loss(
            values,
            old_values.clone(),
            returns.clone(),
            mask.clone(),
            clip,
        );
        let (net, descent) = descend(
            critic.net.clone(),
            &mut critic.optimizer,
            loss,
            lr,
            grad_clip,
        );
        critic.net = net;
        Ok(self
            .survive(descent, Update::Critic { step })?
            .map(|_| stats))
    }

    fn task_stats(&self, episodes: &[Episode]) -> BTreeMap<String, TaskStats> {
        self.spec
            .tasks
            .iter()
            .enumerate()
            .filter_map(|(t, task)| {
                let stats = TaskStats::of(
                    episodes
                        .iter()
                        .filter(|e| e.spec.task == t)
                        .map(|e| (e.success, e.reward, e.turns)),
                );
                (stats.episodes > 0).then(|| (task.name.clone(), stats))
            })
            .collect()
    }

    /// Success on `eval.episodes` fixed instances of each task, with each decoding
    /// `eval.decoding` asks for: greedy first, then sampled at the training settings. Each
    /// decoding writes its `Record::Eval` line and its samples file (`samples-LABEL.txt` for
    /// greedy, `samples-LABEL-sampled.txt` for sampled).
    fn evaluate(&mut self, step: u64, label: &str) -> Result<Evaluated, RunError> {
        let eval = self.spec.eval.clone();
        let mut specs = Vec::new();
        for (t, task) in self.spec.tasks.iter().enumerate() {
            let levels = task.difficulty.max - task.difficulty.min + 1;
            for i in 0..eval.episodes {
                specs.push(EpisodeSpec {
                    task: t,
                    split: env_split(eval.split),
                    difficulty: task.difficulty.min + (i % usize::from(levels)) as u8,
                    index: i as u64,
                    max_turns: task.max_turns,
                    group: specs.len(),
                });
            }
        }
        let mut done = Vec::new();
        for &decoding in eval.decoding.each() {
            // Evaluation draws from its own stream, one per decoding, so evaluating (and
            // whether it samples) does not change training; greedy keeps stream 0.
            let mut rng = ChaCha8Rng::seed_from_u64(self.spec.seed ^ 0x5eed_e7a1);
            let (greedy, samples) = match decoding {
                Decoding::Greedy => (true, label.to_string()),
                Decoding::Sampled => {
                    rng.set_stream(1);
                    (false, format!("{label}-sampled"))
                }
            };
            let episodes = play(
                &self.policy.valid(),
                &self.chat,
                &self.tasks,
                &self.controller,
                &specs,
                &self.sampling(greedy),
                self.context,
                &mut rng,
            );
            self.write_samples(&samples, greedy, &episodes)?;
            let tasks = self.task_stats(&episodes);
            let success =
                tasks.values().map(|s| s.success).sum::<f64>() / tasks.len().max(1) as f64;
            let solved = episodes.iter().filter(|e| e.success).count();
            let success_ci = wilson(solved, episodes.len());
            self.run_dir.record(&Record::Eval {
                step,
                label: label.to_string(),
                decoding,
                tasks: tasks.clone(),
                success,
                success_ci,
            })?;
            done.push((
                decoding,
                Evaluation {
                    tasks,
                    success,
                    success_ci,
                },
            ));
        }
        Ok(Evaluated::of(done))
    }

    /// Writes the first episodes of each task as readable transcripts, `samples-LABEL.txt`,
    /// and every episode as a replayable line of `episodes/` ([`crate::trajectory`]).
    ///
    /// Evaluation episodes are played by the policy as it stands: its version is the RL steps
    /// done (0 for the warm-up's evaluation, whose weights RL starts from); `greedy` says how
    /// they were decoded.
    fn write_samples(
        &self,
        label: &str,
        greedy: bool,
        episodes: &[Episode],
    ) -> Result<(), RunError> {
        let mut text = String::new();
        for (t, task) in self.spec.tasks.iter().enumerate() {
            for episode in episodes.iter().filter(|e| e.spec.task == t).take(4) {
                text.push_str(&render(&task.name, episode, self.chat.tokenizer()));
                text.push('\n');
            }
        }
        let path = self.run_dir.path().join(format!("samples-{label}.txt"));
        std::fs::write(&path, text).map_err(RunError::io(path))?;

        let version = match self.phase {
            Phase::Rl { step } => step,
            Phase::Warmup { .. } => 0,
        };
        let sampling = self.sampling(greedy);
        let mut lines = String::new();
        for episode in episodes {
            let task = &self.spec.tasks[episode.spec.task].name;
            let origin = Origin {
                task,
                task_version: self.task_versions.get(task).map_or("", String::as_str),
                evaluation: label,
                context: self.context,
                sampling: &sampling,
                version,
            };
            let line =
                serde_json::to_string(&trajectory::Trajectory::of(episode, &self.chat, &origin))
                    .map_err(|e| RunError::Io {
                        path: self.run_dir.path().join(trajectory::DIR),
                        source: std::io::Error::other(e.to_string()),
                    })?;
            lines.push_str(&line);
            lines.push('\n');
        }
        let dir = self.run_dir.path().join(trajectory::DIR);
        std::fs::create_dir_all(&dir).map_err(RunError::io(&dir))?;
        let path = dir.join(trajectory::file_name(label, version));
        std::fs::write(&path, lines).map_err(RunError::io(path))
    }

    /// Whether `checkpoint_every` falls on `step` (warm-up and RL steps count separately).
    fn checkpoint_due(&self, step: u64) -> bool {
        self.spec
            .train
            .checkpoint_every
            .is_some_and(|every| step.is_multiple_of(every))
    }

    fn periodic_eval_due(&self, step: u64) -> bool {
        self.spec
            .eval
            .every
            .is_some_and(|every| step.is_multiple_of(every))
    }

    /// Writes a checkpoint of where the run stands (see [`crate::checkpoint`]).
    fn checkpoint(&mut self) -> Result<(), RunError> {
        let run_dir = self.run_dir.path().to_path_buf();
        self.save_checkpoint(&run_dir)?;
        self.saved = Some(self.phase);
        Ok(())
    }

    /// Writes a checkpoint of where the run stands into `dir/checkpoints/`; returns its path.
    fn save_checkpoint(&mut self, dir: &Path) -> Result<PathBuf, RunError> {
        self.successes.make_contiguous();
        let path = Snapshot {
            spec: &self.spec,
            task_versions: &self.task_versions,
            tokenizer: self.chat.tokenizer(),
            policy: &self.policy,
            optimizer: &self.optimizer,
            reference: self.reference.as_ref(),
            critic: self.critic.as_ref().map(|c| (&c.net, &c.optimizer)),
            phase: self.phase,
            rng: &self.rng,
            after_warmup: self.after_warmup.as_ref().map(|e| &e.first),
            after_warmup_sampled: self.after_warmup.as_ref().and_then(|e| e.sampled.as_ref()),
            skipped_steps: self.skipped,
            metrics_len: self.run_dir.metrics_len()?,
            successes: self.successes.as_slices().0,
            monitor: &self.monitor,
            nonfinite_streak: self.nonfinite_streak,
            stale: self
                .stale
                .as_ref()
                .map(|(policy, version)| (policy, *version)),
        }
        .save(dir)?;
        Ok(path)
    }

    fn save_weights(&self, name: &str) -> Result<(), RunError> {
        let path = self.run_dir.path().join(name);
        self.policy
            .clone()
            .save_file(
                path.clone(),
                &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            )
            .map_err(|e| RunError::Io {
                path,
                source: std::io::Error::other(e.to_string()),
            })
    }

    /// Right-padded transcripts, with the agent mask of the predicted tokens.
    fn padded<C: Kernels<Device = B::Device>>(&self, transcripts: &[&Transcript]) -> Padded<C> {
        Padded::new(transcripts, self.chat.tokenizer().pad(), &self.device)
    }

    /// The log-probabilities the episodes' tokens were sampled with, `[n, width - 1]`.
    fn behaviour_logprobs<C: Backend<Device = B::Device>>(
        &self,
        episodes: &[Episode],
        width: usize,
    ) -> Tensor<C, 2> {
        let old: Vec<f32> = episodes
            .iter()
            .flat_map(|e| (1..width).map(|j| e.logprobs.get(j).copied().unwrap_or(0.0)))
            .collect();
        Tensor::from_data(
            TensorData::new(old, [episodes.len(), width - 1]),
            &self.device,
        )
    }

    /// Values given per agent token of each episode (in order, for positions `1..`), placed
    /// at their predicted-token positions of a `[n, width - 1]` tensor, zero elsewhere.
    fn token_tensor<C: Backend<Device = B::Device>>(
        &self,
        episodes: &[Episode],
        per_token: &[Vec<f32>],
        width: usize,
    ) -> Tensor<C, 2> {
        let mut flat = Vec::with_capacity(episodes.len() * (width - 1));
        for (episode, values) in episodes.iter().zip(per_token) {
            let mut next = values.iter();
            for j in 1..width {
                flat.push(if agent_at(episode, j) {
                    next.next().copied().unwrap_or(0.0)
                } else {
                    0.0
                });
            }
        }
        Tensor::from_data(
            TensorData::new(flat, [episodes.len(), width - 1]),
            &self.device,
        )
    }

    fn rl_tensors(&self, episodes: &[Episode], advantages: &[Vec<f32>]) -> RlBatch<B> {
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let padded = self.padded::<B>(&transcripts);
        let width = padded.width;
        RlBatch {
            width,
            old_logprobs: self.behaviour_logprobs(episodes, width),
            advantages: self.token_tensor(episodes, advantages, width),
            tokens: padded.tokens,
            mask: padded.mask,
            scored: padded.scored,
        }
    }
}

/// Whether token `j` of the episode's transcript is the agent's.
fn agent_at(episode: &Episode, j: usize) -> bool {
    episode
        .transcript
        .agent_mask
        .get(j)
        .copied()
        .unwrap_or(false)
}

/// PPO's separate critic (`value_head = separate`): a network of the policy's architecture
/// with a value head, trained on the value loss by an optimizer of its own.
struct Critic<B: TrainBackend> {
    net: Policy<B>,
    optimizer: PolicyOptimizer<Policy<B>, B>,
}

impl<B: TrainBackend> Critic<B> {
    /// A copy of `policy` (its trunk and LM head, which the critic never reads) with a fresh
    /// value head and a fresh optimizer of the declared kind: what the critic starts from, and
    /// what a resumed run loads its state into.
    fn fresh(policy: &Policy<B>, optimizer: &spec::Optimizer) -> Self {
        Critic {
            net: policy.clone().with_value_head(),
            optimizer: PolicyOptimizer::new(optimizer),
        }
    }
}

/// Which update a non-finite loss or gradient stopped the run at.
#[derive(Clone, Copy, Debug)]
enum Update {
    /// A warm-up step.
    Warmup { step: u64 },
    /// The policy's update of an RL step.
    Rl { step: u64 },
    /// The separate critic's update of an RL step.
    Critic { step: u64 },
}

impl std::fmt::Display for Update {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Update::Warmup { step } => write!(f, "warm-up step {step}"),
            Update::Rl { step } => write!(f, "RL step {step}"),
            Update::Critic { step } => write!(f, "the critic's update at RL step {step}"),
        }
    }
}

/// Right-padded transcripts `[n, width]` and which predicted tokens `[n, width - 1]` are the
/// agent's, as a tensor (`mask`) and on the host (`scored`).
struct Padded<B: Backend> {
    tokens: Tensor<B, 2, Int>,
    mask: Tensor<B, 2>,
    scored: Vec<bool>,
    width: usize,
}

impl<B: Kernels> Padded<B> {
    /// The padded width of `transcripts`: the longest, at least 2.
    fn width(transcripts: &[&Transcript]) -> usize {
        transcripts
            .iter()
            .map(|t| t.tokens.len())
            .max()
            .unwrap_or(2)
            .max(2)
    }

    fn new(transcripts: &[&Transcript], pad: u32, device: &B::Device) -> Self {
        let width = Self::width(transcripts);
        let mut tokens = Vec::with_capacity(transcripts.len() * width);
        let mut scored = Vec::with_capacity(transcripts.len() * (width - 1));
        for t in transcripts {
            tokens.extend(t.tokens.iter().map(|&x| i64::from(x)));
            tokens.extend(std::iter::repeat_n(i64::from(pad), width - t.tokens.len()));
            scored.extend(t.agent_mask.iter().skip(1));
            scored.extend(std::iter::repeat_n(false, width - t.tokens.len().max(1)));
        }
        let n = transcripts.len();
        let mask: Vec<f32> = scored.iter().map(|&m| f32::from(u8::from(m))).collect();
        Padded {
            tokens: Tensor::from_data(TensorData::new(tokens, [n, width]), device),
            mask: Tensor::from_data(TensorData::new(mask, [n, width - 1]), device),
            scored,
            width,
        }
    }

    /// Mean negative log-likelihood of the agent tokens under `policy` (temperature 1): the
    /// SFT loss.
    fn nll(self, policy: &Policy<B>) -> Tensor<B, 1> {
        let logprobs = policy.scored_logprobs(self.tokens, &self.scored, 1.0);
        (logprobs * self.mask.clone()).sum().neg() / self.mask.sum().clamp_min(1.0)
    }
}

/// [`Policy::score`] of `transcripts` (padded with `pad`), `[n, width - 1]` in their order
/// (`width` at least the longest transcript), computed in buckets of [`LENGTH_BUCKET`]
/// transcripts of similar length; the values (when wanted and the policy has a value head)
/// come back in the same shape and order.
///
/// Attention costs grow with the square of the padded width, and RL transcripts vary in
/// length (one turn or many), so padding each bucket only to its own longest transcript
/// saves most of the work spent on padding. Padding never changes the scores of the real
/// tokens before it, so the result equals scoring the whole batch at once.
pub fn score_in_buckets<C: Kernels>(
    policy: &Policy<C>,
    transcripts: &[&Transcript],
    pad: u32,
    width: usize,
    temperature: f64,
    want: Want,
) -> Scores<C> {
    let device = policy.device();
    let mut order: Vec<usize> = (0..transcripts.len()).collect();
    order.sort_by_key(|&i| transcripts[i].tokens.len());
    let (mut logprobs, mut entropies, mut values) = (Vec::new(), Vec::new(), Vec::new());
    for bucket in order.chunks(LENGTH_BUCKET) {
        let members: Vec<&Transcript> = bucket.iter().map(|&i| transcripts[i]).collect();
        let padded = Padded::<C>::new(&members, pad, &device);
        let scores = policy.score(padded.tokens, &padded.scored, temperature, want);
        let widen = |t: Tensor<C, 2>| match width - padded.width {
            0 => t,
            extra => {
                let zeros = Tensor::zeros([members.len(), extra], &device);
                Tensor::cat(vec![t, zeros], 1)
            }
        };
        logprobs.push(widen(scores.logprobs));
        entropies.push(widen(scores.entropy));
        values.extend(scores.values.map(widen));
    }
    let mut back = vec![0i64; order.len()];
    for (row, &i) in order.iter().enumerate() {
        back[i] = row as i64;
    }
    let back = Tensor::<C, 1, Int>::from_data(TensorData::new(back, [order.len()]), &device);
    let restore = |parts: Vec<Tensor<C, 2>>| Tensor::cat(parts, 0).select(0, back.clone());
    let has_values = !values.is_empty() && values.len() == logprobs.len();
    Scores {
        logprobs: restore(logprobs),
        entropy: restore(entropies),
        values: has_values.then(|| restore(values)),
    }
}

struct RlBatch<B: Backend> {
    width: usize,
    tokens: Tensor<B, 2, Int>,
    mask: Tensor<B, 2>,
    scored: Vec<bool>,
    old_logprobs: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
}

/// One training episode's draw: task, difficulty and budget from the curriculum, a random
/// instance of the task's training split.
pub(crate) fn training_draw(
    spec: &spec::Experiment,
    curriculum: &Curriculum,
    step: u64,
    group: usize,
    rng: &mut ChaCha8Rng,
) -> EpisodeSpec {
    let draw = curriculum.draw(step, rng);
    EpisodeSpec {
        task: draw.task,
        split: env_split(spec.tasks[draw.task].split),
        difficulty: draw.difficulty,
        index: rng.random_range(0..u64::from(u32::MAX)),
        max_turns: draw.max_turns,
        group,
    }
}

fn env_split(split: spec::Split) -> Split {
    match split {
        spec::Split::Train => Split::Train,
        spec::Split::Test => Split::Test,
    }
}

/// The episodes of the groups with the largest reward spread (StarPO-S), or all of them.
fn filter_groups(episodes: Vec<Episode>, filter: spec::Filter) -> Vec<Episode> {
    let spec::Filter::RewardStd { keep } = filter else {
        return episodes;
    };
    let groups = group_rewards(&episodes);
    let mut spread: Vec<(usize, f64)> = groups.iter().map(|(g, r)| (*g, std_dev(r))).collect();
    spread.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let count = ((spread.len() as f64 * keep).ceil() as usize).clamp(1, spread.len());
    let kept: Vec<usize> = spread[..count].iter().map(|(g, _)| *g).collect();
    episodes
        .into_iter()
        .filter(|e| kept.contains(&e.spec.group))
        .collect()
}

/// The episodes' rewards by group.
fn group_rewards(episodes: &[Episode]) -> BTreeMap<usize, Vec<f64>> {
    let mut groups: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for e in episodes {
        groups
            .entry(e.spec.group)
            .or_default()
            .push(f64::from(e.reward));
    }
    groups
}

/// Fraction of the groups of two or more episodes whose members all earned the same reward;
/// 0 without such groups.
fn flat_groups(episodes: &[Episode]) -> f64 {
    let rewards = group_rewards(episodes);
    let sized: Vec<&Vec<f64>> = rewards.values().filter(|r| r.len() >= 2).collect();
    if sized.is_empty() {
        return 0.0;
    }
    let flat = sized
        .iter()
        .filter(|r| r.iter().all(|x| *x == r[0]))
        .count();
    flat as f64 / sized.len() as f64
}

fn split_name(split: spec::Split) -> &'static str {
    match split {
        spec::Split::Train => "train",
        spec::Split::Test => "held-out",
    }
}

fn describe(evaluation: &Evaluation) -> String {
    let per_task: Vec<String> = evaluation
        .tasks
        .iter()
        .map(|(name, s)| format!("{name} {:.2}", s.success))
        .collect();
    let [low, high] = evaluation.success_ci;
    format!(
        "{:.3} [95% CI {low:.3}, {high:.3}] ({})",
        evaluation.success,
        per_task.join(", ")
    )
}

/// The evaluations of one point of a run: the first decoding `eval.decoding` asks for (greedy,
/// the headline number, unless only sampled is asked) and, with `both`, the sampled one.
#[derive(Clone, Debug)]
struct Evaluated {
    /// The first decoding's evaluation.
    first: Evaluation,
    /// Which decoding `first` is.
    first_decoding: Decoding,
    /// The sampled evaluation, when it followed a greedy one.
    sampled: Option<Evaluation>,
}

impl Evaluated {
    /// From the evaluations in the order they ran (at least one: `EvalDecoding::each` is never
    /// empty).
    fn of(done: Vec<(Decoding, Evaluation)>) -> Self {
        let mut done = done.into_iter();
        let (first_decoding, first) = done.next().expect("every eval.decoding has a decoding");
        Evaluated {
            first,
            first_decoding,
            sampled: done.next().map(|(_, e)| e),
        }
    }

    /// The summary line: each decoding's success with its interval, greedy first.
    fn describe(&self) -> String {
        let mut line = format!("{} {}", describe(&self.first), self.first_decoding.name());
        if let Some(sampled) = &self.sampled {
            line.push_str(&format!(
                ", {} {}",
                describe(sampled),
                Decoding::Sampled.name()
            ));
        }
        line
    }
}
