//! Evaluation on fixed held-out instances, at the points of a run [`EvalPoint`] names.

use std::collections::{BTreeMap, BTreeSet};

use agentry_dsl::spec::{self, Decoding};
use agentry_env::TaskGenerator;
use burn::module::AutodiffModule;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::Trainer;
use super::prepare::task_stats;
use crate::checkpoint::Phase;
use crate::curriculum::env_split;
use crate::error::RunError;
use crate::metrics::{EvalPoint, Evaluation, wilson};
use crate::model::TrainBackend;
use crate::rollout::{Episode, EpisodeSpec, play};
use crate::trajectory::{self, Origin, render};

/// An evaluation's label in its record's files: the point, and `-sampled` for sampling.
fn label(point: EvalPoint, decoding: Decoding) -> String {
    match decoding {
        Decoding::Greedy => point.name().to_string(),
        Decoding::Sampled => format!("{}-sampled", point.name()),
    }
}

/// The readable transcripts an evaluation writes in the run directory.
fn samples_file(point: EvalPoint, decoding: Decoding) -> String {
    format!("samples-{}.txt", label(point, decoding))
}

/// The files the warm-up's evaluation may write, relative to the run directory (samples and
/// recorded episodes, for either decoding): what a run that takes another run's warm-up
/// copies ([`crate::shared_warmup::Earlier`]).
pub(crate) fn warmup_evaluation_files() -> Vec<std::path::PathBuf> {
    [Decoding::Greedy, Decoding::Sampled]
        .into_iter()
        .flat_map(|decoding| {
            [
                samples_file(EvalPoint::Warmup, decoding).into(),
                std::path::Path::new(trajectory::DIR).join(trajectory::file_name(
                    EvalPoint::Warmup,
                    decoding,
                    0,
                )),
            ]
        })
        .collect()
}

impl<B: TrainBackend> Trainer<B> {
    /// Success on `eval.episodes` fixed instances of each task, with each decoding
    /// `eval.decoding` asks for: greedy first, then sampled at the training settings. Each
    /// decoding writes its `Record::Eval` line and its samples file (`samples-LABEL.txt` for
    /// greedy, `samples-LABEL-sampled.txt` for sampled).
    pub(super) fn evaluate(&mut self, step: u64, point: EvalPoint) -> Result<Evaluated, RunError> {
        let eval = self.spec.eval.clone();
        let specs = eval_specs(&self.spec);
        let task_names: Vec<&str> = self.spec.tasks.iter().map(|t| t.name.as_str()).collect();
        let mut done = Vec::new();
        for &decoding in eval.decoding.each() {
            // Evaluation draws from its own stream, one per decoding, so evaluating (and
            // whether it samples) does not change training; greedy keeps stream 0.
            let mut rng = ChaCha8Rng::seed_from_u64(self.spec.seed ^ 0x5eed_e7a1);
            let greedy = match decoding {
                Decoding::Greedy => true,
                Decoding::Sampled => {
                    rng.set_stream(1);
                    false
                }
            };
            let episodes = play(
                &self.state.policy.valid(),
                &self.chat,
                &self.tasks,
                &self.controller,
                &specs,
                &self.sampling(greedy),
                self.context,
                &mut rng,
            );
            self.write_samples(point, decoding, &episodes)?;
            let evaluation = evaluation_of(&task_names, &episodes);
            self.run_dir
                .record(&evaluation.record(step, point, decoding))?;
            done.push((decoding, evaluation));
        }
        Ok(Evaluated::of(done))
    }

