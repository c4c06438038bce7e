//! Scanning one series' blocks over a time range.

use super::hours::{window_of, WINDOW_MS};
use super::keys::{self};
use super::{corrupt, Cf, StoreError, View};

/// Gets a block's hour and value; returns whether to go on.
pub(super) type BlockVisitor<'a> = dyn FnMut(i64, &[u8]) -> Result<bool, StoreError> + 'a;

/// Visits the blocks of one series in `cf` whose hour overlaps
/// `[start, end)`: keys from `prefix · start` on, stopping at the first
/// block whose hour begins at or after `end` (blocks never straddle an
/// hour, so no later key can hold an earlier sample). `f` gets the
/// block's hour and value and returns whether to go on.
pub(super) fn scan_series(
    view: &dyn View,
    cf: Cf,
    prefix: &[u8],
    start: i64,
    end: i64,
    f: &mut BlockVisitor<'_>,
) -> Result<(), StoreError> {
    let (from, mut to) = keys::scan_bounds(prefix, start);
    // Keys whose hour starts at or after `end` are past the range: the
    // scan is bounded at the first of them rather than stopped on it, so
    // a view's kept iterator knows where it stands for the next series.
    if let Some(past) = end
        .checked_add(WINDOW_MS - 1)
        .map(|e| e.div_euclid(WINDOW_MS) * WINDOW_MS)
    {
        to.truncate(prefix.len());
        keys::put_ts(&mut to, past);
    }
    let mut failure = None;
    view.scan(cf, &from, &to, &mut |k, v| {
        let Some(last) = keys::key_ts(k, prefix.len()) else {
            failure = Some(corrupt(cf, "key"));
            return false;
        };
        let w = window_of(last);
        if w >= end {
            return false;
        }
        match f(w, v) {
            Ok(more) => more,
            Err(e) => {
                failure = Some(e);
                false
            }
        }
    })?;
    failure.map_or(Ok(()), Err)
}
