//! `agentry compare RUNS --paired BASE`: every configuration against a base configuration,
//! seed by seed. Runs of one seed share what the seed decides (the warm-up, the instances), so the
//! per-seed difference of two configurations removes the spread between seeds that an unpaired
//! comparison of means carries; its mean over seeds gets a Student-t interval. The base's own
//! first row is the gain of RL over its warm-up (final minus after-warm-up evaluation, per run).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use super::{
    CompareError, Decoding, Group, Point, RunResult, columns, group, mean_and_half_width,
    read_runs, row_name, several_experiments, table_head,
};

/// A difference of success rates over paired seeds.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// Per paired seed, in seed order.
    pub per_seed: Vec<f64>,
    /// Their mean.
    pub mean: f64,
    /// Its 95% Student-t interval; `None` with fewer than two seeds.
    pub ci: Option<[f64; 2]>,
}

impl Difference {
    fn of(per_seed: Vec<f64>) -> Difference {
        let (mean, ci) = match per_seed.len() {
            // One seed (or none): its difference, without an interval.
            0 | 1 => (per_seed.iter().sum(), None),
            _ => {
                let (mean, half) = mean_and_half_width(&per_seed);
                (mean, Some([mean - half, mean + half]))
            }
        };
        Difference { per_seed, mean, ci }
    }

    /// Whether its interval excludes zero.
    pub fn separates(&self) -> bool {
        self.ci.is_some_and(|[low, high]| low > 0.0 || high < 0.0)
    }
}

/// One configuration minus the base, over the seeds both ran.
#[derive(Clone, Debug, PartialEq)]
pub struct PairedRow {
    /// The experiment of the configuration.
    pub experiment: String,
    /// What is subtracted from what.
    pub label: String,
    /// The seeds paired, in order.
    pub seeds: Vec<u64>,
    /// Per task both were evaluated on.
    pub tasks: BTreeMap<String, Difference>,
    /// Over tasks (each run's mean over its tasks), where both were evaluated on the same
    /// tasks: a specialist's one task against a multi-task policy's mean is no difference.
    pub overall: Option<Difference>,
}

/// Every configuration against the base, seed by seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Paired {
    /// The decoding of the evaluations compared.
    pub decoding: Decoding,
    /// The base: its experiment and configuration.
    pub base: (String, String),
    /// Every task of any row, sorted: the columns.
    pub tasks: Vec<String>,
    /// The base's final minus its warm-up evaluation (when its runs had a warm-up), then each
    /// other configuration minus the base.
    pub rows: Vec<PairedRow>,
    /// Configurations that share no seed with the base.
    pub unpaired: Vec<(String, String)>,
}

/// The runs under `paths` ([`find_runs`](super::find_runs)) paired by seed with those of configuration `base`
/// among them: a configuration label (`base`, `ablate.pool.cross_policy=0`), or
/// `EXPERIMENT/LABEL` where several experiments have it.
pub fn paired(paths: &[PathBuf], base: &str, decoding: Decoding) -> Result<Paired, CompareError> {
    let runs = read_runs(paths, decoding)?;
    let groups = group(&runs)?;
    let named = |g: &Group| format!("{}/{}", g.experiment, g.config);
    let matches: Vec<&(Group, Vec<&RunResult>)> = groups
        .iter()
        .filter(|(g, _)| base == g.config || base == named(g))
        .collect();
    let (base_group, base_runs) = match matches.as_slice() {
        [one] => (one.0.clone(), one.1.clone()),
        [] => {
            let known: Vec<String> = groups.iter().map(|(g, _)| named(g)).collect();
            return Err(CompareError::Base(format!(
                "`--paired {base}`: no configuration of that name among the runs; they hold {}",
                known.join(", ")
            )));
        }
        several => {
            let known: Vec<String> = several.iter().map(|(g, _)| named(g)).collect();
            return Err(CompareError::Base(format!(
                "`--paired {base}` names a configuration of several experiments ({}): write \
                 `EXPERIMENT/{base}`",
                known.join(", ")
            )));
        }
    };
    let base_seeds: BTreeMap<u64, &RunResult> =
        base_runs.iter().map(|r| (r.config.seed, *r)).collect();
    let mut rows = Vec::new();
    let warmed: Vec<(u64, &Point, &Point)> = base_seeds
        .iter()
        .filter_map(|(&seed, r)| Some((seed, &r.final_eval, r.warmup.as_ref()?)))
        .collect();
    if !warmed.is_empty() {
        rows.push(row(
            &base_group.experiment,
            format!("{}: final − after warm-up", base_group.config),
            &warmed,
        ));
    }
    let mut unpaired = Vec::new();
    for (other, runs) in &groups {
        if *other == base_group {
            continue;
        }
        let pairs: Vec<(u64, &Point, &Point)> = runs
            .iter()
            .filter_map(|r| {
                let base = base_seeds.get(&r.config.seed)?;
                Some((r.config.seed, &r.final_eval, &base.final_eval))
            })
            .collect();
        let Group { experiment, config } = other;
        if pairs.is_empty() {
            unpaired.push((experiment.clone(), config.clone()));
            continue;
        }
        let label = if *experiment == base_group.experiment {
            format!("{config} − {}", base_group.config)
        } else {
            format!("{config} − {}/{}", base_group.experiment, base_group.config)
        };
        let mut sorted = pairs;
        sorted.sort_by_key(|(seed, _, _)| *seed);
        rows.push(row(experiment, label, &sorted));
    }
    let tasks = columns(rows.iter().flat_map(|r| r.tasks.keys()));
    Ok(Paired {
        decoding,
        base: (base_group.experiment, base_group.config),
        tasks,
        rows,
        unpaired,
    })
}

