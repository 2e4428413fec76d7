//! The training loop: supervised warm-up on oracle demonstrations, then RL.
//!
//! A run is set up once (`setup`), then goes step by step: an `EpisodeSource` (`source`) plays
//! or collects the step's episodes, `prepare` turns them into what the update trains on, the
//! update changes the weights (`update`), the source hands the new weights to the engines,
//! and the step's record is composed from what each of them measured (`record`), then
//! written, checkpointed and evaluated (`eval`) when due. Everything a run mutates is one
//! `RunState` (`state`), which is exactly what a checkpoint holds; its RNG fixes the order of
//! random draws, so the whole run is fixed by the experiment's seed.

mod buckets;
mod eval;
mod exchange;
mod nodes;
mod prepare;

pub(crate) use eval::{eval_specs, evaluation_of, repeated_instance_warnings, split_name};
mod record;
mod replicas;
mod setup;
mod shares;
mod source;
mod state;
mod update;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentry_dsl::spec::{self, Device};
use agentry_dsl::{Checked, OverrideError};
use agentry_env::TaskGenerator;
use agentry_env::controller::Controller;
use burn::module::AutodiffModule;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};

use crate::checkpoint::{Checkpoint, Phase};
use crate::curriculum::Curriculum;
use crate::device::{self, OnBackend};
use crate::error::RunError;
use crate::experiment::Experiment;
use crate::metrics::{EvalPoint, Progress, Record, RlRecord, RunDir};
use crate::model::{Sampling, TrainBackend};
use crate::shared_warmup::{Earlier, SharedWarmups, WarmupFromError};
use crate::text::{ChatFormat, Transcript};
use record::StepStats;
use source::{Asynchronous, EpisodeSource, PipelineStats, Synchronous, refresh_stale};
use state::{Critic, Identity, RunState};

pub use crate::metrics::Evaluation;
pub use buckets::score_in_buckets;
pub(crate) use eval::warmup_evaluation_files;
pub use nodes::{NodeConfig, Nodes, follow, serve_orchestrator};
pub use replicas::fail_replica_at;
use setup::DemoCounts;

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
    /// Start from the end of a warm-up an earlier run trained: a run directory, or a folder
    /// of them (an experiment's runs), searched for the one whose warm-up this run would train
    /// identically ([`crate::shared_warmup::Earlier`]). The run is new; RL settings may differ.
    pub warmup_from: Option<PathBuf>,
    /// Warm-ups to share with the other runs of this invocation ([`crate::shared_warmup`]):
    /// a run whose warm-up is kept there starts from it, and a run that trains one keeps it.
    pub shared_warmups: Option<Arc<SharedWarmups>>,
    /// Connects `remote = "URL"` tasks ([`crate::tasks::RemoteTasks`]); without it they are
    /// an error. The `agentry` crate sets it to its HTTP client.
    pub remote_tasks: Option<Arc<dyn crate::tasks::RemoteTasks>>,
    /// A multi-node invocation's leader (rank 0): its runs' data-parallel replicas are
    /// `train.data_parallel` on each node ([`Nodes`]). The other ranks run [`follow`].
    pub nodes: Option<Arc<Nodes>>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            device: None,
            steps: None,
            out: PathBuf::from("runs"),
            quiet: false,
            resume: None,
            warmup_from: None,
            shared_warmups: None,
            remote_tasks: None,
            nodes: None,
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

/// What a finished run reports (`summary.json`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// The device the run used.
    pub device: String,
    /// CPU threads of flex's kernels (and the host side of any device).
    pub cpu_threads: usize,
    /// `matmul_precision`, and what it did here (`medium (bf16 on AMX tiles)`, `medium (bf16 by
    /// AVX-512 BF16)`).
    pub matmul_precision: String,
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
    /// ([`crate::shared_warmup`]) or took one with `--warmup-from`; its own warm-up would have
    /// been the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_from: Option<PathBuf>,
}

