//! Checker behaviour: one rule per test, each on a minimal fixture.

mod common;

use agentry_dsl::check;
use agentry_dsl::spec::{
    AdvantageNorm, Aggregation, AlgorithmKind, Arch, Credit, EnvRef, EvalDecoding, Interrupt,
    KlEstimator, KlPlacement, MatmulPrecision, Optimizer, Placement, PoolMode, Schedule, SftSource,
    Split, Warmup,
};
use common::{MINIMAL, MULTITASK, at, error, errors, text};

/// `MINIMAL` with `from` replaced by `to` (which must occur).
fn with(from: &str, to: &str) -> String {
    assert!(MINIMAL.contains(from), "fixture lacks {from:?}");
    MINIMAL.replacen(from, to, 1)
}

#[test]
fn the_design_example_checks_with_its_values() {
    let spec = check(MULTITASK).unwrap_or_else(|d| panic!("{}", d.render("m.arl", MULTITASK)));
    assert_eq!(spec.seed, 7);
    assert_eq!(spec.tasks[1].env, EnvRef::Path("crate::envs::Maze".into()));
    assert_eq!(spec.tasks[0].difficulty.max, 2);
    assert_eq!(spec.curriculum.len(), 3);
    assert_eq!(spec.curriculum[2].until, None);
    assert_eq!(spec.algorithm.clip.high, 0.28);
    assert_eq!(spec.algorithm.kl.estimator, Some(KlEstimator::K3));
    assert_eq!(
        spec.algorithm.sft,
        Schedule::Linear {
            from: 0.5,
            to: 0.0,
            over: 200
        }
    );
    assert_eq!(spec.pool.refresh_every, 25);
    assert_eq!(
        spec.train.warmup.map(|w| w.lr),
        Some(Schedule::Constant(1e-3))
    );
    let sweep = spec.into_inner().sweep.expect("sweep");
    assert_eq!(sweep.seeds, vec![1, 2, 3]);
    assert_eq!(sweep.ablations.len(), 2);
    assert_eq!(sweep.ablations[0].path, "pool.cross_policy");
    assert_eq!(sweep.ablations[0].value, "0");
    assert_eq!(sweep.ablations[0].experiment.pool.cross_policy, 0.0);
    assert_eq!(sweep.ablations[0].experiment.sweep, None);
    assert_eq!(
        sweep.ablations[1].experiment.algorithm.advantage_norm,
        AdvantageNorm::Batch
    );
}

#[test]
fn max_nonfinite_skips_is_at_least_one() {
    let spec = check(&with("batch = 16", "batch = 16, max_nonfinite_skips = 1")).unwrap();
    assert_eq!(spec.train.max_nonfinite_skips, 1);
    let source = with("batch = 16", "batch = 16, max_nonfinite_skips = 0");
    let d = error(&source);
    assert_eq!(text(&source, &d), "0");
    assert!(d.message.contains("max_nonfinite_skips"), "{}", d.message);
}

#[test]
fn data_parallel_counts_replicas_from_one_to_256() {
    let spec = check(&with("batch = 16", "batch = 16")).unwrap();
    assert_eq!(spec.train.data_parallel, 1);
    let spec = check(&with("batch = 16", "batch = 16, data_parallel = 4")).unwrap();
    assert_eq!(spec.train.data_parallel, 4);
    for bad in ["0", "257", "2.5", "true"] {
        let source = with("batch = 16", &format!("batch = 16, data_parallel = {bad}"));
        let d = error(&source);
        assert_eq!(text(&source, &d), bad);
        assert!(d.message.contains("data_parallel"), "{}", d.message);
    }
}

#[test]
fn data_parallel_refuses_lora_dropout() {
    let source = with(
        "arch = transformer",
        "arch = transformer, finetune = lora { dropout = 0.1 }",
    )
    .replace("batch = 16", "batch = 16, data_parallel = 2");
    let d = error(&source);
    assert_eq!(text(&source, &d), "2");
    assert!(d.message.contains("dropout"), "{}", d.message);
    assert!(d.hint.unwrap().contains("dropout = 0"));
    let without = with("arch = transformer", "arch = transformer, finetune = lora")
        .replace("batch = 16", "batch = 16, data_parallel = 2");
    assert_eq!(check(&without).unwrap().train.data_parallel, 2);
}

#[test]
fn recompute_is_a_boolean() {
    let spec = check(&with("batch = 16", "batch = 16, recompute = true")).unwrap();
    assert!(spec.train.recompute);
    let source = with("batch = 16", "batch = 16, recompute = 1");
    let d = error(&source);
    assert_eq!(text(&source, &d), "1");
    assert!(d.message.contains("recompute"), "{}", d.message);
}

#[test]
fn defaults_are_the_documented_ones() {
    let spec = check(MINIMAL).unwrap();
    assert_eq!(spec.seed, 0);
    let Arch::Transformer(t) = &spec.model.arch else {
        panic!("transformer expected")
    };
    assert_eq!(
        (t.layers, t.d_model, t.heads, t.kv_heads, t.ffn, t.context),
        (2, 128, 4, 4, 512, 512)
    );
    assert_eq!((t.tie_embeddings, t.vocab), (true, 2048));
    assert_eq!(spec.tasks[0].max_turns, 15);
    assert_eq!(spec.tasks[0].weight, 1.0);
    assert_eq!(
        (spec.tasks[0].difficulty.min, spec.tasks[0].difficulty.max),
        (1, 3)
    );
    assert_eq!(spec.tasks[0].split, Split::Train);
    let a = &spec.algorithm;
    assert_eq!((a.clip.low, a.clip.high), (0.2, 0.2));
    assert_eq!(a.dual_clip, None);
    assert_eq!(a.kl.estimator, None);
    assert_eq!(a.advantage_norm, AdvantageNorm::Group);
    assert_eq!(a.sft, Schedule::Constant(0.0));
    assert_eq!(a.negative_weight, 1.0);
    assert_eq!(
        (a.gamma, a.lambda, a.epochs, a.grad_clip),
        (1.0, 0.95, 1, Some(1.0))
    );
    assert_eq!((a.value_clip, a.value_coef), (0.2, 1.0));
    assert_eq!(spec.pool.engines, 1);
    assert_eq!(spec.pool.mode, PoolMode::Sync);
    assert_eq!(spec.train.lr, 3e-4);
    assert_eq!(
        spec.train.optimizer,
        Optimizer::AdamW {
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999
        }
    );
    assert_eq!(
        (
            spec.train.temperature,
            spec.train.top_p,
            spec.train.max_new_tokens
        ),
        (1.0, 1.0, 64)
    );
    assert_eq!(spec.train.max_nonfinite_skips, 3);
    assert!(!spec.train.recompute);
    assert_eq!(spec.eval.episodes, 64);
    assert_eq!(spec.eval.decoding, EvalDecoding::Both);
    assert_eq!(spec.sweep, None);
}

#[test]
fn algorithm_dependent_defaults() {
    let spec = check(&with(
        "algorithm grpo { group_size = 4 }",
        "algorithm reinforce_pp {}",
    ))
    .unwrap();
    assert_eq!(spec.algorithm.group_size, 1);
    assert_eq!(spec.algorithm.advantage_norm, AdvantageNorm::Batch);
    let spec = check(&with("task kg { env = kg }", "task me { env = ::my::Env }")).unwrap();
    assert_eq!(spec.tasks[0].max_turns, 20);
}

#[test]
fn kl_as_reward_and_other_schedules() {
    let source = with(
        "group_size = 4",
        "group_size = 4, kl = k2(0.1, as = reward), sft = step(1 -> 0, at = 50), dual_clip = none",
    );
    let spec = check(&source).unwrap();
    assert_eq!(spec.algorithm.kl.placement, KlPlacement::Reward);
    assert_eq!(
        spec.algorithm.sft,
        Schedule::Step {
            from: 1.0,
            to: 0.0,
            at: 50
        }
    );
    let spec = check(&with(
        "group_size = 4",
        "group_size = 4, sft = 0.5, grad_clip = none, negative_weight = 0",
    ))
    .unwrap();
    assert_eq!(spec.algorithm.negative_weight, 0.0);
    assert_eq!(spec.algorithm.sft, Schedule::Constant(0.5));
    assert_eq!(spec.algorithm.grad_clip, None);
}

