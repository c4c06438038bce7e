//! Job attribution: which job each GPU runs, found from outside the job.
//!
//! Sources, strongest first (per GPU, the first that names an owner wins):
//!
//! 1. **kubelet pod-resources** ([`pods`]): the device plugin's GPU → pod
//!    assignment, with pod name, namespace and container. No process is
//!    looked at. A GPU several pods share (time-slicing) falls through.
//! 2. **process cgroups** ([`cgroup`]): the source's compute processes
//!    ([`GpuSource::processes`](crate::source::GpuSource::processes)) →
//!    `<proc_root>/<pid>/cgroup` → pod UID and container, Slurm job, or a
//!    plain container. A process that ended between the listing and the
//!    read, or whose file is unreadable or garbage, is skipped and counted.
//! 3. **mapping directory** ([`mapping`]): dcgm-exporter's
//!    `hpc-job-mapping-dir`, a file per GPU index or UUID holding the job.
//! 4. the **source's own** attribution (the simulator knows its jobs);
//! 5. the configured **`job` label**.
//!
//! Job ids: `namespace/pod` for a pod (its UID when the name is unknown),
//! the job id for Slurm and the mapping directory, the 12-hex short id for
//! a container; ids past the collector's 128 bytes are shortened
//! ([`fit_id`]).
//!
//! **Shared GPUs.** When a GPU's processes belong to several owners (pods
//! time-slicing one GPU, MPS clients), every owner is listed, each with its
//! [`Share`] of the GPU's work, apportioned at every capture by the SM
//! utilisation of its processes over the capture's window
//! ([`GpuSource::process_utilization`](crate::source::GpuSource::process_utilization),
//! NVML's `nvmlDeviceGetProcessUtilization`), or evenly ([`Split::Equal`])
//! where the driver gives no per-process figure or the processes were idle.
//! The split is apportioned, not measured: the GPU has one set of
//! counters. The collector divides the GPU's OFU between the owners by
//! their shares (docs/ATTRIBUTION.md, *Shared GPUs*).
//!
//! Cost: lookups run at most every `refresh_interval` (10 s by default), off
//! the sampling path: [`Attribution::tick`] starts a refresh in a
//! background task and installs its result at a later capture, so a slow
//! kubelet never delays a sample. Between refreshes every capture carries
//! the last result ([`Attribution::apply`]).

pub mod cgroup;
pub mod mapping;
pub mod pods;

use crate::source::Capture;
use cgroup::CgroupOwner;
use flopwatch_proto::model::{GpuInfo, JobAssignment, Share, Split};
use futures::FutureExt;
use pods::{KubeletPodResolver, PodDevice, PodResolver};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, warn};

/// Most process cgroup files read in one refresh (bounded work).
pub const MAX_PIDS_PER_REFRESH: usize = 4096;
/// How long one pod-resources `List` may take.
pub const POD_RESOURCES_TIMEOUT: Duration = Duration::from_secs(2);

/// Attribution settings (`[attribution]` in `agent.toml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributionOptions {
    /// Lookups on; off leaves the source's jobs and the label.
    pub enabled: bool,
    /// Where processes are listed (`/host/proc` in a pod).
    pub proc_root: PathBuf,
    /// Kubelet pod-resources socket; `None` skips it.
    pub pod_resources_socket: Option<PathBuf>,
    /// Per-GPU mapping directory.
    pub mapping_dir: Option<PathBuf>,
    /// Where jobs drop their MFU reports ([`crate::mfu`]); read whether or
    /// not lookups are enabled.
    pub mfu_dir: Option<PathBuf>,
    /// Lookups run at most this often.
    pub refresh_interval: Duration,
}

impl Default for AttributionOptions {
    /// The `[attribution]` defaults.
    fn default() -> Self {
        Self::from_settings(&flopwatch_config::AgentConfig::default())
    }
}

