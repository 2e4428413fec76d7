//! One supervised warm-up for every run of an invocation that would train it identically.
//!
//! The runs of a sweep often differ only in what happens after the warm-up: an ablation of
//! `pool.cross_policy` or `algorithm.advantage_norm`, a different RL learning rate. Their
//! warm-ups (oracle demonstrations, tokenizer, SFT steps, the evaluation after them) are then
//! the same computation, so the first run of such a family keeps its state at the end of the
//! warm-up here (a checkpoint) and the others start from it and from what that run's warm-up
//! wrote, exactly as `--warmup-from` starts a run from an earlier run's ([`Earlier`]).
//!
//! Invariant: a run that starts from a shared warm-up writes exactly what it would have written
//! alone (metrics lines, samples, recorded episodes, and from there on every RL step), but for
//! the warm-up's own checkpoints (`sft-*.ckpt`, with `checkpoint_every`): it writes only the one
//! at the warm-up's end, as its own, so it resumes from there. This holds
//! because the key is everything the warm-up reads ([`key`]), and because a resumed run goes on
//! bit for bit (see [`crate::checkpoint`]). The cache lives for one invocation (a sweep, or the
//! files of one `agentry run`), its checkpoints in a folder of the output root removed when it
//! is dropped, so a later build of the code never picks up a warm-up an earlier one trained
//! unless asked to with `--warmup-from`.
//!
//! Across invocations, `--warmup-from DIR` ([`Earlier::find`]) starts a run from the end of
//! a warm-up an earlier run trained and checkpointed (`checkpoints/rl-000000.ckpt`, written
//! when `train.checkpoint_every` is set), when that run's experiment reads the same warm-up
//! inputs and task versions, under the same invariant.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use agentry_dsl::spec;

use crate::checkpoint::{Checkpoint, CheckpointError, Phase};
use crate::metrics::RunDirError;

/// Warm-ups kept for the other runs of one invocation, by [`key`].
#[derive(Debug)]
pub struct SharedWarmups {
    dir: PathBuf,
    /// The warm-ups two or more of the invocation's runs would train (by [`spec_key`]): only
    /// those are worth keeping, since a kept warm-up is a checkpoint written to disk.
    shared: BTreeSet<String>,
    entries: Mutex<BTreeMap<String, Kept>>,
}

/// A kept warm-up: the checkpoint of the state at its end, in the cache's folder, and the run
/// directory that trained it, which holds its metrics lines and its evaluation's files.
#[derive(Clone, Debug)]
struct Kept {
    checkpoint: PathBuf,
    trained_by: PathBuf,
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

    /// The warm-up kept under `key`, if a run of this invocation trained it, to start from as
    /// from an earlier run's ([`Earlier`]): one route for both.
    pub fn get(&self, key: &str) -> Result<Option<Earlier>, CheckpointError> {
        let Some(kept) = self.lock().get(key).cloned() else {
            return Ok(None);
        };
        Ok(Some(Earlier {
            checkpoint: Checkpoint::read(&kept.checkpoint)?,
            run_dir: kept.trained_by,
        }))
    }

