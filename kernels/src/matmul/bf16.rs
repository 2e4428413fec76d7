//! Products in bfloat16 for [`Precision::Medium`](super::Precision::Medium) (PyTorch's
//! `torch.set_float32_matmul_precision("medium")`, and the arithmetic oneDNN gives it on the same
//! CPUs): both operands rounded to bf16 (8 bits of mantissa), each pair of products summed in
//! f32.
//!
//! Both operands are packed once per product into `16 × 32` bf16 tiles, zero-padded to whole
//! tiles so any shape works, the right-hand side in the pair layout (`k` and `k + 1` of a column
//! side by side). Two engines multiply them, the fastest this CPU has:
//! - [`amx`]: Intel's AMX tiles (Xeon from Sapphire Rapids on). One `tdpbf16ps` multiplies a
//!   `16 × 32` tile by a `32 × 16` one, 8192 multiply-adds, about twenty times what AVX-512's
//!   fused multiply-adds do a cycle.
//! - [`avx512`]: AVX-512 BF16's `vdpbf16ps` (AMD from Zen 4 on, Intel from Cooper Lake on), two
//!   multiply-adds in each f32 lane: twice the f32 instructions' rate, read from the same tiles.
//!
//! Each output tile is summed over `k` in order by one task, so the bits do not depend on the
//! thread count (they do depend on the engine: the two round their sums differently).
//!
//! PyTorch's `high` (each operand split into two bf16s, three tile products) was built on the
//! AMX tiles and measured 0.5–1.3× `gemm`'s f32 speed on SmolLM2's shapes, so it is not offered.

mod amx;
mod avx512;

use std::sync::OnceLock;

use super::{Dst, MatRef};

/// Rows of a tile, and f32 columns of an output tile.
const TILE: usize = 16;
/// bf16 elements of `k` in one tile row (64 bytes).
const DEPTH: usize = 32;
/// bf16 elements of one packed tile.
const TILE_LEN: usize = TILE * DEPTH;
/// Output columns one task computes: their packed right-hand side (288 KiB for `k = 576`)
/// stays in the core's second-level cache while the task's rows go by.
const TASK_COLS: usize = 256;
/// Pairs of row blocks (32 rows each) one task computes, each pair's packed left-hand side
/// read from the first-level cache across the task's columns.
const TASK_PAIRS: usize = 8;

/// What multiplies the packed tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// AMX's tile instructions.
    Amx,
    /// AVX-512 BF16's vector instructions.
    Avx512,
}

impl Engine {
    /// `medium` run by it, as [`Precision::describe`](super::Precision::describe) says it.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Engine::Amx => "medium (bf16 on AMX tiles)",
            Engine::Avx512 => "medium (bf16 by AVX-512 BF16)",
        }
    }
}

/// The fastest engine this process may run, if any: AMX where the CPU has it and the kernel
/// granted the tile state, else AVX-512 BF16. Asked once.
pub(crate) fn engine() -> Option<Engine> {
    static ENGINE: OnceLock<Option<Engine>> = OnceLock::new();
    *ENGINE.get_or_init(|| {
        if amx::available() {
            Some(Engine::Amx)
        } else if avx512::available() {
            Some(Engine::Avx512)
        } else {
            None
        }
    })
}

/// Whether a product is worth packing into tiles: a decode step's few rows, attention's
/// `head_dim`-deep tiles and the small model's `d_model = 128` products stay in f32, where the
/// packing costs more than the tiles save (`bench_precision`: 0.8–1.2× at `128 × 512` on AMX).
pub(crate) fn worth(m: usize, n: usize, k: usize) -> bool {
    m.min(n) >= 2 * TILE && k >= 8 * DEPTH && m * n * k >= 1 << 22
}

/// `x` rounded to the nearest bf16, ties to even (NaN stays NaN).
fn bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    let round = 0x7fff + ((bits >> 16) & 1);
    let rounded = (bits.wrapping_add(round) >> 16) as u16;
    if x.is_nan() {
        (bits >> 16) as u16 | 0x40
    } else {
        rounded
    }
}

/// One block's sums: four `16 × 16` output tiles, `(a0, b0), (a0, b1), (a1, b0), (a1, b1)`.
type Sums = [[f32; TILE * TILE]; 4];

/// An engine's product of two row blocks by two column blocks (their first packed tiles) over
/// all of `k`, into [`Sums`].
type Block<'a> = dyn Fn([*const u16; 2], [*const u16; 2], &mut Sums) + 'a;

/// An operand packed as bf16 tiles.
struct Packed {
    /// `[block][chunk][16][32]`.
    tiles: Vec<u16>,
    blocks: usize,
    chunks: usize,
}

