//! What one transition holds: named fields with a dtype and a fixed shape, and the
//! row-major layout that follows from them.
//!
//! # Row layout
//!
//! A row is the fields of one transition side by side. Fields are placed in order of
//! decreasing element size (ties keep their declared order), so every field sits at an
//! offset aligned to its element size with no padding between fields; the row is then
//! padded to a multiple of 8 bytes so that rows, and the stamps beside them, stay
//! word aligned. The mujoco spec of WORKLOADS.md (165 payload bytes) takes 168.
//!
//! Layer: base.

use crate::dtype::DType;
use crate::error::SpecError;
use crate::key::{Key, KeyLike};

/// The largest row the crate accepts: 1 GiB.
pub const MAX_ROW_BYTES: usize = 1 << 30;

/// One field of a [`Spec`]: its key, dtype, shape and place in the row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    key: Key,
    dtype: DType,
    shape: Box<[usize]>,
    bytes: usize,
    offset: usize,
}

impl Field {
    /// The field's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape of one transition's value (`[]` for a scalar).
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Elements in one transition's value.
    pub fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Bytes of one transition's value.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Byte offset of this field inside a row.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// The fields of one transition and their row-major layout.
///
/// ```
/// use replaybuf::{DType, Spec};
///
/// let spec = Spec::builder()
///     .field("obs", DType::F32, [17])
///     .field("action", DType::F32, [6])
///     .field("reward", DType::F32, [1])
///     .field(("next", "obs"), DType::F32, [17])
///     .field("done", DType::Bool, [1])
///     .build()?;
/// assert_eq!(spec.payload_bytes(), 165);
/// assert_eq!(spec.row_bytes(), 168);
/// # Ok::<(), replaybuf::error::SpecError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// Fields in declared order; offsets follow the layout rule of the module docs.
    fields: Box<[Field]>,
    payload_bytes: usize,
    row_bytes: usize,
}

/// The one field of an opaque spec ([`Spec::opaque`]).
pub(crate) const OPAQUE_ROW: &str = "row";

impl Spec {
    /// Starts a spec.
    pub fn builder() -> SpecBuilder {
        SpecBuilder { fields: Vec::new() }
    }

    /// A spec of one opaque byte field of `bytes` bytes: the row of a typed buffer.
    pub(crate) fn opaque(bytes: usize) -> Result<Spec, SpecError> {
        Spec::builder()
            .field(OPAQUE_ROW, DType::U8, [bytes])
            .build()
    }

    /// Fields in declared order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The field `key` names, with its position in [`Spec::fields`].
    pub fn field<K: KeyLike + ?Sized>(&self, key: &K) -> Option<(usize, &Field)> {
        self.fields
            .iter()
            .enumerate()
            .find(|(_, f)| key.names(&f.key))
    }

    /// Bytes of one transition's values, without padding.
    pub fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }

    /// Bytes of one stored row: the payload padded to a multiple of 8.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Whether `other` has the same fields (key, dtype, shape), in any order.
    pub fn same_fields(&self, other: &Spec) -> bool {
        self.fields.len() == other.fields.len()
            && self.fields.iter().all(|f| {
                other
                    .field(&f.key)
                    .is_some_and(|(_, g)| g.dtype == f.dtype && g.shape == f.shape)
            })
    }
}

/// Builds a [`Spec`]; [`SpecBuilder::build`] validates it.
#[derive(Clone, Debug)]
pub struct SpecBuilder {
    fields: Vec<(Key, DType, Vec<usize>)>,
}

impl SpecBuilder {
    /// Adds a field. `shape` is the shape of one transition's value; `[]` is a scalar.
    pub fn field(mut self, key: impl Into<Key>, dtype: DType, shape: impl AsRef<[usize]>) -> Self {
        self.fields
            .push((key.into(), dtype, shape.as_ref().to_vec()));
        self
    }

