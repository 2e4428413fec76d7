//! `agentry compare`: the final evaluations of finished runs, grouped by (experiment,
//! configuration), as a table of mean success over seeds with 95% intervals.
//!
//! A run is a directory holding `metrics.jsonl`; its group comes from `config.json` (written by
//! [`crate::metrics::RunDir::create`]), or, for a run older than that file, from
//! `experiment.json` as the `base` configuration. Each cell is the mean of the per-seed success
//! rates; its interval is Student's t over those rates when there are two seeds or more, and
//! the run's own Wilson interval over its episodes ([`crate::metrics::wilson`], stored in the
//! evaluation line) when there is one.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use agentry_dsl::spec::Sweep;
use serde::Deserialize;

use crate::metrics::{RunConfig, wilson};

mod curves;
mod paired;

pub use curves::plot;
pub use paired::{Difference, Paired, PairedRow, paired};

/// Why runs could not be compared. Every variant names the file or directory at fault.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// An argument does not exist or cannot be read.
    #[error("cannot read `{path}`: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// An argument is neither a run directory nor holds one.
    #[error(
        "no run under `{0}`: pass run directories (holding `metrics.jsonl`) or directories \
         that contain them, e.g. `runs/NAME`"
    )]
    NoRuns(PathBuf),
    /// A line of `metrics.jsonl`, `config.json` or `experiment.json` is not what a run writes.
    #[error("`{path}`{}: {reason}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// The 1-based line, for `metrics.jsonl`.
        line: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// A run has no final evaluation with the decoding asked for.
    #[error(
        "`{path}` has no final evaluation with {} decoding (a `\"phase\":\"eval\"` line \
         with `\"label\":\"final\"`): the run did not finish{}",
        decoding.name(),
        if *decoding == Decoding::Sampled { ", or was not evaluated with sampled decoding" } else { "" }
    )]
    NoFinal {
        /// Its `metrics.jsonl`.
        path: PathBuf,
        /// The decoding asked for.
        decoding: Decoding,
    },
    /// A learning-curve chart could not be drawn or written.
    #[error(transparent)]
    Plot(#[from] crate::report::ReportError),
    /// `--paired` names no configuration of the runs, or one of several experiments.
    #[error("{0}")]
    Base(String),
    /// Two runs of one configuration have the same seed, so one seed would count twice.
    #[error(
        "`{first}` and `{second}` are both seed {seed} of `{experiment}` configuration \
         `{config}`; pass only one of them"
    )]
    SameSeed {
        /// The experiment.
        experiment: String,
        /// The configuration.
        config: String,
        /// The seed.
        seed: u64,
        /// One run directory.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
}

/// Which evaluation episodes to compare: the policy's greedy actions or samples at the training
/// temperature. An evaluation line without a `decoding` field is greedy.
pub use agentry_dsl::spec::Decoding;

/// `greedy` or `sampled`, as `metrics.jsonl` spells them.
fn parse_decoding(name: &str) -> Option<Decoding> {
    [Decoding::Greedy, Decoding::Sampled]
        .into_iter()
        .find(|d| d.name() == name)
}

/// One evaluation of a run: success per task and over tasks, each with its Wilson interval.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// Per task: success and its interval.
    pub tasks: BTreeMap<String, (f64, [f64; 2])>,
    /// Mean success over tasks and its pooled interval.
    pub overall: (f64, [f64; 2]),
}

/// What one run contributes to a comparison.
#[derive(Clone, Debug, PartialEq)]
pub struct RunResult {
    /// Its directory.
    pub dir: PathBuf,
    /// Which run it is.
    pub config: RunConfig,
    /// The final evaluation.
    pub final_eval: Point,
    /// The evaluation after the supervised warm-up, when the run had one.
    pub warmup: Option<Point>,
    /// Every evaluation by the RL step it was taken after (the last one of a step).
    pub curve: BTreeMap<u64, Point>,
}

/// Where a cell's interval comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interval {
    /// Student's t over the per-seed success rates (two seeds or more).
    StudentT,
    /// The single run's Wilson interval over its episodes.
    Wilson,
}

