//! dcgm-exporter's own families (`[exporter] dcgm_compat`): the
//! `DCGM_FI_*` names, types, units and labels dcgm-exporter 4.5.3-4.8.2
//! publishes with its default counters file, so that its Grafana dashboard
//! (12239), gpu-operator's recording rules and alerts written for
//! dcgm-exporter work on flopwatch unchanged (docs/EXPORTER.md).
//!
//! **Families** ([`FIELDS`]): every family of dcgm-exporter's default
//! counters file but `DCGM_FI_DEV_VGPU_LICENSE_STATUS` (a vGPU guest's
//! license, blank on the bare-metal and passthrough GPUs flopwatch
//! reads), plus `DCGM_FI_DEV_FB_TOTAL` (gpu-operator's recording rules),
//! the ECC totals, the clock event reasons and the profiling fields of its
//! DCP file that flopwatch reads. A family is written when some GPU has
//! data for it; `DCGM_FI_DEV_FB_FREE` is the agent's free-memory reading,
//! else total − used − reserved; `DCGM_FI_DEV_FB_TOTAL` the GPU's memory
//! as its agent described it; `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` the
//! NVLink transmit plus receive throughput in MB/s, as DCGM reports that
//! field (a throughput, though dcgm-exporter types it `counter`).
//!
//! **Units** are dcgm-exporter's, not Prometheus base units: clocks in MHz,
//! utilization in percent, framebuffer in MiB, energy in millijoules.
//! **Types** are dcgm-exporter's: its counters are `# TYPE … counter`
//! under their bare names (no `_total`), because dashboards query those.
//!
//! **Labels**, in dcgm-exporter's order: `gpu` (index), `UUID`,
//! `pci_bus_id`, `device` (`nvidia<index>`), `modelName`, on a MIG
//! instance `GPU_I_PROFILE` and `GPU_I_ID` (and `UUID` its card's, as
//! dcgm-exporter writes it), `Hostname` (the spelling of dcgm-exporter's
//! releases up to 4.5.3-4.8.2), `DCGM_FI_DRIVER_VERSION`, and `container`,
//! `namespace`, `pod` (Kubernetes) or `hpc_job` when the GPU is
//! attributed. The XID family adds `err_code` and `err_msg` ([`xid_text`]).
//! Then flopwatch's own: `instance`, the node's hostname, so that one
//! collector target still gives the dashboard's `$instance`
//! (`label_values(DCGM_FI_DEV_GPU_TEMP, instance)`) one choice per node
//! (the scrape job needs `honor_labels: true`, else Prometheus renames it
//! `exported_instance`), and `tenant`, which keeps two tenants' GPUs apart
//! on a provider's page.
//!
//! **XID**: `DCGM_FI_DEV_XID_ERRORS` is the GPU's last XID: the agent's
//! `xid_last` reading when it sends one (the dcgm-exporter source does,
//! from its first capture, so an XID raised before the agent started
//! shows), else the last XID event its agent reported since this
//! collector started, else 0.

use crate::live::GpuLive;
use crate::series::Labels;
use crate::stats::Xid;
use crate::store::GpuRecord;
use flopwatch_proto::metrics as m;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;

/// Where a family's value comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    /// A catalog metric, times the factor into dcgm-exporter's unit.
    Metric(&'static str, f64),
    /// Free memory: the agent's reading, else total − used − reserved.
    FbFree,
    /// The GPU's memory, as its agent described it.
    FbTotal,
    /// NVLink transmit + receive throughput.
    NvlinkTotal,
}

/// One dcgm-exporter family.
#[derive(Debug)]
struct Field {
    /// dcgm-exporter's name.
    name: &'static str,
    /// Typed `counter` by dcgm-exporter (else `gauge`).
    counter: bool,
    /// Where its value comes from.
    value: Value,
    /// Its description.
    help: &'static str,
}

const MIB: f64 = 1024.0 * 1024.0;
/// Percent per ratio.
const PCT: f64 = 100.0;

const fn field(name: &'static str, counter: bool, value: Value, help: &'static str) -> Field {
    Field {
        name,
        counter,
        value,
        help,
    }
}

const fn gauge(name: &'static str, metric: &'static str, scale: f64, help: &'static str) -> Field {
    field(name, false, Value::Metric(metric, scale), help)
}

