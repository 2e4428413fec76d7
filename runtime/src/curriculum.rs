//! Curriculum: which task, difficulty and turn budget each training episode gets.
//!
//! Stages cover consecutive ranges of RL steps (`until` is exclusive); within a stage, tasks are
//! sampled by weight and difficulty uniformly from the allowed levels. Without a `curriculum`
//! block there is one stage with every task at its own settings.

use agentry_dsl::spec::{self, Difficulty, Experiment, Stage, Task};
use agentry_env::Split;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::rollout::EpisodeSpec;

/// What one episode is drawn as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Draw {
    /// Index into the experiment's tasks.
    pub task: usize,
    /// Difficulty level, 1..=3.
    pub difficulty: u8,
    /// Turn budget.
    pub max_turns: u32,
}

/// The experiment's stages over its tasks.
#[derive(Clone, Debug)]
pub struct Curriculum {
    tasks: Vec<Task>,
    stages: Vec<Stage>,
}

impl Curriculum {
    /// The curriculum of a checked experiment.
    pub fn new(experiment: &Experiment) -> Self {
        Curriculum {
            tasks: experiment.tasks.clone(),
            stages: experiment.curriculum.clone(),
        }
    }

    /// The stage in force at RL step `step`, or `None` without a curriculum.
    pub fn stage(&self, step: u64) -> Option<&Stage> {
        self.stages
            .iter()
            .find(|s| s.until.is_none_or(|until| step < until))
            .or(self.stages.last())
    }

    /// The stage's name at `step`, `"all"` without a curriculum.
    pub fn stage_name(&self, step: u64) -> &str {
        self.stage(step).map_or("all", |s| s.name.as_str())
    }

    /// Indices of the tasks sampled at `step`.
    pub fn active_tasks(&self, step: u64) -> Vec<usize> {
        match self.stage(step) {
            Some(stage) if !stage.tasks.is_empty() => self
                .tasks
                .iter()
                .enumerate()
                .filter(|(_, t)| stage.tasks.contains(&t.name))
                .map(|(i, _)| i)
                .collect(),
            _ => (0..self.tasks.len()).collect(),
        }
    }

    /// Draws the task (by weight), difficulty and turn budget of one episode at `step`.
    pub fn draw(&self, step: u64, rng: &mut impl Rng) -> Draw {
        let active = self.active_tasks(step);
        let total: f64 = active.iter().map(|&i| self.tasks[i].weight).sum();
        let mut target = rng.random::<f64>() * total;
        let mut task = active[active.len() - 1];
        for &i in &active {
            if target < self.tasks[i].weight {
                task = i;
                break;
            }
            target -= self.tasks[i].weight;
        }
        let stage = self.stage(step);
        let difficulty = stage
            .and_then(|s| s.difficulty)
            .unwrap_or(self.tasks[task].difficulty);
        Draw {
            task,
            difficulty: draw_level(difficulty, rng),
            max_turns: stage
                .and_then(|s| s.max_turns)
                .unwrap_or(self.tasks[task].max_turns),
        }
    }
}

fn draw_level(difficulty: Difficulty, rng: &mut impl Rng) -> u8 {
    rng.random_range(difficulty.min..=difficulty.max)
}

/// One training episode's draw: task, difficulty and budget from the curriculum, a random
/// instance of the task's training split.
pub fn training_draw(
    spec: &Experiment,
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

/// A warm-up demonstration: drawn as [`training_draw`] draws step 0's episodes, from the first
/// `warmup.instances` instances of the task's split when the warm-up caps them. (The index is
/// reduced rather than drawn again, so an uncapped warm-up draws what it always drew.)
pub fn demonstration_draw(
    spec: &Experiment,
    curriculum: &Curriculum,
    rng: &mut ChaCha8Rng,
) -> EpisodeSpec {
    let mut draw = training_draw(spec, curriculum, 0, 0, rng);
    if let Some(instances) = spec.train.warmup.and_then(|w| w.instances) {
        draw.index %= instances;
    }
    draw
}

/// The environments' split of the language's.
pub fn env_split(split: spec::Split) -> Split {
    match split {
        spec::Split::Train => Split::Train,
        spec::Split::Test => Split::Test,
    }
}
