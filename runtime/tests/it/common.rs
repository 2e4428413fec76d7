//! Scaffolding the runtime's integration tests share (and the root crate's `tests/cli.rs`, which
//! includes this file by path): one user of burn's global RNG at a time, scratch directories
//! under the target dir, tiny runs on flex, and reading what they leave (metrics, JSON files,
//! directory listings).
//!
//! All the runtime's integration tests are modules of one test binary (`tests/it/main.rs`), so
//! they run as threads of one process and share its global state. The one piece of it a test
//! depends on is burn's weight-initialization RNG: it is global per backend (and
//! `Autodiff<Flex>` seeds flex's), so a seed and the draws that must follow it in order (building
//! a policy, or a whole run, which seeds it from the experiment) hold [`serial`]. No test sets
//! environment variables, changes the current directory or sizes rayon's global pool.

// Each includer uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use agentry_runtime::model::{Policy, PolicyConfig};
use agentry_runtime::text::Tokenizer;
use agentry_runtime::{Experiment, Interpreted, RunError, RunOptions, RunSummary};
use burn::backend::{Autodiff, Flex};
use burn::module::{Module, ModuleVisitor, Param};
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

/// burn seeds weight initialization through a per-backend global RNG, so runs (and anything
/// that seeds it and builds a policy) in one process must not overlap.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the one-run lock until dropped (a test that panicked while holding it does not
/// poison the others). Not reentrant: a test that holds it calls nothing that takes it.
pub fn serial() -> MutexGuard<'static, ()> {
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

/// Seeds burn's global RNG for `B` with `seed`, runs `init` (which builds a module from it)
/// and draws every parameter of the module, all under [`serial`], so no other test reseeds or
/// draws from that RNG in between. The draw matters: burn gives a parameter its initial value
/// at its first use, which would otherwise happen after the lock is released, racing with
/// other tests' draws.
pub fn seeded<B: Backend, M: Module<B>>(
    device: &B::Device,
    seed: u64,
    init: impl FnOnce(&B::Device) -> M,
) -> M {
    seeded_run::<B, _>(device, seed, |device| {
        let module = init(device);
        agentry_runtime::model::draw_weights(&module);
        module
    })
}

/// Seeds burn's global RNG for `B` with `seed` and runs `f`, which draws from it (dropout
/// masks, say) and from nothing drawn lazily after it returns, under [`serial`].
pub fn seeded_run<B: Backend, T>(
    device: &B::Device,
    seed: u64,
    f: impl FnOnce(&B::Device) -> T,
) -> T {
    let _guard = serial();
    B::seed(device, seed);
    f(device)
}

/// Two tools of the KG task (`get_neighbors(variable, relation)`, `count(variable)`), with
/// short descriptions: what the chat-format tests render (the Hugging Face fixtures'
/// reference chats were made from these).
pub fn kg_tools() -> Vec<agentry_runtime::env::ToolSchema> {
    use agentry_runtime::env::{Param, ParamKind, ToolSchema};
    vec![
        ToolSchema::new(
            "get_neighbors",
            "neighbors",
            vec![
                Param::required("variable", ParamKind::String, "v"),
                Param::required("relation", ParamKind::String, "r"),
            ],
        ),
        ToolSchema::new(
            "count",
            "count",
            vec![Param::required("variable", ParamKind::String, "v")],
        ),
    ]
}

