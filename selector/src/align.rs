//! Put a workload's irregularly sampled metrics on one regular time grid.
//!
//! The grid covers the window every present metric has data for
//! (latest first sample .. earliest last sample), so no value is ever
//! extrapolated; its step defaults to the median sampling step.

use ndarray::ArrayViewMut1;
use serde::Serialize;

use crate::samples::Series;

/// How a value is read off a series at a grid point between two samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    /// Step-hold: the last sample at or before the grid point (what a
    /// scraper or Prometheus shows between samples; invents no values).
    #[default]
    Step,
    /// Straight line between the samples either side of the grid point.
    Linear,
}

impl std::str::FromStr for Interpolation {
    type Err = String;

    /// `step` or `linear`, as the command line spells them.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "step" => Ok(Interpolation::Step),
            "linear" => Ok(Interpolation::Linear),
            _ => Err(format!("`{s}` is neither `step` nor `linear`")),
        }
    }
}

impl std::fmt::Display for Interpolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Interpolation::Step => "step-hold",
            Interpolation::Linear => "linear",
        })
    }
}

/// A regular time grid: `start_ms + k * step_ms` for `k < len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Grid {
    /// First grid point.
    pub start_ms: i64,
    /// Distance between grid points.
    pub step_ms: i64,
    /// Number of grid points (T in eq. 1).
    pub len: usize,
}

impl Grid {
    /// Last grid point.
    pub fn end_ms(&self) -> i64 {
        self.start_ms + self.step_ms * (self.len as i64 - 1)
    }
}

/// Median of positive differences between consecutive timestamps.
pub(crate) fn median_step(ts: &[i64]) -> Option<i64> {
    let mut diffs: Vec<i64> = ts
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .filter(|&d| d > 0)
        .collect();
    median(&mut diffs)
}

/// Lower median (an observed value, so always a whole number of ms).
pub(crate) fn median(values: &mut [i64]) -> Option<i64> {
    if values.is_empty() {
        return None;
    }
    let mid = (values.len() - 1) / 2;
    Some(*values.select_nth_unstable(mid).1)
}

/// Build the grid for a workload from its present series.
///
/// `step_ms = None` takes the median over metrics of each metric's median
/// sampling step. `max_cells` bounds `len × series.len()` so a tiny step on
/// a long trace fails with a message instead of exhausting memory.
pub(crate) fn grid_for(
    series: &[&Series],
    step_ms: Option<i64>,
    max_cells: usize,
) -> Result<Grid, String> {
    let start = series.iter().filter_map(|s| s.ts.first()).max().copied();
    let end = series.iter().filter_map(|s| s.ts.last()).min().copied();
    let (Some(start), Some(end)) = (start, end) else {
        return Err("no metric has two or more samples".to_owned());
    };
    if start > end {
        return Err(format!(
            "metrics share no common time window (latest first sample {start} ms is after earliest last sample {end} ms)"
        ));
    }
    let step = match step_ms {
        Some(s) => s,
        None => {
            let mut steps: Vec<i64> = series.iter().filter_map(|s| median_step(&s.ts)).collect();
            median(&mut steps).ok_or("no sampling step found")?
        }
    };
    if step <= 0 {
        return Err(format!("step {step} ms is not positive"));
    }
    let span = (end as i128 - start as i128) as u128;
    let len = span / step as u128 + 1;
    if len < 2 {
        return Err(format!(
            "common time window {start}..{end} ms holds fewer than 2 points at step {step} ms"
        ));
    }
    if len.saturating_mul(series.len() as u128) > max_cells as u128 {
        return Err(format!(
            "grid of {len} points × {} metrics exceeds {max_cells} cells; use a larger --step-ms",
            series.len()
        ));
    }
    Ok(Grid {
        start_ms: start,
        step_ms: step,
        len: len as usize,
    })
}

/// Sample `series` on `grid` into `out` (length `grid.len`).
///
/// The grid lies inside the series' time range, so the sample at or before
/// each grid point always exists.
pub(crate) fn align_into(
    series: &Series,
    grid: &Grid,
    interpolation: Interpolation,
    mut out: ArrayViewMut1<'_, f64>,
) {
    let (ts, vs) = (&series.ts, &series.values);
    let mut j = 0; // last sample with ts[j] <= t
    for (k, slot) in out.iter_mut().enumerate() {
        let t = grid.start_ms + grid.step_ms * k as i64;
        while j + 1 < ts.len() && ts[j + 1] <= t {
            j += 1;
        }
        *slot = match interpolation {
            Interpolation::Step => vs[j],
            Interpolation::Linear if ts[j] >= t || j + 1 == ts.len() => vs[j],
            Interpolation::Linear => {
                let (t0, t1) = (ts[j] as f64, ts[j + 1] as f64);
                let f = (t as f64 - t0) / (t1 - t0);
                vs[j] + f * (vs[j + 1] - vs[j])
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::Array1;

    fn series(points: &[(i64, f64)]) -> Series {
        let mut s = Series::default();
        s.ts = points.iter().map(|p| p.0).collect();
        s.values = points.iter().map(|p| p.1).collect();
        s
    }

    #[test]
    fn grid_is_the_common_window_at_the_median_step() {
        let a = series(&[(0, 0.0), (10, 1.0), (20, 2.0), (30, 3.0), (100, 4.0)]);
        let b = series(&[(5, 0.0), (15, 1.0), (25, 2.0), (95, 3.0)]);
        let g = grid_for(&[&a, &b], None, usize::MAX).unwrap();
        assert_eq!(
            g,
            Grid {
                start_ms: 5,
                step_ms: 10,
                len: 10
            }
        );
        assert_eq!(g.end_ms(), 95);
    }

    #[test]
    fn disjoint_windows_are_an_error() {
        let a = series(&[(0, 0.0), (10, 1.0)]);
        let b = series(&[(20, 0.0), (30, 1.0)]);
        assert!(grid_for(&[&a, &b], None, usize::MAX).is_err());
        assert!(grid_for(&[&a], Some(1), 5).is_err());
    }

    #[test]
    fn step_hold_and_linear() {
        let s = series(&[(0, 0.0), (10, 10.0), (30, 30.0)]);
        let g = Grid {
            start_ms: 0,
            step_ms: 5,
            len: 7,
        };
        let mut out = Array1::zeros(7);
        align_into(&s, &g, Interpolation::Step, out.view_mut());
        assert_eq!(out.to_vec(), vec![0.0, 0.0, 10.0, 10.0, 10.0, 10.0, 30.0]);
        align_into(&s, &g, Interpolation::Linear, out.view_mut());
        assert_eq!(out.to_vec(), vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]);
    }
}
