//! `report.md`: what was dropped, what was grouped and how close, and links
//! to the plots.

use std::fmt::Write;

use crate::pipeline::Selection;
use crate::plot::Plots;

fn fmt_d(d: f64) -> String {
    if d.is_finite() {
        format!("{d:.4}")
    } else {
        "n/a (never in the same workload)".to_owned()
    }
}

/// Render the report.
pub fn markdown(selection: &Selection, plots: &Plots) -> String {
    let d = &selection.details;
    let o = &d.options;
    let mut s = String::new();
    let index = |n: &str| d.candidates.binary_search_by(|c| c.as_str().cmp(n)).ok();
    let _ = writeln!(s, "# Metric selection report\n");
    let _ = writeln!(
        s,
        "{} metrics seen in {} workloads; {} dropped as near-constant; {} grouped into {} groups; **{} kept**.\n",
        d.metrics.len(),
        d.workloads.len(),
        selection.dropped_low_variance.len(),
        d.candidates.len(),
        selection.groups.len(),
        selection.kept.len()
    );

    let _ = writeln!(s, "## Method\n");
    let _ = writeln!(
        s,
        "Moneo §2.2. Each workload's metrics are put on a common grid \
         ({} interpolation, step {}). A metric is near-constant in a workload when \
         `Var(x)/max|x|²` < {} and is dropped only if that holds in every workload. \
         Distances are Moneo eq. 1 on min-max normalized series, in RMS form (÷√T, range 0..1); \
         two metrics are redundant when that distance is < {} in **every** workload where both exist \
         (the pair distance is the max over workloads), grouped by complete linkage \
         (linfa-hierarchical) so every pair in a group is under the threshold. \
         Representatives: preference list ({}) first, then highest relative variance, then name.\n",
        o.interpolation,
        o.step_ms
            .map_or("= median sampling step per workload".to_owned(), |s| format!("{s} ms")),
        o.variance_threshold,
        o.distance_threshold,
        if o.prefer.is_empty() {
            "empty".to_owned()
        } else {
            o.prefer.join(", ")
        },
    );

    let _ = writeln!(s, "## Workloads\n");
    let _ = writeln!(
        s,
        "| workload | grid start (ms) | step (ms) | points | metrics present |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|");
    for w in &d.workloads {
        match w.grid {
            Some(g) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | {} | {} | {} |",
                    w.name, g.start_ms, g.step_ms, g.len, w.metrics_present
                );
            }
            None => {
                let _ = writeln!(
                    s,
                    "| {} | – | – | 0 | 0 (no metric with ≥ 2 samples) |",
                    w.name
                );
            }
        }
    }

    let _ = writeln!(s, "\n## Dropped: near-constant in every workload\n");
    if selection.dropped_low_variance.is_empty() {
        let _ = writeln!(s, "None.");
    } else {
        let names: Vec<&str> = d.workloads.iter().map(|w| w.name.as_str()).collect();
        let _ = writeln!(
            s,
            "Relative variance `Var(x)/max|x|²` per workload (– = absent).\n"
        );
        let _ = writeln!(s, "| metric | {} |", names.join(" | "));
        let _ = writeln!(s, "|---|{}", "---:|".repeat(names.len()));
        for m in d.metrics.iter().filter(|m| !m.passed_variance) {
            let cells: Vec<String> = m
                .variance
                .iter()
                .map(|v| v.map_or("–".to_owned(), |v| format!("{v:.3e}")))
                .collect();
            let _ = writeln!(s, "| {} | {} |", m.name, cells.join(" | "));
        }
    }

    let _ = writeln!(s, "\n## Groups of redundant metrics\n");
    let mut multi: Vec<_> = selection
        .groups
        .iter()
        .filter(|g| g.members.len() > 1)
        .collect();
    multi.sort_by(|a, b| {
        b.members
            .len()
            .cmp(&a.members.len())
            .then(a.representative.cmp(&b.representative))
    });
    if multi.is_empty() {
        let _ = writeln!(s, "None: every remaining metric is distinct.");
    }
    for g in &multi {
        let Some(r) = index(&g.representative) else {
            continue;
        };
        let ids: Vec<usize> = g.members.iter().filter_map(|m| index(m)).collect();
        let diameter = ids
            .iter()
            .flat_map(|&a| ids.iter().map(move |&b| (a, b)))
            .map(|(a, b)| d.distance[[a, b]])
            .fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            "### {} ({} members, max pairwise distance {})\n",
            g.representative,
            g.members.len(),
            fmt_d(diameter)
        );
        let _ = writeln!(
            s,
            "| member | distance to representative | worst workload |"
        );
        let _ = writeln!(s, "|---|---:|---|");
        for &m in ids.iter().filter(|&&m| m != r) {
            let worst = (0..d.per_workload.len())
                .filter(|&w| !d.per_workload[w][[r, m]].is_nan())
                .max_by(|&x, &y| d.per_workload[x][[r, m]].total_cmp(&d.per_workload[y][[r, m]]))
                .map_or("–", |w| d.workloads[w].name.as_str());
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                d.candidates[m],
                fmt_d(d.distance[[r, m]]),
                worst
            );
        }
        let _ = writeln!(s);
    }
    let alone: Vec<&str> = selection
        .groups
        .iter()
        .filter(|g| g.members.len() == 1)
        .map(|g| g.representative.as_str())
        .collect();
    if !alone.is_empty() {
        let _ = writeln!(
            s,
            "Kept on their own ({}): {}\n",
            alone.len(),
            alone.join(", ")
        );
    }

    let _ = writeln!(s, "## Plots\n");
    if let Some(h) = &plots.heatmap {
        let _ = writeln!(
            s,
            "Distance heatmap (blue = under the threshold):\n\n![heatmap]({h})\n"
        );
    }
    if let Some(g) = &plots.groups {
        let _ = writeln!(s, "Group sizes:\n\n![groups]({g})\n");
    }
    for (p, file) in d.examples.iter().zip(&plots.pairs) {
        let _ = writeln!(
            s,
            "{} vs {} in {} ({}, distance {}):\n\n![{} vs {}]({file})\n",
            p.a,
            p.b,
            p.workload,
            if p.grouped {
                "grouped, farthest member"
            } else {
                "closest pair not grouped"
            },
            fmt_d(p.distance),
            p.a,
            p.b
        );
    }
    s
}
