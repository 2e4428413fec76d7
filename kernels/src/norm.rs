//! The element-wise pieces of a Llama-style block, fused: RMSNorm, the SwiGLU product and the
//! rotary position embedding, forward and backward.
//!
//! A tensor framework runs each of these as four to eight passes over memory with a temporary
//! per step; here each is one pass, with the row in cache for any second look at it. Loops are
//! over plain slices so they compile to SIMD, rows are split over rayon, and inputs below 32k
//! elements (`PAR_MIN_ELEMS`) stay on the calling thread: a decode step is too small to repay
//! a fork.
//!
//! Determinism: every output but RMSNorm's `d_gamma` depends only on its own row, so how rows
//! are split cannot change a bit. `d_gamma` sums over rows in blocks of a constant 64 rows
//! (`GAMMA_CHUNK_ROWS`), whose partial sums are added in block order on every path.

use rayon::prelude::*;

use crate::math::{exp, sigmoid};
use crate::simd::{inlined, vectorized};

/// Below this many elements a kernel runs on the calling thread: a rayon fork and join costs a
/// few microseconds, about what 32k elements of these kernels take on one core.
const PAR_MIN_ELEMS: usize = 1 << 15;
/// Elements per rayon task (rounded to whole rows): large enough to amortize scheduling, small
/// enough to balance over a few cores.
const TASK_ELEMS: usize = 1 << 13;
/// Rows per partial sum of RMSNorm's `d_gamma`. Fixed, so the sum's rounding never depends on
/// the thread count.
const GAMMA_CHUNK_ROWS: usize = 64;
/// Independent accumulators in a row reduction: a float sum only vectorizes when written as
/// several interleaved sums (16 lanes fill two AVX or four SSE registers).
const LANES: usize = 16;

/// Whether `elems` elements of work are worth splitting over rayon's threads.
fn go_parallel(elems: usize) -> bool {
    elems >= PAR_MIN_ELEMS && rayon::current_num_threads() > 1
}

/// Rows of width `width` per rayon task, at least one.
fn rows_per_task(width: usize) -> usize {
    (TASK_ELEMS / width.max(1)).max(1)
}

/// Adds the 16 lanes pairwise (shorter dependency chains, a little less rounding).
#[inline(always)]
fn reduce_lanes(acc: [f32; LANES]) -> f32 {
    let mut a = acc;
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            a[i] += a[i + width];
        }
        width /= 2;
    }
    a[0]
}

/// `Σ a_i²`, vectorized.
#[inline(always)]
fn sum_squares(a: &[f32]) -> f32 {
    let chunks = a.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    let mut acc = [0.0f32; LANES];
    for c in chunks {
        for (s, v) in acc.iter_mut().zip(c) {
            *s += v * v;
        }
    }
    reduce_lanes(acc) + tail
}

/// `Σ a_i b_i c_i`, vectorized.
#[inline(always)]
fn dot3(a: &[f32], b: &[f32], c: &[f32]) -> f32 {
    let (ca, cb, cc) = (
        a.chunks_exact(LANES),
        b.chunks_exact(LANES),
        c.chunks_exact(LANES),
    );
    let tail: f32 = (ca.remainder().iter())
        .zip(cb.remainder())
        .zip(cc.remainder())
        .map(|((a, b), c)| a * b * c)
        .sum();
    let mut acc = [0.0f32; LANES];
    for ((a, b), c) in ca.zip(cb).zip(cc) {
        for (((s, a), b), c) in acc.iter_mut().zip(a).zip(b).zip(c) {
            *s += a * b * c;
        }
    }
    reduce_lanes(acc) + tail
}

/// RMSNorm as burn's `RmsNorm` computes it: y = x / sqrt(mean(x²) + eps) · gamma, per row of
/// width d = `gamma.len()`.
///
/// `x`, `y`: `[n, d]`; `gamma`: `[d]`; `inv_rms`: `[n]` (1/sqrt(mean(x²)+eps), saved for
/// backward). The row's mean square is summed in f32 over 16 interleaved lanes; burn divides
/// by the RMS where this multiplies by its reciprocal, so the two agree to a few ulp, not bit
/// for bit.
///
/// # Panics
///
/// If `gamma` is empty or the lengths do not match.
pub fn rms_norm_forward(x: &[f32], gamma: &[f32], eps: f32, y: &mut [f32], inv_rms: &mut [f32]) {
    let d = gamma.len();
    let n = inv_rms.len();
    assert!(d > 0, "rms_norm_forward: gamma is empty (d = 0)");
    assert_eq!(
        x.len(),
        n * d,
        "rms_norm_forward: x has {} elements, expected n·d = {n}·{d} (n from inv_rms, d from gamma)",
        x.len()
    );
    assert_eq!(
        y.len(),
        x.len(),
        "rms_norm_forward: y has {} elements, x has {}",
        y.len(),
        x.len()
    );
    let rows = inlined(
        #[inline(always)]
        |x: &[f32], y: &mut [f32], inv_rms: &mut [f32]| {
            for ((x, y), r) in x.chunks_exact(d).zip(y.chunks_exact_mut(d)).zip(inv_rms) {
                let inv = 1.0 / (sum_squares(x) / d as f32 + eps).sqrt();
                *r = inv;
                for ((y, x), g) in y.iter_mut().zip(x).zip(gamma) {
                    *y = x * inv * g;
                }
            }
        },
    );
    if go_parallel(x.len()) {
        let per = rows_per_task(d);
        (x.par_chunks(per * d))
            .zip(y.par_chunks_mut(per * d))
            .zip(inv_rms.par_chunks_mut(per))
            .for_each(|((x, y), r)| {
                vectorized(
                    #[inline(always)]
                    || rows(x, y, r),
                )
            });
    } else {
        vectorized(
            #[inline(always)]
            || rows(x, y, inv_rms),
        );
    }
}

