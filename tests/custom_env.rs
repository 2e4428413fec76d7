//! A user's own environment type, named by path in an experiment file, runs end to end through
//! `agentry::experiment!`: the recipe `examples/custom_env` with its `Lights` task.

#[path = "../examples/custom_env/envs.rs"]
mod envs;

use agentry::env::{Environment, Split, Status, TaskGenerator};
use agentry::{Experiment, RunOptions};

agentry::experiment!("experiments/custom_env.arl");
agentry::experiment!("tests/sweep_user_task.arl");

/// burn seeds weight initialization through a per-backend global RNG, so runs in one process
/// must not overlap; the test harness runs tests on several threads.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

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
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
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

#[test]
fn a_sweeps_specialist_runs_the_users_task() {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let spec = SweepUserTask.spec();
    let sweep = spec
        .sweep
        .as_ref()
        .expect("the sweep is in the generated spec");
    assert!(!sweep.base);
    let labels: Vec<String> = spec
        .configurations()
        .into_iter()
        .map(|(label, _)| label)
        .collect();
    assert_eq!(labels, ["specialist.lights", "specialist.kg"]);

    let out = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sweep-user-task");
    let _ = std::fs::remove_dir_all(&out);
    let options = RunOptions {
        out: out.clone(),
        quiet: true,
        ..RunOptions::default()
    };
    let selection = agentry::sweep::Selection {
        configs: vec!["specialist.lights".into()],
        seed: None,
    };
    let summary = agentry::sweep::run(&SweepUserTask, &options, &selection).unwrap();
    assert_eq!(summary.runs.len(), 1);
    let run = &summary.runs[0];
    assert_eq!((run.config.as_str(), run.seed), ("specialist.lights", 4));
    assert!(
        run.summary
            .run_dir
            .starts_with(out.join("sweep_user_task/specialist.lights"))
    );
    let versions = std::fs::read_to_string(run.summary.run_dir.join("task_versions.json")).unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&versions).unwrap(),
        serde_json::json!({"lights": "lights-1"})
    );
    let table = summary.comparison.expect("a sweep prints its table");
    assert_eq!(table.tasks, ["lights"]);
    assert_eq!(table.rows[0].config, "specialist.lights");
    let _ = std::fs::remove_dir_all(out);
}
