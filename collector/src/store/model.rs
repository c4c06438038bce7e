//! flopwatch's data model over an [`Engine`].

use super::keys::{self, get_str, put_str};
use super::{Cf, Engine, Put, StoreError, View};
use crate::codec::Block;
use crate::events::EventRecord;
use crate::ofu::Mean;
use flopwatch_proto::clock::Clock;
use flopwatch_proto::metrics as m;
use flopwatch_proto::model::{GpuInfo, Point, SeriesBatch};
use serde::{de::DeserializeOwned, Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::Arc;

const META_AGENT: u8 = b'a';
const META_NODE: u8 = b'n';
const META_GPU: u8 = b'g';
const META_JOB: u8 = b'j';
pub(super) const META_EVENT: u8 = b'e';

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
    /// Current job.
    pub job_id: Option<String>,
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
            mig_parent_uuid: g.mig_parent_uuid.clone(),
            job_id,
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
            mig_parent_uuid: self.mig_parent_uuid.clone(),
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
    /// Commit into limbo, entered at this time (unix ms): the batch may be
    /// stored on another collector too (see [`super::limbo`]).
    pub limbo: Option<i64>,
    /// The number is consumed without data (a refused batch): it raises
    /// the acked number but is not held.
    pub no_data: bool,
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

/// Width of a chunk: blocks never straddle an aligned hour, and each
/// series' blocks of one hour are compacted into one chunk.
pub const WINDOW_MS: i64 = 3_600_000;
/// Width of a minute rollup bucket.
pub const MINUTE_MS: i64 = 60_000;

/// Start of the hour holding `ts`.
pub fn window_of(ts: i64) -> i64 {
    ts.div_euclid(WINDOW_MS) * WINDOW_MS
}

/// How long each tenant's data is kept, against an injected clock.
#[derive(Clone)]
pub struct Retention {
    /// Retention of tenants without their own, ms.
    pub default_ms: i64,
    /// Per-tenant retention, ms.
    pub tenants: HashMap<String, i64>,
    /// Now.
    pub clock: Arc<dyn Clock>,
}

impl Retention {
    /// From `retention` and `tenant_retention` of the config file.
    pub fn from_config(c: &flopwatch_config::CollectorConfig, clock: Arc<dyn Clock>) -> Self {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self {
            default_ms: ms(c.retention),
            tenants: c
                .tenant_retention
                .iter()
                .map(|(t, r)| (t.clone(), ms(r.retention)))
                .collect(),
            clock,
        }
    }

    /// The oldest timestamp of `tenant` still kept.
    pub fn cutoff(&self, tenant: &str) -> i64 {
        let keep = self.tenants.get(tenant).copied().unwrap_or(self.default_ms);
        self.clock.now_ms().saturating_sub(keep)
    }
}

/// Bytes of one aggregate in a rollup record: the sample count (u64), then
/// weight, weighted sums of OFU (the value, for a raw series), tensor
/// activity and SM clock, min and max (f64), all little-endian — the
/// order of [`Mean::parts`].
const AGG_BYTES: usize = 56;

fn encode_agg(m: &Mean, out: &mut Vec<u8>) {
    let (count, parts) = m.parts();
    out.extend_from_slice(&count.to_le_bytes());
    for f in parts {
        out.extend_from_slice(&f.to_le_bytes());
    }
}

fn decode_agg(b: &[u8]) -> Option<Mean> {
    let b = b.get(..AGG_BYTES)?;
    let u = |i: usize| -> Option<[u8; 8]> { b.get(i * 8..i * 8 + 8)?.try_into().ok() };
    let mut parts = [0.0; 6];
    for (i, f) in parts.iter_mut().enumerate() {
        *f = f64::from_le_bytes(u(i + 1)?);
    }
    Some(Mean::from_parts(u64::from_le_bytes(u(0)?), parts))
}

/// A rollup record: the hour, then the minutes that have samples.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Rollup {
    pub hour: Mean,
    /// Minute index (0..60) and its aggregate.
    pub minutes: Vec<(u8, Mean)>,
}

impl Rollup {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + AGG_BYTES * (1 + self.minutes.len()));
        let mask = self.minutes.iter().fold(0u64, |m, (i, _)| m | (1u64 << i));
        out.extend_from_slice(&mask.to_le_bytes());
        encode_agg(&self.hour, &mut out);
        for (_, a) in &self.minutes {
            encode_agg(a, &mut out);
        }
        out
    }

    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let mask = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        if mask >> 60 != 0 {
            return None;
        }
        let hour = decode_agg(b.get(8..)?)?;
        let mut minutes = Vec::new();
        let mut pos = 8 + AGG_BYTES;
        for i in 0..60u8 {
            if mask & (1 << i) != 0 {
                minutes.push((i, decode_agg(b.get(pos..)?)?));
                pos += AGG_BYTES;
            }
        }
        (pos == b.len()).then_some(Self { hour, minutes })
    }
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
    },
}

