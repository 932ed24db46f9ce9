//! Element types of a field, and the Rust types that view them.
//!
//! Layer: base.

use std::fmt;

/// The element type of one field, as TorchRL names them.
///
/// `F16` and `BF16` are stored as raw 2-byte values: the buffer never computes with
/// them, it only moves them. View them as [`half::f16`] / [`half::bf16`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// One byte, 0 or 1.
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// IEEE half precision, raw 2 bytes.
    F16,
    /// bfloat16, raw 2 bytes.
    BF16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes of one element; also its alignment inside a row.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The lowercase name used in metadata and messages (`"f32"`, `"bool"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that views the elements of a field of one [`DType`].
///
/// Implemented for `bool`, the integer types, `f32`, `f64`, [`half::f16`] and
/// [`half::bf16`]. Views are checked: asking for `&[f32]` of an `i64` field is an
/// error, and a `bool` view checks that every byte is 0 or 1.
pub trait Element: bytemuck::CheckedBitPattern + bytemuck::NoUninit + Send + Sync {
    /// The dtype this type views.
    const DTYPE: DType;
}

macro_rules! element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {
        $(impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
        })*
    };
}

element! {
    bool => Bool,
    u8 => U8,
    i8 => I8,
    i16 => I16,
    i32 => I32,
    i64 => I64,
    u16 => U16,
    u32 => U32,
    u64 => U64,
    half::f16 => F16,
    half::bf16 => BF16,
    f32 => F32,
    f64 => F64,
}
