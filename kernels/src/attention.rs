//! Scaled-dot-product attention, forward and backward, tiled in the manner of FlashAttention-2:
//! scores are computed one `BLOCK_Q × BLOCK_K` tile at a time and folded into an online softmax,
//! so no `[q_len, kv_len]` matrix is ever materialized (a training batch of 16 × 4 heads × 256²
//! scores would be 16 MiB per pass, re-read several times; a tile stays in L1/L2).
//!
//! Layouts are the model's natural ones, so the caller never transposes: `q`, `out`, `d_out` are
//! `[batch, q_len, heads, head_dim]`, `k`, `v` (and `dk`, `dv`) are
//! `[batch, kv_capacity, kv_heads, head_dim]` (a preallocated KV cache of which the first
//! `kv_len` rows are in use), `lse` is `[batch, heads, q_len]`. Grouped-query attention reads kv
//! head `h / (heads / kv_heads)` for query head `h`, without repeating k and v.
//!
//! Masking: a causal mask aligned bottom-right (query `i` sits at position
//! `kv_len - q_len + i`, so a decode step of `q_len = 1` against a cache sees the whole cache),
//! and per batch row a left-padding start `key_start[b]` before which keys are hidden. Together
//! they make every query's visible keys one interval `key_start[b]..hi(i)`, so a tile's mask is
//! a per-row prefix length, never a stored matrix.
//!
//! A query that sees no key outputs zeros and its log-sum-exp is stored as `+inf` (the log-mass
//! of no key is really `-inf`, but `+inf` makes `exp(s - lse)` zero for any finite score, so
//! recomputed probabilities vanish even where a caller forgets the mask). Its gradients are zero.
//!
//! Parallelism and determinism: rayon splits work over independent outputs only — the forward
//! pass over (batch, kv head, query block), the backward pass over (batch, kv head) — and each
//! task reduces in a fixed order with single-threaded products, so results are bit-identical
//! for any thread count. A query task takes the block's rows of every query head of its kv
//! head at once: they share each key tile, so a decode step (one query per head) multiplies
//! `heads / kv_heads` rows per product instead of one, and reads each kv row once. Its tasks
//! are `batch × kv_heads`. The backward pass recomputes the probabilities from `lse` instead
//! of storing them, once per tile: a task owns one kv head's `dk`, `dv` and the `dq` of its
//! group's queries, walks the key blocks in order, accumulates each block's `dk`, `dv` over
//! every query block that sees it and adds the same tiles' share into `dq`. FlashAttention-2
//! instead adds into `dq` atomically (not deterministic) or, as this kernel did before, runs a
//! second pass per query block that computes every tile's probabilities and score gradients
//! again: two of seven tile products and half the `exp`s (30% of the backward pass at
//! `head_dim` 32). The price is parallelism: `batch × kv_heads` tasks, 24 or more in
//! the training steps measured, which keeps two to eight threads busy.

use rayon::prelude::*;

use crate::math::exp;
use crate::matmul::{MatMut, MatRef, Threads, matmul};
use crate::simd::vectorized;

/// Sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Independent sequences.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads; divides `heads`. Query head `h` reads kv head `h / (heads / kv_heads)`.
    pub kv_heads: usize,
    /// Queries per batch row.
    pub q_len: usize,
    /// Keys in use per batch row.
    pub kv_len: usize,
    /// Rows allocated per batch row in `k`/`v` (>= kv_len): a preallocated KV cache; rows at and
    /// past kv_len are ignored.
    pub kv_capacity: usize,
    /// Features per head.
    pub head_dim: usize,
}

/// Which keys each query may see.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mask<'a> {
    /// Query `i` sits at position `kv_len - q_len + i` and sees keys `j <=` that position
    /// (bottom-right aligned). When false, every query sees every key in use.
    pub causal: bool,
    /// Per batch row, keys `j < key_start[b]` are hidden from every query (left padding).
    /// `None`: none hidden.
    pub key_start: Option<&'a [usize]>,
}

/// Query positions per tile, per head (a task holds this many of each head of a kv group).
const BLOCK_Q: usize = 64;
/// Keys per tile (and per `dk`/`dv` task). With 64-row operands gemm runs near its peak (about
/// 5× its one-row speed here); a `3 · 64 × 64` score tile (SmolLM2's group of 3) is 48 KiB and
/// stays in L2 next to its operands.
const BLOCK_K: usize = 64;

/// Tile sizes; tests shrink them to exercise tile edges on small inputs.
#[derive(Clone, Copy, Debug)]
struct Blocks {
    q: usize,
    k: usize,
}

const BLOCKS: Blocks = Blocks {
    q: BLOCK_Q,
    k: BLOCK_K,
};

/// out = softmax(scale · q kᵀ + mask) v, and per query the log-sum-exp of its scaled visible
/// scores (what backward needs).
///
/// q, out: `[batch, q_len, heads, head_dim]`; k, v: `[batch, kv_capacity, kv_heads, head_dim]`;
/// lse: `[batch, heads, q_len]`. A query that sees no key (all its keys are left padding, or,
/// causal with `q_len > kv_len`, it sits before position 0) gets `out = 0` and `lse = +inf`.
///
/// # Panics
///
/// If a slice's length does not match `shape`, `kv_heads` does not divide `heads`,
/// `kv_len > kv_capacity`, `head_dim` is 0, or `key_start` has not `batch` entries.
#[allow(clippy::too_many_arguments)]
pub fn forward(
    shape: Shape,
    mask: Mask<'_>,
    scale: f32,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
) {
    forward_blocked(BLOCKS, shape, mask, scale, q, k, v, out, lse);
}

/// Gradients of [`forward`]'s `out` with respect to q, k, v given d_out (same layout as out).
/// dq like q; dk, dv like k, v (`[batch, kv_capacity, kv_heads, head_dim]`; rows past kv_len set
/// to 0). All three are overwritten, not accumulated. `out` and `lse` are `forward`'s.
///
/// # Panics
///
/// As [`forward`], for every slice.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    shape: Shape,
    mask: Mask<'_>,
    scale: f32,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    d_out: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    backward_blocked(
        BLOCKS, shape, mask, scale, q, k, v, out, lse, d_out, dq, dk, dv,
    );
}

/// Element counts of the three layouts (q-like, kv-like, lse-like), after checking that the
/// shape and mask are consistent.
fn check_shape(shape: &Shape, mask: &Mask<'_>) -> (usize, usize, usize) {
    let Shape {
        batch,
        heads,
        kv_heads,
        q_len,
        kv_len,
        kv_capacity,
        head_dim,
    } = *shape;
    assert!(
        heads > 0 && kv_heads > 0 && heads % kv_heads == 0,
        "attention: kv_heads ({kv_heads}) must be positive and divide heads ({heads}, positive)"
    );
    assert!(head_dim > 0, "attention: head_dim must be positive");
    assert!(
        kv_len <= kv_capacity,
        "attention: kv_len ({kv_len}) exceeds kv_capacity ({kv_capacity})"
    );
    if let Some(starts) = mask.key_start {
        assert_eq!(
            starts.len(),
            batch,
            "attention: key_start has {} entries for a batch of {batch}",
            starts.len()
        );
    }
    (
        batch * q_len * heads * head_dim,
        batch * kv_capacity * kv_heads * head_dim,
        batch * heads * q_len,
    )
}

