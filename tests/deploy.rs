//! The deployment files under `deploy/`, checked as an operator would rely
//! on them:
//!
//! - every Kubernetes manifest deserializes into its typed `k8s-openapi`
//!   struct and survives the round trip without losing a key (serde ignores
//!   unknown fields, so `hostPid` for `hostPID` would otherwise pass);
//! - the manifests agree with each other (Services select the pods they
//!   name, probes and Services point at ports that exist, the token the
//!   agent reads is the Secret the collector knows the digest of) and with
//!   the configs they embed, which parse with the real loaders and the
//!   environment overrides the pods set;
//! - the Prometheus Operator's kinds in deploy/k8s/monitoring (not in the
//!   Kubernetes API types) deserialize into structs of the fields the
//!   bundle uses, which refuse any other, and select the pods and ports
//!   that exist;
//! - the systemd units, the Prometheus scrape configs, the alerting rules
//!   and the Grafana dashboard name ports, keys and metrics that exist.

use flopwatch_config::{AgentConfig, CollectorConfig, Validate};
use k8s_openapi::api::apps::v1::{DaemonSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, PodTemplateSpec, Secret, Service, ServiceAccount,
    Volume,
};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every metric the collector and the agent export on `/metrics`.
const EXPORTED_METRICS: &[&str] = &[
    "flopwatch_ofu_ratio",
    "flopwatch_ofu_tensor_active_ratio",
    "flopwatch_ofu_sm_clock_hertz",
    "flopwatch_node_ofu_ratio",
    "flopwatch_job_ofu_ratio",
    "flopwatch_gpu_power_watts",
    "flopwatch_gpu_last_sample_timestamp_seconds",
    "flopwatch_gpu_xid_errors_total",
    "flopwatch_build_info",
    "flopwatch_ingest_samples_total",
    "flopwatch_ingest_batches_total",
    "flopwatch_ingest_rejected_samples_total",
    "flopwatch_ingest_rejected_batches_total",
    "flopwatch_ack_latency_seconds",
    "flopwatch_agents_connected",
    "flopwatch_agent_backlog_bytes",
    "flopwatch_regressions_total",
    "flopwatch_stragglers_total",
    "flopwatch_agent_spool_bytes",
    "flopwatch_agent_sample_interval_seconds",
    "flopwatch_agent_samples_total",
    "flopwatch_agent_captures_total",
    "flopwatch_agent_outbox_batches",
    "flopwatch_mfu_mismatches_total",
    // The ledger's counters per job.
    "flopwatch_ledger_held_seconds_total",
    "flopwatch_ledger_idle_seconds_total",
    "flopwatch_ledger_delivered_flop_total",
    "flopwatch_ledger_unused_flop_total",
    "flopwatch_ledger_energy_joules_total",
    // Per GPU, from the exporter's per-metric families.
    "flopwatch_gpu_last_sample_timestamp_seconds",
    "flopwatch_gpu_xid_errors_total",
];

/// Environment variables the binary reads that are not config overrides.
const NON_OVERRIDE_ENV: &[&str] = &["FLOPWATCH_LOG", "FLOPWATCH_CONFIG"];

/// Values the downward API gives the pods, for loading their configs here.
const DOWNWARD_SAMPLES: &[(&str, &str)] = &[
    ("spec.nodeName", "gpu-node-7"),
    ("metadata.name", "flopwatch-collector-0"),
];

fn deploy_dir() -> PathBuf {
    flopwatch_tests::repo_root().join("deploy")
}

fn k8s_dir() -> PathBuf {
    deploy_dir().join("k8s")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One YAML document of a manifest file.
struct Doc {
    /// `file#index`, for messages.
    origin: String,
    value: Value,
}

/// Every non-empty YAML document in `text`, as JSON values.
fn yaml_documents(text: &str, file: &str) -> Vec<Doc> {
    let mut docs = Vec::new();
    for (i, de) in serde_norway::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(de).unwrap_or_else(|e| panic!("{file}#{i}: {e}"));
        if !value.is_null() {
            docs.push(Doc {
                origin: format!("{file}#{i}"),
                value,
            });
        }
    }
    docs
}

/// The manifest files in deploy/k8s (kustomization.yaml aside), sorted.
fn manifest_files() -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(k8s_dir())
        .expect("deploy/k8s exists")
        .map(|e| {
            e.expect("directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| (n.ends_with(".yaml") || n.ends_with(".yml")) && n != "kustomization.yaml")
        .collect();
    files.sort();
    files
}

/// Every document of every manifest.
fn manifests() -> Vec<Doc> {
    let docs: Vec<Doc> = manifest_files()
        .iter()
        .flat_map(|f| yaml_documents(&read(&k8s_dir().join(f)), f))
        .collect();
    assert!(!docs.is_empty(), "no manifests in deploy/k8s");
    docs
}

fn kind_of(doc: &Doc) -> &str {
    doc.value["kind"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: no `kind`", doc.origin))
}

/// Every manifest of kind `kind`, typed.
fn objects<T: DeserializeOwned>(kind: &str) -> Vec<T> {
    manifests()
        .iter()
        .filter(|d| kind_of(d) == kind)
        .map(|d| {
            serde_json::from_value(d.value.clone()).unwrap_or_else(|e| panic!("{}: {e}", d.origin))
        })
        .collect()
}

/// The only manifest of kind `kind`.
fn one<T: DeserializeOwned>(kind: &str) -> T {
    let mut all = objects::<T>(kind);
    assert_eq!(all.len(), 1, "expected exactly one {kind}");
    all.remove(0)
}

/// Deserializes `value` as `T` and serializes it back.
fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(value.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(&typed).map_err(|e| e.to_string())
}

/// The typed round trip of a manifest by its `kind`; an unknown kind is an
/// error, so that every manifest is checked.
fn typed_round_trip(doc: &Doc) -> Result<Value, String> {
    match kind_of(doc) {
        "Namespace" => round_trip::<Namespace>(&doc.value),
        "ServiceAccount" => round_trip::<ServiceAccount>(&doc.value),
        "Secret" => round_trip::<Secret>(&doc.value),
        "ConfigMap" => round_trip::<ConfigMap>(&doc.value),
        "Service" => round_trip::<Service>(&doc.value),
        "StatefulSet" => round_trip::<StatefulSet>(&doc.value),
        "DaemonSet" => round_trip::<DaemonSet>(&doc.value),
        "PodDisruptionBudget" => round_trip::<PodDisruptionBudget>(&doc.value),
        "PodMonitor" => round_trip::<operator::PodMonitor>(&doc.value),
        "ServiceMonitor" => round_trip::<operator::ServiceMonitor>(&doc.value),
        "PrometheusRule" => round_trip::<operator::PrometheusRule>(&doc.value),
        "NetworkPolicy" => round_trip::<NetworkPolicy>(&doc.value),
        other => Err(format!("unknown kind `{other}`")),
    }
}

/// Drops nulls, empty objects and empty arrays, recursively: the typed
/// structs write an absent optional as nothing.
fn normalize(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Object(m) => {
            let m: serde_json::Map<String, Value> = m
                .iter()
                .filter_map(|(k, v)| normalize(v).map(|v| (k.clone(), v)))
                .collect();
            (!m.is_empty()).then_some(Value::Object(m))
        }
        Value::Array(a) => {
            let a: Vec<Value> = a.iter().filter_map(normalize).collect();
            (!a.is_empty()).then_some(Value::Array(a))
        }
        v => Some(v.clone()),
    }
}

/// Where `typed` lost or changed what `original` says (`path: what`), after
/// normalizing. Keys the typed value adds (`apiVersion` and `kind` of an
/// embedded PersistentVolumeClaim) are not losses.
fn differences(path: &str, original: &Value, typed: &Value, out: &mut Vec<String>) {
    match (original, typed) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => differences(&format!("{path}.{k}"), va, vb, out),
                    None => out.push(format!("{path}.{k}: lost (unknown field?)")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

/// The differences between a document and its typed round trip.
fn lost_keys(original: &Value, typed: &Value) -> Vec<String> {
    let mut out = Vec::new();
    differences(
        "",
        &normalize(original).unwrap_or(Value::Null),
        &normalize(typed).unwrap_or(Value::Null),
        &mut out,
    );
    out
}

#[test]
fn every_manifest_is_a_known_kind_and_round_trips_without_losing_keys() {
    let docs = manifests();
    let mut kinds = BTreeSet::new();
    for doc in &docs {
        let typed = typed_round_trip(doc).unwrap_or_else(|e| panic!("{}: {e}", doc.origin));
        let lost = lost_keys(&doc.value, &typed);
        assert!(lost.is_empty(), "{}: {lost:#?}", doc.origin);
        kinds.insert(kind_of(doc).to_string());
    }
    for kind in [
        "Namespace",
        "ServiceAccount",
        "Secret",
        "ConfigMap",
        "Service",
        "StatefulSet",
        "DaemonSet",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ] {
        assert!(kinds.contains(kind), "no {kind} in deploy/k8s");
    }
}

#[test]
fn round_trip_catches_misspelled_and_unknown_fields() {
    let doc = Doc {
        origin: "inline".into(),
        value: serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": { "name": "x" },
            "spec": {
                "selector": { "matchLabels": { "a": "b" } },
                "template": {
                    "metadata": { "labels": { "a": "b" } },
                    "spec": { "hostPid": true, "containers": [{ "name": "c" }] }
                }
            }
        }),
    };
    let typed = typed_round_trip(&doc).expect("a DaemonSet");
    assert_eq!(
        lost_keys(&doc.value, &typed),
        vec![".spec.template.spec.hostPid: lost (unknown field?)".to_string()]
    );
    let mut unknown = doc;
    unknown.value["kind"] = "CronTab".into();
    assert!(typed_round_trip(&unknown).is_err());
}

#[test]
fn every_namespaced_manifest_is_in_the_namespace_the_bundle_creates() {
    let ns: Namespace = one("Namespace");
    let ns = ns.metadata.name.expect("namespace name");
    for doc in manifests().iter().filter(|d| kind_of(d) != "Namespace") {
        assert_eq!(
            doc.value["metadata"]["namespace"].as_str(),
            Some(ns.as_str()),
            "{}",
            doc.origin
        );
    }
}

#[test]
fn kustomization_lists_exactly_the_manifests() {
    let k = yaml_documents(
        &read(&k8s_dir().join("kustomization.yaml")),
        "kustomization",
    );
    assert_eq!(k.len(), 1);
    let listed: Vec<String> = k[0].value["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_string())
        .collect();
    let unique: BTreeSet<&String> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "listed twice: {listed:?}");
    let mut listed = listed;
    listed.sort();
    assert_eq!(listed, manifest_files());
}

// ---- the workloads ----------------------------------------------------

fn pod_spec(t: &PodTemplateSpec) -> &PodSpec {
    t.spec.as_ref().expect("pod spec")
}

fn labels(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn agent() -> DaemonSet {
    one("DaemonSet")
}

fn collector() -> StatefulSet {
    one("StatefulSet")
}

fn agent_pod() -> PodTemplateSpec {
    agent().spec.template
}

fn collector_pod() -> PodTemplateSpec {
    collector().spec.template
}

/// Every pod template in the bundle, with the workload's name.
fn pod_templates() -> Vec<(String, PodTemplateSpec)> {
    let mut out = Vec::new();
    for d in objects::<DaemonSet>("DaemonSet") {
        out.push((d.metadata.name.clone().unwrap_or_default(), d.spec.template));
    }
    for s in objects::<StatefulSet>("StatefulSet") {
        out.push((s.metadata.name.clone().unwrap_or_default(), s.spec.template));
    }
    out
}

fn volume<'a>(spec: &'a PodSpec, name: &str) -> &'a Volume {
    spec.volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no volume `{name}`"))
}

/// The mount of `container` that holds `path`, and `path` inside it.
fn mount_holding<'a>(container: &'a Container, path: &Path) -> (&'a str, bool, PathBuf) {
    let m = container
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| path.starts_with(&m.mount_path))
        .max_by_key(|m| m.mount_path.len())
        .unwrap_or_else(|| panic!("{}: nothing mounted at {}", container.name, path.display()));
    let rest = path
        .strip_prefix(&m.mount_path)
        .expect("prefix")
        .to_path_buf();
    (&m.name, m.read_only == Some(true), rest)
}

