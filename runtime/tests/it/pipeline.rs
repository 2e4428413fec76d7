//! Asynchronous rollout end to end: workers and trainer overlap, every trained turn is within
//! `max_staleness` versions, the pipeline's metrics are recorded, and a run checkpoints and
//! resumes.

use std::path::{Path, PathBuf};

use crate::common::{self, serial};
use agentry_runtime::{Interpreted, RunOptions, RunSummary};
use burn::backend::{Autodiff, Flex};

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("pipeline", name)
}

fn experiment(pool: &str, name: &str) -> String {
    format!(
        r#"
experiment {name} {{
    seed = 5
    device = flex
    model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }} }}
    task kg {{ env = kg, max_turns = 3, difficulty = 1 }}
    algorithm grpo {{ group_size = 2, kl = k1(0.1, as = reward), is_cap = 2 }}
    pool {{ {pool} }}
    train {{
        steps = 6, batch = 4, lr = 1e-3, max_new_tokens = 8
        warmup = sft {{ steps = 2, demonstrations = 8, batch = 2 }}
        checkpoint_every = 3
    }}
    eval {{ episodes = 2 }}
}}
"#
    )
}

fn run(source: &str, out: &Path, steps: u64, resume: Option<&Path>) -> RunSummary {
    common::run_on_flex(&common::experiment(source), out, Some(steps), resume)
        .expect("the run succeeds")
}

fn rl_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    common::metrics(run_dir)
        .into_iter()
        .filter(|line| line["phase"] == "rl")
        .collect()
}

#[test]
fn an_async_run_trains_on_finished_groups_within_the_staleness_bound() {
    let _guard = serial();
    for (pool, name) in [
        (
            "engines = 2, max_staleness = 1, mode = async",
            "async_plain",
        ),
        (
            "engines = 2, stale = 1 { refresh_every = 2 }, cross_policy = 0.5, max_staleness = 3, mode = async",
            "async_cross_policy",
        ),
        (
            "engines = 2, max_staleness = 1, mode = async, interrupt = token",
            "async_token",
        ),
        (
            "engines = 2, max_staleness = 1, mode = async, interrupt = never",
            "async_never",
        ),
    ] {
        let source = experiment(pool, name);
        let summary = run(&source, &scratch(name), 6, None);
        let lines = rl_lines(&summary.run_dir);
        assert_eq!(lines.len(), 6, "{name}");
        for line in &lines {
            let step = line["step"].as_u64().unwrap();
            let idle = line["trainer_idle"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&idle), "{line}");
            let rollout_idle = line["rollout_idle"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&rollout_idle), "{line}");
            assert!(line["trajectories_per_second"].as_f64().unwrap() > 0.0);
            // Every trained turn is at most `max_staleness` versions behind step - 1.
            let max_staleness = if name == "async_cross_policy" { 3 } else { 1 };
            let staleness = line["staleness"].as_object().unwrap();
            assert!(!staleness.is_empty(), "{line}");
            for behind in staleness.keys() {
                let behind: u64 = behind.parse().unwrap();
                assert!(behind <= max_staleness && behind < step, "{line}");
            }
            assert!(line["dropped"].as_u64().is_some(), "{line}");
            let (turns, tokens) = (
                line["stale_turns"].as_f64().unwrap(),
                line["stale_tokens"].as_f64().unwrap(),
            );
            assert!((0.0..=1.0).contains(&turns) && (0.0..=1.0).contains(&tokens));
            if name != "async_token" {
                // A reply is one version's: a turn and its tokens are stale alike.
                assert!(turns > 0.0 || tokens == 0.0, "{line}");
            }
        }
        assert!(summary.after_rl.tasks.contains_key("kg"));
    }
}

#[test]
fn disaggregated_engines_copy_each_version_to_their_device() {
    let _guard = serial();
    let name = "async_disaggregated";
    let source = experiment(
        "engines = 2, stale = 1 { refresh_every = 2 }, cross_policy = 0.5, max_staleness = 3, \
         mode = async, placement = disaggregated { devices = [0] }",
        name,
    );
    // flex has one device, so the copies stay on it; the wgpu test in tests/backend.rs puts
    // the engines on a device of their own.
    let summary = run(&source, &scratch(name), 4, None);
    let lines = rl_lines(&summary.run_dir);
    assert_eq!(lines.len(), 4);
    for line in &lines {
        assert!(
            line["weight_sync_seconds"].as_f64().unwrap() >= 0.0,
            "{line}"
        );
    }
    // A colocated run does not report it.
    let colocated = experiment("engines = 2, mode = async", "async_colocated");
    let summary = run(&colocated, &scratch("async_colocated"), 1, None);
    assert!(
        rl_lines(&summary.run_dir)[0]
            .get("weight_sync_seconds")
            .is_none()
    );
}

#[test]
fn a_device_the_backend_lacks_is_refused_before_any_work() {
    let _guard = serial();
    let source = experiment(
        "engines = 2, mode = async, placement = disaggregated { devices = [0, 3] }",
        "async_missing_device",
    );
    let out = scratch("missing_device");
    let spec = agentry_dsl::check(&source).unwrap();
    let options = RunOptions {
        out: out.clone(),
        quiet: true,
        ..RunOptions::default()
    };
    let error = agentry_runtime::train::run_on::<Autodiff<Flex>>(
        &Interpreted(spec),
        &options,
        Default::default(),
    )
    .expect_err("flex has no device 3");
    assert_eq!(
        error.to_string(),
        "device `flex device 3` is not available: `placement = disaggregated` names it, but \
         this machine has 1 such device (indices from 0)"
    );
}

#[test]
fn an_async_run_resumes_from_its_checkpoint() {
    let _guard = serial();
    let source = experiment(
        "engines = 2, max_staleness = 2, mode = async",
        "async_resume",
    );
    let out = scratch("resume");
    let first = run(&source, &out, 3, None);
    assert!(first.run_dir.join("checkpoints/rl-000003.ckpt").exists());
    let resumed = run(&source, &out, 6, Some(&first.run_dir));
    let steps: Vec<u64> = rl_lines(&resumed.run_dir)
        .iter()
        .map(|l| l["step"].as_u64().unwrap())
        .collect();
    assert_eq!(steps, [1, 2, 3, 4, 5, 6]);
}
