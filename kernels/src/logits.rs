//! The LM head fused with log-softmax: per-position `log p(target)`, entropy and logsumexp of
//! `z = τ · h Wᵀ`, forward and backward, without ever holding the whole `[n, vocab]` logits.
//!
//! At SmolLM2's vocabulary (49152) a few thousand positions make a logits tensor of hundreds of
//! megabytes, written and read back several times by a tensor framework (logits, max, exp,
//! sum, log, gather, and again for the gradient). Here the logits live in one reused tile of
//! about `TILE_ELEMS` floats (4 MB): rows are cut into blocks and the vocabulary into column
//! tiles, each tile is one `gemm`, then one or two passes over it in cache.
//!
//! - Forward keeps, per row, a running max, `Σ e^(z-max)` and `Σ e^(z-max)·(z-max)` across the
//!   vocabulary tiles (an online softmax), so each weight tile is read once per row block
//!   (cutting rows instead would stream the whole 113 MB weight once per ~20 rows).
//! - Backward gets the logsumexp from forward, so `p = e^(z-lse)` is known tile by tile; the
//!   entropy gradient also needs the row's entropy H, recomputed in a first sweep over the
//!   tiles when a row spans several (with one tile it is computed in place). Each tile's
//!   `dz·τ` feeds `d_hidden += dz·W_tile` and `d_weight[tile] (+)= dzᵀ·h`.
//!
//! Determinism: tile shapes depend only on `n` and `vocab`; rayon splits only the per-row
//! element-wise work (each row's sums in a fixed lane order on one thread), every `gemm` is
//! deterministic per element, and sums across tiles or row blocks run in tile order. So every
//! output is bit-identical for any thread count.

use rayon::prelude::*;

use crate::math::exp;
use crate::matmul::{MatMut, MatRef, Threads, matmul};
use crate::simd::vectorized;

/// Floats in one logits tile (4 MB): large enough for efficient `gemm` shapes, small enough to
/// stay in L2/L3 between the product and the passes over it.
const TILE_ELEMS: usize = 1 << 20;
/// Fewest rows in a block when the vocabulary is too wide for whole rows in a tile: at 49152
/// whole rows would make blocks of 21, re-streaming the weight (and in backward `d_weight`)
/// once per 21 rows; 512 rows by 2048 columns keeps all three products' shapes efficient.
const MIN_BLOCK_ROWS: usize = 512;
/// Tile widths are a multiple of this (whole SIMD lanes in the row passes).
const COL_ALIGN: usize = 16;
/// Independent accumulators in a row reduction: a float sum only vectorizes when written as
/// several interleaved sums.
const LANES: usize = 16;
/// Below this many tile elements the row passes stay on the calling thread (a rayon fork costs
/// a few microseconds, about what 32k elements of these passes take).
const PAR_MIN_ELEMS: usize = 1 << 15;

/// Per-row results of `forward`.
pub struct Outputs<'a> {
    /// log p(target) per row, `[n]`.
    pub logprob: &'a mut [f32],
    /// Entropy of each row's distribution, `[n]`; `None` skips computing it (SFT, the KL
    /// reference do not need it).
    pub entropy: Option<&'a mut [f32]>,
    /// logsumexp of each row's tempered logits, `[n]`: what backward needs to rebuild p chunk by
    /// chunk.
    pub lse: &'a mut [f32],
}

/// How the `[n, vocab]` logits are cut: blocks of `rows` rows by tiles of `cols` columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tiling {
    rows: usize,
    cols: usize,
}

impl Tiling {
    /// Whole rows per tile when `TILE_ELEMS / vocab` rows make a worthwhile block (or all of
    /// `n`); otherwise [`MIN_BLOCK_ROWS`] rows by as many columns as fit. Depends on the shape
    /// only, never on the thread count.
    fn for_shape(n: usize, vocab: usize) -> Self {
        let rows = (TILE_ELEMS / vocab.max(1))
            .max(MIN_BLOCK_ROWS)
            .min(n)
            .max(1);
        let cols = if rows * vocab <= TILE_ELEMS {
            vocab
        } else {
            (TILE_ELEMS / rows / COL_ALIGN * COL_ALIGN)
                .max(COL_ALIGN)
                .min(vocab)
        };
        Tiling { rows, cols }.clamped(n, vocab)
    }

    /// At least 1 by 1, at most `n` by `vocab`.
    fn clamped(self, n: usize, vocab: usize) -> Self {
        Tiling {
            rows: self.rows.min(n).max(1),
            cols: self.cols.min(vocab).max(1),
        }
    }
}

/// Forward: for each row i, with `z = τ · hidden_i · weightᵀ`, writes `logprob[i] = z[t_i] −
/// lse(z)`, `lse[i] = lse(z)` and, if asked, `entropy[i] = −Σ p log p` with `p = softmax(z)`.
///
/// `hidden`: [n, d]; `weight`: the head as a [vocab, d] view (the tied embedding as is, or a
/// Linear's `[d, vocab]` weight transposed); `targets`: `[n]`; `inv_temperature`: τ.
///
/// # Panics
///
/// If the shapes or lengths disagree, `vocab` is 0, τ is not finite, or a target is not below
/// `vocab`.
pub fn forward(
    hidden: MatRef<'_>,
    weight: MatRef<'_>,
    targets: &[u32],
    inv_temperature: f32,
    out: Outputs<'_>,
) {
    let tiling = Tiling::for_shape(hidden.rows(), weight.rows());
    forward_tiled(hidden, weight, targets, inv_temperature, out, tiling);
}

