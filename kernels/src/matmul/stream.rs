//! Products of a few rows by a large matrix, read once in memory order: a decode step.
//!
//! A decode step multiplies a handful of rows (one per sequence) by every weight matrix, so
//! its time is the time to read the weights. `gemm` packs its right-hand side into panels on
//! every call (reading and writing the weight once more) and then reads the panels column
//! block by column block; here each weight is read once, front to back, in long runs the
//! hardware prefetcher follows:
//!
//! - a row-major `k × n` right-hand side (a linear layer's `[d_in, d_out]` weight) row by
//!   row, each row scaled by the left-hand side's entries and added into accumulators that stay
//!   in the L1 cache (`x · W` as a sum of scaled rows), in slabs of consecutive rows (each a
//!   contiguous run of memory) spread over the threads;
//! - a transposed one (the tied LM head, `x · Eᵀ` with `E: [vocab, d]`) as dot products of the
//!   left-hand rows with `E`'s rows.
//!
//! Only for weights of at least 256 KiB, and only with AVX2 and FMA (detected at run time; the
//! crate is compiled for the baseline x86-64); elsewhere the product goes to `gemm`. Where the
//! CPU has AVX-512, the row-by-row form runs in its sixteen-lane vectors and the dot products
//! in its 32 registers (six columns at a time instead of two); either gives the same bits as in
//! AVX2, since every lane sums its elements in `k` order whatever the width. The sums run in a
//! different order than `gemm`'s, so a decode step's logits may differ from a full forward
//! pass's in the last bits (as they do between any two BLAS libraries); they do not depend on
//! the thread count: a row-major weight is cut into slabs of rows whose partial sums are added
//! in slab order, a transposed one into blocks of output columns (each written in place, by
//! one thread), and each partial sum is computed by one thread in a fixed order.

use super::{MatRef, by_column_blocks};
use crate::simd::Level;

/// Most left-hand rows a streamed product takes. Above it the arithmetic, not the reading,
/// bounds the product and `gemm`'s register-blocked micro-kernels are faster (measured: 16
/// rows stream at two thirds of `gemm`'s speed, 4 rows at 1.1 to 1.9 times).
pub(super) const MAX_ROWS: usize = 8;

/// Fewest columns of a row-major right-hand side: shorter rows (a key or value projection's
/// 192) stream slower than `gemm` reads its packed panels. A bound on the shape, never on the
/// thread count, so the same product takes the same route (and gives the same bits) on any
/// number of threads.
const MIN_COLS: usize = 512;

/// Accumulator elements of the row-by-row form (32 KiB, an L1 data cache): each tile of
/// columns is at most this many over the number of rows wide.
const ACCUMULATORS: usize = 8192;

/// Rows of `rhs` summed into the accumulators in one pass over them. Each pass loads and
/// stores every accumulator once, so deeper passes move less through L1: eight read a
/// `576 × 1536` weight from memory at 17–20 GB/s on two threads where four read at 15 (and
/// sixteen, sixteen streams at once, at 16).
const DEPTH: usize = 8;

/// Rows of a row-major right-hand side summed as one slab: 64 rows of a `576 × 1536` weight
/// are 384 KiB read front to back, and its 9 slabs keep two threads within a slab of each
/// other.
const SLAB: usize = 64;

/// Right-hand sides of fewer elements (256 KiB) go to `gemm`: they stay in cache, so there is
/// nothing to stream, and handing blocks to the pool would cost more than it saves. (It also
/// keeps the small products of a training step's backward pass on `gemm`.)
const MIN_READ: usize = 1 << 16;

/// Whether this CPU runs the streamed kernels (AVX2 and FMA).
fn supported() -> bool {
    Level::Avx2.supported()
}

/// How the right-hand side is laid out in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// Row-major `k × n` (unit column stride): summed as scaled rows.
    Rows,
    /// Transposed row-major (unit row stride): dot products with its columns.
    Dots,
}

fn form(rhs: &MatRef<'_>) -> Option<Form> {
    if rhs.col_stride == 1 {
        Some(Form::Rows)
    } else if rhs.row_stride == 1 {
        Some(Form::Dots)
    } else {
        None
    }
}

/// `lhs · rhs` as a row-major `m × n` buffer when the product is a streamed one (at most
/// [`MAX_ROWS`] rows, a right-hand side with one unit stride, a CPU with AVX2 and FMA);
/// `None` otherwise. `threads` is how many threads of rayon's pool the product may use: the
/// transposed form cuts the output's columns into that many blocks (aligned to [`ALIGN`](super::ALIGN)),
/// while the row-major form's slabs are fixed by `k` alone and run on the pool whenever
/// `threads` is above one. Either way the sums, and so the bits, do not depend on it.
pub(super) fn product(lhs: MatRef<'_>, rhs: MatRef<'_>, threads: usize) -> Option<Vec<f32>> {
    product_at(Level::detected(), lhs, rhs, threads)
}

