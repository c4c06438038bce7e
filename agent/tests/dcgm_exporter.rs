//! The dcgm-exporter source against a local HTTP server serving pages shaped
//! like dcgm-exporter's (Kubernetes mode, two A100s), opened through
//! `source::open` as the agent does.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use flopwatch_agent::source::dcgm::DcgmExporterSource;
use flopwatch_agent::source::{self, Capture, GpuSource, SourceError};
use flopwatch_config::{AgentConfig, SourceKind};
use flopwatch_proto::clock::Stopwatch;
use flopwatch_proto::metrics as m;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

const UUID0: &str = "GPU-5d4f6a0e-2c3b-8f61-07a4-1e9c2b6d3f70";
const UUID1: &str = "GPU-a83c1f92-6b7e-4d05-9c18-3f2e7d6a1b44";
const UUID2: &str = "GPU-0b9e7c15-d2a4-4f38-8e61-5c7a9d3b2f10";

/// Identity labels of GPU `g` as dcgm-exporter writes them, with the
/// Kubernetes labels last.
fn labels(g: usize, uuid: &str, pod: &str) -> String {
    let (ns, container) = if pod.is_empty() {
        ("", "")
    } else {
        ("ml-team", "trainer")
    };
    format!(
        "gpu=\"{g}\",UUID=\"{uuid}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{g}\",\
         modelName=\"NVIDIA A100-SXM4-80GB\",Hostname=\"gpu-node-7\",DCGM_FI_DRIVER_VERSION=\"550.90.07\",\
         container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"",
        0x07 + g * 0x40
    )
}

/// (field, type, help, value of GPU 0, value of GPU 1).
const FIELDS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        "1410",
        "210",
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        "1593",
        "1593",
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        "41",
        "9223372036854775794",
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        "57",
        "31",
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "Power draw (in W).",
        "312.518",
        "61.204",
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        "8123456789",
        "2222000",
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        "3",
        "0",
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        "87",
        "0",
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        "35",
        "0",
    ),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        "gauge",
        "Encoder utilization (in %).",
        "0",
        "0",
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        "0",
        "0",
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        "20000",
        "80500",
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        "60500",
        "0",
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Framebuffer memory reserved (in MiB).",
        "537",
        "537",
    ),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        "0",
        "0",
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink flow-control CRC errors.",
        "1",
        "0",
    ),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "counter",
        "Total number of NVLink retries.",
        "4",
        "0",
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "gauge",
        "Current clock throttle reasons.",
        "4",
        "1",
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "0.953",
        "0.000",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "0.421",
        "0.000",
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        "0.912",
        "0.000",
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        "0.305",
        "0.000",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active.",
        "0.518",
        "0.000",
    ),
    (
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "gauge",
        "Ratio of cycles the fp16 pipe is active.",
        "0.011",
        "0",
    ),
    (
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        "gauge",
        "Ratio of cycles the fp32 pipe is active.",
        "0.120",
        "0",
    ),
    (
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        "gauge",
        "Ratio of cycles the fp64 pipe is active.",
        "0",
        "0",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus.",
        "1250000",
        "0",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus.",
        "2.5e+07",
        "0",
    ),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink.",
        "4.2e+10",
        "0",
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink.",
        "4.1e+10",
        "0",
    ),
];

/// A page for the GPUs `gpus` (0, 1, and 2 for a GPU hot-added later),
/// with GPU 0's XID field set to `xid`.
fn page(gpus: &[usize], xid: u32) -> String {
    let mut out = String::new();
    for (field, kind, help, v0, v1) in FIELDS {
        out.push_str(&format!("# HELP {field} {help}\n# TYPE {field} {kind}\n"));
        for &g in gpus {
            let (uuid, pod) = match g {
                0 => (UUID0, "trainer-0"),
                1 => (UUID1, ""),
                _ => (UUID2, ""),
            };
            let value = match (g, *field) {
                (0, "DCGM_FI_DEV_XID_ERRORS") => xid.to_string(),
                (0, _) => v0.to_string(),
                _ => v1.to_string(),
            };
            out.push_str(&format!("{field}{{{}}} {value}\n", labels(g, uuid, pod)));
        }
    }
    out
}

/// What the server answers.
struct Reply {
    status: StatusCode,
    body: String,
}

type Shared = Arc<(Mutex<Reply>, AtomicUsize)>;

/// A dcgm-exporter stand-in on 127.0.0.1, serving `/metrics`.
struct Exporter {
    _rt: tokio::runtime::Runtime,
    shared: Shared,
    url: String,
}

