//! Prometheus's HTTP query API (as Prometheus 2.42 serves `/api/v1`) over
//! the [`Engine`], so Grafana's Prometheus data source reads flopwatch's
//! store directly.
//!
//! - Parameters as Prometheus reads them: from the URL, and for POST also
//!   from an `application/x-www-form-urlencoded` body (body first); times
//!   as float Unix seconds or RFC 3339, durations as float seconds or
//!   `1h30m`-style; the same checks, in the same order, with the same
//!   messages (`invalid parameter "step": ...`).
//! - Responses byte for byte as Prometheus writes them: `{"status":
//!   "success","data":...}`, sample values as strings formatted as Go's
//!   `strconv` does (`"2"`, `"0.1"`, `"1e-07"`, `"NaN"`, `"+Inf"`),
//!   timestamps as seconds with at most three decimals; errors as
//!   `{"status":"error","errorType":...,"error":...}` with Prometheus's
//!   status codes ([`QueryError::http_status`]; 503 for a timeout).
//! - Every request presents a bearer token, resolved as for `/metrics`
//!   ([`Collector::bearer_scope`]): a tenant's query token reads its tenant,
//!   a provider token every tenant, no token only the `anonymous_tenant`
//!   when one is set; otherwise 401.
//! - Every query is bounded before it runs and while it runs: its text's
//!   length and depth are checked before it is parsed (400 naming the
//!   limit, [`super::guard`]); it waits for one of its tenant's turns and
//!   runs on a query thread ([`super::admission`]; 429 when the tenant's
//!   queue is full); it stops at `max_samples` or `max_series` (422) and
//!   is canceled when the request's `timeout` passes (Prometheus's
//!   default, 2 minutes, and at most `[prometheus_api] timeout`; 503) or
//!   its client leaves. Each refusal is counted by tenant and limit.

use super::admission::{self, Admission, Refused};
use super::budget::{Budget, Cancel, WorkLimit};
#[cfg(test)]
use super::float::format_sample;
use super::float::{format_scalar, sample_into};
use super::guard::{self, ShapeLimit};
use super::{Engine, QueryError, RangeSeries, Value, MAX_POINTS};
use crate::auth::Scope;
use crate::series::Labels;
use crate::state::Collector;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::header::{CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Form, Router};
use flopwatch_transport::metrics_http::{bearer, serve_router, MetricsTls};
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// The Prometheus release whose API this answers as: what
/// `/api/v1/status/buildinfo` reports as `version`, so that clients which
/// gate features on it (Grafana) use the 2.42 requests.
pub const API_VERSION: &str = "2.42.0";

/// Prometheus's earliest and latest representable times, in ms: the
/// defaults of `start` and `end` on the series and label endpoints.
const MIN_TIME_MS: i64 = (i64::MIN / 1000 + 62_135_596_801) * 1000;
const MAX_TIME_MS: i64 = (i64::MAX / 1000 - 62_135_596_801) * 1000 + 999;
/// The same times as Prometheus's clients write them.
const MIN_TIME_TEXT: &str = "-292273086-05-16T16:47:06Z";
const MAX_TIME_TEXT: &str = "292277026596-12-04T15:30:07.999999999Z";

/// Serves the API for `collector` on `listener`, over TLS when given,
/// until `shutdown` resolves.
pub async fn serve(
    collector: Arc<Collector>,
    listener: TcpListener,
    tls: Option<MetricsTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, tls, router(collector), shutdown).await
}

/// [`serve`] with `engine` (one answering for a cluster, say).
pub async fn serve_engine(
    engine: Engine,
    listener: TcpListener,
    tls: Option<MetricsTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, tls, router_for(engine), shutdown).await
}

/// The API's routes (`/api/v1/...`); anything else is a `not_found` error.
pub fn router(collector: Arc<Collector>) -> Router {
    router_for(Engine::new(collector))
}

