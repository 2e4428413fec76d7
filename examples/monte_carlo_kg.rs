//! The Monte-Carlo process-reward recipe: `cargo run --release --example monte_carlo_kg`.
//!
//! The quickstart's task, model and warm-up, trained with REINFORCE++ where each turn's
//! baseline is the value of the state it started from, estimated by two continuations played
//! from a copy of the environment. It prints held-out success after the warm-up and after RL.
//! Options: `-- --device cuda --steps 200 --quiet`.

agentry::experiment!("experiments/monte_carlo_kg.arl");

fn main() -> agentry::Result<()> {
    agentry::main(MonteCarloKg)
}