fn only_container(spec: &PodSpec) -> &Container {
    assert_eq!(spec.containers.len(), 1, "one container per pod");
    &spec.containers[0]
}

/// What a pod advertises for scraping (its `metrics` port and its
/// `prometheus.io/port` annotation) is what the process binds, on every
/// interface, so that Prometheus in another pod reaches it.
fn assert_scrapeable(pod: &PodTemplateSpec, c: &Container, metrics_listen: &str) {
    let bound: std::net::SocketAddr = metrics_listen
        .parse()
        .unwrap_or_else(|e| panic!("metrics_listen `{metrics_listen}`: {e}"));
    assert!(
        bound.ip().is_unspecified(),
        "{}: metrics_listen {bound} is not reachable from other pods",
        c.name
    );
    assert_eq!(
        i32::from(bound.port()),
        port_named(c, "metrics"),
        "{}",
        c.name
    );
    let annotated = pod
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get("prometheus.io/port"));
    if let Some(a) = annotated {
        assert_eq!(
            a,
            &bound.port().to_string(),
            "{}: prometheus.io/port",
            c.name
        );
    }
}

fn port_named(c: &Container, name: &str) -> i32 {
    c.ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{}: no port named `{name}`", c.name))
        .container_port
}

/// Literal values of `c`'s environment, downward-API values replaced by
/// the samples above.
fn container_env(c: &Container) -> Vec<(String, String)> {
    c.env
        .iter()
        .flatten()
        .map(|e| {
            let value = match (&e.value, &e.value_from) {
                (Some(v), None) => v.clone(),
                (None, Some(from)) => {
                    let field = &from.field_ref.as_ref().expect("a fieldRef").field_path;
                    DOWNWARD_SAMPLES
                        .iter()
                        .find(|(f, _)| f == field)
                        .unwrap_or_else(|| panic!("{}: no sample for {field}", e.name))
                        .1
                        .to_string()
                }
                _ => panic!("{}: neither a value nor a valueFrom", e.name),
            };
            (e.name.clone(), value)
        })
        .collect()
}

/// The `--config` argument of `c`.
fn config_arg(c: &Container) -> PathBuf {
    let args: Vec<&String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .collect();
    let i = args
        .iter()
        .position(|a| *a == "--config")
        .unwrap_or_else(|| panic!("{}: no --config", c.name));
    PathBuf::from(args.get(i + 1).expect("--config FILE"))
}

/// The config file `c` is started with, read from the ConfigMap mounted
/// where `--config` points, and loaded by the real loader with the
/// container's environment overrides.
fn load_pod_config<T: DeserializeOwned + Validate>(spec: &PodSpec) -> T {
    let c = only_container(spec);
    let path = config_arg(c);
    let (vol, read_only, rest) = mount_holding(c, &path);
    assert!(read_only, "{}: config mount `{vol}` is writable", c.name);
    let cm_name = &volume(spec, vol)
        .config_map
        .as_ref()
        .unwrap_or_else(|| panic!("volume `{vol}` is not a ConfigMap"))
        .name;
    let cm = objects::<ConfigMap>("ConfigMap")
        .into_iter()
        .find(|m| m.metadata.name.as_deref() == Some(cm_name.as_str()))
        .unwrap_or_else(|| panic!("no ConfigMap `{cm_name}`"));
    let key = rest.to_str().expect("utf-8");
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("ConfigMap `{cm_name}` has no `{key}`"));
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(key);
    std::fs::write(&file, text).expect("write config");
    flopwatch_config::load_file_with(&file, &container_env(c))
        .unwrap_or_else(|e| panic!("ConfigMap `{cm_name}` {key}: {e}"))
}

/// Environment variables that look like overrides but name no key are
/// ignored by the loader: a typo would silently do nothing.
fn assert_overrides_name_keys(env: &[(String, String)], keys: &[&str], origin: &str) {
    for (name, _) in env {
        let Some(rest) = name.strip_prefix("FLOPWATCH_") else {
            continue;
        };
        if NON_OVERRIDE_ENV.contains(&name.as_str()) {
            continue;
        }
        let top = rest
            .split("__")
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        assert!(
            keys.contains(&top.as_str()),
            "{origin}: {name} overrides no key"
        );
    }
}

