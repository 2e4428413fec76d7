//! Checkpoints and resume: a run stopped and resumed ends exactly where the same run going
//! straight ends (flex is bit-deterministic), and a truncated, corrupt or foreign checkpoint is
//! an error that says so, never a panic.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::common::{self, experiment, serial};
use crate::present::WithPresent;
use agentry_runtime::checkpoint::{Checkpoint, CheckpointError, FORMAT_VERSION};
use agentry_runtime::error::Update;
use agentry_runtime::model::PolicyConfig;
use agentry_runtime::model::hf::load_policy;
use agentry_runtime::optim::PolicyOptimizer;
use agentry_runtime::{Experiment, RunError, RunSummary};
use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Module};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use rand::Rng;

/// A tiny run with every kind of state: a warm-up (SFT phase), a KL reference, an SFT term,
/// AdamW moments, periodic evaluations and checkpoints.
///
/// A model this small solves nothing, so every task reward is 0 and GRPO would skip every RL
/// update; the KL penalty on the reward (`as = reward`) makes the returns differ, so every RL
/// step updates the policy (with its SFT term) and the reference matters.
const TINY: &str = r#"
experiment tiny_resume {
    seed = 5
    device = flex
    model policy { arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 } }
    task kg { env = kg, max_turns = 2, difficulty = 1 }
    algorithm grpo { group_size = 2, kl = k1(0.1, as = reward), entropy = 0.001, sft = constant(0.1) }
    train {
        steps = 4, batch = 4, lr = 1e-3, max_new_tokens = 8, top_k = 20
        warmup = sft { steps = 3, demonstrations = 8, batch = 2 }
        checkpoint_every = 2
    }
    eval { every = 2, episodes = 2 }
}
"#;

fn scratch(name: &str) -> PathBuf {
    common::scratch_in("checkpoint-resume", name)
}

fn run(
    source: &str,
    out: &Path,
    steps: u64,
    resume: Option<&Path>,
) -> Result<RunSummary, RunError> {
    run_experiment(&experiment(source), out, steps, resume)
}

fn run_experiment(
    experiment: &dyn Experiment,
    out: &Path,
    steps: u64,
    resume: Option<&Path>,
) -> Result<RunSummary, RunError> {
    common::run_on_flex(experiment, out, Some(steps), resume)
}

fn phases(lines: &[serde_json::Value]) -> Vec<String> {
    lines
        .iter()
        .map(|l| format!("{}{}", l["phase"].as_str().unwrap(), l["step"]))
        .collect()
}

/// Two runs ended in the same state: the same final weights, bit for bit, and final
/// checkpoints equal in everything but burn's parameter ids (random per run) and the byte
/// length of `metrics.jsonl` (its wall-clock fields differ), the weights and the KL reference
/// compared bit for bit.
fn same_final_state(a: &Path, b: &Path, checkpoint: &str) {
    same_final_state_of(a, b, checkpoint, false);
}

