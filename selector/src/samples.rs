//! Raw input: long-form rows, grouped into one series per (workload, metric).

use std::collections::HashMap;

use crate::SelectError;

/// One long-form sample, as in the CSV `workload,metric,timestamp_ms,value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Workload (job, benchmark, trace) the sample was recorded under.
    pub workload: String,
    /// Metric name.
    pub metric: String,
    /// Sample time, milliseconds (any epoch; only differences matter).
    pub timestamp_ms: i64,
    /// Sample value; must be finite.
    pub value: f64,
}

/// One metric's raw samples in one workload.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    pub ts: Vec<i64>,
    pub values: Vec<f64>,
    /// False once a sample arrived at or before the previous timestamp.
    sorted: bool,
}

impl Series {
    fn push(&mut self, ts: i64, value: f64) {
        if self.ts.is_empty() {
            self.sorted = true;
        } else if self.ts.last().is_some_and(|&last| ts <= last) {
            self.sorted = false;
        }
        self.ts.push(ts);
        self.values.push(value);
    }

    /// Sort by time; of samples sharing a timestamp the last one pushed wins.
    fn sort_dedup(&mut self) {
        if self.sorted || self.ts.is_empty() {
            return;
        }
        let mut order: Vec<usize> = (0..self.ts.len()).collect();
        order.sort_by_key(|&i| self.ts[i]); // stable: equal stamps keep push order
        let mut ts = Vec::with_capacity(order.len());
        let mut values = Vec::with_capacity(order.len());
        for i in order {
            if ts.last() == Some(&self.ts[i]) {
                *values.last_mut().expect("values parallel to ts") = self.values[i];
            } else {
                ts.push(self.ts[i]);
                values.push(self.values[i]);
            }
        }
        self.ts = ts;
        self.values = values;
        self.sorted = true;
    }

    /// A series "exists" in a workload when it has two distinct timestamps:
    /// one sample carries neither a sampling step nor a variance.
    pub(crate) fn is_present(&self) -> bool {
        self.ts.len() >= 2
    }
}

#[derive(Debug, Clone)]
pub(crate) struct WorkloadSamples {
    pub name: String,
    /// Indexed by metric id; an empty series means "not recorded here".
    pub series: Vec<Series>,
}

/// All samples, grouped by workload and metric. Built row by row with
/// [`SampleSet::push`] (the CSV reader and [`crate::select`] do this), so
/// callers that already have rows in memory or in a store can feed it
/// without going through files.
#[derive(Debug, Clone, Default)]
pub struct SampleSet {
    pub(crate) workloads: Vec<WorkloadSamples>,
    workload_ids: HashMap<String, usize>,
    pub(crate) metrics: Vec<String>,
    metric_ids: HashMap<String, usize>,
    /// Cache of the last (workload, metric) looked up: long-form input is
    /// usually grouped by series, so most rows skip both hash lookups.
    last: Option<(usize, usize)>,
    rows: u64,
}