#[test]
fn agent_daemonset_reads_the_host_without_privilege() {
    let pod = agent_pod();
    let spec = pod_spec(&pod);
    assert_eq!(spec.host_pid, Some(true), "hostPID");
    assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
    assert_eq!(
        spec.node_selector
            .as_ref()
            .and_then(|s| s.get("nvidia.com/gpu.present"))
            .map(String::as_str),
        Some("true")
    );
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .any(|t| t.key.as_deref() == Some("nvidia.com/gpu")),
        "tolerates nvidia.com/gpu taints"
    );
    let c = only_container(spec);
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_ne!(sc.privileged, Some(true));
    // All capabilities dropped but SYS_ADMIN, which GPM samples (tensor
    // activity, OFU) need in a container.
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert_eq!(caps.add.as_deref(), Some(&["SYS_ADMIN".to_string()][..]));
    let res = c.resources.as_ref().expect("resources");
    for (what, q) in [("requests", &res.requests), ("limits", &res.limits)] {
        let q = q.as_ref().unwrap_or_else(|| panic!("no {what}"));
        assert!(q.contains_key("cpu") && q.contains_key("memory"), "{what}");
        assert!(!q.contains_key("nvidia.com/gpu"), "the agent claims no GPU");
    }
    assert_eq!(port_named(c, "metrics"), 9401);

    // Every hostPath is mounted read-only, except the spool.
    for m in c.volume_mounts.iter().flatten() {
        if let Some(hp) = &volume(spec, &m.name).host_path {
            if m.name != "spool" {
                assert_eq!(m.read_only, Some(true), "hostPath {} is writable", hp.path);
            }
        }
    }
    let host = |path: &Path| {
        let (vol, ro, rest) = mount_holding(c, path);
        let hp = volume(spec, vol).host_path.as_ref().expect("a hostPath");
        (Path::new(&hp.path).join(rest), ro)
    };
    let cfg: AgentConfig = load_pod_config(spec);
    assert_scrapeable(&pod, c, &cfg.metrics_listen);
    assert_eq!(
        host(&cfg.attribution.proc_root),
        (PathBuf::from("/proc"), true)
    );
    let socket = &cfg.attribution.pod_resources_socket;
    assert_eq!(
        host(socket),
        (
            PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            true
        )
    );
    assert_eq!(
        cfg.node_id, "gpu-node-7",
        "FLOPWATCH_NODE_ID from spec.nodeName"
    );
    assert_eq!(cfg.token, None, "no token in the ConfigMap");
    assert_overrides_name_keys(&container_env(c), AgentConfig::KEYS, "agent DaemonSet");
}

/// The Secret that `spec`'s only container reads at `path`, and the value
/// there.
fn secret_file(spec: &PodSpec, path: &Path) -> (String, String) {
    let (vol, read_only, rest) = mount_holding(only_container(spec), path);
    assert!(read_only, "{} is mounted writable", path.display());
    let sv = volume(spec, vol).secret.as_ref().expect("a Secret volume");
    let rest = rest.to_str().expect("utf-8");
    let key = match &sv.items {
        Some(items) => {
            &items
                .iter()
                .find(|i| i.path == rest)
                .unwrap_or_else(|| panic!("no item at {rest}"))
                .key
        }
        None => rest,
    };
    let name = sv.secret_name.as_deref().expect("secretName");
    let secret = objects::<Secret>("Secret")
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no Secret `{name}`"));
    let value = secret
        .string_data
        .as_ref()
        .and_then(|d| d.get(key))
        .unwrap_or_else(|| panic!("Secret `{name}` has no `{key}`"));
    (format!("{name}/{key}"), value.trim().to_string())
}

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn collectors_are_each_others_peers_with_a_provider_token() {
    let sts = collector();
    let pod = pod_spec(&sts.spec.template);
    let cfg: CollectorConfig = load_pod_config(pod);
    // One peer URL per replica, through the governing headless Service, on
    // the gRPC port, over TLS.
    let name = sts.metadata.name.as_deref().expect("name");
    let service = sts.spec.service_name.as_deref().expect("serviceName");
    let replicas = sts.spec.replicas.expect("replicas");
    let want: Vec<String> = (0..replicas)
        .map(|i| {
            format!(
                "https://{name}-{i}.{service}.flopwatch.svc:{}",
                cfg.listen.port()
            )
        })
        .collect();
    assert_eq!(cfg.peers, want);
    // Each pod skips itself (collector_id is the pod name).
    for i in 0..replicas {
        let me = format!("{name}-{i}");
        let others = flopwatch_collector::other_peers(&cfg.peers, &me);
        assert_eq!(others.len() as i32, replicas - 1, "{me}");
    }
    // The peer token is a provider credential the peers know.
    let token_file = cfg
        .cluster
        .peer_token_file
        .as_ref()
        .expect("peer_token_file");
    let (secret, token) = secret_file(pod, token_file);
    assert!(
        cfg.admin_tokens_sha256.contains(&sha256_hex(&token)),
        "admin_tokens_sha256 lacks the digest of {secret}"
    );
    // Peers' certificates are checked against the CA that is mounted.
    let ca = cfg.peer_tls.ca.as_ref().expect("peer_tls.ca");
    let (vol, read_only, _) = mount_holding(only_container(pod), ca);
    assert!(read_only);
    assert!(volume(pod, vol).config_map.is_some(), "the CA ConfigMap");
}

#[test]
fn agent_token_comes_from_the_secret_whose_digest_the_collector_holds() {
    let pod = agent_pod();
    let spec = pod_spec(&pod);
    let cfg: AgentConfig = load_pod_config(spec);
    let token_file = cfg.token_file.expect("token_file");
    let (name, token) = secret_file(spec, &token_file);
    let digest = sha256_hex(&token);
    let collector: CollectorConfig = load_pod_config(pod_spec(&collector_pod()));
    assert!(
        collector
            .tenants
            .iter()
            .any(|t| t.agent_tokens_sha256.contains(&digest)),
        "the collector knows no digest of Secret `{name}`"
    );
    assert_eq!(collector.anonymous_tenant, None, "agents must authenticate");
}

#[test]
fn secrets_hold_only_marked_placeholders() {
    let secrets: Vec<Secret> = objects("Secret");
    assert!(secrets
        .iter()
        .any(|s| s.type_.as_deref() == Some("kubernetes.io/tls")));
    for s in &secrets {
        let name = s.metadata.name.as_deref().unwrap_or_default();
        assert!(s.data.is_none(), "{name}: use stringData placeholders");
        let data = s.string_data.as_ref().expect("stringData");
        if s.type_.as_deref() == Some("kubernetes.io/tls") {
            assert!(data.contains_key("tls.crt") && data.contains_key("tls.key"));
        }
        for (k, v) in data {
            assert!(
                v.contains("REPLACE-ME"),
                "{name}/{k} is not a marked placeholder"
            );
        }
    }
}

#[test]
fn collector_statefulset_keeps_its_data_and_has_a_governing_headless_service() {
    let sts = collector();
    let spec = &sts.spec;
    assert_eq!(spec.replicas, Some(3));
    assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
    let pod_labels = labels(&spec.template);
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    assert!(!selector.is_empty());
    assert!(selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));

    let service_name = spec.service_name.as_deref().expect("serviceName");
    let services: Vec<Service> = objects("Service");
    let headless = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(service_name))
        .unwrap_or_else(|| panic!("no Service `{service_name}`"));
    let hs = headless.spec.as_ref().expect("spec");
    assert_eq!(hs.cluster_ip.as_deref(), Some("None"), "headless");
    let hsel = hs.selector.clone().unwrap_or_default();
    assert!(!hsel.is_empty());
    assert!(hsel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    assert!(
        services.iter().any(|s| {
            let s = s.spec.as_ref().expect("spec");
            s.cluster_ip.is_none()
                && s.type_.as_deref().unwrap_or("ClusterIP") == "ClusterIP"
                && s.selector.as_ref() == Some(&hsel)
        }),
        "a ClusterIP Service for queries"
    );

    let claims: Vec<String> = spec
        .volume_claim_templates
        .iter()
        .flatten()
        .map(|p| p.metadata.name.clone().expect("claim name"))
        .collect();
    assert!(!claims.is_empty(), "volumeClaimTemplates");
    let pod = pod_spec(&spec.template);
    let c = only_container(pod);
    let cfg: CollectorConfig = load_pod_config(pod);
    let (vol, read_only, _) = mount_holding(c, &cfg.data_dir);
    assert!(
        claims.iter().any(|n| n == vol),
        "data_dir is on `{vol}`, not a claim"
    );
    assert!(!read_only);
    assert_eq!(cfg.listen.port() as i32, port_named(c, "grpc"));
    assert_scrapeable(&spec.template, c, &cfg.metrics_listen.to_string());
    assert_eq!(port_named(c, "grpc"), 7070);
    assert_eq!(port_named(c, "metrics"), 9400);
    assert!(
        cfg.listen.ip().is_unspecified(),
        "listen reachable by agents"
    );
    assert_eq!(
        cfg.collector_id, "flopwatch-collector-0",
        "from the pod name"
    );
    // The gRPC port serves TLS; the kubelet's grpc probes speak plaintext,
    // so they use the plaintext health port (health_listen).
    assert!(cfg.tls.is_some() && !cfg.plaintext, "gRPC over TLS");
    let health = cfg.health_listen.expect("health_listen for the probes");
    assert_eq!(health.port() as i32, port_named(c, "health"));
    for (what, p) in [
        ("readiness", &c.readiness_probe),
        ("liveness", &c.liveness_probe),
    ] {
        let p = p.as_ref().unwrap_or_else(|| panic!("no {what} probe"));
        assert_eq!(
            p.grpc.as_ref().map(|g| g.port),
            Some(health.port() as i32),
            "{what}: grpc.health.v1 on the plaintext health port"
        );
    }
    // The TLS files come from a mounted Secret.
    let tls = cfg.tls.as_ref().unwrap();
    let (vol, _, _) = mount_holding(c, &tls.cert);
    assert!(
        pod.volumes
            .iter()
            .flatten()
            .any(|v| v.name == vol && v.secret.is_some()),
        "tls.cert is not on a Secret volume"
    );
    let sc = c.security_context.as_ref().expect("securityContext");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_overrides_name_keys(&container_env(c), CollectorConfig::KEYS, "collector");
}

