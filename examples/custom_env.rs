//! A recipe with your own environment: `cargo run --release --example custom_env`.
//!
//! The experiment file names the task's environment by path (`env = crate::envs::Lights`);
//! the type lives in [`envs`] and implements `agentry::env::TaskGenerator`. The same file
//! cannot run through `agentry run`, which cannot name Rust types.

#[path = "custom_env/envs.rs"]
mod envs;

agentry::experiment!("experiments/custom_env.arl");

fn main() -> agentry::Result<()> {
    agentry::main(CustomEnv)
}
