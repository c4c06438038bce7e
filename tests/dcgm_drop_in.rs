//! The collector's dcgm-exporter page (`[exporter] dcgm_compat`) as a
//! drop-in for dcgm-exporter: a real Prometheus (Debian package
//! `prometheus`) scrapes it with `honor_labels: true`, evaluates
//! gpu-operator's recording rules over it, and answers the queries of
//! dcgm-exporter's Grafana dashboard with its `$instance` and `$gpu`
//! variables resolved as Grafana resolves them. Every expression must give
//! data, every family of dcgm-exporter's default counters file must be
//! there with dcgm-exporter's type, and an XID set before an agent started
//! must show.
//!
//! Three nodes: two simulated (two GPUs each) and one read from a
//! dcgm-exporter page whose XID field already holds 48.

use flopwatch_agent::source::sim::SimSource;
use flopwatch_collector::Auth;
use flopwatch_config::{CollectorConfig, ExporterConfig};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::clock::Deadline;
use flopwatch_sim::FleetPlan;
use flopwatch_tests::dcgm::{self, PageGpu};
use flopwatch_tests::procs::free_port;
use flopwatch_tests::prom::tool;
use flopwatch_tests::prometheus_peer::{LocalPrometheus, PrometheusOptions};
use flopwatch_tests::TestCollector;
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The panels' queries of dcgm-exporter's Grafana dashboard (12239), with
/// its variables `$instance` (`label_values(DCGM_FI_DEV_GPU_TEMP,
/// instance)`) and `$gpu` (`label_values(DCGM_FI_DEV_GPU_TEMP, gpu)`), and
/// whether the panel shows one series per GPU (else one in all).
const DASHBOARD: [(&str, bool); 9] = [
    (
        r#"DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"}"#,
        true,
    ),
    (
        r#"avg(DCGM_FI_DEV_GPU_TEMP{instance=~"$instance", gpu=~"$gpu"})"#,
        false,
    ),
    (
        r#"DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"}"#,
        true,
    ),
    (
        r#"sum(DCGM_FI_DEV_POWER_USAGE{instance=~"$instance", gpu=~"$gpu"})"#,
        false,
    ),
    (
        r#"DCGM_FI_DEV_SM_CLOCK{instance=~"$instance", gpu=~"$gpu"} * 1000000"#,
        true,
    ),
    (
        r#"DCGM_FI_DEV_GPU_UTIL{instance=~"$instance", gpu=~"$gpu"}"#,
        true,
    ),
    (
        r#"DCGM_FI_DEV_FB_USED{instance=~"$instance", gpu=~"$gpu"}"#,
        true,
    ),
    (
        r#"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{instance=~"$instance", gpu=~"$gpu"}"#,
        true,
    ),
    // The `$gpu` variable's own query, narrowed to the node.
    (r#"DCGM_FI_DEV_GPU_TEMP{instance=~"$instance"}"#, true),
];

/// gpu-operator's recording rules for dcgm-exporter (its
/// `dcgm.accelerator.metrics` group): record, expression.
const RULES: [(&str, &str); 7] = [
    ("accelerator_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL"),
    ("accelerator_memory_used_bytes", "DCGM_FI_DEV_MEM_COPY_UTIL"),
    ("accelerator_memory_total_bytes", "DCGM_FI_DEV_FB_TOTAL"),
    ("accelerator_power_usage_watts", "DCGM_FI_DEV_POWER_USAGE"),
    ("accelerator_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP"),
    ("accelerator_sm_clock_hertz", "DCGM_FI_DEV_SM_CLOCK"),
    ("accelerator_memory_clock_hertz", "DCGM_FI_DEV_MEM_CLOCK"),
];

/// dcgm-exporter's default counters file (4.5.3-4.8.2), family and type,
/// less the vGPU license status (docs/EXPORTER.md).
const DEFAULT_FAMILIES: [(&str, &str); 24] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge"),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge"),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter"),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge"),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge"),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge"),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
    ("DCGM_FI_DEV_FB_FREE", "gauge"),
    ("DCGM_FI_DEV_FB_USED", "gauge"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge"),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter"),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge"),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge"),
];

const SIM_NODES: [&str; 2] = ["node-a", "node-b"];
const DCGM_NODE: &str = "node-dcgm";
const DCGM_UUID: &str = "GPU-7c1e9a52-3d4b-4f80-a6e2-9b05c8d17f36";

