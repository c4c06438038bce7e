//! The on-disk spool: every batch the agent cuts, written ahead of sending.
//!
//! Layout of the spool directory:
//!
//! * `seg-<first seq, 20 digits>.spool`: append-only segments of records,
//!   each `FWS1` · payload length (u32 LE) · CRC-32 of the payload (u32 LE)
//!   · payload (a protobuf `Batch`, its `seq` already set);
//! * `state`: the next sequence number and the highest acknowledged one,
//!   rewritten (temporary file + rename) at every fsync;
//! * `*.bad`: bytes set aside by recovery (a truncated or corrupt record).
//!
//! A batch gets its sequence number here, when it is written, so a resend
//! after any restart carries the same number and the collector drops the
//! replay. Records are written with one `write(2)` each as soon as a batch is
//! cut, so a kill -9 of the agent loses only the batch being assembled
//! (at most `flush_interval` of samples, or 10 s while adaptive sampling
//! has backed off, `batcher::MAX_BATCH_AGE`); the file is fsynced every
//! `fsync_interval`, which bounds what a power loss can take besides.
//!
//! Segments whose records are all acknowledged are deleted. Past
//! `max_bytes` the oldest segment is deleted even if unacknowledged, and its
//! batches are counted as dropped.

use flopwatch_proto::v1;
use prost::Message;
use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

const MAGIC: &[u8; 4] = b"FWS1";
const HEADER: usize = 12;
/// Largest payload a record may claim (a sanity bound for recovery).
const MAX_RECORD: usize = 64 << 20;

/// Spool settings.
#[derive(Debug, Clone)]
pub struct SpoolOptions {
    /// Directory (created if missing).
    pub dir: PathBuf,
    /// Size cap of the segments together, bytes.
    pub max_bytes: u64,
    /// fsync period.
    pub fsync_interval: Duration,
}

/// Counters of the spool.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Batches written.
    pub written_batches: AtomicU64,
    /// Bytes written (records, framing included).
    pub written_bytes: AtomicU64,
    /// Unacknowledged batches deleted because the spool was full.
    pub dropped_batches: AtomicU64,
    /// Bytes of the segments deleted because the spool was full.
    pub dropped_bytes: AtomicU64,
    /// Truncated or corrupt records set aside at startup.
    pub bad_records: AtomicU64,
    /// Bytes set aside with them.
    pub bad_bytes: AtomicU64,
    /// Write, read or fsync failures.
    pub io_errors: AtomicU64,
    /// Bytes on disk now (gauge).
    pub bytes: AtomicU64,
}

/// One segment file. Its numbers are consecutive (a new run of the agent,
/// or a jump in numbering, starts a new segment).
struct Segment {
    first_seq: u64,
    last_seq: u64,
    records: u64,
    bytes: u64,
    path: PathBuf,
}

/// Where the reader stands: in the segment starting at `first_seq`, at
/// `offset`, having returned every record up to `after`.
#[derive(Clone, Copy)]
struct Cursor {
    first_seq: u64,
    offset: u64,
    after: u64,
}

/// The spool (not thread-safe; the outbox holds it under its lock).
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    segment_max: u64,
    segments: VecDeque<Segment>,
    active: Option<File>,
    next_seq: u64,
    acked: u64,
    cursor: Option<Cursor>,
    stats: Arc<SpoolStats>,
}

/// CRC-32 (IEEE 802.3, reflected), as used by zlib and PNG.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    let mut c = !0u32;
    for &b in data {
        c = TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8);
    }
    !c
}

