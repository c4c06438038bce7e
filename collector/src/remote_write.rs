//! Prometheus remote write (protocol 1.0): OFU, tensor activity, SM clock
//! and selected counters of every GPU, pushed to a Prometheus-compatible
//! endpoint (Prometheus with `--web.enable-remote-write-receiver`, Mimir,
//! Thanos Receive, VictoriaMetrics) — how storage scales past one collector.
//!
//! Off by default (`[remote_write]` in collector.toml). Ingest appends one
//! point per GPU and series per acknowledged batch (the batch's mean, at its
//! newest sample's time) to a bounded queue and never waits on the
//! endpoint; a background task sends snappy-compressed `WriteRequest`s every
//! `interval`. A failed request (connection error, 5xx, 429) is retried with
//! backoff and the samples stay queued; a 4xx other than 429 drops the
//! request's samples (the endpoint will never take them). When the queue is
//! full the oldest samples are dropped; both drops are counted on
//! `/metrics` (`flopwatch_remote_write_dropped_samples_total`).

use crate::live::GpuLive;
use crate::series::gpu_labels;
use crate::stats::Stats;
use flopwatch_config::RemoteWriteConfig;
use prost::Message;
use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `prometheus.WriteRequest` (prompb/remote.proto), the fields flopwatch
/// sends.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// Series with their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries`.
#[derive(Clone, PartialEq, Message)]
pub struct TimeSeries {
    /// Labels, sorted by name, `__name__` included.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    /// Samples in time order.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Message)]
pub struct Label {
    /// Name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`.
#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Value.
    #[prost(double, tag = "1")]
    pub value: f64,
    /// Unix ms.
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// One queued point.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    labels: Vec<Label>,
    ts_ms: i64,
    value: f64,
}

/// The bounded queue between ingest and the sender.
#[derive(Debug)]
pub struct RemoteQueue {
    points: Mutex<VecDeque<Point>>,
    cap: usize,
    metrics: Vec<String>,
}

fn labels(name: &str, base: &[(String, String)]) -> Vec<Label> {
    let mut l: Vec<Label> = base
        .iter()
        .map(|(k, v)| Label {
            name: k.clone(),
            value: v.clone(),
        })
        .collect();
    l.push(Label {
        name: "__name__".into(),
        value: name.into(),
    });
    l.sort();
    l
}

impl RemoteQueue {
    /// A queue of at most `cap` points; `metrics` are the counters pushed
    /// besides the OFU series.
    pub fn new(cap: usize, metrics: Vec<String>) -> Self {
        Self {
            points: Mutex::new(VecDeque::new()),
            cap: cap.max(1),
            metrics,
        }
    }