const fn counter(
    name: &'static str,
    metric: &'static str,
    scale: f64,
    help: &'static str,
) -> Field {
    field(name, true, Value::Metric(metric, scale), help)
}

/// The families, in the order of dcgm-exporter's default counters file,
/// then the others flopwatch has. `DCGM_FI_DEV_XID_ERRORS` is written
/// apart ([`encode`]).
#[rustfmt::skip]
const FIELDS: &[Field] = &[
    gauge("DCGM_FI_DEV_SM_CLOCK", m::SM_CLOCK_MHZ, 1.0, "SM clock frequency (in MHz)."),
    gauge("DCGM_FI_DEV_MEM_CLOCK", m::MEM_CLOCK_MHZ, 1.0, "Memory clock frequency (in MHz)."),
    gauge("DCGM_FI_DEV_MEMORY_TEMP", m::MEMORY_TEMP_C, 1.0, "Memory temperature (in C)."),
    gauge("DCGM_FI_DEV_GPU_TEMP", m::TEMP_C, 1.0, "GPU temperature (in C)."),
    gauge("DCGM_FI_DEV_POWER_USAGE", m::POWER_W, 1.0, "Power draw (in W)."),
    counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", m::ENERGY_J, 1000.0, "Total energy consumption since boot (in mJ)."),
    counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", m::PCIE_REPLAY_TOTAL, 1.0, "Total number of PCIe retries."),
    gauge("DCGM_FI_DEV_GPU_UTIL", m::GPU_UTIL, PCT, "GPU utilization (in %)."),
    gauge("DCGM_FI_DEV_MEM_COPY_UTIL", m::MEM_COPY_UTIL, PCT, "Memory utilization (in %)."),
    gauge("DCGM_FI_DEV_ENC_UTIL", m::ENC_UTIL, PCT, "Encoder utilization (in %)."),
    gauge("DCGM_FI_DEV_DEC_UTIL", m::DEC_UTIL, PCT, "Decoder utilization (in %)."),
    field("DCGM_FI_DEV_FB_FREE", false, Value::FbFree, "Framebuffer memory free (in MiB)."),
    gauge("DCGM_FI_DEV_FB_USED", m::MEM_USED_BYTES, 1.0 / MIB, "Framebuffer memory used (in MiB)."),
    gauge("DCGM_FI_DEV_FB_RESERVED", m::MEM_RESERVED_BYTES, 1.0 / MIB, "Framebuffer memory reserved (in MiB)."),
    field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", true, Value::NvlinkTotal, "NVLink throughput, transmit plus receive, over all links (in MB/s)."),
    counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", m::REMAPPED_ROWS_UNCORRECTABLE_TOTAL, 1.0, "Number of rows remapped for uncorrectable errors."),
    counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", m::REMAPPED_ROWS_CORRECTABLE_TOTAL, 1.0, "Number of rows remapped for correctable errors."),
    gauge("DCGM_FI_DEV_ROW_REMAP_FAILURE", m::ROW_REMAP_FAILURE, 1.0, "Whether a row remapping has failed."),
    gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", m::GR_ENGINE_ACTIVE, 1.0, "Ratio of time the graphics engine is active."),
    gauge("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", m::TENSOR_ACTIVE, 1.0, "Ratio of cycles the tensor (HMMA) pipe is active."),
    gauge("DCGM_FI_PROF_DRAM_ACTIVE", m::DRAM_ACTIVE, 1.0, "Ratio of cycles the device memory interface is active sending or receiving data."),
    gauge("DCGM_FI_PROF_PCIE_TX_BYTES", m::PCIE_TX_BYTES_S, 1.0, "The rate of data transmitted over the PCIe bus, headers included, in bytes per second."),
    gauge("DCGM_FI_PROF_PCIE_RX_BYTES", m::PCIE_RX_BYTES_S, 1.0, "The rate of data received over the PCIe bus, headers included, in bytes per second."),
    // Beyond the default file.
    field("DCGM_FI_DEV_FB_TOTAL", false, Value::FbTotal, "Framebuffer memory total (in MiB)."),
    counter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", m::ECC_SBE_TOTAL, 1.0, "Total number of single-bit volatile ECC errors."),
    counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", m::ECC_DBE_TOTAL, 1.0, "Total number of double-bit volatile ECC errors."),
    gauge("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", m::THROTTLE_REASONS, 1.0, "Current clock throttle reasons."),
    gauge("DCGM_FI_PROF_SM_ACTIVE", m::SM_ACTIVE, 1.0, "The ratio of cycles an SM has at least 1 warp assigned."),
    gauge("DCGM_FI_PROF_SM_OCCUPANCY", m::SM_OCCUPANCY, 1.0, "The ratio of number of warps resident on an SM."),
    gauge("DCGM_FI_PROF_PIPE_FP64_ACTIVE", m::FP64_ACTIVE, 1.0, "Ratio of cycles the fp64 pipes are active."),
    gauge("DCGM_FI_PROF_PIPE_FP32_ACTIVE", m::FP32_ACTIVE, 1.0, "Ratio of cycles the fp32 pipes are active."),
    gauge("DCGM_FI_PROF_PIPE_FP16_ACTIVE", m::FP16_ACTIVE, 1.0, "Ratio of cycles the fp16 pipes are active."),
    gauge("DCGM_FI_PROF_NVLINK_TX_BYTES", m::NVLINK_TX_BYTES_S, 1.0, "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second."),
    gauge("DCGM_FI_PROF_NVLINK_RX_BYTES", m::NVLINK_RX_BYTES_S, 1.0, "The rate of data received over NVLink, not including protocol headers, in bytes per second."),
];

