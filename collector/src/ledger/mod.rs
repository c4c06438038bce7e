//! The ledger: what each job held, used, left unused and burned over a
//! period, per GPU it ran on ("holdings"), from the stored rollups.
//!
//! For one job on one GPU over `[start, end)` (whole minutes):
//!
//! * **held**: the time its OFU samples cover (Σ window), the GPU's time
//!   under the job as measured;
//! * **idle**: held minutes whose mean tensor pipe activity is below
//!   [`IDLE_TENSOR_ACTIVE`] (1 %), counted with the time they hold: a GPU
//!   allocated and doing no tensor work for the minute. Minutes, not
//!   samples, so that a training step's communication phase is not idle
//!   and the figure does not depend on the sampling interval;
//! * **Σ OFU × time** (OFU eq. 1, weighted by window as eq. 11): delivered
//!   FLOPs are this times the GPU's dense FP16 tensor peak
//!   (`config/gpus.toml`), unused capacity is held time less this;
//! * **energy**: the GPU's energy counter (`energy_j`) at the job's last
//!   sample less its value where the job's first sample's window starts,
//!   so each sample window counts for the job that held it (a counter
//!   read less often than that is split between readings by board power);
//!   where the GPU has no counter (or it went back: a driver reload),
//!   board power integrated over the same time, and the holding says
//!   which.
//!
//! Sealed minutes come from the rollups (one aggregate per job and
//! minute), the head's samples are grouped into minutes here: the result
//! does not depend on which hours are sealed. See docs/LEDGER.md.

mod live;

pub use live::{JobTotals, Live, Observed};

use crate::ofu::Mean;
use crate::store::{GpuRecord, JobRecord, OfuPiece, Store, StoreError, MINUTE_MS, WINDOW_MS};
use flopwatch_proto::metrics::{ENERGY_J, POWER_W};
use flopwatch_proto::model::Point;
use std::collections::BTreeMap;

pub use crate::store::IDLE_TENSOR_ACTIVE;

/// How far before an instant the energy counter's last reading is looked
/// for: longer than any sampling interval an agent uses.
const COUNTER_LOOKBACK_MS: i64 = 10 * MINUTE_MS;

/// Holdings one thread computes at the least.
const HOLDINGS_PER_THREAD: usize = 16;

/// Where a holding's energy comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EnergySource {
    /// The GPU's energy counter.
    Counter,
    /// Board power integrated over the samples (no counter, or a reset).
    Power,
    /// Neither was recorded.
    #[default]
    None,
}

impl EnergySource {
    /// The name reports use.
    pub fn as_str(self) -> &'static str {
        match self {
            EnergySource::Counter => "counter",
            EnergySource::Power => "power",
            EnergySource::None => "none",
        }
    }

    /// The inverse of [`EnergySource::as_str`] (unknown names: `None`).
    pub fn parse(s: &str) -> Self {
        match s {
            "counter" => EnergySource::Counter,
            "power" => EnergySource::Power,
            _ => EnergySource::None,
        }
    }
}

/// The figures of one holding (summable across holdings).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Figures {
    /// Held time, ms.
    pub held_ms: f64,
    /// Held time in idle minutes, ms.
    pub idle_ms: f64,
    /// Σ OFU × window, ms.
    pub ofu_ms: f64,
    /// Energy, joules.
    pub energy_j: f64,
}

/// One job's figures on one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    /// The job's tenant.
    pub tenant: String,
    /// The job on the GPU (its pod, namespace and node).
    pub job: JobRecord,
    /// The GPU's model, as the agent names it.
    pub model: String,
    /// The GPU's dense FP16 tensor peak, TFLOP/s (0: not in the spec table).
    pub peak_tflops: f64,
    /// What the job held, used and burned on the GPU.
    pub figures: Figures,
    /// Where the energy figure comes from.
    pub energy: EnergySource,
}

