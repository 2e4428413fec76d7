//! `agentry export RUN_DIR`: a run's trained policy for other tools. `--peft` writes a LoRA
//! run's adapters as PEFT does ([`crate::model::lora::save_peft`]: `PeftModel.from_pretrained`
//! on the base); `--merged` writes the policy, adapters folded in, as a Hugging Face checkpoint
//! ([`crate::model::hf::save_hf`]: `AutoModelForCausalLM.from_pretrained`, or this project's
//! `arch = qwen2/llama { weights = ... }`).

use std::path::{Path, PathBuf};

use agentry_dsl::spec::Arch;
use burn::backend::Flex;

use crate::error::RunError;
use crate::model::hf::{HfConfig, save_hf};
use crate::model::lora::save_peft;
use crate::model::{Policy, PolicyConfig, pretrained_config};
use crate::replay::{ReplayError, RunFiles};

/// What to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The LoRA adapters, as PEFT writes them.
    Peft,
    /// The whole policy, adapters merged, as a Hugging Face checkpoint.
    Merged,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The run directory or its weights could not be read.
    #[error(transparent)]
    Run(#[from] ReplayError),
    /// The run kept no weights for the version asked for.
    #[error("{0}")]
    NoWeights(String),
    /// `--peft` of a run without adapters.
    #[error(
        "the run trained every weight (`finetune = full`): it has no adapters to export; use --merged"
    )]
    NoAdapters,
    /// Writing failed.
    #[error("cannot write {}: {source}", path.display())]
    Io {
        /// The folder written.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Writes the policy of `run_dir` at RL step `step` (default: the finished run's final
/// weights, `policy.mpk`) into `out` in `format`.
pub fn export(
    run_dir: &Path,
    step: Option<u64>,
    format: Format,
    out: &Path,
) -> Result<(), ExportError> {
    let (run, policy) = trained_policy(run_dir, step)?;
    let io = |source| ExportError::Io {
        path: out.to_path_buf(),
        source,
    };
    match format {
        Format::Peft => {
            let lora = policy.lora.as_ref().ok_or(ExportError::NoAdapters)?;
            save_peft(lora, &base_name(&run.spec.model.arch), out).map_err(io)
        }
        Format::Merged => {
            // The base's shape as its files declare it (the weights are loaded already).
            let config = match &run.spec.model.arch {
                Arch::Transformer(arch) => HfConfig::llama_of(
                    &PolicyConfig::from_arch(arch, run.tokenizer()?.vocab_size()),
                    policy.norm.epsilon,
                ),
                pretrained => pretrained_config(pretrained)
                    .map_err(|e| ReplayError::from(RunError::from(e)))?,
            };
            save_hf(&policy.merged(), &config, run.tokenizer()?, out).map_err(io)
        }
    }
}

/// The run directory's files and its policy at RL step `step` (default: the finished run's
/// final weights), on flex.
pub(crate) fn trained_policy(
    run_dir: &Path,
    step: Option<u64>,
) -> Result<(RunFiles, Policy<Flex>), ExportError> {
    let run = RunFiles::read(run_dir)?;
    // An endpoint evaluation's run has no policy to load: say so before looking for weights.
    run.tokenizer()?;
    let version = step.or(run.final_version).ok_or_else(|| {
        ExportError::NoWeights(format!(
            "{} has no final weights (the run did not finish): name a checkpoint's step with \
             --step",
            run_dir.display()
        ))
    })?;
    let weights = run.weights_of(version).ok_or_else(|| {
        ExportError::NoWeights(format!(
            "{} kept no weights of RL step {version} (`policy.mpk` holds the final step, \
             `checkpoints/rl-NNNNNN.ckpt` the others)",
            run_dir.display()
        ))
    })?;
    let policy = weights.load::<Flex>(
        &run.spec,
        run.tokenizer()?.vocab_size(),
        &Default::default(),
    )?;
    Ok((run, policy))
}

/// The base model as PEFT's `base_model_name_or_path` names it: the file or folder the
/// experiment loads (empty for a model built from the seed).
pub fn base_name(arch: &Arch) -> String {
    match arch {
        Arch::Gguf { file } => file.clone(),
        Arch::Qwen2 { weights } | Arch::Llama { weights } => weights.clone(),
        Arch::Transformer(_) => String::new(),
    }
}
