//! Checkpoints: everything a run needs to go on exactly where it stopped.
//!
//! A checkpoint is one file, `RUN_DIR/checkpoints/sft-NNNNNN.ckpt` (during the supervised
//! warm-up) or `RUN_DIR/checkpoints/rl-NNNNNN.ckpt` (after it), holding the policy's weights,
//! the optimizer's state (burn's [`Optimizer::to_record`]: AdamW's moments and step counts),
//! the frozen KL reference when there is one, PPO's separate critic and its optimizer's state
//! when there is one (a shared-trunk value head is part of the policy's weights), the tokenizer, the phase and step, the trainer's
//! RNG (ChaCha8 seed, stream and word position), the warm-up evaluation, the count of skipped
//! steps, how much of `metrics.jsonl` had been written, and what identifies the run: the
//! resolved experiment and the version of every task generator. The curriculum and the
//! evaluation stream are functions of the step and the seed, so they need no state.
//!
//! Layout, all integers little-endian:
//!
//! ```text
//! b"AGNTCKPT"  u32 format version  u64 header length  header (JSON)
//! u64 length  weights      (burn named MessagePack, full precision)
//! u64 length  optimizer    (the same format)
//! u64 length  reference    (the same format; length 0 when there is none)
//! u64 length  critic       (the same format; length 0 without a separate critic)
//! u64 length  critic optimizer (the same format; length 0 without a separate critic)
//! u64 length  stale engine (the same format; length 0 without cross-policy sampling)
//! u64 FNV-1a 64 of every byte before it
//! ```
//!
//! Version 2 added the two critic sections, version 3 the stale engine's weights, version 4
//! LoRA: with `finetune = lora` the weights and stale engine sections hold only what training
//! changes (the adapters and a shared value head, [`crate::model::lora::Trainable`]), the
//! reference section is empty (the reference is the base with the adapters off), and the
//! header names the base model's digest, so a run resumed on a different base file is refused
//! rather than continued with adapters trained for another model. This build reads versions 3
//! and 4 (a version-3 file is a version-4 file without LoRA); a file of another version is
//! refused with a message saying whether it is older or newer than this build; there is no
//! migration (a version-1 file holds no PPO run, but its sections would be read out of place).
//!
//! Files are written atomically: to a temporary file in the same directory, synced, then
//! renamed over the final name (and the directory synced), so a crash leaves either the
//! previous checkpoint or the new one, never a partial file under a checkpoint's name.
//! Reading checks the magic, the version, the lengths (a truncated file says so) and the
//! checksum before decoding anything, then the experiment, the architecture and each weight's
//! shape; every failure is a [`CheckpointError`], never a panic.

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use agentry_dsl::spec;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};
use burn::tensor::Tensor;
use burn::tensor::backend::Backend;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::metrics::Evaluation;
use crate::model::Policy;
use crate::model::TrainBackend;
use crate::monitor::Monitor;
use crate::optim::PolicyOptimizer;
use crate::pool::Versioned;
use crate::text::{Tokenizer, Transcript};

/// The first bytes of every checkpoint file.
const MAGIC: &[u8; 8] = b"AGNTCKPT";
/// The layout version this build writes (4: LoRA's adapter-only weights and base digest).
pub const FORMAT_VERSION: u32 = 4;
/// The oldest layout version this build reads.
const OLDEST_READABLE: u32 = 3;
/// The sections after the preamble, in file order.
const SECTIONS: [&str; 7] = [
    "header",
    "weights",
    "optimizer",
    "reference",
    "critic",
    "critic optimizer",
    "stale engine",
];
/// The folder of a run directory holding its checkpoints.
pub const DIR: &str = "checkpoints";
/// Bytes before the header: magic, version, header length.
const PREAMBLE: usize = 8 + 4 + 8;

/// Why a checkpoint could not be written or resumed from. Each says which file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("cannot {action} checkpoint `{path}`: {source}")]
    Io {
        /// `read` or `write`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// There is no checkpoint where one was asked for.
    #[error("no checkpoint to resume from at `{path}`: {reason}")]
    NotFound {
        /// The path given.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// The file is not a whole, intact checkpoint of this format.
    #[error("checkpoint `{path}` is unusable: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint is intact but belongs to another experiment, architecture or version.
    #[error("checkpoint `{path}` does not match this run: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
}

/// Where a run stood when a checkpoint was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// `step` supervised warm-up steps done; the warm-up's evaluation not yet run.
    Warmup {
        /// Warm-up steps done.
        step: u64,
    },
    /// The warm-up (if any) and its evaluation done, and `step` RL steps.
    Rl {
        /// RL steps done.
        step: u64,
    },
}