    /// Queued points.
    pub fn len(&self) -> usize {
        self.points.lock().map(|q| q.len()).unwrap_or(0)
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a GPU's state after a batch: OFU, tensor activity and SM
    /// clock at `ofu_ts_ms` when the batch had OFU, and the configured
    /// counters' last values.
    pub fn push_gpu(&self, g: &GpuLive, ofu_ts_ms: Option<i64>, stats: &Stats) {
        let base = gpu_labels(g);
        let mut new = Vec::new();
        if let (Some(ts), Some(ofu)) = (ofu_ts_ms, g.ofu) {
            for (name, v) in [
                ("flopwatch_ofu", ofu),
                ("flopwatch_tensor_active", g.tensor_active),
                ("flopwatch_sm_clock_mhz", g.sm_clock_mhz),
            ] {
                new.push(Point {
                    labels: labels(name, &base),
                    ts_ms: ts,
                    value: v,
                });
            }
        }
        for m in &self.metrics {
            if let Some((ts, v)) = g.counters.get(m) {
                let mut l = base.clone();
                l.push(("metric".into(), m.clone()));
                new.push(Point {
                    labels: labels("flopwatch_gpu_metric", &l),
                    ts_ms: *ts,
                    value: *v,
                });
            }
        }
        self.push(new, stats);
    }

    fn push(&self, new: Vec<Point>, stats: &Stats) {
        let Ok(mut q) = self.points.lock() else {
            return;
        };
        q.extend(new);
        let over = q.len().saturating_sub(self.cap);
        if over > 0 {
            q.drain(..over);
            stats
                .remote_write_dropped
                .fetch_add(over as u64, Ordering::Relaxed);
        }
    }

    /// Takes up to `n` of the oldest points.
    fn take(&self, n: usize) -> Vec<Point> {
        self.points
            .lock()
            .map(|mut q| {
                let k = n.min(q.len());
                q.drain(..k).collect()
            })
            .unwrap_or_default()
    }

    /// Puts points back at the front, after a failed send.
    fn restore(&self, points: Vec<Point>, stats: &Stats) {
        let Ok(mut q) = self.points.lock() else {
            return;
        };
        for p in points.into_iter().rev() {
            q.push_front(p);
        }
        let over = q.len().saturating_sub(self.cap);
        if over > 0 {
            // Drop the newest overflow: the restored points are older and
            // must go first to keep each series in time order.
            let keep = q.len() - over;
            q.truncate(keep);
            stats
                .remote_write_dropped
                .fetch_add(over as u64, Ordering::Relaxed);
        }
    }
}

/// Groups points into a snappy-compressed `WriteRequest` body.
fn encode(points: &[Point]) -> Result<Vec<u8>, snap::Error> {
    let mut series: Vec<TimeSeries> = Vec::new();
    let mut index: std::collections::BTreeMap<&[Label], usize> = Default::default();
    for p in points {
        let i = *index.entry(&p.labels[..]).or_insert_with(|| {
            series.push(TimeSeries {
                labels: p.labels.clone(),
                samples: Vec::new(),
            });
            series.len() - 1
        });
        series[i].samples.push(Sample {
            value: p.value,
            timestamp: p.ts_ms,
        });
    }
    for s in &mut series {
        s.samples.sort_by_key(|s| s.timestamp);
        s.samples.dedup_by_key(|s| s.timestamp);
    }
    let body = WriteRequest { timeseries: series }.encode_to_vec();
    snap::raw::Encoder::new().compress_vec(&body)
}

/// Why a send failed.
enum SendError {
    /// Worth retrying (connection, 5xx, 429).
    Retry(String),
    /// Never accepted (other 4xx): drop.
    Drop(String),
}

async fn send(
    client: &reqwest::Client,
    cfg: &RemoteWriteConfig,
    points: &[Point],
) -> Result<(), SendError> {
    let body = encode(points).map_err(|e| SendError::Drop(format!("snappy: {e}")))?;
    let mut req = client
        .post(&cfg.url)
        .header("Content-Encoding", "snappy")
        .header("Content-Type", "application/x-protobuf")
        .header("X-Prometheus-Remote-Write-Version", "0.1.0")
        .header(
            "User-Agent",
            concat!("flopwatch/", env!("CARGO_PKG_VERSION")),
        )
        .body(body);
    if let Some(t) = &cfg.bearer_token {
        req = req.bearer_auth(t);
    }
    let resp = req
        .send()
        .await
        .map_err(|e| SendError::Retry(e.to_string()))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(());
    }
    let text = resp.text().await.unwrap_or_default();
    let msg = format!("{status}: {}", text.trim());
    if status.is_server_error() || status.as_u16() == 429 {
        Err(SendError::Retry(msg))
    } else {
        Err(SendError::Drop(msg))
    }
}

/// Sends queued points until `shutdown` flips, then makes one last attempt
/// to drain the queue.
pub async fn run(
    cfg: RemoteWriteConfig,
    queue: Arc<RemoteQueue>,
    collector: Arc<crate::state::Collector>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let client = match reqwest::Client::builder().timeout(cfg.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "remote write disabled: cannot build an HTTP client");
            return;
        }
    };
    let stats = &collector.stats;
    let mut backoff = Duration::ZERO;
    loop {
        let wait = cfg.interval + backoff;
        let stopping = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = shutdown.wait_for(|s| *s) => true,
        };
        loop {
            let points = queue.take(cfg.max_samples_per_request);
            if points.is_empty() {
                break;
            }
            match send(&client, &cfg, &points).await {
                Ok(()) => {
                    backoff = Duration::ZERO;
                    stats
                        .remote_write_samples
                        .fetch_add(points.len() as u64, Ordering::Relaxed);
                }
                Err(SendError::Retry(e)) => {
                    stats.remote_write_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, url = %cfg.url, "remote write failed; will retry");
                    queue.restore(points, stats);
                    backoff = (backoff * 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
                    break;
                }
                Err(SendError::Drop(e)) => {
                    stats.remote_write_failures.fetch_add(1, Ordering::Relaxed);
                    stats
                        .remote_write_dropped
                        .fetch_add(points.len() as u64, Ordering::Relaxed);
                    tracing::warn!(error = %e, url = %cfg.url, "remote write refused; samples dropped");
                }
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(ofu: f64) -> GpuLive {
        GpuLive {
            tenant: "t".into(),
            uuid: "GPU-1".into(),
            model: "H100".into(),
            hostname: "h".into(),
            node_id: "n".into(),
            ofu: Some(ofu),
            tensor_active: 0.5,
            sm_clock_mhz: 1800.0,
            counters: [("power_w".to_string(), (5, 300.0))].into(),
            ..Default::default()
        }
    }

    #[test]
    fn encodes_sorted_labels_and_groups_series() {
        let stats = Stats::default();
        let q = RemoteQueue::new(100, vec!["power_w".into()]);
        q.push_gpu(&gpu(0.25), Some(1_000), &stats);
        q.push_gpu(&gpu(0.5), Some(2_000), &stats);
        assert_eq!(q.len(), 8);
        let points = q.take(100);
        let body = encode(&points).unwrap();
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let req = WriteRequest::decode(&raw[..]).unwrap();
        // power_w's timestamp did not move, so it is sent once.
        assert_eq!(req.timeseries.len(), 4);
        let ofu = req
            .timeseries
            .iter()
            .find(|s| {
                s.labels
                    .iter()
                    .any(|l| l.name == "__name__" && l.value == "flopwatch_ofu")
            })
            .unwrap();
        let mut names: Vec<&str> = ofu.labels.iter().map(|l| l.name.as_str()).collect();
        let sorted = {
            let mut s = names.clone();
            s.sort();
            s
        };
        assert_eq!(names, sorted);
        names.retain(|n| *n == "UUID");
        assert_eq!(names.len(), 1);
        let values: Vec<(i64, f64)> = ofu.samples.iter().map(|s| (s.timestamp, s.value)).collect();
        assert_eq!(values, vec![(1_000, 0.25), (2_000, 0.5)]);
    }

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts() {
        let stats = Stats::default();
        let q = RemoteQueue::new(4, Vec::new());
        q.push_gpu(&gpu(0.1), Some(1), &stats);
        q.push_gpu(&gpu(0.2), Some(2), &stats);
        assert_eq!(q.len(), 4);
        assert_eq!(Stats::get(&stats.remote_write_dropped), 2);
        let p = q.take(10);
        assert_eq!(p[0].ts_ms, 1, "one point of the first push survives");
        assert_eq!(p[3].ts_ms, 2);
        q.restore(p.clone(), &stats);
        assert_eq!(q.take(10), p);
    }
}