    /// Keeps the warm-up `run_dir` has just finished: the checkpoint `save` writes into the
    /// folder it is given (it returns the file's path). Its metrics lines and its evaluation's
    /// files stay in `run_dir`, where the run never rewrites them; the others copy them from
    /// there.
    pub fn keep<E: From<RunDirError>>(
        &self,
        key: &str,
        run_dir: &Path,
        save: impl FnOnce(&Path) -> Result<PathBuf, E>,
    ) -> Result<(), E> {
        let dir = self.dir.join(self.lock().len().to_string());
        std::fs::create_dir_all(&dir).map_err(RunDirError::io(&dir))?;
        let checkpoint = save(&dir)?;
        self.lock().insert(
            key.to_string(),
            Kept {
                checkpoint,
                trained_by: run_dir.to_path_buf(),
            },
        );
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Kept>> {
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
/// when the run has no warm-up.
///
/// The key is the resolved experiment without what only RL reads (its name, the sweep, the
/// algorithm but its `grad_clip`, which clips the warm-up's gradients too, the pool but its
/// `placement`, `train.steps`, `batch`, `lr` and `eval.every`: `WarmupInputs`), plus the device
/// and the task versions.
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

/// The checkpoint a run writes at the end of its warm-up (with `train.checkpoint_every` set).
const END_OF_WARMUP: &str = "rl-000000.ckpt";

/// How deep below `--warmup-from`'s folder run directories are looked for: the folder itself,
/// an experiment's folder of runs, or a root of experiments (`runs/EXPERIMENT/[CONFIG/]RUN`).
const SEARCH_DEPTH: usize = 3;

/// Why `--warmup-from` found no warm-up to start from. Each says what to change.
#[derive(Debug, thiserror::Error)]
pub enum WarmupFromError {
    /// The experiment has no warm-up.
    #[error("--warmup-from: the experiment has no `warmup`, so there is nothing to take")]
    NoWarmup,
    /// `--warmup-from` and `--resume` were both given.
    #[error("--warmup-from starts a new run and --resume continues one: give one of them")]
    WithResume,
    /// No run directory under the folder has an end-of-warm-up checkpoint.
    #[error(
        "--warmup-from `{dir}`: no run directory there (or up to {SEARCH_DEPTH} folders down) \
         holds `{}/{END_OF_WARMUP}`, the checkpoint a run writes at the end of its warm-up when \
         `train.checkpoint_every` is set",
        crate::checkpoint::DIR
    )]
    NoCheckpoint {
        /// The folder given.
        dir: PathBuf,
    },
    /// Runs with end-of-warm-up checkpoints exist, but none trained this run's warm-up.
    #[error(
        "--warmup-from `{dir}`: none of its {count} warm-ups is this run's (the seed, model, \
         tasks, warm-up and evaluation must be the same); {}",
        closest.join("; ")
    )]
    NoMatch {
        /// The folder given.
        dir: PathBuf,
        /// How many end-of-warm-up checkpoints were compared.
        count: usize,
        /// What differs, for the first few of them.
        closest: Vec<String>,
    },
    /// A checkpoint could not be read.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A folder could not be listed.
    #[error(transparent)]
    Io(#[from] RunDirError),
}

/// A warm-up an earlier run trained: its end-of-warm-up checkpoint and its run directory.
pub struct Earlier {
    /// The checkpoint, matched against the run that starts from it.
    pub checkpoint: Checkpoint,
    /// The run directory that trained it.
    pub run_dir: PathBuf,
}

impl Earlier {
    /// The warm-up `spec` would train, among the runs under `dir` that wrote an end-of-warm-up
    /// checkpoint: the one whose experiment has the same warm-up inputs (the fields [`key`]
    /// reads, `checkpoint_every` aside), with the same task versions and base model.
    /// Of several (the same computation, each time), the first in path order.
    pub fn find(
        dir: &Path,
        spec: &spec::Experiment,
        task_versions: &BTreeMap<String, String>,
        base_digest: Option<&str>,
    ) -> Result<Self, WarmupFromError> {
        let wanted = inputs_value(spec).ok_or(WarmupFromError::NoWarmup)?;
        let mut files = Vec::new();
        end_of_warmup_checkpoints(dir, SEARCH_DEPTH, &mut files)?;
        files.sort();
        if files.is_empty() {
            return Err(WarmupFromError::NoCheckpoint {
                dir: dir.to_path_buf(),
            });
        }
        let mut closest = Vec::new();
        for file in &files {
            let checkpoint = Checkpoint::read(file)?;
            let run_dir = checkpoint.run_dir()?;
            match mismatch(&checkpoint, &wanted, spec, task_versions, base_digest) {
                None => {
                    return Ok(Earlier {
                        checkpoint,
                        run_dir,
                    });
                }
                Some(reason) if closest.len() < 3 => {
                    closest.push(format!("`{}`: {reason}", run_dir.display()));
                }
                Some(_) => {}
            }
        }
        Err(WarmupFromError::NoMatch {
            dir: dir.to_path_buf(),
            count: files.len(),
            closest,
        })
    }

