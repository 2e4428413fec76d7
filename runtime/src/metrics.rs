//! What a run records: the run directory, the metrics JSONL, and the live progress line.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::algo::std_dev;
use crate::monitor::{Alert, Signals};
use crate::spec::Decoding;

/// A file of the run directory could not be written (or, reopening it, read).
#[derive(Debug, thiserror::Error)]
#[error("cannot write `{}`: {source}", path.display())]
pub struct RunDirError {
    /// The file or directory.
    pub path: PathBuf,
    /// The underlying error.
    pub source: std::io::Error,
}

impl RunDirError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RunDirError {
        let path = path.into();
        move |source| RunDirError { path, source }
    }
}

/// Where in a run an evaluation happens; its name labels the evaluation's record, samples and
/// episode files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalPoint {
    /// After the supervised warm-up, before any RL.
    Warmup,
    /// Every `eval.every` RL steps.
    Periodic,
    /// At the end of RL.
    Final,
}

impl EvalPoint {
    /// The point's name: `warmup`, `periodic` or `final`.
    pub fn name(self) -> &'static str {
        match self {
            EvalPoint::Warmup => "warmup",
            EvalPoint::Periodic => "periodic",
            EvalPoint::Final => "final",
        }
    }
}

impl std::fmt::Display for EvalPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Success per task on the evaluation split, with one decoding.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// Per task.
    pub tasks: BTreeMap<String, TaskStats>,
    /// Mean success over tasks.
    pub success: f64,
    /// Its 95% interval (Wilson), pooled over the tasks' episodes (each task plays as many).
    #[serde(default)]
    pub success_ci: [f64; 2],
}

impl Evaluation {
    /// Its line of `metrics.jsonl`.
    pub fn record(&self, step: u64, label: EvalPoint, decoding: Decoding) -> Record {
        Record::Eval {
            step,
            label,
            decoding,
            tasks: self.tasks.clone(),
            success: self.success,
            success_ci: self.success_ci,
        }
    }
}

/// Success and return of one task over some episodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskStats {
    /// Episodes counted.
    pub episodes: usize,
    /// Fraction solved.
    pub success: f64,
    /// 95% confidence interval of the success rate (Wilson score interval).
    #[serde(default)]
    pub success_ci: [f64; 2],
    /// Mean episode return.
    pub mean_return: f64,
    /// Standard deviation of the episode returns (unbiased; 0 for one episode).
    #[serde(default)]
    pub return_std: f64,
    /// Mean agent turns.
    pub mean_turns: f64,
}

impl TaskStats {
    /// Statistics of `(success, return, turns)` triples.
    pub fn of(outcomes: impl IntoIterator<Item = (bool, f32, u32)>) -> Self {
        let mut stats = TaskStats::default();
        let mut returns = Vec::new();
        let mut solved = 0;
        for (success, ret, turns) in outcomes {
            returns.push(f64::from(ret));
            solved += usize::from(success);
            stats.episodes += 1;
            stats.success += f64::from(u8::from(success));
            stats.mean_return += f64::from(ret);
            stats.mean_turns += f64::from(turns);
        }
        if stats.episodes > 0 {
            let n = stats.episodes as f64;
            stats.success /= n;
            stats.mean_return /= n;
            stats.mean_turns /= n;
        }
        stats.return_std = std_dev(&returns);
        stats.success_ci = wilson(solved, stats.episodes);
        stats
    }
}

/// The 95% Wilson score interval of a success rate of `successes` out of `n` trials.
///
/// Unlike the normal approximation `p ± 1.96·sqrt(p(1-p)/n)`, it stays inside [0, 1] and is not
/// empty at 0 or `n` successes, which small evaluations hit often. `[0, 1]` for `n = 0`.
pub fn wilson(successes: usize, n: usize) -> [f64; 2] {
    if n == 0 {
        return [0.0, 1.0];
    }
    const Z: f64 = 1.959_963_984_540_054;
    let (n, p) = (n as f64, successes.min(n) as f64 / n as f64);
    let denominator = 1.0 + Z * Z / n;
    let centre = (p + Z * Z / (2.0 * n)) / denominator;
    let half = Z * (p * (1.0 - p) / n + Z * Z / (4.0 * n * n)).sqrt() / denominator;
    [(centre - half).max(0.0), (centre + half).min(1.0)]
}

