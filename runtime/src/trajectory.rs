//! Recorded trajectories: every evaluation episode as one line of JSON, and the readable
//! transcript of an episode.
//!
//! An evaluation writes all its episodes to `RUN_DIR/episodes/LABEL.jsonl` (a periodic
//! evaluation to `periodic-NNNNNN.jsonl`, by its policy version, so none replaces another).
//! A line holds what `agentry replay` needs to play the episode again
//! ([`crate::replay`]): the instance (task, its generator version, split, difficulty, index),
//! the budgets (turns, context), the decoding, the policy version of each turn, and per turn the
//! agent's reply (text and token ids), the behaviour log-probability of each of its tokens, and
//! the environment's answer (observation, reward, status); then the episode's reward, success
//! and status. Instances are a pure function of the first five, so the line with the run
//! directory's files pins the episode.

use agentry_env::{Split, Status};
use serde::{Deserialize, Serialize};

use crate::metrics::EvalPoint;
use crate::model::Sampling;
use crate::rollout::Episode;
use crate::spec::Decoding;
use crate::text::{ChatFormat, Tokenizer};

/// The folder of a run directory holding the recorded episodes.
pub const DIR: &str = "episodes";

/// One recorded episode, a line of `episodes/*.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// The task's name in the experiment.
    pub task: String,
    /// The task generator's version when the episode was played.
    pub task_version: String,
    /// Train or test instances.
    pub split: Split,
    /// Difficulty level.
    pub difficulty: u8,
    /// Instance index within the split.
    pub index: u64,
    /// Turn budget.
    pub max_turns: u32,
    /// The policy's context: the rollout ends an episode when no reply would fit.
    pub context: usize,
    /// The evaluation that played it (`warmup`, `periodic`, `final`, ...).
    pub evaluation: String,
    /// How replies were decoded.
    pub decoding: Sampling,
    /// The version of the policy (RL updates applied) that generated each turn.
    pub policy_versions: Vec<u64>,
    /// Every agent turn, in order.
    pub turns: Vec<Turn>,
    /// Sum of the turn rewards.
    pub reward: f32,
    /// Whether the environment judged the episode solved.
    pub success: bool,
    /// How it ended.
    pub status: Status,
}

impl Trajectory {
    /// The episode's spec, as task 0 of a one-task list (a replay plays it alone).
    pub(crate) fn episode_spec(&self) -> crate::rollout::EpisodeSpec {
        crate::rollout::EpisodeSpec {
            task: 0,
            split: self.split,
            difficulty: self.difficulty,
            index: self.index,
            max_turns: self.max_turns,
            group: 0,
        }
    }
}

/// One agent turn and the environment's answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The reply's text, up to its end token (what was parsed as a call).
    pub reply: String,
    /// The reply's token ids, as generated (with the end token when it stopped there).
    pub tokens: Vec<u32>,
    /// The behaviour log-probability of each token.
    pub logprobs: Vec<f32>,
    /// The environment's observation (or the parser's error).
    pub observation: String,
    /// The turn's reward.
    pub reward: f32,
    /// The step's status.
    pub status: Status,
}

/// Where the episode came from, beyond the episode itself.
pub struct Origin<'a> {
    /// The task's name.
    pub task: &'a str,
    /// Its generator's version.
    pub task_version: &'a str,
    /// The evaluation's label.
    pub evaluation: &'a str,
    /// The policy's context.
    pub context: usize,
    /// The decoding.
    pub sampling: &'a Sampling,
    /// The version of the policy that played it.
    pub version: u64,
}

impl Trajectory {
    /// The record of an evaluation episode, played by one policy (`origin.version`).
    pub fn of(episode: &Episode, chat: &ChatFormat, origin: &Origin<'_>) -> Self {
        let turns = episode
            .turns
            .iter()
            .zip(episode.reply_positions())
            .map(|(turn, positions)| {
                let tokens: Vec<u32> = positions
                    .iter()
                    .map(|&j| episode.transcript.tokens[j])
                    .collect();
                Turn {
                    reply: chat.agent_text(&tokens),
                    logprobs: positions.iter().map(|&j| episode.logprobs[j]).collect(),
                    tokens,
                    observation: turn.step.observation.clone(),
                    reward: turn.step.reward,
                    status: turn.step.status,
                }
            })
            .collect::<Vec<_>>();
        Trajectory {
            task: origin.task.to_string(),
            task_version: origin.task_version.to_string(),
            split: episode.spec.split,
            difficulty: episode.spec.difficulty,
            index: episode.spec.index,
            max_turns: episode.spec.max_turns,
            context: origin.context,
            evaluation: origin.evaluation.to_string(),
            decoding: origin.sampling.clone(),
            policy_versions: vec![origin.version; turns.len()],
            turns,
            reward: episode.reward(),
            success: episode.success,
            status: episode.status,
        }
    }
}

/// The file an evaluation's episodes go to, inside [`DIR`]: `LABEL.jsonl` (`final.jsonl`,
/// `warmup-sampled.jsonl`), or for periodic evaluations `periodic-NNNNNN.jsonl` (by policy
/// version, so each is kept).
pub fn file_name(point: EvalPoint, decoding: Decoding, version: u64) -> String {
    let sampled = match decoding {
        Decoding::Greedy => "",
        Decoding::Sampled => "-sampled",
    };
    match point {
        EvalPoint::Periodic => format!("periodic-{version:06}{sampled}.jsonl"),
        point => format!("{point}{sampled}.jsonl"),
    }
}

/// An episode as the `samples-*.txt` files show it: a header line (task, instance,
/// difficulty, outcome), then the whole decoded conversation with its special tokens.
pub fn render(task: &str, episode: &Episode, tokenizer: &Tokenizer) -> String {
    format!(
        "== {} instance {} difficulty {}: success {} reward {} turns {} ({:?})\n{}\n",
        task,
        episode.spec.index,
        episode.spec.difficulty,
        episode.success,
        episode.reward(),
        episode.turn_count(),
        episode.status,
        tokenizer.decode(&episode.transcript.tokens)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_evaluation_has_its_own_episodes_file() {
        let name = |point, decoding, version| file_name(point, decoding, version);
        assert_eq!(name(EvalPoint::Warmup, Decoding::Greedy, 0), "warmup.jsonl");
        assert_eq!(
            name(EvalPoint::Warmup, Decoding::Sampled, 0),
            "warmup-sampled.jsonl"
        );
        assert_eq!(name(EvalPoint::Final, Decoding::Greedy, 40), "final.jsonl");
        // Periodic evaluations are kept apart by the policy's version.
        assert_eq!(
            name(EvalPoint::Periodic, Decoding::Greedy, 3),
            "periodic-000003.jsonl"
        );
        assert_eq!(
            name(EvalPoint::Periodic, Decoding::Sampled, 12),
            "periodic-000012-sampled.jsonl"
        );
    }
}
