//! What the store holds, in memory: every tenant's nodes, devices, GPUs,
//! the jobs each GPU ran and the raw metrics of each GPU and device, with
//! postings — for each field a GPU is selected by (UUID, index, model,
//! node, hostname, the job fields, a metric it has), the GPUs having each
//! value — so a query finds the few GPUs it names without reading, let
//! alone decoding, every record (Prometheus's postings are the model).
//!
//! - **Loaded once**, at the first read, from the metadata and one seek
//!   per stored metric ([`Store::raw_metrics`]); after that, every commit
//!   keeps it current ([`SeriesIndex::observe`]) in the same order as the
//!   write: a read never sees a batch's samples without its series.
//! - **Cheap on ingest**: a commit that brings nothing new (the common
//!   case: known GPUs, jobs and metrics) takes the read lock only, and
//!   moves its jobs' last-seen times with atomics; the write lock is taken
//!   when a node, GPU, job or metric is new or changed.
//! - It mirrors the records as stored (a job record is replaced by each
//!   commit, so is its entry); series whose samples retention or a limbo
//!   settlement removed stay listed, with no samples to read.
//! - **Where a GPU's OFU begins and ends** ([`OfuBounds`]): times no
//!   OFU sample of the GPU lies before or after, found in the store the
//!   first time a query asks ([`Store::ofu_bounds`]) and widened by every
//!   commit that brings an earlier or later sample, before its write and
//!   again after it. A GPU's series outside its jobs mostly cover the
//!   lookback before its first job, and a range often runs past a GPU's
//!   last hour: with these bounds a query knows both are empty without
//!   reading (a seek each, per series).

use super::records::{CommitSet, GpuRecord, JobRecord, NodeRecord};
use super::{Store, StoreError};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{RwLock, RwLockReadGuard};

/// A field GPUs are selected by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    /// The GPU's UUID.
    Uuid,
    /// Its index on its node.
    Index,
    /// Its product name.
    Model,
    /// Its node's id.
    Node,
    /// Its node's hostname.
    Hostname,
    /// A job it ran.
    JobId,
    /// A pod of a job it ran.
    Pod,
    /// A namespace of a job it ran.
    Namespace,
    /// A container of a job it ran.
    Container,
    /// An HPC job id of a job it ran.
    HpcJob,
    /// A raw metric it has samples of.
    Metric,
}

/// A job a GPU ran, as its record was last committed.
#[derive(Debug)]
pub struct JobEntry {
    pub job_id: String,
    pub pod: String,
    pub namespace: String,
    pub container: String,
    pub hpc_job: String,
    first_seen: AtomicI64,
    last_seen: AtomicI64,
}

impl JobEntry {
    fn new(j: &JobRecord) -> Self {
        Self {
            job_id: j.job_id.clone(),
            pod: j.pod.clone(),
            namespace: j.namespace.clone(),
            container: j.container.clone(),
            hpc_job: j.hpc_job.clone(),
            first_seen: AtomicI64::new(j.first_seen_ms),
            last_seen: AtomicI64::new(j.last_seen_ms),
        }
    }

    fn same_labels(&self, j: &JobRecord) -> bool {
        self.pod == j.pod
            && self.namespace == j.namespace
            && self.container == j.container
            && self.hpc_job == j.hpc_job
    }

    /// When the job was first and last seen on its GPU (ms), as last
    /// committed.
    pub fn seen(&self) -> (i64, i64) {
        (
            self.first_seen.load(Ordering::Relaxed),
            self.last_seen.load(Ordering::Relaxed),
        )
    }

    /// The record as last committed.
    pub fn record(&self, gpu: &str, node: &str) -> JobRecord {
        JobRecord {
            job_id: self.job_id.clone(),
            gpu_uuid: gpu.to_string(),
            node_id: node.to_string(),
            pod: self.pod.clone(),
            namespace: self.namespace.clone(),
            container: self.container.clone(),
            hpc_job: self.hpc_job.clone(),
            first_seen_ms: self.seen().0,
            last_seen_ms: self.seen().1,
        }
    }
}

/// A GPU as last committed.
#[derive(Debug)]
pub struct GpuEntry {
    pub uuid: String,
    pub index: u32,
    pub model: String,
    pub node: String,
    pub jobs: Vec<JobEntry>,
    ofu_bounds: OfuBounds,
}

