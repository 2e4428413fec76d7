//! The RLOO recipe: `cargo run --release --example rloo_kg`.
//!
//! The quickstart's task, model and warm-up, trained with RLOO: each of a group's four episodes
//! is compared with the mean reward of the other three. It prints held-out success after the
//! warm-up and after RL. Options: `-- --device cuda --steps 200 --quiet`.

agentry::experiment!("experiments/rloo_kg.arl");

fn main() -> agentry::Result<()> {
    agentry::main(RlooKg)
}
