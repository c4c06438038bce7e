//! Rollup records: an hour's aggregate and its minutes', per job.
//!
//! A record holds one entry per job that had samples in the hour (compaction
//! already writes one chunk per job and hour), so a GPU's query merges the
//! entries and a job's query takes its own: both answer from the rollups.
//! Each aggregate also keeps the unweighted Σ OFU and the hour's or
//! minute's first sample, which PromQL's closed windows `[t - r, t]` need
//! to answer `avg_over_time` and its kin from buckets `[t - r, t)`.
//!
//! Records written before entries per job existed (format 1: no job, no
//! unweighted sum, no first sample) still decode; they answer a GPU's
//! queries as before and send a job's query to the samples.

use flopwatch_proto::ofu::Mean;

/// Format 1's aggregate: the sample count (u64), then weight, weighted
/// sums of OFU (the value, for a raw series), tensor activity and SM
/// clock, min and max (f64), all little-endian.
const AGG1_BYTES: usize = 56;
/// Format 2's aggregate: format 1's, then Σ OFU (f64), the first sample's
/// time (i64) and value (f64).
const AGG2_BYTES: usize = AGG1_BYTES + 24;
/// Format 2 records start with this word; format 1's first word is a
/// minute mask, whose bits 60 and up are always clear.
const FORMAT2: u64 = 1 << 63 | 2;

/// One bucket's aggregate: its samples' [`Mean`] and its first sample.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Bucket {
    pub mean: Mean,
    /// Time and OFU of the bucket's earliest sample (`None`: no samples,
    /// or a format 1 record).
    pub first: Option<(i64, f64)>,
}

impl Bucket {
    pub(super) fn add(&mut self, ts: i64, v: f64, tpa: f64, clk: f64, window_ms: u32) {
        self.mean.add(v, tpa, clk, window_ms);
        if self.first.is_none_or(|(t, _)| ts < t) {
            self.first = Some((ts, v));
        }
    }

    pub(super) fn merge(&mut self, o: &Bucket) {
        if o.mean.count == 0 {
            return;
        }
        let first = match (self.first, o.first) {
            (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
            _ if self.mean.count == 0 => o.first,
            // A bucket of a format 1 record does not know its first sample.
            _ => None,
        };
        self.mean.merge(&o.mean);
        self.first = first;
    }
}

/// The hour and minutes of one job (or of the whole GPU).
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Entry {
    pub hour: Bucket,
    /// Minute index (0..60) and its aggregate, in order.
    pub minutes: Vec<(u8, Bucket)>,
}

impl Entry {
    fn merge(&mut self, o: &Entry) {
        self.hour.merge(&o.hour);
        for (i, b) in &o.minutes {
            match self.minutes.binary_search_by_key(i, |(j, _)| *j) {
                Ok(k) => self.minutes[k].1.merge(b),
                Err(k) => self.minutes.insert(k, (*i, *b)),
            }
        }
    }
}

/// A rollup record.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Rollup {
    /// Entries by job id (`""`: samples outside every job), in order;
    /// `None` for a format 1 record, whose one entry has no job.
    pub jobs: Option<Vec<(String, Entry)>>,
    /// A format 1 record's entry.
    pub legacy: Entry,
}

impl Rollup {
    /// A record of one entry per job.
    pub(super) fn per_job(jobs: Vec<(String, Entry)>) -> Self {
        Self {
            jobs: Some(jobs),
            legacy: Entry::default(),
        }
    }

    /// The GPU's hour and minutes: every job's merged.
    pub(super) fn gpu(&self) -> Entry {
        match &self.jobs {
            None => self.legacy.clone(),
            Some(jobs) => {
                let mut e = Entry::default();
                for (_, j) in jobs {
                    e.merge(j);
                }
                e
            }
        }
    }

