//! SVG plots for the report (plotters, SVG backend only: no fonts or
//! system libraries needed).

use std::path::Path;

use plotters::prelude::*;

use crate::pipeline::{ExamplePair, Selection};
use crate::SelectError;

/// File names (relative to the report directory) of what was drawn.
#[derive(Debug, Clone, Default)]
pub struct Plots {
    /// Distance heatmap, ordered by group.
    pub heatmap: Option<String>,
    /// Sizes of the multi-member groups.
    pub groups: Option<String>,
    /// One file per example pair, in `details.examples` order.
    pub pairs: Vec<String>,
}

/// Above this many candidates the heatmap shows blocks (max of each block).
const HEATMAP_MAX_CELLS: usize = 150;
/// Above this many candidates the heatmap has no per-metric labels.
const HEATMAP_MAX_LABELS: usize = 60;
/// Bars in the group chart.
const GROUP_CHART_MAX: usize = 40;

/// Draw every plot into `dir`.
pub fn draw_all(selection: &Selection, dir: &Path) -> Result<Plots, SelectError> {
    let mut plots = Plots::default();
    if !selection.details.candidates.is_empty() {
        let name = "heatmap.svg";
        heatmap(selection, &dir.join(name))?;
        plots.heatmap = Some(name.to_owned());
    }
    if selection.groups.iter().any(|g| g.members.len() > 1) {
        let name = "groups.svg";
        group_chart(selection, &dir.join(name))?;
        plots.groups = Some(name.to_owned());
    }
    for (i, pair) in selection.details.examples.iter().enumerate() {
        let name = format!("pair-{}.svg", i + 1);
        pair_chart(
            pair,
            selection.details.options.distance_threshold,
            &dir.join(&name),
        )?;
        plots.pairs.push(name);
    }
    Ok(plots)
}

/// Candidate indices ordered by group (largest groups first, each group's
/// representative first), and each group's span of positions in that order.
pub(crate) fn cluster_order(selection: &Selection) -> (Vec<usize>, Vec<(usize, usize)>) {
    let names = &selection.details.candidates;
    let index = |n: &String| names.binary_search(n).ok();
    let mut groups: Vec<_> = selection.groups.iter().collect();
    groups.sort_by(|a, b| {
        b.members
            .len()
            .cmp(&a.members.len())
            .then_with(|| a.representative.cmp(&b.representative))
    });
    let mut order = Vec::with_capacity(names.len());
    let mut spans = Vec::with_capacity(groups.len());
    for g in groups {
        let start = order.len();
        order.extend(index(&g.representative));
        order.extend(
            g.members
                .iter()
                .filter(|m| **m != g.representative)
                .filter_map(index),
        );
        if order.len() > start {
            spans.push((start, order.len()));
        }
    }
    (order, spans)
}

/// Blue under the threshold (darker = closer), grey to white above it.
fn distance_color(d: f64, threshold: f64) -> RGBColor {
    if !d.is_finite() {
        return RGBColor(255, 240, 240);
    }
    if d < threshold {
        let f = d / threshold;
        let lerp = |a: f64, b: f64| (a + (b - a) * f) as u8;
        RGBColor(lerp(8.0, 158.0), lerp(48.0, 202.0), lerp(107.0, 225.0))
    } else {
        let f = ((d - threshold) / (1.0 - threshold).max(1e-9)).clamp(0.0, 1.0);
        let g = (150.0 + 105.0 * f.sqrt()) as u8;
        RGBColor(g, g, g)
    }
}

fn draw_err(path: &Path) -> impl Fn(String) -> SelectError + '_ {
    move |e| SelectError::output(path, e)
}