/// RMSNorm's backward. `dx`: `[n, d]` (overwritten); `d_gamma`: `[d]` (overwritten) =
/// Σ_rows dy ∘ x ∘ inv_rms.
///
/// With r = inv_rms, dx = r·(gamma ∘ dy − x · r²·⟨dy ∘ gamma, x⟩ / d): two looks at each row,
/// one pass over memory. `d_gamma` is summed over blocks of 64 rows (`GAMMA_CHUNK_ROWS`) in
/// parallel, then the blocks in order, so it is the same for any thread count.
///
/// # Panics
///
/// If `gamma` is empty or the lengths do not match.
pub fn rms_norm_backward(
    x: &[f32],
    gamma: &[f32],
    inv_rms: &[f32],
    dy: &[f32],
    dx: &mut [f32],
    d_gamma: &mut [f32],
) {
    let d = gamma.len();
    let n = inv_rms.len();
    assert!(d > 0, "rms_norm_backward: gamma is empty (d = 0)");
    assert_eq!(
        x.len(),
        n * d,
        "rms_norm_backward: x has {} elements, expected n·d = {n}·{d} (n from inv_rms, d from gamma)",
        x.len()
    );
    assert_eq!(
        dy.len(),
        x.len(),
        "rms_norm_backward: dy has {} elements, x has {}",
        dy.len(),
        x.len()
    );
    assert_eq!(
        dx.len(),
        x.len(),
        "rms_norm_backward: dx has {} elements, x has {}",
        dx.len(),
        x.len()
    );
    assert_eq!(
        d_gamma.len(),
        d,
        "rms_norm_backward: d_gamma has {} elements, gamma has {d}",
        d_gamma.len()
    );
    // One block of rows: writes its dx rows, adds its rows' share of d_gamma into `part`.
    let block = inlined(
        #[inline(always)]
        |x: &[f32], dy: &[f32], inv_rms: &[f32], dx: &mut [f32], part: &mut [f32]| {
            let rows = x.chunks_exact(d).zip(dy.chunks_exact(d));
            for (((x, dy), dx), &r) in rows.zip(dx.chunks_exact_mut(d)).zip(inv_rms) {
                let c = r * r * dot3(dy, gamma, x) / d as f32;
                for ((((dx, p), x), dy), g) in
                    dx.iter_mut().zip(part.iter_mut()).zip(x).zip(dy).zip(gamma)
                {
                    *dx = r * (g * dy - x * c);
                    *p += dy * x * r;
                }
            }
        },
    );
    let len = GAMMA_CHUNK_ROWS * d;
    d_gamma.fill(0.0);
    if go_parallel(x.len()) {
        let parts: Vec<Vec<f32>> = (x.par_chunks(len))
            .zip(dy.par_chunks(len))
            .zip(inv_rms.par_chunks(GAMMA_CHUNK_ROWS))
            .zip(dx.par_chunks_mut(len))
            .map(|(((x, dy), r), dx)| {
                let mut part = vec![0.0; d];
                vectorized(
                    #[inline(always)]
                    || block(x, dy, r, dx, &mut part),
                );
                part
            })
            .collect();
        for part in &parts {
            add_assign(d_gamma, part);
        }
    } else {
        let mut part = vec![0.0; d];
        let blocks = x.chunks(len).zip(dy.chunks(len));
        for ((x, dy), (r, dx)) in
            blocks.zip(inv_rms.chunks(GAMMA_CHUNK_ROWS).zip(dx.chunks_mut(len)))
        {
            part.fill(0.0);
            vectorized(
                #[inline(always)]
                || block(x, dy, r, dx, &mut part),
            );
            add_assign(d_gamma, &part);
        }
    }
}

/// `acc += part`, element-wise.
fn add_assign(acc: &mut [f32], part: &[f32]) {
    for (a, p) in acc.iter_mut().zip(part) {
        *a += p;
    }
}

/// Runs `f` over matching pieces of an element-wise kernel's buffers, in parallel when large.
/// Element-wise, so where the pieces are cut cannot change a result.
fn elementwise3(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    f: impl Fn(&[f32], &[f32], &mut [f32]) + Sync,
) {
    if go_parallel(out.len()) {
        (a.par_chunks(TASK_ELEMS))
            .zip(b.par_chunks(TASK_ELEMS))
            .zip(out.par_chunks_mut(TASK_ELEMS))
            .for_each(|((a, b), out)| {
                vectorized(
                    #[inline(always)]
                    || f(a, b, out),
                )
            });
    } else {
        vectorized(
            #[inline(always)]
            || f(a, b, out),
        );
    }
}

/// SwiGLU's product: out = silu(gate) ∘ up, all the same length.
///
/// # Panics
///
/// If the lengths differ.
pub fn swiglu_forward(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu_forward: gate, up and out must have one length, got {}, {} and {}",
        gate.len(),
        up.len(),
        out.len()
    );
    elementwise3(
        gate,
        up,
        out,
        #[inline(always)]
        |gate, up, out| {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                // silu(g) · u, with silu(g) = g / (1 + e^-g) (one division, not two).
                *o = g * u / (1.0 + exp(-g));
            }
        },
    );
}

