//! Domain types shared by agent and collector, independent of the wire.

use std::collections::BTreeMap;

/// Who a node is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeIdentity {
    /// Unique in the fleet (Kubernetes node name or hostname).
    pub node_id: String,
    /// Hostname as the node sees it.
    pub hostname: String,
    /// Kernel boot id; sequence numbers restart per boot id.
    pub boot_id: String,
    /// Free-form labels.
    pub labels: BTreeMap<String, String>,
}

impl NodeIdentity {
    /// A node whose id and hostname are `name`, without labels (a
    /// simulated or test node).
    pub fn named(name: &str, boot_id: &str) -> Self {
        Self {
            node_id: name.to_string(),
            hostname: name.to_string(),
            boot_id: boot_id.to_string(),
            labels: BTreeMap::new(),
        }
    }
}

/// One GPU (or MIG instance) of a node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuInfo {
    /// Index on the node.
    pub index: u32,
    /// NVML UUID, `GPU-…` or `MIG-…`.
    pub uuid: String,
    /// Product name, e.g. "NVIDIA H100 80GB HBM3".
    pub model: String,
    /// Streaming multiprocessors (0 when unknown).
    pub sm_count: u32,
    /// Maximum SM clock, MHz.
    pub max_sm_clock_mhz: u32,
    /// Maximum memory clock, MHz.
    pub max_mem_clock_mhz: u32,
    /// Driver version string.
    pub driver_version: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// Whether GPM counters are available (Hopper and newer).
    pub gpm_supported: bool,
    /// Device memory, bytes.
    pub memory_total_bytes: u64,
    /// Parent GPU of a MIG instance.
    pub mig_parent_uuid: Option<String>,
}

/// The first message of an agent's stream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hello {
    /// Bearer token carried in the message (metadata is preferred).
    pub token: Option<String>,
    /// Stable agent identity.
    pub agent_id: String,
    /// The node.
    pub node: NodeIdentity,
    /// Its GPUs.
    pub gpus: Vec<GpuInfo>,
    /// Agent software version.
    pub agent_version: String,
    /// Metrics the agent collects.
    pub metrics: Vec<String>,
    /// Node-level devices (InfiniBand ports, NUMA nodes, the host).
    pub devices: Vec<DeviceInfo>,
}

/// A node-level device that is not a GPU: an InfiniBand port, a NUMA node,
/// the host. Its series are keyed by [`DeviceInfo::id`] where GPU series
/// use the GPU UUID (`SeriesBatch::gpu_uuid`), so sampling, batching,
/// storage and queries treat both alike; OFU and GPU counts ignore devices.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceInfo {
    /// Series key, unique in the tenant: `<local>@<node_id>`, e.g.
    /// `ib:mlx5_0:1@node-3`.
    pub id: String,
    /// Kind: [`DEVICE_IB_PORT`], [`DEVICE_NUMA_NODE`] or [`DEVICE_HOST`].
    pub kind: String,
    /// Name on the node: `mlx5_0:1`, `0`, the hostname.
    pub name: String,
}

/// [`DeviceInfo::kind`] of an InfiniBand port.
pub const DEVICE_IB_PORT: &str = "ib_port";
/// [`DeviceInfo::kind`] of a NUMA node.
pub const DEVICE_NUMA_NODE: &str = "numa_node";
/// [`DeviceInfo::kind`] of the host as a whole.
pub const DEVICE_HOST: &str = "host";

/// One sample of one series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Unix ms; for window means, the end of the window.
    pub ts_ms: i64,
    /// The value (window mean for hardware-averaged counters).
    pub value: f64,
    /// Highest value seen inside the window, when the agent tracked it.
    pub peak: Option<f64>,
    /// Window the value covers, ms.
    pub window_ms: Option<u32>,
}

impl Point {
    /// A plain sample.
    pub fn new(ts_ms: i64, value: f64) -> Self {
        Self {
            ts_ms,
            value,
            peak: None,
            window_ms: None,
        }
    }
}

