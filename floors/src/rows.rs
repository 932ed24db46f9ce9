//! A workload's rows held plainly, to time the buffer's reads beside the same reads
//! with nothing shared: [`PlainRows`], the rows in one array and a batch's columns to
//! copy them into, and [`PlainUniform`], a uniform sample of them (`replaybuf bench`'s
//! system `plain-gather`).

use crate::{huge_pages, xorshift};

/// The shape of a workload a floor holds: its rows and its batches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Bytes of a row, as the buffer's spec lays it out.
    pub row_bytes: usize,
    /// Each field's offset in a row and its bytes, in the spec's order.
    pub fields: Vec<(usize, usize)>,
    /// Rows held.
    pub capacity: usize,
    /// Rows of a sampled batch.
    pub batch: usize,
}

impl Shape {
    /// `capacity` rows of `row_bytes`, holding `fields` (each its offset in a row and
    /// its bytes, in the spec's order), sampled `batch` rows at a time.
    pub fn new(
        row_bytes: usize,
        fields: impl IntoIterator<Item = (usize, usize)>,
        capacity: usize,
        batch: usize,
    ) -> Shape {
        Shape {
            row_bytes,
            fields: fields.into_iter().collect(),
            capacity,
            batch,
        }
    }
}

/// Rows ahead of the one being copied whose lines a gather has started into L1, as the
/// buffer's sample does (its `SAMPLE_AHEAD_DRAWS`).
pub const AHEAD: usize = 16;

/// A full buffer's rows in one plain array on huge pages, as the buffer's memory is,
/// and a batch's columns, a field each.
pub struct PlainRows {
    rows: memmap2::MmapMut,
    row_bytes: usize,
    /// Each field's offset in a row and its bytes.
    fields: Vec<(usize, usize)>,
    columns: Vec<Vec<u8>>,
}

impl PlainRows {
    /// `shape.capacity` rows of its fields and columns of `shape.batch` rows.
    pub fn new(shape: &Shape) -> PlainRows {
        PlainRows {
            rows: huge_pages(shape.capacity * shape.row_bytes),
            row_bytes: shape.row_bytes,
            columns: shape
                .fields
                .iter()
                .map(|&(_, b)| vec![0u8; b * shape.batch])
                .collect(),
            fields: shape.fields.clone(),
        }
    }

    /// Row `i`'s bytes.
    pub fn row(&self, i: usize) -> &[u8] {
        &self.rows[i * self.row_bytes..][..self.row_bytes]
    }

    /// Copies row `i`'s fields into row `k` of the batch's columns, a field at a time
    /// ([`copy_field`]).
    #[inline(always)]
    pub fn copy(&mut self, k: usize, i: usize) {
        let row = &self.rows[i * self.row_bytes..][..self.row_bytes];
        for (column, &(offset, len)) in self.columns.iter_mut().zip(&self.fields) {
            copy_field(&mut column[k * len..][..len], &row[offset..offset + len]);
        }
    }

    /// Copies rows `drawn` into the batch's columns, row `k` of the batch from row
    /// `drawn[k]`, prefetching as the buffer's reads do: each row's first line and the
    /// one 128 bytes on started into L2 for the whole batch, then a window of [`AHEAD`]
    /// rows' lines into L1 ahead of the copies.
    pub fn gather(&mut self, drawn: &[usize]) {
        for &row in drawn {
            let bytes = self.row(row);
            for line in [0, 128].into_iter().filter(|&at| at < bytes.len()) {
                prefetch_lines(&bytes[line..=line], Level::L2);
            }
        }
        for &row in drawn.iter().take(AHEAD) {
            prefetch_lines(self.row(row), Level::L1);
        }
        for (k, &row) in drawn.iter().enumerate() {
            if let Some(&ahead) = drawn.get(k + AHEAD) {
                prefetch_lines(self.row(ahead), Level::L1);
            }
            self.copy(k, row);
        }
    }

    /// The batch's columns, field by field.
    pub fn columns(&self) -> &[Vec<u8>] {
        &self.columns
    }
}

/// A uniform sample of a workload's batch done plainly: `shape.batch` rows drawn
/// uniformly among `shape.capacity` in one plain array, each row's first line and the one 128 bytes on
/// started into L2 for the whole batch first, then a window of [`AHEAD`] rows' lines
/// into L1, the fields copied into the batch's columns: the buffer's sample prefetches
/// as it does, without its stamps, laps, checks or redraws. The raw-memory floor of the
/// buffer's `sample`, in one process with it.
pub struct PlainUniform {
    rows: PlainRows,
    capacity: usize,
    state: u64,
    drawn: Vec<usize>,
}

impl PlainUniform {
    pub fn new(shape: &Shape) -> PlainUniform {
        PlainUniform {
            rows: PlainRows::new(shape),
            capacity: shape.capacity,
            state: 0x2545_f491_4f6c_dd1d,
            drawn: vec![0; shape.batch],
        }
    }

