//! One supervised warm-up for every run of an invocation that would train it identically.
//!
//! The runs of a sweep often differ only in what happens after the warm-up: an ablation of
//! `pool.cross_policy` or `algorithm.advantage_norm`, a different RL learning rate. Their
//! warm-ups (oracle demonstrations, tokenizer, SFT steps, the evaluation after them) are then
//! the same computation, so the first run of such a family keeps its state at the end of the
//! warm-up here and the others start from it, as a run resumed from that checkpoint would.
//!
//! Invariant: a run that starts from a shared warm-up writes exactly what it would have written
//! alone (metrics lines, samples, recorded episodes, and from there on every RL step). This holds
//! because the key is everything the warm-up reads ([`key`]), and because a resumed run goes on
//! bit for bit (see [`crate::checkpoint`]). The cache lives for one invocation (a sweep, or the
//! files of one `agentry run`), in a folder of the output root removed when it is dropped, so a
//! later build of the code can never pick up a warm-up an earlier one trained.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use agentry_dsl::spec;

use crate::metrics::RunDirError;

/// The metrics lines of the warm-up, in a cache entry (not `metrics.jsonl`, so that nothing
/// looking for run directories mistakes an entry for one).
const METRICS: &str = "warmup-metrics.jsonl";

/// Files of a run directory that belong to the run itself, not to its warm-up.
const OWN_FILES: [&str; 3] = ["metrics.jsonl", "config.json", "experiment.json"];

/// Warm-ups kept for the other runs of one invocation, by [`key`].
#[derive(Debug)]
pub struct SharedWarmups {
    dir: PathBuf,
    /// The warm-ups two or more of the invocation's runs would train (by [`spec_key`]): only
    /// those are worth keeping, since a kept warm-up is a checkpoint written to disk.
    shared: BTreeSet<String>,
    entries: Mutex<BTreeMap<String, Entry>>,
}

/// A kept warm-up: a folder holding its checkpoint, its metrics lines and the files its
/// evaluation wrote, and the run that trained it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The folder.
    pub dir: PathBuf,
    /// The checkpoint of the state at the end of the warm-up, inside the folder.
    pub checkpoint: PathBuf,
    /// The run directory that trained the warm-up.
    pub trained_by: PathBuf,
}

impl Entry {
    /// The warm-up's `metrics.jsonl` lines.
    pub fn metrics(&self) -> Result<Vec<u8>, RunDirError> {
        let path = self.dir.join(METRICS);
        std::fs::read(&path).map_err(RunDirError::io(path))
    }

    /// Copies the files the warm-up's evaluation wrote (samples, recorded episodes, the
    /// tokenizer) into a fresh run directory.
    pub fn copy_files_to(&self, run_dir: &Path) -> Result<(), RunDirError> {
        copy_tree(&self.dir, run_dir, &|relative| {
            relative != Path::new(METRICS) && !relative.starts_with(crate::checkpoint::DIR)
        })
    }
}