#[test]
fn unknown_key_suggests_the_closest() {
    let source = with("group_size = 4", "group_sise = 4");
    let d = error(&source);
    assert_eq!(d.message, "unknown key `group_sise` in `algorithm`");
    assert_eq!(d.label, "unknown key");
    assert_eq!(at(&source, &d), "4:22");
    assert_eq!(text(&source, &d), "group_sise");
    assert_eq!(d.hint.as_deref(), Some("did you mean `group_size`?"));
}

#[test]
fn unknown_key_without_a_close_match_lists_the_keys() {
    let d = error(&with("steps = 100,", "steps = 100, colour = 3,"));
    assert_eq!(d.message, "unknown key `colour` in `train`");
    assert!(
        d.hint
            .unwrap()
            .starts_with("the keys of `train` are `steps`")
    );
}

#[test]
fn unknown_block_suggests_the_closest() {
    let source = with("train {", "trian {");
    let errs = errors(&source);
    assert_eq!(errs[0].message, "missing `train` block");
    assert_eq!(errs[1].message, "unknown block `trian`");
    assert_eq!(errs[1].hint.as_deref(), Some("did you mean `train`?"));
}

#[test]
fn wrong_type_says_what_was_expected() {
    let source = with("group_size = 4", "group_size = \"4\"");
    let d = error(&source);
    assert_eq!(
        d.message,
        "expected an integer for `group_size`, found a string"
    );
    assert_eq!(d.label, "expected an integer");
    assert_eq!(
        d.hint.as_deref(),
        Some("remove the quotes: `group_size = 4`")
    );
    assert_eq!(at(&source, &d), "4:35");
}

#[test]
fn a_float_where_an_integer_is_expected() {
    let d = error(&with("steps = 100", "steps = 100.0"));
    assert_eq!(
        d.message,
        "expected an integer for `steps`, found the number `100.0`"
    );
    assert_eq!(
        d.hint.as_deref(),
        Some("write `steps = 100` without a decimal point")
    );
}

#[test]
fn unknown_choice_suggests_the_closest() {
    let d = error(&MINIMAL.replace("experiment tiny {", "experiment tiny {\n    device = cdua"));
    assert_eq!(d.message, "unknown value `cdua` for `device`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `cuda`?"));
}

#[test]
fn matmul_precision_is_highest_unless_the_file_says_medium() {
    assert_eq!(
        check(MINIMAL).unwrap().into_inner().matmul_precision,
        MatmulPrecision::Highest
    );
    let source = MINIMAL.replace(
        "experiment tiny {",
        "experiment tiny {\n    matmul_precision = medium",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    assert_eq!(spec.into_inner().matmul_precision, MatmulPrecision::Medium);
    let source = MINIMAL.replace(
        "experiment tiny {",
        "experiment tiny {\n    matmul_precision = high",
    );
    let d = error(&source);
    assert_eq!(d.message, "unknown value `high` for `matmul_precision`");
    assert_eq!(text(&source, &d), "high");
    assert!(d.hint.unwrap().contains("medium"));
}

#[test]
fn matmul_precision_can_be_ablated() {
    let source = with(
        "train {",
        "sweep { ablate matmul_precision = medium }\n    train {",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    let spec = spec.into_inner();
    assert_eq!(spec.matmul_precision, MatmulPrecision::Highest);
    let ablations = spec.sweep.unwrap().ablations;
    assert_eq!(
        ablations[0].experiment.matmul_precision,
        MatmulPrecision::Medium
    );
    let d = error(&with(
        "train {",
        "sweep { ablate matmul_precision.x = medium }\n    train {",
    ));
    assert_eq!(d.message, "`matmul_precision` has no keys inside it");
}

#[test]
fn out_of_range_group_size_for_grpo() {
    let source = with("group_size = 4", "group_size = 1");
    let d = error(&source);
    assert_eq!(d.message, "`group_size` must be at least 2 for grpo");
    assert_eq!(text(&source, &d), "1");
    assert!(d.hint.unwrap().contains("nothing to compare"));
}

#[test]
fn out_of_range_numbers_state_the_interval() {
    let d = error(&with("group_size = 4", "group_size = 4, gamma = 1.5"));
    assert_eq!(d.message, "`gamma` must be in (0, 1]");
    assert_eq!(d.hint.as_deref(), Some("got 1.5"));
    let d = error(&with(
        "group_size = 4",
        "group_size = 4, negative_weight = -0.5",
    ));
    assert_eq!(d.message, "`negative_weight` must be in [0, 1]");
}

/// `steps = 0` is a run with no RL step: an evaluation of the model as declared, or a warm-up
/// alone. No curriculum stage is reached, so none can end after training.
#[test]
fn zero_steps_evaluate_only() {
    let spec = check(&with("steps = 100", "steps = 0")).unwrap();
    assert_eq!(spec.train.steps, 0);
    let source = with(
        "train {",
        "curriculum { stage a { until = 50 }, stage b {} }\n    train {",
    )
    .replace("steps = 100", "steps = 0");
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    assert_eq!(spec.train.steps, 0);
}

#[test]
fn integer_overflow_is_an_error_not_a_panic() {
    let source = MINIMAL.replace(
        "experiment tiny {",
        "experiment tiny {\n    seed = 99999999999999999999999",
    );
    let d = error(&source);
    assert_eq!(d.message, "`seed` must be at most 18446744073709551615");
    assert_eq!(at(&source, &d), "2:12");
    let d = error(&with("steps = 100", "steps = 1e999"));
    assert!(
        d.message.starts_with("expected an integer for `steps`"),
        "{}",
        d.message
    );
}

#[test]
fn duplicate_key() {
    let source = with("steps = 100,", "steps = 100, steps = 200,");
    let d = error(&source);
    assert_eq!(d.message, "`steps` is set twice in `train`");
    assert_eq!(at(&source, &d), "5:26");
}

#[test]
fn duplicate_block() {
    let source = with("train {", "train { steps = 5 }\n    train {");
    let d = error(&source);
    assert_eq!(d.message, "duplicate `train` block");
    assert_eq!(at(&source, &d), "6:5");
}

#[test]
fn duplicate_task_and_stage_names() {
    let source = with(
        "task kg { env = kg }",
        "task kg { env = kg }\n    task kg { env = db }",
    );
    let d = error(&source);
    assert_eq!(d.message, "duplicate task `kg`");
    assert_eq!(at(&source, &d), "4:10");
    let source = with(
        "train {",
        "curriculum { stage a { until = 10 }, stage a { until = 20 } }\n    train {",
    );
    let d = error(&source);
    assert_eq!(d.message, "duplicate stage `a`");
}

#[test]
fn missing_required_items() {
    let source = "experiment empty {\n}\n";
    let messages: Vec<String> = errors(source).into_iter().map(|d| d.message).collect();
    assert_eq!(
        messages,
        [
            "missing `model` block",
            "no `task` declared",
            "missing `algorithm` block",
            "missing `train` block"
        ]
    );
    let d = error(&with("steps = 100, ", ""));
    assert_eq!(d.message, "missing `steps` in `train`");
    assert!(d.hint.unwrap().contains("steps = 500"));
}

#[test]
fn missing_env() {
    let d = error(&with("task kg { env = kg }", "task kg { weight = 2 }"));
    assert_eq!(d.message, "task `kg` has no `env`");
    assert!(d.hint.unwrap().starts_with("add `env = kg`"));
}

#[test]
fn unknown_environment() {
    let d = error(&with("env = kg", "env = webshp"));
    assert_eq!(d.message, "unknown environment `webshp`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `webshop`?"));
    let d = error(&with("env = kg", "env = maze"));
    assert!(d.hint.unwrap().contains("crate::envs::Maze"));
}

#[test]
fn stage_names_an_undeclared_task() {
    let source = with(
        "train {",
        "curriculum { stage a { tasks = [kb] } }\n    train {",
    );
    let d = error(&source);
    assert_eq!(d.message, "stage `a` names undeclared task `kb`");
    assert_eq!(text(&source, &d), "kb");
    assert_eq!(d.hint.as_deref(), Some("did you mean `kg`?"));
}

#[test]
fn until_must_increase() {
    let source = with(
        "train {",
        "curriculum {\n        stage a { until = 50 }\n        stage b { until = 50 }\n    }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "`until` must increase from stage to stage, but stage `b` ends at 50"
    );
    assert_eq!(at(&source, &d), "7:27");
    assert_eq!(d.label, "not after 50");
}

#[test]
fn until_missing_on_a_non_last_stage() {
    let source = with(
        "train {",
        "curriculum { stage a { max_turns = 3 }, stage b { } }\n    train {",
    );
    let d = error(&source);
    assert_eq!(d.message, "stage `a` has no `until`");
    assert_eq!(text(&source, &d), "a");
}

#[test]
fn until_beyond_training() {
    let source = with(
        "train {",
        "curriculum { stage a { until = 150 }, stage b {} }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "stage `a` ends at step 150, after training ends (`steps = 100`)"
    );
    assert_eq!(text(&source, &d), "150");
}

#[test]
fn ppo_needs_a_value_head() {
    let source = with("algorithm grpo { group_size = 4 }", "algorithm ppo {}");
    let d = error(&source);
    assert_eq!(d.message, "PPO needs a value head");
    assert_eq!(text(&source, &d), "ppo");
    assert_eq!(
        d.hint.as_deref(),
        Some("add `value_head = shared` (or `separate`) to `model policy`")
    );
    let ok = source.replace(
        "arch = transformer",
        "arch = transformer, value_head = shared",
    );
    assert!(check(&ok).is_ok());
}

/// `MINIMAL` as a PPO experiment with a value head, its algorithm block holding `keys`.
fn ppo(value_head: &str, keys: &str) -> String {
    MINIMAL
        .replace(
            "arch = transformer",
            &format!("arch = transformer, value_head = {value_head}"),
        )
        .replace(
            "algorithm grpo { group_size = 4 }",
            &format!("algorithm ppo {{ {keys} }}"),
        )
}

#[test]
fn value_clip_and_value_coef_are_checked_numbers() {
    let spec = check(&ppo("shared", "value_clip = 0.5, value_coef = 0.25")).unwrap();
    assert_eq!(
        (spec.algorithm.value_clip, spec.algorithm.value_coef),
        (0.5, 0.25)
    );
    let spec = check(&ppo("shared", "value_coef = 0")).unwrap();
    assert_eq!(spec.algorithm.value_coef, 0.0);

    let d = error(&ppo("shared", "value_clip = 0"));
    assert_eq!(d.message, "`value_clip` must be greater than 0");
    let d = error(&ppo("shared", "value_coef = -1"));
    assert_eq!(d.message, "`value_coef` must be at least 0");
    let source = ppo("shared", "value_clip = \"0.2\"");
    let d = error(&source);
    assert!(d.message.contains("`value_clip`"), "{}", d.message);
    assert_eq!(text(&source, &d), "\"0.2\"");
}

#[test]
fn value_keys_are_ppo_only() {
    let source = with("group_size = 4", "group_size = 4, value_clip = 0.2");
    let d = error(&source);
    assert_eq!(d.message, "`value_clip` is only used by PPO");
    assert_eq!(text(&source, &d), "0.2");
    assert!(d.hint.unwrap().contains("algorithm ppo"));
    let d = error(&with("group_size = 4", "group_size = 4, value_coef = 1"));
    assert_eq!(d.message, "`value_coef` is only used by PPO");
}

#[test]
fn value_coef_is_an_error_with_a_separate_critic() {
    let source = ppo("separate", "value_coef = 0.5");
    let d = error(&source);
    assert_eq!(
        d.message,
        "`value_coef` does not apply to a separate critic"
    );
    assert_eq!(text(&source, &d), "0.5");
    assert!(d.hint.unwrap().contains("its own optimizer"));
    let spec = check(&ppo("separate", "value_clip = 0.1")).unwrap();
    assert_eq!(spec.algorithm.value_clip, 0.1);
}

#[test]
fn clip_rules() {
    let d = error(&with("group_size = 4", "group_size = 4, clip = 0.3 .. 0.2"));
    assert_eq!(d.message, "`clip` low (0.3) is above high (0.2)");
    assert!(d.hint.unwrap().contains("clip = 0.2 .. 0.3"));
    let d = error(&with("group_size = 4", "group_size = 4, clip = 1.2"));
    assert_eq!(d.message, "`clip` must be in (0, 1)");
    let d = error(&with("group_size = 4", "group_size = 4, clip = 0 .. 0.2"));
    assert_eq!(d.message, "`clip` must be in (0, 1)");
}

#[test]
fn batch_must_be_a_multiple_of_group_size() {
    let source = with("batch = 16", "batch = 18");
    let d = error(&source);
    assert_eq!(
        d.message,
        "`batch` (18) must be a multiple of `group_size` (4)"
    );
    assert_eq!(text(&source, &d), "18");
    assert_eq!(
        d.hint.as_deref(),
        Some("a batch holds whole groups; try `batch = 16`")
    );
}

#[test]
fn stale_must_leave_a_fresh_engine() {
    let source = with("train {", "pool { engines = 2, stale = 2 }\n    train {");
    let d = error(&source);
    assert_eq!(d.message, "`stale` (2) must be less than `engines` (2)");
    assert_eq!(text(&source, &d), "2");
}

#[test]
fn cross_policy_needs_a_stale_engine() {
    let source = with(
        "train {",
        "pool { engines = 2, cross_policy = 0.5 }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "`cross_policy = 0.5` needs at least one stale engine"
    );
    assert!(d.hint.unwrap().contains("stale = 1 { refresh_every = 25 }"));
}

#[test]
fn refresh_every_must_be_positive() {
    let source = with(
        "train {",
        "pool { engines = 2, stale = 1 { refresh_every = 0 } }\n    train {",
    );
    let d = error(&source);
    assert_eq!(d.message, "`refresh_every` must be at least 1");
    assert!(d.hint.is_some());
}

#[test]
fn max_staleness_covers_refresh_every() {
    let source = with(
        "train {",
        "pool {\n        engines = 2, stale = 1 { refresh_every = 10 }, cross_policy = 0.2, max_staleness = 3\n    }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "`max_staleness` (3) is below `refresh_every` (10)"
    );
    assert_eq!(at(&source, &d), "6:92");
    assert!(d.hint.unwrap().contains("max_staleness = 10"));
}

#[test]
fn placement_defaults_to_colocated_and_takes_devices() {
    let spec = check(MINIMAL).unwrap();
    assert_eq!(spec.pool.placement, Placement::Colocated);
    let source = with(
        "train {",
        "pool { engines = 3, mode = async, placement = disaggregated { devices = [1, 2] } }\n    train {",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("p.arl", &source)));
    assert_eq!(
        spec.pool.placement,
        Placement::Disaggregated {
            devices: vec![1, 2]
        }
    );
}

