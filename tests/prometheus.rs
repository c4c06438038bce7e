//! A real Prometheus (Debian package `prometheus`, installed by
//! deploy/dev/setup.sh) scrapes the collector's and an agent's `/metrics`
//! and receives the collector's remote write; `promtool check metrics`
//! lints both pages; the Grafana dashboard's queries name only metrics
//! Prometheus really got.

use flopwatch_agent::attribution::AttributionOptions;
use flopwatch_agent::source::sim::SimSource;
use flopwatch_agent::AdaptiveSampler;
use flopwatch_agent::SpoolOptions;
use flopwatch_agent::TokioClock;
use flopwatch_agent::{AgentOptions, DeliveryOptions};
use flopwatch_collector::Auth;
use flopwatch_config::{CollectorConfig, ExporterConfig, RemoteWriteConfig, SamplingConfig};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::model::NodeIdentity;
use flopwatch_proto::v1::ofu_request;
use flopwatch_sim::FleetPlan;
use flopwatch_tests::procs::free_port;
use flopwatch_tests::prom::tool;
use flopwatch_tests::prometheus_peer::{LocalPrometheus, PrometheusOptions};
use flopwatch_tests::TestCollector;
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

fn host_port(url: &str) -> String {
    url.trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string()
}

async fn query(http: &reqwest::Client, prom: &str, q: &str) -> Vec<Value> {
    let r: Value = match http
        .get(format!("{prom}/api/v1/query"))
        .query(&[("query", q)])
        .send()
        .await
    {
        Ok(r) => serde_json::from_str(&r.text().await.unwrap_or_default()).unwrap_or(Value::Null),
        Err(_) => return Vec::new(),
    };
    r["data"]["result"].as_array().cloned().unwrap_or_default()
}

fn value(v: &Value) -> f64 {
    v["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// promtool's findings on a page, less the two it makes about
/// dcgm-exporter's own label names (`UUID`, `modelName`) and those about
/// dcgm-exporter's own family names (`DCGM_FI_*`: counters without
/// `_total`, `…_PCIE_REPLAY_COUNTER`, as on dcgm-exporter's page): flopwatch
/// keeps both on purpose so that dashboards written for dcgm-exporter work.
fn promtool_findings(page: &str) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| !l.ends_with("label names should be written in 'snake_case' not 'camelCase'"))
        .filter(|l| !l.starts_with("DCGM_FI_"))
        .map(str::to_string)
        .collect()
}