/// Samples of one metric of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeriesBatch {
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Metric name from [`crate::metrics::CATALOG`].
    pub metric: String,
    /// Samples in time order.
    pub points: Vec<Point>,
}

/// Which job a GPU runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobAssignment {
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Job identity.
    pub job_id: String,
    /// Kubernetes pod, if any.
    pub pod: String,
    /// Kubernetes namespace, if any.
    pub namespace: String,
    /// Container, if any.
    pub container: String,
    /// HPC (Slurm) job id, if any.
    pub hpc_job: String,
    /// Since when, unix ms.
    pub since_ms: i64,
}

/// A discrete GPU event (XID, ECC, throttling).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Event {
    /// GPU UUID.
    pub gpu_uuid: String,
    /// Kind, e.g. "xid".
    pub kind: String,
    /// Unix ms.
    pub ts_ms: i64,
    /// Numeric code (the XID, the bitmask, ...).
    pub code: i64,
    /// Free text.
    pub detail: String,
}

/// A numbered batch from one agent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Sequence number, from 1 per (agent, boot).
    pub seq: u64,
    /// Agent identity.
    pub agent_id: String,
    /// Boot id of the node when the batch was cut.
    pub boot_id: String,
    /// Samples.
    pub series: Vec<SeriesBatch>,
    /// Job attribution.
    pub jobs: Vec<JobAssignment>,
    /// Events.
    pub events: Vec<Event>,
    /// Agent wall clock at cut time, unix ms.
    pub sent_at_ms: i64,
    /// Whether the batch came from the spool.
    pub from_spool: bool,
    /// Each metric's current sampling interval.
    pub intervals: Vec<SamplingInterval>,
    /// Bytes waiting in the agent for an acknowledgement.
    pub pending_bytes: u64,
    /// Batches waiting in the agent for an acknowledgement.
    pub pending_batches: u32,
    /// MFU reported by the node's jobs.
    pub mfu_reports: Vec<MfuReport>,
    /// On the wire to another collector that failed or was left without
    /// acknowledging it: that collector may hold it too.
    pub uncertain: bool,
}

/// A job's own MFU as it reported it (OFU paper §V-C cross-check).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MfuReport {
    /// Job.
    pub job_id: String,
    /// When reported, unix ms: the end of the period covered.
    pub ts_ms: i64,
    /// Start of the period; 0: the analysis window before `ts_ms`.
    pub start_ms: i64,
    /// The job's MFU, fraction 0..1 (eq. 10).
    pub mfu: Option<f64>,
    /// Achieved TFLOP/s per GPU at each precision, sorted by precision.
    pub tflops_by_precision: Vec<(String, f64)>,
}

/// One metric's current sampling interval on one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SamplingInterval {
    /// GPU.
    pub gpu_uuid: String,
    /// Catalog name.
    pub metric: String,
    /// Interval, ms.
    pub interval_ms: u32,
}

impl Batch {
    /// Number of samples in the batch.
    pub fn sample_count(&self) -> usize {
        self.series.iter().map(|s| s.points.len()).sum()
    }
}

/// Sampling settings pushed to agents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Minimum (and, when not adaptive, fixed) interval, ms.
    pub min_interval_ms: u32,
    /// Upper bound of the adaptive interval, ms.
    pub max_interval_ms: u32,
    /// Adaptive sampling on.
    pub adaptive: bool,
    /// Metric set; empty for the agent's default.
    pub metrics: Vec<String>,
    /// Most samples per batch.
    pub max_batch_samples: u32,
    /// How often the agent cuts a batch, ms.
    pub flush_interval_ms: u32,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_interval_ms: 100,
            max_interval_ms: 30_000,
            adaptive: false,
            metrics: Vec::new(),
            max_batch_samples: 50_000,
            flush_interval_ms: 1_000,
        }
    }
}
