//! Updates of the weights: the supervised warm-up, and RL steps (batches, epochs, the critic).

use burn::module::AutodiffModule;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use agentry_dsl::spec::{self, AlgorithmKind, KlPlacement, SftSource, ValueHead};

use super::Trainer;
use super::buckets::{Padded, predicted_agent, score_in_buckets};
use super::prepare::{self, AdvantageStats, Advantages, Example, PreparedStats};
use super::record::StepStats;
use super::replicas::{LeaderState, Replicas, Work};
use super::shares::{
    RlRows, RlSettings, RlTerms, ValueSettings, rl_loss, sft_loss, split, token_share,
};
use super::source::Collected;
use crate::algo::loss::{IsStats, PolicyLossConfig, Share, kl_estimate, truncated_is_weights};
use crate::algo::{LossStats, ValueStats, explained_variance, value_loss};
use crate::checkpoint::Phase;
use crate::error::{RunError, Update};
use crate::metrics::{Progress, Record};
use crate::model::{Kernels, Policy, TrainBackend, Want};
use crate::optim::{Alone, Descent, descend, descend_summed};
use crate::rollout::Episode;
use crate::text::Transcript;

/// The ChaCha stream of the run's seed that LoRA dropout's per-update seeds come from
/// (evaluation uses its own seed; training's RNG is stream 0).
const DROPOUT_STREAM: u64 = 0xd20f;

/// What one RL update measured over its epochs.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct UpdateStats {
    /// The last applied policy epoch; `None` when every epoch was skipped as not finite.
    pub applied: Option<AppliedEpoch>,
    /// PPO's value loss (last epoch that computed it).
    pub value: Option<ValueStats>,
    /// Truncated importance sampling: the weights at the update's start.
    pub importance: Option<IsStats>,
    /// Updates (policy epochs and critic updates) skipped because they were not finite.
    pub skipped_nonfinite: usize,
    /// Wall-clock seconds of the update.
    pub seconds: f64,
}

/// The loss of an applied policy epoch, its terms and its gradient norm before clipping.
#[derive(Clone, Copy, Debug)]
pub(super) struct AppliedEpoch {
    /// The total loss.
    pub loss: f32,
    /// The policy loss's terms.
    pub terms: LossStats,
    /// Gradient norm before clipping.
    pub grad_norm: f32,
}

impl<B: TrainBackend> Trainer<B> {
    /// Behaviour cloning of the oracle demonstrations, from warm-up step `done + 1`.
    pub(super) fn warmup(&mut self, warmup: &spec::Warmup, done: u64) -> Result<(), RunError> {
        if self.demos.is_empty() {
            return Err(RunError::NoDemonstrations);
        }
        let progress = Progress::new(warmup.steps, "sft", self.options.quiet);
        progress.update(done, String::new());
        for step in done + 1..=warmup.steps {
            let batch: Vec<Transcript> = (0..warmup.batch)
                .map(|_| self.demos[self.state.rng.random_range(0..self.demos.len())].clone())
                .collect();
            self.seed_dropout(Phase::Warmup { step });
            let lr = warmup.lr.at(step - 1);
            let descent = self.descend_sft(batch, lr, Update::Warmup { step })?;
            let record = match self.survive(descent, Update::Warmup { step })? {
                Some(grad_norm) => {
                    progress.update(step, format!("loss {:.4}", descent.loss()));
                    Record::Sft {
                        step,
                        loss: descent.loss(),
                        grad_norm,
                        lr: Some(lr),
                        skipped_nonfinite: false,
                    }
                }
                None => {
                    progress.println(format!(
                        "warning: warm-up step {step}: {}",
                        self.skip_notice(descent)
                    ));
                    Record::Sft {
                        step,
                        loss: 0.0,
                        grad_norm: 0.0,
                        lr: Some(lr),
                        skipped_nonfinite: true,
                    }
                }
            };
            self.run_dir.record(&record)?;
            self.state.phase = Phase::Warmup { step };
            if self.checkpoint_due(step) {
                self.checkpoint()?;
            }
        }
        progress.finish();
        Ok(())
    }

