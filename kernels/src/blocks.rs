//! Weights kept in ggml's quantized blocks, multiplied without ever being expanded to f32 in
//! memory: a decode step reads each weight once per step, so on the CPU its time is the
//! weight's bytes over the memory bandwidth, and a Q4_1 weight is 6.4 times smaller than the
//! same weight in f32.
//!
//! Each block holds 32 consecutive values of one row. A value is dequantized exactly as
//! ggml's `dequantize_row_*` (and `agentry-runtime`'s GGUF loader) computes it, in f32 with
//! one rounding per operation, so a product here multiplies by the very floats the loader
//! would have expanded:
//! - Q4_1, 20 bytes per block: scale `d` and minimum `m` (f16), 16 bytes of nibbles; value
//!   `j < 16` is `lo(qs[j]) · d + m`, value `j + 16` is `hi(qs[j]) · d + m`;
//! - Q8_0, 34 bytes per block: `d` (f16), 32 signed bytes; value `j` is `qs[j] · d`.
//!
//! [`BlockMatrix::product`] computes `x · Wᵀ` for a few rows of `x` (a decode step's batch):
//! each output element is a dot product summed in sixteen lanes, lane `l` taking the elements
//! `c ≡ l (mod 16)` in order with fused multiply-adds, then the lanes added in a fixed tree
//! (`reduce`). The AVX-512 kernel (one register per sum), the AVX2 one (two) and the
//! portable one follow that order exactly, and threads split the output's columns, so the bits
//! depend on neither the CPU nor the thread count.

#![allow(unsafe_code)]

use crate::matmul::{MatRef, Threads, by_column_blocks};
use crate::simd::Level;

/// Values per block.
pub const BLOCK: usize = 32;

/// A ggml block format [`BlockMatrix`] multiplies by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockFormat {
    /// 4-bit values with a scale and a minimum per block (ggml type 3).
    Q4_1,
    /// 8-bit signed values with a scale per block (ggml type 8).
    Q8_0,
}

impl BlockFormat {
    /// Bytes of one block in a ggml file.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q8_0 => 34,
        }
    }

    /// Bytes of quantized values in one block.
    fn quant_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_1 => 16,
            BlockFormat::Q8_0 => 32,
        }
    }

    /// The format's name in ggml.
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4_1 => "Q4_1",
            BlockFormat::Q8_0 => "Q8_0",
        }
    }
}

/// A `rows × cols` matrix stored row by row in 32-value blocks: each block's scale (and
/// minimum) converted from f16 once, its quantized values as the file holds them.
#[derive(Clone, Debug)]
pub struct BlockMatrix {
    format: BlockFormat,
    rows: usize,
    cols: usize,
    /// One per block, row-major (`row * blocks_per_row + block`).
    scales: Vec<f32>,
    /// Q4_1's minimums, one per block; empty for Q8_0.
    mins: Vec<f32>,
    /// [`BlockFormat::quant_bytes`] per block, in the same order.
    quants: Vec<u8>,
}