/// flopwatch's store over any engine.
#[derive(Clone)]
pub struct Store {
    pub(super) engine: Arc<dyn Engine>,
    pub(super) sync: bool,
    pub(super) retention: Option<Retention>,
    /// Compaction interval and seal delay.
    pub(super) schedule: (std::time::Duration, std::time::Duration),
    /// What compaction rounds (nothing by default).
    pub(super) precision: Arc<super::Precision>,
    /// Serialises changes to one agent's held ranges.
    pub(super) stripes: Arc<super::membership::Stripes>,
}

pub(super) fn corrupt(cf: Cf, message: impl ToString) -> StoreError {
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

/// Splits `0..n` into runs whose timestamps fall in one hour.
fn hour_runs(n: usize, ts: impl Fn(usize) -> i64) -> Vec<std::ops::Range<usize>> {
    let mut runs = Vec::new();
    let mut from = 0;
    for i in 1..=n {
        if i == n || window_of(ts(i)) != window_of(ts(from)) {
            runs.push(from..i);
            from = i;
        }
    }
    runs
}

/// A raw series block of points.
pub(super) fn raw_block(points: &[Point]) -> Block {
    let has_peaks = points.iter().any(|p| p.peak.is_some());
    let has_windows = points.iter().any(|p| p.window_ms.is_some());
    let mut cols = vec![points.iter().map(|p| p.value).collect::<Vec<_>>()];
    if has_peaks {
        cols.push(points.iter().map(|p| p.peak.unwrap_or(p.value)).collect());
    }
    Block {
        ts: points.iter().map(|p| p.ts_ms).collect(),
        cols,
        windows: if has_windows {
            points.iter().map(|p| p.window_ms.unwrap_or(0)).collect()
        } else {
            Vec::new()
        },
    }
}

/// Points of a raw block.
pub(super) fn raw_points(b: &Block) -> Result<Vec<Point>, StoreError> {
    let values = b
        .cols
        .first()
        .ok_or_else(|| corrupt(Cf::Raw, "no value column"))?;
    if b.cols.iter().any(|c| c.len() != b.len()) {
        return Err(corrupt(Cf::Raw, "shape"));
    }
    Ok((0..b.len())
        .map(|i| Point {
            ts_ms: b.ts[i],
            value: values[i],
            peak: b.cols.get(1).map(|c| c[i]),
            window_ms: b.windows.get(i).copied(),
        })
        .collect())
}

/// The raw series whose sealed chunk of an hour the GPU's other raw
/// chunks of that hour may take their timestamps and windows from, when
/// theirs are the same (a read group: tensor activity and the SM clocks
/// are read at the same instants). Written by compaction, which keeps the
/// two consistent: a rewrite of the reference chunk re-encodes the chunks
/// that share it in the same write.
pub(super) const TIME_REF: &str = m::TENSOR_ACTIVE;

/// The raw prefix (tenant · gpu · [`TIME_REF`]) of the series whose
/// timestamps the raw series `prefix` (tenant · gpu · metric) may share;
/// `None` for the reference series itself or a malformed prefix.
pub(super) fn time_ref_prefix(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut pos = 0;
    get_str(prefix, &mut pos)?;
    get_str(prefix, &mut pos)?;
    let gpu_end = pos;
    let metric = get_str(prefix, &mut pos)?;
    if metric == TIME_REF || pos != prefix.len() {
        return None;
    }
    let mut p = prefix[..gpu_end].to_vec();
    put_str(&mut p, TIME_REF);
    Some(p)
}

/// Timestamps and windows of one chunk.
pub(super) type Times = (Vec<i64>, Vec<u32>);

/// The timestamps and windows of the sealed raw chunk of the series
/// `prefix` in the hour starting at `w`, if there is one.
pub(super) fn chunk_times(
    view: &dyn View,
    prefix: &[u8],
    w: i64,
) -> Result<Option<Times>, StoreError> {
    let mut out = None;
    scan_series(view, Cf::Raw, prefix, w, w + WINDOW_MS, &mut |hour, v| {
        if hour == w {
            out = Some(Block::decode_time(v).map_err(|e| corrupt(Cf::Raw, e))?);
            return Ok(false);
        }
        Ok(true)
    })?;
    Ok(out)
}

/// Decodes the raw blocks of one series read through one view: a chunk
/// that shares its timestamps gets them from the GPU's [`TIME_REF`]
/// chunk of the same hour (the last hour's kept).
pub(super) struct RawReader<'a> {
    view: &'a dyn View,
    time_ref: Option<Vec<u8>>,
    cached: Option<(i64, Times)>,
}