    /// Writes the first episodes of each task as readable transcripts, `samples-LABEL.txt`,
    /// and every episode as a replayable line of `episodes/` ([`crate::trajectory`]).
    ///
    /// Evaluation episodes are played by the policy as it stands: its version is the RL steps
    /// done (0 for the warm-up's evaluation, whose weights RL starts from).
    fn write_samples(
        &self,
        point: EvalPoint,
        decoding: Decoding,
        episodes: &[Episode],
    ) -> Result<(), RunError> {
        let mut text = String::new();
        for (t, task) in self.spec.tasks.iter().enumerate() {
            for episode in episodes.iter().filter(|e| e.spec.task == t).take(4) {
                text.push_str(&render(&task.name, episode, self.chat.tokenizer()));
                text.push('\n');
            }
        }
        let label = label(point, decoding);
        let path = self.run_dir.path().join(samples_file(point, decoding));
        std::fs::write(&path, text).map_err(RunError::io(path))?;

        let version = match self.state.phase {
            Phase::Rl { step } => step,
            Phase::Warmup { .. } => 0,
        };
        let sampling = self.sampling(decoding == Decoding::Greedy);
        let mut lines = String::new();
        for episode in episodes {
            let task = &self.spec.tasks[episode.spec.task].name;
            let origin = Origin {
                task,
                task_version: self.task_versions.get(task).map_or("", String::as_str),
                evaluation: &label,
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
        let path = dir.join(trajectory::file_name(point, decoding, version));
        std::fs::write(&path, lines).map_err(RunError::io(path))
    }

    /// Whether `eval.every` falls on RL step `step`.
    pub(super) fn periodic_eval_due(&self, step: u64) -> bool {
        self.spec
            .eval
            .every
            .is_some_and(|every| step.is_multiple_of(every))
    }
}

/// The evaluation of `episodes`: per task, and the mean over tasks with its interval pooled
/// over all episodes.
pub(crate) fn evaluation_of(task_names: &[&str], episodes: &[Episode]) -> Evaluation {
    let tasks = task_stats(task_names, episodes);
    let success = tasks.values().map(|s| s.success).sum::<f64>() / tasks.len().max(1) as f64;
    let solved = episodes.iter().filter(|e| e.success).count();
    Evaluation {
        tasks,
        success,
        success_ci: wilson(solved, episodes.len()),
    }
}

/// The episodes every evaluation plays: `eval.episodes` fixed instances of each task, its
/// difficulty levels in turn.
pub(crate) fn eval_specs(spec: &spec::Experiment) -> Vec<EpisodeSpec> {
    let eval = &spec.eval;
    let mut specs = Vec::new();
    for (t, task) in spec.tasks.iter().enumerate() {
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
    specs
}

/// "difficulty 1" or "difficulties 1, 2": where the counts a warning quotes were taken.
pub(super) fn at_difficulties(levels: &[u8]) -> String {
    match levels {
        [one] => format!("difficulty {one}"),
        _ => {
            let levels: Vec<String> = levels.iter().map(u8::to_string).collect();
            format!("difficulties {}", levels.join(", "))
        }
    }
}

/// A warning for each task whose evaluation plays some instance more than once: its generator
/// holds fewer distinct instances of the split at a difficulty than the evaluation gives that
/// difficulty ([`TaskGenerator::instances`]), so indices wrap around, the repeats count twice in
/// the task's success, and its interval is narrower than the instances warrant.
pub(crate) fn repeated_instance_warnings(
    spec: &spec::Experiment,
    tasks: &[Box<dyn TaskGenerator>],
) -> Vec<String> {
    let specs = eval_specs(spec);
    // The split as `eval.split` names it (the progress lines' `split_name` says "held-out").
    let split = match spec.eval.split {
        spec::Split::Train => "train",
        spec::Split::Test => "test",
    };
    let mut warnings = Vec::new();
    for (t, (task, generator)) in spec.tasks.iter().zip(tasks).enumerate() {
        let levels: Vec<u8> = (task.difficulty.min..=task.difficulty.max).collect();
        // Each difficulty's distinct instances, asked once: a generator may count them by
        // walking its data.
        let instances: BTreeMap<u8, Option<u64>> = levels
            .iter()
            .map(|&d| (d, generator.instances(env_split(spec.eval.split), d)))
            .collect();
        let mut seen = BTreeSet::new();
        // The most episodes that play no instance twice: where the first repeat falls.
        let mut first_repeat = None;
        let mut played = 0;
        for episode in specs.iter().filter(|e| e.task == t) {
            let instance = match instances.get(&episode.difficulty).copied().flatten() {
                Some(count) if count > 0 => episode.index % count,
                _ => episode.index,
            };
            if !seen.insert((episode.difficulty, instance)) {
                first_repeat.get_or_insert(played);
            }
            played += 1;
        }
        let Some(most) = first_repeat else {
            continue;
        };
        let counts: Vec<String> = instances
            .values()
            .map(|count| match count {
                Some(count) => count.to_string(),
                None => "unbounded".to_string(),
            })
            .collect();
        let at = at_difficulties(&levels);
        let repeats = match played - seen.len() {
            1 => "1 episode repeats".to_string(),
            n => format!("{n} episodes repeat"),
        };
        warnings.push(format!(
            "warning: task `{}`: its evaluation plays {played} episodes of the {split} split, \
             which holds {} distinct instances at {at}, so {repeats} an instance, counted twice \
             in its success; `eval.episodes = {most}` plays each once",
            task.name,
            counts.join(", "),
        ));
    }
    warnings
}

/// The name of the split evaluations run on, for the progress lines.
pub(crate) fn split_name(split: spec::Split) -> &'static str {
    match split {
        spec::Split::Train => "train",
        spec::Split::Test => "held-out",
    }
}

/// The evaluations of one point of a run: the first decoding `eval.decoding` asks for (greedy,
/// the headline number, unless only sampled is asked) and, with `both`, the sampled one.
#[derive(Clone, Debug)]
pub(super) struct Evaluated {
    /// The first decoding's evaluation.
    pub first: Evaluation,
    /// Which decoding `first` is.
    pub first_decoding: Decoding,
    /// The sampled evaluation, when it followed a greedy one.
    pub sampled: Option<Evaluation>,
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
    pub fn describe(&self) -> String {
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

#[cfg(test)]
mod tests {
    use agentry_env::{Environment, Split};

    use super::*;

    fn experiment(task: &str, episodes: usize) -> spec::Experiment {
        agentry_dsl::check(&format!(
            "experiment e {{
                model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2 }} }}
                {task}
                algorithm grpo {{ group_size = 2 }}
                train {{ steps = 1, batch = 2 }}
                eval {{ episodes = {episodes} }}
            }}"
        ))
        .expect("the test experiment checks")
        .into_inner()
    }

    /// Three instances at difficulty 1, five at 2, as KG's fixed questions are a fixed set.
    struct Few;

    impl TaskGenerator for Few {
        fn version(&self) -> &str {
            "few-1"
        }
        fn instance(&self, split: Split, difficulty: u8, index: u64) -> Box<dyn Environment> {
            agentry_env::kg::Kg::default().instance(split, difficulty, index)
        }
        fn instances(&self, _split: Split, difficulty: u8) -> Option<u64> {
            Some(if difficulty == 1 { 3 } else { 5 })
        }
    }

    #[test]
    fn an_evaluation_longer_than_a_fixed_set_of_instances_is_warned_about() {
        let kg: Vec<Box<dyn TaskGenerator>> = vec![Box::new(agentry_env::kg::Kg::default())];
        let held_out = kg[0]
            .instances(Split::Test, 1)
            .expect("KG's questions are a fixed set");
        let spec = |episodes| experiment("task kg { env = kg, difficulty = 1 }", episodes);
        assert!(repeated_instance_warnings(&spec(held_out as usize), &kg).is_empty());
        let warnings = repeated_instance_warnings(&spec(held_out as usize + 7), &kg);
        assert_eq!(
            warnings,
            [format!(
                "warning: task `kg`: its evaluation plays {} episodes of the test split, which \
                 holds {held_out} distinct instances at difficulty 1, so 7 episodes repeat an \
                 instance, counted twice in its success; `eval.episodes = {held_out}` plays each \
                 once",
                held_out + 7
            )]
        );
    }

    #[test]
    fn the_largest_evaluation_without_repeats_is_found_across_difficulties() {
        let few: Vec<Box<dyn TaskGenerator>> = vec![Box::new(Few)];
        let spec = |episodes| experiment("task kg { env = kg, difficulty = 1 .. 2 }", episodes);
        // Difficulty 1 plays indices 0, 2, 4, 6 (instances 0, 2, 1, 0): episode 6 repeats.
        assert!(repeated_instance_warnings(&spec(6), &few).is_empty());
        let warnings = repeated_instance_warnings(&spec(8), &few);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(
                "holds 3, 5 distinct instances at difficulties 1, 2, so 1 episode repeats"
            ) && warnings[0].ends_with("`eval.episodes = 6` plays each once"),
            "{}",
            warnings[0]
        );
        // Tasks whose every index is an instance of its own are never warned about.
        let os: Vec<Box<dyn TaskGenerator>> = vec![Box::new(agentry_env::os::Os::default())];
        assert!(
            repeated_instance_warnings(&experiment("task os { env = os }", 500), &os).is_empty()
        );
    }
}