fn heatmap(selection: &Selection, path: &Path) -> Result<(), SelectError> {
    let err = draw_err(path);
    let d = &selection.details;
    let (order, spans) = cluster_order(selection);
    let n = order.len();
    // One band per metric when small; else one per group (exact about the
    // grouping, in-group bands are all under the threshold); else uniform
    // blocks. A band pair's colour is the max distance between their members.
    let (bands, caption) = if n <= HEATMAP_MAX_CELLS {
        (
            (0..n).map(|i| (i, i + 1)).collect::<Vec<_>>(),
            "max RMS distance over workloads (ordered by group)".to_owned(),
        )
    } else if spans.len() <= HEATMAP_MAX_CELLS {
        (
            spans,
            "max RMS distance over workloads (one band per group, max)".to_owned(),
        )
    } else {
        let block = n.div_ceil(HEATMAP_MAX_CELLS);
        (
            (0..n)
                .step_by(block)
                .map(|i| (i, (i + block).min(n)))
                .collect(),
            format!("max RMS distance over workloads ({block}×{block} blocks, max)"),
        )
    };
    let labels = n <= HEATMAP_MAX_LABELS;
    let longest = d.candidates.iter().map(|s| s.len()).max().unwrap_or(0);
    let label_px = if labels {
        (longest * 7 + 10).min(300) as u32
    } else {
        40
    };
    let side = (n as u32 * 12).clamp(300, 1200);
    let size = (side + label_px + 40, side + 80);

    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    // plotters' integer ranges are inclusive: `0..n - 1` is `n` segments.
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(20)
        .y_label_area_size(label_px)
        .build_cartesian_2d((0..n - 1).into_segmented(), (0..n - 1).into_segmented())
        .map_err(|e| err(e.to_string()))?;
    // Position `i` of the order is drawn at y = n-1-i so the first group is on top.
    let name_at = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(y) if labels && *y < n => d.candidates[order[n - 1 - *y]].clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(1)
        .x_label_formatter(&|_| String::new())
        .y_labels(if labels { n } else { 1 })
        .y_label_formatter(&name_at)
        .y_label_style(("sans-serif", 11))
        .draw()
        .map_err(|e| err(e.to_string()))?;

    let threshold = d.options.distance_threshold;
    let mut rects = Vec::with_capacity(bands.len() * bands.len());
    for &(r0, r1) in &bands {
        for &(c0, c1) in &bands {
            let mut v = 0.0f64;
            for &i in &order[r0..r1] {
                for &j in &order[c0..c1] {
                    v = v.max(d.distance[[i, j]]);
                }
            }
            rects.push(Rectangle::new(
                [
                    (SegmentValue::Exact(c0), SegmentValue::Exact(n - r1)),
                    (SegmentValue::Exact(c1), SegmentValue::Exact(n - r0)),
                ],
                distance_color(v, threshold).filled(),
            ));
        }
    }
    chart.draw_series(rects).map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

fn group_chart(selection: &Selection, path: &Path) -> Result<(), SelectError> {
    let err = draw_err(path);
    let mut groups: Vec<_> = selection
        .groups
        .iter()
        .filter(|g| g.members.len() > 1)
        .collect();
    groups.sort_by(|a, b| {
        b.members
            .len()
            .cmp(&a.members.len())
            .then_with(|| a.representative.cmp(&b.representative))
    });
    groups.truncate(GROUP_CHART_MAX);
    let n = groups.len();
    let max = groups.iter().map(|g| g.members.len()).max().unwrap_or(1);
    let longest = groups
        .iter()
        .map(|g| g.representative.len())
        .max()
        .unwrap_or(0);
    let label_px = (longest * 7 + 10).min(300) as u32;
    let height = (90 + 24 * n as u32).max(200);
    let root = SVGBackend::new(path, (label_px + 600, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "redundant-metric groups (members per representative)",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(label_px)
        .build_cartesian_2d(0..max + 1, (0..n - 1).into_segmented())
        .map_err(|e| err(e.to_string()))?;
    // Largest group on top: group i is drawn at y = n-1-i.
    let label = |v: &SegmentValue<usize>| match v {
        SegmentValue::CenterOf(y) if *y < n => groups[n - 1 - *y].representative.clone(),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n)
        .y_label_formatter(&label)
        .y_label_style(("sans-serif", 12))
        .x_labels((max + 2).min(12))
        .x_label_style(("sans-serif", 12))
        .x_desc("members")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(groups.iter().enumerate().map(|(i, g)| {
            let y = n - 1 - i;
            Rectangle::new(
                [
                    (0, SegmentValue::Exact(y)),
                    (g.members.len(), SegmentValue::Exact(y + 1)),
                ],
                BLUE.mix(0.6).filled(),
            )
        }))
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}

fn pair_chart(pair: &ExamplePair, threshold: f64, path: &Path) -> Result<(), SelectError> {
    let err = draw_err(path);
    let root = SVGBackend::new(path, (900, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let verdict = if pair.grouped {
        "grouped"
    } else {
        "kept apart"
    };
    let t_end = pair.t_ms.last().copied().unwrap_or(0).max(1) as f64 / 1000.0;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{} vs {} in {}: RMS distance {:.4} (threshold {threshold}) — {verdict}",
                pair.a, pair.b, pair.workload, pair.distance
            ),
            ("sans-serif", 14),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(45)
        .build_cartesian_2d(0.0..t_end, -0.05..1.3)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("seconds since grid start")
        .y_desc("normalized value")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    let secs = |t: i64| t as f64 / 1000.0;
    for (name, values, color) in [
        (&pair.a, &pair.a_values, BLUE),
        (&pair.b, &pair.b_values, RED),
    ] {
        chart
            .draw_series(LineSeries::new(
                pair.t_ms.iter().zip(values).map(|(&t, &v)| (secs(t), v)),
                color.stroke_width(1),
            ))
            .map_err(|e| err(e.to_string()))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}
