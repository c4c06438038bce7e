//! The selection pipeline: align → variance filter → pairwise distances per
//! workload → max over workloads → complete-linkage groups → representatives.

use indicatif::ProgressBar;
use ndarray::{Array1, Array2, ShapeBuilder};
use serde::Serialize;

use crate::align::{align_into, grid_for, Grid};
use crate::cluster::{complete_linkage, representative};
use crate::distance::{normalize_min_max, pairwise_rms};
use crate::par::par_map;
use crate::samples::{Row, SampleSet, Series};
use crate::variance::relative_variance;
use crate::{SelectError, SelectOptions};

/// A group of redundant metrics and the one kept for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Group {
    /// The metric kept.
    pub representative: String,
    /// All members, representative included, sorted by name.
    pub members: Vec<String>,
}

/// The result of a selection.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Metrics to collect: one per group, sorted by name.
    pub kept: Vec<String>,
    /// Metrics near-constant in every workload (or with under two samples everywhere).
    pub dropped_low_variance: Vec<String>,
    /// Every group (singletons included), sorted by representative.
    pub groups: Vec<Group>,
    /// Everything the report needs to explain the choice.
    pub details: Details,
}

/// Intermediate results, for the report and plots.
#[derive(Debug, Clone)]
pub struct Details {
    /// The options used.
    pub options: SelectOptions,
    /// Workloads, sorted by name.
    pub workloads: Vec<WorkloadInfo>,
    /// All metrics seen, sorted by name.
    pub metrics: Vec<MetricInfo>,
    /// Metrics that passed the variance filter, sorted by name: the row and
    /// column order of `distance` and `per_workload`.
    pub candidates: Vec<String>,
    /// Max over workloads of the RMS distance; `∞` if a pair never shares a workload.
    pub distance: Array2<f64>,
    /// RMS distance per workload (same order as `workloads`); NaN where a
    /// metric is absent.
    pub per_workload: Vec<Array2<f64>>,
    /// Example series pairs for the report's plots.
    pub examples: Vec<ExamplePair>,
}

/// One workload's alignment.
#[derive(Debug, Clone, Serialize)]
pub struct WorkloadInfo {
    /// Workload name.
    pub name: String,
    /// The common grid; `None` if no metric had two samples here.
    pub grid: Option<Grid>,
    /// Metrics with two or more samples here.
    pub metrics_present: usize,
}

/// One metric's variance figures.
#[derive(Debug, Clone, Serialize)]
pub struct MetricInfo {
    /// Metric name.
    pub name: String,
    /// Relative variance per workload (`None` where absent).
    pub variance: Vec<Option<f64>>,
    /// Max of `variance` (0 if absent everywhere); ranks representatives.
    pub max_variance: f64,
    /// Whether it passed the variance filter.
    pub passed_variance: bool,
}

/// Two metrics' normalized series in one workload, for plotting.
#[derive(Debug, Clone, Serialize)]
pub struct ExamplePair {
    /// First metric (a group's representative, or one side of a near miss).
    pub a: String,
    /// Second metric.
    pub b: String,
    /// Workload shown: where their distance is largest.
    pub workload: String,
    /// RMS distance in that workload.
    pub distance: f64,
    /// Whether the two ended up in the same group.
    pub grouped: bool,
    /// Grid times, ms since the grid start (downsampled).
    pub t_ms: Vec<i64>,
    /// `a` normalized to [0, 1].
    pub a_values: Vec<f64>,
    /// `b` normalized to [0, 1].
    pub b_values: Vec<f64>,
}

/// Points kept per example series.
const EXAMPLE_POINTS: usize = 1000;
/// Example pairs drawn from the largest groups.
const EXAMPLE_GROUPS: usize = 3;

/// Select metrics from rows in any order (CSV, a store, a test).
pub fn select<I>(
    rows: I,
    options: &SelectOptions,
    progress: &ProgressBar,
) -> Result<Selection, SelectError>
where
    I: IntoIterator<Item = Row>,
{
    let mut samples = SampleSet::new();
    for row in rows {
        samples.push(&row.workload, &row.metric, row.timestamp_ms, row.value)?;
    }
    select_samples(&mut samples, options, progress)
}

struct Phase1 {
    grid: Option<Grid>,
    /// Relative variance per metric (sorted order); `None` where absent.
    variance: Vec<Option<f64>>,
}