impl Phase {
    /// The checkpoint's file name, e.g. `rl-000040.ckpt`.
    pub fn file_name(self) -> String {
        match self {
            Phase::Warmup { step } => format!("sft-{step:06}.ckpt"),
            Phase::Rl { step } => format!("rl-{step:06}.ckpt"),
        }
    }

    /// The phase a checkpoint file name stands for; `None` for any other file.
    fn from_file_name(name: &str) -> Option<Phase> {
        let stem = name.strip_suffix(".ckpt")?;
        let (kind, step) = stem.split_once('-')?;
        if step.is_empty() || !step.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let step = step.parse().ok()?;
        match kind {
            "sft" => Some(Phase::Warmup { step }),
            "rl" => Some(Phase::Rl { step }),
            _ => None,
        }
    }

    /// Orders phases in run order: every warm-up step before every RL step.
    fn order(self) -> (u8, u64) {
        match self {
            Phase::Warmup { step } => (0, step),
            Phase::Rl { step } => (1, step),
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Phase::Warmup { step } => write!(f, "warm-up step {step}"),
            Phase::Rl { step } => write!(f, "RL step {step}"),
        }
    }
}

/// The exact position of a ChaCha8 stream: restoring it continues the same draws.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct RngState {
    seed: [u8; 32],
    stream: u64,
    /// The word position, a `u128` written as decimal text (JSON numbers stop at 64 bits in
    /// many readers).
    word_pos: String,
}

impl RngState {
    fn of(rng: &ChaCha8Rng) -> Self {
        RngState {
            seed: rng.get_seed(),
            stream: rng.get_stream(),
            word_pos: rng.get_word_pos().to_string(),
        }
    }

    fn restore(&self) -> Option<ChaCha8Rng> {
        use rand::SeedableRng;
        let mut rng = ChaCha8Rng::from_seed(self.seed);
        rng.set_stream(self.stream);
        rng.set_word_pos(self.word_pos.parse().ok()?);
        Some(rng)
    }
}

/// The JSON header: everything but the tensors.
#[derive(Serialize, Deserialize)]
struct Header {
    experiment: String,
    /// The resolved experiment the run was started with (`train.steps` may change on resume).
    spec: serde_json::Value,
    task_versions: BTreeMap<String, String>,
    /// The shape of every parameter of the policy, in module order: what a resumed run's
    /// freshly built policy must match (from scratch or from a Hugging Face checkpoint alike).
    shapes: Vec<Vec<usize>>,
    phase: Phase,
    rng: RngState,
    /// The tokenizer's own JSON ([`Tokenizer::to_json`]).
    tokenizer: String,
    after_warmup: Option<Evaluation>,
    /// The sampled evaluation after the warm-up, with `eval.decoding = both` (absent: none).
    #[serde(default)]
    after_warmup_sampled: Option<Evaluation>,
    skipped_steps: u64,
    metrics_len: u64,
    /// `sft_from = successes`: the solved episodes held for the SFT term (absent: none).
    #[serde(default)]
    successes: Vec<Transcript>,
    /// The stability monitor's state (absent in files written before it existed: fresh).
    #[serde(default)]
    monitor: Monitor,
    /// Updates skipped in a row for a non-finite loss or gradient (absent: none).
    #[serde(default)]
    nonfinite_streak: u32,
    /// Cross-policy sampling: the version of the stale engine's weights.
    #[serde(default)]
    stale_version: Option<u64>,
    /// With LoRA over a pretrained model, the digest of its files ([`Snapshot::base`]).
    #[serde(default)]
    base: Option<String>,
}

/// The optimizer of a policy-shaped network (the policy, or PPO's separate critic).
pub type NetOptimizer<B> = PolicyOptimizer<Policy<B>, B>;

/// PPO's separate critic as a checkpoint restores it: its network and its optimizer.
pub type CriticState<B> = (Policy<B>, NetOptimizer<B>);

