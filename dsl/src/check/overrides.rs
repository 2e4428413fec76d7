//! Changes to a checked experiment after checking (the command line's `--steps`, a sweep's
//! seeds), each re-checked by the rules that read the changed key, so that a
//! [`Checked`] experiment stays one the checker would have accepted as a file.

use crate::checked::{Checked, OverrideError};
use crate::spec::{Experiment, Sweep};

use super::tasks::stage_beyond_training;

impl Checked<Experiment> {
    /// The experiment with `train.steps = steps`, if the rules that read `train.steps` still
    /// hold: every curriculum stage ends within training (`until <= steps`; a run of `0`
    /// steps reaches no stage, so it breaks no such rule).
    ///
    /// Every configuration of the sweep is checked with `steps` too, so a sweep fails before
    /// its first run; they keep their own `train.steps`, as the base run records the file's
    /// sweep: each run applies the override to its own configuration.
    pub fn with_steps(self, steps: u64) -> Result<Self, OverrideError> {
        let mut experiment = self.into_inner();
        steps_rules(&experiment, steps, None)?;
        if let Some(sweep) = &experiment.sweep {
            let ablations = sweep.ablations.iter().map(|a| (a.label(), &a.experiment));
            let specialists = sweep.specialists.iter().map(|s| (s.label(), &s.experiment));
            for (label, configuration) in ablations.chain(specialists) {
                steps_rules(configuration, steps, Some(&label))?;
            }
        }
        experiment.train.steps = steps;
        Ok(Checked::new(experiment))
    }

    /// The experiment with `seed` set; no rule reads the seed, so there is nothing to re-check.
    pub fn with_seed(self, seed: u64) -> Self {
        Checked::new(Experiment {
            seed,
            ..self.into_inner()
        })
    }

    /// The configurations of the sweep, labelled, in order: base (unless `base = false`), the
    /// ablations, the specialists; without a sweep block, the base alone. The checker checked
    /// each as a whole experiment.
    pub fn configurations(&self) -> Vec<(String, Checked<Experiment>)> {
        let Some(sweep) = &self.sweep else {
            return vec![(Sweep::base_label().to_string(), self.clone())];
        };
        let base = sweep
            .base
            .then(|| (Sweep::base_label().to_string(), self.clone()));
        let ablations = sweep
            .ablations
            .iter()
            .map(|a| (a.label(), Checked::new((*a.experiment).clone())));
        let specialists = sweep
            .specialists
            .iter()
            .map(|s| (s.label(), Checked::new((*s.experiment).clone())));
        base.into_iter()
            .chain(ablations)
            .chain(specialists)
            .collect()
    }
}

/// Which rule, if any, `steps` RL steps break in `experiment` (the sweep configuration
/// `config`, named in the error).
fn steps_rules(
    experiment: &Experiment,
    steps: u64,
    config: Option<&str>,
) -> Result<(), OverrideError> {
    let within = |message: String| match config {
        Some(config) => format!("configuration `{config}`: {message}"),
        None => message,
    };
    for stage in &experiment.curriculum {
        if let Some(message) = stage_beyond_training(stage, steps) {
            return Err(OverrideError {
                message: within(message),
                hint: format!(
                    "pass `--steps {}` or more, or lower the stage's `until` in the file",
                    stage.until.unwrap_or(steps)
                ),
            });
        }
    }
    Ok(())
}