/// One line of `metrics.jsonl`; read back by [`crate::report`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Record {
    /// A supervised warm-up step.
    Sft {
        /// Warm-up step, from 1.
        step: u64,
        /// Cross-entropy over agent tokens.
        loss: f32,
        /// Gradient norm before clipping.
        grad_norm: f32,
        /// The step's learning rate (`warmup.lr` may be a schedule; absent from lines written
        /// before it was recorded).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lr: Option<f64>,
        /// The update was skipped: its loss or gradient norm was not finite (`loss` and
        /// `grad_norm` are then 0; absent from the line when false).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        skipped_nonfinite: bool,
    },
    /// An RL step.
    Rl(Box<RlRecord>),
    /// An evaluation.
    Eval {
        /// RL steps done when it ran.
        step: u64,
        /// Which point of the run.
        label: EvalPoint,
        /// How the episodes were decoded (lines written before it existed were greedy).
        #[serde(default)]
        decoding: Decoding,
        /// Per task.
        tasks: BTreeMap<String, TaskStats>,
        /// Mean success over tasks.
        success: f64,
        /// Its 95% interval, pooled over the tasks' episodes (each task plays as many).
        success_ci: [f64; 2],
    },
}

/// The metrics of one RL step. Fields a step may lack are absent from its line; reading a line
/// back, any field it lacks (also one added after it was written) takes its default.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RlRecord {
    /// RL step, from 1.
    pub step: u64,
    /// Curriculum stage.
    pub stage: String,
    /// Training episodes' statistics, per task.
    pub tasks: BTreeMap<String, TaskStats>,
    /// Fraction of the step's episodes solved.
    pub success: f64,
    /// Mean return of the step's episodes.
    pub mean_return: f64,
    /// Standard deviation of the episode returns (collapse to 0 is the echo trap).
    pub reward_std: f64,
    /// Fraction of the groups of two or more episodes whose members all earned the same
    /// reward (no signal for group-relative advantages).
    pub flat_groups: f64,
    /// Mean of the token advantages trained on.
    pub advantage_mean: f64,
    /// Standard deviation of the token advantages trained on.
    pub advantage_std: f64,
    /// Smallest token advantage.
    pub advantage_min: f32,
    /// Largest token advantage.
    pub advantage_max: f32,
    /// Total loss.
    pub loss: f32,
    /// Policy-gradient term.
    pub policy_loss: f32,
    /// Mean entropy over agent tokens.
    pub entropy: f32,
    /// Mean KL to the reference.
    pub kl: f32,
    /// SFT weight α this step.
    pub sft_alpha: f64,
    /// Fraction of agent tokens clipped low.
    pub clip_low: f32,
    /// Fraction of agent tokens clipped high.
    pub clip_high: f32,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
    /// PPO's clipped value loss (last epoch); absent for algorithms without a critic.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_loss: Option<f32>,
    /// PPO: `1 - Var(R - V_old) / Var(R)` over the agent tokens, the rollout values' fit to
    /// the GAE returns (1 perfect, 0 no better than a constant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explained_variance: Option<f64>,
    /// PPO: fraction of agent tokens whose value was clipped in the value loss (last epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub value_clip_frac: Option<f32>,
    /// Truncated importance sampling: mean weight over agent tokens (last epoch's start).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_weight: Option<f32>,
    /// Truncated importance sampling: fraction of agent tokens whose weight was capped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_truncated: Option<f32>,
    /// Monte-Carlo credit: continuations played from snapshots this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mc_continuations: Option<usize>,
    /// Monte-Carlo credit: their mean return (the mean state value estimated).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mc_value: Option<f64>,
    /// Cross-policy sampling or asynchronous rollout: fraction of the step's turns whose
    /// first token an older policy than the fresh one generated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stale_turns: Option<f64>,
    /// The same per agent token (with partial rollouts a turn's tokens may come from several
    /// versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stale_tokens: Option<f64>,
    /// Cross-policy sampling: turns by how many versions their policy was behind the fresh one.
    #[serde(
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "versions_behind"
    )]
    pub staleness: BTreeMap<u64, usize>,
    /// Cross-policy sampling: episodes dropped because their group had a turn older than
    /// `max_staleness` (groups are dropped whole).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped: Option<usize>,
    /// `sft_from = successes`: solved episodes held for the SFT term after this step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub successes_kept: Option<usize>,
    /// Stability alarms that hold this step ([`crate::monitor`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub alerts: Vec<Alert>,
    /// Agent tokens trained on.
    pub agent_tokens: usize,
    /// Groups kept by the filter, of those rolled out.
    pub groups_kept: usize,
    /// Whether the update was skipped because every advantage was zero.
    pub skipped: bool,
    /// Updates of the step (policy epochs and critic updates) skipped because their loss or
    /// gradient norm was not finite: weights and optimizer state untouched.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_nonfinite: usize,
    /// Wall-clock seconds of the rollout.
    pub rollout_seconds: f64,
    /// Trajectories played per second of rollout (Monte-Carlo continuations not counted); in
    /// an asynchronous run, trajectories trained on per second of RL so far.
    pub trajectories_per_second: f64,
    /// Disaggregated engines: seconds the workers spent copying new weights to their devices
    /// during the step (summed over workers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_sync_seconds: Option<f64>,
    /// Asynchronous runs: fraction of the step the trainer spent waiting for episodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trainer_idle: Option<f64>,
    /// Asynchronous runs: fraction of the workers' time during the step spent blocked on a
    /// full queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_idle: Option<f64>,
    /// Wall-clock seconds of the update.
    pub update_seconds: f64,
}