/// Holdings of the jobs `store` holds over `[start, end)`, widened to
/// whole minutes: of `tenant` (every tenant when `None`), only `job` when
/// given; `peak` is a GPU's dense FP16 tensor peak (TFLOP/s; 0 for a
/// model not in the spec table). Holdings without a sample in the range
/// are left out.
pub fn holdings(
    store: &Store,
    peak: &(dyn Fn(&GpuRecord) -> f64 + Sync),
    tenant: Option<&str>,
    job: Option<&str>,
    start: i64,
    end: i64,
) -> Result<Vec<Holding>, StoreError> {
    let start = start.div_euclid(MINUTE_MS) * MINUTE_MS;
    let end = (end + MINUTE_MS - 1).div_euclid(MINUTE_MS) * MINUTE_MS;
    let gpus: BTreeMap<(String, String), GpuRecord> = store
        .gpus(tenant)?
        .into_iter()
        .map(|(t, g)| ((t, g.uuid.clone()), g))
        .collect();
    let work: Vec<(String, JobRecord, Option<&GpuRecord>)> = store
        .jobs(tenant)?
        .into_iter()
        .filter(|(_, j)| job.is_none_or(|want| want == j.job_id))
        // A record's first sample may cover a window before it.
        .filter(|(_, j)| j.first_seen_ms - COUNTER_LOOKBACK_MS < end && j.last_seen_ms >= start)
        .map(|(t, j)| {
            // A job's share of a shared GPU: that GPU's record.
            let uuid = flopwatch_proto::model::shared_gpu(&j.gpu_uuid).unwrap_or(&j.gpu_uuid);
            let g = gpus.get(&(t.clone(), uuid.to_string()));
            (t, j, g)
        })
        .collect();
    let read = |(t, j, g): (String, JobRecord, Option<&GpuRecord>)| {
        let peak = g.map_or(0.0, peak);
        // Only the job's own hours are read (its record bounds its
        // samples); whole hours, which the rollups answer without a chunk.
        let from = start.max(hour_floor(j.first_seen_ms - COUNTER_LOOKBACK_MS));
        let to = end.min(hour_floor(j.last_seen_ms) + WINDOW_MS);
        holding(store, &t, &j, from, to).map(|h| {
            h.map(|(figures, energy)| Holding {
                model: g.map(|g| g.model.clone()).unwrap_or_default(),
                tenant: t,
                job: j,
                peak_tflops: peak,
                figures,
                energy,
            })
        })
    };
    let mut out = Vec::new();
    for part in crate::parallel::in_parallel(work, HOLDINGS_PER_THREAD, &read) {
        out.extend(part?.into_iter().flatten());
    }
    Ok(out)
}

/// The hour `t` falls in.
fn hour_floor(t: i64) -> i64 {
    t.div_euclid(WINDOW_MS) * WINDOW_MS
}

/// One job's figures on its GPU over `[start, end)` (minute-aligned), and
/// where its energy came from; `None` without a sample in the range.
/// Sealed hours the job-hour records answer (one small record an hour,
/// `store/job_hours.rs`); the rest minute by minute ([`scan`]).
pub fn holding(
    store: &Store,
    tenant: &str,
    job: &JobRecord,
    start: i64,
    end: i64,
) -> Result<Option<(Figures, EnergySource)>, StoreError> {
    let gpu = job.gpu_uuid.as_str();
    let mut fig = Figures::default();
    // Where the job's first sample's window starts, and its last sample.
    let (mut begin, mut last) = (i64::MAX, i64::MIN);
    let answered = store.job_hours(tenant, gpu, &job.job_id, start, end, &mut |_, h| {
        fig.held_ms += h.held_ms;
        fig.ofu_ms += h.ofu_ms;
        fig.idle_ms += h.idle_ms;
        begin = begin.min(h.first.0 - i64::from(h.first.1));
        last = last.max(h.last_ms);
    })?;
    for (a, b) in gaps(start, end, answered) {
        if let Some(scan) = scan(store, tenant, job, a, b)? {
            for (_, _, m) in &scan.minutes {
                add_minute(&mut fig, m);
            }
            begin = begin.min(scan.begin);
            last = last.max(scan.last);
        }
    }
    if begin > last {
        return Ok(None);
    }
    let energy = energy(store, tenant, gpu, begin, last, &mut fig)?;
    Ok(Some((fig, energy)))
}

