//! The label sets of the series flopwatch exports, shared by the
//! collector's `/metrics` page and its remote_write queue so both name a
//! GPU or a node device the same way, and the Prometheus family of each
//! catalog metric ([`family`]), derived from the catalog's name, unit and
//! aggregation.
//!
//! GPU labels follow dcgm-exporter's (`gpu`, `UUID`, `modelName`,
//! `hostname`) plus `node`, `tenant` and, when the agent attributes the GPU
//! to a job, `job_id`, `pod`, `namespace`, `container`, `hpc_job`.

use crate::live::{DeviceLive, GpuLive};
use flopwatch_proto::metrics::{Aggregation, MetricDef};
use flopwatch_proto::v1::JobAssignment;

/// A series' labels, in order.
pub(crate) type Labels = Vec<(String, String)>;

/// The labels of one GPU's series.
pub(crate) fn gpu_labels(g: &GpuLive) -> Labels {
    let index = g.index.to_string();
    gpu_label_refs(g, &index)
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// [`gpu_labels`], borrowed from `g`; `index` is its index written out.
pub(crate) fn gpu_label_refs<'a>(g: &'a GpuLive, index: &'a str) -> Vec<(&'static str, &'a str)> {
    label_refs(
        index,
        [&g.uuid, &g.model, &g.hostname, &g.node_id, &g.tenant],
        g.job.as_ref(),
    )
}

/// A GPU's labels, borrowed: `index` written out, then its UUID, model,
/// hostname, node and tenant, and its job's when it has one.
pub(crate) fn label_refs<'a>(
    index: &'a str,
    [uuid, model, hostname, node, tenant]: [&'a str; 5],
    job: Option<&'a JobAssignment>,
) -> Vec<(&'static str, &'a str)> {
    let mut l = Vec::with_capacity(6 + JOB_LABELS.len());
    l.extend([
        ("gpu", index),
        ("UUID", uuid),
        ("modelName", model),
        ("hostname", hostname),
        ("node", node),
        ("tenant", tenant),
    ]);
    if let Some(j) = job {
        l.extend(job_labels([
            &j.job_id,
            &j.pod,
            &j.namespace,
            &j.container,
            &j.hpc_job,
        ]));
    }
    l
}

/// The names of a GPU's job labels, in the order they are given.
pub(crate) const JOB_LABELS: [&str; 5] = ["job_id", "pod", "namespace", "container", "hpc_job"];

/// Appends a GPU's job labels (`job_id`, `pod`, `namespace`, `container`,
/// `hpc_job`, in that order, as given), leaving out the empty ones.
pub(crate) fn push_job_labels(l: &mut Labels, values: [&String; 5]) {
    l.extend(job_labels(values).map(|(k, v)| (k.to_string(), v.to_string())));
}

/// A GPU's job labels (names as [`JOB_LABELS`], values as given), the
/// empty ones left out.
fn job_labels(values: [&String; 5]) -> impl Iterator<Item = (&'static str, &str)> {
    JOB_LABELS
        .into_iter()
        .zip(values)
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, v.as_str()))
}

/// The labels of one node device's series.
pub(crate) fn device_labels(d: &DeviceLive) -> Labels {
    vec![
        ("kind".into(), d.kind.clone()),
        ("device".into(), d.name.clone()),
        ("device_id".into(), d.id.clone()),
        ("hostname".into(), d.hostname.clone()),
        ("node".into(), d.node_id.clone()),
        ("tenant".into(), d.tenant.clone()),
    ]
}

/// Where a catalog metric's series lives: on a GPU or on a node device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum On {
    /// A GPU: `flopwatch_gpu_…`.
    Gpu,
    /// A node device (InfiniBand port, NUMA node, host): `flopwatch_device_…`.
    Device,
}

/// How a catalog metric is exported: one Prometheus family per metric, in
/// Prometheus base units, so that each family has one unit and `sum()`
/// over it means something.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Family {
    /// The catalog name (`power_w`).
    pub metric: &'static str,
    /// The family name without its unit (`flopwatch_gpu_power`); with the
    /// unit, the name of a gauge's samples (`flopwatch_gpu_power_watts`).
    pub stem: String,
    /// The Prometheus unit (`watts`), when the metric has one.
    pub unit: Option<&'static str>,
    /// What a catalog value is multiplied by to be in `unit` (MHz → Hz).
    pub scale: f64,
    /// A monotonic counter (its samples end in `_total`), else a gauge.
    pub counter: bool,
    /// The catalog's description, with the unit.
    pub help: String,
}

impl Family {
    /// The family name: stem and unit (`flopwatch_gpu_energy_joules`).
    pub(crate) fn name(&self) -> String {
        match self.unit {
            Some(u) => format!("{}_{u}", self.stem),
            None => self.stem.clone(),
        }
    }

    /// The name its samples carry: [`Family::name`], plus `_total` for a
    /// counter (as remote write and PromQL see it).
    pub(crate) fn sample_name(&self) -> String {
        if self.counter {
            format!("{}_total", self.name())
        } else {
            self.name()
        }
    }
}

/// Catalog unit → Prometheus base unit, the factor into it, and the suffix
/// a catalog name carries for that unit (dropped, the base unit replacing
/// it). A catalog unit missing here fails `every_catalog_metric_has_a_family`.
const UNITS: &[(&str, Option<&str>, f64, &str)] = &[
    ("ratio", Some("ratio"), 1.0, ""),
    ("MHz", Some("hertz"), 1e6, "_mhz"),
    ("W", Some("watts"), 1.0, "_w"),
    ("Cel", Some("celsius"), 1.0, "_c"),
    ("J", Some("joules"), 1.0, "_j"),
    ("By", Some("bytes"), 1.0, "_bytes"),
    ("By/s", Some("bytes_per_second"), 1.0, "_bytes_s"),
    ("Gb/s", Some("bits_per_second"), 1e9, "_gbps"),
    ("1", None, 1.0, ""),
    ("bitmask", None, 1.0, ""),
];