impl RlRecord {
    /// What the stability monitor reads of this step.
    pub fn signals(&self) -> Signals {
        Signals {
            step: self.step,
            skipped: self.skipped,
            skipped_nonfinite: self.skipped_nonfinite,
            grad_norm: self.grad_norm,
            entropy: self.entropy,
            reward_std: self.reward_std,
            flat_groups: self.flat_groups,
        }
    }

    /// The record with the alerts the stability monitor raised on its [`RlRecord::signals`]:
    /// they are judged from the record, so they join it last.
    pub(crate) fn with_alerts(self, alerts: Vec<Alert>) -> Self {
        RlRecord { alerts, ..self }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// Reads `RlRecord::staleness` back. JSON writes its keys as strings (`{"0": 40}`), and inside
/// the internally tagged [`Record`] serde buffers them as strings, which a `u64` key refuses.
fn versions_behind<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<u64, usize>, D::Error> {
    BTreeMap::<String, usize>::deserialize(deserializer)?
        .into_iter()
        .map(|(behind, turns)| {
            behind
                .parse()
                .map(|behind| (behind, turns))
                .map_err(|_| serde::de::Error::custom(format!("`{behind}` is not a version count")))
        })
        .collect()
}

/// `runs/<experiment>/<run-id>/` and its `metrics.jsonl`.
pub struct RunDir {
    path: PathBuf,
    metrics: BufWriter<File>,
}

/// `config.json` of a run directory: which configuration of its experiment's sweep the run is,
/// so that `agentry compare` can group runs without guessing from paths.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunConfig {
    /// The experiment's name.
    pub experiment: String,
    /// The configuration's label: `base`, `ablate.PATH=VALUE` or `specialist.TASK`.
    pub config: String,
    /// The seed the run used.
    pub seed: u64,
}

impl RunConfig {
    /// The file name in a run directory.
    pub const FILE: &str = "config.json";
}

impl RunDir {
    /// Creates a fresh run directory for one configuration of an experiment and writes its
    /// `config.json`. The run id is the seed and the start time, so runs never overwrite each
    /// other: `root/<experiment>/seed<seed>-<ms>` for the base configuration (where a run of a
    /// file without a sweep has always gone) and `root/<experiment>/<config>/seed<seed>-<ms>`
    /// for the others.
    pub fn create(root: &Path, config: &RunConfig) -> Result<Self, RunDirError> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let mut parent = root.join(&config.experiment);
        if config.config != agentry_dsl::spec::Sweep::base_label() {
            parent.push(&config.config);
        }
        let path = parent.join(format!("seed{}-{started}", config.seed));
        std::fs::create_dir_all(&path).map_err(RunDirError::io(&path))?;
        let metrics_path = path.join("metrics.jsonl");
        let metrics = File::create(&metrics_path).map_err(RunDirError::io(&metrics_path))?;
        let run_dir = RunDir {
            path,
            metrics: BufWriter::new(metrics),
        };
        run_dir.write_json(RunConfig::FILE, config)?;
        Ok(run_dir)
    }

