//! Replays a recorded trace: long-form CSV `timestamp_ms,gpu,metric,value`.
//!
//! `gpu` is a UUID or an index. Rows are grouped by timestamp; each capture
//! returns the next timestamp's rows, shifted so the trace's first timestamp
//! lands on the first capture's `now_ms` (a trace recorded yesterday replays
//! as live data today). Metrics outside the catalog are an error naming the
//! file and line, as are malformed rows.
//!
//! [`ReplaySource::paced`] replays instead at the reader's pace, as
//! hardware counters answer: a capture returns everything recorded since
//! the previous one, window means combined exactly (weighted by their
//! windows), point metrics at their latest row. An agent reading a 100 ms
//! trace every second then sees what it would have read from the GPU.
//! Either way the source honours a read plan ([`PlanCarry`]).

use super::{Capture, GpuCapture, GpuSource, Reading, SourceError};
use crate::capture::{PlanCarry, ReadPlan};
use flopwatch_proto::metrics::{self, Aggregation};
use flopwatch_proto::model::GpuInfo;
use std::collections::BTreeMap;
use std::path::Path;

/// A trace loaded in memory.
pub struct ReplaySource {
    inventory: Vec<GpuInfo>,
    /// (timestamp, gpu index, metric, value), sorted by timestamp.
    rows: Vec<(i64, usize, &'static str, f64)>,
    next: usize,
    offset_ms: Option<i64>,
    last_ts: Option<i64>,
    paced: bool,
    carry: PlanCarry,
}

impl ReplaySource {
    /// Loads `path`. `model` names the GPU model for the inventory.
    pub fn open(path: &Path, model: &str) -> Result<Self, SourceError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)?;
        Self::parse(&text, &file, model)
    }

    /// Parses trace text; `file` names it in errors.
    pub fn parse(text: &str, file: &str, model: &str) -> Result<Self, SourceError> {
        let err = |line: u64, message: String| SourceError::Trace {
            file: file.to_string(),
            line,
            message,
        };
        let mut lines = text.lines().enumerate();
        let header = loop {
            match lines.next() {
                Some((_, l)) if l.trim().is_empty() => continue,
                Some((i, l)) => break (i, l),
                None => return Err(err(1, "empty trace".into())),
            }
        };
        let cols: Vec<&str> = header.1.split(',').map(str::trim).collect();
        if cols != ["timestamp_ms", "gpu", "metric", "value"] {
            return Err(err(
                header.0 as u64 + 1,
                format!(
                    "header must be `timestamp_ms,gpu,metric,value`, found `{}`",
                    header.1
                ),
            ));
        }
        let mut gpus: BTreeMap<String, usize> = BTreeMap::new();
        let mut rows = Vec::new();
        for (i, l) in lines {
            let line = i as u64 + 1;
            if l.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() != 4 {
                return Err(err(line, format!("expected 4 fields, found {}", f.len())));
            }
            let ts: i64 = f[0]
                .parse()
                .map_err(|_| err(line, format!("timestamp_ms `{}` is not an integer", f[0])))?;
            let metric = metrics::lookup(f[2])
                .ok_or_else(|| err(line, format!("unknown metric `{}`", f[2])))?
                .name;
            let value: f64 = f[3]
                .parse()
                .map_err(|_| err(line, format!("value `{}` is not a number", f[3])))?;
            if !value.is_finite() {
                return Err(err(line, format!("value `{}` is not finite", f[3])));
            }
            if f[1].is_empty() {
                return Err(err(line, "gpu is empty".into()));
            }
            let n = gpus.len();
            let gpu = *gpus.entry(f[1].to_string()).or_insert(n);
            rows.push((ts, gpu, metric, value));
        }
        if rows.is_empty() {
            return Err(err(1, "trace has no samples".into()));
        }
        rows.sort_by_key(|r| r.0);
        let mut names: Vec<(usize, String)> = gpus.into_iter().map(|(k, v)| (v, k)).collect();
        names.sort();
        let inventory = names
            .into_iter()
            .map(|(i, name)| GpuInfo {
                index: i as u32,
                uuid: if name.starts_with("GPU-") || name.starts_with("MIG-") {
                    name
                } else {
                    format!("GPU-replay-{name}")
                },
                model: model.to_string(),
                driver_version: "replay".into(),
                ..Default::default()
            })
            .collect();
        Ok(Self {
            inventory,
            rows,
            next: 0,
            offset_ms: None,
            last_ts: None,
            paced: false,
            carry: PlanCarry::default(),
        })
    }

    /// Replays at the reader's pace (see the module docs), the trace's
    /// first timestamp at `start_ms`.
    pub fn paced(mut self, start_ms: i64) -> Self {
        self.paced = true;
        self.offset_ms = self.rows.first().map(|r| start_ms - r.0);
        self
    }

    /// Every row recorded up to `now_ms` (trace time + the offset) as one
    /// capture: window means weighted by their rows' windows, points at
    /// their latest row; a capture with no GPUs when no row is due.
    fn capture_paced(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        let Some(&(next, ..)) = self.rows.get(self.next) else {
            return Err(SourceError::Exhausted);
        };
        let offset = *self.offset_ms.get_or_insert(now_ms - next);
        // The first row is an instant: windows start there.
        let since = self.last_ts.or(self.rows.first().map(|r| r.0));
        // (gpu, metric) → (Σ value × window, Σ window, latest value).
        let mut acc: BTreeMap<(usize, &'static str), (f64, u64, f64)> = BTreeMap::new();
        while let Some(&(t, gpu, metric, value)) = self.rows.get(self.next) {
            if t + offset > now_ms {
                break;
            }
            let w = self.last_ts.map_or(0, |p| (t - p).max(0) as u64);
            if self.rows.get(self.next + 1).is_none_or(|r| r.0 != t) {
                self.last_ts = Some(t);
            }
            let e = acc.entry((gpu, metric)).or_insert((0.0, 0, value));
            e.0 += value * w as f64;
            e.1 += w;
            e.2 = value;
            self.next += 1;
        }
        let Some(end) = self.last_ts.filter(|_| !acc.is_empty()) else {
            return Ok(Capture {
                ts_ms: now_ms,
                ..Capture::default()
            });
        };
        let window_ms = since.map_or(0, |s| u32::try_from(end - s).unwrap_or(u32::MAX));
        let mut gpus: Vec<GpuCapture> = Vec::new();
        for ((gpu, metric), (svw, sw, last)) in acc {
            let mean =
                metrics::lookup(metric).map(|d| d.aggregation) == Some(Aggregation::WindowMean);
            let value = if mean && sw > 0 {
                svw / sw as f64
            } else {
                last
            };
            if gpus.last().is_none_or(|g| g.gpu != gpu) {
                gpus.push(GpuCapture {
                    gpu,
                    window_ms,
                    readings: Vec::new(),
                });
            }
            if let Some(g) = gpus.last_mut() {
                g.readings.push(Reading::new(metric, value));
            }
        }
        Ok(Capture {
            ts_ms: end + offset,
            gpus,
            jobs: Vec::new(),
            events: Vec::new(),
        })
    }

    /// Samples not yet replayed.
    pub fn remaining(&self) -> usize {
        self.rows.len() - self.next
    }
}