    /// RL step `step` on the episodes `collected` holds: the batch's statistics as played,
    /// then [`prepare`] (KL penalty, staleness, filter, advantages), then the update.
    pub(super) fn learn(&mut self, step: u64, collected: Collected) -> Result<StepStats, RunError> {
        let Collected {
            episodes,
            turn_values,
            versioned,
            stats: rollout,
        } = collected;
        let algorithm = self.spec.algorithm.clone();
        let task_names: Vec<&str> = self.spec.tasks.iter().map(|t| t.name.as_str()).collect();
        let played = prepare::played(&task_names, &episodes);
        let successes_kept = match algorithm.sft_from {
            SftSource::Successes { keep } => {
                let solved = episodes
                    .iter()
                    .filter(|e| e.success && !e.transcript.tokens.is_empty());
                let successes = &mut self.state.successes;
                successes.extend(solved.map(|e| e.transcript.clone()));
                let excess = successes.len().saturating_sub(keep);
                successes.drain(..excess);
                Some(successes.len())
            }
            SftSource::Oracle => None,
        };

        let penalties = match algorithm.kl.placement {
            KlPlacement::Reward => self.kl_penalties(&episodes),
            KlPlacement::Loss => None,
        };
        let mut examples = prepare::credit(episodes, penalties.as_deref(), turn_values);
        // Like the filter below, the staleness bound decides what is trained on; the success and
        // return above describe every episode played.
        let staleness = if versioned {
            let (kept, staleness) =
                prepare::within_staleness(examples, step - 1, self.spec.pool.max_staleness);
            examples = kept;
            Some(staleness)
        } else {
            None
        };
        let examples = prepare::filter_groups(examples, algorithm.filter);
        // PPO: the critic's values at the rollout (no gradient), then GAE on them.
        let old_values = match algorithm.kind {
            AlgorithmKind::Ppo => Some(self.rollout_values(&examples)),
            _ => None,
        };
        let Advantages {
            advantages,
            returns,
        } = prepare::token_advantages(&algorithm, &examples, old_values.as_deref());
        // PPO: the rollout values' fit to the returns, and whether the critic has any target to
        // learn (an update runs for it even when every advantage is 0).
        let (fit, critic_targets) = match (&old_values, &returns) {
            (Some(values), Some(returns)) => {
                let (values, returns): (Vec<f32>, Vec<f32>) = (values.concat(), returns.concat());
                (
                    Some(explained_variance(&returns, &values)),
                    values != returns,
                )
            }
            _ => (None, false),
        };
        let prepared = PreparedStats {
            played,
            successes_kept,
            staleness,
            groups_kept: prepare::groups(&examples),
            advantages: AdvantageStats::of(&advantages),
            explained_variance: fit,
        };
        let sft_alpha = algorithm.sft.at(step - 1);
        let update = if advantages.iter().flatten().all(|a| *a == 0.0) && !critic_targets {
            None
        } else {
            let targets = old_values
                .zip(returns)
                .map(|(values, returns)| ValueTargets { values, returns });
            Some(self.update(step, &examples, &advantages, targets, sft_alpha)?)
        };
        Ok(StepStats {
            step,
            stage: self.curriculum.stage_name(step - 1).to_string(),
            sft_alpha,
            rollout,
            prepared,
            update,
        })
    }

