//! Matrix products through the `gemm` crate (the one burn's flex backend uses), behind a
//! bounds-checked safe API: the only `unsafe` in the crate.
#![allow(unsafe_code)]

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
    /// Over rayon's current pool. `gemm` splits the output into blocks and reduces each
    /// element in the same order for any thread count, so results do not depend on it.
    Pool,
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
    let (m, k, n) = (lhs.rows, lhs.cols, rhs.cols);
    assert_eq!(
        rhs.rows, k,
        "inner dimensions differ: {m}x{k} by {}x{n}",
        rhs.rows
    );
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
    let parallelism = match threads {
        Threads::One => gemm::Parallelism::None,
        Threads::Pool if rayon::current_num_threads() > 1 => gemm::Parallelism::Rayon(0),
        Threads::Pool => gemm::Parallelism::None,
    };
    let stride = |s: usize| s as isize;
    // SAFETY: `MatRef::new` and `MatMut::new` checked that every element of the three views
    // lies inside its slice; `MatMut::new` checked that no two destination elements share a
    // slot (gemm may write them from several threads); `dst` is a unique borrow, so it aliases
    // neither operand. With `accumulate` false gemm never reads `dst` (`read_dst = false`).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.data.as_mut_ptr(),
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
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
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