    /// One job's hour and minutes: `None` where the record does not know
    /// its jobs (format 1), an empty entry where the job had no samples.
    pub(super) fn job(&self, job: &str) -> Option<Entry> {
        let jobs = self.jobs.as_ref()?;
        Some(
            jobs.iter()
                .find(|(j, _)| j == job)
                .map(|(_, e)| e.clone())
                .unwrap_or_default(),
        )
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let jobs = self.jobs.as_deref().unwrap_or_default();
        let mut out = Vec::with_capacity(16 + jobs.len() * (16 + AGG2_BYTES * 61));
        out.extend_from_slice(&FORMAT2.to_le_bytes());
        out.extend_from_slice(&(jobs.len() as u32).to_le_bytes());
        for (job, e) in jobs {
            out.extend_from_slice(&(job.len() as u32).to_le_bytes());
            out.extend_from_slice(job.as_bytes());
            let mask = e.minutes.iter().fold(0u64, |m, (i, _)| m | (1u64 << i));
            out.extend_from_slice(&mask.to_le_bytes());
            encode_agg(&e.hour, &mut out);
            for (_, a) in &e.minutes {
                encode_agg(a, &mut out);
            }
        }
        out
    }

    pub(super) fn decode(b: &[u8]) -> Option<Self> {
        let head = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
        if head != FORMAT2 {
            let (legacy, used) = decode_entry(b, AGG1_BYTES)?;
            return (used == b.len()).then_some(Self { jobs: None, legacy });
        }
        let mut pos = 12;
        let n = u32::from_le_bytes(b.get(8..12)?.try_into().ok()?);
        let mut jobs = Vec::new();
        for _ in 0..n {
            let len = u32::from_le_bytes(b.get(pos..pos + 4)?.try_into().ok()?) as usize;
            pos += 4;
            let job = std::str::from_utf8(b.get(pos..pos.checked_add(len)?)?).ok()?;
            pos += len;
            let (e, used) = decode_entry(b.get(pos..)?, AGG2_BYTES)?;
            pos += used;
            jobs.push((job.to_string(), e));
        }
        (pos == b.len()).then_some(Self::per_job(jobs))
    }
}

fn encode_agg(b: &Bucket, out: &mut Vec<u8>) {
    let (count, parts) = b.mean.parts();
    out.extend_from_slice(&count.to_le_bytes());
    for f in parts {
        out.extend_from_slice(&f.to_le_bytes());
    }
    let (ts, v) = b.first.unwrap_or((i64::MIN, f64::NAN));
    out.extend_from_slice(&ts.to_le_bytes());
    out.extend_from_slice(&v.to_le_bytes());
}

/// An aggregate of `width` bytes (format 1 or 2).
fn decode_agg(b: &[u8], width: usize) -> Option<Bucket> {
    let b = b.get(..width)?;
    let u = |i: usize| -> Option<[u8; 8]> { b.get(i * 8..i * 8 + 8)?.try_into().ok() };
    let count = u64::from_le_bytes(u(0)?);
    let mut parts = [f64::NAN; 7];
    for (i, f) in parts.iter_mut().enumerate().take(width / 8 - 1) {
        *f = f64::from_le_bytes(u(i + 1)?);
    }
    let mut first = None;
    if width == AGG2_BYTES {
        let ts = i64::from_le_bytes(u(8)?);
        if count > 0 && ts != i64::MIN {
            first = Some((ts, f64::from_le_bytes(u(9)?)));
        }
    }
    Some(Bucket {
        mean: Mean::from_parts(count, parts),
        first,
    })
}

