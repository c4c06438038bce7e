//! `agent.toml`.

use crate::{ConfigError, Validate};
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

/// Where the agent reads GPU counters from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceKind {
    /// NVML through nvml-wrapper (GPM on Hopper and newer).
    Nvml,
    /// A local dcgm-exporter `/metrics` page.
    DcgmExporter(String),
    /// A recorded long-form CSV trace.
    Replay(PathBuf),
    /// The built-in simulated node.
    Sim,
}

impl std::str::FromStr for SourceKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':') {
            _ if s == "nvml" => Ok(SourceKind::Nvml),
            _ if s == "sim" => Ok(SourceKind::Sim),
            Some(("replay", f)) if !f.is_empty() => Ok(SourceKind::Replay(PathBuf::from(f))),
            Some(("dcgm-exporter", u)) if !u.is_empty() => Ok(SourceKind::DcgmExporter(u.into())),
            _ => Err(format!(
                "unknown source `{s}`: expected nvml, sim, replay:FILE or dcgm-exporter:URL"
            )),
        }
    }
}

/// The agent's configuration file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// Node identity; defaults to the hostname.
    pub node_id: String,
    /// Collector URLs (`http://host:port` or `https://…`).
    pub collectors: Vec<String>,
    /// HTTP address of the agent's own `/metrics`; empty turns it off.
    pub metrics_listen: String,
    /// Bearer token for the collectors.
    pub token: Option<String>,
    /// File holding the bearer token (Kubernetes Secret mount).
    pub token_file: Option<PathBuf>,
    /// `nvml`, `sim`, `replay:FILE` or `dcgm-exporter:URL`.
    pub source: String,
    /// Sampling interval (the minimum interval when adaptive).
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// How often a batch is cut and sent.
    #[serde(with = "humantime_serde")]
    pub flush_interval: Duration,
    /// Most samples in one batch.
    pub max_batch_samples: u32,
    /// Metrics to collect; empty means every metric the source has.
    pub metrics: Vec<String>,
    /// A selected metric set written by `flopwatch select`.
    pub metrics_file: Option<PathBuf>,
    /// Labels attached to the node.
    pub labels: std::collections::BTreeMap<String, String>,
    /// Job label used when no attribution source names one.
    pub job: Option<String>,
    /// Batches kept in memory while waiting for acks.
    pub max_in_flight: usize,
    /// `[nvml]`.
    pub nvml: NvmlSettings,
    /// `[sim]`.
    pub sim: SimSettings,
    /// `[spool]`.
    pub spool: SpoolConfig,
    /// `[sampling]`.
    pub sampling: crate::SamplingConfig,
    /// `[attribution]`.
    pub attribution: AttributionSettings,
    /// `[host]`.
    pub host: HostSettings,
    /// `[tls]`: trust anchors and client certificate for `https://`
    /// collectors.
    pub tls: crate::ClientTls,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            node_id: String::new(),
            collectors: vec!["http://127.0.0.1:7070".to_string()],
            metrics_listen: "127.0.0.1:9401".to_string(),
            token: None,
            token_file: None,
            source: "nvml".to_string(),
            interval: Duration::from_millis(100),
            flush_interval: Duration::from_secs(1),
            max_batch_samples: 50_000,
            metrics: Vec::new(),
            metrics_file: None,
            labels: Default::default(),
            job: None,
            max_in_flight: 64,
            nvml: NvmlSettings::default(),
            sim: SimSettings::default(),
            spool: SpoolConfig::default(),
            sampling: crate::SamplingConfig::default(),
            attribution: AttributionSettings::default(),
            host: HostSettings::default(),
            tls: crate::ClientTls::default(),
        }
    }
}

/// `[host]`: node-level counters next to the GPUs' (docs/COUNTERS.md):
/// InfiniBand ports from sysfs, CPU and memory per NUMA node and host from
/// `/proc` and `/sys`. With `source = "sim"` the simulator supplies them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostSettings {
    /// Read InfiniBand port counters.
    pub infiniband: bool,
    /// Read CPU and memory counters per NUMA node and for the host.
    pub cpu_memory: bool,
    /// Where sysfs is mounted (`/host/sys` in a pod).
    pub sys_root: PathBuf,
    /// Where procfs is mounted (`/host/proc` in a pod).
    pub proc_root: PathBuf,
}

