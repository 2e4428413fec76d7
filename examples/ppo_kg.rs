//! The PPO recipe: `cargo run --release --example ppo_kg`.
//!
//! The quickstart's task and model, trained with PPO and a learned critic (a separate network,
//! copied from the policy after the same supervised warm-up). It prints held-out success after
//! the warm-up and after RL. Options: `-- --device cuda --steps 200 --quiet`.

agentry::experiment!("experiments/ppo_kg.arl");

fn main() -> agentry::Result<()> {
    agentry::main(PpoKg)
}