fn check_len(name: &str, got: usize, want: usize) {
    assert_eq!(
        got, want,
        "attention: `{name}` has {got} elements, the shape needs {want}"
    );
}

/// What every task reads: the shape, the mask and the inputs.
struct Ctx<'a> {
    shape: Shape,
    /// Query heads per kv head.
    group: usize,
    causal: bool,
    key_start: Option<&'a [usize]>,
    scale: f32,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
}

impl<'a> Ctx<'a> {
    fn new(
        shape: Shape,
        mask: Mask<'a>,
        scale: f32,
        q: &'a [f32],
        k: &'a [f32],
        v: &'a [f32],
    ) -> Self {
        Ctx {
            shape,
            group: shape.heads / shape.kv_heads,
            causal: mask.causal,
            key_start: mask.key_start,
            scale,
            q,
            k,
            v,
        }
    }

    /// First key visible in batch row `b`.
    fn lo(&self, b: usize) -> usize {
        self.key_start.map_or(0, |starts| starts[b])
    }

    /// One past the last key query `i` may see (before the `lo` cut). Nondecreasing in `i`.
    fn hi(&self, i: usize) -> usize {
        let Shape { q_len, kv_len, .. } = self.shape;
        if self.causal {
            (kv_len + i + 1).saturating_sub(q_len).min(kv_len)
        } else {
            kv_len
        }
    }

    /// Rows `j0..j0 + n` of kv head `g` in batch row `b` of a
    /// `[batch, kv_capacity, kv_heads, head_dim]` buffer, as an `n × head_dim` view.
    fn kv_rows<'s>(&self, x: &'s [f32], b: usize, g: usize, j0: usize, n: usize) -> MatRef<'s> {
        let Shape {
            kv_capacity,
            kv_heads,
            head_dim,
            ..
        } = self.shape;
        let start = ((b * kv_capacity + j0) * kv_heads + g) * head_dim;
        MatRef::new(&x[start..], n, head_dim, kv_heads * head_dim, 1)
    }

    /// Index of query `i` of head `h`, batch row `b` in a `[batch, heads, q_len]` buffer.
    fn stat_index(&self, b: usize, h: usize, i: usize) -> usize {
        (b * self.shape.heads + h) * self.shape.q_len + i
    }

    /// Copies positions `i0..i0 + n` of every query head of kv head `g`, batch row `b`, from a
    /// `[batch, q_len, heads, head_dim]` buffer into `dst` as a dense `group · n × head_dim`
    /// matrix, head after head: the group shares every key tile, so its heads go through one
    /// product (a decode step's single query per head would make a slow one-row product).
    fn gather(&self, x: &[f32], b: usize, g: usize, i0: usize, n: usize, dst: &mut [f32]) {
        let Shape {
            q_len,
            heads,
            head_dim: d,
            ..
        } = self.shape;
        let rows = dst[..self.group * n * d].chunks_exact_mut(d);
        for (row, dst) in rows.enumerate() {
            let (h, i) = (g * self.group + row / n, i0 + row % n);
            let at = ((b * q_len + i) * heads + h) * d;
            dst.copy_from_slice(&x[at..at + d]);
        }
    }

    /// `[batch, heads, q_len]` index of row `row` of a gathered block.
    fn stat_of_row(&self, b: usize, g: usize, i0: usize, n: usize, row: usize) -> usize {
        self.stat_index(b, g * self.group + row / n, i0 + row % n)
    }
}

/// One task's working memory, allocated once per rayon job and reused for every tile.
struct Scratch {
    /// The gathered query block.
    q: Vec<f32>,
    /// The gathered `d_out` block.
    d_out: Vec<f32>,
    /// Scores, then probabilities, of one tile.
    s: Vec<f32>,
    /// `dP`, then `dS`, of one tile.
    ds: Vec<f32>,
    /// The output accumulator: `out`, `dq` or `dk` rows.
    acc: Vec<f32>,
    /// `dv` rows.
    acc2: Vec<f32>,
    /// Per query row: the running maximum (forward) or the log-sum-exp (backward).
    m: Vec<f32>,
    /// Per query row: the running sum (forward) or `D = dO · O` (backward).
    l: Vec<f32>,
    /// Backward: `dq` of a task's every query block, in query-task order.
    dq: Vec<f32>,
}

impl Scratch {
    /// Sized for the call's largest tiles (a decode step's are a few rows, not a full block:
    /// rayon may build a scratch per task, and zeroing unused megabytes would dominate it).
    fn new(ctx: &Ctx<'_>, blocks: Blocks, backward: bool) -> Self {
        let Shape {
            q_len,
            kv_len,
            head_dim,
            ..
        } = ctx.shape;
        let rows = ctx.group * blocks.q.min(q_len);
        let keys = blocks.k.min(kv_len);
        let backward_only = |len: usize| if backward { len } else { 0 };
        Scratch {
            q: vec![0.0; rows * head_dim],
            d_out: vec![0.0; backward_only(rows * head_dim)],
            s: vec![0.0; rows * keys],
            ds: vec![0.0; backward_only(rows * keys)],
            acc: vec![0.0; rows.max(backward_only(keys)) * head_dim],
            acc2: vec![0.0; backward_only(keys * head_dim)],
            m: vec![0.0; rows],
            l: vec![0.0; rows],
            dq: vec![0.0; backward_only(ctx.group * q_len * head_dim)],
        }
    }
}

/// Splits `buf` into `dim`-wide rows and puts row `index` at `slot(index)`: rayon can then hand
/// each task its rows (strided in memory) as one run of disjoint `&mut` slices, without `unsafe`.
fn reorder_rows(buf: &mut [f32], dim: usize, slot: impl Fn(usize) -> usize) -> Vec<&mut [f32]> {
    let mut slots: Vec<Option<&mut [f32]>> = Vec::new();
    slots.resize_with(buf.len() / dim, || None);
    for (index, row) in buf.chunks_exact_mut(dim).enumerate() {
        slots[slot(index)] = Some(row);
    }
    slots
        .into_iter()
        .map(|row| row.expect("each row has its own slot"))
        .collect()
}

/// Slot of query `i` of head `h`, batch row `b` in query-task order: per batch row, kv head and
/// block of positions, the group's heads one after another (the order [`Ctx::gather`] uses).
fn query_slot(shape: &Shape, block: usize, b: usize, h: usize, i: usize) -> usize {
    let group = shape.heads / shape.kv_heads;
    let (g, r) = (h / group, h % group);
    let i0 = i / block * block;
    let n = block.min(shape.q_len - i0);
    (b * shape.heads + g * group) * shape.q_len + i0 * group + r * n + (i - i0)
}

