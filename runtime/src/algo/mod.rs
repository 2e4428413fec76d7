//! RL algorithms: advantage estimation and the policy loss.
//!
//! The estimators and normalizers work on plain `f32` slices, so they are tested against
//! hand-computed values without tensors; the loss works on burn tensors, so it differentiates.
//! Formulas follow verl 0.9's `core_algos.py` and AgentRL's task advantage normalization
//! (DESIGN §6).

pub mod advantage;
pub mod loss;

pub use advantage::{normalize_by_key, outcome_advantages, std_dev, weigh_negatives, whiten};
pub use loss::{LossStats, PolicyLossInput, policy_loss};