/// [`product`] with both forms' kernels in AVX-512 when `level` is AVX-512 and the CPU has it,
/// in AVX2 otherwise (the tests compare the two).
fn product_at(level: Level, lhs: MatRef<'_>, rhs: MatRef<'_>, threads: usize) -> Option<Vec<f32>> {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    if m == 0 || m > MAX_ROWS || k == 0 || n == 0 || !supported() {
        return None;
    }
    let wide = level == Level::Avx512 && level.supported();
    let form = form(&rhs)?;
    if k * n < MIN_READ || (form == Form::Rows && n < MIN_COLS) {
        return None;
    }
    // The left-hand rows, contiguous (a few rows: cheap, and the kernels index them flat).
    let x: Vec<f32> = (0..m)
        .flat_map(|i| (0..k).map(move |c| lhs.at(i, c)))
        .collect();
    use rayon::prelude::*;
    let out = match form {
        Form::Rows => {
            // Slabs of `SLAB` consecutive rows of `rhs` (each one contiguous run of memory),
            // summed separately, then added in slab order: the slabs, not the threads, fix
            // the order of the sums.
            let slab = |s: usize| {
                let inner = s * SLAB..k.min((s + 1) * SLAB);
                // Not zero-filled first: `rows` writes every element (a `memset` of each slab's
                // part was 6% of a decode step's samples).
                let mut part = Vec::with_capacity(m * n);
                #[cfg(target_arch = "x86_64")]
                {
                    let spare = &mut part.spare_capacity_mut()[..m * n];
                    if wide {
                        // SAFETY: `wide` checked that this CPU has AVX-512 (with AVX2 and FMA),
                        // what the `target_feature` function enables.
                        unsafe { rows_avx512(&x, m, k, rhs, inner, spare) }
                    } else {
                        // SAFETY: `supported()` checked that this CPU has AVX2 and FMA, the
                        // only requirement of the `target_feature` function.
                        unsafe { rows_avx2(&x, m, k, rhs, inner, spare) }
                    }
                    // SAFETY: `rows` wrote all `m * n` elements: every row of the output, tile
                    // after tile of columns until the last column.
                    unsafe { part.set_len(m * n) };
                }
                part
            };
            let slabs = k.div_ceil(SLAB);
            let parts: Vec<Vec<f32>> = if threads > 1 {
                (0..slabs).into_par_iter().map(slab).collect()
            } else {
                (0..slabs).map(slab).collect()
            };
            let mut parts = parts.into_iter();
            let mut out = parts.next().expect("k > 0, so one slab");
            for part in parts {
                out.iter_mut().zip(part).for_each(|(o, p)| *o += p);
            }
            out
        }
        Form::Dots => by_column_blocks(m, n, threads, |start, rows| {
            #[cfg(target_arch = "x86_64")]
            if wide {
                // SAFETY: as above, with AVX-512F and VL.
                unsafe { dots_avx512(&x, k, rhs, start, rows) }
            } else {
                // SAFETY: as above.
                unsafe { dots_avx2(&x, k, rhs, start, rows) }
            }
        }),
    };
    Some(out)
}

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{
    __m256, __m512, _mm_add_ps, _mm_cvtss_f32, _mm_movehl_ps, _mm_shuffle_ps,
    _mm256_castps256_ps128, _mm256_extractf128_ps, _mm256_fmadd_ps, _mm256_loadu_ps,
    _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps, _mm512_fmadd_ps, _mm512_loadu_ps,
    _mm512_set1_ps, _mm512_storeu_ps,
};

/// One vector register of f32 lanes, as the kernels use it: the row-by-row form is written
/// once ([`rows`]) and compiled for each width.
///
/// # Safety
///
/// The methods run the width's instructions: call them only inside a function whose
/// `target_feature`s include them (into which they are inlined).
#[cfg(target_arch = "x86_64")]
unsafe trait Vector: Copy {
    /// Lanes in the register.
    const LANES: usize;
    /// The lanes `data[at..at + LANES]`.
    unsafe fn load(data: &[f32], at: usize) -> Self;
    /// Stores the lanes into `data[at..at + LANES]`.
    unsafe fn store(self, data: &mut [f32], at: usize);
    /// `a · w + self` in every lane, one rounding.
    unsafe fn mul_add(self, a: f32, w: Self) -> Self;
}