    /// Reopens the run directory `path` to go on with a run (resuming from a checkpoint):
    /// `metrics.jsonl` keeps its first `keep` bytes, what the checkpoint had recorded, and new
    /// lines are appended after them. Lines beyond `keep` (written after the checkpoint, and
    /// about to be written again) are moved to the end of `metrics-superseded.jsonl` rather than
    /// lost. Returns the directory and how many bytes were moved.
    pub fn reopen(path: &Path, keep: u64) -> Result<(Self, u64), RunDirError> {
        let metrics_path = path.join("metrics.jsonl");
        let written = std::fs::read(&metrics_path).map_err(RunDirError::io(&metrics_path))?;
        let keep_len = usize::try_from(keep).unwrap_or(usize::MAX);
        if written.len() < keep_len {
            return Err(RunDirError {
                path: metrics_path,
                source: std::io::Error::other(format!(
                    "it holds {} bytes, fewer than the {keep} the checkpoint recorded",
                    written.len()
                )),
            });
        }
        let tail = &written[keep_len..];
        if !tail.is_empty() {
            let superseded = path.join("metrics-superseded.jsonl");
            let mut file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&superseded)
                .map_err(RunDirError::io(&superseded))?;
            file.write_all(tail)
                .and_then(|()| file.sync_all())
                .map_err(RunDirError::io(&superseded))?;
        }
        let metrics = std::fs::OpenOptions::new()
            .write(true)
            .open(&metrics_path)
            .map_err(RunDirError::io(&metrics_path))?;
        metrics
            .set_len(keep)
            .map_err(RunDirError::io(&metrics_path))?;
        let mut metrics = BufWriter::new(metrics);
        std::io::Seek::seek(&mut metrics, std::io::SeekFrom::End(0))
            .map_err(RunDirError::io(&metrics_path))?;
        Ok((
            RunDir {
                path: path.to_path_buf(),
                metrics,
            },
            tail.len() as u64,
        ))
    }

    /// Bytes of `metrics.jsonl` written so far (every record is flushed as it is written).
    pub fn metrics_len(&self) -> Result<u64, RunDirError> {
        let path = self.path.join("metrics.jsonl");
        std::fs::metadata(&path)
            .map(|m| m.len())
            .map_err(RunDirError::io(path))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line to `metrics.jsonl` and flushes it, so a crash loses nothing written.
    pub fn record(&mut self, record: &Record) -> Result<(), RunDirError> {
        let path = self.path.join("metrics.jsonl");
        let line = serde_json::to_string(record).map_err(|e| RunDirError {
            path: path.clone(),
            source: e.into(),
        })?;
        writeln!(self.metrics, "{line}")
            .and_then(|()| self.metrics.flush())
            .map_err(RunDirError::io(path))
    }

    /// Appends lines another run recorded (a shared warm-up's, [`crate::shared_warmup`]) as
    /// they are, and flushes them.
    pub fn append_recorded(&mut self, lines: &[u8]) -> Result<(), RunDirError> {
        let path = self.path.join("metrics.jsonl");
        self.metrics
            .write_all(lines)
            .and_then(|()| self.metrics.flush())
            .map_err(RunDirError::io(path))
    }

    /// Writes `name` in the run directory as pretty JSON.
    pub fn write_json(&self, name: &str, value: &impl Serialize) -> Result<(), RunDirError> {
        let path = self.path.join(name);
        let text = serde_json::to_string_pretty(value).map_err(|e| RunDirError {
            path: path.clone(),
            source: e.into(),
        })?;
        std::fs::write(&path, text).map_err(RunDirError::io(path))
    }
}