impl Exporter {
    fn start(body: String) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let shared: Shared = Arc::new((
            Mutex::new(Reply {
                status: StatusCode::OK,
                body,
            }),
            AtomicUsize::new(0),
        ));
        let app = Router::new()
            .route("/metrics", get(metrics))
            .with_state(shared.clone());
        // Bound before serving: connections queue until the server runs.
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        rt.spawn(async move { axum::serve(listener, app).await });
        Self {
            _rt: rt,
            shared,
            url,
        }
    }

    fn set(&self, status: StatusCode, body: String) {
        *self.shared.0.lock().unwrap_or_else(PoisonError::into_inner) = Reply { status, body };
    }

    fn requests(&self) -> usize {
        self.shared.1.load(Ordering::SeqCst)
    }
}

async fn metrics(State(shared): State<Shared>) -> (StatusCode, String) {
    shared.1.fetch_add(1, Ordering::SeqCst);
    let reply = shared.0.lock().unwrap_or_else(PoisonError::into_inner);
    (reply.status, reply.body.clone())
}

/// Opens `url` the way the agent does, without the host's node counters.
fn open(url: &str) -> Result<Box<dyn GpuSource>, SourceError> {
    let kind: SourceKind = format!("dcgm-exporter:{url}").parse().unwrap();
    assert_eq!(kind, SourceKind::DcgmExporter(url.to_string()));
    let mut cfg = AgentConfig::default();
    cfg.host.infiniband = false;
    cfg.host.cpu_memory = false;
    source::open(&kind, &cfg, 0)
}

fn value(c: &Capture, gpu: usize, metric: &str) -> Option<f64> {
    c.gpus
        .iter()
        .find(|g| g.gpu == gpu)?
        .readings
        .iter()
        .find(|r| r.metric == metric)
        .map(|r| r.value)
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() <= 1e-9 * b.abs().max(1.0))
}

#[test]
fn inventory_comes_from_the_first_scrape() {
    let exporter = Exporter::start(page(&[0, 1], 0));
    let source = open(&exporter.url).unwrap();
    assert_eq!(source.name(), "dcgm-exporter");
    assert_eq!(exporter.requests(), 1, "open scrapes once");
    let inv = source.inventory();
    assert_eq!(inv.len(), 2);
    for (g, (info, uuid)) in inv.iter().zip([UUID0, UUID1]).enumerate() {
        assert_eq!(info.index, g as u32);
        assert_eq!(info.uuid, uuid);
        assert_eq!(info.model, "NVIDIA A100-SXM4-80GB");
        assert_eq!(info.driver_version, "550.90.07");
        assert_eq!(
            info.pci_bus_id,
            format!("00000000:{:02X}:00.0", 0x07 + g * 0x40)
        );
        assert_eq!(
            info.memory_total_bytes,
            81_037 << 20,
            "used + free + reserved MiB"
        );
        assert_eq!(info.mig, flopwatch_proto::model::Mig::Off);
        assert!(!info.gpm_supported);
    }
    // NVLINK_BANDWIDTH_TOTAL.
    let direct = DcgmExporterSource::open(&exporter.url).unwrap();
    assert_eq!(direct.ignored_fields(), 1);
    assert_eq!(direct.url(), exporter.url);
}

