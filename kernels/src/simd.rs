//! The kernels' loops in the widest vector instructions the CPU has, chosen when the program
//! runs.
//!
//! The crate is compiled for x86-64's baseline (SSE2: four floats an instruction), so that one
//! binary runs on any x86-64 machine. [`vectorized`] compiles the work it is given three times,
//! for AVX-512, for AVX2 and for the baseline, and runs the widest the CPU supports: the
//! element-wise loops of SwiGLU, RMSNorm, RoPE, the vocabulary's log-softmax and attention's
//! online softmax run two to three times faster on AVX2 and AVX-512 machines (measured on
//! SwiGLU's forward loop).
//!
//! Every version computes the same bits. The loops are element-wise, or reduce over lanes
//! written out in their code (`LANES` partial sums in a fixed order), which the compiler may
//! not reorder in any version; and Rust never fuses a multiplication and an addition into one
//! instruction on its own, AVX2's FMA notwithstanding. Only the speed depends on the CPU.
//! (The matrix products are `gemm`'s, which picks its own micro-kernels.)

// The one `unsafe` here calls a `#[target_feature]` function after checking, at run time, that
// the CPU has its features.
#![allow(unsafe_code)]

/// The vector instructions a version of the work is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// x86-64 with AVX-512 (F, VL, BW, DQ), AVX2 and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// What the crate is compiled for (SSE2 on x86-64; any other architecture's default).
    Baseline,
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Level::Avx512 => "AVX-512",
            Level::Avx2 => "AVX2",
            Level::Baseline => "baseline vector instructions",
        })
    }
}

impl Level {
    /// Every level, narrowest first.
    pub const ALL: [Level; 3] = [Level::Baseline, Level::Avx2, Level::Avx512];

    /// The widest level this CPU supports (detected once).
    pub fn detected() -> Level {
        static DETECTED: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                // Each level's check covers every feature its functions enable.
                let avx512 =
                    has!("avx512f") && has!("avx512vl") && has!("avx512bw") && has!("avx512dq");
                match (has!("avx2") && has!("fma"), avx512) {
                    (false, _) => Level::Baseline,
                    (true, false) => Level::Avx2,
                    (true, true) => Level::Avx512,
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            {
                Level::Baseline
            }
        })
    }

    /// Whether this CPU can run code compiled for `self`.
    pub fn supported(self) -> bool {
        match (self, Level::detected()) {
            (Level::Baseline, _) | (_, Level::Avx512) => true,
            (Level::Avx2, level) => level == Level::Avx2,
            (Level::Avx512, _) => false,
        }
    }
}

/// Runs `work` compiled for the widest vector instructions this CPU has.
///
/// Only code inlined into the version for those instructions is compiled for them, so `work`
/// must be an `#[inline(always)]` closure (`vectorized(#[inline(always)] || ...)`) whose loops
/// are inlined into it: closures it calls carry the attribute too (bound by `let` through
/// [`inlined`]), functions are `#[inline(always)]`. Without the attribute the compiler may
/// call the closure out of line, where it is compiled for the baseline: until this was
/// noticed, attention, RMSNorm, RoPE and the vocabulary's log-softmax ran their loops in SSE2
/// in release builds, four floats an instruction, whatever the CPU. The `every_vectorized_call_is_inlined` test keeps every call site so.
#[inline(always)]
pub fn vectorized<R>(work: impl FnOnce() -> R) -> R {
    #[cfg(test)]
    if let Some(level) = forced::level() {
        return at(level, work);
    }
    // The detected level is supported: no check on this path (it runs once per row or block).
    dispatch(Level::detected(), work)
}

/// Returns `f`: Rust accepts `#[inline(always)]` on a closure passed as an argument but not on
/// one bound by `let`, so `let run = inlined(#[inline(always)] |x: &[f32]| ...)` is how a
/// closure that a [`vectorized`] closure calls is made to inline into it.
#[inline(always)]
pub fn inlined<F>(f: F) -> F {
    f
}

/// Runs `work` compiled for `level`, which the CPU must support (the tests compare levels).
///
/// # Panics
///
/// If the CPU does not support `level`.
#[inline(always)]
pub fn at<R>(level: Level, work: impl FnOnce() -> R) -> R {
    assert!(level.supported(), "this CPU does not support {level:?}");
    dispatch(level, work)
}

