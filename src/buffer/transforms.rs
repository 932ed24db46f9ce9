//! Transforms of a buffer, from the API: appending, inserting and removing them.
//!
//! Layer: api.

use crate::buffer::ReplayBuffer;
use crate::error::TransformIndexError;
use crate::transform::Transform;

impl ReplayBuffer {
    /// Adds a transform at the end of the list: it runs last on sampled batches (and
    /// its inverse first on written data). A closure converts into a forward-only
    /// [`Transform`]. Safe while other threads sample and write: each call uses the
    /// list as it was before or after the change.
    pub fn append_transform(&self, transform: impl Into<Transform>) {
        let t = transform.into();
        self.state().transforms.change(|list| list.push(t));
    }

    /// Inserts a transform at `position` of the list (`0` runs first on sampled
    /// batches). A position past the end is refused and changes nothing.
    pub fn insert_transform(
        &self,
        position: usize,
        transform: impl Into<Transform>,
    ) -> Result<(), TransformIndexError> {
        let t = transform.into();
        self.state().transforms.change(|list| {
            if position > list.len() {
                return Err(TransformIndexError {
                    position,
                    len: list.len(),
                });
            }
            list.insert(position, t);
            Ok(())
        })
    }

    /// Transforms in the list.
    pub fn transforms(&self) -> usize {
        self.state().transforms.len()
    }

    /// Removes every transform.
    pub fn clear_transforms(&self) {
        self.state().transforms.change(Vec::clear);
    }
}
