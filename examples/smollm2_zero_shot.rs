//! SmolLM2-135M-Instruct, zero-shot on the five tasks:
//! `bash scripts/fetch_smollm2.sh && cargo run --release --example smollm2_zero_shot`.
//!
//! The pretrained instruct model, as it comes from its GGUF file, prompted by its own chat
//! template and calling tools in the Hermes format: no warm-up, no RL (`train.steps = 0`), one
//! greedy evaluation on the test split with 95% intervals per task. The baseline of
//! `smollm2_lora`; the book's LoRA page shows what it measured. Options: `-- --device cuda`.

agentry::experiment!("experiments/smollm2_zero_shot.arl");

fn main() -> agentry::Result<()> {
    agentry::main(Smollm2ZeroShot)
}
