//! The AVX-512 BF16 engine: `vdpbf16ps` on the packed tiles. Each f32 lane of a `vdpbf16ps`
//! adds two products, `a[k] b[k] + a[k + 1] b[k + 1]`, so a right-hand tile row in the pair
//! layout (sixteen columns' `k`, `k + 1`) is one register, and a left-hand row's pair is one
//! broadcast 32-bit value. A block's 32 rows go by eight at a time: eight rows by two column
//! tiles are sixteen registers of sums, held over the whole of `k`.

use std::arch::x86_64::{
    __m512bh, _mm512_dpbf16_ps, _mm512_loadu_ps, _mm512_set1_epi32, _mm512_setzero_ps,
    _mm512_storeu_ps,
};

use super::{DEPTH, Sums, TILE, TILE_LEN};

/// Rows whose sums one pass holds in registers.
const ROWS: usize = 8;

/// Whether this CPU (and the operating system's saved state) runs AVX-512 BF16.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// `out[t] = Σ_chunks a(t) · b(t)` for four output tiles `(a0, b0), (a0, b1), (a1, b0),
/// (a1, b1)`: a product of 32 rows by 32 columns.
///
/// # Safety
///
/// AVX-512 BF16 must be [`available`]; each pointer must point at `chunks` consecutive packed
/// tiles.
pub(super) unsafe fn block(a: [*const u16; 2], b: [*const u16; 2], chunks: usize, out: &mut Sums) {
    for (i, &a) in a.iter().enumerate() {
        for first in (0..TILE).step_by(ROWS) {
            let [left, right] = out.get_disjoint_mut([2 * i, 2 * i + 1]).expect("distinct");
            // SAFETY: the caller's contract; `first + ROWS <= TILE`.
            unsafe { rows(a, first, b, chunks, [left, right]) };
        }
    }
}

/// Rows `first..first + ROWS` of one row block's two output tiles.
///
/// # Safety
///
/// As [`block`]'s, for `a` and `b`.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn rows(
    a: *const u16,
    first: usize,
    b: [*const u16; 2],
    chunks: usize,
    mut out: [&mut [f32; TILE * TILE]; 2],
) {
    let mut sums = [[_mm512_setzero_ps(); 2]; ROWS];
    for chunk in 0..chunks {
        let offset = chunk * TILE_LEN;
        // SAFETY: `offset` is inside the `chunks` tiles the caller vouches for, and every read
        // below stays inside the chunk's tile (16 rows of 32 bf16).
        let (a, b0, b1) = unsafe { (a.add(offset), b[0].add(offset), b[1].add(offset)) };
        for pair in 0..DEPTH / 2 {
            // SAFETY: row `pair` of each right-hand tile: 16 pairs, 64 bytes.
            let (b0, b1) = unsafe { (row(b0, pair), row(b1, pair)) };
            for (r, sums) in sums.iter_mut().enumerate() {
                // SAFETY: elements `2 pair` and `2 pair + 1` of row `first + r` of the tile.
                let pair = unsafe {
                    a.add((first + r) * DEPTH + 2 * pair)
                        .cast::<i32>()
                        .read_unaligned()
                };
                // A bit pattern of 32 bf16s, as `vdpbf16ps` takes it.
                let a: __m512bh = to_bf16(_mm512_set1_epi32(pair));
                sums[0] = _mm512_dpbf16_ps(sums[0], a, b0);
                sums[1] = _mm512_dpbf16_ps(sums[1], a, b1);
            }
        }
    }
    for (r, row_sums) in sums.iter().enumerate() {
        for (out, &sum) in out.iter_mut().zip(row_sums) {
            let at = &mut out[(first + r) * TILE..(first + r + 1) * TILE];
            // SAFETY: `at` is 16 f32s.
            unsafe { _mm512_storeu_ps(at.as_mut_ptr(), sum) };
        }
    }
}

/// Row `pair` of a right-hand tile (in the pair layout) as 32 bf16s.
///
/// # Safety
///
/// `tile` must point at a packed tile.
#[inline(always)]
unsafe fn row(tile: *const u16, pair: usize) -> __m512bh {
    // SAFETY: the caller's contract; a tile row is 16 pairs, 64 bytes.
    to_bf16(unsafe { _mm512_loadu_ps(tile.add(pair * DEPTH).cast()) })
}

/// The same 512 bits seen as 32 bf16s.
#[inline(always)]
fn to_bf16<T: Copy>(bits: T) -> __m512bh {
    const { assert!(size_of::<T>() == size_of::<__m512bh>()) };
    // SAFETY: both are 512 bits of plain data, and every bit pattern is a valid `__m512bh`.
    unsafe { std::mem::transmute_copy(&bits) }
}