impl<'a> RawReader<'a> {
    /// A reader for the raw series `prefix` (tenant · gpu · metric).
    pub(super) fn new(view: &'a dyn View, prefix: &[u8]) -> Self {
        Self {
            view,
            time_ref: time_ref_prefix(prefix),
            cached: None,
        }
    }

    /// The block `v`, read from `cf`, of the hour starting at `w`.
    pub(super) fn decode(&mut self, cf: Cf, w: i64, v: &[u8]) -> Result<Block, StoreError> {
        if !Block::shares_time(v) {
            return Block::decode(v).map_err(|e| corrupt(cf, e));
        }
        let Some(rp) = &self.time_ref else {
            return Err(corrupt(cf, "shared timestamps without a reference series"));
        };
        if self.cached.as_ref().map(|(h, _)| *h) != Some(w) {
            let t = chunk_times(self.view, rp, w)?
                .ok_or_else(|| corrupt(cf, "the chunk whose timestamps it shares is missing"))?;
            self.cached = Some((w, t));
        }
        let (_, (ts, windows)) = self.cached.as_ref().expect("just set");
        Block::decode_shared(v, ts, windows).map_err(|e| corrupt(cf, e))
    }
}

/// Marks an OFU chunk whose OFU column is not stored but recomputed from
/// tensor activity and SM clock with the tensor clock that follows it
/// (block versions are 1 and 2, so the byte is unambiguous).
const DERIVED_OFU: u8 = 0xd0;

/// The tensor clock `f` with which every sample's OFU is exactly
/// `ofu(tensor_active, sm_clock_mhz, f)` (bit for bit), if there is one.
pub(super) fn derivation_clock(samples: &[OfuSample]) -> Option<f64> {
    let exact = |f: f64| {
        samples.iter().all(|s| {
            crate::ofu::ofu(s.tensor_active, s.sm_clock_mhz, f).to_bits() == s.ofu.to_bits()
        })
    };
    let mut candidates = Vec::new();
    let usable = |s: &&OfuSample| s.ofu > 0.0 && s.tensor_active > 0.0 && s.tensor_active <= 1.0;
    // A sample whose clock was below the tensor clock (OFU < TPA) pins it.
    if let Some(s) = samples
        .iter()
        .filter(usable)
        .find(|s| s.tensor_active - s.ofu > 1e-9)
    {
        let f = s.tensor_active * s.sm_clock_mhz / s.ofu;
        candidates.extend([
            f.round(),
            (f * 2.0).round() / 2.0,
            (f * 10.0).round() / 10.0,
        ]);
    } else if samples.iter().any(|s| usable(&s)) {
        // Every clock at or above the tensor clock: try the smallest.
        let min = samples
            .iter()
            .map(|s| s.sm_clock_mhz)
            .fold(f64::INFINITY, f64::min);
        candidates.extend([min.floor(), min]);
    } else {
        candidates.push(1.0);
    }
    candidates
        .into_iter()
        .filter(|f| f.is_finite() && *f > 0.0)
        .find(|&f| exact(f))
}

/// Marks an OFU chunk that stores neither OFU nor tensor activity nor SM
/// clock: OFU is recomputed with the tensor clock that follows, the other
/// two are read from the GPU's raw series of the same hour (their values at
/// the chunk's timestamps, checked bit for bit at compaction). The clock
/// series is [`CLOCKS`]`[i]` for the index byte after the tensor clock.
const REF_OFU: u8 = 0xd1;

/// Raw series an OFU sample's SM clock comes from (ingest prefers the
/// window average).
pub(super) const CLOCKS: [&str; 2] = [m::SM_CLOCK_AVG_MHZ, m::SM_CLOCK_MHZ];

/// One raw series' values in one hour by timestamp, as bits; `None` where
/// a timestamp repeats with different values.
pub(super) type HourMap = HashMap<i64, Option<u64>>;

/// The raw series `metric` of the GPU whose OFU prefix is `ofu_prefix`, in
/// the hour starting at `w`: chunks and head.
pub(super) fn raw_hour(
    view: &dyn View,
    ofu_prefix: &[u8],
    metric: &str,
    w: i64,
) -> Result<HourMap, StoreError> {
    let mut raw = ofu_prefix.to_vec();
    put_str(&mut raw, metric);
    let head = keys::kind_prefix(keys::KIND_RAW, &raw);
    let mut map = HourMap::new();
    let mut reader = RawReader::new(view, &raw);
    for (cf, p) in [(Cf::Raw, &raw), (Cf::Head, &head)] {
        scan_series(view, cf, p, w, w + WINDOW_MS, &mut |hour, v| {
            let b = reader.decode(cf, hour, v)?;
            for pt in raw_points(&b)? {
                let bits = pt.value.to_bits();
                map.entry(pt.ts_ms)
                    .and_modify(|e| {
                        if *e != Some(bits) {
                            *e = None
                        }
                    })
                    .or_insert(Some(bits));
            }
            Ok(true)
        })?;
    }
    Ok(map)
}

