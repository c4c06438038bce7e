//! Reads of many series under one view: a fleet-wide query's reading
//! thread takes one snapshot for a group of series and lets the engine
//! keep its iterators from one series to the next, instead of a snapshot
//! and fresh iterators per series.

use super::model::Store;
use super::records::{LastsPiece, OfuSample};
use super::{StoreError, View};
use flopwatch_proto::model::Point;

/// A view of the store that several reads share ([`Store::reading`]).
pub struct Reader<'a> {
    store: &'a Store,
    view: &'a dyn View,
}

impl Store {
    /// `f` with a [`Reader`]: every read through it sees one snapshot.
    pub fn reading<R>(&self, f: impl FnOnce(&Reader<'_>) -> R) -> Result<R, StoreError> {
        let mut f = Some(f);
        let mut out = None;
        self.engine.view(&mut |view| {
            if let Some(f) = f.take() {
                out = Some(f(&Reader { store: self, view }));
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

impl Reader<'_> {
    /// [`Store::ofu`] under this reader's view.
    pub fn ofu(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        f: &mut dyn FnMut(OfuSample),
    ) -> Result<(), StoreError> {
        self.store
            .ofu_in(Some(self.view), tenant, gpu, start, end, job, f)
    }

    /// [`Store::ofu_lasts`] under this reader's view.
    pub fn ofu_lasts(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        f: &mut dyn FnMut(LastsPiece<'_>),
    ) -> Result<(), StoreError> {
        self.store
            .ofu_lasts_in(Some(self.view), tenant, gpu, start, end, f)
    }

    /// [`Store::series`] under this reader's view.
    pub fn series(
        &self,
        tenant: &str,
        gpu: &str,
        metric: &str,
        start: i64,
        end: i64,
        limit: usize,
    ) -> Result<Vec<Point>, StoreError> {
        self.store
            .series_in(Some(self.view), tenant, gpu, metric, start, end, limit)
    }
}