/// The rows of a `[batch, q_len, heads, head_dim]` buffer in query-task order.
fn query_rows<'o>(buf: &'o mut [f32], shape: &Shape, block: usize) -> Vec<&'o mut [f32]> {
    let Shape { heads, q_len, .. } = *shape;
    reorder_rows(buf, shape.head_dim, |index| {
        let (bi, h) = (index / heads, index % heads);
        query_slot(shape, block, bi / q_len, h, bi % q_len)
    })
}

/// The entries of a `[batch, heads, q_len]` buffer in query-task order.
fn stat_rows<'o>(buf: &'o mut [f32], shape: &Shape, block: usize) -> Vec<&'o mut [f32]> {
    let Shape { heads, q_len, .. } = *shape;
    reorder_rows(buf, 1, |index| {
        let (bh, i) = (index / q_len, index % q_len);
        query_slot(shape, block, bh / heads, bh % heads, i)
    })
}

/// A query task: batch row, kv head, first position, and its rows (`group · n` of them).
type QueryTask<'r, 'o> = (usize, usize, usize, &'r mut [&'o mut [f32]]);

/// Cuts rows in query-task order into the tasks' runs.
fn query_tasks<'r, 'o>(
    mut rows: &'r mut [&'o mut [f32]],
    shape: &Shape,
    block: usize,
) -> Vec<QueryTask<'r, 'o>> {
    let group = shape.heads / shape.kv_heads;
    let mut tasks = Vec::new();
    for b in 0..shape.batch {
        for g in 0..shape.kv_heads {
            for i0 in (0..shape.q_len).step_by(block) {
                let n = block.min(shape.q_len - i0);
                let (task, rest) = std::mem::take(&mut rows).split_at_mut(group * n);
                rows = rest;
                tasks.push((b, g, i0, task));
            }
        }
    }
    tasks
}

/// Lanes of the fixed-order reductions below: written as independent partial results they
/// vectorize (a plain float fold cannot be reordered, so it would not), and their order
/// depends on nothing but the length, not on the vector width. The helpers below are always
/// inlined, for the same reason as the tasks that call them.
const LANES: usize = 8;

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().sum();
    for x in chunks {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[inline(always)]
fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = a.chunks_exact(LANES);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for x in chunks {
        for l in 0..LANES {
            acc[l] = acc[l].max(x[l]);
        }
    }
    acc.iter().fold(tail, |m, &x| m.max(x))
}

/// `row[..visible] ← exp(row - shift)`, `row[visible..] ← 0`: a tile row's (unnormalized, in
/// forward) probabilities, the hidden keys' exactly zero.
#[inline(always)]
fn probabilities(row: &mut [f32], visible: usize, shift: f32) {
    let (seen, hidden) = row.split_at_mut(visible);
    for x in seen {
        *x = exp(*x - shift);
    }
    hidden.fill(0.0);
}

/// `ds ← p ∘ (ds - delta)` over a tile row: the score gradient from `dP` (in `ds`).
#[inline(always)]
fn score_grad(ds: &mut [f32], p: &[f32], delta: f32) {
    for (d, &p) in ds.iter_mut().zip(p) {
        *d = p * (*d - delta);
    }
}

/// `dst = scale · a · bᵀ` for row-major `a` (`a.len() / d × d`) and a view `b`.
fn scores(dst: &mut [f32], a: &[f32], b: MatRef<'_>, scale: f32, d: usize) {
    let rows = a.len() / d;
    matmul(
        MatMut::row_major(dst, rows, b.rows()),
        MatRef::row_major(a, rows, d),
        b.t(),
        scale,
        false,
        Threads::One,
    );
}

#[allow(clippy::too_many_arguments)]
fn forward_blocked(
    blocks: Blocks,
    shape: Shape,
    mask: Mask<'_>,
    scale: f32,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &mut [f32],
    lse: &mut [f32],
) {
    let (q_elems, kv_elems, stat_elems) = check_shape(&shape, &mask);
    check_len("q", q.len(), q_elems);
    check_len("k", k.len(), kv_elems);
    check_len("v", v.len(), kv_elems);
    check_len("out", out.len(), q_elems);
    check_len("lse", lse.len(), stat_elems);
    if lse.is_empty() {
        return;
    }
    let ctx = Ctx::new(shape, mask, scale, q, k, v);
    let mut out_rows = query_rows(out, &shape, blocks.q);
    let mut lse_rows = stat_rows(lse, &shape, blocks.q);
    let out_tasks = query_tasks(&mut out_rows, &shape, blocks.q);
    let lse_tasks = query_tasks(&mut lse_rows, &shape, blocks.q);
    out_tasks.into_par_iter().zip(lse_tasks).for_each_init(
        || Scratch::new(&ctx, blocks, false),
        |scratch, ((b, g, i0, out), (_, _, _, lse))| {
            vectorized(
                #[inline(always)]
                || forward_task(&ctx, blocks, scratch, b, g, i0, out, lse),
            );
        },
    );
}