impl Default for HostSettings {
    fn default() -> Self {
        Self {
            infiniband: true,
            cpu_memory: true,
            sys_root: PathBuf::from("/sys"),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

impl HostSettings {
    /// Checks values; errors name the key (`host.<key>`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if (self.infiniband || self.cpu_memory) && self.sys_root.as_os_str().is_empty() {
            return Err(ConfigError::invalid("host.sys_root", "must not be empty"));
        }
        if self.cpu_memory && self.proc_root.as_os_str().is_empty() {
            return Err(ConfigError::invalid("host.proc_root", "must not be empty"));
        }
        Ok(())
    }
}

/// `[nvml]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NvmlSettings {
    /// Path of `libnvidia-ml.so` (default: the system's `libnvidia-ml.so.1`).
    pub library_path: Option<PathBuf>,
    /// A dcgm-exporter's `/metrics` URL to read what GPM would give (tensor
    /// activity among it) for GPUs whose GPM samples the driver refuses.
    pub gpm_fallback: Option<String>,
}

/// `[sim]`: the simulated node.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SimSettings {
    /// This node's index in the simulated fleet.
    pub node_index: usize,
    /// Nodes in the simulated fleet (decides which jobs this node runs).
    pub nodes: usize,
    /// GPUs on this node.
    pub gpus: usize,
    /// Noise seed.
    pub seed: u64,
    /// When the regressing job slows down, after the agent starts.
    #[serde(with = "humantime_serde")]
    pub regress_after: Duration,
    /// Simulate the node's InfiniBand ports, NUMA nodes and host too.
    pub node_counters: bool,
    /// `gemm-bench` runs as jobs of this length that end, one after
    /// another on the same GPUs (`0s`: its one job never ends).
    #[serde(with = "humantime_serde")]
    pub job_run: Duration,
    /// How long those GPUs idle between two such jobs.
    #[serde(with = "humantime_serde")]
    pub job_gap: Duration,
    /// The profiling fields (tensor and pipe activity, averaged clock)
    /// leave this long after the start…
    #[serde(with = "humantime_serde")]
    pub profiling_outage_after: Option<Duration>,
    /// …for this long, then return.
    #[serde(with = "humantime_serde")]
    pub profiling_outage_for: Duration,
    /// The source answers only this long after the start (captures fail
    /// before).
    #[serde(with = "humantime_serde")]
    pub up_after: Duration,
    /// A GPU (index) whose job runs two processes.
    pub shared_gpu: Option<usize>,
}

impl Default for SimSettings {
    fn default() -> Self {
        Self {
            node_index: 0,
            nodes: 1,
            gpus: 8,
            seed: 1,
            regress_after: Duration::from_secs(30),
            node_counters: false,
            job_run: Duration::ZERO,
            job_gap: Duration::from_secs(15),
            profiling_outage_after: None,
            profiling_outage_for: Duration::from_secs(30),
            up_after: Duration::ZERO,
            shared_gpu: None,
        }
    }
}

/// `[attribution]`: which job each GPU runs, found without touching the
/// job: the kubelet's pod-resources socket (GPU → pod), the cgroup of each
/// GPU process (`<proc_root>/<pid>/cgroup` → pod, Slurm job or container),
/// a per-GPU mapping directory, then the `job` label.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttributionSettings {
    /// Attribution on; `false` leaves only the source's own jobs and `job`.
    pub enabled: bool,
    /// Where the node's processes are listed (`/host/proc` in a pod).
    pub proc_root: PathBuf,
    /// The kubelet pod-resources socket; an empty path turns the lookup
    /// off. A socket that does not exist is skipped quietly.
    pub pod_resources_socket: PathBuf,
    /// dcgm-exporter-style mapping directory: a file per GPU, named by its
    /// index or UUID, whose first line is the HPC job id.
    pub mapping_dir: Option<PathBuf>,
    /// Directory where jobs drop their own MFU reports (one JSON file per
    /// job, see docs/CONFIG.md), forwarded to the collector for the MFU
    /// cross-check. Unset: not read.
    pub mfu_dir: Option<PathBuf>,
    /// Attribution is looked up at most this often, not every capture.
    #[serde(with = "humantime_serde")]
    pub refresh_interval: Duration,
}

impl Default for AttributionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            proc_root: PathBuf::from("/proc"),
            pod_resources_socket: PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock"),
            mapping_dir: None,
            mfu_dir: None,
            refresh_interval: Duration::from_secs(10),
        }
    }
}

