//! An update's loss over some rows of its batch: the whole batch for one trainer, a share of it
//! for each data-parallel replica ([`super::replicas`]). Weighed by its [`Share`], a share's
//! loss and statistics are its part of the whole batch's, so the shares' sums are the whole's.

use std::ops::Range;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

use crate::algo::loss::{PolicyLossConfig, Share, policy_loss_share};
use crate::algo::{LossStats, PolicyLossInput, ValueStats, value_loss};
use crate::model::{Kernels, Policy, TrainBackend, Want};
use crate::text::Transcript;

use super::buckets::{self, predicted_agent, score_in_buckets};

/// What an RL update's loss needs besides its rows, the same for every epoch and replica.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct RlSettings {
    /// The policy loss's clip, aggregation, entropy and KL settings.
    pub loss: PolicyLossConfig,
    /// The training temperature the log-probabilities are taken at.
    pub temperature: f64,
    /// The padding token.
    pub pad: u32,
    /// PPO with a shared trunk: the value loss is part of the policy's, weighed by this.
    pub value: Option<ValueSettings>,
}

/// PPO's value loss on the shared trunk.
#[derive(Clone, Copy, Debug, serde::Serialize, serde::Deserialize)]
pub(super) struct ValueSettings {
    /// The value clip.
    pub clip: f64,
    /// The value loss's coefficient in the total.
    pub coef: f64,
}

/// The constant inputs of an RL update's loss for some rows of its batch (`[rows, width - 1]`
/// tensors): the tokens' behaviour (or update-start) log-probabilities, their truncated
/// importance weights, advantages and agent mask, the KL reference's log-probabilities and
/// PPO's value targets.
pub(super) struct RlRows<B: Backend> {
    /// The rows' transcripts.
    pub transcripts: Vec<Transcript>,
    /// The batch's padded width.
    pub width: usize,
    pub old_logprobs: Tensor<B, 2>,
    pub is_weights: Option<Tensor<B, 2>>,
    pub advantages: Tensor<B, 2>,
    pub mask: Tensor<B, 2>,
    pub ref_logprobs: Option<Tensor<B, 2>>,
    /// PPO's rollout values and returns.
    pub value_targets: Option<(Tensor<B, 2>, Tensor<B, 2>)>,
}

/// [`RlRows`] as plain data, to cross to a replica's thread, device or node.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct RlRowsData {
    transcripts: Vec<Transcript>,
    width: usize,
    tensors: Vec<Option<TensorData>>,
}

impl<B: Backend> RlRows<B> {
    /// The number of rows.
    pub fn len(&self) -> usize {
        self.transcripts.len()
    }

    /// Rows `range` of these.
    pub fn rows(&self, range: Range<usize>) -> RlRows<B> {
        let cut = |t: &Tensor<B, 2>| t.clone().slice([range.clone(), 0..self.width - 1]);
        RlRows {
            transcripts: self.transcripts[range.clone()].to_vec(),
            width: self.width,
            old_logprobs: cut(&self.old_logprobs),
            is_weights: self.is_weights.as_ref().map(cut),
            advantages: cut(&self.advantages),
            mask: cut(&self.mask),
            ref_logprobs: self.ref_logprobs.as_ref().map(cut),
            value_targets: self
                .value_targets
                .as_ref()
                .map(|(values, returns)| (cut(values), cut(returns))),
        }
    }

    /// The share of rows `range` in these, under `aggregation`.
    pub fn share(&self, range: Range<usize>, loss: &PolicyLossConfig) -> Share {
        let scored: Vec<Vec<bool>> = self
            .transcripts
            .iter()
            .map(|t| predicted_agent(t, self.width).collect())
            .collect();
        Share::of(&scored, range, loss.aggregation)
    }

    /// These rows as data.
    pub fn into_data(self) -> RlRowsData {
        let (values, returns) = match self.value_targets {
            Some((values, returns)) => (Some(values), Some(returns)),
            None => (None, None),
        };
        let tensors = [
            Some(self.old_logprobs),
            self.is_weights,
            Some(self.advantages),
            Some(self.mask),
            self.ref_logprobs,
            values,
            returns,
        ];
        RlRowsData {
            transcripts: self.transcripts,
            width: self.width,
            tensors: tensors
                .into_iter()
                .map(|t| t.map(Tensor::into_data))
                .collect(),
        }
    }
}

impl RlRowsData {
    /// The rows on `device`.
    pub fn on<B: Backend>(self, device: &B::Device) -> RlRows<B> {
        let mut tensors = self
            .tensors
            .into_iter()
            .map(|t| t.map(|data| Tensor::<B, 2>::from_data(data, device)));
        let mut next = || tensors.next().flatten();
        let old_logprobs = next();
        let is_weights = next();
        let advantages = next();
        let mask = next();
        let ref_logprobs = next();
        let values = next();
        let returns = next();
        let shape = [self.transcripts.len(), self.width - 1];
        let empty = || Tensor::zeros(shape, device);
        RlRows {
            transcripts: self.transcripts,
            width: self.width,
            old_logprobs: old_logprobs.unwrap_or_else(empty),
            is_weights,
            advantages: advantages.unwrap_or_else(empty),
            mask: mask.unwrap_or_else(empty),
            ref_logprobs,
            value_targets: values.zip(returns),
        }
    }
}

/// An RL epoch's statistics over the rows it was computed on (weighed by their share, so the
/// shares' statistics sum to the batch's).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RlTerms {
    pub loss: LossStats,
    pub value: Option<ValueStats>,
}

impl RlTerms {
    /// The statistics as numbers to sum across replicas.
    pub fn to_vec(self) -> Vec<f32> {
        let l = self.loss;
        let v = self.value.unwrap_or_default();
        vec![
            l.policy,
            l.entropy,
            l.kl,
            l.clip_low,
            l.clip_high,
            v.loss,
            v.clip_frac,
        ]
    }

