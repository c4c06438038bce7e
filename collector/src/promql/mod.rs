//! Prometheus-compatible queries over flopwatch's own store: the engine
//! behind the collector's `/api/v1/*` HTTP endpoints, so Grafana's
//! Prometheus data source reads the stored samples and rollups directly.
//!
//! - [`Engine`] answers instant and range queries (a PromQL subset parsed
//!   with `promql-parser`, evaluated here) and the series, label-name and
//!   label-value lookups, for one [`Scope`] (a tenant, or every tenant).
//! - the HTTP layer (`http`) maps requests and responses to Prometheus's
//!   JSON API and errors to its `errorType`s and status codes.
//! - every query is bounded: its shape before it is parsed
//!   ([`guard`]), its work while it runs ([`budget`]), and where and how
//!   many of a tenant's queries run at once ([`admission`]).
//!
//! Times are Unix milliseconds throughout.

pub mod admission;
pub mod budget;
pub mod guard;
mod http;

pub use budget::{Budget, Cancel};
pub use guard::QueryLimits;
pub use http::{router, router_for, serve, serve_engine, API_VERSION};

use crate::auth::Scope;
use crate::series::Labels;
use crate::state::Collector;
use std::sync::Arc;

mod derived;
mod eval;
mod float;
mod functions;
mod minute_steps;
mod model;
pub mod peers;
mod points;
mod query;
mod select;
mod syntax;
#[cfg(test)]
mod tests;

/// A series a peer's `Query/Select` answers with: labels, and points with
/// the last instant each is current.
pub type SelectedSeries = (Labels, Vec<(i64, f64, i64)>);

/// The result of a query, as Prometheus types it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A number at a time (`resultType: "scalar"`).
    Scalar { t_ms: i64, v: f64 },
    /// One sample per series at one time (`"vector"`).
    Vector(Vec<Sample>),
    /// Points per series over a range (`"matrix"`).
    Matrix(Vec<RangeSeries>),
    /// A string literal at a time (`"string"`).
    String { t_ms: i64, v: String },
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
    /// The query would do more work than a limit allows (samples,
    /// series): HTTP 422, `errorType: "execution"`.
    #[error("{0}")]
    Limit(String),
    /// Prometheus's errors of evaluation (a match group not unique, two
    /// series with one label set): HTTP 422, `errorType: "execution"`.
    #[error("{0}")]
    Execution(String),
    /// The query was canceled (its `timeout` passed, or its client left):
    /// HTTP 503, `errorType: "canceled"`.
    #[error("query was canceled in query execution")]
    Canceled,
    /// The store failed: HTTP 500, `errorType: "internal"`.
    #[error("{0}")]
    Internal(String),
}

impl From<crate::store::StoreError> for QueryError {
    fn from(e: crate::store::StoreError) -> Self {
        QueryError::Internal(e.to_string())
    }
}

impl QueryError {
    /// Prometheus's `errorType`.
    pub fn error_type(&self) -> &'static str {
        match self {
            QueryError::BadData(_) => "bad_data",
            QueryError::Unsupported(_) | QueryError::Limit(_) | QueryError::Execution(_) => {
                "execution"
            }
            QueryError::Canceled => "canceled",
            QueryError::Internal(_) => "internal",
        }
    }

    /// The HTTP status Prometheus answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            QueryError::BadData(_) => 400,
            QueryError::Unsupported(_) | QueryError::Limit(_) | QueryError::Execution(_) => 422,
            QueryError::Canceled => 503,
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
/// block: the HTTP layer runs them on a query thread
/// ([`admission::run`]).
#[derive(Clone)]
pub struct Engine {
    c: Arc<Collector>,
    limits: QueryLimits,
    /// The cluster's other collectors, when `peers` are configured.
    peers: Option<Arc<peers::Peers>>,
}