/// `Vector` for one register type, from its unaligned load and store, broadcast and fused
/// multiply-add intrinsics (one body for every width).
macro_rules! vector {
    ($register:ty, $lanes:literal, $load:ident, $store:ident, $splat:ident, $fmadd:ident) => {
        // SAFETY: the methods run only the given intrinsics, the register type's own.
        #[cfg(target_arch = "x86_64")]
        unsafe impl Vector for $register {
            const LANES: usize = $lanes;
            #[inline(always)]
            unsafe fn load(data: &[f32], at: usize) -> Self {
                let lanes: &[f32; $lanes] = data[at..at + $lanes].try_into().expect("a vector");
                // SAFETY: `$lanes` readable f32s, no alignment requirement; the instructions
                // by the trait's contract.
                unsafe { $load(lanes.as_ptr()) }
            }
            #[inline(always)]
            unsafe fn store(self, data: &mut [f32], at: usize) {
                let lanes: &mut [f32; $lanes] =
                    (&mut data[at..at + $lanes]).try_into().expect("a vector");
                // SAFETY: `$lanes` writable f32s, no alignment requirement; the instructions
                // by the trait's contract.
                unsafe { $store(lanes.as_mut_ptr(), self) }
            }
            #[inline(always)]
            unsafe fn mul_add(self, a: f32, w: Self) -> Self {
                // SAFETY: the instructions by the trait's contract.
                unsafe { $fmadd($splat(a), w, self) }
            }
        }
    };
}

// AVX (and FMA for the multiply-add).
vector!(
    __m256,
    8,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    _mm256_fmadd_ps
);
// AVX-512F.
vector!(
    __m512,
    16,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    _mm512_fmadd_ps
);

/// The sum of the eight lanes (pairwise).
///
/// # Safety
///
/// The caller's `target_feature`s must include AVX.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum(v: __m256) -> f32 {
    // SAFETY: AVX by the function's contract; the rest is SSE, in the baseline.
    unsafe {
        let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ps(pair, _mm_shuffle_ps::<1>(pair, pair)))
    }
}

/// The sum over `c` in `inner` of `x[:, c] · rhs[c, :]` for a row-major `rhs` (`k × n`, row
/// stride `rhs.row_stride`), into `out` (`m × n`, every element written), in AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn rows_avx2(
    x: &[f32],
    m: usize,
    k: usize,
    rhs: MatRef<'_>,
    inner: std::ops::Range<usize>,
    out: &mut [std::mem::MaybeUninit<f32>],
) {
    // SAFETY: this function enables AVX2 and FMA, all `__m256`'s methods use.
    unsafe { rows::<__m256>(x, m, k, rhs, inner, out) }
}

/// [`rows_avx2`] in AVX-512: sixteen lanes, the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn rows_avx512(
    x: &[f32],
    m: usize,
    k: usize,
    rhs: MatRef<'_>,
    inner: std::ops::Range<usize>,
    out: &mut [std::mem::MaybeUninit<f32>],
) {
    // SAFETY: this function enables AVX-512F, all `__m512`'s methods use.
    unsafe { rows::<__m512>(x, m, k, rhs, inner, out) }
}

