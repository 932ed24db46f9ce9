//! `x^y` for a batch of `x` and one `y`, in `f64`: the same bits on every CPU, and
//! for one number as for many.
//!
//! A prioritized learner's step raises every sampled row's probability ratio to
//! `beta` (its weight) and every updated priority to `alpha` (its mass): 256 of each
//! a step, where the C library's `powf`, a call each, took 6-7% of the step
//! (`replaybuf bench`'s `sample+update-paired` with the powers left out, MEASURED.md).
//! Here a power is `2^(y * log2 x)`, each half a short polynomial:
//!
//! - `log2 x`: `x = 2^k * m` with `m` in `[sqrt(1/2), sqrt(2))`, read off the bits
//!   (the mantissas above `sqrt 2` counted in the binade above), then
//!   `ln m = 2 atanh(s)`, `s = (m - 1) / (m + 1)`, `|s| <= 0.1716`, by its series to
//!   `s^11`;
//! - `2^t`: `t = n + r` with `n` the nearest integer and `|r| <= 1/2`, `2^r` by its
//!   Taylor series to `r^9`, and `2^n` written into the exponent bits.
//!
//! Both are adds, multiplies and one divide with no branch and no table, so a loop
//! over a slice compiles to vector instructions: [`powers`] is built for the baseline
//! CPU and for AVX2, and takes AVX2 where the CPU has it (a loop of 256 `f32`s on this
//! project's Xeon host: the C library's `powf` 1.27 µs, AVX2 here 0.65-0.68). Not
//! AVX-512: its 512-bit multiplies, tried, made the whole step slower than `powf`
//! did (39.1 -> 41.7 µs a step, six runs each way: the core's clock drops for a
//! while after them), where AVX2's made it faster. No fused multiply-add: an add, a
//! multiply and a divide round the same in every lane of every width, so every path
//! gives the same bits, and [`power`], one number on the baseline path, gives what
//! [`powers`] gives. A leaf's mass computed in an update's batch is then the mass a
//! later check recomputes from the raw priority alone, on any machine.
//!
//! Accuracy: within `1e-10` of the exact power, relative (`3e-11` for `y` up to 1),
//! for `x` positive and normal and `|y * log2 x|` at most 1022 (`tests` sweeps it
//! against `f64::powf`). Beyond that `y * log2 x` is clamped to `[-1022, 1023]`, so a
//! result is never zero, infinite or NaN for such `x`; `0^y` is `0`, and `0^0` is
//! `1`. Negative, subnormal, infinite and NaN `x` are not powers this module takes.
//!
//! The floors crate builds this file too (`floors/src/lib.rs`), so that the plain
//! prioritized step it times the buffer against raises its numbers the same way.
//!
//! Layer: base.

use std::f64::consts::{LN_2, LOG2_E};

/// The bits of `sqrt(1/2)`: `x`'s bits less these split into `k` (above the mantissa)
/// and `m`'s mantissa (below).
const SQRT_HALF_BITS: u64 = 0x3fe6_a09e_667f_3bcd;
const MANTISSA: u64 = (1 << 52) - 1;
/// `2^52`: a 12-bit integer `i` or'ed into its mantissa gives `2^52 + i`.
const TWO_52: f64 = 4_503_599_627_370_496.0;
/// `1.5 * 2^52`: `t + ROUND - ROUND` is `t` rounded to the nearest integer, and the
/// low bits of `t + ROUND` hold that integer.
const ROUND: f64 = 6_755_399_441_055_744.0;

/// `atanh(s) / s = 1 + z/3 + z^2/5 + ...` for `z = s^2`, past its first term.
const ATANH: [f64; 5] = [1.0 / 3.0, 1.0 / 5.0, 1.0 / 7.0, 1.0 / 9.0, 1.0 / 11.0];

/// `2^r = sum (r ln 2)^i / i!`, its coefficients `ln(2)^i / i!`.
const EXP2: [f64; 10] = [
    1.0,
    LN_2,
    0.240_226_506_959_100_7,
    0.055_504_108_664_821_58,
    0.009_618_129_107_628_477,
    0.001_333_355_814_642_844_1,
    0.000_154_035_303_933_816_06,
    1.525_273_380_405_983_8e-5,
    1.321_548_679_014_430_5e-6,
    1.017_808_600_923_969_6e-7,
];

/// `x^y` as [`powers`] computes it for one number (the same bits).
#[inline]
pub(crate) fn power(x: f64, y: f64) -> f64 {
    power_of(x, y, zero_power(y))
}

/// Raises every number of `xs` to `y`, in place; see the module docs for which `x`
/// (and whose bits).
pub(crate) fn powers(xs: &mut [f64], y: f64) {
    raise(xs, y)
}

/// [`powers`] for `f32` numbers, each raised in `f64` and rounded once.
pub(crate) fn powers_f32(xs: &mut [f32], y: f64) {
    raise(xs, y)
}

/// A float a power is taken of: an `f64`, or an `f32` widened (exactly) first.
trait Float: Copy {
    fn wide(self) -> f64;
    fn narrow(x: f64) -> Self;
}

impl Float for f64 {
    #[inline(always)]
    fn wide(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(x: f64) -> f64 {
        x
    }
}

impl Float for f32 {
    #[inline(always)]
    fn wide(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn narrow(x: f64) -> f32 {
        x as f32
    }
}

/// [`powers`] on the widest vector path this CPU has.
fn raise<F: Float>(xs: &mut [F], y: f64) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2.
        return unsafe { raise_avx2(xs, y) };
    }
    raise_with(xs, y)
}

