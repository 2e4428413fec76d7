//! The AgentRL recipe: `cargo run --release --example agentrl`.
//!
//! One policy trained on all five tasks at once (OS, DB, KG, WebShop, ALFWorld), with
//! cross-policy sampling from a stale engine and per-task advantage normalization, at laptop
//! scale: a supervised warm-up, then GRPO, three seeds. It prints held-out success per task
//! after the warm-up and after RL, then the table over seeds. The book's results page shows
//! what it measured. Options: `-- --seed 1 --device cuda --quiet`.

agentry::experiment!("experiments/agentrl.arl");

fn main() -> agentry::Result<()> {
    agentry::main(Agentrl)
}
