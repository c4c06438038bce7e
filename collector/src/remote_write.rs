//! Prometheus remote write (protocol 1.0): OFU, tensor activity, SM clock
//! and selected counters of every GPU, under the names and base units of
//! the collector's `/metrics` ([`crate::series::family`]), pushed to a
//! Prometheus-compatible endpoint (Prometheus with
//! `--web.enable-remote-write-receiver`, Mimir, Thanos Receive,
//! VictoriaMetrics, Grafana Cloud, Amazon Managed Prometheus) — how storage
//! scales past one collector.
//!
//! Off by default (`[remote_write]` in collector.toml). For each batch,
//! ingest writes one point per GPU and series (the batch's mean, at its
//! newest sample's time; a counter's newest value when the batch has one)
//! into the store's forwarding journal, in the same write as the batch
//! ([`queue`], `store::journal`): what an agent was acknowledged is
//! queued, durably, or nothing is — a restart, `kill -9` included, loses
//! nothing. The work is the batch's own GPUs', never the collector's
//! whole fleet.
//!
//! A journal entry keeps each GPU's labels and each series name once
//! ([`wire`]). The sender ([`sender`]) reads the journal's oldest entries,
//! shards their points by series (each series in order within its shard)
//! over up to `max_shards` concurrent requests as the backlog asks, and
//! deletes the entries once every point was delivered, refused or dropped
//! by policy; its CPU work (points read back, requests encoded straight
//! from their label bytes) runs on a thread of its own below ingest's
//! priority. Delivery is at least once, with at most one read window
//! (`max_shards` × `max_samples_per_request` points) sent twice after a
//! crash. Requests go
//! snappy-compressed over TLS (rustls) for an `https://` URL, with a bearer
//! token or basic auth and extra headers when configured ([`endpoint`]).
//!
//! As the remote-write specification asks, a request that fails with a
//! connection error, a 5xx or a 429 is retried after a delay with full
//! jitter, capped at `max_backoff` and at least the endpoint's
//! `Retry-After` (seconds or an HTTP date); any other 4xx drops the
//! request's samples, since the endpoint will never take them. Points
//! older than `max_age`, and the oldest past `max_queue_samples` pending,
//! are dropped by that policy. Failures are counted by reason
//! (`flopwatch_remote_write_failures_total`) and dropped samples by cause
//! (`flopwatch_remote_write_dropped_samples_total`); the backlog and its
//! oldest point's age are gauges; each distinct error is logged once with
//! its status and the first line of the response body.
//!
//! A series that stops — its GPU's input went stale ([`crate::staleness`]),
//! its agent went away, or its job ended and its labels changed — gets
//! Prometheus' staleness marker (the NaN with bits `0x7ff0000000000002`)
//! after its last sample, as a Prometheus scrape writes one for a series
//! that vanished from a target: the receiver then ends the series there
//! instead of extending its last value over its lookback. The series
//! being sent are registered in the store (with the batch that starts or
//! relabels one, so nothing is written per batch in the steady state):
//! after a restart, `kill -9` included, a series that does not come back
//! within a minute, or comes back under other labels, still gets its
//! marker.

mod endpoint;
mod open;
mod queue;
mod sender;
mod wire;

pub use endpoint::{Endpoint, SendError};
pub(crate) use queue::RemoteQueue;
pub(crate) use sender::run;

/// How long after a restart a series the previous run left open waits for
/// its agent to continue it before it gets its staleness marker (agents
/// reconnect well within it).
pub(crate) const RESTORE_GRACE_MS: i64 = 60_000;

use prost::Message;

/// `prometheus.WriteRequest` (prompb/remote.proto), the fields flopwatch
/// sends.
#[derive(Clone, PartialEq, Message)]
pub struct WriteRequest {
    /// Series with their samples.
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
    /// The families' metadata (type, help, unit).
    #[prost(message, repeated, tag = "3")]
    pub metadata: Vec<MetricMetadata>,
}

