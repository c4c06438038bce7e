//! How many batches the agent cuts: a backed-off adaptive sampler's agent
//! sends a batch per sampling interval (at most one per 10 s), not one per
//! second holding almost nothing (agent/src/batcher.rs, "When a batch is
//! cut").

use flopwatch_agent::source::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use flopwatch_agent::{AdaptiveSampler, Agent, AgentOptions, FixedSampler, Sampler, TokioClock};
use flopwatch_config::SamplingConfig;
use flopwatch_proto::model::{GpuInfo, NodeIdentity};
use std::sync::Arc;
use std::time::Duration;

/// One GPU in a steady state: the OFU inputs and power, constant.
struct Steady {
    inventory: Vec<GpuInfo>,
}

impl GpuSource for Steady {
    fn name(&self) -> &'static str {
        "steady"
    }

    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        Ok(Capture {
            ts_ms: now_ms,
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 100,
                readings: vec![
                    Reading::new("tensor_active", 0.6),
                    Reading::new("sm_clock_avg_mhz", 1_400.0),
                    Reading::new("sm_clock_mhz", 1_400.0),
                    Reading::new("power_w", 550.0),
                ],
            }],
            ..Default::default()
        })
    }
}

/// Batches and samples an offline agent (nothing listens at its
/// collector's address) queued in `secs` seconds of paused time.
async fn batches(sampler: Box<dyn Sampler>, secs: u64) -> (usize, u64) {
    let agent = Agent::start(
        Box::new(Steady {
            inventory: vec![GpuInfo {
                uuid: "GPU-0".into(),
                ..Default::default()
            }],
        }),
        sampler,
        AgentOptions {
            max_in_flight: 10_000,
            drain_timeout: Duration::from_millis(100),
            ..AgentOptions::new(
                NodeIdentity::named("n", "b"),
                vec!["http://127.0.0.1:9".into()],
            )
        },
        Arc::new(TokioClock::starting_at(1_800_000_000_000)),
    );
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let outbox = agent.outbox.clone();
    let stats = agent.stats.clone();
    agent.stop().await;
    (
        outbox.len(),
        stats.samples.load(std::sync::atomic::Ordering::Relaxed),
    )
}

#[tokio::test(start_paused = true)]
async fn a_backed_off_agent_sends_fewer_batches() {
    let (fixed, _) = batches(Box::new(FixedSampler::new(Duration::from_millis(100))), 300).await;
    let cfg = SamplingConfig {
        adaptive: true,
        ..Default::default()
    };
    let (adaptive, samples) = batches(Box::new(AdaptiveSampler::new(&cfg, 1)), 300).await;
    // Fixed 100 ms: a batch per flush interval (1 s).
    assert!((299..=302).contains(&fixed), "fixed: {fixed} batches");
    // Backed off: after the first half minute, one per sampling interval
    // (30 s, its points held at most 10 s) and an empty one per 10 s between
    // (37 in 300 s when written).
    assert!(samples > 0);
    assert!(
        adaptive * 5 < fixed,
        "adaptive: {adaptive} batches, fixed: {fixed}"
    );
    assert!(adaptive >= 300 / 10, "adaptive: {adaptive} batches");
}