/// One framed record.
pub(crate) fn frame(batch: &v1::Batch) -> Vec<u8> {
    let payload = batch.encode_to_vec();
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// The record at `off` of `data`, and where the next one starts; `None`
/// when there is no whole, intact record there.
fn parse_at(data: &[u8], off: usize) -> Option<(v1::Batch, usize)> {
    let h = data.get(off..off + HEADER)?;
    if &h[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(h[4..8].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(h[8..12].try_into().ok()?);
    if len > MAX_RECORD {
        return None;
    }
    let payload = data.get(off + HEADER..off + HEADER + len)?;
    if crc32(payload) != crc {
        return None;
    }
    let batch = v1::Batch::decode(payload).ok()?;
    if batch.seq == 0 {
        return None;
    }
    Some((batch, off + HEADER + len))
}

fn segment_name(first_seq: u64) -> String {
    format!("seg-{first_seq:020}.spool")
}

fn parse_segment_name(name: &str) -> Option<u64> {
    name.strip_prefix("seg-")?
        .strip_suffix(".spool")?
        .parse()
        .ok()
}

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// What [`Spool::prepare_sync`] hands to the fsync, run outside the lock.
pub struct SyncJob {
    file: Option<File>,
    state_path: PathBuf,
    state: String,
}

impl SyncJob {
    /// fsyncs the active segment and rewrites the state file.
    pub fn run(self) -> io::Result<()> {
        if let Some(f) = &self.file {
            f.sync_data()?;
        }
        let tmp = self.state_path.with_extension("tmp");
        {
            let mut f = File::create(&tmp)?;
            f.write_all(self.state.as_bytes())?;
            f.sync_data()?;
        }
        fs::rename(&tmp, &self.state_path)?;
        Ok(())
    }
}

impl Spool {
    /// Opens (or creates) the spool in `opts.dir`, checking every record:
    /// a truncated or corrupt one is moved to a `.bad` file beside its
    /// segment and counted, and the agent goes on with the rest.
    pub fn open(opts: &SpoolOptions, stats: Arc<SpoolStats>) -> io::Result<Self> {
        fs::create_dir_all(&opts.dir)?;
        let (mut next_seq, acked) = read_state(&opts.dir.join("state"));
        let mut names = Vec::new();
        for e in fs::read_dir(&opts.dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            } else if let Some(first) = parse_segment_name(&name) {
                names.push((first, e.path()));
            }
        }
        names.sort();
        let mut segments = VecDeque::new();
        for (first, path) in names {
            if let Some(seg) = recover_segment(&path, first, &stats)? {
                next_seq = next_seq.max(seg.last_seq + 1);
                segments.push_back(seg);
            }
        }
        let max_bytes = opts.max_bytes.max(64 * 1024);
        let mut spool = Self {
            dir: opts.dir.clone(),
            max_bytes,
            segment_max: (max_bytes / 8).clamp(16 * 1024, 16 << 20),
            segments,
            active: None,
            next_seq: next_seq.max(1),
            acked,
            cursor: None,
            stats,
        };
        spool.delete_acked();
        spool.update_bytes();
        let backlog = spool.count_after(acked);
        info!(dir = %opts.dir.display(), next_seq = spool.next_seq, acked, backlog, "spool opened");
        Ok(spool)
    }

    /// The counters.
    pub fn stats(&self) -> Arc<SpoolStats> {
        self.stats.clone()
    }

    /// The number the next batch gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Highest acknowledged number known.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// Highest number written (0 when none).
    pub fn last_seq(&self) -> u64 {
        self.next_seq - 1
    }

    /// Numbers below `seq` are taken (a collector acknowledged them, or an
    /// earlier run may have used them). A jump starts a new segment, so
    /// numbers within a segment stay consecutive.
    pub fn reserve_below(&mut self, seq: u64) {
        if seq > self.next_seq {
            self.next_seq = seq;
            self.active = None;
        }
    }

    /// Records held numbered above `seq`.
    pub fn count_after(&self, seq: u64) -> u64 {
        self.segments
            .iter()
            .map(|s| {
                if s.first_seq > seq {
                    s.records
                } else if s.last_seq > seq {
                    (s.last_seq - seq).min(s.records)
                } else {
                    0
                }
            })
            .sum()
    }

    /// The last number of the segment holding the first record above
    /// `seq` (to skip a segment that cannot be read).
    pub fn segment_end_after(&self, seq: u64) -> u64 {
        self.segments
            .iter()
            .find(|s| s.last_seq > seq)
            .map(|s| s.last_seq)
            .unwrap_or_else(|| self.last_seq())
    }

    /// Bytes of the segments on disk.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.bytes).sum()
    }

    fn update_bytes(&self) {
        self.stats.bytes.store(self.bytes(), Ordering::Relaxed);
    }

    /// Numbers `batch` and appends it. The number is kept even when the
    /// write fails (the batch then lives in memory only).
    pub fn append(&mut self, batch: &mut v1::Batch) -> io::Result<()> {
        batch.seq = self.next_seq;
        self.next_seq += 1;
        let rec = frame(batch);
        let r = self.write_record(batch.seq, &rec);
        if r.is_err() {
            self.stats.io_errors.fetch_add(1, Ordering::Relaxed);
        }
        self.enforce_cap();
        self.update_bytes();
        r
    }

    fn write_record(&mut self, seq: u64, rec: &[u8]) -> io::Result<()> {
        let rotate = match (self.segments.back(), &self.active) {
            (Some(s), Some(_)) => s.bytes >= self.segment_max,
            _ => true,
        };
        if rotate {
            let path = self.dir.join(segment_name(seq));
            let f = OpenOptions::new().create(true).append(true).open(&path)?;
            // A fresh segment starts empty (a leftover of the same name
            // would have been read at open).
            f.set_len(0)?;
            sync_dir(&self.dir);
            self.active = Some(f);
            self.segments.push_back(Segment {
                first_seq: seq,
                last_seq: seq - 1,
                records: 0,
                bytes: 0,
                path,
            });
        }
        let f = self
            .active
            .as_mut()
            .ok_or_else(|| io::Error::other("no segment"))?;
        let seg = self
            .segments
            .back_mut()
            .ok_or_else(|| io::Error::other("no segment"))?;
        if let Err(e) = f.write_all(rec) {
            // Leave no partial record behind: cut the file back.
            let _ = f.set_len(seg.bytes);
            self.active = None;
            return Err(e);
        }
        seg.bytes += rec.len() as u64;
        seg.last_seq = seq;
        seg.records += 1;
        self.stats.written_batches.fetch_add(1, Ordering::Relaxed);
        self.stats
            .written_bytes
            .fetch_add(rec.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn enforce_cap(&mut self) {
        while self.bytes() > self.max_bytes && self.segments.len() > 1 {
            let Some(seg) = self.segments.pop_front() else {
                break;
            };
            let unacked = seg
                .last_seq
                .saturating_sub(self.acked.max(seg.first_seq.saturating_sub(1)));
            if unacked > 0 {
                self.stats
                    .dropped_batches
                    .fetch_add(unacked, Ordering::Relaxed);
                self.stats
                    .dropped_bytes
                    .fetch_add(seg.bytes, Ordering::Relaxed);
                warn!(
                    batches = unacked,
                    bytes = seg.bytes,
                    "spool full (spool.max_bytes): oldest unacknowledged batches dropped"
                );
            }
            if let Err(e) = fs::remove_file(&seg.path) {
                warn!(path = %seg.path.display(), error = %e, "cannot delete spool segment");
            }
            if self.cursor.is_some_and(|c| c.first_seq == seg.first_seq) {
                self.cursor = None;
            }
        }
    }

    /// Every batch up to `seq` is durable on a collector: deletes the
    /// segments that hold nothing else.
    pub fn ack(&mut self, seq: u64) {
        if seq <= self.acked {
            return;
        }
        self.acked = seq;
        self.delete_acked();
        self.update_bytes();
    }

    fn delete_acked(&mut self) {
        while let Some(seg) = self.segments.front() {
            let is_active = self.segments.len() == 1 && self.active.is_some();
            if seg.last_seq > self.acked || is_active {
                break;
            }
            if let Some(seg) = self.segments.pop_front() {
                let _ = fs::remove_file(&seg.path);
            }
        }
        // A fully acknowledged active segment is closed, so the next batch
        // starts a new one and this one can go.
        if let Some(seg) = self.segments.back() {
            if self.active.is_some() && seg.last_seq <= self.acked && seg.bytes > 0 {
                self.active = None;
                if let Some(seg) = self.segments.pop_back() {
                    let _ = fs::remove_file(&seg.path);
                }
            }
        }
    }

    /// Up to `max` batches numbered above `after`, in order.
    pub fn read_after(&mut self, after: u64, max: usize) -> Vec<v1::Batch> {
        let mut out = Vec::new();
        if max == 0 || after >= self.last_seq() {
            return out;
        }
        let mut cur = match self.cursor {
            Some(c)
                if c.after == after && self.segments.iter().any(|s| s.first_seq == c.first_seq) =>
            {
                c
            }
            _ => match self.segments.iter().find(|s| s.last_seq > after) {
                Some(s) => Cursor {
                    first_seq: s.first_seq,
                    offset: 0,
                    after,
                },
                None => return out,
            },
        };
        while out.len() < max {
            let Some(idx) = self
                .segments
                .iter()
                .position(|s| s.first_seq == cur.first_seq)
            else {
                break;
            };
            let seg_bytes = self.segments[idx].bytes;
            if cur.offset >= seg_bytes {
                match self.segments.get(idx + 1) {
                    Some(n) => {
                        cur.first_seq = n.first_seq;
                        cur.offset = 0;
                        continue;
                    }
                    None => break,
                }
            }
            let path = self.segments[idx].path.clone();
            match read_records(&path, cur.offset, seg_bytes, cur.after, max - out.len()) {
                Ok((batches, offset)) => {
                    if let Some(b) = batches.last() {
                        cur.after = b.seq;
                    }
                    cur.offset = offset;
                    let progressed = !batches.is_empty();
                    out.extend(batches);
                    if !progressed && cur.offset < seg_bytes {
                        break;
                    }
                }
                Err(e) => {
                    self.stats.io_errors.fetch_add(1, Ordering::Relaxed);
                    warn!(path = %path.display(), error = %e, "cannot read spool segment");
                    break;
                }
            }
        }
        self.cursor = Some(cur);
        out
    }

    /// The fsync to run outside the outbox's lock.
    pub fn prepare_sync(&self) -> SyncJob {
        SyncJob {
            file: self.active.as_ref().and_then(|f| f.try_clone().ok()),
            state_path: self.dir.join("state"),
            state: format!("next_seq={}\nacked={}\n", self.next_seq, self.acked),
        }
    }
}

/// Reads records of one segment from `offset` (up to `end`), skipping
/// those numbered at or below `after`; returns them and the offset reached.
fn read_records(
    path: &Path,
    offset: u64,
    end: u64,
    after: u64,
    max: usize,
) -> io::Result<(Vec<v1::Batch>, u64)> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut data = Vec::new();
    f.take(end - offset).read_to_end(&mut data)?;
    let mut out = Vec::new();
    let mut off = 0usize;
    while out.len() < max {
        match parse_at(&data, off) {
            Some((b, next)) => {
                off = next;
                if b.seq > after {
                    out.push(b);
                }
            }
            None => break,
        }
    }
    Ok((out, offset + off as u64))
}

fn read_state(path: &Path) -> (u64, u64) {
    let Ok(text) = fs::read_to_string(path) else {
        return (1, 0);
    };
    let mut next = None;
    let mut acked = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("next_seq", v)) => next = v.trim().parse::<u64>().ok(),
            Some(("acked", v)) => acked = v.trim().parse::<u64>().ok(),
            _ => {}
        }
    }
    match (next, acked) {
        (Some(n), Some(a)) => (n.max(1), a),
        _ => {
            warn!(path = %path.display(), "spool state unreadable; numbering from the records");
            (1, 0)
        }
    }
}

