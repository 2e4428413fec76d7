//! A user's own environment type, named by path in an experiment file, runs end to end through
//! `agentry::experiment!`: the recipe `examples/custom_env` with its `Lights` task.

#[path = "../examples/custom_env/envs.rs"]
mod envs;

use agentry::env::{Environment, Split, Status, TaskGenerator};
use agentry::{Experiment, RunOptions};

agentry::experiment!("experiments/custom_env.arl");

#[test]
fn the_generated_experiment_resolves_the_users_type() {
    let spec = CustomEnv.spec();
    assert_eq!(spec.tasks[0].name, "lights");
    let generator = CustomEnv.user_task("lights").expect("the user's task");
    assert_eq!(generator.version(), "lights-1");
    assert!(CustomEnv.user_task("nope").is_none());
}

#[test]
fn the_users_oracle_solves_every_instance_and_bad_calls_are_observations() {
    let lights = envs::Lights;
    for split in [Split::Train, Split::Test] {
        for difficulty in 1..=3 {
            for index in 0..40 {
                let mut env = lights.instance(split, difficulty, index);
                env.reset();
                let mut turns = 0;
                while let Some(call) = env.oracle() {
                    let step = env.step(&call);
                    assert_ne!(step.status, Status::InvalidAction, "{}", step.observation);
                    turns += 1;
                }
                assert!(env.success() && turns <= 7);
            }
        }
    }
    let mut env: Box<dyn Environment> = lights.instance(Split::Train, 1, 0);
    env.reset();
    for text in [
        "toggle(index=99)",
        "toggle(index=-1)",
        "toggle(index=\"0\")",
        "toggle()",
        "flip(index=0)",
    ] {
        let call = agentry::env::parse_call(text).unwrap();
        let step = env.step(&call);
        assert_eq!(step.status, Status::InvalidAction, "{text}");
        assert!(step.observation.starts_with("Error"), "{text}");
    }
}

#[test]
fn the_recipe_trains() {
    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("custom-env-runs");
    let options = RunOptions {
        out: out.clone(),
        steps: Some(2),
        quiet: true,
        ..RunOptions::default()
    };
    let summary = agentry::train::run_on::<burn::backend::Autodiff<burn::backend::Flex>>(
        &CustomEnv,
        &options,
        Default::default(),
    )
    .unwrap();
    assert_eq!(summary.steps, 2);
    let experiment = std::fs::read_to_string(summary.run_dir.join("experiment.json")).unwrap();
    assert!(experiment.contains("crate::envs::Lights"), "{experiment}");
    let versions = std::fs::read_to_string(summary.run_dir.join("task_versions.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&versions).unwrap(),
        serde_json::json!({"lights": "lights-1"})
    );
    let _ = std::fs::remove_dir_all(out);
}
