//! The records the store keeps: nodes, devices, GPUs and jobs as last
//! seen, OFU samples, what one acknowledged batch writes, and what reads
//! give back.

use flopwatch_proto::model::{GpuInfo, Mig, MigInstance, Point, SeriesBatch};
use flopwatch_proto::ofu::Mean;
use serde::{Deserialize, Serialize};

/// Identifies an agent's sequence-number space.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentKey {
    /// Tenant (from the credentials).
    pub tenant: String,
    /// Agent id.
    pub agent_id: String,
    /// Boot id.
    pub boot_id: String,
}

/// A node as the collector last saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// Node id.
    pub node_id: String,
    /// Hostname.
    pub hostname: String,
    /// Boot id.
    pub boot_id: String,
    /// Agent id.
    pub agent_id: String,
    /// GPU count.
    pub gpus: u32,
    /// Last hello or batch, unix ms.
    pub last_seen_ms: i64,
    /// Labels.
    pub labels: std::collections::BTreeMap<String, String>,
    /// The node's devices (InfiniBand ports, NUMA nodes, the host), as its
    /// agent last listed them: their series outlive the connection.
    #[serde(default)]
    pub devices: Vec<DeviceRecord>,
    /// The principal of the credential that registered the node
    /// (`token:<name>`, `cert:<name>`): only it may stream for the node
    /// (docs/SECURITY.md). Empty in records written before ownership.
    #[serde(default)]
    pub owner: String,
}

/// A node device (docs/COUNTERS.md), kept with its node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceRecord {
    /// Series key, `<local>@<node_id>`.
    pub id: String,
    /// `ib_port`, `numa_node` or `host`.
    pub kind: String,
    /// Name on the node.
    pub name: String,
}

impl DeviceRecord {
    /// The records of a Hello's devices.
    pub fn from_hello(devices: &[flopwatch_proto::model::DeviceInfo]) -> Vec<Self> {
        devices
            .iter()
            .map(|d| Self {
                id: d.id.clone(),
                kind: d.kind.clone(),
                name: d.name.clone(),
            })
            .collect()
    }
}

/// A GPU as the collector last saw it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuRecord {
    /// UUID.
    pub uuid: String,
    /// Node id.
    pub node_id: String,
    /// Index on the node.
    pub index: u32,
    /// Product name.
    pub model: String,
    /// SMs.
    pub sm_count: u32,
    /// Max SM clock.
    pub max_sm_clock_mhz: u32,
    /// Max memory clock.
    pub max_mem_clock_mhz: u32,
    /// Driver.
    pub driver_version: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// GPM available.
    pub gpm_supported: bool,
    /// Memory, bytes.
    pub memory_total_bytes: u64,
    /// Parent GPU of a MIG instance.
    pub mig_parent_uuid: Option<String>,
    /// A MIG instance's GPU instance id, compute instance id and profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_instance: Option<(u32, u32, String)>,
    /// A card in MIG mode counted through its instances.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mig_enabled: bool,
    /// Current job.
    pub job_id: Option<String>,
    /// The jobs sharing the GPU, with their apportioned shares (job id,
    /// ppm, split), as of its last batch.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<(String, u32, String)>,
    /// Last seen, unix ms.
    pub last_seen_ms: i64,
}

impl GpuRecord {
    /// The record of a GPU its agent described in `Hello`, on `node_id`,
    /// running `job_id`, seen at `last_seen_ms`.
    pub fn from_info(
        g: &GpuInfo,
        node_id: &str,
        job_id: Option<String>,
        last_seen_ms: i64,
    ) -> Self {
        Self {
            uuid: g.uuid.clone(),
            node_id: node_id.to_string(),
            index: g.index,
            model: g.model.clone(),
            sm_count: g.sm_count,
            max_sm_clock_mhz: g.max_sm_clock_mhz,
            max_mem_clock_mhz: g.max_mem_clock_mhz,
            driver_version: g.driver_version.clone(),
            pci_bus_id: g.pci_bus_id.clone(),
            gpm_supported: g.gpm_supported,
            memory_total_bytes: g.memory_total_bytes,
            mig_parent_uuid: g.mig.parent_uuid().map(str::to_string),
            mig_instance: g
                .mig
                .instance()
                .map(|i| (i.gpu_instance_id, i.compute_instance_id, i.profile.clone())),
            mig_enabled: g.mig.is_card(),
            job_id,
            shares: Vec::new(),
            last_seen_ms,
        }
    }