#[test]
fn disruption_budget_covers_the_collectors_and_leaves_room_to_drain() {
    let pdb: PodDisruptionBudget = one("PodDisruptionBudget");
    let spec = pdb.spec.expect("spec");
    let sel = spec
        .selector
        .and_then(|s| s.match_labels)
        .unwrap_or_default();
    let pod_labels = labels(&collector_pod());
    assert!(!sel.is_empty());
    assert!(sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    let replicas = collector().spec.replicas.expect("replicas");
    match spec.min_available {
        Some(IntOrString::Int(n)) => assert!(0 < n && n < replicas, "minAvailable {n}"),
        other => panic!("minAvailable: {other:?}"),
    }
}

#[test]
fn every_probe_and_service_port_exists_on_its_pods() {
    let templates = pod_templates();
    let check = |origin: &str, c: &Container, port: &IntOrString| match port {
        IntOrString::Int(n) => assert!(
            c.ports.iter().flatten().any(|p| p.container_port == *n),
            "{origin}: port {n} not declared by {}",
            c.name
        ),
        IntOrString::String(name) => {
            port_named(c, name);
        }
    };
    let mut probes = 0;
    for (workload, t) in &templates {
        for c in &pod_spec(t).containers {
            for p in [&c.readiness_probe, &c.liveness_probe, &c.startup_probe]
                .into_iter()
                .flatten()
            {
                probes += 1;
                let port = if let Some(g) = &p.grpc {
                    IntOrString::Int(g.port)
                } else if let Some(h) = &p.http_get {
                    h.port.clone()
                } else if let Some(t) = &p.tcp_socket {
                    t.port.clone()
                } else {
                    continue;
                };
                check(workload, c, &port);
            }
        }
    }
    assert!(probes > 0, "no probes at all");
    for svc in objects::<Service>("Service") {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let spec = svc.spec.expect("spec");
        let sel = spec.selector.unwrap_or_default();
        let selected: Vec<&PodTemplateSpec> = templates
            .iter()
            .map(|(_, t)| t)
            .filter(|t| {
                let l = labels(t);
                sel.iter().all(|(k, v)| l.get(k) == Some(v))
            })
            .collect();
        assert!(
            !sel.is_empty() && !selected.is_empty(),
            "Service {name} selects no pods"
        );
        for p in spec.ports.iter().flatten() {
            let target = p.target_port.clone().unwrap_or(IntOrString::Int(p.port));
            for t in &selected {
                check(&name, only_container(pod_spec(t)), &target);
            }
        }
    }
}

/// Agents list every collector replica by its own name through the
/// governing headless Service, as the collectors list their peers: each
/// node homes on one replica by rendezvous hashing and fails over and back
/// by itself, which one ClusterIP address would hide.
#[test]
fn agents_list_each_collector_replica_through_the_headless_service() {
    let cfg: AgentConfig = load_pod_config(pod_spec(&agent_pod()));
    let sts = collector();
    let collector_cfg: CollectorConfig = load_pod_config(pod_spec(&sts.spec.template));
    let ns: Namespace = one("Namespace");
    let ns = ns.metadata.name.expect("name");
    let name = sts.metadata.name.as_deref().expect("name");
    let service = sts.spec.service_name.as_deref().expect("serviceName");
    let replicas = sts.spec.replicas.expect("replicas");
    let port = collector_cfg.listen.port();
    let want: Vec<String> = (0..replicas)
        .map(|i| format!("https://{name}-{i}.{service}.{ns}.svc:{port}"))
        .collect();
    assert_eq!(cfg.collectors, want);
    assert_eq!(
        cfg.collectors, collector_cfg.peers,
        "agents and peers differ"
    );
    // That Service is headless, selects the collectors and has the port.
    let services: Vec<Service> = objects("Service");
    let s = services
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(service))
        .unwrap_or_else(|| panic!("no Service `{service}`"));
    let spec = s.spec.as_ref().expect("spec");
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"), "headless");
    let sel = spec.selector.clone().unwrap_or_default();
    let pod_labels = labels(&sts.spec.template);
    assert!(!sel.is_empty() && sel.iter().all(|(k, v)| pod_labels.get(k) == Some(v)));
    assert!(
        spec.ports
            .iter()
            .flatten()
            .any(|p| p.port == i32::from(port)),
        "Service `{service}` has no port {port}"
    );
}

