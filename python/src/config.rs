//! Samplers and write policies from the plain descriptions the Python package passes:
//! `{"kind": "prioritized", "alpha": 0.6, ...}`. The friendly classes
//! (`replaybuf.Prioritized(...)`, TorchRL's `PrioritizedSampler(...)`) live in Python
//! and describe themselves this way, so one parser serves both faces.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use replaybuf::sampler::{
    Fifo, Prioritized, Reduction, Sampler, Slice, SlicePriority, Uniform, WithoutReplacement,
};
use replaybuf::{Frames, RateLimit, StackFill, WritePolicy};

use crate::errors::{py_err, type_error, value_error};
use crate::fields::key_from_py;

/// One entry of a description, if present and not None.
fn get<'py>(d: &Bound<'py, PyDict>, name: &str) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(d.get_item(name)?.filter(|v| !v.is_none()))
}

fn get_as<'py, T: FromPyObjectOwned<'py>>(
    d: &Bound<'py, PyDict>,
    name: &str,
) -> PyResult<Option<T>> {
    get(d, name)?
        .map(|v| {
            v.extract::<T>()
                .map_err(|_| type_error(format!("`{name}` has the wrong type: {v}")))
        })
        .transpose()
}

/// A description: a dict, or an object that gives one (`obj._describe()`).
fn described<'py>(desc: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyDict>> {
    if let Ok(d) = desc.cast::<PyDict>() {
        return Ok(d.clone());
    }
    if desc.hasattr("_describe")? {
        return desc
            .call_method0("_describe")?
            .cast_into::<PyDict>()
            .map_err(|_| type_error(format!("{what}: _describe() must return a dict")));
    }
    Err(type_error(format!(
        "{what}: expected one of replaybuf's classes, got {}",
        desc.get_type().name()?
    )))
}

fn kind(d: &Bound<'_, PyDict>) -> PyResult<String> {
    get_as::<String>(d, "kind")?.ok_or_else(|| value_error("a description without \"kind\""))
}

fn reduction(d: &Bound<'_, PyDict>) -> PyResult<Reduction> {
    Ok(match get_as::<String>(d, "reduction")?.as_deref() {
        None | Some("max") => Reduction::Max,
        Some("min") => Reduction::Min,
        Some("mean") => Reduction::Mean,
        Some("median") => Reduction::Median,
        Some("sum") => Reduction::Sum,
        Some(other) => {
            return Err(value_error(format!(
                "reduction is one of max, min, mean, median, sum; got {other:?}"
            )))
        }
    })
}

fn prioritized(d: &Bound<'_, PyDict>) -> PyResult<Prioritized> {
    let alpha = get_as::<f64>(d, "alpha")?.ok_or_else(|| value_error("prioritized: no alpha"))?;
    let beta = get_as::<f64>(d, "beta")?.ok_or_else(|| value_error("prioritized: no beta"))?;
    let mut p = Prioritized::new(alpha, beta).reduction(reduction(d)?);
    if let Some(eps) = get_as::<f64>(d, "eps")? {
        p = p.eps(eps);
    }
    if let Some(rows) = get_as::<usize>(d, "max_capacity")? {
        p = p.max_capacity(rows);
    }
    if let Some(yes) = get_as::<bool>(d, "max_priority_within_buffer")? {
        p = p.max_priority_within_buffer(yes);
    }
    Ok(p)
}

fn without_replacement(d: &Bound<'_, PyDict>) -> PyResult<WithoutReplacement> {
    Ok(WithoutReplacement::new()
        .drop_last(get_as::<bool>(d, "drop_last")?.unwrap_or(false))
        .shuffle(get_as::<bool>(d, "shuffle")?.unwrap_or(true)))
}