impl AttributionOptions {
    /// No lookups: only the source's jobs and the label.
    pub fn disabled() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// The options `agent.toml` asks for (an empty socket path is `None`).
    pub fn from_settings(cfg: &flopwatch_config::AgentConfig) -> Self {
        let a = &cfg.attribution;
        Self {
            enabled: a.enabled,
            proc_root: a.proc_root.clone(),
            pod_resources_socket: (!a.pod_resources_socket.as_os_str().is_empty())
                .then(|| a.pod_resources_socket.clone()),
            mapping_dir: a.mapping_dir.clone(),
            mfu_dir: a.mfu_dir.clone(),
            refresh_interval: a.refresh_interval,
        }
    }
}

/// Why a lookup failed (never fatal: the GPU falls to the next source).
#[derive(Debug, thiserror::Error)]
pub enum AttributionError {
    /// The pod-resources socket does not exist (no kubelet on this node).
    #[error("pod-resources socket {} not present", .0.display())]
    NoSocket(PathBuf),
    /// The socket path cannot be used as an endpoint.
    #[error("pod-resources socket path {} is not usable", .0.display())]
    BadSocket(PathBuf),
    /// The kubelet answered with an error, or not at all.
    #[error("pod-resources List: {0}")]
    PodResources(Box<tonic::Status>),
    /// The kubelet did not answer in time.
    #[error("pod-resources List timed out after {0:?}")]
    Timeout(Duration),
}

/// Which source named an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// Kubelet pod-resources.
    PodResources,
    /// A process's cgroup.
    Cgroup,
    /// The mapping directory.
    MappingDir,
}

/// The job a GPU runs, as attribution found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Job identity (see the module docs).
    pub job_id: String,
    /// Pod name, when known.
    pub pod: String,
    /// Namespace, when known.
    pub namespace: String,
    /// Container name, or the 12-hex short id when only that is known.
    pub container: String,
    /// Slurm / HPC job id.
    pub hpc_job: String,
    /// Where it came from.
    pub via: Via,
}

impl Owner {
    /// The owner a pod-resources device names.
    pub fn from_pod(d: &PodDevice) -> Self {
        let job_id = fit_id(if d.namespace.is_empty() {
            d.pod.clone()
        } else {
            format!("{}/{}", d.namespace, d.pod)
        });
        Self {
            job_id,
            pod: d.pod.clone(),
            namespace: d.namespace.clone(),
            container: d.container.clone(),
            hpc_job: String::new(),
            via: Via::PodResources,
        }
    }

    /// The owner a cgroup names.
    pub fn from_cgroup(c: &CgroupOwner) -> Self {
        let mut o = Self {
            job_id: String::new(),
            pod: String::new(),
            namespace: String::new(),
            container: String::new(),
            hpc_job: String::new(),
            via: Via::Cgroup,
        };
        match c {
            CgroupOwner::Pod { uid, container_id } => {
                o.job_id = uid.clone();
                o.container = container_id
                    .as_deref()
                    .map(cgroup::short_id)
                    .unwrap_or_default()
                    .to_string();
            }
            CgroupOwner::Slurm { job_id } => {
                o.job_id = job_id.clone();
                o.hpc_job = job_id.clone();
            }
            CgroupOwner::Container { id } => {
                o.job_id = cgroup::short_id(id).to_string();
                o.container = o.job_id.clone();
            }
        }
        o
    }

    /// The owner a mapping file names.
    pub fn from_mapping(job: &str) -> Self {
        Self {
            job_id: fit_id(job.to_string()),
            pod: String::new(),
            namespace: String::new(),
            container: String::new(),
            hpc_job: fit_id(job.to_string()),
            via: Via::MappingDir,
        }
    }
}

pub use flopwatch_proto::model::{fit_id, MAX_JOB_ID_BYTES};

/// An owner of a GPU and its processes there (none when the owner came
/// from pod-resources or the mapping directory, which name no process).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Who.
    pub owner: Owner,
    /// Its compute processes on the GPU.
    pub pids: Vec<u32>,
}

