//! flopwatch's data model over an [`Engine`].

use super::keys::{self, get_str, put_str};
use super::{Cf, Engine, Put, StoreError};
use crate::codec::Block;
use crate::events::EventRecord;
use flopwatch_proto::model::{Point, SeriesBatch};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::sync::Arc;

const META_AGENT: u8 = b'a';
const META_NODE: u8 = b'n';
const META_GPU: u8 = b'g';
const META_JOB: u8 = b'j';
const META_EVENT: u8 = b'e';

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
    /// Current job.
    pub job_id: Option<String>,
    /// Last seen, unix ms.
    pub last_seen_ms: i64,
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
    /// Node records to upsert.
    pub nodes: Vec<NodeRecord>,
    /// GPU records to upsert.
    pub gpus: Vec<GpuRecord>,
    /// Job records to upsert.
    pub jobs: Vec<JobRecord>,
    /// Events (derived and reported) to record.
    pub events: Vec<EventRecord>,
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

/// flopwatch's store over any engine.
#[derive(Clone)]
pub struct Store {
    engine: Arc<dyn Engine>,
    sync: bool,
}

fn corrupt(cf: Cf, message: impl ToString) -> StoreError {
    StoreError::Corrupt {
        cf: cf.name(),
        message: message.to_string(),
    }
}

/// `e` · tenant · ts · kind · job · gpu: time-ordered within a tenant.
fn event_key(tenant: &str, e: &EventRecord) -> Vec<u8> {
    let mut k = keys::meta_key(META_EVENT, &[tenant]);
    keys::put_ts(&mut k, e.ts_ms);
    for p in [&e.kind, &e.job_id, &e.gpu_uuid] {
        keys::put_str(&mut k, p);
    }
    k
}

fn json<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing plain structs of strings and numbers cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn from_json<T: DeserializeOwned>(b: &[u8]) -> Result<T, StoreError> {
    serde_json::from_slice(b).map_err(|e| corrupt(Cf::Meta, e))
}

impl Store {
    /// A store over `engine`; `sync` fsyncs every commit.
    pub fn new(engine: Arc<dyn Engine>, sync: bool) -> Self {
        Self { engine, sync }
    }

    /// The engine (for flush and size).
    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    /// Writes one batch atomically and durably.
    pub fn commit(&self, tenant: &str, set: &CommitSet) -> Result<(), StoreError> {
        let mut puts: Vec<Put> = Vec::with_capacity(set.series.len() + set.ofu.len() + 4);
        for s in &set.series {
            if s.points.is_empty() {
                continue;
            }
            let has_peaks = s.points.iter().any(|p| p.peak.is_some());
            let has_windows = s.points.iter().any(|p| p.window_ms.is_some());
            let mut cols = vec![s.points.iter().map(|p| p.value).collect::<Vec<_>>()];
            if has_peaks {
                cols.push(s.points.iter().map(|p| p.peak.unwrap_or(p.value)).collect());
            }
            let block = Block {
                ts: s.points.iter().map(|p| p.ts_ms).collect(),
                cols,
                windows: if has_windows {
                    s.points.iter().map(|p| p.window_ms.unwrap_or(0)).collect()
                } else {
                    Vec::new()
                },
            };
            let last = s.points.iter().map(|p| p.ts_ms).max().unwrap_or(0);
            let prefix = keys::raw_prefix(tenant, &s.gpu_uuid, &s.metric);
            let value = block.encode().map_err(|e| corrupt(Cf::Raw, e))?;
            puts.push((Cf::Raw, keys::block_key(&prefix, last, set.seq), value));
        }
        for (gpu, job, samples) in &set.ofu {
            if samples.is_empty() {
                continue;
            }
            let block = Block {
                ts: samples.iter().map(|s| s.ts_ms).collect(),
                cols: vec![
                    samples.iter().map(|s| s.ofu).collect(),
                    samples.iter().map(|s| s.tensor_active).collect(),
                    samples.iter().map(|s| s.sm_clock_mhz).collect(),
                ],
                windows: samples.iter().map(|s| s.window_ms).collect(),
            };
            let mut value = Vec::new();
            put_str(&mut value, job.as_deref().unwrap_or(""));
            value.extend(block.encode().map_err(|e| corrupt(Cf::Ofu, e))?);
            let last = samples.iter().map(|s| s.ts_ms).max().unwrap_or(0);
            puts.push((
                Cf::Ofu,
                keys::block_key(&keys::ofu_prefix(tenant, gpu), last, set.seq),
                value,
            ));
        }
        for n in &set.nodes {
            puts.push((
                Cf::Meta,
                keys::meta_key(META_NODE, &[tenant, &n.node_id]),
                json(n),
            ));
        }
        for g in &set.gpus {
            puts.push((
                Cf::Meta,
                keys::meta_key(META_GPU, &[tenant, &g.uuid]),
                json(g),
            ));
        }
        for j in &set.jobs {
            puts.push((
                Cf::Meta,
                keys::meta_key(META_JOB, &[tenant, &j.job_id, &j.gpu_uuid]),
                json(j),
            ));
        }
        for e in &set.events {
            puts.push((Cf::Meta, event_key(tenant, e), json(e)));
        }
        if let Some(a) = &set.agent {
            puts.push((
                Cf::Meta,
                keys::meta_key(META_AGENT, &[&a.tenant, &a.agent_id, &a.boot_id]),
                set.seq.to_be_bytes().to_vec(),
            ));
        }
        if puts.is_empty() {
            return Ok(());
        }
        self.engine.write(puts, self.sync)
    }

