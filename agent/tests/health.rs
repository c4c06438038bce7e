//! `/healthz` and `/readyz` on the agent's metrics listener, against the
//! fake `libnvidia-ml.so`: ready once a capture is read, and not live once
//! an NVML call hangs (`hang_after=0`), until the driver answers again.
//!
//! The probes are polled until they change; a bound on the wait only keeps a
//! broken build from hanging the test run.

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::FixedSampler;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{Agent, AgentOptions, Pacing};
use flopwatch_fake_nvml::{control, library_path};
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::model::NodeIdentity;
use std::sync::Arc;
use std::time::Duration;

/// Status code of `GET http://addr/path`.
async fn status(addr: std::net::SocketAddr, path: &str) -> u16 {
    let url = format!("http://{addr}{path}");
    tokio::task::spawn_blocking(move || {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        agent.get(&url).call().expect("GET").status().as_u16()
    })
    .await
    .expect("request task")
}

/// Polls `path` until it answers `want`; `Err` with the last answer if it
/// never does.
async fn until(addr: std::net::SocketAddr, path: &str, want: u16) -> Result<(), String> {
    let give_up = Deadline::after(Duration::from_secs(120));
    loop {
        let got = status(addr, path).await;
        if got == want {
            return Ok(());
        }
        if give_up.passed() {
            return Err(format!("{path} stayed {got}, not {want}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Both pacings: a capture hung in the driver holds the blocking pool's
/// thread or the sampling thread, never the runtime that serves the probes.
#[test]
fn a_hanging_nvml_call_fails_liveness_until_the_driver_answers() {
    // The one fake library of the process, held for the whole test.
    let _driver = crate::fake::hold();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    for pacing in [Pacing::Runtime, Pacing::Thread] {
        rt.block_on(hang_and_recover(pacing));
    }
}

async fn hang_and_recover(pacing: Pacing) {
    let path = library_path().expect("the fake NVML library is built next to this test");
    // The wall clock: the loop's capture interval is real time.
    control::set_time_ms(0).unwrap();
    control::configure("gpus=1").unwrap();
    let source = NvmlSource::open(Some(&path)).unwrap();
    let interval = Duration::from_millis(10);
    let agent = Agent::start(
        Box::new(source),
        Box::new(FixedSampler::new(interval)),
        AgentOptions {
            drain_timeout: Duration::from_millis(50),
            pacing,
            // Nothing listens there: batches wait in the outbox.
            ..AgentOptions::new(
                NodeIdentity::named("n", "b"),
                vec!["http://127.0.0.1:9".into()],
            )
        },
        Arc::new(TokioClock::new()),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = Arc::new(flopwatch_agent::registry(&agent));
    // No floor: the limit is STALL_CAPTURES intervals.
    let probes = Arc::new(agent.health.probe(Duration::ZERO));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(flopwatch_transport::metrics_http::serve_with_probes(
        listener,
        registry,
        Some(probes),
        async move {
            let _ = stopped.await;
        },
    ));

    until(addr, "/readyz", 200).await.unwrap();
    assert_eq!(status(addr, "/healthz").await, 200);
    assert!(
        agent
            .stats
            .captures
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );

    // Every device query from now on blocks inside the driver.
    control::configure("gpus=1,hang_after=0").unwrap();
    let stalled = until(addr, "/healthz", 503).await;
    let ready_while_stuck = status(addr, "/readyz").await;
    let metrics_while_stuck = status(addr, "/metrics").await;
    // The driver answers again: the blocked capture returns, the loop goes
    // on (released before any assertion, so that a failure does not leave
    // the capture thread blocked and the test hanging).
    control::configure("gpus=1").unwrap();
    stalled.unwrap();
    assert_eq!(ready_while_stuck, 503, "a stuck agent is not ready");
    assert_eq!(metrics_while_stuck, 200, "the listener itself lives");
    until(addr, "/healthz", 200).await.unwrap();
    until(addr, "/readyz", 200).await.unwrap();

    agent.stop().await;
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