/// Which of [`CLOCKS`] (if any) holds, with tensor activity, exactly the
/// values of every sample.
pub(super) fn ref_clock(samples: &[OfuSample], tpa: &HourMap, clocks: &[HourMap]) -> Option<u8> {
    let has = |m: &HourMap, ts: i64, v: f64| m.get(&ts) == Some(&Some(v.to_bits()));
    if !samples.iter().all(|s| has(tpa, s.ts_ms, s.tensor_active)) {
        return None;
    }
    (0..clocks.len())
        .find(|&i| {
            samples
                .iter()
                .all(|s| has(&clocks[i], s.ts_ms, s.sm_clock_mhz))
        })
        .map(|i| i as u8)
}

/// An OFU block value: job id, then the block. A sealed chunk drops the
/// OFU column when it can be recomputed exactly ([`DERIVED_OFU`]), and the
/// tensor activity and clock columns too when `refs` names the raw clock
/// series that holds them ([`REF_OFU`]).
/// A sealed chunk whose timestamps and windows are exactly `shared` (the
/// GPU's [`TIME_REF`] chunk's of the hour) leaves them out.
pub(super) fn ofu_value(
    job: &str,
    samples: &[OfuSample],
    compact: bool,
    refs: Option<u8>,
    shared: Option<&Times>,
) -> Result<Vec<u8>, StoreError> {
    let derived = if compact {
        derivation_clock(samples)
    } else {
        None
    };
    let refs = refs.filter(|_| derived.is_some());
    let mut cols = Vec::with_capacity(3);
    if derived.is_none() {
        cols.push(samples.iter().map(|s| s.ofu).collect());
    }
    if refs.is_none() {
        cols.push(samples.iter().map(|s| s.tensor_active).collect());
        cols.push(samples.iter().map(|s| s.sm_clock_mhz).collect());
    }
    let block = Block {
        ts: samples.iter().map(|s| s.ts_ms).collect(),
        cols,
        windows: samples.iter().map(|s| s.window_ms).collect(),
    };
    let mut value = Vec::new();
    put_str(&mut value, job);
    if let Some(f) = derived {
        value.push(if refs.is_some() { REF_OFU } else { DERIVED_OFU });
        value.extend_from_slice(&f.to_le_bytes());
    }
    if let Some(i) = refs {
        value.push(i);
    }
    let shares =
        !block.is_empty() && shared.is_some_and(|(ts, w)| *ts == block.ts && *w == block.windows);
    let enc = match (compact, shares) {
        (true, true) => block.encode_compact_shared(),
        (true, false) => block.encode_compact(),
        _ => block.encode(),
    };
    value.extend(enc.map_err(|e| corrupt(Cf::Ofu, e))?);
    Ok(value)
}

/// Where the block of an OFU block value starts (after the job id, the
/// mode byte, the tensor clock and the clock series).
pub(super) fn ofu_block_start(v: &[u8]) -> Option<usize> {
    let mut pos = 0;
    get_str(v, &mut pos)?;
    match v.get(pos).copied() {
        Some(DERIVED_OFU) => pos += 9,
        Some(REF_OFU) => pos += 10,
        _ => {}
    }
    (pos <= v.len()).then_some(pos)
}