/// The parts of `[start, end)` outside the hours `answered`.
fn gaps(start: i64, end: i64, mut answered: Vec<i64>) -> Vec<(i64, i64)> {
    answered.sort_unstable();
    let mut out = Vec::new();
    let mut cur = start;
    for w in answered {
        if w > cur {
            out.push((cur, w));
        }
        cur = cur.max(w + WINDOW_MS);
    }
    if cur < end {
        out.push((cur, end));
    }
    out
}

/// A job's samples on its GPU over a range, by minute.
struct Scan {
    /// Where the job's first sample's window starts.
    begin: i64,
    /// The job's last sample (bounded by its record where the last minute
    /// came from a rollup).
    last: i64,
    /// Minute start, the time the minute's figures stand at (its last
    /// sample's, or its last instant for a sealed minute), and its
    /// aggregate; in order.
    minutes: Vec<(i64, i64, Mean)>,
}

/// Reads a job's OFU on its GPU over `[start, end)` minute by minute:
/// sealed minutes from the rollups, the head's samples grouped here.
fn scan(
    store: &Store,
    tenant: &str,
    job: &JobRecord,
    start: i64,
    end: i64,
) -> Result<Option<Scan>, StoreError> {
    let gpu = job.gpu_uuid.as_str();
    // Sealed minutes come whole, once each; the head's samples are
    // grouped by minute (an hour is read one way or the other).
    let mut sealed: Vec<(i64, i64, Mean)> = Vec::new();
    let mut minutes: BTreeMap<i64, (i64, Mean)> = BTreeMap::new();
    let (mut first, mut last) = (i64::MAX, i64::MIN);
    // The first sample's window, where it came as a sample.
    let mut first_window = None;
    store.ofu_pieces(
        tenant,
        gpu,
        start,
        end,
        Some(&job.job_id),
        Some(MINUTE_MS),
        &mut |piece| match piece {
            OfuPiece::Sample(s) => {
                if s.ts_ms < first {
                    first = s.ts_ms;
                    first_window = Some(s.window_ms);
                }
                last = last.max(s.ts_ms);
                let m = minutes
                    .entry(s.ts_ms.div_euclid(MINUTE_MS) * MINUTE_MS)
                    .or_insert((s.ts_ms, Mean::default()));
                m.0 = m.0.max(s.ts_ms);
                m.1.add(s.ofu, s.tensor_active, s.sm_clock_mhz, s.window_ms);
            }
            OfuPiece::Agg {
                ts_ms,
                len_ms,
                agg,
                first: f,
            } => {
                if agg.count == 0 {
                    return;
                }
                let t = f.map_or(ts_ms, |(t, _)| t);
                if t < first {
                    first = t;
                    first_window = None;
                }
                // The bucket's last sample is not kept: the job's last
                // sample on the GPU bounds it.
                let end = job.last_seen_ms.clamp(ts_ms, ts_ms + len_ms - 1);
                last = last.max(end);
                sealed.push((ts_ms, end, agg));
            }
        },
    )?;
    if first > last {
        return Ok(None);
    }
    // The job's time starts where its first sample's window does.
    let window = match first_window {
        Some(w) => w,
        None => {
            let mut w = 0;
            store.ofu(tenant, gpu, first, first + 1, Some(&job.job_id), &mut |s| {
                w = s.window_ms
            })?;
            w
        }
    };
    sealed.extend(minutes.into_iter().map(|(m, (t, a))| (m, t, a)));
    sealed.sort_unstable_by_key(|m| m.0);
    Ok(Some(Scan {
        begin: first - i64::from(window),
        last,
        minutes: sealed,
    }))
}