impl BlockMatrix {
    /// The matrix a ggml tensor's data holds: `rows` rows of `cols` values (ggml's
    /// `ne[1] × ne[0]`), `cols` a multiple of [`BLOCK`], `data` exactly their blocks.
    pub fn from_ggml(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Self, String> {
        if rows == 0 || cols == 0 || !cols.is_multiple_of(BLOCK) {
            return Err(format!(
                "a {rows} × {cols} {} matrix needs rows and a positive multiple of {BLOCK} \
                 columns",
                format.name()
            ));
        }
        let blocks = rows
            .checked_mul(cols / BLOCK)
            .ok_or_else(|| format!("{rows} × {cols} values overflow"))?;
        if Some(data.len()) != blocks.checked_mul(format.block_bytes()) {
            return Err(format!(
                "has {} bytes of {} data, which is not {rows} × {cols} values",
                data.len(),
                format.name()
            ));
        }
        let quant_bytes = format.quant_bytes();
        let mut scales = Vec::with_capacity(blocks);
        let mut mins = Vec::new();
        let mut quants = Vec::with_capacity(blocks * quant_bytes);
        for block in data.chunks_exact(format.block_bytes()) {
            scales.push(half(&block[0..2]));
            let values = match format {
                BlockFormat::Q4_1 => {
                    mins.push(half(&block[2..4]));
                    &block[4..]
                }
                BlockFormat::Q8_0 => &block[2..],
            };
            quants.extend_from_slice(values);
        }
        Ok(BlockMatrix {
            format,
            rows,
            cols,
            scales,
            mins,
            quants,
        })
    }

    /// `values` (`rows × cols`, row-major) quantized to `format` as ggml's reference
    /// quantizers (`quantize_row_q4_1_ref`, `quantize_row_q8_0_ref`) do: Q4_1 spans each
    /// block's minimum to maximum in 15 steps, Q8_0 its largest magnitude in 127. Lossy; the
    /// values a model then computes with are [`BlockMatrix::dequantize`]'s.
    pub fn quantize(
        format: BlockFormat,
        rows: usize,
        cols: usize,
        values: &[f32],
    ) -> Result<Self, String> {
        if Some(values.len()) != rows.checked_mul(cols) {
            return Err(format!("{} values are not {rows} × {cols}", values.len()));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(format!(
                "value {i} is {}, which cannot be quantized",
                values[i]
            ));
        }
        if !cols.is_multiple_of(BLOCK) {
            return Err(format!(
                "a {rows} × {cols} {} matrix needs a multiple of {BLOCK} columns",
                format.name()
            ));
        }
        let f16 = |v: f32| half::f16::from_f32(v).to_bits().to_le_bytes();
        let mut data = Vec::with_capacity(values.len() / BLOCK * format.block_bytes());
        for x in values.chunks_exact(BLOCK) {
            match format {
                BlockFormat::Q4_1 => {
                    let min = x.iter().copied().fold(f32::MAX, f32::min);
                    let max = x.iter().copied().fold(-f32::MAX, f32::max);
                    let d = (max - min) / 15.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    data.extend(f16(d));
                    data.extend(f16(min));
                    // `(int8_t)(v + 0.5f)`: truncation toward zero of a non-negative value.
                    let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
                    data.extend((0..16).map(|j| q(x[j]) | (q(x[j + 16]) << 4)));
                }
                BlockFormat::Q8_0 => {
                    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    data.extend(f16(d));
                    data.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
                }
            }
        }
        BlockMatrix::from_ggml(format, rows, cols, &data)
    }

    /// The block format.
    pub fn format(&self) -> BlockFormat {
        self.format
    }

    /// Rows (a linear layer's outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (a linear layer's inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the matrix holds in memory (what a product reads).
    pub fn bytes(&self) -> usize {
        4 * (self.scales.len() + self.mins.len()) + self.quants.len()
    }

    /// The matrix with its rows in the given order: row `r` of the result is row `order[r]`
    /// of this one (a loader undoing a permutation of a projection's rows).
    ///
    /// # Panics
    ///
    /// If `order` is not as long as the matrix has rows or names a row it does not have.
    pub fn with_rows(&self, order: &[usize]) -> BlockMatrix {
        assert_eq!(order.len(), self.rows, "one source row per row");
        let per_row = self.cols / BLOCK;
        let quant_row = per_row * self.format.quant_bytes();
        let gather = |from: &[f32], width: usize| -> Vec<f32> {
            order
                .iter()
                .flat_map(|&r| &from[r * width..(r + 1) * width])
                .copied()
                .collect()
        };
        BlockMatrix {
            format: self.format,
            rows: self.rows,
            cols: self.cols,
            scales: gather(&self.scales, per_row),
            mins: if self.mins.is_empty() {
                Vec::new()
            } else {
                gather(&self.mins, per_row)
            },
            quants: order
                .iter()
                .flat_map(|&r| &self.quants[r * quant_row..(r + 1) * quant_row])
                .copied()
                .collect(),
        }
    }

    /// Row `row` in f32 (`cols` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.rows && out.len() == self.cols,
            "a row of the matrix"
        );
        let first = row * (self.cols / BLOCK);
        for (b, values) in out.chunks_exact_mut(BLOCK).enumerate() {
            self.block(first + b, values);
        }
    }

    /// [`BlockMatrix::dequantize_row`] in AVX2, the same values.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    fn dequantize_row_avx2(&self, row: usize, out: &mut [f32]) {
        use std::arch::x86_64::{
            __m128i, _mm_and_si128, _mm_loadl_epi64, _mm_loadu_si128, _mm_set1_epi8,
            _mm_srli_epi16, _mm_srli_si128, _mm256_add_ps, _mm256_cvtepi8_epi32,
            _mm256_cvtepi32_ps, _mm256_cvtepu8_epi32, _mm256_mul_ps, _mm256_set1_ps,
            _mm256_storeu_ps,
        };
        assert!(
            row < self.rows && out.len() == self.cols,
            "a row of the matrix"
        );
        let per_row = self.cols / BLOCK;
        let quant_bytes = self.format.quant_bytes();
        let quants = &self.quants[row * per_row * quant_bytes..][..per_row * quant_bytes];
        for (b, (qs, out)) in quants
            .chunks_exact(quant_bytes)
            .zip(out.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let d = _mm256_set1_ps(self.scales[row * per_row + b]);
            // SAFETY: `qs` holds `quant_bytes` bytes and `out` 32 f32s, what the loads and
            // stores below read and write.
            unsafe {
                let p = qs.as_ptr();
                match self.format {
                    BlockFormat::Q4_1 => {
                        let m = _mm256_set1_ps(self.mins[row * per_row + b]);
                        let bytes = _mm_loadu_si128(p.cast::<__m128i>());
                        let low = _mm_and_si128(bytes, _mm_set1_epi8(0x0F));
                        let high = _mm_and_si128(_mm_srli_epi16::<4>(bytes), _mm_set1_epi8(0x0F));
                        let eights = [
                            low,
                            _mm_srli_si128::<8>(low),
                            high,
                            _mm_srli_si128::<8>(high),
                        ];
                        for (t, q) in eights.into_iter().enumerate() {
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                            let w = _mm256_add_ps(_mm256_mul_ps(q, d), m);
                            _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), w);
                        }
                    }
                    BlockFormat::Q8_0 => {
                        for t in 0..4 {
                            let q = _mm_loadl_epi64(p.add(8 * t).cast::<__m128i>());
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                            _mm256_storeu_ps(out.as_mut_ptr().add(8 * t), _mm256_mul_ps(q, d));
                        }
                    }
                }
            }
        }
    }

    /// [`BlockMatrix::dequantize_row`] in AVX-512, the same values: Q4_1's sixteen possible
    /// values of a block computed once (`q · d + m`, the same two roundings) and looked up by
    /// nibble, all sixteen bytes widened by one instruction.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
    fn dequantize_row_avx512(&self, row: usize, out: &mut [f32]) {
        use std::arch::x86_64::{
            __m128i, _mm_loadu_si128, _mm512_add_ps, _mm512_cvtepi8_epi32, _mm512_cvtepi32_ps,
            _mm512_cvtepu8_epi32, _mm512_mul_ps, _mm512_permutexvar_ps, _mm512_set1_ps,
            _mm512_setr_ps, _mm512_srli_epi32, _mm512_storeu_ps,
        };
        assert!(
            row < self.rows && out.len() == self.cols,
            "a row of the matrix"
        );
        let per_row = self.cols / BLOCK;
        let quant_bytes = self.format.quant_bytes();
        let quants = &self.quants[row * per_row * quant_bytes..][..per_row * quant_bytes];
        let levels = _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        );
        for (b, (qs, out)) in quants
            .chunks_exact(quant_bytes)
            .zip(out.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let d = _mm512_set1_ps(self.scales[row * per_row + b]);
            // SAFETY: `qs` holds `quant_bytes` (16 or 32) bytes and `out` 32 f32s, what the
            // loads and stores below read and write.
            unsafe {
                let p = qs.as_ptr().cast::<__m128i>();
                let (low, high) = match self.format {
                    BlockFormat::Q4_1 => {
                        let m = _mm512_set1_ps(self.mins[row * per_row + b]);
                        let values = _mm512_add_ps(_mm512_mul_ps(levels, d), m);
                        // Each byte in a lane: the lookup reads its low four bits (the low
                        // nibble); shifted, the high nibble.
                        let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(p));
                        (
                            _mm512_permutexvar_ps(bytes, values),
                            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(bytes), values),
                        )
                    }
                    BlockFormat::Q8_0 => {
                        let q = |p| _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(p)));
                        (_mm512_mul_ps(q(p), d), _mm512_mul_ps(q(p.add(1)), d))
                    }
                };
                _mm512_storeu_ps(out.as_mut_ptr(), low);
                _mm512_storeu_ps(out.as_mut_ptr().add(16), high);
            }
        }
    }

    /// The whole matrix in f32, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for (row, values) in out.chunks_exact_mut(self.cols).enumerate() {
            self.dequantize_row(row, values);
        }
        out
    }

    /// Block `b`'s 32 values, one rounding per operation as ggml computes them.
    fn block(&self, b: usize, out: &mut [f32]) {
        let d = self.scales[b];
        let qs = &self.quants[b * self.format.quant_bytes()..][..self.format.quant_bytes()];
        match self.format {
            BlockFormat::Q4_1 => {
                let m = self.mins[b];
                for (j, &q) in qs.iter().enumerate() {
                    out[j] = (q & 0x0F) as f32 * d + m;
                    out[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
            BlockFormat::Q8_0 => {
                for (o, &q) in out.iter_mut().zip(qs) {
                    *o = q as i8 as f32 * d;
                }
            }
        }
    }

    /// `x · Wᵀ` as a row-major `x.rows × self.rows` buffer: a linear layer's outputs for the
    /// rows of `x` (`x.cols == self.cols`). Threads split the output's columns
    /// (`matmul::by_column_blocks`), each column's weight row expanded once into a small buffer and
    /// multiplied by every row of `x`.
    ///
    /// # Panics
    ///
    /// If `x` has not as many columns as the matrix.
    pub fn product(&self, x: MatRef<'_>, threads: Threads) -> Vec<f32> {
        self.product_at(Level::detected(), x, threads)
    }

    /// [`BlockMatrix::product`] with the AVX2 kernel where `level` has it, the portable one
    /// otherwise (the tests compare the two).
    fn product_at(&self, level: Level, x: MatRef<'_>, threads: Threads) -> Vec<f32> {
        let (m, k, n) = (x.rows(), self.cols, self.rows);
        assert_eq!(x.cols(), k, "the left-hand side's columns and the matrix's");
        let vector = level != Level::Baseline && level.supported();
        let wide = level == Level::Avx512 && level.supported();
        // The left-hand rows, contiguous (a few rows: cheap, and the kernels index them flat).
        let lhs: Vec<f32> = (0..m)
            .flat_map(|i| (0..k).map(move |c| x.at(i, c)))
            .collect();
        let run = |start: usize, out: &mut [&mut [f32]]| {
            let len = out.first().map_or(0, |piece| piece.len());
            let mut weights = vec![0.0f32; TILE_COLUMNS.max(WIDE_COLUMNS) * k];
            let mut j = 0;
            while j < len {
                #[cfg(target_arch = "x86_64")]
                if vector {
                    // Tiles of columns as wide as fit, then narrower ones.
                    let most = if wide { WIDE_COLUMNS } else { TILE_COLUMNS };
                    let columns = (len - j).min(most);
                    let weights = &mut weights[..columns * k];
                    // SAFETY: `vector` checked that this CPU has AVX2 and FMA, `wide` that it
                    // has AVX-512 (F, VL, BW, DQ) too: what the `target_feature` functions
                    // enable.
                    unsafe {
                        for (q, w) in weights.chunks_exact_mut(k).enumerate() {
                            if wide {
                                self.dequantize_row_avx512(start + j + q, w);
                            } else {
                                self.dequantize_row_avx2(start + j + q, w);
                            }
                        }
                        match (wide, columns) {
                            (true, 4) => tiles_avx512::<4>(&lhs, k, weights, out, j),
                            (true, 3) => tiles_avx512::<3>(&lhs, k, weights, out, j),
                            (true, 2) => tiles_avx512::<2>(&lhs, k, weights, out, j),
                            (true, _) => tiles_avx512::<1>(&lhs, k, weights, out, j),
                            (false, 2) => tiles_avx2::<2>(&lhs, k, weights, out, j),
                            (false, _) => tiles_avx2::<1>(&lhs, k, weights, out, j),
                        }
                    }
                    j += columns;
                    continue;
                }
                let weights = &mut weights[..k];
                self.dequantize_row(start + j, weights);
                for (row, piece) in lhs.chunks_exact(k).zip(out.iter_mut()) {
                    piece[j] = dot(row, weights);
                }
                j += 1;
            }
        };
        by_column_blocks(m, n, threads.count(), run)
    }
}

/// The f32 an IEEE half-precision value (little-endian bytes) stands for, exactly.
fn half(bytes: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])).to_f32()
}

