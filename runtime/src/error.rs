//! The errors a run can end with.

use std::path::PathBuf;

/// Why a run could not start or go on. Every variant says what to change.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A task names an environment this build cannot provide.
    #[error(transparent)]
    Task(#[from] crate::tasks::ResolveError),
    /// A command-line override (`--steps`) breaks a rule of the checker.
    #[error(transparent)]
    Override(#[from] agentry_dsl::OverrideError),
    /// The experiment asks for something this version of the runtime does not implement.
    #[error("{0}")]
    Unsupported(String),
    /// The warm-up has nothing to clone: no task's oracle produced a demonstration that fits.
    #[error(
        "the warm-up needs oracle demonstrations, but no task produced one that succeeds within \
         its turn budget and the model's context"
    )]
    NoDemonstrations,
    /// Asynchronous rollout stopped delivering episodes.
    #[error(transparent)]
    Rollout(#[from] crate::pipeline::Starved),
    /// A state the runtime should never reach: a bug in Agentry, to be reported.
    #[error("internal error (please report it): {0}")]
    Internal(&'static str),
    /// The experiment's pretrained model (Hugging Face or GGUF) could not be loaded.
    #[error("cannot load the model: {0}")]
    Model(#[from] crate::model::LoadError),
    /// The requested device is not compiled in or not present.
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    /// Writing the run directory failed.
    #[error("cannot write `{path}`: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The environment controller's worker threads could not be started.
    #[error("cannot start the environment controller: {0}")]
    Controller(std::io::Error),
    /// A checkpoint could not be written, or cannot be resumed from.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// `--warmup-from` found no warm-up this run would have trained.
    #[error(transparent)]
    WarmupFrom(#[from] crate::shared_warmup::WarmupFromError),
    /// The run's report could not be written.
    #[error(transparent)]
    Report(#[from] crate::report::ReportError),
    /// Updates in a row had a non-finite loss or gradient norm; each was skipped, so the
    /// weights and optimizer state are those from before the first of them.
    #[error(
        "{skipped} updates in a row had a non-finite loss or gradient norm (the last: {at}, loss \
         {loss}{}) and were skipped; lower the learning rate, set `algorithm.grad_clip`, or \
         raise `train.max_nonfinite_skips`",
        grad_norm.map(|n| format!(", gradient norm {n}")).unwrap_or_default()
    )]
    NonFinite {
        /// Updates skipped in a row (`train.max_nonfinite_skips`).
        skipped: u32,
        /// The last of them.
        at: Update,
        /// Its loss.
        loss: f32,
        /// Its gradient norm, when the loss was finite.
        grad_norm: Option<f32>,
    },
    /// A data-parallel update failed: a replica died, or the gradients' all-reduce failed.
    /// The run stops there; `--resume` goes on from its latest checkpoint.
    #[error(
        "data-parallel training failed at {at}: {reason}; resume from the latest checkpoint \
         with `--resume RUN_DIR`"
    )]
    DataParallel {
        /// The update that failed.
        at: Update,
        /// What failed.
        reason: String,
    },
}

/// Which update a non-finite loss or gradient norm was met at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Update {
    /// A warm-up step.
    Warmup {
        /// The warm-up step.
        step: u64,
    },
    /// The policy's update of an RL step.
    Rl {
        /// The RL step.
        step: u64,
    },
    /// The separate critic's update of an RL step.
    Critic {
        /// The RL step.
        step: u64,
    },
}

impl std::fmt::Display for Update {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Update::Warmup { step } => write!(f, "warm-up step {step}"),
            Update::Rl { step } => write!(f, "RL step {step}"),
            Update::Critic { step } => write!(f, "the critic's update at RL step {step}"),
        }
    }
}

/// A run directory's error is the run's I/O error on that path.
impl From<crate::metrics::RunDirError> for RunError {
    fn from(e: crate::metrics::RunDirError) -> Self {
        RunError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

impl RunError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RunError {
        let path = path.into();
        move |source| RunError::Io { path, source }
    }
}
