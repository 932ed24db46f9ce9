//! `replaybuf.ReplayBuffer`: the engine's buffer with numpy arrays in and out.
//!
//! Rows cross once: `extend` copies the caller's arrays into the storage, and `sample`
//! writes the drawn rows straight into numpy arrays (or, with `sample_into`, the
//! caller's), which then own their memory like any other array. They are new, or an
//! earlier sample's that nothing references any more (`recycle.rs`). The GIL is released
//! while rows move, draws are made or a wait happens, so Python collector and learner
//! threads run at once.

use numpy::npyffi;
use numpy::{
    PyArray1, PyArrayDescr, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray,
    PyUntypedArrayMethods,
};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock, RwLockReadGuard};
use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyDict, PyInt, PyList, PySlice, PyTuple, PyWeakrefMethods, PyWeakrefReference,
};
use replaybuf::sampler::Marks;
use replaybuf::{Batch, DType, Destination, Key, Learner, ReplayBuffer, Spec, PADDING_INDEX};

use crate::arrays::{dict_of_batch, span, with_borrowed, Spans};
use crate::config;
use crate::convert::{asarray, field_array};
use crate::errors::{index_error, key_error, py_err, type_error, value_error};
use crate::fields::{
    dtype_from_py, dtype_of_descr, flatten, key_from_py, key_to_py, numpy_dtype, refuse_reserved,
    spec_from_example, spec_from_py,
};
use crate::gil;
use crate::recycle::{Recycler, Want};

/// Forks of this process so far: the package counts them with
/// `os.register_at_fork(after_in_child=_native._forked)`.
static FORKS: AtomicU64 = AtomicU64::new(0);

/// Counts a fork, in the child (registered by the package at import).
#[pyfunction]
pub(crate) fn _forked() {
    FORKS.fetch_add(1, Ordering::Relaxed);
}

/// The shared buffers this process has attached to or pickled, by region name, held
/// weakly: unpickling a shared buffer in the process that already has it (a
/// `copy.deepcopy`, a queue between threads) gives back the same object rather than a
/// second attachment, which would be a second writer in the region and, with one
/// shard, be refused every write.
static ATTACHED: Mutex<Vec<(String, Py<PyWeakrefReference>)>> = Mutex::new(Vec::new());

/// The live buffer this process holds for the shared region `name`, if any.
fn attached<'py>(py: Python<'py>, name: &str) -> Option<Bound<'py, Buffer>> {
    ATTACHED
        .lock()
        .iter()
        .filter(|(n, _)| n == name)
        .find_map(|(_, weak)| weak.bind(py).upgrade_as::<Buffer>().ok().flatten())
}

/// Records `buffer` as this process's handle on its shared region (a no-op for other
/// buffers, and for one already recorded), forgetting buffers since dropped.
fn remember(buffer: &Bound<'_, Buffer>) -> PyResult<()> {
    let py = buffer.py();
    let Some(name) = &buffer.get().shared else {
        return Ok(());
    };
    let weak = PyWeakrefReference::new(buffer.as_any())?.unbind();
    let mut all = ATTACHED.lock();
    all.retain(|(_, w)| w.bind(py).upgrade().is_some());
    if !all
        .iter()
        .any(|(_, w)| w.bind(py).upgrade().is_some_and(|b| b.is(buffer)))
    {
        all.push((name.clone(), weak));
    }
    Ok(())
}

/// One field as Python sees it, made once per buffer.
struct FieldOut {
    key: Key,
    py_key: Py<PyAny>,
    dtype: DType,
    descr: Py<PyArrayDescr>,
    shape: Vec<usize>,
}

/// A replay buffer of numpy rows (see the package's docs for every argument).
#[pyclass(
    frozen,
    weakref,
    module = "replaybuf._native",
    name = "ReplayBuffer",
    subclass
)]
pub(crate) struct Buffer {
    /// This process's handle and learners: a `Box` of [`Here`]'s, replaced in a
    /// forked child (see [`Buffer::here`]), freed when the buffer drops.
    here: AtomicPtr<Here>,
    /// `sample`'s arrays, written again once the caller has dropped them.
    recycler: Recycler,
    fields: Vec<FieldOut>,
    /// Whether the sampler is prioritized (samples carry `weight`), and whether it
    /// samples slices (`marks`): as the buffer was built, or `reconfigure` made it.
    prioritized: AtomicBool,
    slices: AtomicBool,
    /// Whether samples give `index` as int64 (what torch indexes with) rather than
    /// uint64.
    signed_index: AtomicBool,
    /// The shared region's name, for pickling.
    shared: Option<String>,
}

/// A buffer's engine handle and idle learners, in one process: a forked child makes
/// its own (see [`Buffer::here`]).
struct Here {
    /// The fork count ([`FORKS`]) this belongs to.
    forks: u64,
    /// Write-locked only by `loads`, which needs the buffer's only handle. Never
    /// waited for with the GIL held: its holders may need the GIL to let go.
    rb: RwLock<ReplayBuffer>,
    /// Idle learner handles, for their working room: a sampling thread takes one (or
    /// makes one) and gives it back, so threads never wait on each other. They draw
    /// from the buffer's per-call streams (`learner_on_calls`), so that a checkpoint
    /// holds every draw's randomness: a loaded copy samples what the saved buffer
    /// would have, and a handle dropped (by a refused `loads`) changes nothing.
    learners: Mutex<Vec<Learner>>,
}

impl Here {
    fn new(rb: ReplayBuffer) -> *mut Here {
        Box::into_raw(Box::new(Here {
            forks: FORKS.load(Ordering::Relaxed),
            rb: RwLock::new(rb),
            learners: Mutex::new(Vec::new()),
        }))
    }