/// [`router`] with `engine`.
pub fn router_for(engine: Engine) -> Router {
    let collector = engine.collector().clone();
    let s = &collector.settings.prometheus_api;
    let api = Arc::new(Api {
        engine,
        admission: Admission::new(
            s.max_concurrent_queries as usize,
            s.max_queued_queries as usize,
            collector.stats.clone(),
        ),
        timeout: s.timeout,
        c: collector,
    });
    Router::new()
        .route("/api/v1/query", get(query).post(query))
        .route("/api/v1/query_range", get(query_range).post(query_range))
        .route("/api/v1/series", get(series).post(series))
        .route("/api/v1/labels", get(labels).post(labels))
        .route("/api/v1/label/{name}/values", get(label_values))
        .route("/api/v1/status/buildinfo", get(buildinfo))
        .route("/api/v1/metadata", get(metadata))
        .route("/api/v1/rules", get(rules))
        .fallback(not_found)
        .with_state(api)
}

struct Api {
    c: Arc<Collector>,
    engine: Engine,
    admission: Admission,
    /// A query's timeout when its request names none, and the most one
    /// may name.
    timeout: Duration,
}

type Shared = State<Arc<Api>>;

/// Why a request failed, beyond the engine's own errors.
#[derive(Debug)]
enum ApiError {
    Query(QueryError),
    /// No usable credentials: 401.
    Unauthorized,
    /// The query outran its `timeout`: 503.
    Timeout,
    /// The tenant's queue of queries is full: 429.
    Busy,
    /// No such endpoint: 404.
    NotFound(String),
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> Self {
        ApiError::Query(e)
    }
}

fn bad_data(msg: impl Into<String>) -> ApiError {
    ApiError::Query(QueryError::BadData(msg.into()))
}

/// Prometheus's `invalid parameter "name": why`.
fn invalid(param: &str, why: impl std::fmt::Display) -> ApiError {
    bad_data(format!("invalid parameter {param:?}: {why}"))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, kind, msg) = match self {
            ApiError::Query(e) => (e.http_status(), e.error_type(), e.to_string()),
            ApiError::Unauthorized => (
                401,
                "unauthorized",
                "missing or invalid credentials".to_string(),
            ),
            ApiError::Timeout => (
                503,
                "timeout",
                "query timed out in query execution".to_string(),
            ),
            ApiError::Busy => (
                429,
                "unavailable",
                "too many queries of this tenant running and waiting: max_concurrent_queries and max_queued_queries are reached".to_string(),
            ),
            ApiError::NotFound(m) => (404, "not_found", m),
        };
        let body = format!(
            "{{\"status\":\"error\",\"errorType\":{},\"error\":{}}}",
            json_str(kind),
            json_str(&msg)
        );
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, [(CONTENT_TYPE, "application/json")], body).into_response();
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(WWW_AUTHENTICATE, "Bearer".parse().expect("literal header"));
        }
        r
    }
}

/// `{"status":"success","data":DATA}` where `data` is JSON text.
fn success(data: String) -> Response {
    success_warned(data, &[])
}

/// [`success`] with Prometheus's `warnings` when there are any (a peer of
/// the cluster did not answer).
fn success_warned(data: String, warnings: &[String]) -> Response {
    let mut body = String::with_capacity(data.len() + 64);
    body.push_str(SUCCESS);
    body.push_str(&data);
    close_success(&mut body, warnings);
    json_response(body)
}

/// The start of a successful answer's body; its data follows.
const SUCCESS: &str = "{\"status\":\"success\",\"data\":";

/// Ends a body begun with [`SUCCESS`] and its data.
fn close_success(body: &mut String, warnings: &[String]) {
    if !warnings.is_empty() {
        body.push_str(",\"warnings\":");
        body.push_str(&strings_json(warnings));
    }
    body.push('}');
}

fn json_response(body: String) -> Response {
    ([(CONTENT_TYPE, "application/json")], body).into_response()
}

/// A request's parameters, as Go's `Request.Form`: the form body's
/// values (POST) before the URL's, repeated names kept.
struct Params(Vec<(String, String)>);