/// The row-by-row form in vectors `V`: tile by tile of columns, `rhs`'s rows are read in order
/// and added, scaled by `x`'s column, into every output row's accumulators (which stay in L1).
/// [`DEPTH`] rows of `rhs` go into each pass over the accumulators, fused multiply-adds in `c`
/// order, so each lane sums its output element alike at any width and depth.
///
/// # Safety
///
/// The caller's `target_feature`s must include `V`'s instructions.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn rows<V: Vector>(
    x: &[f32],
    m: usize,
    k: usize,
    rhs: MatRef<'_>,
    inner: std::ops::Range<usize>,
    out: &mut [std::mem::MaybeUninit<f32>],
) {
    let data = rhs.data;
    let stride = rhs.row_stride;
    let n = rhs.cols;
    let lanes = V::LANES;
    let mut acc = [0.0f32; ACCUMULATORS];
    // Tiles of equal width (whole vectors but the last), as few as fit the accumulators, so
    // each row of `rhs` is read in runs as long as possible.
    let widest = (ACCUMULATORS / m) / lanes * lanes;
    let tile = n.div_ceil(n.div_ceil(widest)).next_multiple_of(lanes);
    let mut j = 0;
    while j < n {
        let width = tile.min(n - j);
        let vectors = width - width % lanes;
        let acc = &mut acc[..m * width];
        acc.fill(0.0);
        let mut c = inner.start;
        while c < inner.end {
            let depth = DEPTH.min(inner.end - c);
            let row = |t: usize| (c + t.min(depth - 1)) * stride + j;
            let rows: [usize; DEPTH] = std::array::from_fn(row);
            let mut v = 0;
            while v < vectors {
                // SAFETY (every vector operation below): `V`'s instructions are enabled, by
                // this function's contract.
                let w: [V; DEPTH] = std::array::from_fn(|t| unsafe { V::load(data, rows[t] + v) });
                for i in 0..m {
                    let a = &x[i * k + c..i * k + c + depth];
                    let at = i * width + v;
                    // SAFETY: as above.
                    unsafe {
                        let mut s = V::load(acc, at);
                        for (&a, &w) in a.iter().zip(&w) {
                            s = s.mul_add(a, w);
                        }
                        s.store(acc, at);
                    }
                }
                v += lanes;
            }
            // The columns past the last full vector.
            for t in 0..depth {
                let w = &data[row(t) + vectors..row(t) + width];
                for i in 0..m {
                    let a = x[i * k + c + t];
                    for (s, &w) in acc[i * width + vectors..(i + 1) * width].iter_mut().zip(w) {
                        *s = a.mul_add(w, *s);
                    }
                }
            }
            c += depth;
        }
        for (i, acc) in acc.chunks_exact(width).enumerate() {
            for (o, &a) in out[i * n + j..i * n + j + width].iter_mut().zip(acc) {
                o.write(a);
            }
        }
        j += width;
    }
}

/// Columns `start..start + len` of `x · rhs` for a transposed row-major `rhs` (column `j` is
/// contiguous at `rhs.col_stride * j`), into `out`: one slice per row of `x` (`m` of them),
/// each `len` columns long, pieces of the whole product's rows. In AVX2: two columns at a time
/// (eight accumulators in sixteen registers).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dots_avx2(x: &[f32], k: usize, rhs: MatRef<'_>, start: usize, out: &mut [&mut [f32]]) {
    // SAFETY: this function enables AVX2 and FMA, all `dots` runs.
    unsafe { dots::<2>(x, k, rhs, start, out) }
}

/// [`dots_avx2`] with AVX-512's 32 registers: six columns at a time (24 accumulators), in the
/// same eight-lane vectors and so the same bits (each column's sums are alike whatever the
/// columns beside it). Reads the tied head about 1.3 times as fast (measured: 14 → 18 GB/s).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2,fma")]
fn dots_avx512(x: &[f32], k: usize, rhs: MatRef<'_>, start: usize, out: &mut [&mut [f32]]) {
    // SAFETY: this function enables AVX2 and FMA, all `dots` runs.
    unsafe { dots::<6>(x, k, rhs, start, out) }
}

