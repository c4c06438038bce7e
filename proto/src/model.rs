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
    /// Where the GPU stands in MIG partitioning.
    pub mig: Mig,
}

/// A GPU's place in MIG (Multi-Instance GPU) partitioning.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Mig {
    /// A whole GPU: not in MIG mode, or its instances are not listed.
    #[default]
    Off,
    /// A card in MIG mode whose instances are listed as their own GPUs.
    /// Its device-wide counters (power, temperature, memory clock) are its
    /// own; its compute capacity is its instances', so OFU, peaks and GPU
    /// counts take the instances and never the card as well.
    Card,
    /// A MIG instance of a card.
    Instance(MigInstance),
}

/// The identity of one MIG instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigInstance {
    /// UUID of the card it is carved from.
    pub parent_uuid: String,
    /// GPU instance id (dcgm-exporter's `GPU_I_ID`).
    pub gpu_instance_id: u32,
    /// Compute instance id within the GPU instance.
    pub compute_instance_id: u32,
    /// GPU instance profile, e.g. `3g.40gb` (dcgm-exporter's
    /// `GPU_I_PROFILE`); empty when unknown.
    pub profile: String,
}

impl Mig {
    /// The instance's identity, for a MIG instance.
    pub fn instance(&self) -> Option<&MigInstance> {
        match self {
            Self::Instance(i) => Some(i),
            _ => None,
        }
    }

    /// The parent card's UUID, for a MIG instance.
    pub fn parent_uuid(&self) -> Option<&str> {
        self.instance().map(|i| i.parent_uuid.as_str())
    }

    /// Whether this is a card in MIG mode counted through its instances.
    pub fn is_card(&self) -> bool {
        matches!(self, Self::Card)
    }
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
    /// On a GPU several jobs share: this job's apportioned share of the
    /// GPU's work. `None` for a GPU's only owner.
    pub share: Option<Share>,
}

/// A job's share of a GPU it shares with others (time-slicing, MPS):
/// apportioned from what the driver tells of its processes, not measured
/// per job (docs/ATTRIBUTION.md, *Shared GPUs*).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// The share, parts per million (the shares of one GPU sum to 10⁶).
    pub ppm: u32,
    /// How it was apportioned.
    pub split: Split,
}

impl Share {
    /// `n` even shares of one GPU, summing to exactly 10⁶ ppm (the first
    /// takes the remainder).
    pub fn equal(n: usize) -> Vec<Share> {
        let n32 = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
        let each = 1_000_000 / n32;
        (0..n)
            .map(|i| Share {
                ppm: if i == 0 {
                    1_000_000 - each * (n32 - 1)
                } else {
                    each
                },
                split: Split::Equal,
            })
            .collect()
    }

    /// The share as a fraction 0..=1.
    pub fn fraction(&self) -> f64 {
        f64::from(self.ppm.min(1_000_000)) / 1e6
    }
}

/// How a shared GPU's work was apportioned between its jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// By the SM utilisation of each job's processes
    /// (`nvmlDeviceGetProcessUtilization`).
    SmUtil,
    /// Evenly: the source has no per-process figure (a dcgm-exporter
    /// page).
    Equal,
}

impl Split {
    /// The name on the wire and in labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::SmUtil => "sm_util",
            Self::Equal => "equal",
        }
    }

    /// The split a wire name gives (`None` for an unknown one).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "sm_util" => Some(Self::SmUtil),
            "equal" => Some(Self::Equal),
            _ => None,
        }
    }
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

/// Longest job id the collector accepts, bytes.
pub const MAX_JOB_ID_BYTES: usize = 128;

/// `id` if it fits in [`MAX_JOB_ID_BYTES`], else its head, `~` and a hash
/// of the whole (FNV-1a, 16 hex digits): still unique, still readable.
/// (A pod name alone may be 253 bytes; StatefulSet pods differ only at the
/// end, so plain truncation would merge them.)
pub fn fit_id(id: String) -> String {
    if id.len() <= MAX_JOB_ID_BYTES {
        return id;
    }
    let hash = fnv1a(&id);
    let mut head = MAX_JOB_ID_BYTES - 17;
    while !id.is_char_boundary(head) {
        head -= 1;
    }
    format!("{}~{hash:016x}", &id[..head])
}

/// FNV-1a, 64 bits: short stable keys of long strings.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What separates a shared GPU's UUID from a job's key in [`share_key`].
const SHARE_MARK: &str = "/share/";

/// The series key under which the collector keeps `job`'s apportioned
/// share of the OFU of `gpu`, a GPU several jobs share:
/// `<gpu>/share/<16 hex digits of the job id>` (at most 57 bytes past the
/// UUID, whatever the job id's length).
pub fn share_key(gpu: &str, job: &str) -> String {
    format!("{gpu}{SHARE_MARK}{:016x}", fnv1a(job))
}

/// The GPU of a [`share_key`] (`None` for any other key).
pub fn shared_gpu(key: &str) -> Option<&str> {
    let (gpu, hash) = key.rsplit_once(SHARE_MARK)?;
    (hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())).then_some(gpu)
}