/// Times no OFU sample of a GPU lies before (`first`) or after (`last`),
/// once known: the earliest and the latest hour the store held any of its
/// OFU in when first asked, widened by every commit of an earlier or later
/// sample since. They may lie outside its samples (retention and limbo
/// settlements remove samples, never narrow them), never inside.
#[derive(Debug)]
struct OfuBounds {
    first: AtomicI64,
    last: AtomicI64,
    known: AtomicBool,
}

impl OfuBounds {
    fn new() -> Self {
        Self {
            first: AtomicI64::new(i64::MAX),
            last: AtomicI64::new(i64::MIN),
            known: AtomicBool::new(false),
        }
    }

    /// A commit brings samples from `first` to `last`. Kept even before
    /// the bounds are known: the store read that makes them known may miss
    /// this commit.
    fn widen(&self, first: i64, last: i64) {
        self.first.fetch_min(first, Ordering::AcqRel);
        self.last.fetch_max(last, Ordering::AcqRel);
    }

    fn get(&self) -> Option<(i64, i64)> {
        self.known.load(Ordering::Acquire).then(|| {
            (
                self.first.load(Ordering::Acquire),
                self.last.load(Ordering::Acquire),
            )
        })
    }

    /// The bounds the store held when read (`(i64::MAX, i64::MIN)`: no
    /// OFU at all).
    fn found(&self, first: i64, last: i64) -> (i64, i64) {
        self.widen(first, last);
        self.known.store(true, Ordering::Release);
        (
            self.first.load(Ordering::Acquire),
            self.last.load(Ordering::Acquire),
        )
    }
}

/// A node device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    pub id: String,
    pub kind: String,
    pub name: String,
}

/// A node as last committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEntry {
    pub hostname: String,
    pub devices: Vec<DeviceEntry>,
}

/// One tenant's part of the index.
#[derive(Debug, Default)]
pub struct TenantIndex {
    pub nodes: BTreeMap<String, NodeEntry>,
    gpus: Vec<GpuEntry>,
    by_uuid: HashMap<String, u32>,
    /// Metrics (indices into [`Index::names`]) of each GPU or device key,
    /// sorted.
    metrics: HashMap<String, Vec<u16>>,
    postings: HashMap<Field, HashMap<String, BTreeSet<u32>>>,
}

/// Every tenant's part, and the metric names they share.
#[derive(Debug, Default)]
pub struct Index {
    tenants: BTreeMap<String, TenantIndex>,
    names: Vec<String>,
    name_ids: HashMap<String, u16>,
}

/// The store's index, loaded at the first read.
#[derive(Debug, Default)]
pub struct SeriesIndex {
    inner: RwLock<Option<Index>>,
}

/// A read of the index; commits wait to change it (never the other way).
pub struct IndexRead<'a> {
    guard: RwLockReadGuard<'a, Option<Index>>,
}

fn node_entry(n: &NodeRecord) -> NodeEntry {
    NodeEntry {
        hostname: n.hostname.clone(),
        devices: n
            .devices
            .iter()
            .map(|d| DeviceEntry {
                id: d.id.clone(),
                kind: d.kind.clone(),
                name: d.name.clone(),
            })
            .collect(),
    }
}

impl TenantIndex {
    fn post(&mut self, f: Field, v: &str, id: u32) {
        if v.is_empty() {
            return;
        }
        self.postings
            .entry(f)
            .or_default()
            .entry(v.to_string())
            .or_default()
            .insert(id);
    }

    fn unpost(&mut self, f: Field, v: &str, id: u32) {
        if let Some(m) = self.postings.get_mut(&f) {
            if let Some(ids) = m.get_mut(v) {
                ids.remove(&id);
                if ids.is_empty() {
                    m.remove(v);
                }
            }
        }
    }

    fn hostname(&self, node: &str) -> &str {
        self.nodes.get(node).map_or("", |n| n.hostname.as_str())
    }

