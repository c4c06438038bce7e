//! The Query service: OFU per GPU / node / job / tenant, raw series, lists.
//! Every call authenticates; a tenant credential sees only its tenant.

use crate::auth::{Credentials, Scope};
use crate::ofu::Mean;
use crate::state::Collector;
use crate::store::{GpuRecord, OfuPiece};
use crate::CollectorError;
use flopwatch_proto::stats::quantile;
use flopwatch_proto::v1::{self, ofu_request};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Most buckets one OFU query may return.
pub(crate) const MAX_POINTS: i64 = 20_000;
/// Default range of a query without `start_ms`: the last 10 minutes.
pub(crate) const DEFAULT_RANGE_MS: i64 = 600_000;

/// The tonic service.
#[derive(Clone)]
pub(crate) struct QueryService {
    c: Arc<Collector>,
}

impl QueryService {
    /// Serves `collector`.
    pub(crate) fn new(c: Arc<Collector>) -> Self {
        Self { c }
    }

    /// As a tonic server.
    pub(crate) fn server(self) -> v1::query_server::QueryServer<Self> {
        v1::query_server::QueryServer::new(self)
    }

    fn scope<T>(&self, r: &Request<T>) -> Result<Scope, CollectorError> {
        self.c.auth().query(&Credentials::of(r)).map_err(|e| {
            self.c.stats.auth_failure("query", &e);
            e.into()
        })
    }

    fn range(&self, start: i64, end: i64) -> Result<(i64, i64), CollectorError> {
        let now = self.c.clock.now_ms();
        let end = if end <= 0 { now + 1 } else { end };
        let start = if start <= 0 {
            end - DEFAULT_RANGE_MS
        } else {
            start
        };
        if start >= end {
            return Err(CollectorError::Invalid(
                "start_ms must be before end_ms".into(),
            ));
        }
        // Expired data is never returned.
        Ok((start.max(now - self.c.settings.retention_ms), end))
    }
}

/// Per-GPU work item of an OFU query.
struct Target {
    tenant: String,
    gpu: GpuRecord,
    job: Option<String>,
}

/// The part of a sample's window `(ts − window, ts]` that lies at or after
/// `start`: what the sample weighs in a range that starts there. A sample
/// is stamped at the end of its window, so the first sample of a range
/// can cover time before it — with adaptive sampling a long window of a
/// workload that ended just before `start` (docs/GPU-VALIDATION.md: a
/// 2-s window of a 90 % phase, stamped 0.2 s into the next one). Its mean
/// counts for the time it covers inside the range only. A window-less
/// sample (0) stays as it is.
fn window_from(ts: i64, window_ms: u32, start: i64) -> u32 {
    let inside = u32::try_from((ts - start).max(0)).unwrap_or(u32::MAX);
    window_ms.min(inside.max(1))
}