impl Packed {
    /// The first tile of row (or column) block `block`; its `chunks` tiles over `k` follow it.
    fn tiles(&self, block: usize) -> *const u16 {
        let index = block * self.chunks * TILE_LEN;
        assert!(index + self.chunks * TILE_LEN <= self.tiles.len());
        self.tiles.as_ptr().wrapping_add(index)
    }

    /// Packs `blocks × chunks` tiles, `fill(block, chunk, tile)` writing each one's f32 values
    /// (zero-padded) into a `[16][32]` buffer, rounded then to bf16; block by block over
    /// rayon's pool when `pool`.
    fn new(
        blocks: usize,
        chunks: usize,
        pool: bool,
        fill: impl Fn(usize, usize, &mut [f32; TILE_LEN]) + Sync,
    ) -> Packed {
        use rayon::prelude::*;
        let mut tiles = vec![0u16; blocks * chunks * TILE_LEN];
        let pack_block = |(block, out): (usize, &mut [u16])| {
            let mut values = [0.0f32; TILE_LEN];
            for (chunk, out) in out.chunks_exact_mut(TILE_LEN).enumerate() {
                values.fill(0.0);
                fill(block, chunk, &mut values);
                for (o, &v) in out.iter_mut().zip(&values) {
                    *o = bf16(v);
                }
            }
        };
        let block_len = chunks * TILE_LEN;
        if pool {
            tiles
                .par_chunks_mut(block_len)
                .enumerate()
                .for_each(pack_block);
        } else {
            tiles.chunks_mut(block_len).enumerate().for_each(pack_block);
        }
        Packed {
            tiles,
            blocks,
            chunks,
        }
    }
}

/// Calls `put(r, c, value)` for each element of the `rows × cols` block of `view` from
/// `(i0, j0)`, reading along whichever side has unit stride.
fn gather(
    view: &MatRef<'_>,
    (i0, j0): (usize, usize),
    (rows, cols): (usize, usize),
    mut put: impl FnMut(usize, usize, f32),
) {
    let (row_stride, col_stride) = (view.row_stride, view.col_stride);
    if row_stride == 1 && col_stride != 1 {
        for c in 0..cols {
            let start = i0 + (j0 + c) * col_stride;
            for (r, &v) in view.data[start..start + rows].iter().enumerate() {
                put(r, c, v);
            }
        }
    } else {
        for r in 0..rows {
            let start = (i0 + r) * row_stride + j0 * col_stride;
            if col_stride == 1 {
                for (c, &v) in view.data[start..start + cols].iter().enumerate() {
                    put(r, c, v);
                }
            } else {
                for c in 0..cols {
                    put(r, c, view.data[start + c * col_stride]);
                }
            }
        }
    }
}

/// A `blocks-side × k` operand as tiles of 16 of its rows by 32 of `k`, each element `(r, c)`
/// of a tile at `place(r, c)`.
fn pack(view: MatRef<'_>, pool: bool, place: impl Fn(usize, usize) -> usize + Sync) -> Packed {
    let (rows, k) = (view.rows, view.cols);
    Packed::new(
        rows.div_ceil(TILE),
        k.div_ceil(DEPTH),
        pool,
        |block, chunk, tile| {
            let extent = (TILE.min(rows - block * TILE), DEPTH.min(k - chunk * DEPTH));
            gather(&view, (block * TILE, chunk * DEPTH), extent, |r, c, v| {
                tile[place(r, c)] = v;
            });
        },
    )
}

/// `lhs` (`m × k`) as tiles of 16 rows by 32 of `k`.
fn pack_lhs(lhs: MatRef<'_>, pool: bool) -> Packed {
    pack(lhs, pool, |r, c| r * DEPTH + c)
}

/// `rhs` (`k × n`) as tiles of 32 of `k` by 16 columns, in AMX's pair layout: tile row `r`
/// holds rows `2r` and `2r + 1` of the chunk interleaved, column by column.
fn pack_rhs(rhs: MatRef<'_>, pool: bool) -> Packed {
    pack(rhs.t(), pool, |j, d| (d / 2) * DEPTH + 2 * j + d % 2)
}

