//! The latest state of every GPU and agent, in memory, for `/metrics` and
//! remote write: each GPU's OFU over the last batch (eq. 11 over the
//! batch's windows), the last value of each counter, each metric's current
//! sampling interval, and each agent's pending (unacknowledged) data.
//!
//! Snapshots leave out what is stale ([`crate::staleness`]): a counter
//! (or a GPU's OFU) whose newest sample is three of its sampling windows
//! and 10 s old, and a device with nothing current — the way Prometheus
//! marks a series stale, so that a field that left the page or an agent
//! that went away stops being exported instead of repeating its last
//! value. A GPU stays listed, with no values, for [`STALE_MS`] after its
//! agent last reported it (its last-sample time tells alerts it stopped);
//! so do agents.

use crate::staleness::stale_after_ms;
use flopwatch_proto::model::{DeviceInfo, SamplingInterval, SeriesBatch};
use flopwatch_proto::v1::JobAssignment;
use std::collections::{BTreeMap, HashMap};
use std::sync::RwLock;

/// Agents not heard from for this long are not exported, ms.
pub(crate) const STALE_MS: i64 = crate::staleness::STALE_MAX_MS;

/// When a counter was last received and how long it stays current.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Freshness {
    /// Collector clock at its last sample's arrival, unix ms.
    pub seen_ms: i64,
    /// How long after that it stays current, ms.
    pub for_ms: i64,
}

impl Freshness {
    fn current(&self, now_ms: i64) -> bool {
        now_ms - self.seen_ms <= self.for_ms
    }
}

/// How long a series whose batch held `s` stays current: by the window
/// of its newest sample, else the spacing of its last two, else the
/// agent's reported interval, counted from that sample's time — on the
/// collector's clock, as the sample's age when its batch left the agent
/// (`sent_at_ms`, the agent's clock) before it arrived at `now_ms`.
fn freshness(s: &SeriesBatch, interval_ms: Option<u32>, sent_at_ms: i64, now_ms: i64) -> Freshness {
    let n = s.points.len();
    let spacing = (n >= 2)
        .then(|| s.points[n - 1].ts_ms - s.points[n - 2].ts_ms)
        .and_then(|d| u32::try_from(d).ok());
    let window = s
        .points
        .last()
        .and_then(|p| p.window_ms)
        .filter(|&w| w > 0)
        .or(spacing)
        .into_iter()
        .chain(interval_ms)
        .max();
    let age = s
        .points
        .last()
        .filter(|_| sent_at_ms > 0)
        .map_or(0, |p| (sent_at_ms - p.ts_ms).max(0));
    Freshness {
        seen_ms: now_ms - age,
        for_ms: stale_after_ms(window),
    }
}

/// One GPU, as last seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuLive {
    /// Tenant.
    pub tenant: String,
    /// GPU UUID.
    pub uuid: String,
    /// Index on its node.
    pub index: u32,
    /// Product name.
    pub model: String,
    /// Node id.
    pub node_id: String,
    /// Node hostname.
    pub hostname: String,
    /// Job attribution, when known.
    pub job: Option<JobAssignment>,
    /// The jobs sharing the GPU (time-slicing, MPS) and their apportioned
    /// shares, when several do (then `job` is `None`).
    pub shares: Vec<JobAssignment>,
    /// OFU over the last batch (fraction), when its inputs were present.
    pub ofu: Option<f64>,
    /// Tensor activity over the last batch.
    pub tensor_active: f64,
    /// SM clock over the last batch, MHz.
    pub sm_clock_mhz: f64,
    /// End of the last batch's newest sample, unix ms.
    pub ts_ms: i64,
    /// Last value of each metric with its timestamp.
    pub counters: BTreeMap<String, (i64, f64)>,
    /// Each metric's current sampling interval, ms.
    pub intervals: BTreeMap<String, u32>,
    /// When this entry was refreshed (collector clock), unix ms.
    pub seen_ms: i64,
    /// How current each counter is.
    pub fresh: BTreeMap<String, Freshness>,
    /// How current the OFU is (that of its tensor-activity input).
    pub ofu_fresh: Freshness,
}