/// A job's figures on its GPU from its first sample, as they stood at
/// the end of each minute in `[from, to]` with samples of the job (at the
/// minute's last sample, or its last instant for a sealed minute): the
/// ledger's counters in the PromQL API. Energy is the counter's (or board
/// power's) since the job's first sample.
pub fn cumulative(
    store: &Store,
    tenant: &str,
    job: &JobRecord,
    from: i64,
    to: i64,
) -> Result<Vec<(i64, Figures)>, StoreError> {
    if to < job.first_seen_ms - COUNTER_LOOKBACK_MS || from > job.last_seen_ms + MINUTE_MS {
        return Ok(Vec::new());
    }
    let lo = (job.first_seen_ms - COUNTER_LOOKBACK_MS).div_euclid(MINUTE_MS) * MINUTE_MS;
    let Some(scan) = scan(store, tenant, job, lo, to.saturating_add(1))? else {
        return Ok(Vec::new());
    };
    let gpu = job.gpu_uuid.as_str();
    let readings = Readings::read(store, tenant, gpu, from.min(scan.begin), to)?;
    let begin = counter_at(store, tenant, gpu, scan.begin)?;
    let mut fig = Figures::default();
    let mut out = Vec::new();
    // Every counter is 0 where the job's time starts: a job shorter than
    // a minute still has two points, and `increase` sees all of it.
    if (from..=to).contains(&scan.begin) {
        out.push((scan.begin, fig));
    }
    for (_, t, m) in &scan.minutes {
        add_minute(&mut fig, m);
        if *t < from || *t > to {
            continue;
        }
        fig.energy_j = match (begin, readings.counter_at(*t)) {
            (Some(a), Some(b)) if b >= a => b - a,
            _ => readings
                .power_between(scan.begin, *t)
                .unwrap_or(fig.energy_j),
        };
        out.push((*t, fig));
    }
    Ok(out)
}

/// Adds one minute's aggregate: held time, Σ OFU × time, idle time.
fn add_minute(fig: &mut Figures, m: &Mean) {
    let Some(ofu) = m.mean() else { return };
    let (_, parts) = m.parts();
    let held = parts[0];
    fig.held_ms += held;
    fig.ofu_ms += ofu * held;
    if m.tensor_active() < IDLE_TENSOR_ACTIVE {
        fig.idle_ms += held;
    }
}

/// Energy over `(begin, last]`, the job's time on the GPU: the energy
/// counter's value at `last` less its value at `begin`
/// ([`Readings::counter_at`]), else board power integrated.
fn energy(
    store: &Store,
    tenant: &str,
    gpu: &str,
    begin: i64,
    last: i64,
    fig: &mut Figures,
) -> Result<EnergySource, StoreError> {
    if let (Some(a), Some(b)) = (
        counter_at(store, tenant, gpu, begin)?,
        counter_at(store, tenant, gpu, last)?,
    ) {
        if b >= a && (b - a).is_finite() {
            fig.energy_j = b - a;
            return Ok(EnergySource::Counter);
        }
    }
    let power = Readings::read(store, tenant, gpu, begin, last)?;
    match power.power_between(begin, last) {
        Some(j) => {
            fig.energy_j = j;
            Ok(EnergySource::Power)
        }
        None => Ok(EnergySource::None),
    }
}

/// The energy counter's value at instant `t` ([`Readings::counter_at`]
/// over the readings around it).
fn counter_at(store: &Store, tenant: &str, gpu: &str, t: i64) -> Result<Option<f64>, StoreError> {
    Ok(Readings::read(store, tenant, gpu, t, t)?.counter_at(t))
}

/// A GPU's energy counter readings over a range (and
/// [`COUNTER_LOOKBACK_MS`] either side), and its board power readings
/// there, read when first needed (a counter read at the instant asked
/// needs none).
struct Readings<'a> {
    energy: Vec<Point>,
    power: std::cell::OnceCell<Vec<Point>>,
    store: &'a Store,
    key: (&'a str, &'a str),
    range: (i64, i64),
}