    fn upsert_node(&mut self, node_id: &str, n: NodeEntry) {
        let old = self.hostname(node_id).to_string();
        if old != n.hostname {
            let ids: Vec<u32> = self
                .postings
                .get(&Field::Node)
                .and_then(|m| m.get(node_id))
                .map(|s| s.iter().copied().collect())
                .unwrap_or_default();
            for id in ids {
                self.unpost(Field::Hostname, &old, id);
                self.post(Field::Hostname, &n.hostname, id);
            }
        }
        self.nodes.insert(node_id.to_string(), n);
    }

    fn upsert_gpu(&mut self, g: &GpuRecord) -> u32 {
        let index = g.index.to_string();
        if let Some(&id) = self.by_uuid.get(&g.uuid) {
            let e = &self.gpus[id as usize];
            if e.node == g.node_id && e.model == g.model && e.index == g.index {
                return id;
            }
            let (old_node, old_model, old_index) =
                (e.node.clone(), e.model.clone(), e.index.to_string());
            let old_host = self.hostname(&old_node).to_string();
            self.unpost(Field::Node, &old_node, id);
            self.unpost(Field::Hostname, &old_host, id);
            self.unpost(Field::Model, &old_model, id);
            self.unpost(Field::Index, &old_index, id);
            let e = &mut self.gpus[id as usize];
            e.node = g.node_id.clone();
            e.model = g.model.clone();
            e.index = g.index;
            let host = self.hostname(&g.node_id).to_string();
            self.post(Field::Node, &g.node_id, id);
            self.post(Field::Hostname, &host, id);
            self.post(Field::Model, &g.model, id);
            self.post(Field::Index, &index, id);
            return id;
        }
        let id = self.gpus.len() as u32;
        self.gpus.push(GpuEntry {
            uuid: g.uuid.clone(),
            index: g.index,
            model: g.model.clone(),
            node: g.node_id.clone(),
            jobs: Vec::new(),
            ofu_bounds: OfuBounds::new(),
        });
        self.by_uuid.insert(g.uuid.clone(), id);
        let host = self.hostname(&g.node_id).to_string();
        self.post(Field::Uuid, &g.uuid, id);
        self.post(Field::Node, &g.node_id, id);
        self.post(Field::Hostname, &host, id);
        self.post(Field::Model, &g.model, id);
        self.post(Field::Index, &index, id);
        if let Some(ms) = self.metrics.get(&g.uuid).cloned() {
            for m in ms {
                self.post(Field::Metric, &m.to_string(), id);
            }
        }
        id
    }

    /// The GPU of `uuid`, a bare entry if no record has named it yet (a
    /// job or series may be committed before its GPU's record).
    fn gpu_id(&mut self, uuid: &str) -> u32 {
        match self.by_uuid.get(uuid) {
            Some(&id) => id,
            None => self.upsert_gpu(&GpuRecord {
                uuid: uuid.to_string(),
                ..Default::default()
            }),
        }
    }

    fn upsert_job(&mut self, j: &JobRecord) {
        let id = self.gpu_id(&j.gpu_uuid);
        let e = &mut self.gpus[id as usize];
        if let Some(k) = e.jobs.iter().position(|x| x.job_id == j.job_id) {
            if e.jobs[k].same_labels(j) {
                e.jobs[k]
                    .first_seen
                    .store(j.first_seen_ms, Ordering::Relaxed);
                e.jobs[k].last_seen.store(j.last_seen_ms, Ordering::Relaxed);
                return;
            }
            e.jobs[k] = JobEntry::new(j);
        } else {
            e.jobs.push(JobEntry::new(j));
        }
        for (f, v) in [
            (Field::JobId, &j.job_id),
            (Field::Pod, &j.pod),
            (Field::Namespace, &j.namespace),
            (Field::Container, &j.container),
            (Field::HpcJob, &j.hpc_job),
        ] {
            self.post(f, v, id);
        }
    }

    fn add_metric(&mut self, key: &str, metric: u16) {
        let ms = self.metrics.entry(key.to_string()).or_default();
        if let Err(at) = ms.binary_search(&metric) {
            ms.insert(at, metric);
            if let Some(&id) = self.by_uuid.get(key) {
                self.post(Field::Metric, &metric.to_string(), id);
            }
        }
    }

    fn has_metric(&self, key: &str, metric: u16) -> bool {
        self.metrics
            .get(key)
            .is_some_and(|ms| ms.binary_search(&metric).is_ok())
    }
}