/// Dot products of `x`'s rows with `COLS` columns at a time, eight lanes each, four rows at a
/// time (`4 · COLS` independent accumulators, enough to cover the fused multiply-add's
/// latency); each lane sums its elements in `k` order, and the lanes are added pairwise.
///
/// # Safety
///
/// The caller's `target_feature`s must include AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn dots<const COLS: usize>(
    x: &[f32],
    k: usize,
    rhs: MatRef<'_>,
    start: usize,
    out: &mut [&mut [f32]],
) {
    let data = rhs.data;
    let (m, len) = (out.len(), out.first().map_or(0, |row| row.len()));
    let column = |j: usize| (start + j) * rhs.col_stride;
    // The dot products' width: eight lanes at every level (see `dots_avx512`).
    const LANES: usize = <__m256 as Vector>::LANES;
    let body = k - k % LANES;
    let mut j = 0;
    while j < len {
        let width = COLS.min(len - j);
        let cols: [usize; COLS] = std::array::from_fn(|p| column(j + p.min(width - 1)));
        let mut i = 0;
        while i < m {
            let group = 4.min(m - i);
            // SAFETY (every vector operation below): AVX2 and FMA are enabled, by this
            // function's contract.
            let mut acc = [[unsafe { _mm256_setzero_ps() }; COLS]; 4];
            let mut c = 0;
            while c < body {
                let e: [__m256; COLS] =
                    std::array::from_fn(|p| unsafe { <__m256 as Vector>::load(data, cols[p] + c) });
                for (r, acc) in acc.iter_mut().enumerate().take(group) {
                    let xr = unsafe { <__m256 as Vector>::load(x, (i + r) * k + c) };
                    for (acc, &e) in acc.iter_mut().zip(&e) {
                        *acc = unsafe { _mm256_fmadd_ps(xr, e, *acc) };
                    }
                }
                c += LANES;
            }
            for (r, acc) in acc.iter().enumerate().take(group) {
                let row = &x[(i + r) * k..(i + r + 1) * k];
                for (p, &lanes) in acc.iter().enumerate().take(width) {
                    let mut total = unsafe { sum(lanes) };
                    let tail = &data[cols[p] + body..cols[p] + k];
                    for (&a, &e) in row[body..].iter().zip(tail) {
                        total = a.mul_add(e, total);
                    }
                    out[i + r][j + p] = total;
                }
            }
            i += group;
        }
        j += width;
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{LAYOUTS, same_bits, view};
    use super::*;
    use crate::test_rng::Rng;

    fn naive(a: MatRef<'_>, b: MatRef<'_>) -> Vec<f64> {
        let mut out = Vec::with_capacity(a.rows * b.cols);
        for i in 0..a.rows {
            for j in 0..b.cols {
                out.push(
                    (0..a.cols)
                        .map(|c| f64::from(a.at(i, c)) * f64::from(b.at(c, j)))
                        .sum(),
                );
            }
        }
        out
    }

    /// Every shape edge of both forms: inner sizes around the four-row passes and the
    /// eight-lane dot products, column counts that leave a partial vector, a partial tile or
    /// an odd last block, row counts up to the limit, a transposed left-hand side; against a
    /// sum in f64, and bit for bit across 1, 2 and 3 threads and every vector width.
    #[test]
    fn streamed_products_match_the_naive_product_on_any_thread_count() {
        let mut rng = Rng(11);
        let pools: Vec<rayon::ThreadPool> = (1..=3)
            .map(|t| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap()
            })
            .collect();
        let shapes = [
            (1, 65536),
            (3, 21851),
            (4, 16400),
            (7, 9371),
            (9, 7300),
            (576, 1536),
        ];
        for (k, n) in shapes {
            for m in [1, 3, 8] {
                let a = rng.vec(m * k, 1.0);
                let b = rng.vec(k * n, 1.0);
                for (ta, tb) in LAYOUTS {
                    let (lhs, rhs) = (view(&a, m, k, ta), view(&b, k, n, tb));
                    let mut runs: Vec<Option<Vec<f32>>> = pools
                        .iter()
                        .map(|pool| pool.install(|| product(lhs, rhs, pool.current_num_threads())))
                        .collect();
                    for level in [Level::Avx2, Level::Avx512] {
                        if level.supported() {
                            runs.push(product_at(level, lhs, rhs, 1));
                        }
                    }
                    let Some(one) = &runs[0] else {
                        assert!(!supported(), "{m}x{k}x{n} was not streamed");
                        continue;
                    };
                    for (run, many) in runs.iter().enumerate().skip(1) {
                        let many = many.as_ref().expect("streamed on every thread count");
                        assert!(
                            same_bits(one, many),
                            "{m}x{k}x{n} (transposed {ta}, {tb}) differs in run {run} \
                             (2 and 3 threads, then AVX2 and AVX-512 as supported)"
                        );
                    }
                    for (o, e) in one.iter().zip(naive(lhs, rhs)) {
                        let tolerance = 1e-5 * (1.0 + e.abs()) * (k as f64).sqrt();
                        assert!((f64::from(*o) - e).abs() <= tolerance, "{o} vs {e}");
                    }
                }
            }
        }
    }

    /// More rows than [`MAX_ROWS`], a right-hand side smaller than [`MIN_READ`], a row-major
    /// one narrower than [`MIN_COLS`] and one with no unit stride go to `gemm`.
    #[test]
    fn other_products_are_left_to_gemm() {
        let a = vec![1.0; 16 * 576];
        let b = vec![1.0; 576 * 1536];
        let wide = MatRef::row_major(&b, 576, 1536);
        assert!(product(MatRef::row_major(&a, MAX_ROWS + 1, 576), wide, 1).is_none());
        let narrow = MatRef::row_major(&b, 576, 192);
        assert!(product(MatRef::row_major(&a, 4, 576), narrow, 1).is_none());
        let small = MatRef::row_major(&b, 100, 600);
        assert!(product(MatRef::row_major(&a, 4, 100), small, 1).is_none());
        let strided = MatRef::new(&b, 576, 512, 1536, 2);
        assert!(product(MatRef::row_major(&a, 4, 576), strided, 1).is_none());
        assert_eq!(
            product(MatRef::row_major(&a, 4, 576), wide, 1).is_some(),
            supported()
        );
    }
}