/// `Σ x[c] · w[c]` in the module's order, portably: sixteen lanes of fused multiply-adds
/// (lane `l` takes the elements `c ≡ l (mod 16)` in order), then [`reduce`].
fn dot(x: &[f32], w: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    for (x, w) in x.chunks_exact(LANES).zip(w.chunks_exact(LANES)) {
        for ((s, &x), &w) in lanes.iter_mut().zip(x).zip(w) {
            *s = x.mul_add(w, *s);
        }
    }
    reduce(lanes)
}

/// Lanes of a dot product's sum (a block is two of them).
const LANES: usize = 16;

/// The sum of the sixteen lanes: the two halves added lane by lane (`t_l = s_l + s_{l+8}`),
/// then the eight as AVX2 folds them, `((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7))`.
fn reduce(s: [f32; LANES]) -> f32 {
    let t: [f32; 8] = std::array::from_fn(|l| s[l] + s[l + 8]);
    ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]))
}

/// Weight rows (output columns) in one register tile of [`tiles_avx512`].
const WIDE_COLUMNS: usize = 4;

/// Rows of the left-hand side in one register tile of [`tiles_avx512`].
const WIDE_ROWS: usize = 4;

/// Checks a tile kernel's operands: `out` holds one piece per row of `x` (rows of `k` values,
/// `k` whole sums), each reaching column `col + columns`, and `w` holds `columns` rows.
fn check_tiles(x: &[f32], k: usize, w: &[f32], columns: usize, out: &[&mut [f32]], col: usize) {
    assert!(
        k.is_multiple_of(LANES) && x.len() == out.len() * k && w.len() == columns * k,
        "rows of whole vectors"
    );
    assert!(
        out.iter().all(|piece| piece.len() >= col + columns),
        "an output per row and column"
    );
}

