//! Agentry's CPU kernels: the policy's fused operations on plain `f32` slices, forward and
//! backward, with no dependency on burn.
//!
//! `agentry-runtime` wires them into burn's flex backend through its backend-extension trait
//! (`agentry_runtime::model::kernels`); this crate only does arithmetic on row-major buffers,
//! so each kernel is tested here against a naive reference and finite differences.
//!
//! Every kernel is deterministic for any thread count: work is split by rayon over independent
//! outputs, and any reduction runs in a fixed order over fixed-size chunks, never in the
//! order threads finish (same seed, same run, on one core or sixteen).

pub mod attention;
pub mod blocks;
pub mod logits;
pub mod math;
pub mod matmul;
pub mod memory;
pub mod norm;
pub mod simd;
#[cfg(test)]
mod test_rng;