/// [`raise_with`] compiled for AVX2.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn raise_avx2<F: Float>(xs: &mut [F], y: f64) {
    raise_with(xs, y)
}

#[inline(always)]
fn raise_with<F: Float>(xs: &mut [F], y: f64) {
    let zero = zero_power(y);
    for x in xs {
        *x = F::narrow(power_of(x.wide(), y, zero));
    }
}

/// `0^y`: `1` for `y = 0`, else `0`.
#[inline(always)]
fn zero_power(y: f64) -> f64 {
    if y == 0.0 {
        1.0
    } else {
        0.0
    }
}

/// `x^y`, with `0^y` given as `zero` (so that a loop of these selects it, rather than
/// branching on `y`).
#[inline(always)]
fn power_of(x: f64, y: f64, zero: f64) -> f64 {
    debug_assert!(x == 0.0 || (x.is_normal() && x > 0.0), "no power of {x}");
    // x = 2^k * m. Below sqrt(1/2) the subtraction borrows from the exponent bits,
    // whose 12 bits then read k + 4096: flipping the top one makes them k + 2048 for
    // every k, which the double's mantissa turns into a float.
    let u = x.to_bits().wrapping_sub(SQRT_HALF_BITS);
    let k = f64::from_bits(TWO_52.to_bits() | ((u >> 52) ^ 0x800)) - (TWO_52 + 2048.0);
    let m = f64::from_bits((u & MANTISSA) + SQRT_HALF_BITS);
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let z = s * s;
    let series = horner(&ATANH, z);
    let ln_m = 2.0 * s + 2.0 * s * z * series;
    let t = (y * (k + ln_m * LOG2_E)).clamp(-1022.0, 1023.0);
    // 2^t = 2^n * 2^r.
    let shifted = t + ROUND;
    let n = shifted - ROUND;
    let r = t - n;
    let two_r = horner(&EXP2, r);
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let two_n = f64::from_bits(n_bits.wrapping_add(1023) << 52);
    if x > 0.0 {
        two_r * two_n
    } else {
        zero
    }
}

/// `c[0] + c[1] x + c[2] x^2 + ...`, from the highest term down.
#[inline(always)]
fn horner<const N: usize>(c: &[f64; N], x: f64) -> f64 {
    let (&last, rest) = c.split_last().expect("a polynomial has a term");
    rest.iter().rev().fold(last, |acc, &c| acc * x + c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bases from 1e-300 to 1e300 a little over 0.1% apart, and a few of each
    /// binade's edges.
    fn bases() -> Vec<f64> {
        let mut xs = Vec::new();
        let mut x = 1e-300;
        while x < 1e300 {
            xs.push(x);
            x *= 1.0013;
        }
        for e in -1000..1000 {
            let two = 2f64.powi(e);
            xs.extend([
                two,
                two * std::f64::consts::FRAC_1_SQRT_2,
                two * 1.999_999_999,
            ]);
        }
        xs
    }

    #[test]
    fn powers_are_within_1e_minus_10_of_the_exact_ones() {
        let xs = bases();
        for y in [0.4, 0.6, 0.5, 1.0, 1e-3, 0.999_9, 2.0, 3.7] {
            let mut got = xs.clone();
            powers(&mut got, y);
            for (&x, &p) in xs.iter().zip(&got) {
                let exact = x.powf(y);
                if (y * x.log2()).abs() > 1022.0 {
                    // Clamped: a positive, finite number, never zero.
                    assert!(p > 0.0 && p.is_finite(), "{x:e}^{y}: {p:e}");
                    continue;
                }
                let error = ((p - exact) / exact).abs();
                assert!(error < 1e-10, "{x:e}^{y}: {p:e} vs {exact:e} ({error:e})");
            }
        }
    }

    #[test]
    fn one_number_and_every_vector_path_give_the_same_bits() {
        let xs = bases();
        for y in [0.4, 0.6, 0.123, 2.5] {
            let mut fast = xs.clone();
            powers(&mut fast, y);
            let mut baseline = xs.clone();
            raise_with(&mut baseline, y);
            for ((&x, &a), &b) in xs.iter().zip(&fast).zip(&baseline) {
                assert_eq!(a.to_bits(), power(x, y).to_bits(), "{x:e}^{y}");
                assert_eq!(a.to_bits(), b.to_bits(), "{x:e}^{y}");
            }
            // Every length, so the vector loops' remainders take the same path.
            for n in 0..40 {
                let mut some = xs[1000..1000 + n].to_vec();
                powers(&mut some, y);
                assert_eq!(some, fast[1000..1000 + n]);
            }
        }
    }

    #[test]
    fn exact_cases_and_zero_stay_exact() {
        let mut xs = [0.0, 1.0, 2.0, 0.25, 1024.0];
        powers(&mut xs, 0.0);
        assert_eq!(xs, [1.0, 1.0, 1.0, 1.0, 1.0], "x^0 is 1, 0^0 too");
        // Powers of two to multiples of 1/2^k (here 1/2) are the exponent alone.
        let mut xs = [0.0, 1.0, 4.0, 0.25, 1024.0];
        powers(&mut xs, 0.5);
        assert_eq!(xs, [0.0, 1.0, 2.0, 0.5, 32.0]);
        let mut xs = [0.0f32, 1.0, 0.25, 1e-30];
        powers_f32(&mut xs, 1.0);
        assert_eq!(xs, [0.0, 1.0, 0.25, 1e-30]);
    }
}
