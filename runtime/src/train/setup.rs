//! Setting a run up: the model and tokenizer (built, or loaded from a Hugging Face checkpoint),
//! the oracle demonstrations, the state (fresh, resumed from a checkpoint, or taken from a
//! warm-up another run shared or an earlier run checkpointed) and the run directory.

use std::sync::Arc;

use agentry_env::TaskGenerator;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::state::RunState;
use super::{Job, Trainer};
use crate::curriculum::{Curriculum, demonstration_draw, env_split};
use crate::device;
use crate::error::RunError;
use crate::metrics::{RunConfig, RunDir};
use crate::model::{Origin, PolicyConfig, TrainBackend};
use crate::rollout::{EpisodeSpec, Unfit, demonstration, oracle_text};
use crate::text::{ChatFormat, Tokenizer, Transcript};

/// Oracle episodes the tokenizer is trained on when there is no warm-up (with one, its
/// `demonstrations`). The runtime's own choice, not a key of the language.
const TOKENIZER_EPISODES_WITHOUT_WARMUP: usize = 64;

/// The policy `spec` declares (LoRA adapters, frozen parts, recomputation) over `loaded`,
/// with `vocab` tokens when built from scratch: what every run and every replica of a
/// multi-node run ([`super::nodes`]) trains.
pub(super) fn declared_policy<B: TrainBackend>(
    loaded: Origin<'_, B>,
    spec: &agentry_dsl::spec::Experiment,
    vocab: usize,
    device: &B::Device,
) -> crate::model::Policy<B> {
    let policy = match loaded {
        Origin::Pretrained(checkpoint) => checkpoint.policy,
        Origin::Scratch(arch) => PolicyConfig::from_arch(arch, vocab).init(device),
    };
    policy
        .as_declared(&spec.model)
        .with_recompute(spec.train.recompute)
}