/// [`same_final_state`] of runs whose policy has a value head (`value_head = shared`) or not.
fn same_final_state_of(a: &Path, b: &Path, checkpoint: &str, value_head: bool) {
    let device = Default::default();
    let config = common::tiny_policy_config(a);
    assert_eq!(config, common::tiny_policy_config(b));
    let fresh = || {
        let policy = config.init::<Flex>(&device);
        if value_head {
            policy.with_value_head()
        } else {
            policy
        }
    };
    let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
    let load = |dir: &Path| {
        let policy = fresh()
            .load_file(dir.join("policy.mpk"), &recorder, &device)
            .unwrap();
        common::parameter_bits(&policy)
    };
    assert!(load(a) == load(b), "final weights differ");
    let (ca, cb) = (
        Checkpoint::read(&a.join("checkpoints").join(checkpoint)).unwrap(),
        Checkpoint::read(&b.join("checkpoints").join(checkpoint)).unwrap(),
    );
    assert_eq!(ca.phase(), cb.phase());
    assert_eq!(ca.tokenizer(), cb.tokenizer());
    assert_eq!(ca.after_warmup(), cb.after_warmup());
    assert_eq!(ca.skipped_steps(), cb.skipped_steps());
    let draws = |c: &Checkpoint| -> Vec<u64> {
        let mut rng = c.rng();
        (0..8).map(|_| rng.random()).collect()
    };
    assert_eq!(draws(&ca), draws(&cb), "RNG state");
    let weights =
        |c: &Checkpoint| common::parameter_bits(&c.restore_policy(fresh(), &device).unwrap());
    assert!(weights(&ca) == weights(&cb), "checkpointed weights differ");
    let reference = |c: &Checkpoint| {
        common::parameter_bits(
            &c.restore_reference(fresh(), &device)
                .unwrap()
                .expect("a KL reference"),
        )
    };
    assert!(reference(&ca) == reference(&cb), "KL references differ");
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn a_stopped_and_resumed_run_ends_as_the_straight_run() {
    let _guard = serial();
    let straight = run(TINY, &scratch("straight"), 4, None).unwrap();
    let expected = common::metrics_without_timings(&straight.run_dir);
    assert_eq!(
        phases(&expected),
        [
            "sft1", "sft2", "sft3", "eval0", "eval0", "rl1", "rl2", "eval2", "eval2", "rl3", "rl4",
            "eval4", "eval4"
        ]
    );
    let rl: Vec<&serde_json::Value> = expected.iter().filter(|l| l["phase"] == "rl").collect();
    assert!(
        rl.iter()
            .all(|l| l["skipped"] == false && l["grad_norm"].as_f64() > Some(0.0)),
        "every RL step updates the policy: {rl:?}"
    );
    let names = common::entry_names(&straight.run_dir.join("checkpoints"));
    for name in [
        "sft-000002.ckpt",
        "rl-000000.ckpt",
        "rl-000002.ckpt",
        "rl-000004.ckpt",
    ] {
        assert!(names.iter().any(|n| n == name), "{name} in {names:?}");
    }

    // Stop after two RL steps (a complete shorter run), then resume to four.
    let out = scratch("split");
    let first = run(TINY, &out, 2, None).unwrap();
    let resumed = run(TINY, &out, 4, Some(&first.run_dir)).unwrap();
    assert_eq!(
        resumed.run_dir, first.run_dir,
        "the run goes on in its own directory"
    );
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), expected);
    same_final_state(&resumed.run_dir, &straight.run_dir, "rl-000004.ckpt");
    assert_eq!(resumed.after_warmup, straight.after_warmup);
    assert_eq!(resumed.after_rl, straight.after_rl);
    // The sampled evaluations too (`decoding = both`, the default), the one after the warm-up
    // restored from the checkpoint.
    assert!(straight.after_warmup_sampled.is_some());
    assert_eq!(resumed.after_warmup_sampled, straight.after_warmup_sampled);
    assert_eq!(resumed.after_rl_sampled, straight.after_rl_sampled);
    // The shorter run's final evaluations (greedy and sampled) are kept aside, not lost.
    let superseded =
        std::fs::read_to_string(first.run_dir.join("metrics-superseded.jsonl")).unwrap();
    assert_eq!(superseded.lines().count(), 2);
    assert!(superseded.contains(r#""label":"final""#), "{superseded}");
}

/// [`TINY`] as PPO with a critic of the given kind (`shared` or `separate`): two epochs, so
/// the value clip binds, and the KL penalty on the reward so returns are not all zero.
fn tiny_ppo(value_head: &str) -> String {
    TINY.replace(
        "context = 128 } }",
        &format!("context = 128 }}, value_head = {value_head} }}"),
    )
    .replace(
        "algorithm grpo { group_size = 2, kl",
        "algorithm ppo { epochs = 2, value_clip = 0.1, kl",
    )
    .replace("tiny_resume", &format!("tiny_ppo_{value_head}"))
}

/// The final critic of a PPO run's checkpoint, as bits: the shared value head lives in the
/// policy's weights, a separate critic in its own section.
fn critic_bits(run_dir: &Path, checkpoint: &str, separate: bool) -> Vec<Vec<u32>> {
    let device = Default::default();
    let checkpoint = Checkpoint::read(&run_dir.join("checkpoints").join(checkpoint)).unwrap();
    let fresh = common::tiny_policy_config(run_dir)
        .init::<Autodiff<Flex>>(&device)
        .with_value_head();
    if separate {
        let optimizer = PolicyOptimizer::new(&agentry_dsl::spec::Optimizer::AdamW {
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999,
        });
        let (critic, _) = checkpoint
            .restore_critic(fresh, optimizer, &device)
            .unwrap()
            .expect("a separate critic in the checkpoint");
        common::parameter_bits(&critic.valid())
    } else {
        common::parameter_bits(&checkpoint.restore_policy(fresh, &device).unwrap().valid())
    }
}

fn ppo_resumes_exactly(value_head: &str) {
    let _guard = serial();
    let source = tiny_ppo(value_head);
    let straight = run(
        &source,
        &scratch(&format!("ppo-{value_head}-straight")),
        4,
        None,
    )
    .unwrap();
    let expected = common::metrics_without_timings(&straight.run_dir);
    let rl: Vec<&serde_json::Value> = expected.iter().filter(|l| l["phase"] == "rl").collect();
    assert_eq!(rl.len(), 4);
    for line in &rl {
        assert_eq!(line["skipped"], false, "{line}");
        for key in ["value_loss", "explained_variance", "value_clip_frac"] {
            let value = line[key].as_f64();
            assert!(value.is_some_and(f64::is_finite), "{key} in {line}");
        }
    }
    let out = scratch(&format!("ppo-{value_head}-split"));
    let first = run(&source, &out, 2, None).unwrap();
    let resumed = run(&source, &out, 4, Some(&first.run_dir)).unwrap();
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), expected);
    let separate = value_head == "separate";
    same_final_state_of(
        &resumed.run_dir,
        &straight.run_dir,
        "rl-000004.ckpt",
        !separate,
    );
    let critic = |dir: &Path| critic_bits(dir, "rl-000004.ckpt", separate);
    let (a, b) = (critic(&resumed.run_dir), critic(&straight.run_dir));
    assert!(a == b, "the critics differ");
    // The critic trained: its value head is no longer the all-zero initialization.
    // (The value head is the last module of a policy: its weight and bias.)
    let head = &a[a.len() - 2..];
    assert!(
        head.iter()
            .flatten()
            .any(|bits| f32::from_bits(*bits) != 0.0)
    );
    assert_eq!(resumed.after_rl, straight.after_rl);
}

