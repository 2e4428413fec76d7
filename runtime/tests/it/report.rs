//! Evaluation with both decodings and the run report: a tiny run writes a greedy and a sampled
//! `Eval` line at every evaluation, both samples files, `report.md` with its tables and valid
//! PNG and SVG plots; the report is regenerated identically from the directory alone; sampling
//! in evaluation leaves training bit-identical; a directory that is not a run is a clear error.

use std::path::{Path, PathBuf};

use crate::common::{self, serial};
use agentry_runtime::RunSummary;
use agentry_runtime::report::{self, ReportError};

/// A warm-up (so there is an after-warm-up evaluation), two RL steps, an evaluation every step,
/// and the default `decoding = both`. The KL penalty on the reward makes returns differ, so the
/// RL steps update the policy (and the curves are not flat).
const TINY: &str = r#"
experiment tiny_report {
    seed = 11
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2, kl = k1(0.1, as = reward) }
    train {
        steps = 2, batch = 4, lr = 1e-3, max_new_tokens = 8, top_k = 20
        warmup = sft { steps = 2, demonstrations = 4, batch = 2 }
    }
    eval { every = 1, episodes = 3 }
}
"#;

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("report", name)
}

fn run(source: &str, out: &Path) -> RunSummary {
    common::run_on_flex(&common::experiment(source), out, None, None).unwrap()
}

/// The training lines without their wall-clock fields: what must not depend on evaluation.
fn training(run_dir: &Path) -> Vec<serde_json::Value> {
    common::metrics_without_timings(run_dir)
        .into_iter()
        .filter(|l| l["phase"] != "eval")
        .collect()
}

fn assert_png(path: &Path) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 2000,
        "{} is not a PNG with a plot in it ({} bytes)",
        path.display(),
        bytes.len()
    );
}

fn assert_svg(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        text.contains("<svg") && text.trim_end().ends_with("</svg>") && text.contains("<text"),
        "{} is not an SVG document with text",
        path.display()
    );
}

#[test]
fn a_run_evaluates_greedy_and_sampled_and_writes_its_report() {
    let _guard = serial();
    let summary = run(TINY, &scratch("both"));
    let dir = &summary.run_dir;

    // Every evaluation point has a greedy line, then a sampled one, on the same instances.
    let evals: Vec<((u64, String, String), u64)> = common::eval_lines(dir)
        .iter()
        .map(|l| {
            let episodes = l["tasks"]["kg"]["episodes"].as_u64().unwrap();
            (common::eval_point(l), episodes)
        })
        .collect();
    let expected: Vec<((u64, String, String), u64)> =
        [(0, "warmup"), (1, "periodic"), (2, "final")]
            .into_iter()
            .flat_map(|(step, label)| {
                ["greedy", "sampled"].map(|d| ((step, label.to_string(), d.to_string()), 3))
            })
            .collect();
    assert_eq!(evals, expected);
    for file in [
        "samples-warmup.txt",
        "samples-warmup-sampled.txt",
        "samples-final.txt",
        "samples-final-sampled.txt",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    assert!(summary.after_warmup.is_some() && summary.after_warmup_sampled.is_some());
    assert!(summary.after_rl_sampled.is_some());
    let written = common::json(&dir.join("summary.json"));
    assert!(written["after_rl_sampled"]["tasks"]["kg"].is_object());

    // The report's tables.
    let text = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for needle in [
        "# Run report: `tiny_report`",
        "| device | ",
        "| seed | 11 |",
        "| RL steps | 2 of 2 |",
        "| evaluation | test split, 3 episodes per task, greedy and sampled |",
        "## Final evaluation (step 2)",
        "| task | decoding | success | 95% CI | mean return | mean turns |",
        "| kg | greedy | ",
        "| kg | sampled | ",
        "| **all tasks** | greedy | ",
        "## After warm-up vs after RL",
        "## Evaluations during the run",
        "| 1 | periodic | sampled | ",
        "Supervised warm-up: 2 steps",
        "Last RL step (2):",
        "Stability alerts:",
        "[samples-final-sampled.txt](samples-final-sampled.txt)",
    ] {
        assert!(text.contains(needle), "report.md lacks {needle:?}:\n{text}");
    }
    let plots = [
        "train_success",
        "return",
        "entropy",
        "kl",
        "eval_success_greedy",
        "eval_success_sampled",
    ];
    for plot in plots {
        assert!(text.contains(&format!("(plots/{plot}.png)")), "{plot}");
        assert_png(&dir.join("plots").join(format!("{plot}.png")));
        assert_svg(&dir.join("plots").join(format!("{plot}.svg")));
    }
    // No cross-policy sampling: no staleness to plot.
    assert!(!dir.join("plots/staleness.png").exists());

    // Regenerated from the directory alone, the report is the same.
    std::fs::remove_dir_all(dir.join("plots")).unwrap();
    std::fs::remove_file(dir.join("report.md")).unwrap();
    assert_eq!(report::write(dir).unwrap(), dir.join("report.md"));
    assert_eq!(
        std::fs::read_to_string(dir.join("report.md")).unwrap(),
        text
    );
    for plot in plots {
        assert_png(&dir.join("plots").join(format!("{plot}.png")));
    }
}

#[test]
fn sampling_in_evaluation_leaves_training_bit_identical() {
    let _guard = serial();
    let greedy = run(
        &TINY.replace("episodes = 3 }", "episodes = 3, decoding = greedy }"),
        &scratch("greedy-only"),
    );
    let both = run(TINY, &scratch("greedy-and-sampled"));
    assert_eq!(training(&greedy.run_dir), training(&both.run_dir));
    assert_eq!(greedy.after_rl, both.after_rl, "the greedy evaluation too");
    assert_eq!(greedy.after_rl_sampled, None);
    let text = std::fs::read_to_string(greedy.run_dir.join("report.md")).unwrap();
    assert!(text.contains("| kg | greedy | ") && !text.contains("| kg | sampled | "));
    assert!(
        !greedy
            .run_dir
            .join("plots/eval_success_sampled.png")
            .exists()
    );
}

#[test]
fn a_directory_without_metrics_is_not_a_run() {
    let dir = scratch("not-a-run");
    let error = report::write(&dir).unwrap_err();
    assert!(matches!(error, ReportError::NotARun { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("is not a run directory: it has no `metrics.jsonl`"),
        "{message}"
    );
    assert!(!dir.join("report.md").exists());

    std::fs::write(
        dir.join("metrics.jsonl"),
        "{\"phase\":\"sft\",\"step\":1,\"loss\":1.0,\"grad_norm\":0.5}\nnot json\n",
    )
    .unwrap();
    let message = report::write(&dir).unwrap_err().to_string();
    assert!(
        message.contains("metrics.jsonl` line 2: not a metrics record"),
        "{message}"
    );
}