    /// Writes into a fresh run directory what the earlier run wrote of its warm-up: the
    /// metrics lines up to the checkpoint, and its evaluation's samples and episodes files.
    pub fn copy_to(&self, run_dir: &mut crate::metrics::RunDir) -> Result<(), RunDirError> {
        let from = self.run_dir.join("metrics.jsonl");
        let metrics = std::fs::read(&from).map_err(RunDirError::io(&from))?;
        let len = usize::try_from(self.checkpoint.metrics_len()).unwrap_or(usize::MAX);
        let Some(lines) = metrics.get(..len) else {
            return Err(RunDirError::io(&from)(std::io::Error::other(format!(
                "it holds {} bytes, fewer than the {len} its end-of-warm-up checkpoint recorded",
                metrics.len()
            ))));
        };
        run_dir.append_recorded(lines)?;
        let files = crate::train::warmup_evaluation_files();
        copy_tree(&self.run_dir, run_dir.path(), &|relative| {
            files.iter().any(|file| file == relative)
        })
    }
}

/// Why `checkpoint` is not the warm-up `wanted` (a [`WarmupInputs`] as JSON) describes.
fn mismatch(
    checkpoint: &Checkpoint,
    wanted: &serde_json::Value,
    spec: &spec::Experiment,
    task_versions: &BTreeMap<String, String>,
    base_digest: Option<&str>,
) -> Option<String> {
    if checkpoint.phase() != (Phase::Rl { step: 0 }) {
        return Some(format!(
            "it was written at {}, not at the end of the warm-up",
            checkpoint.phase()
        ));
    }
    let Some(stored) = checkpoint.experiment(spec) else {
        return Some("this version of Agentry cannot read its experiment".into());
    };
    let Some(inputs) = inputs_value(&stored) else {
        return Some("its experiment has no warm-up".into());
    };
    let mut diffs = Vec::new();
    crate::checkpoint::differences(&inputs, wanted, "", &mut diffs);
    if !diffs.is_empty() {
        return Some(diffs.join(", "));
    }
    if checkpoint.task_versions() != task_versions {
        return Some(format!(
            "task versions were {:?} and are now {task_versions:?}",
            checkpoint.task_versions()
        ));
    }
    if checkpoint.base_digest() != base_digest {
        return Some("it was trained on other base model files".into());
    }
    None
}

/// `spec`'s [`WarmupInputs`] as JSON, to compare; `None` when it has no warm-up.
fn inputs_value(spec: &spec::Experiment) -> Option<serde_json::Value> {
    serde_json::to_value(WarmupInputs::of(spec)?).ok()
}

/// Every `checkpoints/rl-000000.ckpt` in `dir` and the folders up to `depth` levels below it.
fn end_of_warmup_checkpoints(
    dir: &Path,
    depth: usize,
    out: &mut Vec<PathBuf>,
) -> Result<(), RunDirError> {
    let file = dir.join(crate::checkpoint::DIR).join(END_OF_WARMUP);
    if file.is_file() {
        out.push(file);
        return Ok(());
    }
    if depth == 0 {
        return Ok(());
    }
    for entry in std::fs::read_dir(dir).map_err(RunDirError::io(dir))? {
        let path = entry.map_err(RunDirError::io(dir))?.path();
        // The shared-warm-up caches of running invocations are not run directories.
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if path.is_dir() && !hidden {
            end_of_warmup_checkpoints(&path, depth - 1, out)?;
        }
    }
    Ok(())
}