    /// The engine's handle, for one call ([`Buffer::handle`]).
    fn read(&self, py: Python<'_>) -> RwLockReadGuard<'_, ReplayBuffer> {
        self.rb
            .try_read()
            .unwrap_or_else(|| gil::detach(py, || self.rb.read()))
    }

    /// Runs `f` with an idle learner handle of `rb`'s, or a new one.
    fn with_learner<R>(&self, rb: &ReplayBuffer, f: impl FnOnce(&mut Learner) -> R) -> R {
        let mut learner = self
            .learners
            .lock()
            .pop()
            .unwrap_or_else(|| rb.learner_on_calls());
        let out = f(&mut learner);
        self.learners.lock().push(learner);
        out
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let here = *self.here.get_mut();
        // SAFETY: `here` is always a live `Box` of this buffer's (`Buffer::here`).
        if unsafe { &*here }.forks != FORKS.load(Ordering::Relaxed) {
            // Inherited from the parent by a fork this child never called through:
            // forgotten, as `Buffer::here` forgets it (dropping it detached the
            // parent, or unlinked the region the parent made).
            return;
        }
        // SAFETY: as above; nothing uses it after the buffer drops.
        drop(unsafe { Box::from_raw(here) });
    }
}

impl Buffer {
    fn wrap(py: Python<'_>, rb: ReplayBuffer, shared: Option<String>) -> PyResult<Buffer> {
        // A checkpoint's or a region's spec, made in Rust, was not checked on the way in.
        refuse_reserved(rb.spec())?;
        let fields = rb
            .spec()
            .fields()
            .iter()
            .map(|f| {
                Ok(FieldOut {
                    key: f.key().clone(),
                    py_key: key_to_py(py, f.key())?.unbind(),
                    dtype: f.dtype(),
                    descr: numpy_dtype(py, f.dtype())?.unbind(),
                    shape: f.shape().to_vec(),
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(Buffer {
            prioritized: AtomicBool::new(rb.alpha().is_some()),
            slices: AtomicBool::new(rb.slice_sampler().is_some()),
            signed_index: AtomicBool::new(false),
            recycler: Recycler::new(py),
            here: AtomicPtr::new(Here::new(rb)),
            fields,
            shared,
        })
    }

    /// Runs `f`, with the GIL released, on a batch whose columns are `data`'s arrays
    /// (a dict of arrays of shape `[n, ..]`, or `[t, E, ..]` for ndim 2), borrowed, not
    /// copied: the engine copies them once, into the storage. Everything is checked
    /// before `f` runs. `flat`: rows for storage positions (a rewrite's), which may
    /// also come as `[n, ..]` on ndim 2, as `get` gives them.
    fn with_batch<R: Send>(
        &self,
        py: Python<'_>,
        rb: &ReplayBuffer,
        data: &Bound<'_, PyAny>,
        flat: bool,
        f: impl FnOnce(&Batch) -> R + Send,
    ) -> PyResult<R> {
        let leaves = flatten(data)?;
        let mut batch_dims = (!flat).then(|| rb.ndim());
        let np = py.import("numpy")?;
        // Pair the caller's arrays with the spec's fields, checking everything before
        // anything is copied.
        let mut arrays: Vec<Option<Bound<'_, PyUntypedArray>>> = vec![None; self.fields.len()];
        let mut shape: Option<Vec<usize>> = None;
        for (key, value) in leaves {
            let Some(i) = self.fields.iter().position(|f| f.key == key) else {
                return Err(key_error(format!(
                    "`{}` is not a field of this buffer",
                    key_to_py(py, &key)?
                )));
            };
            let f = &self.fields[i];
            let array = match value.cast::<PyUntypedArray>() {
                Ok(a) => a.clone(),
                // Lists, scalars, tensors: converted to the field's dtype where no
                // value changes (`convert.rs`); a scalar becomes one row.
                Err(_) => np
                    .call_method1(
                        "ascontiguousarray",
                        (field_array(&value, f.py_key.bind(py), f.descr.bind(py))?,),
                    )?
                    .cast_into::<PyUntypedArray>()?,
            };
            let found = dtype_of_descr(&array.dtype())?;
            if found != f.dtype && !(f.dtype == DType::BF16 && found == DType::U16) {
                return Err(type_error(format!(
                    "`{}` must be {}, got {}",
                    f.py_key.bind(py),
                    f.descr.bind(py),
                    array.dtype()
                )));
            }
            if !array.is_c_contiguous() {
                return Err(value_error(format!(
                    "`{}` is not C-contiguous: pass numpy.ascontiguousarray(...)",
                    f.py_key.bind(py)
                )));
            }
            let dims = array.shape();
            let batch_dims = *batch_dims.get_or_insert_with(|| {
                if dims.len() == rb.ndim() + f.shape.len() {
                    rb.ndim()
                } else {
                    1
                }
            });
            let ok = dims.len() == batch_dims + f.shape.len() && dims[batch_dims..] == f.shape[..];
            if !ok {
                return Err(value_error(format!(
                    "`{}` has shape {:?}; expected (*batch, {}) with {batch_dims} batch dimension(s)",
                    f.py_key.bind(py),
                    dims,
                    f.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
                )));
            }
            match &shape {
                None => shape = Some(dims[..batch_dims].to_vec()),
                Some(s) if s[..] != dims[..batch_dims] => {
                    return Err(value_error(format!(
                        "`{}` has batch shape {:?}, other fields {:?}",
                        f.py_key.bind(py),
                        &dims[..batch_dims],
                        s
                    )))
                }
                Some(_) => {}
            }
            if arrays[i].is_some() {
                // By one key and again by its parts (`"x"` and `("x",)`): the last
                // one given was stored.
                return Err(key_error(format!(
                    "field `{}` is given twice",
                    f.py_key.bind(py)
                )));
            }
            arrays[i] = Some(array);
        }
        if let Some(i) = arrays.iter().position(Option::is_none) {
            return Err(key_error(format!(
                "field `{}` is missing",
                self.fields[i].py_key.bind(py)
            )));
        }
        let arrays: Vec<_> = arrays.into_iter().flatten().collect();
        with_borrowed(
            py,
            rb.spec().clone(),
            &shape.unwrap_or_default(),
            &arrays,
            f,
        )
    }

    /// This process's handle and learners.
    ///
    /// A forked child inherits the parent's, as they were at the fork: the lock and
    /// the learners' mutex perhaps held by a parent thread that was inside a call,
    /// which the child does not have (its first call waited for them forever). And a
    /// shared buffer's handle carries the parent's identity in the region: its
    /// process-table entry and the locks that tell the others it lives. Writing as
    /// the parent, a child that dies mid-write would leave a write that looks in
    /// progress for as long as the parent lives. So the first call in a forked child
    /// makes its own: a fresh lock and no learners, over a handle attached afresh, as
    /// itself, to a shared buffer, or over a clone of a heap buffer's. The inherited
    /// ones are forgotten, never dropped (dropping would detach the parent, or wait).
    /// Two threads of the child making theirs at once: one wins, the other drops its
    /// own.
    fn here(&self) -> PyResult<&Here> {
        let forks = FORKS.load(Ordering::Relaxed);
        let now = self.here.load(Ordering::Acquire);
        // SAFETY: `here` is always a live `Box`: replaced only below, where the one
        // replaced is leaked, and freed only when the buffer drops.
        let here = unsafe { &*now };
        if here.forks == forks {
            return Ok(here);
        }
        let rb = match &self.shared {
            Some(name) => ReplayBuffer::attach(name).map_err(py_err)?,
            // SAFETY: read without the lock, which a parent thread may hold in the
            // child for good; nobody writes the handle but `loads`, under it, and
            // `clone` reads only its `Arc`s.
            None => unsafe { &*here.rb.data_ptr() }.clone(),
        };
        let mine = Here::new(rb);
        match self
            .here
            .compare_exchange(now, mine, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: `mine` is now `here`'s Box, as above.
            Ok(_) => Ok(unsafe { &*mine }),
            Err(theirs) => {
                // SAFETY: `mine` was never shared.
                drop(unsafe { Box::from_raw(mine) });
                // SAFETY: `theirs` is `here`'s Box, as above.
                Ok(unsafe { &*theirs })
            }
        }
    }

    /// The engine's handle, for one call.
    ///
    /// The lock is waited for with the GIL released: `loads` waits for the write side
    /// (without the GIL), and once it waits parking_lot queues new readers behind it.
    /// A reader that queued holding the GIL would wait for readers that, to finish,
    /// need the GIL it holds: the whole interpreter would hang.
    fn handle(&self, py: Python<'_>) -> PyResult<RwLockReadGuard<'_, ReplayBuffer>> {
        Ok(self.here()?.read(py))
    }

    /// The dict of a batch the engine returned (`get`, `read_all_in_order`): its
    /// fields, `index` and `generation`.
    fn dict_of_batch<'py>(&self, py: Python<'py>, batch: &Batch) -> PyResult<Bound<'py, PyDict>> {
        let out = dict_of_batch(py, batch)?;
        out.set_item("generation", PyArray1::from_slice(py, batch.generations()))?;
        Ok(out)
    }

    /// What a sample carries besides its fields, in the order `sample_spans` takes
    /// them: `index` and `generation`, then `weight` (prioritized) and `marks` (slices).
    fn metadata<'py>(&self, py: Python<'py>) -> Vec<(&'static str, Bound<'py, PyArrayDescr>)> {
        let mut out = vec![
            ("index", self.index_descr(py)),
            ("generation", PyArrayDescr::of::<u64>(py)),
        ];
        if self.prioritized.load(Ordering::Relaxed) {
            out.push(("weight", PyArrayDescr::of::<f32>(py)));
        }
        if self.slices.load(Ordering::Relaxed) {
            out.push(("marks", PyArrayDescr::of::<u8>(py)));
        }
        out
    }

    /// The dtype of a sample's `index` ([`Buffer::index_dtype`]).
    fn index_descr<'py>(&self, py: Python<'py>) -> Bound<'py, PyArrayDescr> {
        if self.signed_index.load(Ordering::Relaxed) {
            PyArrayDescr::of::<i64>(py)
        } else {
            PyArrayDescr::of::<u64>(py)
        }
    }