/// [`dot`] of every row of `x` with each of `C` weight rows (`w`, `C` rows of `k` values), in
/// AVX-512: the dot product of row `i` with weight row `q` goes to `out[i][col + q]`. Tiles of
/// up to four rows by `C` columns, each sum one sixteen-lane register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl,avx2,fma")]
fn tiles_avx512<const C: usize>(
    x: &[f32],
    k: usize,
    w: &[f32],
    out: &mut [&mut [f32]],
    col: usize,
) {
    check_tiles(x, k, w, C, out, col);
    for (x, out) in x.chunks(WIDE_ROWS * k).zip(out.chunks_mut(WIDE_ROWS)) {
        // SAFETY: AVX-512F, AVX2 and FMA are enabled here; the slices are as checked.
        unsafe {
            match out.len() {
                4 => wide_tile::<4, C>(x, k, w, out, col),
                3 => wide_tile::<3, C>(x, k, w, out, col),
                2 => wide_tile::<2, C>(x, k, w, out, col),
                _ => wide_tile::<1, C>(x, k, w, out, col),
            }
        }
    }
}

/// One register tile of [`tiles_avx512`]: `R` rows of `x` by `C` weight rows.
///
/// # Safety
///
/// The caller enables AVX-512F, AVX2 and FMA; `x` holds `R` rows and `w` `C` rows of `k`
/// values, `k` a multiple of sixteen, and `out` holds `R` pieces reaching `col + C`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn wide_tile<const R: usize, const C: usize>(
    x: &[f32],
    k: usize,
    w: &[f32],
    out: &mut [&mut [f32]],
    col: usize,
) {
    use std::arch::x86_64::{
        __m512, _mm256_add_ps, _mm512_castps512_ps256, _mm512_extractf32x8_ps, _mm512_fmadd_ps,
        _mm512_loadu_ps, _mm512_setzero_ps,
    };
    // SAFETY (every intrinsic below): the caller enables the instructions, and every load
    // reads sixteen values at `c < k` of a row the slices hold.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        for c in (0..k).step_by(LANES) {
            let ws: [__m512; C] = std::array::from_fn(|q| _mm512_loadu_ps(wp.add(q * k + c)));
            for (r, acc) in acc.iter_mut().enumerate() {
                let xs = _mm512_loadu_ps(xp.add(r * k + c));
                for (a, &w) in acc.iter_mut().zip(&ws) {
                    *a = _mm512_fmadd_ps(xs, w, *a);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, &s) in acc.iter().enumerate() {
                let halves =
                    _mm256_add_ps(_mm512_castps512_ps256(s), _mm512_extractf32x8_ps::<1>(s));
                out[r][col + q] = sum8(halves);
            }
        }
    }
}