impl SharedWarmups {
    /// A cache for the runs of an invocation, which will run `experiments` (each resolved
    /// experiment with its seed set), in a new folder `root/.shared-warmups-<pid>-<ms>`; `None`
    /// when no two of them would train the same warm-up (a sweep over seeds alone, say).
    pub fn for_runs<'a>(
        root: &Path,
        experiments: impl IntoIterator<Item = &'a spec::Experiment>,
    ) -> Result<Option<Self>, RunDirError> {
        let mut seen = BTreeSet::new();
        let mut shared = BTreeSet::new();
        for key in experiments.into_iter().filter_map(spec_key) {
            if !seen.insert(key.clone()) {
                shared.insert(key);
            }
        }
        if shared.is_empty() {
            return Ok(None);
        }

        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let dir = root.join(format!(".shared-warmups-{}-{started}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(RunDirError::io(&dir))?;
        Ok(Some(SharedWarmups {
            dir,
            shared,
            entries: Mutex::new(BTreeMap::new()),
        }))
    }

    /// The key of `spec`'s warm-up on `device` with these task versions, when another run of
    /// the invocation would train the same one.
    pub fn key(
        &self,
        spec: &spec::Experiment,
        device: &str,
        task_versions: &BTreeMap<String, String>,
    ) -> Option<String> {
        let spec_key = spec_key(spec)?;
        self.shared
            .contains(&spec_key)
            .then(|| key_of(&spec_key, device, task_versions))
            .flatten()
    }

    /// The warm-up kept under `key`, if a run of this invocation trained it.
    pub fn get(&self, key: &str) -> Option<Entry> {
        self.lock().get(key).cloned()
    }

    /// Keeps the warm-up `run_dir` has just finished: its metrics so far, the files its
    /// evaluation wrote, and the checkpoint `save` writes into the folder it is given (it
    /// returns the file's path).
    pub fn keep<E: From<RunDirError>>(
        &self,
        key: &str,
        run_dir: &Path,
        save: impl FnOnce(&Path) -> Result<PathBuf, E>,
    ) -> Result<(), E> {
        let dir = self.dir.join(self.lock().len().to_string());
        std::fs::create_dir_all(&dir).map_err(RunDirError::io(&dir))?;
        copy_tree(run_dir, &dir, &|relative| {
            !relative.starts_with(crate::checkpoint::DIR)
                && !OWN_FILES.iter().any(|own| relative == Path::new(own))
        })?;
        let (from, to) = (run_dir.join("metrics.jsonl"), dir.join(METRICS));
        std::fs::copy(&from, &to).map_err(RunDirError::io(&from))?;
        let checkpoint = save(&dir)?;
        self.lock().insert(
            key.to_string(),
            Entry {
                dir,
                checkpoint,
                trained_by: run_dir.to_path_buf(),
            },
        );
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for SharedWarmups {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What a run's warm-up depends on: two runs with the same key train the same warm-up. `None`
/// when the run has no warm-up, or writes warm-up checkpoints of its own (`checkpoint_every`),
/// which hold its experiment and so cannot be shared.
///
/// The key is the resolved experiment without what only RL reads (its name, the sweep, the
/// algorithm but its `grad_clip`, which clips the warm-up's gradients too, the pool but its
/// `placement`, and `train.steps`, `batch`, `lr`: `WarmupInputs`), plus the device and the
/// task versions.
/// Leaving something out wrongly would share a warm-up that differs; keeping something in
/// needlessly only trains a warm-up twice, so everything else stays in.
pub fn key(
    spec: &spec::Experiment,
    device: &str,
    task_versions: &BTreeMap<String, String>,
) -> Option<String> {
    key_of(&spec_key(spec)?, device, task_versions)
}

fn key_of(
    spec_key: &str,
    device: &str,
    task_versions: &BTreeMap<String, String>,
) -> Option<String> {
    serde_json::to_string(&(spec_key, device, task_versions)).ok()
}

/// The experiment's part of [`key`]: its [`WarmupInputs`].
fn spec_key(spec: &spec::Experiment) -> Option<String> {
    serde_json::to_string(&WarmupInputs::of(spec)?).ok()
}

/// Everything of an experiment its warm-up may read, borrowed from it. Every spec struct is
/// destructured whole, without `..`, so a field added or renamed in the language is a compile
/// error here until someone decides whether the warm-up reads it (if unsure, it does).
#[derive(serde::Serialize)]
struct WarmupInputs<'a> {
    seed: u64,
    device: &'a spec::Device,
    model: &'a spec::Model,
    tasks: &'a [spec::Task],
    curriculum: &'a [spec::Stage],
    /// The one algorithm key the warm-up reads: it clips the warm-up's gradients too.
    grad_clip: Option<f64>,
    /// Where the engines run: the only pool key that reaches the warm-up (its devices).
    placement: &'a spec::Placement,
    optimizer: &'a spec::Optimizer,
    temperature: f64,
    top_p: f64,
    top_k: Option<usize>,
    stop: &'a [String],
    max_new_tokens: usize,
    warmup: &'a spec::Warmup,
    max_nonfinite_skips: u32,
    eval: &'a spec::Eval,
}

impl<'a> WarmupInputs<'a> {
    /// `None` when the run has no warm-up, or writes warm-up checkpoints of its own
    /// (`checkpoint_every`), which hold its experiment and so cannot be shared.
    fn of(spec: &'a spec::Experiment) -> Option<Self> {
        let spec::Experiment {
            name: _,
            seed,
            device,
            model,
            tasks,
            curriculum,
            algorithm,
            pool,
            train,
            eval,
            sweep: _,
        } = spec;
        let spec::Algorithm {
            kind: _,
            group_size: _,
            clip: _,
            dual_clip: _,
            kl: _,
            entropy: _,
            advantage_norm: _,
            aggregation: _,
            sft: _,
            sft_from: _,
            is_cap: _,
            filter: _,
            negative_weight: _,
            credit: _,
            gamma: _,
            lambda: _,
            epochs: _,
            grad_clip,
            value_clip: _,
            value_coef: _,
        } = algorithm;
        let spec::Pool {
            engines: _,
            stale: _,
            refresh_every: _,
            cross_policy: _,
            max_staleness: _,
            mode: _,
            placement,
            interrupt: _,
            env_workers: _,
        } = pool;
        let spec::Train {
            steps: _,
            batch: _,
            lr: _,
            optimizer,
            temperature,
            top_p,
            top_k,
            stop,
            max_new_tokens,
            warmup,
            checkpoint_every,
            max_nonfinite_skips,
            // Recomputation changes the memory an update takes, and replicas where it is
            // computed, not its result (up to the order of a few float sums), so runs that
            // differ in them share a warm-up.
            recompute: _,
            data_parallel: _,
        } = train;
        if checkpoint_every.is_some() {
            return None;
        }
        Some(WarmupInputs {
            seed: *seed,
            device,
            model,
            tasks,
            curriculum,
            grad_clip: *grad_clip,
            placement,
            optimizer,
            temperature: *temperature,
            top_p: *top_p,
            top_k: *top_k,
            stop,
            max_new_tokens: *max_new_tokens,
            warmup: warmup.as_ref()?,
            max_nonfinite_skips: *max_nonfinite_skips,
            eval,
        })
    }
}

/// Copies the files under `from` whose path relative to it `keep` accepts into `to`.
fn copy_tree(from: &Path, to: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<(), RunDirError> {
    let mut pending = vec![from.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).map_err(RunDirError::io(&dir))? {
            let path = entry.map_err(RunDirError::io(&dir))?.path();
            let relative = path.strip_prefix(from).unwrap_or(&path).to_path_buf();
            if path.is_dir() {
                pending.push(path);
            } else if keep(&relative) {
                let target = to.join(&relative);
                if let Some(parent) = target.parent() {
                    std::fs::create_dir_all(parent).map_err(RunDirError::io(parent))?;
                }
                std::fs::copy(&path, &target).map_err(RunDirError::io(&path))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `rest` may hold an `algorithm` block; a default one is added otherwise.
    fn spec(train: &str, rest: &str) -> spec::Experiment {
        let algorithm = if rest.contains("algorithm") {
            ""
        } else {
            "algorithm grpo { group_size = 4 }"
        };
        agentry_dsl::check(&format!(
            "experiment e {{
                model policy {{ arch = transformer {{ layers = 1, d_model = 16, heads = 2 }} }}
                task kg {{ env = kg }}
                train {{ steps = 10, batch = 8, {train} }}
                {algorithm}
                {rest}
            }}"
        ))
        .expect("the test experiment checks")
        .into_inner()
    }

    fn key_of(spec: &spec::Experiment) -> Option<String> {
        key(
            spec,
            "flex",
            &BTreeMap::from([("kg".into(), "kg-1".into())]),
        )
    }

    /// With its own `lr`: without one, the warm-up takes the training `lr`.
    const WARMUP: &str = "warmup = sft { steps = 5, lr = 0.005 }";

    #[test]
    fn what_only_rl_reads_leaves_the_key_alone() {
        let base = key_of(&spec(WARMUP, "algorithm grpo { group_size = 4 }"));
        assert!(base.is_some());
        for (train, rest) in [
            (
                format!("{WARMUP}, lr = 0.01"),
                "algorithm grpo { group_size = 2, advantage_norm = per_task }",
            ),
            (
                WARMUP.to_string(),
                "algorithm rloo { group_size = 4 }\npool { engines = 2, stale = 1, cross_policy = 0.5 }",
            ),
        ] {
            let mut other = spec(&train, rest);
            other.name = "renamed".into();
            other.train.steps = 99;
            other.train.batch = 4;
            assert_eq!(key_of(&other), base, "{train} {rest}");
        }
    }

    #[test]
    fn what_the_warmup_reads_changes_the_key() {
        let base = spec(WARMUP, "");
        let key = key_of(&base);
        let mut seed = base.clone();
        seed.seed += 1;
        for other in [
            seed,
            spec("warmup = sft { steps = 6, lr = 0.005 }", ""),
            // The warm-up's `lr` defaults to the training one.
            spec("warmup = sft { steps = 5 }, lr = 0.007", ""),
            spec(&format!("{WARMUP}, max_new_tokens = 9"), ""),
            spec(WARMUP, "eval { episodes = 3 }"),
            // The warm-up's steps clip gradients as RL's do.
            spec(WARMUP, "algorithm grpo { group_size = 4, grad_clip = 0.5 }"),
        ] {
            assert_ne!(key_of(&other), key);
        }
        let versions = BTreeMap::from([("kg".into(), "kg-2".into())]);
        assert_ne!(super::key(&base, "flex", &versions), key);
        assert_ne!(
            super::key(
                &base,
                "wgpu",
                &BTreeMap::from([("kg".into(), "kg-1".into())])
            ),
            key
        );
    }

    #[test]
    fn a_cache_is_made_only_for_runs_that_would_share_a_warmup() {
        let root = std::env::temp_dir().join(format!("agentry-shared-{}", std::process::id()));
        let one = spec(WARMUP, "");
        let mut seed = one.clone();
        seed.seed += 1;
        // Seeds alone: every warm-up differs, nothing is worth keeping.
        assert!(
            SharedWarmups::for_runs(&root, [&one, &seed])
                .unwrap()
                .is_none()
        );
        let mut rl = one.clone();
        rl.train.lr = 0.5;
        let cache = SharedWarmups::for_runs(&root, [&one, &seed, &rl])
            .unwrap()
            .expect("two runs share a warm-up");
        let versions = BTreeMap::from([("kg".into(), "kg-1".into())]);
        assert_eq!(
            cache.key(&one, "flex", &versions),
            key(&one, "flex", &versions)
        );
        assert_eq!(
            cache.key(&rl, "flex", &versions),
            key(&one, "flex", &versions)
        );
        assert_eq!(
            cache.key(&seed, "flex", &versions),
            None,
            "no other run shares it"
        );
        let dir = cache.dir.clone();
        assert!(dir.is_dir());
        drop(cache);
        assert!(!dir.exists(), "the cache's folder goes with it");
    }

    #[test]
    fn runs_without_a_warmup_or_with_warmup_checkpoints_share_nothing() {
        assert_eq!(key_of(&spec("lr = 0.01", "")), None);
        assert_eq!(
            key_of(&spec(&format!("{WARMUP}, checkpoint_every = 2"), "")),
            None
        );
    }
}
