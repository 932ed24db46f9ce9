//! A buffer's configuration as data: what a checkpoint's `meta.json` and a shared
//! region's meta section record, so that a buffer can be rebuilt, or attached to,
//! without the code that built it.
//!
//! These types mirror the builder's choices field by field rather than deriving
//! serde on the public types, so that the on-disk format changes only when
//! [`FORMAT_VERSION`](crate::storage::layout::FORMAT_VERSION) does.
//!
//! The **layout hash** condenses what decides how a region's words are laid out and
//! read: the spec, the storage's shape, the sampler (without alpha and beta, which
//! live in the region and change at run time) and the priority field. Two buffers
//! with one layout hash can share a region or trade checkpoints; a seed, batch size or
//! `dim_extend` may differ.
//!
//! Layer: core.

use serde::{Deserialize, Serialize};

use crate::dtype::DType;
use crate::error::SpecError;
use crate::frames::{Frames, StackFill};
use crate::key::Key;
use crate::sampler::slice::SliceShape;
use crate::sampler::{
    Fifo, Prioritized, Reduction, Sampler, Slice, SlicePriority, Uniform, WithoutReplacement,
};
use crate::spec::Spec;

/// Everything a buffer was built with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    pub(crate) spec: Vec<FieldMeta>,
    pub(crate) capacity: usize,
    pub(crate) shards: usize,
    pub(crate) ndim: usize,
    pub(crate) envs: Option<usize>,
    pub(crate) dim_extend: usize,
    pub(crate) batch_size: Option<usize>,
    pub(crate) seed: u64,
    pub(crate) sampler: SamplerMeta,
    pub(crate) writer: WriterMeta,
    pub(crate) priority_key: Option<Vec<String>>,
    /// Fields stored once a step (absent in checkpoints of buffers without them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) frames: Option<FramesMeta>,
}

/// Fields stored once a step ([`Frames`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FramesMeta {
    pub(crate) stacks: Vec<(Vec<String>, usize)>,
    pub(crate) next_of: Vec<(Vec<String>, Vec<String>)>,
    pub(crate) fill_zeros: bool,
    pub(crate) unchecked: bool,
    pub(crate) done: Option<Vec<String>>,
    pub(crate) truncated: Option<Vec<String>>,
    pub(crate) terminal_slots: Option<usize>,
}

impl FramesMeta {
    pub(crate) fn of(f: &Frames) -> FramesMeta {
        FramesMeta {
            stacks: f.stacks.iter().map(|(k, d)| (key_meta(k), *d)).collect(),
            next_of: f
                .next_of
                .iter()
                .map(|(a, b)| (key_meta(a), key_meta(b)))
                .collect(),
            fill_zeros: f.fill == StackFill::Zeros,
            unchecked: f.unchecked,
            done: f.done.as_ref().map(key_meta),
            truncated: f.truncated.as_ref().map(key_meta),
            terminal_slots: f.terminal_slots,
        }
    }

    pub(crate) fn frames(&self) -> Frames {
        Frames {
            stacks: self.stacks.iter().map(|(k, d)| (key_of(k), *d)).collect(),
            next_of: self
                .next_of
                .iter()
                .map(|(a, b)| (key_of(a), key_of(b)))
                .collect(),
            fill: if self.fill_zeros {
                StackFill::Zeros
            } else {
                StackFill::Repeat
            },
            unchecked: self.unchecked,
            done: self.done.as_deref().map(key_of),
            truncated: self.truncated.as_deref().map(key_of),
            terminal_slots: self.terminal_slots,
        }
    }
}

/// For `inspect`: `obs stacked 4 deep; next_obs the next step's obs; fill repeat,
/// checked; episodes end at done or truncated`.
impl std::fmt::Display for FramesMeta {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (key, depth) in &self.stacks {
            write!(f, "{} stacked {depth} deep; ", key.join("."))?;
        }
        for (of, next) in &self.next_of {
            write!(f, "{} the next step's {}; ", next.join("."), of.join("."))?;
        }
        let fill = if self.fill_zeros { "zeros" } else { "repeat" };
        let checked = if self.unchecked {
            "unchecked"
        } else {
            "checked"
        };
        write!(f, "fill {fill}, {checked}")?;
        if let Some(done) = &self.done {
            write!(f, "; episodes end at {}", done.join("."))?;
            if let Some(t) = &self.truncated {
                write!(f, " or {}", t.join("."))?;
            }
        }
        if let Some(n) = self.terminal_slots {
            write!(f, "; {n} terminal slots a shard")?;
        }
        Ok(())
    }
}

/// One field of the spec.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FieldMeta {
    pub(crate) key: Vec<String>,
    pub(crate) dtype: DType,
    pub(crate) shape: Vec<usize>,
}

