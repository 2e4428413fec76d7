//! Matrix products through the `gemm` crate (the one burn's flex backend uses), behind a
//! bounds-checked safe API. [`product`] hands a decode step's few-row products to `stream`,
//! which reads each weight once in memory order instead of packing it; at
//! [`Precision::Medium`] the large products go to `bf16`, on Intel's AMX tiles or AVX-512 BF16.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
mod bf16;
mod stream;

use std::sync::atomic::{AtomicU8, Ordering};

/// How exactly products of f32 matrices are computed: two of PyTorch's
/// `torch.set_float32_matmul_precision` levels, with the arithmetic oneDNN gives them on CPUs
/// with bf16 products. Set for the whole process by [`set_precision`].
///
/// [`Precision::Medium`] trades the bits this crate's tests pin for speed where the CPU has
/// AMX's bf16 tiles (Intel Xeon from Sapphire Rapids on) or AVX-512 BF16 (AMD from Zen 4 on),
/// and is [`Precision::Highest`] elsewhere. Either way a run is deterministic on one machine for
/// any thread count. Products too small to pay for packing the tiles (a decode step's few rows,
/// attention's tiles) stay in f32. PyTorch's `high` (three bf16 products) measured no faster than f32 here: see `bf16`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 products (`gemm`).
    #[default]
    Highest,
    /// Both operands rounded to bf16 (8 bits of mantissa) and the products summed in f32:
    /// errors near 2⁻⁸ of `Σ|a||b|`.
    Medium,
}

impl Precision {
    /// Its name, as PyTorch spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Highest => "highest",
            Precision::Medium => "medium",
        }
    }

    /// What it does on this machine: `highest`, `medium (bf16 on AMX tiles)`, `medium (bf16
    /// by AVX-512 BF16)`, or `medium (f32: this CPU has no bf16 products)`.
    pub fn describe(self) -> &'static str {
        match self {
            Precision::Highest => "highest",
            #[cfg(target_arch = "x86_64")]
            Precision::Medium if let Some(engine) = bf16::engine() => engine.describe(),
            Precision::Medium => "medium (f32: this CPU has no bf16 products)",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Precision::Highest, Precision::Medium]
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| format!("unknown matmul precision `{s}`: expected highest or medium"))
    }
}

/// The process's [`Precision`], as its index.
static PRECISION: AtomicU8 = AtomicU8::new(0);

/// Sets the precision of every later product in the process ([`matmul`], [`product`] and the
/// kernels built on them), like `torch.set_float32_matmul_precision`.
pub fn set_precision(precision: Precision) {
    PRECISION.store(precision as u8, Ordering::Relaxed);
}

/// The process's product precision ([`Precision::Highest`] unless [`set_precision`] said
/// otherwise).
pub fn precision() -> Precision {
    match PRECISION.load(Ordering::Relaxed) {
        1 => Precision::Medium,
        _ => Precision::Highest,
    }
}

/// A read-only strided view of a `rows × cols` f32 matrix: element `(i, j)` is
/// `data[i * row_stride + j * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

/// A writable strided view of a `rows × cols` f32 matrix; its elements never overlap.
#[derive(Debug)]
pub struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    row_stride: usize,
    col_stride: usize,
}

/// Whether a strided `rows × cols` view fits in `len` elements.
fn fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    (rows - 1)
        .checked_mul(row_stride)
        .zip((cols - 1).checked_mul(col_stride))
        .and_then(|(r, c)| r.checked_add(c))
        .is_some_and(|last| last < len)
}

/// Panics unless a strided `rows × cols` view fits in `len` elements.
fn assert_fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) {
    assert!(
        fits(len, rows, cols, row_stride, col_stride),
        "a {rows}x{cols} view with strides ({row_stride}, {col_stride}) does not fit in {len} elements"
    );
}

impl<'a> MatRef<'a> {
    /// A strided view.
    ///
    /// # Panics
    ///
    /// If the view reaches past the end of `data`.
    pub fn new(
        data: &'a [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        assert_fits(data.len(), rows, cols, row_stride, col_stride);
        MatRef {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// A dense row-major `rows × cols` view of the first `rows * cols` elements.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef::new(data, rows, cols, cols, 1)
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Element `(i, j)`.
    pub fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.row_stride + j * self.col_stride]
    }

