//! `selected.toml` (what agents read), the JSON summary, and the report
//! directory.

use std::path::Path;

use serde::Serialize;

use crate::pipeline::{Group, Selection};
use crate::{plot, report, SelectError};

/// The selected metric set as the agent config reads it.
#[derive(Serialize)]
struct SelectedFile<'a> {
    /// Metrics to collect.
    metrics: &'a [String],
    /// For reference: which metrics each kept one stands for.
    groups: &'a [Group],
}

/// The JSON summary (`--json`, and `summary.json` in the report).
#[derive(Serialize)]
struct Summary<'a> {
    kept: &'a [String],
    dropped_low_variance: &'a [String],
    groups: &'a [Group],
}

/// `selected.toml` contents: top-level `metrics = [...]` plus `[[groups]]`.
pub fn selected_toml(selection: &Selection) -> Result<String, toml::ser::Error> {
    let body = toml::to_string(&SelectedFile {
        metrics: &selection.kept,
        groups: &selection.groups,
    })?;
    Ok(format!(
        "# Written by `flopwatch select` (Moneo §2.2 metric selection).\n\
         # `metrics` is the set agents collect; `groups` records which metrics\n\
         # each kept one stands for.\n{body}"
    ))
}

/// The JSON summary: `{"kept": [..], "dropped_low_variance": [..], "groups": [{"representative", "members"}]}`.
pub fn summary_json(selection: &Selection) -> String {
    serde_json::to_string_pretty(&Summary {
        kept: &selection.kept,
        dropped_low_variance: &selection.dropped_low_variance,
        groups: &selection.groups,
    })
    .expect("string lists always serialize")
}

/// Write `output` (selected TOML) and, if asked, the report directory:
/// `report.md`, `summary.json`, `heatmap.svg`, `groups.svg`, `pair-N.svg`.
pub fn write_outputs(
    selection: &Selection,
    output: &Path,
    report_dir: Option<&Path>,
) -> Result<(), SelectError> {
    let toml = selected_toml(selection).map_err(|e| SelectError::output(output, e))?;
    create_parent(output)?;
    std::fs::write(output, toml).map_err(|e| SelectError::io(output, e))?;
    if let Some(dir) = report_dir {
        std::fs::create_dir_all(dir).map_err(|e| SelectError::io(dir, e))?;
        let plots = plot::draw_all(selection, dir)?;
        let path = dir.join("report.md");
        std::fs::write(&path, report::markdown(selection, &plots))
            .map_err(|e| SelectError::io(&path, e))?;
        let path = dir.join("summary.json");
        std::fs::write(&path, summary_json(selection) + "\n")
            .map_err(|e| SelectError::io(&path, e))?;
    }
    Ok(())
}

fn create_parent(path: &Path) -> Result<(), SelectError> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => {
            std::fs::create_dir_all(p).map_err(|e| SelectError::io(p, e))
        }
        _ => Ok(()),
    }
}