/// `prometheus.MetricMetadata`.
#[derive(Clone, PartialEq, Message)]
pub struct MetricMetadata {
    /// `MetricType`: 1 counter, 2 gauge.
    #[prost(int32, tag = "1")]
    pub r#type: i32,
    /// The family's name (a counter's without `_total`).
    #[prost(string, tag = "2")]
    pub metric_family_name: String,
    /// Help text.
    #[prost(string, tag = "4")]
    pub help: String,
    /// Unit.
    #[prost(string, tag = "5")]
    pub unit: String,
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

/// Every family remote write may send, with its metadata: the OFU
/// series and the GPU catalog's families, named as on `/metrics`.
fn metadata() -> Vec<crate::remote_write_v2::Meta<'static>> {
    static ALL: std::sync::OnceLock<Vec<(String, &'static str, String, &'static str)>> =
        std::sync::OnceLock::new();
    let all = ALL.get_or_init(|| {
        let mut v: Vec<(String, &'static str, String, &'static str)> = vec![
            (
                "flopwatch_ofu_ratio".into(),
                "gauge",
                "OFU: tensor pipe activity × SM clock ÷ tensor peak clock, the batch's mean."
                    .into(),
                "ratio",
            ),
            (
                "flopwatch_ofu_tensor_active_ratio".into(),
                "gauge",
                "Tensor pipe activity, the batch's mean (an OFU input).".into(),
                "ratio",
            ),
            (
                "flopwatch_ofu_sm_clock_hertz".into(),
                "gauge",
                "SM clock of the OFU samples, the batch's mean.".into(),
                "hertz",
            ),
        ];
        for def in flopwatch_proto::metrics::CATALOG {
            if let Some(f) = crate::series::family(def, crate::series::On::Gpu) {
                v.push((
                    f.sample_name(),
                    if f.counter { "counter" } else { "gauge" },
                    f.help.clone(),
                    f.unit.unwrap_or(""),
                ));
            }
        }
        v
    });
    all.iter()
        .map(|(name, kind, help, unit)| crate::remote_write_v2::Meta {
            name,
            kind,
            help,
            unit,
        })
        .collect()
}

/// One point to send.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
struct Point {
    labels: Vec<Label>,
    ts_ms: i64,
    value: f64,
}

pub(crate) use crate::staleness::STALE_NAN;

/// A series' labels: `base` (empty values left out, as the specification
/// asks) and its name, sorted.
#[cfg(test)]
fn labels(name: &str, base: &[(String, String)]) -> Vec<Label> {
    let mut l: Vec<Label> = base
        .iter()
        .filter(|(_, v)| !v.is_empty())
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

/// A `WriteRequest` as it goes on the wire: protobuf, then snappy's block
/// format (remote-write 1.0). One encoder for the collector's sender and
/// for `flopwatch-bench ingest --peer prometheus`.
pub fn encode_request(req: &WriteRequest) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Encoder::new().compress_vec(&req.encode_to_vec())
}

/// Groups points into a `WriteRequest`, each series' samples in time
/// order, one per timestamp.
#[cfg(test)]
fn request(points: &[Point]) -> WriteRequest {
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
    WriteRequest {
        timeseries: series,
        metadata: Vec::new(),
    }
}

/// `points` as a `WriteRequest` of one series per point, written straight
/// from the points (no grouping): what the journal keeps of a batch, read
/// back by [`wire::read`] (which does not group either; the sender groups
/// a request's points).
#[cfg(test)]
fn encode_points(points: &[Point]) -> Vec<u8> {
    let mut b = Vec::new();
    for p in points {
        wire::series_into(&wire::labels_of(&p.labels), p.ts_ms, p.value, &mut b);
    }
    b
}

/// The 1.0 metadata of the families named in `names` (values of
/// `__name__`), in the order of [`metadata`].
fn metadata_v1<'a>(names: &'a [&[u8]]) -> impl Iterator<Item = MetricMetadata> + 'a {
    metadata()
        .into_iter()
        .filter(|m| names.contains(&m.name.as_bytes()))
        .map(|m| MetricMetadata {
            r#type: if m.kind == "counter" { 1 } else { 2 },
            metric_family_name: m.name.strip_suffix("_total").unwrap_or(m.name).to_string(),
            help: m.help.to_string(),
            unit: m.unit.to_string(),
        })
}

/// Groups points into a snappy-compressed `WriteRequest` body, with the
/// metadata of the families in it: what the sender sends of them.
#[cfg(test)]
fn encode(points: &[Point]) -> Result<Vec<u8>, snap::Error> {
    let body = encode_points(points);
    let mut raw = Vec::new();
    wire::read(&body, &mut raw).expect("points encode as a request");
    snap::raw::Encoder::new().compress_vec(&wire::request_v1(&raw))
}

/// The points of a `WriteRequest` (a journal entry's body); `None` when the
/// bytes are not one.
#[cfg(test)]
fn points_of(body: &[u8]) -> Option<Vec<Point>> {
    let req = WriteRequest::decode(body).ok()?;
    Some(
        req.timeseries
            .into_iter()
            .flat_map(|s| {
                let labels = s.labels;
                s.samples.into_iter().map(move |x| Point {
                    labels: labels.clone(),
                    ts_ms: x.timestamp,
                    value: x.value,
                })
            })
            .collect(),
    )
}