#[test]
fn disaggregated_placement_needs_async_mode() {
    let source = with(
        "train {",
        "pool { placement = disaggregated { devices = [1] } }\n    train {",
    );
    let d = error(&source);
    assert_eq!(d.message, "disaggregated engines need `mode = async`");
    assert!(text(&source, &d).starts_with("disaggregated"));
    assert!(d.hint.unwrap().contains("mode = async"));
}

#[test]
fn interrupt_defaults_to_turn_and_takes_never_turn_token() {
    let spec = check(MINIMAL).unwrap();
    assert_eq!(spec.pool.interrupt, Interrupt::Turn);
    for (name, interrupt) in [
        ("never", Interrupt::Never),
        ("turn", Interrupt::Turn),
        ("token", Interrupt::Token),
    ] {
        let source = with(
            "train {",
            &format!("pool {{ mode = async, interrupt = {name} }}\n    train {{"),
        );
        let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("p.arl", &source)));
        assert_eq!(spec.pool.interrupt, interrupt);
    }
    let source = with(
        "train {",
        "pool { mode = async, interrupt = tokens }\n    train {",
    );
    let d = error(&source);
    assert_eq!(text(&source, &d), "tokens");
    assert_eq!(d.hint.as_deref(), Some("did you mean `token`?"));
}

#[test]
fn env_workers_default_to_the_cores_and_are_bounded() {
    assert_eq!(check(MINIMAL).unwrap().pool.env_workers, None);
    let source = with("train {", "pool { env_workers = 64 }\n    train {");
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("p.arl", &source)));
    assert_eq!(spec.pool.env_workers, Some(64));
    for bad in ["0", "5000", "2.5"] {
        let source = with(
            "train {",
            &format!("pool {{ env_workers = {bad} }}\n    train {{"),
        );
        let d = error(&source);
        assert_eq!(text(&source, &d), bad);
        assert!(d.message.contains("env_workers"), "{}", d.message);
    }
}

#[test]
fn interrupt_needs_async_mode() {
    let source = with("train {", "pool { interrupt = token }\n    train {");
    let d = error(&source);
    assert_eq!(d.message, "`interrupt = token` needs `mode = async`");
    assert_eq!(text(&source, &d), "token");
    assert!(d.hint.unwrap().contains("mode = async"));
}