/// SwiGLU's backward: d_gate = d_out ∘ up ∘ silu'(gate), d_up = d_out ∘ silu(gate)
/// (both overwritten), with silu'(g) = s·(1 + g·(1 − s)), s = sigmoid(g). Recomputes the
/// sigmoid rather than reading a saved silu: one `exp` is cheaper than another buffer's
/// round trip through memory.
///
/// # Panics
///
/// If the lengths differ.
pub fn swiglu_backward(
    gate: &[f32],
    up: &[f32],
    d_out: &[f32],
    d_gate: &mut [f32],
    d_up: &mut [f32],
) {
    let len = gate.len();
    assert!(
        up.len() == len && d_out.len() == len && d_gate.len() == len && d_up.len() == len,
        "swiglu_backward: gate, up, d_out, d_gate and d_up must have one length, got {}, {}, {}, {} and {}",
        len,
        up.len(),
        d_out.len(),
        d_gate.len(),
        d_up.len()
    );
    let run = inlined(
        #[inline(always)]
        |gate: &[f32], up: &[f32], d_out: &[f32], d_gate: &mut [f32], d_up: &mut [f32]| {
            let ins = gate.iter().zip(up).zip(d_out);
            for (((&g, &u), &dout), (dg, du)) in ins.zip(d_gate.iter_mut().zip(d_up.iter_mut())) {
                let s = sigmoid(g);
                *du = dout * g * s;
                *dg = dout * u * s * (1.0 + g * (1.0 - s));
            }
        },
    );
    if go_parallel(len) {
        (gate.par_chunks(TASK_ELEMS))
            .zip(up.par_chunks(TASK_ELEMS))
            .zip(d_out.par_chunks(TASK_ELEMS))
            .zip(d_gate.par_chunks_mut(TASK_ELEMS))
            .zip(d_up.par_chunks_mut(TASK_ELEMS))
            .for_each(|((((g, u), o), dg), du)| {
                vectorized(
                    #[inline(always)]
                    || run(g, u, o, dg, du),
                )
            });
    } else {
        vectorized(
            #[inline(always)]
            || run(gate, up, d_out, d_gate, d_up),
        );
    }
}

/// Rotary position embedding, rotate-half convention (dimension i pairs with i + head_dim/2, as
/// in Llama and SmolLM2), in place on `x`: `[tokens, heads, head_dim]`.
///
/// `cos`, `sin`: `[tokens, head_dim / 2]` (the angle of pair i at that token's position), shared by
/// every head, so queries and keys (with their own head counts) use the same tables. For
/// i < half: x_i' = x_i·cos_i − x_{i+half}·sin_i ; x_{i+half}' = x_{i+half}·cos_i + x_i·sin_i.
/// `inverse` applies the inverse rotation (sin negated): that is also the backward, since the
/// gradient of a rotation is the inverse rotation of the gradient.
///
/// # Panics
///
/// If `heads` or `head_dim` is 0, `head_dim` is odd, or the lengths do not match.
pub fn rope_in_place(
    x: &mut [f32],
    heads: usize,
    head_dim: usize,
    cos: &[f32],
    sin: &[f32],
    inverse: bool,
) {
    assert!(
        heads > 0 && head_dim > 0 && head_dim.is_multiple_of(2),
        "rope_in_place: need heads > 0 and an even head_dim > 0, got heads {heads}, head_dim {head_dim}"
    );
    let row = heads * head_dim;
    let half = head_dim / 2;
    assert!(
        x.len().is_multiple_of(row),
        "rope_in_place: x has {} elements, not a whole number of tokens of heads·head_dim = {heads}·{head_dim}",
        x.len()
    );
    let tokens = x.len() / row;
    assert!(
        cos.len() == tokens * half && sin.len() == tokens * half,
        "rope_in_place: cos and sin must have tokens·head_dim/2 = {tokens}·{half} elements, got {} and {}",
        cos.len(),
        sin.len()
    );
    let run = inlined(
        #[inline(always)]
        |x: &mut [f32], cos: &[f32], sin: &[f32]| {
            for ((x, cos), sin) in x
                .chunks_exact_mut(row)
                .zip(cos.chunks_exact(half))
                .zip(sin.chunks_exact(half))
            {
                for head in x.chunks_exact_mut(head_dim) {
                    let (lo, hi) = head.split_at_mut(half);
                    if inverse {
                        rotate::<true>(lo, hi, cos, sin);
                    } else {
                        rotate::<false>(lo, hi, cos, sin);
                    }
                }
            }
        },
    );
    if go_parallel(x.len()) {
        let per = rows_per_task(row);
        (x.par_chunks_mut(per * row))
            .zip(cos.par_chunks(per * half))
            .zip(sin.par_chunks(per * half))
            .for_each(|((x, c), s)| {
                vectorized(
                    #[inline(always)]
                    || run(x, c, s),
                )
            });
    } else {
        vectorized(
            #[inline(always)]
            || run(x, cos, sin),
        );
    }
}