impl Index {
    fn name_id(&mut self, metric: &str) -> u16 {
        if let Some(&id) = self.name_ids.get(metric) {
            return id;
        }
        let id = self.names.len() as u16;
        self.names.push(metric.to_string());
        self.name_ids.insert(metric.to_string(), id);
        id
    }

    /// Applies what `set` commits for `tenant`.
    fn apply(&mut self, tenant: &str, set: &CommitSet) {
        let metrics: Vec<(String, u16)> = set
            .series
            .iter()
            .map(|s| (s.gpu_uuid.clone(), self.name_id(&s.metric)))
            .collect();
        let t = self.tenants.entry(tenant.to_string()).or_default();
        for n in &set.nodes {
            t.upsert_node(&n.node_id, node_entry(n));
        }
        for g in &set.gpus {
            t.upsert_gpu(g);
        }
        for j in &set.jobs {
            t.upsert_job(j);
        }
        for (key, m) in metrics {
            t.add_metric(&key, m);
        }
    }

    /// Widens the OFU bounds of the GPUs whose samples `set` brings.
    fn widen_ofu_bounds(&self, tenant: &str, set: &CommitSet) {
        let Some(t) = self.tenants.get(tenant) else {
            return;
        };
        for (gpu, _, samples) in &set.ofu {
            let Some(&id) = t.by_uuid.get(gpu) else {
                continue;
            };
            let (first, last) = samples.iter().fold((i64::MAX, i64::MIN), |(a, b), s| {
                (a.min(s.ts_ms), b.max(s.ts_ms))
            });
            if first <= last {
                t.gpus[id as usize].ofu_bounds.widen(first, last);
            }
        }
    }

    /// Whether applying `set` would change anything but job times, which
    /// it moves meanwhile.
    fn is_news(&self, tenant: &str, set: &CommitSet) -> bool {
        let Some(t) = self.tenants.get(tenant) else {
            return true;
        };
        for n in &set.nodes {
            if t.nodes.get(&n.node_id) != Some(&node_entry(n)) {
                return true;
            }
        }
        for g in &set.gpus {
            match t.by_uuid.get(&g.uuid).map(|&id| &t.gpus[id as usize]) {
                Some(e) if e.node == g.node_id && e.model == g.model && e.index == g.index => {}
                _ => return true,
            }
        }
        for s in &set.series {
            match self.name_ids.get(&s.metric) {
                Some(&m) if t.has_metric(&s.gpu_uuid, m) => {}
                _ => return true,
            }
        }
        for j in &set.jobs {
            let Some(&id) = t.by_uuid.get(&j.gpu_uuid) else {
                return true;
            };
            match t.gpus[id as usize]
                .jobs
                .iter()
                .find(|x| x.job_id == j.job_id)
            {
                Some(e) if e.same_labels(j) => {
                    e.first_seen.store(j.first_seen_ms, Ordering::Relaxed);
                    e.last_seen.store(j.last_seen_ms, Ordering::Relaxed);
                }
                _ => return true,
            }
        }
        false
    }
}

impl SeriesIndex {
    /// Keeps the index current with a commit of `set` for `tenant`, once
    /// it is written. Nothing to do before the first read loads it.
    pub fn observe(&self, tenant: &str, set: &CommitSet) {
        {
            let Ok(g) = self.inner.read() else { return };
            match g.as_ref() {
                None => return,
                Some(i) => {
                    i.widen_ofu_bounds(tenant, set);
                    if !i.is_news(tenant, set) {
                        return;
                    }
                }
            }
        }
        if let Ok(mut g) = self.inner.write() {
            if let Some(i) = g.as_mut() {
                i.apply(tenant, set);
            }
        }
    }

    /// Widens the OFU bounds of `set`'s GPUs to its samples before it is
    /// written, so no read sees a sample before its GPU's bound
    /// ([`SeriesIndex::observe`] does it again, for a GPU its commit
    /// brought into the index).
    pub fn before_write(&self, tenant: &str, set: &CommitSet) {
        if let Ok(g) = self.inner.read() {
            if let Some(i) = g.as_ref() {
                i.widen_ofu_bounds(tenant, set);
            }
        }
    }
}

