//! The series model: the series `/metrics` exports, with its names and
//! labels, backed by the stored samples instead of the live state.
//!
//! - `flopwatch_ofu_ratio`, `flopwatch_ofu_tensor_active_ratio` and
//!   `flopwatch_ofu_sm_clock_hertz` per GPU, from the stored OFU samples.
//! - one family per catalog metric per GPU (`flopwatch_gpu_…`) and per node
//!   device (`flopwatch_device_…`), from the raw series, in the family's
//!   base unit ([`crate::series::family`]: the stored value × `scale`).
//!
//! Labels are [`crate::series::gpu_labels`]' and
//! [`crate::series::device_labels`]'. Job labels (`job_id`, `pod`, …):
//! a GPU sample carries those of the job whose stored record covers its
//! time (`first_seen_ms ≤ t ≤ last_seen_ms`; the latest started wins where
//! two overlap), none outside every job. So a GPU's series changes its
//! label set when its job changes, as a relabelled target's does in
//! Prometheus: one series per (GPU, family, job), each holding only the
//! samples of its job's time.
//!
//! `flopwatch_node_ofu_ratio` (`tenant`, `node`, `hostname`),
//! `flopwatch_job_ofu_ratio` and `flopwatch_job_gpus` (`tenant`,
//! `job_id`) are derived from their GPUs' OFU series ([`derived`]): at a
//! time `t`, the exact mean (or the number) of the newest values of the
//! GPUs whose newest sample is in `[t − 5m, t]`. An instant selector reads
//! them at its step's time itself; range functions read their points, one
//! at each sample time of their GPUs. A job's GPU counts over its job's
//! time only (the spans of its `job_id` series). So
//! `flopwatch_node_ofu_ratio` answers as `avg by (tenant, node, hostname)
//! (flopwatch_ofu_ratio)` does, but for the 5 minutes after a GPU changes
//! jobs: there `avg by` still sees the GPU's series of before the change
//! and counts the GPU twice, the node's series once.

use super::budget::Budget;
use super::derived::{self, Across};
use super::points::newest_at;
use super::{QueryError, LOOKBACK_MS};
use crate::auth::Scope;
use crate::series::{family_of, push_job_labels, Family, Labels, On};
use crate::store::{GpuRecord, JobRecord, NodeRecord, OfuPiece, Store, StoreError, MINUTE_MS};
use promql_parser::label::{MatchOp, Matcher};
use std::collections::{BTreeMap, HashMap};

/// Which column of a GPU's OFU samples a series is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OfuCol {
    Ofu,
    Tensor,
    Clock,
}

/// Where a series' samples are stored.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Source {
    Ofu {
        tenant: String,
        gpu: String,
        col: OfuCol,
    },
    Raw {
        tenant: String,
        key: String,
        metric: String,
        scale: f64,
    },
    /// A node's or job's series, from its GPUs' OFU series (`members`,
    /// each with its spans).
    Across { members: Vec<SeriesRef>, op: Across },
}

/// One series: its labels, where its samples are, and the time spans
/// (`[from, to)`) whose samples are its own (job attribution).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SeriesRef {
    /// Sorted by name, `__name__` included.
    pub labels: Labels,
    pub source: Source,
    pub spans: Vec<(i64, i64)>,
}

/// A matcher of a selector: `name op value` on one label (absent = "").
pub(super) fn matches(m: &[Matcher], labels: &Labels) -> bool {
    m.iter().all(|m| {
        let v = labels
            .iter()
            .find(|(k, _)| *k == m.name)
            .map_or("", |(_, v)| v.as_str());
        m.is_match(v)
    })
}

/// The `__name__` value an equality matcher pins, if one does.
fn pinned_name(m: &[Matcher]) -> Option<&str> {
    m.iter()
        .find(|m| m.name == "__name__" && matches!(m.op, MatchOp::Equal))
        .map(|m| m.value.as_str())
}

/// Job spans of one GPU: constant-owner pieces of the time line, with the
/// index of the owning job record (or `None`).
fn job_segments(jobs: &[&JobRecord]) -> Vec<(i64, i64, Option<usize>)> {
    let mut cuts = vec![i64::MIN, i64::MAX];
    for j in jobs {
        cuts.push(j.first_seen_ms);
        cuts.push(j.last_seen_ms.saturating_add(1));
    }
    cuts.sort_unstable();
    cuts.dedup();
    let owner = |t: i64| {
        jobs.iter()
            .enumerate()
            .filter(|(_, j)| j.first_seen_ms <= t && t <= j.last_seen_ms)
            .max_by_key(|(_, j)| j.first_seen_ms)
            .map(|(i, _)| i)
    };
    let mut out: Vec<(i64, i64, Option<usize>)> = Vec::new();
    for w in cuts.windows(2) {
        let o = owner(w[0]);
        match out.last_mut() {
            Some(last) if last.2 == o && last.1 == w[0] => last.1 = w[1],
            _ => out.push((w[0], w[1], o)),
        }
    }
    out
}

