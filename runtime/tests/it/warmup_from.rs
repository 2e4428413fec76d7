//! `--warmup-from`: a new run starts from the end of a warm-up an earlier run trained and
//! checkpointed, and writes what it would have written training that warm-up itself.

use std::path::Path;

use crate::common::{self, experiment, serial};
use agentry_runtime::shared_warmup::WarmupFromError;
use agentry_runtime::sweep::{self, Selection};
use agentry_runtime::{Experiment, RunError, RunOptions, RunSummary};
use burn::backend::{Autodiff, Flex};

/// The earlier run: a warm-up, its checkpoints (so it writes `rl-000000.ckpt`), a KL reference
/// of its own, and RL settings the later run does not share.
const EARLIER: &str = r#"
experiment earlier {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2, kl = k1(0.1, as = reward) }
    train {
        steps = 2, batch = 4, lr = 1e-3, max_new_tokens = 8
        warmup = sft { steps = 3, lr = 2e-3, demonstrations = 8, batch = 2 }
        checkpoint_every = 2
    }
    eval { episodes = 2 }
}
"#;

/// The same warm-up under another name, with other RL: learning rate, steps, KL coefficient,
/// an SFT term, periodic evaluations, and checkpoints at other steps.
fn later(seed: u64) -> String {
    format!(
        r#"
experiment later {{
    seed = {seed}
    device = flex
    model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }} }}
    task kg {{ env = kg, max_turns = 2, difficulty = 1 }}
    algorithm grpo {{ group_size = 2, kl = k1(0.3, as = reward), sft = constant(0.1) }}
    train {{
        steps = 3, batch = 4, lr = 3e-3, max_new_tokens = 8
        warmup = sft {{ steps = 3, lr = 2e-3, demonstrations = 8, batch = 2 }}
        checkpoint_every = 3
    }}
    eval {{ episodes = 2, every = 1 }}
}}
"#
    )
}

fn run(
    experiment: &dyn Experiment,
    out: &Path,
    warmup_from: Option<&Path>,
) -> Result<RunSummary, RunError> {
    let options = RunOptions {
        out: out.to_path_buf(),
        quiet: true,
        warmup_from: warmup_from.map(Path::to_path_buf),
        ..RunOptions::default()
    };
    agentry_runtime::train::run_on::<Autodiff<Flex>>(experiment, &options, Default::default())
}

