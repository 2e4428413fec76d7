//! The ablations recipe sized for a GPU:
//! `cargo run --release --features cuda --example ablations_gpu`.
//!
//! `agentrl_gpu` without cross-policy sampling, without per-task advantage normalization, and
//! with the stale engine refreshed every 16 steps instead of 4, five seeds each. Its warm-ups
//! are `agentrl_gpu`'s: run both in one command (`agentry run experiments/agentrl_gpu.arl
//! experiments/ablations_gpu.arl`). Options: `-- --config ablate.pool.cross_policy=0 --quiet`.

agentry::experiment!("experiments/ablations_gpu.arl");

fn main() -> agentry::Result<()> {
    agentry::main(AblationsGpu)
}