/// Forward for positions `i0..` of the query heads of kv head `g`, batch row `b` (`out` holds
/// `group · n` rows, head after head): an online softmax over the key tiles from `lo(b)` to the
/// last key the block's last position sees.
///
/// Always inlined, so that each of [`vectorized`]'s versions compiles it for its vector width.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn forward_task(
    ctx: &Ctx<'_>,
    blocks: Blocks,
    scratch: &mut Scratch,
    b: usize,
    g: usize,
    i0: usize,
    out: &mut [&mut [f32]],
    lse: &mut [&mut [f32]],
) {
    let (rows, d) = (out.len(), ctx.shape.head_dim);
    let n = rows / ctx.group;
    let Scratch {
        q, s, acc, m, l, ..
    } = scratch;
    let (q, acc, m, l) = (
        &mut q[..rows * d],
        &mut acc[..rows * d],
        &mut m[..rows],
        &mut l[..rows],
    );
    ctx.gather(ctx.q, b, g, i0, n, q);
    acc.fill(0.0);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    let end = ctx.hi(i0 + n - 1);
    let mut j0 = ctx.lo(b);
    while j0 < end {
        let tl = blocks.k.min(end - j0);
        let s = &mut s[..rows * tl];
        scores(s, q, ctx.kv_rows(ctx.k, b, g, j0, tl), ctx.scale, d);
        for (row, (s, acc)) in s
            .chunks_exact_mut(tl)
            .zip(acc.chunks_exact_mut(d))
            .enumerate()
        {
            let visible = ctx.hi(i0 + row % n).saturating_sub(j0).min(tl);
            if visible == 0 {
                s.fill(0.0);
                continue;
            }
            let m_new = m[row].max(max(&s[..visible]));
            // exp(-inf) = 0 on a row's first visible tile, where acc and l are still 0.
            let alpha = exp(m[row] - m_new);
            probabilities(s, visible, m_new);
            l[row] = l[row] * alpha + sum(&s[..visible]);
            m[row] = m_new;
            if alpha != 1.0 {
                acc.iter_mut().for_each(|o| *o *= alpha);
            }
        }
        matmul(
            MatMut::row_major(acc, rows, d),
            MatRef::row_major(s, rows, tl),
            ctx.kv_rows(ctx.v, b, g, j0, tl),
            1.0,
            true,
            Threads::One,
        );
        j0 += tl;
    }
    for (row, (out, acc)) in out.iter_mut().zip(acc.chunks_exact(d)).enumerate() {
        if l[row] > 0.0 {
            let inv = 1.0 / l[row];
            for (o, &a) in out.iter_mut().zip(acc) {
                *o = a * inv;
            }
            lse[row][0] = m[row] + l[row].ln();
        } else {
            out.fill(0.0);
            lse[row][0] = f32::INFINITY;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn backward_blocked(
    blocks: Blocks,
    shape: Shape,
    mask: Mask<'_>,
    scale: f32,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    out: &[f32],
    lse: &[f32],
    d_out: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (q_elems, kv_elems, stat_elems) = check_shape(&shape, &mask);
    check_len("q", q.len(), q_elems);
    check_len("k", k.len(), kv_elems);
    check_len("v", v.len(), kv_elems);
    check_len("out", out.len(), q_elems);
    check_len("lse", lse.len(), stat_elems);
    check_len("d_out", d_out.len(), q_elems);
    check_len("dq", dq.len(), q_elems);
    check_len("dk", dk.len(), kv_elems);
    check_len("dv", dv.len(), kv_elems);
    let ctx = Ctx::new(shape, mask, scale, q, k, v);
    let Shape {
        heads,
        kv_heads,
        q_len,
        kv_len,
        kv_capacity,
        head_dim: d,
        ..
    } = shape;

    // D_i = dO_i · O_i (= Σ_j P_ij dP_ij), laid out like lse.
    let mut delta = vec![0.0f32; stat_elems];
    if !delta.is_empty() {
        delta
            .par_chunks_mut(q_len)
            .enumerate()
            .for_each(|(bh, delta)| {
                let (b, h) = (bh / heads, bh % heads);
                vectorized(
                    #[inline(always)]
                    || {
                        for (i, x) in delta.iter_mut().enumerate() {
                            let at = ((b * q_len + i) * heads + h) * d;
                            *x = dot(&out[at..at + d], &d_out[at..at + d]);
                        }
                    },
                );
            });
    }
    let delta = &delta[..];
    let grads = Grads { lse, delta, d_out };

    // One pass per (batch row, kv head): dk, dv key block by key block, dq summed over them.
    let slot = |index: usize| {
        let (bj, g) = (index / kv_heads, index % kv_heads);
        (bj / kv_capacity * kv_heads + g) * kv_capacity + bj % kv_capacity
    };
    let mut dq_rows = query_rows(dq, &shape, blocks.q);
    let mut dk_rows = reorder_rows(dk, d, slot);
    let mut dv_rows = reorder_rows(dv, d, slot);
    let mut dq_rest = &mut dq_rows[..];
    let (mut dk_rest, mut dv_rest) = (&mut dk_rows[..], &mut dv_rows[..]);
    let mut tasks = Vec::new();
    for bg in 0..shape.batch * kv_heads {
        let (dq, rest) = std::mem::take(&mut dq_rest).split_at_mut(ctx.group * q_len);
        dq_rest = rest;
        let (dk, rest) = std::mem::take(&mut dk_rest).split_at_mut(kv_capacity);
        dk_rest = rest;
        let (dv, rest) = std::mem::take(&mut dv_rest).split_at_mut(kv_capacity);
        dv_rest = rest;
        let (dk, dk_unused) = dk.split_at_mut(kv_len);
        let (dv, dv_unused) = dv.split_at_mut(kv_len);
        for row in dk_unused.iter_mut().chain(dv_unused) {
            row.fill(0.0);
        }
        tasks.push((bg / kv_heads, bg % kv_heads, dq, dk, dv));
    }
    tasks.into_par_iter().for_each_init(
        || Scratch::new(&ctx, blocks, true),
        |scratch, (b, g, dq, dk, dv)| {
            vectorized(
                #[inline(always)]
                || grads_task(&ctx, &grads, blocks, scratch, b, g, dq, dk, dv),
            );
        },
    );
}

/// What the backward tasks read besides the inputs.
struct Grads<'a> {
    lse: &'a [f32],
    /// `D = rowsum(dO ∘ O)`, laid out like `lse`.
    delta: &'a [f32],
    d_out: &'a [f32],
}

impl Ctx<'_> {
    /// Gathers the `q` and `d_out` blocks of positions `i0..i0 + n` of kv head `g`'s query heads,
    /// and their rows' lse and `D`, into the scratch; returns the block's row count.
    fn gather_backward(
        &self,
        grads: &Grads<'_>,
        scratch: &mut Scratch,
        b: usize,
        g: usize,
        i0: usize,
        n: usize,
    ) -> usize {
        let rows = self.group * n;
        self.gather(self.q, b, g, i0, n, &mut scratch.q);
        self.gather(grads.d_out, b, g, i0, n, &mut scratch.d_out);
        for row in 0..rows {
            let at = self.stat_of_row(b, g, i0, n, row);
            scratch.m[row] = grads.lse[at];
            scratch.l[row] = grads.delta[at];
        }
        rows
    }
}

/// dq, dk, dv of kv head `g`, batch row `b` (`dq`: the group's query rows in query-task
/// order; `dk`, `dv`: its `kv_len` keys' rows), key block by key block: each tile's
/// probabilities and score gradients are computed once, for all three (FlashAttention-2
/// computes them twice, or adds `dq` atomically; here one task owns a kv head's `dq`).
///
/// Always inlined, so that each of [`vectorized`]'s versions compiles it for its vector width.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn grads_task(
    ctx: &Ctx<'_>,
    grads: &Grads<'_>,
    blocks: Blocks,
    scratch: &mut Scratch,
    b: usize,
    g: usize,
    dq: &mut [&mut [f32]],
    dk: &mut [&mut [f32]],
    dv: &mut [&mut [f32]],
) {
    let d = ctx.shape.head_dim;
    scratch.dq[..dq.len() * d].fill(0.0);
    for (kb, (dk, dv)) in dk
        .chunks_mut(blocks.k)
        .zip(dv.chunks_mut(blocks.k))
        .enumerate()
    {
        key_block(ctx, grads, blocks, scratch, b, g, kb * blocks.k, dk, dv);
    }
    for (dq, acc) in dq.iter_mut().zip(scratch.dq.chunks_exact(d)) {
        dq.copy_from_slice(acc);
    }
}