/// `dst = (dst if accumulate else 0) + scale * lhs · rhs` in bf16 tiles, over rayon's pool
/// when `pool`.
///
/// # Safety
///
/// `engine` must be [`engine`]'s, and `dst` valid as in `product_raw`; `m`, `n`, `k` positive.
pub(crate) unsafe fn product(
    engine: Engine,
    dst: Dst,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    scale: f32,
    accumulate: bool,
    pool: bool,
) {
    use rayon::prelude::*;
    let (m, n) = (lhs.rows, rhs.cols);
    let (a, b) = (pack_lhs(lhs, pool), pack_rhs(rhs, pool));
    // An output tile's sums land in `dst` through this, clipped to the matrix.
    let write = |tile: &[f32; TILE * TILE], row: usize, col: usize| {
        let cols = TILE.min(n.saturating_sub(col));
        for r in 0..TILE.min(m.saturating_sub(row)) {
            let values = &tile[r * TILE..r * TILE + cols];
            if dst.col_stride == 1 {
                // SAFETY: row `row + r`, columns `col..col + cols` are inside the product and
                // contiguous, so `product_raw`'s contract makes them valid, written by this
                // task alone.
                let out = unsafe { std::slice::from_raw_parts_mut(dst.at(row + r, col), cols) };
                if accumulate {
                    out.iter_mut()
                        .zip(values)
                        .for_each(|(o, &v)| *o += scale * v);
                } else {
                    out.iter_mut()
                        .zip(values)
                        .for_each(|(o, &v)| *o = scale * v);
                }
            } else {
                for (c, &v) in values.iter().enumerate() {
                    let at = dst.at(row + r, col + c);
                    // SAFETY: as above, one element at a time.
                    unsafe {
                        *at = if accumulate {
                            *at + scale * v
                        } else {
                            scale * v
                        }
                    };
                }
            }
        }
    };
    let (row_pairs, col_tiles) = (m.div_ceil(2 * TILE), n.div_ceil(TILE));
    let tiles_per_task = TASK_COLS / TILE;
    let col_tasks = col_tiles.div_ceil(tiles_per_task);
    let row_tasks = row_pairs.div_ceil(TASK_PAIRS);
    let task = |index: usize| {
        let (cols, rows) = (index / row_tasks, index % row_tasks);
        let (first, last) = (
            cols * tiles_per_task,
            ((cols + 1) * tiles_per_task).min(col_tiles),
        );
        let blocks = |block: &Block<'_>| {
            for pair in rows * TASK_PAIRS..((rows + 1) * TASK_PAIRS).min(row_pairs) {
                // Two row blocks and two column blocks; a missing second one repeats the first
                // (its sums are not written).
                let blocks = [2 * pair, (2 * pair + 1).min(a.blocks - 1)];
                for col in (first..last).step_by(2) {
                    let cols = [col, (col + 1).min(last - 1)];
                    let mut out = [[0.0; TILE * TILE]; 4];
                    block(
                        [a.tiles(blocks[0]), a.tiles(blocks[1])],
                        [b.tiles(cols[0]), b.tiles(cols[1])],
                        &mut out,
                    );
                    for (t, tile) in out.iter().enumerate() {
                        let (i, j) = (t / 2, t % 2);
                        if (i == 0 || blocks[1] != blocks[0]) && (j == 0 || cols[1] != cols[0]) {
                            write(tile, blocks[i] * TILE, cols[j] * TILE);
                        }
                    }
                }
            }
        };
        let chunks = a.chunks;
        match engine {
            // SAFETY (both): the engine is available (the caller's contract), each pointer
            // starts `chunks` packed tiles, and the tiles are configured on this thread for the
            // AMX blocks alone.
            Engine::Amx => unsafe {
                amx::with_tiles(|| blocks(&|a, b, out| amx::block(a, b, chunks, out)));
            },
            Engine::Avx512 => blocks(&|a, b, out| unsafe { avx512::block(a, b, chunks, out) }),
        }
    };
    let tasks = row_tasks * col_tasks;
    if pool {
        (0..tasks).into_par_iter().for_each(task);
    } else {
        (0..tasks).for_each(task);
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{LAYOUTS, same_bits, view};
    use super::*;
    use crate::test_rng::Rng;

    /// The f32 a bf16 stands for.
    fn widen(x: u16) -> f32 {
        f32::from_bits(u32::from(x) << 16)
    }

    /// `init + scale · lhs · rhs` (or `scale · lhs · rhs` without `init`) through the tiles.
    fn run(
        engine: Engine,
        lhs: MatRef<'_>,
        rhs: MatRef<'_>,
        pool: bool,
        scale: f32,
        init: Option<&[f32]>,
    ) -> Vec<f32> {
        let (m, n) = (lhs.rows, rhs.cols);
        let mut out = init.map_or_else(|| vec![f32::NAN; m * n], <[f32]>::to_vec);
        let dst = Dst {
            ptr: out.as_mut_ptr(),
            row_stride: n,
            col_stride: 1,
        };
        // SAFETY: the tests call this only with engines this machine has; `out` is a fresh
        // row-major `m × n` buffer.
        unsafe { product(engine, dst, lhs, rhs, scale, init.is_some(), pool) };
        out
    }

    /// Runs `test` with each engine this machine has; says so where it has none.
    fn with_engines(test: impl Fn(Engine)) {
        let engines = [
            (Engine::Amx, amx::available()),
            (Engine::Avx512, avx512::available()),
        ];
        let here: Vec<Engine> = engines
            .into_iter()
            .filter_map(|(engine, here)| here.then_some(engine))
            .collect();
        if here.is_empty() {
            eprintln!("no bf16 products on this machine: they stay in f32");
        }
        here.into_iter().for_each(test);
    }

    /// The largest error over `Σ_k |a||b|` of each element, against an f64 product of the
    /// operands as `round` leaves them.
    fn worst_error(
        out: &[f32],
        lhs: MatRef<'_>,
        rhs: MatRef<'_>,
        round: impl Fn(f32) -> f32,
    ) -> f64 {
        let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
        let mut worst = 0.0f64;
        for i in 0..m {
            for j in 0..n {
                let (mut sum, mut size) = (0.0f64, 0.0f64);
                for l in 0..k {
                    let term = f64::from(round(lhs.at(i, l))) * f64::from(round(rhs.at(l, j)));
                    sum += term;
                    size += term.abs();
                }
                let error = (f64::from(out[i * n + j]) - sum).abs() / size.max(f64::MIN_POSITIVE);
                worst = worst.max(error);
            }
        }
        worst
    }

    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (17, 33, 31),
        (33, 17, 65),
        (64, 48, 100),
        (70, 300, 64),
        (40, 37, 576),
    ];

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16(1.0), 0x3f80);
        assert_eq!(
            bf16(f32::from_bits(0x3f80_8000)),
            0x3f80,
            "a tie goes to the even side"
        );
        assert_eq!(
            bf16(f32::from_bits(0x3f81_8000)),
            0x3f82,
            "a tie goes to the even side"
        );
        assert_eq!(
            bf16(f32::from_bits(0x3f80_8001)),
            0x3f81,
            "above the tie rounds up"
        );
        assert_eq!(bf16(-2.5), 0xc020);
        assert_eq!(bf16(f32::INFINITY), 0x7f80);
        assert!(widen(bf16(f32::NAN)).is_nan());
        for x in [0.1f32, -3.7, 1e-20, 6.5e4] {
            let (hi, lo) = (bf16(x), bf16(x - widen(bf16(x))));
            let split = widen(hi) + widen(lo);
            assert!(
                (split - x).abs() <= x.abs() * 2f32.powi(-16),
                "{x} split as {split}"
            );
        }
    }

    #[test]
    fn products_are_f32_sums_of_the_operands_rounded_to_bf16() {
        with_engines(|engine| {
            let mut rng = Rng(11);
            for (m, k, n) in SHAPES {
                for (lt, rt) in LAYOUTS {
                    let (a, b) = (rng.vec(m * k, 1.0), rng.vec(k * n, 1.0));
                    let (lhs, rhs) = (view(&a, m, k, lt), view(&b, k, n, rt));
                    let case = format!("{engine:?}: {m}x{k} by {k}x{n}, transposed {lt} {rt}");
                    let out = run(engine, lhs, rhs, true, 1.0, None);
                    let rounded = worst_error(&out, lhs, rhs, |x| widen(bf16(x)));
                    assert!(rounded < 1e-6, "{case}: against bf16 operands {rounded:e}");
                    let exact = worst_error(&out, lhs, rhs, |x| x);
                    assert!(
                        exact < 2f64.powi(-7),
                        "{case}: against f32 operands {exact:e}"
                    );
                }
            }
        });
    }

    #[test]
    fn products_scale_accumulate_and_ignore_the_thread_count() {
        with_engines(|engine| {
            let mut rng = Rng(12);
            for (m, k, n) in SHAPES {
                let (a, b, c) = (
                    rng.vec(m * k, 1.0),
                    rng.vec(k * n, 1.0),
                    rng.vec(m * n, 1.0),
                );
                let (lhs, rhs) = (view(&a, m, k, false), view(&b, k, n, false));
                let pooled = run(engine, lhs, rhs, true, 0.5, None);
                let alone = run(engine, lhs, rhs, false, 0.5, None);
                assert!(same_bits(&pooled, &alone), "{engine:?}: {m}x{k}x{n}");
                let added = run(engine, lhs, rhs, true, 0.5, Some(&c));
                let expected: Vec<f32> = c.iter().zip(&pooled).map(|(x, y)| x + y).collect();
                assert!(same_bits(&added, &expected), "{engine:?}: {m}x{k}x{n}");
            }
        });
    }
}