    /// Samples into `arrays` (one per field, then index, generation, and weight and
    /// marks when this sampler writes them), `rows` rows of room: returns rows drawn.
    fn sample_spans(&self, py: Python<'_>, rows: usize, spans: Spans) -> PyResult<usize> {
        let here = self.here()?;
        let rb = here.read(py);
        let spec: &Spec = rb.spec();
        let fields = self.fields.len();
        let prioritized = self.prioritized.load(Ordering::Relaxed);
        let slices = self.slices.load(Ordering::Relaxed);
        gil::detach(py, || {
            let spans = spans;
            // SAFETY: every span is the data of an array of that many bytes that the
            // caller holds for this call, and no two overlap (distinct arrays, checked
            // by the caller for `sample_into`).
            let bytes = |i: usize| unsafe {
                let (ptr, len) = spans.0[i];
                std::slice::from_raw_parts_mut(ptr, len)
            };
            let words = |i: usize| -> &mut [u64] { cast_span(bytes(i)) };
            let mut dest = Destination::new(
                spec,
                rows,
                (0..fields).map(bytes),
                words(fields),
                words(fields + 1),
            )
            .map_err(py_err)?;
            let mut next = fields + 2;
            if prioritized {
                dest = dest.with_weight(cast_span(bytes(next))).map_err(py_err)?;
                next += 1;
            }
            if slices {
                let marks: &mut [Marks] = cast_span(bytes(next));
                dest = dest.with_marks(marks).map_err(py_err)?;
            }
            here.with_learner(&rb, |l| l.sample_to(&mut dest))
                .map_err(py_err)
        })
    }
}

/// An array's bytes as its elements. An empty array's data may sit at any address
/// (numpy calls it aligned all the same), and a cast checks the address even of no
/// bytes: a misaligned empty `index` array panicked inside `sample_into`.
fn cast_span<T: bytemuck::Pod>(bytes: &mut [u8]) -> &mut [T] {
    match bytes {
        [] => &mut [],
        bytes => bytemuck::cast_slice_mut(bytes),
    }
}

/// Why a read-only buffer (`open_dataset`'s, or one built with an `Immutable()`
/// writer) refuses `clear` and `loads`, as it does every other write.
const READ_ONLY_CLEAR: &str =
    "this buffer is read-only (open_dataset, or an Immutable() writer): clear is refused";
const READ_ONLY_LOADS: &str =
    "this buffer is read-only (open_dataset, or an Immutable() writer): loads is refused";

/// How long `loads` queues for the buffer before it stands aside (and looks for a
/// Ctrl-C), and for how long it stands aside.
const LOADS_TURN: std::time::Duration = std::time::Duration::from_millis(20);
const LOADS_ASIDE: std::time::Duration = std::time::Duration::from_millis(2);

#[pymethods]
impl Buffer {
    #[new]
    #[pyo3(signature = (
        capacity,
        *,
        spec = None,
        example = None,
        sampler = None,
        write_policy = None,
        rate_limit = None,
        frames = None,
        ndim = 1,
        envs = None,
        dim_extend = 0,
        shards = None,
        seed = None,
        batch_size = None,
        priority_key = None,
        memmap = None,
        shared = None,
        existsok = false,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        capacity: usize,
        spec: Option<&Bound<'_, PyAny>>,
        example: Option<&Bound<'_, PyAny>>,
        sampler: Option<&Bound<'_, PyAny>>,
        write_policy: Option<&Bound<'_, PyAny>>,
        rate_limit: Option<&Bound<'_, PyAny>>,
        frames: Option<&Bound<'_, PyAny>>,
        ndim: usize,
        envs: Option<usize>,
        dim_extend: usize,
        shards: Option<usize>,
        seed: Option<u64>,
        batch_size: Option<usize>,
        priority_key: Option<&Bound<'_, PyAny>>,
        memmap: Option<std::path::PathBuf>,
        shared: Option<String>,
        existsok: bool,
    ) -> PyResult<Buffer> {
        let spec = match (spec, example) {
            (Some(s), None) => spec_from_py(s)?,
            (None, Some(e)) => spec_from_example(e, 0)?,
            _ => return Err(value_error("give one of spec= and example=")),
        };
        let mut b = ReplayBuffer::builder(spec)
            .capacity(capacity)
            .ndim(ndim)
            .dim_extend(dim_extend)
            .sampler(config::sampler(sampler)?)
            .write_policy(config::write_policy(write_policy)?)
            .existsok(existsok);
        if let Some(envs) = envs {
            b = b.envs(envs);
        }
        if let Some(shards) = shards {
            b = b.shards(shards);
        }
        if let Some(seed) = seed {
            b = b.seed(seed);
        }
        if let Some(limit) = rate_limit.filter(|l| !l.is_none()) {
            b = b.rate_limit(config::rate_limit(limit)?);
        }
        if let Some(frames) = frames.filter(|f| !f.is_none()) {
            b = b.frames(config::frames(frames)?);
        }
        if let Some(n) = batch_size {
            b = b.batch_size(n);
        }
        if let Some(key) = priority_key {
            b = b.priority_key(key_from_py(key)?);
        }
        if let Some(dir) = memmap {
            b = b.memmap(dir);
        }
        if let Some(name) = &shared {
            b = b.shared(name.clone());
        }
        let rb = gil::detach(py, || b.build()).map_err(py_err)?;
        Buffer::wrap(py, rb, shared)
    }

