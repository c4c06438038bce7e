//! Query fan-out across a collector cluster.
//!
//! Agents spread over the collectors (rendezvous hashing of node ids), and
//! a node's data can be split between collectors after a failover. With
//! `peers` configured, a collector answers every query by asking itself and
//! each peer (marked [`LOCAL`], so peers answer from their own data only)
//! and merging:
//!
//! * `Series`: points of all collectors, in time order, one per timestamp
//!   (a batch stored on two collectors shows once);
//! * `ListNodes`, `ListGpus`, `ListJobs`, `ListEvents`: the union, one entry
//!   per identity, the most recent `last_seen` winning;
//! * `Ofu`: summaries combined weighted by samples (mean; min and max
//!   exact; percentiles, GPU counts and peaks approximate when a scope's
//!   data are split between collectors); bucketed points merged by bucket,
//!   weighted by GPUs.
//!
//! A peer that does not answer within [`PEER_TIMEOUT`] is left out, and the
//! response carries the metadata `x-flopwatch-partial: N` (peers missing).

use crate::query::QueryService;
use flopwatch_proto::v1::{self, query_client::QueryClient, query_server::Query};
use flopwatch_transport::channel::TlsClient;
use std::collections::BTreeMap;
use std::time::Duration;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};
use tracing::warn;

pub(crate) use crate::peering::{peer_channels, LOCAL};
/// Response metadata: how many peers did not answer.
pub(crate) const PARTIAL: &str = "x-flopwatch-partial";
/// How long a peer gets to answer.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// The Query service of a clustered collector.
#[derive(Clone)]
pub(crate) struct FanoutQuery {
    local: QueryService,
    peers: Vec<(String, Channel)>,
}

impl FanoutQuery {
    /// Answers with `local` and the collectors at `peers` (query URLs).
    /// `tls` is used for `https://` peers.
    pub(crate) fn new(
        local: QueryService,
        peers: &[String],
        tls: &TlsClient,
    ) -> Result<Self, crate::CollectorError> {
        Ok(Self {
            local,
            peers: peer_channels(peers, tls)?,
        })
    }

    /// As a tonic server.
    pub(crate) fn server(self) -> v1::query_server::QueryServer<Self> {
        v1::query_server::QueryServer::new(self).max_decoding_message_size(16 << 20)
    }
}

fn is_local<T>(r: &Request<T>) -> bool {
    r.metadata().get(LOCAL).is_some()
}

fn peer_request<T: Clone>(r: &Request<T>) -> Request<T> {
    let mut p = Request::new(r.get_ref().clone());
    if let Some(a) = r.metadata().get("authorization") {
        p.metadata_mut().insert("authorization", a.clone());
    }
    p.metadata_mut()
        .insert(LOCAL, MetadataValue::from_static("1"));
    p.set_timeout(PEER_TIMEOUT);
    p
}

