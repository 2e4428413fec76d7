//! The curriculum's draws: a warm-up's demonstrations, capped to the first instances of each
//! task's training split or not.

use std::collections::BTreeSet;

use agentry_runtime::curriculum::{Curriculum, demonstration_draw, training_draw};
use agentry_runtime::rollout::EpisodeSpec;
use agentry_runtime::spec::Experiment;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

const CAPPED: &str = r#"
experiment capped {
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 3, difficulty = 1 }
    task os { env = os, max_turns = 3, difficulty = 1..2 }
    algorithm grpo { group_size = 2 }
    train {
        steps = 3, batch = 4, lr = 1e-3
        warmup = sft { steps = 4, demonstrations = 400, batch = 4, instances = 5 }
    }
}
"#;

fn capped() -> Experiment {
    agentry_dsl::check(CAPPED)
        .expect("the file checks")
        .into_inner()
}

fn demonstrations(spec: &Experiment, seed: u64) -> Vec<EpisodeSpec> {
    let curriculum = Curriculum::new(spec);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..400)
        .map(|_| demonstration_draw(spec, &curriculum, &mut rng))
        .collect()
}

#[test]
fn a_capped_warmup_draws_every_task_from_its_first_instances_only() {
    let spec = capped();
    let draws = demonstrations(&spec, 1);
    for task in 0..spec.tasks.len() {
        let indices: BTreeSet<u64> = draws
            .iter()
            .filter(|d| d.task == task)
            .map(|d| d.index)
            .collect();
        assert_eq!(indices, (0..5).collect(), "task {task}");
    }
    // The cap is on the instance index alone: tasks, difficulties and budgets are drawn as
    // without it, and an index is the uncapped draw's reduced.
    let mut uncapped = spec.clone();
    uncapped.train.warmup.as_mut().unwrap().instances = None;
    let free = demonstrations(&uncapped, 1);
    assert!(free.iter().filter(|d| d.index >= 5).count() > 390);
    for (capped, free) in draws.iter().zip(&free) {
        assert_eq!(
            (
                capped.task,
                capped.difficulty,
                capped.max_turns,
                capped.index
            ),
            (free.task, free.difficulty, free.max_turns, free.index % 5)
        );
    }
}

#[test]
fn an_uncapped_warmup_draws_what_step_zero_would_train_on() {
    let mut spec = capped();
    spec.train.warmup.as_mut().unwrap().instances = None;
    let curriculum = Curriculum::new(&spec);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let trained: Vec<_> = (0..64)
        .map(|_| training_draw(&spec, &curriculum, 0, 0, &mut rng))
        .collect();
    assert_eq!(demonstrations(&spec, 7)[..64], trained[..]);
}
