//! How a priority becomes a leaf's mass: in `f64`, times a power of two that the
//! buffer moves as its priorities move, rounded to an integer.
//!
//! A row of priority `p` is drawn with probability `x / sum`, where `x = (p + eps)^alpha`.
//! The trees keep exact integer sums (`sumtree/`), so `x` must become an integer: its
//! **mass** `m = round(x * 2^s)`, with one exponent `s` for the whole buffer (a draw
//! picks a shard by its root's mass, so every tree counts in the same units). The
//! rounding costs a row with mass `m` a relative error of at most `0.5 / m`, and a leaf
//! keeps 26 significant bits (2^-27 more). A positive `x` never rounds below one unit:
//! no positive priority loses its mass.
//!
//! # Choosing the exponent
//!
//! Sums must fit a `u64`, so a leaf holds at most `value_max = u64::MAX / leaves`
//! (and less than 2^63; per shard, the same bound for every shard: that of the
//! largest). Let `top` be its `log2`, 43 for a million leaves per shard and 53 for a
//! thousand. The exponent keeps
//! the heavy end of the buffer near `2^(top - HEADROOM_BITS)`:
//!
//! - **Lowered** when a write would give a leaf more than `value_max`: the exponent
//!   drops until that mass sits at `2^(top - HEADROOM_BITS)`. Nothing saturates; a
//!   priority only rises `2^HEADROOM_BITS`-fold (at `alpha = 1`) past the heaviest
//!   before the next lowering.
//! - **Raised** when, after a write, the buffer's total mass has fallen below
//!   `2^(top - 3 * HEADROOM_BITS)`: the exponent rises until the total is about
//!   `2^(top - HEADROOM_BITS)`, but never so far that the priority new rows enter
//!   with (the largest seen, or with `max_priority_within_buffer` the largest stored)
//!   would need more than that. A buffer whose new rows are certain to come back at
//!   the old maximum keeps room for them, instead of rescaling back and forth.
//!
//! Both moves are bounded by the same hysteresis: a lowering leaves a total of at least
//! `2^(top - HEADROOM_BITS)`, a raise leaves every mass at most that, so neither
//! undoes the other without the priorities themselves moving by a factor of
//! `2^HEADROOM_BITS` or more (the largest seen only grows, so with the default new-row
//! priority the lowerings are bounded by how far it grows).
//!
//! # What "within 1%" holds for
//!
//! Once writes have returned, the total is at least `2^(top - 9)` units (unless the
//! buffer is empty), so a row whose probability is at least `64 / 2^(top - 9)` has at
//! least 64 units and is drawn within 0.8% of `x / sum` (the rounding's half unit; the
//! 26-bit leaves add under 1e-8, the power under 1e-10): every row with a probability of
//! at least `2^-(top - 15)`, about 3.7e-9 with a million leaves per shard and 1.8e-12
//! with a thousand. Where the new rows' priority capped a raise, that priority's mass
//! is about `2^(top - 3)` units and the same holds relative to it: a row whose `x` is
//! at least `2^-(top - 9)` of that priority's is within 1%. Any two priorities alone,
//! anywhere in the finite range (`1e-8` and `2e-8`, or `1e7` and `1e8`), are exact to
//! that, as long as the new rows' priority is not far above them: by default it is the
//! largest ever seen, which never falls, so after one outlier (`1e16` beside rows of 1
//! and 2 at `alpha = 1`) every row of an ordinary priority keeps about one unit and is
//! drawn almost uniformly, its weight 1, until the buffer is emptied. With
//! `max_priority_within_buffer` (new rows at the largest stored) the raise comes back
//! once the outlier row is overwritten or updated. A fix would let new rows' masses
//! saturate at `value_max` instead of capping the raise.
//!
//! What no 64-bit integer sum can hold is a buffer whose masses span more than that:
//! `1e-8` beside `1e8` at `alpha = 1` is a ratio of 1e16. The light row keeps
//! one unit, so it is drawn with a probability of `1 / total` instead (at most
//! `2^-(top - 9)`, about 5.8e-11 with a million leaves per shard): never lost, as a
//! float sum loses it (cpprb's `f64` trees drop rows below 2^-53 of the total), but not
//! exact either. The tests of `tests/prioritized_range.rs` check both sides.
//!
//! # Changing the exponent (and alpha)
//!
//! The exponent lives in the region (`Global::MassScale`) beside `alpha`, with an
//! epoch that every change of either bumps: `| epoch (32 bits) | offset (i32) |`, the
//! offset counted from `top - HEADROOM_BITS`, so a zeroed region starts with priority
//! 1 at the top. A leaf is a cache of its raw priority's mass under the current word;
//! every writer keeps it so (see `leaf_writes.rs`): it reads the word (then alpha),
//! computes and writes, then reads the word again and, if it moved, brings the leaves it
//! wrote to the new word from their raw priorities. Whoever moves the word (a rescale,
//! `set_alpha`) then brings every leaf of every tree to it the same way, chunk by chunk.
//! A `SeqCst` fence between a writer's leaves and its check, and another between a
//! move and its pass (see `leaf_writes.rs`): a writer whose leaf lands after the pass
//! went by reads the new word on its check, and one that checked before the word moved
//! wrote before the pass came. Masses of two words may sit side by side while a pass runs (draws follow the
//! mix for that long, as during `set_alpha` before); each is at most `value_max`, so
//! the sums never overflow. A pass over a million leaves takes tens of milliseconds,
//! in the write that moved the word; other threads go on meanwhile. (A process of a
//! shared buffer that dies during its pass leaves the rest of the leaves under the old
//! word until the next pass, or a recovery rebuilds them.)
//!
//! Layer: algos.

