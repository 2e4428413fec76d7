//! Element-wise math the kernels share: a branch-free `exp` the compiler vectorizes (libm's
//! `expf` is called one float at a time), and the SiLU built on it.

/// Largest input whose exponential is a finite f32.
const EXP_HI: f32 = 88.37626;
/// Below this the exponential is under f32's smallest normal; the result is flushed to 0.
const EXP_LO: f32 = -87.33654;

/// `1.5 · 2^23`: adding then subtracting it rounds an f32 of magnitude below `2^22` to the
/// nearest integer, and the sum's low mantissa bits are that integer, offset by its own bits.
const ROUNDER: f32 = 12_582_912.0;

/// `e^x` to within 2 ulp for finite `x` (Cephes' `expf`: `x = n ln 2 + r`, a degree-6
/// polynomial for `e^r`, `2^n` put into the exponent bits). Returns 0 below about -87.3
/// (including `-inf`), `inf` above about 88.4, NaN for NaN. Branch-free, so loops over slices
/// compile to SIMD.
///
/// `n` is rounded with `ROUNDER` and read back from the sum's bits, not with `f32::round` and
/// `as i32`: on x86-64's baseline (SSE2) `round` is a libm call and the saturating cast is
/// scalar code, either of which keeps the loop from vectorizing (about 5× slower).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let clamped = x.clamp(EXP_LO, EXP_HI);
    let shifted = clamped * std::f32::consts::LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let n_int = shifted.to_bits() as i32 - ROUNDER.to_bits() as i32;
    let r = clamped - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = 1.987_569_1e-4_f32;
    let p = p * r + 1.398_2e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5; // Cephes' 5.0000001e-1, which is 0.5 in f32
    let er = 1.0 + r + r * r * p;
    // 2^n in two halves so n = 128 (x near EXP_HI) stays representable.
    let half = n_int >> 1;
    let scale = |e: i32| f32::from_bits(((e + 127) << 23) as u32);
    let y = er * scale(half) * scale(n_int - half);
    let y = if x < EXP_LO { 0.0 } else { y };
    let y = if x > EXP_HI { f32::INFINITY } else { y };
    if x.is_nan() { x } else { y }
}

/// `x ← e^x` over a slice.
pub fn exp_in_place(xs: &mut [f32]) {
    for x in xs {
        *x = exp(*x);
    }
}

/// The logistic sigmoid `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// SiLU, `x · sigmoid(x)`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ulps(a: f32, b: f32) -> u32 {
        (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs() as u32
    }

    #[test]
    fn exp_matches_libm_within_two_ulp_over_its_range() {
        let mut worst = 0;
        let mut x = EXP_LO;
        while x < EXP_HI {
            worst = worst.max(ulps(exp(x), (x as f64).exp() as f32));
            x += 0.0137;
        }
        assert!(worst <= 2, "worst error {worst} ulp");
    }

    #[test]
    fn exp_saturates_and_propagates_nan() {
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(88.3).is_finite());
    }

    #[test]
    fn silu_is_x_times_sigmoid() {
        for x in [-30.0f32, -2.5, -0.1, 0.0, 0.3, 4.0, 40.0] {
            let want = x as f64 / (1.0 + (-x as f64).exp());
            assert!(
                (silu(x) as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{x}"
            );
        }
    }
}