/// Mean success and its 95% interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Cell {
    /// Mean over seeds.
    pub mean: f64,
    /// The interval, within [0, 1].
    pub ci: [f64; 2],
}

/// One row of the table: a configuration's final evaluation, or its evaluation after warm-up.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The experiment.
    pub experiment: String,
    /// The configuration's label, with ` (after warm-up)` for the warm-up row.
    pub config: String,
    /// Seeds averaged.
    pub seeds: usize,
    /// How the intervals were computed.
    pub interval: Interval,
    /// Per task; a task the configuration does not train on (a specialist's) is absent.
    pub tasks: BTreeMap<String, Cell>,
    /// Over tasks.
    pub overall: Cell,
}

/// The comparison table.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The decoding of the evaluations compared.
    pub decoding: Decoding,
    /// Every task of any row, sorted: the columns.
    pub tasks: Vec<String>,
    /// The rows: by experiment, `base` first, then the other configurations by label; each
    /// configuration's warm-up row follows it.
    pub rows: Vec<Row>,
}

/// The 97.5% quantile of Student's t with `df` degrees of freedom (the half-width factor of a
/// two-sided 95% interval): a table to 30, a Cornish-Fisher expansion (error below 1e-6)
/// beyond. `df` must be at least 1.
pub fn t_quantile_975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706_204_736,
        4.302_652_730,
        3.182_446_305,
        2.776_445_105,
        2.570_581_836,
        2.446_911_851,
        2.364_624_252,
        2.306_004_135,
        2.262_157_163,
        2.228_138_852,
        2.200_985_160,
        2.178_812_830,
        2.160_368_656,
        2.144_786_688,
        2.131_449_546,
        2.119_905_299,
        2.109_815_578,
        2.100_922_040,
        2.093_024_054,
        2.085_963_447,
        2.079_613_845,
        2.073_873_068,
        2.068_657_610,
        2.063_898_562,
        2.059_538_553,
        2.055_529_439,
        2.051_830_516,
        2.048_407_142,
        2.045_229_642,
        2.042_272_456,
    ];
    if let Some(t) = TABLE.get(df.max(1) - 1) {
        return *t;
    }
    let z: f64 = 1.959_963_984_540_054;
    let n = df as f64;
    z + (z.powi(3) + z) / (4.0 * n)
        + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * n * n)
        + (3.0 * z.powi(7) + 19.0 * z.powi(5) + 17.0 * z.powi(3) - 15.0 * z) / (384.0 * n.powi(3))
        + (79.0 * z.powi(9) + 776.0 * z.powi(7) + 1482.0 * z.powi(5)
            - 1920.0 * z.powi(3)
            - 945.0 * z)
            / (92160.0 * n.powi(4))
}

/// The mean of `rates` (two or more) with its 95% Student-t interval, clipped to [0, 1].
pub fn t_interval(rates: &[f64]) -> Cell {
    let (mean, half) = mean_and_half_width(rates);
    Cell {
        mean,
        ci: [(mean - half).max(0.0), (mean + half).min(1.0)],
    }
}

/// The mean of `values` (two or more) and the half-width of its 95% Student-t interval.
fn mean_and_half_width(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let sd = crate::algo::std_dev(values);
    (
        mean,
        t_quantile_975(values.len().saturating_sub(1)) * sd / n.sqrt(),
    )
}

/// The run directories named by `paths`: each is a run directory (it holds `metrics.jsonl`)
/// or a directory searched recursively for them (symbolic links are not followed). Sorted,
/// without repeats.
pub fn find_runs(paths: &[PathBuf]) -> Result<Vec<PathBuf>, CompareError> {
    let mut runs = Vec::new();
    for path in paths {
        let before = runs.len();
        let meta = std::fs::metadata(path).map_err(|source| CompareError::Io {
            path: path.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(CompareError::NoRuns(path.clone()));
        }
        collect(path, &mut runs, 0)?;
        if runs.len() == before {
            return Err(CompareError::NoRuns(path.clone()));
        }
    }
    runs.sort();
    runs.dedup();
    Ok(runs)
}

/// Deepest directory level searched below an argument.
const MAX_DEPTH: usize = 16;

fn collect(dir: &Path, runs: &mut Vec<PathBuf>, depth: usize) -> Result<(), CompareError> {
    if dir.join("metrics.jsonl").is_file() {
        runs.push(dir.to_path_buf());
        return Ok(());
    }
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    let io = |source| CompareError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut children = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io)? {
        let entry = entry.map_err(io)?;
        if entry.file_type().map_err(io)?.is_dir() {
            children.push(entry.path());
        }
    }
    children.sort();
    for child in children {
        collect(&child, runs, depth + 1)?;
    }
    Ok(())
}