#[test]
fn a_ppo_run_with_a_shared_value_head_resumes_exactly() {
    ppo_resumes_exactly("shared");
}

#[test]
fn a_ppo_run_with_a_separate_critic_resumes_exactly() {
    ppo_resumes_exactly("separate");
}

#[test]
fn a_run_resumes_from_a_warmup_checkpoint() {
    let _guard = serial();
    // The warm-up's learning rate follows its schedule, step by step, across the resume too.
    let source = TINY
        .replace("steps = 4, batch", "steps = 2, batch")
        .replace(
            "warmup = sft { steps = 3,",
            "warmup = sft { steps = 3, lr = linear(2e-3 -> 5e-4, over = 3),",
        );
    let straight = run(&source, &scratch("warmup-straight"), 2, None).unwrap();
    let lrs: Vec<f64> = std::fs::read_to_string(straight.run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|record| record["phase"] == "sft")
        .map(|record| record["lr"].as_f64().unwrap())
        .collect();
    assert_eq!(lrs.len(), 3);
    for (lr, expected) in lrs.iter().zip([2e-3, 1.5e-3, 1e-3]) {
        assert!((lr - expected).abs() < 1e-12, "{lrs:?}");
    }
    // Resume the finished run from its mid-warm-up checkpoint: everything after it is redone.
    let out = scratch("warmup-split");
    let first = run(&source, &out, 2, None).unwrap();
    let checkpoint = first.run_dir.join("checkpoints").join("sft-000002.ckpt");
    let resumed = run(&source, &out, 2, Some(&checkpoint)).unwrap();
    assert_eq!(
        common::metrics_without_timings(&resumed.run_dir),
        common::metrics_without_timings(&straight.run_dir)
    );
    same_final_state(&resumed.run_dir, &straight.run_dir, "rl-000002.ckpt");
    let superseded =
        std::fs::read_to_string(first.run_dir.join("metrics-superseded.jsonl")).unwrap();
    // sft3, eval0 (greedy and sampled), rl1, rl2 and the final evaluations were written again.
    assert_eq!(superseded.lines().count(), 7, "{superseded}");
    // `--steps` may change on resume, but not to before the checkpoint.
    drop(_guard);
    let message = resume_error(&source, 1, &straight.run_dir);
    assert!(
        message.contains("it is at RL step 2, past this run's 1 steps; pass `--steps 2`"),
        "{message}"
    );
}

/// A run from a Hugging Face checkpoint resumes exactly too: the checkpoint embeds the model's
/// own `tokenizer.json`, and the policy is rebuilt from the model files before its weights are
/// replaced. The model files changing under the run is an error, not a silent mix.
#[test]
fn a_run_from_a_hugging_face_checkpoint_resumes_exactly() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen2");
    let model = scratch("hf-model");
    for entry in std::fs::read_dir(&fixture).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    // The fixture's toy vocabulary spells the Hermes prompt of its chat template almost byte
    // by byte (about 2500 tokens), past its 2048-token context: give the copy room.
    let config_path = model.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = 4096.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let source = TINY
        .replace(
            "arch = transformer { layers = 1, d_model = 16, heads = 2, ffn = 32, context = 128 }",
            &format!("arch = qwen2 {{ weights = \"{}\" }}", model.display()),
        )
        .replace("steps = 4, batch", "steps = 2, batch");
    let straight = {
        let _guard = serial();
        run(&source, &scratch("hf-straight"), 2, None).unwrap()
    };
    let out = scratch("hf-split");
    let resumed = {
        let _guard = serial();
        let first = run(&source, &out, 1, None).unwrap();
        let resumed = run(&source, &out, 2, Some(&first.run_dir)).unwrap();
        assert_eq!(resumed.run_dir, first.run_dir);
        resumed
    };
    assert_eq!(
        common::metrics_without_timings(&resumed.run_dir),
        common::metrics_without_timings(&straight.run_dir)
    );
    let (a, b) = (
        Checkpoint::read(&resumed.run_dir.join("checkpoints/rl-000002.ckpt")).unwrap(),
        Checkpoint::read(&straight.run_dir.join("checkpoints/rl-000002.ckpt")).unwrap(),
    );
    assert!(
        a.tokenizer().hf().is_some(),
        "the model's tokenizer is kept"
    );
    assert_eq!(a.tokenizer(), b.tokenizer());
    let device = Default::default();
    let weights = |c: &Checkpoint| {
        let (_, fresh) = load_policy::<Flex>(&model, &device).unwrap();
        common::parameter_bits(&c.restore_policy(fresh, &device).unwrap())
    };
    assert!(weights(&a) == weights(&b), "checkpointed weights differ");

    // A policy of another shape (as when the model files change under the path) is refused.
    // Its weights are drawn from burn's global RNG, which a run of another test may have just
    // seeded: it waits for the lock.
    let other = {
        let _guard = serial();
        PolicyConfig {
            vocab: 64,
            layers: 1,
            d_model: 16,
            heads: 2,
            kv_heads: 2,
            ffn: 32,
            context: 64,
            tie_embeddings: true,
        }
        .init::<Flex>(&device)
    };
    let message = a.restore_policy(other, &device).unwrap_err().to_string();
    assert!(
        message.contains("the architecture differs (parameter 0 is")
            && message.contains("did the model files the experiment loads change?"),
        "{message}"
    );
}