/// Parts per million of a whole GPU.
const WHOLE_PPM: u32 = 1_000_000;

/// The shares of a GPU's `claims` (several owners): by the SM utilisation
/// of each owner's processes in `util` (PID → percent), else evenly. The
/// shares sum to exactly 10⁶ ppm.
pub fn apportion(claims: &[Claim], util: &HashMap<u32, f64>) -> Vec<Share> {
    let used: Vec<f64> = claims
        .iter()
        .map(|c| {
            c.pids
                .iter()
                .filter_map(|p| util.get(p))
                .filter(|u| u.is_finite() && **u > 0.0)
                .sum()
        })
        .collect();
    let total: f64 = used.iter().sum();
    let (weights, split) = if total > 0.0 {
        (used, Split::SmUtil)
    } else {
        (vec![1.0; claims.len()], Split::Equal)
    };
    let sum: f64 = weights.iter().sum();
    let mut ppm: Vec<u32> = weights
        .iter()
        .map(|w| (w / sum * f64::from(WHOLE_PPM)).round() as u32)
        .collect();
    // Rounding leftovers go to the largest share, so the GPU is whole.
    let given: i64 = ppm.iter().map(|&p| i64::from(p)).sum();
    if let Some(big) = (0..ppm.len()).max_by_key(|&i| ppm[i]) {
        let fixed = i64::from(ppm[big]) + i64::from(WHOLE_PPM) - given;
        ppm[big] = fixed.clamp(0, i64::from(WHOLE_PPM)) as u32;
    }
    ppm.into_iter().map(|ppm| Share { ppm, split }).collect()
}

/// Counters of the attribution lookups.
#[derive(Debug, Default)]
pub struct AttributionStats {
    /// Refreshes completed.
    pub refreshes: AtomicU64,
    /// Process cgroup files read and parsed.
    pub pids_read: AtomicU64,
    /// Processes skipped: ended before the read, unreadable, or over
    /// [`MAX_PIDS_PER_REFRESH`].
    pub pids_skipped: AtomicU64,
    /// Failed pod-resources calls (a missing socket is not counted).
    pub pod_resources_errors: AtomicU64,
}

/// Resolves owners by cgroup and mapping directory only (blocking file
/// reads; the pod-resources part is async and lives in
/// [`Attribution::refresh`]). `processes` pairs an inventory index with a
/// PID; `uuids` is the inventory's UUIDs. Per GPU, its one owner: of a
/// shared GPU the one with the most processes (ties: the smallest job id);
/// [`resolve_claims`] has them all.
pub fn resolve_local(
    opts: &AttributionOptions,
    uuids: &[String],
    processes: &[(usize, u32)],
    stats: &AttributionStats,
) -> Vec<Option<Owner>> {
    resolve_claims(opts, uuids, processes, stats)
        .into_iter()
        .map(|c| c.into_iter().next().map(|c| c.owner))
        .collect()
}

