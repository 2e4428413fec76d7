//! Products in bfloat16 on Intel's AMX tiles, for [`Precision::Medium`] (PyTorch's
//! `torch.set_float32_matmul_precision("medium")`, and the arithmetic oneDNN gives it on the same
//! CPUs): both operands rounded to bf16 (8 bits of mantissa), the sums in f32.
//!
//! One `tdpbf16ps` multiplies a `16 × 32` bf16 tile by a `32 × 16` one into sixteen by sixteen
//! f32 sums: 8192 multiply-adds an instruction, about twenty times what AVX-512's fused
//! multiply-adds do a cycle. The operands are packed into tiles zero-padded to whole tiles, so
//! any shape works; each output tile is summed over `k` in order by one task, so the bits do not
//! depend on the thread count. Linux on x86-64 only: the kernel must grant the process the
//! tiles' 8 KiB of state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), asked once; elsewhere, or when it
//! refuses, products stay in f32.
//!
//! PyTorch's `high` (each operand split into two bf16s, three tile products) was built on the
//! same tiles and measured 0.5–1.3× `gemm`'s f32 speed on SmolLM2's shapes, so it is not offered.

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

/// Whether this process may run AMX bf16 products: the CPU has them and the kernel granted the
/// tile state. Asked once.
pub(crate) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(detect)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
fn detect() -> bool {
    // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let has = |bit: u32| leaf.edx & (1 << bit) != 0;
    if !(has(22) && has(24)) {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only asks the kernel for permission to use the
    // tile state; it reads and writes no memory of ours.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
fn detect() -> bool {
    false
}

/// Whether a product is worth packing into tiles: a decode step's few rows, attention's
/// `head_dim`-deep tiles and the small model's `d_model = 128` products stay in f32, where the
/// packing costs more than the tiles save (`bench_precision`: 0.8–1.2× at `128 × 512`).
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

/// The tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

const CONFIG: Config = Config {
    palette: 1,
    start_row: 0,
    reserved: [0; 14],
    bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
    rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
};

/// Bytes between a tile's rows, packed.
const STRIDE: usize = DEPTH * 2;
/// Bytes from one packed tile to the next chunk's.
const NEXT: usize = TILE_LEN * 2;

/// `out[t] = Σ_chunks a(t) · b(t)` for four output tiles `(a0, b0), (a0, b1), (a1, b0),
/// (a1, b1)`: a product of 32 rows by 32 columns.
///
/// # Safety
///
/// AMX must be [`available`] and the tiles configured with [`CONFIG`] on this thread; each
/// pointer must point at `chunks` consecutive packed tiles.
unsafe fn block(
    a: [*const u16; 2],
    b: [*const u16; 2],
    chunks: usize,
    out: &mut [[f32; TILE * TILE]; 4],
) {
    // SAFETY: the caller's contract; the loads read `chunks` tiles from each pointer and the
    // stores write four 1 KiB buffers.
    unsafe {
        std::arch::asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            "2:",
            "tileloadd tmm4, [{a0} + {s}*1]",
            "tileloadd tmm6, [{b0} + {s}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tileloadd tmm7, [{b1} + {s}*1]",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tileloadd tmm5, [{a1} + {s}*1]",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            // The next chunk's right-hand tiles, line by line, into the first-level cache while
            // the products run (+10-15% on the prefill's shapes); a prefetch never faults, so
            // the last chunk's, past the buffer, is harmless.
            "prefetcht0 [{b0} + 1024]",
            "prefetcht0 [{b0} + 1088]",
            "prefetcht0 [{b0} + 1152]",
            "prefetcht0 [{b0} + 1216]",
            "prefetcht0 [{b0} + 1280]",
            "prefetcht0 [{b0} + 1344]",
            "prefetcht0 [{b0} + 1408]",
            "prefetcht0 [{b0} + 1472]",
            "prefetcht0 [{b0} + 1536]",
            "prefetcht0 [{b0} + 1600]",
            "prefetcht0 [{b0} + 1664]",
            "prefetcht0 [{b0} + 1728]",
            "prefetcht0 [{b0} + 1792]",
            "prefetcht0 [{b0} + 1856]",
            "prefetcht0 [{b0} + 1920]",
            "prefetcht0 [{b0} + 1984]",
            "prefetcht0 [{b1} + 1024]",
            "prefetcht0 [{b1} + 1088]",
            "prefetcht0 [{b1} + 1152]",
            "prefetcht0 [{b1} + 1216]",
            "prefetcht0 [{b1} + 1280]",
            "prefetcht0 [{b1} + 1344]",
            "prefetcht0 [{b1} + 1408]",
            "prefetcht0 [{b1} + 1472]",
            "prefetcht0 [{b1} + 1536]",
            "prefetcht0 [{b1} + 1600]",
            "prefetcht0 [{b1} + 1664]",
            "prefetcht0 [{b1} + 1728]",
            "prefetcht0 [{b1} + 1792]",
            "prefetcht0 [{b1} + 1856]",
            "prefetcht0 [{b1} + 1920]",
            "prefetcht0 [{b1} + 1984]",
            "add {a0}, {next}",
            "add {a1}, {next}",
            "add {b0}, {next}",
            "add {b1}, {next}",
            "dec {n}",
            "jnz 2b",
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            a0 = inout(reg) a[0] => _,
            a1 = inout(reg) a[1] => _,
            b0 = inout(reg) b[0] => _,
            b1 = inout(reg) b[1] => _,
            n = inout(reg) chunks => _,
            s = in(reg) STRIDE,
            next = const NEXT,
            c0 = in(reg) out[0].as_mut_ptr(),
            c1 = in(reg) out[1].as_mut_ptr(),
            c2 = in(reg) out[2].as_mut_ptr(),
            c3 = in(reg) out[3].as_mut_ptr(),
            options(nostack),
        );
    }
}

/// `dst = (dst if accumulate else 0) + scale * lhs · rhs` in bf16 tiles, over rayon's pool
/// when `pool`.
///
/// # Safety
///
/// [`available`] must be true, and `dst` valid as in `product_raw`; `m`, `n`, `k` positive.
pub(crate) unsafe fn product(
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
        // SAFETY: AMX is available (the caller's contract); the configuration is this
        // thread's, loaded before its first tile operation and released after its last, and
        // nothing between runs another tile operation on this thread.
        unsafe {
            std::arch::asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack));
        }
        for pair in rows * TASK_PAIRS..((rows + 1) * TASK_PAIRS).min(row_pairs) {
            // Two row blocks and two column blocks; a missing second one repeats the first
            // (its sums are not written).
            let blocks = [2 * pair, (2 * pair + 1).min(a.blocks - 1)];
            for col in (first..last).step_by(2) {
                let cols = [col, (col + 1).min(last - 1)];
                let mut out = [[0.0; TILE * TILE]; 4];
                // SAFETY: each pointer starts `chunks` packed tiles; see above for the tiles.
                unsafe {
                    block(
                        [a.tiles(blocks[0]), a.tiles(blocks[1])],
                        [b.tiles(cols[0]), b.tiles(cols[1])],
                        a.chunks,
                        &mut out,
                    );
                }
                for (t, tile) in out.iter().enumerate() {
                    let (i, j) = (t / 2, t % 2);
                    if (i == 0 || blocks[1] != blocks[0]) && (j == 0 || cols[1] != cols[0]) {
                        write(tile, blocks[i] * TILE, cols[j] * TILE);
                    }
                }
            }
        }
        // SAFETY: releases this thread's tile state configured above.
        unsafe {
            std::arch::asm!("tilerelease", options(nostack));
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
        // SAFETY: the tests call this only where AMX is available; `out` is a fresh row-major
        // `m × n` buffer.
        unsafe { product(dst, lhs, rhs, scale, init.is_some(), pool) };
        out
    }

    /// Runs `test` where this machine has AMX; says so where it does not.
    fn with_amx(test: impl FnOnce()) {
        if available() {
            test();
        } else {
            eprintln!("no AMX bf16 tiles on this machine: the products stay in f32");
        }
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
        with_amx(|| {
            let mut rng = Rng(11);
            for (m, k, n) in SHAPES {
                for (lt, rt) in LAYOUTS {
                    let (a, b) = (rng.vec(m * k, 1.0), rng.vec(k * n, 1.0));
                    let (lhs, rhs) = (view(&a, m, k, lt), view(&b, k, n, rt));
                    let case = format!("{m}x{k} by {k}x{n}, transposed {lt} {rt}");
                    let out = run(lhs, rhs, true, 1.0, None);
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
        with_amx(|| {
            let mut rng = Rng(12);
            for (m, k, n) in SHAPES {
                let (a, b, c) = (
                    rng.vec(m * k, 1.0),
                    rng.vec(k * n, 1.0),
                    rng.vec(m * n, 1.0),
                );
                let (lhs, rhs) = (view(&a, m, k, false), view(&b, k, n, false));
                let pooled = run(lhs, rhs, true, 0.5, None);
                let alone = run(lhs, rhs, false, 0.5, None);
                assert!(same_bits(&pooled, &alone), "{m}x{k}x{n}");
                let added = run(lhs, rhs, true, 0.5, Some(&c));
                let expected: Vec<f32> = c.iter().zip(&pooled).map(|(x, y)| x + y).collect();
                assert!(same_bits(&added, &expected), "{m}x{k}x{n}");
            }
        });
    }
}