impl Params {
    /// The first value of `name`, or `""` (Go's `FormValue`).
    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// Every value of `name`, in order.
    fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// A request's credential: its scope, and its bearer token (which the
/// cluster's peers are shown).
struct Caller {
    scope: Scope,
    token: Option<String>,
}

/// Authenticates `req` and reads its parameters.
async fn begin(api: &Api, req: Request) -> Result<(Caller, Params), ApiError> {
    let token = bearer(req.headers());
    let scope = api
        .c
        .bearer_scope(token.as_deref(), "prometheus_api")
        .map_err(|_| ApiError::Unauthorized)?;
    let caller = Caller { scope, token };
    let Query(mut url): Query<Vec<(String, String)>> = Query::try_from_uri(req.uri())
        .map_err(|e| bad_data(format!("error parsing form values: {e}")))?;
    let form_body = req.method() == Method::POST
        && req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !form_body {
        return Ok((caller, Params(url)));
    }
    let Form(mut body) = <Form<Vec<(String, String)>> as FromRequest<()>>::from_request(req, &())
        .await
        .map_err(|e| bad_data(format!("error parsing form values: {}", e.body_text())))?;
    body.append(&mut url);
    Ok((caller, Params(body)))
}

/// The tenant a scope's queries count against: `*` for a provider's.
fn tenant_of(scope: &Scope) -> &str {
    match scope {
        Scope::Tenant(t) => t,
        Scope::All => "*",
    }
}

/// The label of a limit on `/metrics`.
fn shape_limit_name(l: ShapeLimit) -> &'static str {
    match l {
        ShapeLimit::Bytes => "max_query_bytes",
        ShapeLimit::Depth => "max_query_depth",
    }
}

/// Checks the shape of each of `queries` before anything is parsed.
fn check_shapes(api: &Api, scope: &Scope, queries: &[&str]) -> Result<(), ApiError> {
    for q in queries {
        if let Err((limit, e)) = guard::check(q, api.engine.limits()) {
            api.c
                .stats
                .query_limited(tenant_of(scope), shape_limit_name(limit));
            return Err(e.into());
        }
    }
    Ok(())
}

/// An answer and what it warns of.
struct Answer<T> {
    value: T,
    warnings: Vec<String>,
}

/// Runs `f` within one of the scope's tenant's turns on a query thread,
/// with a budget of the engine's limits, canceled after `timeout`.
async fn run<T: Send + 'static>(
    api: &Api,
    scope: &Scope,
    timeout: Duration,
    f: impl FnOnce(&Engine, &Budget) -> Result<T, QueryError> + Send + 'static,
) -> Result<Answer<T>, ApiError> {
    let tenant = tenant_of(scope).to_string();
    let stats = &api.c.stats;
    let refused = |r: Refused| -> ApiError {
        match r {
            Refused::Busy => {
                stats.query_limited(&tenant, "max_concurrent_queries");
                ApiError::Busy
            }
            Refused::Timeout => {
                stats.query_limited(&tenant, "timeout");
                ApiError::Timeout
            }
            Refused::NoThread(e) => QueryError::Internal(format!("query not run: {e}")).into(),
        }
    };
    // The time waited for a turn counts against the timeout.
    let waited = tokio::time::Instant::now();
    let turn = api
        .admission
        .turn(&tenant, timeout)
        .await
        .map_err(refused)?;
    let left = timeout.saturating_sub(waited.elapsed());
    let engine = api.engine.clone();
    let cancel = Cancel::default();
    let budget = engine.budget(cancel.clone());
    let (out, hit, warnings) = admission::run(turn, left, cancel, move || {
        let out = f(&engine, &budget);
        (out, budget.hit(), budget.warnings())
    })
    .await
    .map_err(refused)?;
    match hit {
        Some(WorkLimit::Samples) => stats.query_limited(&tenant, "max_samples"),
        Some(WorkLimit::Series) => stats.query_limited(&tenant, "max_series"),
        Some(WorkLimit::Canceled) | None => {}
    }
    Ok(Answer {
        value: out?,
        warnings,
    })
}

/// The `timeout` parameter (at most the configured one), or the
/// configured one.
fn timeout_param(api: &Api, p: &Params) -> Result<Duration, ApiError> {
    match p.get("timeout") {
        "" => Ok(api.timeout),
        s => {
            let ns = parse_duration_ns(s).map_err(|e| invalid("timeout", e))?;
            Ok(Duration::from_nanos(ns.max(0) as u64).min(api.timeout))
        }
    }
}

/// A malformed query names the parameter, as Prometheus's errors do.
fn query_param(e: ApiError) -> ApiError {
    match e {
        ApiError::Query(QueryError::BadData(m)) => invalid("query", m),
        e => e,
    }
}