fn read(run_dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(run_dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn warmup_from_error(result: Result<RunSummary, RunError>) -> WarmupFromError {
    match result {
        Err(RunError::WarmupFrom(e)) => e,
        Err(other) => panic!("not a --warmup-from error: {other}"),
        Ok(summary) => panic!("ran: {}", summary.run_dir.display()),
    }
}

/// Asserts that two runs wrote the same metrics (timings aside), the same `files` and the same
/// final weights, bit for bit.
fn assert_wrote_the_same(alone: &RunSummary, taken: &RunSummary, files: &[&str]) {
    assert_eq!(
        common::metrics_without_timings(&alone.run_dir),
        common::metrics_without_timings(&taken.run_dir)
    );
    for file in files {
        assert!(
            read(&alone.run_dir, file) == read(&taken.run_dir, file),
            "{file} differs"
        );
    }
    assert!(
        common::final_weight_bits(&alone.run_dir, false)
            == common::final_weight_bits(&taken.run_dir, false),
        "the final weights differ"
    );
}

#[test]
fn a_run_from_an_earlier_warmup_writes_what_it_would_have_written_alone() {
    let _one = serial();
    let earlier_out = common::scratch_in("warmup_from", "earlier");
    let earlier = run(&experiment(EARLIER), &earlier_out, None).expect("the earlier run");
    assert!(earlier.run_dir.join("checkpoints/rl-000000.ckpt").is_file());

    let alone_out = common::scratch_in("warmup_from", "alone");
    let alone = run(&experiment(&later(5)), &alone_out, None).expect("the run alone");
    // The experiments' folder of runs is searched, not only a run directory.
    let taken_out = common::scratch_in("warmup_from", "taken");
    let taken = run(
        &experiment(&later(5)),
        &taken_out,
        Some(&earlier_out.join("earlier")),
    )
    .expect("the run from the earlier warm-up");

    assert_eq!(alone.warmup_from, None);
    assert_eq!(
        taken.warmup_from.as_deref(),
        Some(earlier.run_dir.as_path())
    );
    assert_eq!(alone.after_warmup, taken.after_warmup);
    assert_eq!(alone.after_rl, taken.after_rl);
    assert_wrote_the_same(
        &alone,
        &taken,
        &[
            "samples-warmup.txt",
            "samples-warmup-sampled.txt",
            "episodes/warmup.jsonl",
            "episodes/warmup-sampled.jsonl",
            "episodes/periodic-000001.jsonl",
            "samples-final.txt",
            "episodes/final.jsonl",
            "tokenizer.json",
        ],
    );
    // The warm-up's checkpoints are the earlier run's; the one at its end is also this run's
    // own, to resume from.
    let checkpoints = |run: &Path| common::entry_names(&run.join("checkpoints"));
    assert_eq!(
        checkpoints(&alone.run_dir),
        ["rl-000000.ckpt", "rl-000003.ckpt", "sft-000003.ckpt"]
    );
    assert_eq!(
        checkpoints(&taken.run_dir),
        ["rl-000000.ckpt", "rl-000003.ckpt"]
    );
    // Its RL really differs from the earlier run's, so the match above is not two copies of it.
    assert_ne!(
        common::metrics_without_timings(&earlier.run_dir),
        common::metrics_without_timings(&taken.run_dir)
    );

    // Another seed trains another warm-up: refused, naming the difference.
    let error = warmup_from_error(run(&experiment(&later(6)), &taken_out, Some(&earlier_out)));
    let message = error.to_string();
    assert!(
        matches!(error, WarmupFromError::NoMatch { count: 1, .. })
            && message.contains("`seed` was 5 and is now 6"),
        "{message}"
    );

    // A sweep finds every run's warm-up before the first starts: seed 5 has one, 6 does not.
    let sweep_out = common::scratch_in("warmup_from", "sweep");
    let seeds = later(5).replace("eval {", "sweep { seeds = [5, 6] }\n    eval {");
    let options = RunOptions {
        out: sweep_out.clone(),
        quiet: true,
        warmup_from: Some(earlier_out.clone()),
        ..RunOptions::default()
    };
    let error = sweep::run(&experiment(&seeds), &options, &Selection::default()).unwrap_err();
    assert!(error.to_string().contains("seed 6"), "{error}");
    assert!(
        common::entry_names(&sweep_out).is_empty(),
        "no run started: {:?}",
        common::entry_names(&sweep_out)
    );
}

/// Greedy decoding reads no sampling setting, so a run whose evaluation is greedy takes the
/// warm-up of one whose RL sampled at another temperature, and still writes what it would have
/// written alone (its greedy evaluations record no temperature).
#[test]
fn runs_that_evaluate_greedily_share_a_warmup_across_temperatures() {
    let _one = serial();
    let at = |temperature: f64| {
        later(5)
            .replace(
                "max_new_tokens = 8",
                &format!("max_new_tokens = 8, temperature = {temperature}, top_k = 20"),
            )
            .replace("eval {", "eval { decoding = greedy,")
    };
    let earlier_out = common::scratch_in("warmup_from", "greedy-earlier");
    let earlier = run(&experiment(&at(0.6)), &earlier_out, None).expect("the earlier run");
    let alone_out = common::scratch_in("warmup_from", "greedy-alone");
    let alone = run(&experiment(&at(1.4)), &alone_out, None).expect("the run alone");
    let taken_out = common::scratch_in("warmup_from", "greedy-taken");
    let taken = run(&experiment(&at(1.4)), &taken_out, Some(&earlier_out))
        .expect("the run from the warm-up sampled at another temperature");

    assert_eq!(
        taken.warmup_from.as_deref(),
        Some(earlier.run_dir.as_path())
    );
    assert_wrote_the_same(
        &alone,
        &taken,
        &[
            "samples-warmup.txt",
            "episodes/warmup.jsonl",
            "episodes/final.jsonl",
        ],
    );
    // The temperatures really differ where RL samples.
    assert_ne!(
        common::metrics_without_timings(&earlier.run_dir),
        common::metrics_without_timings(&taken.run_dir)
    );
}

#[test]
fn warmup_from_says_why_there_is_nothing_to_take() {
    let out = common::scratch_in("warmup_from", "nothing");
    // No run there wrote an end-of-warm-up checkpoint.
    std::fs::create_dir_all(out.join("runs/e/seed1-1/checkpoints")).unwrap();
    let error = warmup_from_error(run(&experiment(&later(5)), &out, Some(&out.join("runs"))));
    assert!(
        matches!(error, WarmupFromError::NoCheckpoint { .. })
            && error.to_string().contains("train.checkpoint_every"),
        "{error}"
    );
    // A run without a warm-up has nothing to take.
    let no_warmup = later(5).replace(
        "warmup = sft { steps = 3, lr = 2e-3, demonstrations = 8, batch = 2 }",
        "",
    );
    let error = warmup_from_error(run(&experiment(&no_warmup), &out, Some(&out)));
    assert!(matches!(error, WarmupFromError::NoWarmup), "{error}");
    // Resuming a run and starting one are exclusive.
    let options = RunOptions {
        out: out.clone(),
        quiet: true,
        warmup_from: Some(out.clone()),
        resume: Some(out.clone()),
        ..RunOptions::default()
    };
    let result = agentry_runtime::train::run_on::<Autodiff<Flex>>(
        &experiment(&later(5)),
        &options,
        Default::default(),
    );
    assert!(matches!(
        warmup_from_error(result),
        WarmupFromError::WithResume
    ));
}
