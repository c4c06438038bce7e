//! OTLP/HTTP metrics export from the same neutral samples as remote write
//! ([`Sample`], [`Meta`]): an `ExportMetricsServiceRequest`
//! (`opentelemetry.proto.collector.metrics.v1`) in binary protobuf,
//! [`CONTENT_TYPE`], uncompressed.
//!
//! The messages are the official ones (the `opentelemetry-proto` crate,
//! messages only); `tests::field_numbers_match_the_official_schema` pins
//! the bytes of a tiny request to the field numbers of the
//! open-telemetry/opentelemetry-proto files.
//!
//! Mapping (docs/OTLP.md has the table for users):
//! - one `ResourceMetrics` per node: resource attributes `host.name`
//!   (label `hostname`), `flopwatch.node` (`node`), `flopwatch.tenant`
//!   (`tenant`); one scope, `flopwatch`;
//! - a family goes out under the OpenTelemetry hardware semantic
//!   conventions' name where one exists (`hw.power`, `hw.energy`,
//!   `hw.temperature`, `hw.gpu.utilization`, `hw.gpu.memory.usage`,
//!   `hw.errors`), else under a documented `flopwatch.` name ([`MAPPINGS`]);
//!   a family missing there goes out as `flopwatch.` + its name without the
//!   `flopwatch_` prefix, `_total` and unit suffix, `_` → `.`;
//! - the GPU labels become `hw.id` (UUID), `hw.type` = `gpu`, `hw.name`
//!   (`gpu<index>`), `hw.model`, `hw.vendor`; the job labels
//!   `k8s.pod.name`, `k8s.namespace.name`, `k8s.container.name`,
//!   `flopwatch.job.id`, `flopwatch.hpc_job.id` ([`POINT_LABELS`]); any
//!   other label `flopwatch.<label>`; empty values are dropped;
//! - counters are cumulative monotonic sums, up-down counters (memory in
//!   use, as the conventions define it) cumulative non-monotonic sums,
//!   the rest gauges; the start time of a sum is unknown to the collector
//!   and sent as 0, which OTLP defines as "unspecified";
//! - a Prometheus staleness marker becomes a point with the
//!   no-recorded-value flag and no value.

// Used by the sender from the next change.

use crate::remote_write_v2::{meta_for, metric_name, Meta, Sample};
use crate::staleness::STALE_NAN;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::metrics::v1::{
    metric, number_data_point, AggregationTemporality, DataPointFlags, Gauge, Metric,
    NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;
use std::collections::BTreeMap;

/// The `Content-Type` of an OTLP/HTTP binary protobuf request.
pub(crate) const CONTENT_TYPE: &str = "application/x-protobuf";

/// The instrumentation scope every metric is sent under.
pub(crate) const SCOPE: &str = "flopwatch";

/// What kind of OTLP metric a family becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Instrument {
    /// `Gauge`.
    Gauge,
    /// Cumulative, non-monotonic `Sum` (an UpDownCounter).
    UpDownCounter,
    /// Cumulative, monotonic `Sum`.
    Counter,
}

/// How one flopwatch family goes out over OTLP.
#[derive(Debug)]
pub(crate) struct Mapping {
    /// The family's `__name__` as its samples carry it (a counter's with
    /// `_total`).
    pub family: &'static str,
    /// The OTLP metric name.
    pub name: &'static str,
    /// UCUM unit.
    pub unit: &'static str,
    pub instrument: Instrument,
    /// Attributes every point of the family carries (which of several
    /// families that share a metric name it is).
    pub attrs: &'static [(&'static str, &'static str)],
    /// The metric's description; `""` for the family's help.
    pub description: &'static str,
}

const fn map(
    family: &'static str,
    name: &'static str,
    unit: &'static str,
    instrument: Instrument,
    attrs: &'static [(&'static str, &'static str)],
    description: &'static str,
) -> Mapping {
    Mapping {
        family,
        name,
        unit,
        instrument,
        attrs,
        description,
    }
}

use Instrument::{Counter, Gauge as G, UpDownCounter};

const UTILIZATION: &str = "Fraction of time spent in a specific task.";
const PIPES: &str = "Fraction of cycles the GPU's pipe of the given kind was active.";

