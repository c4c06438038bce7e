//! Prometheus-compatible queries over flopwatch's own store: the engine
//! behind the collector's `/api/v1/*` HTTP endpoints, so Grafana's
//! Prometheus data source reads the stored samples and rollups directly.
//!
//! - [`Engine`] answers instant and range queries (a PromQL subset parsed
//!   with `promql-parser`, evaluated here) and the series, label-name and
//!   label-value lookups, for one [`Scope`] (a tenant, or every tenant).
//! - the HTTP layer (`http`) maps requests and responses to Prometheus's
//!   JSON API and errors to its `errorType`s and status codes.
//!
//! Times are Unix milliseconds throughout.

mod http;

pub use http::{router, serve, API_VERSION};

use crate::auth::Scope;
use crate::series::Labels;
use crate::state::Collector;
use std::sync::Arc;

mod eval;
mod functions;
mod model;
mod query;
#[cfg(test)]
mod tests;

/// The result of a query, as Prometheus types it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number at a time (`resultType: "scalar"`).
    Scalar { t_ms: i64, v: f64 },
    /// One sample per series at one time (`"vector"`).
    Vector(Vec<Sample>),
    /// Points per series over a range (`"matrix"`).
    Matrix(Vec<RangeSeries>),
}

/// One series' sample in an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Labels, `__name__` included where the series keeps its name, sorted
    /// by label name.
    pub labels: Labels,
    pub t_ms: i64,
    pub v: f64,
}

/// One series' points in a range result, in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct RangeSeries {
    /// Labels, sorted by label name.
    pub labels: Labels,
    pub points: Vec<(i64, f64)>,
}

/// Why a query failed, as Prometheus's API reports it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    /// A malformed query or parameter: HTTP 400, `errorType: "bad_data"`.
    #[error("{0}")]
    BadData(String),
    /// Valid PromQL this engine does not evaluate, naming the part:
    /// HTTP 422, `errorType: "execution"`.
    #[error("{0}")]
    Unsupported(String),
    /// The store failed: HTTP 500, `errorType: "internal"`.
    #[error("{0}")]
    Internal(String),
}

impl QueryError {
    /// Prometheus's `errorType`.
    pub fn error_type(&self) -> &'static str {
        match self {
            QueryError::BadData(_) => "bad_data",
            QueryError::Unsupported(_) => "execution",
            QueryError::Internal(_) => "internal",
        }
    }

    /// The HTTP status Prometheus answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            QueryError::BadData(_) => 400,
            QueryError::Unsupported(_) => 422,
            QueryError::Internal(_) => 500,
        }
    }
}

/// Most points a range query may return per series (Prometheus's limit).
pub const MAX_POINTS: i64 = 11_000;
/// How far back an instant selector looks for a sample (Prometheus's
/// default lookback delta).
pub const LOOKBACK_MS: i64 = 300_000;

/// Evaluates queries against one collector's store. Calls read RocksDB and
/// block: the HTTP layer runs them on a blocking thread.
#[derive(Clone)]
pub struct Engine {
    c: Arc<Collector>,
}

impl Engine {
    /// Queries `collector`'s store.
    pub fn new(c: Arc<Collector>) -> Self {
        Self { c }
    }

    /// `query` evaluated at `time_ms` (`/api/v1/query`).
    pub fn instant(&self, scope: &Scope, query: &str, time_ms: i64) -> Result<Value, QueryError> {
        query::instant(&self.c.store, scope, query, time_ms)
    }

    /// `query` evaluated at `start_ms`, `start_ms + step_ms`, … ≤ `end_ms`
    /// (`/api/v1/query_range`); always a matrix.
    pub fn range(
        &self,
        scope: &Scope,
        query: &str,
        start_ms: i64,
        end_ms: i64,
        step_ms: i64,
    ) -> Result<Value, QueryError> {
        query::range(&self.c.store, scope, query, start_ms, end_ms, step_ms)
    }

    /// Label sets of the series matching any of `matchers` (each a series
    /// selector such as `flopwatch_ofu_ratio{job_id="a"}`) with samples in
    /// `[start_ms, end_ms]` (`/api/v1/series`).
    pub fn series(
        &self,
        scope: &Scope,
        matchers: &[String],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<Labels>, QueryError> {
        query::series(&self.c.store, scope, matchers, start_ms, end_ms)
    }

    /// Label names of those series (all series when `matchers` is empty),
    /// sorted (`/api/v1/labels`).
    pub fn label_names(
        &self,
        scope: &Scope,
        matchers: &[String],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<String>, QueryError> {
        let mut names: Vec<String> =
            query::series(&self.c.store, scope, matchers, start_ms, end_ms)?
                .into_iter()
                .flatten()
                .map(|(k, _)| k)
                .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Values of label `name` on those series, sorted
    /// (`/api/v1/label/<name>/values`; `__name__` gives metric names).
    pub fn label_values(
        &self,
        scope: &Scope,
        name: &str,
        matchers: &[String],
        start_ms: i64,
        end_ms: i64,
    ) -> Result<Vec<String>, QueryError> {
        let mut values: Vec<String> =
            query::series(&self.c.store, scope, matchers, start_ms, end_ms)?
                .into_iter()
                .flatten()
                .filter(|(k, _)| k == name)
                .map(|(_, v)| v)
                .collect();
        values.sort();
        values.dedup();
        Ok(values)
    }
}
