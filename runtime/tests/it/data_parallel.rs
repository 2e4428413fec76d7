//! Data-parallel training (`train { data_parallel = N }`): replicas as threads on flex, summing
//! their gradients with burn's collective all-reduce, end where one trainer on the whole batch
//! ends; a replica that dies fails the step with its reason, and the run resumes.

use std::path::{Path, PathBuf};

use agentry_runtime::{RunError, RunSummary};

use crate::common::{self, experiment, run_on_flex, serial};
use crate::present::WithPresent;

/// A tiny run whose every update trains: a warm-up of batches of 3 (so 3 replicas get shares
/// of 1 and 4 replicas an empty one), then Dr. GRPO steps of 6 episodes whose returns differ
/// by the KL penalty on the reward, with the SFT term on the leader's share and sequence-mean
/// aggregation (so shares weigh by sequences, not tokens), two epochs per step.
///
/// Dr. GRPO, not GRPO: at the first step the policy is its KL reference, the penalties are
/// float noise, and GRPO's division by the group's std would blow that noise up into
/// advantages of ±1 that differ with every rounding (a sum of shares rounds differently from
/// the whole batch's sum).
const TINY: &str = r#"
experiment tiny_parallel {
    seed = 11
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm dr_grpo {
        group_size = 2, epochs = 2, kl = k1(0.5, as = reward), entropy = 0.001
        sft = constant(0.1), aggregation = seq_mean_token_mean
    }
    train {
        steps = 4, batch = 6, lr = 1e-3, max_new_tokens = 8, top_k = 20
        warmup = sft { steps = 3, demonstrations = 8, batch = 3 }
        checkpoint_every = 2
        data_parallel = REPLICAS
    }
    eval { every = 4, episodes = 2 }
}
"#;

/// PPO on a shared trunk, with the KL term in the loss and truncated importance sampling: the
/// value loss, the reference's log-probabilities and the importance weights cross to the
/// replicas too. On [`Present`](crate::present::Present), whose rewards differ between
/// episodes (kg's are all 0 here, and PPO would have nothing to learn).
const TINY_PPO: &str = r#"
experiment tiny_parallel_ppo {
    seed = 12
    device = flex
    model policy {
        arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }
        value_head = shared
    }
    task present { env = crate::Present, max_turns = 2 }
    algorithm ppo { kl = k3(0.05, as = loss), is_cap = 2.0, entropy = 0.001 }
    train {
        steps = 2, batch = 8, lr = 1e-3, max_new_tokens = 16, top_k = 20
        warmup = sft { steps = 30, lr = 3e-2, demonstrations = 8, batch = 2 }
        checkpoint_every = 2
        data_parallel = REPLICAS
    }
    eval { every = 2, episodes = 2 }
}
"#;

fn source(template: &str, replicas: usize) -> String {
    template.replace("REPLICAS", &replicas.to_string())
}

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("data-parallel", name)
}

/// Every float parameter of the run's final policy, in module order.
fn final_weights(run_dir: &Path, value_head: bool) -> Vec<f32> {
    common::final_weight_bits(run_dir, value_head)
        .into_iter()
        .flatten()
        .map(f32::from_bits)
        .collect()
}

/// The largest difference between two runs' weights, relative to the largest weight.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let gap = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    gap / scale
}

/// `many`'s final weights, losses and gradient norms are `one`'s, within float tolerance.
fn assert_trained_alike(many: &RunSummary, one: &RunSummary, replicas: usize, value_head: bool) {
    let gap = relative_gap(
        &final_weights(&many.run_dir, value_head),
        &final_weights(&one.run_dir, value_head),
    );
    assert!(
        gap < 1e-4,
        "{replicas} replicas: weights differ by {gap} (relative)"
    );
    let (got, expected) = (common::losses(&many.run_dir), common::losses(&one.run_dir));
    assert!(expected.len() >= 4, "{expected:?}");
    assert_eq!(got.len(), expected.len());
    for ((loss, norm), (want_loss, want_norm)) in got.iter().zip(&expected) {
        assert!(
            (loss - want_loss).abs() <= 1e-4 * want_loss.abs().max(1.0),
            "{replicas} replicas: loss {loss} vs {want_loss}"
        );
        assert!(
            (norm - want_norm).abs() <= 1e-3 * want_norm.abs().max(1e-3),
            "{replicas} replicas: gradient norm {norm} vs {want_norm}"
        );
    }
    assert_eq!(many.after_rl, one.after_rl, "{replicas} replicas");
}