/// An optional time parameter (Prometheus's `parseTimeParam`).
fn time_param(p: &Params, name: &str, default_ms: i64) -> Result<i64, ApiError> {
    match p.get(name) {
        "" => Ok(default_ms),
        s => parse_time(s)
            .map_err(|e| invalid(name, format!("Invalid time value for '{name}': {e}"))),
    }
}

async fn query(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    let (caller, p) = begin(&api, req).await?;
    let time_ms = time_param(&p, "time", api.c.clock.now_ms())?;
    let timeout = timeout_param(&api, &p)?;
    let q = p.get("query").to_string();
    check_shapes(&api, &caller.scope, &[&q]).map_err(query_param)?;
    let Caller { scope, token } = caller;
    let s = scope.clone();
    // The answer is written on the query's thread too, not the runtime's.
    let v = run(&api, &scope, timeout, move |e, b| {
        let v = e.instant_within(&s, token.as_deref(), &q, time_ms, b)?;
        Ok(query_body(&v, &b.warnings()))
    })
    .await
    .map_err(query_param)?;
    Ok(json_response(v.value))
}

async fn query_range(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    let (caller, p) = begin(&api, req).await?;
    let start = parse_time(p.get("start")).map_err(|e| invalid("start", e))?;
    let end = parse_time(p.get("end")).map_err(|e| invalid("end", e))?;
    if end < start {
        return Err(invalid(
            "end",
            "end timestamp must not be before start time",
        ));
    }
    let step_ns = parse_duration_ns(p.get("step")).map_err(|e| invalid("step", e))?;
    if step_ns <= 0 {
        return Err(invalid(
            "step",
            "zero or negative query resolution step widths are not accepted. Try a positive integer",
        ));
    }
    let span_ns = (end as i128 - start as i128) * 1_000_000;
    if span_ns / step_ns as i128 > MAX_POINTS as i128 {
        return Err(bad_data(
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
        ));
    }
    let timeout = timeout_param(&api, &p)?;
    // The engine works in ms; a step below one is one.
    let step_ms = (step_ns / 1_000_000).max(1);
    let q = p.get("query").to_string();
    check_shapes(&api, &caller.scope, &[&q]).map_err(query_param)?;
    let Caller { scope, token } = caller;
    let s = scope.clone();
    // The answer is written on the query's thread too, not the runtime's.
    let v = run(&api, &scope, timeout, move |e, b| {
        let v = e.range_within(&s, token.as_deref(), &q, (start, end, step_ms), b)?;
        Ok(query_body(&v, &b.warnings()))
    })
    .await?;
    Ok(json_response(v.value))
}

/// The label sets of the series `match[]` selects in `[start, end]`:
/// the series, label and label-value endpoints' common part.
async fn series_of(
    api: &Api,
    caller: Caller,
    p: &Params,
    need_match: bool,
) -> Result<Answer<Vec<Labels>>, ApiError> {
    let matchers = p.all("match[]");
    if need_match && matchers.is_empty() {
        return Err(bad_data("no match[] parameter provided"));
    }
    let start = time_param(p, "start", MIN_TIME_MS)?;
    let end = time_param(p, "end", MAX_TIME_MS)?;
    let as_match = |e| match e {
        ApiError::Query(QueryError::BadData(m)) => invalid("match[]", m),
        e => e,
    };
    let texts: Vec<&str> = matchers.iter().map(String::as_str).collect();
    check_shapes(api, &caller.scope, &texts).map_err(as_match)?;
    let Caller { scope, token } = caller;
    let s = scope.clone();
    run(api, &scope, api.timeout, move |e, b| {
        e.series(&s, token.as_deref(), &matchers, (start, end), b)
    })
    .await
    .map_err(as_match)
}

async fn series(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    let (caller, p) = begin(&api, req).await?;
    let sets = series_of(&api, caller, &p, true).await?;
    let mut out = String::from("[");
    for (i, l) in sets.value.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        labels_json(&mut out, l);
    }
    out.push(']');
    Ok(success_warned(out, &sets.warnings))
}

async fn labels(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    let (caller, p) = begin(&api, req).await?;
    let sets = series_of(&api, caller, &p, false).await?;
    let mut names: Vec<String> = sets.value.into_iter().flatten().map(|(k, _)| k).collect();
    names.sort();
    names.dedup();
    Ok(success_warned(strings_json(&names), &sets.warnings))
}