#[test]
fn readings_are_mapped_to_catalog_units() {
    let exporter = Exporter::start(page(&[0, 1], 0));
    let mut source = open(&exporter.url).unwrap();
    let c = source.capture(1_000).unwrap();
    assert_eq!(exporter.requests(), 2, "one GET per capture");
    assert_eq!(c.ts_ms, 1_000);
    assert_eq!(c.gpus.len(), 2);
    assert!(c.gpus.iter().all(|g| g.window_ms == 0), "first capture");
    let want = [
        (m::TENSOR_ACTIVE, 0.421),
        (m::SM_ACTIVE, 0.912),
        (m::SM_OCCUPANCY, 0.305),
        (m::DRAM_ACTIVE, 0.518),
        (m::FP16_ACTIVE, 0.011),
        (m::FP32_ACTIVE, 0.12),
        (m::FP64_ACTIVE, 0.0),
        (m::PCIE_TX_BYTES_S, 1.25e6),
        (m::PCIE_RX_BYTES_S, 2.5e7),
        (m::NVLINK_TX_BYTES_S, 4.2e10),
        (m::NVLINK_RX_BYTES_S, 4.1e10),
        (m::SM_CLOCK_MHZ, 1410.0),
        (m::MEM_CLOCK_MHZ, 1593.0),
        (m::POWER_W, 312.518),
        (m::TEMP_C, 57.0),
        (m::GPU_UTIL, 0.87),
        (m::MEM_COPY_UTIL, 0.35),
        (m::MEM_USED_BYTES, 60_500.0 * 1024.0 * 1024.0),
        (m::ENERGY_J, 8_123_456.789),
        (m::THROTTLE_REASONS, 4.0),
        (m::PCIE_REPLAY_TOTAL, 3.0),
        (m::NVLINK_ERRORS_TOTAL, 5.0),
        (m::GR_ENGINE_ACTIVE, 0.953),
        (m::MEMORY_TEMP_C, 41.0),
        (m::ENC_UTIL, 0.0),
        (m::XID_LAST, 0.0),
        (m::MEM_FREE_BYTES, 20_000.0 * 1024.0 * 1024.0),
        (m::MEM_RESERVED_BYTES, 537.0 * 1024.0 * 1024.0),
    ];
    for (metric, v) in want {
        assert!(
            close(value(&c, 0, metric), v),
            "{metric}: {:?} vs {v}",
            value(&c, 0, metric)
        );
    }
    let gpu0 = &c.gpus.iter().find(|g| g.gpu == 0).unwrap().readings;
    assert_eq!(gpu0.len(), want.len(), "unmapped fields give no reading");
    assert!(gpu0.iter().all(|r| m::lookup(r.metric).is_some()));
    assert_eq!(value(&c, 1, m::SM_CLOCK_MHZ), Some(210.0));
    assert_eq!(value(&c, 1, m::TENSOR_ACTIVE), Some(0.0));

    // GPU 0 runs a pod; GPU 1's Kubernetes labels are empty.
    assert_eq!(c.jobs.len(), 1);
    let job = &c.jobs[0];
    assert_eq!(job.gpu_uuid, UUID0);
    assert_eq!(job.job_id, "ml-team/trainer-0");
    assert_eq!(
        (
            job.pod.as_str(),
            job.namespace.as_str(),
            job.container.as_str()
        ),
        ("trainer-0", "ml-team", "trainer")
    );
    assert!(c.events.is_empty());

    let c = source.capture(2_000).unwrap();
    assert!(c.gpus.iter().all(|g| g.window_ms == 1_000));
    assert_eq!(exporter.requests(), 3);
}