/// A fresh, empty `CARGO_TARGET_TMPDIR/<suite>/<name>`.
pub fn scratch_in(suite: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(suite)
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The experiment `source` declares (which must check).
pub fn experiment(source: &str) -> Interpreted {
    Interpreted(agentry_dsl::check(source).expect("the test experiment checks"))
}

/// Runs `experiment` quietly on flex (with autodiff) into `out`, for `steps` (all of them when
/// `None`) and resuming from `resume`. The caller holds [`serial`].
pub fn run_on_flex(
    experiment: &dyn Experiment,
    out: &Path,
    steps: Option<u64>,
    resume: Option<&Path>,
) -> Result<RunSummary, RunError> {
    let options = RunOptions {
        out: out.to_path_buf(),
        steps,
        quiet: true,
        resume: resume.map(Path::to_path_buf),
        ..RunOptions::default()
    };
    agentry_runtime::train::run_on::<Autodiff<Flex>>(experiment, &options, Default::default())
}

/// The JSON file at `path` (a run's `summary.json`, a checkpoint's `config.json`, ...), parsed;
/// a missing or malformed file fails the test naming it.
pub fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON array of token ids (a reference fixture's), as ids.
pub fn ids(value: &serde_json::Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The names of the entries of `dir`, sorted (so a listing compares as a list).
pub fn entry_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The run directory of experiment `name` under the root `out`, for a test that ran it there
/// once: the first entry of `out/NAME` (run directories are `out/NAME/seedS-...`).
pub fn run_dir_of(out: &Path, name: &str) -> PathBuf {
    std::fs::read_dir(out.join(name))
        .unwrap()
        .next()
        .expect("the experiment ran here")
        .unwrap()
        .path()
}

/// Every line of a run's `metrics.jsonl`.
pub fn metrics(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Each warm-up step's and RL step's (last epoch's) loss and gradient norm, in order.
pub fn losses(run_dir: &Path) -> Vec<(f64, f64)> {
    metrics(run_dir)
        .iter()
        .filter(|l| matches!(l["phase"].as_str(), Some("sft" | "rl")))
        .filter_map(|l| Some((l["loss"].as_f64()?, l["grad_norm"].as_f64()?)))
        .collect()
}

/// The evaluation lines of a run's `metrics.jsonl`, in order.
pub fn eval_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    metrics(run_dir)
        .into_iter()
        .filter(|line| line["phase"] == "eval")
        .collect()
}

/// Which evaluation an evaluation line is: its step, label and decoding.
pub fn eval_point(line: &serde_json::Value) -> (u64, String, String) {
    (
        line["step"].as_u64().unwrap(),
        line["label"].as_str().unwrap().to_string(),
        line["decoding"].as_str().unwrap().to_string(),
    )
}

/// The metrics lines of a run with its wall-clock fields (`*_seconds`,
/// `trajectories_per_second`) removed: everything else of two equal runs must match exactly.
pub fn metrics_without_timings(run_dir: &Path) -> Vec<serde_json::Value> {
    metrics(run_dir)
        .into_iter()
        .map(|mut value| {
            if let Some(object) = value.as_object_mut() {
                object.retain(|key, _| {
                    !key.ends_with("_seconds") && key != "trajectories_per_second"
                });
            }
            value
        })
        .collect()
}

/// The bits of every float parameter, in module order.
pub fn parameter_bits(policy: &Policy<Flex>) -> Vec<Vec<u32>> {
    struct Bits(Vec<Vec<u32>>);
    impl ModuleVisitor<Flex> for Bits {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<Flex, D>>) {
            let values = param.val().into_data().into_vec::<f32>().unwrap();
            self.0.push(values.into_iter().map(f32::to_bits).collect());
        }
    }
    let mut bits = Bits(Vec::new());
    policy.visit(&mut bits);
    bits.0
}

/// The shape of the tests' tiny policy (1 layer, d_model 16, 2 heads, ffn 32, context 128),
/// with the run's tokenizer.
pub fn tiny_policy_config(run_dir: &Path) -> PolicyConfig {
    let tokenizer = Tokenizer::load(run_dir.join("tokenizer.json")).unwrap();
    PolicyConfig {
        vocab: tokenizer.vocab_size(),
        layers: 1,
        d_model: 16,
        heads: 2,
        kv_heads: 2,
        ffn: 32,
        context: 128,
        tie_embeddings: true,
    }
}

/// The bits of a tiny policy's final weights (`policy.mpk`; the file itself also holds burn's
/// parameter ids, random per run), with a value head or not.
pub fn final_weight_bits(run_dir: &Path, value_head: bool) -> Vec<Vec<u32>> {
    let device = Default::default();
    let mut policy = tiny_policy_config(run_dir).init::<Flex>(&device);
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
    parameter_bits(&policy)
}
