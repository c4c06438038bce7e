//! A dcgm-exporter that starts after the agent, fails, and comes back, as a
//! DaemonSet's two containers do: the agent is started the way
//! `flopwatch agent` starts it ([`Agent::start_opening`] with
//! `source::open`, the sampler wrapped in [`RefreshPaced`]), with short
//! backoff, against a local HTTP server that first refuses connections,
//! then answers 500, then serves a dcgm-exporter page whose values refresh
//! every 500 ms.
//!
//! The test runs on the wall clock (real HTTP); the probes and `/metrics`
//! are polled until they change, and a bound on each wait only keeps a
//! broken build from hanging the run.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use flopwatch_agent::source::{self, GpuSource};
use flopwatch_agent::{
    Agent, AgentOptions, DeliveryOptions, FixedSampler, OpenSource, Pacing, RefreshPaced,
    RetryOptions, SamplerFor, StartError, TokioClock,
};
use flopwatch_config::{AgentConfig, SourceKind};
use flopwatch_proto::clock::{Deadline, Stopwatch};
use flopwatch_proto::model::NodeIdentity;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const UUID0: &str = "GPU-5d4f6a0e-2c3b-8f61-07a4-1e9c2b6d3f70";
const UUID1: &str = "GPU-a83c1f92-6b7e-4d05-9c18-3f2e7d6a1b44";

/// How often the stand-in's values change, ms.
const REFRESH_MS: u64 = 500;

/// A dcgm-exporter page (Kubernetes mode, two A100s) whose energy counter,
/// power and tensor activity have moved `version` times.
fn page(version: u64) -> String {
    let v = version as f64;
    let mut out = String::new();
    let fields: [(&str, &str, &str, [f64; 2]); 6] = [
        (
            "DCGM_FI_DEV_SM_CLOCK",
            "gauge",
            "SM clock frequency (in MHz).",
            [1410.0, 210.0],
        ),
        (
            "DCGM_FI_DEV_POWER_USAGE",
            "gauge",
            "Power draw (in W).",
            [300.0 + v % 17.0, 61.204],
        ),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            "Total energy consumption since boot (in mJ).",
            [8_123_456_789.0 + 90_000.0 * v, 2_222_000.0 + 18_000.0 * v],
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL",
            "gauge",
            "GPU utilization (in %).",
            [87.0, 0.0],
        ),
        (
            "DCGM_FI_DEV_FB_USED",
            "gauge",
            "Framebuffer memory used (in MiB).",
            [60500.0, 0.0],
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            [0.4 + (v % 10.0) / 100.0, 0.0],
        ),
    ];
    for (field, kind, help, values) in fields {
        out.push_str(&format!("# HELP {field} {help}\n# TYPE {field} {kind}\n"));
        for (g, (uuid, pod)) in [(UUID0, "trainer-0"), (UUID1, "")].iter().enumerate() {
            let ns = if pod.is_empty() { "" } else { "ml-team" };
            out.push_str(&format!(
                "{field}{{gpu=\"{g}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{g}\",\
                 modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-7\",DCGM_FI_DRIVER_VERSION=\"550.90.07\",\
                 container=\"\",namespace=\"{ns}\",pod=\"{pod}\"}} {}\n",
                0x07 + g * 0x40,
                values[g]
            ));
        }
    }
    out
}

/// What the stand-in answers: 500, or the page.
#[derive(Default)]
struct Shared {
    status: AtomicU16,
    requests: AtomicUsize,
}

/// A dcgm-exporter stand-in; its port is reserved before it listens, so
/// that the agent first meets a refused connection.
struct Exporter {
    shared: Arc<Shared>,
    port: u16,
    started: Stopwatch,
}