impl Store {
    /// Times no OFU sample of GPU `g` of `tenant` lies before or after
    /// (`(i64::MAX, i64::MIN)` when it has none): read from the store the
    /// first time they are asked for, then kept by the commits
    /// ([`OfuBounds`]).
    pub fn ofu_bounds(&self, tenant: &str, g: &GpuEntry) -> Result<(i64, i64), StoreError> {
        if let Some(b) = g.ofu_bounds.get() {
            return Ok(b);
        }
        let (first, last) = self.ofu_hours(tenant, &g.uuid)?;
        Ok(g.ofu_bounds.found(first, last))
    }

    /// [`Store::ofu_bounds`] of GPU `gpu` where a query already asked for
    /// them; `None` otherwise (nothing is read).
    pub(super) fn known_ofu_bounds(&self, tenant: &str, gpu: &str) -> Option<(i64, i64)> {
        let g = self.index.inner.read().ok()?;
        let t = g.as_ref()?.tenants.get(tenant)?;
        let id = *t.by_uuid.get(gpu)?;
        t.gpus[id as usize].ofu_bounds.get()
    }

    /// The start of the earliest hour and the end of the latest hour of
    /// any key holding OFU of `gpu` in any family a read takes it from
    /// (the head, limbo, the chunks, the minute lasts and the rollups);
    /// `(i64::MAX, i64::MIN)` when there is none. A key's time lies in the
    /// hour of its samples.
    fn ofu_hours(&self, tenant: &str, gpu: &str) -> Result<(i64, i64), StoreError> {
        use super::keys::{self, KIND_LAST, KIND_OFU};
        use super::Cf;
        let prefix = keys::ofu_prefix(tenant, gpu);
        let lasts = keys::kind_prefix(KIND_LAST, &prefix);
        let rollups = keys::kind_prefix(KIND_OFU, &prefix);
        let (mut first, mut last) = (i64::MAX, i64::MIN);
        let head = self.bundle_hours(Cf::Head);
        self.engine.view(&mut |view| {
            for cf in [Cf::Head, Cf::Limbo] {
                let hours = super::gpu_block::hours(view, cf, head.of(cf), &prefix)?;
                if let (Some(f), Some(l)) = (hours.first(), hours.last()) {
                    first = first.min(*f);
                    last = last.max(l.saturating_add(super::WINDOW_MS - 1));
                }
            }
            Ok(())
        })?;
        for (cf, p) in [
            (Cf::Ofu, &prefix),
            (Cf::Rollup, &lasts),
            (Cf::Rollup, &rollups),
        ] {
            let (from, to) = keys::scan_bounds(p, i64::MIN);
            let hour = |k: &[u8]| {
                keys::key_ts(k, p.len())
                    .map(super::hours::window_of)
                    .ok_or_else(|| super::corrupt(cf, "key"))
            };
            let mut found = None;
            self.engine.scan(cf, &from, &to, &mut |k, _| {
                found = Some(k.to_vec());
                false
            })?;
            if let Some(k) = found {
                first = first.min(hour(&k)?);
            }
            if let Some(k) = self.engine.last_key(cf, &from, &to)? {
                last = last.max(hour(&k)?.saturating_add(super::WINDOW_MS - 1));
            }
        }
        Ok((first, last))
    }

    /// A read of the index, loading it first if no read has yet.
    pub fn index(&self) -> Result<IndexRead<'_>, StoreError> {
        {
            let g = self
                .index
                .inner
                .read()
                .map_err(|_| StoreError::Engine("series index lock poisoned".into()))?;
            if g.is_some() {
                return Ok(IndexRead { guard: g });
            }
        }
        {
            let mut g = self
                .index
                .inner
                .write()
                .map_err(|_| StoreError::Engine("series index lock poisoned".into()))?;
            if g.is_none() {
                // Commits wait for the lock: none is lost between this
                // load's reads and its install.
                *g = Some(self.load_index()?);
            }
        }
        self.index()
    }

    /// The index from the stored records and series.
    fn load_index(&self) -> Result<Index, StoreError> {
        let mut index = Index::default();
        let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (t, n) in self.nodes(None)? {
            let e = index.tenants.entry(t.clone()).or_default();
            e.upsert_node(&n.node_id, node_entry(&n));
            keys.entry(t)
                .or_default()
                .extend(n.devices.iter().map(|d| d.id.clone()));
        }
        for (t, g) in self.gpus(None)? {
            index.tenants.entry(t.clone()).or_default().upsert_gpu(&g);
            keys.entry(t).or_default().insert(g.uuid.clone());
        }
        for (t, j) in self.jobs(None)? {
            index.tenants.entry(t).or_default().upsert_job(&j);
        }
        for (t, ks) in keys {
            for k in ks {
                for m in self.raw_metrics(&t, &k)? {
                    let id = index.name_id(&m);
                    if let Some(e) = index.tenants.get_mut(&t) {
                        e.add_metric(&k, id);
                    }
                }
            }
        }
        Ok(index)
    }
}