/// One finished run whose checkpoints the error tests take apart.
fn finished_run() -> &'static PathBuf {
    static RUN: OnceLock<PathBuf> = OnceLock::new();
    RUN.get_or_init(|| {
        let _guard = serial();
        let source = TINY.replace("steps = 4, batch", "steps = 1, batch");
        run(&source, &scratch("finished"), 1, None).unwrap().run_dir
    })
}

/// A copy of the finished run, to damage.
fn copy_of_finished(name: &str) -> PathBuf {
    let from = finished_run();
    let to = scratch(name).join("run");
    std::fs::create_dir_all(to.join("checkpoints")).unwrap();
    for file in ["metrics.jsonl", "checkpoints/rl-000001.ckpt"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
    to
}

fn resume_error(source: &str, steps: u64, path: &Path) -> String {
    let _guard = serial();
    let out = path.parent().unwrap().join("out");
    match run(source, &out, steps, Some(path)) {
        Ok(_) => panic!("resuming from {} should fail", path.display()),
        Err(e @ RunError::Checkpoint(_)) => e.to_string(),
        Err(other) => panic!("not a checkpoint error: {other}"),
    }
}

fn one_step() -> String {
    TINY.replace("steps = 4, batch", "steps = 1, batch")
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The sections of a checkpoint file: header, weights, optimizer, reference, critic, critic
/// optimizer.
fn sections(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut at = 12;
    let mut out = Vec::new();
    for _ in 0..7 {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        out.push(bytes[at + 8..at + 8 + len].to_vec());
        at += 8 + len;
    }
    out
}

/// A well-formed file (valid checksum) around the given sections.
fn assemble(sections: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = b"AGNTCKPT".to_vec();
    bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    for s in sections {
        bytes.extend_from_slice(&(s.len() as u64).to_le_bytes());
        bytes.extend_from_slice(s);
    }
    let checksum = fnv1a(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    bytes
}

#[test]
fn truncated_checkpoints_are_rejected_at_every_length() {
    let run_dir = copy_of_finished("truncated");
    let file = run_dir.join("checkpoints/rl-000001.ckpt");
    let whole = read(file.clone());
    let mut cuts = vec![
        0,
        4,
        8,
        13,
        20,
        100,
        whole.len() / 2,
        whole.len() - 9,
        whole.len() - 1,
    ];
    cuts.extend((1..40).map(|i| i * whole.len() / 40));
    for cut in cuts {
        std::fs::write(&file, &whole[..cut]).unwrap();
        let message = match Checkpoint::read(&file) {
            Err(CheckpointError::Corrupt { reason, .. }) => reason,
            Err(other) => panic!("cut at {cut}: {other}"),
            Ok(_) => panic!("cut at {cut} was accepted"),
        };
        assert!(
            message.contains("truncated") || message.contains("not an Agentry checkpoint"),
            "cut at {cut}: {message}"
        );
    }
    std::fs::write(&file, &whole[..whole.len() / 2]).unwrap();
    let message = resume_error(&one_step(), 1, &run_dir);
    assert!(
        message.contains("rl-000001.ckpt") && message.contains("truncated"),
        "{message}"
    );
}

#[test]
fn corrupt_checkpoints_are_rejected() {
    let run_dir = copy_of_finished("corrupt");
    let file = run_dir.join("checkpoints/rl-000001.ckpt");
    let whole = read(file.clone());
    let expect = |bytes: &[u8], needle: &str| {
        std::fs::write(&file, bytes).unwrap();
        match Checkpoint::read(&file) {
            Err(e @ CheckpointError::Corrupt { .. }) => {
                let message = e.to_string();
                assert!(message.contains(needle), "{message}");
            }
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("accepted a checkpoint that should contain `{needle}`"),
        }
    };
    // A flipped bit anywhere in the sections' contents fails the checksum.
    for at in [
        25,
        whole.len() / 3,
        whole.len() / 2,
        whole.len() - 40,
        whole.len() - 3,
    ] {
        let mut bytes = whole.clone();
        bytes[at] ^= 0x10;
        expect(&bytes, "checksum mismatch");
    }
    // The last 32 bytes are the (empty) critic and stale-engine sections' lengths and the
    // checksum: a flipped length bit reads as a section running past the end of the file.
    let mut bytes = whole.clone();
    bytes[whole.len() - 20] ^= 0x10;
    expect(&bytes, "truncated");
    let mut bytes = whole.clone();
    bytes[0] = b'X';
    expect(&bytes, "not an Agentry checkpoint");
    let mut bytes = whole.clone();
    bytes[8] = 9;
    expect(
        &bytes,
        "format version 9, but this build reads only versions 3 to 4: a newer Agentry",
    );
    // Versions 1 and 2 lack later sections: refused as older, not read out of place.
    for old in [1, 2] {
        let mut bytes = whole.clone();
        bytes[8] = old;
        expect(
            &bytes,
            &format!(
                "format version {old}, but this build reads only versions 3 to 4: an older Agentry"
            ),
        );
    }
    // Version 3 is version 4 without LoRA: such a file reads as it is.
    let mut bytes = whole[..whole.len() - 8].to_vec();
    bytes[8..12].copy_from_slice(&3u32.to_le_bytes());
    let checksum = fnv1a(&bytes);
    bytes.extend_from_slice(&checksum.to_le_bytes());
    std::fs::write(&file, &bytes).unwrap();
    let version3 = Checkpoint::read(&file).expect("a version-3 checkpoint reads");
    assert_eq!(
        version3.phase(),
        agentry_runtime::checkpoint::Phase::Rl { step: 1 }
    );
    let mut bytes = whole.clone();
    bytes.extend_from_slice(b"junk");
    expect(&bytes, "unexpected bytes after the checksum");
    // A length field claiming more than the file holds.
    let mut bytes = whole.clone();
    bytes[12..20].copy_from_slice(&u64::MAX.to_le_bytes());
    expect(&bytes, "truncated");
    expect(b"{\"not\": \"a checkpoint\"}", "not an Agentry checkpoint");

    // Intact files (valid checksum) whose content is damaged still fail cleanly.
    let parts = sections(&whole);
    let mut bad_header = parts.clone();
    bad_header[0] = b"{ not json".to_vec();
    expect(&assemble(&bad_header), "unreadable header");
    let mut bad_tokenizer = parts.clone();
    let mut header: serde_json::Value = serde_json::from_slice(&parts[0]).unwrap();
    header["tokenizer"] = serde_json::Value::String(r#"{"format": "other", "pieces": []}"#.into());
    bad_tokenizer[0] = serde_json::to_vec(&header).unwrap();
    expect(&assemble(&bad_tokenizer), "unknown format");
    // A checkpoint written before a key existed (here `train.max_nonfinite_skips`) was trained
    // with its default, and still matches the experiment.
    let mut older = parts.clone();
    let mut header: serde_json::Value = serde_json::from_slice(&parts[0]).unwrap();
    let train = header["spec"]["train"].as_object_mut().unwrap();
    assert!(train.remove("max_nonfinite_skips").is_some());
    older[0] = serde_json::to_vec(&header).unwrap();
    let spec = experiment(&one_step()).0.into_inner();
    let task_versions: std::collections::BTreeMap<String, String> =
        serde_json::from_value(header["task_versions"].clone()).unwrap();
    let path = run_dir.join("older.ckpt");
    std::fs::write(&path, assemble(&older)).unwrap();
    let checkpoint = Checkpoint::read(&path).unwrap();
    checkpoint
        .check_matches(&spec, &task_versions, None)
        .expect("a key's default matches a checkpoint written before the key");
    // With another value it does not, and the difference is named.
    let mut changed = spec.clone();
    changed.train.max_nonfinite_skips = 7;
    let error = checkpoint
        .check_matches(&changed, &task_versions, None)
        .unwrap_err();
    assert!(
        error.to_string().contains("train.max_nonfinite_skips"),
        "{error}"
    );
    let garbage: Vec<u8> = (0..4000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    for section in [1, 2] {
        for content in [
            Vec::new(),
            garbage.clone(),
            parts[section][..parts[section].len() / 2].to_vec(),
        ] {
            let mut damaged = parts.clone();
            damaged[section] = content;
            std::fs::write(&file, assemble(&damaged)).unwrap();
            // Reading succeeds (the frame is intact); restoring the tensors reports the damage.
            let message = resume_error(&one_step(), 1, &run_dir);
            let what = if section == 1 { "weights" } else { "optimizer" };
            assert!(
                message.contains(what) && message.contains("unusable"),
                "{message}"
            );
        }
    }
    // Weights of another shape, behind a header that claims this architecture.
    let _guard = serial();
    let wider = one_step().replace("d_model = 16", "d_model = 32");
    let other = run(&wider, &scratch("corrupt-wider"), 1, None).unwrap();
    drop(_guard);
    let other_parts = sections(&read(other.run_dir.join("checkpoints/rl-000001.ckpt")));
    let mut swapped = parts.clone();
    swapped[1] = other_parts[1].clone();
    std::fs::write(&file, assemble(&swapped)).unwrap();
    let message = resume_error(&one_step(), 1, &run_dir);
    assert!(message.contains("tensor shapes"), "{message}");
}

#[test]
fn checkpoints_of_another_experiment_or_architecture_are_rejected() {
    let run_dir = finished_run().clone();
    let renamed = one_step().replace("tiny_resume", "someone_else");
    let message = resume_error(&renamed, 1, &run_dir);
    assert!(
        message.contains("does not match this run")
            && message.contains("written by experiment `tiny_resume`, not `someone_else`"),
        "{message}"
    );
    let wider = one_step().replace("d_model = 16", "d_model = 32");
    let message = resume_error(&wider, 1, &run_dir);
    assert!(
        message.contains("`model.arch.transformer.d_model` was 16 and is now 32"),
        "{message}"
    );
    let faster = one_step().replace("lr = 1e-3", "lr = 2e-3");
    let message = resume_error(&faster, 1, &run_dir);
    assert!(
        message.contains("`train.lr` was 0.001 and is now 0.002"),
        "{message}"
    );
}

#[test]
fn missing_checkpoints_are_reported() {
    let dir = scratch("missing");
    let message = resume_error(&one_step(), 1, &dir.join("no-such-run"));
    assert!(message.contains("no such file or directory"), "{message}");
    let empty = dir.join("empty-run");
    std::fs::create_dir_all(&empty).unwrap();
    let message = resume_error(&one_step(), 1, &empty);
    assert!(message.contains("no `checkpoints` folder"), "{message}");
    std::fs::create_dir_all(empty.join("checkpoints")).unwrap();
    std::fs::write(empty.join("checkpoints/.rl-000001.ckpt.tmp"), b"partial").unwrap();
    let message = resume_error(&one_step(), 1, &empty);
    assert!(message.contains("holds no checkpoint file"), "{message}");
    // A checkpoint outside a run directory has nowhere to go on.
    let stray = dir.join("stray.ckpt");
    std::fs::copy(finished_run().join("checkpoints/rl-000001.ckpt"), &stray).unwrap();
    let message = resume_error(&one_step(), 1, &stray);
    assert!(
        message.contains("resumes in its own directory"),
        "{message}"
    );
}

#[test]
fn sft_from_successes_and_truncated_importance_sampling_resume_exactly() {
    let _guard = serial();
    let source = TINY
        .replace(
            "task kg { env = kg, max_turns = 2, difficulty = 1 }",
            "task present { env = crate::Present, max_turns = 2 }",
        )
        .replace(
            "sft = constant(0.1) }",
            "sft = constant(0.5), sft_from = successes(keep = 6), is_cap = 2, epochs = 2, credit = turn, gamma = 0.9 }",
        )
        .replace("tiny_resume", "tiny_successes");
    let experiment = WithPresent::solved_anyway(&source);
    let straight = run_experiment(&experiment, &scratch("successes-straight"), 4, None).unwrap();
    let expected = common::metrics_without_timings(&straight.run_dir);
    let rl: Vec<&serde_json::Value> = expected.iter().filter(|l| l["phase"] == "rl").collect();
    assert_eq!(rl.len(), 4);
    // Four episodes a step, all solved, kept up to six.
    let kept: Vec<u64> = rl
        .iter()
        .map(|l| l["successes_kept"].as_u64().unwrap())
        .collect();
    assert_eq!(kept, [4, 6, 6, 6]);
    for line in &rl {
        assert_eq!(line["skipped"], false, "{line}");
        // The update starts from the policy that sampled: the weights are 1 up to the
        // numerical difference of cached sampling and batched scoring.
        let weight = line["is_weight"].as_f64().unwrap();
        assert!((weight - 1.0).abs() < 1e-3, "is_weight {weight}");
        assert_eq!(line["is_truncated"].as_f64(), Some(0.0));
    }

    let out = scratch("successes-split");
    let first = run_experiment(&experiment, &out, 2, None).unwrap();
    let checkpoint = Checkpoint::read(&first.run_dir.join("checkpoints/rl-000002.ckpt")).unwrap();
    assert_eq!(checkpoint.successes().len(), 6);
    let resumed = run_experiment(&experiment, &out, 4, Some(&first.run_dir)).unwrap();
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), expected);
    same_final_state(&resumed.run_dir, &straight.run_dir, "rl-000004.ckpt");
}

#[test]
fn monte_carlo_credit_values_states_by_continuations_and_resumes_exactly() {
    let _guard = serial();
    // A warm-up long enough for the tiny policy to learn the one call `done()`, so episodes
    // earn reward and the continuations' returns (the state values) are not all 0.
    let source = TINY
        .replace(
            "task kg { env = kg, max_turns = 2, difficulty = 1 }",
            "task present { env = crate::Present, max_turns = 2 }",
        )
        .replace(
            "algorithm grpo { group_size = 2, kl = k1(0.1, as = reward), entropy = 0.001, sft = constant(0.1) }",
            "algorithm reinforce_pp { credit = monte_carlo(k = 3, turns = 0 .. 1), gamma = 0.9 }",
        )
        .replace(
            "warmup = sft { steps = 3, demonstrations = 8, batch = 2 }",
            "warmup = sft { steps = 40, lr = 1e-2, demonstrations = 8, batch = 4 }",
        )
        .replace("tiny_resume", "tiny_monte_carlo");
    let experiment = WithPresent::solved_anyway(&source);
    let straight = run_experiment(&experiment, &scratch("mc-straight"), 4, None).unwrap();
    let expected = common::metrics_without_timings(&straight.run_dir);
    let rl: Vec<&serde_json::Value> = expected.iter().filter(|l| l["phase"] == "rl").collect();
    assert_eq!(rl.len(), 4);
    for line in &rl {
        // Every episode is snapshotted at the start (boundary 0) with 3 continuations, and
        // again after turn 1 if it is still running: 12 to 24 continuations for 4 episodes.
        let continuations = line["mc_continuations"].as_u64().unwrap();
        assert!((12..=24).contains(&continuations), "{line}");
        // A continuation from the start earns 1 when it calls `done()` on its first turn (or
        // 0.9 on its second); its mean is the state value.
        let value = line["mc_value"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&value), "{line}");
    }
    let mean_value = rl
        .iter()
        .map(|l| l["mc_value"].as_f64().unwrap())
        .sum::<f64>()
        / 4.0;
    let success = rl
        .iter()
        .map(|l| l["success"].as_f64().unwrap())
        .sum::<f64>()
        / 4.0;
    assert!(
        mean_value > 0.3 && success > 0.3,
        "the warmed-up policy calls done(): value {mean_value}, success {success}"
    );

    let out = scratch("mc-split");
    let first = run_experiment(&experiment, &out, 2, None).unwrap();
    let resumed = run_experiment(&experiment, &out, 4, Some(&first.run_dir)).unwrap();
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), expected);
}