    /// Attaches to a shared buffer another process made with `shared=name`. Where
    /// this process already attached to that buffer or pickled it, returns that same
    /// object, so that unpickling in the process that holds it adds no second writer.
    #[staticmethod]
    fn attach(py: Python<'_>, name: String) -> PyResult<Bound<'_, Buffer>> {
        if let Some(held) = attached(py, &name) {
            return Ok(held);
        }
        let rb = gil::detach(py, || ReplayBuffer::attach(&name)).map_err(py_err)?;
        let buffer = Bound::new(py, Buffer::wrap(py, rb, Some(name))?)?;
        remember(&buffer)?;
        Ok(buffer)
    }

    /// A buffer rebuilt from a checkpoint `dumps` wrote: same configuration, on the
    /// heap, every row, priority and sampler state.
    #[staticmethod]
    fn from_checkpoint(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Buffer> {
        let rb = gil::detach(py, || ReplayBuffer::from_checkpoint(&path)).map_err(py_err)?;
        Buffer::wrap(py, rb, None)
    }

    /// A checkpoint or file-backed directory opened read-only, its rows mapped from
    /// the files as they are sampled: every write is refused.
    #[staticmethod]
    fn open_dataset(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Buffer> {
        let rb = gil::detach(py, || ReplayBuffer::open_dataset(&path)).map_err(py_err)?;
        Buffer::wrap(py, rb, None)
    }

    /// What the rate limit has counted, as a dict (rows `inserts` and `samples`,
    /// `insert_waits` and `sample_waits` with their total seconds `insert_waited` and
    /// `sample_waited`, `closed`, `diff`, and the limit in force), or None without a
    /// rate limit.
    fn rate_limit_stats<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.handle(py)?.rate_limit_stats() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        let (min_diff, max_diff) = s.limit.diff_band();
        let (insert_timeout, sample_timeout) = s.limit.timeouts();
        d.set_item("inserts", s.inserts)?;
        d.set_item("samples", s.samples)?;
        d.set_item("insert_waits", s.insert_waits)?;
        d.set_item("insert_waited", s.insert_waited.as_secs_f64())?;
        d.set_item("sample_waits", s.sample_waits)?;
        d.set_item("sample_waited", s.sample_waited.as_secs_f64())?;
        d.set_item("closed", s.closed)?;
        d.set_item("diff", s.diff())?;
        d.set_item("samples_per_insert", s.limit.samples_per_insert())?;
        d.set_item("min_size_to_sample", s.limit.min_size_to_sample())?;
        d.set_item("min_diff", min_diff)?;
        d.set_item("max_diff", max_diff)?;
        d.set_item("insert_timeout", insert_timeout.map(|t| t.as_secs_f64()))?;
        d.set_item("sample_timeout", sample_timeout.map(|t| t.as_secs_f64()))?;
        Ok(Some(d))
    }

    /// Puts a new rate limit in force, counts kept; waiting calls judge themselves by
    /// it at once.
    fn set_rate_limit(&self, py: Python<'_>, limit: &Bound<'_, PyAny>) -> PyResult<()> {
        let limit = config::rate_limit(limit)?;
        self.handle(py)?.set_rate_limit(limit).map_err(py_err)
    }

    /// Closes the rate limit: waiting calls, and later calls that would wait, raise
    /// `RateLimitClosed` (for shutting collectors and learners down).
    fn close_rate_limit(&self, py: Python<'_>) -> PyResult<()> {
        self.handle(py)?.close_rate_limit().map_err(py_err)
    }

    /// Opens a closed rate limit again.
    fn reopen_rate_limit(&self, py: Python<'_>) -> PyResult<()> {
        self.handle(py)?.reopen_rate_limit().map_err(py_err)
    }

    /// Rows the storage holds.
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.handle(py)?.len())
    }