/// Job id and samples of an OFU block value; `resolve` gives a raw series
/// of the block's hour when the block refers to them.
pub(super) fn ofu_samples<'v>(
    v: &'v [u8],
    resolve: &mut dyn HourRefs,
) -> Result<(&'v str, Vec<OfuSample>), StoreError> {
    let mut pos = 0;
    let job = get_str(v, &mut pos).ok_or_else(|| corrupt(Cf::Ofu, "job"))?;
    let mode = v.get(pos).copied();
    let derived = if mode == Some(DERIVED_OFU) || mode == Some(REF_OFU) {
        let f: [u8; 8] = v
            .get(pos + 1..pos + 9)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| corrupt(Cf::Ofu, "tensor clock"))?;
        pos += 9;
        Some(f64::from_le_bytes(f))
    } else {
        None
    };
    let refs = if mode == Some(REF_OFU) {
        let i = *v.get(pos).ok_or_else(|| corrupt(Cf::Ofu, "clock series"))?;
        pos += 1;
        let clock = *CLOCKS
            .get(usize::from(i))
            .ok_or_else(|| corrupt(Cf::Ofu, "clock series"))?;
        Some((resolve.raw(m::TENSOR_ACTIVE)?, resolve.raw(clock)?))
    } else {
        None
    };
    let b = if Block::shares_time(&v[pos..]) {
        let t = resolve.times()?;
        Block::decode_shared(&v[pos..], &t.0, &t.1)
    } else {
        Block::decode(&v[pos..])
    }
    .map_err(|e| corrupt(Cf::Ofu, e))?;
    let ncols = usize::from(derived.is_none()) + if refs.is_some() { 0 } else { 2 };
    if b.cols.len() != ncols
        || b.cols.iter().any(|c| c.len() != b.len())
        || b.windows.len() != b.len()
    {
        return Err(corrupt(Cf::Ofu, "shape"));
    }
    let lookup = |map: &HourMap, ts: i64| -> Result<f64, StoreError> {
        match map.get(&ts) {
            Some(Some(bits)) => Ok(f64::from_bits(*bits)),
            _ => Err(corrupt(Cf::Ofu, "referenced raw sample missing")),
        }
    };
    let mut samples = Vec::with_capacity(b.len());
    for i in 0..b.len() {
        let (tpa, clk) = match &refs {
            Some((t, c)) => (lookup(t, b.ts[i])?, lookup(c, b.ts[i])?),
            None => (b.cols[ncols - 2][i], b.cols[ncols - 1][i]),
        };
        samples.push(OfuSample {
            ts_ms: b.ts[i],
            ofu: match derived {
                Some(f) => crate::ofu::ofu(tpa, clk, f),
                None => b.cols[0][i],
            },
            tensor_active: tpa,
            sm_clock_mhz: clk,
            window_ms: b.windows[i],
        });
    }
    Ok((job, samples))
}

/// What [`ofu_samples`] reads besides the block: the GPU's raw series of
/// the block's hour, and its [`TIME_REF`] chunk's timestamps.
pub(super) trait HourRefs {
    /// The raw series `metric` of the hour, by timestamp.
    fn raw(&mut self, metric: &'static str) -> Result<Arc<HourMap>, StoreError>;
    /// The timestamps and windows of the hour's [`TIME_REF`] chunk.
    fn times(&mut self) -> Result<Arc<Times>, StoreError>;
}

/// Raw hours and reference timestamps read for OFU blocks, kept across
/// the blocks of one read.
#[derive(Default)]
pub(super) struct RefCache {
    raw: HashMap<(&'static str, i64), Arc<HourMap>>,
    times: HashMap<i64, Arc<Times>>,
}

/// [`HourRefs`] of the hour starting at `w` of the GPU whose OFU prefix
/// is `ofu_prefix`, over `view`.
pub(super) struct Resolver<'a> {
    view: &'a dyn View,
    ofu_prefix: &'a [u8],
    cache: &'a mut RefCache,
    w: i64,
}

impl HourRefs for Resolver<'_> {
    fn raw(&mut self, metric: &'static str) -> Result<Arc<HourMap>, StoreError> {
        if let Some(m) = self.cache.raw.get(&(metric, self.w)) {
            return Ok(m.clone());
        }
        let m = Arc::new(raw_hour(self.view, self.ofu_prefix, metric, self.w)?);
        self.cache.raw.insert((metric, self.w), m.clone());
        Ok(m)
    }

    fn times(&mut self) -> Result<Arc<Times>, StoreError> {
        if let Some(t) = self.cache.times.get(&self.w) {
            return Ok(t.clone());
        }
        let mut p = self.ofu_prefix.to_vec();
        put_str(&mut p, TIME_REF);
        let t = chunk_times(self.view, &p, self.w)?
            .ok_or_else(|| corrupt(Cf::Ofu, "the chunk whose timestamps it shares is missing"))?;
        let t = Arc::new(t);
        self.cache.times.insert(self.w, t.clone());
        Ok(t)
    }
}

/// A resolver for [`ofu_samples`] over `view`, caching each raw hour.
pub(super) fn resolver<'a>(
    view: &'a dyn View,
    ofu_prefix: &'a [u8],
    cache: &'a mut RefCache,
    w: i64,
) -> Resolver<'a> {
    Resolver {
        view,
        ofu_prefix,
        cache,
        w,
    }
}

/// Gets a block's hour and value; returns whether to go on.
pub(super) type BlockVisitor<'a> = dyn FnMut(i64, &[u8]) -> Result<bool, StoreError> + 'a;