impl SampleSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of rows pushed so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Number of distinct workloads.
    pub fn workload_count(&self) -> usize {
        self.workloads.len()
    }

    /// Number of distinct metrics.
    pub fn metric_count(&self) -> usize {
        self.metrics.len()
    }

    /// Every stored sample as `(workload, metric, timestamp_ms, value)`,
    /// series by series.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str, i64, f64)> + '_ {
        self.workloads.iter().flat_map(move |w| {
            w.series.iter().enumerate().flat_map(move |(m, s)| {
                s.ts.iter()
                    .zip(&s.values)
                    .map(move |(&t, &v)| (w.name.as_str(), self.metrics[m].as_str(), t, v))
            })
        })
    }

    /// Add one sample. Rejects empty names and non-finite values.
    pub fn push(
        &mut self,
        workload: &str,
        metric: &str,
        timestamp_ms: i64,
        value: f64,
    ) -> Result<(), SelectError> {
        if let Some(reason) = check_sample(workload, metric, value) {
            return Err(SelectError::InvalidRow {
                workload: workload.to_owned(),
                metric: metric.to_owned(),
                timestamp_ms,
                reason: reason.to_owned(),
            });
        }
        self.push_unchecked(workload, metric, timestamp_ms, value);
        Ok(())
    }

    /// Add a sample already validated with [`check_sample`].
    pub(crate) fn push_unchecked(
        &mut self,
        workload: &str,
        metric: &str,
        timestamp_ms: i64,
        value: f64,
    ) {
        let (w, m) = match self.last {
            Some((w, m)) if self.workloads[w].name == workload && self.metrics[m] == metric => {
                (w, m)
            }
            _ => (self.workload_id(workload), self.metric_id(metric)),
        };
        self.last = Some((w, m));
        let series = &mut self.workloads[w].series;
        if series.len() <= m {
            series.resize_with(m + 1, Series::default);
        }
        series[m].push(timestamp_ms, value);
        self.rows += 1;
    }

    fn workload_id(&mut self, name: &str) -> usize {
        if let Some(&id) = self.workload_ids.get(name) {
            return id;
        }
        let id = self.workloads.len();
        self.workloads.push(WorkloadSamples {
            name: name.to_owned(),
            series: Vec::new(),
        });
        self.workload_ids.insert(name.to_owned(), id);
        id
    }

    fn metric_id(&mut self, name: &str) -> usize {
        if let Some(&id) = self.metric_ids.get(name) {
            return id;
        }
        let id = self.metrics.len();
        self.metrics.push(name.to_owned());
        self.metric_ids.insert(name.to_owned(), id);
        id
    }

    /// Sort every series by time and drop duplicate timestamps (last wins).
    /// Cheap when the input was already in order.
    pub(crate) fn sort(&mut self) {
        for w in &mut self.workloads {
            for s in &mut w.series {
                s.sort_dedup();
            }
        }
    }

    /// The series of metric `m` in workload `w`, if recorded there.
    pub(crate) fn series(&self, w: usize, m: usize) -> Option<&Series> {
        self.workloads[w].series.get(m).filter(|s| !s.ts.is_empty())
    }
}

/// Why a sample is invalid, if it is.
pub(crate) fn check_sample(workload: &str, metric: &str, value: f64) -> Option<&'static str> {
    if workload.is_empty() {
        Some("empty workload name")
    } else if metric.is_empty() {
        Some("empty metric name")
    } else if value.is_nan() {
        Some("value is NaN")
    } else if !value.is_finite() {
        Some("value is infinite")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_and_last_duplicate_wins() {
        let mut set = SampleSet::new();
        for (t, v) in [(30, 3.0), (10, 1.0), (20, 2.0), (10, 9.0)] {
            set.push("w", "m", t, v).unwrap();
        }
        set.sort();
        let s = set.series(0, 0).unwrap();
        assert_eq!(s.ts, vec![10, 20, 30]);
        assert_eq!(s.values, vec![9.0, 2.0, 3.0]);
    }

    #[test]
    fn rejects_nan_and_empty_names() {
        let mut set = SampleSet::new();
        assert!(set.push("w", "m", 0, f64::NAN).is_err());
        assert!(set.push("w", "m", 0, f64::INFINITY).is_err());
        assert!(set.push("", "m", 0, 1.0).is_err());
        assert!(set.push("w", "", 0, 1.0).is_err());
        assert_eq!(set.rows(), 0);
    }

    #[test]
    fn interleaved_series_are_kept_apart() {
        let mut set = SampleSet::new();
        set.push("w1", "a", 0, 1.0).unwrap();
        set.push("w2", "a", 0, 2.0).unwrap();
        set.push("w1", "b", 0, 3.0).unwrap();
        set.push("w1", "a", 1, 4.0).unwrap();
        assert_eq!(set.workload_count(), 2);
        assert_eq!(set.metric_count(), 2);
        assert_eq!(set.series(0, 0).unwrap().values, vec![1.0, 4.0]);
        assert_eq!(set.series(1, 0).unwrap().values, vec![2.0]);
        assert!(set.series(1, 1).is_none());
    }
}