#[test]
fn agent_runs_node_critical_with_probes_on_its_health_endpoints() {
    let pod = agent_pod();
    let spec = pod_spec(&pod);
    assert_eq!(
        spec.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let c = only_container(spec);
    let cfg: AgentConfig = load_pod_config(spec);
    let bound: std::net::SocketAddr = cfg.metrics_listen.parse().expect("metrics_listen");
    for (what, probe, path) in [
        (
            "liveness",
            &c.liveness_probe,
            flopwatch_transport::metrics_http::LIVENESS_PATH,
        ),
        (
            "readiness",
            &c.readiness_probe,
            flopwatch_transport::metrics_http::READINESS_PATH,
        ),
    ] {
        let p = probe.as_ref().unwrap_or_else(|| panic!("no {what} probe"));
        let get = p
            .http_get
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: not an httpGet probe"));
        assert_eq!(get.path.as_deref(), Some(path), "{what}");
        assert_eq!(
            get.scheme.as_deref().unwrap_or("HTTP"),
            "HTTP",
            "{what}: the metrics listener is plaintext"
        );
        let port = match &get.port {
            IntOrString::Int(n) => *n,
            IntOrString::String(name) => port_named(c, name),
        };
        assert_eq!(
            port,
            i32::from(bound.port()),
            "{what}: not the port the agent serves {path} on"
        );
    }
    // Restarting takes failing probes for a while, not one slow answer.
    let live = c.liveness_probe.as_ref().expect("liveness");
    assert!(live.failure_threshold.unwrap_or(3) >= 3);
    assert!(live.timeout_seconds.unwrap_or(1) >= 2);
}

// ---- Prometheus Operator ----------------------------------------------

/// The Prometheus Operator's kinds (monitoring.coreos.com/v1), which
/// k8s-openapi does not know: the fields the bundle uses, refusing any
/// other, so that a misspelled field fails here rather than being dropped
/// by the API server's pruning.
mod operator {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use serde::{Deserialize, Serialize};
    use std::collections::BTreeMap;

    pub(crate) const API_VERSION: &str = "monitoring.coreos.com/v1";

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub(crate) struct Object<S> {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: S,
    }

    pub(crate) type PodMonitor = Object<PodMonitorSpec>;
    pub(crate) type ServiceMonitor = Object<ServiceMonitorSpec>;
    pub(crate) type PrometheusRule = Object<PrometheusRuleSpec>;

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub(crate) struct PodMonitorSpec {
        pub selector: LabelSelector,
        pub pod_metrics_endpoints: Vec<Endpoint>,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub(crate) struct ServiceMonitorSpec {
        pub selector: LabelSelector,
        pub endpoints: Vec<Endpoint>,
    }

    /// A PodMonitor's podMetricsEndpoint or a ServiceMonitor's endpoint.
    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub(crate) struct Endpoint {
        pub port: String,
        pub path: String,
        pub interval: Option<String>,
        pub honor_labels: Option<bool>,
        #[serde(default)]
        pub relabelings: Vec<Relabeling>,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub(crate) struct Relabeling {
        #[serde(default)]
        pub source_labels: Vec<String>,
        pub target_label: Option<String>,
        pub regex: Option<String>,
        pub replacement: Option<String>,
        pub action: Option<String>,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct PrometheusRuleSpec {
        pub groups: Vec<RuleGroup>,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct RuleGroup {
        pub name: String,
        pub rules: Vec<Rule>,
    }

    #[derive(Debug, Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct Rule {
        pub alert: Option<String>,
        pub record: Option<String>,
        pub expr: String,
        #[serde(rename = "for")]
        pub for_: Option<String>,
        pub labels: Option<BTreeMap<String, String>>,
        pub annotations: Option<BTreeMap<String, String>>,
    }
}

fn monitoring_dir() -> PathBuf {
    k8s_dir().join("monitoring")
}

/// Every document of deploy/k8s/monitoring (kustomization.yaml aside).
fn monitoring_manifests() -> Vec<Doc> {
    let mut files: Vec<String> = std::fs::read_dir(monitoring_dir())
        .expect("deploy/k8s/monitoring exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    files
        .iter()
        .flat_map(|f| yaml_documents(&read(&monitoring_dir().join(f)), f))
        .collect()
}

fn monitoring_one<T: DeserializeOwned>(kind: &str) -> T {
    let docs: Vec<Doc> = monitoring_manifests()
        .into_iter()
        .filter(|d| kind_of(d) == kind)
        .collect();
    assert_eq!(docs.len(), 1, "expected exactly one {kind}");
    serde_json::from_value(docs[0].value.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
}

#[test]
fn monitoring_manifests_are_operator_kinds_in_the_bundle_namespace() {
    let ns: Namespace = one("Namespace");
    let ns = ns.metadata.name.expect("namespace name");
    let mut kinds = BTreeSet::new();
    for doc in monitoring_manifests() {
        let typed = typed_round_trip(&doc).unwrap_or_else(|e| panic!("{}: {e}", doc.origin));
        let lost = lost_keys(&doc.value, &typed);
        assert!(lost.is_empty(), "{}: {lost:#?}", doc.origin);
        assert_eq!(
            doc.value["apiVersion"],
            operator::API_VERSION,
            "{}",
            doc.origin
        );
        assert_eq!(
            doc.value["metadata"]["namespace"].as_str(),
            Some(ns.as_str()),
            "{}",
            doc.origin
        );
        assert!(doc.value["metadata"]["name"].is_string(), "{}", doc.origin);
        kinds.insert(kind_of(&doc).to_string());
    }
    assert_eq!(
        kinds,
        ["PodMonitor", "PrometheusRule", "ServiceMonitor"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

#[test]
fn operator_kinds_refuse_misspelled_fields() {
    let doc = Doc {
        origin: "inline".into(),
        value: serde_json::json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PodMonitor",
            "metadata": { "name": "x" },
            "spec": {
                "selector": { "matchLabels": { "a": "b" } },
                "podMetricEndpoints": [{ "port": "metrics", "path": "/metrics" }]
            }
        }),
    };
    let e = typed_round_trip(&doc).expect_err("podMetricEndpoints is no field");
    assert!(e.contains("podMetricEndpoints"), "{e}");
}

/// The Operator's CRDs are not on every cluster: `kubectl apply -k
/// deploy/k8s` must not need them, and the monitoring kustomization lists
/// exactly its own files.
#[test]
fn monitoring_is_a_kustomization_of_its_own() {
    let main = yaml_documents(&read(&k8s_dir().join("kustomization.yaml")), "main");
    for r in main[0].value["resources"].as_array().expect("resources") {
        assert!(
            !r.as_str().unwrap_or_default().contains("monitoring"),
            "{r}"
        );
    }
    for doc in manifests() {
        assert_ne!(
            doc.value["apiVersion"],
            operator::API_VERSION,
            "{}",
            doc.origin
        );
    }
    let k = yaml_documents(
        &read(&monitoring_dir().join("kustomization.yaml")),
        "monitoring",
    );
    let mut listed: Vec<String> = k[0].value["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("a file").to_string())
        .collect();
    listed.sort();
    let mut files: Vec<String> = std::fs::read_dir(monitoring_dir())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    files.sort();
    assert_eq!(listed, files);
}

/// What the alerting rules find targets by: `component`, set from the
/// pod's component label.
fn assert_sets_component(origin: &str, e: &operator::Endpoint) {
    assert!(
        e.relabelings.iter().any(|r| {
            r.target_label.as_deref() == Some("component")
                && r.source_labels == ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]
                && r.action.as_deref().unwrap_or("replace") == "replace"
        }),
        "{origin}: no `component` label"
    );
    assert_eq!(e.honor_labels, Some(true), "{origin}: honorLabels");
    assert_eq!(e.path, "/metrics", "{origin}");
}

fn selects(
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    let want = selector.match_labels.clone().unwrap_or_default();
    assert!(selector.match_expressions.is_none());
    !want.is_empty() && want.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[test]
fn pod_monitor_scrapes_the_agents_metrics_port() {
    let pm: operator::PodMonitor = monitoring_one("PodMonitor");
    let pod = agent_pod();
    assert!(
        selects(&pm.spec.selector, &labels(&pod)),
        "selects no agent pod"
    );
    for (_, t) in pod_templates() {
        if t.metadata.as_ref().map(|m| m.labels.as_ref())
            != pod.metadata.as_ref().map(|m| m.labels.as_ref())
        {
            assert!(
                !selects(&pm.spec.selector, &labels(&t)),
                "selects collectors too"
            );
        }
    }
    let c = only_container(pod_spec(&pod));
    let cfg: AgentConfig = load_pod_config(pod_spec(&pod));
    let bound: std::net::SocketAddr = cfg.metrics_listen.parse().expect("metrics_listen");
    assert_eq!(pm.spec.pod_metrics_endpoints.len(), 1);
    let e = &pm.spec.pod_metrics_endpoints[0];
    assert_eq!(port_named(c, &e.port), i32::from(bound.port()));
    assert_sets_component("PodMonitor", e);
}

/// The ServiceMonitor reaches each collector's metrics port once: of the
/// Services it selects, one has the endpoint's port, and it targets the
/// port the collector serves /metrics on.
#[test]
fn service_monitor_scrapes_each_collector_once() {
    let sm: operator::ServiceMonitor = monitoring_one("ServiceMonitor");
    assert_eq!(sm.spec.endpoints.len(), 1);
    let e = &sm.spec.endpoints[0];
    assert_sets_component("ServiceMonitor", e);
    let pod = collector_pod();
    let c = only_container(pod_spec(&pod));
    let cfg: CollectorConfig = load_pod_config(pod_spec(&pod));
    let with_port: Vec<Service> = objects::<Service>("Service")
        .into_iter()
        .filter(|s| {
            selects(
                &sm.spec.selector,
                &s.metadata.labels.clone().unwrap_or_default(),
            )
        })
        .filter(|s| {
            s.spec
                .iter()
                .flat_map(|s| s.ports.iter().flatten())
                .any(|p| p.name.as_deref() == Some(e.port.as_str()))
        })
        .collect();
    assert_eq!(
        with_port.len(),
        1,
        "scraped through {} Services",
        with_port.len()
    );
    let spec = with_port[0].spec.as_ref().expect("spec");
    assert_eq!(
        spec.cluster_ip.as_deref(),
        Some("None"),
        "every replica, not one of them"
    );
    let sel = spec.selector.clone().unwrap_or_default();
    assert!(sel.iter().all(|(k, v)| labels(&pod).get(k) == Some(v)));
    let p = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some(e.port.as_str()))
        .expect("port");
    let target = match p.target_port.clone().unwrap_or(IntOrString::Int(p.port)) {
        IntOrString::Int(n) => n,
        IntOrString::String(name) => port_named(c, &name),
    };
    assert_eq!(target, i32::from(cfg.metrics_listen.port()));
}

/// The alerting rules (deploy/prometheus/flopwatch-rules.yml, the same
/// groups as the PrometheusRule) name only metrics flopwatch exports, and
/// each has a severity and a summary.
#[test]
fn alerting_rules_use_exported_metrics() {
    let rule: operator::PrometheusRule = monitoring_one("PrometheusRule");
    let exprs: Vec<String> = rule
        .spec
        .groups
        .iter()
        .flat_map(|g| g.rules.iter())
        .map(|r| {
            let name = r.alert.as_deref().unwrap_or("?");
            let labels = r.labels.clone().unwrap_or_default();
            assert!(
                ["critical", "warning", "info"]
                    .contains(&labels.get("severity").map(String::as_str).unwrap_or("")),
                "{name}: severity"
            );
            assert!(
                r.annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("summary")),
                "{name}: summary"
            );
            r.expr.clone()
        })
        .collect();
    let as_dashboard = serde_json::json!({
        "panels": [{ "targets": exprs.iter().map(|e| serde_json::json!({ "expr": e })).collect::<Vec<_>>() }]
    });
    let used = dashboard_metric_names(&as_dashboard);
    let exported: BTreeSet<String> = EXPORTED_METRICS.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?}");
    for needed in [
        "flopwatch_regressions_total",
        "flopwatch_stragglers_total",
        "flopwatch_mfu_mismatches_total",
        "flopwatch_gpu_xid_errors_total",
        "flopwatch_gpu_last_sample_timestamp_seconds",
        "flopwatch_agent_backlog_bytes",
    ] {
        assert!(used.contains(needed), "no alert on {needed}");
    }
}

// ---- Grafana ----------------------------------------------------------

fn dashboard() -> Value {
    serde_json::from_str(&read(&deploy_dir().join("grafana/flopwatch.json")))
        .expect("flopwatch.json is JSON")
}

/// Every panel, those inside rows included.
fn all_panels(v: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in v["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(all_panels(p));
    }
    out
}

/// The PromQL the dashboard runs: panel targets and template variable
/// queries.
fn dashboard_queries(json: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for p in all_panels(json) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push(e.to_string());
            }
        }
    }
    for v in json["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" {
            for q in [&v["query"], &v["query"]["query"], &v["definition"]] {
                if let Some(q) = q.as_str() {
                    out.push(q.to_string());
                }
            }
        }
    }
    out
}

/// `q` with the contents of its string literals (label values, which may
/// look like metric names) blanked.
fn without_strings(q: &str) -> String {
    let mut out = String::with_capacity(q.len());
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in q.chars() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if c == '\\' => escaped = true,
            Some(qc) if c == qc => {
                quote = None;
                out.push(c);
            }
            Some(_) => {}
            None => {
                if matches!(c, '"' | '\'' | '`') {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

/// Every `flopwatch_*` metric name in the dashboard's PromQL, histogram
/// series suffixes (`_bucket`, `_sum`, `_count`) stripped to the metric.
fn dashboard_metric_names(json: &Value) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = BTreeSet::new();
    for q in dashboard_queries(json) {
        let q = without_strings(&q);
        let mut rest = q.as_str();
        while let Some(i) = rest.find("flopwatch_") {
            let before = rest[..i].chars().next_back();
            let tail = &rest[i..];
            let len = tail.find(|c: char| !ident(c)).unwrap_or(tail.len());
            if !before.is_some_and(ident) {
                let name = &tail[..len];
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(name);
                names.insert(base.to_string());
            }
            rest = &tail[len..];
        }
    }
    names
}

#[test]
fn dashboard_metric_names_finds_every_name_and_strips_histogram_suffixes() {
    let json = serde_json::json!({
        "templating": { "list": [
            { "type": "query", "query": { "query": "label_values(flopwatch_a, tenant)" } }
        ]},
        "panels": [
            { "type": "row", "panels": [
                { "targets": [{ "expr": "rate(flopwatch_b_seconds_bucket[5m]) / flopwatch_c_total{x=\"flopwatch_not\"}" }] }
            ]},
            { "targets": [{ "expr": "sum(rate(flopwatch_b_seconds_count[1m])) + my_flopwatch_d" }] }
        ]
    });
    let names: Vec<String> = dashboard_metric_names(&json).into_iter().collect();
    assert_eq!(
        names,
        ["flopwatch_a", "flopwatch_b_seconds", "flopwatch_c_total"]
    );
}

/// The Job variable filters every panel whose series carry `job_id` (the
/// per-GPU and per-job families), not one panel of them.
#[test]
fn the_job_variable_filters_every_panel_with_job_labels() {
    let queries = dashboard_queries(&dashboard());
    let mut filtered = 0;
    // Panels' queries, not the variables' own.
    for q in queries.iter().filter(|q| !q.starts_with("label_values(")) {
        let names = [
            "flopwatch_ofu_ratio{",
            "flopwatch_ofu_tensor_active_ratio{",
            "flopwatch_ofu_sm_clock_hertz{",
            "flopwatch_job_ofu_ratio{",
            "flopwatch_gpu_",
        ];
        if names.iter().any(|n| q.contains(n)) {
            assert!(q.contains("job_id=~\"$job\""), "not filtered by $job: {q}");
            filtered += 1;
        }
    }
    assert!(filtered >= 8, "{filtered} panels");
}

#[test]
fn dashboard_uses_only_exported_metrics() {
    let used = dashboard_metric_names(&dashboard());
    let exported: BTreeSet<String> = EXPORTED_METRICS.iter().map(|s| s.to_string()).collect();
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(unknown.is_empty(), "not exported: {unknown:?}");
    for needed in [
        "flopwatch_ofu_ratio",
        "flopwatch_job_ofu_ratio",
        "flopwatch_node_ofu_ratio",
        "flopwatch_gpu_last_sample_timestamp_seconds",
        "flopwatch_gpu_xid_errors_total",
        "flopwatch_regressions_total",
        "flopwatch_stragglers_total",
        "flopwatch_ingest_samples_total",
        "flopwatch_ingest_rejected_samples_total",
        "flopwatch_ack_latency_seconds",
        "flopwatch_agents_connected",
        "flopwatch_agent_backlog_bytes",
        "flopwatch_agent_sample_interval_seconds",
        "flopwatch_agent_samples_total",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}");
    }
}

#[test]
fn every_dashboard_panel_has_a_datasource_and_a_query() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().expect("schemaVersion") >= 36);
    let vars: Vec<&Value> = d["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .collect();
    let var_names: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
    let ds = vars
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(ds["query"], "prometheus");
    let ds_ref = format!("${{{}}}", ds["name"].as_str().expect("name"));
    for v in ["tenant", "hostname", "job"] {
        assert!(var_names.contains(v), "no `{v}` variable");
    }
    let mut ids = BTreeSet::new();
    let mut shown = 0;
    for p in all_panels(&d) {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "{title}: duplicate id"
        );
        if p["type"] == "row" {
            continue;
        }
        shown += 1;
        assert_eq!(
            p["datasource"]["uid"],
            ds_ref.as_str(),
            "{title}: datasource"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no targets");
        for t in targets {
            assert_eq!(
                t["datasource"]["uid"],
                ds_ref.as_str(),
                "{title}: target datasource"
            );
            let expr = t["expr"].as_str().unwrap_or_default();
            assert!(!expr.trim().is_empty(), "{title}: empty expr");
            // Every $variable a query uses is defined (Grafana's own
            // `$__...` aside).
            for part in expr.split('$').skip(1) {
                let name: String = part
                    .trim_start_matches('{')
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                assert!(
                    name.starts_with("__") || var_names.contains(name.as_str()),
                    "{title}: ${name} is not a variable"
                );
            }
        }
    }
    assert!(shown >= 10, "only {shown} panels");
}

// ---- Grafana data source ----------------------------------------------

/// The one data source of deploy/grafana/datasource.yml.
fn grafana_datasource() -> Value {
    let file = "grafana/datasource.yml";
    let docs = yaml_documents(&read(&deploy_dir().join(file)), file);
    assert_eq!(docs.len(), 1, "{file}: one document");
    let v = &docs[0].value;
    assert_eq!(
        v["apiVersion"], 1,
        "{file}: Grafana provisioning apiVersion"
    );
    let list = v["datasources"].as_array().expect("datasources");
    assert_eq!(list.len(), 1, "{file}: one data source");
    list[0].clone()
}

/// Grafana reads the collectors' Prometheus API where the bundle serves
/// it: the URL names the ClusterIP Service in its namespace (the name the
/// collectors' certificate carries), on the Service port that leads to the
/// container port `prometheus_api.listen` binds, over the TLS that
/// `[prometheus_api.tls]` serves, with a bearer token in the
/// Authorization header; only the monitoring namespace may connect.
#[test]
fn grafana_datasource_reads_the_collectors_prometheus_api() {
    let ds = grafana_datasource();
    assert_eq!(ds["type"], "prometheus");
    assert_eq!(ds["access"], "proxy");
    let url = ds["url"].as_str().expect("url");
    let rest = url
        .strip_prefix("https://")
        .expect("https: the bundle serves the API over TLS");
    let (host, port) = rest
        .trim_end_matches('/')
        .rsplit_once(':')
        .expect("HOST:PORT");
    let port: i32 = port.parse().expect("a port number");
    let parts: Vec<&str> = host.split('.').collect();
    assert_eq!(parts.len(), 3, "{host}: SERVICE.NAMESPACE.svc");
    assert_eq!((parts[1], parts[2]), ("flopwatch", "svc"), "{host}");
    let svc = objects::<Service>("Service")
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some(parts[0]))
        .unwrap_or_else(|| panic!("no Service {}", parts[0]));
    let spec = svc.spec.expect("spec");
    assert_ne!(
        spec.cluster_ip.as_deref(),
        Some("None"),
        "{host}: not the headless Service"
    );
    let sp = spec
        .ports
        .iter()
        .flatten()
        .find(|p| p.port == port)
        .unwrap_or_else(|| panic!("Service {} has no port {port}", parts[0]));
    let target = match sp.target_port.clone().unwrap_or(IntOrString::Int(port)) {
        IntOrString::String(name) => name,
        IntOrString::Int(n) => panic!("target port by name, not {n}"),
    };
    let pod = collector_pod();
    let container = only_container(pod_spec(&pod));
    let container_port = port_named(container, &target);
    let cfg: CollectorConfig = load_pod_config(pod_spec(&pod));
    let listen = cfg
        .prometheus_api
        .listen_addr()
        .expect("[prometheus_api] listen is set");
    assert!(
        listen.ip().is_unspecified(),
        "{listen}: unreachable from Grafana"
    );
    assert_eq!(
        i32::from(listen.port()),
        container_port,
        "prometheus_api.listen"
    );
    let tls = cfg
        .prometheus_api
        .tls
        .as_ref()
        .expect("[prometheus_api.tls]");
    // The certificate the gRPC port serves, whose SANs name the Service.
    let grpc = cfg.tls.as_ref().expect("[tls]");
    assert_eq!((&tls.cert, &tls.key), (&grpc.cert, &grpc.key));
    // A bearer token from Grafana's environment, never in the file.
    let json = &ds["jsonData"];
    let secure = &ds["secureJsonData"];
    assert_eq!(json["httpHeaderName1"], "Authorization");
    let header = secure["httpHeaderValue1"]
        .as_str()
        .expect("httpHeaderValue1");
    assert!(
        header.starts_with("Bearer $"),
        "{header}: a token from the environment"
    );
    assert_eq!(json["tlsAuthWithCACert"], true);
    assert!(secure["tlsCACert"].as_str().is_some_and(|c| !c.is_empty()));
    assert_eq!(json["prometheusType"], "Prometheus");
    assert_eq!(
        json["prometheusVersion"],
        flopwatch_collector::promql::API_VERSION,
        "what /api/v1/status/buildinfo reports"
    );
    // The NetworkPolicy admits the monitoring namespace to that port.
    let policies = objects::<NetworkPolicy>("NetworkPolicy");
    let open = policies
        .iter()
        .flat_map(|p| p.spec.iter())
        .flat_map(|s| s.ingress.iter().flatten())
        .any(|rule| {
            rule.ports
                .iter()
                .flatten()
                .any(|p| p.port == Some(IntOrString::String(target.clone())))
                && rule.from.as_ref().is_some_and(|f| !f.is_empty())
                && rule.from.iter().flatten().all(|peer| {
                    peer.namespace_selector
                        .as_ref()
                        .and_then(|n| n.match_labels.as_ref())
                        .and_then(|l| l.get("kubernetes.io/metadata.name"))
                        .is_some_and(|n| n == "monitoring")
                })
        });
    assert!(
        open,
        "no NetworkPolicy rule opens {target} to the monitoring namespace"
    );
}

/// The dashboard runs on the flopwatch data source as on a Prometheus:
/// its data source variable offers every Prometheus-type data source,
/// the provisioned one included, and every panel uses it.
#[test]
fn dashboard_can_use_the_provisioned_datasource() {
    let ds = grafana_datasource();
    let d = dashboard();
    let var = d["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(var["query"], ds["type"]);
    let regex = var["regex"].as_str().unwrap_or_default();
    assert!(
        regex.is_empty(),
        "a regex `{regex}` could hide a data source"
    );
    let uid = format!("${{{}}}", var["name"].as_str().unwrap());
    for p in all_panels(&d) {
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], uid.as_str(), "{}", p["title"]);
        }
    }
}