/// Select metrics from an already built [`SampleSet`] (sorted in place).
pub fn select_samples(
    samples: &mut SampleSet,
    options: &SelectOptions,
    progress: &ProgressBar,
) -> Result<Selection, SelectError> {
    options.validate()?;
    if samples.rows() == 0 {
        return Err(SelectError::NoData);
    }
    samples.sort();
    let samples = &*samples;

    let mut workload_order: Vec<usize> = (0..samples.workloads.len()).collect();
    workload_order.sort_by(|&a, &b| samples.workloads[a].name.cmp(&samples.workloads[b].name));
    let mut metric_order: Vec<usize> = (0..samples.metrics.len()).collect();
    metric_order.sort_by(|&a, &b| samples.metrics[a].cmp(&samples.metrics[b]));
    let n_workloads = workload_order.len();

    progress.set_length(2 * n_workloads as u64 + 1);
    progress.set_position(0);
    progress.set_message("aligning, variance");

    // Phase 1: grid and relative variance of every metric in every workload.
    let phase1: Vec<Phase1> = par_map(n_workloads, |wi| {
        let w = workload_order[wi];
        let present: Vec<_> = metric_order
            .iter()
            .map(|&m| samples.series(w, m).filter(|s| s.is_present()))
            .collect();
        let series: Vec<_> = present.iter().flatten().copied().collect();
        let mut variance = vec![None; metric_order.len()];
        if series.is_empty() {
            progress.inc(1);
            return Ok(Phase1 {
                grid: None,
                variance,
            });
        }
        let grid =
            grid_for(&series, options.step_ms, options.max_grid_cells).map_err(|reason| {
                SelectError::Grid {
                    workload: samples.workloads[w].name.clone(),
                    reason,
                }
            })?;
        let mut buf = Array1::zeros(grid.len);
        for (slot, s) in variance.iter_mut().zip(&present) {
            if let Some(s) = s {
                align_into(s, &grid, options.interpolation, buf.view_mut());
                *slot = Some(relative_variance(buf.view()));
            }
        }
        progress.inc(1);
        Ok(Phase1 {
            grid: Some(grid),
            variance,
        })
    })
    .into_iter()
    .collect::<Result<_, SelectError>>()?;

    // Variance filter: drop only what is near-constant everywhere it exists.
    let metrics: Vec<MetricInfo> = metric_order
        .iter()
        .enumerate()
        .map(|(mi, &m)| {
            let variance: Vec<Option<f64>> = phase1.iter().map(|p| p.variance[mi]).collect();
            let max_variance = variance.iter().flatten().fold(0.0f64, |a, &b| a.max(b));
            let passed_variance = variance
                .iter()
                .flatten()
                .any(|&v| v >= options.variance_threshold);
            MetricInfo {
                name: samples.metrics[m].clone(),
                variance,
                max_variance,
                passed_variance,
            }
        })
        .collect();
    let cand: Vec<usize> = (0..metrics.len())
        .filter(|&mi| metrics[mi].passed_variance)
        .collect();
    let k = cand.len();

    // Phase 2: per-workload pairwise distances among candidates.
    progress.set_message("pairwise distances");
    let per_workload: Vec<Array2<f64>> = par_map(n_workloads, |wi| {
        let mut full = Array2::from_elem((k, k), f64::NAN);
        let Some(grid) = phase1[wi].grid else {
            progress.inc(1);
            return full;
        };
        let w = workload_order[wi];
        let here: Vec<usize> = (0..k)
            .filter(|&ci| phase1[wi].variance[cand[ci]].is_some())
            .collect();
        // Column-major so each metric's column is contiguous while aligning.
        let mut m = Array2::<f64>::zeros((grid.len, here.len()).f());
        for (col, &ci) in here.iter().enumerate() {
            let mi = cand[ci];
            let series = samples.series(w, metric_order[mi]);
            let flat = is_flat(phase1[wi].variance[mi], options);
            fill_normalized(series, flat, &grid, options, m.column_mut(col));
        }
        let d = pairwise_rms(m.view());
        drop(m);
        for (a, &ca) in here.iter().enumerate() {
            for (b, &cb) in here.iter().enumerate() {
                full[[ca, cb]] = d[[a, b]];
            }
        }
        progress.inc(1);
        full
    });

    // A pair is only as close as it is in its worst shared workload.
    let mut distance = Array2::from_elem((k, k), f64::NEG_INFINITY);
    for d in &per_workload {
        ndarray::Zip::from(&mut distance)
            .and(d)
            .for_each(|acc, &x| {
                if !x.is_nan() {
                    *acc = acc.max(x);
                }
            });
    }
    distance.mapv_inplace(|d| {
        if d == f64::NEG_INFINITY {
            f64::INFINITY
        } else {
            d
        }
    });
    distance.diag_mut().fill(0.0);

    progress.set_message("clustering");
    let clusters = complete_linkage(&distance, options.distance_threshold)?;
    let candidates: Vec<String> = cand.iter().map(|&mi| metrics[mi].name.clone()).collect();
    let scores: Vec<f64> = cand.iter().map(|&mi| metrics[mi].max_variance).collect();
    let mut groups: Vec<(usize, Vec<usize>)> = clusters
        .into_iter()
        .map(|members| {
            let rep = representative(&members, &candidates, &scores, &options.prefer);
            (rep, members)
        })
        .collect();
    groups.sort_by(|a, b| candidates[a.0].cmp(&candidates[b.0]));
    progress.inc(1);

    let workloads: Vec<WorkloadInfo> = workload_order
        .iter()
        .zip(&phase1)
        .map(|(&w, p)| WorkloadInfo {
            name: samples.workloads[w].name.clone(),
            grid: p.grid,
            metrics_present: p.variance.iter().flatten().count(),
        })
        .collect();

    let examples = pick_examples(&groups, &distance, &per_workload)
        .into_iter()
        .map(|(a, b, wi, grouped)| {
            let grid = phase1[wi]
                .grid
                .expect("examples come from workloads with a grid");
            let w = workload_order[wi];
            let col = |ci: usize| {
                let mi = cand[ci];
                let mut v = Array1::zeros(grid.len);
                let series = samples.series(w, metric_order[mi]);
                let flat = is_flat(phase1[wi].variance[mi], options);
                fill_normalized(series, flat, &grid, options, v.view_mut());
                v
            };
            let (va, vb) = (col(a), col(b));
            let stride = grid.len.div_ceil(EXAMPLE_POINTS).max(1);
            ExamplePair {
                a: candidates[a].clone(),
                b: candidates[b].clone(),
                workload: workloads[wi].name.clone(),
                distance: per_workload[wi][[a, b]],
                grouped,
                t_ms: (0..grid.len)
                    .step_by(stride)
                    .map(|i| grid.step_ms * i as i64)
                    .collect(),
                a_values: va.iter().step_by(stride).copied().collect(),
                b_values: vb.iter().step_by(stride).copied().collect(),
            }
        })
        .collect();

    let dropped_low_variance = metrics
        .iter()
        .filter(|m| !m.passed_variance)
        .map(|m| m.name.clone())
        .collect();
    let mut kept: Vec<String> = groups.iter().map(|g| candidates[g.0].clone()).collect();
    kept.sort();
    let groups = groups
        .into_iter()
        .map(|(rep, members)| Group {
            representative: candidates[rep].clone(),
            members: members.iter().map(|&m| candidates[m].clone()).collect(),
        })
        .collect();

    Ok(Selection {
        kept,
        dropped_low_variance,
        groups,
        details: Details {
            options: options.clone(),
            workloads,
            metrics,
            candidates,
            distance,
            per_workload,
            examples,
        },
    })
}