    /// Rows the storage can hold.
    #[getter]
    fn capacity(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.handle(py)?.capacity())
    }

    /// What a row takes, in bytes: `logical` (a row as extended and sampled), `slot`
    /// (one storage slot: its header and the row as stored; with frames, a stack's
    /// newest frame only) and `side` (a frames buffer's side slots, all together).
    #[getter]
    fn row_bytes(
        &self,
        py: Python<'_>,
    ) -> PyResult<std::collections::HashMap<&'static str, usize>> {
        let b = self.handle(py)?.row_bytes();
        Ok([("logical", b.logical), ("slot", b.slot), ("side", b.side)].into())
    }

    /// Rows ever written (TorchRL's `write_count`).
    #[getter]
    fn write_count(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.handle(py)?.write_count())
    }

    /// The rows (a slice sampler's: slices) of the open without-replacement epoch
    /// not yet drawn; None for samplers with replacement, or with no epoch open. 0
    /// (with `drop_last`: fewer than a batch) once a sample ran the epoch out.
    fn epoch_left(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        Ok(self.handle(py)?.epoch_left())
    }

    /// Rows a FIFO sampler has not taken yet (None for other samplers).
    fn queued(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        Ok(self.handle(py)?.queued())
    }

    /// 1, or 2 for a storage of `[steps, envs]`.
    #[getter]
    fn ndim(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.handle(py)?.ndim())
    }

    /// Environments of an ndim-2 storage (1 for ndim 1).
    #[getter]
    fn envs(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.handle(py)?.envs())
    }

    /// Independent rings the rows are spread over.
    #[getter]
    fn shards(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.handle(py)?.shards())
    }

    /// The seed of every draw.
    #[getter]
    fn seed(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.handle(py)?.seed())
    }

    /// The rows `sample()` draws when given no count, if set.
    #[getter]
    fn batch_size(&self, py: Python<'_>) -> PyResult<Option<usize>> {
        Ok(self.handle(py)?.batch_size())
    }

    /// The numpy dtype of a sample's `index`: uint64, or int64 once set so (what torch
    /// indexes with; a TorchRL-style caller then needs no conversion). In int64, a
    /// short slice's padding index is -1, which `update_priority` skips as it does
    /// the uint64 one; `get` and `write_at` read -1 as the last stored row, so leave
    /// padding rows out (`marks`) before writing a sample back.
    #[getter]
    fn index_dtype<'py>(&self, py: Python<'py>) -> Bound<'py, PyArrayDescr> {
        self.index_descr(py)
    }

    #[setter(index_dtype)]
    fn set_index_dtype(&self, dtype: &Bound<'_, PyAny>) -> PyResult<()> {
        let signed = match dtype_from_py(dtype)? {
            DType::I64 => true,
            DType::U64 => false,
            _ => {
                return Err(type_error(format!(
                    "index_dtype is uint64 or int64, got {dtype}"
                )))
            }
        };
        self.signed_index.store(signed, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the sampler is prioritized (samples carry `weight`).
    #[getter]
    fn prioritized(&self) -> bool {
        self.prioritized.load(Ordering::Relaxed)
    }

    /// Whether the sampler draws slices of trajectories (samples carry `marks`).
    #[getter]
    fn samples_slices(&self) -> bool {
        self.slices.load(Ordering::Relaxed)
    }

    /// The shared region's name, for a shared buffer.
    #[getter]
    fn shared_name(&self) -> Option<&str> {
        self.shared.as_deref()
    }

    /// The priority exponent, for a prioritized sampler.
    #[getter]
    fn alpha(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        Ok(self.handle(py)?.alpha())
    }

    #[setter(alpha)]
    fn set_alpha(&self, py: Python<'_>, alpha: f64) -> PyResult<()> {
        let rb = self.handle(py)?;
        gil::detach(py, || rb.set_alpha(alpha)).map_err(py_err)
    }

    /// The importance-correction exponent, for a prioritized sampler.
    #[getter]
    fn beta(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        Ok(self.handle(py)?.beta())
    }

    #[setter(beta)]
    fn set_beta(&self, py: Python<'_>, beta: f64) -> PyResult<()> {
        self.handle(py)?.set_beta(beta).map_err(py_err)
    }

    /// For a prioritized sampler, `(total, min)`: the sum over the stored rows of
    /// `(priority + eps) ** alpha`, which a row's chance of being drawn is its share
    /// of, and the smallest non-zero one, which weights are taken against
    /// (`(min / mass) ** beta`); `(0.0, 0.0)` when empty. None otherwise.
    fn priority_mass(&self, py: Python<'_>) -> PyResult<Option<(f64, f64)>> {
        Ok(self.handle(py)?.priority_mass().map(|m| (m.total, m.min)))
    }

    /// The fields: a list of `(key, numpy dtype, shape)`.
    #[getter]
    fn spec<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let items = self
            .fields
            .iter()
            .map(|f| {
                let dtype: Bound<'_, PyAny> = if f.dtype == DType::BF16 {
                    "bfloat16".into_pyobject(py)?.into_any()
                } else {
                    f.descr.bind(py).clone().into_any()
                };
                PyTuple::new(
                    py,
                    [
                        f.py_key.bind(py).clone(),
                        dtype,
                        PyTuple::new(py, &f.shape)?.into_any(),
                    ],
                )
            })
            .collect::<PyResult<Vec<_>>>()?;
        PyList::new(py, items)
    }

    /// Appends a batch (a dict of arrays, nested dicts or tuple keys for nested
    /// fields, each of shape `(n, *field shape)`, or `(t, envs, *field shape)` for
    /// ndim 2) and returns the storage index of every row (`2**64 - 1` for a row a
    /// max-value writer rejected). Arrays must have the fields' dtypes; lists, scalars
    /// and tensors are converted where no value changes (a float into an integer
    /// field, or an integer outside the field's range, is refused).
    fn extend<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let rb = self.handle(py)?;
        let (written, shape) =
            self.with_batch(py, &rb, data, false, |b| (rb.extend(b), b.shape().to_vec()))?;
        let written = written.map_err(py_err)?;
        Ok(PyArray1::from_vec(py, written.to_vec())
            .reshape(shape)?
            .into_any())
    }

    /// Adds one transition (a dict of arrays of the field shapes) and returns its
    /// index. ndim-1 storages only.
    fn add(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<u64> {
        let rb = self.handle(py)?;
        if rb.ndim() != 1 {
            return Err(value_error(format!(
                "add writes one row, on an ndim-1 buffer only; this one has ndim={}: extend \
                 it with arrays of shape [t, envs, ...]",
                rb.ndim()
            )));
        }
        let np = py.import("numpy")?;
        let one = PyDict::new(py);
        for (key, value) in flatten(data)? {
            let field = self.fields.iter().find(|f| f.key == key);
            let array = match (value.cast::<PyUntypedArray>(), field) {
                (Ok(a), _) => a.clone().into_any(),
                (Err(_), Some(f)) => {
                    field_array(&value, f.py_key.bind(py), f.descr.bind(py))?.into_any()
                }
                (Err(_), None) => value,
            };
            one.set_item(
                key_to_py(py, &key)?,
                np.call_method1("expand_dims", (array, 0))?,
            )?;
        }
        self.with_batch(py, &rb, &one, false, |b| rb.add(b))?
            .map_err(py_err)
    }

    /// Draws `n` rows (the buffer's `batch_size` when `n` is None): a dict of one
    /// array per field, plus `index` and `generation` (uint64), `weight` (float32) for a
    /// prioritized sampler and `marks` (uint8: 1 valid, 2 start, 4 end, 8 truncated)
    /// for a slice sampler. Fewer rows only when a without-replacement epoch ends short.
    #[pyo3(signature = (n = None))]
    fn sample<'py>(
        &self,
        py: Python<'py>,
        n: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let n = n
            .map(|n| {
                let count = || value_error(format!("a batch is a count of rows, not {n}"));
                if n.is_instance_of::<PyBool>() {
                    return Err(count());
                }
                n.extract::<u64>()
                    .ok()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| match n.is_instance_of::<PyInt>() {
                        true => count(),
                        false => type_error(format!(
                            "a batch size is an int, got {}",
                            n.get_type().name().map_or(String::new(), |t| t.to_string())
                        )),
                    })
            })
            .transpose()?;
        let n = match n.or(self.handle(py)?.batch_size()) {
            Some(n) => n,
            None => {
                return Err(value_error(
                    "give a batch size: sample(n), or batch_size= when building",
                ))
            }
        };
        let metadata = self.metadata(py);
        let mut keys = Vec::with_capacity(self.fields.len() + metadata.len());
        let mut shapes = Vec::with_capacity(keys.capacity());
        for f in &self.fields {
            keys.push(f.py_key.bind(py).clone());
            shapes.push([&[n][..], &f.shape].concat());
        }
        for (name, _) in &metadata {
            keys.push(name.into_pyobject(py)?.into_any());
            shapes.push(vec![n]);
        }
        let descrs = self
            .fields
            .iter()
            .map(|f| f.descr.bind(py))
            .chain(metadata.iter().map(|(_, descr)| descr));
        let wants: Vec<Want<'_, 'py>> = descrs
            .zip(&shapes)
            .map(|(descr, shape)| Want { descr, shape })
            .collect();
        let arrays: Vec<_> = keys
            .into_iter()
            .zip(self.recycler.arrays(py, &wants)?)
            .collect();
        let spans = Spans(arrays.iter().map(|(_, a)| span(a)).collect());
        let rows = self.sample_spans(py, n, spans)?;
        let out = PyDict::new(py);
        let cut = (rows < n).then(|| PySlice::new(py, 0, rows as isize, 1));
        for (key, array) in arrays {
            match &cut {
                None => out.set_item(key, array)?,
                Some(cut) => out.set_item(key, array.get_item(cut)?)?,
            }
        }
        Ok(out)
    }

    /// Draws into the caller's arrays (a dict like one `sample` returns, its arrays
    /// C-contiguous and of the right dtypes, with room for the same number of rows;
    /// `weight` for a prioritized sampler and `marks` for a slice sampler): no
    /// allocation. Returns the rows drawn. The arrays must not be used by another
    /// thread during the call.
    fn sample_into<'py>(&self, py: Python<'py>, out: &Bound<'py, PyDict>) -> PyResult<usize> {
        let get = |key: &Bound<'py, PyAny>, name: &str| -> PyResult<Bound<'py, PyUntypedArray>> {
            let value = out
                .get_item(key)?
                .ok_or_else(|| key_error(format!("sample_into: no array for `{name}`")))?;
            let array = value
                .cast_into::<PyUntypedArray>()
                .map_err(|_| type_error(format!("sample_into: `{name}` is not a numpy array")))?;
            if !array.is_c_contiguous() || !array.is_aligned() || !writeable(&array) {
                return Err(value_error(format!(
                    "sample_into: `{name}` must be C-contiguous, aligned and writeable"
                )));
            }
            Ok(array)
        };
        let mut arrays = Vec::new();
        for f in &self.fields {
            let array = get(f.py_key.bind(py), &f.py_key.bind(py).to_string())?;
            if !array.dtype().is_equiv_to(f.descr.bind(py)) {
                return Err(type_error(format!(
                    "sample_into: `{}` must be {}, got {}",
                    f.py_key.bind(py),
                    f.descr.bind(py),
                    array.dtype()
                )));
            }
            arrays.push(array);
        }
        for (name, descr) in &self.metadata(py) {
            let array = get(&name.into_pyobject(py)?.into_any(), name)?;
            if !array.dtype().is_equiv_to(descr) {
                return Err(type_error(format!(
                    "sample_into: `{name}` must be {descr}, got {}",
                    array.dtype()
                )));
            }
            arrays.push(array);
        }
        // The rows are the index's: one a row (a (3, 2) index was read as 6 rows, and
        // the fields' arrays blamed for it).
        let index = &arrays[self.fields.len()];
        if index.ndim() != 1 {
            return Err(value_error(format!(
                "sample_into: `index` has shape {:?}, expected (rows,)",
                index.shape()
            )));
        }
        let rows = index.len();
        // One entry a row in each of the others too: the batch size's cut below takes
        // whole rows of each array, and a weight of another length was cut mid-value.
        for ((name, _), array) in self.metadata(py).iter().zip(&arrays[self.fields.len()..]) {
            if array.shape() != [rows] {
                return Err(value_error(format!(
                    "sample_into: `{name}` has shape {:?}, expected ({rows},) as `index`",
                    array.shape()
                )));
            }
        }
        // Distinct arrays: a dict may hold one array under two keys.
        let spans = Spans(arrays.iter().map(span).collect());
        let mut starts: Vec<(usize, usize)> =
            spans.0.iter().map(|&(p, l)| (p as usize, l)).collect();
        starts.sort_unstable();
        if starts
            .windows(2)
            .any(|w| w[0].0 + w[0].1 > w[1].0 && w[0].1 > 0)
        {
            return Err(value_error("sample_into: two of the arrays share memory"));
        }
        for (f, array) in self.fields.iter().zip(&arrays) {
            // The shape, not only the size: rows of (4, 3) went into a (2, 6) array.
            let want: Vec<usize> = std::iter::once(rows)
                .chain(f.shape.iter().copied())
                .collect();
            if array.shape() != want.as_slice() {
                return Err(value_error(format!(
                    "sample_into: `{}` has shape {:?}, expected ({rows}, {})",
                    f.py_key.bind(py),
                    array.shape(),
                    f.shape
                        .iter()
                        .map(|d| d.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        let n = self.handle(py)?.batch_size().unwrap_or(rows).min(rows);
        // The arrays' first `n` rows (a batch size under their room): every array
        // holds `rows` rows of whole bytes each.
        let spans = if n < rows {
            Spans(spans.0.iter().map(|&(p, l)| (p, l / rows * n)).collect())
        } else {
            spans
        };
        self.sample_spans(py, n, spans)
    }

    /// Sets the priorities of sampled rows. With `generation` (from the sample), rows
    /// replaced since they were drawn are skipped; without, the update goes to
    /// whatever rows are at `index` now (TorchRL's behaviour). `priority` holds one
    /// value per row, or several (reduced by the sampler's `reduction`). Returns
    /// `(applied, stale)`. NaN, infinite or negative priorities change nothing.
    #[pyo3(signature = (index, priority, generation = None))]
    fn update_priority<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
        priority: &Bound<'py, PyAny>,
        generation: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(usize, usize)> {
        let index_a = flat_array::<u64>(index)?;
        let numpy = py.import("numpy")?;
        let shape: Vec<usize> = numpy.call_method1("shape", (priority,))?.extract()?;
        if shape.len() > 1 && shape[0] != index_a.len() {
            // Several priorities a row come row by row: a [2, 3] for 3 indices was
            // regrouped into pairs.
            return Err(value_error(format!(
                "priorities of shape {shape:?} for {} indices: one row of them an index",
                index_a.len()
            )));
        }
        let priority_a = flat_array::<f64>(priority)?;
        let rb = self.handle(py)?;
        let index_r = index_a.readonly();
        let priority_r = priority_a.readonly();
        let (index_s, priority_s) = (index_r.as_slice()?, priority_r.as_slice()?);
        let done = match generation {
            Some(g) => {
                let g = flat_array::<u64>(g)?;
                let g = g.readonly();
                let g = g.as_slice()?;
                gil::detach(py, || rb.update_priority(index_s, g, priority_s))
            }
            None => {
                // The rows there now, and their generations; a slice batch's padding
                // (no row) keeps its place, for the update to skip.
                let rows: Vec<u64> = index_s
                    .iter()
                    .copied()
                    .filter(|&i| i != PADDING_INDEX)
                    .collect();
                // From the rows' stamps: copying the rows to read their generations
                // took 1.1 ms for 256 rows of 28 KB, against 0.05 with them given.
                let current = gil::detach(py, || rb.generations_at(&rows)).map_err(py_err)?;
                let mut found = current.iter();
                let generations: Vec<u64> = index_s
                    .iter()
                    .map(|&i| match i {
                        PADDING_INDEX => 0,
                        _ => *found.next().expect("one generation a row asked for"),
                    })
                    .collect();
                gil::detach(py, || rb.update_priority(index_s, &generations, priority_s))
            }
        }
        .map_err(py_err)?;
        Ok((done.applied, done.stale))
    }

    /// The priority of the row at `index`, as last set (None if not prioritized, or no
    /// row is there).
    fn priority(&self, py: Python<'_>, index: &Bound<'_, PyAny>) -> PyResult<Option<f64>> {
        refuse_bool(index)?;
        let index = match (index.extract::<u64>(), index.extract::<i64>()) {
            (Ok(i), _) => i,
            (_, Ok(i)) => return Err(index_error(format!("index {i} is negative"))),
            // Past 64 bits: no row is there (it was an OverflowError); one below zero
            // is negative, as -1 is.
            _ if index.is_instance_of::<PyInt>() => {
                return match index.lt(0)? {
                    true => Err(index_error(format!("index {index} is negative"))),
                    false => Ok(None),
                }
            }
            _ => {
                return Err(type_error(format!(
                    "priority takes one int index, got {}",
                    index.get_type().name()?
                )))
            }
        };
        Ok(self.handle(py)?.priority(index))
    }

    /// The rows at `index` (an int, an array of ints, or a mask of one boolean a stored
    /// row), in that order, as a dict. A negative index counts back from the number of
    /// rows stored, as a list's does; one before the first row is an `IndexError`.
    fn get<'py>(&self, py: Python<'py>, index: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyDict>> {
        let rb = self.handle(py)?;
        let indices = positions(&rb, index)?;
        let batch = gil::detach(py, || rb.get_many(&indices)).map_err(py_err)?;
        self.dict_of_batch(py, &batch)
    }

    /// The storage positions `index` names, as `get` reads them (uint64, flattened):
    /// an int, an array of ints (a negative one counting back through the positions
    /// that hold rows), or a mask of one boolean a stored row.
    fn positions<'py>(
        &self,
        py: Python<'py>,
        index: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let rb = self.handle(py)?;
        Ok(PyArray1::from_vec(py, positions(&rb, index)?))
    }

    /// The storage positions among the first `end` (all when None) that hold a row,
    /// in storage order (uint64): those whose rows `read_all_in_order` gives.
    #[pyo3(signature = (end = None))]
    fn stored_positions<'py>(
        &self,
        py: Python<'py>,
        end: Option<usize>,
    ) -> PyResult<Bound<'py, PyArray1<u64>>> {
        let rb = self.handle(py)?;
        let stored = gil::detach(py, || rb.stored_positions(end));
        Ok(PyArray1::from_vec(py, stored))
    }

    /// Every stored row among the first `end` positions (all when None), in storage
    /// order (TorchRL's `rb[:end]`).
    #[pyo3(signature = (end = None))]
    fn read_all_in_order<'py>(
        &self,
        py: Python<'py>,
        end: Option<usize>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let rb = self.handle(py)?;
        let batch = gil::detach(py, || rb.read_all_in_order(end));
        self.dict_of_batch(py, &batch)
    }

    /// Overwrites positions `0..end` with the first `end` rows of `data`, in storage
    /// order (TorchRL's `rb[:end] = data`); every position must hold a row.
    #[pyo3(signature = (data, end = None))]
    fn write_all(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        end: Option<usize>,
    ) -> PyResult<()> {
        let rb = self.handle(py)?;
        self.with_batch(py, &rb, data, true, |b| rb.write_all(b, end))?
            .map_err(py_err)
    }

    /// Overwrites the rows at `index` (an int, or an array of ints, counted as `get`
    /// counts them) with the rows of `data`, one for each index, in order: a position
    /// named twice keeps its last row (TorchRL's `rb[index] = data`). Every position
    /// must hold a row; on any error nothing is written.
    fn write_at(
        &self,
        py: Python<'_>,
        index: &Bound<'_, PyAny>,
        data: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let rb = self.handle(py)?;
        let indices = positions(&rb, index)?;
        self.with_batch(py, &rb, data, true, |b| rb.write_at(&indices, b))?
            .map_err(py_err)
    }

    /// Swaps the sampler, the write policy or the capacity of a built buffer, its rows
    /// and priorities kept (TorchRL's `set_sampler`, `set_writer`, `set_storage`): a
    /// cold path, which holds collectors and learners back while the rows are
    /// carried. `sampler` and `write_policy` as the constructor takes them; with
    /// `capacity`, the rows move to a heap storage of that many (the newest kept).
    /// A shared buffer refuses every swap; on any error nothing changes.
    #[pyo3(signature = (*, sampler = None, write_policy = None, capacity = None))]
    fn reconfigure(
        &self,
        py: Python<'_>,
        sampler: Option<&Bound<'_, PyAny>>,
        write_policy: Option<&Bound<'_, PyAny>>,
        capacity: Option<usize>,
    ) -> PyResult<()> {
        let sampler = sampler.map(|s| config::sampler(Some(s))).transpose()?;
        let write_policy = write_policy
            .map(|w| config::write_policy(Some(w)))
            .transpose()?;
        let rb = self.handle(py)?;
        gil::detach(py, || {
            let mut change = rb.reconfigure();
            if let Some(s) = sampler {
                change = change.sampler(s);
            }
            if let Some(w) = write_policy {
                change = change.write_policy(w);
            }
            if let Some(c) = capacity {
                change = change.storage(replaybuf::swap::StorageConfig::heap().capacity(c));
            }
            change.apply()
        })
        .map_err(py_err)?;
        // What samples carry follows the sampler now in force.
        self.prioritized
            .store(rb.alpha().is_some(), Ordering::Relaxed);
        self.slices
            .store(rb.slice_sampler().is_some(), Ordering::Relaxed);
        Ok(())
    }

    /// Drops every row (TorchRL's `empty`), ending the sampler's epoch.
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        let rb = self.handle(py)?;
        // As every other write of a dataset is refused (it emptied the rows).
        gil::detach(py, || rb.clear()).map_err(|_| value_error(READ_ONLY_CLEAR))
    }

    /// Saves the whole state (rows, priorities, sampler state, random streams) under
    /// the directory `path` (TorchRL's `dumps`).
    fn dumps(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        let rb = self.handle(py)?;
        gil::detach(py, || rb.save(&path)).map_err(py_err)
    }

    /// Loads a checkpoint of this buffer's layout into it (TorchRL's `loads`). No
    /// other thread may use the buffer meanwhile; on any error it is left as it was.
    fn loads(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<()> {
        // A call waiting inside the buffer (a rate-limited sample waiting for rows)
        // holds the lock's read side. Queued for the write side, `loads` would hold
        // back every new reader, the collectors that call waits for among them, and
        // `close_rate_limit`: so it queues in turns of `LOADS_TURN`, and between turns
        // stands aside for `LOADS_ASIDE`, letting the readers held back in (without
        // the pause it queued again before they woke), and answers Ctrl-C. Queued, it
        // gets in between back-to-back samplers, which a look for the lock free
        // alone never did.
        let here = self.here()?;
        let mut rb = loop {
            if let Some(rb) = gil::detach(py, || here.rb.try_write_for(LOADS_TURN)) {
                break rb;
            }
            py.check_signals()?;
            gil::detach(py, || std::thread::sleep(LOADS_ASIDE));
        };
        if rb.is_read_only() {
            // Its rows replaced: a write, as `clear` is.
            return Err(value_error(READ_ONLY_LOADS));
        }
        gil::detach(py, || {
            // They hold the buffer, whose only handle `restore` needs; they keep no
            // random state (`Here::learners`), so a refused load changes no draw.
            here.learners.lock().clear();
            rb.restore(&path)
        })
        .map_err(py_err)
    }

    /// Writes a file-backed storage through to its file and the disk.
    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        let rb = self.handle(py)?;
        gil::detach(py, || rb.flush()).map_err(py_err)
    }

    /// A shared buffer pickles as its name and attaches on unpickling, so it can be
    /// handed to `multiprocessing` workers; any other buffer refuses to be pickled.
    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (String,))> {
        let py = slf.py();
        remember(slf)?;
        match &slf.get().shared {
            Some(name) => Ok((
                py.import("replaybuf._native")?
                    .getattr("ReplayBuffer")?
                    .getattr("attach")?,
                (name.clone(),),
            )),
            None => Err(type_error(
                "a heap or file-backed replaybuf.ReplayBuffer cannot be pickled: its rows \
                 live in this process. Build it with shared=\"name\" to hand it to other \
                 processes (they attach to the same memory), or dumps() it to a directory",
            )),
        }
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let rb = self.handle(py)?;
        Ok(format!(
            "ReplayBuffer(len={}, capacity={}, fields={}, shards={}{})",
            rb.len(),
            rb.capacity(),
            self.fields.len(),
            rb.shards(),
            self.shared
                .as_deref()
                .map(|n| format!(", shared={n:?}"))
                .unwrap_or_default()
        ))
    }
}