// ---- Prometheus -------------------------------------------------------

fn prometheus(file: &str) -> Value {
    let docs = yaml_documents(&read(&deploy_dir().join("prometheus").join(file)), file);
    assert_eq!(docs.len(), 1, "{file}: one document");
    docs.into_iter().next().expect("one").value
}

fn scrape_configs(v: &Value) -> &Vec<Value> {
    v["scrape_configs"].as_array().expect("scrape_configs")
}

#[test]
fn prometheus_scrapes_the_collector_and_agent_metrics_ports() {
    let v = prometheus("prometheus.yml");
    let targets: Vec<&str> = scrape_configs(&v)
        .iter()
        .flat_map(|j| j["static_configs"].as_array().into_iter().flatten())
        .flat_map(|s| s["targets"].as_array().into_iter().flatten())
        .map(|t| t.as_str().expect("a target"))
        .collect();
    // The collector's default metrics_listen, as the systemd unit runs it.
    let collector = CollectorConfig::default().metrics_listen;
    assert_eq!(collector.port(), 9400);
    assert!(
        targets.contains(&collector.to_string().as_str()),
        "{targets:?}"
    );
    assert!(targets.contains(&"127.0.0.1:9401"), "{targets:?}");
    for file in ["prometheus.yml", "prometheus-kubernetes.yml"] {
        let v = prometheus(file);
        let jobs: Vec<&str> = scrape_configs(&v)
            .iter()
            .map(|j| j["job_name"].as_str().expect("job_name"))
            .collect();
        let unique: BTreeSet<&&str> = jobs.iter().collect();
        assert_eq!(unique.len(), jobs.len(), "{file}: duplicate job_name");
        for j in scrape_configs(&v) {
            // flopwatch's own `job`, `pod`, `namespace` labels name the
            // workload and must not become exported_*.
            assert_eq!(j["honor_labels"], true, "{file}: honor_labels");
        }
    }
}