    /// The GPU as its agent described it (what [`GpuRecord::from_info`]
    /// took).
    pub fn info(&self) -> GpuInfo {
        GpuInfo {
            index: self.index,
            uuid: self.uuid.clone(),
            model: self.model.clone(),
            sm_count: self.sm_count,
            max_sm_clock_mhz: self.max_sm_clock_mhz,
            max_mem_clock_mhz: self.max_mem_clock_mhz,
            driver_version: self.driver_version.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            gpm_supported: self.gpm_supported,
            memory_total_bytes: self.memory_total_bytes,
            mig: self.mig(),
        }
    }

    /// Where the GPU stands in MIG partitioning.
    pub fn mig(&self) -> Mig {
        match (&self.mig_parent_uuid, &self.mig_instance) {
            (Some(parent), instance) => {
                let (gi, ci, profile) = instance.clone().unwrap_or_default();
                Mig::Instance(MigInstance {
                    parent_uuid: parent.clone(),
                    gpu_instance_id: gi,
                    compute_instance_id: ci,
                    profile,
                })
            }
            (None, _) if self.mig_enabled => Mig::Card,
            (None, _) => Mig::Off,
        }
    }
}

/// A job seen on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    /// Job id.
    pub job_id: String,
    /// GPU.
    pub gpu_uuid: String,
    /// Node.
    pub node_id: String,
    /// Pod.
    pub pod: String,
    /// Namespace.
    pub namespace: String,
    /// Container.
    pub container: String,
    /// HPC job.
    pub hpc_job: String,
    /// First seen on this GPU, unix ms.
    pub first_seen_ms: i64,
    /// Last seen on this GPU, unix ms.
    pub last_seen_ms: i64,
}

/// One OFU sample of one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OfuSample {
    /// End of the window, unix ms.
    pub ts_ms: i64,
    /// OFU, fraction.
    pub ofu: f64,
    /// Tensor pipe activity, fraction.
    pub tensor_active: f64,
    /// SM clock used, MHz.
    pub sm_clock_mhz: f64,
    /// Window, ms.
    pub window_ms: u32,
}

/// How a GPU's OFU samples were derived at ingest (OFU eq. 1): the tensor
/// peak clock `f_max` and the raw series the SM clock came from. Stored with
/// the head block and carried to compaction, which then stores OFU as
/// derived (recomputed on read) after checking it, never guessing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derivation {
    /// f_max, MHz.
    pub tensor_clock_mhz: f64,
    /// The SM clock's raw series: its index in [`OFU_CLOCKS`].
    pub clock: u8,
}

/// The raw series an OFU sample's SM clock comes from (ingest prefers the
/// window average), by [`Derivation::clock`].
pub const OFU_CLOCKS: [&str; 2] = [
    flopwatch_proto::metrics::SM_CLOCK_AVG_MHZ,
    flopwatch_proto::metrics::SM_CLOCK_MHZ,
];

impl Derivation {
    /// OFU with `tensor_clock_mhz` and the clock read from `clock_metric`;
    /// `None` for a series OFU is not derived from.
    pub fn new(tensor_clock_mhz: f64, clock_metric: &str) -> Option<Self> {
        let i = OFU_CLOCKS.iter().position(|c| *c == clock_metric)?;
        Some(Self {
            tensor_clock_mhz,
            clock: i as u8,
        })
    }

    /// The clock's raw series.
    pub fn clock_metric(&self) -> Option<&'static str> {
        OFU_CLOCKS.get(usize::from(self.clock)).copied()
    }

    /// Every sample's OFU is exactly `ofu(tensor_active, sm_clock_mhz, f)`,
    /// bit for bit.
    pub fn exact(&self, samples: &[OfuSample]) -> bool {
        self.tensor_clock_mhz.is_finite()
            && self.tensor_clock_mhz > 0.0
            && samples.iter().all(|s| {
                flopwatch_proto::ofu::ofu(s.tensor_active, s.sm_clock_mhz, self.tensor_clock_mhz)
                    .to_bits()
                    == s.ofu.to_bits()
            })
    }
}