impl AttributionSettings {
    /// Checks values; errors name the key (`attribution.<key>`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled && self.proc_root.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                "attribution.proc_root",
                "must not be empty",
            ));
        }
        if self.refresh_interval < Duration::from_millis(100)
            || self.refresh_interval > Duration::from_secs(3600)
        {
            return Err(ConfigError::invalid(
                "attribution.refresh_interval",
                "must lie between 100ms and 1h",
            ));
        }
        if self
            .mfu_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(ConfigError::invalid(
                "attribution.mfu_dir",
                "must not be empty (leave it out instead)",
            ));
        }
        if self
            .mapping_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(ConfigError::invalid(
                "attribution.mapping_dir",
                "must not be empty (leave it out instead)",
            ));
        }
        Ok(())
    }
}

/// `[spool]`: batches kept on disk while no collector acknowledges them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SpoolConfig {
    /// Spool directory; unset keeps unacknowledged batches in memory only.
    pub dir: Option<PathBuf>,
    /// Size cap; the oldest batches are dropped (and counted) past it.
    pub max_bytes: u64,
    /// How often the spool is fsynced: what a power loss can take on top
    /// of the batch being assembled.
    #[serde(with = "humantime_serde")]
    pub fsync_interval: Duration,
    /// Most batches sent per second while a backlog drains.
    pub drain_rate: u32,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            dir: None,
            max_bytes: 256 * 1024 * 1024,
            fsync_interval: Duration::from_secs(1),
            drain_rate: 50,
        }
    }
}

impl SpoolConfig {
    /// Checks values; errors name the key (`spool.<key>`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.dir.as_ref().is_some_and(|d| d.as_os_str().is_empty()) {
            return Err(ConfigError::invalid(
                "spool.dir",
                "must not be empty (leave it out instead)",
            ));
        }
        if self.max_bytes < 64 * 1024 {
            return Err(ConfigError::invalid(
                "spool.max_bytes",
                "must be at least 65536",
            ));
        }
        if self.fsync_interval < Duration::from_millis(10)
            || self.fsync_interval > Duration::from_secs(60)
        {
            return Err(ConfigError::invalid(
                "spool.fsync_interval",
                "must lie between 10ms and 60s",
            ));
        }
        if self.drain_rate == 0 {
            return Err(ConfigError::invalid("spool.drain_rate", "must be positive"));
        }
        Ok(())
    }
}

impl AgentConfig {
    /// The parsed `source`.
    pub fn source_kind(&self) -> Result<SourceKind, ConfigError> {
        self.source
            .parse()
            .map_err(|m: String| ConfigError::invalid("source", m))
    }
}