/// `x` as a contiguous, aligned 1-D array of `T`: itself when it is one already (what
/// `sample` returns, the common case, which then costs no numpy call), else
/// `numpy.require(x, T, ["C", "A"]).reshape(-1)`.
fn flat_array<'py, T: numpy::Element>(x: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArray1<T>>> {
    let py = x.py();
    if let Ok(a) = x.cast::<PyArray1<T>>() {
        // (An empty one is made afresh below.)
        if a.is_c_contiguous() && a.is_aligned() && a.len() > 0 {
            return Ok(a.clone());
        }
    }
    // Numbers only, converted as their values allow: integers (non-negative ones for
    // indices and generations), or any number for priorities. A float index was
    // truncated, a negative one an OverflowError, a string numpy's own ValueError.
    let integers = numpy::dtype::<T>(py).kind() == b'u';
    let (array, kind) = if integers {
        array_of_kind(x, "iu", "integers")?
    } else {
        array_of_kind(x, "iuf", "numbers")?
    };
    // (`min` of none is numpy's ValueError.) In an int64 array, -1 is a slice
    // sample's padding as an int64 index shows it (`index_dtype`), cast back to it
    // below (`PADDING_INDEX`); a list's -1 is a mistake.
    if integers && kind == "i" && array.getattr("size")?.extract::<usize>()? > 0 {
        let min = array.call_method0("min")?.extract::<i64>()?;
        let padding = x
            .cast::<PyUntypedArray>()
            .is_ok_and(|a| a.dtype().is_equiv_to(&numpy::dtype::<i64>(py)));
        if min < -i64::from(padding) {
            return Err(index_error(format!(
                "a negative index or generation: {min}"
            )));
        }
    }
    let flat = py
        .import("numpy")?
        .call_method1("require", (array, numpy::dtype::<T>(py), ["C", "A"]))?
        .call_method1("reshape", (-1,))?
        .cast_into::<PyArray1<T>>()?;
    if flat.len() == 0 {
        // An empty array's data may sit anywhere (numpy calls it aligned all the
        // same), and a slice of it must not: a fresh one.
        return Ok(PyArray1::zeros(py, 0, false));
    }
    Ok(flat)
}

