//! The specialists recipe sized for a GPU:
//! `cargo run --release --features cuda --example specialists_gpu`.
//!
//! `agentrl_gpu`'s setting split into five single-task runs, each with a fifth of the batches and
//! demonstrations, five seeds. Compare with `agentry compare runs/agentrl_gpu
//! runs/specialists_gpu`. Options: `-- --config specialist.alfworld --seed 1 --quiet`.

agentry::experiment!("experiments/specialists_gpu.arl");

fn main() -> agentry::Result<()> {
    agentry::main(SpecialistsGpu)
}