/// flopwatch family → OTLP metric. The `hw.*` names, units, instruments
/// and attributes are those of the OpenTelemetry hardware semantic
/// conventions (common and GPU metrics, semantic-conventions v1.44.0);
/// `flopwatch.*` are our own. docs/OTLP.md lists the same table.
#[rustfmt::skip]
pub(crate) const MAPPINGS: &[Mapping] = &[
    // OFU and its inputs over the GPU's last batch.
    map("flopwatch_ofu_ratio", "flopwatch.gpu.ofu", "1", G, &[], ""),
    map("flopwatch_ofu_tensor_active_ratio", "flopwatch.gpu.tensor.activity", "1", G, &[], ""),
    map("flopwatch_ofu_sm_clock_hertz", "flopwatch.gpu.sm.clock", "Hz", G, &[], ""),
    // Semantic conventions.
    map("flopwatch_gpu_power_watts", "hw.power", "W", G, &[],
        "Instantaneous power consumed by the component."),
    map("flopwatch_gpu_energy_joules_total", "hw.energy", "J", Counter, &[],
        "Energy consumed by the component."),
    map("flopwatch_gpu_temp_celsius", "hw.temperature", "Cel", G, &[],
        "Temperature in degrees Celsius."),
    map("flopwatch_gpu_gpu_util_ratio", "hw.gpu.utilization", "1", G,
        &[("hw.gpu.task", "general")], UTILIZATION),
    map("flopwatch_gpu_mem_copy_util_ratio", "hw.gpu.utilization", "1", G,
        &[("hw.gpu.task", "memory_copy")], UTILIZATION),
    map("flopwatch_gpu_mem_used_bytes", "hw.gpu.memory.usage", "By", UpDownCounter, &[],
        "GPU memory used."),
    map("flopwatch_gpu_ecc_sbe_total", "hw.errors", "{error}", Counter,
        &[("error.type", "corrected")], "Number of errors encountered by the GPU."),
    map("flopwatch_gpu_ecc_dbe_total", "hw.errors", "{error}", Counter,
        &[("error.type", "uncorrected")], "Number of errors encountered by the GPU."),
    // flopwatch extensions.
    map("flopwatch_gpu_tensor_active_ratio", "flopwatch.gpu.pipe.utilization", "1", G,
        &[("flopwatch.gpu.pipe", "tensor")], PIPES),
    map("flopwatch_gpu_fp16_active_ratio", "flopwatch.gpu.pipe.utilization", "1", G,
        &[("flopwatch.gpu.pipe", "fp16")], PIPES),
    map("flopwatch_gpu_fp32_active_ratio", "flopwatch.gpu.pipe.utilization", "1", G,
        &[("flopwatch.gpu.pipe", "fp32")], PIPES),
    map("flopwatch_gpu_fp64_active_ratio", "flopwatch.gpu.pipe.utilization", "1", G,
        &[("flopwatch.gpu.pipe", "fp64")], PIPES),
    map("flopwatch_gpu_sm_active_ratio", "flopwatch.gpu.sm.activity", "1", G, &[], ""),
    map("flopwatch_gpu_sm_occupancy_ratio", "flopwatch.gpu.sm.occupancy", "1", G, &[], ""),
    map("flopwatch_gpu_dram_active_ratio", "flopwatch.gpu.dram.activity", "1", G, &[], ""),
    map("flopwatch_gpu_sm_clock_hertz", "flopwatch.gpu.sm.frequency", "Hz", G, &[], ""),
    map("flopwatch_gpu_sm_clock_avg_hertz", "flopwatch.gpu.sm.average_frequency", "Hz", G, &[], ""),
    map("flopwatch_gpu_mem_clock_hertz", "flopwatch.gpu.memory.frequency", "Hz", G, &[], ""),
    map("flopwatch_gpu_nvlink_tx_bytes_per_second", "flopwatch.gpu.nvlink.throughput", "By/s", G,
        &[("network.io.direction", "transmit")], "NVLink throughput."),
    map("flopwatch_gpu_nvlink_rx_bytes_per_second", "flopwatch.gpu.nvlink.throughput", "By/s", G,
        &[("network.io.direction", "receive")], "NVLink throughput."),
    map("flopwatch_gpu_pcie_tx_bytes_per_second", "flopwatch.gpu.pcie.throughput", "By/s", G,
        &[("network.io.direction", "transmit")], "PCIe throughput."),
    map("flopwatch_gpu_pcie_rx_bytes_per_second", "flopwatch.gpu.pcie.throughput", "By/s", G,
        &[("network.io.direction", "receive")], "PCIe throughput."),
    map("flopwatch_gpu_throttle_reasons", "flopwatch.gpu.throttle_reasons", "1", G, &[], ""),
    map("flopwatch_gpu_compute_processes", "flopwatch.gpu.compute_processes", "{process}", G, &[], ""),
    map("flopwatch_gpu_nvlink_links_active", "flopwatch.gpu.nvlink.active_links", "{link}", G, &[], ""),
    map("flopwatch_gpu_nvlink_errors_total", "flopwatch.gpu.nvlink.errors", "{error}", Counter, &[], ""),
    map("flopwatch_gpu_pcie_replay_total", "flopwatch.gpu.pcie.replays", "{replay}", Counter, &[], ""),
];