/// An evaluation line of `metrics.jsonl`, as far as a comparison reads it.
#[derive(Deserialize)]
struct EvalLine {
    label: String,
    /// The RL step it was taken after (0: before RL).
    #[serde(default)]
    step: u64,
    tasks: BTreeMap<String, TaskLine>,
    success: f64,
    success_ci: Option<[f64; 2]>,
    decoding: Option<String>,
}

#[derive(Deserialize)]
struct TaskLine {
    episodes: usize,
    success: f64,
    success_ci: Option<[f64; 2]>,
}

/// A success rate and its interval: the stored interval, or (for a line written before
/// intervals were) the Wilson interval of the rate over `episodes`.
fn rate(success: f64, ci: Option<[f64; 2]>, episodes: usize) -> Result<(f64, [f64; 2]), String> {
    if !(0.0..=1.0).contains(&success) {
        return Err(format!("success {success} is not a rate in [0, 1]"));
    }
    let ci = ci.unwrap_or_else(|| wilson((success * episodes as f64).round() as usize, episodes));
    if !(0.0..=1.0).contains(&ci[0]) || !(0.0..=1.0).contains(&ci[1]) || ci[0] > ci[1] {
        return Err(format!(
            "success_ci {ci:?} is not an interval within [0, 1]"
        ));
    }
    Ok((success, ci))
}

impl EvalLine {
    fn point(&self) -> Result<Point, String> {
        let mut tasks = BTreeMap::new();
        for (name, t) in &self.tasks {
            let cell = rate(t.success, t.success_ci, t.episodes)
                .map_err(|e| format!("task `{name}`: {e}"))?;
            tasks.insert(name.clone(), cell);
        }
        let episodes = self.tasks.values().map(|t| t.episodes).sum();
        Ok(Point {
            tasks,
            overall: rate(self.success, self.success_ci, episodes)?,
        })
    }
}

/// Reads one run directory: its configuration and its last final (and warm-up) evaluation
/// with `decoding`.
pub fn read_run(dir: &Path, decoding: Decoding) -> Result<RunResult, CompareError> {
    let config = run_config(dir)?;
    let path = dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|source| CompareError::Io {
        path: path.clone(),
        source,
    })?;
    let (mut final_eval, mut warmup) = (None, None);
    let mut curve = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let malformed = |reason: String| CompareError::Malformed {
            path: path.clone(),
            line: Some(i + 1),
            reason,
        };
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| malformed(format!("not JSON: {e}")))?;
        let Some(phase) = value.get("phase").and_then(|p| p.as_str()) else {
            return Err(malformed("no `phase`".into()));
        };
        if phase != "eval" {
            continue;
        }
        let eval: EvalLine = serde_json::from_value(value)
            .map_err(|e| malformed(format!("not an evaluation record: {e}")))?;
        let line_decoding = match eval.decoding.as_deref() {
            None => Decoding::Greedy,
            Some(name) => parse_decoding(name).ok_or_else(|| {
                malformed(format!("unknown decoding `{name}` (greedy or sampled)"))
            })?,
        };
        if line_decoding != decoding {
            continue;
        }
        let point = eval.point().map_err(malformed)?;
        match eval.label.as_str() {
            "final" => final_eval = Some(point.clone()),
            "warmup" => warmup = Some(point.clone()),
            _ => {}
        }
        curve.insert(eval.step, point);
    }
    // A finished run (it wrote its summary) with no RL steps after its warm-up did not
    // evaluate again: its final weights are the warm-up's, and so is its final evaluation.
    let finished = dir.join(crate::RunSummary::FILE).is_file();
    let final_eval = final_eval
        .or_else(|| warmup.clone().filter(|_| finished && curve.len() == 1))
        .ok_or(CompareError::NoFinal { path, decoding })?;
    Ok(RunResult {
        dir: dir.to_path_buf(),
        config,
        final_eval,
        warmup,
        curve,
    })
}

