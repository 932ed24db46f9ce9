//! The choice a descent makes at each node: how many of a full node's children end, in
//! running total, at or before the target mass, and the running total before the child
//! that holds it.
//!
//! This is most of a prioritized sample's work (a million rows: three nodes a draw,
//! each sixteen words, below the summit a sample reads once, `tree.rs`), so it comes
//! three times:
//!
//! - **Scalar**, for every machine: the running totals unrolled into an array and
//!   counted by a binary search.
//! - **AVX2**, where the CPU has it (checked once a descent, `crate::cpu`): four words
//!   a register, their running totals by two permute-and-adds, all sixteen compared
//!   with the target at once and the answer a population count. With it (and each
//!   level's words taken once, `tree.rs`), a descent of 20,000 leaves runs 490
//!   instructions where it ran 625 (callgrind).
//! - **AVX-512**, where the CPU has it: eight words a register, their running totals
//!   by three lane shifts and adds, the comparison unsigned as it stands and the two
//!   masks counted. A million rows, `sample+update` of 256 (AMD EPYC family 26,
//!   2026-11-28, two rounds alternating): the sample 14.8-15.0 us where the AVX2
//!   count's took 17.0-17.2.
//!
//! All read the node's words as the descent's ordering notes allow (`tree.rs`): each
//! word some value it held, `Relaxed`, and no more. The vector counts load four or
//! eight words at a time through an `asm!` block, as `storage::atomic_copy` copies
//! rows: opaque to the compiler, so not a racy plain access in the language's model,
//! and on the hardware each aligned word of a 32- or 64-byte load is read whole (words
//! are 8-byte aligned, and the loads of AVX-capable CPUs are atomic per aligned 16
//! bytes). None needs more: a racing update may leave a node whose words disagree with
//! each other or its parent, and the descent's landing check catches whatever that
//! does to the draw.
//!
//! Running totals add modulo 2^64, as the sum tree does (`tree.rs`, `add_deltas`): a
//! node's true totals never pass 2^64, but words read mid-race may, and then the count
//! need not name a child whose total before is at most the target. The caller checks
//! that (`checked_sub`).
//!
//! Layer: algos.

use super::{decode_mass, ARITY};
use crate::sync::{AtomicU64, Ordering};

/// The mass of a node's word: a leaf word's decoded mass (`LEAVES`), or a sum entry.
#[inline(always)]
pub(super) fn mass<const LEAVES: bool>(w: &AtomicU64) -> u64 {
    let w = w.load(Ordering::Relaxed);
    if LEAVES {
        decode_mass(w)
    } else {
        w
    }
}

/// Which count [`count_full`] runs: the scalar one, or a vector one the CPU has.
pub(super) type Simd = u8;
/// The scalar count.
pub(super) const SCALAR: Simd = 0;
/// The AVX2 count (AVX2 and POPCNT).
pub(super) const AVX2: Simd = 1;
/// The AVX-512 count (AVX-512 foundation and POPCNT).
pub(super) const AVX512: Simd = 2;

/// For a full node (`LEAVES`: of leaf words), the number of children whose running
/// total is at most `t`, and the running total of the child before the one it names
/// (the total of all of them if every one is). A vector `SIMD` only where the CPU has
/// it.
#[inline(always)]
pub(super) fn count_full<const LEAVES: bool, const SIMD: Simd>(
    node: &[AtomicU64; ARITY],
    t: u64,
) -> (usize, u64) {
    #[cfg(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    ))]
    match SIMD {
        // SAFETY: `AVX2` is asked for only by a caller that checked the CPU has AVX2
        // and POPCNT.
        AVX2 => return unsafe { avx2::count::<LEAVES>(node, t) },
        // SAFETY: `AVX512` is asked for only by a caller that checked the CPU has
        // AVX-512 and POPCNT.
        AVX512 => return unsafe { avx512::count::<LEAVES>(node, t) },
        _ => {}
    }
    let mut totals = [0u64; ARITY + 1];
    for (k, w) in node.iter().enumerate() {
        totals[k + 1] = totals[k].wrapping_add(mass::<LEAVES>(w));
    }
    // Running totals only grow (unless a race wrapped one): a binary search counts
    // those at most `t`.
    let mut c = 0;
    let mut step = ARITY / 2;
    while step > 0 {
        c += if totals[c + step] <= t { step } else { 0 };
        step /= 2;
    }
    c += usize::from(totals[c + 1] <= t);
    (c, totals[c])
}

