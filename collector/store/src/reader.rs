//! Reads of many series under one view: a fleet-wide query's reading
//! thread takes one snapshot for a group of series and lets the engine
//! keep its iterators from one series to the next, instead of a snapshot
//! and fresh iterators per series.

use super::model::Store;
use super::{StoreError, View};

/// A view of the store that several reads share ([`Store::reading`]).
/// The store's reads that take one (`Store::ofu_in`, `Store::ofu_lasts_in`,
/// `Store::series_in`) run under its view.
pub struct Reader<'a> {
    pub(super) view: &'a dyn View,
}

impl Store {
    /// `f` with a [`Reader`]: every read through it sees one snapshot.
    pub fn reading<R>(&self, f: impl FnOnce(&Reader<'_>) -> R) -> Result<R, StoreError> {
        let mut f = Some(f);
        let mut out = None;
        self.engine.view(&mut |view| {
            if let Some(f) = f.take() {
                out = Some(f(&Reader { view }));
            }
            Ok(())
        })?;
        out.ok_or_else(|| StoreError::Engine("the engine gave no view".into()))
    }

    /// `f` under `at`, or under a view of its own.
    pub(super) fn in_view(
        &self,
        at: Option<&dyn View>,
        f: &mut dyn FnMut(&dyn View) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        match at {
            Some(view) => f(view),
            None => self.engine.view(f),
        }
    }
}
