//! Save and load hooks (TorchRL's `register_save_hook` / `register_load_hook`):
//! closures that see a checkpoint's rows on their way to disk and back.
//!
//! A save hook gets the rows of each chunk of slots as a [`Batch`] of the buffer's
//! spec (a frames buffer's rows as stored: one frame of each stack, without the
//! fields rebuilt from later rows), in storage order, and may change their values in place (quantise, scrub,
//! compress a field into fewer bytes); what it leaves is what the checkpoint stores.
//! A load hook gets the loaded rows the same way and undoes it. Hooks never change the
//! buffer that is being saved, only what is written. Hooks run in registration order.
//!
//! Layer: state.

use std::sync::Arc;

use crate::batch::Batch;
use crate::sync::Mutex;

/// What a hook returns: `Err` stops the dump or load, which then changes nothing.
pub type HookResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// A save or load hook.
pub(crate) type Hook = Arc<dyn Fn(&mut Batch) -> HookResult + Send + Sync>;

/// A buffer's hooks.
#[derive(Default)]
pub(crate) struct Hooks {
    save: Mutex<Vec<Hook>>,
    load: Mutex<Vec<Hook>>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("save", &self.save.lock().len())
            .field("load", &self.load.lock().len())
            .finish()
    }
}

impl Hooks {
    pub(crate) fn add_save(&self, hook: Hook) {
        self.save.lock().push(hook);
    }

    pub(crate) fn add_load(&self, hook: Hook) {
        self.load.lock().push(hook);
    }

    /// The save hooks, in order.
    pub(crate) fn save(&self) -> Vec<Hook> {
        self.save.lock().clone()
    }

    /// The load hooks, in order.
    pub(crate) fn load(&self) -> Vec<Hook> {
        self.load.lock().clone()
    }
}

/// Runs `hooks` over `batch` in order; the first error's message. A hook must leave
/// the batch's fields, in their order, and length as they were: its columns are
/// copied back by position.
pub(crate) fn run(hooks: &[Hook], batch: &mut Batch) -> Result<(), String> {
    let (spec, rows) = (batch.spec().clone(), batch.len());
    for hook in hooks {
        hook(batch).map_err(|e| e.to_string())?;
        if !Arc::ptr_eq(batch.spec(), &spec) && **batch.spec() != *spec || batch.len() != rows {
            return Err(format!(
                "a hook must change values only, but it left a batch of {} rows with \
                 other fields or length than the {rows} it was given",
                batch.len()
            ));
        }
    }
    Ok(())
}