impl Engine {
    /// Queries `collector`'s store, within the limits of its
    /// `[prometheus_api]` settings.
    pub fn new(c: Arc<Collector>) -> Self {
        let limits = QueryLimits::from_config(&c.settings.prometheus_api);
        Self {
            c,
            limits,
            peers: None,
        }
    }

    /// The same engine answering for the whole cluster: every query also
    /// reads `peers`' series ([`peers`]).
    pub fn with_peers(mut self, peers: Arc<peers::Peers>) -> Self {
        self.peers = Some(peers);
        self
    }

    /// The same engine within `limits`.
    pub fn with_limits(mut self, limits: QueryLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits queries run within.
    pub fn limits(&self) -> &QueryLimits {
        &self.limits
    }

    /// The collector it reads.
    pub fn collector(&self) -> &Arc<Collector> {
        &self.c
    }

    /// A budget of this engine's limits, stopped by `cancel`.
    pub fn budget(&self, cancel: Cancel) -> Budget {
        Budget::new(self.limits.max_samples, self.limits.max_series, cancel)
    }

    fn ctx<'a>(
        &'a self,
        scope: &'a Scope,
        budget: &'a Budget,
        token: Option<&'a str>,
    ) -> query::Ctx<'a> {
        query::Ctx {
            store: &self.c.store,
            scope,
            budget,
            limits: &self.limits,
            peers: self.peers.as_deref().map(|p| (p, token)),
            base_only: false,
            specs: Some(&self.c.specs),
        }
    }

    /// `query` evaluated at `time_ms` (`/api/v1/query`), within the
    /// engine's limits.
    pub fn instant(&self, scope: &Scope, query: &str, time_ms: i64) -> Result<Value, QueryError> {
        self.instant_within(scope, None, query, time_ms, &self.budget(Cancel::default()))
    }

    /// [`Engine::instant`] within `budget`, for a caller presenting
    /// `token` (which the cluster's peers are shown).
    pub fn instant_within(
        &self,
        scope: &Scope,
        token: Option<&str>,
        query: &str,
        time_ms: i64,
        budget: &Budget,
    ) -> Result<Value, QueryError> {
        query::instant(&self.ctx(scope, budget, token), query, time_ms)
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
        let budget = self.budget(Cancel::default());
        self.range_within(scope, None, query, (start_ms, end_ms, step_ms), &budget)
    }

    /// [`Engine::range`] within `budget`, for a caller presenting `token`.
    pub fn range_within(
        &self,
        scope: &Scope,
        token: Option<&str>,
        query: &str,
        (start_ms, end_ms, step_ms): (i64, i64, i64),
        budget: &Budget,
    ) -> Result<Value, QueryError> {
        query::range(
            &self.ctx(scope, budget, token),
            query,
            start_ms,
            end_ms,
            step_ms,
        )
    }

    /// Label sets of the series matching any of `matchers` (each a series
    /// selector such as `flopwatch_ofu_ratio{job_id="a"}`) with samples in
    /// `[start_ms, end_ms]` (`/api/v1/series`).
    pub fn series(
        &self,
        scope: &Scope,
        token: Option<&str>,
        matchers: &[String],
        (start_ms, end_ms): (i64, i64),
        budget: &Budget,
    ) -> Result<Vec<Labels>, QueryError> {
        query::series(&self.ctx(scope, budget, token), matchers, start_ms, end_ms)
    }

    /// The stored series of this collector alone that `selectors` pick,
    /// with their points in `[start_ms, end_ms]` (none with
    /// `labels_only`, which lists the series with a point there): a
    /// cluster peer's answer to `Query/Select`. No derived series.
    pub fn select_local(
        &self,
        scope: &Scope,
        selectors: &[String],
        (start_ms, end_ms): (i64, i64),
        labels_only: bool,
    ) -> Result<Vec<SelectedSeries>, QueryError> {
        let budget = self.budget(Cancel::default());
        let mut ctx = self.ctx(scope, &budget, None);
        ctx.peers = None;
        ctx.base_only = true;
        query::select_local(&ctx, selectors, start_ms, end_ms, labels_only)
    }
}
