//! Scaffolding the runtime's integration tests share: one run at a time, and scratch
//! directories under the target dir.

// Each test crate uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// burn seeds weight initialization through a per-backend global RNG, so runs (and anything
/// that builds a policy) in one process must not overlap.
static ONE_RUN_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Holds the one-run lock until dropped (a test that panicked while holding it does not
/// poison the others).
pub fn serial() -> MutexGuard<'static, ()> {
    ONE_RUN_AT_A_TIME
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
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

/// The metrics lines of a run with its wall-clock fields (`*_seconds`,
/// `trajectories_per_second`) removed: everything else of two equal runs must match exactly.
pub fn metrics_without_timings(run_dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
            if let Some(object) = value.as_object_mut() {
                object.retain(|key, _| {
                    !key.ends_with("_seconds") && key != "trajectories_per_second"
                });
            }
            value
        })
        .collect()
}