/// The eight lanes' sum in [`reduce`]'s order: `[t0 + t4, t1 + t5, t2 + t6, t3 + t7]`, then
/// `[(t0 + t4) + (t2 + t6), (t1 + t5) + (t3 + t7), ..]`, then the first plus the second.
///
/// # Safety
///
/// The caller enables AVX2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn sum8(t: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::{
        _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_movehl_ps, _mm_shuffle_ps,
        _mm256_castps256_ps128, _mm256_extractf128_ps,
    };
    // SAFETY: the caller enables AVX2 (and so SSE).
    unsafe {
        let quad = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps::<1>(t));
        let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
        _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps::<0b01>(pair, pair)))
    }
}

/// Rows of the left-hand side in one register tile of [`tiles_avx2`].
const TILE_ROWS: usize = 3;

/// Weight rows (output columns) in one register tile of [`tiles_avx2`].
const TILE_COLUMNS: usize = 2;

/// [`tiles_avx512`] in AVX2, the same bits: each sum is two eight-lane registers (the lanes
/// `l` and `l + 8` of the sixteen), in tiles of up to three rows by `C` columns (twelve
/// registers of sums).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tiles_avx2<const C: usize>(x: &[f32], k: usize, w: &[f32], out: &mut [&mut [f32]], col: usize) {
    check_tiles(x, k, w, C, out, col);
    for (x, out) in x.chunks(TILE_ROWS * k).zip(out.chunks_mut(TILE_ROWS)) {
        // SAFETY: AVX2 and FMA are enabled here; the slices are as checked.
        unsafe {
            match out.len() {
                3 => tile::<3, C>(x, k, w, out, col),
                2 => tile::<2, C>(x, k, w, out, col),
                _ => tile::<1, C>(x, k, w, out, col),
            }
        }
    }
}

