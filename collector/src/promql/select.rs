//! Selection: the series a selector's matchers pick, found through the
//! store's index ([`crate::store::index`]) so that the work grows with the
//! series selected, not with the fleet: each matcher that rejects an empty
//! value narrows the GPUs to those with a matching value of its label
//! (`UUID`, `gpu`, `modelName`, `node`, `hostname`, the job labels; the
//! metric name through the metrics each GPU has), and only those GPUs'
//! series are labelled and matched. No record is read or decoded.
//!
//! The derived node and job series take their GPUs through the matchers
//! on the labels they carry (`tenant`, `node`, `hostname`; `tenant`,
//! `job_id`) alone.

use super::derived::{Across, JOB_GPUS, JOB_OFU, NODE_OFU};
use super::model::{matches, LedgerCol, Model, OfuCol, SeriesRef, Source};
use super::syntax::label;
use super::QueryError;
use crate::series::{family_of, push_job_labels, Labels, On};
use crate::store::index::{Field, GpuView, IndexRead};
use crate::store::JobRecord;
use promql_parser::label::{MatchOp, Matcher};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The families of the OFU columns.
pub(super) const OFU_FAMILIES: [(&str, OfuCol); 3] = [
    ("flopwatch_ofu_ratio", OfuCol::Ofu),
    ("flopwatch_ofu_tensor_active_ratio", OfuCol::Tensor),
    ("flopwatch_ofu_sm_clock_hertz", OfuCol::Clock),
];

/// The ledger's counters (docs/LEDGER.md): one series per job and GPU,
/// labelled as the GPU's series under that job.
pub(super) const LEDGER_FAMILIES: [(&str, LedgerCol); 5] = [
    ("flopwatch_ledger_held_seconds_total", LedgerCol::Held),
    ("flopwatch_ledger_idle_seconds_total", LedgerCol::Idle),
    (
        "flopwatch_ledger_delivered_flop_total",
        LedgerCol::Delivered,
    ),
    ("flopwatch_ledger_unused_flop_total", LedgerCol::Unused),
    ("flopwatch_ledger_energy_joules_total", LedgerCol::Energy),
];

/// The index field a GPU label is selected by.
fn field_of(label: &str) -> Option<Field> {
    Some(match label {
        "UUID" => Field::Uuid,
        "gpu" => Field::Index,
        "modelName" => Field::Model,
        "node" => Field::Node,
        "hostname" => Field::Hostname,
        "job_id" => Field::JobId,
        "pod" => Field::Pod,
        "namespace" => Field::Namespace,
        "container" => Field::Container,
        "hpc_job" => Field::HpcJob,
        _ => return None,
    })
}

/// Job spans of one GPU: constant-owner pieces of the time line, with the
/// index of the owning job record (or `None`).
pub(super) fn job_segments(jobs: &[JobRecord]) -> Vec<(i64, i64, Option<usize>)> {
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

/// The labels of a node device's series.
const DEVICE_LABELS: [&str; 6] = ["kind", "device", "device_id", "hostname", "node", "tenant"];

/// Whether every matcher on a label outside `labels` (and the name)
/// accepts a series without that label.
fn only_on(m: &[Matcher], labels: &[&str]) -> bool {
    m.iter()
        .all(|x| x.name == "__name__" || labels.contains(&x.name.as_str()) || x.is_match(""))
}

/// Every family a node device's series may have.
fn device_families() -> &'static [String] {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        flopwatch_proto::metrics::CATALOG
            .iter()
            .filter_map(|d| crate::series::family(d, On::Device))
            .map(|f| f.sample_name())
            .collect()
    })
}

/// A catalog metric's family name and scale, per metric name.
type FamilyCache = HashMap<String, Option<(String, f64)>>;

fn family_cached(cache: &mut FamilyCache, metric: &str, on: On) -> Option<(String, f64)> {
    cache
        .entry(metric.to_string())
        .or_insert_with(|| family_of(metric, on).map(|f| (f.sample_name(), f.scale)))
        .clone()
}