/// Checks a segment; sets bad regions aside in `<segment>.<offset>.bad`
/// and rewrites the segment without them. `None` when nothing good is
/// left.
fn recover_segment(path: &Path, first: u64, stats: &SpoolStats) -> io::Result<Option<Segment>> {
    let data = fs::read(path)?;
    let mut good: Vec<std::ops::Range<usize>> = Vec::new();
    let mut bad: Vec<std::ops::Range<usize>> = Vec::new();
    let mut first_seq = None;
    let mut last_seq = 0u64;
    let mut off = 0usize;
    while off < data.len() {
        match parse_at(&data, off) {
            Some((b, next)) if b.seq > last_seq => {
                first_seq.get_or_insert(b.seq);
                last_seq = b.seq;
                good.push(off..next);
                off = next;
            }
            _ => {
                // Resynchronise on the next intact record.
                let mut next = off + 1;
                while next < data.len() {
                    if data[next..].starts_with(MAGIC)
                        && parse_at(&data, next).is_some_and(|(b, _)| b.seq > last_seq)
                    {
                        break;
                    }
                    next += 1;
                }
                bad.push(off..next);
                off = next;
            }
        }
    }
    if !bad.is_empty() {
        for r in &bad {
            let aside = path.with_extension(format!("{}.bad", r.start));
            fs::write(&aside, &data[r.clone()])?;
            stats.bad_records.fetch_add(1, Ordering::Relaxed);
            stats
                .bad_bytes
                .fetch_add((r.end - r.start) as u64, Ordering::Relaxed);
            warn!(
                segment = %path.display(),
                offset = r.start,
                bytes = r.end - r.start,
                aside = %aside.display(),
                "truncated or corrupt spool record set aside"
            );
        }
        let tmp = path.with_extension("tmp");
        {
            let mut f = File::create(&tmp)?;
            for r in &good {
                f.write_all(&data[r.clone()])?;
            }
            f.sync_data()?;
        }
        fs::rename(&tmp, path)?;
    }
    let bytes: u64 = good.iter().map(|r| (r.end - r.start) as u64).sum();
    match first_seq {
        Some(f) if bytes > 0 => {
            // The name keeps the number it was created with.
            let _ = first;
            Ok(Some(Segment {
                first_seq: f.min(first.max(1)),
                last_seq,
                records: good.len() as u64,
                bytes,
                path: path.to_path_buf(),
            }))
        }
        _ => {
            fs::remove_file(path)?;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> v1::Batch {
        v1::Batch {
            agent_id: "a".into(),
            series: vec![v1::Series {
                gpu_uuid: "GPU-1".into(),
                metric: "power_w".into(),
                timestamps_ms: (0..n as i64).collect(),
                values: vec![1.0; n],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn opts(dir: &Path, max: u64) -> SpoolOptions {
        SpoolOptions {
            dir: dir.to_path_buf(),
            max_bytes: max,
            fsync_interval: Duration::from_secs(1),
        }
    }

    #[test]
    fn crc32_matches_the_reference_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn survives_reopen_and_continues_numbering() {
        let d = tempfile::tempdir().unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats.clone()).unwrap();
        for _ in 0..5 {
            s.append(&mut batch(3)).unwrap();
        }
        s.ack(2);
        s.prepare_sync().run().unwrap();
        drop(s);
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats).unwrap();
        assert_eq!(s.next_seq(), 6);
        assert_eq!(s.acked(), 2);
        let got: Vec<u64> = s.read_after(2, 10).iter().map(|b| b.seq).collect();
        assert_eq!(got, vec![3, 4, 5]);
        let mut b = batch(1);
        s.append(&mut b).unwrap();
        assert_eq!(b.seq, 6);
        assert_eq!(s.read_after(5, 10)[0].seq, 6);
    }

    #[test]
    fn a_new_run_numbers_above_every_earlier_one_and_counts_records() {
        let d = tempfile::tempdir().unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats.clone()).unwrap();
        for _ in 0..3 {
            s.append(&mut batch(1)).unwrap();
        }
        drop(s);
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats).unwrap();
        s.reserve_below(1_000_000);
        let mut b = batch(1);
        s.append(&mut b).unwrap();
        assert_eq!(b.seq, 1_000_000);
        assert_eq!(s.count_after(0), 4, "records, not numbers");
        assert_eq!(s.count_after(2), 2);
        let got: Vec<u64> = s.read_after(0, 10).iter().map(|b| b.seq).collect();
        assert_eq!(got, vec![1, 2, 3, 1_000_000]);
        assert_eq!(s.segment_end_after(0), 3);
        s.ack(3);
        assert_eq!(s.count_after(0), 1);
    }

    #[test]
    fn cap_drops_the_oldest_segment_and_counts() {
        let d = tempfile::tempdir().unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 64 * 1024), stats.clone()).unwrap();
        for _ in 0..200 {
            s.append(&mut batch(100)).unwrap();
        }
        assert!(s.bytes() <= 64 * 1024, "{}", s.bytes());
        let dropped = stats.dropped_batches.load(Ordering::Relaxed);
        assert!(dropped > 0);
        let rest = s.read_after(0, 1000);
        assert_eq!(rest.len() as u64 + dropped, 200);
        assert_eq!(rest.last().unwrap().seq, 200);
        assert!(rest.windows(2).all(|w| w[1].seq == w[0].seq + 1));
    }

    #[test]
    fn acked_segments_are_deleted() {
        let d = tempfile::tempdir().unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 64 * 1024), stats).unwrap();
        for _ in 0..100 {
            s.append(&mut batch(100)).unwrap();
        }
        s.ack(100);
        assert_eq!(s.bytes(), 0);
        assert_eq!(s.count_after(0), 0);
        assert!(s.read_after(100, 10).is_empty());
    }

    #[test]
    fn corrupt_and_truncated_records_are_set_aside_and_counted() {
        let d = tempfile::tempdir().unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats).unwrap();
        for _ in 0..4 {
            s.append(&mut batch(10)).unwrap();
        }
        s.prepare_sync().run().unwrap();
        drop(s);
        let seg = d.path().join(segment_name(1));
        let mut data = fs::read(&seg).unwrap();
        let rec = data.len() / 4;
        // Flip a byte in the second record, cut the fourth in half.
        data[rec + HEADER + 3] ^= 0xFF;
        data.truncate(3 * rec + rec / 2);
        fs::write(&seg, &data).unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats.clone()).unwrap();
        assert_eq!(stats.bad_records.load(Ordering::Relaxed), 2);
        let got: Vec<u64> = s.read_after(0, 10).iter().map(|b| b.seq).collect();
        assert_eq!(got, vec![1, 3]);
        assert_eq!(s.next_seq(), 5, "numbers already used are not reused");
        let bad = fs::read_dir(d.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".bad")
            })
            .count();
        assert_eq!(bad, 2);
    }

    #[test]
    fn garbage_file_is_set_aside_entirely() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join(segment_name(7)), b"not a spool at all").unwrap();
        fs::write(d.path().join("state"), b"garbage").unwrap();
        let stats = Arc::new(SpoolStats::default());
        let mut s = Spool::open(&opts(d.path(), 1 << 20), stats.clone()).unwrap();
        assert_eq!(stats.bad_records.load(Ordering::Relaxed), 1);
        assert!(s.read_after(0, 10).is_empty());
        let mut b = batch(1);
        s.append(&mut b).unwrap();
        assert_eq!(b.seq, 1);
    }
}