    /// Rows `start..start + len` as a view.
    pub fn rows_range(self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.rows, "rows out of range");
        if len == 0 {
            return MatRef { rows: 0, ..self };
        }
        MatRef {
            data: &self.data[start * self.row_stride..],
            rows: len,
            ..self
        }
    }
}

impl<'a> MatMut<'a> {
    /// A strided writable view.
    ///
    /// # Panics
    ///
    /// If the view reaches past the end of `data`, or if its strides could make two elements
    /// share a slot (one of the strides must be 1 and the other at least the extent along it).
    pub fn new(
        data: &'a mut [f32],
        rows: usize,
        cols: usize,
        row_stride: usize,
        col_stride: usize,
    ) -> Self {
        assert_fits(data.len(), rows, cols, row_stride, col_stride);
        let disjoint = rows <= 1
            || cols <= 1
            || (col_stride == 1 && row_stride >= cols)
            || (row_stride == 1 && col_stride >= rows);
        let distinct = (rows <= 1 || row_stride > 0) && (cols <= 1 || col_stride > 0);
        assert!(
            disjoint && distinct,
            "a writable view's elements must not overlap"
        );
        MatMut {
            data,
            rows,
            cols,
            row_stride,
            col_stride,
        }
    }

    /// A dense row-major `rows × cols` view of the first `rows * cols` elements.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        MatMut::new(data, rows, cols, cols, 1)
    }

    /// A shorter-lived view of the same elements, so one destination can take several
    /// products (for example one per block of its rows).
    pub fn reborrow(&mut self) -> MatMut<'_> {
        MatMut {
            data: &mut *self.data,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.row_stride,
            col_stride: self.col_stride,
        }
    }

    /// Rows `start..start + len` as a view.
    pub fn rows_range(self, start: usize, len: usize) -> Self {
        assert!(start + len <= self.rows, "rows out of range");
        if len == 0 {
            return MatMut { rows: 0, ..self };
        }
        let offset = start * self.row_stride;
        MatMut {
            data: &mut self.data[offset..],
            rows: len,
            ..self
        }
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The transposed view (no copy).
    pub fn t(self) -> Self {
        MatMut {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }
}

/// How a product may use threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threads {
    /// On the calling thread (inside a kernel that already splits its work over rayon).
    One,
    /// Over rayon's current pool: the destination is cut into one block of rows (or columns)
    /// per thread, each an independent single-threaded product. Every element is reduced in the
    /// same order whatever the cut (see `Split`), so results do not depend on the thread
    /// count.
    Pool,
}

/// Columns of the output each thread's block in [`by_column_blocks`] is a multiple of (64
/// bytes).
pub(crate) const ALIGN: usize = 16;

/// A row-major `m × n` output cut into blocks of columns, one per thread of `threads` (aligned
/// to [`ALIGN`]): a block is one piece of each of the `m` rows (disjoint slices of the
/// output), and `run(first column, pieces)` writes them, on rayon's pool when there are
/// several blocks. What a product computing each column from its own operand column splits
/// by: every element is written by one block, so the bits do not depend on `threads`.
pub(crate) fn by_column_blocks(
    m: usize,
    n: usize,
    threads: usize,
    run: impl Fn(usize, &mut [&mut [f32]]) + Sync,
) -> Vec<f32> {
    use rayon::prelude::*;
    let block = n.div_ceil(threads.max(1)).next_multiple_of(ALIGN);
    let mut out = vec![0.0; m * n];
    let mut blocks: Vec<Vec<&mut [f32]>> = (0..n.div_ceil(block))
        .map(|_| Vec::with_capacity(m))
        .collect();
    for row in out.chunks_exact_mut(n) {
        for (pieces, piece) in blocks.iter_mut().zip(row.chunks_mut(block)) {
            pieces.push(piece);
        }
    }
    let run = |(b, mut pieces): (usize, Vec<&mut [f32]>)| run(b * block, &mut pieces);
    if blocks.len() == 1 {
        blocks.into_iter().enumerate().for_each(run);
    } else {
        blocks.into_par_iter().enumerate().for_each(run);
    }
    out
}

impl Threads {
    /// How many threads the product may use.
    pub(crate) fn count(self) -> usize {
        match self {
            Threads::One => 1,
            Threads::Pool => rayon::current_num_threads(),
        }
    }
}