    /// The epochs of RL step `step`'s update on `examples`, with PPO's value `targets` and the
    /// SFT term weighed by `sft_alpha`.
    fn update(
        &mut self,
        step: u64,
        examples: &[Example],
        advantages: &[Vec<f32>],
        targets: Option<ValueTargets>,
        sft_alpha: f64,
    ) -> Result<UpdateStats, RunError> {
        let algorithm = self.spec.algorithm.clone();
        let group_size = algorithm.group_size.max(1);
        let update_started = std::time::Instant::now();
        self.seed_dropout(Phase::Rl { step });
        let episodes: Vec<&Episode> = examples.iter().map(|e| &e.episode).collect();
        let batch = self.rl_tensors(&episodes, advantages);
        let width = batch.width;
        // `[n, width - 1]` tensors of the rollout values and the returns, for the value loss.
        let value_targets = targets.map(|t| {
            (
                self.token_tensor::<B>(&episodes, &t.values, width),
                self.token_tensor::<B>(&episodes, &t.returns, width),
            )
        });
        let loss_config = PolicyLossConfig {
            clip: algorithm.clip,
            dual_clip: algorithm.dual_clip,
            aggregation: algorithm.aggregation,
            entropy_coef: algorithm.entropy,
            kl: match (algorithm.kl.estimator, algorithm.kl.placement) {
                (Some(estimator), KlPlacement::Loss) => Some((estimator, algorithm.kl.coef)),
                _ => None,
            },
        };
        let temperature = self.spec.train.temperature;
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let pad = self.chat.tokenizer().pad();
        let ref_logprobs = match (&self.state.reference, loss_config.kl) {
            (Some(reference), Some(_)) => Some(Tensor::from_inner(
                score_in_buckets(
                    reference,
                    &transcripts,
                    pad,
                    width,
                    temperature,
                    Want::LogProbs,
                )
                .logprobs,
            )),
            _ => None,
        };
        // Truncated importance sampling: the ratio is taken against the policy the update
        // starts from, and each token weighed by how much likelier that policy finds it than
        // the one that sampled it, capped.
        let mut stats = UpdateStats::default();
        let (old_logprobs, is_weights) = match algorithm.is_cap {
            None => (batch.old_logprobs.clone(), None),
            Some(cap) => {
                let start = score_in_buckets(
                    &self.state.policy.valid(),
                    &transcripts,
                    pad,
                    width,
                    temperature,
                    Want::LogProbs,
                )
                .logprobs;
                let start = Tensor::<B, 2>::from_inner(start);
                let (weights, importance) = truncated_is_weights(
                    start.clone(),
                    batch.old_logprobs.clone(),
                    batch.mask.clone(),
                    cap,
                );
                stats.importance = Some(importance);
                (start, Some(weights))
            }
        };
        // A shared trunk reads the values in the policy's own forward pass.
        let shared = value_targets.is_some() && self.state.critic.is_none();
        let settings = RlSettings {
            loss: loss_config,
            temperature,
            pad,
            value: shared.then_some(ValueSettings {
                clip: algorithm.value_clip,
                coef: algorithm.value_coef,
            }),
        };
        let rows = RlRows {
            transcripts: transcripts.iter().map(|t| (*t).clone()).collect(),
            width,
            old_logprobs,
            is_weights,
            advantages: batch.advantages.clone(),
            mask: batch.mask.clone(),
            ref_logprobs,
            value_targets: value_targets
                .as_ref()
                .filter(|_| shared)
                .map(|(old, returns)| (old.clone(), returns.clone())),
        };
        for _ in 0..algorithm.epochs {
            let pool: Vec<&Transcript> = match algorithm.sft_from {
                SftSource::Oracle => self.demos.iter().collect(),
                SftSource::Successes { .. } => self.state.successes.iter().collect(),
            };
            let demos: Vec<Transcript> = if sft_alpha > 0.0 && !pool.is_empty() {
                (0..group_size.max(4))
                    .map(|_| pool[self.state.rng.random_range(0..pool.len())].clone())
                    .collect()
            } else {
                Vec::new()
            };
            let (descent, terms) =
                self.descend_rl(&rows, demos, sft_alpha, &settings, Update::Rl { step })?;
            if terms.value.is_some() {
                stats.value = terms.value;
            }
            let terms = terms.loss;
            // A skipped update leaves the step's loss terms as they were (0 if no epoch ran).
            let Some(grad_norm) = self.survive(descent, Update::Rl { step })? else {
                stats.skipped_nonfinite += 1;
                continue;
            };
            stats.applied = Some(AppliedEpoch {
                loss: descent.loss(),
                terms,
                grad_norm,
            });
            if let (false, Some((old, returns))) = (shared, &value_targets) {
                match self.critic_step(&transcripts, old, returns, &batch.mask, step)? {
                    Some(value_stats) => stats.value = Some(value_stats),
                    None => stats.skipped_nonfinite += 1,
                }
            }
        }
        stats.seconds = update_started.elapsed().as_secs_f64();
        Ok(stats)
    }

    /// With LoRA dropout, reseeds the backend's RNG, which burn's dropout draws its
    /// masks from, from the run's seed and `update`: each update's masks are then a function
    /// of the seed and the step, and a resumed run draws the ones the uninterrupted run drew.
    fn seed_dropout(&self, update: Phase) {
        let spec::Finetune::Lora(lora) = &self.spec.model.finetune else {
            return;
        };
        if lora.dropout == 0.0 {
            return;
        }
        let (kind, step) = match update {
            Phase::Warmup { step } => (0, step),
            Phase::Rl { step } => (1, step),
        };
        let mut rng = ChaCha8Rng::seed_from_u64(self.spec.seed);
        rng.set_stream(DROPOUT_STREAM);
        rng.set_word_pos((u128::from(step) * 2 + kind) * 2);
        B::seed(&self.device, rng.next_u64());
    }

