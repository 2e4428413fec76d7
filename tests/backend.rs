//! Training runs for real on each backend compiled in: flex always, and with `--features wgpu`
//! the wgpu adapter of kind CPU (Mesa's lavapipe on a machine without a GPU).

use agentry::{Interpreted, RunOptions, RunSummary};
use burn::backend::Autodiff;

/// A tiny experiment: a few warm-up steps and two RL steps.
const TINY: &str = r#"
experiment tiny {
    seed = 3
    model policy { arch = transformer { layers = 1, d_model = 32, heads = 2, ffn = 64, context = 128 } }
    task kg { env = kg, max_turns = 3, difficulty = 1 }
    algorithm grpo { group_size = 4, kl = low_var_kl(0.01), entropy = 0.001, sft = constant(0.1) }
    train {
        steps = 2, batch = 8, lr = 1e-3, max_new_tokens = 16
        warmup = sft { steps = 3, demonstrations = 16, batch = 4 }
    }
    eval { episodes = 4 }
}
"#;

/// burn seeds weight initialization through a per-backend global RNG, so runs in one process
/// must not overlap; the test harness runs tests on several threads.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn options(dir: &tempdir::Dir) -> RunOptions {
    RunOptions {
        out: dir.path().to_path_buf(),
        quiet: true,
        ..RunOptions::default()
    }
}

fn check_run(summary: &RunSummary) {
    assert_eq!(summary.steps, 2);
    let metrics = std::fs::read_to_string(summary.run_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).expect("every metrics line is JSON"))
        .collect();
    let phases: Vec<&str> = lines.iter().map(|l| l["phase"].as_str().unwrap()).collect();
    // `eval.decoding = both` (the default): a greedy and a sampled evaluation at each point.
    assert_eq!(
        phases,
        [
            "sft", "sft", "sft", "eval", "eval", "rl", "rl", "eval", "eval"
        ]
    );
    for line in &lines {
        if let Some(loss) = line.get("loss") {
            assert!(loss.as_f64().is_some_and(f64::is_finite), "{line}");
        }
    }
    for file in [
        "experiment.json",
        "task_versions.json",
        "tokenizer.json",
        "summary.json",
        "policy.mpk",
    ] {
        assert!(summary.run_dir.join(file).is_file(), "{file} missing");
    }
}

/// Runs `source` (the tiny experiment, or a variant of it) on backend `B` and checks what it
/// wrote.
fn trains_on<B: agentry::model::TrainBackend>(name: &str, source: &str, device: B::Device) {
    let _serial = serial();
    let spec = agentry::dsl::check(source).unwrap();
    let dir = tempdir::Dir::new(name);
    let summary = agentry::train::run_on::<B>(&Interpreted(spec), &options(&dir), device).unwrap();
    check_run(&summary);
}

#[test]
fn trains_on_flex() {
    trains_on::<Autodiff<burn::backend::Flex>>("flex", TINY, Default::default());
}

#[cfg(feature = "wgpu")]
#[test]
fn trains_on_wgpu_cpu_adapter() {
    trains_on::<Autodiff<burn::backend::Wgpu>>("wgpu", TINY, burn::backend::wgpu::WgpuDevice::Cpu);
}

/// Recomputed blocks (`train { recompute = true }`) on the decomposed ops of a GPU backend: the
/// per-block backward passes run wherever autodiff does.
#[cfg(feature = "wgpu")]
#[test]
fn trains_on_wgpu_with_recomputed_blocks() {
    let source = TINY.replace(
        "max_new_tokens = 16",
        "max_new_tokens = 16, recompute = true",
    );
    assert!(agentry::dsl::check(&source).unwrap().train.recompute);
    trains_on::<Autodiff<burn::backend::Wgpu>>(
        "wgpu-recompute",
        &source,
        burn::backend::wgpu::WgpuDevice::Cpu,
    );
}

/// Disaggregated placement across two real devices: the trainer on wgpu's default adapter, the
/// rollout engines on the adapter of kind CPU (two separate device handles, even when both are
/// lavapipe), with every new version of the weights copied across.
#[cfg(feature = "wgpu")]
#[test]
fn trains_on_wgpu_with_engines_on_another_device() {
    use burn::backend::wgpu::WgpuDevice;
    let _serial = serial();
    let source = TINY.replace(
        "    train {",
        "    pool { engines = 2, mode = async, max_staleness = 2 }\n    train {",
    );
    let spec = agentry::dsl::check(&source).unwrap();
    let dir = tempdir::Dir::new("wgpu-disaggregated");
    let summary = agentry::train::run_on_devices::<Autodiff<burn::backend::Wgpu>>(
        &Interpreted(spec),
        &options(&dir),
        WgpuDevice::DefaultDevice,
        vec![WgpuDevice::Cpu],
    )
    .unwrap();
    check_run(&summary);
    let metrics = std::fs::read_to_string(summary.run_dir.join("metrics.jsonl")).unwrap();
    let synced: f64 = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["phase"] == "rl")
        .map(|l| l["weight_sync_seconds"].as_f64().unwrap())
        .sum();
    assert!(synced > 0.0, "the engines copied no weights");
}

/// Same seed, same run, bit for bit, on the CPU backend. (GPU backends, lavapipe included, reduce
/// in a scheduling-dependent order, so their losses may differ in the last bits between runs.)
#[test]
fn same_seed_same_run() {
    let _serial = serial();
    let spec = agentry::dsl::check(TINY).unwrap();
    let metrics = |name: &str| {
        let dir = tempdir::Dir::new(name);
        let summary = agentry::train::run_on::<Autodiff<burn::backend::Flex>>(
            &Interpreted(spec.clone()),
            &options(&dir),
            Default::default(),
        )
        .unwrap();
        let text = std::fs::read_to_string(summary.run_dir.join("metrics.jsonl")).unwrap();
        // Wall-clock times differ between runs; everything else must not.
        text.lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                if let Some(o) = v.as_object_mut() {
                    o.remove("rollout_seconds");
                    o.remove("update_seconds");
                    o.remove("trajectories_per_second");
                }
                v
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(metrics("a"), metrics("b"));
}

mod tempdir {
    use std::path::{Path, PathBuf};

    /// A directory under the target dir, removed when dropped.
    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new(name: &str) -> Self {
            let path = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("backend-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).unwrap();
            Dir(path)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
