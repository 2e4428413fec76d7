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
    let n = rates.len() as f64;
    let mean = rates.iter().sum::<f64>() / n;
    let sd = crate::algo::std_dev(rates);
    let half = t_quantile_975(rates.len().saturating_sub(1)) * sd / n.sqrt();
    Cell {
        mean,
        ci: [(mean - half).max(0.0), (mean + half).min(1.0)],
    }
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
        match eval.label.as_str() {
            "final" => final_eval = Some(eval.point().map_err(malformed)?),
            "warmup" => warmup = Some(eval.point().map_err(malformed)?),
            _ => {}
        }
    }
    let final_eval = final_eval.ok_or(CompareError::NoFinal { path, decoding })?;
    Ok(RunResult {
        dir: dir.to_path_buf(),
        config,
        final_eval,
        warmup,
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
    let runs = find_runs(paths)?
        .iter()
        .map(|dir| read_run(dir, decoding))
        .collect::<Result<Vec<_>, _>>()?;
    Comparison::of(&runs, decoding)
}

impl Comparison {
    /// Groups `runs` by (experiment, configuration) and averages each group over its seeds.
    pub fn of(runs: &[RunResult], decoding: Decoding) -> Result<Self, CompareError> {
        // `base` sorts first within an experiment, the other labels after it in order.
        let key = |r: &RunResult| {
            (
                r.config.experiment.clone(),
                r.config.config != Sweep::base_label(),
                r.config.config.clone(),
            )
        };
        let mut groups: BTreeMap<(String, bool, String), Vec<&RunResult>> = BTreeMap::new();
        for run in runs {
            let group = groups.entry(key(run)).or_default();
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
        let mut rows = Vec::new();
        for ((experiment, _, config), group) in groups {
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
        let mut tasks: Vec<String> = rows.iter().flat_map(|r| r.tasks.keys().cloned()).collect();
        tasks.sort();
        tasks.dedup();
        Ok(Comparison {
            decoding,
            tasks,
            rows,
        })
    }

    /// The table in markdown, with a footnote on what the numbers are.
    pub fn markdown(&self) -> String {
        let several = self
            .rows
            .windows(2)
            .any(|w| w[0].experiment != w[1].experiment);
        let mut out = String::new();
        let mut header = vec!["configuration".to_string(), "seeds".to_string()];
        header.extend(self.tasks.iter().cloned());
        header.push("overall".into());
        let _ = writeln!(out, "| {} |", header.join(" | "));
        let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
        let mut wilson_rows = false;
        for row in &self.rows {
            let name = if several {
                format!("{} / {}", row.experiment, row.config)
            } else {
                row.config.clone()
            };
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
mod tests {
    use super::*;

    /// A fresh scratch directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("agentry-compare-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// An evaluation line: `kg` and `os` with 10 episodes each.
    fn eval(label: &str, kg: f64, os: f64, decoding: Option<&str>) -> String {
        let decoding = decoding
            .map(|d| format!(",\"decoding\":\"{d}\""))
            .unwrap_or_default();
        let task = |s: f64| {
            let ci = wilson((s * 10.0).round() as usize, 10);
            format!(
                "{{\"episodes\":10,\"success\":{s},\"success_ci\":[{},{}],\"mean_return\":0.0,\"mean_turns\":1.0}}",
                ci[0], ci[1]
            )
        };
        let overall = (kg + os) / 2.0;
        let ci = wilson((overall * 20.0).round() as usize, 20);
        format!(
            "{{\"phase\":\"eval\",\"step\":4,\"label\":\"{label}\",\"tasks\":{{\"kg\":{},\"os\":{}}},\"success\":{overall},\"success_ci\":[{},{}]{decoding}}}",
            task(kg),
            task(os),
            ci[0],
            ci[1]
        )
    }

    /// A run directory `root/name` with `config.json` and these metrics lines.
    fn run(root: &Path, name: &str, config: &str, seed: u64, lines: &[String]) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let config = RunConfig {
            experiment: "study".into(),
            config: config.into(),
            seed,
        };
        std::fs::write(
            dir.join(RunConfig::FILE),
            serde_json::to_string(&config).unwrap(),
        )
        .unwrap();
        let mut text =
            "{\"phase\":\"sft\",\"step\":1,\"loss\":2.0,\"grad_norm\":1.0}\n".to_string();
        for line in lines {
            text.push_str(line);
            text.push('\n');
        }
        std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
        dir
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-6, "{a} != {b}");
    }

    #[test]
    fn t_quantiles_match_tables() {
        close(t_quantile_975(1), 12.706_204_736);
        close(t_quantile_975(2), 4.302_652_730);
        close(t_quantile_975(30), 2.042_272_456);
        // Beyond the table: t(40) = 2.021075, t(120) = 1.979930 (numerical integration).
        assert!((t_quantile_975(40) - 2.021_075).abs() < 2e-6);
        assert!((t_quantile_975(120) - 1.979_930).abs() < 2e-6);
    }

    #[test]
    fn seeds_average_with_a_t_interval_and_one_seed_keeps_its_wilson_interval() {
        let root = scratch("table");
        let sweep = root.join("runs/study");
        for (seed, kg, os) in [(1, 0.5, 0.2), (2, 0.6, 0.4), (3, 0.7, 0.3)] {
            run(
                &sweep,
                &format!("seed{seed}-1"),
                "base",
                seed,
                &[
                    eval("warmup", 0.1, 0.0, None),
                    eval("periodic", 0.0, 0.0, None),
                    eval("final", 0.9, 0.9, Some("sampled")),
                    eval("final", kg, os, Some("greedy")),
                ],
            );
        }
        run(
            &sweep,
            "ablate.pool.cross_policy=0/seed1-2",
            "ablate.pool.cross_policy=0",
            1,
            &[eval("final", 0.3, 0.8, None)],
        );
        let table = compare(&[root.join("runs")], Decoding::Greedy).unwrap();
        assert_eq!(table.tasks, ["kg", "os"]);
        let names: Vec<&str> = table.rows.iter().map(|r| r.config.as_str()).collect();
        assert_eq!(
            names,
            ["base", "base (after warm-up)", "ablate.pool.cross_policy=0"]
        );
        let base = &table.rows[0];
        assert_eq!((base.seeds, base.interval), (3, Interval::StudentT));
        // kg: 0.5, 0.6, 0.7: mean 0.6, sd 0.1, half-width 4.302653 * 0.1 / sqrt(3) = 0.248414.
        let kg = base.tasks["kg"];
        close(kg.mean, 0.6);
        close(kg.ci[0], 0.6 - 0.248_414_2);
        close(kg.ci[1], 0.6 + 0.248_414_2);
        // overall: 0.35, 0.5, 0.5: mean 0.45, sd 0.0866025, half 4.302653 * 0.05 = 0.215133.
        close(base.overall.mean, 0.45);
        close(base.overall.ci[0], 0.45 - 0.215_132_6);
        // The warm-up row: 0.0 for os on every seed, a zero-width interval.
        assert_eq!(table.rows[1].tasks["os"].ci, [0.0, 0.0]);
        let ablation = &table.rows[2];
        assert_eq!((ablation.seeds, ablation.interval), (1, Interval::Wilson));
        // One seed: the stored Wilson intervals (3 of 10, and 11 of 20 pooled).
        for (ci, hand) in [
            (ablation.tasks["kg"].ci, wilson(3, 10)),
            (ablation.overall.ci, wilson(11, 20)),
        ] {
            close(ci[0], hand[0]);
            close(ci[1], hand[1]);
        }

        let markdown = table.markdown();
        let lines: Vec<&str> = markdown.lines().collect();
        assert_eq!(lines[0], "| configuration | seeds | kg | os | overall |");
        assert_eq!(lines[1], "|---|---|---|---|---|");
        assert_eq!(
            lines[2],
            "| base | 3 | 0.600 [0.352, 0.848] | 0.300 [0.052, 0.548] | 0.450 [0.235, 0.665] |"
        );
        assert!(
            lines[4].starts_with("| ablate.pool.cross_policy=0 | 1* | 0.300 [0.108, 0.603] |"),
            "{markdown}"
        );
        assert!(markdown.contains("greedy decoding"), "{markdown}");
        assert!(
            markdown.contains("`*` one seed: the run's Wilson"),
            "{markdown}"
        );

        let sampled = compare(&[sweep.join("seed1-1")], Decoding::Sampled).unwrap();
        assert_eq!(sampled.rows.len(), 1, "no sampled warm-up evaluation");
        close(sampled.rows[0].overall.mean, 0.9);
        let e = compare(
            &[sweep.join("ablate.pool.cross_policy=0")],
            Decoding::Sampled,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("has no final evaluation with sampled decoding"),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_run_without_config_json_is_its_experiments_base() {
        let root = scratch("legacy");
        let dir = run(
            &root,
            "seed4-1",
            "base",
            4,
            &[eval("final", 1.0, 0.5, None)],
        );
        std::fs::remove_file(dir.join(RunConfig::FILE)).unwrap();
        std::fs::write(
            dir.join("experiment.json"),
            r#"{"name":"old","seed":4,"more":1}"#,
        )
        .unwrap();
        let result = read_run(&dir, Decoding::Greedy).unwrap();
        assert_eq!(
            result.config,
            RunConfig {
                experiment: "old".into(),
                config: "base".into(),
                seed: 4
            }
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn bad_runs_are_errors_naming_the_file() {
        let root = scratch("bad");
        let good = eval("final", 0.5, 0.5, None);
        let cases: Vec<(&str, String, &str)> = vec![
            ("json", "{not json".into(), "line 2: not JSON"),
            ("phase", "{\"step\":1}".into(), "line 2: no `phase`"),
            (
                "shape",
                "{\"phase\":\"eval\",\"label\":\"final\",\"tasks\":3}".into(),
                "line 2: not an evaluation record",
            ),
            (
                "rate",
                good.replacen(
                    "\"episodes\":10,\"success\":0.5",
                    "\"episodes\":10,\"success\":1.5",
                    1,
                ),
                "line 2: task `kg`: success 1.5 is not a rate in [0, 1]",
            ),
            (
                "decoding",
                format!("{},\"decoding\":\"beam\"}}", good.trim_end_matches('}')),
                "unknown decoding `beam`",
            ),
            (
                "unfinished",
                eval("periodic", 0.5, 0.5, None),
                "has no final evaluation with greedy decoding",
            ),
        ];
        for (name, line, expected) in cases {
            let dir = run(&root, name, "base", 1, &[line]);
            let e = compare(std::slice::from_ref(&dir), Decoding::Greedy)
                .unwrap_err()
                .to_string();
            let file = dir.join("metrics.jsonl");
            assert!(e.contains(&format!("`{}`", file.display())), "{name}: {e}");
            assert!(e.contains(expected), "{name}: {e}");
        }
        let dir = run(&root, "config", "base", 1, std::slice::from_ref(&good));
        std::fs::write(dir.join(RunConfig::FILE), "{\"experiment\":\"x\"}").unwrap();
        let e = compare(std::slice::from_ref(&dir), Decoding::Greedy)
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json`: missing field"), "{e}");

        let missing = root.join("nope");
        let e = compare(&[missing], Decoding::Greedy)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("cannot read `") && e.contains("nope"), "{e}");
        let empty = root.join("empty/inner");
        std::fs::create_dir_all(&empty).unwrap();
        let e = compare(&[root.join("empty")], Decoding::Greedy)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("no run under `"), "{e}");

        let twice = root.join("twice");
        run(&twice, "a", "base", 1, std::slice::from_ref(&good));
        run(&twice, "b", "base", 1, &[good]);
        let e = compare(&[twice], Decoding::Greedy).unwrap_err().to_string();
        assert!(
            e.contains("are both seed 1 of `study` configuration `base`"),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
