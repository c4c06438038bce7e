//! GPM refused by the driver (`gpm_permission=denied` in the fake
//! `libnvidia-ml.so`), as for an agent in a container without
//! `CAP_SYS_ADMIN`: captures go on without the GPM metrics (absent, not
//! zeros), one warning names the fix, and the agent's `/metrics` shows
//! which GPUs are refused.
//!
//! They share the one library this process loads with the other NVML
//! tests: each holds it ([`crate::fake::hold`]).

use flopwatch_agent::source::nvml::{NvmlSource, GPM_DENIED_HELP};
use flopwatch_agent::source::{Capture, GpuSource};
use flopwatch_agent::{Agent, AgentOptions, FixedSampler, TokioClock};
use flopwatch_fake_nvml::{control, library_path};
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::NodeIdentity;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

const T0: i64 = 1_700_000_000_000;

/// The metrics only GPM gives (tensor activity is OFU's input).
const GPM_ONLY: [&str; 7] = [
    m::TENSOR_ACTIVE,
    m::SM_ACTIVE,
    m::SM_OCCUPANCY,
    m::DRAM_ACTIVE,
    m::FP16_ACTIVE,
    m::FP32_ACTIVE,
    m::FP64_ACTIVE,
];

fn has(c: &Capture, gpu: usize, metric: &str) -> bool {
    c.gpus[gpu].readings.iter().any(|r| r.metric == metric)
}

/// Everything logged, as text.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

#[test]
fn refused_gpm_leaves_the_rest_and_is_said_once() {
    let _guard = crate::fake::hold();
    let path = library_path().expect("the fake NVML library is built next to this test");
    let t1 = T0 + 10_000;
    control::set_time_ms(t1).unwrap();
    control::configure(&format!("start_ms={T0},gpus=2,gpm_permission=denied")).unwrap();
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::DEBUG)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        let mut source = NvmlSource::open(Some(&path)).unwrap();
        // The GPU supports GPM; only this process may not use it.
        assert!(source.inventory().iter().all(|g| g.gpm_supported));

        let mut captures = Vec::new();
        for t in [t1, t1 + 1_000, t1 + 2_000] {
            control::set_time_ms(t).unwrap();
            captures.push(source.capture(t).unwrap());
            assert_eq!(source.gpm_permission_denied(), [true, true]);
        }
        for (i, c) in captures.iter().enumerate() {
            for g in 0..2 {
                for metric in GPM_ONLY {
                    assert!(!has(c, g, metric), "capture {i} gpu {g}: {metric}");
                }
                for metric in [m::SM_CLOCK_MHZ, m::POWER_W, m::TEMP_C, m::MEM_USED_BYTES] {
                    assert!(has(c, g, metric), "capture {i} gpu {g}: no {metric}");
                }
                if i > 0 {
                    // Windowed reads, and throughput from the non-GPM calls.
                    for metric in [
                        m::SM_CLOCK_AVG_MHZ,
                        m::GPU_UTIL,
                        m::NVLINK_TX_BYTES_S,
                        m::PCIE_RX_BYTES_S,
                    ] {
                        assert!(has(c, g, metric), "capture {i} gpu {g}: no {metric}");
                    }
                }
            }
        }

        // Permission granted: GPM comes back (a window needs two samples).
        control::configure(&format!("start_ms={T0},gpus=2")).unwrap();
        let t = t1 + 3_000;
        control::set_time_ms(t).unwrap();
        source.capture(t).unwrap();
        assert_eq!(source.gpm_permission_denied(), [false, false]);
        control::set_time_ms(t + 1_000).unwrap();
        let back = source.capture(t + 1_000).unwrap();
        assert!(has(&back, 0, m::TENSOR_ACTIVE) && has(&back, 1, m::TENSOR_ACTIVE));
    });
    let text = logs.text();
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("NO_PERMISSION"))
        .collect();
    assert_eq!(warnings.len(), 1, "{text}");
    let w = warnings[0];
    assert!(w.contains("WARN") && w.contains(GPM_DENIED_HELP), "{w}");
    for fix in [
        "securityContext.capabilities",
        "AmbientCapabilities=CAP_SYS_ADMIN",
        "dcgm-exporter",
    ] {
        assert!(w.contains(fix), "{fix} missing from {w}");
    }
}