impl RunSummary {
    /// The file name in a run directory; a run writes it once it has finished (only the report
    /// comes after), so its presence means the run finished.
    pub const FILE: &str = "summary.json";
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

/// Everything [`run_configuration`] checks before any work (the overrides, the tasks, a
/// checkpoint to resume, the `--warmup-from` match), without running: a sweep checks every
/// run before the first starts.
pub(crate) fn check_start(
    experiment: &dyn Experiment,
    options: &RunOptions,
    config: &str,
) -> Result<(), RunError> {
    Job::new(experiment, options, config).map(drop)
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
    /// `--warmup-from`: the earlier run's warm-up to start from, already matched.
    earlier: Option<Earlier>,
    /// With LoRA over a pretrained model, the digest of its files (checkpoints record it).
    base_digest: Option<String>,
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
        if options.nodes.is_some() {
            nodes::refuse_unsupported(&spec)?;
        }
        let remote = options.remote_tasks.as_deref();
        let tasks = crate::tasks::resolve(&|name| experiment.user_task(name), remote, &spec)?;
        let task_versions: BTreeMap<String, String> = spec
            .tasks
            .iter()
            .zip(&tasks)
            .map(|(task, generator)| (task.name.clone(), generator.version().to_string()))
            .collect();
        let base_digest = match spec.model.finetune {
            spec::Finetune::Lora(_) => crate::model::base_digest(&spec.model.arch)?,
            spec::Finetune::Full => None,
        };
        if options.warmup_from.is_some() && options.resume.is_some() {
            return Err(WarmupFromError::WithResume.into());
        }
        // A checkpoint is read and matched before any work, so a bad one costs nothing.
        let resume = match &options.resume {
            Some(path) => {
                let checkpoint = Checkpoint::read(&Checkpoint::locate(path)?)?;
                checkpoint.check_matches(&spec, &task_versions, base_digest.as_deref())?;
                checkpoint.run_dir()?;
                Some(checkpoint)
            }
            None => None,
        };
        let earlier = match &options.warmup_from {
            Some(dir) => Some(Earlier::find(
                dir,
                &spec,
                &task_versions,
                base_digest.as_deref(),
            )?),
            None => None,
        };
        Ok(Job {
            spec,
            tasks,
            task_versions,
            resume,
            earlier,
            base_digest,
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

/// A run as it goes: what setup fixed, and the state a checkpoint holds.
struct Trainer<B: TrainBackend> {
    spec: spec::Experiment,
    device_name: String,
    tasks: Arc<Vec<Box<dyn TaskGenerator>>>,
    /// Steps the environments of every rollout in parallel, isolating failures.
    controller: Arc<Controller>,
    chat: ChatFormat,
    context: usize,
    demos: Vec<Transcript>,
    /// Per task: oracle demonstrations drawn, kept, and left out.
    demo_counts: Vec<DemoCounts>,
    /// For a tokenizer trained by this run: the tokens it would need to keep every word of
    /// the tasks' text whole.
    vocab_needed: Option<usize>,
    curriculum: Curriculum,
    device: B::Device,
    options: RunOptions,
    task_versions: BTreeMap<String, String>,
    /// Disaggregated placement: the devices the rollout workers run on (empty: the trainer's).
    engine_devices: Vec<B::Device>,
    /// What the warm-up depends on, when another run may share it ([`SharedWarmups::key`]).
    warmup_key: Option<String>,
    /// The run whose warm-up this one started from (shared, or `--warmup-from`).
    warmup_from: Option<PathBuf>,
    /// With LoRA over a pretrained model, the digest of its files (checkpoints record it).
    base_digest: Option<String>,
    /// Everything the run mutates.
    state: RunState<B>,
    run_dir: RunDir,
    /// The phase of the latest checkpoint written (or resumed from).
    saved: Option<Phase>,
    /// `train.data_parallel > 1`, or several nodes: the other trainer replicas, from the first
    /// update on.
    replicas: Option<replicas::Replicas<B>>,
}

impl<B: TrainBackend> Trainer<B> {
    fn run(mut self) -> Result<RunSummary, RunError> {
        let out = Progress::new(0, "", true);
        let precision = device::set_matmul_precision(self.spec.matmul_precision);
        let products = match self.spec.matmul_precision {
            spec::MatmulPrecision::Highest => String::new(),
            spec::MatmulPrecision::Medium => format!(", products {precision}"),
        };
        let per_node = self.spec.train.data_parallel;
        let replicas = match &self.options.nodes {
            Some(nodes) => format!(
                " ({} data-parallel replicas on {} nodes)",
                nodes.replicas(per_node),
                nodes.config().nodes
            ),
            None if per_node == 1 => String::new(),
            None => format!(" ({per_node} data-parallel replicas)"),
        };
        out.println(format!(
            "experiment `{}` on {}{replicas}{products} | {} tasks | {} demonstrations | vocab {}",
            self.spec.name,
            self.device_name,
            self.tasks.len(),
            self.demos.len(),
            self.chat.tokenizer().vocab_size()
        ));
        let vocab = self.chat.tokenizer().vocab_size();
        if let Some(needed) = self.vocab_needed.filter(|&needed| needed > vocab) {
            out.println(format!(
                "warning: the tasks' text has {} words the tokenizer spells in bytes (it holds \
                 {vocab} tokens of the {needed} it would need), and a small policy copies a \
                 value spelled in bytes badly; raise the model's `vocab` to {needed} to keep \
                 every word whole",
                needed - vocab
            ));
        }
        for line in repeated_instance_warnings(&self.spec, &self.tasks) {
            out.println(line);
        }
        self.warm_up(&out)?;
        let steps = self.spec.train.steps;
        let Phase::Rl { step: done } = self.state.phase else {
            unreachable!("the warm-up ends in the RL phase")
        };
        let out = Progress::new(steps, "rl", self.options.quiet);
        out.update(done, String::new());
        // A checkpoint is written before the evaluation of its step, so a run resumed there
        // runs that evaluation (it was cut, or was the final one of a shorter run).
        if done > 0 && done < steps && self.periodic_eval_due(done) {
            let evaluation = self.evaluate(done, EvalPoint::Periodic)?;
            out.println(format!("step {done}: success {}", evaluation.describe()));
        }
        match self.spec.pool.mode {
            // Nothing left to train (`steps = 0`, or a run resumed at its end): no engines.
            _ if done >= steps => {}
            spec::PoolMode::Sync => {
                let fresh = self.state.policy.valid();
                refresh_stale(&mut self, &fresh, done);
                self.rl_steps(&mut Synchronous, done, steps, &out)?;
            }
            spec::PoolMode::Async => std::thread::scope(|scope| {
                let mut source = Asynchronous::start(scope, &mut self, done);
                let result = self.rl_steps(&mut source, done, steps, &out);
                source.stop();
                result
            })?,
        }
        out.finish();
        self.finish(steps, &out)
    }

    /// RL steps `done + 1 ..= steps`, on episodes from `source`.
    fn rl_steps(
        &mut self,
        source: &mut impl EpisodeSource<B>,
        done: u64,
        steps: u64,
        out: &Progress,
    ) -> Result<(), RunError> {
        for step in done + 1..=steps {
            let collected = source.collect(self, step)?;
            let stats = self.learn(step, collected)?;
            let pipeline = source.publish(self, step);
            self.finish_step(step, steps, stats, pipeline, out)?;
        }
        Ok(())
    }

    /// The warm-up, when the run has one and has not done it, with its evaluation; then what
    /// RL starts from: the KL reference, a separate critic, a checkpoint.
    fn warm_up(&mut self, out: &Progress) -> Result<(), RunError> {
        if self.spec.train.warmup.is_some() {
            for line in self.demonstration_warnings() {
                out.println(line);
            }
        }
        let mut warmed_up = false;
        if let (Some(warmup), Phase::Warmup { step: done }) =
            (self.spec.train.warmup, self.state.phase)
        {
            self.warmup(&warmup, done)?;
            let evaluation = self.evaluate(0, EvalPoint::Warmup)?;
            out.println(format!(
                "after SFT warm-up: {} success {}",
                split_name(self.spec.eval.split),
                evaluation.describe()
            ));
            self.state.after_warmup = Some(evaluation);
            self.state.phase = Phase::Rl { step: 0 };
            warmed_up = true;
            if let (Some(warmups), Some(key)) =
                (self.options.shared_warmups.clone(), &self.warmup_key)
            {
                let key = key.clone();
                let run_dir = self.run_dir.path().to_path_buf();
                warmups.keep(&key, &run_dir, |dir| self.save_checkpoint(dir))?;
            }
        } else if let (Some(from), Some(evaluation)) = (&self.warmup_from, &self.state.after_warmup)
        {
            out.println(format!(
                "after SFT warm-up: {} success {} (the warm-up of {}: the same computation, \
                 shared)",
                split_name(self.spec.eval.split),
                evaluation.describe(),
                from.display()
            ));
        }
        if !self.trains() {
            return Ok(());
        }
        // The KL reference is the policy as RL starts, with any adapters off: with LoRA that
        // is the frozen base, which shares its weights instead of copying them (and which a
        // resumed run rebuilds here); otherwise a resumed run has it from its checkpoint.
        if self.spec.algorithm.kl.estimator.is_some() && self.state.reference.is_none() {
            self.state.reference = Some(self.state.policy.valid().without_lora());
        }
        // So is a separate critic: a copy of the policy (after the warm-up) with a value head.
        if self.separate_critic() && self.state.critic.is_none() {
            self.state.critic = Some(Critic::fresh(
                &self.state.policy,
                &self.spec.train.optimizer,
            ));
        }
        // The end of the warm-up, trained or taken from another run, is where a stopped run
        // goes on from before its first RL checkpoint (and what `--warmup-from` reads).
        if (warmed_up || self.warmup_from.is_some()) && self.spec.train.checkpoint_every.is_some() {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Whether the run changes the weights: RL steps, or a warm-up. One that does not
    /// (`steps = 0`, no warm-up) only evaluates the model as loaded, and writes no checkpoint
    /// and no weights: they would be a copy of its input.
    fn trains(&self) -> bool {
        self.spec.train.steps > 0 || self.spec.train.warmup.is_some()
    }

    /// The end of a run: the last checkpoint, the final evaluation, the weights, the summary
    /// and the report.
    fn finish(mut self, steps: u64, out: &Progress) -> Result<RunSummary, RunError> {
        let trains = self.trains();
        // The last checkpoint is taken before the final evaluation: a longer run resumed from
        // it goes on as if this one had not ended.
        if trains && self.saved != Some(self.state.phase) {
            self.checkpoint()?;
        }
        let split = split_name(self.spec.eval.split);
        let after_rl = match (steps, self.state.after_warmup.clone()) {
            // No RL after the warm-up: its evaluation was of these very weights, and an
            // evaluation draws the same episodes every time, so it would only be repeated.
            (0, Some(after_warmup)) => after_warmup,
            _ => {
                let evaluation = self.evaluate(steps, EvalPoint::Final)?;
                let when = if trains {
                    format!("after RL ({steps} steps)")
                } else {
                    "evaluation only (no training)".to_string()
                };
                out.println(format!("{when}: {split} success {}", evaluation.describe()));
                evaluation
            }
        };
        if trains {
            self.save_weights("policy")?;
            self.export_adapter()?;
        }
        let after_warmup = self.state.after_warmup.clone();
        let summary = RunSummary {
            run_dir: self.run_dir.path().to_path_buf(),
            device: self.device_name.clone(),
            cpu_threads: device::cpu_threads(),
            matmul_precision: device::describe_matmul_precision(self.spec.matmul_precision)
                .to_string(),
            after_warmup_sampled: after_warmup.as_ref().and_then(|e| e.sampled.clone()),
            after_warmup: after_warmup.map(|e| e.first),
            after_rl_sampled: after_rl.sampled,
            after_rl: after_rl.first,
            steps,
            skipped_steps: self.state.skipped,
            warmup_from: self.warmup_from.clone(),
        };
        self.run_dir.write_json(RunSummary::FILE, &summary)?;
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

    /// What follows every RL step's update: its record composed from the phases' `stats` and
    /// the source's `pipeline` measures, the stability monitor, the progress line, and the
    /// checkpoint and periodic evaluation when due.
    fn finish_step(
        &mut self,
        step: u64,
        steps: u64,
        stats: StepStats,
        pipeline: Option<PipelineStats>,
        out: &Progress,
    ) -> Result<(), RunError> {
        let record = RlRecord::compose(stats, pipeline);
        self.state.skipped += u64::from(record.skipped);
        let (alerts, started) = self.state.monitor.observe(&record.signals());
        let record = record.with_alerts(alerts);
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
        self.state.phase = Phase::Rl { step };
        if self.checkpoint_due(step) {
            self.checkpoint()?;
        }
        if step < steps && self.periodic_eval_due(step) {
            let evaluation = self.evaluate(step, EvalPoint::Periodic)?;
            out.println(format!("step {step}: success {}", evaluation.describe()));
        }
        Ok(())
    }

    /// Warnings about the demonstrations, which would otherwise show only as a task stuck at
    /// zero: a task whose oracle calls are longer than a turn may generate (the policy learns
    /// them but could never finish one), and a task none of whose oracle episodes fits the
    /// context (or is solved within the turn budget); and a task `warmup.instances` caps
    /// nothing of.
    fn demonstration_warnings(&self) -> Vec<String> {
        let max_reply = self.spec.train.max_new_tokens;
        let mut warnings = setup::uncapped_task_warnings(&self.spec, &self.tasks);
        for (task, counts) in self.spec.tasks.iter().zip(&self.demo_counts) {
            let DemoCounts {
                drawn,
                kept,
                long_episode,
                long_reply,
                longest_reply,
            } = *counts;
            let name = &task.name;
            if long_reply > 0 {
                warnings.push(format!(
                    "warning: task `{name}`: {long_reply} of its {kept} oracle demonstrations \
                     make a call longer than a turn may generate (`max_new_tokens` = \
                     {max_reply}; the longest takes {longest_reply} tokens): the policy is \
                     taught such calls but is cut off before it finishes one; raise \
                     `train.max_new_tokens`"
                ));
            }
            if drawn > 0 && kept == 0 && long_episode > 0 {
                warnings.push(format!(
                    "warning: task `{name}`: none of its {drawn} oracle demonstrations fits in \
                     the context ({} tokens) within its turn budget ({} turns), so the warm-up \
                     cannot teach it; raise the model's `context` or the task's `max_turns`",
                    self.context, task.max_turns
                ));
            } else if drawn > 0 && kept == 0 {
                warnings.push(format!(
                    "warning: task `{name}`: its oracle solves none of its {drawn} drawn \
                     instances within its turn budget ({} turns), so the warm-up cannot teach \
                     it; raise the task's `max_turns` (or give its environment an oracle)",
                    task.max_turns
                ));
            }
        }
        warnings
    }

    /// The training settings' decoding, or greedy ([`Sampling::greedy_if`]).
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
            greedy: false,
        }
        .greedy_if(greedy)
    }

    /// Whether `checkpoint_every` falls on `step` (warm-up and RL steps count separately).
    fn checkpoint_due(&self, step: u64) -> bool {
        self.spec
            .train
            .checkpoint_every
            .is_some_and(|every| step.is_multiple_of(every))
    }

    /// Writes a checkpoint of where the run stands (see [`crate::checkpoint`]).
    fn checkpoint(&mut self) -> Result<(), RunError> {
        let run_dir = self.run_dir.path().to_path_buf();
        self.save_checkpoint(&run_dir)?;
        self.saved = Some(self.state.phase);
        Ok(())
    }

    /// Writes a checkpoint of where the run stands into `dir/checkpoints/`; returns its path.
    fn save_checkpoint(&mut self, dir: &Path) -> Result<PathBuf, RunError> {
        let identity = Identity {
            spec: &self.spec,
            task_versions: &self.task_versions,
            tokenizer: self.chat.tokenizer(),
            metrics_len: self.run_dir.metrics_len()?,
            base_digest: self.base_digest.as_deref(),
        };
        self.state.save(dir, identity)
    }

    /// With LoRA, the final adapters as PEFT writes them, in `adapter/` of the run directory,
    /// for `PeftModel.from_pretrained` on the base model.
    fn export_adapter(&self) -> Result<(), RunError> {
        let Some(lora) = &self.state.policy.lora else {
            return Ok(());
        };
        let base = crate::export::base_name(&self.spec.model.arch);
        let dir = self.run_dir.path().join("adapter");
        crate::model::lora::save_peft(lora, &base, &dir)
            .map_err(|source| RunError::Io { path: dir, source })
    }

    fn save_weights(&self, name: &str) -> Result<(), RunError> {
        let path = self.run_dir.path().join(name);
        self.state
            .policy
            .record_trained(
                &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
                path.clone(),
            )
            .map_err(|e| RunError::Io {
                path,
                source: std::io::Error::other(e.to_string()),
            })
    }
}