/// Bits of room above the heaviest mass after a lowering, and between a raise's
/// target total and `value_max`.
pub(crate) const HEADROOM_BITS: i32 = 3;

/// A raise happens when the total falls this many bits below `top`.
const LOW_WATER_BITS: i32 = 3 * HEADROOM_BITS;

/// The exponent's range: wide enough for any finite priority under any `alpha` up to
/// [`ALPHA_MAX`] (`alpha * log2(p + eps)` lies within `±1100 * ALPHA_MAX`).
const EXPONENT_LIMIT: i64 = 1 << 31;

/// The largest `alpha` accepted: bounds the exponent a mass can need.
pub(crate) const ALPHA_MAX: f64 = 1_048_576.0;

/// The mass scale word: which masses the leaves are computed with.
///
/// ```text
///  63              32 31                0
/// +------------------+-------------------+
/// |  epoch (32 bits) |  offset (i32)     |
/// +------------------+-------------------+
/// exponent = top - HEADROOM_BITS + offset
/// ```
///
/// The epoch counts changes of the offset and of `alpha`, wrapping: a writer compares
/// whole words, and would have to sleep through 2^32 changes inside one write to be
/// fooled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Scale(u64);

impl Scale {
    pub(crate) fn from_bits(bits: u64) -> Scale {
        Scale(bits)
    }

    pub(crate) fn bits(self) -> u64 {
        self.0
    }

    fn offset(self) -> i64 {
        i64::from(self.0 as u32 as i32)
    }

    /// The next word: the epoch bumped, the offset `offset`.
    pub(crate) fn next(self, offset: i64) -> Scale {
        let epoch = (self.0 >> 32).wrapping_add(1) & 0xFFFF_FFFF;
        Scale((epoch << 32) | u64::from(offset as i32 as u32))
    }

    /// The same offset under a new epoch (`alpha` changed).
    pub(crate) fn bumped(self) -> Scale {
        self.next(self.offset())
    }
}

/// `log2` of the largest mass a leaf may hold, rounded down.
fn top(value_max: u64) -> i64 {
    i64::from(63 - value_max.max(1).leading_zeros())
}

/// `2^e` for `|e| <= 1022`.
const fn pow2(e: i64) -> f64 {
    f64::from_bits(((1023 + e) as u64) << 52)
}

/// A priority too heavy for the scale it was computed under: `log2` of its unscaled
/// mass `(p + eps)^alpha`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TooHeavy(pub(crate) f64);

/// Everything a mass is computed with, as one writer read it: the scale word, `alpha`
/// and `eps`, and the leaves' bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MassFn {
    scale: Scale,
    alpha: f64,
    eps: f64,
    value_max: u64,
    /// `value_max` as a float (exact: a leaf's bound has 26 significant bits).
    value_max_f: f64,
    exponent: i64,
    /// `2^exponent` as two factors, each a normal float.
    factors: (f64, f64),
    /// Whether bases within [`POWER_BASES`] take `powers.rs`'s power (`alpha` in
    /// `(0, 1)`, but 0.5, whose powers are square roots).
    takes_powers: bool,
}

/// Bases `p + eps` that take `powers.rs`'s power (see [`MassFn::mass`]): `2^±100`, whose
/// powers under `alpha` below 1 are normal and within that range too.
const POWER_BASES: std::ops::RangeInclusive<f64> = pow2(-100)..=pow2(100);