#[test]
fn cross_policy_sampling_mixes_versions_and_resumes_exactly() {
    let _guard = serial();
    // Stale engines refreshed every 2 updates: at steps 2 and 4 they are one version behind.
    let source = TINY
        .replace(
            "algorithm grpo { group_size = 2, kl",
            "pool { engines = 2, stale = 1 { refresh_every = 2 }, cross_policy = 0.5, \
             max_staleness = 2 }\n    algorithm grpo { group_size = 2, is_cap = 2, kl",
        )
        .replace("tiny_resume", "tiny_cross_policy");
    let straight = run(&source, &scratch("cross-straight"), 4, None).unwrap();
    let expected = common::metrics_without_timings(&straight.run_dir);
    let rl: Vec<&serde_json::Value> = expected.iter().filter(|l| l["phase"] == "rl").collect();
    assert_eq!(rl.len(), 4);
    for line in &rl {
        let step = line["step"].as_u64().unwrap();
        let staleness = line["staleness"].as_object().unwrap();
        // At steps 1 and 3 the stale engine was just refreshed: every turn is version-fresh.
        let behind: Vec<&String> = staleness.keys().collect();
        if step % 2 == 1 {
            assert_eq!(behind, ["0"], "{line}");
            assert_eq!(line["stale_turns"].as_f64(), Some(0.0));
        } else {
            assert!(staleness.contains_key("1"), "{line}");
            let stale = line["stale_turns"].as_f64().unwrap();
            assert!(stale > 0.0 && stale < 1.0, "{line}");
        }
        assert_eq!(line["dropped"].as_u64(), Some(0), "{line}");
    }
    let out = scratch("cross-split");
    let first = run(&source, &out, 1, None).unwrap();
    let resumed = run(&source, &out, 4, Some(&first.run_dir)).unwrap();
    assert_eq!(common::metrics_without_timings(&resumed.run_dir), expected);
    same_final_state(&resumed.run_dir, &straight.run_dir, "rl-000004.ckpt");
}