/// Backward: given upstream gradients of `logprob` (and of `entropy`, if the forward computed
/// it), writes `d_hidden` ([n, d] row-major, overwritten) and `d_weight` (the same [vocab, d]
/// logical view as `weight`, so a transposed Linear weight gets its gradient in its own
/// layout; overwritten).
///
/// With `p = softmax(z)`, `log p = z − lse`, `H = −Σ p log p`: `dz_j = g_lp·(1[j=t] − p_j) −
/// g_H·p_j·(log p_j + H)`; `d_hidden = τ·dz·W`, `d_weight = τ·dzᵀ·h`. `lse` is forward's.
///
/// `d_weight` is written in place, one block of vocabulary rows per tile.
///
/// # Panics
///
/// If the shapes or lengths disagree, `vocab` is 0, τ is not finite, or a target is not below
/// `vocab`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    hidden: MatRef<'_>,
    weight: MatRef<'_>,
    targets: &[u32],
    inv_temperature: f32,
    lse: &[f32],
    d_logprob: &[f32],
    d_entropy: Option<&[f32]>,
    d_hidden: &mut [f32],
    d_weight: MatMut<'_>,
) {
    let tiling = Tiling::for_shape(hidden.rows(), weight.rows());
    let grads = Grads {
        lse,
        d_logprob,
        d_entropy,
    };
    backward_tiled(
        hidden,
        weight,
        targets,
        inv_temperature,
        grads,
        d_hidden,
        d_weight,
        tiling,
    );
}

/// Backward's per-row inputs.
#[derive(Clone, Copy)]
struct Grads<'a> {
    lse: &'a [f32],
    d_logprob: &'a [f32],
    d_entropy: Option<&'a [f32]>,
}

/// Checks what forward and backward share; returns (n, d, vocab).
fn check_common(
    what: &str,
    hidden: MatRef<'_>,
    weight: MatRef<'_>,
    targets: &[u32],
    inv_temperature: f32,
) -> (usize, usize, usize) {
    let (n, d, vocab) = (hidden.rows(), hidden.cols(), weight.rows());
    assert!(
        vocab > 0,
        "logits::{what}: the weight has no rows (vocab = 0)"
    );
    assert_eq!(
        weight.cols(),
        d,
        "logits::{what}: hidden is {n}x{d} but the weight view is {vocab}x{} (want [vocab, d])",
        weight.cols()
    );
    assert_eq!(
        targets.len(),
        n,
        "logits::{what}: {} targets for {n} hidden rows",
        targets.len()
    );
    assert!(
        inv_temperature.is_finite(),
        "logits::{what}: inv_temperature is {inv_temperature}"
    );
    if let Some((i, &t)) = targets
        .iter()
        .enumerate()
        .find(|&(_, &t)| t as usize >= vocab)
    {
        panic!("logits::{what}: target {t} at row {i} is not below vocab = {vocab}");
    }
    (n, d, vocab)
}

fn check_len(what: &str, name: &str, len: usize, want: usize) {
    assert_eq!(
        len, want,
        "logits::{what}: {name} has {len} elements, expected {want}"
    );
}

/// The tile of logits for rows `h` and weight rows `v0..v0 + cols`, into `buf` ([rows, cols]
/// row-major).
fn logits_tile(
    buf: &mut [f32],
    h: MatRef<'_>,
    weight: MatRef<'_>,
    v0: usize,
    cols: usize,
    tau: f32,
) {
    let w = weight.rows_range(v0, cols);
    matmul(
        MatMut::row_major(buf, h.rows(), cols),
        h,
        w.t(),
        tau,
        false,
        Threads::Pool,
    );
}

/// Runs `f` on each row of `tile` (width `cols`) with its row's state, over rayon when large,
/// [`vectorized`]. Rows are independent, so the split cannot change a result.
fn for_rows<S: Send>(
    tile: &mut [f32],
    cols: usize,
    states: &mut [S],
    f: impl Fn(&mut [f32], &mut S) + Sync,
) {
    if tile.len() >= PAR_MIN_ELEMS && rayon::current_num_threads() > 1 {
        tile.par_chunks_mut(cols)
            .zip(states.par_iter_mut())
            .for_each(|(row, s)| {
                vectorized(
                    #[inline(always)]
                    || f(row, s),
                )
            });
    } else {
        vectorized(
            #[inline(always)]
            || {
                for (row, s) in tile.chunks_mut(cols).zip(states.iter_mut()) {
                    f(row, s);
                }
            },
        );
    }
}