/// Computes an OFU response for `targets` (sync: runs on a blocking thread).
fn compute(
    c: &Collector,
    targets: &[Target],
    start: i64,
    end: i64,
    step: i64,
) -> Result<v1::OfuResponse, CollectorError> {
    let mut total = Mean::default();
    let mut per_gpu = Vec::with_capacity(targets.len());
    let mut buckets: BTreeMap<i64, (Mean, BTreeSet<usize>)> = BTreeMap::new();
    let (mut peak, mut achieved) = (0.0, 0.0);
    // The scope's OFU per time bucket (eq. 11 over its GPUs), for the
    // percentiles over time: the step, or one minute without one.
    let time_step = if step > 0 { step } else { 60_000 };
    let mut over_time: BTreeMap<i64, Mean> = BTreeMap::new();
    for (i, t) in targets.iter().enumerate() {
        let mut m = Mean::default();
        // Capacity-weighted across GPUs (docs/MIG.md): 1 for a whole GPU,
        // a MIG instance's share of its card.
        let share = c.capacity_share(&t.gpu);
        // Sealed hours and minutes that fit one time bucket come from the
        // rollups (crate::store::Store::ofu_pieces), the rest as samples.
        c.store.ofu_pieces(
            &t.tenant,
            &t.gpu.uuid,
            start,
            end,
            t.job.as_deref(),
            Some(time_step),
            &mut |piece| {
                let (ts, part) = match piece {
                    OfuPiece::Sample(s) => {
                        let mut p = Mean::default();
                        let w = window_from(s.ts_ms, s.window_ms, start);
                        p.add(s.ofu, s.tensor_active, s.sm_clock_mhz, w);
                        (s.ts_ms, p)
                    }
                    OfuPiece::Agg { ts_ms, agg, .. } => (ts_ms, agg),
                };
                m.merge(&part);
                let part = part.scaled(share);
                over_time
                    .entry(start + (ts - start) / time_step * time_step)
                    .or_default()
                    .merge(&part);
                if step > 0 {
                    let b = start + (ts - start) / step * step;
                    let e = buckets.entry(b).or_default();
                    e.0.merge(&part);
                    e.1.insert(i);
                }
            },
        )?;
        if let Some(mean) = m.mean() {
            let p = c.peak_tflops(&t.gpu);
            peak += p;
            achieved += p * mean;
            per_gpu.push(mean);
        }
        total.merge(&m.scaled(share));
    }
    let gpus = per_gpu.len() as u32;
    let mut in_time: Vec<f64> = over_time.values().filter_map(Mean::mean).collect();
    let summary = v1::OfuSummary {
        p50_over_time: quantile(&mut in_time.clone(), 0.5).unwrap_or(0.0),
        p10_over_time: quantile(&mut in_time, 0.1).unwrap_or(0.0),
        mean: total.mean().unwrap_or(0.0),
        min: if total.count > 0 { total.min() } else { 0.0 },
        max: if total.count > 0 { total.max() } else { 0.0 },
        p50: quantile(&mut per_gpu.clone(), 0.5).unwrap_or(0.0),
        p10: quantile(&mut per_gpu, 0.1).unwrap_or(0.0),
        samples: total.count,
        gpus,
        peak_tflops: peak,
        achieved_tflops: achieved,
    };
    let points = buckets
        .into_iter()
        .map(|(ts, (m, g))| v1::OfuPoint {
            timestamp_ms: ts,
            ofu: m.mean().unwrap_or(0.0),
            tensor_active: m.tensor_active(),
            sm_clock_mhz: m.sm_clock_mhz(),
            gpus: g.len() as u32,
        })
        .collect();
    Ok(v1::OfuResponse {
        points,
        summary: Some(summary),
    })
}

impl QueryService {
    fn targets(&self, scope: &Scope, req: &v1::OfuRequest) -> Result<Vec<Target>, CollectorError> {
        let visible: Vec<(String, GpuRecord)> = self
            .c
            .all_gpus()
            .into_iter()
            .filter(|(t, _)| scope.allows(t))
            .collect();
        let plain = |v: Vec<(String, GpuRecord)>| {
            v.into_iter()
                .map(|(tenant, gpu)| Target {
                    tenant,
                    gpu,
                    job: None,
                })
                .collect::<Vec<_>>()
        };
        let targets = match &req.scope {
            Some(ofu_request::Scope::GpuUuid(u)) => {
                plain(visible.into_iter().filter(|(_, g)| &g.uuid == u).collect())
            }
            Some(ofu_request::Scope::NodeId(n)) => plain(
                visible
                    .into_iter()
                    .filter(|(_, g)| &g.node_id == n)
                    .collect(),
            ),
            Some(ofu_request::Scope::Tenant(t)) => {
                if !scope.allows(t) {
                    return Err(CollectorError::NotFound("no such tenant".into()));
                }
                plain(visible.into_iter().filter(|(vt, _)| vt == t).collect())
            }
            Some(ofu_request::Scope::JobId(j)) => {
                let tenant = match scope {
                    Scope::All => None,
                    Scope::Tenant(t) => Some(t.as_str()),
                };
                let keys: BTreeSet<(String, String)> = self
                    .c
                    .store
                    .jobs(tenant)?
                    .into_iter()
                    .filter(|(_, r)| &r.job_id == j)
                    .map(|(t, r)| (t, r.gpu_uuid))
                    .collect();
                // A GPU the job shared with others is read through the
                // job's share series: the GPU's record (model, peak,
                // capacity) under the series' key.
                let by_uuid: HashMap<(String, String), GpuRecord> = visible
                    .into_iter()
                    .map(|(t, g)| ((t, g.uuid.clone()), g))
                    .collect();
                keys.into_iter()
                    .filter_map(|(t, key)| {
                        let uuid = flopwatch_proto::model::shared_gpu(&key).unwrap_or(&key);
                        let mut gpu = by_uuid.get(&(t.clone(), uuid.to_string()))?.clone();
                        gpu.uuid = key;
                        Some(Target {
                            tenant: t,
                            gpu,
                            job: Some(j.clone()),
                        })
                    })
                    .collect()
            }
            Some(ofu_request::Scope::Fleet(_)) | None => plain(visible),
        };
        if targets.is_empty() && !matches!(req.scope, Some(ofu_request::Scope::Fleet(_)) | None) {
            return Err(CollectorError::NotFound("nothing matches the scope".into()));
        }
        Ok(targets)
    }
}

