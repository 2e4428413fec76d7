//! Products by weights kept in ggml blocks against the same products in f32, on the shapes of
//! a SmolLM2-135M decode step (d_model 576, FFN 1536, key/value 192, vocabulary 49152): Q4_1
//! for the block weights, Q8_0 for the head, as the model's GGUF file stores them.
//!
//! Each weight is read from memory rather than the caches: each shape cycles through copies
//! filling 160 MiB in either form, as a decode step reads a different weight at each layer. Reports the best
//! of five rounds per product and the ratio (f32 time over block time), so only the ratio
//! within one run means anything.
//!
//! `cargo run --release -p agentry-kernels --example bench_blocks -- [ROWS...]` (default 1 4 16).

use std::hint::black_box;
use std::time::Instant;

use agentry_kernels::blocks::{BlockFormat, BlockMatrix};
use agentry_kernels::matmul::{MatRef, Threads, product};

/// `(inputs, outputs)` of each weight.
const SHAPES: [(usize, usize); 5] = [
    (576, 1536),
    (576, 576),
    (1536, 576),
    (576, 192),
    (576, 49152),
];

/// Bytes of weight copies per shape (more than the last-level cache of most machines).
const FOOTPRINT: usize = 160 << 20;

fn main() {
    let rows: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("rows are positive integers"))
        .collect();
    let rows = if rows.is_empty() {
        vec![1, 4, 16]
    } else {
        rows
    };
    println!(
        "{} threads; best of 5 rounds per product, each weight read from memory",
        rayon::current_num_threads()
    );
    for (k, n) in SHAPES {
        let copies = (FOOTPRINT / (k * n * 4)).max(2);
        // The head is the tied embedding, `[vocabulary, d_model]`: a transposed right-hand side.
        let head = n == 49152;
        let format = if head {
            BlockFormat::Q8_0
        } else {
            BlockFormat::Q4_1
        };
        let dense: Vec<Vec<f32>> = (0..copies)
            .map(|c| {
                (0..k * n)
                    .map(|i| ((i * 7 + c) % 13) as f32 * 0.01)
                    .collect()
            })
            .collect();
        let bytes = n * k / 32 * format.block_bytes();
        let blocks: Vec<BlockMatrix> = (0..(FOOTPRINT / bytes).max(2))
            .map(|c| {
                let bytes: Vec<u8> = (0..bytes)
                    .map(|i| ((i * 31 + c) % 251) as u8 & 0x3F)
                    .collect();
                BlockMatrix::from_ggml(format, n, k, &bytes).expect("whole blocks")
            })
            .collect();
        for &m in &rows {
            let x: Vec<f32> = (0..m * k).map(|i| (i % 5) as f32 * 0.1).collect();
            let lhs = MatRef::row_major(&x, m, k);
            let (mut f32_best, mut blocks_best) = (f64::MAX, f64::MAX);
            for _ in 0..5 {
                let start = Instant::now();
                for w in &dense {
                    let rhs = if head {
                        MatRef::row_major(w, n, k).t()
                    } else {
                        MatRef::row_major(w, k, n)
                    };
                    black_box(product(lhs, rhs, Threads::Pool));
                }
                f32_best = f32_best.min(start.elapsed().as_secs_f64() / copies as f64);
                let start = Instant::now();
                for w in &blocks {
                    black_box(w.product(lhs, Threads::Pool));
                }
                blocks_best = blocks_best.min(start.elapsed().as_secs_f64() / blocks.len() as f64);
            }
            println!(
                "{m:>2} rows x {k}x{n}: f32 {:.3} ms, {} {:.3} ms ({:.1} MB): {:.2}x",
                f32_best * 1e3,
                format.name(),
                blocks_best * 1e3,
                blocks[0].bytes() as f64 / 1e6,
                f32_best / blocks_best
            );
        }
    }
}