/// Labels that describe the node: label → resource attribute.
pub(crate) const RESOURCE_LABELS: &[(&str, &str)] = &[
    ("hostname", "host.name"),
    ("node", "flopwatch.node"),
    ("tenant", "flopwatch.tenant"),
];

/// Labels of a point: label → attribute. Any other label but `__name__`
/// goes out as `flopwatch.<label>`.
pub(crate) const POINT_LABELS: &[(&str, &str)] = &[
    ("UUID", "hw.id"),
    ("modelName", "hw.model"),
    ("gpu", "flopwatch.gpu.index"),
    ("job_id", "flopwatch.job.id"),
    ("pod", "k8s.pod.name"),
    ("namespace", "k8s.namespace.name"),
    ("container", "k8s.container.name"),
    ("hpc_job", "flopwatch.hpc_job.id"),
];

/// Prometheus unit (as in [`Meta::unit`]) → UCUM, for unmapped families.
const UNITS: &[(&str, &str)] = &[
    ("ratio", "1"),
    ("hertz", "Hz"),
    ("watts", "W"),
    ("celsius", "Cel"),
    ("joules", "J"),
    ("bytes", "By"),
    ("bytes_per_second", "By/s"),
    ("bits_per_second", "bit/s"),
    ("seconds", "s"),
];

/// Where a family's samples go: metric name, unit, instrument,
/// description and the attributes it adds.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    name: String,
    unit: String,
    instrument: Instrument,
    description: String,
    attrs: &'static [(&'static str, &'static str)],
}

/// The target of family `family` (a sample's `__name__`), from
/// [`MAPPINGS`] or, for a family missing there, from its name and metadata.
fn target(family: &str, meta: Option<&Meta>) -> Target {
    let help = meta.map_or("", |m| m.help);
    if let Some(m) = MAPPINGS.iter().find(|m| m.family == family) {
        let description = if m.description.is_empty() {
            help
        } else {
            m.description
        };
        return Target {
            name: m.name.to_string(),
            unit: m.unit.to_string(),
            instrument: m.instrument,
            description: description.to_string(),
            attrs: m.attrs,
        };
    }
    let counter = match meta {
        Some(m) => m.kind == "counter",
        None => family.ends_with("_total"),
    };
    let prom_unit = meta.map_or("", |m| m.unit);
    let mut stem = family.strip_prefix("flopwatch_").unwrap_or(family);
    if counter {
        stem = stem.strip_suffix("_total").unwrap_or(stem);
    }
    if !prom_unit.is_empty() {
        stem = stem
            .strip_suffix(prom_unit)
            .and_then(|s| s.strip_suffix('_'))
            .unwrap_or(stem);
    }
    let unit = UNITS
        .iter()
        .find(|(p, _)| *p == prom_unit)
        .map_or(prom_unit, |(_, u)| u);
    Target {
        name: format!("flopwatch.{}", stem.replace('_', ".")),
        unit: unit.to_string(),
        instrument: if counter { Counter } else { G },
        description: help.to_string(),
        attrs: &[],
    }
}