/// Visits the blocks of one series in `cf` whose hour overlaps
/// `[start, end)`: keys from `prefix · start` on, stopping at the first
/// block whose hour begins at or after `end` (blocks never straddle an
/// hour, so no later key can hold an earlier sample). `f` gets the
/// block's hour and value and returns whether to go on.
pub(super) fn scan_series(
    view: &dyn View,
    cf: Cf,
    prefix: &[u8],
    start: i64,
    end: i64,
    f: &mut BlockVisitor<'_>,
) -> Result<(), StoreError> {
    let (from, to) = keys::scan_bounds(prefix, start);
    let mut failure = None;
    view.scan(cf, &from, &to, &mut |k, v| {
        let Some(last) = keys::key_ts(k, prefix.len()) else {
            failure = Some(corrupt(cf, "key"));
            return false;
        };
        let w = window_of(last);
        if w >= end {
            return false;
        }
        match f(w, v) {
            Ok(more) => more,
            Err(e) => {
                failure = Some(e);
                false
            }
        }
    })?;
    failure.map_or(Ok(()), Err)
}

impl Store {
    /// A store over `engine`; `sync` fsyncs every commit.
    pub fn new(engine: Arc<dyn Engine>, sync: bool) -> Self {
        Self {
            engine,
            sync,
            retention: None,
            schedule: (
                std::time::Duration::from_secs(60),
                std::time::Duration::from_secs(300),
            ),
            precision: Arc::default(),
            stripes: Arc::default(),
        }
    }

    /// Rounds values at compaction as `precision` says (opt-in lossy
    /// storage; see [`super::Precision`]).
    pub fn with_precision(mut self, precision: super::Precision) -> Self {
        self.precision = Arc::new(precision);
        self
    }

    /// Compacts every `every`, sealing an hour `seal_delay` after it ends
    /// (see [`super::run_compactor`]).
    pub fn with_compaction(
        mut self,
        every: std::time::Duration,
        seal_delay: std::time::Duration,
    ) -> Self {
        self.schedule = (every, seal_delay);
        self
    }