/// The family of a catalog metric on `on`; `None` for a unit the table
/// above does not know (caught by its test, never at run time).
pub(crate) fn family(def: &MetricDef, on: On) -> Option<Family> {
    let &(_, unit, scale, suffix) = UNITS.iter().find(|u| u.0 == def.unit)?;
    let counter = def.aggregation == Aggregation::Counter;
    let mut stem = def.name.strip_suffix("_total").unwrap_or(def.name);
    stem = stem.strip_suffix(suffix).unwrap_or(stem);
    let prefix = match on {
        On::Gpu => "flopwatch_gpu_",
        On::Device => "flopwatch_device_",
    };
    let help = match unit {
        Some(u) => format!("{} In {}.", def.help, u.replace('_', " ")),
        None => def.help.to_string(),
    };
    Some(Family {
        metric: def.name,
        stem: format!("{prefix}{stem}"),
        unit,
        scale,
        counter,
        help,
    })
}

/// The family of the catalog metric named `metric`, if it is one.
pub(crate) fn family_of(metric: &str, on: On) -> Option<Family> {
    family(flopwatch_proto::metrics::lookup(metric)?, on)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_proto::metrics::CATALOG;
    use std::collections::BTreeSet;

    fn valid(name: &str) -> bool {
        let mut c = name.chars();
        c.next()
            .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
            && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
    }

    #[test]
    fn every_catalog_metric_has_a_family() {
        let mut names = BTreeSet::new();
        for on in [On::Gpu, On::Device] {
            for def in CATALOG {
                let f = family(def, on)
                    .unwrap_or_else(|| panic!("{}: unit {} has no mapping", def.name, def.unit));
                let name = f.sample_name();
                assert!(valid(&name), "{name}");
                // One unit per family, named at its end; counters end in
                // _total exactly once.
                if let Some(u) = f.unit {
                    assert!(f.name().ends_with(&format!("_{u}")), "{name}");
                }
                assert_eq!(f.counter, name.ends_with("_total"), "{name}");
                assert!(!f.name().ends_with("_total"), "{name}");
                // No catalog unit left in the name.
                for old in ["_mhz", "_gbps", "_bytes_s", "_w_", "_j_", "_c_"] {
                    assert!(!name.contains(old), "{name}");
                }
                assert!(names.insert(name.clone()), "{name} twice");
                // Nor a clash with the families the exporter adds itself.
                assert!(!FIXED.contains(&name.as_str()), "{name} is taken");
            }
        }
        assert_eq!(names.len(), 2 * CATALOG.len());
    }

    #[test]
    fn counters_md_lists_every_family() {
        let doc = std::fs::read_to_string(
            std::path::PathBuf::from(
                std::env::var_os("CARGO_MANIFEST_DIR")
                    .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into()),
            )
            .join("../docs/COUNTERS.md"),
        )
        .unwrap();
        for def in CATALOG {
            let named = [On::Gpu, On::Device]
                .iter()
                .filter_map(|on| family(def, *on))
                .any(|f| doc.contains(&format!("`{}`", f.sample_name())));
            assert!(
                named,
                "docs/COUNTERS.md does not name {}'s family",
                def.name
            );
        }
    }

    /// Per-GPU families the exporter writes besides the catalog's.
    const FIXED: &[&str] = &[
        "flopwatch_gpu_last_sample_timestamp_seconds",
        "flopwatch_gpu_xid_errors_total",
        "flopwatch_gpu_sampling_interval_seconds",
        "flopwatch_device_sampling_interval_seconds",
    ];

    #[test]
    fn units_are_converted_to_base_units() {
        let f = family_of("sm_clock_mhz", On::Gpu).unwrap();
        assert_eq!(f.sample_name(), "flopwatch_gpu_sm_clock_hertz");
        assert_eq!(f.scale, 1e6);
        let f = family_of("energy_j", On::Gpu).unwrap();
        assert_eq!(f.sample_name(), "flopwatch_gpu_energy_joules_total");
        assert!(f.counter);
        assert_eq!(
            family_of("power_w", On::Gpu).unwrap().sample_name(),
            "flopwatch_gpu_power_watts"
        );
        assert_eq!(
            family_of("temp_c", On::Gpu).unwrap().sample_name(),
            "flopwatch_gpu_temp_celsius"
        );
        assert_eq!(
            family_of("tensor_active", On::Gpu).unwrap().sample_name(),
            "flopwatch_gpu_tensor_active_ratio"
        );
        assert_eq!(
            family_of("ecc_dbe_total", On::Gpu).unwrap().sample_name(),
            "flopwatch_gpu_ecc_dbe_total"
        );
        let f = family_of("ib_link_rate_gbps", On::Device).unwrap();
        assert_eq!(
            f.sample_name(),
            "flopwatch_device_ib_link_rate_bits_per_second"
        );
        assert_eq!(f.scale, 1e9);
        assert_eq!(
            family_of("nvlink_tx_bytes_s", On::Gpu)
                .unwrap()
                .sample_name(),
            "flopwatch_gpu_nvlink_tx_bytes_per_second"
        );
        assert!(family_of("no_such_metric", On::Gpu).is_none());
    }
}