/// Runs `call` on every peer; returns the answers and how many peers
/// failed (NotFound counts as an empty answer, not a failure).
async fn ask_peers<T, R, F, Fut>(
    peers: &[(String, Channel)],
    req: &Request<T>,
    call: F,
) -> (Vec<R>, usize)
where
    T: Clone,
    F: Fn(QueryClient<Channel>, Request<T>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<R>, Status>>,
{
    let futs = peers.iter().map(|(url, ch)| {
        let client = QueryClient::new(ch.clone()).max_decoding_message_size(64 << 20);
        let fut = call(client, peer_request(req));
        async move {
            match tokio::time::timeout(PEER_TIMEOUT, fut).await {
                Ok(Ok(r)) => Ok(Some(r.into_inner())),
                Ok(Err(s)) if s.code() == Code::NotFound => Ok(None),
                Ok(Err(s)) => {
                    warn!(peer = %url, code = ?s.code(), message = %s.message(), "peer query failed");
                    Err(())
                }
                Err(_) => {
                    warn!(peer = %url, "peer query timed out");
                    Err(())
                }
            }
        }
    });
    let mut out = Vec::new();
    let mut failed = 0;
    for r in futures::future::join_all(futs).await {
        match r {
            Ok(Some(v)) => out.push(v),
            Ok(None) => {}
            Err(()) => failed += 1,
        }
    }
    (out, failed)
}

fn respond<R>(r: R, failed: usize) -> Response<R> {
    let mut resp = Response::new(r);
    if failed > 0 {
        if let Ok(v) = MetadataValue::try_from(failed.to_string()) {
            resp.metadata_mut().insert(PARTIAL, v);
        }
    }
    resp
}

/// Merges series of one GPU metric: time order, one point per timestamp.
pub(crate) fn merge_series(parts: Vec<v1::Series>, limit: usize) -> Option<v1::Series> {
    let mut first: Option<v1::Series> = None;
    let mut points: BTreeMap<i64, (f64, Option<f64>, Option<u32>)> = BTreeMap::new();
    for s in parts {
        for (i, &ts) in s.timestamps_ms.iter().enumerate() {
            let v = s.values.get(i).copied().unwrap_or(f64::NAN);
            points
                .entry(ts)
                .or_insert((v, s.peaks.get(i).copied(), s.window_ms.get(i).copied()));
        }
        if first.is_none() {
            first = Some(v1::Series {
                gpu_uuid: s.gpu_uuid,
                metric: s.metric,
                ..Default::default()
            });
        }
    }
    let mut out = first?;
    let with_peaks = points.values().any(|p| p.1.is_some());
    let with_windows = points.values().any(|p| p.2.is_some());
    for (ts, (v, peak, w)) in points.into_iter().take(limit) {
        out.timestamps_ms.push(ts);
        out.values.push(v);
        if with_peaks {
            out.peaks.push(peak.unwrap_or(v));
        }
        if with_windows {
            out.window_ms.push(w.unwrap_or(0));
        }
    }
    Some(out)
}

/// Combines OFU answers (see the module docs for what is exact).
pub(crate) fn merge_ofu(parts: Vec<v1::OfuResponse>) -> v1::OfuResponse {
    let summaries: Vec<v1::OfuSummary> = parts.iter().filter_map(|p| p.summary).collect();
    let total: u64 = summaries.iter().map(|s| s.samples).sum();
    let summary = if summaries.is_empty() {
        None
    } else if total == 0 {
        summaries.first().copied()
    } else {
        let w = |f: fn(&v1::OfuSummary) -> f64| {
            summaries
                .iter()
                .map(|s| f(s) * s.samples as f64)
                .sum::<f64>()
                / total as f64
        };
        let with_data = summaries.iter().filter(|s| s.samples > 0);
        let mean = w(|s| s.mean);
        let peak = summaries.iter().map(|s| s.peak_tflops).fold(0.0, f64::max);
        // Fields not combined here come from the collector with the most
        // samples.
        let base = summaries
            .iter()
            .max_by_key(|s| s.samples)
            .copied()
            .unwrap_or_default();
        Some(v1::OfuSummary {
            mean,
            min: with_data
                .clone()
                .map(|s| s.min)
                .fold(f64::INFINITY, f64::min),
            max: with_data.map(|s| s.max).fold(f64::NEG_INFINITY, f64::max),
            p50: w(|s| s.p50),
            p10: w(|s| s.p10),
            samples: total,
            gpus: summaries.iter().map(|s| s.gpus).max().unwrap_or(0),
            peak_tflops: peak,
            achieved_tflops: mean * peak,
            ..base
        })
    };
    let mut buckets: BTreeMap<i64, (f64, f64, f64, u32)> = BTreeMap::new();
    for p in parts.iter().flat_map(|p| p.points.iter()) {
        let g = f64::from(p.gpus.max(1));
        let e = buckets.entry(p.timestamp_ms).or_default();
        e.0 += p.ofu * g;
        e.1 += p.tensor_active * g;
        e.2 += p.sm_clock_mhz * g;
        e.3 += p.gpus.max(1);
    }
    let points = buckets
        .into_iter()
        .map(|(ts, (o, t, c, g))| {
            let n = f64::from(g.max(1));
            v1::OfuPoint {
                timestamp_ms: ts,
                ofu: o / n,
                tensor_active: t / n,
                sm_clock_mhz: c / n,
                gpus: g,
            }
        })
        .collect();
    v1::OfuResponse { points, summary }
}

#[tonic::async_trait]
impl Query for FanoutQuery {
    /// Always this collector's own series: the asking collector merges.
    async fn select(
        &self,
        request: Request<v1::SelectRequest>,
    ) -> Result<Response<v1::SelectResponse>, Status> {
        self.local.select(request).await
    }

    async fn ofu(
        &self,
        request: Request<v1::OfuRequest>,
    ) -> Result<Response<v1::OfuResponse>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.ofu(request).await;
        }
        let (mut parts, failed) =
            ask_peers(
                &self.peers,
                &request,
                |mut c, r| async move { c.ofu(r).await },
            )
            .await;
        match self.local.ofu(request).await {
            Ok(r) => parts.push(r.into_inner()),
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(s),
        }
        if parts.is_empty() {
            return Err(Status::not_found("no collector holds this scope"));
        }
        Ok(respond(merge_ofu(parts), failed))
    }

    async fn series(
        &self,
        request: Request<v1::SeriesRequest>,
    ) -> Result<Response<v1::SeriesResponse>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.series(request).await;
        }
        let limit = match request.get_ref().limit {
            0 => 100_000,
            n => n.min(1_000_000),
        } as usize;
        let (answers, failed) = ask_peers(&self.peers, &request, |mut c, r| async move {
            c.series(r).await
        })
        .await;
        let mut parts: Vec<v1::Series> = answers.into_iter().filter_map(|a| a.series).collect();
        match self.local.series(request).await {
            Ok(r) => parts.extend(r.into_inner().series),
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => return Err(s),
        }
        match merge_series(parts, limit) {
            Some(series) => Ok(respond(
                v1::SeriesResponse {
                    series: Some(series),
                },
                failed,
            )),
            None => Err(Status::not_found("no such GPU")),
        }
    }

    async fn list_nodes(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::NodeList>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.list_nodes(request).await;
        }
        let (mut parts, failed) = ask_peers(&self.peers, &request, |mut c, r| async move {
            c.list_nodes(r).await
        })
        .await;
        parts.push(self.local.list_nodes(request).await?.into_inner());
        let mut by: BTreeMap<(String, String), v1::NodeEntry> = BTreeMap::new();
        for n in parts.into_iter().flat_map(|p| p.nodes) {
            let k = (n.tenant.clone(), n.node_id.clone());
            match by.get(&k) {
                Some(o) if o.last_seen_ms >= n.last_seen_ms => {}
                _ => {
                    by.insert(k, n);
                }
            }
        }
        Ok(respond(
            v1::NodeList {
                nodes: by.into_values().collect(),
            },
            failed,
        ))
    }

    async fn list_gpus(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::GpuList>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.list_gpus(request).await;
        }
        let (mut parts, failed) = ask_peers(&self.peers, &request, |mut c, r| async move {
            c.list_gpus(r).await
        })
        .await;
        parts.push(self.local.list_gpus(request).await?.into_inner());
        let mut by: BTreeMap<(String, String), v1::GpuEntry> = BTreeMap::new();
        for g in parts.into_iter().flat_map(|p| p.gpus) {
            let uuid = g.info.as_ref().map(|i| i.uuid.clone()).unwrap_or_default();
            let k = (g.tenant.clone(), uuid);
            match by.get(&k) {
                Some(o) if o.last_seen_ms >= g.last_seen_ms => {}
                _ => {
                    by.insert(k, g);
                }
            }
        }
        Ok(respond(
            v1::GpuList {
                gpus: by.into_values().collect(),
            },
            failed,
        ))
    }

    async fn list_jobs(
        &self,
        request: Request<v1::ListRequest>,
    ) -> Result<Response<v1::JobList>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.list_jobs(request).await;
        }
        let (mut parts, failed) = ask_peers(&self.peers, &request, |mut c, r| async move {
            c.list_jobs(r).await
        })
        .await;
        parts.push(self.local.list_jobs(request).await?.into_inner());
        let mut by: BTreeMap<(String, String), v1::JobEntry> = BTreeMap::new();
        for j in parts.into_iter().flat_map(|p| p.jobs) {
            let k = (j.tenant.clone(), j.job_id.clone());
            match by.get_mut(&k) {
                Some(o) => {
                    for g in j.gpu_uuids {
                        if !o.gpu_uuids.contains(&g) {
                            o.gpu_uuids.push(g);
                        }
                    }
                    for n in j.node_ids {
                        if !o.node_ids.contains(&n) {
                            o.node_ids.push(n);
                        }
                    }
                    o.first_seen_ms = o.first_seen_ms.min(j.first_seen_ms);
                    o.last_seen_ms = o.last_seen_ms.max(j.last_seen_ms);
                }
                None => {
                    by.insert(k, j);
                }
            }
        }
        Ok(respond(
            v1::JobList {
                jobs: by.into_values().collect(),
            },
            failed,
        ))
    }

    /// Each member's holdings are its own samples' (a GPU handed over
    /// mid-period has an entry from each side): the entries add up.
    async fn ledger(
        &self,
        request: Request<v1::LedgerRequest>,
    ) -> Result<Response<v1::LedgerResponse>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.ledger(request).await;
        }
        let (mut parts, failed) = ask_peers(&self.peers, &request, |mut c, r| async move {
            c.ledger(r).await
        })
        .await;
        let mut all = self.local.ledger(request).await?.into_inner();
        for p in parts.drain(..) {
            all.entries.extend(p.entries);
        }
        Ok(respond(all, failed))
    }

    async fn list_events(
        &self,
        request: Request<v1::EventsRequest>,
    ) -> Result<Response<v1::EventList>, Status> {
        if is_local(&request) || self.peers.is_empty() {
            return self.local.list_events(request).await;
        }
        let (mut parts, failed) = ask_peers(&self.peers, &request, |mut c, r| async move {
            c.list_events(r).await
        })
        .await;
        parts.push(self.local.list_events(request).await?.into_inner());
        let mut events: Vec<v1::EventEntry> = parts.into_iter().flat_map(|p| p.events).collect();
        events.sort_by(|a, b| {
            (
                a.timestamp_ms,
                &a.kind,
                &a.tenant,
                &a.job_id,
                &a.gpu_uuid,
                &a.node_id,
            )
                .cmp(&(
                    b.timestamp_ms,
                    &b.kind,
                    &b.tenant,
                    &b.job_id,
                    &b.gpu_uuid,
                    &b.node_id,
                ))
        });
        events.dedup_by(|a, b| {
            a.timestamp_ms == b.timestamp_ms
                && a.kind == b.kind
                && a.tenant == b.tenant
                && a.job_id == b.job_id
                && a.gpu_uuid == b.gpu_uuid
                && a.node_id == b.node_id
        });
        Ok(respond(v1::EventList { events }, failed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(ts: &[i64]) -> v1::Series {
        v1::Series {
            gpu_uuid: "GPU-1".into(),
            metric: "power_w".into(),
            timestamps_ms: ts.to_vec(),
            values: ts.iter().map(|&t| t as f64).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn series_merge_orders_and_drops_copies() {
        let m = merge_series(vec![series(&[1, 2, 3]), series(&[3, 4]), series(&[0])], 10).unwrap();
        assert_eq!(m.timestamps_ms, vec![0, 1, 2, 3, 4]);
        assert_eq!(m.values, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
        assert!(m.peaks.is_empty() && m.window_ms.is_empty());
        let m = merge_series(vec![series(&[5, 6, 7])], 2).unwrap();
        assert_eq!(m.timestamps_ms, vec![5, 6]);
        assert!(merge_series(Vec::new(), 10).is_none());
    }

    #[test]
    fn ofu_merge_weights_by_samples() {
        let part = |mean: f64, samples: u64| v1::OfuResponse {
            points: vec![v1::OfuPoint {
                timestamp_ms: 0,
                ofu: mean,
                tensor_active: mean,
                sm_clock_mhz: 1000.0,
                gpus: 1,
            }],
            summary: Some(v1::OfuSummary {
                mean,
                min: mean,
                max: mean,
                p50: mean,
                p10: mean,
                samples,
                gpus: 1,
                peak_tflops: 100.0,
                achieved_tflops: mean * 100.0,
                ..Default::default()
            }),
        };
        let m = merge_ofu(vec![part(0.2, 300), part(0.6, 100)]);
        let s = m.summary.unwrap();
        assert!((s.mean - 0.3).abs() < 1e-12);
        assert_eq!((s.min, s.max, s.samples), (0.2, 0.6, 400));
        assert_eq!(m.points.len(), 1);
        assert!((m.points[0].ofu - 0.4).abs() < 1e-12);
        assert_eq!(m.points[0].gpus, 2);
    }
}