/// `config.json`, or for a run written before it, the experiment's name and seed from
/// `experiment.json` as the `base` configuration.
fn run_config(dir: &Path) -> Result<RunConfig, CompareError> {
    let read = |name: &str| {
        let path = dir.join(name);
        let text = std::fs::read_to_string(&path).map_err(|source| CompareError::Io {
            path: path.clone(),
            source,
        })?;
        Ok::<_, CompareError>((path, text))
    };
    let malformed = |path: PathBuf, reason: String| CompareError::Malformed {
        path,
        line: None,
        reason,
    };
    if dir.join(RunConfig::FILE).exists() {
        let (path, text) = read(RunConfig::FILE)?;
        return serde_json::from_str(&text).map_err(|e| malformed(path, e.to_string()));
    }
    let (path, text) = read("experiment.json")?;
    #[derive(Deserialize)]
    struct Named {
        name: String,
        seed: u64,
    }
    let named: Named = serde_json::from_str(&text).map_err(|e| malformed(path, e.to_string()))?;
    Ok(RunConfig {
        experiment: named.name,
        config: Sweep::base_label().to_string(),
        seed: named.seed,
    })
}

/// The comparison of the runs under `paths` ([`find_runs`]).
pub fn compare(paths: &[PathBuf], decoding: Decoding) -> Result<Comparison, CompareError> {
    Comparison::of(&read_runs(paths, decoding)?, decoding)
}

/// Every run under `paths` ([`find_runs`]), read with `decoding` ([`read_run`]).
fn read_runs(paths: &[PathBuf], decoding: Decoding) -> Result<Vec<RunResult>, CompareError> {
    find_runs(paths)?
        .iter()
        .map(|dir| read_run(dir, decoding))
        .collect()
}

impl Comparison {
    /// Groups `runs` by (experiment, configuration) and averages each group over its seeds.
    pub fn of(runs: &[RunResult], decoding: Decoding) -> Result<Self, CompareError> {
        let groups = group(runs)?;
        let mut rows = Vec::new();
        for (Group { experiment, config }, group) in groups {
            let finals: Vec<&Point> = group.iter().map(|r| &r.final_eval).collect();
            rows.push(row(&experiment, config.clone(), &finals));
            let warmups: Vec<&Point> = group.iter().filter_map(|r| r.warmup.as_ref()).collect();
            if !warmups.is_empty() {
                rows.push(row(
                    &experiment,
                    format!("{config} (after warm-up)"),
                    &warmups,
                ));
            }
        }
        let tasks = columns(rows.iter().flat_map(|r| r.tasks.keys()));
        Ok(Comparison {
            decoding,
            tasks,
            rows,
        })
    }

    /// The table in markdown, with a footnote on what the numbers are.
    pub fn markdown(&self) -> String {
        let several = several_experiments(self.rows.iter().map(|r| r.experiment.as_str()));
        let mut out = table_head("configuration", &self.tasks);
        let mut wilson_rows = false;
        for row in &self.rows {
            let name = row_name(several, &row.experiment, &row.config);
            let seeds = match row.interval {
                Interval::StudentT => row.seeds.to_string(),
                Interval::Wilson => {
                    wilson_rows = true;
                    format!("{}*", row.seeds)
                }
            };
            let mut cells = vec![name, seeds];
            for task in &self.tasks {
                cells.push(row.tasks.get(task).map_or_else(|| "–".into(), cell));
            }
            cells.push(cell(&row.overall));
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        let _ = writeln!(
            out,
            "\nSuccess on the final evaluation ({} decoding; `(after warm-up)` rows: the \
             evaluation after the SFT warm-up): the mean over seeds, then its 95% interval. \
             Rows with two seeds or more: Student's t interval over the per-seed success rates \
             (clipped to [0, 1]).",
            self.decoding.name()
        );
        if wilson_rows {
            let _ = writeln!(
                out,
                "`*` one seed: the run's Wilson score interval over its evaluation episodes."
            );
        }
        out
    }
}

/// The sorted, distinct task names: a table's or a chart's columns.
fn columns<'t>(tasks: impl Iterator<Item = &'t String>) -> Vec<String> {
    let distinct: std::collections::BTreeSet<&String> = tasks.collect();
    distinct.into_iter().cloned().collect()
}