impl<'a> Readings<'a> {
    fn read(
        store: &'a Store,
        tenant: &'a str,
        gpu: &'a str,
        from: i64,
        to: i64,
    ) -> Result<Self, StoreError> {
        let range = (
            from - COUNTER_LOOKBACK_MS,
            to.saturating_add(COUNTER_LOOKBACK_MS),
        );
        let mut energy = store.series(tenant, gpu, ENERGY_J, range.0, range.1, usize::MAX)?;
        energy.retain(|p| p.value.is_finite());
        Ok(Self {
            energy,
            power: std::cell::OnceCell::new(),
            store,
            key: (tenant, gpu),
            range,
        })
    }

    /// The power readings (none where they could not be read: the energy
    /// between two counter readings is then split by time).
    fn power(&self) -> &[Point] {
        self.power.get_or_init(|| {
            let (tenant, gpu) = self.key;
            self.store
                .series(tenant, gpu, POWER_W, self.range.0, self.range.1, usize::MAX)
                .unwrap_or_else(|e| {
                    tracing::warn!(error = %e, gpu, "ledger: board power not read");
                    Vec::new()
                })
        })
    }

    /// The energy counter's value at instant `t`. A counter is often read
    /// less often than the job's samples (every second against 100 ms),
    /// so between two readings the energy between them is split by board
    /// power (by time where no power was read); past the last reading (or
    /// before the first) power is added (taken off). `None` without a
    /// reading within [`COUNTER_LOOKBACK_MS`], or where power cannot
    /// bridge the gap.
    fn counter_at(&self, t: i64) -> Option<f64> {
        let i = self.energy.partition_point(|p| p.ts_ms <= t);
        let before = i.checked_sub(1).map(|k| &self.energy[k]);
        let after = self.energy.get(i);
        match (before, after) {
            (Some(b), _) if b.ts_ms == t => Some(b.value),
            (Some(b), Some(a)) if a.value >= b.value => {
                let frac = match (
                    self.power_between(b.ts_ms, t),
                    self.power_between(b.ts_ms, a.ts_ms),
                ) {
                    (Some(x), Some(all)) if all > 0.0 => x / all,
                    _ => (t - b.ts_ms) as f64 / (a.ts_ms - b.ts_ms) as f64,
                };
                Some(b.value + frac.clamp(0.0, 1.0) * (a.value - b.value))
            }
            (Some(b), _) => self.power_between(b.ts_ms, t).map(|j| b.value + j),
            (None, Some(a)) => self.power_between(t, a.ts_ms).map(|j| a.value - j),
            (None, None) => None,
        }
    }

    fn power_between(&self, from: i64, to: i64) -> Option<f64> {
        power_between(self.power(), from, to)
    }
}

/// Joules over `(from, to]` from board power readings, each holding
/// until the next (as a Prometheus sample does; before the first reading
/// in the range, the one before it holds); `None` where a stretch longer
/// than [`COUNTER_LOOKBACK_MS`] has no reading.
fn power_between(pts: &[Point], from: i64, to: i64) -> Option<f64> {
    if to <= from {
        return Some(0.0);
    }
    let pts: Vec<&Point> = pts.iter().filter(|p| p.value.is_finite()).collect();
    // The reading that holds at `from`, else the first after it.
    let i = pts.iter().rposition(|p| p.ts_ms <= from).unwrap_or(0);
    let mut cur = pts.get(i)?;
    if (cur.ts_ms - from).abs() > COUNTER_LOOKBACK_MS {
        return None;
    }
    let mut joules = 0.0;
    let mut t = from;
    for next in pts[i + 1..].iter().filter(|p| p.ts_ms > from) {
        let b = next.ts_ms.min(to);
        if b - t > COUNTER_LOOKBACK_MS {
            return None;
        }
        joules += cur.value.max(0.0) * (b - t) as f64 / 1000.0;
        t = b;
        cur = next;
        if t >= to {
            return Some(joules);
        }
    }
    (to - t <= COUNTER_LOOKBACK_MS).then(|| joules + cur.value.max(0.0) * (to - t) as f64 / 1000.0)
}

