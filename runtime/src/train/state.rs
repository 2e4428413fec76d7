//! What a run mutates: exactly what a checkpoint holds ([`crate::checkpoint`]), saved and
//! restored whole, so a resumed run goes on as if it had never stopped.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};

use agentry_dsl::spec;
use burn::module::AutodiffModule;
use rand_chacha::ChaCha8Rng;

use super::eval::Evaluated;
use crate::checkpoint::{Checkpoint, Phase, Snapshot};
use crate::error::RunError;
use crate::model::{Policy, TrainBackend};
use crate::monitor::Monitor;
use crate::optim::PolicyOptimizer;
use crate::pool::Versioned;
use crate::text::{Tokenizer, Transcript};

/// Everything a run changes as it goes.
pub(super) struct RunState<B: TrainBackend> {
    /// The policy being trained.
    pub policy: Policy<B>,
    /// Its optimizer.
    pub optimizer: PolicyOptimizer<Policy<B>, B>,
    /// The KL reference: the policy as RL started.
    pub reference: Option<Policy<B::InnerBackend>>,
    /// PPO's separate critic (`value_head = separate`), from the start of RL on.
    pub critic: Option<Critic<B>>,
    /// The run's random stream: warm-up batches, curriculum draws, sampling, SFT draws.
    pub rng: ChaCha8Rng,
    /// Where the run stands: warm-up steps done, or RL steps done.
    pub phase: Phase,
    /// The evaluations after the warm-up, once it ran.
    pub after_warmup: Option<Evaluated>,
    /// RL steps skipped because every advantage was zero.
    pub skipped: u64,
    /// `sft_from = successes`: the latest solved training episodes, oldest first.
    pub successes: VecDeque<Transcript>,
    /// The stability monitor.
    pub monitor: Monitor,
    /// Updates skipped in a row for a non-finite loss or gradient norm (checkpointed, so a
    /// resumed run stops where the uninterrupted one would).
    pub nonfinite_streak: u32,
    /// Cross-policy sampling: the stale engines' weights.
    pub stale: Option<Versioned<Policy<B::InnerBackend>>>,
}

/// What a checkpoint records beside the state: the run's identity.
pub(super) struct Identity<'a> {
    /// The experiment.
    pub spec: &'a spec::Experiment,
    /// Each task's generator version, by task name.
    pub task_versions: &'a BTreeMap<String, String>,
    /// The run's tokenizer.
    pub tokenizer: &'a Tokenizer,
    /// Bytes of `metrics.jsonl` written so far.
    pub metrics_len: u64,
    /// With LoRA over a pretrained model, the digest of its files.
    pub base_digest: Option<&'a str>,
}

impl<B: TrainBackend> RunState<B> {
    /// Where a fresh run starts: `policy` as built, a fresh optimizer, the run's RNG as setup
    /// left it.
    pub fn fresh(policy: Policy<B>, spec: &spec::Experiment, rng: ChaCha8Rng) -> Self {
        RunState {
            policy,
            optimizer: PolicyOptimizer::new(&spec.train.optimizer),
            reference: None,
            critic: None,
            rng,
            phase: match spec.train.warmup {
                Some(_) => Phase::Warmup { step: 0 },
                None => Phase::Rl { step: 0 },
            },
            after_warmup: None,
            skipped: 0,
            successes: VecDeque::new(),
            monitor: Monitor::default(),
            nonfinite_streak: 0,
            stale: None,
        }
    }

    /// The state `checkpoint` holds, its weights loaded into this (fresh) state's modules.
    pub fn restore(
        self,
        checkpoint: &Checkpoint,
        spec: &spec::Experiment,
        device: &B::Device,
    ) -> Result<Self, RunError> {
        let policy = checkpoint.restore_policy(self.policy, device)?;
        let optimizer = checkpoint.restore_optimizer(self.optimizer, device)?;
        let reference = checkpoint.restore_reference(policy.valid(), device)?;
        let fresh = Critic::fresh(&policy, &spec.train.optimizer);
        let critic = checkpoint
            .restore_critic(fresh.net, fresh.optimizer, device)?
            .map(|(net, optimizer)| Critic { net, optimizer });
        let stale = checkpoint.restore_stale(policy.valid(), device)?;
        Ok(RunState {
            policy,
            optimizer,
            reference,
            critic,
            rng: checkpoint.rng(),
            phase: checkpoint.phase(),
            after_warmup: checkpoint.after_warmup().cloned().map(|first| Evaluated {
                first,
                first_decoding: spec.eval.decoding.each()[0],
                sampled: checkpoint.after_warmup_sampled().cloned(),
            }),
            skipped: checkpoint.skipped_steps(),
            successes: checkpoint.successes().iter().cloned().collect(),
            monitor: checkpoint.monitor().clone(),
            nonfinite_streak: checkpoint.nonfinite_streak(),
            stale,
        })
    }

    /// The state at the end of an earlier run's warm-up (its end-of-warm-up checkpoint), for a
    /// new run: without what the earlier run built for its own RL (a KL reference, a separate
    /// critic, stale engines), which this run builds as its experiment asks, from the same
    /// weights, as it would after a warm-up of its own.
    pub fn restore_warmup(
        self,
        checkpoint: &Checkpoint,
        spec: &spec::Experiment,
        device: &B::Device,
    ) -> Result<Self, RunError> {
        Ok(RunState {
            reference: None,
            critic: None,
            stale: None,
            ..self.restore(checkpoint, spec, device)?
        })
    }

    /// Writes this state, with the run's identity, as a checkpoint into `dir/checkpoints/`;
    /// returns its path.
    pub fn save(&mut self, dir: &Path, identity: Identity<'_>) -> Result<PathBuf, RunError> {
        self.successes.make_contiguous();
        let path = Snapshot {
            spec: identity.spec,
            task_versions: identity.task_versions,
            tokenizer: identity.tokenizer,
            policy: &self.policy,
            optimizer: &self.optimizer,
            reference: self.reference.as_ref(),
            critic: self.critic.as_ref().map(|c| (&c.net, &c.optimizer)),
            phase: self.phase,
            rng: &self.rng,
            after_warmup: self.after_warmup.as_ref().map(|e| &e.first),
            after_warmup_sampled: self.after_warmup.as_ref().and_then(|e| e.sampled.as_ref()),
            skipped_steps: self.skipped,
            metrics_len: identity.metrics_len,
            successes: self.successes.as_slices().0,
            monitor: &self.monitor,
            nonfinite_streak: self.nonfinite_streak,
            stale: self.stale.as_ref().map(Versioned::borrowed),
            base: identity.base_digest,
        }
        .save(dir)?;
        Ok(path)
    }
}

/// PPO's separate critic (`value_head = separate`): a network of the policy's architecture
/// with a value head, trained on the value loss by an optimizer of its own.
pub(super) struct Critic<B: TrainBackend> {
    /// The network.
    pub net: Policy<B>,
    /// Its optimizer.
    pub optimizer: PolicyOptimizer<Policy<B>, B>,
}

impl<B: TrainBackend> Critic<B> {
    /// A copy of `policy` (its trunk and LM head, which the critic never reads) with a fresh
    /// value head and a fresh optimizer of the declared kind: what the critic starts from, and
    /// what a resumed run loads its state into.
    pub fn fresh(policy: &Policy<B>, optimizer: &spec::Optimizer) -> Self {
        Critic {
            net: policy.clone().with_value_head(),
            optimizer: PolicyOptimizer::new(optimizer),
        }
    }
}
