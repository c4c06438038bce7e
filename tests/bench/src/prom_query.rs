//! The Prometheus side of the query comparisons (`bench storage` and
//! `bench ingest --peer prometheus`): OFU samples as OpenMetrics, TSDB
//! blocks made by promtool, a Prometheus serving them, and timed
//! `query_range` calls.

use anyhow::{bail, Context};
use flopwatch_collector::store::{OfuSample, WINDOW_MS};
use flopwatch_proto::clock::Stopwatch;
use flopwatch_tests::procs::free_port;
use flopwatch_tests::prometheus_peer::{create_blocks, LocalPrometheus, PrometheusOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The series flopwatch stores OFU under, as Prometheus gets it.
pub(super) const OFU_NAME: &str = "flopwatch_ofu_ratio";

/// promtool's block length for the query data (`--max-block-duration`):
/// 54 h is the largest block Prometheus' compaction makes when the
/// retention is at least 22.5 days (blocks up to a tenth of it).
pub(super) const BLOCK_MS: i64 = 54 * WINDOW_MS;

/// A started Prometheus, ready.
pub(super) async fn start(
    o: PrometheusOptions,
) -> anyhow::Result<(LocalPrometheus, reqwest::Client)> {
    let mut prom = LocalPrometheus::spawn(&o).with_context(|| format!("starting {}", o.binary))?;
    let http = reqwest::Client::new();
    let ready = format!("{}/-/ready", prom.url());
    prom.wait_ready(|| http.get(&ready), Duration::from_secs(120))
        .await
        .map_err(anyhow::Error::msg)?;
    Ok((prom, http))
}

/// Prometheus for the query comparison: its tools and a work directory.
pub(super) struct QueryPeer {
    pub prometheus: String,
    pub promtool: String,
    pub work: PathBuf,
}

/// One query compared: flopwatch's median and, with a peer, Prometheus'.
pub(super) struct QueryRow {
    pub label: String,
    pub flopwatch_ms: f64,
    pub prometheus_ms: Option<f64>,
}

/// One `OpenMetrics` sample line; values print round-trip exactly.
pub(super) fn om_sample(
    f: &mut impl Write,
    name: &str,
    labels: &str,
    ts_ms: i64,
    v: f64,
) -> std::io::Result<()> {
    writeln!(
        f,
        "{name}{{{labels}}} {v:?} {}.{:03}",
        ts_ms.div_euclid(1000),
        ts_ms.rem_euclid(1000)
    )
}

/// One GPU's OFU samples on their way into Prometheus: an OpenMetrics file
/// per 54-hour block, turned into a block by promtool when the next block
/// starts (promtool reads its input once per block it spans, so one file
/// per block reads each sample twice in all).
pub(super) struct OfuBlocks<'a> {
    peer: &'a QueryPeer,
    labels: String,
    open: Option<(i64, std::io::BufWriter<std::fs::File>)>,
    samples: u64,
}

impl<'a> OfuBlocks<'a> {
    pub(super) fn new(peer: &'a QueryPeer, uuid: &str, job: &str) -> anyhow::Result<Self> {
        let _ = std::fs::remove_dir_all(&peer.work);
        std::fs::create_dir_all(&peer.work)?;
        Ok(Self {
            peer,
            labels: format!("UUID=\"{uuid}\",job_id=\"{job}\""),
            open: None,
            samples: 0,
        })
    }

    fn om_path(&self) -> PathBuf {
        self.peer.work.join("block.om")
    }

    fn tsdb(&self) -> PathBuf {
        self.peer.work.join("tsdb")
    }

    /// Appends samples (in time order).
    pub(super) fn add(&mut self, samples: &[OfuSample]) -> anyhow::Result<()> {
        for s in samples {
            let block = s.ts_ms.div_euclid(BLOCK_MS);
            if self.open.as_ref().is_some_and(|(b, _)| *b != block) {
                self.seal()?;
            }
            if self.open.is_none() {
                let mut f = std::io::BufWriter::new(std::fs::File::create(self.om_path())?);
                writeln!(f, "# TYPE {OFU_NAME} gauge")?;
                self.open = Some((block, f));
            }
            let (_, f) = self.open.as_mut().expect("opened above");
            om_sample(f, OFU_NAME, &self.labels, s.ts_ms, s.ofu)?;
            self.samples += 1;
        }
        Ok(())
    }

    /// Turns the open file into a block.
    fn seal(&mut self) -> anyhow::Result<()> {
        if let Some((_, mut f)) = self.open.take() {
            writeln!(f, "# EOF")?;
            f.flush()?;
            drop(f);
            create_blocks(&self.peer.promtool, &self.om_path(), &self.tsdb(), "54h")
                .map_err(anyhow::Error::msg)?;
            std::fs::remove_file(self.om_path())?;
        }
        Ok(())
    }

    /// Seals the last block; Prometheus' TSDB directory and its samples.
    pub(super) fn finish(mut self) -> anyhow::Result<(PathBuf, u64)> {
        self.seal()?;
        Ok((self.tsdb(), self.samples))
    }
}

/// A Prometheus serving the blocks in `tsdb`, kept `days` (and more).
pub(super) async fn serve_blocks(
    peer: &QueryPeer,
    tsdb: &Path,
    days: i64,
) -> anyhow::Result<(LocalPrometheus, reqwest::Client)> {
    start(PrometheusOptions {
        binary: peer.prometheus.clone(),
        tsdb: tsdb.to_path_buf(),
        args: vec![format!("--storage.tsdb.retention.time={}d", days + 5)],
        ..PrometheusOptions::new(&peer.work, free_port())
    })
    .await
}

/// `query_range` of `q` from `start_ms` to `end_ms` (inclusive) at
/// `step_ms` against the Prometheus API at `url` (Prometheus' or the
/// collector's), `runs` times: the times in ms (sorted) and the last
/// answer's points (unix ms, value) of its one series.
pub(super) async fn query_range(
    http: &reqwest::Client,
    url: &str,
    q: &str,
    (start_ms, end_ms, step_ms): (i64, i64, i64),
    runs: usize,
) -> anyhow::Result<(Vec<f64>, Vec<(i64, f64)>)> {
    let secs = |ms: i64| format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000));
    let mut times = Vec::new();
    let mut points = Vec::new();
    for _ in 0..runs {
        let t = Stopwatch::start();
        let r = http
            .get(format!("{url}/api/v1/query_range"))
            .query(&[
                ("query", q.to_string()),
                ("start", secs(start_ms)),
                ("end", secs(end_ms)),
                ("step", secs(step_ms)),
            ])
            .send()
            .await?;
        let status = r.status();
        let text = r.text().await?;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        if !status.is_success() {
            bail!("query_range `{q}` at {url}: {status}: {text}");
        }
        let v: serde_json::Value = serde_json::from_str(&text)?;
        let result = v["data"]["result"].as_array().cloned().unwrap_or_default();
        let [series] = &result[..] else {
            bail!(
                "query_range `{q}` at {url}: {} series, not one",
                result.len()
            );
        };
        points = series["values"]
            .as_array()
            .map(|vs| {
                vs.iter()
                    .filter_map(|p| {
                        let ts = p[0].as_f64()?;
                        let v = p[1].as_str()?.parse::<f64>().ok()?;
                        Some(((ts * 1000.0).round() as i64, v))
                    })
                    .collect()
            })
            .unwrap_or_default();
    }
    times.sort_by(|a, b| a.total_cmp(b));
    Ok((times, points))
}