impl MassFn {
    pub(crate) fn new(scale: Scale, alpha: f64, eps: f64, value_max: u64) -> MassFn {
        let exponent = (top(value_max) - i64::from(HEADROOM_BITS) + scale.offset())
            .clamp(-EXPONENT_LIMIT, EXPONENT_LIMIT);
        let half = (exponent / 2).clamp(-1022, 1022);
        let rest = (exponent - half).clamp(-1022, 1022);
        MassFn {
            scale,
            alpha,
            eps,
            value_max,
            value_max_f: value_max as f64,
            exponent,
            factors: (pow2(half), pow2(rest)),
            takes_powers: alpha > 0.0 && alpha < 1.0 && alpha != 0.5,
        }
    }

    /// The scale word this was computed from.
    pub(crate) fn scale(&self) -> Scale {
        self.scale
    }

    /// `alpha * log2(p + eps)`, without overflowing where `p + eps` would.
    fn log2_unscaled(&self, p: f64) -> f64 {
        let base = p + self.eps;
        let log = if base.is_finite() {
            base.log2()
        } else {
            let (hi, lo) = (p.max(self.eps), p.min(self.eps));
            hi.log2() + (lo / hi).ln_1p() * std::f64::consts::LOG2_E
        };
        if self.alpha == 0.0 {
            0.0
        } else {
            self.alpha * log
        }
    }

    /// What `units` of mass are worth in `(p + eps)^alpha`: a sum or a minimum of
    /// leaves read back in the priorities' own units.
    pub(crate) fn value_of(&self, units: f64) -> f64 {
        let x = units / self.factors.0 / self.factors.1;
        if x.is_normal() || units == 0.0 || self.exponent.abs() <= 2 * 1022 {
            x
        } else {
            // Past the float range with the factors: the same number through logarithms.
            (units.log2() - self.exponent as f64).exp2()
        }
    }

    /// The mass of priority `p` (finite, not negative, as a raw word keeps it) in
    /// leaf units; [`TooHeavy`] if it would pass the leaves' bound.
    ///
    /// `(p + eps)^alpha` is exact for `alpha` 1 and 0.5, and otherwise `powers.rs`'s
    /// power where its base is within `2^±100` (a relative error under 1e-10, the same
    /// bits on every CPU and in [`MassFn::masses`]' batches); an `f64` power
    /// elsewhere, and logarithms past the `f64` range: a positive priority never rounds
    /// to nothing and a large one never overflows.
    #[inline]
    pub(crate) fn mass(&self, p: f64) -> Result<u64, TooHeavy> {
        let base = p + self.eps;
        let power = self
            .takes_power(base)
            .then(|| crate::powers::power(base, self.alpha));
        self.mass_with(p, base, power)
    }

    /// The masses of priorities `ps`, each to `each` with its position, as
    /// [`MassFn::mass`] gives it (the same bits), their powers taken together
    /// (`powers.rs`: a vector of them at once). `room` holds the powers meanwhile.
    pub(crate) fn masses(
        &self,
        ps: &[f64],
        room: &mut Vec<f64>,
        mut each: impl FnMut(usize, Result<u64, TooHeavy>),
    ) {
        room.clear();
        if self.takes_powers {
            // The bases outside the power's range take one of 1 meanwhile, unused.
            room.extend(ps.iter().map(|&p| {
                let base = p + self.eps;
                if POWER_BASES.contains(&base) {
                    base
                } else {
                    1.0
                }
            }));
            crate::powers::powers(room, self.alpha);
        }
        for (i, &p) in ps.iter().enumerate() {
            let base = p + self.eps;
            each(
                i,
                self.mass_with(p, base, self.takes_power(base).then(|| room[i])),
            );
        }
    }

    /// Whether base `p + eps` takes `powers.rs`'s power.
    #[inline(always)]
    fn takes_power(&self, base: f64) -> bool {
        self.takes_powers && POWER_BASES.contains(&base)
    }

