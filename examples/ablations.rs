//! The ablations recipe: `cargo run --release --example ablations`.
//!
//! The AgentRL recipe without cross-policy sampling, and without per-task advantage
//! normalization, three seeds each. Its warm-ups are the AgentRL recipe's: run both in one
//! command (`agentry run experiments/agentrl.arl experiments/ablations.arl`) and each seed's
//! warm-up is trained once. Options: `-- --config ablate.pool.cross_policy=0 --quiet`.

agentry::experiment!("experiments/ablations.arl");

fn main() -> agentry::Result<()> {
    agentry::main(Ablations)
}