/// What the trainer hands over to be saved, borrowed.
pub struct Snapshot<'a, B: TrainBackend> {
    /// The resolved experiment.
    pub spec: &'a spec::Experiment,
    /// Each task's generator version, by task name.
    pub task_versions: &'a BTreeMap<String, String>,
    /// The run's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// The policy being trained.
    pub policy: &'a Policy<B>,
    /// Its optimizer.
    pub optimizer: &'a PolicyOptimizer<Policy<B>, B>,
    /// The frozen KL reference, when the run has one.
    pub reference: Option<&'a Policy<B::InnerBackend>>,
    /// PPO's separate critic and its optimizer, once RL started with `value_head = separate`.
    pub critic: Option<(&'a Policy<B>, &'a NetOptimizer<B>)>,
    /// Where the run stands.
    pub phase: Phase,
    /// The trainer's RNG.
    pub rng: &'a ChaCha8Rng,
    /// The evaluation after the warm-up, once it ran (greedy, or the only decoding).
    pub after_warmup: Option<&'a Evaluation>,
    /// The sampled evaluation after the warm-up, when it followed a greedy one.
    pub after_warmup_sampled: Option<&'a Evaluation>,
    /// RL steps skipped so far.
    pub skipped_steps: u64,
    /// Bytes of `metrics.jsonl` written so far.
    pub metrics_len: u64,
    /// The solved episodes held for `sft_from = successes`, oldest first.
    pub successes: &'a [Transcript],
    /// The stability monitor.
    pub monitor: &'a Monitor,
    /// Updates skipped in a row for a non-finite loss or gradient.
    pub nonfinite_streak: u32,
    /// Cross-policy sampling: the stale engine's weights and their version.
    pub stale: Option<Versioned<&'a Policy<B::InnerBackend>>>,
    /// With LoRA over a pretrained model, the digest of the base model's files: the
    /// adapters mean something only on top of that base.
    pub base: Option<&'a str>,
}

/// How checkpoints (and a multi-node run's replicas, [`crate::train`]) encode weights and
/// optimizer states.
pub(crate) fn recorder() -> NamedMpkBytesRecorder<FullPrecisionSettings> {
    NamedMpkBytesRecorder::new()
}