/// Align `series` into `out` and normalize it to [0, 1]; where it is
/// near-constant in this workload (`flat`) it carries no shape, so it
/// becomes zeros instead of having its jitter stretched to full range.
fn fill_normalized(
    series: Option<&Series>,
    flat: bool,
    grid: &Grid,
    options: &SelectOptions,
    mut out: ndarray::ArrayViewMut1<'_, f64>,
) {
    match series {
        Some(s) if !flat => {
            align_into(s, grid, options.interpolation, out.view_mut());
            normalize_min_max(out);
        }
        _ => out.fill(0.0),
    }
}

/// Near-constant (or absent) in this workload: carries no shape here.
fn is_flat(variance: Option<f64>, options: &SelectOptions) -> bool {
    variance.is_none_or(|v| v < options.variance_threshold)
}

/// Pairs worth plotting: for the largest groups, the representative and its
/// farthest member; plus the closest pair that was *not* grouped. Each is
/// shown in the workload where the pair is farthest apart.
fn pick_examples(
    groups: &[(usize, Vec<usize>)],
    distance: &Array2<f64>,
    per_workload: &[Array2<f64>],
) -> Vec<(usize, usize, usize, bool)> {
    let worst = |a: usize, b: usize| {
        (0..per_workload.len())
            .filter(|&w| !per_workload[w][[a, b]].is_nan())
            .max_by(|&x, &y| per_workload[x][[a, b]].total_cmp(&per_workload[y][[a, b]]))
    };
    let mut multi: Vec<&(usize, Vec<usize>)> = groups.iter().filter(|g| g.1.len() > 1).collect();
    multi.sort_by_key(|g| std::cmp::Reverse(g.1.len()));
    let mut out = Vec::new();
    for (rep, members) in multi.into_iter().take(EXAMPLE_GROUPS) {
        let far = members
            .iter()
            .filter(|&&m| m != *rep)
            .max_by(|&&x, &&y| distance[[*rep, x]].total_cmp(&distance[[*rep, y]]));
        if let Some(&far) = far {
            if let Some(w) = worst(*rep, far) {
                out.push((*rep, far, w, true));
            }
        }
    }
    let mut group_of = vec![0; distance.nrows()];
    for (g, (_, members)) in groups.iter().enumerate() {
        for &m in members {
            group_of[m] = g;
        }
    }
    let mut near_miss: Option<(usize, usize)> = None;
    for a in 0..distance.nrows() {
        for b in a + 1..distance.nrows() {
            if group_of[a] != group_of[b]
                && distance[[a, b]].is_finite()
                && near_miss.is_none_or(|(x, y)| distance[[a, b]] < distance[[x, y]])
            {
                near_miss = Some((a, b));
            }
        }
    }
    if let Some((a, b)) = near_miss {
        if let Some(w) = worst(a, b) {
            out.push((a, b, w, false));
        }
    }
    out
}
