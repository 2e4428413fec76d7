//! Runs of `train.steps = 0`: without a warm-up the run only evaluates the model as declared
//! (one evaluation, no checkpoint, no weights, a report, episodes that replay against the
//! declared model); with a warm-up it evaluates once after it, keeps its weights and checkpoint,
//! and a longer run resumes from there.

use std::path::{Path, PathBuf};

use crate::common::{self, serial};
use agentry_runtime::replay::replay;

/// No warm-up and no RL: an evaluation of the freshly initialized policy.
const EVAL_ONLY: &str = r#"
experiment tiny_eval_only {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 256 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2, kl = k3(0.05) }
    train { steps = 0, batch = 4, lr = 1e-3, max_new_tokens = 8, top_k = 20 }
    eval { episodes = 3 }
}
"#;

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("evaluation_only", name)
}

/// The (step, label, decoding) of every evaluation line of `run_dir`'s metrics, and whether
/// any line is not an evaluation.
fn evaluations(run_dir: &Path) -> (Vec<(u64, String, String)>, bool) {
    let evals = common::eval_lines(run_dir)
        .iter()
        .map(common::eval_point)
        .collect();
    let trained = common::metrics(run_dir).iter().any(|l| l["phase"] == "rl");
    (evals, trained)
}

fn labelled(step: u64, label: &str) -> Vec<(u64, String, String)> {
    ["greedy", "sampled"]
        .map(|d| (step, label.to_string(), d.to_string()))
        .to_vec()
}

#[test]
fn zero_steps_without_a_warmup_only_evaluate_the_declared_model() {
    let summary = {
        let _serial = serial();
        common::run_on_flex(
            &common::experiment(EVAL_ONLY),
            &scratch("plain"),
            None,
            None,
        )
        .expect("an evaluation-only run runs")
    };
    let dir = &summary.run_dir;
    assert_eq!(summary.steps, 0);
    assert!(summary.after_warmup.is_none());
    assert!(summary.after_rl_sampled.is_some());
    let (evals, trained) = evaluations(dir);
    assert_eq!(evals, labelled(0, "final"));
    assert!(!trained, "no RL line");

    // Nothing trained, so nothing of the model is written: it is the experiment's input.
    let entries = common::entry_names(dir);
    for absent in ["checkpoints", "policy.mpk", "adapter"] {
        assert!(
            !entries.contains(&absent.to_string()),
            "{absent}: {entries:?}"
        );
    }
    for present in ["summary.json", "report.md", "episodes", "samples-final.txt"] {
        assert!(
            entries.contains(&present.to_string()),
            "{present}: {entries:?}"
        );
    }
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("## Final evaluation (step 0)"), "{report}");
    assert!(report.contains("| RL steps | 0 of 0 |"), "{report}");

    // Its episodes replay against the model as declared, rebuilt from the seed: log-probs
    // re-scored and greedy tokens regenerated, though the run kept no weights.
    let file = dir.join("episodes/final.jsonl");
    let replayed = {
        let _serial = serial();
        replay(&format!("{}:1", file.display()), None, None).expect("the replay runs")
    };
    assert!(replayed.identical(), "{replayed:#?}");
    assert!(
        replayed
            .checks
            .iter()
            .any(|c| c.contains("with the model as declared (version 0")),
        "{replayed:#?}"
    );
    assert!(
        replayed
            .checks
            .iter()
            .any(|c| c.contains("tokens identical")),
        "{replayed:#?}"
    );
}

#[test]
fn zero_steps_after_a_warmup_evaluate_once_and_keep_what_a_longer_run_resumes_from() {
    let source = EVAL_ONLY.replace(
        "top_k = 20 }",
        "top_k = 20, warmup = sft { steps = 2, demonstrations = 4, batch = 2 } }",
    );
    let experiment = common::experiment(&source);
    let out = scratch("warmup");
    let summary = {
        let _serial = serial();
        common::run_on_flex(&experiment, &out, None, None).expect("a warm-up-only run runs")
    };
    let dir = &summary.run_dir;
    // The warm-up's evaluation is the final one: the same weights, not evaluated twice.
    let (evals, trained) = evaluations(dir);
    assert_eq!(evals, labelled(0, "warmup"));
    assert!(!trained);
    let after_warmup = summary.after_warmup.as_ref().unwrap();
    assert_eq!(after_warmup.success, summary.after_rl.success);
    assert_eq!(after_warmup.tasks, summary.after_rl.tasks);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("## Final evaluation (step 0)"), "{report}");
    assert!(!report.contains("has not finished"), "{report}");

    // The warmed-up weights are kept, and a run with more steps goes on from their checkpoint.
    assert!(dir.join("policy.mpk").is_file());
    let resumed = {
        let _serial = serial();
        common::run_on_flex(&experiment, &out, Some(1), Some(dir)).expect("the run resumes")
    };
    assert_eq!(resumed.steps, 1);
    let (evals, trained) = evaluations(dir);
    assert!(trained, "the resumed run took an RL step");
    assert_eq!(
        evals.first(),
        Some(&(0, "warmup".to_string(), "greedy".to_string()))
    );
    assert_eq!(
        evals.last(),
        Some(&(1, "final".to_string(), "sampled".to_string()))
    );
}