/// The sampler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum SamplerMeta {
    Uniform,
    WithoutReplacement {
        drop_last: bool,
        shuffle: bool,
    },
    Prioritized(PrioritizedMeta),
    Slice {
        num_slices: Option<usize>,
        slice_len: Option<usize>,
        traj_key: Option<Vec<String>>,
        end_key: Vec<String>,
        truncated_key: Option<Vec<String>>,
        strict_length: bool,
        span: (usize, usize),
        without_replacement: Option<(bool, bool)>,
        prioritized: Option<(PrioritizedMeta, SlicePriorityMeta)>,
    },
    Fifo,
}

/// A prioritized sampler's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrioritizedMeta {
    pub(crate) alpha: f64,
    pub(crate) beta: f64,
    pub(crate) eps: f64,
    pub(crate) max_capacity: Option<usize>,
    pub(crate) reduction: ReductionMeta,
    pub(crate) max_priority_within_buffer: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReductionMeta {
    Max,
    Min,
    Mean,
    Median,
    Sum,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SlicePriorityMeta {
    Start,
    Window,
}

/// The write policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum WriterMeta {
    RoundRobin,
    Immutable,
    MaxValue {
        rank_key: Vec<String>,
        reduction: ReductionMeta,
    },
}

pub(crate) fn key_meta(key: &Key) -> Vec<String> {
    key.components().map(str::to_owned).collect()
}

pub(crate) fn key_of(parts: &[String]) -> Key {
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    Key::from(&parts[..])
}

impl ReductionMeta {
    pub(crate) fn of(r: Reduction) -> ReductionMeta {
        match r {
            Reduction::Max => ReductionMeta::Max,
            Reduction::Min => ReductionMeta::Min,
            Reduction::Mean => ReductionMeta::Mean,
            Reduction::Median => ReductionMeta::Median,
            Reduction::Sum => ReductionMeta::Sum,
        }
    }

    pub(crate) fn reduction(self) -> Reduction {
        match self {
            ReductionMeta::Max => Reduction::Max,
            ReductionMeta::Min => Reduction::Min,
            ReductionMeta::Mean => Reduction::Mean,
            ReductionMeta::Median => Reduction::Median,
            ReductionMeta::Sum => Reduction::Sum,
        }
    }
}

impl PrioritizedMeta {
    fn of(p: &Prioritized) -> PrioritizedMeta {
        PrioritizedMeta {
            alpha: p.alpha,
            beta: p.beta,
            eps: p.eps,
            max_capacity: p.max_capacity,
            reduction: ReductionMeta::of(p.reduction),
            max_priority_within_buffer: p.max_priority_within_buffer,
        }
    }

    fn sampler(&self) -> Prioritized {
        Prioritized {
            alpha: self.alpha,
            beta: self.beta,
            eps: self.eps,
            max_capacity: self.max_capacity,
            reduction: self.reduction.reduction(),
            max_priority_within_buffer: self.max_priority_within_buffer,
        }
    }
}

impl SamplerMeta {
    pub(crate) fn of(sampler: &Sampler) -> SamplerMeta {
        match sampler {
            Sampler::Uniform(_) => SamplerMeta::Uniform,
            Sampler::Fifo(_) => SamplerMeta::Fifo,
            Sampler::WithoutReplacement(w) => SamplerMeta::WithoutReplacement {
                drop_last: w.drop_last,
                shuffle: w.shuffle,
            },
            Sampler::Prioritized(p) => SamplerMeta::Prioritized(PrioritizedMeta::of(p)),
            Sampler::Slice(s) => {
                let (num_slices, slice_len) = match s.shape {
                    SliceShape::Count(n) => (Some(n), None),
                    SliceShape::Len(l) => (None, Some(l)),
                };
                SamplerMeta::Slice {
                    num_slices,
                    slice_len,
                    traj_key: s.traj_key.as_ref().map(key_meta),
                    end_key: key_meta(&s.end_key),
                    truncated_key: s.truncated_key.as_ref().map(key_meta),
                    strict_length: s.strict_length,
                    span: s.span,
                    without_replacement: s.without_replacement.map(|w| (w.drop_last, w.shuffle)),
                    prioritized: s.prioritized.as_ref().map(|(p, over)| {
                        let over = match over {
                            SlicePriority::Start => SlicePriorityMeta::Start,
                            SlicePriority::Window => SlicePriorityMeta::Window,
                        };
                        (PrioritizedMeta::of(p), over)
                    }),
                }
            }
        }
    }

    /// The sampler of an engine that keeps no other configuration (a list buffer's:
    /// uniform, without replacement or FIFO).
    pub(crate) fn of_engine(engine: &crate::sampler::SamplerEngine) -> SamplerMeta {
        match engine {
            crate::sampler::SamplerEngine::WithoutReplacement(e) => {
                SamplerMeta::of(&Sampler::WithoutReplacement(e.config()))
            }
            crate::sampler::SamplerEngine::Fifo => SamplerMeta::Fifo,
            _ => SamplerMeta::Uniform,
        }
    }