    /// A warm-up step on `batch`: the whole batch here, or one share per data-parallel replica.
    fn descend_sft(
        &mut self,
        batch: Vec<Transcript>,
        lr: f64,
        at: Update,
    ) -> Result<Descent, RunError> {
        let pad = self.chat.tokenizer().pad();
        let Some(replicas) = self.replicas(at)? else {
            let loss = sft_loss(&self.state.policy, &batch, pad, 1.0);
            return Ok(self.step_alone(loss, lr));
        };
        let shares = split(batch.len(), replicas.count());
        let works = shares[1..]
            .iter()
            .map(|range| Work::Sft {
                transcripts: batch[range.clone()].to_vec(),
                share: token_share(&batch, range.clone()),
                lr,
            })
            .collect();
        replicas
            .dispatch(works)
            .map_err(|reason| RunError::DataParallel { at, reason })?;
        let mine = &batch[shares[0].clone()];
        let share = token_share(&batch, shares[0].clone());
        let (descent, _) = self.step_together(lr, at, |policy| {
            (sft_loss(policy, mine, pad, share), Vec::new())
        })?;
        Ok(descent)
    }

    /// An RL epoch on `rows`, plus the SFT term on `demos`: the whole batch here, or one share
    /// per data-parallel replica (the leader's with the SFT term).
    fn descend_rl(
        &mut self,
        rows: &RlRows<B>,
        demos: Vec<Transcript>,
        sft_alpha: f64,
        settings: &RlSettings,
        at: Update,
    ) -> Result<(Descent, RlTerms), RunError> {
        let value = settings.value.is_some() && rows.value_targets.is_some();
        let lr = self.spec.train.lr;
        let Some(replicas) = self.replicas(at)? else {
            let loss = rl_loss(
                &self.state.policy,
                rows,
                Share::WHOLE,
                &demos,
                sft_alpha,
                settings,
            );
            let terms = loss.as_ref().map(|(_, terms)| *terms).unwrap_or_default();
            let descent = self.step_alone(loss.map(|(loss, _)| loss), lr);
            return Ok((descent, terms));
        };
        let shares = split(rows.len(), replicas.count());
        let works = shares[1..]
            .iter()
            .map(|range| Work::Rl {
                rows: rows.rows(range.clone()).into_data(),
                share: rows.share(range.clone(), &settings.loss),
                settings: *settings,
                lr,
            })
            .collect();
        replicas
            .dispatch(works)
            .map_err(|reason| RunError::DataParallel { at, reason })?;
        let mine = rows.rows(shares[0].clone());
        let share = rows.share(shares[0].clone(), &settings.loss);
        let (descent, sums) = self.step_together(lr, at, |policy| {
            match rl_loss(policy, &mine, share, &demos, sft_alpha, settings) {
                Some((loss, terms)) => (Some(loss), terms.to_vec()),
                None => (None, RlTerms::from_slice(&[], value).to_vec()),
            }
        })?;
        Ok((descent, RlTerms::from_slice(&sums, value)))
    }

    /// The data-parallel replicas, started on first use (from the policy and optimizer as
    /// they are then); `None` for one trainer.
    fn replicas(&mut self, at: Update) -> Result<Option<&mut Replicas<B>>, RunError> {
        let nodes = self.options.nodes.as_ref();
        if self.spec.train.data_parallel <= 1 && nodes.is_none() {
            return Ok(None);
        }
        if self.replicas.is_none() {
            let origin = LeaderState {
                spec: &self.spec,
                policy: &self.state.policy,
                optimizer: &self.state.optimizer,
                vocab: self.chat.tokenizer().vocab_size(),
                pad: self.chat.tokenizer().pad(),
            };
            let replicas = Replicas::start(origin, &self.device, nodes)
                .map_err(|reason| RunError::DataParallel { at, reason })?;
            self.replicas = Some(replicas);
        }
        Ok(self.replicas.as_mut())
    }

    /// Backward, clip, optimizer step of the policy on `loss` alone, unless the update is not
    /// finite ([`descend_summed`]).
    fn step_alone(&mut self, loss: Option<Tensor<B, 1>>, lr: f64) -> Descent {
        let stepped = descend_summed(
            self.state.policy.clone(),
            &mut self.state.optimizer,
            loss,
            lr,
            self.spec.algorithm.grad_clip,
            &mut Alone,
        );
        let (policy, descent) = match stepped {
            Ok(done) => done,
            Err(never) => match never {},
        };
        self.state.policy = policy;
        descent
    }