/// [`count_full`] for the last node of a level, which may have fewer children.
#[inline(always)]
pub(super) fn count_partial<const LEAVES: bool>(node: &[AtomicU64], t: u64) -> (usize, u64) {
    let (mut acc, mut before, mut c) = (0u64, 0u64, 0usize);
    for w in node {
        acc = acc.wrapping_add(mass::<LEAVES>(w));
        let past = acc <= t;
        c += usize::from(past);
        before = if past { acc } else { before };
    }
    (c, before)
}

/// Four words in one 32-byte load, for the other vector reads of the trees' words
/// (`extremum.rs`).
#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
pub(super) use avx2::load as load_avx2;

#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::super::{MANTISSA_BITS, MANTISSA_MASK};
    use super::ARITY;
    use crate::sync::AtomicU64;

    /// Words per register.
    const LANES: usize = 4;

    /// The four words at `p`, one 32-byte load (see the module docs).
    ///
    /// # Safety
    /// `p..p + 4` is inside one live slice of words; the CPU has AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(in crate::sumtree) unsafe fn load(p: *const AtomicU64) -> __m256i {
        let v: __m256i;
        // SAFETY: the caller's range is readable.
        unsafe {
            std::arch::asm!(
                "vmovdqu {v}, ymmword ptr [{p}]",
                p = in(reg) p,
                v = out(ymm_reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    /// [`super::count_full`] with AVX2.
    ///
    /// # Safety
    /// The CPU has AVX2 and POPCNT.
    #[inline]
    #[target_feature(enable = "avx2,popcnt")]
    pub(super) unsafe fn count<const LEAVES: bool>(
        node: &[AtomicU64; ARITY],
        t: u64,
    ) -> (usize, u64) {
        let zero = _mm256_setzero_si256();
        // Unsigned order through the signed compare: both sides' top bit flipped.
        let flip = _mm256_set1_epi64x(i64::MIN);
        let target = _mm256_xor_si256(_mm256_set1_epi64x(t as i64), flip);
        let mut carry = zero;
        // The masses of the children that end at or before `t`: what comes before the
        // one holding it. Summed in the registers rather than read back from the
        // totals, which would wait for the vector stores to forward.
        let mut before = zero;
        let mut at_most = 0u32;
        for q in 0..ARITY / LANES {
            // SAFETY: words `LANES * q..` of a node of `ARITY`.
            let mut v = unsafe { load(node.as_ptr().add(LANES * q)) };
            if LEAVES {
                // `decode_mass`, a lane each.
                let mantissa = _mm256_and_si256(v, _mm256_set1_epi64x(MANTISSA_MASK as i64));
                let exp = _mm256_and_si256(
                    _mm256_srli_epi64::<{ MANTISSA_BITS as i32 }>(v),
                    _mm256_set1_epi64x(63),
                );
                v = _mm256_sllv_epi64(mantissa, exp);
            }
            let masses = v;
            // [a, b, c, d] -> [a, a+b, b+c, c+d] -> [a, a+b, a+b+c, a+b+c+d], then the
            // totals of the registers before.
            let up1 = _mm256_blend_epi32::<0b0000_0011>(
                _mm256_permute4x64_epi64::<0b10_01_00_00>(v),
                zero,
            );
            v = _mm256_add_epi64(v, up1);
            let up2 = _mm256_blend_epi32::<0b0000_1111>(
                _mm256_permute4x64_epi64::<0b01_00_00_00>(v),
                zero,
            );
            v = _mm256_add_epi64(_mm256_add_epi64(v, up2), carry);
            carry = _mm256_permute4x64_epi64::<0b11_11_11_11>(v);
            let above = _mm256_cmpgt_epi64(_mm256_xor_si256(v, flip), target);
            before = _mm256_add_epi64(before, _mm256_andnot_si256(above, masses));
            let above = _mm256_movemask_pd(_mm256_castsi256_pd(above)) as u32;
            at_most |= (!above & 0b1111) << (LANES * q);
        }
        let halves = _mm_add_epi64(
            _mm256_castsi256_si128(before),
            _mm256_extracti128_si256::<1>(before),
        );
        let before = _mm_add_epi64(halves, _mm_unpackhi_epi64(halves, halves));
        (
            at_most.count_ones() as usize,
            _mm_cvtsi128_si64(before) as u64,
        )
    }
}

#[cfg(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
))]
mod avx512 {
    use std::arch::x86_64::*;

