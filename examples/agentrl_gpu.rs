//! The AgentRL recipe sized for a GPU:
//! `cargo run --release --features cuda --example agentrl_gpu`.
//!
//! `agentrl.rs`'s questions with what the laptop recipes' tuning found missing (turns long enough
//! for DB's calls, every word in the tokenizer, a context for WebShop's episodes, a long warm-up)
//! and a 6-layer policy, five seeds. Run it with `ablations_gpu` in one `agentry run` so each
//! seed's warm-up is trained once. Options: `-- --seed 1 --device flex --quiet`.

agentry::experiment!("experiments/agentrl_gpu.arl");

fn main() -> agentry::Result<()> {
    agentry::main(AgentrlGpu)
}