/// Rotates the pairs (lo_i, hi_i) by the angle with cosine `cos_i` and sine `sin_i`, or by its
/// negative when `INVERSE` (a constant, so each loop is straight-line and vectorizes).
#[inline(always)]
fn rotate<const INVERSE: bool>(lo: &mut [f32], hi: &mut [f32], cos: &[f32], sin: &[f32]) {
    for (((a, b), &c), &s) in lo.iter_mut().zip(hi.iter_mut()).zip(cos).zip(sin) {
        let (x0, x1) = (*a, *b);
        if INVERSE {
            *a = x0 * c + x1 * s;
            *b = x1 * c - x0 * s;
        } else {
            *a = x0 * c - x1 * s;
            *b = x1 * c + x0 * s;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::simd::{Level, forced};
    use crate::test_rng::Rng;

    fn assert_close(what: &str, got: &[f32], want: &[f64], tol: &[f64]) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, ((&g, &w), &t)) in got.iter().zip(want).zip(tol).enumerate() {
            assert!(
                (g as f64 - w).abs() <= t,
                "{what}[{i}]: got {g}, want {w} (tolerance {t:e})"
            );
        }
    }

    // ---- naive f64 references ----

    fn rms_ref(x: &[f32], gamma: &[f32], eps: f32) -> (Vec<f64>, Vec<f64>) {
        let d = gamma.len();
        let mut y = Vec::new();
        let mut inv = Vec::new();
        for row in x.chunks(d) {
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            inv.push(r);
            y.extend(
                row.iter()
                    .zip(gamma)
                    .map(|(&v, &g)| v as f64 * r * g as f64),
            );
        }
        (y, inv)
    }

    /// dx, d_gamma, and per-element tolerances for dx (the two terms of dx can cancel).
    fn rms_backward_ref(
        x: &[f32],
        gamma: &[f32],
        eps: f32,
        dy: &[f32],
    ) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let d = gamma.len();
        let (_, inv) = rms_ref(x, gamma, eps);
        let (mut dx, mut dx_tol) = (Vec::new(), Vec::new());
        let mut dg = vec![0.0f64; d];
        let mut dg_tol = vec![0.0f64; d];
        for ((x, dy), &r) in x.chunks(d).zip(dy.chunks(d)).zip(&inv) {
            let dot: f64 = (0..d)
                .map(|j| dy[j] as f64 * gamma[j] as f64 * x[j] as f64)
                .sum();
            let dot_abs: f64 = (0..d)
                .map(|j| (dy[j] as f64 * gamma[j] as f64 * x[j] as f64).abs())
                .sum();
            for j in 0..d {
                let (xj, gj, dyj) = (x[j] as f64, gamma[j] as f64, dy[j] as f64);
                dx.push(r * (gj * dyj - xj * r * r * dot / d as f64));
                dx_tol.push(
                    1e-5 * r * ((gj * dyj).abs() + (xj * r * r * dot_abs / d as f64).abs()) + 1e-30,
                );
                dg[j] += dyj * xj * r;
                dg_tol[j] += 1e-5 * (dyj * xj * r).abs();
            }
        }
        (dx, dx_tol, dg, dg_tol.iter().map(|t| t + 1e-30).collect())
    }

    fn sigmoid_ref(g: f64) -> f64 {
        1.0 / (1.0 + (-g).exp())
    }

    fn rope_ref(
        x: &[f32],
        heads: usize,
        head_dim: usize,
        cos: &[f32],
        sin: &[f32],
        inverse: bool,
    ) -> Vec<f64> {
        let half = head_dim / 2;
        let sign = if inverse { -1.0 } else { 1.0 };
        let mut out = vec![0.0; x.len()];
        for (t, tok) in x.chunks(heads * head_dim).enumerate() {
            for (h, head) in tok.chunks(head_dim).enumerate() {
                let base = (t * heads + h) * head_dim;
                for i in 0..half {
                    let (c, s) = (cos[t * half + i] as f64, sign * sin[t * half + i] as f64);
                    let (a, b) = (head[i] as f64, head[i + half] as f64);
                    out[base + i] = a * c - b * s;
                    out[base + i + half] = b * c + a * s;
                }
            }
        }
        out
    }

    /// Angle tables for `tokens` positions as a real model builds them (θ = pos · base^(-2i/hd)).
    fn rope_tables(tokens: usize, head_dim: usize, first_pos: usize) -> (Vec<f32>, Vec<f32>) {
        let half = head_dim / 2;
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for t in 0..tokens {
            for i in 0..half {
                let theta =
                    (first_pos + t) as f64 * 10_000f64.powf(-2.0 * i as f64 / head_dim as f64);
                cos.push(theta.cos() as f32);
                sin.push(theta.sin() as f32);
            }
        }
        (cos, sin)
    }

    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&a, &b)| a as f64 * b as f64).sum()
    }

    // ---- against the references ----

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn rms_norm_forward_matches_f64_reference(
            n in 1usize..6,
            d in 1usize..80,
            eps in prop::sample::select(vec![1e-6f32, 1e-5, 1e-2, 0.5]),
            scale in prop::sample::select(vec![1e-3f32, 1.0, 30.0]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let (x, gamma) = (rng.vec(n * d, scale), rng.vec(d, 2.0));
            let (mut y, mut inv) = (vec![f32::NAN; n * d], vec![f32::NAN; n]);
            rms_norm_forward(&x, &gamma, eps, &mut y, &mut inv);
            let (y_ref, inv_ref) = rms_ref(&x, &gamma, eps);
            let tol: Vec<f64> = y_ref.iter().map(|v| 1e-6 * v.abs() + 1e-30).collect();
            assert_close("y", &y, &y_ref, &tol);
            let tol: Vec<f64> = inv_ref.iter().map(|v| 1e-6 * v).collect();
            assert_close("inv_rms", &inv, &inv_ref, &tol);
        }

        #[test]
        fn rms_norm_backward_matches_f64_reference(
            n in 1usize..6,
            d in 1usize..80,
            eps in prop::sample::select(vec![1e-6f32, 1e-5, 1e-2, 0.5]),
            scale in prop::sample::select(vec![1e-2f32, 1.0, 30.0]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let (x, gamma, dy) = (rng.vec(n * d, scale), rng.vec(d, 2.0), rng.vec(n * d, 1.0));
            let (mut y, mut inv) = (vec![0.0; n * d], vec![0.0; n]);
            rms_norm_forward(&x, &gamma, eps, &mut y, &mut inv);
            let (mut dx, mut dg) = (vec![f32::NAN; n * d], vec![f32::NAN; d]);
            rms_norm_backward(&x, &gamma, &inv, &dy, &mut dx, &mut dg);
            let (dx_ref, dx_tol, dg_ref, dg_tol) = rms_backward_ref(&x, &gamma, eps, &dy);
            assert_close("dx", &dx, &dx_ref, &dx_tol);
            assert_close("d_gamma", &dg, &dg_ref, &dg_tol);
        }

        #[test]
        fn swiglu_forward_matches_f64_reference(
            len in 0usize..200,
            scale in prop::sample::select(vec![0.1f32, 4.0, 100.0]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let (gate, up) = (rng.vec(len, scale), rng.vec(len, 3.0));
            let mut out = vec![f32::NAN; len];
            swiglu_forward(&gate, &up, &mut out);
            let want: Vec<f64> = (gate.iter().zip(&up))
                .map(|(&g, &u)| g as f64 * sigmoid_ref(g as f64) * u as f64)
                .collect();
            let tol: Vec<f64> = want.iter().map(|w| 2e-6 * w.abs() + 1e-30).collect();
            assert_close("out", &out, &want, &tol);
        }

        #[test]
        fn swiglu_backward_matches_f64_reference(
            len in 0usize..200,
            scale in prop::sample::select(vec![0.1f32, 4.0, 100.0]),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let (gate, up, d_out) = (rng.vec(len, scale), rng.vec(len, 3.0), rng.vec(len, 1.0));
            let (mut dg, mut du) = (vec![f32::NAN; len], vec![f32::NAN; len]);
            swiglu_backward(&gate, &up, &d_out, &mut dg, &mut du);
            let (mut dg_ref, mut dg_tol, mut du_ref, mut du_tol) = (vec![], vec![], vec![], vec![]);
            for ((&g, &u), &o) in gate.iter().zip(&up).zip(&d_out) {
                let (g, u, o) = (g as f64, u as f64, o as f64);
                let s = sigmoid_ref(g);
                du_ref.push(o * g * s);
                du_tol.push(4e-6 * (o * g * s).abs() + 1e-30);
                dg_ref.push(o * u * s * (1.0 + g * (1.0 - s)));
                // 1 + g(1 - s) cancels near g ≈ -1.28: tolerance from its terms.
                dg_tol.push(4e-6 * (o * u * s).abs() * (1.0 + (g * (1.0 - s)).abs()) + 1e-30);
            }
            assert_close("d_up", &du, &du_ref, &du_tol);
            assert_close("d_gate", &dg, &dg_ref, &dg_tol);
        }

        #[test]
        fn rope_matches_f64_reference(
            tokens in 1usize..5,
            heads in 1usize..=9,
            head_dim in prop::sample::select(vec![2usize, 6, 64]),
            first_pos in 0usize..2048,
            inverse in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let x = rng.vec(tokens * heads * head_dim, 2.0);
            let (cos, sin) = rope_tables(tokens, head_dim, first_pos);
            let mut got = x.clone();
            rope_in_place(&mut got, heads, head_dim, &cos, &sin, inverse);
            let want = rope_ref(&x, heads, head_dim, &cos, &sin, inverse);
            let tol = vec![1e-6; want.len()];
            assert_close("rope", &got, &want, &tol);
        }

        #[test]
        fn rope_inverse_undoes_forward(
            tokens in 1usize..5,
            heads in 1usize..=9,
            head_dim in prop::sample::select(vec![2usize, 6, 64]),
            first_pos in 0usize..2048,
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let x = rng.vec(tokens * heads * head_dim, 1.0);
            let (cos, sin) = rope_tables(tokens, head_dim, first_pos);
            let mut y = x.clone();
            rope_in_place(&mut y, heads, head_dim, &cos, &sin, false);
            prop_assert!(y != x || first_pos == 0);
            rope_in_place(&mut y, heads, head_dim, &cos, &sin, true);
            for (a, b) in y.iter().zip(&x) {
                prop_assert!((a - b).abs() <= 1e-6, "{a} vs {b}");
            }
        }

        /// The backward (the inverse rotation) is the forward's transpose: ⟨R x, y⟩ = ⟨x, Rᵀ y⟩.
        #[test]
        fn rope_backward_is_transpose_of_forward(
            tokens in 1usize..5,
            heads in 1usize..=9,
            head_dim in prop::sample::select(vec![2usize, 6, 64]),
            first_pos in 0usize..2048,
            seed in any::<u64>(),
        ) {
            let mut rng = Rng(seed);
            let len = tokens * heads * head_dim;
            let (x, y) = (rng.vec(len, 1.0), rng.vec(len, 1.0));
            let (cos, sin) = rope_tables(tokens, head_dim, first_pos);
            let (mut rx, mut rty) = (x.clone(), y.clone());
            rope_in_place(&mut rx, heads, head_dim, &cos, &sin, false);
            rope_in_place(&mut rty, heads, head_dim, &cos, &sin, true);
            let (lhs, rhs) = (dot64(&rx, &y), dot64(&x, &rty));
            prop_assert!((lhs - rhs).abs() <= 1e-5 * (len as f64).sqrt(), "{lhs} vs {rhs}");
        }
    }

    /// Several `d_gamma` blocks, ragged last block, on the sequential (1 thread, or below the
    /// threshold) and the parallel path.
    #[test]
    fn rms_norm_backward_matches_f64_reference_over_many_row_blocks() {
        let mut rng = Rng(3);
        for (n, d, threads) in [(150, 7, 3), (300, 130, 1), (300, 130, 3)] {
            let (x, gamma, dy) = (rng.vec(n * d, 2.0), rng.vec(d, 2.0), rng.vec(n * d, 1.0));
            let (dx, dg) = in_pool(threads, || {
                let (mut y, mut inv) = (vec![0.0; n * d], vec![0.0; n]);
                rms_norm_forward(&x, &gamma, 1e-5, &mut y, &mut inv);
                let (mut dx, mut dg) = (vec![f32::NAN; n * d], vec![f32::NAN; d]);
                rms_norm_backward(&x, &gamma, &inv, &dy, &mut dx, &mut dg);
                (dx, dg)
            });
            let (dx_ref, dx_tol, dg_ref, dg_tol) = rms_backward_ref(&x, &gamma, 1e-5, &dy);
            assert_close("dx", &dx, &dx_ref, &dx_tol);
            assert_close("d_gamma", &dg, &dg_ref, &dg_tol);
        }
    }

    #[test]
    fn rms_norm_of_a_zero_row_is_zero_with_finite_gradient() {
        let (x, gamma) = (vec![0.0f32; 8], vec![1.5f32; 4]);
        let (mut y, mut inv) = (vec![f32::NAN; 8], vec![f32::NAN; 2]);
        rms_norm_forward(&x, &gamma, 1e-5, &mut y, &mut inv);
        assert!(y.iter().all(|&v| v == 0.0));
        assert_eq!(inv, vec![1.0 / 1e-5f32.sqrt(); 2]);
        let dy = vec![1.0f32; 8];
        let (mut dx, mut dg) = (vec![f32::NAN; 8], vec![f32::NAN; 4]);
        rms_norm_backward(&x, &gamma, &inv, &dy, &mut dx, &mut dg);
        assert!(dx.iter().all(|&v| v == 1.5 * inv[0]), "{dx:?}");
        assert!(dg.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn swiglu_saturates_without_nan() {
        let gate = [-1e4f32, -200.0, -90.0, 90.0, 200.0, 1e4];
        let up = [2.0f32; 6];
        let mut out = [f32::NAN; 6];
        swiglu_forward(&gate, &up, &mut out);
        assert_eq!(&out[..3], &[0.0; 3]);
        assert_eq!(&out[3..], &[180.0, 400.0, 2e4]);
        let (mut dg, mut du) = ([f32::NAN; 6], [f32::NAN; 6]);
        swiglu_backward(&gate, &up, &[1.0; 6], &mut dg, &mut du);
        assert_eq!(dg, [0.0, 0.0, 0.0, 2.0, 2.0, 2.0]);
        assert_eq!(du, [0.0, 0.0, 0.0, 90.0, 200.0, 1e4]);
    }

    // ---- finite differences ----

    /// Central difference of `loss` at `v[i]`, in f64 of the f32 kernel's outputs.
    fn numeric_grad(v: &mut [f32], i: usize, h: f32, loss: &mut dyn FnMut(&[f32]) -> f64) -> f64 {
        let orig = v[i];
        v[i] = orig + h;
        let up = loss(v);
        v[i] = orig - h;
        let down = loss(v);
        v[i] = orig;
        (up - down) / (2.0 * h as f64)
    }

    fn check_grad(what: &str, analytic: &[f32], numeric: &[f64]) {
        for (i, (&a, &n)) in analytic.iter().zip(numeric).enumerate() {
            assert!(
                (a as f64 - n).abs() <= 2e-3 * (1.0 + n.abs()),
                "{what}[{i}]: analytic {a}, finite difference {n}"
            );
        }
    }

    #[test]
    fn rms_norm_backward_matches_finite_differences() {
        let mut rng = Rng(7);
        for (n, d, eps) in [(1, 1, 1e-5f32), (2, 3, 1e-5), (3, 5, 0.1), (1, 8, 1e-6)] {
            let (mut x, mut gamma, w) = (rng.vec(n * d, 1.5), rng.vec(d, 2.0), rng.vec(n * d, 1.0));
            // Loss ⟨w, y⟩, so dy = w.
            let loss = |x: &[f32], gamma: &[f32]| {
                let (mut y, mut inv) = (vec![0.0; n * d], vec![0.0; n]);
                rms_norm_forward(x, gamma, eps, &mut y, &mut inv);
                dot64(&y, &w)
            };
            let (mut y, mut inv) = (vec![0.0; n * d], vec![0.0; n]);
            rms_norm_forward(&x, &gamma, eps, &mut y, &mut inv);
            let (mut dx, mut dg) = (vec![0.0; n * d], vec![0.0; d]);
            rms_norm_backward(&x, &gamma, &inv, &w, &mut dx, &mut dg);
            let g2 = gamma.clone();
            let num_dx: Vec<f64> = (0..n * d)
                .map(|i| numeric_grad(&mut x, i, 1e-3, &mut |x| loss(x, &g2)))
                .collect();
            let x2 = x.clone();
            let num_dg: Vec<f64> = (0..d)
                .map(|i| numeric_grad(&mut gamma, i, 1e-3, &mut |g| loss(&x2, g)))
                .collect();
            check_grad("dx", &dx, &num_dx);
            check_grad("d_gamma", &dg, &num_dg);
        }
    }

    #[test]
    fn swiglu_backward_matches_finite_differences() {
        let mut rng = Rng(11);
        let len = 9;
        let mut gate = rng.vec(len, 4.0);
        gate[0] = -1.278; // near silu's minimum, where silu' crosses 0
        let (mut up, w) = (rng.vec(len, 2.0), rng.vec(len, 1.0));
        let loss = |gate: &[f32], up: &[f32]| {
            let mut out = vec![0.0; len];
            swiglu_forward(gate, up, &mut out);
            dot64(&out, &w)
        };
        let (mut dg, mut du) = (vec![0.0; len], vec![0.0; len]);
        swiglu_backward(&gate, &up, &w, &mut dg, &mut du);
        let u2 = up.clone();
        let num_dg: Vec<f64> = (0..len)
            .map(|i| numeric_grad(&mut gate, i, 1e-3, &mut |g| loss(g, &u2)))
            .collect();
        let g2 = gate.clone();
        let num_du: Vec<f64> = (0..len)
            .map(|i| numeric_grad(&mut up, i, 1e-3, &mut |u| loss(&g2, u)))
            .collect();
        check_grad("d_gate", &dg, &num_dg);
        check_grad("d_up", &du, &num_du);
    }

    #[test]
    fn rope_backward_matches_finite_differences() {
        let mut rng = Rng(13);
        for (tokens, heads, head_dim) in [(1, 1, 2), (2, 3, 6), (3, 2, 4)] {
            let len = tokens * heads * head_dim;
            let (mut x, w) = (rng.vec(len, 1.0), rng.vec(len, 1.0));
            let (cos, sin) = rope_tables(tokens, head_dim, 5);
            let mut loss = |x: &[f32]| {
                let mut y = x.to_vec();
                rope_in_place(&mut y, heads, head_dim, &cos, &sin, false);
                dot64(&y, &w)
            };
            let mut dx = w.clone();
            rope_in_place(&mut dx, heads, head_dim, &cos, &sin, true);
            let num: Vec<f64> = (0..len)
                .map(|i| numeric_grad(&mut x, i, 1e-2, &mut loss))
                .collect();
            check_grad("dx", &dx, &num);
        }
    }

    // ---- determinism ----

    fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Runs every kernel on inputs above the parallel threshold (row counts that are not
    /// multiples of any chunk) and returns all outputs' bits.
    fn all_outputs() -> Vec<Vec<u32>> {
        let mut rng = Rng(42);
        let (n, d) = (1000, 130);
        let (x, gamma, dy) = (rng.vec(n * d, 2.0), rng.vec(d, 1.0), rng.vec(n * d, 1.0));
        let (mut y, mut inv) = (vec![0.0; n * d], vec![0.0; n]);
        rms_norm_forward(&x, &gamma, 1e-5, &mut y, &mut inv);
        let (mut dx, mut dg) = (vec![0.0; n * d], vec![0.0; d]);
        rms_norm_backward(&x, &gamma, &inv, &dy, &mut dx, &mut dg);
        let len = 70_001;
        let (gate, up, d_out) = (rng.vec(len, 5.0), rng.vec(len, 1.0), rng.vec(len, 1.0));
        let mut out = vec![0.0; len];
        swiglu_forward(&gate, &up, &mut out);
        let (mut d_gate, mut d_up) = (vec![0.0; len], vec![0.0; len]);
        swiglu_backward(&gate, &up, &d_out, &mut d_gate, &mut d_up);
        let (tokens, heads, head_dim) = (301, 9, 64);
        let (cos, sin) = rope_tables(tokens, head_dim, 3);
        let mut q = rng.vec(tokens * heads * head_dim, 1.0);
        rope_in_place(&mut q, heads, head_dim, &cos, &sin, false);
        let mut k = q.clone();
        rope_in_place(&mut k, heads, head_dim, &cos, &sin, true);
        [y, inv, dx, dg, out, d_gate, d_up, q, k]
            .iter()
            .map(|v| bits(v))
            .collect()
    }

    #[test]
    fn kernels_are_bit_identical_across_thread_counts_and_vector_widths() {
        // One thread takes the sequential path, three the parallel one.
        let one = forced::at(Level::Baseline, || in_pool(1, all_outputs));
        for level in forced::supported() {
            let three = forced::at(level, || in_pool(3, all_outputs));
            for (i, (a, b)) in one.iter().zip(&three).enumerate() {
                assert!(
                    a == b,
                    "output {i} differs between 1 thread and 3 at {level:?}"
                );
            }
        }
    }

    // ---- length checks ----

    #[test]
    #[should_panic(expected = "rms_norm_forward: x has 7 elements")]
    fn rms_norm_forward_rejects_ragged_x() {
        rms_norm_forward(&[0.0; 7], &[1.0; 4], 1e-5, &mut [0.0; 7], &mut [0.0; 2]);
    }

    #[test]
    #[should_panic(expected = "rms_norm_backward: d_gamma has 3 elements")]
    fn rms_norm_backward_rejects_wrong_d_gamma() {
        rms_norm_backward(
            &[0.0; 8],
            &[1.0; 4],
            &[1.0; 2],
            &[0.0; 8],
            &mut [0.0; 8],
            &mut [0.0; 3],
        );
    }

    #[test]
    #[should_panic(
        expected = "swiglu_backward: gate, up, d_out, d_gate and d_up must have one length"
    )]
    fn swiglu_backward_rejects_mismatched_lengths() {
        swiglu_backward(
            &[0.0; 4],
            &[0.0; 4],
            &[0.0; 4],
            &mut [0.0; 4],
            &mut [0.0; 5],
        );
    }

    #[test]
    #[should_panic(expected = "rope_in_place: cos and sin must have")]
    fn rope_rejects_short_tables() {
        rope_in_place(&mut [0.0; 24], 2, 6, &[1.0; 6], &[0.0; 5], false);
    }

    #[test]
    #[should_panic(expected = "even head_dim")]
    fn rope_rejects_odd_head_dim() {
        rope_in_place(&mut [0.0; 6], 2, 3, &[1.0; 1], &[0.0; 1], false);
    }

    // ---- timings (information only) ----

    /// A tensor framework's version: one pass and one temporary per operation.
    mod naive {
        pub fn rms_forward(x: &[f32], gamma: &[f32], eps: f32, y: &mut [f32], inv: &mut [f32]) {
            let d = gamma.len();
            let sq: Vec<f32> = x.iter().map(|v| v * v).collect();
            let ms: Vec<f32> = sq
                .chunks(d)
                .map(|r| r.iter().sum::<f32>() / d as f32)
                .collect();
            let rms: Vec<f32> = ms.iter().map(|m| (m + eps).sqrt()).collect();
            let xn: Vec<f32> = x
                .chunks(d)
                .zip(&rms)
                .flat_map(|(r, s)| r.iter().map(move |v| v / s))
                .collect();
            for (i, (y, v)) in y.iter_mut().zip(&xn).enumerate() {
                *y = v * gamma[i % d];
            }
            for (i, r) in inv.iter_mut().zip(&rms) {
                *i = 1.0 / r;
            }
        }

        pub fn rms_backward(
            x: &[f32],
            gamma: &[f32],
            inv: &[f32],
            dy: &[f32],
            dx: &mut [f32],
            dg: &mut [f32],
        ) {
            let d = gamma.len();
            let t: Vec<f32> = dy
                .iter()
                .enumerate()
                .map(|(i, v)| v * gamma[i % d])
                .collect();
            let tx: Vec<f32> = t.iter().zip(x).map(|(a, b)| a * b).collect();
            let dot: Vec<f32> = tx.chunks(d).map(|r| r.iter().sum()).collect();
            let c: Vec<f32> = dot
                .iter()
                .zip(inv)
                .map(|(s, r)| s * r * r * r / d as f32)
                .collect();
            let a: Vec<f32> = t.iter().enumerate().map(|(i, v)| v * inv[i / d]).collect();
            let b: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * c[i / d]).collect();
            for ((o, a), b) in dx.iter_mut().zip(&a).zip(&b) {
                *o = a - b;
            }
            let xn: Vec<f32> = x.iter().enumerate().map(|(i, v)| v * inv[i / d]).collect();
            let p: Vec<f32> = xn.iter().zip(dy).map(|(a, b)| a * b).collect();
            dg.fill(0.0);
            for row in p.chunks(d) {
                for (g, v) in dg.iter_mut().zip(row) {
                    *g += v;
                }
            }
        }

        fn sigmoid(g: &[f32]) -> Vec<f32> {
            g.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect()
        }

        pub fn swiglu_forward(gate: &[f32], up: &[f32], out: &mut [f32]) {
            let s = sigmoid(gate);
            let silu: Vec<f32> = s.iter().zip(gate).map(|(a, b)| a * b).collect();
            for ((o, a), b) in out.iter_mut().zip(&silu).zip(up) {
                *o = a * b;
            }
        }

        pub fn swiglu_backward(
            gate: &[f32],
            up: &[f32],
            d_out: &[f32],
            dg: &mut [f32],
            du: &mut [f32],
        ) {
            let s = sigmoid(gate);
            let silu: Vec<f32> = s.iter().zip(gate).map(|(a, b)| a * b).collect();
            for ((o, a), b) in du.iter_mut().zip(&silu).zip(d_out) {
                *o = a * b;
            }
            let one_minus: Vec<f32> = s.iter().map(|v| 1.0 - v).collect();
            let inner: Vec<f32> = one_minus
                .iter()
                .zip(gate)
                .map(|(a, b)| 1.0 + a * b)
                .collect();
            let dsilu: Vec<f32> = inner.iter().zip(&s).map(|(a, b)| a * b).collect();
            let t: Vec<f32> = d_out.iter().zip(up).map(|(a, b)| a * b).collect();
            for ((o, a), b) in dg.iter_mut().zip(&t).zip(&dsilu) {
                *o = a * b;
            }
        }

        pub fn rope(x: &mut [f32], heads: usize, head_dim: usize, cos: &[f32], sin: &[f32]) {
            let half = head_dim / 2;
            let row = heads * head_dim;
            let full = |t: &[f32]| -> Vec<f32> {
                (0..x.len())
                    .map(|i| t[(i / row) * half + (i % head_dim) % half])
                    .collect()
            };
            let (cf, sf) = (full(cos), full(sin));
            let rot: Vec<f32> = (0..x.len())
                .map(|i| {
                    if i % head_dim < half {
                        -x[i + half]
                    } else {
                        x[i - half]
                    }
                })
                .collect();
            let a: Vec<f32> = x.iter().zip(&cf).map(|(a, b)| a * b).collect();
            let b: Vec<f32> = rot.iter().zip(&sf).map(|(a, b)| a * b).collect();
            for ((o, a), b) in x.iter_mut().zip(&a).zip(&b) {
                *o = a + b;
            }
        }
    }

    /// Median and fastest wall time of `reps` calls, in microseconds (on a shared machine the
    /// fastest is the better estimate of the kernel's own cost).
    fn time_us(reps: usize, mut f: impl FnMut()) -> (f64, f64) {
        f();
        let mut t: Vec<f64> = (0..reps)
            .map(|_| {
                let start = std::time::Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        t.sort_by(f64::total_cmp);
        (t[reps / 2], t[0])
    }

    fn report(label: &str, fused: (f64, f64), naive: (f64, f64)) {
        println!(
            "{label:<18} fused {:>8.1} µs (min {:>8.1})   naive {:>8.1} µs (min {:>8.1})   ×{:.1}",
            fused.0,
            fused.1,
            naive.0,
            naive.1,
            naive.0 / fused.0
        );
    }

    fn time_all(n: usize, d: usize, ffn: usize, heads: usize, head_dim: usize, reps: usize) {
        println!(
            "-- n = {n}, d = {d}, ffn = {ffn}, rope {heads}×{head_dim}, {} threads",
            rayon::current_num_threads()
        );
        let mut rng = Rng(1);
        let (x, gamma, dy) = (rng.vec(n * d, 2.0), rng.vec(d, 1.0), rng.vec(n * d, 1.0));
        let (mut y, mut inv) = (vec![0.0; n * d], vec![0.0; n]);
        let (mut dx, mut dg) = (vec![0.0; n * d], vec![0.0; d]);
        let f = time_us(reps, || {
            rms_norm_forward(&x, &gamma, 1e-5, &mut y, &mut inv)
        });
        let s = time_us(reps, || {
            naive::rms_forward(&x, &gamma, 1e-5, &mut y, &mut inv)
        });
        report("rms_norm_forward", f, s);
        let f = time_us(reps, || {
            rms_norm_backward(&x, &gamma, &inv, &dy, &mut dx, &mut dg)
        });
        let s = time_us(reps, || {
            naive::rms_backward(&x, &gamma, &inv, &dy, &mut dx, &mut dg)
        });
        report("rms_norm_backward", f, s);
        let len = n * ffn;
        let (gate, up, d_out) = (rng.vec(len, 4.0), rng.vec(len, 1.0), rng.vec(len, 1.0));
        let (mut out, mut d_gate, mut d_up) = (vec![0.0; len], vec![0.0; len], vec![0.0; len]);
        let f = time_us(reps, || swiglu_forward(&gate, &up, &mut out));
        let s = time_us(reps, || naive::swiglu_forward(&gate, &up, &mut out));
        report("swiglu_forward", f, s);
        let f = time_us(reps, || {
            swiglu_backward(&gate, &up, &d_out, &mut d_gate, &mut d_up)
        });
        let s = time_us(reps, || {
            naive::swiglu_backward(&gate, &up, &d_out, &mut d_gate, &mut d_up)
        });
        report("swiglu_backward", f, s);
        let (cos, sin) = rope_tables(n, head_dim, 0);
        let mut q = rng.vec(n * heads * head_dim, 1.0);
        let f = time_us(reps, || {
            rope_in_place(&mut q, heads, head_dim, &cos, &sin, false)
        });
        let s = time_us(reps, || naive::rope(&mut q, heads, head_dim, &cos, &sin));
        report("rope_in_place", f, s);
    }

    /// `cargo test -p agentry-kernels --release norm::tests::timings -- --ignored --nocapture`
    #[test]
    #[ignore = "timings, information only"]
    fn timings() {
        time_all(4096, 128, 512, 4, 32, 31);
        in_pool(1, || time_all(4096, 128, 512, 4, 32, 31));
        // A decode step of SmolLM2: sequential path.
        time_all(16, 576, 1536, 9, 64, 201);
    }
}
