//! The specialists recipe: `cargo run --release --example specialists`.
//!
//! AgentRL's multi-task setting split into five single-task runs (`specialists = true`), each
//! with a fifth of the batches so that it sees as many demonstrations and episodes of its task
//! as the multi-task policy does. Compare with `agentry compare runs/agentrl runs/specialists`.
//! Options: `-- --config specialist.kg --seed 1 --quiet`.

agentry::experiment!("experiments/specialists.arl");

fn main() -> agentry::Result<()> {
    agentry::main(Specialists)
}