/// One node device (InfiniBand port, NUMA node, host), as last seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceLive {
    /// Tenant.
    pub tenant: String,
    /// Series key (`ib:mlx5_0:1@node-3`).
    pub id: String,
    /// Kind (`ib_port`, `numa_node`, `host`).
    pub kind: String,
    /// Name on the node (`mlx5_0:1`, `0`, `host`).
    pub name: String,
    /// Node id.
    pub node_id: String,
    /// Node hostname.
    pub hostname: String,
    /// Last value of each metric with its timestamp.
    pub counters: BTreeMap<String, (i64, f64)>,
    /// Each metric's current sampling interval, ms.
    pub intervals: BTreeMap<String, u32>,
    /// When this entry was refreshed (collector clock), unix ms.
    pub seen_ms: i64,
    /// How current each counter is.
    pub fresh: BTreeMap<String, Freshness>,
}

/// One agent, as last seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentLive {
    /// Tenant.
    pub tenant: String,
    /// Agent id.
    pub agent_id: String,
    /// Node hostname.
    pub hostname: String,
    /// Bytes waiting in the agent for an acknowledgement.
    pub pending_bytes: u64,
    /// Batches waiting in the agent for an acknowledgement.
    pub pending_batches: u32,
    /// When this entry was refreshed (collector clock), unix ms.
    pub seen_ms: i64,
}

/// OFU of one GPU over one batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchOfu {
    /// Window-weighted mean OFU.
    pub ofu: f64,
    /// Window-weighted mean tensor activity.
    pub tensor_active: f64,
    /// Mean SM clock, MHz.
    pub sm_clock_mhz: f64,
    /// Newest sample's timestamp.
    pub ts_ms: i64,
}

/// What one committed batch tells about its node.
pub struct BatchView<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Agent id.
    pub agent_id: &'a str,
    /// Node id.
    pub node_id: &'a str,
    /// Hostname.
    pub hostname: &'a str,
    /// The node's GPUs: uuid, index, model.
    pub gpus: Vec<(&'a str, u32, &'a str)>,
    /// The node's devices (InfiniBand ports, NUMA nodes, the host).
    pub devices: &'a [DeviceInfo],
    /// Job attribution by GPU.
    pub jobs: &'a HashMap<String, JobAssignment>,
    /// The jobs of each GPU several share, with their shares.
    pub shared: &'a HashMap<String, Vec<JobAssignment>>,
    /// Per-GPU OFU of the batch.
    pub ofu: &'a HashMap<String, BatchOfu>,
    /// The batch's samples.
    pub series: &'a [SeriesBatch],
    /// The agent's sampling intervals.
    pub intervals: &'a [SamplingInterval],
    /// Pending bytes and batches in the agent.
    pub pending: (u64, u32),
    /// When the agent sent the batch (its clock), unix ms; 0: not known.
    pub sent_at_ms: i64,
}

/// The in-memory live view.
#[derive(Debug, Default)]
pub struct Live {
    gpus: RwLock<HashMap<(String, String), GpuLive>>,
    agents: RwLock<HashMap<(String, String), AgentLive>>,
    devices: RwLock<HashMap<(String, String), DeviceLive>>,
}

impl Live {
    /// Folds a committed batch in, at collector time `now_ms`.
    pub fn record(&self, b: &BatchView<'_>, now_ms: i64) {
        if let Ok(mut agents) = self.agents.write() {
            agents.insert(
                (b.tenant.to_string(), b.agent_id.to_string()),
                AgentLive {
                    tenant: b.tenant.to_string(),
                    agent_id: b.agent_id.to_string(),
                    hostname: b.hostname.to_string(),
                    pending_bytes: b.pending.0,
                    pending_batches: b.pending.1,
                    seen_ms: now_ms,
                },
            );
        }
        self.record_devices(b, now_ms);
        if let Ok(mut gpus) = self.gpus.write() {
            fold(&mut gpus, b, now_ms, |_| true);
        }
    }

