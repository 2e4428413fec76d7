//! RL algorithms: advantage estimation (outcome estimators and GAE), the policy and value losses.
//!
//! The estimators and normalizers work on plain `f32` slices, so they are tested against
//! hand-computed values without tensors; the loss works on burn tensors, so it differentiates.
//! Formulas follow verl 0.9's `core_algos.py` and AgentRL's task advantage normalization
//! (DESIGN §6).

pub mod advantage;
pub mod gae;
pub mod loss;

pub use advantage::{
    Baseline, Trajectory, credited_advantages, normalize_by_key, outcome_advantages,
    outcome_baselines, returns_to_go, std_dev, weigh_negatives, whiten,
};
pub use gae::{explained_variance, gae, terminal_rewards, turn_end_rewards};
pub use loss::{LossStats, PolicyLossInput, ValueStats, policy_loss, value_loss};
