//! The Prometheus API of a 3-collector cluster answers for the whole
//! cluster: agents of two tenants spread over the collectors (a job's GPUs
//! on two of them, one GPU's samples split between two after a failover),
//! and each collector's API — query, query_range, series, labels, label
//! values — gives the same answers, with every collector's series, only
//! the caller's tenant's, and the node and job series derived over GPUs
//! wherever they are stored. With a peer down, the answers carry
//! Prometheus's `warnings` naming it.

use flopwatch_collector::{digest, server, Auth};
use flopwatch_config::{CollectorConfig, QueryToken, SpecTable, TenantConfig};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::v1::{self, collector_message};
use flopwatch_tests::raw::RawAgent;
use serde_json::Value as Json;
use std::sync::Arc;

/// One collector of the cluster.
struct Member {
    grpc: String,
    api: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

fn config(dir: &std::path::Path) -> CollectorConfig {
    let tenant = |name: &str| TenantConfig {
        name: name.into(),
        agent_tokens_sha256: vec![digest(&format!("{name}-agent"))],
        query_tokens: vec![QueryToken {
            sha256: digest(&format!("{name}-read")),
        }],
        ..Default::default()
    };
    CollectorConfig {
        data_dir: dir.to_path_buf(),
        admin_tokens_sha256: vec![digest("provider")],
        tenants: vec![tenant("a"), tenant("b")],
        plaintext: true,
        ..Default::default()
    }
}

async fn cluster(root: &std::path::Path, n: usize) -> Vec<Member> {
    let mut grpc = Vec::new();
    for _ in 0..n {
        grpc.push(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
    }
    let urls: Vec<String> = grpc
        .iter()
        .map(|l| format!("http://{}", l.local_addr().unwrap()))
        .collect();
    let mut out = Vec::new();
    for (i, l) in grpc.into_iter().enumerate() {
        let cfg = config(&root.join(format!("c{i}")));
        let c = server::open(
            &cfg.data_dir,
            &cfg,
            SpecTable::builtin(),
            Auth::from_config(&cfg),
            Vec::new(),
            Arc::new(SystemClock),
        )
        .unwrap();
        let api = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api_url = format!("http://{}", api.local_addr().unwrap());
        let serving = server::Serving {
            peers: urls
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, u)| u.clone())
                .collect(),
            api: Some(api),
            ..Default::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = server::serve_cluster(c, l, None, serving, async move {
                let _ = stopped.await;
            })
            .await;
        });
        out.push(Member {
            grpc: urls[i].clone(),
            api: api_url,
            stop: Some(stop),
            task,
        });
    }
    out
}