    /// Highest durable sequence number of an agent (0: none).
    pub fn acked_seq(&self, a: &AgentKey) -> Result<u64, StoreError> {
        let k = keys::meta_key(META_AGENT, &[&a.tenant, &a.agent_id, &a.boot_id]);
        match self.engine.get(Cf::Meta, &k)? {
            None => Ok(0),
            Some(v) => {
                let b: [u8; 8] = v
                    .as_slice()
                    .try_into()
                    .map_err(|_| corrupt(Cf::Meta, "acked seq"))?;
                Ok(u64::from_be_bytes(b))
            }
        }
    }

    /// Visits blocks of `prefix` overlapping `[start, end)`.
    fn blocks(
        &self,
        cf: Cf,
        prefix: &[u8],
        start: i64,
        f: &mut dyn FnMut(&[u8]) -> Result<bool, StoreError>,
    ) -> Result<(), StoreError> {
        let (from, to) = keys::scan_bounds(prefix, start);
        let mut failure = None;
        self.engine.scan(cf, &from, &to, &mut |_, v| match f(v) {
            Ok(more) => more,
            Err(e) => {
                failure = Some(e);
                false
            }
        })?;
        failure.map_or(Ok(()), Err)
    }

    /// Raw samples of one series in `[start, end)`, at most `limit`.
    pub fn series(
        &self,
        tenant: &str,
        gpu: &str,
        metric: &str,
        start: i64,
        end: i64,
        limit: usize,
    ) -> Result<Vec<Point>, StoreError> {
        let mut out = Vec::new();
        let prefix = keys::raw_prefix(tenant, gpu, metric);
        self.blocks(Cf::Raw, &prefix, start, &mut |v| {
            let b = Block::decode(v).map_err(|e| corrupt(Cf::Raw, e))?;
            if b.ts.first().is_some_and(|&t| t >= end) {
                return Ok(false);
            }
            let values = b
                .cols
                .first()
                .ok_or_else(|| corrupt(Cf::Raw, "no value column"))?;
            for i in 0..b.len() {
                if b.ts[i] >= start && b.ts[i] < end && out.len() < limit {
                    out.push(Point {
                        ts_ms: b.ts[i],
                        value: values[i],
                        peak: b.cols.get(1).map(|c| c[i]),
                        window_ms: b.windows.get(i).copied(),
                    });
                }
            }
            Ok(out.len() < limit)
        })?;
        out.sort_by_key(|p| p.ts_ms);
        Ok(out)
    }