    /// Applies `retention`: reads never return older samples and
    /// [`Store::expire`] deletes them.
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = Some(retention);
        self
    }

    /// The engine (for flush and size).
    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    /// The oldest timestamp of `tenant` kept at `now_ms` (`i64::MIN`
    /// without retention).
    pub fn cutoff(&self, tenant: &str, now_ms: i64) -> i64 {
        match &self.retention {
            Some(r) => {
                let keep = r.tenants.get(tenant).copied().unwrap_or(r.default_ms);
                now_ms.saturating_sub(keep)
            }
            None => i64::MIN,
        }
    }

    /// `start` raised to `tenant`'s retention cutoff.
    fn clamp(&self, tenant: &str, start: i64) -> i64 {
        match &self.retention {
            Some(r) => start.max(r.cutoff(tenant)),
            None => start,
        }
    }

    /// Writes one batch atomically and durably: its samples go to the
    /// head as one block per series and hour.
    pub fn commit(&self, tenant: &str, set: &CommitSet) -> Result<(), StoreError> {
        let mut puts: Vec<Put> = Vec::with_capacity(set.series.len() + set.ofu.len() + 4);
        for s in &set.series {
            let prefix = keys::kind_prefix(
                keys::KIND_RAW,
                &keys::raw_prefix(tenant, &s.gpu_uuid, &s.metric),
            );
            for run in hour_runs(s.points.len(), |i| s.points[i].ts_ms) {
                let points = &s.points[run];
                let value = raw_block(points)
                    .encode()
                    .map_err(|e| corrupt(Cf::Raw, e))?;
                let last = points.iter().map(|p| p.ts_ms).max().unwrap_or(0);
                puts.push((Cf::Head, keys::block_key(&prefix, last, set.seq), value));
            }
        }
        for (gpu, job, samples) in &set.ofu {
            let prefix = keys::kind_prefix(keys::KIND_OFU, &keys::ofu_prefix(tenant, gpu));
            for run in hour_runs(samples.len(), |i| samples[i].ts_ms) {
                let samples = &samples[run];
                let value = ofu_value(job.as_deref().unwrap_or(""), samples, false, None, None)?;
                let last = samples.iter().map(|s| s.ts_ms).max().unwrap_or(0);
                puts.push((Cf::Head, keys::block_key(&prefix, last, set.seq), value));
            }
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
        let Some(a) = &set.agent else {
            if puts.is_empty() {
                return Ok(());
            }
            return self.engine.write(puts, self.sync);
        };
        puts.push((
            Cf::Meta,
            keys::meta_key(META_AGENT, &[&a.tenant, &a.agent_id, &a.boot_id]),
            set.seq.to_be_bytes().to_vec(),
        ));
        // The batch's number joins the held ranges (or its limbo record) in
        // this same write.
        let _stripe = self.stripes.lock(a);
        if let Some(since) = set.limbo {
            let record = self.limbo_puts(a, set.seq, since, &mut puts);
            puts.push(record);
        } else if !set.no_data {
            puts.push(self.held_put(a, set.seq)?);
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

    /// Raw samples of one series in `[start, end)`, the first `limit` in
    /// time order: sealed chunks and head blocks read under one view, so
    /// each sample is seen once even while a compaction runs.
    pub fn series(
        &self,
        tenant: &str,
        gpu: &str,
        metric: &str,
        start: i64,
        end: i64,
        limit: usize,
    ) -> Result<Vec<Point>, StoreError> {
        let start = self.clamp(tenant, start);
        let mut out = Vec::new();
        let prefix = keys::raw_prefix(tenant, gpu, metric);
        let head = keys::kind_prefix(keys::KIND_RAW, &prefix);
        self.engine.view(&mut |view| {
            let mut reader = RawReader::new(view, &prefix);
            for (cf, p) in [(Cf::Raw, &prefix), (Cf::Head, &head), (Cf::Limbo, &head)] {
                let mut taken = 0usize;
                scan_series(view, cf, p, start, end, &mut |hour, v| {
                    let b = reader.decode(cf, hour, v)?;
                    for pt in raw_points(&b)? {
                        if pt.ts_ms >= start && pt.ts_ms < end {
                            out.push(pt);
                            taken += 1;
                        }
                    }
                    Ok(taken < limit)
                })?;
            }
            Ok(())
        })?;
        out.sort_by_key(|p| p.ts_ms);
        out.truncate(limit);
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
        self.ofu_pieces(tenant, gpu, start, end, job, None, &mut |p| {
            if let OfuPiece::Sample(s) = p {
                f(s)
            }
        })
    }

    /// OFU of one GPU in `[start, end)` as samples and, where the caller
    /// allows it, rollup buckets. With `buckets = Some(step)` (and no
    /// `job`), a sealed hour or minute lying wholly inside the range and
    /// inside one step bucket `start + k·step` (any when `step` is 0) comes
    /// as one [`OfuPiece::Agg`] instead of its samples; at steps of 1 h or
    /// more every sealed minute inside the range does (its bucket is the
    /// one it starts in). Hours with samples still in the head come as
    /// samples. Every sample counts exactly once.
    #[allow(clippy::too_many_arguments)]
    pub fn ofu_pieces(
        &self,
        tenant: &str,
        gpu: &str,
        start: i64,
        end: i64,
        job: Option<&str>,
        buckets: Option<i64>,
        f: &mut dyn FnMut(OfuPiece),
    ) -> Result<(), StoreError> {
        let start = self.clamp(tenant, start);
        if start >= end {
            return Ok(());
        }
        let prefix = keys::ofu_prefix(tenant, gpu);
        let head = keys::kind_prefix(keys::KIND_OFU, &prefix);
        let step = buckets.filter(|_| job.is_none());
        let bucket = |ts: i64| match step {
            Some(s) if s > 0 => (ts - start).div_euclid(s),
            _ => 0,
        };
        // At steps of an hour or more a minute counts in the bucket where
        // it starts: a bucket edge that falls inside a minute moves to the
        // minute's start (< 1 min of a ≥ 1 h bucket), so no chunk has to
        // be decoded for an unaligned start. Totals stay exact.
        let coarse = step.is_some_and(|s| s >= WINDOW_MS);
        let usable = |from: i64, len: i64| {
            from >= start
                && from + len <= end
                && (bucket(from) == bucket(from + len - 1) || (coarse && len == MINUTE_MS))
        };
        self.engine.view(&mut |view| {
            // Hours with head blocks are read sample by sample.
            let mut in_head = std::collections::HashSet::new();
            // Covered minutes per hour (all 60 bits: the whole hour).
            let mut covered: HashMap<i64, u64> = HashMap::new();
            if step.is_some() {
                for cf in [Cf::Head, Cf::Limbo] {
                    scan_series(view, cf, &head, start, end, &mut |w, _| {
                        in_head.insert(w);
                        Ok(true)
                    })?;
                }
                let rprefix = keys::kind_prefix(keys::KIND_OFU, &prefix);
                scan_series(
                    view,
                    Cf::Rollup,
                    &rprefix,
                    window_of(start),
                    end,
                    &mut |w, v| {
                        if in_head.contains(&w) {
                            return Ok(true);
                        }
                        let r = Rollup::decode(v).ok_or_else(|| corrupt(Cf::Rollup, "record"))?;
                        if usable(w, WINDOW_MS) {
                            covered.insert(w, u64::MAX);
                            f(OfuPiece::Agg {
                                ts_ms: w,
                                len_ms: WINDOW_MS,
                                agg: r.hour,
                            });
                            return Ok(true);
                        }
                        // Minutes inside the range: from their rollup (those
                        // without samples have nothing to read either).
                        let mut mask = 0u64;
                        for i in 0..60u8 {
                            if usable(w + i64::from(i) * MINUTE_MS, MINUTE_MS) {
                                mask |= 1 << i;
                            }
                        }
                        for (i, agg) in r.minutes {
                            if mask & (1 << i) != 0 {
                                f(OfuPiece::Agg {
                                    ts_ms: w + i64::from(i) * MINUTE_MS,
                                    len_ms: MINUTE_MS,
                                    agg,
                                });
                            }
                        }
                        covered.insert(
                            w,
                            if mask == (1 << 60) - 1 {
                                u64::MAX
                            } else {
                                mask
                            },
                        );
                        Ok(true)
                    },
                )?;
            }
            // Chunks are read only between hours the rollups covered whole.
            let mut full: Vec<i64> = covered
                .iter()
                .filter(|(_, m)| **m == u64::MAX)
                .map(|(w, _)| *w)
                .collect();
            full.sort_unstable();
            let mut ranges = Vec::new();
            let mut cur = start;
            for w in full {
                if w > cur {
                    ranges.push((Cf::Ofu, &prefix, cur, w));
                }
                cur = cur.max(w + WINDOW_MS);
            }
            if cur < end {
                ranges.push((Cf::Ofu, &prefix, cur, end));
            }
            ranges.push((Cf::Head, &head, start, end));
            ranges.push((Cf::Limbo, &head, start, end));
            let mut raw_cache = RefCache::default();
            for (cf, p, from, to) in ranges {
                scan_series(view, cf, p, from, to, &mut |w, v| {
                    let mask = if cf == Cf::Ofu {
                        covered.get(&w).copied().unwrap_or(0)
                    } else {
                        0
                    };
                    if mask == u64::MAX {
                        return Ok(true);
                    }
                    let (block_job, samples) =
                        ofu_samples(v, &mut resolver(view, &prefix, &mut raw_cache, w))?;
                    if job.is_some_and(|j| j != block_job) {
                        return Ok(true);
                    }
                    for s in samples {
                        let minute = (s.ts_ms - w) / MINUTE_MS;
                        let bit = if (0..60).contains(&minute) {
                            1u64 << minute
                        } else {
                            0
                        };
                        if s.ts_ms >= start && s.ts_ms < end && mask & bit == 0 {
                            f(OfuPiece::Sample(s));
                        }
                    }
                    Ok(true)
                })?;
            }
            Ok(())
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
        // Events of batches in limbo are stored under the same keys in the
        // limbo family: merged in key (time) order under one view.
        let mut raw = Vec::new();
        self.engine.view(&mut |view| {
            for cf in [Cf::Meta, Cf::Limbo] {
                let mut n = 0;
                view.scan(cf, &from, &to, &mut |k, v| {
                    raw.push((k.to_vec(), v.to_vec()));
                    n += 1;
                    n < limit
                })?;
            }
            Ok(())
        })?;
        raw.sort();
        raw.truncate(limit);
        raw.iter().map(|(_, v)| from_json(v)).collect()
    }

    /// One node's record.
    pub fn node(&self, tenant: &str, node_id: &str) -> Result<Option<NodeRecord>, StoreError> {
        match self
            .engine
            .get(Cf::Meta, &keys::meta_key(META_NODE, &[tenant, node_id]))?
        {
            Some(v) => Ok(Some(from_json(&v)?)),
            None => Ok(None),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The rollup record layout that stores already hold: a minute mask,
    /// then 56 bytes per aggregate (count, weight, Σ value, Σ TPA, Σ clock,
    /// min, max, little-endian).
    #[test]
    fn rollup_records_keep_their_byte_layout() {
        let mut hour = Mean::default();
        hour.add(0.5, 0.6, 1500.0, 100);
        hour.add(0.25, 0.3, 1200.0, 300);
        let mut minute = Mean::default();
        minute.add(0.25, 0.3, 1200.0, 300);
        let r = Rollup {
            hour,
            minutes: vec![(7, minute)],
        };
        let mut want = (1u64 << 7).to_le_bytes().to_vec();
        for (count, fs) in [
            (2u64, [400.0, 125.0, 150.0, 510_000.0, 0.25, 0.5]),
            (1, [300.0, 75.0, 90.0, 360_000.0, 0.25, 0.25]),
        ] {
            want.extend_from_slice(&count.to_le_bytes());
            for f in fs {
                want.extend_from_slice(&f64::to_le_bytes(f));
            }
        }
        assert_eq!(r.encode(), want);
        assert_eq!(Rollup::decode(&want), Some(r));
        assert_eq!(Rollup::decode(&want[..want.len() - 1]), None);
    }

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
            mig_parent_uuid: Some("GPU-1".into()),
        };
        let r = GpuRecord::from_info(&info, "node-a", Some("job".into()), 42);
        assert_eq!(r.info(), info);
        assert_eq!(
            (r.node_id.as_str(), r.job_id.as_deref(), r.last_seen_ms),
            ("node-a", Some("job"), 42)
        );
    }
}