impl Exporter {
    /// A port nothing listens on yet.
    fn reserve() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let shared = Arc::new(Shared::default());
        shared.status.store(500, Ordering::SeqCst);
        Self {
            shared,
            port,
            started: Stopwatch::start(),
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.port)
    }

    /// Starts listening (answering 500 until [`Exporter::answer`]).
    async fn listen(&self) {
        let app = Router::new()
            .route("/metrics", get(metrics))
            .with_state((self.shared.clone(), self.started));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", self.port))
            .await
            .expect("the reserved port is still free");
        tokio::spawn(async move { axum::serve(listener, app).await });
    }

    fn answer(&self, status: u16) {
        self.shared.status.store(status, Ordering::SeqCst);
    }

    fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

async fn metrics(
    State((shared, started)): State<(Arc<Shared>, Stopwatch)>,
) -> (StatusCode, String) {
    shared.requests.fetch_add(1, Ordering::SeqCst);
    match shared.status.load(Ordering::SeqCst) {
        200 => {
            let version = started.elapsed().as_millis() as u64 / REFRESH_MS;
            (StatusCode::OK, page(version))
        }
        _ => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "DCGM is not ready\n".to_string(),
        ),
    }
}

/// `GET http://addr/path`: status and body.
async fn get_page(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let url = format!("http://{addr}{path}");
    tokio::task::spawn_blocking(move || {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .build()
            .new_agent();
        let mut r = agent.get(&url).call().expect("GET");
        let status = r.status().as_u16();
        (status, r.body_mut().read_to_string().unwrap_or_default())
    })
    .await
    .expect("request task")
}