    /// The statistics summed across replicas ([`RlTerms::to_vec`]'s order), with a value loss
    /// when the update has one.
    pub fn from_slice(sums: &[f32], value: bool) -> RlTerms {
        let at = |i: usize| sums.get(i).copied().unwrap_or(0.0);
        RlTerms {
            loss: LossStats {
                policy: at(0),
                entropy: at(1),
                kl: at(2),
                clip_low: at(3),
                clip_high: at(4),
            },
            value: value.then(|| ValueStats {
                loss: at(5),
                clip_frac: at(6),
            }),
        }
    }
}

/// The loss of one RL epoch on `rows` weighed by their `share`, plus `sft_alpha` times the
/// NLL of `demos` (one replica adds the SFT term; it is no share of the batch); `None` for no
/// rows and no demonstrations.
pub(super) fn rl_loss<B: TrainBackend>(
    policy: &Policy<B>,
    rows: &RlRows<B>,
    share: Share,
    demos: &[Transcript],
    sft_alpha: f64,
    settings: &RlSettings,
) -> Option<(Tensor<B, 1>, RlTerms)> {
    let mut total: Option<Tensor<B, 1>> = None;
    let mut terms = RlTerms::default();
    if rows.len() > 0 {
        let want = match settings.value {
            Some(_) if rows.value_targets.is_some() => Want::Both,
            _ => Want::Policy,
        };
        let transcripts: Vec<&Transcript> = rows.transcripts.iter().collect();
        let scores = score_in_buckets(
            policy,
            &transcripts,
            settings.pad,
            rows.width,
            settings.temperature,
            want,
        );
        let (mut loss, stats) = policy_loss_share(
            PolicyLossInput {
                logprobs: scores.logprobs,
                old_logprobs: rows.old_logprobs.clone(),
                is_weights: rows.is_weights.clone(),
                advantages: rows.advantages.clone(),
                mask: rows.mask.clone(),
                entropy: scores.entropy,
                ref_logprobs: rows.ref_logprobs.clone(),
            },
            &settings.loss,
            share,
        );
        terms.loss = stats;
        if let (Some(value), Some(values), Some((old, returns))) =
            (settings.value, scores.values, &rows.value_targets)
        {
            let (value_term, stats) = value_loss(
                values,
                old.clone(),
                returns.clone(),
                rows.mask.clone(),
                value.clip,
            );
            let (value_term, stats) = if share.tokens == 1.0 {
                (value_term, stats)
            } else {
                let weighed = ValueStats {
                    loss: stats.loss * share.tokens,
                    clip_frac: stats.clip_frac * share.tokens,
                };
                (value_term * share.tokens, weighed)
            };
            loss = loss + value_term * value.coef;
            terms.value = Some(stats);
        }
        total = Some(loss);
    }
    if sft_alpha > 0.0 && !demos.is_empty() {
        let demos: Vec<&Transcript> = demos.iter().collect();
        if let Some(sft) = buckets::nll(policy, &demos, settings.pad) {
            let sft = sft * sft_alpha;
            total = Some(match total {
                Some(loss) => loss + sft,
                None => sft,
            });
        }
    }
    total.map(|loss| (loss, terms))
}

/// The warm-up's loss on `transcripts`: their agent tokens' NLL weighed by `share` (the
/// transcripts' agent tokens over the batch's); `None` for no transcripts.
pub(super) fn sft_loss<B: Kernels>(
    policy: &Policy<B>,
    transcripts: &[Transcript],
    pad: u32,
    share: f32,
) -> Option<Tensor<B, 1>> {
    let batch: Vec<&Transcript> = transcripts.iter().collect();
    let loss = buckets::nll(policy, &batch, pad)?;
    Some(if share == 1.0 { loss } else { loss * share })
}

/// The agent tokens of `transcripts[range]` over all of theirs: a warm-up share's weight.
pub(super) fn token_share(transcripts: &[Transcript], range: Range<usize>) -> f32 {
    // The predicted tokens (position 0 is never predicted).
    let tokens = |ts: &[Transcript]| -> usize {
        ts.iter()
            .map(|t| t.agent_mask.iter().skip(1).filter(|m| **m).count())
            .sum()
    };
    let whole = tokens(transcripts);
    if whole == 0 {
        0.0
    } else {
        (tokens(&transcripts[range]) as f64 / whole as f64) as f32
    }
}

/// `n` rows cut into `parts` contiguous ranges, the first ones one longer when `n` does not
/// divide evenly (a range is empty when there are fewer rows than parts).
pub(super) fn split(n: usize, parts: usize) -> Vec<Range<usize>> {
    let parts = parts.max(1);
    let (base, extra) = (n / parts, n % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_covers_every_row_once_in_order() {
        assert_eq!(split(10, 3), vec![0..4, 4..7, 7..10]);
        assert_eq!(split(2, 4), vec![0..1, 1..2, 2..2, 2..2]);
        assert_eq!(split(0, 2), vec![0..0, 0..0]);
        assert_eq!(split(5, 1), vec![0..5]);
    }

    #[test]
    fn token_shares_sum_to_one() {
        let t = |mask: &[bool]| Transcript {
            tokens: vec![1; mask.len()],
            agent_mask: mask.to_vec(),
        };
        // Position 0 is never predicted: the first transcript has 1 agent token, the second 3.
        let batch = vec![t(&[true, false, true]), t(&[false, true, true, true])];
        assert_eq!(token_share(&batch, 0..1), 0.25);
        assert_eq!(token_share(&batch, 1..2), 0.75);
        assert_eq!(token_share(&batch[..0], 0..0), 0.0);
    }
}
