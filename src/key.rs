//! Field names: [`Key`], one component (`"obs"`) or a nested path
//! (`("next", "obs")`), and [`KeyLike`], whatever names a field.
//!
//! Layer: base (imports nothing of the crate).

use std::fmt;

/// A field name: one component (`"obs"`) or a nested path (`("next", "obs")`).
///
/// Anything that names a field converts into a `Key` and can be passed where a field
/// is looked up: `"obs"`, `("next", "obs")`, `["next", "obs"]`, `&["next", "obs"][..]`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Box<[Box<str>]>);

impl Key {
    /// The components of the path, outermost first.
    pub fn components(&self) -> impl ExactSizeIterator<Item = &str> {
        self.0.iter().map(|c| &**c)
    }

    /// Whether the key has no component, or an empty one: not a field's name.
    pub(crate) fn is_malformed(&self) -> bool {
        self.0.is_empty() || self.0.iter().any(|c| c.is_empty())
    }

    /// Whether `self` is a strict prefix of `other` (`"next"` of `("next", "obs")`).
    pub fn is_prefix_of(&self, other: &Key) -> bool {
        self.0.len() < other.0.len() && other.0[..self.0.len()] == self.0[..]
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            f.write_str(c)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// Something that names a field without allocating: compared against a [`Key`] on
/// every lookup, converted into one only when a `Key` must be stored.
pub trait KeyLike {
    /// Whether this names `key`.
    fn names(&self, key: &Key) -> bool;
    /// An owned key.
    fn to_key(&self) -> Key;
}

impl KeyLike for Key {
    fn names(&self, key: &Key) -> bool {
        self == key
    }
    fn to_key(&self) -> Key {
        self.clone()
    }
}

impl KeyLike for str {
    fn names(&self, key: &Key) -> bool {
        key.0.len() == 1 && &*key.0[0] == self
    }
    fn to_key(&self) -> Key {
        Key(Box::new([self.into()]))
    }
}

impl KeyLike for String {
    fn names(&self, key: &Key) -> bool {
        self.as_str().names(key)
    }
    fn to_key(&self) -> Key {
        self.as_str().to_key()
    }
}

impl KeyLike for [&str] {
    fn names(&self, key: &Key) -> bool {
        key.0.len() == self.len() && key.0.iter().zip(self).all(|(a, b)| &**a == *b)
    }
    fn to_key(&self) -> Key {
        Key(self.iter().map(|c| Box::<str>::from(*c)).collect())
    }
}

impl<const N: usize> KeyLike for [&str; N] {
    fn names(&self, key: &Key) -> bool {
        self[..].names(key)
    }
    fn to_key(&self) -> Key {
        self[..].to_key()
    }
}

impl KeyLike for (&str, &str) {
    fn names(&self, key: &Key) -> bool {
        [self.0, self.1].names(key)
    }
    fn to_key(&self) -> Key {
        [self.0, self.1].to_key()
    }
}

impl KeyLike for (&str, &str, &str) {
    fn names(&self, key: &Key) -> bool {
        [self.0, self.1, self.2].names(key)
    }
    fn to_key(&self) -> Key {
        [self.0, self.1, self.2].to_key()
    }
}

impl<K: KeyLike + ?Sized> KeyLike for &K {
    fn names(&self, key: &Key) -> bool {
        (**self).names(key)
    }
    fn to_key(&self) -> Key {
        (**self).to_key()
    }
}

impl<K: KeyLike + ?Sized> From<&K> for Key {
    fn from(k: &K) -> Key {
        k.to_key()
    }
}

impl From<(&str, &str)> for Key {
    fn from(k: (&str, &str)) -> Key {
        k.to_key()
    }
}

impl<const N: usize> From<[&str; N]> for Key {
    fn from(k: [&str; N]) -> Key {
        k.to_key()
    }
}