#[test]
fn replicas_train_as_one_trainer_on_the_whole_batch() {
    let _guard = serial();
    let one = run_on_flex(&experiment(&source(TINY, 1)), &scratch("one"), None, None).unwrap();
    for replicas in [2, 3, 4] {
        let spec = experiment(&source(TINY, replicas));
        let many = run_on_flex(&spec, &scratch(&replicas.to_string()), None, None).unwrap();
        assert_trained_alike(&many, &one, replicas, false);
    }
}

/// PPO's replicas start from the one trainer's warm-up checkpoint: its 30 warm-up steps at a
/// high learning rate (so that the policy earns rewards) would turn the different rounding of
/// summed shares into visibly different weights. A run resumes on any number of replicas.
#[test]
fn ppo_replicas_resumed_from_a_warm_up_train_as_one_trainer() {
    let _guard = serial();
    let one = run_on_flex(
        &WithPresent::new(&source(TINY_PPO, 1)),
        &scratch("ppo-one"),
        None,
        None,
    )
    .unwrap();
    assert!(
        common::metrics(&one.run_dir)
            .iter()
            .any(|l| l["phase"] == "rl" && l["success"].as_f64() > Some(0.0)),
        "the warm-up should teach the policy to earn rewards"
    );
    for replicas in [2, 3] {
        let out = scratch(&format!("ppo-{replicas}"));
        let run_dir = out.join(one.run_dir.file_name().unwrap());
        copy_run_until_warm_up(&one.run_dir, &run_dir);
        let many = run_on_flex(
            &WithPresent::new(&source(TINY_PPO, replicas)),
            &out,
            None,
            Some(&run_dir.join("checkpoints/rl-000000.ckpt")),
        )
        .unwrap();
        assert_trained_alike(&many, &one, replicas, true);
    }
}

/// A copy of the run directory `from` at `to`, with its warm-up's checkpoint only.
fn copy_run_until_warm_up(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("checkpoints")).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
    std::fs::copy(
        from.join("checkpoints/rl-000000.ckpt"),
        to.join("checkpoints/rl-000000.ckpt"),
    )
    .unwrap();
}

#[test]
fn a_dying_replica_fails_its_step_and_the_run_resumes_from_its_checkpoint() {
    let _guard = serial();
    let spec = experiment(&source(TINY, 2));
    let straight = run_on_flex(&spec, &scratch("straight"), None, None).unwrap();

    // Updates 1-3 are the warm-up; RL steps take two epochs each, so update 8 is RL step 3's
    // second epoch, after the checkpoint of RL step 2.
    let out = scratch("dying");
    agentry_runtime::train::fail_replica_at(1, 8);
    let error = run_on_flex(&spec, &out, None, None).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, RunError::DataParallel { .. }), "{message}");
    assert!(message.contains("RL step 3"), "{message}");
    assert!(message.contains("replica 1 failed"), "{message}");
    assert!(
        message.contains("a fault injected at its update 8"),
        "{message}"
    );
    assert!(message.contains("--resume"), "{message}");

    let run_dir = common::run_dir_of(&out, "tiny_parallel");
    let resumed = run_on_flex(&spec, &out, None, Some(&run_dir)).unwrap();
    assert_eq!(resumed.after_rl, straight.after_rl);
    assert!(
        final_weights(&resumed.run_dir, false) == final_weights(&straight.run_dir, false),
        "a resumed data-parallel run ends as the straight one, bit for bit"
    );
}