impl<B: TrainBackend> Snapshot<'_, B> {
    /// Writes the checkpoint atomically to `run_dir/checkpoints/<phase>.ckpt`; returns its path.
    pub fn save(&self, run_dir: &Path) -> Result<PathBuf, CheckpointError> {
        let dir = run_dir.join(DIR);
        let path = dir.join(self.phase.file_name());
        let failed = |reason: String| CheckpointError::Io {
            action: "write",
            path: path.clone(),
            source: std::io::Error::other(reason),
        };
        let header = Header {
            experiment: self.spec.name.clone(),
            spec: comparable(self.spec).map_err(|e| failed(e.to_string()))?,
            task_versions: self.task_versions.clone(),
            shapes: shapes(self.policy),
            phase: self.phase,
            rng: RngState::of(self.rng),
            tokenizer: self.tokenizer.to_json().map_err(failed)?,
            after_warmup: self.after_warmup.cloned(),
            after_warmup_sampled: self.after_warmup_sampled.cloned(),
            skipped_steps: self.skipped_steps,
            metrics_len: self.metrics_len,
            successes: self.successes.to_vec(),
            monitor: self.monitor.clone(),
            nonfinite_streak: self.nonfinite_streak,
            stale_version: self.stale.map(|stale| stale.version),
            base: self.base.map(str::to_string),
        };
        let header = serde_json::to_vec(&header).map_err(|e| failed(e.to_string()))?;
        let weights = weight_bytes(self.policy).map_err(|e| failed(format!("weights: {e}")))?;
        let optimizer = optimizer_bytes(self.optimizer).map_err(|e| failed(e.to_string()))?;
        // With LoRA the reference is the base with the adapters off: the base file has it.
        let reference = match self.reference.filter(|_| self.policy.lora.is_none()) {
            Some(reference) => {
                weight_bytes(reference).map_err(|e| failed(format!("reference: {e}")))?
            }
            None => Vec::new(),
        };
        let (critic, critic_optimizer) = match self.critic {
            Some((critic, optimizer)) => (
                Recorder::<B>::record(&recorder(), critic.clone().into_record(), ())
                    .map_err(|e| failed(format!("critic: {e}")))?,
                optimizer_bytes(optimizer).map_err(|e| failed(format!("critic optimizer: {e}")))?,
            ),
            None => (Vec::new(), Vec::new()),
        };
        let stale = match self.stale {
            Some(stale) => {
                weight_bytes(stale.weights).map_err(|e| failed(format!("stale engine: {e}")))?
            }
            None => Vec::new(),
        };
        let sections = [
            &header,
            &weights,
            &optimizer,
            &reference,
            &critic,
            &critic_optimizer,
            &stale,
        ];
        let mut bytes = Vec::with_capacity(
            PREAMBLE + 8 * sections.len() + 8 + sections.iter().map(|s| s.len()).sum::<usize>(),
        );
        bytes.extend_from_slice(MAGIC);
        bytes.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        for section in sections {
            bytes.extend_from_slice(&(section.len() as u64).to_le_bytes());
            bytes.extend_from_slice(section);
        }
        let checksum = fnv1a(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        std::fs::create_dir_all(&dir).map_err(|source| CheckpointError::Io {
            action: "write",
            path: dir.clone(),
            source,
        })?;
        write_atomic(&path, &bytes).map_err(|source| CheckpointError::Io {
            action: "write",
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }
}

/// A policy's weights as a checkpoint section: all of them, or with LoRA only the part
/// training changes ([`Policy::trainable`]).
pub(crate) fn weight_bytes<B: Backend>(
    policy: &Policy<B>,
) -> Result<Vec<u8>, burn::record::RecorderError> {
    policy.record_trained(&recorder(), ())
}

/// An optimizer's state as a checkpoint section.
pub(crate) fn optimizer_bytes<B: TrainBackend>(
    optimizer: &PolicyOptimizer<Policy<B>, B>,
) -> Result<Vec<u8>, burn::record::RecorderError> {
    let r = recorder();
    match optimizer {
        PolicyOptimizer::AdamW(o) => Recorder::<B>::record(&r, o.to_record(), ()),
        PolicyOptimizer::Adam(o) => Recorder::<B>::record(&r, o.to_record(), ()),
        PolicyOptimizer::Sgd(o) => Recorder::<B>::record(&r, o.to_record(), ()),
    }
}

/// `optimizer` (fresh, of the declared kind) with the state [`optimizer_bytes`] wrote.
pub(crate) fn optimizer_from_bytes<B: TrainBackend>(
    optimizer: PolicyOptimizer<Policy<B>, B>,
    bytes: Vec<u8>,
    device: &B::Device,
) -> Result<PolicyOptimizer<Policy<B>, B>, burn::record::RecorderError> {
    let r = recorder();
    Ok(match optimizer {
        PolicyOptimizer::AdamW(o) => {
            PolicyOptimizer::AdamW(o.load_record(Recorder::<B>::load(&r, bytes, device)?))
        }
        PolicyOptimizer::Adam(o) => {
            PolicyOptimizer::Adam(o.load_record(Recorder::<B>::load(&r, bytes, device)?))
        }
        PolicyOptimizer::Sgd(o) => {
            PolicyOptimizer::Sgd(o.load_record(Recorder::<B>::load(&r, bytes, device)?))
        }
    })
}

/// Writes `bytes` to `path` so that `path` is never seen half-written: a temporary file in the
/// same directory, synced, renamed over `path`, then the directory synced so the rename lasts.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{}.tmp", name.unwrap_or_default()));
    let written = File::create(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    if let Err(e) = written.and_then(|()| std::fs::rename(&tmp, path)) {
        // Best effort: a stale temporary file is ignored by readers and replaced next time.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    #[cfg(unix)]
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// FNV-1a, 64 bits: catches torn or flipped bytes; not a defence against a crafted file.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The experiment as compared on resume: everything but `train.steps`, which `--steps` may
/// change, and where the same arithmetic runs: `train.data_parallel` (a run may resume on
/// fewer replicas after losing a node) and `pool.env_workers`.
fn comparable(spec: &spec::Experiment) -> serde_json::Result<serde_json::Value> {
    let mut value = serde_json::to_value(spec)?;
    if let Some(train) = value.get_mut("train").and_then(|t| t.as_object_mut()) {
        train.remove("steps");
        train.remove("data_parallel");
    }
    if let Some(pool) = value.get_mut("pool").and_then(|t| t.as_object_mut()) {
        pool.remove("env_workers");
    }
    Ok(value)
}

/// The experiment a checkpoint stored, as this version reads it: a key added to the language
/// since the checkpoint was written takes its default (the value the run was trained with),
/// so a checkpoint outlives new keys. `train.steps`, left out of the stored form, is lent from
/// `spec` to read it and left out again. What this version cannot read stays as stored, and
/// the comparison says where it differs.
fn upgraded(stored: &serde_json::Value, spec: &spec::Experiment) -> serde_json::Value {
    read_stored(stored, spec)
        .and_then(|read| comparable(&read).ok())
        .unwrap_or_else(|| stored.clone())
}

/// The experiment a checkpoint stored, read by this version (new keys at their defaults), with
/// `train.steps` lent from `spec`; `None` when this version cannot read it.
fn read_stored(stored: &serde_json::Value, spec: &spec::Experiment) -> Option<spec::Experiment> {
    let mut value = stored.clone();
    if let Some(train) = value.get_mut("train").and_then(|t| t.as_object_mut()) {
        train.insert("steps".into(), spec.train.steps.into());
    }
    serde_json::from_value(value).ok()
}

/// Up to four paths where `a` and `b` differ, with both values, appended to `out`.
pub(crate) fn differences(
    a: &serde_json::Value,
    b: &serde_json::Value,
    at: &str,
    out: &mut Vec<String>,
) {
    use serde_json::Value;
    const LIMIT: usize = 4;
    if out.len() >= LIMIT || a == b {
        return;
    }
    let join = |key: &str| {
        if at.is_empty() {
            key.to_string()
        } else {
            format!("{at}.{key}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (key, va) in x {
                differences(va, y.get(key).unwrap_or(&Value::Null), &join(key), out);
            }
            for (key, vb) in y.iter().filter(|(k, _)| !x.contains_key(*k)) {
                differences(&Value::Null, vb, &join(key), out);
            }
        }
        _ => out.push(format!("`{at}` was {a} and is now {b}")),
    }
}

/// A checkpoint read from disk: whole and intact (magic, version, lengths and checksum
/// checked), not yet matched against an experiment.
pub struct Checkpoint {
    path: PathBuf,
    header: Header,
    tokenizer: Tokenizer,
    weights: Vec<u8>,
    optimizer: Vec<u8>,
    reference: Option<Vec<u8>>,
    /// The separate critic's weights and optimizer state.
    critic: Option<(Vec<u8>, Vec<u8>)>,
    /// The stale engine's weights.
    stale: Option<Vec<u8>>,
}

impl Checkpoint {
    /// The checkpoint `path` names: the file itself, or for a run directory its latest
    /// checkpoint (the latest phase, then the highest step).
    pub fn locate(path: &Path) -> Result<PathBuf, CheckpointError> {
        let not_found = |reason: String| CheckpointError::NotFound {
            path: path.to_path_buf(),
            reason,
        };
        if path.is_file() {
            return Ok(path.to_path_buf());
        }
        if !path.is_dir() {
            return Err(not_found("no such file or directory".to_string()));
        }
        let dir = path.join(DIR);
        let entries = std::fs::read_dir(&dir).map_err(|_| {
            not_found(format!(
                "the run directory has no `{DIR}` folder (a run writes one every \
                 `train.checkpoint_every` steps, and at its end)"
            ))
        })?;
        entries
            .filter_map(|entry| {
                let name = entry.ok()?.file_name();
                Some((Phase::from_file_name(name.to_str()?)?, dir.join(&name)))
            })
            .max_by_key(|(phase, _)| phase.order())
            .map(|(_, file)| file)
            .ok_or_else(|| not_found(format!("`{}` holds no checkpoint file", dir.display())))
    }

    /// Reads and verifies a checkpoint file.
    pub fn read(path: &Path) -> Result<Self, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            action: "read",
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(path, &bytes)
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, CheckpointError> {
        let corrupt = |reason: String| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        if bytes.len() < PREAMBLE || &bytes[..8] != MAGIC {
            return Err(corrupt(
                "not an Agentry checkpoint (it does not start with the checkpoint magic)".into(),
            ));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if !(OLDEST_READABLE..=FORMAT_VERSION).contains(&version) {
            let which = if version < FORMAT_VERSION {
                "an older Agentry wrote it; resume it with that version, or start the run again"
            } else {
                "a newer Agentry wrote it; resume it with that version or a later one"
            };
            return Err(corrupt(format!(
                "format version {version}, but this build reads only versions \
                 {OLDEST_READABLE} to {FORMAT_VERSION}: {which}"
            )));
        }
        // Walk the sections, checking each length against what is there.
        let mut at = 12;
        let mut sections = Vec::with_capacity(SECTIONS.len());
        for name in SECTIONS {
            let truncated = |needed: usize| {
                corrupt(format!(
                    "truncated: {} bytes, but the {name} section needs {needed} (the file was \
                     cut short; use an earlier checkpoint)",
                    bytes.len(),
                ))
            };
            let len_end = at + 8;
            if bytes.len() < len_end {
                return Err(truncated(len_end));
            }
            let len = u64::from_le_bytes(bytes[at..len_end].try_into().expect("8 bytes"));
            let end = usize::try_from(len)
                .ok()
                .and_then(|len| len_end.checked_add(len))
                .ok_or_else(|| truncated(usize::MAX))?;
            if bytes.len() < end {
                return Err(truncated(end));
            }
            sections.push(&bytes[len_end..end]);
            at = end;
        }
        if bytes.len() < at + 8 {
            return Err(corrupt(format!(
                "truncated: {} bytes, but the checksum ends at byte {}",
                bytes.len(),
                at + 8
            )));
        }
        if bytes.len() > at + 8 {
            return Err(corrupt(format!(
                "{} unexpected bytes after the checksum",
                bytes.len() - at - 8
            )));
        }
        let stored = u64::from_le_bytes(bytes[at..].try_into().expect("8 bytes"));
        if fnv1a(&bytes[..at]) != stored {
            return Err(corrupt(
                "checksum mismatch: the file was altered or damaged after it was written".into(),
            ));
        }
        let header: Header = serde_json::from_slice(sections[0])
            .map_err(|e| corrupt(format!("unreadable header: {e}")))?;
        let tokenizer = Tokenizer::from_json(&header.tokenizer, "embedded in the checkpoint")
            .map_err(|e| corrupt(e.to_string()))?;
        if header.rng.restore().is_none() {
            return Err(corrupt("the RNG state has no valid word position".into()));
        }
        // The token embedding comes first; a Hugging Face model may have more rows than ids.
        let rows = header
            .shapes
            .first()
            .and_then(|shape| shape.first())
            .copied();
        if rows.is_none_or(|rows| rows < tokenizer.vocab_size()) {
            return Err(corrupt(format!(
                "the policy's embedding has {} rows but the tokenizer {} token ids",
                rows.unwrap_or(0),
                tokenizer.vocab_size()
            )));
        }
        Ok(Checkpoint {
            path: path.to_path_buf(),
            tokenizer,
            weights: sections[1].to_vec(),
            optimizer: sections[2].to_vec(),
            reference: (!sections[3].is_empty()).then(|| sections[3].to_vec()),
            critic: (!sections[4].is_empty()).then(|| (sections[4].to_vec(), sections[5].to_vec())),
            stale: (!sections[6].is_empty()).then(|| sections[6].to_vec()),
            header,
        })
    }

    /// The checkpoint file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The run directory the checkpoint belongs to (the parent of its `checkpoints` folder).
    pub fn run_dir(&self) -> Result<PathBuf, CheckpointError> {
        let folder = self.path.parent();
        match folder.and_then(|f| Some((f.file_name()?, f.parent()?))) {
            Some((name, run_dir)) if name == DIR && run_dir.join("metrics.jsonl").is_file() => {
                Ok(run_dir.to_path_buf())
            }
            _ => Err(CheckpointError::NotFound {
                path: self.path.clone(),
                reason: format!(
                    "a run resumes in its own directory: pass the run directory, or a \
                     checkpoint inside its `{DIR}` folder next to `metrics.jsonl`"
                ),
            }),
        }
    }

    /// Where the run stood.
    pub fn phase(&self) -> Phase {
        self.header.phase
    }

    /// The run's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The trainer's RNG, at the position it had.
    pub fn rng(&self) -> ChaCha8Rng {
        self.header.rng.restore().expect("checked when read")
    }

    /// The evaluation after the warm-up, if it had run.
    pub fn after_warmup(&self) -> Option<&Evaluation> {
        self.header.after_warmup.as_ref()
    }

    /// The sampled evaluation after the warm-up, if it had run besides a greedy one.
    pub fn after_warmup_sampled(&self) -> Option<&Evaluation> {
        self.header.after_warmup_sampled.as_ref()
    }

    /// RL steps skipped before the checkpoint.
    pub fn skipped_steps(&self) -> u64 {
        self.header.skipped_steps
    }

    /// Bytes of `metrics.jsonl` the run had written.
    pub fn metrics_len(&self) -> u64 {
        self.header.metrics_len
    }

    /// The solved episodes the run held for `sft_from = successes`, oldest first.
    pub fn successes(&self) -> &[Transcript] {
        &self.header.successes
    }

    /// The stability monitor's state.
    pub fn monitor(&self) -> &Monitor {
        &self.header.monitor
    }

    /// Updates skipped in a row for a non-finite loss or gradient when it was written.
    pub fn nonfinite_streak(&self) -> u32 {
        self.header.nonfinite_streak
    }

    /// The experiment that wrote it, as this version reads it (keys added since at their
    /// defaults, `train.steps` taken from `now`); `None` when this version cannot read it.
    pub fn experiment(&self, now: &spec::Experiment) -> Option<spec::Experiment> {
        read_stored(&self.header.spec, now)
    }

    /// Each task's generator version when it was written, by task name.
    pub fn task_versions(&self) -> &BTreeMap<String, String> {
        &self.header.task_versions
    }

    /// With LoRA over a pretrained model, the digest of the base model's files.
    pub fn base_digest(&self) -> Option<&str> {
        self.header.base.as_deref()
    }

    /// Checks that the checkpoint was written by this experiment: same name, same resolved
    /// spec except `train.steps`, same task versions, the same base model under LoRA
    /// (`base_digest` is the digest of the model files now, see [`Snapshot::base`]), and not
    /// past the run's last step.
    pub fn check_matches(
        &self,
        spec: &spec::Experiment,
        task_versions: &BTreeMap<String, String>,
        base_digest: Option<&str>,
    ) -> Result<(), CheckpointError> {
        let mismatch = |reason: String| CheckpointError::Mismatch {
            path: self.path.clone(),
            reason,
        };
        if self.header.experiment != spec.name {
            return Err(mismatch(format!(
                "it was written by experiment `{}`, not `{}`",
                self.header.experiment, spec.name
            )));
        }
        let now = comparable(spec).map_err(|e| mismatch(e.to_string()))?;
        let mut diffs = Vec::new();
        differences(&upgraded(&self.header.spec, spec), &now, "", &mut diffs);
        if !diffs.is_empty() {
            return Err(mismatch(format!(
                "the experiment changed since it was written: {}; a run resumes only with the \
                 file it started with (`--steps` may change)",
                diffs.join(", ")
            )));
        }
        if &self.header.task_versions != task_versions {
            return Err(mismatch(format!(
                "task versions were {:?} and are now {:?}: instances differ, so the run cannot \
                 go on exactly",
                self.header.task_versions, task_versions
            )));
        }
        if let Some(base) = &self.header.base
            && base_digest != Some(base.as_str())
        {
            return Err(mismatch(format!(
                "its adapters were trained on a base model with digest {base}, but the model \
                 files are now {}; LoRA adapters belong to the base they were trained on",
                base_digest.unwrap_or("not a pretrained model")
            )));
        }
        if spec.algorithm.kl.estimator.is_some()
            && spec.model.finetune == spec::Finetune::Full
            && matches!(self.header.phase, Phase::Rl { .. })
            && self.reference.is_none()
        {
            return Err(CheckpointError::Corrupt {
                path: self.path.clone(),
                reason: "the run uses a KL reference but the checkpoint holds none".into(),
            });
        }
        if spec.algorithm.kind == spec::AlgorithmKind::Ppo
            && spec.model.value_head == spec::ValueHead::Separate
            && matches!(self.header.phase, Phase::Rl { .. })
            && self.critic.is_none()
        {
            return Err(CheckpointError::Corrupt {
                path: self.path.clone(),
                reason: "the run trains a separate critic but the checkpoint holds none".into(),
            });
        }
        if let Phase::Rl { step } = self.header.phase
            && step > spec.train.steps
        {
            return Err(mismatch(format!(
                "it is at RL step {step}, past this run's {} steps; pass `--steps {step}` or more",
                spec.train.steps
            )));
        }
        Ok(())
    }

    /// `policy` (freshly built as the experiment builds it) with the checkpoint's weights.
    pub fn restore_policy<B: Backend>(
        &self,
        policy: Policy<B>,
        device: &B::Device,
    ) -> Result<Policy<B>, CheckpointError> {
        let built = shapes(&policy);
        if built != self.header.shapes {
            let differ = built
                .iter()
                .zip(&self.header.shapes)
                .position(|(a, b)| a != b)
                .map_or_else(
                    || {
                        format!(
                            "the checkpoint holds {} parameter tensors, the experiment builds {}",
                            self.header.shapes.len(),
                            built.len()
                        )
                    },
                    |i| {
                        format!(
                            "parameter {i} is {:?} in the checkpoint but {:?} in the policy the \
                             experiment builds",
                            self.header.shapes[i], built[i]
                        )
                    },
                );
            return Err(CheckpointError::Mismatch {
                path: self.path.clone(),
                reason: format!(
                    "the architecture differs ({differ}); did the model files the experiment \
                     loads change?"
                ),
            });
        }
        self.load_weights(policy, &self.weights, "weights", device)
    }

    /// The frozen KL reference, built like `policy` (fresh, as the experiment builds it); `None`
    /// when the checkpoint has none.
    pub fn restore_reference<B: Backend>(
        &self,
        policy: Policy<B>,
        device: &B::Device,
    ) -> Result<Option<Policy<B>>, CheckpointError> {
        match &self.reference {
            Some(bytes) => self
                .load_weights(policy, bytes, "reference weights", device)
                .map(Some),
            None => Ok(None),
        }
    }

    fn load_weights<B: Backend>(
        &self,
        policy: Policy<B>,
        bytes: &[u8],
        what: &str,
        device: &B::Device,
    ) -> Result<Policy<B>, CheckpointError> {
        let expected = shapes(&policy);
        let loaded = policy
            .load_trained(&recorder(), bytes.to_vec(), device)
            .map_err(|e| self.corrupt(format!("{what}: {e}")))?;
        let found = shapes(&loaded);
        if found != expected {
            return Err(self.corrupt(format!(
                "{what}: the tensor shapes {found:?} are not the architecture's {expected:?}"
            )));
        }
        Ok(loaded)
    }

    /// `optimizer` (fresh, of the kind the experiment declares) with the checkpoint's state.
    pub fn restore_optimizer<B: TrainBackend>(
        &self,
        optimizer: PolicyOptimizer<Policy<B>, B>,
        device: &B::Device,
    ) -> Result<PolicyOptimizer<Policy<B>, B>, CheckpointError> {
        self.load_optimizer(optimizer, &self.optimizer, "optimizer", device)
    }

    /// Cross-policy sampling's stale engine, loaded into `policy` (shaped as the policy), with
    /// its version; `None` when the run has none.
    pub fn restore_stale<B: Backend>(
        &self,
        policy: Policy<B>,
        device: &B::Device,
    ) -> Result<Option<Versioned<Policy<B>>>, CheckpointError> {
        match (&self.stale, self.header.stale_version) {
            (Some(bytes), Some(version)) => Ok(Some(Versioned {
                weights: self.load_weights(policy, bytes, "stale engine weights", device)?,
                version,
            })),
            (None, None) => Ok(None),
            _ => {
                Err(self
                    .corrupt("the stale engine's weights and version do not come together".into()))
            }
        }
    }

    /// PPO's separate critic and its optimizer, loaded into `critic` (a fresh one, as the
    /// experiment builds it, with a value head) and `optimizer` (fresh, of the declared kind);
    /// `None` when the checkpoint has no critic (before RL, or another algorithm).
    pub fn restore_critic<B: TrainBackend>(
        &self,
        critic: Policy<B>,
        optimizer: PolicyOptimizer<Policy<B>, B>,
        device: &B::Device,
    ) -> Result<Option<CriticState<B>>, CheckpointError> {
        let Some((weights, state)) = &self.critic else {
            return Ok(None);
        };
        let critic = self.load_weights(critic, weights, "critic weights", device)?;
        let optimizer = self.load_optimizer(optimizer, state, "critic optimizer", device)?;
        Ok(Some((critic, optimizer)))
    }

    fn load_optimizer<B: TrainBackend>(
        &self,
        optimizer: PolicyOptimizer<Policy<B>, B>,
        bytes: &[u8],
        what: &str,
        device: &B::Device,
    ) -> Result<PolicyOptimizer<Policy<B>, B>, CheckpointError> {
        optimizer_from_bytes(optimizer, bytes.to_vec(), device)
            .map_err(|e| self.corrupt(format!("{what}: {e}")))
    }

    fn corrupt(&self, reason: String) -> CheckpointError {
        CheckpointError::Corrupt {
            path: self.path.clone(),
            reason,
        }
    }
}

/// The shape of every float parameter, in module order.
fn shapes<B: Backend>(policy: &Policy<B>) -> Vec<Vec<usize>> {
    struct Shapes(Vec<Vec<usize>>);
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.push(param.val().dims().to_vec());
        }
    }
    let mut visitor = Shapes(Vec::new());
    policy.visit(&mut visitor);
    visitor.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn phases_round_trip_through_file_names_in_run_order() {
        let phases = [
            Phase::Warmup { step: 3 },
            Phase::Warmup { step: 1_000_000 },
            Phase::Rl { step: 0 },
            Phase::Rl { step: 12 },
        ];
        for phase in phases {
            assert_eq!(Phase::from_file_name(&phase.file_name()), Some(phase));
        }
        assert!(phases.windows(2).all(|w| w[0].order() < w[1].order()));
        for name in [
            ".rl-000001.ckpt.tmp",
            "rl-.ckpt",
            "rl-+1.ckpt",
            "ppo-000001.ckpt",
        ] {
            assert_eq!(Phase::from_file_name(name), None, "{name}");
        }
    }

    #[test]
    fn rng_state_continues_the_same_stream() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for _ in 0..37 {
            rng.random::<u32>();
        }
        let state: RngState =
            serde_json::from_str(&serde_json::to_string(&RngState::of(&rng)).unwrap()).unwrap();
        let mut restored = state.restore().unwrap();
        let a: Vec<u64> = (0..10).map(|_| rng.random()).collect();
        let b: Vec<u64> = (0..10).map(|_| restored.random()).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn differences_name_the_changed_paths() {
        let a = serde_json::json!({"train": {"lr": 0.001, "batch": 8}, "seed": 1});
        let b = serde_json::json!({"train": {"lr": 0.002, "batch": 8}, "seed": 1, "new": true});
        let mut out = Vec::new();
        differences(&a, &b, "", &mut out);
        assert_eq!(
            out,
            [
                "`train.lr` was 0.001 and is now 0.002",
                "`new` was null and is now true"
            ]
        );
    }
}