fn forward_tiled(
    hidden: MatRef<'_>,
    weight: MatRef<'_>,
    targets: &[u32],
    tau: f32,
    out: Outputs<'_>,
    tiling: Tiling,
) {
    let (n, _, vocab) = check_common("forward", hidden, weight, targets, tau);
    check_len("forward", "logprob", out.logprob.len(), n);
    check_len("forward", "lse", out.lse.len(), n);
    if let Some(e) = &out.entropy {
        check_len("forward", "entropy", e.len(), n);
    }
    if n == 0 {
        return;
    }
    let Outputs {
        logprob,
        mut entropy,
        lse,
    } = out;
    let want_entropy = entropy.is_some();
    let Tiling { rows, cols } = tiling.clamped(n, vocab);
    let mut buf = vec![0.0f32; rows * cols];
    let mut states = vec![Online::default(); rows];
    for r0 in (0..n).step_by(rows) {
        let br = rows.min(n - r0);
        let h = hidden.rows_range(r0, br);
        let states = &mut states[..br];
        for (s, &t) in states.iter_mut().zip(&targets[r0..r0 + br]) {
            *s = Online::new(t as usize);
        }
        for v0 in (0..vocab).step_by(cols) {
            let bc = cols.min(vocab - v0);
            let tile = &mut buf[..br * bc];
            logits_tile(tile, h, weight, v0, bc, tau);
            if want_entropy {
                for_rows(
                    tile,
                    bc,
                    states,
                    #[inline(always)]
                    |row, s| s.absorb::<true>(row, v0),
                );
            } else {
                for_rows(
                    tile,
                    bc,
                    states,
                    #[inline(always)]
                    |row, s| s.absorb::<false>(row, v0),
                );
            }
        }
        for (i, s) in states.iter().enumerate() {
            let ln_sum = s.sum.ln();
            lse[r0 + i] = s.max + ln_sum;
            // (z_t − max) − ln Σ: exact subtraction first, so large logits lose nothing to lse.
            logprob[r0 + i] = (s.target_logit - s.max) - ln_sum;
            if let Some(e) = entropy.as_deref_mut() {
                // H = −Σ p·(z − max − ln Σ) = ln Σ − (Σ e^(z−max)·(z−max)) / Σ; both terms ≥ 0.
                e[r0 + i] = ln_sum - s.weighted / s.sum;
            }
        }
    }
}

/// One row's online-softmax state across vocabulary tiles.
#[derive(Clone, Copy, Debug)]
struct Online {
    /// The row's target, as a column index.
    target: usize,
    /// Its logit, once its tile has been seen.
    target_logit: f32,
    /// Max logit so far.
    max: f32,
    /// `Σ e^(z − max)` so far.
    sum: f32,
    /// `Σ e^(z − max)·(z − max)` so far (for the entropy).
    weighted: f32,
}

impl Default for Online {
    fn default() -> Self {
        Online::new(0)
    }
}

impl Online {
    fn new(target: usize) -> Self {
        Online {
            target,
            target_logit: f32::NAN,
            max: f32::NEG_INFINITY,
            sum: 0.0,
            weighted: 0.0,
        }
    }

    /// Folds in the row's logits for columns `v0..v0 + z.len()`.
    #[inline(always)]
    fn absorb<const ENTROPY: bool>(&mut self, z: &[f32], v0: usize) {
        if let Some(&zt) = self.target.checked_sub(v0).and_then(|j| z.get(j)) {
            self.target_logit = zt;
        }
        let max = self.max.max(row_max(z));
        if self.sum > 0.0 && max > self.max {
            // Rebase the sums from the old max to the new: e^(z−m') = e^(z−m)·e^(m−m').
            let shift = self.max - max;
            let scale = exp(shift);
            if ENTROPY {
                self.weighted = (self.weighted + shift * self.sum) * scale;
            }
            self.sum *= scale;
        }
        self.max = max;
        let (sum, weighted) = exp_sums::<ENTROPY>(z, max);
        self.sum += sum;
        self.weighted += weighted;
    }
}

/// Adds the lanes pairwise (shorter dependency chains, a little less rounding).
#[inline(always)]
fn reduce_lanes(acc: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut a = acc;
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            a[i] = op(a[i], a[i + width]);
        }
        width /= 2;
    }
    a[0]
}

/// The larger of two, as `maxps` computes it (NaNs are skipped, then surface through the sums).
#[inline(always)]
fn max2(a: f32, b: f32) -> f32 {
    if b > a { b } else { a }
}

/// Max of a row, vectorized (−inf for an empty one).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let chunks = x.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &v| max2(a, v));
    let mut acc = [f32::NEG_INFINITY; LANES];
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = max2(*a, v);
        }
    }
    max2(reduce_lanes(acc, max2), tail)
}

/// `(Σ e^(x−m), Σ e^(x−m)·(x−m))`, the second only when `WEIGHTED` (else 0), vectorized.
#[inline(always)]
fn exp_sums<const WEIGHTED: bool>(x: &[f32], m: f32) -> (f32, f32) {
    let chunks = x.chunks_exact(LANES);
    let (mut tail_s, mut tail_w) = (0.0f32, 0.0f32);
    for &v in chunks.remainder() {
        let y = v - m;
        let e = exp(y);
        tail_s += e;
        if WEIGHTED {
            tail_w += e * y;
        }
    }
    let mut s = [0.0f32; LANES];
    let mut w = [0.0f32; LANES];
    for c in chunks {
        for ((s, w), &v) in s.iter_mut().zip(w.iter_mut()).zip(c) {
            let y = v - m;
            let e = exp(y);
            *s += e;
            if WEIGHTED {
                *w += e * y;
            }
        }
    }
    let add = |a: f32, b: f32| a + b;
    (reduce_lanes(s, add) + tail_s, reduce_lanes(w, add) + tail_w)
}

/// `Σ p·log p` with `log p = x − lse`, vectorized.
#[inline(always)]
fn sum_p_log_p(x: &[f32], lse: f32) -> f32 {
    // Same sum as `exp_sums`'s second, about lse instead of the max.
    exp_sums::<true>(x, lse).1
}

/// One row's backward constants.
#[derive(Clone, Copy, Debug, Default)]
struct BackRow {
    target: usize,
    lse: f32,
    /// τ·g_lp.
    g: f32,
    /// τ·g_H.
    g_h: f32,
    /// `Σ p log p` over the tiles seen so far (−H once all are).
    p_log_p: f32,
}