    /// The leader's step on its share's loss and scalars, as `loss` computes them from the
    /// policy, summed with the replicas' (the scalars returned summed).
    fn step_together<F>(
        &mut self,
        lr: f64,
        at: Update,
        loss: F,
    ) -> Result<(Descent, Vec<f32>), RunError>
    where
        F: FnOnce(&Policy<B>) -> (Option<Tensor<B, 1>>, Vec<f32>) + Send,
    {
        let Some(replicas) = self.replicas.as_mut() else {
            return Err(RunError::Internal(
                "a data-parallel step without its replicas",
            ));
        };
        let policy = self.state.policy.clone();
        let (policy, descent, scalars) = replicas
            .descend(policy, &mut self.state.optimizer, lr, loss)
            .map_err(|reason| RunError::DataParallel { at, reason })?;
        self.state.policy = policy;
        Ok((descent, scalars))
    }

    /// Counts `descent` against `train.max_nonfinite_skips`: the gradient norm of an applied
    /// update, `None` for a skipped one, or the error that ends the run once that many updates
    /// in a row were skipped.
    fn survive(&mut self, descent: Descent, at: Update) -> Result<Option<f32>, RunError> {
        match descent {
            Descent::Applied { grad_norm, .. } => {
                self.state.nonfinite_streak = 0;
                Ok(Some(grad_norm))
            }
            Descent::Skipped { loss, grad_norm } => {
                self.state.nonfinite_streak += 1;
                let limit = self.spec.train.max_nonfinite_skips;
                if self.state.nonfinite_streak >= limit {
                    return Err(RunError::NonFinite {
                        skipped: self.state.nonfinite_streak,
                        at,
                        loss,
                        grad_norm,
                    });
                }
                Ok(None)
            }
        }
    }

    /// What a skipped update's warning says.
    fn skip_notice(&self, descent: Descent) -> String {
        let what = match descent {
            Descent::Skipped {
                grad_norm: Some(norm),
                ..
            } => format!("the gradient norm is {norm}"),
            _ => format!("the loss is {}", descent.loss()),
        };
        format!(
            "{what}; the update was skipped, weights and optimizer unchanged ({} in a row; the \
             run stops at {}, `train.max_nonfinite_skips`)",
            self.state.nonfinite_streak, self.spec.train.max_nonfinite_skips
        )
    }

    /// `coef · KL` of each episode's agent tokens against the reference (the penalty on the
    /// reward); `None` without a reference or estimator.
    fn kl_penalties(&self, episodes: &[Episode]) -> Option<Vec<f32>> {
        let reference = self.state.reference.as_ref()?;
        let estimator = self.spec.algorithm.kl.estimator?;
        let coef = self.spec.algorithm.kl.coef;
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let batch = self.padded::<B::InnerBackend>(&transcripts);
        let ref_logprobs = score_in_buckets(
            reference,
            &transcripts,
            self.chat.tokenizer().pad(),
            batch.width,
            self.spec.train.temperature,
            Want::LogProbs,
        )
        .logprobs;
        let episodes: Vec<&Episode> = episodes.iter().collect();
        let old = self.behaviour_logprobs::<B::InnerBackend>(&episodes, batch.width);
        let kl = (kl_estimate(old, ref_logprobs, estimator) * batch.mask).sum_dim(1);
        let kl = kl.into_data().into_vec::<f32>().unwrap_or_default();
        Some(
            kl.into_iter()
                .map(|kl| (f64::from(kl) * coef) as f32)
                .collect(),
        )
    }

    /// The critic's values (the shared trunk's head, or the separate critic) of each example's
    /// agent tokens, computed without a gradient before the update: PPO's `V_old`.
    fn rollout_values(&self, examples: &[Example]) -> Vec<Vec<f32>> {
        let critic = match &self.state.critic {
            Some(critic) => critic.net.valid(),
            None => self.state.policy.valid(),
        };
        let transcripts: Vec<&Transcript> =
            examples.iter().map(|e| &e.episode.transcript).collect();
        let width = Padded::<B::InnerBackend>::width(&transcripts);
        let pad = self.chat.tokenizer().pad();
        let values = score_in_buckets(&critic, &transcripts, pad, width, 1.0, Want::Values)
            .values
            .map(|v| v.into_data().into_vec::<f32>().unwrap_or_default())
            .unwrap_or_default();
        transcripts
            .iter()
            .enumerate()
            .map(|(i, transcript)| {
                predicted_agent(transcript, width)
                    .enumerate()
                    .filter(|(_, agent)| *agent)
                    .map(|(p, _)| values.get(i * (width - 1) + p).copied().unwrap_or(0.0))
                    .collect()
            })
            .collect()
    }