/// A sample's point attributes, sorted by key: its labels renamed
/// ([`POINT_LABELS`]), the resource labels, `__name__` and empty values
/// left out, plus the GPU's `hw.type`, `hw.name` and `hw.vendor` when it
/// is a GPU's series (it has a `UUID`) and the target's own.
fn point_attrs(labels: &[(String, String)], target: &Target) -> Attrs {
    let mut out: Attrs = Vec::with_capacity(labels.len() + 4);
    let mut gpu = false;
    for (k, v) in labels {
        if v.is_empty() || k == "__name__" || RESOURCE_LABELS.iter().any(|(l, _)| l == k) {
            continue;
        }
        let key = match POINT_LABELS.iter().find(|(l, _)| l == k) {
            Some((_, a)) => (*a).to_string(),
            None => format!("flopwatch.{k}"),
        };
        match k.as_str() {
            "UUID" => gpu = true,
            "gpu" => out.push(("hw.name".into(), format!("gpu{v}"))),
            // NVML's model names start with the vendor's.
            "modelName" if v.to_ascii_uppercase().starts_with("NVIDIA") => {
                out.push(("hw.vendor".into(), "NVIDIA".into()));
            }
            _ => {}
        }
        out.push((key, v.clone()));
    }
    if gpu {
        out.push(("hw.type".into(), "gpu".into()));
    }
    for (k, v) in target.attrs {
        out.push(((*k).to_string(), (*v).to_string()));
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// A sample's resource: the node's attributes, in [`RESOURCE_LABELS`] order.
fn resource_key(labels: &[(String, String)]) -> Vec<(&'static str, String)> {
    RESOURCE_LABELS
        .iter()
        .filter_map(|(l, a)| {
            labels
                .iter()
                .find(|(k, v)| k == l && !v.is_empty())
                .map(|(_, v)| (*a, v.clone()))
        })
        .collect()
}

/// A point's attributes, sorted by key.
type Attrs = Vec<(String, String)>;

/// One metric's points as they are gathered: (attributes, unix ms, value).
struct Gathered {
    target: Target,
    points: Vec<(Attrs, i64, f64)>,
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_string())),
        }),
        ..Default::default()
    }
}

/// Unix ms → unix ns; 0 ("unspecified") before 1970.
fn unix_nanos(ts_ms: i64) -> u64 {
    u64::try_from(ts_ms).unwrap_or(0).saturating_mul(1_000_000)
}

fn data_point(attrs: &[(String, String)], ts_ms: i64, value: f64) -> NumberDataPoint {
    let stale = value.to_bits() == STALE_NAN;
    NumberDataPoint {
        attributes: attrs.iter().map(|(k, v)| kv(k, v)).collect(),
        start_time_unix_nano: 0,
        time_unix_nano: unix_nanos(ts_ms),
        value: (!stale).then_some(number_data_point::Value::AsDouble(value)),
        flags: if stale {
            DataPointFlags::NoRecordedValueMask as u32
        } else {
            0
        },
        ..Default::default()
    }
}

fn metric(g: Gathered) -> Metric {
    let Gathered { target, mut points } = g;
    points.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
    let data_points = points
        .iter()
        .map(|(attrs, ts, v)| data_point(attrs, *ts, *v))
        .collect();
    let data = match target.instrument {
        Instrument::Gauge => metric::Data::Gauge(Gauge { data_points }),
        Instrument::UpDownCounter | Instrument::Counter => metric::Data::Sum(Sum {
            data_points,
            aggregation_temporality: AggregationTemporality::Cumulative as i32,
            is_monotonic: target.instrument == Instrument::Counter,
        }),
    };
    Metric {
        name: target.name,
        description: target.description,
        unit: target.unit,
        data: Some(data),
        ..Default::default()
    }
}