    /// OFU samples of one GPU in `[start, end)`, only those recorded while
    /// `job` ran on it when `job` is given.
    pub fn ofu(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        f: &mut dyn FnMut(OfuSample),
    ) -> Result<(), StoreError> {
        let prefix = keys::ofu_prefix(tenant, gpu);
        self.blocks(Cf::Ofu, &prefix, start, &mut |v| {
            let mut pos = 0;
            let block_job = get_str(v, &mut pos).ok_or_else(|| corrupt(Cf::Ofu, "job"))?;
            let b = Block::decode(&v[pos..]).map_err(|e| corrupt(Cf::Ofu, e))?;
            if b.ts.first().is_some_and(|&t| t >= end) {
                return Ok(false);
            }
            if job.is_some_and(|j| j != block_job) {
                return Ok(true);
            }
            if b.cols.len() != 3 || b.windows.len() != b.len() {
                return Err(corrupt(Cf::Ofu, "shape"));
            }
            for i in 0..b.len() {
                if b.ts[i] >= start && b.ts[i] < end {
                    f(OfuSample {
                        ts_ms: b.ts[i],
                        ofu: b.cols[0][i],
                        tensor_active: b.cols[1][i],
                        sm_clock_mhz: b.cols[2][i],
                        window_ms: b.windows[i],
                    });
                }
            }
            Ok(true)
        })
    }

    fn meta_list<T: DeserializeOwned>(
        &self,
        kind: u8,
        tenant: Option<&str>,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let parts: Vec<&str> = tenant.into_iter().collect();
        let (from, to) = keys::meta_range(kind, &parts);
        let mut raw = Vec::new();
        self.engine.scan(Cf::Meta, &from, &to, &mut |k, v| {
            raw.push((k.to_vec(), v.to_vec()));
            true
        })?;
        raw.into_iter()
            .map(|(k, v)| {
                let mut pos = 1;
                let t = get_str(&k, &mut pos).ok_or_else(|| corrupt(Cf::Meta, "key"))?;
                Ok((t.to_string(), from_json(&v)?))
            })
            .collect()
    }

    /// Nodes of `tenant` (every tenant when `None`), with their tenant.
    pub fn nodes(&self, tenant: Option<&str>) -> Result<Vec<(String, NodeRecord)>, StoreError> {
        self.meta_list(META_NODE, tenant)
    }

    /// GPUs of `tenant` (every tenant when `None`).
    pub fn gpus(&self, tenant: Option<&str>) -> Result<Vec<(String, GpuRecord)>, StoreError> {
        self.meta_list(META_GPU, tenant)
    }

    /// Job-on-GPU records of `tenant` (every tenant when `None`).
    pub fn jobs(&self, tenant: Option<&str>) -> Result<Vec<(String, JobRecord)>, StoreError> {
        self.meta_list(META_JOB, tenant)
    }

    /// Events of `tenant` with `start_ms <= ts < end_ms`, oldest first, at
    /// most `limit`.
    pub fn events(
        &self,
        tenant: &str,
        start_ms: i64,
        end_ms: i64,
        limit: usize,
    ) -> Result<Vec<EventRecord>, StoreError> {
        let base = keys::meta_key(META_EVENT, &[tenant]);
        let (mut from, mut to) = (base.clone(), base);
        keys::put_ts(&mut from, start_ms);
        keys::put_ts(&mut to, end_ms);
        let mut raw = Vec::new();
        self.engine.scan(Cf::Meta, &from, &to, &mut |_, v| {
            raw.push(v.to_vec());
            raw.len() < limit
        })?;
        raw.iter().map(|v| from_json(v)).collect()
    }

    /// One GPU's record.
    pub fn gpu(&self, tenant: &str, uuid: &str) -> Result<Option<GpuRecord>, StoreError> {
        match self
            .engine
            .get(Cf::Meta, &keys::meta_key(META_GPU, &[tenant, uuid]))?
        {
            Some(v) => Ok(Some(from_json(&v)?)),
            None => Ok(None),
        }
    }
}