impl<B: TrainBackend> Trainer<B> {
    /// `engine_devices` overrides the file's `placement` (see [`run_on_devices`]).
    pub(super) fn new(
        job: Job,
        device: B::Device,
        engine_devices: Option<Vec<B::Device>>,
    ) -> Result<Self, RunError> {
        let Job {
            spec,
            tasks,
            task_versions,
            resume,
            earlier,
            base_digest,
            options,
            device_name,
            config,
        } = job;
        // A pretrained model brings its policy and tokenizer; otherwise both are built.
        let loaded = Origin::of(&spec.model.arch, &device)?;
        let context = match &loaded {
            Origin::Scratch(arch) => arch.context,
            Origin::Pretrained(checkpoint) => checkpoint.policy.context,
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
            .map(|_| demonstration_draw(&spec, &curriculum, &mut rng))
            .collect();
        // A warm-up another run of this invocation trained identically is taken as it ended,
        // as `--warmup-from` takes an earlier run's.
        let warmup_key = options
            .shared_warmups
            .as_ref()
            .and_then(|warmups| warmups.key(&spec, &device_name, &task_versions));
        let earlier = match (earlier, &resume, &options.shared_warmups, &warmup_key) {
            (None, None, Some(warmups), Some(key)) => warmups.get(key)?,
            (earlier, ..) => earlier,
        };
        // A tokenizer trained here, and the tokens it would need to keep every word whole.
        let taken = resume.as_ref().or(earlier.as_ref().map(|e| &e.checkpoint));
        let (tokenizer, vocab_needed) = match (taken, &loaded) {
            // The weights were trained with the checkpoint's tokenizer (ours or the model's).
            (Some(checkpoint), _) => (checkpoint.tokenizer().clone(), None),
            (None, Origin::Pretrained(checkpoint)) => (checkpoint.tokenizer.clone(), None),
            (None, Origin::Scratch(arch)) => {
                let mut corpus: Vec<String> = tasks.iter().flat_map(|t| t.vocabulary()).collect();
                for draw in &demo_draws {
                    let mut env =
                        tasks[draw.task].instance(draw.split, draw.difficulty, draw.index);
                    corpus.extend(oracle_text(env.as_mut(), draw.max_turns));
                }
                let (tokenizer, needed) =
                    Tokenizer::train_counting(corpus.iter().map(String::as_str), arch.vocab);
                (tokenizer, Some(needed))
            }
        };
        let chat = ChatFormat::new(tokenizer);
        let mut demo_counts = vec![DemoCounts::default(); tasks.len()];
        let demos: Vec<Transcript> = demo_draws
            .iter()
            .filter_map(|draw| {
                let mut env = tasks[draw.task].instance(draw.split, draw.difficulty, draw.index);
                let demo = demonstration(&chat, env.as_mut(), draw.max_turns, context);
                demo_counts[draw.task].count(&demo, spec.train.max_new_tokens);
                demo.ok()
            })
            .collect();

        B::seed(&device, spec.seed);
        let policy = declared_policy(loaded, &spec, chat.tokenizer().vocab_size(), &device);
        // Whatever uses the policy first (an evaluation's copy, a data-parallel replica, the
        // first update), its initial weights are these.
        crate::model::draw_weights(&policy);
        let mut state = RunState::fresh(policy, &spec, rng);
        if let Some(checkpoint) = &resume {
            state = state.restore(checkpoint, &spec, &device)?;
        }
        if let Some(earlier) = &earlier {
            state = state.restore_warmup(&earlier.checkpoint, &spec, &device)?;
        }
        let mut saved = None;
        let run_dir = match &resume {
            Some(checkpoint) => {
                saved = Some(state.phase);
                let (run_dir, superseded) =
                    RunDir::reopen(&checkpoint.run_dir()?, checkpoint.metrics_len())?;
                let mut note = format!(
                    "resuming from {} ({})",
                    checkpoint.path().display(),
                    state.phase
                );
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
                if let Some(earlier) = &earlier {
                    earlier.copy_to(&mut run_dir)?;
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
        let controller = Arc::new(crate::tasks::controller(&spec).map_err(RunError::Controller)?);
        let tasks = Arc::new(tasks);
        Ok(Trainer {
            controller,
            context,
            device_name,
            spec,
            tasks,
            chat,
            demos,
            demo_counts,
            vocab_needed,
            curriculum,
            device,
            options,
            task_versions,
            engine_devices,
            warmup_key,
            warmup_from: earlier.map(|earlier| earlier.run_dir),
            base_digest,
            state,
            run_dir,
            saved,
            replicas: None,
        })
    }
}

/// One task's oracle demonstrations: how many were drawn, kept, and left out for being longer
/// than the context; and how many of those kept have a call longer than a turn may generate,
/// which the policy could never finish as demonstrated. So the run can say why a task is not
/// learned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct DemoCounts {
    pub drawn: usize,
    pub kept: usize,
    /// Left out: longer than the context.
    pub long_episode: usize,
    /// Kept, with a call longer than `train.max_new_tokens`.
    pub long_reply: usize,
    /// The longest call among those.
    pub longest_reply: usize,
}

impl DemoCounts {
    fn count(&mut self, demo: &Result<Transcript, Unfit>, max_reply: usize) {
        self.drawn += 1;
        match demo {
            Ok(transcript) => {
                self.kept += 1;
                let reply = transcript.longest_reply();
                if reply > max_reply {
                    self.long_reply += 1;
                    self.longest_reply = self.longest_reply.max(reply);
                }
            }
            Err(Unfit::Context { .. }) => self.long_episode += 1,
            Err(Unfit::Unsolved) => {}
        }
    }
}

/// A warning for each task that `warmup.instances` holds nothing back from: at every difficulty
/// its training split holds no more distinct instances than the cap ([`TaskGenerator::instances`];
/// a fixed set such as KG's questions), so the warm-up may demonstrate each of them and RL
/// meets no instance the warm-up could not have shown, which a cap is set to give it.
pub(super) fn uncapped_task_warnings(
    spec: &agentry_dsl::spec::Experiment,
    tasks: &[Box<dyn TaskGenerator>],
) -> Vec<String> {
    let Some(cap) = spec.train.warmup.and_then(|w| w.instances) else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    for (task, generator) in spec.tasks.iter().zip(tasks) {
        let levels: Vec<u8> = (task.difficulty.min..=task.difficulty.max).collect();
        let counts: Option<Vec<u64>> = levels
            .iter()
            .map(|&d| generator.instances(env_split(task.split), d))
            .collect();
        let Some(counts) = counts.filter(|counts| counts.iter().all(|&count| count <= cap)) else {
            continue;
        };
        let largest = counts.iter().copied().max().unwrap_or(0);
        let at = super::eval::at_difficulties(&levels);
        let counts: Vec<String> = counts.iter().map(u64::to_string).collect();
        warnings.push(format!(
            "warning: task `{}`: `warmup.instances = {cap}` holds none of its instances back \
             from the warm-up: its {} split holds {} at {at}, so RL trains only on instances \
             the warm-up may have shown; a cap below {largest} holds some back",
            task.name,
            super::split_name(task.split),
            counts.join(", "),
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use agentry_env::{Split, TaskGenerator};

    use super::uncapped_task_warnings;

    fn experiment(cap: &str) -> agentry_dsl::spec::Experiment {
        agentry_dsl::check(&format!(
            "experiment e {{
                model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2 }} }}
                task kg {{ env = kg, difficulty = 1 }}
                task os {{ env = os, difficulty = 1 }}
                algorithm grpo {{ group_size = 2 }}
                train {{
                    steps = 1, batch = 2
                    warmup = sft {{ steps = 1, demonstrations = 2, batch = 2{cap} }}
                }}
            }}"
        ))
        .expect("the test experiment checks")
        .into_inner()
    }

    #[test]
    fn a_cap_at_least_a_fixed_sets_size_is_warned_about_and_a_smaller_one_is_not() {
        let tasks: Vec<Box<dyn TaskGenerator>> = vec![
            Box::new(agentry_env::kg::Kg::default()),
            Box::new(agentry_env::os::Os::default()),
        ];
        let questions = tasks[0]
            .instances(Split::Train, 1)
            .expect("KG's questions are a fixed set");
        // OS generates its instances, so no cap holds all of them.
        assert_eq!(
            uncapped_task_warnings(&experiment(&format!(", instances = {questions}")), &tasks),
            [format!(
                "warning: task `kg`: `warmup.instances = {questions}` holds none of its \
                 instances back from the warm-up: its train split holds {questions} at \
                 difficulty 1, so RL trains only on instances the warm-up may have shown; a cap \
                 below {questions} holds some back"
            )]
        );
        let below = format!(", instances = {}", questions - 1);
        assert!(uncapped_task_warnings(&experiment(&below), &tasks).is_empty());
        assert!(uncapped_task_warnings(&experiment(""), &tasks).is_empty());
    }
}