/// `a − b` per seed of `pairs` (seed, a, b), for each task both evaluated and overall.
fn row(experiment: &str, label: String, pairs: &[(u64, &Point, &Point)]) -> PairedRow {
    let mut per_task: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for (_, a, b) in pairs {
        for (task, (success, _)) in &a.tasks {
            if let Some((base, _)) = b.tasks.get(task) {
                per_task
                    .entry(task.clone())
                    .or_default()
                    .push(success - base);
            }
        }
    }
    // A task counts only where every pair has it, so its seeds are the row's seeds.
    per_task.retain(|_, diffs| diffs.len() == pairs.len());
    PairedRow {
        experiment: experiment.to_string(),
        label,
        seeds: pairs.iter().map(|(seed, _, _)| *seed).collect(),
        tasks: per_task
            .into_iter()
            .map(|(task, diffs)| (task, Difference::of(diffs)))
            .collect(),
        overall: pairs
            .iter()
            .all(|(_, a, b)| a.tasks.keys().eq(b.tasks.keys()))
            .then(|| {
                Difference::of(
                    pairs
                        .iter()
                        .map(|(_, a, b)| a.overall.0 - b.overall.0)
                        .collect(),
                )
            }),
    }
}

impl Paired {
    /// The table in markdown, then each row's per-seed differences, with a footnote on what
    /// the numbers are.
    pub fn markdown(&self) -> String {
        let mut out = table_head("difference", &self.tasks);
        for row in &self.rows {
            let mut cells = vec![self.name(row), row.seeds.len().to_string()];
            for task in &self.tasks {
                cells.push(row.tasks.get(task).map_or_else(|| "–".into(), cell));
            }
            cells.push(row.overall.as_ref().map_or_else(|| "–".into(), cell));
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        let _ = writeln!(
            out,
            "\nPer seed (overall, or the one task both were evaluated on):\n"
        );
        for row in &self.rows {
            let tasks: Vec<&Difference> = row.tasks.values().collect();
            let single = match (&row.overall, tasks.as_slice()) {
                (Some(overall), _) => Some(overall),
                (None, [only]) => Some(*only),
                (None, _) => None,
            };
            let Some(difference) = single else { continue };
            let seeds: Vec<String> = row
                .seeds
                .iter()
                .zip(&difference.per_seed)
                .map(|(seed, d)| format!("{seed}: {d:+.3}"))
                .collect();
            let _ = writeln!(out, "- {}: {}", self.name(row), seeds.join(", "));
        }
        let (experiment, config) = &self.base;
        let _ = writeln!(
            out,
            "\nPaired differences of success on the final evaluation ({} decoding) against \
             `{experiment}/{config}`, seed by seed: the mean over the seeds both ran, then its \
             95% Student-t interval (none with one seed); `*` marks an interval that excludes \
             zero. The first row is the base's gain of RL over its warm-up, run by run.",
            self.decoding.name()
        );
        for (experiment, config) in &self.unpaired {
            let _ = writeln!(
                out,
                "`{experiment}/{config}` shares no seed with the base: not compared."
            );
        }
        out
    }

    fn name(&self, row: &PairedRow) -> String {
        let several = several_experiments(self.rows.iter().map(|r| r.experiment.as_str()));
        row_name(several, &row.experiment, &row.label)
    }
}

fn cell(d: &Difference) -> String {
    let mark = if d.separates() { "*" } else { "" };
    match d.ci {
        Some([low, high]) => format!("{:+.3} [{low:+.3}, {high:+.3}]{mark}", d.mean),
        None => format!("{:+.3}", d.mean),
    }
}

#[cfg(test)]
mod tests;