    /// [`MassFn::mass`] of `p`, whose base `p + eps` is `base`, and whose power is
    /// `power` where it takes `powers.rs`'s.
    #[inline(always)]
    fn mass_with(&self, p: f64, base: f64, power: Option<f64>) -> Result<u64, TooHeavy> {
        let x = match power {
            Some(x) => x,
            None if self.alpha == 1.0 => base,
            None if self.alpha == 0.5 => base.sqrt(),
            None => base.powf(self.alpha),
        };
        // `powers.rs`'s power is normal: its base is within `2^±100` and `alpha` in
        // `(0, 1)`.
        let y = if power.is_some() || x.is_normal() || base == 0.0 {
            x * self.factors.0 * self.factors.1
        } else {
            // Past the float range unscaled (alpha above 1, or p + eps overflowing):
            // the same number through logarithms.
            (self.log2_unscaled(p) + self.exponent as f64).exp2()
        };
        if y <= self.value_max_f {
            // Below 2^63 (`value_max` is): the signed conversion is the short one.
            let m = (y + 0.5) as i64 as u64;
            // A positive priority keeps at least one unit, however light.
            Ok(if base > 0.0 { m.max(1) } else { m })
        } else if self.exponent == -EXPONENT_LIMIT {
            // Beyond any exponent: unreachable with alpha at most ALPHA_MAX.
            Ok(self.value_max)
        } else {
            Err(TooHeavy(self.log2_unscaled(p)))
        }
    }

    /// The scale word that puts a mass of `log2` `heavy` at `2^(top - HEADROOM_BITS)`,
    /// if that is lower than this one's; `current` is the word now.
    pub(crate) fn lowered_for(&self, current: Scale, heavy: TooHeavy) -> Option<Scale> {
        let want = (i64::from(-HEADROOM_BITS) + top(self.value_max)
            - (heavy.0.ceil() as i64).clamp(-EXPONENT_LIMIT, EXPONENT_LIMIT))
        .max(-EXPONENT_LIMIT);
        let now = top(self.value_max) - i64::from(HEADROOM_BITS) + current.offset();
        (want < now).then(|| current.next(want - top(self.value_max) + i64::from(HEADROOM_BITS)))
    }

    /// Whether a total of `total` units (under this function) is below the low-water
    /// mark `2^(top - 3 * HEADROOM_BITS)`, and not zero.
    pub(crate) fn is_light(&self, total: u128) -> bool {
        total > 0 && self.under_low_water(total)
    }

    /// Whether `units` is below the low-water mark.
    pub(crate) fn under_low_water(&self, units: impl Into<u128>) -> bool {
        units.into() < 1u128 << (top(self.value_max) - i64::from(LOW_WATER_BITS))
    }