/// The points of a journal entry's body.
#[cfg(test)]
fn journal_points(body: &[u8]) -> Option<Vec<Point>> {
    let (mut arena, mut spans) = (Vec::new(), Vec::new());
    wire::expand(body, &mut arena, &mut spans)?;
    Some(
        spans
            .into_iter()
            .map(|s| Point {
                labels: wire::pairs(&arena[s.labels])
                    .into_iter()
                    .map(|(name, value)| Label { name, value })
                    .collect(),
                ts_ms: s.ts_ms,
                value: s.value,
            })
            .collect(),
    )
}

#[cfg(test)]
mod compliance;
#[cfg(test)]
mod stub;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_encode_as_prost_would_and_read_back() {
        let l = |v: &str| labels("flopwatch_ofu_ratio", &[("UUID".into(), v.into())]);
        let pts = vec![
            Point {
                labels: l("GPU-1"),
                ts_ms: 1_700_000_000_123,
                value: 0.25,
            },
            Point {
                labels: l("GPU-ü"),
                ts_ms: -5,
                value: f64::from_bits(STALE_NAN),
            },
            Point {
                labels: l("GPU-1"),
                ts_ms: 0,
                value: 1e300,
            },
            Point {
                labels: l(""),
                ts_ms: 7,
                value: 0.0,
            },
        ];
        let ours = encode_points(&pts);
        let theirs = WriteRequest {
            timeseries: pts
                .iter()
                .map(|p| TimeSeries {
                    labels: p.labels.clone(),
                    samples: vec![Sample {
                        value: p.value,
                        timestamp: p.ts_ms,
                    }],
                })
                .collect(),
            metadata: Vec::new(),
        }
        .encode_to_vec();
        assert_eq!(ours, theirs);
        let back = points_of(&ours).unwrap();
        assert_eq!(back.len(), 4);
        assert_eq!(back[1].value.to_bits(), STALE_NAN);
        assert_eq!((back[2].ts_ms, back[2].value), (0, 1e300));
        assert!(encode_points(&[]).is_empty());
    }

    #[test]
    fn labels_are_sorted_and_empty_values_left_out() {
        let l = labels(
            "flopwatch_ofu_ratio",
            &[
                ("hostname".into(), String::new()),
                ("UUID".into(), "GPU-1".into()),
                ("gpu".into(), "0".into()),
            ],
        );
        let names: Vec<&str> = l.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["UUID", "__name__", "gpu"]);
    }

    #[test]
    fn a_request_groups_series_in_time_order_and_reads_back() {
        let a = labels("x", &[("UUID".into(), "GPU-1".into())]);
        let b = labels("y", &[("UUID".into(), "GPU-1".into())]);
        let p = |l: &Vec<Label>, ts, value| Point {
            labels: l.clone(),
            ts_ms: ts,
            value,
        };
        let pts = vec![p(&a, 2, 0.5), p(&b, 1, 7.0), p(&a, 1, 0.25), p(&a, 2, 0.5)];
        let req = request(&pts);
        assert_eq!(req.timeseries.len(), 2);
        let ts: Vec<(i64, f64)> = req.timeseries[0]
            .samples
            .iter()
            .map(|s| (s.timestamp, s.value))
            .collect();
        assert_eq!(ts, [(1, 0.25), (2, 0.5)], "sorted, one per timestamp");
        let back = points_of(&req.encode_to_vec()).unwrap();
        assert_eq!(back.len(), 3);
        assert!(points_of(b"\xff\xff").is_none());
        let wire = snap::raw::Decoder::new()
            .decompress_vec(&encode(&pts).unwrap())
            .unwrap();
        let sent = WriteRequest::decode(&wire[..]).unwrap();
        assert_eq!(sent.timeseries, req.timeseries);
        // Metadata of the families sent, none of the others.
        let ofu = labels("flopwatch_ofu_ratio", &[]);
        let energy = labels("flopwatch_gpu_energy_joules_total", &[]);
        let wire = snap::raw::Decoder::new()
            .decompress_vec(&encode(&[p(&ofu, 1, 0.5), p(&energy, 1, 9.0)]).unwrap())
            .unwrap();
        let md = WriteRequest::decode(&wire[..]).unwrap().metadata;
        let got: Vec<(i32, &str, &str)> = md
            .iter()
            .map(|m| (m.r#type, m.metric_family_name.as_str(), m.unit.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (2, "flopwatch_ofu_ratio", "ratio"),
                (1, "flopwatch_gpu_energy_joules", "joules")
            ]
        );
    }
}