    fn record_devices(&self, b: &BatchView<'_>, now_ms: i64) {
        if b.devices.is_empty() {
            return;
        }
        let Ok(mut devices) = self.devices.write() else {
            return;
        };
        for d in b.devices {
            let e = devices
                .entry((b.tenant.to_string(), d.id.clone()))
                .or_default();
            e.tenant = b.tenant.to_string();
            e.id = d.id.clone();
            e.kind = d.kind.clone();
            e.name = d.name.clone();
            e.node_id = b.node_id.to_string();
            e.hostname = b.hostname.to_string();
            e.seen_ms = now_ms;
        }
        let intervals = intervals_of(b);
        for s in b.series {
            let (Some(last), Some(e)) = (
                s.points.last(),
                devices.get_mut(&(b.tenant.to_string(), s.gpu_uuid.clone())),
            ) else {
                continue;
            };
            let interval = intervals
                .get(&(s.gpu_uuid.as_str(), s.metric.as_str()))
                .copied();
            e.fresh.insert(
                s.metric.clone(),
                freshness(s, interval, b.sent_at_ms, now_ms),
            );
            e.counters
                .insert(s.metric.clone(), (last.ts_ms, last.value));
        }
        for i in b.intervals {
            if let Some(e) = devices.get_mut(&(b.tenant.to_string(), i.gpu_uuid.clone())) {
                e.intervals.insert(i.metric.clone(), i.interval_ms);
            }
        }
    }