/// An instant query's result, or why there is none.
async fn query(http: &reqwest::Client, prom: &str, q: &str) -> Result<Vec<Value>, String> {
    let r = http
        .get(format!("{prom}/api/v1/query"))
        .query(&[("query", q)])
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = serde_json::from_str(&r.text().await.map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    match v["data"]["result"].as_array() {
        Some(a) => Ok(a.clone()),
        None => Err(v.to_string()),
    }
}

/// `label_values(match, label)` as Grafana asks it.
async fn label_values(http: &reqwest::Client, prom: &str, label: &str, m: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(
        &http
            .get(format!("{prom}/api/v1/label/{label}/values"))
            .query(&[("match[]", m)])
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    v["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn value(v: &Value) -> f64 {
    v["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A dcgm-exporter page of one H100 whose XID field holds 48 (raised
/// before the agent starts).
fn dcgm_page() -> String {
    let mut page = dcgm::page(&[PageGpu {
        uuid: DCGM_UUID.into(),
        model: "NVIDIA H100 80GB HBM3".into(),
        tensor: 0.4,
        sm_clock_mhz: 1755.0,
        pod: None,
    }]);
    page.push_str(&format!(
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n\
         # TYPE DCGM_FI_DEV_XID_ERRORS gauge\n\
         DCGM_FI_DEV_XID_ERRORS{{gpu=\"0\",UUID=\"{DCGM_UUID}\",pci_bus_id=\"00000000:18:00.0\",device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-7\",DCGM_FI_DRIVER_VERSION=\"550.90.07\",err_code=\"48\",err_msg=\"Double Bit ECC Error\"}} 48\n"
    ));
    page
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dashboard_and_recording_rules_work_on_the_compat_page() {
    let prometheus = tool("prometheus");
    let dir = tempfile::tempdir().unwrap();
    let cfg = CollectorConfig {
        data_dir: dir.path().join("data"),
        anonymous_tenant: Some("default".into()),
        exporter: ExporterConfig {
            dcgm_compat: true,
            ..Default::default()
        },
        ..Default::default()
    };
    let collector = TestCollector::start_config(&cfg, Auth::anonymous("default"), Vec::new()).await;

    let clock = flopwatch_agent::TokioClock::new();
    let fleet = FleetPlan::new(2, 2, 3_600_000);
    let mut agents = Vec::new();
    for (n, node) in SIM_NODES.iter().enumerate() {
        agents.push(flopwatch_tests::agent(
            Box::new(SimSource::new(&fleet, n, clock.now_ms(), 7)),
            node,
            &collector.url,
            Duration::from_millis(200),
        ));
    }
    let url = dcgm::serve(Arc::new(Mutex::new(dcgm_page()))).await;
    let source = tokio::task::spawn_blocking(move || {
        flopwatch_agent::source::dcgm::DcgmExporterSource::open_with_timeout(
            &url,
            Duration::from_secs(2),
        )
    })
    .await
    .unwrap()
    .expect("the dcgm-exporter stand-in answers");
    agents.push(flopwatch_tests::agent(
        Box::new(source),
        DCGM_NODE,
        &collector.url,
        Duration::from_millis(200),
    ));

    let rules = dir.path().join("rules.yml");
    let mut text =
        "groups:\n  - name: dcgm.accelerator.metrics\n    interval: 1s\n    rules:\n".to_string();
    for (record, expr) in RULES {
        text.push_str(&format!(
            "      - record: {record}\n        expr: {expr}\n        labels:\n          vendor: nvidia\n"
        ));
    }
    std::fs::write(&rules, text).unwrap();
    let port = free_port();
    let target = collector
        .metrics_url
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .to_string();
    let _prom = LocalPrometheus::spawn(&PrometheusOptions {
        binary: prometheus,
        config: format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: dcgm-exporter\n    honor_labels: true\n    \
             static_configs:\n      - targets: [\"{target}\"]\n",
            rules.display()
        ),
        ..PrometheusOptions::new(dir.path(), port)
    })
    .unwrap();
    let prom = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();

    // Until every node's GPUs are scraped and every rule has a result.
    let deadline = Deadline::after(Duration::from_secs(90));
    loop {
        let mut missing = Vec::new();
        let temps = query(&http, &prom, "DCGM_FI_DEV_GPU_TEMP").await;
        if temps.map_or(0, |r| r.len()) < 5 {
            missing.push("DCGM_FI_DEV_GPU_TEMP of 5 GPUs".to_string());
        }
        for (name, _) in DEFAULT_FAMILIES {
            let q = format!("{name}{{instance=\"node-a\"}}");
            if query(&http, &prom, &q).await.map_or(true, |r| r.is_empty()) {
                missing.push(q);
            }
        }
        for (record, _) in RULES {
            if query(&http, &prom, record)
                .await
                .map_or(true, |r| r.len() < 4)
            {
                missing.push(record.to_string());
            }
        }
        if missing.is_empty() {
            break;
        }
        assert!(!deadline.passed(), "Prometheus never got: {missing:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // `$instance`: one choice per node, not the collector's address.
    let instances: BTreeSet<String> =
        label_values(&http, &prom, "instance", "DCGM_FI_DEV_GPU_TEMP")
            .await
            .into_iter()
            .collect();
    assert_eq!(
        instances,
        ["node-a", "node-b", DCGM_NODE]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        "$instance"
    );
    let gpus = label_values(&http, &prom, "gpu", "DCGM_FI_DEV_GPU_TEMP").await;
    assert_eq!(gpus, ["0", "1"], "$gpu");
    // Grafana's "All" of a multi-value variable, as a regex.
    let all_gpus = format!("({})", gpus.join("|"));
    for node in SIM_NODES {
        for (panel, per_gpu) in DASHBOARD {
            let q = panel.replace("$instance", node).replace("$gpu", &all_gpus);
            let r = query(&http, &prom, &q)
                .await
                .unwrap_or_else(|e| panic!("{q}: {e}"));
            let want = if per_gpu { 2 } else { 1 };
            assert_eq!(r.len(), want, "{q}: {r:?}");
            assert!(r.iter().all(|s| value(s).is_finite()), "{q}: {r:?}");
        }
    }

    // The recording rules: one series per GPU that has the field, with
    // the labels dcgm-exporter gives.
    for (record, expr) in RULES {
        let r = query(&http, &prom, &format!("{record}{{vendor=\"nvidia\"}}"))
            .await
            .unwrap();
        let direct = query(&http, &prom, expr).await.unwrap();
        assert!(r.len() >= 4 && r.len() == direct.len(), "{record}: {r:?}");
        for s in &r {
            let l = &s["metric"];
            for label in [
                "gpu",
                "UUID",
                "pci_bus_id",
                "device",
                "modelName",
                "Hostname",
            ] {
                assert!(l[label].is_string(), "{record} lacks {label}: {s}");
            }
        }
    }
    // Framebuffer total in MiB: an 80 GB H100 of the simulator.
    let total = query(&http, &prom, "DCGM_FI_DEV_FB_TOTAL{instance=\"node-a\"}")
        .await
        .unwrap();
    assert!(
        total
            .iter()
            .all(|s| value(s) > 70_000.0 && value(s) < 100_000.0),
        "{total:?}"
    );
    let used_free_reserved = query(
        &http,
        &prom,
        "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE + DCGM_FI_DEV_FB_RESERVED - DCGM_FI_DEV_FB_TOTAL",
    )
    .await
    .unwrap();
    assert_eq!(used_free_reserved.len(), 4, "{used_free_reserved:?}");
    assert!(
        used_free_reserved.iter().all(|s| value(s).abs() < 1.0),
        "{used_free_reserved:?}"
    );

    // dcgm-exporter's types, as Prometheus recorded them.
    for (name, kind) in DEFAULT_FAMILIES {
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
        assert_eq!(
            v["data"][name][0]["type"].as_str(),
            Some(kind),
            "{name}: {v}"
        );
    }
    // The same in the text format curl gets: bare names, dcgm-exporter's types.
    let page = http
        .get(&collector.metrics_url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (name, kind) in DEFAULT_FAMILIES {
        assert!(
            page.contains(&format!("# TYPE {name} {kind}\n")),
            "{name}:\n{page}"
        );
    }

    // Labels of a simulated GPU.
    let temp = query(
        &http,
        &prom,
        "DCGM_FI_DEV_GPU_TEMP{instance=\"node-b\",gpu=\"1\"}",
    )
    .await
    .unwrap();
    assert_eq!(temp.len(), 1, "{temp:?}");
    let l = &temp[0]["metric"];
    assert_eq!(l["device"], "nvidia1");
    assert_eq!(l["Hostname"], "node-b");
    assert_eq!(l["DCGM_FI_DRIVER_VERSION"], "sim");
    assert_eq!(l["pci_bus_id"], "00000000:19:00.0");
    assert_eq!(l["tenant"], "default");
    assert!(
        l["UUID"].as_str().is_some_and(|u| u.starts_with("GPU-")),
        "{l}"
    );

    // The XID the dcgm-exporter node had before its agent started.
    let xid = query(
        &http,
        &prom,
        &format!("DCGM_FI_DEV_XID_ERRORS{{instance=\"{DCGM_NODE}\"}}"),
    )
    .await
    .unwrap();
    assert_eq!(xid.len(), 1, "{xid:?}");
    assert_eq!(value(&xid[0]), 48.0, "{xid:?}");
    assert_eq!(xid[0]["metric"]["err_code"], "48");
    assert_eq!(xid[0]["metric"]["err_msg"], "Double-bit ECC error");
    assert_eq!(xid[0]["metric"]["UUID"], DCGM_UUID);
    let quiet = query(&http, &prom, "DCGM_FI_DEV_XID_ERRORS{instance=\"node-a\"}")
        .await
        .unwrap();
    assert!(
        quiet
            .iter()
            .all(|s| value(s) == 0.0 && s["metric"]["err_code"] == "0"),
        "{quiet:?}"
    );

    for a in agents {
        a.stop().await;
    }
    collector.stop().await;
}