/// The storage positions `index` names (an int, an array of ints of any shape,
/// flattened, or a mask of booleans, one for each stored row): a negative one counts
/// back through the positions that hold rows, in storage order, as a list's index
/// counts back through the list (-1 is the last stored row: position `len - 1` until
/// a clear, after which positions go on from where the ring was, or where several
/// shards leave gaps); one before the first row is an `IndexError`. A mask's
/// booleans are those positions', in that order.
fn positions(rb: &ReplayBuffer, index: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    refuse_bool(index)?;
    let rows = rb.len() as u64;
    let from_end = |i: i64| -> PyResult<u64> {
        match u64::try_from(i) {
            Ok(i) => Ok(i),
            Err(_) => usize::try_from(i.unsigned_abs() - 1)
                .ok()
                .and_then(|k| rb.stored_position_from_end(k))
                .ok_or_else(|| index_error(format!("index {i} is out of bounds for {rows} rows"))),
        }
    };
    if let Ok(i) = index.extract::<i64>() {
        return Ok(vec![from_end(i)?]);
    }
    // Many indices counting back look up one list (each alone scans from the end).
    let stored = std::cell::OnceCell::new();
    let from_end_of_many = |i: i64| -> PyResult<u64> {
        match u64::try_from(i) {
            Ok(i) => Ok(i),
            Err(_) => {
                let stored: &Vec<u64> = stored.get_or_init(|| rb.stored_positions(None));
                stored
                    .len()
                    .checked_sub(i.unsigned_abs() as usize)
                    .map(|k| stored[k])
                    .ok_or_else(|| {
                        index_error(format!("index {i} is out of bounds for {rows} rows"))
                    })
            }
        }
    };
    // An integer past `i64`, alone or in a list (numpy makes those objects or floats):
    // a position no buffer has, not a value of the wrong type.
    let is_int =
        |x: &Bound<'_, PyAny>| x.is_instance_of::<PyInt>() && !x.is_instance_of::<PyBool>();
    let past_range = || index_error(format!("index {index} is out of range for {rows} rows"));
    if is_int(index) {
        return Err(past_range());
    }
    let listed = index.is_instance_of::<PyList>() || index.is_instance_of::<PyTuple>();
    if let Some(items) = listed
        .then(|| index.extract::<Vec<Bound<'_, PyAny>>>().ok())
        .flatten()
    {
        if items
            .iter()
            .any(|x| is_int(x) && x.extract::<i64>().is_err())
        {
            return Err(past_range());
        }
    }
    let (array, kind) = array_of_kind(index, "biu", "integers")?;
    if kind == "b" {
        let stored = rb.stored_positions(None);
        let shape: Vec<usize> = array.getattr("shape")?.extract()?;
        if shape != [stored.len()] {
            return Err(index_error(format!(
                "a mask of shape {shape:?} for {} rows: it needs one boolean a row",
                stored.len()
            )));
        }
        let at: Vec<usize> = array
            .py()
            .import("numpy")?
            .call_method1("flatnonzero", (&array,))?
            .call_method0("tolist")?
            .extract()?;
        return Ok(at.into_iter().map(|k| stored[k]).collect());
    }
    let unsigned = kind == "u";
    let dtype = if unsigned { "uint64" } else { "int64" };
    let list = array
        .call_method1("astype", (dtype,))?
        .call_method1("reshape", (-1,))?
        .call_method0("tolist")?;
    if unsigned {
        list.extract()
    } else {
        let signed: Vec<i64> = list.extract()?;
        signed.into_iter().map(from_end_of_many).collect()
    }
}

/// Refuses a bool where an index is asked for: Python's `True` is the int 1, and
/// `rb.get(True)` read row 1 (`numpy.bool_(True)` is a mask).
fn refuse_bool(x: &Bound<'_, PyAny>) -> PyResult<()> {
    if x.is_instance_of::<PyBool>() {
        return Err(type_error("an index is an int, not a bool"));
    }
    Ok(())
}

/// `x` as a numpy array, and its dtype's kind, which must be one of `kinds` (an
/// empty array's need not: `[]` reads as float64, and its kind is then ""); else a
/// `TypeError` saying `what` was expected.
fn array_of_kind<'py>(
    x: &Bound<'py, PyAny>,
    kinds: &str,
    what: &str,
) -> PyResult<(Bound<'py, PyAny>, String)> {
    let array = asarray(x, what)?;
    let kind = array
        .getattr("dtype")?
        .getattr("kind")?
        .extract::<String>()?;
    let known = kind.len() == 1 && kinds.contains(kind.as_str());
    if array.getattr("size")?.extract::<usize>()? == 0 {
        // An empty mask is still a mask (of one boolean a stored row).
        return Ok((array, if known { kind } else { String::new() }));
    }
    if !known {
        return Err(type_error(format!(
            "expected {what}, not an array of {}",
            array.getattr("dtype")?
        )));
    }
    Ok((array, kind))
}

/// Whether numpy lets the array be written.
fn writeable(array: &Bound<'_, PyUntypedArray>) -> bool {
    // SAFETY: `as_array_ptr` points at a live array object (we hold a reference).
    let flags = unsafe { (*array.as_array_ptr()).flags };
    flags & npyffi::NPY_ARRAY_WRITEABLE != 0
}
