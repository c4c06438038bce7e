//! Which raw series a GPU or node device has: the metric names under its
//! key prefix, found by seeking past each metric's blocks (one seek per
//! metric and family, never a scan of the samples).

use super::gpu_block;
use super::keys::{get_str, put_str};
use super::{Cf, Store, StoreError};
use std::collections::BTreeSet;

impl Store {
    /// Names of the raw metrics stored for the GPU or device `key` of
    /// `tenant` (sealed chunks, head and limbo blocks), sorted. Internal
    /// series (the shared time reference) are listed too: callers keep the
    /// names they know.
    pub fn raw_metrics(&self, tenant: &str, key: &str) -> Result<Vec<String>, StoreError> {
        let mut base = Vec::new();
        put_str(&mut base, tenant);
        put_str(&mut base, key);
        let mut out = BTreeSet::new();
        // Sealed chunks.
        {
            let cf = Cf::Raw;
            let prefix = base.clone();
            let mut to = prefix.clone();
            to.extend_from_slice(&[0xff; 300]);
            let mut from = prefix.clone();
            loop {
                let mut found = None;
                self.engine.scan(cf, &from, &to, &mut |k, _| {
                    let mut pos = prefix.len();
                    found = get_str(k, &mut pos).map(str::to_string);
                    false
                })?;
                let Some(metric) = found else { break };
                // Past every block of this metric: prefix · metric · 17×0xff.
                from = prefix.clone();
                put_str(&mut from, &metric);
                from.extend_from_slice(&[0xff; 17]);
                out.insert(metric);
            }
        }
        // The head's bundles, each naming the metrics it holds.
        let head = self.bundle_hours(Cf::Head);
        self.engine.view(&mut |view| {
            for cf in [Cf::Head, Cf::Limbo] {
                gpu_block::metrics(view, cf, head.of(cf), &base, &mut out)?;
            }
            Ok(())
        })?;
        Ok(out.into_iter().collect())
    }
}