/// `dk`, `dv` for keys `j0..j0 + dk.len()` of kv head `g`, batch row `b` (the sum over every
/// query head of the group and every query block that sees one of these keys), and those
/// queries' share of `dq` added into the scratch's.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn key_block(
    ctx: &Ctx<'_>,
    grads: &Grads<'_>,
    blocks: Blocks,
    scratch: &mut Scratch,
    b: usize,
    g: usize,
    j0: usize,
    dk: &mut [&mut [f32]],
    dv: &mut [&mut [f32]],
) {
    let Shape {
        q_len,
        kv_len,
        head_dim: d,
        ..
    } = ctx.shape;
    let j1 = j0 + dk.len();
    // Keys before lo(b) are hidden: their gradients stay zero.
    let first = j0.max(ctx.lo(b)).min(j1);
    let tl = j1 - first;
    scratch.acc[..tl * d].fill(0.0);
    scratch.acc2[..tl * d].fill(0.0);
    if tl > 0 {
        let keys = ctx.kv_rows(ctx.k, b, g, first, tl);
        let values = ctx.kv_rows(ctx.v, b, g, first, tl);
        // The first position that sees key `first` (hi(i) > first); earlier ones see none of
        // the block, so their tiles are skipped.
        let i_start = if ctx.causal {
            (first + q_len).saturating_sub(kv_len)
        } else {
            0
        };
        // Query blocks start at multiples of the block size, where `dq`'s blocks do.
        for i0 in (i_start / blocks.q * blocks.q..q_len).step_by(blocks.q) {
            let n = blocks.q.min(q_len - i0);
            let rows = ctx.gather_backward(grads, scratch, b, g, i0, n);
            let Scratch {
                q,
                d_out,
                s: p,
                ds,
                acc: dk_acc,
                acc2: dv_acc,
                m: lse,
                l: delta,
                dq,
            } = &mut *scratch;
            let (q, d_out) = (&q[..rows * d], &d_out[..rows * d]);
            let (p, ds) = (&mut p[..rows * tl], &mut ds[..rows * tl]);
            scores(p, q, keys, ctx.scale, d);
            for (row, p) in p.chunks_exact_mut(tl).enumerate() {
                let visible = ctx.hi(i0 + row % n).saturating_sub(first).min(tl);
                probabilities(p, visible, lse[row]);
            }
            let p_view = MatRef::row_major(p, rows, tl);
            let d_out_view = MatRef::row_major(d_out, rows, d);
            // dV += Pᵀ dO
            matmul(
                MatMut::row_major(&mut dv_acc[..tl * d], tl, d),
                p_view.t(),
                d_out_view,
                1.0,
                true,
                Threads::One,
            );
            // dP = dO Vᵀ, then dS = P ∘ (dP - D)
            scores(ds, d_out, values, 1.0, d);
            for (row, (ds, p)) in ds.chunks_exact_mut(tl).zip(p.chunks_exact(tl)).enumerate() {
                score_grad(ds, p, delta[row]);
            }
            let ds_view = MatRef::row_major(ds, rows, tl);
            // dK += scale · dSᵀ Q
            matmul(
                MatMut::row_major(&mut dk_acc[..tl * d], tl, d),
                ds_view.t(),
                MatRef::row_major(q, rows, d),
                ctx.scale,
                true,
                Threads::One,
            );
            // dQ += scale · dS K, into the block's rows
            let at = i0 * ctx.group * d;
            matmul(
                MatMut::row_major(&mut dq[at..at + rows * d], rows, d),
                ds_view,
                keys,
                ctx.scale,
                true,
                Threads::One,
            );
        }
    }
    let hidden = first - j0;
    for (r, (dk, dv)) in dk.iter_mut().zip(dv.iter_mut()).enumerate() {
        if r < hidden {
            dk.fill(0.0);
            dv.fill(0.0);
        } else {
            let at = (r - hidden) * d;
            dk.copy_from_slice(&scratch.acc[at..at + d]);
            dv.copy_from_slice(&scratch.acc2[at..at + d]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    use crate::simd::{Level, forced};
    use crate::test_rng::Rng;

    #[derive(Clone, Debug)]
    struct Case {
        shape: Shape,
        causal: bool,
        key_start: Option<Vec<usize>>,
        blocks: Blocks,
        seed: u64,
    }

    struct Inputs {
        scale: f32,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        d_out: Vec<f32>,
    }

    impl Case {
        fn mask(&self) -> Mask<'_> {
            Mask {
                causal: self.causal,
                key_start: self.key_start.as_deref(),
            }
        }

        fn q_elems(&self) -> usize {
            let s = self.shape;
            s.batch * s.q_len * s.heads * s.head_dim
        }

        fn kv_elems(&self) -> usize {
            let s = self.shape;
            s.batch * s.kv_capacity * s.kv_heads * s.head_dim
        }

        /// Random inputs; scores scaled up (×2.5) so softmaxes are peaked, not near-uniform.
        fn inputs(&self) -> Inputs {
            let mut rng = Rng(self.seed);
            Inputs {
                scale: 2.5 / (self.shape.head_dim as f32).sqrt(),
                q: rng.vec(self.q_elems(), 1.0),
                k: rng.vec(self.kv_elems(), 1.0),
                v: rng.vec(self.kv_elems(), 1.0),
                d_out: rng.vec(self.q_elems(), 1.0),
            }
        }

        /// The kernel's forward and backward, into buffers prefilled with NaN (every element
        /// must be overwritten).
        fn run(&self, x: &Inputs) -> [Vec<f32>; 5] {
            let s = self.shape;
            let mut out = vec![f32::NAN; self.q_elems()];
            let mut lse = vec![f32::NAN; s.batch * s.heads * s.q_len];
            forward_blocked(
                self.blocks,
                s,
                self.mask(),
                x.scale,
                &x.q,
                &x.k,
                &x.v,
                &mut out,
                &mut lse,
            );
            let mut dq = vec![f32::NAN; self.q_elems()];
            let mut dk = vec![f32::NAN; self.kv_elems()];
            let mut dv = vec![f32::NAN; self.kv_elems()];
            backward_blocked(
                self.blocks,
                s,
                self.mask(),
                x.scale,
                &x.q,
                &x.k,
                &x.v,
                &out,
                &lse,
                &x.d_out,
                &mut dq,
                &mut dk,
                &mut dv,
            );
            [out, lse, dq, dk, dv]
        }
    }

    /// Whether query `i` of batch row `b` sees key `j`, from the definitions (signed positions).
    fn sees(case: &Case, b: usize, i: usize, j: usize) -> bool {
        let s = case.shape;
        let position = s.kv_len as i64 - s.q_len as i64 + i as i64;
        let start = case.key_start.as_ref().map_or(0, |ks| ks[b]);
        j < s.kv_len && j >= start && (!case.causal || j as i64 <= position)
    }

    /// Naive attention in f64 with materialized scores: `[out, lse, dq, dk, dv]`, lse `+inf`
    /// for a query that sees nothing.
    fn reference(case: &Case, x: &Inputs) -> [Vec<f64>; 5] {
        let s = case.shape;
        let d = s.head_dim;
        let qi = |b: usize, i: usize, h: usize| ((b * s.q_len + i) * s.heads + h) * d;
        let ki = |b: usize, j: usize, g: usize| ((b * s.kv_capacity + j) * s.kv_heads + g) * d;
        let dot = |a: &[f32], b: &[f32]| -> f64 {
            a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
        };
        let mut out = vec![0.0; case.q_elems()];
        let mut lse = vec![f64::INFINITY; s.batch * s.heads * s.q_len];
        let mut dq = vec![0.0; case.q_elems()];
        let mut dk = vec![0.0; case.kv_elems()];
        let mut dv = vec![0.0; case.kv_elems()];
        for b in 0..s.batch {
            for h in 0..s.heads {
                let g = h / (s.heads / s.kv_heads);
                for i in 0..s.q_len {
                    let keys: Vec<usize> = (0..s.kv_len).filter(|&j| sees(case, b, i, j)).collect();
                    if keys.is_empty() {
                        continue;
                    }
                    let qr = &x.q[qi(b, i, h)..qi(b, i, h) + d];
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|&j| x.scale as f64 * dot(qr, &x.k[ki(b, j, g)..ki(b, j, g) + d]))
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let total: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
                    let p: Vec<f64> = scores.iter().map(|s| (s - mx).exp() / total).collect();
                    lse[(b * s.heads + h) * s.q_len + i] = mx + total.ln();
                    let go = &x.d_out[qi(b, i, h)..qi(b, i, h) + d];
                    let dp: Vec<f64> = keys
                        .iter()
                        .map(|&j| dot(go, &x.v[ki(b, j, g)..ki(b, j, g) + d]))
                        .collect();
                    let delta: f64 = p.iter().zip(&dp).map(|(p, dp)| p * dp).sum();
                    for (t, &j) in keys.iter().enumerate() {
                        let ds = p[t] * (dp[t] - delta) * x.scale as f64;
                        for c in 0..d {
                            out[qi(b, i, h) + c] += p[t] * x.v[ki(b, j, g) + c] as f64;
                            dv[ki(b, j, g) + c] += p[t] * go[c] as f64;
                            dq[qi(b, i, h) + c] += ds * x.k[ki(b, j, g) + c] as f64;
                            dk[ki(b, j, g) + c] += ds * qr[c] as f64;
                        }
                    }
                }
            }
        }
        [out, lse, dq, dk, dv]
    }

    fn assert_close(name: &str, got: &[f32], want: &[f64], tol: f64) {
        assert_eq!(got.len(), want.len(), "{name}: length");
        for (index, (&g, &w)) in got.iter().zip(want).enumerate() {
            let ok = if w.is_infinite() {
                g as f64 == w
            } else {
                (g as f64 - w).abs() <= tol * (1.0 + w.abs())
            };
            assert!(ok, "{name}[{index}]: got {g}, want {w}");
        }
    }

    fn small_blocks() -> impl Strategy<Value = Blocks> {
        prop_oneof![
            Just(BLOCKS),
            (1usize..=9, 1usize..=9).prop_map(|(q, k)| Blocks { q, k }),
        ]
    }

    /// Shapes over odd lengths, decode steps (q_len 1) and cache prefixes (q_len < kv_len),
    /// kv_len 1, GQA ratios 1–3, spare cache capacity, head dims off multiples of 8, causal or
    /// not, and left padding that can hide every key from early queries (or from all of them).
    fn cases() -> impl Strategy<Value = Case> {
        (
            1usize..=3,
            1usize..=2,
            1usize..=3,
            1usize..=140,
            0usize..=3,
            1usize..=40,
            any::<bool>(),
            small_blocks(),
            any::<u64>(),
        )
            .prop_flat_map(
                |(batch, kv_heads, group, kv_len, spare, head_dim, causal, blocks, seed)| {
                    let q_len = prop_oneof![Just(1), Just(kv_len), 1..=kv_len];
                    let key_start = prop::option::of(prop::collection::vec(
                        prop_oneof![Just(0), 0..=kv_len],
                        batch,
                    ));
                    (q_len, key_start).prop_map(move |(q_len, key_start)| Case {
                        shape: Shape {
                            batch,
                            heads: kv_heads * group,
                            kv_heads,
                            q_len,
                            kv_len,
                            kv_capacity: kv_len + spare,
                            head_dim,
                        },
                        causal,
                        key_start,
                        blocks,
                        seed,
                    })
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn forward_and_backward_match_the_f64_reference(case in cases()) {
            let x = case.inputs();
            let [out, lse, dq, dk, dv] = case.run(&x);
            let [r_out, r_lse, r_dq, r_dk, r_dv] = reference(&case, &x);
            assert_close("out", &out, &r_out, 1e-4);
            assert_close("lse", &lse, &r_lse, 1e-4);
            assert_close("dq", &dq, &r_dq, 1e-4);
            assert_close("dk", &dk, &r_dk, 1e-4);
            assert_close("dv", &dv, &r_dv, 1e-4);
        }
    }

    /// Left padding under a causal mask: queries before the padding ends see no key at all.
    fn padded_case() -> Case {
        Case {
            shape: Shape {
                batch: 2,
                heads: 4,
                kv_heads: 2,
                q_len: 7,
                kv_len: 7,
                kv_capacity: 9,
                head_dim: 5,
            },
            causal: true,
            key_start: Some(vec![3, 0]),
            blocks: Blocks { q: 3, k: 2 },
            seed: 7,
        }
    }

    #[test]
    fn a_query_that_sees_no_key_outputs_zeros_and_passes_no_gradient() {
        let case = padded_case();
        let s = case.shape;
        let x = case.inputs();
        let [out, lse, dq, _, _] = case.run(&x);
        for h in 0..s.heads {
            for i in 0..s.q_len {
                let at = (i * s.heads + h) * s.head_dim;
                let rows = [&out[at..at + s.head_dim], &dq[at..at + s.head_dim]];
                if i < 3 {
                    assert_eq!(lse[h * s.q_len + i], f32::INFINITY);
                    assert!(rows.iter().all(|r| r.iter().all(|&v| v == 0.0)), "{h} {i}");
                } else {
                    assert!(lse[h * s.q_len + i].is_finite());
                    assert!(rows.iter().all(|r| r.iter().any(|&v| v != 0.0)), "{h} {i}");
                }
            }
        }
    }

    #[test]
    fn a_decode_step_against_the_cache_matches_the_last_row_of_the_full_pass() {
        let full = Case {
            shape: Shape {
                batch: 3,
                heads: 9,
                kv_heads: 3,
                q_len: 70,
                kv_len: 70,
                kv_capacity: 70,
                head_dim: 64,
            },
            causal: true,
            key_start: Some(vec![0, 5, 69]),
            blocks: BLOCKS,
            seed: 11,
        };
        let x = full.inputs();
        let [out, lse, ..] = full.run(&x);
        // The same keys in a cache of 100 rows, and only the last query.
        let s = full.shape;
        let step = Case {
            shape: Shape {
                q_len: 1,
                kv_capacity: 100,
                ..s
            },
            ..full.clone()
        };
        let row = s.heads * s.head_dim;
        // Batch row b's keys at rows b * kv_capacity.. of the cache, the rest left at zero.
        let to_cache = |src: &[f32]| -> Vec<f32> {
            let mut cache = vec![0.0; step.kv_elems()];
            let (used, kv_row) = (s.kv_len * s.kv_heads * s.head_dim, s.kv_heads * s.head_dim);
            for b in 0..s.batch {
                cache[b * step.shape.kv_capacity * kv_row..][..used]
                    .copy_from_slice(&src[b * used..][..used]);
            }
            cache
        };
        let last = |buf: &[f32]| -> Vec<f32> {
            (0..s.batch)
                .flat_map(|b| buf[(b * s.q_len + s.q_len - 1) * row..][..row].to_vec())
                .collect()
        };
        let mut step_out = vec![0.0; s.batch * row];
        let mut step_lse = vec![0.0; s.batch * s.heads];
        forward(
            step.shape,
            step.mask(),
            x.scale,
            &last(&x.q),
            &to_cache(&x.k),
            &to_cache(&x.v),
            &mut step_out,
            &mut step_lse,
        );
        let want = last(&out);
        for (g, w) in step_out.iter().zip(&want) {
            assert!((g - w).abs() <= 1e-5, "{g} vs {w}");
        }
        for b in 0..s.batch {
            for h in 0..s.heads {
                let w = lse[(b * s.heads + h) * s.q_len + s.q_len - 1];
                assert!((step_lse[b * s.heads + h] - w).abs() <= 1e-5);
            }
        }
    }

    #[test]
    fn backward_matches_finite_differences_of_forward() {
        let case = padded_case();
        let s = case.shape;
        let x = case.inputs();
        let [_, _, dq, dk, dv] = case.run(&x);
        // loss = Σ d_out ∘ out, so d_out is its gradient with respect to out.
        let loss = |q: &[f32], k: &[f32], v: &[f32]| -> f64 {
            let mut out = vec![0.0; case.q_elems()];
            let mut lse = vec![0.0; s.batch * s.heads * s.q_len];
            forward(s, case.mask(), x.scale, q, k, v, &mut out, &mut lse);
            out.iter()
                .zip(&x.d_out)
                .map(|(&o, &w)| o as f64 * w as f64)
                .sum()
        };
        let eps = 1e-2;
        let mut worst = 0.0f64;
        for which in 0..3 {
            let (base, grad) = [(&x.q, &dq), (&x.k, &dk), (&x.v, &dv)][which];
            for index in 0..base.len() {
                let mut plus = [x.q.clone(), x.k.clone(), x.v.clone()];
                let mut minus = plus.clone();
                plus[which][index] += eps;
                minus[which][index] -= eps;
                let fd = (loss(&plus[0], &plus[1], &plus[2])
                    - loss(&minus[0], &minus[1], &minus[2]))
                    / (2.0 * eps as f64);
                let err = (grad[index] as f64 - fd).abs() / (1.0 + fd.abs());
                worst = worst.max(err);
                assert!(
                    err < 1e-2,
                    "input {which}[{index}]: {} vs {fd}",
                    grad[index]
                );
            }
        }
        // The loop covered cache rows past kv_len too: they do not move the loss, gradient 0.
        assert!(worst > 0.0, "finite differences saw no gradient at all");
    }

    #[test]
    fn results_are_bit_identical_for_any_thread_count_and_vector_width() {
        let case = Case {
            shape: Shape {
                batch: 3,
                heads: 6,
                kv_heads: 2,
                q_len: 150,
                kv_len: 200,
                kv_capacity: 203,
                head_dim: 24,
            },
            causal: true,
            key_start: Some(vec![0, 17, 120]),
            blocks: BLOCKS,
            seed: 3,
        };
        let x = case.inputs();
        let pool = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
        };
        let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let one = forced::at(Level::Baseline, || pool(1).install(|| case.run(&x)));
        for level in forced::supported() {
            let three = forced::at(level, || pool(3).install(|| case.run(&x)));
            for (a, b) in one.iter().zip(&three) {
                assert!(bits(a) == bits(b), "1 thread and 3 at {level:?} differ");
            }
        }
    }

    /// Rows `at`, `at + stride`, … of `x` as a `rows × cols` view.
    fn strided(x: &[f32], at: usize, rows: usize, cols: usize, stride: usize) -> MatRef<'_> {
        MatRef::new(&x[at..], rows, cols, stride, 1)
    }

    /// Causal attention the way a tensor framework runs it, for the timing comparison: per
    /// (batch, head) the full `[len, len]` probability matrix, kept for backward. Requires
    /// `kv_heads == heads` and `q_len == kv_len == kv_capacity`; outputs are head-major.
    fn materialized_forward(s: Shape, x: &Inputs) -> (Vec<f32>, Vec<f32>) {
        let (scale, q, k, v) = (x.scale, &x.q, &x.k, &x.v);
        let (l, d) = (s.q_len, s.head_dim);
        let stride = s.heads * d;
        let mut out = vec![0.0; s.batch * s.heads * l * d];
        let mut probs = vec![0.0; s.batch * s.heads * l * l];
        out.par_chunks_mut(l * d)
            .zip(probs.par_chunks_mut(l * l))
            .enumerate()
            .for_each(|(bh, (out, p))| {
                let at = (bh / s.heads) * l * stride + (bh % s.heads) * d;
                matmul(
                    MatMut::row_major(p, l, l),
                    strided(q, at, l, d, stride),
                    strided(k, at, l, d, stride).t(),
                    scale,
                    false,
                    Threads::One,
                );
                for (i, row) in p.chunks_exact_mut(l).enumerate() {
                    let m = max(&row[..=i]);
                    probabilities(row, i + 1, m);
                    let total = sum(row);
                    row.iter_mut().for_each(|x| *x /= total);
                }
                matmul(
                    MatMut::row_major(out, l, d),
                    MatRef::row_major(p, l, l),
                    strided(v, at, l, d, stride),
                    1.0,
                    false,
                    Threads::One,
                );
            });
        (out, probs)
    }

    /// Backward of [`materialized_forward`] from its stored probabilities: `dq, dk, dv`,
    /// head-major.
    fn materialized_backward(s: Shape, x: &Inputs, out: &[f32], probs: &[f32]) -> [Vec<f32>; 3] {
        let (scale, q, k, v, d_out) = (x.scale, &x.q, &x.k, &x.v, &x.d_out);
        let (l, d) = (s.q_len, s.head_dim);
        let stride = s.heads * d;
        let mut grads = [0; 3].map(|_| vec![0.0; s.batch * s.heads * l * d]);
        let [dq, dk, dv] = &mut grads;
        dq.par_chunks_mut(l * d)
            .zip(dk.par_chunks_mut(l * d))
            .zip(dv.par_chunks_mut(l * d))
            .enumerate()
            .for_each_init(
                || vec![0.0; l * l],
                |ds, (bh, ((dq, dk), dv))| {
                    let at = (bh / s.heads) * l * stride + (bh % s.heads) * d;
                    let p = &probs[bh * l * l..(bh + 1) * l * l];
                    let o = &out[bh * l * d..(bh + 1) * l * d];
                    matmul(
                        MatMut::row_major(dv, l, d),
                        MatRef::row_major(p, l, l).t(),
                        strided(d_out, at, l, d, stride),
                        1.0,
                        false,
                        Threads::One,
                    );
                    matmul(
                        MatMut::row_major(ds, l, l),
                        strided(d_out, at, l, d, stride),
                        strided(v, at, l, d, stride).t(),
                        1.0,
                        false,
                        Threads::One,
                    );
                    for (i, (ds, p)) in ds.chunks_exact_mut(l).zip(p.chunks_exact(l)).enumerate() {
                        let g = &d_out[at + i * stride..at + i * stride + d];
                        score_grad(ds, p, dot(&o[i * d..(i + 1) * d], g));
                    }
                    matmul(
                        MatMut::row_major(dq, l, d),
                        MatRef::row_major(ds, l, l),
                        strided(k, at, l, d, stride),
                        scale,
                        false,
                        Threads::One,
                    );
                    matmul(
                        MatMut::row_major(dk, l, d),
                        MatRef::row_major(ds, l, l).t(),
                        strided(q, at, l, d, stride),
                        scale,
                        false,
                        Threads::One,
                    );
                },
            );
        grads
    }

    /// Best of a few runs, in milliseconds.
    fn time_ms(mut f: impl FnMut()) -> f64 {
        (0..5)
            .map(|_| {
                let start = std::time::Instant::now();
                f();
                start.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// `cargo test -p agentry-kernels --release attention::tests::timings -- --ignored --nocapture`
    #[test]
    #[ignore = "timings, for information"]
    fn timings() {
        let threads = rayon::current_num_threads();
        for (batch, heads, kv_heads, len, head_dim) in [
            (16, 4, 4, 256, 32),
            (16, 8, 8, 512, 32),
            (16, 9, 3, 256, 64),
        ] {
            let case = Case {
                shape: Shape {
                    batch,
                    heads,
                    kv_heads,
                    q_len: len,
                    kv_len: len,
                    kv_capacity: len,
                    head_dim,
                },
                causal: true,
                key_start: None,
                blocks: BLOCKS,
                seed: 1,
            };
            let s = case.shape;
            let x = case.inputs();
            let mut out = vec![0.0; case.q_elems()];
            let mut lse = vec![0.0; batch * heads * len];
            let fwd = time_ms(|| {
                forward(
                    s,
                    case.mask(),
                    x.scale,
                    &x.q,
                    &x.k,
                    &x.v,
                    &mut out,
                    &mut lse,
                )
            });
            let (mut dq, mut dk, mut dv) = (
                vec![0.0; case.q_elems()],
                vec![0.0; case.kv_elems()],
                vec![0.0; case.kv_elems()],
            );
            let bwd = time_ms(|| {
                backward(
                    s,
                    case.mask(),
                    x.scale,
                    &x.q,
                    &x.k,
                    &x.v,
                    &out,
                    &lse,
                    &x.d_out,
                    &mut dq,
                    &mut dk,
                    &mut dv,
                )
            });
            let line = format!(
                "batch {batch} heads {heads}/{kv_heads} len {len} head_dim {head_dim} causal, {threads} threads: tiled forward {fwd:.2} ms, backward {bwd:.2} ms"
            );
            if kv_heads == heads {
                let (mut m_out, mut probs) = (Vec::new(), Vec::new());
                let m_fwd = time_ms(|| (m_out, probs) = materialized_forward(s, &x));
                let m_bwd = time_ms(|| {
                    materialized_backward(s, &x, &m_out, &probs);
                });
                println!("{line}; materialized forward {m_fwd:.2} ms, backward {m_bwd:.2} ms");
            } else {
                println!("{line}");
            }
        }
        for (batch, kv_len) in [(4, 364), (16, 364)] {
            let case = Case {
                shape: Shape {
                    batch,
                    heads: 9,
                    kv_heads: 3,
                    q_len: 1,
                    kv_len,
                    kv_capacity: 512,
                    head_dim: 64,
                },
                causal: true,
                key_start: None,
                blocks: BLOCKS,
                seed: 1,
            };
            let s = case.shape;
            let x = case.inputs();
            let mut out = vec![0.0; case.q_elems()];
            let mut lse = vec![0.0; batch * 9];
            let step = time_ms(|| {
                for _ in 0..100 {
                    forward(
                        s,
                        case.mask(),
                        x.scale,
                        &x.q,
                        &x.k,
                        &x.v,
                        &mut out,
                        &mut lse,
                    );
                }
            }) / 100.0;
            println!(
                "decode step batch {batch} heads 9/3 kv_len {kv_len} head_dim 64: {:.1} µs",
                step * 1e3
            );
        }
    }

    #[test]
    fn empty_lengths_give_zero_outputs_and_gradients() {
        for (batch, q_len, kv_len, kv_capacity) in
            [(2, 3, 0, 2), (2, 0, 4, 5), (0, 3, 3, 3), (1, 2, 0, 0)]
        {
            let case = Case {
                shape: Shape {
                    batch,
                    heads: 2,
                    kv_heads: 1,
                    q_len,
                    kv_len,
                    kv_capacity,
                    head_dim: 3,
                },
                causal: true,
                key_start: None,
                blocks: BLOCKS,
                seed: 5,
            };
            let [out, lse, dq, dk, dv] = case.run(&case.inputs());
            assert!(
                out.iter()
                    .chain(&dq)
                    .chain(&dk)
                    .chain(&dv)
                    .all(|&x| x == 0.0)
            );
            assert!(lse.iter().all(|&x| x == f32::INFINITY));
        }
    }

    #[test]
    #[should_panic(expected = "`k` has 10 elements")]
    fn a_slice_of_the_wrong_length_is_refused() {
        let shape = Shape {
            batch: 1,
            heads: 2,
            kv_heads: 1,
            q_len: 1,
            kv_len: 2,
            kv_capacity: 3,
            head_dim: 4,
        };
        let (mut out, mut lse) = (vec![0.0; 8], vec![0.0; 2]);
        forward(
            shape,
            Mask::default(),
            1.0,
            &[0.0; 8],
            &[0.0; 10],
            &[0.0; 12],
            &mut out,
            &mut lse,
        );
    }
}