    /// One sample of the batch.
    pub fn sample(&mut self) {
        for row in &mut self.drawn {
            let r = xorshift(&mut self.state);
            *row = ((u128::from(r) * self.capacity as u128) >> 64) as usize;
        }
        self.rows.gather(&self.drawn);
        std::hint::black_box(self.rows.columns());
    }
}

/// Copies `src` into `dst`, of the same length, inline: 16-byte moves from the start,
/// the last ending at the end (over the one before it where the length is not a
/// multiple of 16); under 16 bytes, two moves of 8, 4 or 2 bytes, the second ending at
/// the end, or one byte. The moves the buffer's reads make, where `copy_from_slice` of
/// a length known only when the program runs calls `memcpy` (a mujoco row's five
/// fields, five calls).
///
/// # Panics
/// If `dst` and `src` differ in length.
#[inline(always)]
pub fn copy_field(dst: &mut [u8], src: &[u8]) {
    /// Two moves of `N` bytes: at the start and ending at the end.
    fn pair<const N: usize>(dst: &mut [u8], src: &[u8]) {
        let last = src.len() - N;
        dst[..N].copy_from_slice(&src[..N]);
        dst[last..].copy_from_slice(&src[last..]);
    }
    let len = src.len();
    assert_eq!(
        dst.len(),
        len,
        "a field copy into a column row of its length"
    );
    match len {
        0 => {}
        1 => dst[0] = src[0],
        2..=3 => pair::<2>(dst, src),
        4..=7 => pair::<4>(dst, src),
        8..=15 => pair::<8>(dst, src),
        _ => {
            for at in (0..len - 16).step_by(16) {
                dst[at..at + 16].copy_from_slice(&src[at..at + 16]);
            }
            dst[len - 16..].copy_from_slice(&src[len - 16..]);
        }
    }
}

/// The cache a prefetch loads into.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Level {
    L1,
    L2,
}

/// Starts loading every cache line of `bytes` into the cache `level` names (x86_64;
/// nothing elsewhere).
#[inline(always)]
pub fn prefetch_lines(bytes: &[u8], level: Level) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};
        // From the line the first byte is on to the one the last byte is on.
        let lead = bytes.as_ptr() as usize % 64;
        let first = bytes.as_ptr().wrapping_sub(lead);
        for offset in (0..lead + bytes.len()).step_by(64) {
            let line = first.wrapping_add(offset).cast::<i8>();
            // SAFETY: SSE is part of x86_64; a prefetch of any address changes nothing
            // the program sees.
            unsafe {
                match level {
                    Level::L1 => _mm_prefetch::<_MM_HINT_T0>(line),
                    Level::L2 => _mm_prefetch::<_MM_HINT_T1>(line),
                }
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (bytes, level);
}

/// The mujoco workload's shape (165 payload bytes in 168-byte rows, batches of 256)
/// over `capacity` rows, for the tests.
#[cfg(test)]
pub(crate) fn mujoco(capacity: usize) -> Shape {
    let fields = [(0, 68), (68, 24), (92, 4), (96, 68), (164, 1)];
    Shape::new(168, fields, capacity, 256)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A field copy copies every length exactly, and no byte around it.
    #[test]
    fn a_field_copy_copies_every_length_exactly() {
        for len in 0..=200 {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let mut out = vec![0u8; len + 32];
            copy_field(&mut out[16..16 + len], &src);
            assert_eq!(out[16..16 + len], src[..], "{len}");
            assert!(
                out[..16].iter().chain(&out[16 + len..]).all(|&b| b == 0),
                "{len}"
            );
        }
    }

    /// A plain sample copies each drawn row's fields into its batch row, and its draws
    /// cover the rows evenly.
    #[test]
    fn a_plain_sample_copies_the_drawn_rows_and_draws_them_evenly() {
        let shape = mujoco(1_000);
        let mut plain = PlainUniform::new(&shape);
        // Every byte of row `i` holds `i % 251`.
        for i in 0..shape.capacity {
            let start = i * plain.rows.row_bytes;
            plain.rows.rows[start..start + plain.rows.row_bytes].fill((i % 251) as u8);
        }
        let mut hits = vec![0usize; shape.capacity];
        for _ in 0..200 {
            plain.sample();
            for (k, &row) in plain.drawn.iter().enumerate() {
                hits[row] += 1;
                for (column, &(_, len)) in plain.rows.columns().iter().zip(&plain.rows.fields) {
                    assert!(column[k * len..][..len]
                        .iter()
                        .all(|&b| b == (row % 251) as u8));
                }
            }
        }
        // 51,200 draws of 1,000 rows: about 51 each.
        let (least, most) = (hits.iter().min().unwrap(), hits.iter().max().unwrap());
        assert!(*least >= 20 && *most <= 90, "{least}..{most}");
    }
}