/// A product runs on one thread below this many multiply-adds (burn's flex uses the same
/// bound) unless it reads at least [`PARALLEL_READ`] operand elements.
const PARALLEL_WORK: usize = 192 * 192 * 192;

/// Operand elements (256 KiB) from which a product is cut into blocks whatever its arithmetic:
/// a decode step multiplies a few rows by every weight matrix, and streaming a weight from
/// memory on one core runs at about half the speed of two (3.2 against 6.2 GB/s here). At
/// 1 MiB, SmolLM2's `576 × 192` key and value projections ran whole on the calling thread;
/// cut, a decode step at batch 4 took a median of 42.5 ms against 47.4 (seven rounds).
const PARALLEL_READ: usize = 1 << 16;

/// Blocks are cut at multiples of this many rows or columns (a multiple of every micro-kernel
/// width gemm has for f32).
const BLOCK_ALIGN: usize = 16;

/// How [`Threads::Pool`] cuts a destination. A block must sum each element in the same order
/// as the whole product: gemm sums over `k` in chunks sized from `k` alone, except on its
/// routes for small products (both sides at most 64, or at most 256 elements), whose chunks
/// differ. So a block either keeps more than 64 rows or columns on the side that is cut, or
/// keeps the uncut side's more than 64 and at least [`BLOCK_ALIGN`] on the cut one (a
/// `128 × 128` weight gradient splits in two blocks of 64 rows); either keeps it off those
/// routes as the whole product is. (Matrix-vector products, one row or one column, take
/// gemm's vector route whole and cut alike, and sum in `k` order on it; the tests cover both.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Split {
    /// One product.
    Whole,
    /// Blocks of this many rows (the last may be shorter, but not below 65).
    Rows(usize),
    /// Blocks of this many columns.
    Cols(usize),
}

impl Split {
    fn plan(m: usize, n: usize, k: usize, threads: usize) -> Split {
        let work = m.saturating_mul(n).saturating_mul(k);
        let read = m.saturating_mul(k).saturating_add(k.saturating_mul(n));
        if threads < 2 || k <= 2 || (work < PARALLEL_WORK && read < PARALLEL_READ) {
            return Split::Whole;
        }
        let block = |extent: usize, other: usize| {
            let size = extent.div_ceil(threads).next_multiple_of(BLOCK_ALIGN);
            let last = extent - (extent - 1) / size * size;
            let off_small_routes = last > 64 || (other > 64 && last >= BLOCK_ALIGN);
            (size < extent && off_small_routes).then_some(size)
        };
        let rows = block(m, n).map(Split::Rows);
        let cols = block(n, m).map(Split::Cols);
        let first = if m >= n { rows.or(cols) } else { cols.or(rows) };
        first.unwrap_or(Split::Whole)
    }
}

/// A raw destination: element `(i, j)` at `ptr + i * row_stride + j * col_stride`, handed to
/// the threads that write disjoint blocks of it.
#[derive(Clone, Copy)]
struct Dst {
    ptr: *mut f32,
    row_stride: usize,
    col_stride: usize,
}

// SAFETY: each thread writes a disjoint block of the destination (see `product_raw`).
unsafe impl Send for Dst {}
// SAFETY: as above; the pointer itself is only copied.
unsafe impl Sync for Dst {}

impl Dst {
    /// The destination from row `i`, column `j` on. A method, so closures capture the whole
    /// `Dst`.
    fn at(self, i: usize, j: usize) -> *mut f32 {
        self.ptr
            .wrapping_add(i * self.row_stride + j * self.col_stride)
    }
}

