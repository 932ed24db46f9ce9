//! Frames stored once: [`Frames`], a buffer's choice of `next_of` fields and frame
//! stacks.
//!
//! A DQN agent on Atari stores a stack of the last four 84x84 frames as its
//! observation and another as its next observation: every frame is stored eight
//! times. With
//!
//! ```
//! use replaybuf::{DType, Frames, ReplayBuffer, Spec};
//!
//! let spec = Spec::builder()
//!     .field("obs", DType::U8, [4, 84, 84])
//!     .field("action", DType::I64, [1])
//!     .field("reward", DType::F32, [1])
//!     .field("next_obs", DType::U8, [4, 84, 84])
//!     .field("done", DType::Bool, [1])
//!     .build()?;
//! let rb = ReplayBuffer::builder(spec)
//!     .capacity(10_000)
//!     .frames(Frames::new().stack("obs", 4).next_of("obs", "next_obs"))
//!     .build()?;
//! // One frame a step: 7,056 bytes of pixels a row, not 56,448.
//! assert!(rb.reserved_bytes() / rb.capacity() < 7_200);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! each step stores its newest frame once; a sampled row's stacks are rebuilt from
//! the frames of its trajectory's last steps, and its next observation from the
//! following step's (the step that ends an episode keeps its own in a side slot).
//! Extends and samples see the fields as declared: a buffer with frames returns
//! exactly what one without them, fed the same stream, returns.
//!
//! Layer: base (plain data, which the storage layer resolves: `storage/frames.rs`).

use crate::key::Key;

/// What fills a stack's places before its episode's first step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StackFill {
    /// The episode's first frame, repeated (Dopamine's and most Atari wrappers').
    #[default]
    Repeat,
    /// Zeros.
    Zeros,
}

/// Which fields a buffer stores once per step, given to
/// [`ReplayBufferBuilder::frames`](crate::ReplayBufferBuilder::frames).
///
/// A trajectory is the steps one collector feeds a lane in order: the rows of one
/// [`Writer`](crate::Writer), one environment column of an ndim-2 storage, or a
/// buffer-level `extend`'s rows (shard 0). Episodes end at a row whose done field (or
/// truncated field) is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frames {
    pub(crate) stacks: Vec<(Key, usize)>,
    pub(crate) next_of: Vec<(Key, Key)>,
    pub(crate) fill: StackFill,
    pub(crate) unchecked: bool,
    pub(crate) done: Option<Key>,
    pub(crate) truncated: Option<Key>,
    pub(crate) terminal_slots: Option<usize>,
}

impl Frames {
    /// No field stored once yet.
    pub fn new() -> Frames {
        Frames::default()
    }

    /// Field `key`, of shape `[depth, ..]`, is a stack of the last `depth` frames
    /// along its first axis: one frame a step is stored.
    pub fn stack(mut self, key: impl Into<Key>, depth: usize) -> Self {
        self.stacks.push((key.into(), depth));
        self
    }

    /// Field `next_key` is not stored: a row's value is the following step's `key`
    /// in the same trajectory (the step that ends an episode keeps its own).
    pub fn next_of(mut self, key: impl Into<Key>, next_key: impl Into<Key>) -> Self {
        self.next_of.push((key.into(), next_key.into()));
        self
    }

    /// What fills a stack's places before its episode's first step (default:
    /// [`StackFill::Repeat`]).
    pub fn fill(mut self, fill: StackFill) -> Self {
        self.fill = fill;
        self
    }

    /// Skips the check that each step's stacks are the previous step's, shifted by
    /// one frame. Without it, an extend whose stacks are not is refused.
    pub fn unchecked(mut self) -> Self {
        self.unchecked = true;
        self
    }

    /// The fields that say a step ends its episode (default: the first of `done`,
    /// `("next", "done")`, `terminated`, `("next", "terminated")` in the spec, and
    /// `truncated` or `("next", "truncated")` if there is one).
    pub fn ends(mut self, done: impl Into<Key>, truncated: Option<Key>) -> Self {
        self.done = Some(done.into());
        self.truncated = truncated;
        self
    }

    /// The field that says a step was cut off (its episode ends there too), with the
    /// field for episode ends found as [`ends`](Self::ends) says: for a spec whose
    /// `done` field the default finds but whose truncation flag has another name.
    pub fn truncated(mut self, truncated: impl Into<Key>) -> Self {
        self.truncated = Some(truncated.into());
        self
    }

    /// Side slots per shard for the next observations of the steps that end
    /// episodes. A buffer keeps the last `capacity` steps or the steps of its last
    /// `slots` episode ends per shard, whichever is fewer. The default is one slot per
    /// 128 steps of the ring (at least 64, at most one per step): episodes averaging
    /// 128 steps or more fill the ring. Give the shard's capacity for episodes of any
    /// length.
    pub fn terminal_slots(mut self, slots: usize) -> Self {
        self.terminal_slots = Some(slots);
        self
    }

    /// Whether any field is stored once.
    pub(crate) fn is_empty(&self) -> bool {
        self.stacks.is_empty() && self.next_of.is_empty()
    }
}