#[test]
fn a_run_stopped_at_any_step_resumes_to_the_straight_run() {
    let _guard = serial();
    let straight = run(TINY, &scratch("every-straight"), 4, None).unwrap();
    let expected = common::metrics_without_timings(&straight.run_dir);
    // Stopped after the warm-up (RL step 0), and after every RL step; step 2 is the test above.
    for stop in [0, 1, 3] {
        let out = scratch(&format!("every-{stop}"));
        let first = run(TINY, &out, stop, None).unwrap();
        let resumed = run(TINY, &out, 4, Some(&first.run_dir)).unwrap();
        assert_eq!(
            common::metrics_without_timings(&resumed.run_dir),
            expected,
            "stopped at {stop}"
        );
        same_final_state(&resumed.run_dir, &straight.run_dir, "rl-000004.ckpt");
    }
}

/// [`TINY`] with the learning rates blown up: the first update makes the weights so large
/// that every later forward pass overflows, so every later update is non-finite.
fn exploding(warmup_lr: &str, rl_lr: &str, max_skips: u32) -> String {
    TINY.replace(
        "lr = 1e-3",
        &format!("lr = {rl_lr}, max_nonfinite_skips = {max_skips}"),
    )
    .replace(
        "warmup = sft { steps = 3,",
        &format!("warmup = sft {{ lr = {warmup_lr}, steps = 3,"),
    )
}

