//! SmolLM2-135M-Instruct fine-tuned with LoRA:
//! `bash scripts/fetch_smollm2.sh && cargo run --release --example smollm2_lora`.
//!
//! The pretrained instruct model, frozen, with rank-16 adapters on every projection: a short
//! supervised warm-up on oracle demonstrations of the OS task, then GRPO, sized for two CPU
//! cores. It prints held-out success after the warm-up and after RL, and writes the adapters in
//! PEFT's layout to `adapter/` of the run directory. The book's LoRA page shows what it
//! measured and the settings to use on a GPU. Options: `-- --device cuda --steps 200`.

agentry::experiment!("experiments/smollm2_lora.arl");

fn main() -> agentry::Result<()> {
    agentry::main(Smollm2Lora)
}
