//! Shared fixtures and helpers for the integration tests.
#![allow(dead_code)]

use agentry_dsl::diagnostics::{Diagnostic, line_col};

/// The DESIGN §2 experiment, extended with every key the language has.
pub const MULTITASK: &str = r#"// line comments and /* block */ comments
experiment multitask {
    seed = 7
    device = auto                      // auto | flex | wgpu | vulkan | cuda
    model policy {
        arch = transformer { layers = 2, d_model = 128, heads = 4, context = 512 }
        value_head = none               // none | shared | separate
    }
    task kg   { env = kg, weight = 1, max_turns = 15, difficulty = 1 .. 2 }
    task mine { env = crate::envs::Maze, max_turns = 30 }   // a user's Rust type by path
    curriculum {
        stage h1 { until = 100, max_turns = 5,  tasks = [kg] }
        stage h2 { until = 300, max_turns = 10 }
        stage h3 {              max_turns = 20, difficulty = 3 }
    }
    algorithm grpo {
        group_size = 8
        clip = 0.2 .. 0.28              // decoupled low/high; `clip = 0.2` sets both
        dual_clip = 3.0
        kl = low_var_kl(1e-4)           // k1(c) | k2(c) | low_var_kl(c) | k3(c) | abs(c) | none ; optional named arg `as = reward`
        entropy = 0.001
        advantage_norm = per_task       // none | group | batch | per_task
        aggregation = token_mean        // token_mean | seq_mean_token_sum | seq_mean_token_mean
        sft = linear(0.5 -> 0.0, over = 200)   // constant(a) | a bare number | linear/cosine(a -> b, over = n) | step(a -> b, at = n)
        filter = reward_std(keep = 0.75)       // none | reward_std(keep = f)
        gamma = 1.0, lambda = 0.95, epochs = 1, grad_clip = 1.0   // grad_clip = none disables
    }
    pool {
        engines = 4
        stale = 1 { refresh_every = 25 }
        cross_policy = 0.25
        max_staleness = 25
        mode = sync                     // sync | async
    }
    train {
        steps = 500, batch = 32, lr = 3e-4
        optimizer = adamw { weight_decay = 0.01 }   // adamw {weight_decay, beta1, beta2} | adam {beta1, beta2} | sgd {momentum}; a bare `adamw` takes defaults
        temperature = 1.0, top_p = 1.0, max_new_tokens = 64
        warmup = sft { steps = 100, lr = 1e-3, demonstrations = 256, batch = 16 }
        checkpoint_every = 100
        max_nonfinite_skips = 3
        recompute = false
        data_parallel = 1
    }
    eval  { every = 50, split = test, episodes = 100, decoding = both }   // decoding: greedy | sampled | both
    sweep { seeds = [1, 2, 3], ablate pool.cross_policy = 0, ablate algorithm.advantage_norm = batch }
}
"#;

/// The smallest experiment that checks; tests append or replace lines in it.
pub const MINIMAL: &str = "experiment tiny {
    model policy { arch = transformer }
    task kg { env = kg }
    algorithm grpo { group_size = 4 }
    train { steps = 100, batch = 16 }
}
";

/// Checks `source` and returns its errors, failing if it checks.
pub fn errors(source: &str) -> Vec<Diagnostic> {
    match agentry_dsl::check(source) {
        Ok(spec) => panic!("expected errors, but it checked: {spec:#?}"),
        Err(d) => d.0,
    }
}

/// The only error of `source`, failing if there are none or several.
pub fn error(source: &str) -> Diagnostic {
    let errors = errors(source);
    assert_eq!(errors.len(), 1, "expected one error, got {errors:#?}");
    errors.into_iter().next().unwrap()
}

/// `line:col` of a diagnostic in `source`.
pub fn at(source: &str, d: &Diagnostic) -> String {
    let (line, col) = line_col(source, d.span.start);
    format!("{line}:{col}")
}

/// The text a diagnostic's span covers.
pub fn text<'a>(source: &'a str, d: &Diagnostic) -> &'a str {
    &source[d.span.start..d.span.end]
}