/// Every `flopwatch_*` name in the dashboard's PromQL.
fn dashboard_names() -> BTreeSet<String> {
    let path = flopwatch_tests::repo_root().join("deploy/grafana/flopwatch.json");
    let text = std::fs::read_to_string(path).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let mut exprs = Vec::new();
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr" | "query" | "definition", Value::String(s)) => out.push(s.clone()),
                        _ => walk(x, out),
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&json, &mut exprs);
    let mut names = BTreeSet::new();
    for e in exprs {
        let mut rest = e.as_str();
        while let Some(i) = rest.find("flopwatch_") {
            let tail = &rest[i..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_scrapes_both_pages_and_receives_remote_write() {
    let prometheus = tool("prometheus");
    let dir = tempfile::tempdir().unwrap();
    let prom_port = free_port();
    let prom = format!("http://127.0.0.1:{prom_port}");
    let cfg = CollectorConfig {
        data_dir: dir.path().join("data"),
        anonymous_tenant: Some("default".into()),
        remote_write: Some(RemoteWriteConfig {
            url: format!("{prom}/api/v1/write"),
            interval: Duration::from_millis(500),
            ..Default::default()
        }),
        exporter: ExporterConfig {
            dcgm_compat: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let collector = TestCollector::start_config(&cfg, Auth::anonymous("default"), Vec::new()).await;

    // One simulated node of 4 GPUs, adaptive sampling, a disk spool, its
    // own /metrics.
    let clock = Arc::new(TokioClock::new());
    let fleet = FleetPlan::new(1, 4, 3_600_000);
    let sampling = SamplingConfig {
        adaptive: true,
        ..Default::default()
    };
    let agent = flopwatch_agent::Agent::start_with_delivery(
        Box::new(SimSource::new(&fleet, 0, clock.now_ms(), 7)),
        Box::new(AdaptiveSampler::new(&sampling, 7)),
        AgentOptions {
            flush_interval: Duration::from_millis(500),
            ..AgentOptions::new(
                NodeIdentity::named("node-a", "test-boot"),
                vec![collector.url.clone()],
            )
        },
        AttributionOptions::disabled(),
        clock.clone(),
        DeliveryOptions {
            spool: Some(SpoolOptions {
                dir: dir.path().join("spool"),
                max_bytes: 64 << 20,
                fsync_interval: Duration::from_secs(1),
            }),
            max_batches_per_second: None,
        },
    )
    .unwrap();
    let agent_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let agent_addr = agent_listener.local_addr().unwrap();
    let (agent_stop, agent_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let agent_http = tokio::spawn(flopwatch_transport::metrics_http::serve(
        agent_listener,
        Arc::new(flopwatch_agent::registry(&agent)),
        async move {
            let _ = agent_stop_rx.await;
        },
    ));

    let _prom = LocalPrometheus::spawn(&PrometheusOptions {
        binary: prometheus,
        config: format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  \
             - job_name: flopwatch-collector\n    honor_labels: true\n    static_configs:\n      - targets: [\"{}\"]\n  \
             - job_name: flopwatch-agent\n    honor_labels: true\n    static_configs:\n      - targets: [\"{agent_addr}\"]\n",
            host_port(&collector.metrics_url)
        ),
        remote_write_receiver: true,
        ..PrometheusOptions::new(dir.path(), prom_port)
    })
    .unwrap();
    let started = clock.now_ms();

    // Wait for: both targets up, the collector's four GPUs scraped, the
    // agent's per-metric intervals scraped, and the four GPUs' OFU written
    // remotely (remote-written series carry no `instance` label).
    let http = reqwest::Client::new();
    let deadline = Deadline::after(Duration::from_secs(90));
    let checks = [
        "up{job=\"flopwatch-collector\"} == 1",
        "up{job=\"flopwatch-agent\"} == 1",
        "flopwatch_ofu_ratio{instance!=\"\"}",
        "flopwatch_agent_sample_interval_seconds",
        "flopwatch_ofu_ratio{instance=\"\"}",
    ];
    loop {
        let mut ok = true;
        for (i, q) in checks.iter().enumerate() {
            let n = query(&http, &prom, q).await.len();
            let want = if i >= 2 && *q != "flopwatch_agent_sample_interval_seconds" {
                4
            } else {
                1
            };
            ok &= n >= want;
        }
        if ok {
            break;
        }
        assert!(!deadline.passed(), "Prometheus never saw everything");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Let a few more batches arrive, then compare.
    tokio::time::sleep(Duration::from_secs(4)).await;
    agent.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end = clock.now_ms();

    // Remote-written OFU against the collector's own answer, per GPU, over
    // the whole run: both are means of per-batch OFU.
    let span = (end - started) / 1000 + 5;
    let rw = query(
        &http,
        &prom,
        &format!("avg_over_time(flopwatch_ofu_ratio{{instance=\"\"}}[{span}s])"),
    )
    .await;
    assert_eq!(rw.len(), 4, "{rw:?}");
    let mut q = collector.query().await;
    for s in &rw {
        let uuid = s["metric"]["UUID"].as_str().unwrap().to_string();
        assert_eq!(s["metric"]["hostname"], "node-a");
        assert_eq!(s["metric"]["tenant"], "default");
        let ours = flopwatch_tests::ofu_summary(
            &mut q,
            ofu_request::Scope::GpuUuid(uuid.clone()),
            started - 60_000,
            end + 1,
        )
        .await;
        let theirs = value(s);
        assert!(
            (theirs - ours.mean).abs() < 0.02,
            "GPU {uuid}: remote-written mean {theirs} vs collector {}",
            ours.mean
        );
    }
    let sent = flopwatch_collector::Stats::get(&collector.collector.stats.remote_write_samples);
    assert!(sent > 0);
    assert_eq!(
        flopwatch_collector::Stats::get(&collector.collector.stats.remote_write_dropped),
        0
    );

    // One family per catalog metric, in base units, with its type and unit
    // as Prometheus recorded them from the OpenMetrics page.
    let scraped = "{job=\"flopwatch-collector\"}";
    for (name, kind, unit) in [
        ("flopwatch_gpu_power_watts", "gauge", "watts"),
        ("flopwatch_gpu_sm_clock_hertz", "gauge", "hertz"),
        ("flopwatch_gpu_energy_joules", "counter", "joules"),
        ("flopwatch_gpu_gpu_util_ratio", "gauge", "ratio"),
        ("flopwatch_gpu_xid_errors", "counter", ""),
    ] {
        let v: Value = serde_json::from_str(
            &http
                .get(format!("{prom}/api/v1/metadata"))
                .query(&[("metric", name)])
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
        .unwrap();
        let m = &v["data"][name][0];
        assert_eq!(
            (m["type"].as_str(), m["unit"].as_str()),
            (Some(kind), Some(unit)),
            "{name}: {v}"
        );
        let sample = if kind == "counter" {
            format!("{name}_total{scraped}")
        } else {
            format!("{name}{scraped}")
        };
        assert_eq!(query(&http, &prom, &sample).await.len(), 4, "{sample}");
    }
    // No unit-mixing family is left.
    assert!(query(&http, &prom, "flopwatch_gpu_metric").await.is_empty());
    // dcgm-exporter's names, labels and units, from the same scrape as
    // flopwatch's own families.
    for (q, want) in [
        ("DCGM_FI_DEV_SM_CLOCK * 1e6 - on (UUID) flopwatch_gpu_sm_clock_hertz", 0.0),
        ("DCGM_FI_DEV_POWER_USAGE - on (UUID) flopwatch_gpu_power_watts", 0.0),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION - on (UUID) 1000 * flopwatch_gpu_energy_joules_total", 0.0),
        ("DCGM_FI_DEV_GPU_UTIL - on (UUID) 100 * flopwatch_gpu_gpu_util_ratio", 0.0),
        ("DCGM_FI_DEV_XID_ERRORS", 0.0),
    ] {
        let r = query(&http, &prom, q).await;
        assert_eq!(r.len(), 4, "{q}: {r:?}");
        for s in &r {
            assert!((value(s) - want).abs() < 1e-6, "{q}: {s}");
        }
    }
    let dcgm = query(&http, &prom, "DCGM_FI_DEV_POWER_USAGE").await;
    let gpus: BTreeSet<String> = dcgm
        .iter()
        .map(|s| {
            let m = &s["metric"];
            assert_eq!(m["Hostname"], "node-a", "{s}");
            assert!(m["UUID"].is_string() && m["modelName"].is_string(), "{s}");
            let gpu = m["gpu"].as_str().unwrap();
            assert_eq!(
                m["device"].as_str(),
                Some(format!("nvidia{gpu}").as_str()),
                "{s}"
            );
            gpu.to_string()
        })
        .collect();
    assert_eq!(gpus.len(), 4, "{gpus:?}");
    // Build information and process metrics of both processes, and each
    // GPU's newest sample, seconds old rather than minutes.
    for job in ["flopwatch-collector", "flopwatch-agent"] {
        for name in [
            "flopwatch_build_info",
            "process_resident_memory_bytes",
            "process_cpu_seconds_total",
            "process_start_time_seconds",
            "process_open_fds",
        ] {
            let r = query(&http, &prom, &format!("{name}{{job=\"{job}\"}}")).await;
            assert_eq!(r.len(), 1, "{job} {name}: {r:?}");
        }
    }
    let fresh = query(
        &http,
        &prom,
        "time() - flopwatch_gpu_last_sample_timestamp_seconds < 60",
    )
    .await;
    assert_eq!(fresh.len(), 4, "{fresh:?}");

    // promtool on both pages, as curl gets them (Prometheus text format).
    let mut families = Vec::new();
    for url in [
        collector.metrics_url.clone(),
        format!("http://{agent_addr}/metrics"),
    ] {
        let page = http.get(&url).send().await.unwrap().text().await.unwrap();
        assert!(page.contains("flopwatch_"), "{url}: {page}");
        let findings = promtool_findings(&page);
        assert!(findings.is_empty(), "{url}: promtool: {findings:#?}");
        families.push(
            page.lines()
                .filter_map(|l| l.strip_prefix("# TYPE "))
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_string)
                .collect::<BTreeSet<String>>(),
        );
    }
    // A family means one thing: none is on both pages (the collector once
    // exported the agents' reported backlog under the name of the agent's
    // own spool gauge), except those that describe the scraped process
    // itself, the same thing on every page.
    assert!(families[1].contains("flopwatch_agent_spool_bytes"));
    let both: Vec<&String> = families[0]
        .intersection(&families[1])
        .filter(|f| *f != "flopwatch_build_info" && !f.starts_with("process_"))
        .collect();
    assert!(both.is_empty(), "on both pages: {both:?}");
    assert!(families[0].contains("process_resident_memory_bytes"));

    // Every metric the dashboard queries exists in what Prometheus got.
    let names: BTreeSet<String> = {
        let text = http
            .get(format!("{prom}/api/v1/label/__name__/values"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let r: Value = serde_json::from_str(&text).unwrap();
        r["data"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect()
    };
    let missing: Vec<String> = dashboard_names()
        .into_iter()
        .filter(|n| !names.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "dashboard names unknown metrics: {missing:?}"
    );

    let _ = agent_stop.send(());
    let _ = agent_http.await;
    collector.stop().await;
}

/// A Prometheus serving HTTPS (a certificate of a throwaway CA) with basic
/// auth (`web.config.file`) and the remote-write receiver.
struct SecurePrometheus {
    _proc: LocalPrometheus,
    /// `https://127.0.0.1:PORT`.
    url: String,
    /// The CA the server certificate chains to.
    ca_file: std::path::PathBuf,
    /// A client trusting `ca_file`.
    http: reqwest::Client,
}

const PROM_USER: &str = "flopwatch";
const PROM_PASSWORD: &str = "correct horse battery staple";

impl SecurePrometheus {
    async fn start(dir: &std::path::Path) -> Self {
        let prometheus = tool("prometheus");
        let pki = flopwatch_tests::pki::Pki::new(&dir.join("pki"), "prometheus");
        let server = pki.server("prometheus-server");
        let hash = bcrypt::hash(PROM_PASSWORD, 4).unwrap();
        let web = dir.join("web.yml");
        std::fs::write(
            &web,
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  {PROM_USER}: '{hash}'\n",
                server.cert.display(),
                server.key.display()
            ),
        )
        .unwrap();
        let mut proc = LocalPrometheus::spawn(&PrometheusOptions {
            binary: prometheus,
            remote_write_receiver: true,
            args: vec![format!("--web.config.file={}", web.display())],
            ..PrometheusOptions::new(dir, free_port())
        })
        .unwrap();
        let ca = std::fs::read(pki.ca_file()).unwrap();
        let http = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap();
        let url = format!("https://127.0.0.1:{}", proc.port);
        proc.wait_ready(
            || {
                http.get(format!("{url}/-/ready"))
                    .basic_auth(PROM_USER, Some(PROM_PASSWORD))
            },
            Duration::from_secs(60),
        )
        .await
        .expect("Prometheus (TLS) never ready");
        // TLS and basic auth are really on: no password, no answer.
        let anonymous = http.get(format!("{url}/-/ready")).send().await.unwrap();
        assert_eq!(anonymous.status().as_u16(), 401);
        assert!(reqwest::get(format!("{url}/-/ready")).await.is_err());
        Self {
            _proc: proc,
            url,
            ca_file: pki.ca_file(),
            http,
        }
    }

    async fn query(&self, q: &str) -> Vec<Value> {
        let r = self
            .http
            .get(format!("{}/api/v1/query", self.url))
            .basic_auth(PROM_USER, Some(PROM_PASSWORD))
            .query(&[("query", q)])
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{q}: {}", r.status());
        let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

/// A collector remote-writing to `prom` with `ca_file` and basic auth
/// (the password from a file), fed by a simulated node of 2 GPUs.
async fn tls_collector(
    dir: &std::path::Path,
    prom: &SecurePrometheus,
    password: &str,
) -> (TestCollector, flopwatch_agent::Agent) {
    let password_file = dir.join("remote-password");
    std::fs::write(&password_file, format!("{password}\n")).unwrap();
    let cfg = CollectorConfig {
        data_dir: dir.join("data"),
        anonymous_tenant: Some("default".into()),
        remote_write: Some(RemoteWriteConfig {
            url: format!("{}/api/v1/write", prom.url),
            interval: Duration::from_millis(300),
            ca_file: Some(prom.ca_file.clone()),
            username: Some(PROM_USER.into()),
            password_file: Some(password_file),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(500),
            ..Default::default()
        }),
        ..Default::default()
    };
    cfg.remote_write.as_ref().unwrap().validate().unwrap();
    let collector = TestCollector::start_config(&cfg, Auth::anonymous("default"), Vec::new()).await;
    let clock = TokioClock::new();
    let fleet = FleetPlan::new(1, 2, 3_600_000);
    let agent = flopwatch_tests::agent(
        Box::new(SimSource::new(&fleet, 0, clock.now_ms(), 7)),
        "node-tls",
        &collector.url,
        Duration::from_millis(100),
    );
    (collector, agent)
}

/// `name{labels} value` on the collector's `/metrics` page (0 when absent).
async fn scraped(collector: &TestCollector, series: &str) -> f64 {
    let page = reqwest::get(&collector.metrics_url)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // A family without labels is written `name{} value`.
    page.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(series)?;
            rest.strip_prefix("{}").unwrap_or(rest).strip_prefix(' ')
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn prometheus_receives_remote_write_over_tls_with_basic_auth() {
    let dir = tempfile::tempdir().unwrap();
    let prom = SecurePrometheus::start(dir.path()).await;
    let (collector, agent) = tls_collector(dir.path(), &prom, PROM_PASSWORD).await;

    // Both GPUs' OFU arrive, written remotely (no `instance` label: this
    // Prometheus scrapes nothing).
    let deadline = Deadline::after(Duration::from_secs(60));
    let series = loop {
        let s = prom
            .query("flopwatch_ofu_ratio{hostname=\"node-tls\"}")
            .await;
        if s.len() >= 2 {
            break s;
        }
        assert!(
            !deadline.passed(),
            "no OFU over TLS; collector /metrics failures: 4xx {} connection {}",
            scraped(
                &collector,
                "flopwatch_remote_write_failures_total{reason=\"4xx\"}"
            )
            .await,
            scraped(
                &collector,
                "flopwatch_remote_write_failures_total{reason=\"connection\"}"
            )
            .await,
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    agent.stop().await;
    for s in &series {
        assert_eq!(s["metric"]["tenant"], "default");
        assert!(s["metric"].get("instance").is_none(), "{s}");
        let v = value(s);
        assert!((0.0..=1.0).contains(&v), "{s}");
    }
    let tensor = prom
        .query("flopwatch_ofu_tensor_active_ratio{hostname=\"node-tls\"}")
        .await;
    assert_eq!(tensor.len(), 2, "{tensor:?}");
    assert!(scraped(&collector, "flopwatch_remote_write_samples_total").await > 0.0);
    for reason in ["4xx", "5xx", "429", "credentials"] {
        let n = scraped(
            &collector,
            &format!("flopwatch_remote_write_failures_total{{reason=\"{reason}\"}}"),
        )
        .await;
        assert_eq!(n, 0.0, "{reason} failures");
    }
    collector.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wrong_password_is_a_4xx_counted_and_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let prom = SecurePrometheus::start(dir.path()).await;
    let (collector, agent) = tls_collector(dir.path(), &prom, "wrong password").await;
    let refused = "flopwatch_remote_write_failures_total{reason=\"4xx\"}";
    let deadline = Deadline::after(Duration::from_secs(60));
    while scraped(&collector, refused).await < 3.0 {
        assert!(
            !deadline.passed(),
            "no 4xx counted on /metrics; connection failures: {}",
            scraped(
                &collector,
                "flopwatch_remote_write_failures_total{reason=\"connection\"}"
            )
            .await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    agent.stop().await;
    // The last batches' samples reach the queue and are refused too.
    let queue = collector.collector.remote.clone().unwrap();
    let deadline = Deadline::after(Duration::from_secs(10));
    while queue.pending() > 0 {
        assert!(!deadline.passed(), "refused samples stay queued");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let after_drain = scraped(&collector, refused).await;
    // Nothing new is queued: a retried refusal would keep counting (every
    // min_backoff..max_backoff); a dropped one does not.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(scraped(&collector, refused).await, after_drain);
    assert_eq!(queue.pending(), 0);
    let dropped = scraped(
        &collector,
        "flopwatch_remote_write_dropped_samples_total{reason=\"4xx\"}",
    )
    .await;
    assert!(
        dropped >= after_drain,
        "{dropped} samples in {after_drain} requests"
    );
    for reason in ["5xx", "429", "connection", "credentials"] {
        let n = scraped(
            &collector,
            &format!("flopwatch_remote_write_failures_total{{reason=\"{reason}\"}}"),
        )
        .await;
        assert_eq!(n, 0.0, "{reason} failures");
    }
    assert_eq!(
        scraped(&collector, "flopwatch_remote_write_samples_total").await,
        0.0
    );
    assert_eq!(
        scraped(
            &collector,
            "flopwatch_remote_write_dropped_samples_total{reason=\"queue_full\"}"
        )
        .await,
        0.0
    );
    // Prometheus got nothing.
    assert!(prom.query("flopwatch_ofu_ratio").await.is_empty());
    collector.stop().await;
}
