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
use crate::series::{family_of, Labels, On, JOB_LABELS};
use crate::store::index::{Field, GpuView, IndexRead, JobEntry};
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

/// Job spans of one GPU from its jobs' times (first and last seen, ms):
/// constant-owner pieces of the time line, with the index of the owning
/// job (or `None`).
pub(super) fn job_segments(jobs: &[(i64, i64)]) -> Vec<(i64, i64, Option<usize>)> {
    let mut cuts = vec![i64::MIN, i64::MAX];
    for &(first, last) in jobs {
        cuts.push(first);
        cuts.push(last.saturating_add(1));
    }
    cuts.sort_unstable();
    cuts.dedup();
    let owner = |t: i64| {
        jobs.iter()
            .enumerate()
            .filter(|(_, j)| j.0 <= t && t <= j.1)
            .max_by_key(|(_, j)| j.0)
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

/// A catalog metric's family name and scale, per metric name, where the
/// selector wants the family.
type FamilyCache = HashMap<String, Option<(String, f64)>>;

fn family_cached(
    cache: &mut FamilyCache,
    metric: &str,
    on: On,
    wants: &dyn Fn(&str) -> bool,
) -> Option<(String, f64)> {
    if let Some(f) = cache.get(metric) {
        return f.clone();
    }
    let f = family_of(metric, on)
        .map(|f| (f.sample_name(), f.scale))
        .filter(|(n, _)| wants(n));
    cache.insert(metric.to_string(), f.clone());
    f
}

/// The families of GPU series a selector may want, decided once per
/// selector rather than per GPU.
struct Wanted {
    ofu: Vec<(&'static str, OfuCol)>,
    ledger: Vec<(&'static str, LedgerCol)>,
    /// Whether a raw metric's family (`flopwatch_gpu_…`) can match.
    raw: bool,
}

impl Wanted {
    fn new(name: Option<&Matcher>) -> Self {
        let wants = |family: &str| name.is_none_or(|x| x.is_match(family));
        Self {
            ofu: OFU_FAMILIES
                .iter()
                .filter(|f| wants(f.0))
                .copied()
                .collect(),
            ledger: LEDGER_FAMILIES
                .iter()
                .filter(|f| wants(f.0))
                .copied()
                .collect(),
            raw: name.is_none_or(|x| {
                !matches!(x.op, MatchOp::Equal) || x.value.starts_with(GPU_FAMILY_PREFIX)
            }),
        }
    }
}

/// What every raw GPU family's name starts with ([`crate::series::family`]).
const GPU_FAMILY_PREFIX: &str = "flopwatch_gpu_";

/// One owner of a GPU's samples (a job, or none) in [`Model::gpu_series`]:
/// its labels, borrowed from the index, and its spans.
struct Owner<'e> {
    job: Option<usize>,
    /// Sorted by name, empty values left out, no `__name__`.
    labels: Vec<(&'e str, &'e str)>,
    spans: Vec<(i64, i64)>,
}

/// A GPU's labels `base` and those of its job `j`, sorted by name, empty
/// values left out: an [`Owner`]'s.
fn owner_labels<'e>(
    base: &[(&'e str, &'e str)],
    j: Option<&'e JobEntry>,
) -> Vec<(&'e str, &'e str)> {
    let mut l = base.to_vec();
    if let Some(j) = j {
        let values = [&j.job_id, &j.pod, &j.namespace, &j.container, &j.hpc_job];
        l.extend(JOB_LABELS.into_iter().zip(values.map(String::as_str)));
    }
    l.retain(|(_, v)| !v.is_empty());
    l.sort_unstable();
    l
}

/// Whether the matchers accept a series of family `name` with labels `l`
/// (sorted by name, without `__name__`; a label not there is "").
fn matches_named(m: &[Matcher], l: &[(&str, &str)], name: &str) -> bool {
    m.iter().all(|x| {
        let v = if x.name == "__name__" {
            name
        } else {
            l.binary_search_by(|(k, _)| (*k).cmp(x.name.as_str()))
                .map_or("", |i| l[i].1)
        };
        x.is_match(v)
    })
}

/// Labels `l` (sorted by name, without `__name__`) and the name `name`,
/// owned and in order.
fn owned_named(l: &[(&str, &str)], name: &str) -> Labels {
    let at = l.partition_point(|(k, _)| *k < "__name__");
    let mut out = Vec::with_capacity(l.len() + 1);
    out.extend(l[..at].iter().map(|(k, v)| (k.to_string(), v.to_string())));
    out.push(("__name__".to_string(), name.to_string()));
    out.extend(l[at..].iter().map(|(k, v)| (k.to_string(), v.to_string())));
    out
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
        // GPU series: the OFU columns, the ledger's and the raw families.
        let wanted = Wanted::new(name);
        let gpu_families = !wanted.ofu.is_empty() || !wanted.ledger.is_empty() || wanted.raw;
        for tenant in self.tenants(&index, m).into_iter().filter(|_| gpu_families) {
            let mut gpus = self.candidates(&index, tenant, m, None).unwrap_or_default();
            if wanted.ofu.is_empty() && wanted.ledger.is_empty() {
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
                self.gpu_series(&index, tenant, g, &wanted, &wants, m, &mut cache, &mut out)?;
            }
        }
        for tenant in self.tenants(&index, m) {
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
    /// owner (the GPU's labels plus the job's), each with its spans. An
    /// OFU series none of whose spans can hold a sample (all outside the
    /// GPU's OFU bounds, [`crate::store::Store::ofu_bounds`]) has no
    /// sample at all, and is no series. Labels are matched borrowed from
    /// the index, and owned only by the series selected.
    #[allow(clippy::too_many_arguments)]
    fn gpu_series(
        &self,
        index: &IndexRead,
        tenant: &str,
        g: GpuView,
        wanted: &Wanted,
        wants: &dyn Fn(&str) -> bool,
        m: &[Matcher],
        cache: &mut FamilyCache,
        out: &mut Vec<SeriesRef>,
    ) -> Result<(), QueryError> {
        let e = g.entry;
        let seen: Vec<(i64, i64)> = e.jobs.iter().map(|j| j.seen()).collect();
        let gpu_index = e.index.to_string();
        let base: [(&str, &str); 6] = [
            ("gpu", &gpu_index),
            ("UUID", &e.uuid),
            ("modelName", &e.model),
            ("hostname", g.hostname),
            ("node", &e.node),
            ("tenant", tenant),
        ];
        // One label set per owner (the GPU's, plus the job's), sorted by
        // name, empty values left out, `__name__` not yet in; and its
        // spans.
        let mut owners: Vec<Owner> = Vec::new();
        for (a, b, o) in job_segments(&seen) {
            match owners.iter_mut().find(|x| x.job == o) {
                Some(at) => at.spans.push((a, b)),
                None => owners.push(Owner {
                    job: o,
                    labels: owner_labels(&base, o.map(|j| &e.jobs[j])),
                    spans: vec![(a, b)],
                }),
            }
        }
        let mut families: Vec<(String, Source)> = wanted
            .ofu
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
        if wanted.raw {
            for metric in index.metrics(tenant, &e.uuid) {
                if let Some((n, scale)) = family_cached(cache, metric, On::Gpu, wants) {
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
        if !wanted.ledger.is_empty() {
            let peak_flops = self
                .specs
                .and_then(|s| s.lookup(&e.model))
                .and_then(|s| s.peak_tflops(flopwatch_config::Precision::Fp16))
                .unwrap_or(0.0)
                * 1e12;
            for j in &e.jobs {
                let job = j.record(&e.uuid, &e.node);
                let l = owner_labels(&base, Some(j));
                for &(n, col) in &wanted.ledger {
                    if matches_named(m, &l, n) {
                        self.budget.series(1)?;
                        out.push(SeriesRef {
                            labels: owned_named(&l, n),
                            source: Source::Ledger {
                                tenant: tenant.to_string(),
                                job: Box::new(job.clone()),
                                col,
                                peak_flops,
                            },
                            spans: vec![(i64::MIN, i64::MAX)],
                        });
                    }
                }
            }
        }
        // No OFU sample of the GPU lies before its first bound or after
        // its last: its OFU series' spans start at the first at the
        // earliest (the lookback before its first job, where its series
        // outside every job has no sample, is known empty without a
        // read), and a span starting after the last holds none.
        let (ofu_from, ofu_to) = if wanted.ofu.is_empty() {
            (i64::MIN, i64::MAX)
        } else {
            self.store.ofu_bounds(tenant, e)?
        };
        let ofu_spans: Vec<Vec<(i64, i64)>> = owners
            .iter()
            .map(|o| {
                o.spans
                    .iter()
                    .map(|&(a, b)| (a.max(ofu_from), b))
                    .filter(|&(a, b)| a < b && a <= ofu_to)
                    .collect()
            })
            .collect();
        for (n, source) in families {
            for (k, o) in owners.iter().enumerate() {
                let spans = match source {
                    Source::Ofu { .. } if ofu_spans[k].is_empty() => continue,
                    Source::Ofu { .. } => &ofu_spans[k],
                    _ => &o.spans,
                };
                if matches_named(m, &o.labels, &n) {
                    self.budget.series(1)?;
                    out.push(SeriesRef {
                        labels: owned_named(&o.labels, &n),
                        source: source.clone(),
                        spans: spans.clone(),
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
                    let Some((f, scale)) = family_cached(cache, metric, On::Device, wants) else {
                        continue;
                    };
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

    #[test]
    fn job_segments_cover_the_time_line_once() {
        let s = job_segments(&[(100, 199), (150, 300)]);
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