/// Polls `path` until `want` holds of its answer; the last answer if it
/// never does.
async fn until(
    addr: std::net::SocketAddr,
    path: &str,
    want: impl Fn(u16, &str) -> bool,
) -> Result<(u16, String), (u16, String)> {
    let give_up = Deadline::after(Duration::from_secs(60));
    loop {
        let (status, body) = get_page(addr, path).await;
        if want(status, &body) {
            return Ok((status, body));
        }
        if give_up.passed() {
            return Err((status, body));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of an unlabelled sample on a `/metrics` page.
fn sample(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// What `flopwatch agent` opens for `dcgm-exporter:URL`, without the
/// host's node counters.
fn opener(url: &str) -> OpenSource {
    let kind: SourceKind = format!("dcgm-exporter:{url}").parse().unwrap();
    let mut cfg = AgentConfig::default();
    cfg.host.infiniband = false;
    cfg.host.cpu_memory = false;
    Box::new(move |now| source::open(&kind, &cfg, now))
}

/// A fixed 20 ms sampler following the page's refresh within 50 ms–2 s.
fn paced() -> SamplerFor {
    Box::new(|source: &dyn GpuSource| {
        Box::new(RefreshPaced::with_bounds(
            Box::new(FixedSampler::new(Duration::from_millis(20))),
            source.inventory().len(),
            Duration::from_millis(50),
            Duration::from_secs(2),
        )) as Box<dyn flopwatch_agent::Sampler>
    })
}

fn retry() -> RetryOptions {
    RetryOptions {
        first: Duration::from_millis(50),
        cap: Duration::from_millis(200),
        seed: 7,
        remind_every: Duration::from_secs(1),
    }
}

fn start(url: &str) -> Result<Agent, StartError> {
    Agent::start_opening(
        opener(url),
        paced(),
        AgentOptions {
            drain_timeout: Duration::from_millis(50),
            pacing: Pacing::Thread,
            // Nothing listens there: batches wait in the outbox.
            ..AgentOptions::new(
                NodeIdentity::named("gpu-node-7", "b"),
                vec!["http://127.0.0.1:9".into()],
            )
        },
        flopwatch_agent::attribution::AttributionOptions::disabled(),
        Arc::new(TokioClock::new()),
        DeliveryOptions::default(),
        retry(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exporter_that_starts_late_then_fails_and_recovers() {
    let exporter = Exporter::reserve();
    let agent = start(&exporter.url()).expect("a refused connection does not stop the start");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let registry = Arc::new(flopwatch_agent::registry(&agent));
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

    // Refused: live, not ready with the reason, the source down.
    let (_, why) = get_page(addr, "/readyz").await;
    assert!(
        why.contains("source not ready") && why.contains(&exporter.url()),
        "{why}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(get_page(addr, "/healthz").await.0, 200);
    assert_eq!(get_page(addr, "/readyz").await.0, 503);
    assert!(!agent.source_opened());

    // Listening, answering 500: still retried.
    exporter.listen().await;
    let (_, why) = until(addr, "/readyz", |_, b| b.contains("HTTP status 500"))
        .await
        .unwrap();
    assert!(why.contains("source not ready"), "{why}");
    assert!(exporter.requests() > 0);
    let (_, m) = get_page(addr, "/metrics").await;
    assert_eq!(sample(&m, "flopwatch_agent_source_up"), Some(0.0), "{m}");
    let open_errors = sample(&m, "flopwatch_agent_source_open_errors_total").unwrap();
    assert!(open_errors >= 2.0, "{m}");
    assert_eq!(
        get_page(addr, "/healthz").await.0,
        200,
        "waiting is no stall"
    );

    // The page: it opens, captures, becomes ready.
    exporter.answer(200);
    until(addr, "/readyz", |s, _| s == 200).await.unwrap();
    assert!(agent.source_opened());
    let (_, m) = until(addr, "/metrics", |_, b| {
        sample(b, "flopwatch_agent_captures_total").is_some_and(|n| n >= 3.0)
    })
    .await
    .unwrap();
    assert_eq!(sample(&m, "flopwatch_agent_source_up"), Some(1.0), "{m}");

    // Captures follow the page's 500 ms refresh (0.9 × it, give or take
    // the loop's own delays), not the 20 ms interval nor the 50 ms of
    // learning.
    let (_, m) = until(addr, "/metrics", |_, b| {
        sample(b, "flopwatch_agent_capture_interval_seconds").is_some_and(|s| s >= 0.1)
    })
    .await
    .unwrap();
    let every = sample(&m, "flopwatch_agent_capture_interval_seconds").unwrap();
    assert!((0.1..=0.6).contains(&every), "capturing every {every} s");

    // Failing captures: not ready (three in a row), then ready again.
    exporter.answer(500);
    let (_, why) = until(addr, "/readyz", |s, _| s == 503).await.unwrap();
    assert!(
        why.contains("source failing") && why.contains("500"),
        "{why}"
    );
    assert_eq!(
        get_page(addr, "/healthz").await.0,
        200,
        "failing is no stall"
    );
    let (_, m) = get_page(addr, "/metrics").await;
    assert_eq!(sample(&m, "flopwatch_agent_source_up"), Some(0.0), "{m}");
    assert!(sample(&m, "flopwatch_agent_capture_errors_total").is_some_and(|n| n >= 3.0));
    exporter.answer(200);
    until(addr, "/readyz", |s, _| s == 200).await.unwrap();

    agent.stop().await;
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

/// Stopping an agent that still waits for its source ends the wait at
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_waiting_for_its_source_stops_at_once() {
    let exporter = Exporter::reserve();
    let agent = Agent::start_opening(
        opener(&exporter.url()),
        paced(),
        AgentOptions::new(
            NodeIdentity::named("gpu-node-7", "b"),
            vec!["http://127.0.0.1:9".into()],
        ),
        flopwatch_agent::attribution::AttributionOptions::disabled(),
        Arc::new(TokioClock::new()),
        DeliveryOptions::default(),
        RetryOptions {
            first: Duration::from_secs(3600),
            cap: Duration::from_secs(3600),
            ..retry()
        },
    )
    .expect("started, waiting");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Stopwatch::start();
    agent.stop().await;
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
}

/// A source that retrying cannot fix still fails the start, with the
/// error.
#[tokio::test]
async fn a_bad_url_still_fails_at_once() {
    let Err(StartError::Source(e)) = start("https://127.0.0.1:9400/metrics") else {
        panic!("an https URL must fail the start");
    };
    assert!(
        e.to_string().contains("scheme `https` is not supported"),
        "{e}"
    );
}
