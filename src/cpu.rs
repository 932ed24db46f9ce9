//! What this CPU offers the crate's vector paths, each asked of the CPU once and
//! remembered by the standard library (`is_x86_feature_detected!`).
//!
//! Every answer is no off x86_64, under loom (whose models have no vector paths to
//! run), and with `--cfg replaybuf_atomic_copy`, the sanitizer runs' build: there
//! every shared-memory access must be an atomic word the sanitizers see, so the
//! `asm!` loads and stores these features select are left out.
//!
//! Layer: base.

/// Whether the vector paths are built at all (see the module docs).
const BUILT: bool = cfg!(all(
    target_arch = "x86_64",
    not(replaybuf_loom),
    not(replaybuf_atomic_copy)
));

/// AVX: 32-byte moves (`storage::atomic_copy`, a streaming append's stage).
#[inline]
pub(crate) fn avx() -> bool {
    #[cfg(target_arch = "x86_64")]
    return BUILT && std::arch::is_x86_feature_detected!("avx");
    #[allow(unreachable_code)]
    false
}

/// AVX2 and POPCNT: a descent's sixteen-child count (`sumtree/pick.rs`).
#[inline]
pub(crate) fn avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    return BUILT
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("popcnt");
    #[allow(unreachable_code)]
    false
}

/// AVX-512 foundation: 64-byte non-temporal stores of a streaming append's stage
/// (`storage::atomic_copy::store_stage`).
#[inline]
#[cfg_attr(
    not(all(
        target_arch = "x86_64",
        not(replaybuf_loom),
        not(replaybuf_atomic_copy)
    )),
    allow(dead_code)
)]
pub(crate) fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    return BUILT && std::arch::is_x86_feature_detected!("avx512f");
    #[allow(unreachable_code)]
    false
}