    /// The scale word that raises a total of `total` units (under this function) to
    /// about `2^(top - HEADROOM_BITS)`, if the total is below the low-water mark
    /// `2^(top - 3 * HEADROOM_BITS)`, without taking the new rows' priority
    /// `new_row` past `2^(top - HEADROOM_BITS)`.
    pub(crate) fn raised_for(&self, total: u128, new_row: f64) -> Option<Scale> {
        let top = top(self.value_max);
        if !self.is_light(total) {
            return None;
        }
        // ceil(log2(total))
        let total_bits = i64::from(128 - (total - 1).leading_zeros());
        let by_total = top - i64::from(HEADROOM_BITS) - total_bits;
        // The exponent at which a new row's mass would sit at the target.
        let new_row_bits = self.log2_unscaled(new_row).ceil();
        let by_new_row = if new_row_bits.is_finite() {
            top - i64::from(HEADROOM_BITS) - new_row_bits as i64 - self.exponent
        } else {
            by_total
        };
        let by = by_total.min(by_new_row);
        (by > 0).then(|| {
            let exponent = (self.exponent + by).min(EXPONENT_LIMIT);
            self.scale.next(exponent - top + i64::from(HEADROOM_BITS))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sumtree::value_max;

    fn at(offset: i64, alpha: f64, leaves: usize) -> MassFn {
        MassFn::new(Scale(0).next(offset), alpha, 0.0, value_max(leaves))
    }

    #[test]
    fn priority_one_starts_at_the_top_less_the_headroom() {
        for leaves in [1, 4, 1000, 1 << 20] {
            let f = MassFn::new(Scale(0), 0.6, 0.0, value_max(leaves));
            assert_eq!(
                f.mass(1.0),
                Ok(1 << (top(value_max(leaves)) - i64::from(HEADROOM_BITS)))
            );
        }
        assert_eq!(top(value_max(1 << 20)), 43);
    }

    #[test]
    fn masses_follow_the_formula_and_stay_positive() {
        let f = at(-20, 0.6, 1000);
        let unit = 2f64.powi((top(value_max(1000)) - 3 - 20) as i32);
        for p in [1e-3, 0.5, 1.0, 3.7, 1e3] {
            let m = f.mass(p).unwrap() as f64;
            let exact = p.powf(0.6) * unit;
            assert!((m - exact).abs() <= 0.5 + exact * 1e-6, "{p}");
        }
        assert_eq!(f.mass(0.0), Ok(0));
        assert_eq!(f.mass(1e-300), Ok(1), "a positive priority keeps a unit");
        assert_eq!(at(0, 0.0, 4).mass(0.0), at(0, 0.0, 4).mass(7.0), "0^0 is 1");
        let alpha_two = MassFn::new(Scale(0), 2.0, 0.0, value_max(4));
        assert!(alpha_two.mass(1e-200).unwrap() >= 1);
        assert!(alpha_two.mass(1e200).is_err());
        let eps = MassFn::new(Scale(0).next(-1100), 1.0, f64::MAX, value_max(4));
        assert!(eps.mass(f64::MAX).is_ok(), "p + eps past f64::MAX");
    }

    #[test]
    fn the_batched_power_is_within_1e_minus_10_of_the_f64_one() {
        for alpha in [0.6, 0.3, 0.9999, 1e-3] {
            for k in -400..=400 {
                let base = 10f64.powf(f64::from(k) * 0.075);
                // A scale that puts this base's mass near 2^50 (exact in units).
                let lx = alpha * base.log2();
                let f = MassFn::new(Scale(0), alpha, 0.0, value_max(1));
                let g = MassFn::new(
                    Scale(0).next((50.0 - lx).round() as i64 - f.exponent),
                    alpha,
                    0.0,
                    value_max(1),
                );
                let exact = base.powf(alpha) * 2f64.powi(g.exponent as i32);
                let got = g.mass(base).unwrap() as f64;
                assert!(
                    (got - exact).abs() <= exact * 1e-10,
                    "{base:e}^{alpha}: {got} vs {exact}"
                );
            }
        }
    }

    #[test]
    fn a_batch_of_masses_is_each_mass() {
        // Priorities in and out of the power's range, zero, and too heavy ones, under
        // alphas that take the power and ones that do not.
        let ps: Vec<f64> = (-700..700)
            .map(|k| 10f64.powf(f64::from(k) * 0.43))
            .chain([0.0, 1.0, 3.5, f64::MAX])
            .collect();
        for alpha in [0.6, 0.5, 1.0, 2.0, 1e-3] {
            for (offset, eps) in [(0, 0.0), (-30, 1e-8), (40, 1e3)] {
                let f = MassFn::new(Scale(0).next(offset), alpha, eps, value_max(1000));
                let mut got = Vec::new();
                f.masses(&ps, &mut Vec::new(), |_, m| got.push(m));
                let each: Vec<_> = ps.iter().map(|&p| f.mass(p)).collect();
                assert_eq!(got, each, "alpha {alpha}, eps {eps}");
            }
        }
    }

    #[test]
    fn a_lowering_fits_the_heavy_mass_and_a_raise_the_total() {
        let f = at(0, 1.0, 1000);
        let heavy = f.mass(1e30).unwrap_err();
        let lower = f.lowered_for(f.scale(), heavy).unwrap();
        let g = MassFn::new(lower, 1.0, 0.0, value_max(1000));
        let m = g.mass(1e30).unwrap();
        let target = 1u64 << (top(value_max(1000)) - 3);
        assert!(m <= target && m > target / 2, "{m} vs {target}");
        assert_eq!(g.lowered_for(lower, heavy), None, "already low enough");
        // A tiny total rises to the target, unless new rows would not fit.
        let small = 1000u128;
        let up = f.raised_for(small, 1e-30).unwrap();
        let h = MassFn::new(up, 1.0, 0.0, value_max(1000));
        let scaled = small as f64 * 2f64.powi((h.exponent - f.exponent) as i32);
        assert!(scaled <= target as f64 && scaled > target as f64 / 2.0);
        let capped = f.raised_for(small, 1e-6).unwrap();
        let m = MassFn::new(capped, 1.0, 0.0, value_max(1000))
            .mass(1e-6)
            .unwrap();
        assert!(
            m <= target && m > target / 2,
            "a new row of 1e-6 at the target"
        );
        assert_eq!(
            f.raised_for(small, 1.0),
            None,
            "priority 1 is at the target already"
        );
        assert_eq!(
            f.raised_for(1 << 60, 1e-6),
            None,
            "a total above the low water"
        );
        assert_eq!(f.raised_for(0, 1e-6), None);
    }

    #[test]
    fn scale_words_keep_offset_and_count_epochs() {
        let s = Scale(0).next(-5);
        assert_eq!((s.offset(), s.0 >> 32), (-5, 1));
        assert_eq!(s.bumped().offset(), -5);
        assert_ne!(s.bumped(), s);
        let wrapped = Scale(u64::MAX).next(7);
        assert_eq!((wrapped.offset(), wrapped.0 >> 32), (7, 0));
    }
}
