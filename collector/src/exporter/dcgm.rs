//! dcgm-exporter's own families (`[exporter] dcgm_compat`): the
//! `DCGM_FI_*` names, units and labels dcgm-exporter publishes for the
//! counters flopwatch has, so that its dashboards (Grafana 12239) and
//! alerts (gpu-operator's) work on flopwatch unchanged.
//!
//! Units are dcgm-exporter's, not Prometheus base units: clocks in MHz,
//! utilization in percent, framebuffer in MiB, energy in millijoules. Its
//! counters are exported without the `_total` that OpenMetrics would add,
//! under the type `unknown`, because dashboards query the bare names.
//!
//! Labels: `gpu` (index), `UUID`, `device` (`nvidia<index>`), `modelName`,
//! `Hostname`, and `pod`, `namespace`, `container` when the GPU is
//! attributed to a Kubernetes pod; plus `tenant`, which keeps two tenants'
//! GPUs apart on the provider's page.
//!
//! Fields dcgm-exporter has that flopwatch has no counter for
//! (`DCGM_FI_DEV_FB_FREE`: the agent does not send total memory) are not
//! exported.

use crate::live::GpuLive;
use crate::series::Labels;
use crate::stats::Xid;
use flopwatch_proto::metrics as m;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;

/// One dcgm-exporter field fed by a catalog metric.
struct Field {
    /// The catalog metric.
    metric: &'static str,
    /// dcgm-exporter's name.
    name: &'static str,
    /// Catalog value × this = dcgm-exporter's value.
    scale: f64,
    /// A counter in dcgm-exporter's counters file.
    counter: bool,
    /// dcgm-exporter's description.
    help: &'static str,
}

const MIB: f64 = 1024.0 * 1024.0;