/// `dst = (dst if accumulate else 0) + scale * lhs · rhs` through a raw destination.
///
/// # Safety
///
/// `dst` must be valid for writes (and, with `accumulate`, reads) of every element `(i, j)`
/// for `i < lhs.rows`, `j < rhs.cols`, those elements must be distinct, and nothing else may
/// access them during the call. The shapes must chain and `m`, `n`, `k` must be positive.
unsafe fn product_raw(
    dst: Dst,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    scale: f32,
    accumulate: bool,
    threads: Threads,
) {
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    #[cfg(target_arch = "x86_64")]
    {
        if precision() == Precision::Medium
            && bf16::worth(m, n, k)
            && let Some(engine) = bf16::engine()
        {
            let pool = threads == Threads::Pool;
            // SAFETY: the engine is this machine's; `dst` is as this function's contract says.
            unsafe { bf16::product(engine, dst, lhs, rhs, scale, accumulate, pool) };
            return;
        }
    }
    let pool = threads.count();
    let one = |out: *mut f32, lhs: MatRef<'_>, rhs: MatRef<'_>| {
        let stride = |s: usize| s as isize;
        // SAFETY: the caller's contract, for the block `lhs.rows × rhs.cols` at `out`; the
        // operands' views were checked to lie inside their slices. With `accumulate` false
        // gemm never reads `dst` (`read_dst = false`).
        unsafe {
            gemm::gemm(
                lhs.rows,
                rhs.cols,
                k,
                out,
                stride(dst.col_stride),
                stride(dst.row_stride),
                accumulate,
                lhs.data.as_ptr(),
                stride(lhs.col_stride),
                stride(lhs.row_stride),
                rhs.data.as_ptr(),
                stride(rhs.col_stride),
                stride(rhs.row_stride),
                1.0,
                scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    };
    use rayon::prelude::*;
    match Split::plan(m, n, k, pool) {
        Split::Whole => one(dst.at(0, 0), lhs, rhs),
        Split::Rows(size) => (0..m.div_ceil(size)).into_par_iter().for_each(|b| {
            let (start, len) = (b * size, size.min(m - b * size));
            one(dst.at(start, 0), lhs.rows_range(start, len), rhs);
        }),
        Split::Cols(size) => (0..n.div_ceil(size)).into_par_iter().for_each(|b| {
            let (start, len) = (b * size, size.min(n - b * size));
            let rhs = rhs.t().rows_range(start, len).t();
            one(dst.at(0, start), lhs, rhs);
        }),
    }
}

/// Panics unless `lhs: m × k` and `rhs: k × n` chain.
fn check_chain(lhs: &MatRef<'_>, rhs: &MatRef<'_>) {
    assert_eq!(
        rhs.rows, lhs.cols,
        "inner dimensions differ: {}x{} by {}x{}",
        lhs.rows, lhs.cols, rhs.rows, rhs.cols
    );
}

/// `dst = (dst if accumulate else 0) + scale * lhs · rhs`.
///
/// # Panics
///
/// If the shapes do not chain (`lhs: m × k`, `rhs: k × n`, `dst: m × n`).
pub fn matmul(
    dst: MatMut<'_>,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    scale: f32,
    accumulate: bool,
    threads: Threads,
) {
    check_chain(&lhs, &rhs);
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(
        (dst.rows, dst.cols),
        (m, n),
        "destination is {}x{}, the product {m}x{n}",
        dst.rows,
        dst.cols
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    dst.data[i * dst.row_stride + j * dst.col_stride] = 0.0;
                }
            }
        }
        return;
    }
    // SAFETY: `MatMut::new` checked that every destination element lies inside `dst.data` and
    // that no two share a slot; `dst` is a unique borrow, so nothing else reads or writes them
    // and it aliases neither operand.
    unsafe {
        product_raw(
            Dst {
                ptr: dst.data.as_mut_ptr(),
                row_stride: dst.row_stride,
                col_stride: dst.col_stride,
            },
            lhs,
            rhs,
            scale,
            accumulate,
            threads,
        );
    }
}

/// `lhs · rhs` as a new row-major `m × n` buffer, written once by the product (no zero-filled
/// allocation first: for the products of a linear layer, that fill and its page faults on the
/// calling thread were a serial part of every step). At most 8 rows by a weight of at least
/// 256 KiB go through `stream` (a decode step), whose sums run in another order than
/// `gemm`'s; everything else is bit-identical to [`matmul`].
///
/// # Panics
///
/// If the shapes do not chain.
pub fn product(lhs: MatRef<'_>, rhs: MatRef<'_>, threads: Threads) -> Vec<f32> {
    check_chain(&lhs, &rhs);
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    let len = m.checked_mul(n).expect("the product's size fits in usize");
    if len == 0 || k == 0 {
        return vec![0.0; len];
    }
    if let Some(out) = stream::product(lhs, rhs, threads.count()) {
        return out;
    }
    let mut out = Vec::with_capacity(len);
    // SAFETY: the spare capacity holds `len` elements, row-major `m × n` with strides `(n, 1)`
    // are distinct and in bounds, and the buffer is not yet visible to anyone else. gemm with
    // `accumulate` false writes every element of the destination without reading it, so all
    // `len` elements are initialized when it returns and `set_len` exposes only those.
    unsafe {
        product_raw(
            Dst {
                ptr: out.spare_capacity_mut().as_mut_ptr().cast(),
                row_stride: n,
                col_stride: 1,
            },
            lhs,
            rhs,
            1.0,
            false,
            threads,
        );
        out.set_len(len);
    }
    out
}