/// A GPU as a read of the index shows it.
#[derive(Debug, Clone, Copy)]
pub struct GpuView<'a> {
    pub id: u32,
    pub entry: &'a GpuEntry,
    pub hostname: &'a str,
}

impl IndexRead<'_> {
    fn index(&self) -> Option<&Index> {
        self.guard.as_ref()
    }

    /// Every tenant, in order.
    pub fn tenants(&self) -> Vec<&str> {
        self.index()
            .map(|i| i.tenants.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    pub fn tenant(&self, tenant: &str) -> Option<&TenantIndex> {
        self.index()?.tenants.get(tenant)
    }

    /// The GPUs of `tenant` with a value of `field` that `pred` accepts;
    /// `pred` is asked once per distinct value.
    pub fn gpus_where(
        &self,
        tenant: &str,
        field: Field,
        pred: &dyn Fn(&str) -> bool,
    ) -> BTreeSet<u32> {
        let Some(i) = self.index() else {
            return BTreeSet::new();
        };
        let Some(t) = i.tenants.get(tenant) else {
            return BTreeSet::new();
        };
        let Some(p) = t.postings.get(&field) else {
            return BTreeSet::new();
        };
        let mut out = BTreeSet::new();
        for (v, ids) in p {
            let accepted = if field == Field::Metric {
                v.parse::<usize>()
                    .ok()
                    .and_then(|m| i.names.get(m))
                    .is_some_and(|name| pred(name))
            } else {
                pred(v)
            };
            if accepted {
                out.extend(ids.iter().copied());
            }
        }
        out
    }

    /// The GPUs of `tenant` whose `field` is `value` (one lookup).
    pub fn gpus_with(&self, tenant: &str, field: Field, value: &str) -> BTreeSet<u32> {
        let Some(i) = self.index() else {
            return BTreeSet::new();
        };
        let key = if field == Field::Metric {
            match i.name_ids.get(value) {
                Some(id) => id.to_string(),
                None => return BTreeSet::new(),
            }
        } else {
            value.to_string()
        };
        i.tenants
            .get(tenant)
            .and_then(|t| t.postings.get(&field))
            .and_then(|p| p.get(&key))
            .cloned()
            .unwrap_or_default()
    }

    /// Every GPU of `tenant`.
    pub fn all_gpus(&self, tenant: &str) -> BTreeSet<u32> {
        self.tenant(tenant)
            .map(|t| (0..t.gpus.len() as u32).collect())
            .unwrap_or_default()
    }

    /// GPU `id` of `tenant`.
    pub fn gpu(&self, tenant: &str, id: u32) -> Option<GpuView<'_>> {
        let t = self.tenant(tenant)?;
        let entry = t.gpus.get(id as usize)?;
        Some(GpuView {
            id,
            entry,
            hostname: t.hostname(&entry.node),
        })
    }

    /// The raw metrics of GPU or device `key` of `tenant`.
    pub fn metrics(&self, tenant: &str, key: &str) -> Vec<&str> {
        let (Some(i), Some(t)) = (self.index(), self.tenant(tenant)) else {
            return Vec::new();
        };
        t.metrics
            .get(key)
            .map(|ms| {
                ms.iter()
                    .filter_map(|&m| i.names.get(m as usize).map(String::as_str))
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemEngine;
    use flopwatch_proto::model::{Point, SeriesBatch};
    use std::sync::Arc;

    fn set(
        gpu: &str,
        node: &str,
        host: &str,
        job: Option<&str>,
        metric: &str,
        t: i64,
    ) -> CommitSet {
        CommitSet {
            series: vec![SeriesBatch {
                gpu_uuid: gpu.into(),
                metric: metric.into(),
                points: vec![Point {
                    ts_ms: t,
                    value: 1.0,
                    peak: None,
                    window_ms: Some(1000),
                }],
            }],
            gpus: vec![GpuRecord {
                uuid: gpu.into(),
                node_id: node.into(),
                model: "H100".into(),
                ..Default::default()
            }],
            nodes: vec![NodeRecord {
                node_id: node.into(),
                hostname: host.into(),
                ..Default::default()
            }],
            jobs: job
                .map(|j| JobRecord {
                    job_id: j.into(),
                    gpu_uuid: gpu.into(),
                    first_seen_ms: 0,
                    last_seen_ms: t,
                    ..Default::default()
                })
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn uuids(r: &IndexRead, tenant: &str, ids: &BTreeSet<u32>) -> Vec<String> {
        ids.iter()
            .map(|&id| r.gpu(tenant, id).unwrap().entry.uuid.clone())
            .collect()
    }

    /// What commits bring after the first read is what a fresh load of the
    /// same store finds.
    #[test]
    fn commits_keep_the_index_as_a_fresh_load_would_find_it() {
        let s = Store::new(Arc::new(MemEngine::new()), false);
        s.commit("a", &set("G1", "n1", "h1", Some("j1"), "power_w", 1000))
            .unwrap();
        // Loaded here; later commits update it.
        assert_eq!(s.index().unwrap().tenants(), vec!["a"]);
        s.commit("a", &set("G2", "n1", "h1", Some("j2"), "temp_c", 2000))
            .unwrap();
        s.commit("a", &set("G1", "n1", "h1", Some("j1"), "temp_c", 3000))
            .unwrap();
        s.commit("b", &set("G3", "n2", "h2", None, "power_w", 3000))
            .unwrap();
        // The node renamed: its GPUs move to the new hostname.
        s.commit("a", &set("G1", "n1", "h9", None, "power_w", 4000))
            .unwrap();
        let fresh = Store::new(s.engine.clone(), false);
        for store in [&s, &fresh] {
            let r = store.index().unwrap();
            assert_eq!(r.tenants(), vec!["a", "b"]);
            let on = |f, v: &str| {
                let v = v.to_string();
                uuids(&r, "a", &r.gpus_where("a", f, &|x| x == v))
            };
            assert_eq!(on(Field::Node, "n1"), ["G1", "G2"]);
            assert_eq!(on(Field::Hostname, "h9"), ["G1", "G2"]);
            assert!(on(Field::Hostname, "h1").is_empty());
            assert_eq!(on(Field::JobId, "j2"), ["G2"]);
            assert_eq!(on(Field::Metric, "temp_c"), ["G1", "G2"]);
            assert_eq!(on(Field::Metric, "power_w"), ["G1"]);
            let g1 = r.gpu("a", 0).unwrap();
            assert_eq!(g1.entry.jobs.len(), 1);
            assert_eq!(g1.entry.jobs[0].record("G1", "n1").last_seen_ms, 3000);
            assert_eq!(r.metrics("a", "G1"), ["power_w", "temp_c"]);
            assert!(r.gpus_where("b", Field::JobId, &|_| true).is_empty());
        }
    }

    fn ofu(gpu: &str, job: Option<&str>, ts: &[i64]) -> CommitSet {
        let samples = ts
            .iter()
            .map(|&t| crate::OfuSample {
                ts_ms: t,
                ofu: 0.5,
                tensor_active: 0.5,
                sm_clock_mhz: 1755.0,
                window_ms: 1000,
            })
            .collect();
        CommitSet {
            ofu: vec![(gpu.into(), job.map(String::from), samples)],
            ..Default::default()
        }
    }

    /// The times of `gpu`'s samples any read of the store finds.
    fn sample_times(s: &Store, gpu: &str) -> Vec<i64> {
        let mut ts = Vec::new();
        s.ofu("a", gpu, i64::MIN, i64::MAX, None, &mut |x| {
            ts.push(x.ts_ms)
        })
        .unwrap();
        ts.sort_unstable();
        ts
    }

    fn ofu_bounds(s: &Store, gpu: &str) -> (i64, i64) {
        let r = s.index().unwrap();
        let id = r.gpus_with("a", Field::Uuid, gpu);
        let g = r.gpu("a", *id.first().unwrap()).unwrap();
        s.ofu_bounds("a", g.entry).unwrap()
    }

    /// The bounds hold every sample, and a read with them known finds
    /// what one without them found.
    fn holds_every_sample(s: &Store, gpu: &str, before: &[i64]) {
        let (first, last) = ofu_bounds(s, gpu);
        let after = sample_times(s, gpu);
        assert_eq!(after, before, "{gpu}");
        if let (Some(a), Some(b)) = (after.first(), after.last()) {
            assert!(
                first <= *a && *b <= last,
                "{gpu}: {first}..{last} against {a}..{b}"
            );
        }
    }

    /// No OFU sample of a GPU lies outside its bounds, wherever its samples
    /// are (the head; chunks and minute lasts after a seal), whenever the
    /// bounds were first read, and when a commit brings an earlier or a
    /// later sample; a read past the last bound finds what it found before.
    #[test]
    fn no_ofu_sample_lies_outside_its_gpus_bounds() {
        const H: i64 = crate::WINDOW_MS;
        let s = Store::new(Arc::new(MemEngine::new()), false);
        s.commit("a", &set("G1", "n1", "h1", Some("j1"), "power_w", 5 * H))
            .unwrap();
        s.commit("a", &set("G2", "n1", "h1", None, "power_w", 5 * H))
            .unwrap();
        s.commit(
            "a",
            &ofu("G1", Some("j1"), &[5 * H + 600_000, 5 * H + 601_000]),
        )
        .unwrap();
        // In the head: its hour.
        let before = sample_times(&s, "G1");
        assert_eq!(ofu_bounds(&s, "G1"), (5 * H, 6 * H - 1));
        holds_every_sample(&s, "G1", &before);
        // A head bundle holds a GPU's raw blocks and its OFU alike: G2's
        // bounds are its raw samples' hour.
        assert_eq!(ofu_bounds(&s, "G2"), (5 * H, 6 * H - 1));
        // An earlier or a later sample widens the known bounds, also of a
        // GPU that had no OFU when they were read.
        s.commit("a", &ofu("G1", None, &[2 * H + 1_800_000]))
            .unwrap();
        s.commit("a", &ofu("G1", None, &[9 * H + 5])).unwrap();
        s.commit("a", &ofu("G2", None, &[3 * H + 5])).unwrap();
        assert_eq!(ofu_bounds(&s, "G1"), (2 * H + 1_800_000, 9 * H + 5));
        assert_eq!(
            sample_times(&s, "G1"),
            [
                2 * H + 1_800_000,
                5 * H + 600_000,
                5 * H + 601_000,
                9 * H + 5
            ]
        );
        assert_eq!(ofu_bounds(&s, "G2"), (3 * H + 5, 6 * H - 1));
        // Sealed into chunks and minute lasts, read by a fresh store.
        s.compact(12 * H, 0).unwrap();
        let fresh = Store::new(s.engine.clone(), false);
        for (gpu, bounds) in [("G1", (2 * H, 10 * H - 1)), ("G2", (3 * H, 4 * H - 1))] {
            let before = sample_times(&fresh, gpu);
            assert_eq!(ofu_bounds(&fresh, gpu), bounds, "{gpu}");
            holds_every_sample(&fresh, gpu, &before);
        }
        // A GPU with nothing stored has no sample anywhere; known before
        // its first OFU arrives, the commit widens them.
        let record = CommitSet {
            gpus: vec![GpuRecord {
                uuid: "G3".into(),
                node_id: "n1".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        s.commit("a", &record).unwrap();
        assert_eq!(ofu_bounds(&s, "G3"), (i64::MAX, i64::MIN));
        s.commit("a", &ofu("G3", None, &[7 * H + 1])).unwrap();
        assert_eq!(ofu_bounds(&s, "G3"), (7 * H + 1, 7 * H + 1));
        assert_eq!(sample_times(&s, "G3"), [7 * H + 1]);
    }
}