/// Every owner of each GPU by cgroup, with its processes there, most
/// processes first (ties: the smallest job id); else the mapping
/// directory's owner.
pub fn resolve_claims(
    opts: &AttributionOptions,
    uuids: &[String],
    processes: &[(usize, u32)],
    stats: &AttributionStats,
) -> Vec<Vec<Claim>> {
    let mut out: Vec<Vec<Claim>> = vec![Vec::new(); uuids.len()];
    // PID → owner, so a process on several GPUs is read once.
    let mut seen: HashMap<u32, Option<CgroupOwner>> = HashMap::new();
    let mut by_gpu: Vec<BTreeMap<CgroupOwner, Vec<u32>>> = vec![BTreeMap::new(); uuids.len()];
    let mut reads = 0usize;
    for &(gpu, pid) in processes {
        if gpu >= uuids.len() {
            continue;
        }
        let owner = match seen.entry(pid) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => {
                if reads >= MAX_PIDS_PER_REFRESH {
                    stats.pids_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                reads += 1;
                e.insert(match cgroup::read_owner(&opts.proc_root, pid) {
                    Ok(o) => {
                        stats.pids_read.fetch_add(1, Ordering::Relaxed);
                        o
                    }
                    Err(e) => {
                        debug!(pid, error = %e, "process cgroup unreadable; skipped");
                        stats.pids_skipped.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                })
            }
        };
        if let Some(owner) = owner {
            by_gpu[gpu].entry(owner.clone()).or_default().push(pid);
        }
    }
    for (g, owners) in by_gpu.into_iter().enumerate() {
        let mut claims: Vec<Claim> = owners
            .into_iter()
            .map(|(o, pids)| Claim {
                owner: Owner::from_cgroup(&o),
                pids,
            })
            .collect();
        claims.sort_by(|a, b| {
            b.pids
                .len()
                .cmp(&a.pids.len())
                .then_with(|| a.owner.job_id.cmp(&b.owner.job_id))
        });
        // Two cgroups of one job (its containers) are one owner.
        claims.dedup_by(|b, a| {
            let same = a.owner.job_id == b.owner.job_id;
            if same {
                a.pids.append(&mut b.pids);
            }
            same
        });
        out[g] = claims;
    }
    if let Some(dir) = &opts.mapping_dir {
        for (g, uuid) in uuids.iter().enumerate() {
            if out[g].is_empty() {
                if let Some(j) = mapping::read_mapping(dir, g as u32, uuid) {
                    out[g].push(Claim {
                        owner: Owner::from_mapping(&j),
                        pids: Vec::new(),
                    });
                }
            }
        }
    }
    out
}

/// Pod-resources owners over local ones, GPU by GPU.
pub fn combine(pods: Vec<Option<PodDevice>>, local: Vec<Vec<Claim>>) -> Vec<Vec<Claim>> {
    pods.into_iter()
        .zip(local)
        .map(|(p, l)| match p {
            Some(p) => vec![Claim {
                owner: Owner::from_pod(&p),
                pids: Vec::new(),
            }],
            None => l,
        })
        .collect()
}

/// One full lookup: pod-resources (async), then cgroups and the mapping
/// directory on a blocking thread.
async fn resolve_all(
    opts: AttributionOptions,
    resolver: Option<Arc<dyn PodResolver>>,
    uuids: Vec<String>,
    processes: Vec<(usize, u32)>,
    stats: Arc<AttributionStats>,
) -> Vec<Vec<Claim>> {
    let devices = match &resolver {
        Some(r) => match r.list().await {
            Ok(d) => d,
            Err(AttributionError::NoSocket(p)) => {
                debug!(socket = %p.display(), "no pod-resources socket");
                Vec::new()
            }
            Err(e) => {
                if stats.pod_resources_errors.fetch_add(1, Ordering::Relaxed) == 0 {
                    warn!(error = %e, "pod-resources lookup failed; using process cgroups");
                } else {
                    debug!(error = %e, "pod-resources lookup failed");
                }
                Vec::new()
            }
        },
        None => Vec::new(),
    };
    let pods = pods::gpu_pods(&devices, &uuids);
    let n = uuids.len();
    let stats2 = stats.clone();
    let local =
        tokio::task::spawn_blocking(move || resolve_claims(&opts, &uuids, &processes, &stats2))
            .await
            .unwrap_or_else(|e| {
                warn!(error = %e, "attribution lookup task failed");
                vec![Vec::new(); n]
            });
    stats.refreshes.fetch_add(1, Ordering::Relaxed);
    combine(pods, local)
}

/// The agent's attribution state: the latest owners per GPU, refreshed at
/// most every `refresh_interval`, applied to every capture.
pub struct Attribution {
    opts: AttributionOptions,
    label: Option<String>,
    resolver: Option<Arc<dyn PodResolver>>,
    /// Every owner of each GPU (several on a shared GPU), by inventory
    /// index.
    claims: Vec<Vec<Claim>>,
    /// Each GPU's first owner (what [`Attribution::owners`] shows).
    owners: Vec<Option<Owner>>,
    /// (GPU UUID, job id) → since when the job runs there.
    since: HashMap<(String, String), i64>,
    last_refresh_ms: Option<i64>,
    pending: Option<tokio::task::JoinHandle<Vec<Vec<Claim>>>>,
    stats: Arc<AttributionStats>,
}

impl std::fmt::Debug for Attribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attribution")
            .field("opts", &self.opts)
            .field("label", &self.label)
            .field("owners", &self.owners)
            .field("last_refresh_ms", &self.last_refresh_ms)
            .finish_non_exhaustive()
    }
}

