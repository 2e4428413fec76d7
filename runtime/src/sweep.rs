//! Sweeps: an experiment's configurations (base, ablations, specialists) times its seeds, run
//! one after another.
//!
//! The checker has already built every configuration's whole experiment (`spec::Sweep`); this
//! module only lays them out ([`plan`]), narrows them to what the user asked for ([`select`]),
//! and runs them ([`run`]), each in its own run directory labelled with its configuration
//! ([`crate::metrics::RunDir::create`]). Runs go in sequence: each already uses the machine's
//! cores for its rollouts. Runs whose warm-ups would be the same computation train it once
//! ([`crate::shared_warmup`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentry_dsl::spec;
use agentry_dsl::{Checked, OverrideError};
use agentry_env::TaskGenerator;

use crate::compare::{self, CompareError, Comparison, Decoding};
use crate::error::RunError;
use crate::experiment::Experiment;
use crate::metrics::RunConfig;
use crate::shared_warmup::SharedWarmups;
use crate::train::{RunOptions, RunSummary, run_configuration};

/// Why a sweep could not run, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// `--config` names no configuration of the sweep.
    #[error("`{experiment}` has no configuration `{config}`; it has {}", known.join(", "))]
    UnknownConfig {
        /// The experiment.
        experiment: String,
        /// The label asked for.
        config: String,
        /// The labels it has.
        known: Vec<String>,
    },
    /// `--seed` is not one of the sweep's seeds.
    #[error("`{experiment}` does not run seed {seed}; its seeds are {}", seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(", "))]
    UnknownSeed {
        /// The experiment.
        experiment: String,
        /// The seed asked for.
        seed: u64,
        /// The sweep's seeds.
        seeds: Vec<u64>,
    },
    /// `--resume` continues one run, but the selection holds several (or none).
    #[error(
        "--resume continues one run, but {count} runs of the sweep match it (the run directory \
         has no `config.json` naming its configuration and seed); choose one with --config \
         and --seed"
    )]
    ResumeNeedsOne {
        /// Runs selected.
        count: usize,
    },
    /// The run to resume is not part of this selection.
    #[error(
        "--resume `{path}` is configuration `{config}` seed {seed}, which --config/--seed leave out"
    )]
    ResumeOutside {
        /// The run directory.
        path: PathBuf,
        /// Its configuration.
        config: String,
        /// Its seed.
        seed: u64,
    },
    /// `config.json` of the run to resume cannot be read.
    #[error("cannot read `{path}`: {reason}")]
    ResumeConfig {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// One run failed; the sweep stops there.
    #[error("configuration `{config}`, seed {seed}: {source}")]
    Run {
        /// The configuration's label.
        config: String,
        /// The seed.
        seed: u64,
        /// What went wrong.
        source: RunError,
    },
    /// A command-line override (`--steps`) breaks a rule of the checker in some configuration.
    #[error(transparent)]
    Override(#[from] OverrideError),
    /// The finished runs could not be compared.
    #[error(transparent)]
    Compare(#[from] CompareError),
}

/// One run of a sweep: a configuration and a seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// The configuration's label: `base`, `ablate.PATH=VALUE` or `specialist.TASK`.
    pub config: String,
    /// The seed.
    pub seed: u64,
    /// The configuration's experiment with `seed` set.
    pub experiment: Checked<spec::Experiment>,
}

/// Which runs of a sweep to run: all of them by default.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Selection {
    /// Only these configurations (labels); empty means all.
    pub configs: Vec<String>,
    /// Only this seed.
    pub seed: Option<u64>,
}

/// The seeds every configuration runs with: the sweep's, or the file's `seed`.
pub fn seeds(spec: &spec::Experiment) -> Vec<u64> {
    match &spec.sweep {
        Some(sweep) if !sweep.seeds.is_empty() => sweep.seeds.clone(),
        _ => vec![spec.seed],
    }
}

/// Every run of the sweep: each configuration ([`Checked::configurations`]) with each seed,
/// configuration by configuration.
pub fn plan(spec: &Checked<spec::Experiment>) -> Vec<Planned> {
    let seeds = seeds(spec);
    spec.configurations()
        .into_iter()
        .flat_map(|(config, experiment)| {
            seeds.iter().map(move |&seed| Planned {
                config: config.clone(),
                seed,
                experiment: experiment.clone().with_seed(seed),
            })
        })
        .collect()
}