#[test]
fn nonfinite_updates_are_skipped_counted_and_stop_the_run_after_the_limit() {
    let _guard = serial();
    // Warm-up step 1 applies its huge update; steps 2 and 3 overflow and are skipped. Two in a
    // row is under the limit of 3, so the run goes on (its RL steps, on a policy whose every
    // output is now uniform, have all-zero advantages and are skipped as such).
    let out = scratch("nonfinite-warmup");
    let summary = run(&exploding("1e30", "1e-3", 3), &out, 4, None).unwrap();
    let lines = common::metrics_without_timings(&summary.run_dir);
    let sft: Vec<&serde_json::Value> = lines.iter().filter(|l| l["phase"] == "sft").collect();
    assert_eq!(sft.len(), 3);
    assert!(sft[0].get("skipped_nonfinite").is_none(), "{:?}", sft[0]);
    assert!(sft[0]["loss"].as_f64() > Some(0.0), "{:?}", sft[0]);
    for line in &sft[1..] {
        assert_eq!(line["skipped_nonfinite"], true, "{line:?}");
        assert_eq!(
            (&line["loss"], &line["grad_norm"]),
            (&0.0.into(), &0.0.into())
        );
    }
    let report = std::fs::read_to_string(summary.run_dir.join("report.md")).unwrap();
    assert!(
        report.contains("| updates skipped (loss or gradient not finite) | 2 |"),
        "{report}"
    );
    // The skipped updates left the weights as step 1 made them: finite.
    let policy = common::tiny_policy_config(&summary.run_dir)
        .init::<Flex>(&Default::default())
        .load_file(
            summary.run_dir.join("policy.mpk"),
            &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
            &Default::default(),
        )
        .unwrap();
    let weights = common::parameter_bits(&policy);
    assert!(
        weights
            .iter()
            .flatten()
            .all(|bits| f32::from_bits(*bits).is_finite()),
        "a weight is not finite"
    );

    // With a limit of 2, the second skip in a row ends the run with an error saying so.
    let error = run(
        &exploding("1e30", "1e-3", 2),
        &scratch("nonfinite-two"),
        4,
        None,
    )
    .unwrap_err();
    let RunError::NonFinite { skipped, at, .. } = &error else {
        panic!("expected NonFinite, got {error}");
    };
    assert_eq!((*skipped, *at), (2, Update::Warmup { step: 3 }), "{error}");
    assert!(
        error.to_string().contains("(the last: warm-up step 3,"),
        "{error}"
    );
    let message = error.to_string();
    assert!(message.contains("max_nonfinite_skips"), "{message}");
}

#[test]
fn a_skipped_rl_update_is_recorded_with_its_alert() {
    let _guard = serial();
    // A sane warm-up, then an RL learning rate that blows the weights up at step 1: step 2's
    // update is skipped, recorded and alerted, and the run stops at step 3 (limit 2).
    let out = scratch("nonfinite-rl");
    let error = run(&exploding("1e-3", "1e30", 2), &out, 4, None).unwrap_err();
    assert!(
        matches!(
            &error,
            RunError::NonFinite {
                skipped: 2,
                at: Update::Rl { step: 3 },
                ..
            }
        ),
        "{error}"
    );
    let run_dir = common::run_dir_of(&out, "tiny_resume");
    let lines = common::metrics_without_timings(&run_dir);
    let rl: Vec<&serde_json::Value> = lines.iter().filter(|l| l["phase"] == "rl").collect();
    assert_eq!(rl.len(), 2, "{rl:?}");
    assert!(rl[0].get("skipped_nonfinite").is_none(), "{:?}", rl[0]);
    assert_eq!(rl[1]["skipped_nonfinite"], 1, "{:?}", rl[1]);
    assert_eq!(
        rl[1]["alerts"],
        serde_json::json!(["nonfinite"]),
        "{:?}",
        rl[1]
    );
}
