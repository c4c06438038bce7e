//! One refresh of `flopwatch top`: the lists and the OFU answers it shows,
//! asked concurrently over one HTTP/2 channel.
//!
//! Per refresh: ListNodes, ListGpus, ListJobs, two fleet OFU calls (the
//! window, and `--since` bucketed for the sparkline), then one OFU call per
//! node, per job and per GPU over the window — each capped at
//! [`MAX_PER_KIND`], so a large fleet costs at most ~200 small calls.

use super::model::Responses;
use flopwatch_proto::v1::{self, ofu_request::Scope};
use futures::future::join_all;
use std::time::Duration;

/// Most nodes, jobs and GPUs whose OFU one refresh asks for, each.
pub(super) const MAX_PER_KIND: usize = 64;
/// A step wider than any window: the answer is one bucket, whose point
/// carries the window's tensor activity and SM clock beside the summary.
const ONE_BUCKET_MS: i64 = 86_400_000;
/// Buckets of the fleet sparkline over `--since`.
const SPARK_POINTS: i64 = 120;

/// The collector's Query service.
pub(super) struct Source {
    url: String,
    client: crate::conn::Client,
}

/// What to ask for, at which time (time is passed in, not read here).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ask {
    /// Now, unix ms.
    pub now_ms: i64,
    /// The "now" window of the summaries, ms.
    pub window_ms: i64,
    /// Range of the sparkline and of the lists, ms.
    pub since_ms: i64,
}

enum Key {
    Node(String),
    Job(String),
    Gpu(String),
}

impl Source {
    /// A channel that connects on first use and reconnects by itself after
    /// the collector comes back. Fails only on a malformed URL or token.
    pub(super) fn new(conn: &crate::conn::ConnArgs, timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self {
            url: conn.collector.clone(),
            client: conn.lazy(timeout)?,
        })
    }

    /// Says why a call failed, naming the collector.
    fn describe(&self, s: &tonic::Status) -> String {
        let mut msg = s.message().to_string();
        let mut source = std::error::Error::source(s);
        while let Some(e) = source {
            let text = e.to_string();
            if !msg.contains(&text) {
                msg = format!("{msg}: {text}");
            }
            source = e.source();
        }
        match s.code() {
            tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled => {
                format!("collector unreachable: {}: {msg}", self.url)
            }
            code => format!("collector {} answered {code:?}: {msg}", self.url),
        }
    }

    fn ofu_request(scope: Scope, start_ms: i64, step_ms: i64) -> v1::OfuRequest {
        v1::OfuRequest {
            scope: Some(scope),
            start_ms,
            end_ms: 0,
            step_ms,
        }
    }

    /// Every answer one frame needs; an error names the collector when the
    /// lists cannot be had. A failed per-scope call only leaves its row
    /// without a figure.
    pub(super) async fn fetch(&self, ask: Ask) -> Result<Responses, String> {
        let list = v1::ListRequest {
            since_ms: ask.now_ms - ask.since_ms,
        };
        let window_start = ask.now_ms - ask.window_ms;
        let spark_step = (ask.since_ms / SPARK_POINTS).max(1000);
        // Buckets on multiples of the step, so they hold still between
        // refreshes instead of sliding with `now`.
        let spark_start = (ask.now_ms - ask.since_ms).div_euclid(spark_step) * spark_step;
        let (mut c1, mut c2, mut c3, mut c4, mut c5) = (
            self.client.clone(),
            self.client.clone(),
            self.client.clone(),
            self.client.clone(),
            self.client.clone(),
        );
        let (nodes, gpus, jobs, fleet_now, fleet_series) = tokio::join!(
            c1.list_nodes(list),
            c2.list_gpus(list),
            c3.list_jobs(list),
            c4.ofu(Self::ofu_request(
                Scope::Fleet(true),
                window_start,
                ONE_BUCKET_MS
            )),
            c5.ofu(Self::ofu_request(
                Scope::Fleet(true),
                spark_start,
                spark_step
            )),
        );
        let nodes = nodes.map_err(|s| self.describe(&s))?.into_inner().nodes;
        let gpus = gpus.map_err(|s| self.describe(&s))?.into_inner().gpus;
        let jobs = jobs.map_err(|s| self.describe(&s))?.into_inner().jobs;

        let mut keys: Vec<(Key, Scope)> = Vec::new();
        for n in nodes.iter().take(MAX_PER_KIND) {
            keys.push((
                Key::Node(n.node_id.clone()),
                Scope::NodeId(n.node_id.clone()),
            ));
        }
        let mut seen_jobs = std::collections::BTreeSet::new();
        for j in &jobs {
            if seen_jobs.len() < MAX_PER_KIND && seen_jobs.insert(j.job_id.clone()) {
                keys.push((Key::Job(j.job_id.clone()), Scope::JobId(j.job_id.clone())));
            }
        }
        let gpus_queried = gpus.len().min(MAX_PER_KIND);
        for g in gpus.iter().take(MAX_PER_KIND) {
            let uuid = g.info.as_ref().map(|i| i.uuid.clone()).unwrap_or_default();
            keys.push((Key::Gpu(uuid.clone()), Scope::GpuUuid(uuid)));
        }
        let answers = join_all(keys.into_iter().map(|(key, scope)| {
            let mut c = self.client.clone();
            let req = Self::ofu_request(scope, window_start, ONE_BUCKET_MS);
            async move { (key, c.ofu(req).await) }
        }))
        .await;

        let mut r = Responses {
            nodes,
            gpus,
            jobs,
            fleet_now: fleet_now.ok().map(|x| x.into_inner()),
            fleet_series: fleet_series.ok().map(|x| x.into_inner()),
            gpus_queried,
            ..Responses::default()
        };
        for (key, answer) in answers {
            let Ok(answer) = answer else { continue };
            let answer = answer.into_inner();
            match key {
                Key::Node(k) => r.node_ofu.insert(k, answer),
                Key::Job(k) => r.job_ofu.insert(k, answer),
                Key::Gpu(k) => r.gpu_ofu.insert(k, answer),
            };
        }
        Ok(r)
    }
}