impl Drop for Attribution {
    fn drop(&mut self) {
        // A lookup still waiting on the kubelet is of no use any more.
        if let Some(h) = self.pending.take() {
            h.abort();
        }
    }
}

impl Attribution {
    /// Attribution per `opts`, with the kubelet's socket when it names one,
    /// and `label` as the last fallback.
    pub fn new(opts: AttributionOptions, label: Option<String>) -> Self {
        let resolver = opts
            .pod_resources_socket
            .as_ref()
            .filter(|_| opts.enabled)
            .map(|s| {
                Arc::new(KubeletPodResolver::new(s.clone(), POD_RESOURCES_TIMEOUT))
                    as Arc<dyn PodResolver>
            });
        Self::with_resolver(opts, label, resolver)
    }

    /// Attribution with an explicit pod resolver (tests, other kubelets).
    pub fn with_resolver(
        opts: AttributionOptions,
        label: Option<String>,
        resolver: Option<Arc<dyn PodResolver>>,
    ) -> Self {
        Self {
            opts,
            label,
            resolver,
            claims: Vec::new(),
            owners: Vec::new(),
            since: HashMap::new(),
            last_refresh_ms: None,
            pending: None,
            stats: Arc::new(AttributionStats::default()),
        }
    }

    /// The lookup counters.
    pub fn stats(&self) -> Arc<AttributionStats> {
        self.stats.clone()
    }

    /// The owners of the last completed refresh, by inventory index (of a
    /// shared GPU the one with the most processes; [`Attribution::claims`]
    /// has them all).
    pub fn owners(&self) -> &[Option<Owner>] {
        &self.owners
    }

    /// Every owner of each GPU of the last completed refresh, by inventory
    /// index.
    pub fn claims(&self) -> &[Vec<Claim>] {
        &self.claims
    }

    fn install(&mut self, claims: Vec<Vec<Claim>>) {
        self.owners = claims
            .iter()
            .map(|c| c.first().map(|c| c.owner.clone()))
            .collect();
        self.claims = claims;
    }

    /// Whether a refresh is due at `now_ms` (and none is running).
    pub fn due(&self, now_ms: i64) -> bool {
        self.opts.enabled
            && self.pending.is_none()
            && self.last_refresh_ms.is_none_or(|last| {
                now_ms.saturating_sub(last) >= self.opts.refresh_interval.as_millis() as i64
            })
    }

    /// Looks everything up now and waits for the result (tests, and
    /// callers that want the owners before the first capture).
    pub async fn refresh(
        &mut self,
        now_ms: i64,
        inventory: &[GpuInfo],
        processes: &[(usize, u32)],
    ) {
        if !self.opts.enabled {
            return;
        }
        self.last_refresh_ms = Some(now_ms);
        let claims = resolve_all(
            self.opts.clone(),
            self.resolver.clone(),
            inventory.iter().map(|g| g.uuid.clone()).collect(),
            processes.to_vec(),
            self.stats.clone(),
        )
        .await;
        self.install(claims);
    }

