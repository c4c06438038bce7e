//! The work one query may do: series selected and samples touched, each
//! against its limit, and a cancellation flag the evaluation checks as it
//! goes (set when the request's `timeout` passes or its client leaves).
//!
//! Prometheus bounds a query by `--query.max-samples` (samples held at
//! once) and `--query.timeout`. Here every stored point a query reads and
//! every point it computes counts once, whether or not it is still held:
//! an upper bound of what it holds, cheap to keep, and never lower.

use super::QueryError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Which work limit stopped a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkLimit {
    /// `max_samples`.
    Samples,
    /// `max_series`.
    Series,
    /// The request's `timeout`, or its client gone.
    Canceled,
}

/// Shared between a running evaluation and whoever may cancel it.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Asks the evaluation to stop at its next check.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether it was asked to.
    pub fn is_canceled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// One evaluation's counts and limits, shared by the threads that read
/// its series.
#[derive(Debug)]
pub struct Budget {
    max_samples: u64,
    max_series: u64,
    samples: AtomicU64,
    series: AtomicU64,
    cancel: Cancel,
    hit: Mutex<Option<WorkLimit>>,
    /// What the answer should warn of (peers that did not answer).
    warnings: Mutex<Vec<String>>,
}

impl Budget {
    /// A budget of `max_samples` and `max_series`, stopped by `cancel`.
    pub fn new(max_samples: u64, max_series: u64, cancel: Cancel) -> Self {
        Self {
            max_samples,
            max_series,
            samples: AtomicU64::new(0),
            series: AtomicU64::new(0),
            cancel,
            hit: Mutex::new(None),
            warnings: Mutex::default(),
        }
    }

    /// No limits and no cancellation (internal callers and tests).
    pub fn unlimited() -> Self {
        Self::new(u64::MAX, u64::MAX, Cancel::default())
    }

    fn stop(&self, why: WorkLimit) -> QueryError {
        if let Ok(mut h) = self.hit.lock() {
            *h = Some(why);
        }
        match why {
            WorkLimit::Samples => QueryError::Limit(format!(
                "query processing would load too many samples into memory in query execution (max_samples = {})",
                self.max_samples
            )),
            WorkLimit::Series => QueryError::Limit(format!(
                "query selects more than the {} series max_series allows",
                self.max_series
            )),
            WorkLimit::Canceled => QueryError::Canceled,
        }
    }

    /// Counts `n` samples read or computed; an error once past the limit
    /// or canceled.
    pub fn samples(&self, n: usize) -> Result<(), QueryError> {
        let n = n as u64;
        let total = self
            .samples
            .fetch_add(n, Ordering::Relaxed)
            .saturating_add(n);
        if total > self.max_samples {
            return Err(self.stop(WorkLimit::Samples));
        }
        self.check()
    }

    /// Counts `n` series selected; an error once past the limit.
    pub fn series(&self, n: usize) -> Result<(), QueryError> {
        let n = n as u64;
        let total = self
            .series
            .fetch_add(n, Ordering::Relaxed)
            .saturating_add(n);
        if total > self.max_series {
            return Err(self.stop(WorkLimit::Series));
        }
        self.check()
    }

    /// An error once the query was canceled.
    pub fn check(&self) -> Result<(), QueryError> {
        if self.cancel.is_canceled() {
            return Err(self.stop(WorkLimit::Canceled));
        }
        Ok(())
    }

    /// The limit that stopped the query, if one did.
    pub fn hit(&self) -> Option<WorkLimit> {
        self.hit.lock().ok().and_then(|h| *h)
    }

    /// Notes a warning for the answer (Prometheus's `warnings`).
    pub fn warn(&self, w: String) {
        if let Ok(mut v) = self.warnings.lock() {
            v.push(w);
        }
    }

    /// The warnings noted.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Samples counted so far.
    pub fn samples_counted(&self) -> u64 {
        self.samples.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_cancellation_stop_the_query() {
        let b = Budget::new(10, 2, Cancel::default());
        assert!(b.samples(10).is_ok());
        assert!(matches!(b.samples(1), Err(QueryError::Limit(_))));
        assert_eq!(b.hit(), Some(WorkLimit::Samples));
        let b = Budget::new(10, 2, Cancel::default());
        assert!(b.series(2).is_ok());
        assert!(b.series(1).is_err());
        assert_eq!(b.hit(), Some(WorkLimit::Series));
        let c = Cancel::default();
        let b = Budget::new(10, 2, c.clone());
        assert!(b.check().is_ok());
        c.cancel();
        assert_eq!(b.check(), Err(QueryError::Canceled));
        assert_eq!(b.hit(), Some(WorkLimit::Canceled));
    }
}