impl GpuSource for ReplaySource {
    fn name(&self) -> &'static str {
        "replay"
    }

    fn inventory(&self) -> &[GpuInfo] {
        &self.inventory
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        if self.paced {
            return self.capture_paced(now_ms);
        }
        let Some(&(ts, ..)) = self.rows.get(self.next) else {
            return Err(SourceError::Exhausted);
        };
        let offset = *self.offset_ms.get_or_insert(now_ms - ts);
        let window_ms = self
            .last_ts
            .replace(ts)
            .map(|p| u32::try_from(ts - p).unwrap_or(u32::MAX))
            .unwrap_or(0);
        let mut per_gpu: BTreeMap<usize, Vec<Reading>> = BTreeMap::new();
        while let Some(&(t, gpu, metric, value)) = self.rows.get(self.next) {
            if t != ts {
                break;
            }
            per_gpu
                .entry(gpu)
                .or_default()
                .push(Reading::new(metric, value));
            self.next += 1;
        }
        Ok(Capture {
            ts_ms: ts + offset,
            gpus: per_gpu
                .into_iter()
                .map(|(gpu, readings)| GpuCapture {
                    gpu,
                    window_ms,
                    readings,
                })
                .collect(),
            jobs: Vec::new(),
            events: Vec::new(),
        })
    }

    /// Reads everything, then applies `plan` as a field-by-field source
    /// would ([`PlanCarry`]).
    fn capture_planned(&mut self, now_ms: i64, plan: &ReadPlan) -> Result<Capture, SourceError> {
        let mut c = self.capture(now_ms)?;
        self.carry.apply(plan, &mut c);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replays_in_time_order_shifted_to_now() {
        let t = "timestamp_ms,gpu,metric,value\n200,0,tensor_active,0.5\n100,0,tensor_active,0.4\n100,1,sm_clock_mhz,1400\n";
        let mut r = ReplaySource::parse(t, "t.csv", "NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(r.inventory().len(), 2);
        let c = r.capture(5_000).unwrap();
        assert_eq!(c.ts_ms, 5_000);
        assert_eq!(c.gpus.len(), 2);
        let c = r.capture(5_100).unwrap();
        assert_eq!(c.ts_ms, 5_100);
        assert_eq!(c.gpus[0].window_ms, 100);
        assert_eq!(c.gpus[0].readings[0].value, 0.5);
        assert!(matches!(r.capture(5_200), Err(SourceError::Exhausted)));
    }

    #[test]
    fn paced_replay_combines_what_was_recorded_since_the_last_read() {
        let t = "timestamp_ms,gpu,metric,value\n\
                 0,0,tensor_active,0.0\n0,0,power_w,100\n\
                 100,0,tensor_active,0.2\n100,0,power_w,200\n\
                 200,0,tensor_active,0.6\n200,0,power_w,300\n\
                 300,0,tensor_active,0.4\n300,0,power_w,400\n";
        let mut r = ReplaySource::parse(t, "t.csv", "NVIDIA H100 80GB HBM3")
            .unwrap()
            .paced(10_000);
        // Nothing recorded yet: an empty capture.
        assert!(r.capture(9_950).unwrap().gpus.is_empty());
        let c = r.capture(10_000).unwrap();
        assert_eq!((c.ts_ms, c.gpus[0].window_ms), (10_000, 0));
        assert!(r.capture(10_050).unwrap().gpus.is_empty());
        // Two rows since the last read: their exact mean, the latest point.
        let c = r.capture(10_250).unwrap();
        assert_eq!((c.ts_ms, c.gpus[0].window_ms), (10_200, 200));
        let v = |c: &Capture, m: &str| {
            c.gpus[0]
                .readings
                .iter()
                .find(|x| x.metric == m)
                .unwrap()
                .value
        };
        assert!((v(&c, metrics::TENSOR_ACTIVE) - 0.4).abs() < 1e-12);
        assert_eq!(v(&c, metrics::POWER_W), 300.0);
        let c = r.capture(10_300).unwrap();
        assert_eq!((c.ts_ms, c.gpus[0].window_ms), (10_300, 100));
        assert!(matches!(r.capture(10_400), Err(SourceError::Exhausted)));
        // A slower reader's first read covers every row but the first.
        let mut r = ReplaySource::parse(t, "t.csv", "NVIDIA H100 80GB HBM3")
            .unwrap()
            .paced(10_000);
        let c = r.capture(10_200).unwrap();
        assert_eq!((c.ts_ms, c.gpus[0].window_ms), (10_200, 200));
        assert!((v(&c, metrics::TENSOR_ACTIVE) - 0.4).abs() < 1e-12);
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let cases = [
            ("", "t.csv:1: empty trace"),
            ("ts,gpu,metric,value\n", "t.csv:1: header must be"),
            (
                "timestamp_ms,gpu,metric,value\n1,0,bogus,1\n",
                "t.csv:2: unknown metric `bogus`",
            ),
            (
                "timestamp_ms,gpu,metric,value\n1,0,tensor_active,x\n",
                "t.csv:2: value `x`",
            ),
            (
                "timestamp_ms,gpu,metric,value\n\n1,0,tensor_active,NaN\n",
                "t.csv:3: value `NaN` is not finite",
            ),
            (
                "timestamp_ms,gpu,metric,value\n1.5,0,tensor_active,1\n",
                "t.csv:2: timestamp_ms",
            ),
            (
                "timestamp_ms,gpu,metric,value\n1,0,tensor_active\n",
                "t.csv:2: expected 4 fields",
            ),
        ];
        for (text, want) in cases {
            let e = ReplaySource::parse(text, "t.csv", "x")
                .err()
                .expect(want)
                .to_string();
            assert!(e.starts_with(want), "{e} vs {want}");
        }
    }
}