    /// Checks the fields and lays out the row.
    ///
    /// Fails on: no fields, an empty key or key component, two fields with one key, a
    /// key that is also the prefix of another (`"next"` beside `("next", "obs")`), or a
    /// row over [`MAX_ROW_BYTES`].
    pub fn build(self) -> Result<Spec, SpecError> {
        if self.fields.is_empty() {
            return Err(SpecError::NoFields);
        }
        let mut fields = Vec::with_capacity(self.fields.len());
        for (i, (key, dtype, shape)) in self.fields.into_iter().enumerate() {
            if key.is_malformed() {
                return Err(SpecError::EmptyKey { position: i });
            }
            for f in &fields {
                let f: &Field = f;
                if f.key == key {
                    return Err(SpecError::DuplicateKey { key });
                }
                if f.key.is_prefix_of(&key) || key.is_prefix_of(&f.key) {
                    return Err(SpecError::KeyIsPrefix {
                        key,
                        other: f.key.clone(),
                    });
                }
            }
            let elements = shape
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .filter(|&n| {
                    n.checked_mul(dtype.size())
                        .is_some_and(|b| b <= MAX_ROW_BYTES)
                })
                .ok_or_else(|| SpecError::RowTooLarge { key: key.clone() })?;
            fields.push(Field {
                key,
                dtype,
                bytes: elements * dtype.size(),
                shape: shape.into_boxed_slice(),
                offset: 0,
            });
        }

        // Largest elements first keeps every offset aligned without padding.
        let mut order: Vec<usize> = (0..fields.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(fields[i].dtype.size()));
        let mut offset = 0usize;
        for &i in &order {
            fields[i].offset = offset;
            offset += fields[i].bytes;
            if offset > MAX_ROW_BYTES {
                return Err(SpecError::RowTooLarge {
                    key: fields[i].key.clone(),
                });
            }
        }
        Ok(Spec {
            fields: fields.into_boxed_slice(),
            payload_bytes: offset,
            row_bytes: offset.div_ceil(8) * 8,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_aligns_every_field_and_pads_the_row() {
        let spec = Spec::builder()
            .field("done", DType::Bool, [1])
            .field("action", DType::I64, [1])
            .field("reward", DType::F32, [])
            .field("h", DType::F16, [3])
            .build()
            .unwrap();
        for f in spec.fields() {
            assert_eq!(f.offset() % f.dtype().size(), 0, "{} misaligned", f.key());
        }
        assert_eq!(spec.payload_bytes(), 1 + 8 + 4 + 6);
        assert_eq!(spec.row_bytes(), 24);
        assert_eq!(spec.field("action").unwrap().1.offset(), 0);
    }

    #[test]
    fn rejects_bad_specs() {
        assert_eq!(Spec::builder().build(), Err(SpecError::NoFields));
        let dup = Spec::builder()
            .field("a", DType::U8, [1])
            .field("a", DType::U8, [2])
            .build();
        assert!(matches!(dup, Err(SpecError::DuplicateKey { .. })));
        let prefix = Spec::builder()
            .field("next", DType::U8, [1])
            .field(("next", "obs"), DType::U8, [2])
            .build();
        assert!(matches!(prefix, Err(SpecError::KeyIsPrefix { .. })));
        let empty = Spec::builder().field("", DType::U8, [1]).build();
        assert!(matches!(empty, Err(SpecError::EmptyKey { position: 0 })));
        let huge = Spec::builder()
            .field("x", DType::F64, [usize::MAX / 2, 4])
            .build();
        assert!(matches!(huge, Err(SpecError::RowTooLarge { .. })));
    }

    #[test]
    fn nested_keys_look_up_without_allocating_forms() {
        let spec = Spec::builder()
            .field(("next", "obs"), DType::F32, [2])
            .field("obs", DType::F32, [2])
            .build()
            .unwrap();
        assert_eq!(spec.field(&("next", "obs")).unwrap().0, 0);
        assert_eq!(spec.field(&["next", "obs"]).unwrap().0, 0);
        assert_eq!(spec.field("obs").unwrap().0, 1);
        assert!(spec.field("next").is_none());
        assert_eq!(spec.fields()[0].key().to_string(), "next.obs");
    }
}
