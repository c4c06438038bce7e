//! `Pacing::Thread` on the single-threaded runtime a node runs: the
//! captures go on at the interval on their own thread, and a capture
//! blocked in the driver holds that thread only; the runtime goes on
//! (its timers fire, its tasks run), and the loop resumes once the
//! capture returns.
//!
//! Real time, short intervals: waits are bounded polls, so a broken build
//! fails rather than hangs.

use flopwatch_agent::source::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use flopwatch_agent::{Agent, AgentOptions, FixedSampler, Pacing, TokioClock};
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::model::{GpuInfo, NodeIdentity};
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

/// One GPU; its third capture waits for the gate to open.
struct Gated {
    inventory: Vec<GpuInfo>,
    captures: u32,
    entered: tokio::sync::mpsc::UnboundedSender<std::thread::ThreadId>,
    gate: mpsc::Receiver<()>,
}

impl GpuSource for Gated {
    fn name(&self) -> &'static str {
        "gated"
    }

    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        self.captures += 1;
        if self.captures == 3 {
            let _ = self.entered.send(std::thread::current().id());
            let _ = self.gate.recv_timeout(Duration::from_secs(60));
        }
        Ok(Capture {
            ts_ms: now_ms,
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 10,
                readings: vec![Reading::new(flopwatch_proto::metrics::TENSOR_ACTIVE, 0.5)],
            }],
            ..Default::default()
        })
    }
}

/// Polls until `f` holds; panics after 30 s.
async fn until(what: &str, f: impl Fn() -> bool) {
    let give_up = Deadline::after(Duration::from_secs(30));
    while !f() {
        assert!(!give_up.passed(), "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_blocked_capture_holds_the_sampling_thread_not_the_runtime() {
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let (open, gate) = mpsc::channel();
    let agent = Agent::start(
        Box::new(Gated {
            inventory: vec![GpuInfo {
                uuid: "GPU-0".into(),
                ..Default::default()
            }],
            captures: 0,
            entered: entered_tx,
            gate,
        }),
        Box::new(FixedSampler::new(Duration::from_millis(10))),
        AgentOptions {
            drain_timeout: Duration::from_millis(50),
            pacing: Pacing::Thread,
            // Nothing listens there: batches wait in the outbox.
            ..AgentOptions::new(
                NodeIdentity::named("n", "b"),
                vec!["http://127.0.0.1:9".into()],
            )
        },
        Arc::new(TokioClock::new()),
    );
    let captures = || agent.stats.captures.load(Ordering::Relaxed);

    let blocked_on = tokio::time::timeout(Duration::from_secs(30), entered.recv())
        .await
        .expect("the third capture starts")
        .unwrap();
    assert_ne!(
        blocked_on,
        std::thread::current().id(),
        "the capture runs off the runtime's thread"
    );
    // The capture is blocked: the runtime's own timers still fire, many
    // capture intervals over, and no capture returns meanwhile.
    let before = captures();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        captures(),
        before,
        "no capture returns while one is blocked"
    );
    assert!(agent.health.since_progress() >= Duration::from_millis(100));

    open.send(()).unwrap();
    until("captures resume", || captures() >= before + 5).await;
    let outbox = agent.outbox.clone();
    agent.stop().await;
    let taken = agent_samples(&outbox);
    assert!(taken >= 7, "every returned capture is batched: {taken}");
}

/// Samples of the tensor series in what the outbox holds.
fn agent_samples(outbox: &flopwatch_agent::Outbox) -> usize {
    outbox
        .next_to_send(usize::MAX)
        .iter()
        .flat_map(|b| &b.series)
        .map(|s| s.timestamps_ms.len())
        .sum()
}