impl Model<'_> {
    /// The tenants this scope reads that a `tenant` matcher admits.
    fn tenants<'i>(&self, index: &'i IndexRead, m: &[Matcher]) -> Vec<&'i str> {
        index
            .tenants()
            .into_iter()
            .filter(|t| self.scope.allows(t))
            .filter(|t| {
                m.iter()
                    .filter(|x| x.name == "tenant")
                    .all(|x| x.is_match(t))
            })
            .collect()
    }

    /// The GPUs of `tenant` the matchers on labels in `on` (all GPU labels
    /// when `None`) leave; `None` when a matcher needs a label no GPU
    /// series has.
    fn candidates(
        &self,
        index: &IndexRead,
        tenant: &str,
        m: &[Matcher],
        on: Option<&[&str]>,
    ) -> Option<BTreeSet<u32>> {
        let mut set: Option<BTreeSet<u32>> = None;
        for x in m {
            if x.name == "tenant" || x.name == "__name__" || x.is_match("") {
                continue;
            }
            if on.is_some_and(|on| !on.contains(&x.name.as_str())) {
                continue;
            }
            let f = field_of(&x.name)?;
            let ids = if matches!(x.op, MatchOp::Equal) {
                index.gpus_with(tenant, f, &x.value)
            } else {
                index.gpus_where(tenant, f, &|v| x.is_match(v))
            };
            set = Some(match set {
                None => ids,
                Some(s) => s.intersection(&ids).copied().collect(),
            });
        }
        Some(set.unwrap_or_else(|| index.all_gpus(tenant)))
    }

    /// Every series whose labels satisfy `m` (no samples read): this
    /// collector's and, in a cluster, the peers' ([`super::peers`]), then
    /// the derived node and job series over both.
    pub(super) fn select(&self, m: &[Matcher]) -> Result<Vec<SeriesRef>, QueryError> {
        let mut out = self.select_base(m)?;
        if !self.base_only {
            self.select_derived(m, &mut out)?;
        }
        out.sort_by(|a, b| a.labels.cmp(&b.labels));
        Ok(out)
    }

    /// The stored series `m` selects, this collector's and the peers',
    /// one per label set.
    fn select_base(&self, m: &[Matcher]) -> Result<Vec<SeriesRef>, QueryError> {
        let index = self.store.index()?;
        let name = m.iter().find(|x| x.name == "__name__");
        let wants = |family: &str| name.is_none_or(|x| x.is_match(family));
        let mut out = Vec::new();
        let mut cache = FamilyCache::new();
        for tenant in self.tenants(&index, m) {
            // GPU series: the OFU columns and the raw families.
            let ofu: Vec<(&str, OfuCol)> = OFU_FAMILIES
                .iter()
                .filter(|f| wants(f.0))
                .copied()
                .collect();
            let mut gpus = self.candidates(&index, tenant, m, None).unwrap_or_default();
            let ledger = LEDGER_FAMILIES.iter().any(|f| wants(f.0));
            if ofu.is_empty() && !ledger {
                // Only GPUs with a raw metric of a wanted family.
                let with = index.gpus_where(tenant, Field::Metric, &|metric| {
                    family_of(metric, On::Gpu).is_some_and(|f| wants(&f.sample_name()))
                });
                gpus = gpus.intersection(&with).copied().collect();
            }
            for id in gpus {
                self.budget.check()?;
                let Some(g) = index.gpu(tenant, id) else {
                    continue;
                };
                self.gpu_series(&index, tenant, g, &ofu, &wants, m, &mut cache, &mut out)?;
            }
            if device_families().iter().any(|f| wants(f)) && only_on(m, &DEVICE_LABELS) {
                self.device_series(&index, tenant, m, &wants, &mut cache, &mut out)?;
            }
        }
        let Some(remote) = self.remote else {
            return Ok(out);
        };
        // The peers' series; a label set on two collectors is one series.
        let mut by_labels: BTreeMap<Labels, Vec<SeriesRef>> = BTreeMap::new();
        for s in out {
            by_labels.entry(s.labels.clone()).or_default().push(s);
        }
        for (labels, points) in &remote.series {
            let tenant = labels
                .iter()
                .find(|(k, _)| k == "tenant")
                .map_or("", |(_, v)| v.as_str());
            if !self.scope.allows(tenant) || !matches(m, labels) {
                continue;
            }
            self.budget.series(1)?;
            by_labels
                .entry(labels.clone())
                .or_default()
                .push(SeriesRef {
                    labels: labels.clone(),
                    source: Source::Loaded(points.clone()),
                    spans: vec![(i64::MIN, i64::MAX)],
                });
        }
        Ok(by_labels
            .into_iter()
            .map(|(labels, mut parts)| {
                if parts.len() == 1 {
                    parts.remove(0)
                } else {
                    SeriesRef {
                        labels,
                        source: Source::Union(parts),
                        spans: vec![(i64::MIN, i64::MAX)],
                    }
                }
            })
            .collect())
    }

    /// The node and job series `m` selects, derived from the OFU ratio
    /// series of their GPUs (a GPU's series of several jobs, or on several
    /// collectors, together one member).
    fn select_derived(&self, m: &[Matcher], out: &mut Vec<SeriesRef>) -> Result<(), QueryError> {
        let name = m.iter().find(|x| x.name == "__name__");
        let wants = |family: &str| name.is_none_or(|x| x.is_match(family));
        let families: [(&[&str], &[&str]); 2] = [
            (&[NODE_OFU], &["tenant", "node", "hostname"]),
            (&[JOB_OFU, JOB_GPUS], &["tenant", "job_id"]),
        ];
        for (names, keys) in families {
            if !names.iter().any(|n| wants(n)) || !only_on(m, keys) {
                continue;
            }
            let mut mm: Vec<Matcher> = m
                .iter()
                .filter(|x| keys.contains(&x.name.as_str()))
                .cloned()
                .collect();
            mm.push(Matcher::new(MatchOp::Equal, "__name__", OFU_FAMILIES[0].0));
            // Label set of the derived series → the GPU's parts.
            let mut groups: BTreeMap<Labels, BTreeMap<String, Vec<SeriesRef>>> = BTreeMap::new();
            for s in self.select_base(&mm)? {
                let key: Labels = keys
                    .iter()
                    .map(|k| (k.to_string(), label(&s.labels, k).to_string()))
                    .collect();
                if key.iter().any(|(_, v)| v.is_empty()) {
                    continue;
                }
                let uuid = label(&s.labels, "UUID").to_string();
                groups
                    .entry(key)
                    .or_default()
                    .entry(uuid)
                    .or_default()
                    .push(s);
            }
            for (key, gpus) in groups {
                let members: Vec<SeriesRef> = gpus
                    .into_values()
                    .map(|mut parts| {
                        if parts.len() == 1 {
                            parts.remove(0)
                        } else {
                            SeriesRef {
                                labels: Vec::new(),
                                source: Source::Union(parts),
                                spans: vec![(i64::MIN, i64::MAX)],
                            }
                        }
                    })
                    .collect();
                for (n, op) in names
                    .iter()
                    .zip([Across::Mean, Across::Count])
                    .filter(|(n, _)| wants(n))
                {
                    let mut l = key.clone();
                    l.push(("__name__".into(), n.to_string()));
                    let labels = sorted(l);
                    if matches(m, &labels) {
                        self.budget.series(1)?;
                        out.push(SeriesRef {
                            labels,
                            source: Source::Across {
                                members: members.clone(),
                                op,
                            },
                            spans: vec![(i64::MIN, i64::MAX)],
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// GPU `g`'s series of the wanted families: one per family and job
    /// owner (the GPU's labels plus the job's), each with its spans.
    #[allow(clippy::too_many_arguments)]
    fn gpu_series(
        &self,
        index: &IndexRead,
        tenant: &str,
        g: GpuView,
        ofu: &[(&str, OfuCol)],
        wants: &dyn Fn(&str) -> bool,
        m: &[Matcher],
        cache: &mut FamilyCache,
        out: &mut Vec<SeriesRef>,
    ) -> Result<(), QueryError> {
        let e = g.entry;
        let jobs: Vec<JobRecord> = e.jobs.iter().map(|j| j.record(&e.uuid, &e.node)).collect();
        let base = vec![
            ("gpu".to_string(), e.index.to_string()),
            ("UUID".to_string(), e.uuid.clone()),
            ("modelName".to_string(), e.model.clone()),
            ("hostname".to_string(), g.hostname.to_string()),
            ("node".to_string(), e.node.clone()),
            ("tenant".to_string(), tenant.to_string()),
        ];
        // One label set per owner: the GPU's, plus the job's.
        let mut owners: Vec<(Labels, Vec<(i64, i64)>)> = Vec::new();
        let mut seen: HashMap<Option<usize>, usize> = HashMap::new();
        for (a, b, o) in job_segments(&jobs) {
            let i = *seen.entry(o).or_insert_with(|| {
                let mut l = base.clone();
                if let Some(j) = o {
                    let j = &jobs[j];
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
        let mut families: Vec<(String, Source)> = ofu
            .iter()
            .map(|&(n, col)| {
                (
                    n.to_string(),
                    Source::Ofu {
                        tenant: tenant.to_string(),
                        gpu: e.uuid.clone(),
                        col,
                    },
                )
            })
            .collect();
        for metric in index.metrics(tenant, &e.uuid) {
            if let Some((n, scale)) = family_cached(cache, metric, On::Gpu) {
                if wants(&n) {
                    families.push((
                        n,
                        Source::Raw {
                            tenant: tenant.to_string(),
                            key: e.uuid.clone(),
                            metric: metric.to_string(),
                            scale,
                        },
                    ));
                }
            }
        }
        // The ledger's counters, one per job record of the GPU.
        let ledger: Vec<_> = LEDGER_FAMILIES.iter().filter(|f| wants(f.0)).collect();
        if !ledger.is_empty() {
            let peak_flops = self
                .specs
                .and_then(|s| s.lookup(&e.model))
                .and_then(|s| s.peak_tflops(flopwatch_config::Precision::Fp16))
                .unwrap_or(0.0)
                * 1e12;
            for j in &jobs {
                let mut l = base.clone();
                push_job_labels(
                    &mut l,
                    [&j.job_id, &j.pod, &j.namespace, &j.container, &j.hpc_job],
                );
                for &&(n, col) in &ledger {
                    let mut labels = l.clone();
                    labels.push(("__name__".into(), n.to_string()));
                    let labels = sorted(labels);
                    if matches(m, &labels) {
                        self.budget.series(1)?;
                        out.push(SeriesRef {
                            labels,
                            source: Source::Ledger {
                                tenant: tenant.to_string(),
                                job: Box::new(j.clone()),
                                col,
                                peak_flops,
                            },
                            spans: vec![(i64::MIN, i64::MAX)],
                        });
                    }
                }
            }
        }
        // No OFU sample of the GPU lies before `ofu_from`: its OFU series'
        // spans start there at the earliest, so the lookback before its
        // first job, where its series outside every job has no sample, is
        // known to be empty without a read.
        let ofu_from = if ofu.is_empty() {
            i64::MIN
        } else {
            self.store.ofu_bounds(tenant, e)?.0
        };
        let ofu_spans: Vec<Vec<(i64, i64)>> = owners
            .iter()
            .map(|(_, spans)| {
                spans
                    .iter()
                    .map(|&(a, b)| (a.max(ofu_from), b))
                    .filter(|&(a, b)| a < b)
                    .collect()
            })
            .collect();
        for (n, source) in families {
            for (k, (l, spans)) in owners.iter().enumerate() {
                let mut labels = l.clone();
                labels.push(("__name__".into(), n.clone()));
                let labels = sorted(labels);
                if matches(m, &labels) {
                    self.budget.series(1)?;
                    let spans = match source {
                        Source::Ofu { .. } => ofu_spans[k].clone(),
                        _ => spans.clone(),
                    };
                    out.push(SeriesRef {
                        labels,
                        source: source.clone(),
                        spans,
                    });
                }
            }
        }
        Ok(())
    }

    /// The node devices' series of `tenant` that `m` selects.
    fn device_series(
        &self,
        index: &IndexRead,
        tenant: &str,
        m: &[Matcher],
        wants: &dyn Fn(&str) -> bool,
        cache: &mut FamilyCache,
        out: &mut Vec<SeriesRef>,
    ) -> Result<(), QueryError> {
        let Some(t) = index.tenant(tenant) else {
            return Ok(());
        };
        for (node, n) in &t.nodes {
            let node_ok = m
                .iter()
                .filter(|x| x.name == "node" || x.name == "hostname")
                .all(|x| x.is_match(if x.name == "node" { node } else { &n.hostname }));
            if !node_ok {
                continue;
            }
            for d in &n.devices {
                for metric in index.metrics(tenant, &d.id) {
                    let Some((f, scale)) = family_cached(cache, metric, On::Device) else {
                        continue;
                    };
                    if !wants(&f) {
                        continue;
                    }
                    let labels = sorted(vec![
                        ("__name__".into(), f),
                        ("kind".into(), d.kind.clone()),
                        ("device".into(), d.name.clone()),
                        ("device_id".into(), d.id.clone()),
                        ("hostname".into(), n.hostname.clone()),
                        ("node".into(), node.clone()),
                        ("tenant".into(), tenant.to_string()),
                    ]);
                    if matches(m, &labels) {
                        self.budget.series(1)?;
                        out.push(SeriesRef {
                            labels,
                            source: Source::Raw {
                                tenant: tenant.to_string(),
                                key: d.id.clone(),
                                metric: metric.to_string(),
                                scale,
                            },
                            spans: vec![(i64::MIN, i64::MAX)],
                        });
                    }
                }
            }
        }
        Ok(())
    }
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
        let s = job_segments(&[a, b]);
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