    /// The sampler, or `None` if the record is inconsistent (a slice shape given both
    /// ways or neither).
    pub(crate) fn sampler(&self) -> Option<Sampler> {
        let epochs = |(drop_last, shuffle): (bool, bool)| {
            WithoutReplacement::new()
                .drop_last(drop_last)
                .shuffle(shuffle)
        };
        Some(match self {
            SamplerMeta::Uniform => Sampler::Uniform(Uniform),
            SamplerMeta::Fifo => Sampler::Fifo(Fifo),
            SamplerMeta::WithoutReplacement { drop_last, shuffle } => {
                Sampler::WithoutReplacement(epochs((*drop_last, *shuffle)))
            }
            SamplerMeta::Prioritized(p) => Sampler::Prioritized(p.sampler()),
            SamplerMeta::Slice {
                num_slices,
                slice_len,
                traj_key,
                end_key,
                truncated_key,
                strict_length,
                span,
                without_replacement,
                prioritized,
            } => {
                let mut s = match (num_slices, slice_len) {
                    (Some(n), None) => Slice::num_slices(*n),
                    (None, Some(l)) => Slice::slice_len(*l),
                    _ => return None,
                };
                s = s
                    .end_key(key_of(end_key))
                    .strict_length(*strict_length)
                    .span(span.0, span.1);
                if let Some(k) = traj_key {
                    s = s.traj_key(key_of(k));
                }
                if let Some(k) = truncated_key {
                    s = s.truncated_key(key_of(k));
                }
                if let Some(w) = without_replacement {
                    s = s.without_replacement(epochs(*w));
                }
                if let Some((p, over)) = prioritized {
                    let over = match over {
                        SlicePriorityMeta::Start => SlicePriority::Start,
                        SlicePriorityMeta::Window => SlicePriority::Window,
                    };
                    s = s.prioritized(p.sampler(), over);
                }
                Sampler::Slice(s)
            }
        })
    }

    /// The same settings with alpha and beta left out: they live in the region.
    fn without_runtime(&self) -> SamplerMeta {
        let mut s = self.clone();
        let clear = |p: &mut PrioritizedMeta| {
            p.alpha = 0.0;
            p.beta = 0.0;
        };
        match &mut s {
            SamplerMeta::Prioritized(p) => clear(p),
            SamplerMeta::Slice {
                prioritized: Some((p, _)),
                ..
            } => clear(p),
            _ => {}
        }
        s
    }
}

/// Why a recorded configuration cannot be turned back into a builder.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ConfigError {
    Spec(SpecError),
    Sampler,
}

impl Config {
    /// The spec.
    pub(crate) fn spec(&self) -> Result<Spec, SpecError> {
        self.spec
            .iter()
            .fold(Spec::builder(), |b, f| {
                b.field(key_of(&f.key), f.dtype, &f.shape)
            })
            .build()
    }

    /// The hash of everything that decides the region's layout (see the module docs).
    pub(crate) fn layout_hash(&self) -> u64 {
        #[derive(Serialize)]
        struct LayoutKey<'a> {
            spec: &'a [FieldMeta],
            capacity: usize,
            shards: usize,
            ndim: usize,
            envs: Option<usize>,
            sampler: SamplerMeta,
            priority_key: &'a Option<Vec<String>>,
            #[serde(skip_serializing_if = "Option::is_none")]
            frames: &'a Option<FramesMeta>,
        }
        let key = LayoutKey {
            spec: &self.spec,
            capacity: self.capacity,
            shards: self.shards,
            ndim: self.ndim,
            envs: self.envs,
            sampler: self.sampler.without_runtime(),
            priority_key: &self.priority_key,
            frames: &self.frames,
        };
        let bytes = serde_json::to_vec(&key).expect("a layout key always serialises");
        xxhash_rust::xxh3::xxh3_64(&bytes)
    }

    /// What differs between this configuration's layout and `other`'s, in words, for
    /// an error message; `None` if the layouts agree.
    pub(crate) fn layout_difference(&self, other: &Config) -> Option<String> {
        if self.layout_hash() == other.layout_hash() {
            return None;
        }
        let mut diffs = Vec::new();
        if self.spec != other.spec {
            diffs.push("the spec".to_owned());
        }
        for (what, a, b) in [
            ("capacity", self.capacity, other.capacity),
            ("shards", self.shards, other.shards),
            ("ndim", self.ndim, other.ndim),
            ("envs", self.envs.unwrap_or(0), other.envs.unwrap_or(0)),
        ] {
            if a != b {
                diffs.push(format!("{what} {a} vs {b}"));
            }
        }
        if self.sampler.without_runtime() != other.sampler.without_runtime() {
            diffs.push("the sampler".to_owned());
        }
        if self.priority_key != other.priority_key {
            diffs.push("the priority key".to_owned());
        }
        if self.frames != other.frames {
            let has = |f: &Option<FramesMeta>| if f.is_some() { "frames" } else { "no frames" };
            diffs.push(match (&self.frames, &other.frames) {
                (Some(_), Some(_)) => "the frames".to_owned(),
                (a, b) => format!("{} vs {}", has(a), has(b)),
            });
        }
        Some(diffs.join(", "))
    }
}
