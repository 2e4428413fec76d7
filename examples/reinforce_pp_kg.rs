//! The REINFORCE++ recipe: `cargo run --release --example reinforce_pp_kg`.
//!
//! The quickstart's task, model and warm-up, trained with REINFORCE++: no critic and no groups,
//! each episode's return whitened over the batch's agent tokens. It prints held-out success
//! after the warm-up and after RL. Options: `-- --device cuda --steps 200 --quiet`.

agentry::experiment!("experiments/reinforce_pp_kg.arl");

fn main() -> agentry::Result<()> {
    agentry::main(ReinforcePpKg)
}
