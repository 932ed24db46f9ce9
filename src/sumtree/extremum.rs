//! The min or max of a run of leaves' mass codes: what a refresh of the min and max
//! trees' lowest level reads, once to work an entry out and once more to verify it
//! (`tree.rs`, `Tree::refresh`), over the `ARITY * ARITY` leaves below the entry.
//!
//! A collector's new rows change every entry over them, and beside a learner (whose
//! updates have spread the priorities of the rows they replace) each change is two
//! passes over 256 leaves: the collector's largest cost beside a learner that it does
//! not have alone. So it comes twice:
//!
//! - **Scalar**, for every machine and under loom: a `handshake_load` of each word.
//! - **AVX2**, where the CPU has it (`crate::cpu`): four words a register, one 32-byte
//!   load inside an `asm!` block as a descent's (`pick.rs`), and the codes (each
//!   word's low half) compared as the 32-bit lanes they are, the high halves masked
//!   out of the way.
//!
//! Both read each word as a refresh's ordering notes need (`tree.rs`; `docs/orderings.rs`
//! §7): a `SeqCst` load of each, after the compare-exchange or fence that comes before
//! the refresh. On x86-64 such a load is a plain load, and so is each aligned word of
//! the vector load: the block is opaque to the compiler (it reads memory, so nothing
//! moves across it), each aligned word is read whole, and x86 orders a vector load as
//! it orders any load: after every locked instruction and fence before it.
//!
//! Layer: algos.

use super::{Leaf, TreeKind};
use crate::sync::AtomicU64;

/// The entry of min or max tree `kind` over leaves whose words are `leaves`: a mass
/// code, not yet encoded for storage. `u64::MAX` (min) or 0 (max) if none has mass.
#[inline]
pub(super) fn of_leaves(kind: TreeKind, leaves: &[AtomicU64]) -> u64 {
    #[cfg(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    ))]
    if leaves.len().is_multiple_of(avx2::LANES) && crate::cpu::avx2() {
        // SAFETY: the CPU has AVX2; `leaves` is whole registers.
        return unsafe { avx2::of_leaves(kind, leaves) };
    }
    of_codes(kind, leaves.iter().map(crate::sync::handshake_load))
}

/// [`of_leaves`] of leaf words as read.
///
/// A leaf's code is its low half; one without mass is empty, which for the min tree is
/// `u64::MAX`: the min of the codes less one, wrapping, skips them (a code is below
/// 2^32 - 1).
#[inline(always)]
fn of_codes(kind: TreeKind, leaves: impl Iterator<Item = u64>) -> u64 {
    let code = |w: u64| Leaf::from_bits(w).code();
    match kind {
        TreeKind::Min => {
            let below = |w: u64| u64::from((code(w) as u32).wrapping_sub(1));
            from_below(leaves.fold(u64::from(u32::MAX), |acc, w| acc.min(below(w))))
        }
        TreeKind::Max => leaves.fold(0, |acc, w| acc.max(code(w))),
        TreeKind::Sum => unreachable!("the sum tree is kept by deltas"),
    }
}

/// The min entry from the least code less one: none if every leaf was empty.
#[inline(always)]
fn from_below(least: u64) -> u64 {
    match least {
        m if m == u64::from(u32::MAX) => u64::MAX,
        m => m + 1,
    }
}