/// Everything of an experiment its warm-up may read, borrowed from it. Every spec struct is
/// destructured whole, without `..`, so a field added or renamed in the language is a compile
/// error here until someone decides whether the warm-up reads it (if unsure, it does).
#[derive(serde::Serialize)]
struct WarmupInputs<'a> {
    seed: u64,
    device: &'a spec::Device,
    /// Left out at its default, so warm-ups recorded before the key existed still match.
    #[serde(skip_serializing_if = "is_highest")]
    matmul_precision: &'a spec::MatmulPrecision,
    model: &'a spec::Model,
    tasks: &'a [spec::Task],
    curriculum: &'a [spec::Stage],
    /// The one algorithm key the warm-up reads: it clips the warm-up's gradients too.
    grad_clip: Option<f64>,
    /// Where the engines run: the only pool key that reaches the warm-up (its devices).
    placement: &'a spec::Placement,
    optimizer: &'a spec::Optimizer,
    /// How the warm-up's evaluation samples, when it does (`eval.decoding` `sampled` or
    /// `both`). Greedy decoding reads none of it, so runs whose evaluation is greedy share a
    /// warm-up whatever temperature their RL samples at.
    #[serde(skip_serializing_if = "Option::is_none")]
    sampled: Option<SampledDecoding>,
    stop: &'a [String],
    max_new_tokens: usize,
    warmup: &'a spec::Warmup,
    max_nonfinite_skips: u32,
    /// The evaluation after the warm-up: all of `eval` but `every`, which only RL reads.
    eval_split: spec::Split,
    eval_episodes: usize,
    eval_decoding: spec::EvalDecoding,
}

/// The sampling settings of [`WarmupInputs::sampled`].
#[derive(serde::Serialize)]
struct SampledDecoding {
    temperature: f64,
    top_p: f64,
    top_k: Option<usize>,
}

/// Whether products are f32 (`matmul_precision`'s default).
fn is_highest(precision: &&spec::MatmulPrecision) -> bool {
    **precision == spec::MatmulPrecision::Highest
}

impl<'a> WarmupInputs<'a> {
    /// `None` when the run has no warm-up.
    fn of(spec: &'a spec::Experiment) -> Option<Self> {
        let spec::Experiment {
            name: _,
            seed,
            device,
            matmul_precision,
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
            // Which checkpoints a run writes, not what it computes. A run that takes its
            // warm-up writes none of the warm-up's (`sft-*.ckpt`), only the one at its end.
            checkpoint_every: _,
            max_nonfinite_skips,
            // Recomputation changes the memory an update takes, and replicas where it is
            // computed, not its result (up to the order of a few float sums), so runs that
            // differ in them share a warm-up.
            recompute: _,
            data_parallel: _,
        } = train;
        let spec::Eval {
            every: _,
            split: eval_split,
            episodes: eval_episodes,
            decoding: eval_decoding,
        } = eval;
        Some(WarmupInputs {
            seed: *seed,
            device,
            matmul_precision,
            model,
            tasks,
            curriculum,
            grad_clip: *grad_clip,
            placement,
            optimizer,
            sampled: eval_decoding
                .each()
                .contains(&spec::Decoding::Sampled)
                .then_some(SampledDecoding {
                    temperature: *temperature,
                    top_p: *top_p,
                    top_k: *top_k,
                }),
            stop,
            max_new_tokens: *max_new_tokens,
            warmup: warmup.as_ref()?,
            max_nonfinite_skips: *max_nonfinite_skips,
            eval_split: *eval_split,
            eval_episodes: *eval_episodes,
            eval_decoding: *eval_decoding,
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
            (
                WARMUP.to_string(),
                "algorithm grpo { group_size = 4 }\neval { every = 5 }",
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
            spec("warmup = sft { steps = 5, lr = 0.005, instances = 40 }", ""),
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
    fn sampling_reaches_the_key_only_through_a_sampled_evaluation() {
        const SAMPLING: &str = "temperature = 1.3, top_p = 0.9, top_k = 5";
        let greedy = |train: &str| key_of(&spec(train, "eval { decoding = greedy }"));
        assert_eq!(greedy(WARMUP), greedy(&format!("{WARMUP}, {SAMPLING}")));
        for decoding in ["sampled", "both"] {
            let eval = format!("eval {{ decoding = {decoding} }}");
            let key = |train: &str| key_of(&spec(train, &eval));
            for setting in SAMPLING.split(", ") {
                assert_ne!(
                    key(WARMUP),
                    key(&format!("{WARMUP}, {setting}")),
                    "{eval} {setting}"
                );
            }
        }
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
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn runs_without_a_warmup_share_nothing_and_checkpoints_do_not_count() {
        assert_eq!(key_of(&spec("lr = 0.01", "")), None);
        assert_eq!(
            key_of(&spec(&format!("{WARMUP}, checkpoint_every = 2"), "")),
            key_of(&spec(WARMUP, ""))
        );
    }
}
