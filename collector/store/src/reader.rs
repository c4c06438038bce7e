//! Reads of many series under one view: a fleet-wide query's reading
//! thread takes one snapshot for a group of series and lets the engine
//! keep its iterators from one series to the next, instead of a snapshot
//! and fresh iterators per series.

use super::gpu_block::BundleHours;
use super::model::Store;
use super::{Cf, StoreError, View};

/// A view of the store that several reads share ([`Store::reading`]).
/// The store's reads that take one (`Store::ofu_in`, `Store::ofu_lasts_in`,
/// `Store::series_in`) run under its view.
pub struct Reader<'a> {
    pub(super) view: &'a dyn View,
    /// The head's hours, taken before the view.
    pub(super) head: BundleHours,
}

impl Store {
    /// `f` with a [`Reader`]: every read through it sees one snapshot.
    pub fn reading<R>(&self, f: impl FnOnce(&Reader<'_>) -> R) -> Result<R, StoreError> {
        let mut f = Some(f);
        let mut out = None;
        // Before the view: an hour forgotten meanwhile holds nothing the
        // view sees (`head_hours`).
        let head = self.bundle_hours(Cf::Head);
        self.engine.view(&mut |view| {
            if let Some(f) = f.take() {
                out = Some(f(&Reader {
                    view,
                    head: head.clone(),
                }));
            }
            Ok(())
        })?;
        out.ok_or_else(|| StoreError::Engine("the engine gave no view".into()))
    }

    /// `f` under `at`'s view and with its head hours, or under a view of
    /// its own and the head's hours taken before it.
    pub(super) fn in_view(
        &self,
        at: Option<&Reader<'_>>,
        f: &mut dyn FnMut(&dyn View, &BundleHours) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        match at {
            Some(r) => f(r.view, &r.head),
            None => {
                let head = self.bundle_hours(Cf::Head);
                self.engine.view(&mut |view| f(view, &head))
            }
        }
    }
}