async fn label_values(
    State(api): Shared,
    Path(name): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    let (caller, p) = begin(&api, req).await?;
    if !is_label_name(&name) {
        return Err(bad_data(format!("invalid label name: {name:?}")));
    }
    let sets = series_of(&api, caller, &p, false).await?;
    let mut values: Vec<String> = sets
        .value
        .into_iter()
        .flatten()
        .filter(|(k, _)| *k == name)
        .map(|(_, v)| v)
        .collect();
    values.sort();
    values.dedup();
    Ok(success_warned(strings_json(&values), &sets.warnings))
}

/// Prometheus 2.42's fields, without the `features` that newer
/// Prometheus-compatible stores (Mimir, Thanos) add: flopwatch answers as
/// a Prometheus. The flopwatch build is in `revision` and `branch`.
async fn buildinfo(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    begin(&api, req).await?;
    let flopwatch = format!("flopwatch-{}", env!("CARGO_PKG_VERSION"));
    Ok(success(format!(
        "{{\"version\":{},\"revision\":{},\"branch\":\"flopwatch\",\"buildUser\":\"flopwatch\",\"buildDate\":\"\",\"goVersion\":\"none\"}}",
        json_str(API_VERSION),
        json_str(&flopwatch),
    )))
}

/// No metric metadata is kept: an empty map.
async fn metadata(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    begin(&api, req).await?;
    Ok(success("{}".into()))
}

/// flopwatch evaluates no rules: no groups.
async fn rules(State(api): Shared, req: Request) -> Result<Response, ApiError> {
    begin(&api, req).await?;
    Ok(success("{\"groups\":[]}".into()))
}

/// Exemplars and every endpoint not listed in [`router`].
async fn not_found(req: Request) -> Response {
    let path = req.uri().path();
    let msg = if path.starts_with("/api/v1/query_exemplars") {
        "exemplars are not stored by flopwatch".to_string()
    } else {
        format!("{path} is not served by flopwatch's Prometheus API")
    };
    ApiError::NotFound(msg).into_response()
}

/// `{"resultType":...,"result":...}`.
fn query_body(v: &Value, warnings: &[String]) -> String {
    let mut out = String::from(SUCCESS);
    match v {
        Value::Scalar { t_ms, v } => {
            out.push_str("{\"resultType\":\"scalar\",\"result\":[");
            timestamp_json(&mut out, *t_ms);
            out.push(',');
            out.push_str(&json_str(&format_scalar(*v)));
            out.push_str("]}");
        }
        Value::String { t_ms, v } => {
            out.push_str("{\"resultType\":\"string\",\"result\":[");
            timestamp_json(&mut out, *t_ms);
            out.push(',');
            out.push_str(&json_str(v));
            out.push_str("]}");
        }
        Value::Vector(samples) => {
            out.push_str("{\"resultType\":\"vector\",\"result\":[");
            for (i, s) in samples.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str("{\"metric\":");
                labels_json(&mut out, &s.labels);
                out.push_str(",\"value\":");
                point_json(&mut out, s.t_ms, s.v);
                out.push('}');
            }
            out.push_str("]}");
        }
        Value::Matrix(series) => {
            // About 30 bytes a point: one allocation for most answers.
            let size = |s: &RangeSeries| 64 + 30 * s.points.len();
            out.reserve(series.iter().map(size).sum());
            out.push_str("{\"resultType\":\"matrix\",\"result\":[");
            let points: usize = series.iter().map(|s| s.points.len()).sum();
            let stamps = Stamps::of(series);
            if points >= PARALLEL_POINTS {
                // Large answers: each series written on one of the cores,
                // then joined in order. Each series is taken by the next
                // free thread: a thread that starts late (a millisecond
                // and more on a busy machine) takes fewer, instead of
                // leaving half the answer to wait for it.
                let write = |s: &RangeSeries| {
                    let mut o = String::with_capacity(size(s));
                    range_series_json(&mut o, s, &stamps);
                    Ok::<_, std::convert::Infallible>(o)
                };
                let parts = crate::parallel::each_in_parallel(series.iter().collect(), &write);
                let texts = parts.into_iter().map(|p| match p {
                    Ok(p) => p,
                });
                for (i, text) in texts.enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&text);
                }
            } else {
                for (i, s) in series.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    range_series_json(&mut out, s, &stamps);
                }
            }
            out.push_str("]}");
        }
    }
    close_success(&mut out, warnings);
    out
}