fn sorted(mut l: Labels) -> Labels {
    l.retain(|(_, v)| !v.is_empty());
    l.sort();
    l
}

/// The derived families ([`Source::Across`]).
const NODE_OFU: &str = "flopwatch_node_ofu_ratio";
const JOB_OFU: &str = "flopwatch_job_ofu_ratio";
const JOB_GPUS: &str = "flopwatch_job_gpus";

/// The families of the OFU columns.
const OFU_FAMILIES: [(&str, OfuCol); 3] = [
    ("flopwatch_ofu_ratio", OfuCol::Ofu),
    ("flopwatch_ofu_tensor_active_ratio", OfuCol::Tensor),
    ("flopwatch_ofu_sm_clock_hertz", OfuCol::Clock),
];

/// The series visible to a scope, listed from the store's inventories.
pub(super) struct Model<'a> {
    pub store: &'a Store,
    pub scope: &'a Scope,
    /// Counts the series selected and samples read.
    pub budget: &'a Budget,
}

impl Model<'_> {
    fn tenant(&self) -> Option<&str> {
        match self.scope {
            Scope::All => None,
            Scope::Tenant(t) => Some(t.as_str()),
        }
    }

    /// Every series whose labels satisfy `m` (no samples read).
    pub fn select(&self, m: &[Matcher]) -> Result<Vec<SeriesRef>, QueryError> {
        let name = pinned_name(m);
        let wants = |family: &str| name.is_none_or(|n| n == family);
        let tenant = self.tenant();
        let nodes: HashMap<(String, String), NodeRecord> = self
            .store
            .nodes(tenant)?
            .into_iter()
            .map(|(t, n)| ((t, n.node_id.clone()), n))
            .collect();
        let hostname = |t: &str, n: &str| {
            nodes
                .get(&(t.to_string(), n.to_string()))
                .map(|r| r.hostname.clone())
                .unwrap_or_default()
        };
        let mut jobs: HashMap<(String, String), Vec<JobRecord>> = HashMap::new();
        for (t, j) in self.store.jobs(tenant)? {
            jobs.entry((t, j.gpu_uuid.clone())).or_default().push(j);
        }
        let mut out = Vec::new();
        let node_family = wants(NODE_OFU);
        let job_family = wants(JOB_OFU) || wants(JOB_GPUS);
        // The GPUs of each node and job, for the derived series.
        let mut node_gpus: BTreeMap<Labels, Vec<SeriesRef>> = BTreeMap::new();
        let mut job_gpus: BTreeMap<Labels, BTreeMap<String, SeriesRef>> = BTreeMap::new();
        let gpu_family = name.is_none_or(|n| n.starts_with("flopwatch_ofu_"));
        let raw_family = name.is_none_or(|n| n.starts_with("flopwatch_gpu_"));
        for (t, g) in self.store.gpus(tenant)? {
            if !self.scope.allows(&t) {
                continue;
            }
            self.budget.check()?;
            let base = gpu_base(&t, &g, &hostname(&t, &g.node_id));
            let gpu_jobs: Vec<&JobRecord> = jobs
                .get(&(t.clone(), g.uuid.clone()))
                .map(|v| v.iter().collect())
                .unwrap_or_default();
            let segments = job_segments(&gpu_jobs);
            let ofu = |spans| SeriesRef {
                labels: Vec::new(),
                source: Source::Ofu {
                    tenant: t.clone(),
                    gpu: g.uuid.clone(),
                    col: OfuCol::Ofu,
                },
                spans,
            };
            if node_family {
                let node = vec![
                    ("hostname".into(), hostname(&t, &g.node_id)),
                    ("node".into(), g.node_id.clone()),
                    ("tenant".into(), t.clone()),
                ];
                node_gpus
                    .entry(node)
                    .or_default()
                    .push(ofu(vec![(i64::MIN, i64::MAX)]));
            }
            if job_family {
                for &(a, b, o) in &segments {
                    if let Some(j) = o {
                        let job = vec![
                            ("job_id".into(), gpu_jobs[j].job_id.clone()),
                            ("tenant".into(), t.clone()),
                        ];
                        job_gpus
                            .entry(job)
                            .or_default()
                            .entry(g.uuid.clone())
                            .or_insert_with(|| ofu(Vec::new()))
                            .spans
                            .push((a, b));
                    }
                }
            }
            // One label set per owner: the GPU's, plus the job's.
            let mut owners: Vec<(Labels, Vec<(i64, i64)>)> = Vec::new();
            let mut seen: HashMap<Option<usize>, usize> = HashMap::new();
            for (a, b, o) in segments {
                let i = *seen.entry(o).or_insert_with(|| {
                    let mut l = base.clone();
                    if let Some(j) = o {
                        let j = gpu_jobs[j];
                        push_job_labels(
                            &mut l,
                            [&j.job_id, &j.pod, &j.namespace, &j.container, &j.hpc_job],
                        );
                    }
                    owners.push((l, Vec::new()));
                    owners.len() - 1
                });
                owners[i].1.push((a, b));
            }
            let mut families: Vec<(String, Source)> = Vec::new();
            if gpu_family {
                for (n, col) in OFU_FAMILIES {
                    if wants(n) {
                        families.push((
                            n.to_string(),
                            Source::Ofu {
                                tenant: t.clone(),
                                gpu: g.uuid.clone(),
                                col,
                            },
                        ));
                    }
                }
            }
            if raw_family {
                self.raw_families(&t, &g.uuid, On::Gpu, &wants, &mut families)?;
            }
            for (n, source) in families {
                for (l, spans) in &owners {
                    let mut labels = l.clone();
                    labels.push(("__name__".into(), n.clone()));
                    let labels = sorted(labels);
                    if matches(m, &labels) {
                        self.budget.series(1)?;
                        out.push(SeriesRef {
                            labels,
                            source: source.clone(),
                            spans: spans.clone(),
                        });
                    }
                }
            }
        }
        let mut count = 0;
        let mut derived = |name: &str, labels: &Labels, members: &[SeriesRef], op| {
            let mut l = labels.clone();
            l.push(("__name__".into(), name.to_string()));
            let labels = sorted(l);
            if wants(name) && matches(m, &labels) {
                count += 1;
                out.push(SeriesRef {
                    labels,
                    source: Source::Across {
                        members: members.to_vec(),
                        op,
                    },
                    spans: vec![(i64::MIN, i64::MAX)],
                });
            }
        };
        for (labels, members) in &node_gpus {
            derived(NODE_OFU, labels, members, Across::Mean);
        }
        for (labels, gpus) in &job_gpus {
            let members: Vec<SeriesRef> = gpus.values().cloned().collect();
            derived(JOB_OFU, labels, &members, Across::Mean);
            derived(JOB_GPUS, labels, &members, Across::Count);
        }
        self.budget.series(count)?;
        if name.is_none_or(|n| n.starts_with("flopwatch_device_")) {
            for ((t, _), n) in &nodes {
                if !self.scope.allows(t) {
                    continue;
                }
                for d in &n.devices {
                    let mut families = Vec::new();
                    self.raw_families(t, &d.id, On::Device, &wants, &mut families)?;
                    for (f, source) in families {
                        let labels = sorted(vec![
                            ("__name__".into(), f),
                            ("kind".into(), d.kind.clone()),
                            ("device".into(), d.name.clone()),
                            ("device_id".into(), d.id.clone()),
                            ("hostname".into(), n.hostname.clone()),
                            ("node".into(), n.node_id.clone()),
                            ("tenant".into(), t.clone()),
                        ]);
                        if matches(m, &labels) {
                            self.budget.series(1)?;
                            out.push(SeriesRef {
                                labels,
                                source,
                                spans: vec![(i64::MIN, i64::MAX)],
                            });
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        Ok(out)
    }

    fn raw_families(
        &self,
        tenant: &str,
        key: &str,
        on: On,
        wants: &dyn Fn(&str) -> bool,
        out: &mut Vec<(String, Source)>,
    ) -> Result<(), StoreError> {
        for metric in self.store.raw_metrics(tenant, key)? {
            let Some(f): Option<Family> = family_of(&metric, on) else {
                continue;
            };
            let n = f.sample_name();
            if wants(&n) {
                out.push((
                    n,
                    Source::Raw {
                        tenant: tenant.to_string(),
                        key: key.to_string(),
                        metric,
                        scale: f.scale,
                    },
                ));
            }
        }
        Ok(())
    }

    /// The samples of `s` with `from ≤ t ≤ to`, in time order, in the
    /// family's unit.
    pub fn samples(
        &self,
        s: &SeriesRef,
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, f64)>, QueryError> {
        self.budget.check()?;
        if let Source::Across { members, op } = &s.source {
            return self.across(members, *op, from, to);
        }
        let mut out = Vec::new();
        for &(a, b) in &s.spans {
            let (lo, hi) = (a.max(from), b.min(to.saturating_add(1)));
            if lo >= hi {
                continue;
            }
            match &s.source {
                Source::Ofu { tenant, gpu, col } => {
                    self.store.ofu(tenant, gpu, lo, hi, None, &mut |x| {
                        out.push((
                            x.ts_ms,
                            ofu_column(*col, x.ofu, x.tensor_active, x.sm_clock_mhz),
                        ));
                    })?;
                }
                Source::Raw {
                    tenant,
                    key,
                    metric,
                    scale,
                } => {
                    for p in self.store.series(tenant, key, metric, lo, hi, usize::MAX)? {
                        out.push((p.ts_ms, p.value * scale));
                    }
                }
                Source::Across { .. } => unreachable!("answered above"),
            }
        }
        self.budget.samples(out.len())?;
        out.sort_by_key(|p| p.0);
        Ok(out)
    }

    /// A derived series' points with `from ≤ t ≤ to` ([`derived::points`]).
    fn across(
        &self,
        members: &[SeriesRef],
        op: Across,
        from: i64,
        to: i64,
    ) -> Result<Vec<(i64, f64)>, QueryError> {
        let lists = members
            .iter()
            .map(|m| self.samples(m, from.saturating_sub(LOOKBACK_MS), to))
            .collect::<Result<Vec<_>, _>>()?;
        let out = derived::points(&lists, op, from, to);
        self.budget.samples(out.len())?;
        Ok(out)
    }

    /// The sample of `s` an instant selector takes at each of `times`
    /// (ascending): the newest in `[t − lookback, t]`, read from the
    /// samples in `[from, to]`; for a derived series, its value at `t`
    /// itself ([`derived::at_times`]).
    pub fn at_times(
        &self,
        s: &SeriesRef,
        times: &[i64],
        from: i64,
        to: i64,
    ) -> Result<Vec<Option<(i64, f64)>>, QueryError> {
        if let Source::Across { members, op } = &s.source {
            let lists = members
                .iter()
                .map(|m| self.samples(m, from, to))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(derived::at_times(&lists, *op, times));
        }
        let pts = self.samples(s, from, to)?;
        let mut j = 0;
        Ok(times.iter().map(|&t| newest_at(&pts, t, &mut j)).collect())
    }

    /// The pieces of an OFU ratio series `s` with `from ≤ t ≤ to`, in
    /// time order, for the windowed aggregates: sealed minutes (and hours,
    /// with `hours`) lying wholly inside the range and a job span as
    /// [`Piece::Bucket`]s, the rest as samples. `None` where the rollups
    /// cannot answer: another column (the rollups keep min and max of OFU
    /// only), or a bucket rolled up before the store kept unweighted sums
    /// and first samples.
    pub fn ofu_buckets(
        &self,
        s: &SeriesRef,
        from: i64,
        to: i64,
        hours: bool,
    ) -> Result<Option<Vec<Piece>>, QueryError> {
        self.budget.check()?;
        let Source::Ofu {
            tenant,
            gpu,
            col: OfuCol::Ofu,
        } = &s.source
        else {
            return Ok(None);
        };
        let mut out = Vec::new();
        let mut known = true;
        let mut take = |p: OfuPiece| match p {
            OfuPiece::Sample(x) => out.push(Piece::Sample(x.ts_ms, x.ofu)),
            OfuPiece::Agg {
                ts_ms, agg, first, ..
            } => match (agg.plain_sum(), first) {
                (Some(sum), Some(first)) => out.push(Piece::Bucket {
                    ts: ts_ms,
                    count: agg.count,
                    sum,
                    min: agg.min(),
                    max: agg.max(),
                    first,
                }),
                _ => known = false,
            },
        };
        // Buckets start on whole minutes: the partial minutes at a span's
        // ends are read as samples, and buckets of the rest align with
        // the windows (minutes only, unless `hours`).
        let grain = if hours { 0 } else { MINUTE_MS };
        for &(a, b) in &s.spans {
            let (lo, hi) = (a.max(from), b.min(to.saturating_add(1)));
            if lo >= hi {
                continue;
            }
            let mid_lo = lo.div_euclid(MINUTE_MS) * MINUTE_MS
                + MINUTE_MS * i64::from(lo.rem_euclid(MINUTE_MS) != 0);
            let mid_hi = hi.div_euclid(MINUTE_MS) * MINUTE_MS;
            if mid_lo >= mid_hi {
                self.store
                    .ofu_pieces(tenant, gpu, lo, hi, None, None, &mut take)?;
                continue;
            }
            self.store
                .ofu_pieces(tenant, gpu, lo, mid_lo, None, None, &mut take)?;
            self.store
                .ofu_pieces(tenant, gpu, mid_lo, mid_hi, None, Some(grain), &mut take)?;
            self.store
                .ofu_pieces(tenant, gpu, mid_hi, hi, None, None, &mut take)?;
        }
        if !known {
            return Ok(None);
        }
        self.budget.samples(out.len())?;
        out.sort_by_key(Piece::ts);
        Ok(Some(out))
    }

    /// Whether `s` has a sample in `[from, to]`.
    pub fn has_samples(&self, s: &SeriesRef, from: i64, to: i64) -> Result<bool, QueryError> {
        self.budget.check()?;
        if let Source::Across { members, .. } = &s.source {
            for m in members {
                if self.has_samples(m, from, to)? {
                    return Ok(true);
                }
            }
            return Ok(false);
        }
        for &(a, b) in &s.spans {
            let (lo, hi) = (a.max(from), b.min(to.saturating_add(1)));
            if lo >= hi {
                continue;
            }
            let found = match &s.source {
                Source::Ofu { tenant, gpu, .. } => {
                    let mut any = false;
                    self.store
                        .ofu_pieces(tenant, gpu, lo, hi, None, Some(0), &mut |p| {
                            any |= match p {
                                OfuPiece::Sample(_) => true,
                                OfuPiece::Agg { agg, .. } => agg.count > 0,
                            }
                        })?;
                    any
                }
                Source::Raw {
                    tenant,
                    key,
                    metric,
                    ..
                } => !self
                    .store
                    .series(tenant, key, metric, lo, hi, 1)?
                    .is_empty(),
                Source::Across { .. } => unreachable!("answered above"),
            };
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

/// A piece of an OFU ratio series, for the windowed aggregates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Piece {
    /// One sample: time and value.
    Sample(i64, f64),
    /// A sealed minute or hour starting at `ts`: its samples' count,
    /// unweighted sum, min and max, and its first sample.
    Bucket {
        ts: i64,
        count: u64,
        sum: f64,
        min: f64,
        max: f64,
        first: (i64, f64),
    },
}

impl Piece {
    pub fn ts(&self) -> i64 {
        match *self {
            Self::Sample(ts, _) | Self::Bucket { ts, .. } => ts,
        }
    }
}

/// A column of an OFU sample or aggregate, in the family's unit.
pub(super) fn ofu_column(col: OfuCol, ofu: f64, tensor_active: f64, sm_clock_mhz: f64) -> f64 {
    match col {
        OfuCol::Ofu => ofu,
        OfuCol::Tensor => tensor_active,
        OfuCol::Clock => sm_clock_mhz * 1e6,
    }
}

/// A GPU's labels without job labels ([`crate::series::gpu_labels`]' set).
fn gpu_base(tenant: &str, g: &GpuRecord, hostname: &str) -> Labels {
    vec![
        ("gpu".into(), g.index.to_string()),
        ("UUID".into(), g.uuid.clone()),
        ("modelName".into(), g.model.clone()),
        ("hostname".into(), hostname.to_string()),
        ("node".into(), g.node_id.clone()),
        ("tenant".into(), tenant.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, a: i64, b: i64) -> JobRecord {
        JobRecord {
            job_id: id.into(),
            first_seen_ms: a,
            last_seen_ms: b,
            ..Default::default()
        }
    }

    #[test]
    fn job_segments_cover_the_time_line_once() {
        let (a, b) = (job("a", 100, 199), job("b", 150, 300));
        let s = job_segments(&[&a, &b]);
        assert_eq!(
            s,
            vec![
                (i64::MIN, 100, None),
                (100, 150, Some(0)),
                (150, 301, Some(1)),
                (301, i64::MAX, None),
            ]
        );
        assert_eq!(job_segments(&[]), vec![(i64::MIN, i64::MAX, None)]);
    }
}
