//! A raw Ingest client, as a client written from `proto/` alone would
//! drive the protocol: Hello → Welcome, then batches and their answers.

use flopwatch_proto::v1::{
    self, agent_message, collector_message, ingest_client::IngestClient, AgentMessage,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// One agent stream.
pub struct RawAgent {
    tx: mpsc::Sender<AgentMessage>,
    inbound: tonic::Streaming<v1::CollectorMessage>,
}

/// A Hello for `node` with one H100 GPU `gpu`.
pub fn hello(node: &str, hostname: &str, gpu: &str) -> v1::Hello {
    v1::Hello {
        agent_id: node.into(),
        node: Some(v1::NodeIdentity {
            node_id: node.into(),
            hostname: hostname.into(),
            boot_id: "boot-1".into(),
            labels: Default::default(),
        }),
        gpus: vec![v1::GpuInfo {
            uuid: gpu.into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            ..Default::default()
        }],
        protocol_version: 1,
        ..Default::default()
    }
}

/// A batch of `n` samples at 100 ms from `t0` of tensor activity `tpa`,
/// a 1830 MHz clock and power `power_w` on `gpu`, run by `job` when given.
pub fn batch(
    seq: u64,
    gpu: &str,
    t0: i64,
    n: usize,
    tpa: f64,
    power_w: f64,
    job: Option<&str>,
) -> v1::Batch {
    let ts: Vec<i64> = (0..n as i64).map(|i| t0 + i * 100).collect();
    let series = |metric: &str, v: f64| v1::Series {
        gpu_uuid: gpu.into(),
        metric: metric.into(),
        timestamps_ms: ts.clone(),
        values: vec![v; n],
        window_ms: vec![100; n],
        ..Default::default()
    };
    v1::Batch {
        seq,
        series: vec![
            series("tensor_active", tpa),
            series("sm_clock_avg_mhz", 1830.0),
            series("power_w", power_w),
        ],
        jobs: job
            .map(|j| {
                vec![v1::JobAssignment {
                    gpu_uuid: gpu.into(),
                    job_id: j.into(),
                    // The job held the GPU from the batch's first sample.
                    since_ms: t0,
                    ..Default::default()
                }]
            })
            .unwrap_or_default(),
        ..Default::default()
    }
}

impl RawAgent {
    /// Opens a stream on `channel` with `token` (as `authorization`
    /// metadata) and `hello`; the Welcome, or the status that refused it.
    pub async fn open(
        channel: Channel,
        token: Option<&str>,
        hello: v1::Hello,
    ) -> Result<(RawAgent, v1::Welcome), tonic::Status> {
        let mut client = IngestClient::new(channel);
        let (tx, rx) = mpsc::channel(16);
        tx.send(AgentMessage {
            msg: Some(agent_message::Msg::Hello(hello)),
        })
        .await
        .map_err(|_| tonic::Status::internal("local channel closed"))?;
        let mut req = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(t) = token {
            let v = format!("Bearer {t}")
                .parse()
                .map_err(|_| tonic::Status::invalid_argument("token is not header text"))?;
            req.metadata_mut().insert("authorization", v);
        }
        let mut inbound = client.stream(req).await?.into_inner();
        match inbound.message().await?.and_then(|m| m.msg) {
            Some(collector_message::Msg::Welcome(w)) => Ok((RawAgent { tx, inbound }, w)),
            other => Err(tonic::Status::internal(format!(
                "expected a Welcome, got {other:?}"
            ))),
        }
    }

    /// Sends `b` without waiting.
    pub async fn send(&self, b: v1::Batch) {
        let _ = self
            .tx
            .send(AgentMessage {
                msg: Some(agent_message::Msg::Batch(b)),
            })
            .await;
    }

    /// The next answer, or the status that ended the stream.
    pub async fn next(&mut self) -> Result<collector_message::Msg, tonic::Status> {
        match self.inbound.message().await? {
            Some(v1::CollectorMessage { msg: Some(m) }) => Ok(m),
            _ => Err(tonic::Status::unavailable("stream ended")),
        }
    }

    /// Sends `b` and waits for its answer.
    pub async fn call(&mut self, b: v1::Batch) -> Result<collector_message::Msg, tonic::Status> {
        self.send(b).await;
        self.next().await
    }
}