/// Points of a matrix answer from which its series are written on every
/// core.
const PARALLEL_POINTS: usize = 1 << 15;

/// The timestamps of a matrix answer's longest series, written once:
/// a range query's series share its steps, so most points find theirs
/// here instead of formatting it again.
struct Stamps {
    times: Vec<i64>,
    /// `[t,"` of each time, one after another; `ends[i]`: where the
    /// `i`-th ends.
    text: String,
    ends: Vec<usize>,
}

impl Stamps {
    fn of(series: &[RangeSeries]) -> Self {
        let longest = series.iter().max_by_key(|s| s.points.len());
        let times: Vec<i64> =
            longest.map_or(Vec::new(), |s| s.points.iter().map(|p| p.0).collect());
        let mut text = String::with_capacity(16 * times.len());
        let mut ends = Vec::with_capacity(times.len());
        for &t in &times {
            point_start(&mut text, t);
            ends.push(text.len());
        }
        Self { times, text, ends }
    }

    /// `[t,"` of `t` appended to `out`, `at` the position in `times` the
    /// previous point of the series reached (points come in time order).
    fn put(&self, out: &mut String, t: i64, at: &mut usize) {
        while self.times.get(*at).is_some_and(|&x| x < t) {
            *at += 1;
        }
        if self.times.get(*at) == Some(&t) {
            let from = if *at == 0 { 0 } else { self.ends[*at - 1] };
            out.push_str(&self.text[from..self.ends[*at]]);
        } else {
            point_start(out, t);
        }
    }
}

/// One series of a matrix answer.
fn range_series_json(out: &mut String, s: &RangeSeries, stamps: &Stamps) {
    out.push_str("{\"metric\":");
    labels_json(out, &s.labels);
    if !s.points.is_empty() {
        out.push_str(",\"values\":[");
        let mut at = 0;
        for (j, &(t, v)) in s.points.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            stamps.put(out, t, &mut at);
            sample_into(out, v);
            out.push_str("\"]");
        }
        out.push(']');
    }
    out.push('}');
}

/// `[t,"v"]`, written in place: a number's text needs no escaping.
fn point_json(out: &mut String, t_ms: i64, v: f64) {
    point_start(out, t_ms);
    sample_into(out, v);
    out.push_str("\"]");
}

/// A point's `[t,"`, up to its value.
fn point_start(out: &mut String, t_ms: i64) {
    out.push('[');
    timestamp_json(out, t_ms);
    out.push_str(",\"");
}

/// A label set as a JSON object, keys sorted (Go marshals label maps so).
fn labels_json(out: &mut String, labels: &Labels) {
    let mut sorted: Vec<&(String, String)> = labels.iter().collect();
    sorted.sort();
    out.push('{');
    for (i, (k, v)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&json_str(k));
        out.push(':');
        out.push_str(&json_str(v));
    }
    out.push('}');
}

fn strings_json(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| json_str(s)).collect();
    format!("[{}]", items.join(","))
}

/// A JSON string as Go's `encoding/json` writes it: HTML-safe (`<`, `>`,
/// `&` escaped) and with U+2028 and U+2029 escaped.
fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A timestamp as Prometheus writes it: seconds, and the milliseconds as
/// up to three decimals (`1700000000.1` is written `1700000000.100`).
fn timestamp_json(out: &mut String, t_ms: i64) {
    let t = t_ms.unsigned_abs();
    if t_ms < 0 {
        out.push('-');
    }
    out.push_str(itoa::Buffer::new().format(t / 1000));
    let ms = t % 1000;
    if ms != 0 {
        out.push('.');
        if ms < 100 {
            out.push('0');
        }
        if ms < 10 {
            out.push('0');
        }
        out.push_str(itoa::Buffer::new().format(ms));
    }
}