/// One register tile of [`tiles_avx2`]: `R` rows of `x` by `C` rows of `w`.
///
/// # Safety
///
/// The caller enables AVX2 and FMA; `x` holds `R` rows and `w` `C` rows of `k` values, `k` a
/// multiple of sixteen, and `out` holds `R` pieces reaching `col + C`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn tile<const R: usize, const C: usize>(
    x: &[f32],
    k: usize,
    w: &[f32],
    out: &mut [&mut [f32]],
    col: usize,
) {
    use std::arch::x86_64::{
        __m256, _mm256_add_ps, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps,
    };
    // SAFETY (every intrinsic below): the caller enables AVX2 and FMA, and every load reads
    // eight values at `c + 8 < k` of a row the slices hold.
    unsafe {
        let mut acc = [[[_mm256_setzero_ps(); 2]; C]; R];
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        for c in (0..k).step_by(LANES) {
            for half in 0..2 {
                let c = c + 8 * half;
                let ws: [__m256; C] = std::array::from_fn(|q| _mm256_loadu_ps(wp.add(q * k + c)));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let xs = _mm256_loadu_ps(xp.add(r * k + c));
                    for (a, &w) in acc.iter_mut().zip(&ws) {
                        a[half] = _mm256_fmadd_ps(xs, w, a[half]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            for (q, s) in acc.iter().enumerate() {
                out[r][col + q] = sum8(_mm256_add_ps(s[0], s[1]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// A random matrix in `format`: random scales and minimums (finite f16s), random values.
    fn random(format: BlockFormat, rows: usize, cols: usize, rng: &mut Rng) -> BlockMatrix {
        let mut data = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            let d = half::f16::from_f32(0.026 + rng.f32(0.024))
                .to_bits()
                .to_le_bytes();
            data.extend_from_slice(&d);
            if format == BlockFormat::Q4_1 {
                let m = half::f16::from_f32(rng.f32(0.3)).to_bits().to_le_bytes();
                data.extend_from_slice(&m);
            }
            for _ in 0..format.quant_bytes() {
                data.push((rng.next_u64() >> 56) as u8);
            }
        }
        BlockMatrix::from_ggml(format, rows, cols, &data).unwrap()
    }

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f64> {
        (0..m)
            .flat_map(|i| {
                (0..n).map(move |j| {
                    (0..k)
                        .map(|c| x[i * k + c] as f64 * w[j * k + c] as f64)
                        .sum()
                })
            })
            .collect()
    }

    #[test]
    fn products_match_the_dequantized_matrix_in_both_kernels_and_any_thread_count() {
        let mut rng = Rng(7);
        for format in [BlockFormat::Q4_1, BlockFormat::Q8_0] {
            for (m, k, n) in [
                (1, 32, 1),
                (3, 64, 70),
                (4, 576, 200),
                (16, 96, 129),
                (17, 32, 5),
            ] {
                let w = random(format, n, k, &mut rng);
                let x: Vec<f32> = (0..m * k).map(|_| rng.f32(1.0)).collect();
                let lhs = MatRef::row_major(&x, m, k);
                let expected = naive(&x, &w.dequantize(), m, k, n);
                let got = w.product_at(Level::Baseline, lhs, Threads::One);
                for (g, e) in got.iter().zip(&expected) {
                    assert!(
                        (*g as f64 - e).abs() <= 1e-5 * (1.0 + e.abs()),
                        "{g} vs {e}"
                    );
                }
                for level in crate::simd::forced::supported() {
                    for threads in [Threads::One, Threads::Pool] {
                        let other = w.product_at(level, lhs, threads);
                        assert_eq!(
                            other.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                            "{format:?} {m}x{k}x{n} at {level:?}"
                        );
                    }
                }
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(5)
                    .build()
                    .unwrap();
                let five = pool.install(|| w.product_at(Level::detected(), lhs, Threads::Pool));
                assert_eq!(five, got, "five threads");
            }
        }
    }

    #[test]
    fn a_row_gives_the_same_bits_alone_or_in_a_batch() {
        let mut rng = Rng(3);
        let w = random(BlockFormat::Q4_1, 130, 128, &mut rng);
        let x: Vec<f32> = (0..9 * 128).map(|_| rng.f32(1.0)).collect();
        let all = w.product(MatRef::row_major(&x, 9, 128), Threads::Pool);
        for i in 0..9 {
            let one = w.product(
                MatRef::row_major(&x[i * 128..(i + 1) * 128], 1, 128),
                Threads::Pool,
            );
            assert_eq!(one[..], all[i * 130..(i + 1) * 130]);
        }
    }

    #[test]
    fn blocks_dequantize_as_ggml_computes_them() {
        // Q4_1: d = 0.5, m = -1.0; nibbles 0x21 give low 1 and high 2.
        let mut q41 = vec![0x00, 0x38, 0x00, 0xBC];
        q41.extend([0x21; 16]);
        let w = BlockMatrix::from_ggml(BlockFormat::Q4_1, 1, 32, &q41).unwrap();
        let values = w.dequantize();
        assert!(values[..16].iter().all(|&v| v == 1.0 * 0.5 - 1.0));
        assert!(values[16..].iter().all(|&v| v == 2.0 * 0.5 - 1.0));
        // Q8_0: d = 2.0, values -128 and 127.
        let mut q80 = vec![0x00, 0x40];
        q80.extend([0x80; 16]);
        q80.extend([0x7F; 16]);
        let w = BlockMatrix::from_ggml(BlockFormat::Q8_0, 1, 32, &q80).unwrap();
        let values = w.dequantize();
        assert!(values[..16].iter().all(|&v| v == -256.0));
        assert!(values[16..].iter().all(|&v| v == 254.0));
        assert_eq!(w.bytes(), 4 + 32);
    }

    #[test]
    fn quantizing_keeps_each_value_within_half_a_step() {
        let mut rng = Rng(5);
        let values = rng.vec(3 * 64, 2.0);
        for (format, steps) in [(BlockFormat::Q4_1, 15.0), (BlockFormat::Q8_0, 254.0)] {
            let w = BlockMatrix::quantize(format, 3, 64, &values).unwrap();
            for (block, back) in values.chunks(BLOCK).zip(w.dequantize().chunks(BLOCK)) {
                let (lo, hi) = block
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                let span = match format {
                    BlockFormat::Q4_1 => hi - lo,
                    BlockFormat::Q8_0 => 2.0 * lo.abs().max(hi.abs()),
                };
                for (v, b) in block.iter().zip(back) {
                    // Half a step, plus the f16 rounding of the scale and minimum.
                    assert!(
                        (v - b).abs() <= span / steps * 0.5 + 2e-3 * span,
                        "{v} -> {b}"
                    );
                }
            }
            // Quantizing the dequantized values again gives the same blocks.
            let again = BlockMatrix::quantize(format, 3, 64, &w.dequantize()).unwrap();
            assert_eq!(again.dequantize(), w.dequantize());
        }
        let zeros = BlockMatrix::quantize(BlockFormat::Q4_1, 1, 32, &[0.0; 32]).unwrap();
        assert_eq!(zeros.dequantize(), vec![0.0; 32]);
        let bad = BlockMatrix::quantize(BlockFormat::Q8_0, 1, 32, &[f32::NAN; 32]).unwrap_err();
        assert!(bad.contains("NaN"), "{bad}");
        assert!(BlockMatrix::quantize(BlockFormat::Q8_0, 1, 33, &[0.0; 33]).is_err());
        assert!(BlockMatrix::quantize(BlockFormat::Q8_0, 2, 32, &[0.0; 32]).is_err());
    }

    #[test]
    fn rows_are_reordered_with_their_blocks() {
        let mut rng = Rng(11);
        let w = random(BlockFormat::Q4_1, 4, 64, &mut rng);
        let moved = w.with_rows(&[2, 0, 3, 1]);
        let (a, b) = (w.dequantize(), moved.dequantize());
        for (r, &from) in [2, 0, 3, 1].iter().enumerate() {
            assert_eq!(b[r * 64..(r + 1) * 64], a[from * 64..(from + 1) * 64]);
        }
    }

    #[test]
    fn malformed_data_is_an_error() {
        for (rows, cols, len) in [
            (1, 32, 19),
            (1, 32, 21),
            (1, 31, 20),
            (0, 32, 0),
            (2, 32, 20),
        ] {
            let err =
                BlockMatrix::from_ggml(BlockFormat::Q4_1, rows, cols, &vec![0; len]).unwrap_err();
            assert!(err.contains("Q4_1"), "{err}");
        }
        assert!(BlockMatrix::from_ggml(BlockFormat::Q4_1, usize::MAX, 64, &[]).is_err());
    }
}