/// The export request of `samples`: one resource per node, metrics by
/// name, points by attributes then time.
pub(crate) fn request(samples: &[Sample], meta: &[Meta]) -> ExportMetricsServiceRequest {
    let mut nodes: BTreeMap<Vec<(&'static str, String)>, BTreeMap<String, Gathered>> =
        BTreeMap::new();
    for s in samples {
        let family = metric_name(s.labels);
        let target = target(family, meta_for(meta, family));
        let attrs = point_attrs(s.labels, &target);
        let metrics = nodes.entry(resource_key(s.labels)).or_default();
        metrics
            .entry(target.name.clone())
            .or_insert_with(|| Gathered {
                target,
                points: Vec::new(),
            })
            .points
            .push((attrs, s.ts_ms, s.value));
    }
    let resource_metrics = nodes
        .into_iter()
        .map(|(resource, metrics)| ResourceMetrics {
            resource: Some(Resource {
                attributes: resource.iter().map(|(k, v)| kv(k, v)).collect(),
                ..Default::default()
            }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                metrics: metrics.into_values().map(metric).collect(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect();
    ExportMetricsServiceRequest { resource_metrics }
}

/// The body of an OTLP/HTTP export of `samples` (uncompressed protobuf).
pub(crate) fn encode_otlp(samples: &[Sample], meta: &[Meta]) -> Vec<u8> {
    request(samples, meta).encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote_write_v2::tests::{at, labels};
    use opentelemetry_proto::tonic::metrics::v1::metric::Data;

    fn gpu(name: &str, node: &str, uuid: &str, index: &str) -> Vec<(String, String)> {
        labels(&[
            ("__name__", name),
            ("gpu", index),
            ("UUID", uuid),
            ("modelName", "NVIDIA H100 80GB HBM3"),
            ("hostname", &format!("{node}.example")),
            ("node", node),
            ("tenant", "t1"),
        ])
    }

    fn attrs(kvs: &[KeyValue]) -> Vec<(String, String)> {
        kvs.iter()
            .map(|kv| {
                let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(any_value::Value::StringValue(s)) => s.clone(),
                    other => panic!("{}: not a string: {other:?}", kv.key),
                };
                (kv.key.clone(), v)
            })
            .collect()
    }

    fn attr<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a str> {
        kvs.iter().find(|kv| kv.key == key).and_then(|kv| {
            match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => Some(s.as_str()),
                _ => None,
            }
        })
    }

    fn decode(samples: &[Sample], meta: &[Meta]) -> ExportMetricsServiceRequest {
        ExportMetricsServiceRequest::decode(encode_otlp(samples, meta).as_slice()).unwrap()
    }

    fn find<'a>(rm: &'a ResourceMetrics, name: &str) -> &'a Metric {
        rm.scope_metrics[0]
            .metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    }

    fn points(m: &Metric) -> &[NumberDataPoint] {
        match m.data.as_ref().unwrap() {
            Data::Gauge(g) => &g.data_points,
            Data::Sum(s) => &s.data_points,
            other => panic!("{other:?}"),
        }
    }

    fn value(p: &NumberDataPoint) -> Option<f64> {
        match p.value {
            Some(number_data_point::Value::AsDouble(v)) => Some(v),
            _ => None,
        }
    }

    const POWER: Meta = Meta {
        name: "flopwatch_gpu_power_watts",
        kind: "gauge",
        help: "Board power draw. In watts.",
        unit: "watts",
    };
    const ENERGY: Meta = Meta {
        name: "flopwatch_gpu_energy_joules",
        kind: "counter",
        help: "Total energy consumed since driver load. In joules.",
        unit: "joules",
    };

    #[test]
    fn one_resource_per_node_with_semconv_names_units_and_attributes() {
        let p0 = gpu("flopwatch_gpu_power_watts", "n1", "GPU-a", "0");
        let mut p1 = gpu("flopwatch_gpu_power_watts", "n1", "GPU-b", "1");
        p1.extend(labels(&[
            ("job_id", "j-7"),
            ("pod", "train-0"),
            ("namespace", "ml"),
            ("container", "main"),
            ("hpc_job", ""),
        ]));
        let e0 = gpu("flopwatch_gpu_energy_joules_total", "n1", "GPU-a", "0");
        let ofu = gpu("flopwatch_ofu_ratio", "n2", "GPU-c", "0");
        let samples = [
            at(&p0, 2_000, 310.0),
            at(&p0, 1_000, 300.0),
            at(&p1, 1_000, 120.0),
            at(&e0, 1_000, 5e6),
            at(&ofu, 1_500, 0.42),
        ];
        let req = decode(&samples, &[POWER, ENERGY]);
        assert_eq!(req.resource_metrics.len(), 2, "one per node");
        let n1 = &req.resource_metrics[0];
        assert_eq!(
            attrs(&n1.resource.as_ref().unwrap().attributes),
            labels(&[
                ("host.name", "n1.example"),
                ("flopwatch.node", "n1"),
                ("flopwatch.tenant", "t1"),
            ])
        );
        assert_eq!(n1.scope_metrics.len(), 1);
        assert_eq!(
            n1.scope_metrics[0].scope.as_ref().unwrap().name,
            "flopwatch"
        );

        let power = find(n1, "hw.power");
        assert_eq!(power.unit, "W");
        assert_eq!(
            power.description,
            "Instantaneous power consumed by the component."
        );
        assert!(matches!(power.data, Some(Data::Gauge(_))));
        let pts = points(power);
        assert_eq!(pts.len(), 3);
        // GPU-a's two points first, in time order, then GPU-b's.
        assert_eq!(attr(&pts[0].attributes, "hw.id"), Some("GPU-a"));
        assert_eq!(pts[0].time_unix_nano, 1_000_000_000);
        assert_eq!(value(&pts[0]), Some(300.0));
        assert_eq!(pts[1].time_unix_nano, 2_000_000_000);
        assert_eq!(value(&pts[1]), Some(310.0));
        assert_eq!(
            attrs(&pts[0].attributes),
            labels(&[
                ("flopwatch.gpu.index", "0"),
                ("hw.id", "GPU-a"),
                ("hw.model", "NVIDIA H100 80GB HBM3"),
                ("hw.name", "gpu0"),
                ("hw.type", "gpu"),
                ("hw.vendor", "NVIDIA"),
            ]),
            "the node's labels are on the resource, not the points"
        );
        let b = &pts[2].attributes;
        assert_eq!(attr(b, "hw.id"), Some("GPU-b"));
        assert_eq!(attr(b, "flopwatch.job.id"), Some("j-7"));
        assert_eq!(attr(b, "k8s.pod.name"), Some("train-0"));
        assert_eq!(attr(b, "k8s.namespace.name"), Some("ml"));
        assert_eq!(attr(b, "k8s.container.name"), Some("main"));
        assert_eq!(
            attr(b, "flopwatch.hpc_job.id"),
            None,
            "empty values are dropped"
        );

        let energy = find(n1, "hw.energy");
        assert_eq!(energy.unit, "J");
        match energy.data.as_ref().unwrap() {
            Data::Sum(s) => {
                assert!(s.is_monotonic);
                assert_eq!(
                    s.aggregation_temporality,
                    AggregationTemporality::Cumulative as i32
                );
                assert_eq!(s.data_points[0].start_time_unix_nano, 0);
                assert_eq!(value(&s.data_points[0]), Some(5e6));
            }
            other => panic!("{other:?}"),
        }

        let n2 = &req.resource_metrics[1];
        assert_eq!(
            attr(&n2.resource.as_ref().unwrap().attributes, "flopwatch.node"),
            Some("n2")
        );
        let ofu = find(n2, "flopwatch.gpu.ofu");
        assert_eq!(ofu.unit, "1");
        assert_eq!(value(&points(ofu)[0]), Some(0.42));
        assert_eq!(n2.scope_metrics[0].metrics.len(), 1);
    }

    #[test]
    fn families_sharing_a_metric_differ_by_attribute() {
        let sbe = gpu("flopwatch_gpu_ecc_sbe_total", "n1", "GPU-a", "0");
        let dbe = gpu("flopwatch_gpu_ecc_dbe_total", "n1", "GPU-a", "0");
        let mem = gpu("flopwatch_gpu_mem_used_bytes", "n1", "GPU-a", "0");
        let util = gpu("flopwatch_gpu_gpu_util_ratio", "n1", "GPU-a", "0");
        let samples = [
            at(&sbe, 1, 4.0),
            at(&dbe, 1, 1.0),
            at(&mem, 1, 8e9),
            at(&util, 1, 0.5),
        ];
        let req = decode(&samples, &[]);
        let rm = &req.resource_metrics[0];
        let errors = find(rm, "hw.errors");
        assert_eq!(errors.unit, "{error}");
        let kinds: Vec<_> = points(errors)
            .iter()
            .map(|p| {
                (
                    attr(&p.attributes, "error.type").unwrap(),
                    value(p).unwrap(),
                )
            })
            .collect();
        assert_eq!(kinds, [("corrected", 4.0), ("uncorrected", 1.0)]);

        // Memory in use is an UpDownCounter in the conventions.
        let usage = find(rm, "hw.gpu.memory.usage");
        assert_eq!(usage.unit, "By");
        match usage.data.as_ref().unwrap() {
            Data::Sum(s) => assert!(!s.is_monotonic),
            other => panic!("{other:?}"),
        }
        let u = find(rm, "hw.gpu.utilization");
        assert_eq!(
            attr(&points(u)[0].attributes, "hw.gpu.task"),
            Some("general")
        );
    }

    #[test]
    fn unmapped_families_fall_back_to_flopwatch_names() {
        let ib = labels(&[
            ("__name__", "flopwatch_device_ib_tx_bytes_per_second"),
            ("kind", "ib_port"),
            ("device", "mlx5_0:1"),
            ("node", "n1"),
        ]);
        let drops = labels(&[
            ("__name__", "flopwatch_device_ib_rx_discards_total"),
            ("node", "n1"),
        ]);
        let meta = [Meta {
            name: "flopwatch_device_ib_tx_bytes_per_second",
            kind: "gauge",
            help: "InfiniBand port transmit throughput.",
            unit: "bytes_per_second",
        }];
        let samples = [at(&ib, 1, 1e9), at(&drops, 1, 3.0)];
        let req = decode(&samples, &meta);
        let rm = &req.resource_metrics[0];
        let tx = find(rm, "flopwatch.device.ib.tx");
        assert_eq!(tx.unit, "By/s");
        assert_eq!(tx.description, "InfiniBand port transmit throughput.");
        assert!(matches!(tx.data, Some(Data::Gauge(_))));
        assert_eq!(
            attrs(&points(tx)[0].attributes),
            labels(&[
                ("flopwatch.device", "mlx5_0:1"),
                ("flopwatch.kind", "ib_port")
            ])
        );
        // No metadata: a `_total` name is a counter.
        let d = find(rm, "flopwatch.device.ib.rx.discards");
        assert!(matches!(d.data, Some(Data::Sum(ref s)) if s.is_monotonic));
    }

    #[test]
    fn staleness_markers_are_points_without_a_value() {
        let p = gpu("flopwatch_gpu_power_watts", "n1", "GPU-a", "0");
        let samples = [at(&p, 5, f64::from_bits(STALE_NAN))];
        let req = decode(&samples, &[]);
        let pt = &points(find(&req.resource_metrics[0], "hw.power"))[0];
        assert_eq!(pt.value, None);
        assert_eq!(pt.flags, DataPointFlags::NoRecordedValueMask as u32);
        assert_eq!(pt.time_unix_nano, 5_000_000);
    }

    #[test]
    fn every_mapping_names_a_distinct_stream() {
        let mut seen = std::collections::HashSet::new();
        for m in MAPPINGS {
            assert!(m.family.starts_with("flopwatch_"), "{}", m.family);
            assert!(
                m.name.starts_with("hw.") || m.name.starts_with("flopwatch."),
                "{}",
                m.name
            );
            assert!(
                seen.insert((m.name, m.attrs)),
                "{} and another family collide",
                m.family
            );
            // Counters' samples carry `_total`, and only theirs.
            assert_eq!(
                m.instrument == Counter,
                m.family.ends_with("_total"),
                "{}",
                m.family
            );
            // A metric shared by several families has one unit, instrument
            // and description.
            for o in MAPPINGS.iter().filter(|o| o.name == m.name) {
                assert_eq!(
                    (o.unit, o.instrument, o.description),
                    (m.unit, m.instrument, m.description)
                );
            }
        }
        let mut families: Vec<_> = MAPPINGS.iter().map(|m| m.family).collect();
        families.sort_unstable();
        families.dedup();
        assert_eq!(families.len(), MAPPINGS.len());
    }

    /// docs/OTLP.md lists every mapping.
    #[test]
    fn otlp_md_lists_every_mapping() {
        let doc = include_str!("../../docs/OTLP.md");
        for m in MAPPINGS {
            let row = format!("| `{}` | `{}` | `{}` |", m.family, m.name, m.unit);
            assert!(doc.contains(&row), "docs/OTLP.md lacks {row}");
        }
    }

    /// Length-delimited field `field` holding `body`.
    fn ld(field: u8, body: &[u8]) -> Vec<u8> {
        let mut out = vec![(field << 3) | 2];
        let mut n = body.len();
        while n >= 0x80 {
            out.push((n as u8 & 0x7f) | 0x80);
            n >>= 7;
        }
        out.push(n as u8);
        out.extend(body);
        out
    }

    /// A string `KeyValue` (key = 1, value = 2 → AnyValue.string_value = 1).
    fn kv_bytes(k: &str, v: &str) -> Vec<u8> {
        [ld(1, k.as_bytes()), ld(2, &ld(1, v.as_bytes()))].concat()
    }

    /// The protobuf of a one-point request, written by hand from the
    /// official field numbers and wire types (opentelemetry-proto
    /// `collector/metrics/v1/metrics_service.proto`, `metrics/v1/metrics.proto`,
    /// `common/v1/common.proto`, `resource/v1/resource.proto`).
    #[test]
    fn field_numbers_match_the_official_schema() {
        let g = labels(&[
            ("__name__", "flopwatch_ofu_ratio"),
            ("node", "n"),
            ("UUID", "u"),
        ]);
        let c = labels(&[
            ("__name__", "flopwatch_gpu_energy_joules_total"),
            ("node", "n"),
        ]);
        let samples = [at(&g, 1, 0.5), at(&c, 2, 2.0)];
        let got = encode_otlp(&samples, &[]);

        // NumberDataPoint: attributes = 7 (KeyValue), start_time_unix_nano = 2
        // (fixed64, 0: omitted), time_unix_nano = 3 (fixed64), as_double = 4
        // (double). prost writes fields in field-number order.
        let point = |attrs: &[Vec<u8>], ns: u64, v: f64| {
            let mut p = vec![(3 << 3) | 1];
            p.extend(ns.to_le_bytes());
            p.push((4 << 3) | 1);
            p.extend(v.to_le_bytes());
            for a in attrs {
                p.extend(ld(7, a));
            }
            p
        };
        // Energy: Metric.name = 1, unit = 3, sum = 7 → Sum { data_points = 1,
        // aggregation_temporality = 2 (CUMULATIVE = 2), is_monotonic = 3 }.
        let mut sum = ld(1, &point(&[], 2_000_000, 2.0));
        sum.extend([2 << 3, 2, 3 << 3, 1]);
        let energy = [
            ld(1, b"hw.energy"),
            ld(2, b"Energy consumed by the component."),
            ld(3, b"J"),
            ld(7, &sum),
        ]
        .concat();
        // OFU: Metric.gauge = 5 → Gauge { data_points = 1 }.
        let attrs = [kv_bytes("hw.id", "u"), kv_bytes("hw.type", "gpu")];
        let ofu = [
            ld(1, b"flopwatch.gpu.ofu"),
            ld(3, b"1"),
            ld(5, &ld(1, &point(&attrs, 1_000_000, 0.5))),
        ]
        .concat();
        // ScopeMetrics { scope = 1 (InstrumentationScope { name = 1,
        // version = 2 }), metrics = 2 }, metrics by name.
        let scope = [
            ld(1, b"flopwatch"),
            ld(2, env!("CARGO_PKG_VERSION").as_bytes()),
        ]
        .concat();
        let scope_metrics = [ld(1, &scope), ld(2, &ofu), ld(2, &energy)].concat();
        // ResourceMetrics { resource = 1 (Resource { attributes = 1 }),
        // scope_metrics = 2 }; ExportMetricsServiceRequest.resource_metrics = 1.
        let resource = ld(1, &kv_bytes("flopwatch.node", "n"));
        let rm = [ld(1, &resource), ld(2, &scope_metrics)].concat();
        assert_eq!(got, ld(1, &rm));
    }
}