    /// Devices with a current counter at `now_ms`, with their current
    /// counters only, ordered by tenant, hostname and id.
    pub fn devices(&self, now_ms: i64) -> Vec<DeviceLive> {
        let mut v: Vec<DeviceLive> = self
            .devices
            .read()
            .map(|m| {
                m.values()
                    .filter_map(|d| {
                        let mut d = d.clone();
                        let fresh = &d.fresh;
                        d.counters
                            .retain(|k, _| fresh.get(k).is_some_and(|f| f.current(now_ms)));
                        (!d.counters.is_empty()).then_some(d)
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| (&a.tenant, &a.hostname, &a.id).cmp(&(&b.tenant, &b.hostname, &b.id)));
        v
    }

    /// The tenants that have a device with this id (stale ones included:
    /// its stored series stay queryable), for series queries.
    pub fn device_tenants(&self, id: &str) -> Vec<String> {
        self.devices
            .read()
            .map(|m| {
                m.keys()
                    .filter(|(_, d)| d == id)
                    .map(|(t, _)| t.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// GPUs reported within [`STALE_MS`] of `now_ms` with what of them is
    /// current — their current counters only, and their OFU while its
    /// input is current — ordered by tenant, hostname and index.
    pub fn gpus(&self, now_ms: i64) -> Vec<GpuLive> {
        let mut v: Vec<GpuLive> = self
            .gpus
            .read()
            .map(|m| m.values().filter_map(|g| current(g, now_ms)).collect())
            .unwrap_or_default();
        sort_gpus(&mut v);
        v
    }

    /// How many GPUs [`Live::gpus`] would give of the tenants `allows`
    /// accepts, counted without copying them.
    pub fn count_gpus(&self, now_ms: i64, allows: impl Fn(&str) -> bool) -> usize {
        self.gpus
            .read()
            .map(|m| {
                m.values()
                    .filter(|g| now_ms - g.seen_ms <= STALE_MS && allows(&g.tenant))
                    .count()
            })
            .unwrap_or_default()
    }

    /// [`Live::gpus`] without each GPU's counters and sampling intervals:
    /// what node, job and fleet figures need, at a few hundred bytes a GPU.
    pub fn gpus_light(&self, now_ms: i64) -> Vec<GpuLive> {
        let mut v: Vec<GpuLive> = self
            .gpus
            .read()
            .map(|m| {
                m.values()
                    .filter(|g| now_ms - g.seen_ms <= STALE_MS)
                    .map(|g| GpuLive {
                        tenant: g.tenant.clone(),
                        uuid: g.uuid.clone(),
                        index: g.index,
                        model: g.model.clone(),
                        node_id: g.node_id.clone(),
                        hostname: g.hostname.clone(),
                        job: g.job.clone(),
                        shares: g.shares.clone(),
                        ofu: g.ofu.filter(|_| g.ofu_fresh.current(now_ms)),
                        tensor_active: g.tensor_active,
                        sm_clock_mhz: g.sm_clock_mhz,
                        ts_ms: g.ts_ms,
                        counters: BTreeMap::new(),
                        intervals: BTreeMap::new(),
                        seen_ms: g.seen_ms,
                        fresh: BTreeMap::new(),
                        ofu_fresh: g.ofu_fresh,
                    })
                    .collect()
            })
            .unwrap_or_default();
        sort_gpus(&mut v);
        v
    }

    /// Agents refreshed within [`STALE_MS`] of `now_ms`.
    pub fn agents(&self, now_ms: i64) -> Vec<AgentLive> {
        let mut v: Vec<AgentLive> = self
            .agents
            .read()
            .map(|m| {
                m.values()
                    .filter(|a| now_ms - a.seen_ms <= STALE_MS)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| (&a.tenant, &a.agent_id).cmp(&(&b.tenant, &b.agent_id)));
        v
    }
}

/// The batch's reported sampling intervals by (series key, metric), once
/// per batch rather than a scan per series.
fn intervals_of<'a>(b: &'a BatchView<'_>) -> HashMap<(&'a str, &'a str), u32> {
    b.intervals
        .iter()
        .map(|i| ((i.gpu_uuid.as_str(), i.metric.as_str()), i.interval_ms))
        .collect()
}

/// What batch `b` tells of its GPUs, folded into `gpus` (by tenant and
/// UUID) at `now_ms`: the GPUs, and the series of the metrics `keep`
/// takes.
fn fold(
    gpus: &mut HashMap<(String, String), GpuLive>,
    b: &BatchView<'_>,
    now_ms: i64,
    keep: impl Fn(&str) -> bool,
) {
    // The batch's GPUs' keys, built once: a batch holds many series
    // of few GPUs.
    let keys: Vec<(String, String)> = b
        .gpus
        .iter()
        .map(|(uuid, _, _)| (b.tenant.to_string(), uuid.to_string()))
        .collect();
    for (key, (uuid, index, model)) in keys.iter().zip(&b.gpus) {
        let e = gpus.entry(key.clone()).or_default();
        set(&mut e.tenant, b.tenant);
        set(&mut e.uuid, uuid);
        e.index = *index;
        set(&mut e.model, model);
        set(&mut e.node_id, b.node_id);
        set(&mut e.hostname, b.hostname);
        let job = b.jobs.get(*uuid).filter(|j| !j.job_id.is_empty());
        if e.job.as_ref() != job {
            e.job = job.cloned();
        }
        match b.shared.get(*uuid) {
            Some(v) if *v != e.shares => e.shares = v.clone(),
            Some(_) => {}
            None => e.shares.clear(),
        }
        if let Some(o) = b.ofu.get(*uuid) {
            e.ofu = Some(o.ofu);
            e.tensor_active = o.tensor_active;
            e.sm_clock_mhz = o.sm_clock_mhz;
            e.ts_ms = e.ts_ms.max(o.ts_ms);
        }
        e.seen_ms = now_ms;
    }
    let intervals = intervals_of(b);
    let interval = |uuid: &str, metric: &str| intervals.get(&(uuid, metric)).copied();
    let key_of = |uuid: &str| match keys.iter().find(|k| k.1 == uuid) {
        Some(k) => k.clone(),
        None => (b.tenant.to_string(), uuid.to_string()),
    };
    let mut at: Option<(&str, (String, String))> = None;
    for s in b.series {
        let Some(last) = s.points.last().filter(|_| keep(&s.metric)) else {
            continue;
        };
        if at.as_ref().is_none_or(|(u, _)| *u != s.gpu_uuid) {
            at = Some((s.gpu_uuid.as_str(), key_of(&s.gpu_uuid)));
        }
        let Some(e) = at.as_ref().and_then(|(_, k)| gpus.get_mut(k)) else {
            continue;
        };
        let f = freshness(s, interval(&s.gpu_uuid, &s.metric), b.sent_at_ms, now_ms);
        if s.metric == flopwatch_proto::metrics::TENSOR_ACTIVE && b.ofu.contains_key(&s.gpu_uuid) {
            e.ofu_fresh = f;
        }
        match e.counters.get_mut(&s.metric) {
            Some(c) => *c = (last.ts_ms, last.value),
            None => {
                e.counters
                    .insert(s.metric.clone(), (last.ts_ms, last.value));
            }
        }
        match e.fresh.get_mut(&s.metric) {
            Some(x) => *x = f,
            None => {
                e.fresh.insert(s.metric.clone(), f);
            }
        }
        e.ts_ms = e.ts_ms.max(last.ts_ms);
    }
    for i in b.intervals {
        if let Some(e) = gpus.get_mut(&(b.tenant.to_string(), i.gpu_uuid.clone())) {
            e.intervals.insert(i.metric.clone(), i.interval_ms);
        }
    }
}

/// One GPU as one batch tells it, borrowed from the batch (nothing is
/// copied): what remote write forwards of it ([`batch_gpus`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct BatchGpu<'a> {
    pub tenant: &'a str,
    pub uuid: &'a str,
    pub index: u32,
    pub model: &'a str,
    pub node_id: &'a str,
    pub hostname: &'a str,
    /// Job attribution, when known.
    pub job: Option<&'a JobAssignment>,
    /// The batch's OFU of the GPU, when its inputs were in the batch.
    pub ofu: Option<BatchOfu>,
    /// How current the OFU is (that of its tensor-activity input).
    pub ofu_fresh: Freshness,
    /// The series kept: metric, newest point (time, value), how current.
    pub counters: Vec<(&'a str, (i64, f64), Freshness)>,
}

impl BatchGpu<'_> {
    /// The newest point of the series of `metric`, and how current it is.
    pub(crate) fn counter(&self, metric: &str) -> Option<((i64, f64), Freshness)> {
        self.counters
            .iter()
            .find(|(m, _, _)| *m == metric)
            .map(|&(_, p, f)| (p, f))
    }
}

#[cfg(test)]
impl<'a> From<&'a GpuLive> for BatchGpu<'a> {
    fn from(g: &'a GpuLive) -> Self {
        Self {
            tenant: &g.tenant,
            uuid: &g.uuid,
            index: g.index,
            model: &g.model,
            node_id: &g.node_id,
            hostname: &g.hostname,
            job: g.job.as_ref(),
            ofu: g.ofu.map(|ofu| BatchOfu {
                ofu,
                tensor_active: g.tensor_active,
                sm_clock_mhz: g.sm_clock_mhz,
                ts_ms: g.ts_ms,
            }),
            ofu_fresh: g.ofu_fresh,
            counters: g
                .counters
                .iter()
                .map(|(m, &p)| (m.as_str(), p, g.fresh.get(m).copied().unwrap_or_default()))
                .collect(),
        }
    }
}

/// The GPUs of batch `b` as the batch alone tells them (their values in
/// it, nothing earlier), with the newest point of each series of the
/// metrics `keep` takes, in the node's order: what remote write forwards
/// for the batch. Borrowed from the batch: no GPU's labels are copied.
pub(crate) fn batch_gpus<'a>(
    b: &BatchView<'a>,
    now_ms: i64,
    keep: impl Fn(&str) -> bool,
) -> Vec<BatchGpu<'a>> {
    let mut out: Vec<BatchGpu<'a>> = b
        .gpus
        .iter()
        .map(|&(uuid, index, model)| BatchGpu {
            tenant: b.tenant,
            uuid,
            index,
            model,
            node_id: b.node_id,
            hostname: b.hostname,
            job: b.jobs.get(uuid).filter(|j| !j.job_id.is_empty()),
            ofu: b.ofu.get(uuid).copied(),
            ..Default::default()
        })
        .collect();
    let intervals = intervals_of(b);
    let interval = |uuid: &str, metric: &str| intervals.get(&(uuid, metric)).copied();
    // A batch holds many series of few GPUs, in runs of one GPU.
    let mut at: Option<usize> = None;
    for s in b.series {
        let Some(last) = s.points.last().filter(|_| keep(&s.metric)) else {
            continue;
        };
        if at.is_none_or(|i| out[i].uuid != s.gpu_uuid) {
            at = out.iter().position(|g| g.uuid == s.gpu_uuid);
        }
        let Some(g) = at.map(|i| &mut out[i]) else {
            continue;
        };
        let f = freshness(s, interval(&s.gpu_uuid, &s.metric), b.sent_at_ms, now_ms);
        if s.metric == flopwatch_proto::metrics::TENSOR_ACTIVE && g.ofu.is_some() {
            g.ofu_fresh = f;
        }
        let point = (last.ts_ms, last.value);
        match g.counters.iter_mut().find(|(m, _, _)| *m == s.metric) {
            Some(c) => (c.1, c.2) = (point, f),
            None => g.counters.push((s.metric.as_str(), point, f)),
        }
    }
    out
}

/// What of `g` is current at `now_ms` ([`crate::staleness`]); `None` once
/// its agent has not reported it for [`STALE_MS`]. Until then a GPU with
/// nothing current is still listed (its last-sample time is how alerts
/// see it stopped), without values.
/// Orders GPUs by tenant, hostname, index and UUID.
fn sort_gpus(v: &mut [GpuLive]) {
    v.sort_by(|a, b| {
        (&a.tenant, &a.hostname, a.index, &a.uuid).cmp(&(&b.tenant, &b.hostname, b.index, &b.uuid))
    });
}

fn current(g: &GpuLive, now_ms: i64) -> Option<GpuLive> {
    if now_ms - g.seen_ms > STALE_MS {
        return None;
    }
    let ofu = g.ofu.filter(|_| g.ofu_fresh.current(now_ms));
    let mut g = g.clone();
    g.ofu = ofu;
    let fresh = std::mem::take(&mut g.fresh);
    g.counters
        .retain(|k, _| fresh.get(k).is_some_and(|f| f.current(now_ms)));
    g.fresh = fresh;
    Some(g)
}

/// Mean OFU of groups of GPUs (a node, a job): every GPU weighs the same,
/// as in OFU eq. 11 over equal windows.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct GroupOfu {
    /// Mean OFU.
    pub ofu: f64,
    /// GPUs with an OFU value.
    pub gpus: u32,
}

/// Groups GPUs' OFU by `key` (GPUs for which `key` gives nothing are
/// skipped) and averages it, each GPU weighted by `share`: its share of a
/// card's capacity (1 for a whole GPU, less for a MIG instance;
/// docs/MIG.md). `key` may give a GPU several groups, each with the OFU it
/// counts there (a shared GPU's jobs: their apportioned parts).
pub(crate) fn group_ofu<K: Ord + Clone>(
    gpus: &[GpuLive],
    key: impl Fn(&GpuLive) -> Vec<(K, f64)>,
    share: impl Fn(&GpuLive) -> f64,
) -> BTreeMap<K, GroupOfu> {
    let mut out: BTreeMap<K, (GroupOfu, f64)> = BTreeMap::new();
    for g in gpus.iter().filter(|g| g.ofu.is_some()) {
        let w = share(g);
        let w = if w.is_finite() { w.max(0.0) } else { 1.0 };
        for (k, o) in key(g) {
            let (e, weight) = out.entry(k).or_default();
            e.ofu += o * w;
            *weight += w;
            e.gpus += 1;
        }
    }
    out.into_iter()
        .map(|(k, (mut e, weight))| {
            e.ofu = if weight > 0.0 { e.ofu / weight } else { 0.0 };
            (k, e)
        })
        .collect()
}

/// The job groups of a GPU with its OFU there: its one job with the whole
/// OFU, or each job sharing it with its apportioned part (OFU × share).
pub(crate) fn job_parts(g: &GpuLive) -> Vec<(String, f64)> {
    let Some(ofu) = g.ofu else {
        return Vec::new();
    };
    match &g.job {
        Some(j) => vec![(j.job_id.clone(), ofu)],
        None => g
            .shares
            .iter()
            .filter(|j| !j.job_id.is_empty())
            .map(|j| {
                (
                    j.job_id.clone(),
                    ofu * f64::from(j.share_ppm.min(1_000_000)) / 1e6,
                )
            })
            .collect(),
    }
}

/// `*to = from`, allocating only when it changes.
fn set(to: &mut String, from: &str) {
    if to != from {
        from.clone_into(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_proto::model::Point;

    static NO_SHARES: std::sync::LazyLock<HashMap<String, Vec<JobAssignment>>> =
        std::sync::LazyLock::new(HashMap::new);

    fn view<'a>(
        jobs: &'a HashMap<String, JobAssignment>,
        ofu: &'a HashMap<String, BatchOfu>,
        series: &'a [SeriesBatch],
        intervals: &'a [SamplingInterval],
    ) -> BatchView<'a> {
        BatchView {
            tenant: "t",
            agent_id: "n1",
            node_id: "n1",
            hostname: "host1",
            gpus: vec![("GPU-a", 0, "H100"), ("GPU-b", 1, "H100")],
            devices: &[],
            jobs,
            shared: &NO_SHARES,
            ofu,
            series,
            intervals,
            pending: (100, 1),
            sent_at_ms: 0,
        }
    }

    #[test]
    fn a_batch_s_gpus_are_told_by_the_batch_alone_with_the_kept_series_newest_points() {
        let mut jobs = HashMap::new();
        for (g, job) in [("GPU-a", "train"), ("GPU-b", "")] {
            jobs.insert(
                g.to_string(),
                JobAssignment {
                    gpu_uuid: g.into(),
                    job_id: job.into(),
                    ..Default::default()
                },
            );
        }
        let ofu = HashMap::from([(
            "GPU-a".to_string(),
            BatchOfu {
                ofu: 0.4,
                tensor_active: 0.5,
                sm_clock_mhz: 1600.0,
                ts_ms: 1_000,
            },
        )]);
        let point = |ts_ms: i64, value: f64| Point {
            ts_ms,
            value,
            peak: None,
            window_ms: Some(100),
        };
        let series = vec![
            SeriesBatch {
                gpu_uuid: "GPU-a".into(),
                metric: "tensor_active".into(),
                points: vec![point(900, 0.3), point(1_000, 0.5)],
            },
            SeriesBatch {
                gpu_uuid: "GPU-a".into(),
                metric: "power_w".into(),
                points: vec![point(1_000, 300.0)],
            },
            SeriesBatch {
                gpu_uuid: "GPU-b".into(),
                metric: "power_w".into(),
                points: vec![point(950, 200.0)],
            },
            // A GPU the node does not have: not told.
            SeriesBatch {
                gpu_uuid: "GPU-z".into(),
                metric: "tensor_active".into(),
                points: vec![point(1_000, 0.9)],
            },
        ];
        let v = view(&jobs, &ofu, &series, &[]);
        let gpus = batch_gpus(&v, 5_000, |m| m == "tensor_active");
        assert_eq!(
            gpus.iter().map(|g| (g.uuid, g.index)).collect::<Vec<_>>(),
            [("GPU-a", 0), ("GPU-b", 1)]
        );
        let (a, b) = (&gpus[0], &gpus[1]);
        assert_eq!(a.job.map(|j| j.job_id.as_str()), Some("train"));
        assert_eq!((a.hostname, a.node_id, a.tenant), ("host1", "n1", "t"));
        assert_eq!(a.ofu.map(|o| o.ofu), Some(0.4));
        // Only the kept metric, at its newest point, current as its
        // window says; the OFU as current as its tensor input.
        assert_eq!(a.counters.len(), 1);
        let ((ts, value), fresh) = a.counter("tensor_active").unwrap();
        assert_eq!((ts, value), (1_000, 0.5));
        assert_eq!(fresh, freshness(&series[0], None, 0, 5_000));
        assert_eq!(a.ofu_fresh, fresh);
        assert!(a.counter("power_w").is_none());
        // A job without an id is no job; no OFU, nothing kept.
        assert!(b.job.is_none() && b.ofu.is_none() && b.counters.is_empty());
        assert_eq!(b.ofu_fresh, Freshness::default());
    }

    #[test]
    fn records_ofu_counters_intervals_and_goes_stale() {
        let live = Live::default();
        let mut jobs = HashMap::new();
        jobs.insert(
            "GPU-a".to_string(),
            JobAssignment {
                gpu_uuid: "GPU-a".into(),
                job_id: "train".into(),
                ..Default::default()
            },
        );
        let mut ofu = HashMap::new();
        for (g, o) in [("GPU-a", 0.4), ("GPU-b", 0.2)] {
            ofu.insert(
                g.to_string(),
                BatchOfu {
                    ofu: o,
                    tensor_active: o,
                    sm_clock_mhz: 1830.0,
                    ts_ms: 1_000,
                },
            );
        }
        let tensor = |gpu: &str, v: f64| SeriesBatch {
            gpu_uuid: gpu.into(),
            metric: "tensor_active".into(),
            points: vec![Point {
                ts_ms: 1_000,
                value: v,
                peak: None,
                window_ms: Some(100),
            }],
        };
        let series = vec![
            tensor("GPU-a", 0.4),
            tensor("GPU-b", 0.2),
            SeriesBatch {
                gpu_uuid: "GPU-b".into(),
                metric: "power_w".into(),
                points: vec![
                    Point {
                        ts_ms: 900,
                        value: 300.0,
                        peak: None,
                        window_ms: None,
                    },
                    Point {
                        ts_ms: 1_000,
                        value: 310.0,
                        peak: None,
                        window_ms: None,
                    },
                ],
            },
        ];
        let intervals = vec![SamplingInterval {
            gpu_uuid: "GPU-b".into(),
            metric: "power_w".into(),
            interval_ms: 800,
        }];
        live.record(&view(&jobs, &ofu, &series, &intervals), 10_000);
        let g = live.gpus(10_000);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].job.as_ref().map(|j| j.job_id.as_str()), Some("train"));
        assert_eq!(g[1].job, None);
        assert_eq!(g[1].counters["power_w"], (1_000, 310.0));
        assert_eq!(g[1].counters["tensor_active"], (1_000, 0.2));
        assert_eq!(g[1].intervals["power_w"], 800);
        let nodes = group_ofu(
            &g,
            |g| vec![(g.node_id.clone(), g.ofu.unwrap_or(0.0))],
            |_| 1.0,
        );
        assert!((nodes["n1"].ofu - 0.3).abs() < 1e-12);
        assert_eq!(nodes["n1"].gpus, 2);
        let jobs = group_ofu(&g, job_parts, |_| 1.0);
        assert_eq!(jobs.len(), 1);
        assert!((jobs["train"].ofu - 0.4).abs() < 1e-12);
        assert_eq!(live.agents(10_000)[0].pending_bytes, 100);
        assert!(live.devices(10_000).is_empty());
        // Tensor activity every 100 ms: OFU is current for 3 windows and
        // 10 s; power, reported every 800 ms, for 12.4 s.
        let g = live.gpus(10_000 + 10_300);
        assert_eq!(g.len(), 2);
        assert!(g.iter().all(|g| g.ofu.is_some()));
        let g = live.gpus(10_000 + 10_301);
        assert_eq!(g.len(), 2, "{g:?}");
        assert_eq!((g[0].uuid.as_str(), g[0].ofu), ("GPU-a", None));
        assert!(g[0].counters.is_empty(), "GPU-a has nothing current");
        assert_eq!((g[1].uuid.as_str(), g[1].ofu), ("GPU-b", None));
        assert_eq!(g[1].counters.keys().collect::<Vec<_>>(), ["power_w"]);
        assert!(group_ofu(
            &g,
            |g| vec![(g.node_id.clone(), g.ofu.unwrap_or(0.0))],
            |_| 1.0
        )
        .is_empty());
        // Nothing current: listed without values until STALE_MS.
        let g = live.gpus(10_000 + 12_401);
        assert_eq!(g.len(), 2);
        assert!(g.iter().all(|g| g.ofu.is_none() && g.counters.is_empty()));
        assert!(live.gpus(10_000 + STALE_MS + 1).is_empty());
        assert_eq!(live.agents(10_000 + 12_401).len(), 1);
        assert!(live.agents(10_000 + STALE_MS + 1).is_empty());
    }

