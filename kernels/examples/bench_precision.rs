//! Products at each [`Precision`] on the shapes of a SmolLM2-135M prefill (4 × 300 positions
//! through d_model 576, FFN 1536, key/value 192), of a training step of `bench_policy`'s small
//! model, and of the tied head: GFLOP/s (two per multiply-add) and the speed-up over
//! `highest`, best of five rounds. Only ratios within one run mean anything.
//!
//! `cargo run --release -p agentry-kernels --example bench_precision -- [ROWS]` (default 1200).

use std::hint::black_box;
use std::time::Instant;

use agentry_kernels::matmul::{MatRef, Precision, Threads, product, set_precision};

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .map_or(1200, |a| a.parse().expect("ROWS is a positive integer"));
    let levels = [Precision::Highest, Precision::Medium];
    println!(
        "{} threads; {}; {rows} rows",
        rayon::current_num_threads(),
        Precision::Medium.describe()
    );
    println!("{:>22} {:>22} {:>22}", "product", "highest", "medium");
    for (k, n, name) in [
        (576, 1536, "gate, up"),
        (1536, 576, "down"),
        (576, 576, "query, output"),
        (576, 192, "key, value"),
        (128, 512, "small: FFN"),
        (576, 49152, "head"),
    ] {
        let a: Vec<f32> = (0..rows * k)
            .map(|i| ((i * 7) % 13) as f32 * 0.01 - 0.06)
            .collect();
        let b: Vec<f32> = (0..k * n)
            .map(|i| ((i * 5) % 11) as f32 * 0.01 - 0.05)
            .collect();
        let (lhs, rhs) = (MatRef::row_major(&a, rows, k), MatRef::row_major(&b, k, n));
        let flops = 2.0 * (rows * k * n) as f64;
        let mut cells = Vec::new();
        let mut base = 0.0;
        for level in levels {
            set_precision(level);
            black_box(product(lhs, rhs, Threads::Pool));
            let best = (0..5)
                .map(|_| {
                    let start = Instant::now();
                    black_box(product(lhs, rhs, Threads::Pool));
                    start.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            if level == Precision::Highest {
                base = best;
            }
            cells.push(format!(
                "{:.0} GFLOP/s ({:.2}x)",
                flops / best / 1e9,
                base / best
            ));
        }
        println!(
            "{:>22} {:>22} {:>22}",
            format!("{name} {k}x{n}"),
            cells[0],
            cells[1]
        );
    }
    set_precision(Precision::Highest);
}