/// Streams a node of `tenant` with `gpus` (UUID, job) to `url`: 30
/// samples 10 s apart from `t0`.
async fn node(
    url: &str,
    tenant: &str,
    node: &str,
    gpus: &[(&str, Option<&str>)],
    t0: i64,
    seed: f64,
) {
    let hello = v1::Hello {
        agent_id: format!("{node}-{t0}"),
        node: Some(v1::NodeIdentity {
            node_id: node.into(),
            hostname: format!("host-{node}"),
            boot_id: "boot".into(),
            labels: Default::default(),
        }),
        gpus: gpus
            .iter()
            .enumerate()
            .map(|(i, (uuid, _))| v1::GpuInfo {
                uuid: uuid.to_string(),
                index: i as u32,
                model: "NVIDIA H100 80GB HBM3".into(),
                ..Default::default()
            })
            .collect(),
        protocol_version: 1,
        ..Default::default()
    };
    let ch = tonic::transport::Endpoint::from_shared(url.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (mut a, _) = RawAgent::open(ch, Some(&format!("{tenant}-agent")), hello)
        .await
        .unwrap();
    let ts: Vec<i64> = (0..30).map(|k| t0 + k * 10_000).collect();
    let mut series = Vec::new();
    let mut jobs = Vec::new();
    for (g, (uuid, job)) in gpus.iter().enumerate() {
        let tpa: Vec<f64> = (0..30)
            .map(|k| ((seed + g as f64 * 0.37 + k as f64 * 0.013) % 1.0 * 1e4).round() / 1e4)
            .collect();
        for (metric, v) in [
            ("tensor_active", tpa),
            ("sm_clock_avg_mhz", vec![1830.0; 30]),
            ("power_w", (0..30).map(|k| 300.0 + k as f64).collect()),
        ] {
            series.push(v1::Series {
                gpu_uuid: uuid.to_string(),
                metric: metric.into(),
                timestamps_ms: ts.clone(),
                values: v,
                window_ms: vec![10_000; 30],
                ..Default::default()
            });
        }
        if let Some(j) = job {
            jobs.push(v1::JobAssignment {
                gpu_uuid: uuid.to_string(),
                job_id: j.to_string(),
                since_ms: t0,
                ..Default::default()
            });
        }
    }
    let r = a
        .call(v1::Batch {
            seq: 1,
            series,
            jobs,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(matches!(r, collector_message::Msg::Ack(_)), "{r:?}");
}

async fn get(url: &str, path: &str, token: &str, form: &[(&str, String)]) -> Json {
    let http = reqwest::Client::new();
    // Label values are GET only, as in Prometheus.
    let r = if path.contains("/label/") {
        http.get(format!("{url}{path}")).query(form)
    } else {
        http.post(format!("{url}{path}")).form(form)
    };
    let r = r.bearer_auth(token).send().await.unwrap();
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    let body: Json =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {code} {text:?}: {e}"));
    assert_eq!(code, 200, "{path} {form:?}: {body}");
    body
}

fn secs(ms: i64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// An instant query's series as (sorted labels text, value).
async fn instant(url: &str, token: &str, q: &str, t: i64) -> (Vec<(String, f64)>, Json) {
    let body = get(
        url,
        "/api/v1/query",
        token,
        &[("query", q.into()), ("time", secs(t))],
    )
    .await;
    let mut out: Vec<(String, f64)> = body["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["metric"].to_string(),
                s["value"][1].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    (out, body["warnings"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_collector_answers_for_the_whole_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = cluster(dir.path(), 3).await;
    let t0 = SystemClock.now_ms() / 1000 * 1000 - 600_000;
    // Tenant a: job "train" on n1 (collector 0) and n2 (collector 1);
    // GPU-2 of n2 moved to collector 2 after a failover, later samples.
    node(
        &members[0].grpc,
        "a",
        "n1",
        &[("GPU-0", Some("train")), ("GPU-1", Some("train"))],
        t0,
        0.1,
    )
    .await;
    node(
        &members[1].grpc,
        "a",
        "n2",
        &[("GPU-2", Some("train")), ("GPU-3", None)],
        t0,
        0.5,
    )
    .await;
    node(
        &members[2].grpc,
        "a",
        "n2",
        &[("GPU-2", Some("train"))],
        t0 + 300_000,
        0.9,
    )
    .await;
    // Tenant b: one node on collector 2.
    node(
        &members[2].grpc,
        "b",
        "n9",
        &[("GPU-9", Some("other"))],
        t0,
        0.3,
    )
    .await;
    let t = t0 + 295_000;
    let late = t0 + 595_000;

    let mut answers = Vec::new();
    for m in &members {
        let api = &m.api;
        // Tenant a sees its four GPUs on three collectors, not b's.
        let (gpus, w) = instant(api, "a-read", "count(flopwatch_ofu_ratio)", t).await;
        assert_eq!(gpus, vec![("{}".to_string(), 4.0)], "{api}");
        assert!(w.is_null(), "{w}");
        let (uuids, _) = instant(
            api,
            "a-read",
            "count by (UUID) (flopwatch_gpu_power_watts)",
            t,
        )
        .await;
        assert_eq!(uuids.len(), 4);
        // The job spans two collectors; its series is derived from all
        // its GPUs and agrees with averaging them.
        let (job, _) = instant(api, "a-read", "flopwatch_job_ofu_ratio", t).await;
        let (avg, _) = instant(
            api,
            "a-read",
            "avg(flopwatch_ofu_ratio{job_id=\"train\"})",
            t,
        )
        .await;
        assert_eq!(job.len(), 1);
        assert!((job[0].1 - avg[0].1).abs() < 1e-12, "{job:?} {avg:?}");
        let (gpus_in_job, _) = instant(api, "a-read", "flopwatch_job_gpus", t).await;
        assert_eq!(gpus_in_job[0].1, 3.0);
        // GPU-2's samples are on collectors 1 (early) and 2 (late): one
        // series with both.
        let body = get(
            api,
            "/api/v1/query",
            "a-read",
            &[
                (
                    "query",
                    "count_over_time(flopwatch_gpu_power_watts{UUID=\"GPU-2\"}[15m])".into(),
                ),
                ("time", secs(late + 5_000)),
            ],
        )
        .await;
        assert_eq!(body["data"]["result"][0]["value"][1], "60", "{body}");
        // A range query, the series and label endpoints.
        let body = get(
            api,
            "/api/v1/query_range",
            "a-read",
            &[
                ("query", "sum by (node) (flopwatch_gpu_power_watts)".into()),
                ("start", secs(t0 + 60_000)),
                ("end", secs(late)),
                ("step", "60".into()),
            ],
        )
        .await;
        assert_eq!(
            body["data"]["result"].as_array().unwrap().len(),
            2,
            "{body}"
        );
        let series = get(
            api,
            "/api/v1/series",
            "a-read",
            &[("match[]", "flopwatch_gpu_power_watts".into())],
        )
        .await;
        assert_eq!(series["data"].as_array().unwrap().len(), 4, "{series}");
        let values = get(api, "/api/v1/label/UUID/values", "a-read", &[]).await;
        assert_eq!(
            values["data"],
            serde_json::json!(["GPU-0", "GPU-1", "GPU-2", "GPU-3"])
        );
        let labels = get(api, "/api/v1/labels", "b-read", &[]).await;
        assert!(labels["data"]
            .as_array()
            .unwrap()
            .contains(&"job_id".into()));
        let values = get(api, "/api/v1/label/UUID/values", "b-read", &[]).await;
        assert_eq!(values["data"], serde_json::json!(["GPU-9"]));
        // A provider sees both tenants.
        let (all, _) = instant(
            api,
            "provider",
            "count by (tenant) (flopwatch_ofu_ratio)",
            t,
        )
        .await;
        assert_eq!(all.len(), 2);
        answers.push((job, gpus_in_job));
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");

    // Collector 2 stops: the others answer with what they hold, and say
    // which peer is missing.
    let gone = members.pop().unwrap();
    let _ = gone.stop.unwrap().send(());
    let _ = gone.task.await;
    let (gpus, w) = instant(&members[0].api, "a-read", "count(flopwatch_ofu_ratio)", t).await;
    assert_eq!(gpus, vec![("{}".to_string(), 4.0)]);
    let w = w.as_array().cloned().unwrap_or_default();
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(w[0].as_str().unwrap().contains(&gone.grpc), "{w:?}");
    let series = get(
        &members[1].api,
        "/api/v1/series",
        "a-read",
        &[("match[]", "flopwatch_ofu_ratio".into())],
    )
    .await;
    assert!(
        series["warnings"].as_array().is_some_and(|w| w.len() == 1),
        "{series}"
    );
    for m in members {
        let _ = m.stop.unwrap().send(());
        let _ = m.task.await;
    }
}