/// Whether the rows come from more than one experiment, so each must name its own.
fn several_experiments<'e>(mut experiments: impl Iterator<Item = &'e str>) -> bool {
    let first = experiments.next();
    experiments.any(|e| Some(e) != first)
}

/// A row's name: its label, after its experiment's when the rows come from several.
fn row_name(several: bool, experiment: &str, label: &str) -> String {
    if several {
        format!("{experiment} / {label}")
    } else {
        label.to_string()
    }
}

/// A markdown table's header (`first`, seeds, the tasks, overall) and separator lines.
fn table_head(first: &str, tasks: &[String]) -> String {
    let mut header = vec![first.to_string(), "seeds".to_string()];
    header.extend(tasks.iter().cloned());
    header.push("overall".into());
    format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    )
}

/// A configuration of an experiment: the runs that differ only in their seed.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Group {
    experiment: String,
    /// The configuration's label (`base` sorts first: see [`group`]).
    config: String,
}

/// `runs` by configuration, in order: by experiment, `base` first, then the other labels in
/// order. Two runs of one configuration with the same seed are an error.
fn group(runs: &[RunResult]) -> Result<Vec<(Group, Vec<&RunResult>)>, CompareError> {
    let mut groups: BTreeMap<(String, bool, String), Vec<&RunResult>> = BTreeMap::new();
    for run in runs {
        let key = (
            run.config.experiment.clone(),
            run.config.config != Sweep::base_label(),
            run.config.config.clone(),
        );
        let group = groups.entry(key).or_default();
        if let Some(other) = group.iter().find(|o| o.config.seed == run.config.seed) {
            return Err(CompareError::SameSeed {
                experiment: run.config.experiment.clone(),
                config: run.config.config.clone(),
                seed: run.config.seed,
                first: other.dir.clone(),
                second: run.dir.clone(),
            });
        }
        group.push(run);
    }
    Ok(groups
        .into_iter()
        .map(|((experiment, _, config), runs)| (Group { experiment, config }, runs))
        .collect())
}

fn cell(c: &Cell) -> String {
    format!("{:.3} [{:.3}, {:.3}]", c.mean, c.ci[0], c.ci[1])
}

/// One row over `points` (one per seed).
fn row(experiment: &str, config: String, points: &[&Point]) -> Row {
    let combine = |values: &[(f64, [f64; 2])]| match values {
        [(mean, ci)] => Cell {
            mean: *mean,
            ci: *ci,
        },
        _ => t_interval(&values.iter().map(|(m, _)| *m).collect::<Vec<_>>()),
    };
    let mut per_task: BTreeMap<&str, Vec<(f64, [f64; 2])>> = BTreeMap::new();
    for point in points {
        for (task, value) in &point.tasks {
            per_task.entry(task).or_default().push(*value);
        }
    }
    let overall: Vec<(f64, [f64; 2])> = points.iter().map(|p| p.overall).collect();
    Row {
        experiment: experiment.to_string(),
        config,
        seeds: points.len(),
        interval: if points.len() >= 2 {
            Interval::StudentT
        } else {
            Interval::Wilson
        },
        tasks: per_task
            .into_iter()
            .map(|(task, values)| (task.to_string(), combine(&values)))
            .collect(),
        overall: combine(&overall),
    }
}

#[cfg(test)]
mod tests;