#[test]
fn prometheus_kubernetes_jobs_keep_exactly_the_flopwatch_metrics_ports() {
    let v = prometheus("prometheus-kubernetes.yml");
    // Each job: the rule keeping `label` and its regex.
    let keep = |job: &Value, label: &str| -> String {
        job["relabel_configs"]
            .as_array()
            .expect("relabel_configs")
            .iter()
            .find(|r| r["action"] == "keep" && r["source_labels"] == serde_json::json!([label]))
            .and_then(|r| r["regex"].as_str())
            .unwrap_or_else(|| panic!("no keep on {label}"))
            .to_string()
    };
    let mut scraped = BTreeSet::new();
    for job in scrape_configs(&v) {
        assert_eq!(job["kubernetes_sd_configs"][0]["role"], "pod");
        let app = keep(job, "__meta_kubernetes_pod_label_app_kubernetes_io_name");
        let port = keep(job, "__meta_kubernetes_pod_container_port_name");
        let component = keep(job, "component");
        // Only the collectors' job presents a token: the provider token
        // must never reach an agent on a tenant's node.
        let token = !job["authorization"].is_null();
        assert_eq!(token, component == "collector", "{}", job["job_name"]);
        if token {
            assert_eq!(job["authorization"]["type"], "Bearer");
            assert!(job["authorization"]["credentials_file"].is_string());
        }
        for (workload, t) in pod_templates() {
            let l = labels(&t);
            if l.get("app.kubernetes.io/component") != Some(&component) {
                continue;
            }
            assert_eq!(l.get("app.kubernetes.io/name"), Some(&app), "{workload}");
            port_named(only_container(pod_spec(&t)), &port);
            scraped.insert(workload);
        }
    }
    assert_eq!(scraped.len(), pod_templates().len(), "{scraped:?}");
    // On hosts too, only the collector's job carries the token.
    let v = prometheus("prometheus.yml");
    for job in scrape_configs(&v) {
        let collector = job["job_name"] == "flopwatch-collector";
        assert_eq!(
            !job["authorization"].is_null(),
            collector,
            "{}",
            job["job_name"]
        );
    }
}

