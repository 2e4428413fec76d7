//! Shared warm-ups: the runs of a sweep that differ only after the warm-up train it once, and
//! each of them writes exactly what it would have written alone.

use std::path::Path;

use crate::common::{self, serial};
use agentry_runtime::sweep::{self, Selection, SweepRun};
use agentry_runtime::{Interpreted, RunOptions};

const SWEEP: &str = r#"
experiment shared {
    seed = 3
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 3, difficulty = 1 }
    algorithm grpo { group_size = 2 }
    pool { engines = 2, stale = 1 { refresh_every = 2 }, cross_policy = 0.5, max_staleness = 2 }
    train {
        steps = 3, batch = 4, lr = 1e-3, max_new_tokens = 8
        warmup = sft { steps = 4, lr = 1e-3, demonstrations = 16, batch = 4 }
        checkpoint_every = 2
    }
    eval { episodes = 4 }
    sweep {
        seeds = [1, 2]
        ablate pool.cross_policy = 0
        ablate train.lr = 3e-3
        ablate train.warmup.steps = 5
    }
}
"#;

const NO_CROSS_POLICY: &str = "ablate.pool.cross_policy=0";

fn sweep_into(out: &Path, selection: &Selection) -> Vec<SweepRun> {
    let spec = agentry_dsl::check(SWEEP).expect("the sweep checks");
    let options = RunOptions {
        out: out.to_path_buf(),
        quiet: true,
        ..RunOptions::default()
    };
    sweep::run(&Interpreted(spec), &options, selection)
        .expect("the sweep runs")
        .runs
}

fn find<'a>(runs: &'a [SweepRun], config: &str, seed: u64) -> &'a SweepRun {
    runs.iter()
        .find(|r| r.config == config && r.seed == seed)
        .expect("the sweep ran this configuration and seed")
}

fn read(run_dir: &Path, file: &str) -> Vec<u8> {
    std::fs::read(run_dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

#[test]
fn runs_that_differ_after_the_warmup_share_it_and_write_what_they_would_alone() {
    let _one = serial();
    let out = common::scratch_in("shared_warmup", "sweep");
    let runs = sweep_into(&out, &Selection::default());
    assert_eq!(runs.len(), 8);

    for seed in [1, 2] {
        let base = find(&runs, "base", seed);
        assert_eq!(
            base.summary.warmup_from, None,
            "the first run trains the warm-up"
        );
        // Ablations of what only RL reads start from the base's warm-up of the same seed...
        for config in [NO_CROSS_POLICY, "ablate.train.lr=0.003"] {
            assert_eq!(
                find(&runs, config, seed).summary.warmup_from.as_deref(),
                Some(base.summary.run_dir.as_path()),
                "{config} seed {seed}"
            );
        }
        // ...one of the warm-up's own settings trains its own.
        assert_eq!(
            find(&runs, "ablate.train.warmup.steps=5", seed)
                .summary
                .warmup_from,
            None
        );
    }
    // A seed is part of what the warm-up reads.
    assert_ne!(
        find(&runs, NO_CROSS_POLICY, 2).summary.warmup_from,
        find(&runs, NO_CROSS_POLICY, 1).summary.warmup_from
    );
    // The cache is gone with the sweep; only the experiment's runs are left.
    assert_eq!(common::entry_names(&out), ["shared"]);

    // The same configuration alone, with no other run to share with, writes the same.
    let alone_out = common::scratch_in("shared_warmup", "alone");
    let alone = sweep_into(
        &alone_out,
        &Selection {
            configs: vec![NO_CROSS_POLICY.to_string()],
            seed: Some(1),
        },
    );
    let (alone, shared) = (&alone[0].summary, &find(&runs, NO_CROSS_POLICY, 1).summary);
    assert_eq!(alone.warmup_from, None);
    assert_eq!(
        common::metrics_without_timings(&alone.run_dir),
        common::metrics_without_timings(&shared.run_dir)
    );
    assert_eq!(alone.after_warmup, shared.after_warmup);
    assert_eq!(alone.after_rl, shared.after_rl);
    for file in [
        "samples-warmup.txt",
        "samples-warmup-sampled.txt",
        "episodes/warmup.jsonl",
        "episodes/warmup-sampled.jsonl",
        "samples-final.txt",
        "episodes/final.jsonl",
        "episodes/final-sampled.jsonl",
        "tokenizer.json",
    ] {
        assert!(
            read(&alone.run_dir, file) == read(&shared.run_dir, file),
            "{file} differs"
        );
    }
    // The run that trained the warm-up has its checkpoints; the one that took it has the one
    // at its end (as its own, to resume from) and its RL ones.
    let checkpoints = |run: &Path| common::entry_names(&run.join("checkpoints"));
    assert_eq!(
        checkpoints(&alone.run_dir),
        [
            "rl-000000.ckpt",
            "rl-000002.ckpt",
            "rl-000003.ckpt",
            "sft-000002.ckpt",
            "sft-000004.ckpt"
        ]
    );
    assert_eq!(
        checkpoints(&shared.run_dir),
        ["rl-000000.ckpt", "rl-000002.ckpt", "rl-000003.ckpt"]
    );
    // The RL steps of the two really differ from the base's, so the comparison above is not
    // between two copies of the base.
    let base = &find(&runs, "base", 1).summary;
    assert_ne!(
        common::metrics_without_timings(&base.run_dir),
        common::metrics_without_timings(&shared.run_dir)
    );
}