/// The sampler a description names (`None`: uniform).
pub(crate) fn sampler(desc: Option<&Bound<'_, PyAny>>) -> PyResult<Sampler> {
    let Some(desc) = desc.filter(|d| !d.is_none()) else {
        return Ok(Sampler::from(Uniform));
    };
    let d = &described(desc, "sampler")?;
    Ok(match kind(d)?.as_str() {
        "uniform" => Sampler::from(Uniform),
        "without_replacement" => Sampler::from(without_replacement(d)?),
        "prioritized" => Sampler::from(prioritized(d)?),
        "slice" => Sampler::from(slice(d)?),
        "fifo" => Sampler::from(Fifo),
        other => return Err(value_error(format!("no sampler is called {other:?}"))),
    })
}

fn slice(d: &Bound<'_, PyDict>) -> PyResult<Slice> {
    let mut s = match (
        get_as::<usize>(d, "num_slices")?,
        get_as::<usize>(d, "slice_len")?,
    ) {
        (Some(n), None) => Slice::num_slices(n),
        (None, Some(len)) => Slice::slice_len(len),
        _ => {
            return Err(value_error(
                "a slice sampler takes one of num_slices and slice_len",
            ))
        }
    };
    if let Some(k) = get(d, "traj_key")? {
        s = s.traj_key(key_from_py(&k)?);
    }
    if let Some(k) = get(d, "end_key")? {
        s = s.end_key(key_from_py(&k)?);
    }
    if let Some(k) = get(d, "truncated_key")? {
        s = s.truncated_key(key_from_py(&k)?);
    }
    if let Some(strict) = get_as::<bool>(d, "strict_length")? {
        s = s.strict_length(strict);
    }
    if let Some((left, right)) = get_as::<(usize, usize)>(d, "span")? {
        s = s.span(left, right);
    }
    if let Some(w) = get(d, "without_replacement")? {
        s = s.without_replacement(without_replacement(&described(&w, "without_replacement")?)?);
    }
    if let Some(p) = get(d, "prioritized")? {
        let p = &described(&p, "prioritized")?;
        let over = match get_as::<String>(p, "over")?.as_deref() {
            None | Some("start") => SlicePriority::Start,
            Some("window") => SlicePriority::Window,
            Some(other) => {
                return Err(value_error(format!(
                    "slice priorities are over \"start\" or \"window\", got {other:?}"
                )))
            }
        };
        s = s.prioritized(prioritized(p)?, over);
    }
    Ok(s)
}

/// The write policy a description names (`None`: round robin).
pub(crate) fn write_policy(desc: Option<&Bound<'_, PyAny>>) -> PyResult<WritePolicy> {
    let Some(desc) = desc.filter(|d| !d.is_none()) else {
        return Ok(WritePolicy::RoundRobin);
    };
    let d = &described(desc, "write_policy")?;
    Ok(match kind(d)?.as_str() {
        "round_robin" => WritePolicy::RoundRobin,
        "immutable" => WritePolicy::Immutable,
        "max_value" => {
            let key = get(d, "rank_key")?.ok_or_else(|| value_error("max_value: no rank_key"))?;
            WritePolicy::MaxValue {
                rank_key: key_from_py(&key)?,
                reduction: match get(d, "reduction")? {
                    Some(_) => reduction(d)?,
                    None => Reduction::Sum,
                },
            }
        }
        other => return Err(value_error(format!("no write policy is called {other:?}"))),
    })
}