/// The live progress line: step, success, mean return, loss.
pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    /// A bar over `total` steps; hidden when `quiet` or when stderr is not a terminal.
    pub fn new(total: u64, prefix: &str, quiet: bool) -> Self {
        let bar = ProgressBar::new(total);
        if quiet {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        bar.set_style(
            ProgressStyle::with_template("{prefix:>6} {bar:24} {pos:>4}/{len} {msg} [{elapsed}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(prefix.to_string());
        Progress { bar }
    }

    /// Moves to `position` and shows `message`.
    pub fn update(&self, position: u64, message: String) {
        self.bar.set_position(position);
        self.bar.set_message(message);
    }

    /// Prints a line to stdout above the bar (also when the bar is hidden).
    pub fn println(&self, line: impl AsRef<str>) {
        self.bar.suspend(|| println!("{}", line.as_ref()));
    }

    /// Leaves the bar at its last state.
    pub fn finish(&self) {
        self.bar.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: [f64; 2], b: [f64; 2]) {
        assert!(
            (a[0] - b[0]).abs() < 1e-4 && (a[1] - b[1]).abs() < 1e-4,
            "{a:?} != {b:?}"
        );
    }

    #[test]
    fn records_read_back_as_written() {
        let rl = RlRecord {
            step: 3,
            staleness: BTreeMap::from([(0, 40), (2, 12)]),
            alerts: vec![Alert::EchoTrap],
            value_loss: Some(0.5),
            ..RlRecord::default()
        };
        let records = [
            Record::Rl(Box::new(rl)),
            Record::Eval {
                step: 3,
                label: EvalPoint::Final,
                decoding: Decoding::Sampled,
                tasks: BTreeMap::from([("kg".into(), TaskStats::of([(true, 1.0, 2)]))]),
                success: 1.0,
                success_ci: wilson(1, 1),
            },
        ];
        for record in records {
            let line = serde_json::to_string(&record).unwrap();
            let back: Record = serde_json::from_str(&line).unwrap();
            assert_eq!(serde_json::to_string(&back).unwrap(), line);
        }
        // An evaluation written before `decoding` existed was greedy.
        let old = r#"{"phase":"eval","step":0,"label":"warmup","tasks":{},"success":0.0,"success_ci":[0.0,1.0]}"#;
        let Record::Eval { decoding, .. } = serde_json::from_str(old).unwrap() else {
            panic!("an eval record")
        };
        assert_eq!(decoding, Decoding::Greedy);
    }

    #[test]
    fn wilson_intervals_match_hand_values() {
        close(wilson(5, 10), [0.2366, 0.7634]);
        close(wilson(0, 10), [0.0, 0.2775]);
        close(wilson(10, 10), [0.7225, 1.0]);
        close(wilson(90, 128), [0.6190, 0.7754]);
        assert_eq!(wilson(0, 0), [0.0, 1.0]);
    }

    #[test]
    fn task_stats_carry_the_interval_of_their_success() {
        let stats = TaskStats::of([
            (true, 1.0, 2),
            (false, 0.0, 4),
            (true, 1.0, 3),
            (false, 0.0, 1),
        ]);
        assert_eq!(stats.success, 0.5);
        close(stats.success_ci, wilson(2, 4));
        assert!((stats.return_std - (1.0f64 / 3.0).sqrt()).abs() < 1e-9);
    }
}