#[test]
fn a_gpu_missing_from_a_later_scrape_gets_no_readings() {
    let exporter = Exporter::start(page(&[0, 1], 0));
    let mut source = open(&exporter.url).unwrap();
    source.capture(1_000).unwrap();

    // GPU 0 gone, GPU 2 new: GPU 0 stays listed without readings, GPU 2
    // is appended (the inventory only grows) and read.
    exporter.set(StatusCode::OK, page(&[1, 2], 0));
    let c = source.capture(2_000).unwrap();
    assert_eq!(c.gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(value(&c, 1, m::SM_CLOCK_MHZ), Some(210.0));
    assert!(c.jobs.is_empty());
    assert_eq!(source.inventory().len(), 3, "the inventory only grows");
    assert_eq!(source.inventory()[0].uuid, UUID0, "and keeps its order");

    // GPU 0 back, in its place.
    exporter.set(StatusCode::OK, page(&[0, 1, 2], 0));
    let c = source.capture(3_000).unwrap();
    assert_eq!(c.gpus.iter().map(|g| g.gpu).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(value(&c, 0, m::SM_CLOCK_MHZ), Some(1410.0));
    assert_eq!(source.inventory().len(), 3);
}

#[test]
fn a_new_xid_is_an_event() {
    let exporter = Exporter::start(page(&[0, 1], 13));
    let mut source = open(&exporter.url).unwrap();
    let c = source.capture(1_000).unwrap();
    assert!(c.events.is_empty(), "the XID at open is the baseline");
    // ... and a reading from the first capture on.
    assert_eq!(value(&c, 0, m::XID_LAST), Some(13.0));
    exporter.set(StatusCode::OK, page(&[0, 1], 79));
    let c = source.capture(2_000).unwrap();
    assert_eq!(c.events.len(), 1);
    let e = &c.events[0];
    assert_eq!(
        (e.gpu_uuid.as_str(), e.kind.as_str(), e.code, e.ts_ms),
        (UUID0, "xid", 79, 2_000)
    );
    let c = source.capture(3_000).unwrap();
    assert!(c.events.is_empty(), "unchanged");
}

#[test]
fn http_errors_name_the_url_and_status() {
    let exporter = Exporter::start(String::new());
    exporter.set(StatusCode::INTERNAL_SERVER_ERROR, "DCGM not ready".into());
    let e = open(&exporter.url)
        .err()
        .expect("a 500 fails the open")
        .to_string();
    assert!(e.contains(&exporter.url) && e.contains("500"), "{e}");

    exporter.set(StatusCode::OK, page(&[0, 1], 0));
    let mut source = open(&exporter.url).unwrap();
    exporter.set(StatusCode::INTERNAL_SERVER_ERROR, "DCGM not ready".into());
    let e = source.capture(1_000).unwrap_err();
    assert!(
        matches!(&e, SourceError::Exporter { url, .. } if *url == exporter.url),
        "{e}"
    );
    assert!(e.to_string().contains("HTTP status 500"), "{e}");
    // The next good scrape reads again.
    exporter.set(StatusCode::OK, page(&[0, 1], 0));
    assert_eq!(source.capture(2_000).unwrap().gpus.len(), 2);
}

#[test]
fn a_malformed_page_names_its_line() {
    let exporter = Exporter::start(page(&[0, 1], 0));
    let mut source = open(&exporter.url).unwrap();
    exporter.set(
        StatusCode::OK,
        format!(
            "# HELP x y\n{}DCGM_FI_DEV_SM_CLOCK{{gpu=\"0}} 1\n",
            "ok 1\n".repeat(3)
        ),
    );
    let e = source.capture(1_000).unwrap_err().to_string();
    assert!(e.contains(&exporter.url) && e.contains("line 5"), "{e}");
}

#[test]
fn a_page_without_gpus_fails_the_open() {
    let exporter = Exporter::start("# HELP up x\nup 1\ngo_goroutines 12\n".into());
    let e = open(&exporter.url).err().expect("no GPU").to_string();
    assert!(e.contains("no GPU"), "{e}");
}

#[test]
fn an_unreachable_exporter_fails_the_open() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}/metrics");
    let e = open(&url).err().expect("nothing listens").to_string();
    assert!(e.contains(&url) && e.contains("cannot scrape"), "{e}");
}

#[test]
fn a_hung_exporter_times_out() {
    // Accepted by the kernel, never answered.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/metrics", listener.local_addr().unwrap());
    let started = Stopwatch::start();
    let e = DcgmExporterSource::open_with_timeout(&url, Duration::from_millis(300))
        .expect_err("no answer")
        .to_string();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(e.contains("timeout"), "{e}");
    drop(listener);
}

#[test]
fn mig_instances_are_their_own_gpus() {
    let gi = |id: u32, profile: &str| {
        format!("gpu=\"0\",UUID=\"{UUID0}\",modelName=\"NVIDIA A100-SXM4-80GB\",GPU_I_PROFILE=\"{profile}\",GPU_I_ID=\"{id}\"")
    };
    let whole = format!("gpu=\"0\",UUID=\"{UUID0}\",modelName=\"NVIDIA A100-SXM4-80GB\"");
    let body = format!(
        "DCGM_FI_DEV_SM_CLOCK{{{whole}}} 1395\n\
         DCGM_FI_DEV_POWER_USAGE{{{whole}}} 250\n\
         DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{}}} 0.6\n\
         DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{}}} 0.05\n",
        gi(1, "3g.40gb"),
        gi(5, "1g.10gb")
    );
    let exporter = Exporter::start(body);
    let mut source = open(&exporter.url).unwrap();
    let uuids: Vec<_> = source.inventory().iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(
        uuids,
        [
            UUID0.to_string(),
            format!("MIG-{UUID0}/1"),
            format!("MIG-{UUID0}/5")
        ]
    );
    assert_eq!(source.inventory()[1].mig.parent_uuid(), Some(UUID0));
    let c = source.capture(1_000).unwrap();
    assert_eq!(value(&c, 1, m::TENSOR_ACTIVE), Some(0.6));
    assert_eq!(value(&c, 2, m::TENSOR_ACTIVE), Some(0.05));
    assert_eq!(
        value(&c, 2, m::SM_CLOCK_MHZ),
        Some(1395.0),
        "the parent's clock"
    );
    assert_eq!(
        value(&c, 2, m::POWER_W),
        None,
        "device fields stay on the GPU"
    );
    assert_eq!(value(&c, 0, m::POWER_W), Some(250.0));
}