/// The value of `family{UUID="uuid"}` on the page, if it is there.
fn gauge(page: &str, family: &str, uuid: &str) -> Option<f64> {
    let prefix = format!("{family}{{UUID=\"{uuid}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn metrics_show_which_gpus_are_refused() {
    // The library is held for the whole runtime, not across its awaits.
    let _guard = crate::fake::hold();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(refused_gpus_on_metrics());
}

async fn refused_gpus_on_metrics() {
    let path = library_path().expect("the fake NVML library is built next to this test");
    // The wall clock: the loop's capture interval is real time.
    control::set_time_ms(0).unwrap();
    control::configure("gpus=2,gpm_permission=denied").unwrap();
    let source = NvmlSource::open(Some(&path)).unwrap();
    let uuids: Vec<String> = source.inventory().iter().map(|g| g.uuid.clone()).collect();
    let agent = Agent::start(
        Box::new(source),
        Box::new(FixedSampler::new(Duration::from_millis(10))),
        AgentOptions {
            drain_timeout: Duration::from_millis(50),
            // Nothing listens there: batches wait in the outbox.
            ..AgentOptions::new(
                NodeIdentity::named("n", "b"),
                vec!["http://127.0.0.1:9".into()],
            )
        },
        Arc::new(TokioClock::new()),
    );
    let registry = flopwatch_agent::registry(&agent);
    let family = "flopwatch_agent_gpm_permission_denied";
    // Polled until a capture is in; the bound only keeps a broken build
    // from hanging the run.
    let give_up = Deadline::after(Duration::from_secs(120));
    // The page is encoded after a capture is counted, never before.
    while agent.stats.captures.load(Ordering::Acquire) == 0 && !give_up.passed() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut page = String::new();
    prometheus_client::encoding::text::encode(&mut page, &registry).unwrap();
    agent.stop().await;
    control::configure("gpus=2").unwrap();
    assert!(page.contains(&format!("# TYPE {family} gauge")), "{page}");
    for uuid in &uuids {
        assert_eq!(gauge(&page, family, uuid), Some(1.0), "{uuid}: {page}");
    }
}

/// A dcgm-exporter stand-in: answers every request with `body`, one
/// connection at a time, until the process ends.
fn serve_page(body: String) -> String {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            // The request line and headers, up to the blank line.
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let mut w = &stream;
            let _ = write!(
                w,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

/// `[nvml] gpm_fallback`: with GPM refused, tensor activity (and the other
/// GPM-only metrics the exporter shows) come from the dcgm-exporter, by
/// GPU UUID; what NVML reads stays NVML's; with GPM granted again the
/// exporter's values are no longer taken.
#[test]
fn a_dcgm_exporter_stands_in_for_refused_gpm() {
    use flopwatch_agent::source::gpm_fallback::GpmFallback;
    let _guard = crate::fake::hold();
    let path = library_path().expect("the fake NVML library is built next to this test");
    let t1 = T0 + 10_000;
    control::set_time_ms(t1).unwrap();
    control::configure(&format!("start_ms={T0},gpus=2,gpm_permission=denied")).unwrap();
    let nvml = NvmlSource::open(Some(&path)).unwrap();
    let uuids: Vec<String> = nvml.inventory().iter().map(|g| g.uuid.clone()).collect();
    // The exporter lists the GPUs in the other order, and a power value
    // NVML's own reading must win over.
    let mut body = String::from(
        "# TYPE DCGM_FI_PROF_PIPE_TENSOR_ACTIVE gauge\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n",
    );
    for (i, (g, v)) in [(1usize, 0.25), (0, 0.75)].into_iter().enumerate() {
        let labels = format!(
            "gpu=\"{i}\",UUID=\"{}\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node\"",
            uuids[g]
        );
        body.push_str(&format!(
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{labels}}} {v}\n"
        ));
        body.push_str(&format!("DCGM_FI_DEV_POWER_USAGE{{{labels}}} 1.5\n"));
    }
    let mut source = GpmFallback::new(Box::new(nvml), &serve_page(body));
    let value = |c: &Capture, g: usize, metric: &str| {
        c.gpus[g]
            .readings
            .iter()
            .filter(|r| r.metric == metric)
            .map(|r| r.value)
            .collect::<Vec<_>>()
    };
    for t in [t1, t1 + 1_000] {
        control::set_time_ms(t).unwrap();
        let c = source.capture(t).unwrap();
        assert_eq!(source.gpm_permission_denied(), [true, true]);
        assert!(source.exporter_open());
        assert_eq!(value(&c, 0, m::TENSOR_ACTIVE), [0.75], "GPU 0 by UUID");
        assert_eq!(value(&c, 1, m::TENSOR_ACTIVE), [0.25], "GPU 1 by UUID");
        for g in 0..2 {
            let power = value(&c, g, m::POWER_W);
            assert_eq!(power.len(), 1, "one power reading: {power:?}");
            assert!(
                power[0] > 1.5,
                "NVML's power, not the exporter's: {power:?}"
            );
        }
    }
    // Granted: GPM's own tensor activity, not the exporter's 0.75.
    control::configure(&format!("start_ms={T0},gpus=2")).unwrap();
    for t in [t1 + 2_000, t1 + 3_000] {
        control::set_time_ms(t).unwrap();
        let c = source.capture(t).unwrap();
        assert_eq!(source.gpm_permission_denied(), [false, false]);
        if t == t1 + 3_000 {
            let tpa = value(&c, 0, m::TENSOR_ACTIVE);
            assert_eq!(tpa.len(), 1);
            assert_ne!(tpa[0], 0.75, "GPM's own value once granted");
        }
    }
}