/// The XID family's name.
pub(super) const XID_FAMILY: &str = "DCGM_FI_DEV_XID_ERRORS";

/// What the GPU's record (its agent's description) gives the page.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Identity {
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Driver version.
    pub driver_version: String,
    /// Device memory, bytes (0: not known).
    pub memory_total_bytes: u64,
    /// A MIG instance's card UUID, profile (`GPU_I_PROFILE`) and GPU
    /// instance id (`GPU_I_ID`).
    pub mig: Option<(String, String, u32)>,
}

impl Identity {
    /// From the GPU's stored record.
    pub(super) fn of(r: &GpuRecord) -> Self {
        Self {
            pci_bus_id: r.pci_bus_id.clone(),
            driver_version: r.driver_version.clone(),
            memory_total_bytes: r.memory_total_bytes,
            mig: mig_instance(r),
        }
    }
}

/// A MIG instance's card UUID, profile and GPU instance id.
fn mig_instance(r: &GpuRecord) -> Option<(String, String, u32)> {
    let mig = r.mig();
    let i = mig.instance()?;
    Some((i.parent_uuid.clone(), i.profile.clone(), i.gpu_instance_id))
}

/// One GPU of the page: its live values and its identity.
#[derive(Debug, Clone, Copy)]
pub(super) struct Gpu<'a> {
    /// Live values.
    pub live: &'a GpuLive,
    /// Its record's labels and memory.
    pub id: &'a Identity,
}

/// dcgm-exporter's labels for a GPU (without the XID family's).
pub(super) fn labels(g: &Gpu<'_>) -> Labels {
    let live = g.live;
    let uuid = g.id.mig.as_ref().map_or(&live.uuid, |(card, _, _)| card);
    let mut l: Labels = vec![
        ("gpu".into(), live.index.to_string()),
        ("UUID".into(), uuid.clone()),
        ("pci_bus_id".into(), g.id.pci_bus_id.clone()),
        ("device".into(), format!("nvidia{}", live.index)),
        ("modelName".into(), live.model.clone()),
    ];
    if let Some((_, profile, gi)) = &g.id.mig {
        l.push(("GPU_I_PROFILE".into(), profile.clone()));
        l.push(("GPU_I_ID".into(), gi.to_string()));
    }
    if !live.hostname.is_empty() {
        l.push(("Hostname".into(), live.hostname.clone()));
    }
    if !g.id.driver_version.is_empty() {
        l.push(("DCGM_FI_DRIVER_VERSION".into(), g.id.driver_version.clone()));
    }
    if let Some(j) = &live.job {
        for (k, v) in [
            ("container", &j.container),
            ("namespace", &j.namespace),
            ("pod", &j.pod),
            ("hpc_job", &j.hpc_job),
        ] {
            if !v.is_empty() {
                l.push((k.into(), v.clone()));
            }
        }
    }
    let node = if live.hostname.is_empty() {
        &live.node_id
    } else {
        &live.hostname
    };
    l.push(("instance".into(), node.clone()));
    l.push(("tenant".into(), live.tenant.clone()));
    l
}

