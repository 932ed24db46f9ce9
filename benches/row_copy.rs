//! The choice of row copy out of shared slot memory (DESIGN.md, "Measured while
//! designing"): 256 random 168-byte mujoco rows, each after its 8-byte stamp in a
//! 176-byte slot, out of 1,000,000 slots into a 256-row destination. A racy plain
//! `copy_from_slice` (the speed target), one `AtomicU64` load per word, and the
//! crate's `internals::load`, each with and without a software prefetch of the batch's
//! rows first; the crate's own sliding prefetch window beside them. Both regions sit on
//! huge pages, as the crate's storage does.

// The loom-facade rule of .clippy.toml is for the library, not its benches.
#![allow(clippy::disallowed_types, clippy::disallowed_methods)]

use std::hint::black_box;
use std::sync::atomic::Ordering;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use memmap2::{MmapMut, MmapOptions};
use rand::{RngExt, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;
use replaybuf::bytemuck;
use replaybuf::internals::{load, AtomicU64};

/// Slots in the region.
const SLOTS: usize = 1_000_000;
/// The mujoco row: 165 payload bytes padded to 168.
const ROW_BYTES: usize = 168;
/// The stamp word and the row.
const SLOT_BYTES: usize = 8 + ROW_BYTES;
/// Rows copied per batch.
const BATCH: usize = 256;
/// Batches of precomputed indices, cycled through so that rows are not reused from
/// cache batch after batch (1M draws over the 1M slots).
const POOL_BATCHES: usize = 4096;
/// Cache lines prefetched per slot (as the crate does for a 176-byte slot).
const PREFETCH_LINES: usize = 3;
/// How many rows ahead the sliding window prefetches (the crate's
/// `SAMPLE_AHEAD_DRAWS`).
const AHEAD: usize = 16;

/// Whether and how the batch's rows are prefetched before they are copied.
#[derive(Clone, Copy)]
enum Prefetch {
    /// No prefetch: every row misses when it is copied.
    None,
    /// All of the batch's rows, then the copies.
    Pass,
    /// The first [`AHEAD`] rows, then row `k + AHEAD` before copying row `k`.
    Window,
}

/// Starts loading the first [`PREFETCH_LINES`] cache lines of `slot`.
#[inline]
fn prefetch_slot(base: *const u8, slot: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = base.wrapping_add(slot * SLOT_BYTES).cast::<i8>();
        for line in 0..PREFETCH_LINES {
            // SAFETY: a prefetch never faults and changes no memory, whatever the
            // address; this one is inside the region anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(line * 64)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (base, slot);
}

/// A zeroed anonymous mapping of `bytes`, on huge pages where the kernel allows, as the
/// crate's own storage is (`src/region/heap.rs`): random rows over 176 MB of 4 KiB
/// pages would time TLB misses rather than the copy.
fn huge_page_map(bytes: usize) -> MmapMut {
    let map = MmapOptions::new()
        .len(bytes)
        .map_anon()
        .expect("an anonymous mapping");
    #[cfg(target_os = "linux")]
    let _ = map.advise(memmap2::Advice::HugePage);
    map
}

/// The mapping as atomic words (what the unstable `AtomicU64::from_mut_slice` does).
fn as_atomic_words(map: &mut MmapMut) -> &[AtomicU64] {
    let words: &mut [u64] = bytemuck::cast_slice_mut(&mut map[..]);
    // SAFETY: the crate's `AtomicU64` is `#[repr(transparent)]` over std's, which has
    // the size and bit validity of `u64`, and `cast_slice_mut`
    // checked the 8-byte alignment it needs; the unique borrow of `map`, held as long as
    // the result, rules out any non-atomic access meanwhile.
    unsafe { &*(std::ptr::from_mut::<[u64]>(words) as *const [AtomicU64]) }
}

/// Copies the rows of `slots` into consecutive rows of `dst` with `copy_row`,
/// prefetching as `prefetch` says from the region at `base`.
#[inline]
fn gather(
    base: *const u8,
    slots: &[usize],
    dst: &mut [u8],
    prefetch: Prefetch,
    mut copy_row: impl FnMut(usize, &mut [u8]),
) {
    match prefetch {
        Prefetch::None => {}
        Prefetch::Pass => slots.iter().for_each(|&s| prefetch_slot(base, s)),
        Prefetch::Window => slots
            .iter()
            .take(AHEAD)
            .for_each(|&s| prefetch_slot(base, s)),
    }
    for (k, (&slot, row)) in slots
        .iter()
        .zip(dst.chunks_exact_mut(ROW_BYTES))
        .enumerate()
    {
        if let (Prefetch::Window, Some(&ahead)) = (prefetch, slots.get(k + AHEAD)) {
            prefetch_slot(base, ahead);
        }
        copy_row(slot, row);
    }
}

/// The row of `slot`, racy: a plain copy out of a plain byte region.
#[inline]
fn plain_copy(region: &[u8], slot: usize, dst: &mut [u8]) {
    dst.copy_from_slice(&region[slot * SLOT_BYTES + 8..][..ROW_BYTES]);
}

/// The row of `slot`, one `Relaxed` atomic load per word.
#[inline]
fn atomic_words(region: &[AtomicU64], slot: usize, dst: &mut [u8]) {
    let words = &region[(slot * SLOT_BYTES + 8) / 8..][..ROW_BYTES / 8];
    for (d, w) in dst.chunks_exact_mut(8).zip(words) {
        d.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
}

/// The row of `slot`, through the crate's race-free copy.
#[inline]
fn crate_load(region: &[AtomicU64], slot: usize, dst: &mut [u8]) {
    load(region, slot * SLOT_BYTES + 8, dst);
}

/// Benches one variant: every iteration copies the next batch of indices of `pool`
/// out of the region at `base` with `copy_row`.
fn bench_variant(
    group: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    pool: &[usize],
    base: *const u8,
    prefetch: Prefetch,
    mut copy_row: impl FnMut(usize, &mut [u8]),
) {
    let mut dst = vec![0u8; BATCH * ROW_BYTES];
    let mut batches = pool.chunks_exact(BATCH).cycle();
    group.bench_function(name, |b| {
        b.iter(|| {
            let slots = batches.next().expect("a cycle never ends");
            gather(base, slots, &mut dst, prefetch, &mut copy_row);
            black_box(&mut dst);
        });
    });
}

fn row_copy(c: &mut Criterion) {
    // Zeroed, then written once, so that every page is resident and holds real bytes.
    let mut shared_map = huge_page_map(SLOTS * SLOT_BYTES);
    let shared = as_atomic_words(&mut shared_map);
    for (i, w) in shared.iter().enumerate() {
        w.store(
            (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            Ordering::Relaxed,
        );
    }
    let mut plain = huge_page_map(SLOTS * SLOT_BYTES);
    for (bytes, w) in plain.chunks_exact_mut(8).zip(shared) {
        bytes.copy_from_slice(&w.load(Ordering::Relaxed).to_ne_bytes());
    }
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(7);
    let pool: Vec<usize> = (0..POOL_BATCHES * BATCH)
        .map(|_| rng.random_range(0..SLOTS))
        .collect();

    let mut group = c.benchmark_group("row_copy_256_of_1M");
    group
        .throughput(Throughput::Elements(BATCH as u64))
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));

    let plain_base = plain.as_ptr();
    let shared_base = shared.as_ptr().cast::<u8>();
    let without_and_with_pass = [("", Prefetch::None), ("+prefetch_pass", Prefetch::Pass)];
    for (suffix, prefetch) in without_and_with_pass {
        let name = format!("plain_copy_racy{suffix}");
        bench_variant(&mut group, &name, &pool, plain_base, prefetch, |s, row| {
            plain_copy(&plain, s, row)
        });
    }
    for (suffix, prefetch) in without_and_with_pass {
        let name = format!("atomic_u64_words{suffix}");
        bench_variant(&mut group, &name, &pool, shared_base, prefetch, |s, row| {
            atomic_words(shared, s, row)
        });
    }
    for (suffix, prefetch) in [
        ("", Prefetch::None),
        ("+prefetch_pass", Prefetch::Pass),
        ("+prefetch_window16", Prefetch::Window),
    ] {
        let name = format!("internals_load{suffix}");
        bench_variant(&mut group, &name, &pool, shared_base, prefetch, |s, row| {
            crate_load(shared, s, row)
        });
    }
    group.finish();
}

criterion_group!(benches, row_copy);
criterion_main!(benches);