/// Fields and their units, as dcgm-exporter's default counters file
/// describes them.
#[rustfmt::skip]
const FIELDS: &[Field] = &[
    Field { metric: m::SM_CLOCK_MHZ, name: "DCGM_FI_DEV_SM_CLOCK", scale: 1.0, counter: false, help: "SM frequency (in MHz)." },
    Field { metric: m::MEM_CLOCK_MHZ, name: "DCGM_FI_DEV_MEM_CLOCK", scale: 1.0, counter: false, help: "Memory frequency (in MHz)." },
    Field { metric: m::TEMP_C, name: "DCGM_FI_DEV_GPU_TEMP", scale: 1.0, counter: false, help: "GPU temperature (in C)." },
    Field { metric: m::POWER_W, name: "DCGM_FI_DEV_POWER_USAGE", scale: 1.0, counter: false, help: "Power draw (in W)." },
    Field { metric: m::ENERGY_J, name: "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", scale: 1000.0, counter: true, help: "Total energy consumption since boot (in mJ)." },
    Field { metric: m::PCIE_REPLAY_TOTAL, name: "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", scale: 1.0, counter: true, help: "Total number of PCIe retries." },
    Field { metric: m::GPU_UTIL, name: "DCGM_FI_DEV_GPU_UTIL", scale: 100.0, counter: false, help: "GPU utilization (in %)." },
    Field { metric: m::MEM_COPY_UTIL, name: "DCGM_FI_DEV_MEM_COPY_UTIL", scale: 100.0, counter: false, help: "Memory utilization (in %)." },
    Field { metric: m::MEM_USED_BYTES, name: "DCGM_FI_DEV_FB_USED", scale: 1.0 / MIB, counter: false, help: "Framebuffer memory used (in MiB)." },
    Field { metric: m::ECC_SBE_TOTAL, name: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", scale: 1.0, counter: true, help: "Total number of single-bit volatile ECC errors." },
    Field { metric: m::ECC_DBE_TOTAL, name: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", scale: 1.0, counter: true, help: "Total number of double-bit volatile ECC errors." },
    Field { metric: m::THROTTLE_REASONS, name: "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", scale: 1.0, counter: false, help: "Current clock throttle reasons." },
    Field { metric: m::SM_ACTIVE, name: "DCGM_FI_PROF_SM_ACTIVE", scale: 1.0, counter: false, help: "The ratio of cycles an SM has at least 1 warp assigned." },
    Field { metric: m::SM_OCCUPANCY, name: "DCGM_FI_PROF_SM_OCCUPANCY", scale: 1.0, counter: false, help: "The ratio of number of warps resident on an SM." },
    Field { metric: m::TENSOR_ACTIVE, name: "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", scale: 1.0, counter: false, help: "Ratio of cycles the tensor (HMMA) pipe is active." },
    Field { metric: m::DRAM_ACTIVE, name: "DCGM_FI_PROF_DRAM_ACTIVE", scale: 1.0, counter: false, help: "Ratio of cycles the device memory interface is active sending or receiving data." },
    Field { metric: m::FP64_ACTIVE, name: "DCGM_FI_PROF_PIPE_FP64_ACTIVE", scale: 1.0, counter: false, help: "Ratio of cycles the fp64 pipes are active." },
    Field { metric: m::FP32_ACTIVE, name: "DCGM_FI_PROF_PIPE_FP32_ACTIVE", scale: 1.0, counter: false, help: "Ratio of cycles the fp32 pipes are active." },
    Field { metric: m::FP16_ACTIVE, name: "DCGM_FI_PROF_PIPE_FP16_ACTIVE", scale: 1.0, counter: false, help: "Ratio of cycles the fp16 pipes are active." },
    Field { metric: m::PCIE_TX_BYTES_S, name: "DCGM_FI_PROF_PCIE_TX_BYTES", scale: 1.0, counter: false, help: "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second." },
    Field { metric: m::PCIE_RX_BYTES_S, name: "DCGM_FI_PROF_PCIE_RX_BYTES", scale: 1.0, counter: false, help: "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second." },
    Field { metric: m::NVLINK_TX_BYTES_S, name: "DCGM_FI_PROF_NVLINK_TX_BYTES", scale: 1.0, counter: false, help: "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second." },
    Field { metric: m::NVLINK_RX_BYTES_S, name: "DCGM_FI_PROF_NVLINK_RX_BYTES", scale: 1.0, counter: false, help: "The rate of data received over NVLink, not including protocol headers, in bytes per second." },
];

/// dcgm-exporter's labels for a GPU.
pub fn labels(g: &GpuLive) -> Labels {
    let mut l: Labels = vec![
        ("gpu".into(), g.index.to_string()),
        ("UUID".into(), g.uuid.clone()),
        ("device".into(), format!("nvidia{}", g.index)),
        ("modelName".into(), g.model.clone()),
        ("Hostname".into(), g.hostname.clone()),
        ("tenant".into(), g.tenant.clone()),
    ];
    if let Some(j) = &g.job {
        for (k, v) in [
            ("pod", &j.pod),
            ("namespace", &j.namespace),
            ("container", &j.container),
        ] {
            if !v.is_empty() {
                l.push((k.into(), v.clone()));
            }
        }
    }
    l
}

fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    counter: bool,
    rows: Vec<(Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let kind = if counter {
        MetricType::Unknown
    } else {
        MetricType::Gauge
    };
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (l, v) in rows {
        ConstGauge::new(v).encode(m.encode_family(&l)?)?;
    }
    Ok(())
}

/// Writes the `DCGM_FI_*` families of `gpus` (the metrics `shown` lets
/// through) and the last XID of each.
pub fn encode(
    enc: &mut DescriptorEncoder,
    gpus: &[GpuLive],
    xids: &BTreeMap<(String, String), Xid>,
    shown: &dyn Fn(&String) -> bool,
) -> Result<(), std::fmt::Error> {
    for f in FIELDS {
        let rows: Vec<(Labels, f64)> = gpus
            .iter()
            .filter_map(|g| {
                let (k, (_, v)) = g.counters.get_key_value(f.metric)?;
                shown(k).then(|| (labels(g), v * f.scale))
            })
            .collect();
        family(enc, f.name, f.help, f.counter, rows)?;
    }
    // dcgm-exporter's XID field is the last XID's value, 0 before any.
    family(
        enc,
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        false,
        gpus.iter()
            .map(|g| {
                let last = xids
                    .get(&(g.tenant.clone(), g.uuid.clone()))
                    .map_or(0, |x| x.last);
                (labels(g), last as f64)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_proto::metrics::lookup;
    use std::collections::HashSet;

    #[test]
    fn every_field_comes_from_a_catalog_metric_of_the_same_kind() {
        let mut names = HashSet::new();
        for f in FIELDS {
            let def = lookup(f.metric).unwrap_or_else(|| panic!("{} not in the catalog", f.metric));
            assert_eq!(
                f.counter,
                def.aggregation == m::Aggregation::Counter,
                "{}",
                f.name
            );
            assert!(
                f.name.starts_with("DCGM_FI_") && names.insert(f.name),
                "{}",
                f.name
            );
        }
    }

    #[test]
    fn units_are_dcgm_exporters() {
        let g = GpuLive {
            tenant: "t".into(),
            uuid: "GPU-1".into(),
            index: 3,
            model: "NVIDIA H100 80GB HBM3".into(),
            hostname: "h1".into(),
            counters: [
                (m::ENERGY_J, 2.5),
                (m::GPU_UTIL, 0.42),
                (m::MEM_USED_BYTES, 3.0 * MIB),
                (m::SM_CLOCK_MHZ, 1980.0),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), (1, v)))
            .collect(),
            ..Default::default()
        };
        let mut xids = BTreeMap::new();
        xids.insert(
            ("t".to_string(), "GPU-1".to_string()),
            Xid { count: 2, last: 79 },
        );
        let mut r = prometheus_client::registry::Registry::default();
        r.register_collector(Box::new(Page(vec![g], xids)));
        let text = flopwatch_transport::metrics_http::render(&r);
        let l = r#"{gpu="3",UUID="GPU-1",device="nvidia3",modelName="NVIDIA H100 80GB HBM3",Hostname="h1",tenant="t"}"#;
        for want in [
            format!("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{l} 2500.0\n"),
            format!("DCGM_FI_DEV_GPU_UTIL{l} 42.0\n"),
            format!("DCGM_FI_DEV_FB_USED{l} 3.0\n"),
            format!("DCGM_FI_DEV_SM_CLOCK{l} 1980.0\n"),
            format!("DCGM_FI_DEV_XID_ERRORS{l} 79.0\n"),
            "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown\n".to_string(),
        ] {
            assert!(text.contains(&want), "{want} missing:\n{text}");
        }
        // Only fields with data.
        assert!(!text.contains("DCGM_FI_DEV_POWER_USAGE"), "{text}");
    }

    #[derive(Debug)]
    struct Page(Vec<GpuLive>, BTreeMap<(String, String), Xid>);

    impl prometheus_client::collector::Collector for Page {
        fn encode(&self, mut enc: DescriptorEncoder) -> std::fmt::Result {
            encode(&mut enc, &self.0, &self.1, &|_| true)
        }
    }
}