impl BackRow {
    /// Overwrites the row's logits `z` (columns `v0..`) with `τ·dz`.
    #[inline(always)]
    fn grad<const ENTROPY: bool>(&self, z: &mut [f32], v0: usize) {
        if ENTROPY {
            // τ·dz_j = −p_j·(τg + τg_H·(log p_j + H)) = p_j·(a + b·log p_j).
            let entropy = -self.p_log_p;
            let a = -(self.g + self.g_h * entropy);
            let b = -self.g_h;
            for x in z.iter_mut() {
                let lp = *x - self.lse;
                *x = exp(lp) * (a + b * lp);
            }
        } else {
            let c = -self.g;
            for x in z.iter_mut() {
                *x = c * exp(*x - self.lse);
            }
        }
        if let Some(x) = self.target.checked_sub(v0).and_then(|j| z.get_mut(j)) {
            *x += self.g;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn backward_tiled(
    hidden: MatRef<'_>,
    weight: MatRef<'_>,
    targets: &[u32],
    tau: f32,
    grads: Grads<'_>,
    d_hidden: &mut [f32],
    mut d_weight: MatMut<'_>,
    tiling: Tiling,
) {
    let (n, d, vocab) = check_common("backward", hidden, weight, targets, tau);
    check_len("backward", "lse", grads.lse.len(), n);
    check_len("backward", "d_logprob", grads.d_logprob.len(), n);
    if let Some(g) = grads.d_entropy {
        check_len("backward", "d_entropy", g.len(), n);
    }
    check_len("backward", "d_hidden", d_hidden.len(), n * d);
    assert_eq!(
        (d_weight.rows(), d_weight.cols()),
        (vocab, d),
        "logits::backward: d_weight must be a [vocab, d] = [{vocab}, {d}] view"
    );
    if n == 0 {
        // No rows: a product with an empty inner dimension writes zeros.
        matmul(
            d_weight,
            MatRef::row_major(&[], vocab, 0),
            MatRef::row_major(&[], 0, d),
            1.0,
            false,
            Threads::Pool,
        );
        return;
    }
    let Tiling { rows, cols } = tiling.clamped(n, vocab);
    let tiles = vocab.div_ceil(cols);
    let entropy = grads.d_entropy.is_some();
    let mut buf = vec![0.0f32; rows * cols];
    let mut states = vec![BackRow::default(); rows.min(n)];
    for (block, r0) in (0..n).step_by(rows).enumerate() {
        let br = rows.min(n - r0);
        let h = hidden.rows_range(r0, br);
        let states = &mut states[..br];
        for (i, s) in states.iter_mut().enumerate() {
            let r = r0 + i;
            *s = BackRow {
                target: targets[r] as usize,
                lse: grads.lse[r],
                g: tau * grads.d_logprob[r],
                g_h: grads.d_entropy.map_or(0.0, |g| tau * g[r]),
                p_log_p: 0.0,
            };
        }
        if entropy && tiles > 1 {
            // H needs the whole row: one sweep over the tiles for Σ p log p first.
            for v0 in (0..vocab).step_by(cols) {
                let bc = cols.min(vocab - v0);
                let tile = &mut buf[..br * bc];
                logits_tile(tile, h, weight, v0, bc, tau);
                for_rows(
                    tile,
                    bc,
                    states,
                    #[inline(always)]
                    |row, s| s.p_log_p += sum_p_log_p(row, s.lse),
                );
            }
        }
        let d_hidden_block = &mut d_hidden[r0 * d..(r0 + br) * d];
        for (tile_index, v0) in (0..vocab).step_by(cols).enumerate() {
            let bc = cols.min(vocab - v0);
            let tile = &mut buf[..br * bc];
            logits_tile(tile, h, weight, v0, bc, tau);
            if entropy {
                for_rows(
                    tile,
                    bc,
                    states,
                    #[inline(always)]
                    |row, s| {
                        if tiles == 1 {
                            s.p_log_p = sum_p_log_p(row, s.lse);
                        }
                        s.grad::<true>(row, v0);
                    },
                );
            } else {
                for_rows(
                    tile,
                    bc,
                    states,
                    #[inline(always)]
                    |row, s| s.grad::<false>(row, v0),
                );
            }
            let dz = MatRef::row_major(tile, br, bc);
            matmul(
                MatMut::row_major(d_hidden_block, br, d),
                dz,
                weight.rows_range(v0, bc),
                1.0,
                tile_index > 0,
                Threads::Pool,
            );
            matmul(
                d_weight.reborrow().rows_range(v0, bc),
                dz.t(),
                h,
                1.0,
                block > 0,
                Threads::Pool,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{Level, forced};
    use proptest::prelude::*;

    /// Deterministic values in [-1, 1) from a seed (splitmix64).
    fn values(seed: u64, len: usize) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = state;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                (z >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// One problem: inputs, upstream gradients and the weight's storage layout.
    #[derive(Clone, Debug)]
    struct Case {
        n: usize,
        d: usize,
        vocab: usize,
        hidden: Vec<f32>,
        /// [vocab, d] row-major, or [d, vocab] row-major when `transposed`.
        weight: Vec<f32>,
        transposed: bool,
        targets: Vec<u32>,
        tau: f32,
        d_logprob: Vec<f32>,
        d_entropy: Vec<f32>,
    }

    impl Case {
        #[allow(clippy::too_many_arguments)]
        fn new(
            n: usize,
            d: usize,
            vocab: usize,
            tau: f32,
            scale: f32,
            transposed: bool,
            seed: u64,
        ) -> Self {
            let hidden = values(seed, n * d).iter().map(|v| v * scale).collect();
            let weight = values(seed ^ 0xABCD, vocab * d);
            let targets = values(seed ^ 0x1234, n)
                .iter()
                .map(|v| (((v + 1.0) * 0.5 * vocab as f32) as usize).min(vocab - 1) as u32)
                .collect();
            Case {
                n,
                d,
                vocab,
                hidden,
                weight,
                transposed,
                targets,
                tau,
                d_logprob: values(seed ^ 0x5555, n),
                d_entropy: values(seed ^ 0x7777, n),
            }
        }

        fn h(&self) -> MatRef<'_> {
            MatRef::row_major(&self.hidden, self.n, self.d)
        }

        fn w(&self) -> MatRef<'_> {
            if self.transposed {
                MatRef::row_major(&self.weight, self.d, self.vocab).t()
            } else {
                MatRef::row_major(&self.weight, self.vocab, self.d)
            }
        }

        fn forward(
            &self,
            tiling: Option<Tiling>,
            entropy: bool,
        ) -> (Vec<f32>, Option<Vec<f32>>, Vec<f32>) {
            let mut logprob = vec![f32::NAN; self.n];
            let mut ent = entropy.then(|| vec![f32::NAN; self.n]);
            let mut lse = vec![f32::NAN; self.n];
            let out = Outputs {
                logprob: &mut logprob,
                entropy: ent.as_deref_mut(),
                lse: &mut lse,
            };
            let tiling = tiling.unwrap_or(Tiling::for_shape(self.n, self.vocab));
            forward_tiled(self.h(), self.w(), &self.targets, self.tau, out, tiling);
            (logprob, ent, lse)
        }

        /// (d_hidden, d_weight as a logical [vocab, d] row-major matrix).
        fn backward(
            &self,
            tiling: Option<Tiling>,
            lse: &[f32],
            entropy: bool,
        ) -> (Vec<f32>, Vec<f32>) {
            let (n, d, vocab) = (self.n, self.d, self.vocab);
            let mut d_hidden = vec![f32::NAN; n * d];
            let mut d_weight = vec![f32::NAN; vocab * d];
            let view = if self.transposed {
                MatMut::row_major(&mut d_weight, d, vocab).t()
            } else {
                MatMut::row_major(&mut d_weight, vocab, d)
            };
            let grads = Grads {
                lse,
                d_logprob: &self.d_logprob,
                d_entropy: entropy.then_some(&self.d_entropy[..]),
            };
            let tiling = tiling.unwrap_or(Tiling::for_shape(n, vocab));
            backward_tiled(
                self.h(),
                self.w(),
                &self.targets,
                self.tau,
                grads,
                &mut d_hidden,
                view,
                tiling,
            );
            let logical = if self.transposed {
                let mut l = vec![0.0; vocab * d];
                for j in 0..vocab {
                    for k in 0..d {
                        l[j * d + k] = d_weight[k * vocab + j];
                    }
                }
                l
            } else {
                d_weight
            };
            (d_hidden, logical)
        }
    }

    /// The f64 answer, and how far an f32 kernel may honestly be from it.
    struct Reference {
        logprob: Vec<f64>,
        entropy: Vec<f64>,
        lse: Vec<f64>,
        d_hidden: Vec<f64>,
        d_weight: Vec<f64>,
        /// Per row: 1 + τ·max_j Σ_k |h_ik W_jk|, the scale of the f32 rounding in the logits.
        mag: Vec<f64>,
        tol_d_hidden: Vec<f64>,
        tol_d_weight: Vec<f64>,
    }

    /// Relative precision of the f32 pipeline against the logits' magnitude: a few dozen ulp.
    const EPS: f64 = 5e-7;

    fn reference(c: &Case, entropy_grad: bool) -> Reference {
        let (n, d, vocab) = (c.n, c.d, c.vocab);
        let (h, w) = (c.h(), c.w());
        let tau = c.tau as f64;
        let mut r = Reference {
            logprob: vec![0.0; n],
            entropy: vec![0.0; n],
            lse: vec![0.0; n],
            d_hidden: vec![0.0; n * d],
            d_weight: vec![0.0; vocab * d],
            mag: vec![0.0; n],
            tol_d_hidden: vec![0.0; n * d],
            tol_d_weight: vec![0.0; vocab * d],
        };
        for i in 0..n {
            let mut z = vec![0.0f64; vocab];
            let mut mag = 0.0f64;
            for (j, z) in z.iter_mut().enumerate() {
                let (mut s, mut a) = (0.0, 0.0);
                for k in 0..d {
                    let p = h.at(i, k) as f64 * w.at(j, k) as f64;
                    s += p;
                    a += p.abs();
                }
                *z = tau * s;
                mag = mag.max(tau * a);
            }
            let mag = 1.0 + mag;
            let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + z.iter().map(|z| (z - max).exp()).sum::<f64>().ln();
            let lp: Vec<f64> = z.iter().map(|z| z - lse).collect();
            let p: Vec<f64> = lp.iter().map(|l| l.exp()).collect();
            let ent = -p.iter().zip(&lp).map(|(p, l)| p * l).sum::<f64>();
            let t = c.targets[i] as usize;
            r.logprob[i] = lp[t];
            r.lse[i] = lse;
            r.entropy[i] = ent;
            r.mag[i] = mag;
            let g = c.d_logprob[i] as f64;
            let gh = if entropy_grad {
                c.d_entropy[i] as f64
            } else {
                0.0
            };
            for j in 0..vocab {
                let hit = if j == t { 1.0 } else { 0.0 };
                let dz = tau * (g * (hit - p[j]) - gh * p[j] * (lp[j] + ent));
                // Error budget of this dz: p's relative error is about mag·EPS (from z and lse).
                let err = EPS
                    * mag
                    * tau
                    * (g.abs() * (p[j] + hit) + gh.abs() * p[j] * (1.0 + ent + lp[j].abs()));
                for k in 0..d {
                    let (hk, wk) = (h.at(i, k) as f64, w.at(j, k) as f64);
                    r.d_hidden[i * d + k] += dz * wk;
                    r.d_weight[j * d + k] += dz * hk;
                    r.tol_d_hidden[i * d + k] += err * wk.abs();
                    r.tol_d_weight[j * d + k] += err * hk.abs();
                }
            }
        }
        r
    }

    fn assert_close(what: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let tol = tol(i) + 1e-7;
            assert!(
                (g as f64 - w).abs() <= tol,
                "{what}[{i}]: got {g}, want {w} (tolerance {tol:e})"
            );
        }
    }

    /// Forward and backward of `c` against the f64 reference.
    fn check(c: &Case, tiling: Option<Tiling>, entropy: bool) {
        let r = reference(c, entropy);
        let (logprob, ent, lse) = c.forward(tiling, entropy);
        assert_close("logprob", &logprob, &r.logprob, |i| 2.0 * EPS * r.mag[i]);
        assert_close("lse", &lse, &r.lse, |i| 2.0 * EPS * r.mag[i]);
        match ent {
            Some(e) => assert_close("entropy", &e, &r.entropy, |i| {
                EPS * r.mag[i] * (2.0 + r.entropy[i] + (c.vocab as f64).ln())
            }),
            None => assert!(!entropy),
        }
        let (d_hidden, d_weight) = c.backward(tiling, &lse, entropy);
        assert_close("d_hidden", &d_hidden, &r.d_hidden, |i| r.tol_d_hidden[i]);
        assert_close("d_weight", &d_weight, &r.d_weight, |i| r.tol_d_weight[i]);
    }

    #[test]
    fn one_row_one_tile_matches_the_reference() {
        for transposed in [false, true] {
            let c = Case::new(1, 5, 13, 1.0, 1.0, transposed, 7);
            check(&c, None, true);
            check(&c, None, false);
        }
    }

    #[test]
    fn many_blocks_and_tiles_match_the_reference() {
        for (tau, transposed) in [(0.7, false), (1.0, true), (1.3, false), (1.3, true)] {
            let c = Case::new(11, 9, 37, tau, 1.0, transposed, 11);
            for tiling in [
                Tiling { rows: 3, cols: 8 },
                Tiling { rows: 4, cols: 5 },
                Tiling { rows: 11, cols: 37 },
            ] {
                check(&c, Some(tiling), true);
                check(&c, Some(tiling), false);
            }
        }
    }

    #[test]
    fn extreme_logits_stay_finite_and_match_the_reference() {
        // Logits in the thousands: e^z overflows f32 beyond 88.
        let c = Case::new(7, 8, 29, 1.3, 300.0, true, 3);
        let (_, ent, lse) = c.forward(Some(Tiling { rows: 2, cols: 6 }), true);
        assert!(lse.iter().any(|l| l.abs() > 500.0), "not extreme: {lse:?}");
        assert!(ent.unwrap().iter().chain(&lse).all(|v| v.is_finite()));
        check(&c, Some(Tiling { rows: 2, cols: 6 }), true);
        check(&c, None, true);
    }

    #[test]
    fn the_default_tiling_fits_the_budget_and_keeps_wide_blocks() {
        assert_eq!(
            Tiling::for_shape(2048, 2048),
            Tiling {
                rows: 512,
                cols: 2048
            }
        );
        assert_eq!(
            Tiling::for_shape(512, 49152),
            Tiling {
                rows: 512,
                cols: 2048
            }
        );
        assert_eq!(
            Tiling::for_shape(8, 49152),
            Tiling {
                rows: 8,
                cols: 49152
            }
        );
        assert_eq!(Tiling::for_shape(100, 7), Tiling { rows: 100, cols: 7 });
        assert_eq!(Tiling::for_shape(0, 7), Tiling { rows: 1, cols: 7 });
        for (n, vocab) in [(5000, 49152), (300, 100_000), (1, 1 << 22), (4096, 3000)] {
            let t = Tiling::for_shape(n, vocab);
            assert!(t.rows * t.cols <= TILE_ELEMS, "{n}x{vocab}: {t:?}");
            assert!(t.rows >= MIN_BLOCK_ROWS.min(n), "{n}x{vocab}: {t:?}");
        }
    }

    /// The scalar whose gradient backward computes: Σ g_lp·logprob + g_H·entropy.
    fn loss(c: &Case) -> f64 {
        let (logprob, ent, _) = c.forward(None, true);
        let ent = ent.unwrap();
        (0..c.n)
            .map(|i| {
                c.d_logprob[i] as f64 * logprob[i] as f64 + c.d_entropy[i] as f64 * ent[i] as f64
            })
            .sum()
    }

    #[test]
    fn gradients_match_finite_differences() {
        for transposed in [false, true] {
            let c = Case::new(3, 4, 7, 1.3, 1.0, transposed, 5);
            let (_, _, lse) = c.forward(None, true);
            let (d_hidden, d_weight) = c.backward(Some(Tiling { rows: 2, cols: 3 }), &lse, true);
            let step = 1e-2f32;
            let fd = |perturb: &dyn Fn(&mut Case, f32)| {
                let (mut plus, mut minus) = (c.clone(), c.clone());
                perturb(&mut plus, step);
                perturb(&mut minus, -step);
                (loss(&plus) - loss(&minus)) / (2.0 * step as f64)
            };
            for (i, &got) in d_hidden.iter().enumerate() {
                let want = fd(&|c: &mut Case, s| c.hidden[i] += s);
                let got = got as f64;
                assert!(
                    (got - want).abs() <= 2e-3 * (1.0 + want.abs()),
                    "d_hidden[{i}]: {got} vs {want}"
                );
            }
            for j in 0..c.vocab {
                for k in 0..c.d {
                    let at = if transposed {
                        k * c.vocab + j
                    } else {
                        j * c.d + k
                    };
                    let want = fd(&|c: &mut Case, s| c.weight[at] += s);
                    let got = d_weight[j * c.d + k] as f64;
                    assert!(
                        (got - want).abs() <= 2e-3 * (1.0 + want.abs()),
                        "d_weight[{j},{k}]: {got} vs {want}"
                    );
                }
            }
        }
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn results_are_bit_identical_for_any_thread_count_and_vector_width() {
        let cases = [
            (
                Case::new(200, 48, 1500, 1.3, 2.0, true, 21),
                Some(Tiling {
                    rows: 64,
                    cols: 512,
                }),
            ),
            (Case::new(130, 40, 2000, 0.7, 1.0, false, 22), None),
        ];
        for (c, tiling) in &cases {
            let run = |threads: usize, level| {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                forced::at(level, || {
                    pool.install(|| {
                        let (logprob, ent, lse) = c.forward(*tiling, true);
                        let (dh, dw) = c.backward(*tiling, &lse, true);
                        let (dh0, dw0) = c.backward(*tiling, &lse, false);
                        [logprob, ent.unwrap(), lse, dh, dw, dh0, dw0].map(|v| bits(&v))
                    })
                })
            };
            let one = run(1, Level::Baseline);
            for level in forced::supported() {
                let three = run(3, level);
                for (k, (a, b)) in one.iter().zip(&three).enumerate() {
                    assert!(
                        a == b,
                        "output {k} differs between 1 thread and 3 at {level:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_empty_batch_writes_a_zero_weight_gradient() {
        let c = Case::new(0, 4, 13, 1.0, 1.0, true, 1);
        let (logprob, _, lse) = c.forward(None, true);
        assert!(logprob.is_empty() && lse.is_empty());
        let (d_hidden, d_weight) = c.backward(None, &lse, true);
        assert!(d_hidden.is_empty());
        assert!(d_weight.iter().all(|&x| x == 0.0), "{d_weight:?}");
    }

    #[test]
    #[should_panic(expected = "target 13 at row 1 is not below vocab = 13")]
    fn a_target_past_the_vocabulary_panics() {
        let mut c = Case::new(3, 4, 13, 1.0, 1.0, false, 1);
        c.targets[1] = 13;
        c.forward(None, false);
    }

    #[test]
    #[should_panic(expected = "d_hidden has 11 elements, expected 12")]
    fn a_short_gradient_buffer_panics() {
        let c = Case::new(3, 4, 13, 1.0, 1.0, false, 1);
        let mut d_hidden = vec![0.0; 11];
        let mut d_weight = vec![0.0; 13 * 4];
        backward(
            c.h(),
            c.w(),
            &c.targets,
            1.0,
            &[0.0; 3],
            &[0.0; 3],
            None,
            &mut d_hidden,
            MatMut::row_major(&mut d_weight, 13, 4),
        );
    }

    #[test]
    #[should_panic(expected = "hidden is 3x4 but the weight view is 4x13")]
    fn an_untransposed_linear_weight_panics() {
        let c = Case::new(3, 4, 13, 1.0, 1.0, true, 1);
        let (mut lp, mut lse) = (vec![0.0; 3], vec![0.0; 3]);
        let out = Outputs {
            logprob: &mut lp,
            entropy: None,
            lse: &mut lse,
        };
        forward(
            c.h(),
            MatRef::row_major(&c.weight, 4, 13),
            &c.targets,
            1.0,
            out,
        );
    }

    /// The unfused baseline, as a tensor framework runs it: the whole [n, vocab] log-softmax
    /// materialized in forward and kept for backward (so backward needs no second logits product).
    struct Naive {
        log_softmax: Vec<f32>,
    }

    impl Naive {
        fn forward(
            h: MatRef<'_>,
            w: MatRef<'_>,
            targets: &[u32],
            tau: f32,
            out: Outputs<'_>,
        ) -> Naive {
            let (n, vocab) = (h.rows(), w.rows());
            let mut z = vec![0.0f32; n * vocab];
            matmul(
                MatMut::row_major(&mut z, n, vocab),
                h,
                w.t(),
                tau,
                false,
                Threads::Pool,
            );
            let mut ent = vec![0.0f32; n];
            z.par_chunks_mut(vocab)
                .zip(out.lse.par_iter_mut())
                .zip(ent.par_iter_mut())
                .for_each(|((z, lse), e)| {
                    let max = row_max(z);
                    let sum: f32 = z.iter().map(|&x| exp(x - max)).sum();
                    *lse = max + sum.ln();
                    for x in z.iter_mut() {
                        *x -= *lse;
                    }
                    *e = -z.iter().map(|&l| exp(l) * l).sum::<f32>();
                });
            for (i, lp) in out.logprob.iter_mut().enumerate() {
                *lp = z[i * vocab + targets[i] as usize];
            }
            if let Some(e) = out.entropy {
                e.copy_from_slice(&ent);
            }
            Naive { log_softmax: z }
        }

        #[allow(clippy::too_many_arguments)]
        fn backward(
            &self,
            h: MatRef<'_>,
            w: MatRef<'_>,
            targets: &[u32],
            tau: f32,
            d_logprob: &[f32],
            d_entropy: Option<&[f32]>,
            d_hidden: &mut [f32],
            d_weight: MatMut<'_>,
        ) {
            let (n, d, vocab) = (h.rows(), h.cols(), w.rows());
            let mut dz = vec![0.0f32; n * vocab];
            dz.par_chunks_mut(vocab)
                .zip(self.log_softmax.par_chunks(vocab))
                .enumerate()
                .for_each(|(i, (dz, lp))| {
                    let (g, gh) = (d_logprob[i], d_entropy.map_or(0.0, |e| e[i]));
                    let ent = -lp.iter().map(|&l| exp(l) * l).sum::<f32>();
                    for (dz, &l) in dz.iter_mut().zip(lp) {
                        let p = exp(l);
                        *dz = tau * (-g * p - gh * p * (l + ent));
                    }
                    dz[targets[i] as usize] += tau * g;
                });
            let dz = MatRef::row_major(&dz, n, vocab);
            matmul(
                MatMut::row_major(d_hidden, n, d),
                dz,
                w,
                1.0,
                false,
                Threads::Pool,
            );
            matmul(d_weight, dz.t(), h, 1.0, false, Threads::Pool);
        }
    }

    fn weight_grad_view(dw: &mut [f32], d: usize, vocab: usize, transposed: bool) -> MatMut<'_> {
        if transposed {
            MatMut::row_major(dw, d, vocab).t()
        } else {
            MatMut::row_major(dw, vocab, d)
        }
    }

    /// Forward + backward wall time, fused against unfused (information only).
    /// `cargo test -p agentry-kernels --release logits::tests::timings -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn timings() {
        use std::time::Instant;
        fn best(reps: usize, mut f: impl FnMut() -> (f64, f64)) -> (f64, f64) {
            (0..reps)
                .map(|_| f())
                .fold((f64::MAX, f64::MAX), |a, b| (a.0.min(b.0), a.1.min(b.1)))
        }
        for (n, d, vocab, reps) in [(2048, 128, 2048, 5), (512, 576, 49152, 2)] {
            for transposed in [false, true] {
                let c = Case::new(n, d, vocab, 1.0, 1.0, transposed, 1);
                let mut lp = vec![0.0; n];
                let mut ent = vec![0.0; n];
                let mut lse = vec![0.0; n];
                let mut dh = vec![0.0; n * d];
                let mut dw = vec![0.0; vocab * d];
                for entropy in [false, true] {
                    let g_h = entropy.then_some(&c.d_entropy[..]);
                    let fused = best(reps, || {
                        let t = Instant::now();
                        let out = Outputs {
                            logprob: &mut lp,
                            entropy: entropy.then_some(&mut ent[..]),
                            lse: &mut lse,
                        };
                        forward(c.h(), c.w(), &c.targets, c.tau, out);
                        let f = t.elapsed().as_secs_f64();
                        let t = Instant::now();
                        backward(
                            c.h(),
                            c.w(),
                            &c.targets,
                            c.tau,
                            &lse,
                            &c.d_logprob,
                            g_h,
                            &mut dh,
                            weight_grad_view(&mut dw, d, vocab, transposed),
                        );
                        (f, t.elapsed().as_secs_f64())
                    });
                    let naive = best(reps, || {
                        let t = Instant::now();
                        let out = Outputs {
                            logprob: &mut lp,
                            entropy: entropy.then_some(&mut ent[..]),
                            lse: &mut lse,
                        };
                        let saved = Naive::forward(c.h(), c.w(), &c.targets, c.tau, out);
                        let f = t.elapsed().as_secs_f64();
                        let t = Instant::now();
                        saved.backward(
                            c.h(),
                            c.w(),
                            &c.targets,
                            c.tau,
                            &c.d_logprob,
                            g_h,
                            &mut dh,
                            weight_grad_view(&mut dw, d, vocab, transposed),
                        );
                        (f, t.elapsed().as_secs_f64())
                    });
                    let ms = |s: f64| s * 1e3;
                    println!(
                        "n={n} d={d} vocab={vocab} weight={} entropy={entropy}: fused fwd {:.1} ms + bwd {:.1} ms = {:.1} ms; unfused fwd {:.1} ms + bwd {:.1} ms = {:.1} ms",
                        if transposed {
                            "[d,vocab]^T"
                        } else {
                            "[vocab,d]"
                        },
                        ms(fused.0),
                        ms(fused.1),
                        ms(fused.0 + fused.1),
                        ms(naive.0),
                        ms(naive.1),
                        ms(naive.0 + naive.1)
                    );
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn forward_and_backward_match_the_f64_reference(
            n in prop_oneof![Just(1usize), 2usize..=13],
            d in 1usize..=10,
            vocab in 1usize..=41,
            tau in prop::sample::select(vec![0.7f32, 1.0, 1.3]),
            extreme in any::<bool>(),
            transposed in any::<bool>(),
            entropy in any::<bool>(),
            tiling in prop::option::of((1usize..=5, 1usize..=24)),
            seed in any::<u64>(),
        ) {
            let scale = if extreme { 150.0 } else { 1.0 };
            let c = Case::new(n, d, vocab, tau, scale, transposed, seed);
            check(&c, tiling.map(|(rows, cols)| Tiling { rows, cols }), entropy);
        }
    }
}