    /// One update of the separate critic on the clipped value loss, with its own optimizer at
    /// the train learning rate and the algorithm's gradient clip; `None` when it was skipped as
    /// not finite.
    fn critic_step(
        &mut self,
        transcripts: &[&Transcript],
        old_values: &Tensor<B, 2>,
        returns: &Tensor<B, 2>,
        mask: &Tensor<B, 2>,
        step: u64,
    ) -> Result<Option<ValueStats>, RunError> {
        let pad = self.chat.tokenizer().pad();
        let (lr, clip, grad_clip) = (
            self.spec.train.lr,
            self.spec.algorithm.value_clip,
            self.spec.algorithm.grad_clip,
        );
        let Some(critic) = self.state.critic.as_mut() else {
            return Err(RunError::Internal(
                "PPO with a separate critic reached an update without its critic",
            ));
        };
        let width = old_values.dims()[1] + 1;
        let values = score_in_buckets(&critic.net, transcripts, pad, width, 1.0, Want::Values)
            .values
            .unwrap_or_else(|| Tensor::zeros(old_values.dims(), &self.device));
        let (loss, stats) = value_loss(
            values,
            old_values.clone(),
            returns.clone(),
            mask.clone(),
            clip,
        );
        let (net, descent) = descend(
            critic.net.clone(),
            &mut critic.optimizer,
            loss,
            lr,
            grad_clip,
        );
        critic.net = net;
        Ok(self
            .survive(descent, Update::Critic { step })?
            .map(|_| stats))
    }

    /// Whether this run trains a separate critic, which RL starts from a copy of the policy.
    pub(super) fn separate_critic(&self) -> bool {
        self.spec.model.value_head == ValueHead::Separate
            && self.spec.algorithm.kind == AlgorithmKind::Ppo
    }

    /// Right-padded transcripts, with the agent mask of the predicted tokens.
    fn padded<C: Kernels<Device = B::Device>>(&self, transcripts: &[&Transcript]) -> Padded<C> {
        Padded::new(transcripts, self.chat.tokenizer().pad(), &self.device)
    }

    /// The log-probabilities the episodes' tokens were sampled with, `[n, width - 1]`.
    fn behaviour_logprobs<C: Backend<Device = B::Device>>(
        &self,
        episodes: &[&Episode],
        width: usize,
    ) -> Tensor<C, 2> {
        let old: Vec<f32> = episodes
            .iter()
            .flat_map(|e| (1..width).map(|j| e.logprobs.get(j).copied().unwrap_or(0.0)))
            .collect();
        Tensor::from_data(
            TensorData::new(old, [episodes.len(), width - 1]),
            &self.device,
        )
    }

    /// Values given per agent token of each episode (in order), placed at their
    /// predicted-token positions of a `[n, width - 1]` tensor, zero elsewhere.
    fn token_tensor<C: Backend<Device = B::Device>>(
        &self,
        episodes: &[&Episode],
        per_token: &[Vec<f32>],
        width: usize,
    ) -> Tensor<C, 2> {
        let mut flat = Vec::with_capacity(episodes.len() * (width - 1));
        for (episode, values) in episodes.iter().zip(per_token) {
            let mut next = values.iter();
            for agent in predicted_agent(&episode.transcript, width) {
                flat.push(if agent {
                    next.next().copied().unwrap_or(0.0)
                } else {
                    0.0
                });
            }
        }
        Tensor::from_data(
            TensorData::new(flat, [episodes.len(), width - 1]),
            &self.device,
        )
    }

    fn rl_tensors(&self, episodes: &[&Episode], advantages: &[Vec<f32>]) -> RlBatch<B> {
        let transcripts: Vec<&Transcript> = episodes.iter().map(|e| &e.transcript).collect();
        let padded = self.padded::<B>(&transcripts);
        let width = padded.width;
        RlBatch {
            width,
            old_logprobs: self.behaviour_logprobs(episodes, width),
            advantages: self.token_tensor(episodes, advantages, width),
            mask: padded.mask,
        }
    }
}

/// PPO's critic targets, per example and agent token: the values at the rollout and the
/// returns.
struct ValueTargets {
    values: Vec<Vec<f32>>,
    returns: Vec<Vec<f32>>,
}

/// An RL batch's per-token tensors, `[n, width - 1]`, right-padded to its longest episode.
struct RlBatch<B: Backend> {
    width: usize,
    mask: Tensor<B, 2>,
    old_logprobs: Tensor<B, 2>,
    advantages: Tensor<B, 2>,
}