#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::TreeKind;
    use crate::sync::AtomicU64;

    /// Words per register.
    pub(super) const LANES: usize = 4;

    /// [`super::of_leaves`] with AVX2. Each word is two 32-bit lanes, the code low:
    /// for the min, the code less one (a lane's own wrap) with the high lane set to
    /// all ones, so that it never wins; for the max, the code with the high lane
    /// cleared.
    ///
    /// # Safety
    /// The CPU has AVX2; `leaves.len()` is a multiple of [`LANES`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn of_leaves(kind: TreeKind, leaves: &[AtomicU64]) -> u64 {
        let words = leaves.chunks_exact(LANES).map(|four| {
            // SAFETY: four words of a live slice; the caller's CPU has AVX2.
            unsafe { crate::sumtree::pick::load_avx2(four.as_ptr()) }
        });
        match kind {
            TreeKind::Min => {
                let high = _mm256_set1_epi64x(!0xFFFF_FFFF);
                let one = _mm256_set1_epi64x(1);
                let least = words.fold(_mm256_set1_epi32(-1), |acc, v| {
                    let below = _mm256_or_si256(_mm256_sub_epi32(v, one), high);
                    _mm256_min_epu32(acc, below)
                });
                super::from_below(u64::from(across(least, |a, b| _mm_min_epu32(a, b))))
            }
            TreeKind::Max => {
                let low = _mm256_set1_epi64x(0xFFFF_FFFF);
                let most = words.fold(_mm256_setzero_si256(), |acc, v| {
                    _mm256_max_epu32(acc, _mm256_and_si256(v, low))
                });
                u64::from(across(most, |a, b| _mm_max_epu32(a, b)))
            }
            TreeKind::Sum => unreachable!("the sum tree is kept by deltas"),
        }
    }

    /// The eight 32-bit lanes of `v` folded into one by `f` (an unsigned min or max),
    /// halves against halves.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn across(v: __m256i, f: impl Fn(__m128i, __m128i) -> __m128i) -> u32 {
        let v = f(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let v = f(v, _mm_shuffle_epi32::<0b01_00_11_10>(v));
        let v = f(v, _mm_shuffle_epi32::<0b10_11_00_01>(v));
        _mm_cvtsi128_si32(v) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words of lap `lap` with masses `masses` (zero: an empty leaf of that lap).
    fn words(lap: u32, masses: &[u64]) -> Vec<AtomicU64> {
        masses
            .iter()
            .map(|&m| AtomicU64::new(Leaf::new(lap, m).bits()))
            .collect()
    }

    fn scalar(kind: TreeKind, w: &[AtomicU64]) -> u64 {
        of_codes(
            kind,
            w.iter().map(|a| a.load(crate::sync::Ordering::Relaxed)),
        )
    }

    /// Every length up to two nodes of leaves, masses from a few to near 2^64, empty
    /// leaves among them and laps whose bits would win a comparison of whole words: the
    /// entry `of_leaves` gives (by AVX2 where the CPU has it) is the scalar fold's.
    #[test]
    fn a_run_of_leaves_gives_the_scalar_folds_entry() {
        let mut rng = crate::rng::stream(0x2545_f491, crate::rng::Stream::Call(0));
        let mut next = move || rand::Rng::next_u64(&mut rng);
        for len in 0..=2 * super::super::ARITY * super::super::ARITY / 8 {
            for round in 0..20 {
                let masses: Vec<u64> = (0..len)
                    .map(|_| match next() % 8 {
                        0 => 0,
                        1 => 1,
                        2 => next() >> (next() % 64),
                        _ => (next() >> 24) + round,
                    })
                    .collect();
                let lap = [0, 1, u32::MAX, next() as u32][round as usize % 4];
                let w = words(lap, &masses);
                for kind in [TreeKind::Min, TreeKind::Max] {
                    assert_eq!(
                        of_leaves(kind, &w),
                        scalar(kind, &w),
                        "{kind:?} of {masses:?} at lap {lap}"
                    );
                }
            }
        }
    }

    #[test]
    fn empty_leaves_make_no_entry_and_one_mass_makes_its_code() {
        let empty = words(5, &[0; 16]);
        assert_eq!(of_leaves(TreeKind::Min, &empty), u64::MAX);
        assert_eq!(of_leaves(TreeKind::Max, &empty), 0);
        let mut masses = [0u64; 256];
        masses[200] = 12_345;
        let one = words(u32::MAX, &masses);
        let code = Leaf::new(0, 12_345).code();
        assert_eq!(of_leaves(TreeKind::Min, &one), code);
        assert_eq!(of_leaves(TreeKind::Max, &one), code);
        masses[3] = 7;
        masses[255] = 1 << 60;
        let three = words(9, &masses);
        assert_eq!(of_leaves(TreeKind::Min, &three), Leaf::new(0, 7).code());
        assert_eq!(
            of_leaves(TreeKind::Max, &three),
            Leaf::new(0, 1 << 60).code()
        );
    }
}