/// A minute mask, the hour's aggregate and the minutes'; with the bytes
/// it took.
fn decode_entry(b: &[u8], width: usize) -> Option<(Entry, usize)> {
    let mask = u64::from_le_bytes(b.get(..8)?.try_into().ok()?);
    if mask >> 60 != 0 {
        return None;
    }
    let hour = decode_agg(b.get(8..)?, width)?;
    let mut minutes = Vec::new();
    let mut pos = 8 + width;
    for i in 0..60u8 {
        if mask & (1 << i) != 0 {
            minutes.push((i, decode_agg(b.get(pos..)?, width)?));
            pos += width;
        }
    }
    Some((Entry { hour, minutes }, pos))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(samples: &[(i64, f64, u32)]) -> Bucket {
        let mut b = Bucket::default();
        for &(ts, v, w) in samples {
            b.add(ts, v, v * 1.2, 1200.0 + v, w);
        }
        b
    }

    /// Records that stores already hold (format 1): a minute mask, then
    /// 56 bytes per aggregate (count, weight, Σ value, Σ TPA, Σ clock, min,
    /// max, little-endian). They decode with their jobs, unweighted sums
    /// and first samples unknown.
    #[test]
    fn format_1_records_still_decode() {
        let mut want = (1u64 << 7).to_le_bytes().to_vec();
        for (count, fs) in [
            (2u64, [400.0, 125.0, 150.0, 510_000.0, 0.25, 0.5]),
            (1, [300.0, 75.0, 90.0, 360_000.0, 0.25, 0.25]),
        ] {
            want.extend_from_slice(&count.to_le_bytes());
            for f in fs {
                want.extend_from_slice(&f64::to_le_bytes(f));
            }
        }
        let r = Rollup::decode(&want).unwrap();
        assert_eq!(r.jobs, None);
        let e = r.gpu();
        assert_eq!(e.hour.mean.count, 2);
        assert_eq!(e.hour.mean.mean(), Some(125.0 / 400.0));
        assert_eq!(e.hour.mean.plain_sum(), None);
        assert_eq!(e.hour.first, None);
        assert_eq!(e.minutes.len(), 1);
        assert_eq!(e.minutes[0].0, 7);
        assert_eq!(r.job("a"), None, "a format 1 record knows no jobs");
        assert_eq!(Rollup::decode(&want[..want.len() - 1]), None);
    }

    #[test]
    fn entries_per_job_round_trip_and_merge_for_the_gpu() {
        let a = Entry {
            hour: bucket(&[(1_000, 0.5, 100), (61_000, 0.25, 300)]),
            minutes: vec![
                (0, bucket(&[(1_000, 0.5, 100)])),
                (1, bucket(&[(61_000, 0.25, 300)])),
            ],
        };
        let b = Entry {
            hour: bucket(&[(60_000, 1.0, 100)]),
            minutes: vec![(1, bucket(&[(60_000, 1.0, 100)]))],
        };
        let r = Rollup::per_job(vec![("a".into(), a.clone()), ("b".into(), b.clone())]);
        let back = Rollup::decode(&r.encode()).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.job("a"), Some(a));
        assert_eq!(back.job("b"), Some(b));
        assert_eq!(back.job("c"), Some(Entry::default()));
        let gpu = back.gpu();
        assert_eq!(gpu.hour.mean.count, 3);
        assert_eq!(gpu.hour.mean.plain_sum(), Some(1.75));
        assert_eq!(gpu.hour.first, Some((1_000, 0.5)));
        // Minute 1 holds both jobs' samples; its first is job b's.
        assert_eq!(gpu.minutes.len(), 2);
        assert_eq!(gpu.minutes[1].1.mean.count, 2);
        assert_eq!(gpu.minutes[1].1.first, Some((60_000, 1.0)));
        let bytes = r.encode();
        for cut in 1..bytes.len() {
            assert_eq!(Rollup::decode(&bytes[..cut]), None, "cut at {cut}");
        }
    }

    #[test]
    fn garbage_is_refused_not_a_panic() {
        let mut b = FORMAT2.to_le_bytes().to_vec();
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(Rollup::decode(&b), None);
        assert_eq!(Rollup::decode(&[0xff; 8]), None);
        assert_eq!(Rollup::decode(&[]), None);
    }
}