impl Figures {
    /// Adds another holding's figures.
    pub fn add(&mut self, o: &Figures) {
        self.held_ms += o.held_ms;
        self.idle_ms += o.idle_ms;
        self.ofu_ms += o.ofu_ms;
        self.energy_j += o.energy_j;
    }
}

impl From<Holding> for flopwatch_proto::v1::LedgerEntry {
    fn from(h: Holding) -> Self {
        let f = h.figures;
        Self {
            tenant: h.tenant,
            job_id: h.job.job_id,
            namespace: h.job.namespace,
            pod: h.job.pod,
            node_id: h.job.node_id,
            apportioned: flopwatch_proto::model::shared_gpu(&h.job.gpu_uuid).is_some(),
            gpu_uuid: flopwatch_proto::model::shared_gpu(&h.job.gpu_uuid)
                .map_or_else(|| h.job.gpu_uuid.clone(), str::to_string),
            model: h.model,
            peak_tflops: h.peak_tflops,
            held_s: f.held_ms / 1000.0,
            idle_s: f.idle_ms / 1000.0,
            ofu_s: f.ofu_ms / 1000.0,
            energy_j: f.energy_j,
            energy_source: h.energy.as_str().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemEngine;
    use crate::store::{CommitSet, OfuSample, WINDOW_MS};
    use flopwatch_proto::model::SeriesBatch;
    use std::sync::Arc;

    /// An hour boundary, unix ms.
    const T0: i64 = 1_800_000_000_000 / WINDOW_MS * WINDOW_MS;
    const S: i64 = 1_000;

    /// GPU-1 at 1 s: `job-a` from T0 + 10 min to T0 + 90 min (busy the
    /// first 30 min, then idle), then `job-b` (busy) to T0 + 130 min.
    /// Power 400 W busy, 60 W idle; the energy counter read every 5 s.
    fn fill(store: &Store) {
        let (from, to) = (T0 + 10 * MINUTE_MS, T0 + 130 * MINUTE_MS);
        let mut energy = 1e6;
        let mut seq = 0;
        let mut t = from;
        while t < to {
            let ts: Vec<i64> = (1..=60).map(|i| t + i * S).collect();
            let busy = |x: i64| !(T0 + 40 * MINUTE_MS..T0 + 90 * MINUTE_MS).contains(&(x - 1));
            let job = |x: i64| {
                if x - 1 < T0 + 90 * MINUTE_MS {
                    "job-a"
                } else {
                    "job-b"
                }
            };
            let series = |metric: &str, pts: Vec<Point>| SeriesBatch {
                gpu_uuid: "GPU-1".into(),
                metric: metric.into(),
                points: pts,
            };
            let point = |x: i64, v: f64| Point {
                ts_ms: x,
                value: v,
                peak: None,
                window_ms: Some(1000),
            };
            let power: Vec<Point> = ts
                .iter()
                .map(|&x| point(x, if busy(x) { 400.0 } else { 60.0 }))
                .collect();
            let mut counter = Vec::new();
            for &x in &ts {
                energy += if busy(x) { 400.0 } else { 60.0 };
                if x % (5 * S) == 0 {
                    counter.push(point(x, energy));
                }
            }
            let mut ofu: BTreeMap<&str, Vec<OfuSample>> = BTreeMap::new();
            for &x in &ts {
                let tpa = if busy(x) { 0.5 } else { 0.0 };
                ofu.entry(job(x)).or_default().push(OfuSample {
                    ts_ms: x,
                    ofu: crate::ofu::ofu(tpa, 1500.0, 1830.0),
                    tensor_active: tpa,
                    sm_clock_mhz: 1500.0,
                    window_ms: 1000,
                });
            }
            for (j, samples) in ofu {
                seq += 1;
                let set = CommitSet {
                    seq,
                    series: vec![
                        series(POWER_W, power.clone()),
                        series(ENERGY_J, counter.clone()),
                    ],
                    ofu: vec![("GPU-1".into(), Some(j.into()), samples)],
                    ..Default::default()
                };
                store.commit("t", &set).unwrap();
            }
            t += 60 * S;
        }
    }

    fn job(id: &str, last: i64) -> JobRecord {
        JobRecord {
            job_id: id.into(),
            gpu_uuid: "GPU-1".into(),
            last_seen_ms: last,
            ..Default::default()
        }
    }

    /// The figures are the same from the head and from sealed rollups,
    /// and what the samples say: held and idle time, Σ OFU × time, energy
    /// from a counter read every 5 s split at the job change by power.
    #[test]
    fn head_and_sealed_hours_give_the_same_figures() {
        let store = Store::new(Arc::new(MemEngine::new()), false);
        fill(&store);
        let jobs = [
            job("job-a", T0 + 90 * MINUTE_MS),
            job("job-b", T0 + 130 * MINUTE_MS),
        ];
        let range = (T0, T0 + 3 * WINDOW_MS);
        let read = || {
            jobs.iter()
                .map(|j| holding(&store, "t", j, range.0, range.1).unwrap().unwrap())
                .collect::<Vec<_>>()
        };
        let answered = |s: &Store| {
            s.job_hours("t", "GPU-1", "job-a", range.0, range.1, &mut |_, _| {})
                .unwrap()
        };
        let head = read();
        assert_eq!(answered(&store), Vec::<i64>::new());
        let report = store.compact(T0 + 3 * WINDOW_MS, 0).unwrap();
        assert!(report.chunks > 0);
        // Sealed: the job-hour records answer every hour.
        assert_eq!(
            answered(&store),
            vec![T0, T0 + WINDOW_MS, T0 + 2 * WINDOW_MS]
        );
        let sealed = read();
        let ofu = crate::ofu::ofu(0.5, 1500.0, 1830.0);
        // job-a: 80 min held, 30 busy, then 50 idle: minutes 40 to 89 and
        // the sample ending at 90:00, alone in its minute (a sample counts
        // in the minute its window ends in; minute 40 holds the last busy
        // second and is idle all the same). job-b: 40 min busy.
        let want = [
            (
                80.0,
                50.0 + 1.0 / 60.0,
                30.0,
                30.0 * 60.0 * 400.0 + 50.0 * 60.0 * 60.0,
            ),
            (40.0, 0.0, 40.0, 40.0 * 60.0 * 400.0),
        ];
        for ((h, s), (held, idle, busy, joules)) in head.iter().zip(&sealed).zip(want) {
            for (what, (f, src)) in [("head", h), ("sealed", s)] {
                let near = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
                assert_eq!(*src, EnergySource::Counter, "{what}");
                assert!(near(f.held_ms, held * 60_000.0), "{what}: {f:?}");
                assert!(near(f.idle_ms, idle * 60_000.0), "{what}: {f:?}");
                assert!(near(f.ofu_ms, busy * 60_000.0 * ofu), "{what}: {f:?}");
                assert!(near(f.energy_j, joules), "{what}: {f:?}");
            }
        }
        // Out of range: nothing.
        assert_eq!(
            holding(&store, "t", &jobs[1], T0, T0 + 80 * MINUTE_MS).unwrap(),
            None
        );
    }

    /// Without an energy counter, board power is integrated, and said so.
    #[test]
    fn power_stands_in_for_a_missing_counter() {
        let pts: Vec<Point> = (0..=10)
            .map(|i| Point {
                ts_ms: i * S,
                value: 100.0 * i as f64,
                peak: None,
                window_ms: None,
            })
            .collect();
        // Each reading holds until the next: 0 W, 100 W, … over (0, 10 s].
        assert_eq!(power_between(&pts, 0, 10 * S), Some(4_500.0));
        // A range between readings: (2.5 s, 4 s] holds 200 W then 300 W.
        assert_eq!(power_between(&pts, 2_500, 4 * S), Some(200.0 * 0.5 + 300.0));
        // A gap longer than the lookback is not bridged.
        assert_eq!(power_between(&pts, 0, 20 * MINUTE_MS), None);
        assert_eq!(power_between(&[], 0, S), None);
    }
}