#[test]
fn placement_devices_are_checked() {
    let bad = [
        ("disaggregated", "`disaggregated` needs `devices`"),
        ("disaggregated { }", "`disaggregated` needs `devices`"),
        ("disaggregated { devices = [] }", "`devices` is empty"),
        (
            "disaggregated { devices = [1, 1] }",
            "device 1 is listed twice",
        ),
        (
            "disaggregated { devices = [70000] }",
            "`devices` must be at most 65535",
        ),
        ("disaggregated { devices = 1 }", "`devices`"),
        ("colocated { devices = [1] }", "`colocated` takes no block"),
        ("disagregated", "unknown placement `disagregated`"),
    ];
    for (placement, message) in bad {
        let source = with(
            "train {",
            &format!("pool {{ mode = async, placement = {placement} }}\n    train {{"),
        );
        let d = error(&source);
        assert!(
            d.message.contains(message),
            "{placement}: {} does not contain {message}",
            d.message
        );
    }
    let source = with(
        "train {",
        "pool { mode = async, placement = disagregated }\n    train {",
    );
    assert_eq!(
        error(&source).hint.as_deref(),
        Some("did you mean `disaggregated`?")
    );
}

#[test]
fn d_model_must_divide_into_heads() {
    let source = with(
        "arch = transformer",
        "arch = transformer { d_model = 130, heads = 4 }",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "`d_model` (130) must be a multiple of `heads` (4)"
    );
    assert_eq!(text(&source, &d), "130");
    assert!(d.hint.unwrap().contains("d_model = 128"));
}

#[test]
fn vocab_holds_the_specials_and_bytes_and_more() {
    let spec = check(&with(
        "arch = transformer",
        "arch = transformer { vocab = 8192 }",
    ))
    .unwrap();
    let Arch::Transformer(t) = &spec.model.arch else {
        panic!("transformer expected")
    };
    assert_eq!(t.vocab, 8192);
    let source = with("arch = transformer", "arch = transformer { vocab = 300 }");
    let d = error(&source);
    assert_eq!(text(&source, &d), "300");
    assert!(
        d.message.contains("`vocab`") && d.message.contains("512"),
        "{}",
        d.message
    );
}

/// A warm-up as experiments and checkpoints recorded before `lr` schedules and `instances`
/// existed hold it.
const RECORDED_WARMUP: &str = r#"{"steps":10,"lr":0.006,"demonstrations":8,"batch":2}"#;

/// `MINIMAL` training at `lr = 2e-3` after `warmup = sft { <sft> }`.
fn warmup(sft: &str) -> String {
    with(
        "train { steps = 100, batch = 16 }",
        &format!("train {{ steps = 100, batch = 16, lr = 2e-3, warmup = sft {{ {sft} }} }}"),
    )
}

#[test]
fn the_warmup_lr_is_the_training_lr_a_number_or_a_schedule_above_zero() {
    let lr = |source: &str| check(source).unwrap().train.warmup.unwrap().lr;
    assert_eq!(lr(&warmup("steps = 10")), Schedule::Constant(2e-3));
    assert_eq!(
        lr(&warmup("steps = 10, lr = 6e-3")),
        Schedule::Constant(6e-3)
    );
    assert_eq!(
        lr(&warmup("steps = 10, lr = cosine(3e-3 -> 3e-4, over = 10)")),
        Schedule::Cosine {
            from: 3e-3,
            to: 3e-4,
            over: 10
        }
    );
    // A learning rate of zero anywhere in the schedule is refused, with a schedule that is not.
    let source = warmup("steps = 10, lr = linear(3e-3 -> 0.0, over = 10)");
    let d = error(&source);
    assert_eq!(text(&source, &d), "0.0");
    assert!(d.message.contains("`lr`"), "{}", d.message);
    let source = warmup("steps = 10, lr = linear(3e-3, over = 10)");
    assert_eq!(
        error(&source).hint.as_deref(),
        Some("write `lr = linear(3e-3 -> 3e-4, over = 200)`")
    );
    // Experiments recorded before (`experiment.json`, checkpoints) hold a bare number.
    let old: Warmup = serde_json::from_str(RECORDED_WARMUP).unwrap();
    assert_eq!(old.lr, Schedule::Constant(0.006));
    let scheduled = lr(&warmup("steps = 10, lr = step(3e-3 -> 3e-4, at = 5)"));
    let json = serde_json::to_string(&scheduled).unwrap();
    assert_eq!(serde_json::from_str::<Schedule>(&json).unwrap(), scheduled);
}

#[test]
fn warmup_instances_caps_the_demonstrations_instances_at_one_or_more() {
    let instances = |source: &str| check(source).unwrap().train.warmup.unwrap().instances;
    assert_eq!(instances(&warmup("steps = 10")), None);
    assert_eq!(instances(&warmup("steps = 10, instances = 200")), Some(200));
    let source = warmup("steps = 10, instances = 0");
    let d = error(&source);
    assert_eq!(text(&source, &d), "0");
    assert!(d.message.contains("`instances`"), "{}", d.message);
    let source = warmup("steps = 10, instance = 200");
    let d = error(&source);
    assert_eq!(text(&source, &d), "instance");
    assert!(
        d.hint.as_deref().unwrap_or("").contains("instances"),
        "{d:?}"
    );
    // Recorded without the key (before it existed, or uncapped): uncapped, and written back
    // without it, so `--warmup-from` matches warm-ups recorded before.
    let old: Warmup = serde_json::from_str(RECORDED_WARMUP).unwrap();
    assert_eq!(old.instances, None);
    let json = serde_json::to_string(&old).unwrap();
    assert!(!json.contains("instances"), "{json}");
    let capped = Warmup {
        instances: Some(200),
        ..old
    };
    let json = serde_json::to_string(&capped).unwrap();
    assert!(json.ends_with(r#""instances":200}"#), "{json}");
    assert_eq!(serde_json::from_str::<Warmup>(&json).unwrap(), capped);
}

#[test]
fn heads_must_be_a_multiple_of_kv_heads() {
    let d = error(&with(
        "arch = transformer",
        "arch = transformer { heads = 4, kv_heads = 3 }",
    ));
    assert_eq!(
        d.message,
        "`heads` (4) must be a multiple of `kv_heads` (3)"
    );
}

#[test]
fn difficulty_rules() {
    let source = with("env = kg", "env = kg, difficulty = 0 .. 2");
    let d = error(&source);
    assert_eq!(d.message, "difficulty level 0 does not exist");
    assert_eq!(text(&source, &d), "0");
    let d = error(&with("env = kg", "env = kg, difficulty = 3 .. 1"));
    assert_eq!(d.message, "difficulty range `3 .. 1` is reversed");
    assert_eq!(d.hint.as_deref(), Some("write `difficulty = 1 .. 3`"));
}

#[test]
fn task_split() {
    let spec = check(&with("env = kg", "env = kg, split = test")).unwrap();
    assert_eq!(spec.tasks[0].split, Split::Test);
    let source = with("env = kg", "env = kg, split = dev");
    let d = error(&source);
    assert_eq!(d.message, "unknown value `dev` for `split`");
    assert_eq!(text(&source, &d), "dev");
    let d = error(&with("env = kg", "env = kg, split = 1"));
    assert!(d.message.contains("split"), "{}", d.message);
}

#[test]
fn ablation_must_name_an_existing_key() {
    let source = with(
        "train {",
        "sweep { ablate pool.cross_polcy = 0 }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "with `ablate pool.cross_polcy = 0`: unknown key `cross_polcy` in `pool`"
    );
    assert_eq!(text(&source, &d), "cross_polcy");
    assert_eq!(d.hint.as_deref(), Some("did you mean `cross_policy`?"));
    let d = error(&with(
        "train {",
        "sweep { ablate algo.gamma = 0.9 }\n    train {",
    ));
    assert_eq!(d.message, "unknown ablation target `algo`");
    let d = error(&with(
        "train {",
        "sweep { ablate task.kb.weight = 2 }\n    train {",
    ));
    assert_eq!(d.message, "no task `kb` to ablate");
    assert_eq!(d.hint.as_deref(), Some("did you mean `kg`?"));
}

#[test]
fn ablated_experiment_must_check() {
    let source = with(
        "train {",
        "sweep { ablate algorithm.group_size = 3 }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "with `ablate algorithm.group_size = 3`: `batch` (16) must be a multiple of `group_size` (3)"
    );
    assert_eq!(at(&source, &d), "5:13");
}

#[test]
fn ablations_reach_nested_and_default_keys() {
    let source = with(
        "train {",
        "sweep { seeds = [4], ablate model.arch.layers = 4, ablate train.optimizer.weight_decay = 0, ablate task.kg.weight = 2, ablate eval.decoding = sampled }\n    train {",
    );
    let source = source.replace("batch = 16", "batch = 16, optimizer = adamw");
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    let ablations = spec.into_inner().sweep.unwrap().ablations;
    let Arch::Transformer(t) = &ablations[0].experiment.model.arch else {
        panic!()
    };
    assert_eq!(t.layers, 4);
    assert!(matches!(
        ablations[1].experiment.train.optimizer,
        Optimizer::AdamW {
            weight_decay: 0.0,
            ..
        }
    ));
    assert_eq!(ablations[2].experiment.tasks[0].weight, 2.0);
    assert_eq!(ablations[3].experiment.eval.decoding, EvalDecoding::Sampled);
}

#[test]
fn kl_needs_a_coefficient_and_a_known_estimator() {
    let d = error(&with("group_size = 4", "group_size = 4, kl = k3"));
    assert_eq!(d.message, "`k3` needs a coefficient");
    let d = error(&with("group_size = 4", "group_size = 4, kl = low_var(0.1)"));
    assert_eq!(d.message, "unknown KL estimator `low_var`");
    let d = error(&with(
        "group_size = 4",
        "group_size = 4, kl = k1(0.1, at = reward)",
    ));
    assert_eq!(d.message, "unknown argument `at` to `k1`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `as`?"));
}

#[test]
fn schedules_need_their_arguments() {
    let d = error(&with(
        "group_size = 4",
        "group_size = 4, sft = linear(0.5 -> 0)",
    ));
    assert_eq!(d.message, "`linear` needs `over = STEPS`");
    let d = error(&with(
        "group_size = 4",
        "group_size = 4, sft = cosin(1 -> 0, over = 5)",
    ));
    assert_eq!(d.hint.as_deref(), Some("did you mean `cosine`?"));
}

#[test]
fn unknown_escape_is_reported_with_other_errors() {
    let source = with(
        "arch = transformer",
        "arch = qwen2 { weights = \"a\\qb\" }, colour = 1",
    );
    let errs = errors(&source);
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert_eq!(errs[0].message, "unknown escape `\\q` in string");
    assert_eq!(text(&source, &errs[0]), "\\q");
    assert_eq!(errs[1].message, "unknown key `colour` in `model`");
}

#[test]
fn every_mistake_of_a_file_is_reported() {
    let source = "experiment bad {
    model policy { arch = transformer { d_model = 130 } }
    task kg { env = kgg }
    algorithm grpo { group_sise = 8, clip = 0.3 .. 0.2 }
    pool { engines = 1, stale = 1 }
    train { batch = 32 }
    eval { decoding = yes }
}
";
    let messages: Vec<String> = errors(source).into_iter().map(|d| d.message).collect();
    assert_eq!(
        messages,
        [
            "`d_model` (130) must be a multiple of `heads` (4)",
            "unknown environment `kgg`",
            "unknown key `group_sise` in `algorithm`",
            "`clip` low (0.3) is above high (0.2)",
            "`stale` (1) must be less than `engines` (1)",
            "missing `steps` in `train`",
            "unknown value `yes` for `decoding`",
        ]
    );
}

