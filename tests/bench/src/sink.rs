//! `bench fleet --remote-write sink`: a remote-write 1.0 receiver in a
//! process of its own, standing in for the store a site forwards to (Mimir,
//! Thanos Receive, VictoriaMetrics on machines of their own). It decodes
//! every request (snappy, then `prometheus.WriteRequest`), counts what it
//! carries and answers 204 after `--sink-delay`, so a slow receiver can be
//! played without a receiver's own work on the machine's cores.
//!
//! Counted per point: *new* (a series' timestamp later than any seen for
//! it), *repeat* (one already seen: a resend, at-least-once), *marker*
//! (Prometheus' staleness NaN), and the delivery lag, from the point's
//! timestamp to its request's arrival. A status line every 500 ms:
//! `sink requests=… bytes=… new=… repeats=… markers=… bad=… series=…
//! hist=…` (the lag histogram, as the agents' ack latency's).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use flopwatch_agent::latency::LatencyHistogram;
use flopwatch_collector::prompb::WriteRequest;
use flopwatch_proto::clock::{Clock, SystemClock};
use prost::Message;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Prometheus' staleness marker (`value.StaleNaN`).
const STALE_NAN: u64 = 0x7ff0_0000_0000_0002;

/// What the sink has received.
#[derive(Default)]
struct Tally {
    counts: Mutex<Counts>,
    lag: LatencyHistogram,
}

#[derive(Default)]
struct Counts {
    requests: u64,
    bytes: u64,
    new: u64,
    repeats: u64,
    markers: u64,
    /// Requests that did not decode (answered 400).
    bad: u64,
    /// Each series' newest timestamp, by a hash of its labels.
    newest: HashMap<u64, i64>,
}

impl Tally {
    /// Counts one decoded request that arrived at `now_ms`.
    fn take(&self, req: &WriteRequest, now_ms: i64, bytes: usize) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.requests += 1;
        c.bytes += bytes as u64;
        for ts in &req.timeseries {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            for l in &ts.labels {
                (l.name.as_str(), l.value.as_str()).hash(&mut h);
            }
            let newest = c.newest.entry(h.finish()).or_insert(i64::MIN);
            let mut latest = *newest;
            let (mut new, mut repeats, mut markers) = (0, 0, 0);
            for s in &ts.samples {
                if s.value.to_bits() == STALE_NAN {
                    markers += 1;
                } else if s.timestamp > latest {
                    new += 1;
                    let lag = u64::try_from(now_ms - s.timestamp).unwrap_or(0);
                    self.lag.observe(Duration::from_millis(lag));
                } else {
                    repeats += 1;
                }
                latest = latest.max(s.timestamp);
            }
            *newest = latest;
            c.new += new;
            c.repeats += repeats;
            c.markers += markers;
        }
    }

    fn line(&self) -> String {
        let c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let hist = super::hist_line::fmt_hist(&self.lag.counts());
        format!(
            "sink requests={} bytes={} new={} repeats={} markers={} bad={} series={} hist={}",
            c.requests,
            c.bytes,
            c.new,
            c.repeats,
            c.markers,
            c.bad,
            c.newest.len(),
            hist
        )
    }
}

/// `POST /api/v1/write`: decoded and counted, then answered after the
/// delay.
async fn write(State((tally, delay)): State<(Arc<Tally>, Duration)>, body: Bytes) -> StatusCode {
    let now = SystemClock.now_ms();
    let req = snap::raw::Decoder::new()
        .decompress_vec(&body)
        .ok()
        .and_then(|raw| WriteRequest::decode(raw.as_slice()).ok());
    let Some(req) = req else {
        tally.counts.lock().unwrap_or_else(|e| e.into_inner()).bad += 1;
        return StatusCode::BAD_REQUEST;
    };
    tally.take(&req, now, body.len());
    tokio::time::sleep(delay).await;
    StatusCode::NO_CONTENT
}

/// Serves on `port` until killed, printing its status every 500 ms.
pub(super) async fn run(port: u16, delay: Duration) -> anyhow::Result<()> {
    let tally = Arc::new(Tally::default());
    let app = axum::Router::new()
        .route("/api/v1/write", axum::routing::post(write))
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state((tally.clone(), delay));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!("sink listening on 127.0.0.1:{port}");
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        println!("{}", tally.line());
        let _ = std::io::stdout().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_collector::prompb::{Label, Sample, TimeSeries};

    fn series(gpu: &str, samples: &[(i64, f64)]) -> TimeSeries {
        TimeSeries {
            labels: vec![
                Label {
                    name: "__name__".into(),
                    value: "flopwatch_ofu_ratio".into(),
                },
                Label {
                    name: "UUID".into(),
                    value: gpu.into(),
                },
            ],
            samples: samples
                .iter()
                .map(|&(timestamp, value)| Sample { value, timestamp })
                .collect(),
        }
    }

    #[test]
    fn points_count_as_new_repeated_or_markers_per_series() {
        let t = Tally::default();
        let req = |ts| WriteRequest {
            timeseries: ts,
            metadata: vec![],
        };
        t.take(
            &req(vec![
                series("a", &[(1_000, 0.5), (2_000, 0.6)]),
                series("b", &[(1_000, 0.5)]),
            ]),
            2_500,
            10,
        );
        // A resend of a's first point, a's next one, and b's marker.
        t.take(
            &req(vec![
                series("a", &[(1_000, 0.5), (3_000, 0.7)]),
                series("b", &[(2_000, f64::from_bits(STALE_NAN))]),
            ]),
            3_500,
            10,
        );
        let c = t.counts.lock().unwrap();
        assert_eq!((c.new, c.repeats, c.markers), (4, 1, 1));
        assert_eq!((c.requests, c.bytes, c.newest.len()), (2, 20, 2));
        drop(c);
        // Lags 1,500, 500, 1,500 and 500 ms: the median at most 4.4 % over.
        let lag = t.lag.counts();
        let median = flopwatch_agent::latency::quantile(&lag, 0.5).unwrap();
        assert!(median >= Duration::from_millis(500) && median <= Duration::from_millis(522));
        assert_eq!(lag.iter().sum::<u64>(), 4);
    }
}