    /// The sampling loop's call, once per capture: installs a finished
    /// background refresh, and starts one when due (`processes` is only
    /// called then). Never waits. Must run inside a tokio runtime.
    pub fn tick(
        &mut self,
        now_ms: i64,
        inventory: &[GpuInfo],
        processes: impl FnOnce() -> Vec<(usize, u32)>,
    ) {
        if self.pending.as_ref().is_some_and(|h| h.is_finished()) {
            if let Some(Some(result)) = self.pending.take().map(|h| h.now_or_never()) {
                match result {
                    Ok(claims) => self.install(claims),
                    Err(e) => warn!(error = %e, "attribution refresh failed"),
                }
            }
        }
        if !self.due(now_ms) {
            return;
        }
        self.last_refresh_ms = Some(now_ms);
        self.pending = Some(tokio::spawn(resolve_all(
            self.opts.clone(),
            self.resolver.clone(),
            inventory.iter().map(|g| g.uuid.clone()).collect(),
            processes(),
            self.stats.clone(),
        )));
    }

    /// Sets `capture.jobs`: per GPU, the looked-up owner, else the source's
    /// own assignment, else the label; GPUs with none are left out.
    /// `since_ms` is when the agent first saw the job on the GPU (the
    /// source's value when it has one). A shared GPU's owners are split
    /// evenly ([`Attribution::apply_with_util`] splits by utilisation).
    pub fn apply(&mut self, now_ms: i64, capture: &mut Capture, inventory: &[GpuInfo]) {
        self.apply_with_util(now_ms, capture, inventory, &[]);
    }

    /// [`Attribution::apply`], with the capture's per-process SM
    /// utilisation (inventory index, PID, percent) to apportion a GPU that
    /// several owners share.
    pub fn apply_with_util(
        &mut self,
        now_ms: i64,
        capture: &mut Capture,
        inventory: &[GpuInfo],
        util: &[(usize, u32, f64)],
    ) {
        let mut from_source: HashMap<String, Vec<JobAssignment>> = HashMap::new();
        for j in std::mem::take(&mut capture.jobs) {
            from_source.entry(j.gpu_uuid.clone()).or_default().push(j);
        }
        for (g, info) in inventory.iter().enumerate() {
            let claims = self.claims.get(g).map_or(&[][..], Vec::as_slice);
            let jobs: Vec<JobAssignment> =
                match (claims, from_source.remove(&info.uuid), &self.label) {
                    ([], Some(j), _) => j,
                    ([], None, Some(label)) => vec![JobAssignment {
                        gpu_uuid: info.uuid.clone(),
                        job_id: label.clone(),
                        ..Default::default()
                    }],
                    ([], None, None) => Vec::new(),
                    (claims, _, _) => {
                        let shares: Vec<Option<Share>> = if claims.len() > 1 {
                            let mine: HashMap<u32, f64> = util
                                .iter()
                                .filter(|(i, _, _)| *i == g)
                                .map(|&(_, pid, u)| (pid, u))
                                .collect();
                            apportion(claims, &mine).into_iter().map(Some).collect()
                        } else {
                            vec![None]
                        };
                        claims
                            .iter()
                            .zip(shares)
                            .map(|(c, share)| {
                                let o = &c.owner;
                                JobAssignment {
                                    gpu_uuid: info.uuid.clone(),
                                    job_id: o.job_id.clone(),
                                    pod: o.pod.clone(),
                                    namespace: o.namespace.clone(),
                                    container: o.container.clone(),
                                    hpc_job: o.hpc_job.clone(),
                                    since_ms: 0,
                                    share,
                                }
                            })
                            .collect()
                    }
                };
            self.since
                .retain(|(gpu, job), _| gpu != &info.uuid || jobs.iter().any(|j| &j.job_id == job));
            for mut job in jobs {
                let key = (info.uuid.clone(), job.job_id.clone());
                let since = *self.since.entry(key).or_insert(if job.since_ms > 0 {
                    job.since_ms
                } else {
                    now_ms
                });
                if job.since_ms <= 0 {
                    job.since_ms = since;
                }
                capture.jobs.push(job);
            }
        }
    }

    /// The options in effect.
    pub fn options(&self) -> &AttributionOptions {
        &self.opts
    }
}