/// Runs `work` compiled for `level`, which the caller has checked the CPU supports.
#[inline(always)]
fn dispatch<R>(level: Level, work: impl FnOnce() -> R) -> R {
    match level {
        // SAFETY: the callers checked `level.supported()`: the CPU has these target features.
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { avx512(work) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { avx2(work) },
        _ => work(),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
fn avx512<R>(work: impl FnOnce() -> R) -> R {
    work()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn avx2<R>(work: impl FnOnce() -> R) -> R {
    work()
}

/// The kernels' tests run them at each level: while [`forced::at`] runs, every [`vectorized`]
/// call (on any thread) uses its level. The process-wide setting can only slow down or speed up
/// other tests running at the time, since every level computes the same bits.
#[cfg(test)]
pub(crate) mod forced {
    use super::Level;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU8, Ordering};

    static FORCED: AtomicU8 = AtomicU8::new(0);
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

    /// The forced level, stored as its index in [`Level::ALL`] plus one (0: none).
    pub(crate) fn level() -> Option<Level> {
        let code = FORCED.load(Ordering::Relaxed) as usize;
        code.checked_sub(1).map(|i| Level::ALL[i])
    }

    /// Runs `work` with every kernel loop at `level`.
    pub(crate) fn at<R>(level: Level, work: impl FnOnce() -> R) -> R {
        let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let index = Level::ALL.iter().position(|&l| l == level);
        FORCED.store(index.map_or(0, |i| i as u8 + 1), Ordering::Relaxed);
        let result = work();
        FORCED.store(0, Ordering::Relaxed);
        result
    }

    /// The levels this CPU supports, narrowest first.
    pub(crate) fn supported() -> Vec<Level> {
        Level::ALL.into_iter().filter(|l| l.supported()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::exp;

    #[test]
    fn every_supported_level_computes_the_same_bits() {
        // An element-wise loop with `exp`, and a fixed-lane reduction, as the kernels write them.
        let xs: Vec<f32> = (0..4099).map(|i| (i % 211) as f32 * 0.173 - 18.0).collect();
        let run = |level| {
            at(
                level,
                #[inline(always)]
                || {
                    let ys: Vec<f32> = xs.iter().map(|&x| x * 0.5 / (1.0 + exp(-x))).collect();
                    let mut lanes = [0.0f32; 8];
                    for chunk in ys.chunks_exact(8) {
                        for l in 0..8 {
                            lanes[l] += chunk[l] * chunk[l];
                        }
                    }
                    let bits: Vec<u32> = ys.iter().map(|y| y.to_bits()).collect();
                    (bits, lanes.map(f32::to_bits))
                },
            )
        };
        let baseline = run(Level::Baseline);
        for level in forced::supported() {
            assert!(
                run(level) == baseline,
                "{level:?} differs from the baseline"
            );
        }
    }

    /// A tidy check, as rust-analyzer keeps them: every closure handed to [`vectorized`] (or
    /// [`at`]) in this crate's sources is `#[inline(always)]`, or its loops may run compiled
    /// for the baseline (nothing else would notice: every level computes the same bits).
    #[test]
    fn every_vectorized_call_is_inlined() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut calls = 0;
        let mut files = vec![src.clone()];
        while let Some(path) = files.pop() {
            if path.is_dir() {
                files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for call in ["vectorized(", "at(level, "] {
                for (at, _) in text.match_indices(call) {
                    let rest = text[at + call.len()..].trim_start();
                    let line = &text[text[..at].rfind('\n').map_or(0, |i| i + 1)..at];
                    let before = line.chars().next_back().unwrap_or(' ');
                    // Not another name's tail (`forced::at`, `product_at`), a string, the
                    // dispatch itself or a definition.
                    if before.is_alphanumeric()
                        || "_:\"".contains(before)
                        || rest.starts_with("work)")
                        || line.contains("fn ")
                    {
                        continue;
                    }
                    calls += 1;
                    assert!(
                        rest.starts_with("#[inline(always)]"),
                        "{}:{}: `{call}` takes an `#[inline(always)]` closure",
                        path.display(),
                        text[..at].lines().count()
                    );
                }
            }
        }
        assert!(
            calls >= 10,
            "found only {calls} calls: is the source path right?"
        );
    }

    #[test]
    fn the_detected_level_is_supported() {
        assert!(Level::detected().supported());
        assert!(Level::Baseline.supported());
    }
}