    #[test]
    fn devices_keep_their_counters_apart_from_gpus() {
        let live = Live::default();
        let (jobs, ofu) = (HashMap::new(), HashMap::new());
        let devices = vec![DeviceInfo {
            id: "ib:mlx5_0:1@n1".into(),
            kind: "ib_port".into(),
            name: "mlx5_0:1".into(),
        }];
        let series = vec![SeriesBatch {
            gpu_uuid: "ib:mlx5_0:1@n1".into(),
            metric: "ib_rx_bytes_s".into(),
            points: vec![Point {
                ts_ms: 900,
                value: 4.2e10,
                peak: None,
                window_ms: Some(100),
            }],
        }];
        let mut v = view(&jobs, &ofu, &series, &[]);
        v.devices = &devices;
        live.record(&v, 10_000);
        let d = live.devices(10_000);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].kind, "ib_port");
        assert_eq!(d[0].hostname, "host1");
        assert_eq!(d[0].counters["ib_rx_bytes_s"], (900, 4.2e10));
        assert!(live.gpus(10_000).iter().all(|g| g.counters.is_empty()));
        assert_eq!(live.device_tenants("ib:mlx5_0:1@n1"), vec!["t".to_string()]);
        // One 100 ms window: current for 10.3 s.
        assert_eq!(live.devices(10_000 + 10_300).len(), 1);
        assert!(live.devices(10_000 + 10_301).is_empty());
        assert_eq!(live.device_tenants("ib:mlx5_0:1@n1").len(), 1);
    }
}