/// Everything one acknowledged batch writes.
#[derive(Debug, Clone, Default)]
pub struct CommitSet {
    /// Whose batch.
    pub agent: Option<AgentKey>,
    /// Its sequence number (stored as the agent's acked seq).
    pub seq: u64,
    /// Raw samples.
    pub series: Vec<SeriesBatch>,
    /// OFU per GPU, with the job running on it.
    pub ofu: Vec<(String, Option<String>, Vec<OfuSample>)>,
    /// How the OFU of `ofu` was derived, by its GPU key; a series without
    /// an entry (a shared GPU's job shares, say) is stored as given.
    pub derivations: std::collections::HashMap<String, Derivation>,
    /// Node records to upsert.
    pub nodes: Vec<NodeRecord>,
    /// GPU records to upsert.
    pub gpus: Vec<GpuRecord>,
    /// Job records to upsert.
    pub jobs: Vec<JobRecord>,
    /// Events (derived and reported) to record.
    pub events: Vec<EventRecord>,
    /// Commit into limbo, entered at this time (unix ms): the batch may be
    /// stored on another collector too (see [`super::limbo`]).
    pub limbo: Option<i64>,
    /// The number is consumed without data (a refused batch): it raises
    /// the acked number but is not held.
    pub no_data: bool,
    /// Remote write's entry for this batch ([`super::journal::value`]),
    /// written with it; empty: none.
    pub forward: Vec<u8>,
    /// Remote write's open-series register entries this batch starts or
    /// relabels ([`super::journal::OPEN_PREFIX`]): key and value, written
    /// with it.
    pub forward_open: super::journal::OpenEntries,
}

/// Raw samples read back.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSeries {
    /// GPU.
    pub gpu_uuid: String,
    /// Metric.
    pub metric: String,
    /// Samples in time order.
    pub points: Vec<Point>,
}

/// What an OFU read yields: single samples, or the aggregate of all the
/// samples of `[ts_ms, ts_ms + len_ms)` from a rollup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OfuPiece {
    /// One sample.
    Sample(OfuSample),
    /// A rollup bucket.
    Agg {
        /// Bucket start.
        ts_ms: i64,
        /// Bucket width.
        len_ms: i64,
        /// Its samples' aggregate.
        agg: Mean,
        /// Time and OFU of its first sample (`None`: not known, a bucket
        /// rolled up before the store kept it).
        first: Option<(i64, f64)>,
    },
}

/// What [`crate::Store::ofu_lasts`] yields: samples, and the minute lasts
/// of each sealed hour read in place.
#[derive(Debug, Clone, Copy)]
pub enum LastsPiece<'a> {
    /// One sample.
    Sample(OfuSample),
    /// A sealed hour's minute lasts (its minutes inside the range).
    Hour(super::HourLasts<'a>),
}

/// A stored event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    /// `regression`, `straggler`, or an agent's kind (`xid`, `ecc_dbe`, …).
    pub kind: String,
    /// When, unix ms (the end of the window for derived events).
    pub ts_ms: i64,
    /// Job, when known.
    #[serde(default)]
    pub job_id: String,
    /// GPU, when the event is about one.
    #[serde(default)]
    pub gpu_uuid: String,
    /// Node, when known.
    #[serde(default)]
    pub node_id: String,
    /// The observed value (window OFU, GPU tensor activity, XID code).
    #[serde(default)]
    pub value: f64,
    /// What it is compared with (baseline OFU, job median).
    #[serde(default)]
    pub baseline: f64,
    /// Human-readable detail.
    #[serde(default)]
    pub detail: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GPU record gives back every field of the agent's description (the
    /// `ListGpus` answer is built from it through the wire conversion).
    #[test]
    fn gpu_records_keep_the_agents_description() {
        let info = GpuInfo {
            index: 3,
            uuid: "MIG-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            sm_count: 132,
            max_sm_clock_mhz: 1980,
            max_mem_clock_mhz: 2619,
            driver_version: "550.54".into(),
            pci_bus_id: "0000:19:00.0".into(),
            gpm_supported: true,
            memory_total_bytes: 80 << 30,
            mig: Mig::Instance(MigInstance {
                parent_uuid: "GPU-1".into(),
                gpu_instance_id: 2,
                compute_instance_id: 0,
                profile: "3g.40gb".into(),
            }),
        };
        let r = GpuRecord::from_info(&info, "node-a", Some("job".into()), 42);
        assert_eq!(r.info(), info);
        // Through the store's encoding too; a card in MIG mode as well.
        let back: GpuRecord = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!(back.info(), info);
        let card = GpuInfo {
            mig: Mig::Card,
            ..info.clone()
        };
        let c = GpuRecord::from_info(&card, "node-a", None, 42);
        let back: GpuRecord = serde_json::from_slice(&serde_json::to_vec(&c).unwrap()).unwrap();
        assert_eq!(back.info(), card);
        assert_eq!(
            (r.node_id.as_str(), r.job_id.as_deref(), r.last_seen_ms),
            ("node-a", Some("job"), 42)
        );
    }
}
