//! Data-parallel training (`train { data_parallel = N }`): replicas as threads on flex, summing
//! their gradients with burn's collective all-reduce, end where one trainer on the whole batch
//! ends; a replica that dies fails the step with its reason, and the run resumes.

use std::path::{Path, PathBuf};

use agentry_runtime::RunError;
use agentry_runtime::model::{Policy, PolicyConfig};
use agentry_runtime::text::Tokenizer;
use burn::backend::Flex;
use burn::module::{Module, ModuleVisitor, Param};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::Tensor;

use crate::common::{self, experiment, run_on_flex, serial};

/// A tiny run whose every update trains: a warm-up of batches of 3 (so 3 replicas get shares
/// of 1 and 4 replicas an empty one), then GRPO steps of 6 episodes whose returns differ by
/// the KL penalty on the reward, with the SFT term on the leader's share and sequence-mean
/// aggregation (so shares weigh by sequences, not tokens), two epochs per step.
const TINY: &str = r#"
experiment tiny_parallel {
    seed = 11
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo {
        group_size = 2, epochs = 2, kl = k1(0.1, as = reward), entropy = 0.001
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
/// replicas too.
const TINY_PPO: &str = r#"
experiment tiny_parallel_ppo {
    seed = 12
    device = flex
    model policy {
        arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }
        value_head = shared
    }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm ppo { kl = k3(0.05, as = loss), is_cap = 2.0, entropy = 0.001 }
    train {
        steps = 2, batch = 4, lr = 1e-3, max_new_tokens = 8, top_k = 20
        warmup = sft { steps = 2, demonstrations = 8, batch = 2 }
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
    struct Floats(Vec<f32>);
    impl ModuleVisitor<Flex> for Floats {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
            self.0
                .extend(param.val().into_data().into_vec::<f32>().unwrap());
        }
    }
    let tokenizer = Tokenizer::load(run_dir.join("tokenizer.json")).unwrap();
    let config = PolicyConfig {
        vocab: tokenizer.vocab_size(),
        layers: 1,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        context: 128,
        tie_embeddings: true,
    };
    let device = Default::default();
    let mut policy: Policy<Flex> = config.init(&device);
    if value_head {
        policy = policy.with_value_head();
    }
    let policy = policy
        .load_file(
            run_dir.join("policy.mpk"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            &device,
        )
        .unwrap();
    let mut floats = Floats(Vec::new());
    policy.visit(&mut floats);
    floats.0
}

/// The largest difference between two runs' weights, relative to the largest weight.
fn relative_gap(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
    let gap = a
        .iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    gap / scale
}

/// Each warm-up step's and RL step's (last epoch's) loss and gradient norm, in order.
fn losses(run_dir: &Path) -> Vec<(f64, f64)> {
    common::metrics(run_dir)
        .iter()
        .filter(|l| matches!(l["phase"].as_str(), Some("sft" | "rl")))
        .filter_map(|l| Some((l["loss"].as_f64()?, l["grad_norm"].as_f64()?)))
        .collect()
}

#[test]
fn replicas_train_as_one_trainer_on_the_whole_batch() {
    let _guard = serial();
    for (template, value_head) in [(TINY, false), (TINY_PPO, true)] {
        let one = run_on_flex(
            &experiment(&source(template, 1)),
            &scratch(&format!("one-{value_head}")),
            None,
            None,
        )
        .unwrap();
        let expected = final_weights(&one.run_dir, value_head);
        let expected_losses = losses(&one.run_dir);
        assert!(expected_losses.len() >= 5, "{expected_losses:?}");
        for replicas in [2, 3, 4] {
            let many = run_on_flex(
                &experiment(&source(template, replicas)),
                &scratch(&format!("{replicas}-{value_head}")),
                None,
                None,
            )
            .unwrap();
            let gap = relative_gap(&final_weights(&many.run_dir, value_head), &expected);
            assert!(gap < 1e-4, "{replicas} replicas: weights differ by {gap} (relative)");
            let got = losses(&many.run_dir);
            assert_eq!(got.len(), expected_losses.len());
            for ((loss, norm), (want_loss, want_norm)) in got.iter().zip(&expected_losses) {
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
    }
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
    assert!(
        matches!(error, RunError::DataParallel { .. }),
        "{message}"
    );
    assert!(message.contains("RL step 3"), "{message}");
    assert!(message.contains("replica 1 failed"), "{message}");
    assert!(message.contains("a fault injected at its update 8"), "{message}");
    assert!(message.contains("--resume"), "{message}");

    let run_dir = common::run_dir_of(&out, "tiny_parallel");
    let resumed = run_on_flex(&spec, &out, None, Some(&run_dir)).unwrap();
    assert_eq!(resumed.after_rl, straight.after_rl);
    assert!(
        final_weights(&resumed.run_dir, false) == final_weights(&straight.run_dir, false),
        "a resumed data-parallel run ends as the straight one, bit for bit"
    );
}