/// A rate limit from its description (`replaybuf.RateLimit(...)._describe()`): a
/// preset (`min_size`, `sample_to_insert_ratio`, `queue`) or the general form
/// (`custom`), with timeouts in seconds. The engine checks the numbers.
pub(crate) fn rate_limit(desc: &Bound<'_, PyAny>) -> PyResult<RateLimit> {
    let d = described(desc, "rate_limit")?;
    if kind(&d)? != "rate_limit" {
        return Err(type_error("rate_limit: expected a replaybuf.RateLimit"));
    }
    let need = |name: &str| -> PyResult<f64> {
        get_as::<f64>(&d, name)?
            .ok_or_else(|| value_error(format!("rate_limit: `{name}` is missing")))
    };
    let min_size = get_as::<u64>(&d, "min_size_to_sample")?.unwrap_or(1);
    let limit = match get_as::<String>(&d, "preset")?
        .as_deref()
        .unwrap_or("custom")
    {
        "custom" => RateLimit::new(
            min_size,
            need("samples_per_insert")?,
            need("min_diff")?,
            need("max_diff")?,
        ),
        "min_size" => Ok(RateLimit::min_size(min_size)),
        "sample_to_insert_ratio" => RateLimit::sample_to_insert_ratio(
            need("samples_per_insert")?,
            min_size,
            need("error_buffer")?,
        ),
        "queue" => RateLimit::queue(get_as::<u64>(&d, "size")?.unwrap_or(0)),
        other => return Err(value_error(format!("rate_limit: unknown preset {other:?}"))),
    }
    .map_err(py_err)?;
    let seconds = |name: &str| -> PyResult<Option<std::time::Duration>> {
        let Some(s) = get_as::<f64>(&d, name)? else {
            return Ok(None);
        };
        // Longer than any wait can last (`inf` among them): no timeout.
        if s >= u64::MAX as f64 {
            return Ok(None);
        }
        std::time::Duration::try_from_secs_f64(s)
            .map(Some)
            .map_err(|_| {
                value_error(format!(
                    "rate_limit: `{name}` must be seconds >= 0, got {s}"
                ))
            })
    };
    Ok(limit
        .insert_timeout(seconds("insert_timeout")?)
        .sample_timeout(seconds("sample_timeout")?))
}

/// Fields stored once a step, from their description (`replaybuf.Frames(...)`):
/// `stack` as (key, depth) pairs, `next_of` as (next key, key) pairs.
pub(crate) fn frames(desc: &Bound<'_, PyAny>) -> PyResult<Frames> {
    let d = described(desc, "frames")?;
    if kind(&d)? != "frames" {
        return Err(type_error("frames: expected a replaybuf.Frames"));
    }
    let mut f = Frames::new();
    for pair in get(&d, "stack")?
        .into_iter()
        .flat_map(|v| v.try_iter().ok())
        .flatten()
    {
        let (key, depth): (Bound<'_, PyAny>, usize) = pair?
            .extract()
            .map_err(|_| type_error("frames: stack maps a field to its depth (an int)"))?;
        f = f.stack(key_from_py(&key)?, depth);
    }
    for pair in get(&d, "next_of")?
        .into_iter()
        .flat_map(|v| v.try_iter().ok())
        .flatten()
    {
        let (next, of): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair?
            .extract()
            .map_err(|_| type_error("frames: next_of maps a next field to its field"))?;
        f = f.next_of(key_from_py(&of)?, key_from_py(&next)?);
    }
    f = f.fill(match get_as::<String>(&d, "fill")?.as_deref() {
        None | Some("repeat") => StackFill::Repeat,
        Some("zeros") => StackFill::Zeros,
        Some(other) => {
            return Err(value_error(format!(
                "frames: fill is \"repeat\" or \"zeros\", not {other:?}"
            )))
        }
    });
    if get_as::<bool>(&d, "checked")? == Some(false) {
        f = f.unchecked();
    }
    if let Some(n) = get_as::<usize>(&d, "terminal_slots")? {
        f = f.terminal_slots(n);
    }
    let truncated = get(&d, "truncated")?.map(|t| key_from_py(&t)).transpose()?;
    match (get(&d, "done")?, truncated) {
        (Some(done), truncated) => f = f.ends(key_from_py(&done)?, truncated),
        // The given truncation flag, beside the done field found by default (it was
        // dropped: a truncated step's next observation became the next episode's).
        (None, Some(truncated)) => f = f.truncated(truncated),
        (None, None) => {}
    }
    Ok(f)
}