/// The runs of `spec`'s sweep that `selection` keeps; a label or seed the sweep lacks is an
/// error rather than an empty sweep.
pub fn select(
    spec: &Checked<spec::Experiment>,
    selection: &Selection,
) -> Result<Vec<Planned>, SweepError> {
    let known: Vec<String> = spec.configurations().into_iter().map(|(l, _)| l).collect();
    for config in &selection.configs {
        if !known.contains(config) {
            return Err(SweepError::UnknownConfig {
                experiment: spec.name.clone(),
                config: config.clone(),
                known,
            });
        }
    }
    let all_seeds = seeds(spec);
    if let Some(seed) = selection.seed
        && !all_seeds.contains(&seed)
    {
        return Err(SweepError::UnknownSeed {
            experiment: spec.name.clone(),
            seed,
            seeds: all_seeds,
        });
    }
    Ok(plan(spec)
        .into_iter()
        .filter(|p| selection.configs.is_empty() || selection.configs.contains(&p.config))
        .filter(|p| selection.seed.is_none_or(|s| s == p.seed))
        .collect())
}

/// The run to go on with: the one `config.json` of the run directory names, within the
/// selection (any single run when the directory predates `config.json`).
fn resumed(resume: &Path, runs: Vec<Planned>) -> Result<Vec<Planned>, SweepError> {
    // `--resume` names the run directory or a checkpoint in its `checkpoints` folder.
    let dir = if resume.is_dir() {
        Some(resume)
    } else {
        resume.parent().and_then(Path::parent)
    };
    let path = dir.map(|d| d.join(RunConfig::FILE));
    let runs = match path.filter(|p| p.is_file()) {
        Some(path) => {
            let text = std::fs::read_to_string(&path).map_err(|e| SweepError::ResumeConfig {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            let config: RunConfig =
                serde_json::from_str(&text).map_err(|e| SweepError::ResumeConfig {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            let matching: Vec<Planned> = runs
                .into_iter()
                .filter(|p| p.config == config.config && p.seed == config.seed)
                .collect();
            if matching.is_empty() {
                return Err(SweepError::ResumeOutside {
                    path: resume.to_path_buf(),
                    config: config.config,
                    seed: config.seed,
                });
            }
            matching
        }
        None => runs,
    };
    if runs.len() != 1 {
        return Err(SweepError::ResumeNeedsOne { count: runs.len() });
    }
    Ok(runs)
}

/// One configuration of an experiment: its own spec, the user's task types of the original.
struct Configured<'a> {
    inner: &'a dyn Experiment,
    spec: Checked<spec::Experiment>,
}

impl Experiment for Configured<'_> {
    fn spec(&self) -> Checked<spec::Experiment> {
        self.spec.clone()
    }

    fn user_task(&self, name: &str) -> Option<Box<dyn TaskGenerator>> {
        self.inner.user_task(name)
    }
}

/// A finished run of a sweep.
#[derive(Debug)]
pub struct SweepRun {
    /// The configuration's label.
    pub config: String,
    /// The seed.
    pub seed: u64,
    /// What the run reported (its directory among it).
    pub summary: RunSummary,
}

/// Finds each selected run's `--warmup-from` warm-up (`options.warmup_from`; nothing to do
/// without it) before any run starts, as overrides are checked: a run with none should not
/// surface hours into a sweep. [`run`] calls it; `agentry run` with several files calls it for
/// each file first.
pub fn check_warmup_from(
    experiment: &dyn Experiment,
    options: &RunOptions,
    selection: &Selection,
) -> Result<(), SweepError> {
    let spec = options.overridden(experiment.spec())?;
    check_warmups_from(experiment, options, &select(&spec, selection)?)
}

fn check_warmups_from(
    experiment: &dyn Experiment,
    options: &RunOptions,
    runs: &[Planned],
) -> Result<(), SweepError> {
    if options.warmup_from.is_none() {
        return Ok(());
    }
    for planned in runs {
        let configured = Configured {
            inner: experiment,
            spec: planned.experiment.clone(),
        };
        crate::train::check_start(&configured, options, &planned.config).map_err(|source| {
            SweepError::Run {
                config: planned.config.clone(),
                seed: planned.seed,
                source,
            }
        })?;
    }
    Ok(())
}

/// What a finished sweep reports.
#[derive(Debug)]
pub struct SweepSummary {
    /// Every run, in the order they ran.
    pub runs: Vec<SweepRun>,
    /// The comparison of those runs, when the file has a sweep block.
    pub comparison: Option<Comparison>,
}

/// Runs the selected runs of `experiment`'s sweep one after another, then prints where each
/// went and (for a file with a sweep) their comparison table. The first failing run stops the
/// sweep with an error naming its configuration and seed. `--resume` (`options.resume`)
/// continues one run: the one its directory's `config.json` names.
pub fn run(
    experiment: &dyn Experiment,
    options: &RunOptions,
    selection: &Selection,
) -> Result<SweepSummary, SweepError> {
    // Overrides are checked for every configuration before any run starts.
    let spec = options.overridden(experiment.spec())?;
    let mut runs = select(&spec, selection)?;
    if let Some(resume) = &options.resume {
        runs = resumed(resume, runs)?;
    }
    let total = runs.len();
    // Runs that differ only after the warm-up train it once (unless the caller already
    // shares warm-ups across more than this sweep).
    let mut options = options.clone();
    if total > 1 && options.shared_warmups.is_none() && options.warmup_from.is_none() {
        let warmups = SharedWarmups::for_runs(&options.out, runs.iter().map(|r| &*r.experiment))
            .map_err(|source| SweepError::Run {
                config: runs[0].config.clone(),
                seed: runs[0].seed,
                source: source.into(),
            })?;
        options.shared_warmups = warmups.map(Arc::new);
    }
    let options = &options;
    if total > 1 {
        check_warmups_from(experiment, options, &runs)?;
    }
    let mut done = Vec::new();
    for (i, planned) in runs.into_iter().enumerate() {
        if total > 1 {
            println!(
                "== sweep `{}`: run {}/{total}: configuration `{}`, seed {}",
                spec.name,
                i + 1,
                planned.config,
                planned.seed
            );
        }
        let configured = Configured {
            inner: experiment,
            spec: planned.experiment,
        };
        let summary =
            run_configuration(&configured, options, &planned.config).map_err(|source| {
                SweepError::Run {
                    config: planned.config.clone(),
                    seed: planned.seed,
                    source,
                }
            })?;
        done.push(SweepRun {
            config: planned.config,
            seed: planned.seed,
            summary,
        });
    }
    let comparison = match spec.sweep {
        Some(_) => {
            println!("\nruns of `{}`:", spec.name);
            for run in &done {
                println!(
                    "  {} seed {}: {}",
                    run.config,
                    run.seed,
                    run.summary.run_dir.display()
                );
            }
            let results = done
                .iter()
                .map(|r| compare::read_run(&r.summary.run_dir, Decoding::default()))
                .collect::<Result<Vec<_>, _>>()?;
            let comparison = Comparison::of(&results, Decoding::default())?;
            println!("\n{}", comparison.markdown());
            Some(comparison)
        }
        None => None,
    };
    Ok(SweepSummary {
        runs: done,
        comparison,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "experiment study {
        seed = 9
        model policy { arch = transformer }
        task kg { env = kg }
        task os { env = os }
        algorithm grpo { group_size = 4 }
        train { steps = 10, batch = 16 }
        sweep {
            seeds = [1, 2]
            ablate pool.cross_policy = 0
            ablate algorithm.clip = 0.2 .. 0.28
            specialists = true
        }
    }";

    fn spec(source: &str) -> Checked<spec::Experiment> {
        agentry_dsl::check(source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", source)))
    }

    #[test]
    fn a_sweep_expands_into_labelled_configurations_times_seeds() {
        let spec = spec(FILE);
        let runs = plan(&spec);
        let labels: Vec<(&str, u64)> = runs.iter().map(|p| (p.config.as_str(), p.seed)).collect();
        assert_eq!(
            labels,
            [
                ("base", 1),
                ("base", 2),
                ("ablate.pool.cross_policy=0", 1),
                ("ablate.pool.cross_policy=0", 2),
                ("ablate.algorithm.clip=0.2..0.28", 1),
                ("ablate.algorithm.clip=0.2..0.28", 2),
                ("specialist.kg", 1),
                ("specialist.kg", 2),
                ("specialist.os", 1),
                ("specialist.os", 2),
            ]
        );
        for p in &runs {
            assert_eq!(p.experiment.seed, p.seed);
            assert_eq!(p.experiment.name, "study");
        }
        assert_eq!(runs[2].experiment.pool.cross_policy, 0.0);
        assert_eq!(runs[4].experiment.algorithm.clip.high, 0.28);
        let kg: Vec<&str> = runs[6]
            .experiment
            .tasks
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(kg, ["kg"]);
        assert_eq!(runs[9].experiment.tasks[0].name, "os");
        // The base keeps its sweep (recorded in its experiment.json); the others have none.
        assert!(runs[0].experiment.sweep.is_some());
        assert!(runs[2].experiment.sweep.is_none());
    }

    #[test]
    fn without_seeds_or_sweep_the_file_seed_runs_once() {
        let plain = spec(&FILE.replace("seeds = [1, 2]", ""));
        let runs = plan(&plain);
        assert_eq!(runs.len(), 5);
        assert!(runs.iter().all(|p| p.seed == 9));
        let no_sweep = format!("{}}}", &FILE[..FILE.find("sweep {").unwrap()]);
        let runs = plan(&spec(&no_sweep));
        assert_eq!(runs.len(), 1);
        assert_eq!((runs[0].config.as_str(), runs[0].seed), ("base", 9));
    }

    #[test]
    fn base_false_leaves_the_base_out() {
        let spec = spec(&FILE.replace("specialists = true", "base = false"));
        let labels: Vec<String> = spec.configurations().into_iter().map(|(l, _)| l).collect();
        assert_eq!(
            labels,
            [
                "ablate.pool.cross_policy=0",
                "ablate.algorithm.clip=0.2..0.28"
            ]
        );
    }

    #[test]
    fn a_selection_keeps_the_named_configurations_and_seed() {
        let spec = spec(FILE);
        let selection = Selection {
            configs: vec!["specialist.os".into(), "base".into()],
            seed: Some(2),
        };
        let runs = select(&spec, &selection).unwrap();
        let labels: Vec<(&str, u64)> = runs.iter().map(|p| (p.config.as_str(), p.seed)).collect();
        assert_eq!(labels, [("base", 2), ("specialist.os", 2)]);

        let bad = Selection {
            configs: vec!["ablate.pool.cross_policy=1".into()],
            seed: None,
        };
        let e = select(&spec, &bad).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "`study` has no configuration `ablate.pool.cross_policy=1`; it has base, \
                 ablate.pool.cross_policy=0,"
            ),
            "{e}"
        );
        let bad = Selection {
            configs: Vec::new(),
            seed: Some(3),
        };
        assert_eq!(
            select(&spec, &bad).unwrap_err().to_string(),
            "`study` does not run seed 3; its seeds are 1, 2"
        );
    }

    #[test]
    fn resume_picks_the_run_its_directory_names() {
        let spec = spec(FILE);
        let dir = std::env::temp_dir().join(format!("agentry-sweep-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let all = plan(&spec);
        // Without config.json, only a single selected run can be resumed.
        let e = resumed(&dir, all.clone()).unwrap_err();
        assert!(matches!(e, SweepError::ResumeNeedsOne { count: 10 }), "{e}");
        std::fs::write(
            dir.join(RunConfig::FILE),
            r#"{"experiment":"study","config":"specialist.kg","seed":2}"#,
        )
        .unwrap();
        let runs = resumed(&dir, all.clone()).unwrap();
        assert_eq!(
            (runs[0].config.as_str(), runs[0].seed),
            ("specialist.kg", 2)
        );
        // A checkpoint file inside the run directory names the same run.
        let checkpoint = dir.join("checkpoints").join("rl-000002.ckpt");
        let runs = resumed(&checkpoint, all.clone()).unwrap();
        assert_eq!(runs[0].config, "specialist.kg");
        let only_base: Vec<Planned> = all.into_iter().filter(|p| p.config == "base").collect();
        let e = resumed(&dir, only_base).unwrap_err().to_string();
        assert!(e.contains("is configuration `specialist.kg` seed 2"), "{e}");
        std::fs::write(dir.join(RunConfig::FILE), "{").unwrap();
        let e = resumed(&dir, plan(&spec)).unwrap_err().to_string();
        assert!(e.starts_with("cannot read `"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