/// Prometheus's label-name syntax (2.42: `[a-zA-Z_][a-zA-Z0-9_]*`).
fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// A time parameter in ms: float Unix seconds (rounded to the ms, as
/// Prometheus does) or RFC 3339.
fn parse_time(s: &str) -> Result<i64, String> {
    if let Some(t) = parse_go_float(s) {
        if t.is_finite() {
            let secs = t.trunc();
            let ms = ((t - secs) * 1000.0).round();
            return Ok((secs as i64).saturating_mul(1000).saturating_add(ms as i64));
        }
    }
    if let Some(ms) = parse_rfc3339(s) {
        return Ok(ms);
    }
    match s {
        MIN_TIME_TEXT => Ok(MIN_TIME_MS),
        MAX_TIME_TEXT => Ok(MAX_TIME_MS),
        _ => Err(format!("cannot parse {s:?} to a valid timestamp")),
    }
}

/// A number as Go's `strconv.ParseFloat` reads one (no `_` separators,
/// `Inf`/`NaN` in any case).
fn parse_go_float(s: &str) -> Option<f64> {
    if s.is_empty() || s.contains('_') {
        return None;
    }
    s.parse().ok()
}

/// RFC 3339 with optional fraction (`2023-11-14T22:13:20.5Z`,
/// `...+01:00`) in ms, the fraction truncated to the ms as Prometheus's
/// `timestamp.FromTime` does.
fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let num = |from: usize, to: usize| -> Option<i64> {
        let d = s.get(from..to)?;
        d.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| d.parse().ok())?
    };
    let (y, mo, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (h, mi, se) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    if !(1..=12).contains(&mo) || !(1..=days_in_month(y, mo)).contains(&d) {
        return None;
    }
    if h > 23 || mi > 59 || se > 59 {
        return None;
    }
    let mut rest = &s[19..];
    let mut ms = 0;
    if let Some(f) = rest.strip_prefix('.') {
        let digits = f.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 || digits > 9 {
            return None;
        }
        let frac = format!("{:0<3}", &f[..digits.min(3)]);
        ms = frac.parse::<i64>().ok()?;
        rest = &f[digits..];
    }
    let offset_s = match rest {
        "Z" => 0,
        _ => {
            let r = rest.as_bytes();
            if r.len() != 6 || r[3] != b':' || !(r[0] == b'+' || r[0] == b'-') {
                return None;
            }
            let oh: i64 = rest[1..3].parse().ok()?;
            let om: i64 = rest[4..6].parse().ok()?;
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if r[0] == b'-' {
                -o
            } else {
                o
            }
        }
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    Some(secs * 1000 + ms)
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// A duration parameter in ns: float seconds, or Prometheus's duration
/// syntax (`1h30m`, `15s`, `500ms`; units y, w, d, h, m, s, ms, each at
/// most once, largest first).
fn parse_duration_ns(s: &str) -> Result<i64, String> {
    if let Some(d) = parse_go_float(s) {
        let ns = d * 1e9;
        if ns.is_nan() {
            return Err(format!("cannot parse {s:?} to a valid duration"));
        }
        if ns > i64::MAX as f64 || ns < i64::MIN as f64 {
            return Err(format!(
                "cannot parse {s:?} to a valid duration. It overflows int64"
            ));
        }
        return Ok(ns as i64);
    }
    parse_prom_duration(s).ok_or_else(|| format!("cannot parse {s:?} to a valid duration"))
}

/// Prometheus's `model.ParseDuration`, in ns.
fn parse_prom_duration(s: &str) -> Option<i64> {
    const UNITS: [(&str, i64); 7] = [
        ("y", 365 * 86_400_000),
        ("w", 7 * 86_400_000),
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
        ("ms", 1),
    ];
    if s == "0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut rest = s;
    let mut next_unit = 0;
    let mut ms: i64 = 0;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        // "ms" before "m": the longer unit where both fit.
        let (i, (unit, scale)) = UNITS
            .iter()
            .enumerate()
            .skip(next_unit)
            .filter(|(_, (u, _))| rest.starts_with(u))
            .max_by_key(|(_, (u, _))| u.len())?;
        rest = &rest[unit.len()..];
        next_unit = i + 1;
        ms = ms.checked_add(n.checked_mul(*scale)?)?;
    }
    ms.checked_mul(1_000_000)
}

#[cfg(test)]
mod limit_tests;
#[cfg(test)]
mod tests;