impl Validate for AgentConfig {
    const KEYS: &'static [&'static str] = &[
        "node_id",
        "collectors",
        "metrics_listen",
        "token",
        "token_file",
        "source",
        "interval",
        "flush_interval",
        "max_batch_samples",
        "metrics",
        "metrics_file",
        "job",
        "max_in_flight",
        "nvml",
        "sim",
        "spool",
        "sampling",
        "attribution",
        "host",
        "tls",
    ];

    fn validate(&self) -> Result<(), ConfigError> {
        self.source_kind()?;
        self.tls.validate("tls")?;
        if !self.metrics_listen.is_empty()
            && self.metrics_listen.parse::<std::net::SocketAddr>().is_err()
        {
            return Err(ConfigError::invalid(
                "metrics_listen",
                "must be an address such as 127.0.0.1:9401, or empty to turn /metrics off",
            ));
        }
        self.sampling.validate()?;
        self.attribution.validate()?;
        self.host.validate()?;
        self.spool.validate()?;
        if self.collectors.is_empty() {
            return Err(ConfigError::invalid(
                "collectors",
                "name at least one collector URL",
            ));
        }
        for (i, c) in self.collectors.iter().enumerate() {
            if !(c.starts_with("http://") || c.starts_with("https://")) {
                return Err(ConfigError::invalid(
                    &format!("collectors[{i}]"),
                    format!("`{c}` must start with http:// or https://"),
                ));
            }
        }
        if self.interval < Duration::from_millis(10) || self.interval > Duration::from_secs(30) {
            return Err(ConfigError::invalid(
                "interval",
                "must lie between 10ms and 30s",
            ));
        }
        if self.flush_interval < self.interval {
            return Err(ConfigError::invalid(
                "flush_interval",
                "must be at least `interval`",
            ));
        }
        if self.max_batch_samples == 0 {
            return Err(ConfigError::invalid(
                "max_batch_samples",
                "must be positive",
            ));
        }
        if self.max_in_flight == 0 {
            return Err(ConfigError::invalid("max_in_flight", "must be positive"));
        }
        if self.sim.gpus == 0 || self.sim.gpus > 64 {
            return Err(ConfigError::invalid(
                "sim.gpus",
                "must lie between 1 and 64",
            ));
        }
        if self.sim.nodes == 0 || self.sim.node_index >= self.sim.nodes {
            return Err(ConfigError::invalid(
                "sim.node_index",
                "must be below sim.nodes",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_str, ConfigError};
    use std::path::Path;

    #[test]
    fn attribution_defaults_and_overrides() {
        let a: AgentConfig = parse_str("source = \"sim\"\n", Path::new("a.toml")).unwrap();
        assert_eq!(a.attribution, AttributionSettings::default());
        assert!(a.attribution.enabled);
        assert_eq!(a.attribution.proc_root, Path::new("/proc"));
        assert_eq!(
            a.attribution.pod_resources_socket,
            Path::new("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(a.attribution.mapping_dir, None);
        assert_eq!(a.attribution.refresh_interval, Duration::from_secs(10));

        let a: AgentConfig = parse_str(
            "[attribution]\nenabled = false\nproc_root = \"/host/proc\"\n\
             pod_resources_socket = \"\"\nmapping_dir = \"/run/hpc-jobs\"\n\
             refresh_interval = \"30s\"\n",
            Path::new("a.toml"),
        )
        .unwrap();
        assert!(!a.attribution.enabled);
        assert_eq!(a.attribution.proc_root, Path::new("/host/proc"));
        assert!(a.attribution.pod_resources_socket.as_os_str().is_empty());
        assert_eq!(
            a.attribution.mapping_dir.as_deref(),
            Some(Path::new("/run/hpc-jobs"))
        );
        assert_eq!(a.attribution.refresh_interval, Duration::from_secs(30));
    }

    #[test]
    fn attribution_errors_name_the_key() {
        for (text, key) in [
            (
                "[attribution]\nrefresh_interval = \"10ms\"\n",
                "attribution.refresh_interval",
            ),
            ("[attribution]\nproc_root = \"\"\n", "attribution.proc_root"),
            (
                "[attribution]\nmapping_dir = \"\"\n",
                "attribution.mapping_dir",
            ),
        ] {
            let e = parse_str::<AgentConfig>(text, Path::new("a.toml")).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { key: k, .. } if k == key),
                "{text}: {e}"
            );
        }
        let e = parse_str::<AgentConfig>("[attribution]\nprocroot = \"/p\"\n", Path::new("a.toml"))
            .unwrap_err();
        assert!(e.to_string().contains("procroot"), "{e}");
    }

    #[test]
    fn spool_defaults_and_errors_name_the_key() {
        let a: AgentConfig = parse_str("source = \"sim\"\n", Path::new("a.toml")).unwrap();
        assert_eq!(a.spool, SpoolConfig::default());
        assert_eq!(a.spool.fsync_interval, Duration::from_secs(1));
        assert_eq!(a.spool.drain_rate, 50);
        let a: AgentConfig = parse_str(
            "[spool]\ndir = \"/var/spool/fw\"\nfsync_interval = \"200ms\"\ndrain_rate = 10\n",
            Path::new("a.toml"),
        )
        .unwrap();
        assert_eq!(a.spool.fsync_interval, Duration::from_millis(200));
        assert_eq!(a.spool.drain_rate, 10);
        for (text, key) in [
            (
                "[spool]\nfsync_interval = \"1ms\"\n",
                "spool.fsync_interval",
            ),
            ("[spool]\ndrain_rate = 0\n", "spool.drain_rate"),
            ("[spool]\nmax_bytes = 10\n", "spool.max_bytes"),
            ("[spool]\ndir = \"\"\n", "spool.dir"),
        ] {
            let e = parse_str::<AgentConfig>(text, Path::new("a.toml")).unwrap_err();
            assert!(
                matches!(&e, ConfigError::Invalid { key: k, .. } if k == key),
                "{text}: {e}"
            );
        }
    }

    #[test]
    fn attribution_is_overridable_from_the_environment() {
        let env = vec![(
            "FLOPWATCH_ATTRIBUTION__PROC_ROOT".to_string(),
            "/host/proc".to_string(),
        )];
        let path =
            std::env::temp_dir().join(format!("flopwatch-config-attr-{}.toml", std::process::id()));
        std::fs::write(&path, "source = \"sim\"\n").unwrap();
        let a: Result<AgentConfig, _> = crate::load_file_with(&path, &env);
        let _ = std::fs::remove_file(&path);
        assert_eq!(a.unwrap().attribution.proc_root, Path::new("/host/proc"));
    }
}