#[test]
fn top_k_is_none_by_default_a_positive_integer_or_none() {
    let spec = check(MINIMAL).unwrap();
    assert_eq!((spec.train.top_k, spec.train.stop.len()), (None, 0));
    let spec = check(&with("steps = 100", "steps = 100, top_k = 40")).unwrap();
    assert_eq!(spec.train.top_k, Some(40));
    let spec = check(&with("steps = 100", "steps = 100, top_k = none")).unwrap();
    assert_eq!(spec.train.top_k, None);
    let source = with("steps = 100", "steps = 100, top_k = 0");
    let d = error(&source);
    assert_eq!(d.message, "`top_k` must be at least 1");
    assert_eq!(text(&source, &d), "0");
    assert!(d.hint.unwrap().contains("`top_k = none`"));
    let d = error(&with("steps = 100", "steps = 100, top_k = 0.5"));
    assert_eq!(
        d.message,
        "expected an integer for `top_k`, found the number `0.5`"
    );
}

#[test]
fn stop_is_a_list_of_distinct_non_empty_strings() {
    let spec = check(&with("steps = 100", r#"steps = 100, stop = [")", "\n\n"]"#)).unwrap();
    assert_eq!(spec.train.stop, [")", "\n\n"]);
    let source = with("steps = 100", r#"steps = 100, stop = ")""#);
    let d = error(&source);
    assert_eq!(
        d.message,
        "expected a list of strings for `stop`, found a string"
    );
    assert_eq!(d.hint.as_deref(), Some(r#"write a list: `stop = [")"]`"#));
    // Every bad item is reported, each at its own place.
    let source = with("steps = 100", r#"steps = 100, stop = ["", 3, "x", "x"]"#);
    let errs = errors(&source);
    let messages: Vec<&str> = errs.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(
        messages,
        [
            "a stop string is empty",
            "expected a string for `stop`, found the integer `3`",
            "stop string \"x\" is listed twice"
        ]
    );
    assert_eq!(text(&source, &errs[2]), r#""x""#);
}

#[test]
fn dr_grpo_and_reinforce_pp_baseline_are_grouped_estimators_with_their_defaults() {
    let spec = check(&with("algorithm grpo", "algorithm dr_grpo")).unwrap();
    assert_eq!(spec.algorithm.kind, AlgorithmKind::DrGrpo);
    // Dr. GRPO drops both the std division and the length normalization.
    assert_eq!(spec.algorithm.advantage_norm, AdvantageNorm::None);
    assert_eq!(spec.algorithm.aggregation, Aggregation::SeqMeanTokenSum);
    let spec = check(&with("algorithm grpo", "algorithm reinforce_pp_baseline")).unwrap();
    assert_eq!(spec.algorithm.advantage_norm, AdvantageNorm::Batch);
    assert_eq!(spec.algorithm.aggregation, Aggregation::TokenMean);

    for kind in ["dr_grpo", "reinforce_pp_baseline"] {
        let source = with("algorithm grpo", &format!("algorithm {kind}")).replacen(
            "group_size = 4",
            "group_size = 1",
            1,
        );
        let d = error(&source);
        assert_eq!(
            d.message,
            format!("`group_size` must be at least 2 for {kind}")
        );
    }
}

#[test]
fn dr_grpo_refuses_group_normalization() {
    let source = with("algorithm grpo", "algorithm dr_grpo").replacen(
        "group_size = 4",
        "group_size = 4, advantage_norm = group",
        1,
    );
    let d = error(&source);
    assert_eq!(d.message, "`advantage_norm = group` undoes Dr. GRPO");
    assert_eq!(text(&source, &d), "group");
    assert!(d.hint.unwrap().contains("algorithm grpo"));
    let source = with("algorithm grpo", "algorithm dr_grpo").replacen(
        "group_size = 4",
        "group_size = 4, advantage_norm = per_task",
        1,
    );
    assert_eq!(
        check(&source).unwrap().algorithm.advantage_norm,
        AdvantageNorm::PerTask
    );
}

#[test]
fn sft_from_and_is_cap_are_checked() {
    let spec = check(&with("group_size = 4", "group_size = 4, sft = 0.1")).unwrap();
    assert_eq!(spec.algorithm.sft_from, SftSource::Oracle);
    assert_eq!(spec.algorithm.is_cap, None);
    let spec = check(&with(
        "group_size = 4",
        "group_size = 4, sft = 0.1, sft_from = successes, is_cap = 2",
    ))
    .unwrap();
    assert_eq!(spec.algorithm.sft_from, SftSource::Successes { keep: 256 });
    assert_eq!(spec.algorithm.is_cap, Some(2.0));
    let spec = check(&with(
        "group_size = 4",
        "group_size = 4, sft_from = successes(keep = 32), is_cap = none",
    ))
    .unwrap();
    assert_eq!(spec.algorithm.sft_from, SftSource::Successes { keep: 32 });

    let source = with("group_size = 4", "group_size = 4, sft_from = sucesses");
    let d = error(&source);
    assert_eq!(d.message, "unknown SFT source `sucesses`");
    assert_eq!(text(&source, &d), "sucesses");
    assert_eq!(d.hint.as_deref(), Some("did you mean `successes`?"));
    let d = error(&with(
        "group_size = 4",
        "group_size = 4, sft_from = successes(keep = 0)",
    ));
    assert_eq!(d.message, "`keep` must be at least 1");
    let d = error(&with("group_size = 4", "group_size = 4, sft_from = 3"));
    assert!(d.message.contains("`sft_from`"), "{}", d.message);
    let source = with("group_size = 4", "group_size = 4, is_cap = 0.5");
    let d = error(&source);
    assert_eq!(d.message, "`is_cap` must be at least 1");
    assert_eq!(text(&source, &d), "0.5");
}

#[test]
fn credit_is_outcome_or_turn() {
    let spec = check(MINIMAL).unwrap();
    assert_eq!(spec.algorithm.credit, Credit::Outcome);
    let spec = check(&with(
        "group_size = 4",
        "group_size = 4, credit = turn, gamma = 0.9",
    ))
    .unwrap();
    assert_eq!(spec.algorithm.credit, Credit::Turn);
    let source = with("group_size = 4", "group_size = 4, credit = turns");
    let d = error(&source);
    assert_eq!(d.message, "unknown value `turns` for `credit`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `turn`?"));
}

#[test]
fn monte_carlo_credit_is_checked() {
    let rpp = |credit: &str| {
        with("algorithm grpo", "algorithm reinforce_pp").replacen(
            "group_size = 4",
            &format!("group_size = 4, credit = {credit}"),
            1,
        )
    };
    let spec = check(&rpp("monte_carlo(k = 4, turns = 1 .. 3)")).unwrap();
    let credit = spec.algorithm.credit;
    assert_eq!(
        credit,
        Credit::MonteCarlo {
            k: 4,
            first: 1,
            last: Some(3)
        }
    );
    assert_eq!(credit.boundaries(10), [1, 2, 3]);
    assert_eq!(credit.boundaries(3), [1, 2]);
    let spec = check(&rpp("monte_carlo(k = 2)")).unwrap();
    assert_eq!(spec.algorithm.credit.boundaries(4), [0, 1, 2, 3]);
    let spec = check(&rpp("monte_carlo(k = 2, turns = 2)")).unwrap();
    assert_eq!(spec.algorithm.credit.boundaries(4), [2]);

    let d = error(&rpp("monte_carlo(turns = 0 .. 2)"));
    assert_eq!(d.message, "`monte_carlo` needs `k`");
    let d = error(&rpp("monte_carlo(k = 0)"));
    assert_eq!(d.message, "`k` must be at least 1");
    let source = rpp("monte_carlo(k = 2, turns = 3 .. 1)");
    let d = error(&source);
    assert_eq!(d.message, "`turns` range `3 .. 1` is reversed");
    assert_eq!(text(&source, &d), "3 .. 1");
    let d = error(&rpp("monte_carlo(k = 2, n = 3)"));
    assert!(d.message.contains("`n`"), "{}", d.message);
    let source = rpp("monte_karlo(k = 2)");
    let d = error(&source);
    assert_eq!(d.message, "unknown credit `monte_karlo`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `monte_carlo`?"));
    // The estimates are the baseline: with a group estimator it would be subtracted twice.
    let source = with(
        "group_size = 4",
        "group_size = 4, credit = monte_carlo(k = 2)",
    );
    let d = error(&source);
    assert_eq!(d.message, "Monte-Carlo credit does not combine with grpo");
    assert!(d.hint.unwrap().contains("reinforce_pp"));
}

#[test]
fn combinations_that_cannot_work_are_errors() {
    let rpp = |keys: &str| {
        with("algorithm grpo", "algorithm reinforce_pp").replacen(
            "group_size = 4",
            &format!("group_size = 1, {keys}"),
            1,
        )
    };
    let source = rpp("advantage_norm = group");
    let d = error(&source);
    assert_eq!(d.message, "`advantage_norm = group` needs groups");
    assert_eq!(text(&source, &d), "group");
    let source = rpp("filter = reward_std(keep = 0.5)");
    let d = error(&source);
    assert_eq!(d.message, "`filter = reward_std(...)` needs groups");
    assert!(d.hint.unwrap().contains("group_size"));
    // With groups both are fine.
    let source = with("algorithm grpo", "algorithm reinforce_pp").replacen(
        "group_size = 4",
        "group_size = 4, advantage_norm = group, filter = reward_std(keep = 0.5)",
        1,
    );
    assert!(check(&source).is_ok());

    let source = MINIMAL.replacen(
        "arch = transformer",
        "arch = transformer, value_head = separate",
        1,
    );
    let d = error(&source);
    assert_eq!(d.message, "grpo does not use a value head");
    assert_eq!(text(&source, &d), "grpo");
    assert!(d.hint.unwrap().contains("algorithm ppo"));
}

#[test]
fn a_remote_task_names_a_controller() {
    let source = with(
        "task kg { env = kg }",
        "task kg { remote = \"http://127.0.0.1:5020/api\" }\n    task ws { remote = \"http://c:5020/api\", name = \"webshop-std\", max_turns = 12 }",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("r.arl", &source)));
    assert_eq!(
        spec.tasks[0].env,
        EnvRef::Remote {
            url: "http://127.0.0.1:5020/api".into(),
            name: "kg".into()
        }
    );
    assert_eq!(spec.tasks[0].max_turns, 20);
    assert_eq!(
        spec.tasks[1].env,
        EnvRef::Remote {
            url: "http://c:5020/api".into(),
            name: "webshop-std".into()
        }
    );
    assert_eq!(spec.tasks[1].max_turns, 12);
}

#[test]
fn remote_task_mistakes_are_reported() {
    let cases = [
        (
            "task kg { env = kg, remote = \"http://c/api\" }",
            "task `kg` has both `env` and `remote`",
        ),
        (
            "task kg { remote = \"c:5020/api\" }",
            "`remote` must be an http:// or https:// URL",
        ),
        (
            "task kg { env = kg, name = \"kg\" }",
            "`name` is only for remote tasks",
        ),
        (
            "task kg { remote = \"http://c/api\", split = test }",
            "a remote task has no `split`",
        ),
        (
            "task kg { remote = \"http://c/api\", difficulty = 2 }",
            "a remote task has no `difficulty`",
        ),
    ];
    for (task, message) in cases {
        let source = with("task kg { env = kg }", task);
        assert_eq!(error(&source).message, message, "{task}");
    }
}

#[test]
fn a_remote_task_cannot_give_demonstrations() {
    let source = with(
        "task kg { env = kg }",
        "task kg { remote = \"http://c/api\" }",
    )
    .replace(
        "train { steps = 100, batch = 16 }",
        "train { steps = 100, batch = 16, warmup = sft { steps = 10 } }",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "task `kg` is remote: it has no oracle demonstrations"
    );
    assert_eq!(at(&source, &d), "3:10");
    assert!(d.hint.unwrap().contains("warmup"));
    // One in-process task is enough: the warm-up learns from its demonstrations.
    let mixed = source.replacen(
        "task kg { remote = \"http://c/api\" }",
        "task kg { remote = \"http://c/api\" }\n    task local { env = kg }",
        1,
    );
    assert!(
        check(&mixed).is_ok(),
        "a local task gives the demonstrations"
    );
    let source = with(
        "task kg { env = kg }",
        "task kg { remote = \"http://c/api\" }",
    )
    .replace(
        "group_size = 4",
        "group_size = 4, sft = linear(0.5 -> 0.0, over = 10)",
    );
    assert!(error(&source).hint.unwrap().contains("algorithm { sft"));
    // An SFT term on the run's own successes needs no oracle.
    let successes = source.replacen(
        "sft = linear(0.5 -> 0.0, over = 10)",
        "sft = linear(0.5 -> 0.0, over = 10), sft_from = successes",
        1,
    );
    assert!(check(&successes).is_ok());
}

#[test]
fn a_remote_task_is_generated_as_such() {
    let source = with(
        "task kg { env = kg }",
        "task kg { remote = \"http://c:5020/api\", name = \"kg-std\" }",
    );
    let code = agentry_dsl::expand_source(&source, "r.arl")
        .unwrap()
        .to_string()
        .replace(' ', "");
    assert!(
        code.contains(
            "::agentry::spec::EnvRef::Remote{url:::std::string::String::from(\"http://c:5020/api\"),name:::std::string::String::from(\"kg-std\")}"
        ),
        "{code}"
    );
    // Not a user type: no `user_task` arm constructs it.
    assert!(!code.contains("Default>::default"), "{code}");
}

#[test]
fn eval_decoding_is_greedy_sampled_or_both() {
    for (value, expected) in [
        ("greedy", EvalDecoding::Greedy),
        ("sampled", EvalDecoding::Sampled),
        ("both", EvalDecoding::Both),
    ] {
        let source = MINIMAL.replacen(
            "train {",
            &format!("eval {{ decoding = {value} }}\n    train {{"),
            1,
        );
        let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
        assert_eq!(spec.eval.decoding, expected, "{value}");
    }
    assert_eq!(
        EvalDecoding::Both
            .each()
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>(),
        ["greedy", "sampled"]
    );
    let d = error(&with("train {", "eval { decoding = sample }\n    train {"));
    assert_eq!(d.message, "unknown value `sample` for `decoding`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `sampled`?"));
}

#[test]
fn the_retired_greedy_key_names_its_replacement() {
    let source = with(
        "train {",
        "eval { episodes = 8, greedy = true }\n    train {",
    );
    let d = error(&source);
    assert_eq!(d.message, "`greedy` is no longer a key of `eval`");
    assert_eq!(text(&source, &d), "greedy");
    assert_eq!(
        d.hint.as_deref(),
        Some("`greedy` was replaced by `decoding = greedy | sampled | both`")
    );
}

/// `MINIMAL` with a second task, a curriculum and `sweep` holding `items`.
fn two_tasks(curriculum: &str, items: &str) -> String {
    with(
        "task kg { env = kg }",
        &format!(
            "task kg {{ env = kg }}\n    task os {{ env = os, max_turns = 6 }}\n    {curriculum}\n    sweep {{ {items} }}"
        ),
    )
}

#[test]
fn specialists_are_single_task_experiments_with_narrowed_stages() {
    let source = two_tasks(
        "curriculum { stage a { until = 50, tasks = [kg, os] }, stage b { max_turns = 4 } }",
        "seeds = [1, 2], specialists = true",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    let sweep = spec.sweep.clone().unwrap();
    assert!(sweep.base);
    let names: Vec<&str> = sweep.specialists.iter().map(|s| s.task.as_str()).collect();
    assert_eq!(names, ["kg", "os"]);
    let labels: Vec<String> = sweep.specialists.iter().map(|s| s.label()).collect();
    assert_eq!(labels, ["specialist.kg", "specialist.os"]);
    let os = &sweep.specialists[1].experiment;
    assert_eq!(os.tasks.len(), 1);
    assert_eq!(os.tasks[0].name, "os");
    assert_eq!(os.tasks[0].max_turns, 6);
    assert_eq!(os.curriculum[0].tasks, ["os"]);
    assert!(os.curriculum[1].tasks.is_empty());
    assert_eq!(os.sweep, None);
    assert_eq!(os.seed, spec.seed);
}

#[test]
fn specialists_false_and_base_true_change_nothing() {
    let source = two_tasks("", "specialists = false, base = true");
    let sweep = check(&source).unwrap().into_inner().sweep.unwrap();
    assert!(sweep.specialists.is_empty());
    assert!(sweep.base);
}

#[test]
fn a_specialist_whose_stage_lists_only_other_tasks_is_an_error() {
    let source = two_tasks(
        "curriculum { stage only_kg { until = 50, tasks = [kg] }, stage all { } }",
        "specialists = true",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "specialist `os`: curriculum stage `only_kg` lists only other tasks, so with `os` \
         alone it has nothing to train on"
    );
    assert_eq!(text(&source, &d), "specialists");
    assert!(
        d.hint
            .unwrap()
            .contains("add `os` to the `tasks` of stage `only_kg`")
    );
}

#[test]
fn a_specialist_that_does_not_check_is_reported_at_the_key() {
    // With the in-process `kg` beside it, a remote task may come with a warm-up (kg's oracle
    // gives the demonstrations); alone, it may not.
    let source = two_tasks("", "specialists = true")
        .replace(
            "task os { env = os, max_turns = 6 }",
            "task os { remote = \"http://c:5020/api\" }",
        )
        .replace("batch = 16 }", "batch = 16, warmup = sft { steps = 5 } }");
    let d = error(&source);
    assert!(d.message.starts_with("specialist `os`: "), "{}", d.message);
    assert_eq!(text(&source, &d), "specialists");
    assert_eq!(d.label, "the single-task experiment does not check");
}

/// `two_tasks` with `os` drawn twice as often as `kg`, a warm-up, and `train` as `train`.
fn weighted(train: &str, items: &str) -> String {
    two_tasks("", items)
        .replace("max_turns = 6 }", "max_turns = 6, weight = 2 }")
        .replace("train { steps = 100, batch = 16 }", train)
}

#[test]
fn specialists_by_weight_scale_the_warm_up_and_the_rl_batch_by_weight_share() {
    let source = weighted(
        "train { steps = 100, batch = 24, warmup = sft { steps = 300, \
         lr = cosine(3e-3 -> 3e-4, over = 300), demonstrations = 90, batch = 2 } }",
        "specialists = by_weight",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    let sweep = spec.sweep.clone().unwrap();
    // kg: weight 1 of 3 over two tasks, x2/3; os: weight 2 of 3, x4/3.
    let sized: Vec<(&str, u64, usize, usize, u64)> = sweep
        .specialists
        .iter()
        .map(|s| {
            let train = &s.experiment.train;
            let warmup = train.warmup.as_ref().unwrap();
            (
                s.task.as_str(),
                warmup.steps,
                warmup.demonstrations,
                train.batch,
                train.steps,
            )
        })
        .collect();
    assert_eq!(sized, [("kg", 200, 60, 16, 100), ("os", 400, 120, 32, 100)]);
    let os = sweep.specialists[1]
        .experiment
        .train
        .warmup
        .as_ref()
        .unwrap();
    assert_eq!(
        os.lr,
        Schedule::Cosine {
            from: 3e-3,
            to: 3e-4,
            over: 400
        }
    );
    assert_eq!(os.batch, 2, "the warm-up's batch stays as written");
    // The base is the file as written.
    assert_eq!(spec.train.batch, 24);
    assert_eq!(spec.train.warmup.as_ref().unwrap().steps, 300);
}

#[test]
fn specialists_by_weight_with_equal_weights_are_the_specialists_as_written() {
    let train = "train { steps = 100, batch = 16, warmup = sft { steps = 30, \
                 lr = step(1e-3 -> 1e-4, at = 20), demonstrations = 9 } }";
    let source =
        two_tasks("", "specialists = true").replace("train { steps = 100, batch = 16 }", train);
    let as_written = check(&source).unwrap().into_inner().sweep.unwrap();
    let by_weight = check(&source.replace("specialists = true", "specialists = by_weight"))
        .unwrap()
        .into_inner()
        .sweep
        .unwrap();
    assert_eq!(by_weight.specialists, as_written.specialists);
}

#[test]
fn specialists_by_weight_scale_a_step_schedule_and_leave_a_warm_up_only_batch_alone() {
    // No RL steps: the batch (16, not divisible by weight) is not the specialists' data.
    let source = weighted(
        "train { steps = 0, batch = 16, warmup = sft { steps = 30, \
         lr = step(1e-3 -> 1e-4, at = 15), demonstrations = 9 } }",
        "specialists = by_weight",
    );
    let sweep = check(&source)
        .unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)))
        .into_inner()
        .sweep
        .unwrap();
    let kg = &sweep.specialists[0].experiment.train;
    assert_eq!(kg.batch, 16);
    let warmup = kg.warmup.as_ref().unwrap();
    assert_eq!((warmup.steps, warmup.demonstrations), (20, 6));
    assert_eq!(
        warmup.lr,
        Schedule::Step {
            from: 1e-3,
            to: 1e-4,
            at: 10
        }
    );
}

#[test]
fn specialists_by_weight_need_whole_groups_and_name_a_batch_that_gives_them() {
    let source = weighted(
        "train { steps = 100, batch = 16 }",
        "specialists = by_weight",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "specialist `kg`: `specialists = by_weight` makes its RL batch 10.67 (`batch = 16` x \
         0.667), not a whole number of groups of 4"
    );
    assert_eq!(text(&source, &d), "specialists");
    assert_eq!(
        d.hint.as_deref(),
        Some(
            "with `batch = 12` in `train` every specialist's batch is a whole number of groups \
             of 4 (kg 8, os 16)"
        )
    );
}

#[test]
fn specialists_takes_true_false_or_by_weight() {
    let source = two_tasks("", "specialists = by_wieght");
    let d = error(&source);
    assert_eq!(d.message, "unknown value `by_wieght` for `specialists`");
    assert_eq!(text(&source, &d), "by_wieght");
    assert_eq!(d.hint.as_deref(), Some("did you mean `by_weight`?"));
    let d = error(&two_tasks("", "specialists = 2"));
    assert!(
        d.message.contains("`true`, `false` or `by_weight`"),
        "{}",
        d.message
    );
    let d = error(&two_tasks(
        "",
        "specialists = by_weight, specialists = true",
    ));
    assert!(d.message.contains("specialists"), "{}", d.message);
}

#[test]
fn base_false_needs_another_configuration() {
    let source = with(
        "train {",
        "sweep { seeds = [1], base = false }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "`base = false` leaves the sweep with no configuration to run"
    );
    assert_eq!(text(&source, &d), "base");
    let source = with(
        "train {",
        "sweep { base = false, ablate pool.cross_policy = 0 }\n    train {",
    );
    let sweep = check(&source).unwrap().into_inner().sweep.unwrap();
    assert!(!sweep.base);
    assert_eq!(sweep.ablations[0].label(), "ablate.pool.cross_policy=0");
}

#[test]
fn sweep_flags_are_booleans_given_once() {
    let d = error(&with("train {", "sweep { specialists = yes }\n    train {"));
    assert!(d.message.contains("specialists"), "{}", d.message);
    let source = with("train {", "sweep { base = true, base = true }\n    train {");
    let d = error(&source);
    assert!(d.message.contains("base"), "{}", d.message);
    let d = error(&with("train {", "sweep { specialist = true }\n    train {"));
    assert_eq!(d.message, "unknown key `specialist` in `sweep`");
    assert_eq!(d.hint.as_deref(), Some("did you mean `specialists`?"));
}

#[test]
fn ablation_labels_are_file_names_and_unique() {
    let source = with(
        "train {",
        "sweep { ablate algorithm.clip = 0.2 .. 0.28, ablate train.lr = 1e-3 }\n    train {",
    );
    let sweep = check(&source).unwrap().into_inner().sweep.unwrap();
    assert_eq!(
        sweep.ablations[0].label(),
        "ablate.algorithm.clip=0.2..0.28"
    );
    assert_eq!(sweep.ablations[1].label(), "ablate.train.lr=0.001");
    let source = with(
        "train {",
        "sweep { ablate pool.cross_policy = 0, ablate pool.cross_policy = 0 }\n    train {",
    );
    let d = error(&source);
    assert_eq!(
        d.message,
        "the sweep already has the configuration `ablate.pool.cross_policy=0`"
    );
}

/// `--steps` goes through the checker's rules (`Checked::with_steps`): no
/// curriculum stage ending after training, in every configuration of the sweep.
#[test]
fn steps_override_is_checked() {
    let spec = check(MULTITASK).unwrap();
    let longer = spec.clone().with_steps(300).unwrap();
    assert_eq!(longer.train.steps, 300);
    // The configurations keep the file's steps; each run overrides its own.
    let sweep = longer.sweep.as_ref().unwrap();
    assert!(
        sweep
            .ablations
            .iter()
            .all(|a| a.experiment.train.steps == 500)
    );

    let e = spec.clone().with_steps(250).unwrap_err();
    assert_eq!(
        e.message,
        "stage `h2` ends at step 300, after training ends (`steps = 250`)"
    );
    assert!(e.hint.contains("`--steps 300`"), "{}", e.hint);
    // `--steps 0` stops after the warm-up: no stage is reached, so no stage rule applies.
    assert_eq!(spec.with_steps(0).unwrap().train.steps, 0);
}

/// A sweep configuration that breaks the rule under `--steps` is named, though the base keeps it.
#[test]
fn steps_override_names_the_configuration_that_breaks_a_rule() {
    let source = with(
        "train {",
        "curriculum { stage a { until = 5 }, stage b {} }\n    sweep { ablate curriculum.a.until = 8 }\n    train {",
    );
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("t.arl", &source)));
    assert!(spec.clone().with_steps(8).is_ok());
    let e = spec.with_steps(6).unwrap_err();
    assert_eq!(
        e.message,
        "configuration `ablate.curriculum.a.until=8`: stage `a` ends at step 8, after training \
         ends (`steps = 6`)"
    );
}