/// What the product tests of this module and of `stream` share: the operand layouts they run
/// and the bit-for-bit comparison their thread-count checks make.
#[cfg(test)]
mod testing {
    use super::MatRef;

    /// The operand layouts every product test covers, as (left-hand side transposed,
    /// right-hand side transposed): both row-major, then each side stored transposed (the
    /// backward's and the tied head's views).
    pub(super) const LAYOUTS: [(bool, bool); 3] = [(false, false), (true, false), (false, true)];

    /// A `rows × cols` view of `data`: row-major, or when `transposed` the transpose of a
    /// row-major `cols × rows` matrix (unit row stride).
    pub(super) fn view(data: &[f32], rows: usize, cols: usize, transposed: bool) -> MatRef<'_> {
        if transposed {
            MatRef::row_major(data, cols, rows).t()
        } else {
            MatRef::row_major(data, rows, cols)
        }
    }

    /// Whether two results are the same, bit for bit.
    pub(super) fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{LAYOUTS, same_bits, view};
    use super::*;

    fn naive(a: MatRef<'_>, b: MatRef<'_>) -> Vec<f32> {
        let mut out = vec![0.0; a.rows() * b.cols()];
        for i in 0..a.rows() {
            for j in 0..b.cols() {
                out[i * b.cols() + j] = (0..a.cols()).map(|p| a.at(i, p) * b.at(p, j)).sum();
            }
        }
        out
    }

    #[test]
    fn products_of_transposed_views_match_the_naive_product() {
        let a: Vec<f32> = (0..15).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..20).map(|i| (i as f32 * 0.91).cos()).collect();
        let lhs = MatRef::row_major(&a, 5, 3);
        let rhs = MatRef::row_major(&b, 5, 4).t().rows_range(0, 4).t();
        // rhs: the 5x4 matrix viewed as 4x5 then transposed back: 5x4; use lhs^T (3x5) · it.
        let mut out = vec![1.0; 12];
        matmul(
            MatMut::row_major(&mut out, 3, 4),
            lhs.t(),
            rhs,
            2.0,
            true,
            Threads::Pool,
        );
        let expect = naive(lhs.t(), rhs);
        for (o, e) in out.iter().zip(&expect) {
            assert!((o - (1.0 + 2.0 * e)).abs() < 1e-5, "{o} vs {e}");
        }
    }

    /// Values that are not exactly representable sums, so any change of summation order
    /// shows in the bits.
    fn noise(len: usize, seed: u64) -> Vec<f32> {
        crate::test_rng::Rng(seed).vec(len, 1.0)
    }

    /// The cut into per-thread blocks never changes a bit: shapes around every threshold of
    /// [`Split::plan`] and of gemm's own routes, row-major and transposed operands, in pools of
    /// 2 and 3 threads against one thread.
    #[test]
    fn products_are_bit_identical_for_any_thread_count() {
        let shapes = [
            (4096, 128, 128),
            (128, 4096, 128),
            (128, 4096, 64),
            (136, 700, 128),
            (96, 3000, 130),
            (97, 4096, 70),
            (128, 4096, 40),
            (200, 3000, 64),
            (128, 4096, 512),
            (512, 4096, 128),
            (130, 700, 129),
            (200, 300, 65),
            (200, 3000, 65),
            (65, 400, 300),
            (16, 576, 2000),
            (2000, 576, 16),
            (1, 512, 20000),
            (20000, 512, 1),
            (64, 3000, 64),
            (300, 3, 300),
            (4, 576, 1536),
            (1, 576, 1536),
            (3, 1536, 576),
            (4, 576, 192),
            (1, 576, 192),
        ];
        for (i, &(m, k, n)) in shapes.iter().enumerate() {
            let a = noise(m * k, i as u64);
            let b = noise(k * n, 100 + i as u64);
            for (ta, tb) in LAYOUTS {
                let (lhs, rhs) = (view(&a, m, k, ta), view(&b, k, n, tb));
                let one = product(lhs, rhs, Threads::One);
                for threads in [2, 3] {
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(threads)
                        .build()
                        .unwrap();
                    let many = pool.install(|| product(lhs, rhs, Threads::Pool));
                    assert!(
                        same_bits(&one, &many),
                        "{m}x{k}x{n} (transposed {ta}, {tb}) differs on {threads} threads"
                    );
                    let mut acc = noise(m * n, 7);
                    let mut expect = acc.clone();
                    matmul(
                        MatMut::row_major(&mut expect, m, n),
                        lhs,
                        rhs,
                        0.5,
                        true,
                        Threads::One,
                    );
                    pool.install(|| {
                        matmul(
                            MatMut::row_major(&mut acc, m, n),
                            lhs,
                            rhs,
                            0.5,
                            true,
                            Threads::Pool,
                        )
                    });
                    assert!(same_bits(&acc, &expect));
                }
                let naive = naive(lhs, rhs);
                for (o, e) in one.iter().zip(&naive) {
                    assert!(
                        (o - e).abs() <= 1e-4 * (1.0 + e.abs()) * (k as f32).sqrt(),
                        "{o} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_cut_takes_the_longer_side_and_keeps_every_block_off_gemms_special_routes() {
        assert_eq!(Split::plan(4096, 128, 128, 2), Split::Rows(2048));
        // (rows, columns, inner)
        assert_eq!(Split::plan(128, 512, 4096, 2), Split::Cols(256));
        assert_eq!(Split::plan(16, 49152, 576, 3), Split::Cols(16384));
        assert_eq!(Split::plan(2000, 16, 576, 2), Split::Rows(1008));
        // A weight gradient of the small model: 64 rows by 128 columns is no small product.
        assert_eq!(Split::plan(128, 128, 4096, 2), Split::Rows(64));
        assert_eq!(Split::plan(200, 65, 3000, 3), Split::Rows(80));
        // 64 columns: blocks of 64 rows would be small products, blocks of 32 columns by 128
        // or 200 rows are not.
        assert_eq!(Split::plan(128, 64, 4096, 2), Split::Cols(32));
        assert_eq!(Split::plan(200, 64, 3000, 3), Split::Cols(32));
        // 40 columns: 64-row blocks would be small products, 32-column blocks leave one of 8.
        assert_eq!(Split::plan(128, 40, 4096, 2), Split::Whole);
        // Blocks of 48 rows would leave one, of 32 columns six: either could take a
        // small-product route.
        assert_eq!(Split::plan(136, 128, 4096, 2), Split::Rows(80));
        assert_eq!(Split::plan(97, 70, 4096, 3), Split::Whole);
        assert_eq!(Split::plan(4096, 128, 128, 1), Split::Whole);
        assert_eq!(Split::plan(64, 64, 64, 2), Split::Whole);
        // A decode step: little arithmetic, a large weight to read.
        assert_eq!(Split::plan(4, 1536, 576, 2), Split::Cols(768));
        assert_eq!(Split::plan(4, 192, 576, 2), Split::Cols(96));
        assert_eq!(Split::plan(1, 64, 576, 2), Split::Whole);
    }

    #[test]
    fn an_empty_inner_dimension_gives_zeros() {
        let a: [f32; 0] = [];
        let out = product(
            MatRef::row_major(&a, 3, 0),
            MatRef::row_major(&a, 0, 2),
            Threads::Pool,
        );
        assert_eq!(out, vec![0.0; 6]);
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn a_view_past_the_end_is_refused() {
        let a = [0.0f32; 5];
        MatRef::new(&a, 2, 3, 3, 1);
    }

    #[test]
    #[should_panic(expected = "must not overlap")]
    fn an_overlapping_destination_is_refused() {
        let mut a = [0.0f32; 8];
        MatMut::new(&mut a, 3, 3, 1, 1);
    }
}