/// What dcgm-exporter's XID messages say, in short (`err_msg`); codes not
/// listed are "Unknown Error".
pub(super) fn xid_text(code: i64) -> &'static str {
    match code {
        0 => "No Error",
        13 => "Graphics engine exception",
        31 => "GPU memory page fault",
        32 => "Invalid or corrupted push buffer stream",
        43 => "GPU stopped processing",
        45 => "Preemptive cleanup, due to previous errors",
        48 => "Double-bit ECC error",
        61 => "Internal micro-controller breakpoint or warning",
        62 => "Internal micro-controller halt",
        63 => "ECC page retirement or row remapping recorded",
        64 => "ECC page retirement or row remapping failed",
        68 => "Video processor exception",
        74 => "NVLink error",
        79 => "GPU has fallen off the bus",
        92 => "High single-bit ECC error rate",
        94 => "Contained memory error",
        95 => "Uncontained memory error",
        109 => "Context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => "Unknown Error",
    }
}

/// A catalog metric of the GPU, when current and shown.
fn metric(g: &Gpu<'_>, name: &str, shown: &dyn Fn(&String) -> bool) -> Option<f64> {
    let (k, (_, v)) = g.live.counters.get_key_value(name)?;
    shown(k).then_some(*v)
}

/// A family's value on a GPU, in dcgm-exporter's unit.
fn value(f: &Field, g: &Gpu<'_>, shown: &dyn Fn(&String) -> bool) -> Option<f64> {
    let total = (g.id.memory_total_bytes > 0).then_some(g.id.memory_total_bytes as f64);
    match f.value {
        Value::Metric(name, scale) => metric(g, name, shown).map(|v| v * scale),
        Value::FbFree => metric(g, m::MEM_FREE_BYTES, shown)
            .or_else(|| {
                let used = metric(g, m::MEM_USED_BYTES, shown)?;
                let reserved = metric(g, m::MEM_RESERVED_BYTES, shown).unwrap_or(0.0);
                Some((total? - used - reserved).max(0.0))
            })
            .map(|b| b / MIB),
        Value::FbTotal => total.map(|b| b / MIB),
        Value::NvlinkTotal => {
            let tx = metric(g, m::NVLINK_TX_BYTES_S, shown);
            let rx = metric(g, m::NVLINK_RX_BYTES_S, shown);
            (tx.is_some() || rx.is_some()).then(|| (tx.unwrap_or(0.0) + rx.unwrap_or(0.0)) / 1e6)
        }
    }
}

/// A family under dcgm-exporter's name and type: counters keep their bare
/// names (their samples are written as gauges' are, without `_total`).
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
        MetricType::Counter
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
/// through) and the last XID of each (`xids`: the XID events by tenant
/// and GPU UUID).
pub(super) fn encode(
    enc: &mut DescriptorEncoder,
    gpus: &[Gpu<'_>],
    xids: &BTreeMap<(String, String), Xid>,
    shown: &dyn Fn(&String) -> bool,
) -> Result<(), std::fmt::Error> {
    let labelled: Vec<(&Gpu<'_>, Labels)> = gpus.iter().map(|g| (g, labels(g))).collect();
    for f in FIELDS {
        let rows = labelled
            .iter()
            .filter_map(|(g, l)| value(f, g, shown).map(|v| (l.clone(), v)))
            .collect();
        family(enc, f.name, f.help, f.counter, rows)?;
    }
    family(
        enc,
        XID_FAMILY,
        "Value of the last XID error encountered.",
        false,
        labelled
            .into_iter()
            .map(|(g, mut l)| {
                let code = metric(g, m::XID_LAST, shown)
                    .map(|v| v as i64)
                    .or_else(|| {
                        xids.get(&(g.live.tenant.clone(), g.live.uuid.clone()))
                            .map(|x| x.last)
                    })
                    .unwrap_or(0);
                // After `modelName` … `pod`, as dcgm-exporter's attributes.
                let at = l.len() - 2;
                l.insert(at, ("err_code".into(), code.to_string()));
                l.insert(at + 1, ("err_msg".into(), xid_text(code).into()));
                (l, code as f64)
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests;