#[test]
fn gguf_needs_a_file() {
    let source = with("arch = transformer", "arch = gguf { file = \"m/s.gguf\" }");
    let spec = check(&source).unwrap_or_else(|d| panic!("{}", d.render("m.arl", &source)));
    assert_eq!(
        spec.model.arch,
        Arch::Gguf {
            file: "m/s.gguf".to_string()
        }
    );
    let d = error(&with("arch = transformer", "arch = gguf"));
    assert_eq!(d.message, "`gguf` needs `file`");
    assert!(d.hint.unwrap().contains("arch = gguf { file = "));
    let d = error(&with("arch = transformer", "arch = gguf { file = \"\" }"));
    assert_eq!(d.message, "`file` is empty");
    let messages: Vec<String> = errors(&with(
        "arch = transformer",
        "arch = gguf { weights = \"x\" }",
    ))
    .into_iter()
    .map(|d| d.message)
    .collect();
    assert!(
        messages.iter().any(|m| m.contains("weights")),
        "{messages:?}"
    );
    assert!(
        messages.contains(&"`gguf` needs `file`".to_string()),
        "{messages:?}"
    );
    let d = error(&with("arch = transformer", "arch = ggfu"));
    assert_eq!(d.hint.as_deref(), Some("did you mean `gguf`?"));
}