#[tonic::async_trait]
impl v1::query_server::Query for QueryService {
    async fn select(
        &self,
        request: Request<v1::SelectRequest>,
    ) -> Result<Response<v1::SelectResponse>, Status> {
        use crate::promql::QueryError;
        let scope = self.scope(&request)?;
        let r = request.into_inner();
        let engine = crate::promql::Engine::new(self.c.clone());
        let found = crate::promql::admission::on_query_thread(move || {
            engine.select_local(&scope, &r.selectors, (r.start_ms, r.end_ms), r.labels_only)
        })
        .await
        .map_err(|e| Status::unavailable(format!("{e:?}")))?
        .map_err(|e| match e {
            QueryError::BadData(m) => Status::invalid_argument(m),
            QueryError::Limit(m) | QueryError::Execution(m) => Status::resource_exhausted(m),
            QueryError::Unsupported(m) => Status::unimplemented(m),
            QueryError::Canceled => Status::cancelled("canceled"),
            QueryError::Internal(m) => Status::internal(m),
        })?;
        Ok(Response::new(v1::SelectResponse {
            series: found
                .into_iter()
                .map(|(labels, points)| v1::SelectedSeries {
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| v1::Label { name, value })
                        .collect(),
                    timestamps_ms: points.iter().map(|p| p.0).collect(),
                    values: points.iter().map(|p| p.1).collect(),
                    current_until_ms: points.iter().map(|p| p.2).collect(),
                })
                .collect(),
        }))
    }

    async fn ofu(
        &self,
        request: Request<v1::OfuRequest>,
    ) -> Result<Response<v1::OfuResponse>, Status> {
        let scope = self.scope(&request)?;
        let req = request.into_inner();
        let (start, end) = self.range(req.start_ms, req.end_ms)?;
        if req.step_ms < 0 || (req.step_ms > 0 && (end - start) / req.step_ms > MAX_POINTS) {
            return Err(CollectorError::Invalid(format!(
                "step_ms {} gives more than {MAX_POINTS} points over the range",
                req.step_ms
            ))
            .into());
        }
        let targets = self.targets(&scope, &req)?;
        let c = self.c.clone();
        let step = req.step_ms;
        let resp = tokio::task::spawn_blocking(move || compute(&c, &targets, start, end, step))
            .await
            .map_err(|e| Status::internal(e.to_string()))??;
        Ok(Response::new(resp))
    }

    async fn series(
        &self,
        request: Request<v1::SeriesRequest>,
    ) -> Result<Response<v1::SeriesResponse>, Status> {
        let scope = self.scope(&request)?;
        let req = request.into_inner();
        let (start, end) = self.range(req.start_ms, req.end_ms)?;
        let gpu_tenant = self
            .c
            .all_gpus()
            .into_iter()
            .find(|(t, g)| scope.allows(t) && g.uuid == req.gpu_uuid)
            .map(|(t, _)| t);
        // A node device's series (docs/COUNTERS.md) is keyed like a GPU's;
        // its node's record keeps it across restarts.
        let device_tenant = || -> Result<Option<String>, CollectorError> {
            if let Some(t) = self
                .c
                .live
                .device_tenants(&req.gpu_uuid)
                .into_iter()
                .find(|t| scope.allows(t))
            {
                return Ok(Some(t));
            }
            Ok(self
                .c
                .store
                .nodes(None)?
                .into_iter()
                .find(|(t, n)| scope.allows(t) && n.devices.iter().any(|d| d.id == req.gpu_uuid))
                .map(|(t, _)| t))
        };
        let tenant = match gpu_tenant {
            Some(t) => Some(t),
            None => device_tenant()?,
        };
        let Some(tenant) = tenant else {
            return Err(CollectorError::NotFound("no such GPU or device".into()).into());
        };
        let limit = if req.limit == 0 {
            100_000
        } else {
            req.limit.min(1_000_000)
        } as usize;
        let c = self.c.clone();
        let (gpu, metric) = (req.gpu_uuid.clone(), req.metric.clone());
        let points = tokio::task::spawn_blocking(move || {
            c.store.series(&tenant, &gpu, &metric, start, end, limit)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(CollectorError::from)?;
        let series = flopwatch_proto::model::SeriesBatch {
            gpu_uuid: req.gpu_uuid,
            metric: req.metric,
            points,
        };
        Ok(Response::new(v1::SeriesResponse {
            series: Some(series.into()),
        }))
    }

    async fn list_nodes(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::NodeList>, Status> {
        let scope = self.scope(&request)?;
        let since = request.into_inner().since_ms;
        let tenant = match &scope {
            Scope::All => None,
            Scope::Tenant(t) => Some(t.as_str()),
        };
        let nodes = self
            .c
            .store
            .nodes(tenant)
            .map_err(CollectorError::from)?
            .into_iter()
            .filter(|(_, n)| n.last_seen_ms >= since)
            .map(|(t, n)| v1::NodeEntry {
                node_id: n.node_id,
                hostname: n.hostname,
                tenant: t,
                gpus: n.gpus,
                last_seen_ms: n.last_seen_ms,
                boot_id: n.boot_id,
            })
            .collect();
        Ok(Response::new(v1::NodeList { nodes }))
    }

    async fn list_gpus(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::GpuList>, Status> {
        let scope = self.scope(&request)?;
        let since = request.into_inner().since_ms;
        let mut gpus: Vec<v1::GpuEntry> = self
            .c
            .all_gpus()
            .into_iter()
            .filter(|(t, g)| scope.allows(t) && g.last_seen_ms >= since)
            .map(|(t, g)| v1::GpuEntry {
                info: Some(g.info().into()),
                shares: g
                    .shares
                    .iter()
                    .map(|(job_id, share_ppm, split)| v1::JobShare {
                        job_id: job_id.clone(),
                        share_ppm: *share_ppm,
                        split: split.clone(),
                    })
                    .collect(),
                node_id: g.node_id,
                tenant: t,
                job_id: g.job_id.unwrap_or_default(),
                last_seen_ms: g.last_seen_ms,
            })
            .collect();
        gpus.sort_by(|a, b| {
            (&a.node_id, a.info.as_ref().map(|i| i.index))
                .cmp(&(&b.node_id, b.info.as_ref().map(|i| i.index)))
        });
        Ok(Response::new(v1::GpuList { gpus }))
    }

    async fn list_jobs(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::JobList>, Status> {
        let scope = self.scope(&request)?;
        let since = request.into_inner().since_ms;
        let tenant = match &scope {
            Scope::All => None,
            Scope::Tenant(t) => Some(t.as_str()),
        };
        let mut jobs: BTreeMap<(String, String), v1::JobEntry> = BTreeMap::new();
        for (t, r) in self.c.store.jobs(tenant).map_err(CollectorError::from)? {
            let e = jobs
                .entry((t.clone(), r.job_id.clone()))
                .or_insert_with(|| v1::JobEntry {
                    job_id: r.job_id.clone(),
                    tenant: t,
                    first_seen_ms: r.first_seen_ms,
                    last_seen_ms: r.last_seen_ms,
                    ..Default::default()
                });
            e.first_seen_ms = e.first_seen_ms.min(r.first_seen_ms);
            e.last_seen_ms = e.last_seen_ms.max(r.last_seen_ms);
            if !e.node_ids.contains(&r.node_id) {
                e.node_ids.push(r.node_id.clone());
            }
            // A shared GPU is listed as itself (the job's share series
            // is how it is read, not what it is).
            let uuid = flopwatch_proto::model::shared_gpu(&r.gpu_uuid)
                .map_or(r.gpu_uuid.clone(), str::to_string);
            if !e.gpu_uuids.contains(&uuid) {
                e.gpu_uuids.push(uuid);
            }
        }
        let jobs = jobs
            .into_values()
            .filter(|j| j.last_seen_ms >= since)
            .collect();
        Ok(Response::new(v1::JobList { jobs }))
    }

    async fn ledger(
        &self,
        request: Request<v1::LedgerRequest>,
    ) -> Result<Response<v1::LedgerResponse>, Status> {
        let scope = self.scope(&request)?;
        let req = request.into_inner();
        let (start, end) = self.range(req.start_ms, req.end_ms)?;
        // Another tenant's ledger is as absent as its data.
        let tenant = match (&scope, req.tenant.as_str()) {
            (_, t) if !t.is_empty() && !scope.allows(t) => {
                return Err(CollectorError::NotFound("no such tenant".into()).into())
            }
            (Scope::Tenant(t), _) => Some(t.clone()),
            (Scope::All, "") => None,
            (Scope::All, t) => Some(t.to_string()),
        };
        let job = (!req.job_id.is_empty()).then_some(req.job_id);
        let c = self.c.clone();
        let holdings = tokio::task::spawn_blocking(move || {
            let peak = |g: &GpuRecord| c.peak_tflops(g);
            crate::ledger::holdings(
                &c.store,
                &peak,
                tenant.as_deref(),
                job.as_deref(),
                start,
                end,
            )
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(CollectorError::from)?;
        let minute = crate::store::MINUTE_MS;
        Ok(Response::new(v1::LedgerResponse {
            entries: holdings.into_iter().map(Into::into).collect(),
            start_ms: start.div_euclid(minute) * minute,
            end_ms: (end + minute - 1).div_euclid(minute) * minute,
        }))
    }

    async fn list_events(
        &self,
        request: Request<v1::EventsRequest>,
    ) -> Result<Response<v1::EventList>, Status> {
        let scope = self.scope(&request)?;
        let r = request.into_inner();
        let end = if r.end_ms <= 0 {
            self.c.clock.now_ms() + 1
        } else {
            r.end_ms
        };
        let limit = if r.limit == 0 { 1000 } else { r.limit as usize };
        let tenants: BTreeSet<String> = match &scope {
            Scope::Tenant(t) => [t.clone()].into(),
            Scope::All => self
                .c
                .store
                .nodes(None)
                .map_err(CollectorError::from)?
                .into_iter()
                .map(|(t, _)| t)
                .collect(),
        };
        let mut events = Vec::new();
        for t in tenants {
            for e in self
                .c
                .store
                .events(&t, r.start_ms, end, usize::MAX)
                .map_err(CollectorError::from)?
            {
                if (!r.kind.is_empty() && e.kind != r.kind)
                    || (!r.job_id.is_empty() && e.job_id != r.job_id)
                {
                    continue;
                }
                events.push(v1::EventEntry {
                    kind: e.kind,
                    timestamp_ms: e.ts_ms,
                    tenant: t.clone(),
                    job_id: e.job_id,
                    gpu_uuid: e.gpu_uuid,
                    node_id: e.node_id,
                    value: e.value,
                    baseline: e.baseline,
                    detail: e.detail,
                });
            }
        }
        events.sort_by_key(|e| e.timestamp_ms);
        // The newest `limit`, oldest first.
        if events.len() > limit {
            events.drain(..events.len() - limit);
        }
        Ok(Response::new(v1::EventList { events }))
    }
}

#[cfg(test)]
mod tests {
    use super::window_from;

    #[test]
    fn a_window_counts_from_the_start_of_the_range() {
        // Wholly inside: unchanged.
        assert_eq!(window_from(10_000, 100, 5_000), 100);
        assert_eq!(window_from(10_000, 5_000, 5_000), 5_000);
        // Straddling the start: only the part after it.
        assert_eq!(window_from(5_200, 2_000, 5_000), 200);
        // Stamped at the start: its window lies before the range; the
        // least weight a sample has.
        assert_eq!(window_from(5_000, 2_000, 5_000), 1);
        // Window-less samples stay window-less.
        assert_eq!(window_from(5_200, 0, 5_000), 0);
    }
}