    use super::super::{MANTISSA_BITS, MANTISSA_MASK};
    use super::ARITY;
    use crate::sync::AtomicU64;

    /// The eight words at `p`, one 64-byte load (see the module docs).
    ///
    /// # Safety
    /// `p..p + 8` is inside one live slice of words; the CPU has AVX-512.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const AtomicU64) -> __m512i {
        let v: __m512i;
        // SAFETY: the caller's range is readable.
        unsafe {
            std::arch::asm!(
                "vmovdqu64 {v}, zmmword ptr [{p}]",
                p = in(reg) p,
                v = out(zmm_reg) v,
                options(nostack, readonly, preserves_flags),
            );
        }
        v
    }

    /// The masses of eight words: leaf words decoded (`LEAVES`), sum entries as they
    /// are.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn masses<const LEAVES: bool>(v: __m512i) -> __m512i {
        if !LEAVES {
            return v;
        }
        let mantissa = _mm512_and_si512(v, _mm512_set1_epi64(MANTISSA_MASK as i64));
        let exp = _mm512_and_si512(_mm512_srli_epi64::<MANTISSA_BITS>(v), _mm512_set1_epi64(63));
        _mm512_sllv_epi64(mantissa, exp)
    }

    /// Running totals of eight masses: three shift-and-adds, each lane moved up by
    /// one, two and four lanes (zeros coming in below).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn running(v: __m512i) -> __m512i {
        let zero = _mm512_setzero_si512();
        let v = _mm512_add_epi64(v, _mm512_alignr_epi64::<7>(v, zero));
        let v = _mm512_add_epi64(v, _mm512_alignr_epi64::<6>(v, zero));
        _mm512_add_epi64(v, _mm512_alignr_epi64::<4>(v, zero))
    }

    /// [`super::count_full`] with AVX-512: eight words a register, the comparison
    /// unsigned as it stands, and the count a population count of the two masks.
    ///
    /// # Safety
    /// The CPU has AVX-512 (foundation) and POPCNT.
    #[inline]
    #[target_feature(enable = "avx512f,popcnt")]
    pub(super) unsafe fn count<const LEAVES: bool>(
        node: &[AtomicU64; ARITY],
        t: u64,
    ) -> (usize, u64) {
        const LANES: usize = 8;
        // SAFETY: words `0..8` and `8..16` of a node of `ARITY`.
        let (lo, hi) = unsafe { (load(node.as_ptr()), load(node.as_ptr().add(LANES))) };
        let (lo, hi) = (masses::<LEAVES>(lo), masses::<LEAVES>(hi));
        let low_totals = running(lo);
        // The high half's totals go on from the low half's last.
        let carry = _mm512_permutexvar_epi64(_mm512_set1_epi64(LANES as i64 - 1), low_totals);
        let high_totals = _mm512_add_epi64(running(hi), carry);
        let target = _mm512_set1_epi64(t as i64);
        let (low_at_most, high_at_most) = (
            _mm512_cmple_epu64_mask(low_totals, target),
            _mm512_cmple_epu64_mask(high_totals, target),
        );
        // The masses of the children that end at or before `t`, as the AVX2 count
        // sums them.
        let before = _mm512_reduce_add_epi64(_mm512_add_epi64(
            _mm512_maskz_mov_epi64(low_at_most, lo),
            _mm512_maskz_mov_epi64(high_at_most, hi),
        ));
        let at_most = u32::from(low_at_most) | u32::from(high_at_most) << LANES;
        (at_most.count_ones() as usize, before as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node of `masses` (sum entries), or of leaf words of lap 7 with those masses.
    fn node(masses: &[u64; ARITY], leaves: bool) -> [AtomicU64; ARITY] {
        std::array::from_fn(|k| {
            AtomicU64::new(if leaves {
                super::super::Leaf::new(7, masses[k]).bits()
            } else {
                masses[k]
            })
        })
    }

    fn both<const LEAVES: bool>(n: &[AtomicU64; ARITY], t: u64) -> (usize, u64) {
        let scalar = count_full::<LEAVES, SCALAR>(n, t);
        if crate::cpu::avx2() {
            assert_eq!(count_full::<LEAVES, AVX2>(n, t), scalar, "AVX2, t = {t}");
        }
        if crate::cpu::avx512f() {
            assert_eq!(
                count_full::<LEAVES, AVX512>(n, t),
                scalar,
                "AVX-512, t = {t}"
            );
        }
        assert_eq!(count_partial::<LEAVES>(n, t), scalar, "t = {t}");
        scalar
    }

    #[test]
    fn the_counts_agree_on_every_boundary() {
        let mut rng = crate::rng::stream(0x9E37_79B9_7F4A_7C15u64, crate::rng::Stream::Call(0));
        let mut next = move || rand::Rng::next_u64(&mut rng);
        for round in 0..200 {
            // Some children empty, some huge (past 2^26, where leaves round), the
            // totals of a few rounds near 2^64.
            let masses: [u64; ARITY] = std::array::from_fn(|_| match next() % 4 {
                0 => 0,
                1 => next() % 100,
                2 => next() % (1 << 40),
                // Sixteen of these stay below 2^64.
                _ if round % 10 == 0 => next() >> 9,
                _ => next() % (1 << 20),
            });
            for leaves in [false, true] {
                let n = node(&masses, leaves);
                let of = |w: &AtomicU64| mass::<true>(w);
                let values: Vec<u64> = if leaves {
                    n.iter().map(of).collect()
                } else {
                    masses.to_vec()
                };
                let mut total = 0u64;
                for (k, &m) in values.iter().enumerate() {
                    for t in [total, total + m / 2, (total + m).wrapping_sub(1)] {
                        if m == 0 || total.checked_add(m).is_none() {
                            continue;
                        }
                        let got = if leaves {
                            both::<true>(&n, t)
                        } else {
                            both::<false>(&n, t)
                        };
                        assert_eq!(got, (k, total), "child {k} of {values:?}, t = {t}");
                    }
                    total = total.wrapping_add(m);
                }
            }
        }
    }

    #[test]
    fn a_target_past_the_node_counts_every_child() {
        let n = node(&[3; ARITY], false);
        assert_eq!(
            both::<false>(&n, 3 * ARITY as u64),
            (ARITY, 3 * ARITY as u64)
        );
        assert_eq!(both::<false>(&n, u64::MAX), (ARITY, 3 * ARITY as u64));
    }

    #[test]
    fn wrapped_totals_still_count_within_the_node() {
        // Words read mid-race that pass 2^64 together: the count is some child, and
        // whether its total before is at most the target is the caller's check.
        let n = node(&[u64::MAX / 2; ARITY], false);
        assert!(count_full::<false, SCALAR>(&n, 10).0 <= ARITY);
        assert!(count_partial::<false>(&n, 10).0 <= ARITY);
        if crate::cpu::avx2() {
            assert!(count_full::<false, AVX2>(&n, 10).0 <= ARITY);
        }
        if crate::cpu::avx512f() {
            assert!(count_full::<false, AVX512>(&n, 10).0 <= ARITY);
        }
    }
}