/// The NetworkPolicies: a collector's gRPC port from agents and collectors
/// only, its metrics port and the agents' from the monitoring namespace
/// only, and every port they name exists on the pods they select.
#[test]
fn network_policies_open_metrics_to_monitoring_and_grpc_to_agents() {
    let templates = pod_templates();
    let component = |c: &str| -> PodTemplateSpec {
        templates
            .iter()
            .find(|(_, t)| {
                labels(t)
                    .get("app.kubernetes.io/component")
                    .map(String::as_str)
                    == Some(c)
            })
            .unwrap_or_else(|| panic!("no {c} pods"))
            .1
            .clone()
    };
    let selects = |sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
                   t: &PodTemplateSpec| {
        let l = labels(t);
        sel.match_expressions.is_none()
            && sel
                .match_labels
                .iter()
                .flatten()
                .all(|(k, v)| l.get(k) == Some(v))
    };
    let policies = objects::<NetworkPolicy>("NetworkPolicy");
    for c in ["collector", "agent"] {
        let pods = component(c);
        let mine: Vec<&NetworkPolicy> = policies
            .iter()
            .filter(|p| {
                let sel = p.spec.as_ref().and_then(|s| s.pod_selector.as_ref());
                sel.is_some_and(|sel| selects(sel, &pods))
            })
            .collect();
        assert_eq!(mine.len(), 1, "{c}: one policy selects its pods");
        let spec = mine[0].spec.as_ref().unwrap();
        assert_eq!(
            spec.policy_types.as_deref(),
            Some(&["Ingress".to_string()][..])
        );
        let container = only_container(pod_spec(&pods));
        let mut metrics_rules = 0;
        for rule in spec.ingress.iter().flatten() {
            let ports: Vec<String> = rule
                .ports
                .iter()
                .flatten()
                .map(|p| match &p.port {
                    Some(IntOrString::String(s)) => s.clone(),
                    other => panic!("{c}: ports by name, not {other:?}"),
                })
                .collect();
            assert!(
                !ports.is_empty(),
                "{c}: a rule without ports opens every port"
            );
            for port in &ports {
                port_named(container, port);
            }
            let from = rule.from.as_deref().unwrap_or_default();
            if ports.contains(&"metrics".to_string()) {
                metrics_rules += 1;
                assert_eq!(from.len(), 1, "{c}: metrics from one peer");
                let ns = from[0].namespace_selector.as_ref().expect("a namespace");
                assert!(from[0].pod_selector.is_none());
                assert_eq!(
                    ns.match_labels
                        .as_ref()
                        .unwrap()
                        .get("kubernetes.io/metadata.name"),
                    Some(&"monitoring".to_string())
                );
            }
            if ports.contains(&"grpc".to_string()) {
                // Pods of this namespace only: agents and collectors.
                let agent = component("agent");
                assert!(!from.is_empty());
                for peer in from {
                    assert!(peer.namespace_selector.is_none() && peer.ip_block.is_none());
                    let sel = peer.pod_selector.as_ref().expect("a pod selector");
                    assert!(selects(sel, &agent) || selects(sel, &pods), "{sel:?}");
                }
                assert!(from
                    .iter()
                    .any(|p| selects(p.pod_selector.as_ref().unwrap(), &agent)));
            }
            if from.is_empty() {
                // Open to all: only the probe-only health port.
                assert_eq!(ports, ["health"], "{c}");
            }
        }
        assert_eq!(metrics_rules, 1, "{c}");
    }
}

// ---- systemd ----------------------------------------------------------

/// `Key=value` lines of a unit file (sections ignored); repeated keys keep
/// every value.
fn unit(name: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in read(&deploy_dir().join("systemd").join(name)).lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';', '[']) {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{name}: `{line}`"));
        out.entry(k.to_string()).or_default().push(v.to_string());
    }
    out
}

fn unit_value<'a>(u: &'a BTreeMap<String, Vec<String>>, key: &str) -> Option<&'a str> {
    u.get(key).and_then(|v| v.last()).map(String::as_str)
}

/// `Environment=` pairs, `%d` (the credentials directory) expanded.
fn unit_env(u: &BTreeMap<String, Vec<String>>, service: &str) -> Vec<(String, String)> {
    u.get("Environment")
        .into_iter()
        .flatten()
        .map(|e| {
            let (k, v) = e.split_once('=').expect("NAME=value");
            let v = v.replace("%d", &format!("/run/credentials/{service}"));
            (k.to_string(), v)
        })
        .collect()
}

fn example_config(name: &str) -> PathBuf {
    flopwatch_tests::repo_root().join("config").join(name)
}

#[test]
fn systemd_units_run_flopwatch_hardened_and_stop_with_a_flush() {
    for (service, sub) in [
        ("flopwatch-collector.service", "collector"),
        ("flopwatch-agent.service", "agent"),
    ] {
        let u = unit(service);
        assert_eq!(
            unit_value(&u, "ExecStart"),
            Some(
                format!("/usr/local/bin/flopwatch {sub} --config /etc/flopwatch/{sub}.toml")
                    .as_str()
            ),
            "{service}"
        );
        for (k, v) in [
            ("Restart", "on-failure"),
            ("KillSignal", "SIGTERM"),
            ("TimeoutStopSec", "30"),
            ("NoNewPrivileges", "yes"),
            ("ProtectSystem", "strict"),
            ("ProtectHome", "yes"),
            ("PrivateTmp", "yes"),
        ] {
            assert_eq!(unit_value(&u, k), Some(v), "{service}: {k}");
        }
        assert!(
            unit_value(&u, "DynamicUser") == Some("yes") || u.contains_key("User"),
            "{service}: a dedicated user"
        );
    }

    let c = unit("flopwatch-collector.service");
    assert_eq!(unit_value(&c, "StateDirectory"), Some("flopwatch"));
    assert!(c.contains_key("LimitNOFILE"));
    let env = unit_env(&c, "flopwatch-collector.service");
    assert_overrides_name_keys(&env, CollectorConfig::KEYS, "collector unit");
    let cfg: CollectorConfig =
        flopwatch_config::load_file_with(&example_config("collector.toml"), &env)
            .expect("config/collector.toml with the unit's environment");
    assert_eq!(
        cfg.data_dir,
        Path::new("/var/lib/flopwatch"),
        "data_dir in StateDirectory"
    );

    // NVML opens /dev/nvidia*; attribution reads other processes' /proc.
    let a = unit("flopwatch-agent.service");
    for (k, bad) in [
        ("PrivateDevices", &["yes", "true"][..]),
        ("DevicePolicy", &["closed", "strict"][..]),
        ("ProtectProc", &["invisible", "noaccess", "ptraceable"][..]),
        ("ProcSubset", &["pid"][..]),
    ] {
        let v = unit_value(&a, k).unwrap_or_default();
        assert!(!bad.contains(&v), "agent unit: {k}={v}");
    }
    // GPM samples need CAP_SYS_ADMIN, and nothing else is kept; the
    // collector keeps none.
    for k in ["CapabilityBoundingSet", "AmbientCapabilities"] {
        assert_eq!(unit_value(&a, k), Some("CAP_SYS_ADMIN"), "agent unit: {k}");
        assert_eq!(
            unit_value(&c, k).unwrap_or_default(),
            "",
            "collector unit: {k}"
        );
    }
    let env = unit_env(&a, "flopwatch-agent.service");
    assert_overrides_name_keys(&env, AgentConfig::KEYS, "agent unit");
    let cfg: AgentConfig = flopwatch_config::load_file_with(&example_config("agent.toml"), &env)
        .expect("config/agent.toml with the unit's environment");
    assert_eq!(
        cfg.token_file.as_deref(),
        Some(Path::new("/run/credentials/flopwatch-agent.service/token")),
        "token from LoadCredential="
    );
    assert!(
        unit_value(&a, "LoadCredential").is_some_and(|v| v.starts_with("token:")),
        "LoadCredential=token:..."
    );
}
