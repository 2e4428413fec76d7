//! The quickstart recipe: `cargo run --release --example quickstart`.
//!
//! A small transformer learns to answer knowledge-graph questions by calling tools over several
//! turns: a short supervised warm-up on oracle demonstrations, then GRPO. It prints held-out
//! success after the warm-up and after RL. Options: `-- --device cuda --steps 200 --quiet`.

agentry::experiment!("experiments/quickstart.arl");

fn main() -> agentry::Result<()> {
    agentry::main(Quickstart)
}