#[test]
fn lora_fine_tuning_takes_defaults_and_checks_each_key() {
    use agentry_dsl::spec::{Finetune, Lora, LoraTarget};
    let parse = |finetune: &str| {
        let source = with(
            "arch = transformer",
            &format!("arch = transformer, {finetune}"),
        );
        check(&source).unwrap_or_else(|d| panic!("{}", d.render("m.arl", &source)))
    };
    assert_eq!(parse("finetune = full").model.finetune, Finetune::Full);
    assert_eq!(
        parse("finetune = lora").model.finetune,
        Finetune::Lora(Lora::default())
    );
    let spec =
        parse("finetune = lora { rank = 8, alpha = 16, dropout = 0.05, targets = [q, v, down] }");
    let Finetune::Lora(lora) = &spec.model.finetune else {
        panic!("not lora")
    };
    assert_eq!((lora.rank, lora.alpha, lora.dropout), (8, 16.0, 0.05));
    assert_eq!(
        lora.targets,
        [LoraTarget::Q, LoraTarget::V, LoraTarget::Down]
    );
    assert_eq!(lora.scale(), 2.0);

    let message = |finetune: &str| {
        error(&with(
            "arch = transformer",
            &format!("arch = transformer, {finetune}"),
        ))
        .message
    };
    assert_eq!(
        message("finetune = lora { rank = 0 }"),
        "`rank` must be at least 1"
    );
    assert!(message("finetune = lora { alpha = 0 }").starts_with("`alpha` must be"));
    assert!(message("finetune = lora { dropout = 1 }").starts_with("`dropout` must be"));
    assert_eq!(
        message("finetune = lora { targets = [] }"),
        "`targets` is empty"
    );
    assert_eq!(
        message("finetune = lora { targets = [q, q] }"),
        "`q` is listed twice"
    );
    assert_eq!(
        message("finetune = lora { targets = [query] }"),
        "unknown value `query` for `targets`"
    );
    assert_eq!(message("finetune = lorra"), "unknown fine-tuning `lorra`");
    let d = error(&with(
        "arch = transformer",
        "arch = transformer, finetune = lorra",
    ));
    assert!(d.hint.unwrap().contains("lora"));
    assert_eq!(
        message("finetune = full { rank = 4 }"),
        "`full` takes no settings"
    );
    let d = errors(&with(
        "arch = transformer",
        "arch = transformer, value_head = separate, finetune = lora",
    ))
    .into_iter()
    .find(|d| d.message == "a separate critic cannot be trained with `finetune = lora`")
    .expect("the separate critic is refused");
    assert!(d.hint.unwrap().contains("value_head = shared"));
}
