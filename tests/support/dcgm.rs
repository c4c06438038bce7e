//! A dcgm-exporter stand-in for end-to-end tests: pages as dcgm-exporter
//! 3.x renders them (its `render_metrics.go`: `# HELP`/`# TYPE` per
//! family, the GPU's labels, the pod's when it is attributed), served on
//! 127.0.0.1 and changed while the test runs; and a collector's `/metrics`
//! read in-process.

use flopwatch_agent::{Agent, AgentOptions, FixedSampler};
use flopwatch_collector::Collector;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::NodeIdentity;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One GPU of a page.
#[derive(Debug, Clone)]
pub struct PageGpu {
    /// NVML UUID.
    pub uuid: String,
    /// `modelName`, as the exporter prints it (blanks replaced or not).
    pub model: String,
    /// `DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`.
    pub tensor: f64,
    /// `DCGM_FI_DEV_SM_CLOCK`, MHz.
    pub sm_clock_mhz: f64,
    /// The pod running on it (`namespace` "ml", `container` "trainer").
    pub pod: Option<String>,
}

/// The page of `gpus`.
pub fn page(gpus: &[PageGpu]) -> String {
    let labels = |i: usize, g: &PageGpu| {
        let mut l = format!(
            "gpu=\"{i}\",UUID=\"{}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"{}\",Hostname=\"node-7\",DCGM_FI_DRIVER_VERSION=\"550.90.07\"",
            g.uuid,
            0x18 + i,
            g.model
        );
        if let Some(pod) = &g.pod {
            l.push_str(&format!(
                ",container=\"trainer\",namespace=\"ml\",pod=\"{pod}\""
            ));
        }
        l
    };
    type Field = (&'static str, &'static str, fn(&PageGpu) -> f64);
    let fields: [Field; 5] = [
        (
            "DCGM_FI_DEV_SM_CLOCK",
            "SM clock frequency (in MHz).",
            |g| g.sm_clock_mhz,
        ),
        ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", |_| 612.4),
        ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", |_| 61.0),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "Ratio of cycles the tensor (HMMA) pipe is active.",
            |g| g.tensor,
        ),
        (
            "DCGM_FI_PROF_SM_ACTIVE",
            "The ratio of cycles an SM has at least 1 warp assigned.",
            |g| (g.tensor * 1.3).min(1.0),
        ),
    ];
    let mut out = String::new();
    for (name, help, value) in fields {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n"));
        for (i, g) in gpus.iter().enumerate() {
            out.push_str(&format!("{name}{{{}}} {}\n", labels(i, g), value(g)));
        }
    }
    out
}

/// Serves the current text of `page` on every request; returns the
/// `/metrics` URL.
pub async fn serve(page: Arc<Mutex<String>>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}/metrics", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let _ = conn.read(&mut buf).await;
                let body = page.lock().map(|p| p.clone()).unwrap_or_default();
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    url
}

/// The collector's `/metrics` samples of `family` (anonymous scrape):
/// (the sample's name and labels, value).
pub fn scrape(c: &Arc<Collector>, family: &str) -> Vec<(String, f64)> {
    let scrape = flopwatch_transport::metrics_http::Scrape {
        token: None,
        params: &[],
    };
    let page = flopwatch_collector::metrics_page(c, &scrape).unwrap_or_default();
    page.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with('{'))
        .filter_map(|l| {
            let (labels, v) = l.rsplit_once(' ')?;
            Some((labels.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// An agent, node `node`, scraping the dcgm-exporter page at `url` every
/// 200 ms into the collector at `collector`, cutting a batch every `flush`
/// (the agent's default when `None`).
pub async fn agent(
    url: String,
    node: &str,
    collector: &str,
    flush: Option<Duration>,
    clock: Arc<dyn Clock>,
) -> Agent {
    let source = tokio::task::spawn_blocking(move || {
        flopwatch_agent::source::dcgm::DcgmExporterSource::open_with_timeout(
            &url,
            Duration::from_secs(2),
        )
    })
    .await
    .expect("the open task")
    .expect("exporter answers");
    let mut opts = AgentOptions::new(
        NodeIdentity::named(node, "boot"),
        vec![collector.to_string()],
    );
    if let Some(f) = flush {
        opts.flush_interval = f;
    }
    Agent::start(
        Box::new(source),
        Box::new(FixedSampler::new(Duration::from_millis(200))),
        opts,
        clock,
    )
}
