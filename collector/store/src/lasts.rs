//! Minute lasts: for each minute of a sealed GPU-hour, the time and OFU of
//! its last sample (all jobs together), and the OFU of a sample lying
//! exactly on the minute's start. That is all an instant selector needs
//! at a step on a whole minute — the newest sample at or before `t` is
//! the sample on `t` if there is one, else the last of the minutes before
//! — and it is about 12 bytes a minute where a rollup's minute is 96: a
//! day of a fleet's steps reads an eighth of the bytes, none of them
//! decoded beyond a fixed layout.
//!
//! Written by compaction with the rollup (key kind [`keys::KIND_LAST`] in
//! the rollup family, the same series prefix and hour), so retention and
//! the rewrite of an hour that late samples reopen treat both alike.
//!
//! Layout (little-endian): a mask of the minutes with samples (u64; bit
//! 63 set: the samples' windows follow), a mask of those whose first
//! sample lies on the minute's start (u64); for each minute in the first
//! mask, the last sample's offset from the hour (u32, ms) and value
//! (f64), and with bit 63 its sampling window (u32, ms: when its series
//! goes stale, the collector's staleness rule); for each in the second, the value
//! on the start (f64). Records without bit 63 (written before windows
//! were kept) read with the window unknown.
//!
//! [`keys::KIND_LAST`]: super::keys::KIND_LAST

use super::hours::MINUTE_MS;

/// One minute of a GPU-hour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MinuteLast {
    /// The minute's start, unix ms.
    pub minute: i64,
    /// Time and OFU of its last sample.
    pub last: (i64, f64),
    /// That sample's window, ms (`None`: not recorded).
    pub window_ms: Option<u32>,
    /// OFU of its sample on the minute's start, if one lies there.
    pub at_start: Option<f64>,
}

/// Bit of the first mask saying the windows are recorded.
const WITH_WINDOWS: u64 = 1 << 63;

/// The record of the hour starting at `hour` from its samples (time,
/// OFU, window), in any order.
pub(super) fn encode(hour: i64, samples: impl Iterator<Item = (i64, f64, u32)>) -> Vec<u8> {
    let mut last: [Option<(i64, f64, u32)>; 60] = [None; 60];
    let mut first: [Option<(i64, f64)>; 60] = [None; 60];
    for (ts, v, w) in samples {
        let m = (ts - hour).div_euclid(MINUTE_MS);
        let Ok(m) = usize::try_from(m) else { continue };
        if m >= 60 {
            continue;
        }
        if last[m].is_none_or(|(t, _, _)| ts >= t) {
            last[m] = Some((ts, v, w));
        }
        if first[m].is_none_or(|(t, _)| ts < t) {
            first[m] = Some((ts, v));
        }
    }
    let (mut have, mut on_start) = (0u64, 0u64);
    for m in 0..60 {
        if last[m].is_some() {
            have |= 1 << m;
        }
        if first[m].is_some_and(|(t, _)| t == hour + m as i64 * MINUTE_MS) {
            on_start |= 1 << m;
        }
    }
    let mut out = Vec::with_capacity(16 + 16 * 60);
    out.extend_from_slice(&(have | WITH_WINDOWS).to_le_bytes());
    out.extend_from_slice(&on_start.to_le_bytes());
    for (ts, v, w) in last.iter().flatten() {
        out.extend_from_slice(&((ts - hour) as u32).to_le_bytes());
        out.extend_from_slice(&v.to_le_bytes());
        out.extend_from_slice(&w.to_le_bytes());
    }
    for (m, f) in first.iter().enumerate() {
        if on_start & (1 << m) != 0 {
            out.extend_from_slice(&f.map_or(f64::NAN, |f| f.1).to_le_bytes());
        }
    }
    out
}

/// A sealed hour's minute lasts, read in place from its record: what
/// [`crate::Store::ofu_lasts`] hands over, one record at a time, so a
/// reader fills its per-minute arrays without a call per minute.
#[derive(Debug, Clone, Copy)]
pub struct HourLasts<'a> {
    hour: i64,
    /// Minutes with samples.
    have: u64,
    /// Of those, the minutes with a sample on their start.
    on_start: u64,
    /// The minutes handed over (the reader's range).
    wanted: u64,
    /// Minutes whose sample on the start is not handed over (it lies
    /// before the reader's range).
    no_start: u64,
    /// Bytes per minute entry (16 with windows, 12 without).
    each: usize,
    windows: bool,
    b: &'a [u8],
}

impl<'a> HourLasts<'a> {
    /// The record `b` of the hour starting at `hour`; `None` when it is
    /// malformed.
    pub(super) fn parse(hour: i64, b: &'a [u8]) -> Option<Self> {
        let word = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        let (have, on_start) = (word(0)?, word(8)?);
        let windows = have & WITH_WINDOWS != 0;
        let have = have & !WITH_WINDOWS;
        if have >> 60 != 0 || on_start & !have != 0 {
            return None;
        }
        let each = if windows { 16 } else { 12 };
        let starts = 16 + each * have.count_ones() as usize;
        if b.len() != starts + 8 * on_start.count_ones() as usize {
            return None;
        }
        Some(Self {
            hour,
            have,
            on_start,
            wanted: u64::MAX,
            no_start: 0,
            each,
            windows,
            b,
        })
    }

    /// Only the minutes of `mask` (bit `m`: minute `m` of the hour).
    pub(super) fn only(self, mask: u64) -> Self {
        Self {
            wanted: self.wanted & mask,
            ..self
        }
    }

    /// Without the samples on the start of the minutes of `mask`.
    pub(super) fn without_start(self, mask: u64) -> Self {
        Self {
            no_start: self.no_start | mask,
            ..self
        }
    }

    /// The hour's start, unix ms.
    pub fn hour(&self) -> i64 {
        self.hour
    }

    /// How many minutes [`HourLasts::for_each`] hands over.
    pub fn len(&self) -> usize {
        (self.have & self.wanted).count_ones() as usize
    }

    /// Whether no minute is handed over.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The time of the last sample of minute `m` (0–59) of the hour, if
    /// it has samples.
    pub fn last_of(&self, m: u32) -> Option<i64> {
        if m >= 60 || self.have & (1 << m) == 0 {
            return None;
        }
        let at = 16 + self.each * (self.have & ((1 << m) - 1)).count_ones() as usize;
        let off = u32::from_le_bytes(self.b.get(at..at + 4)?.try_into().ok()?);
        Some(self.hour + i64::from(off))
    }

    /// The minutes, in order, to `f`.
    #[inline]
    pub fn for_each(&self, mut f: impl FnMut(MinuteLast)) {
        let windows = self.windows;
        self.for_each_entry(|m, off, v, w, at_start| {
            f(MinuteLast {
                minute: self.hour + i64::from(m) * MINUTE_MS,
                last: (self.hour + i64::from(off), v),
                window_ms: windows.then_some(w),
                at_start,
            })
        });
    }

    /// The minutes, in order, to `f` as they lie in the record: the
    /// minute of the hour (0–59), its last sample's offset from the hour
    /// (ms) and value, that sample's window (ms; 0 where the record keeps
    /// none, [`HourLasts::has_windows`]) and the value on the minute's
    /// start. What a reader's inner loop takes: nothing is built per
    /// minute and no entry is bounds-checked twice.
    #[inline]
    pub fn for_each_entry(&self, mut f: impl FnMut(u32, u32, f64, u32, Option<f64>)) {
        // `parse` checked that the entries (`each` bytes, 12 or 16) and
        // the values on starts fill the record exactly.
        let body = self.b.get(16..).unwrap_or_default();
        let n = self.have.count_ones() as usize;
        let (entries, starts) = body.split_at(body.len().min(self.each * n));
        let (starts, _) = starts.as_chunks::<8>();
        let (mut entries, mut starts) = (entries.chunks_exact(self.each), starts.iter());
        let (mut bits, on_start, given) = (self.have, self.on_start, self.wanted);
        let (no_start, windows) = (self.no_start, self.windows);
        while bits != 0 {
            let m = bits.trailing_zeros();
            bits &= bits - 1;
            let Some(e) = entries.next() else { return };
            let at_start = match on_start >> m & 1 != 0 {
                true => starts.next().map(|s| f64::from_le_bytes(*s)),
                false => None,
            };
            if given >> m & 1 == 0 {
                continue;
            }
            let (Some(off), Some(v)) = (e.first_chunk::<4>(), e.get(4..12)) else {
                return;
            };
            let mut value = [0u8; 8];
            value.copy_from_slice(v);
            let w = match (windows, e.get(12..16)) {
                (true, Some(w)) => u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
                _ => 0,
            };
            let at_start = at_start.filter(|_| no_start >> m & 1 == 0);
            f(
                m,
                u32::from_le_bytes(*off),
                f64::from_le_bytes(value),
                w,
                at_start,
            );
        }
    }

    /// Whether the record keeps its samples' windows.
    pub fn has_windows(&self) -> bool {
        self.windows
    }

    /// The record's entries as they lie, where it hands over every minute
    /// it has, each with its value on the start, and keeps its samples'
    /// windows (the common case: an hour wholly inside a reader's range):
    /// what a reader's tightest loop walks.
    pub fn whole(&self) -> Option<WholeHour<'a>> {
        if !self.windows || self.have & !self.wanted != 0 || self.no_start != 0 {
            return None;
        }
        let n = self.have.count_ones() as usize;
        let (entries, starts) = self.b.get(16..)?.split_at_checked(16 * n)?;
        let (entries, _) = entries.as_chunks::<16>();
        let (starts, _) = starts.as_chunks::<8>();
        Some(WholeHour {
            hour: self.hour,
            have: self.have,
            on_start: self.on_start,
            entries,
            starts,
        })
    }
}

/// A sealed hour's minute lasts, every one handed over
/// ([`HourLasts::whole`]): for the `k`-th minute of `have` (in order),
/// entry `k` (its last sample's offset from the hour, u32 ms; value, f64;
/// window, u32 ms; little-endian); for the `j`-th minute of `on_start`,
/// the value on its start, `starts[j]`.
#[derive(Debug, Clone, Copy)]
pub struct WholeHour<'a> {
    pub hour: i64,
    pub have: u64,
    pub on_start: u64,
    pub entries: &'a [[u8; 16]],
    pub starts: &'a [[u8; 8]],
}

impl WholeHour<'_> {
    /// An entry's offset from the hour (ms), value and window (ms).
    #[inline(always)]
    pub fn entry(e: &[u8; 16]) -> (u32, f64, u32) {
        let [a, b, c, d, v0, v1, v2, v3, v4, v5, v6, v7, w0, w1, w2, w3] = *e;
        (
            u32::from_le_bytes([a, b, c, d]),
            f64::from_le_bytes([v0, v1, v2, v3, v4, v5, v6, v7]),
            u32::from_le_bytes([w0, w1, w2, w3]),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_round_trip_with_their_last_and_on_start_samples() {
        let h = 1_700_000_000_000 / 3_600_000 * 3_600_000;
        let samples = [
            (h + 60_000, 0.5, 100),
            (h + 61_000, 0.25, 100),
            (h + 119_999, 0.75, 30_000),
            (h + 5, 1.0, 100),
            (h + 59 * 60_000 + 59_999, 0.125, 0),
        ];
        let b = encode(h, samples.iter().copied());
        let mut got = Vec::new();
        HourLasts::parse(h, &b).unwrap().for_each(|m| got.push(m));
        assert_eq!(
            got,
            vec![
                MinuteLast {
                    minute: h,
                    last: (h + 5, 1.0),
                    window_ms: Some(100),
                    at_start: None
                },
                MinuteLast {
                    minute: h + 60_000,
                    last: (h + 119_999, 0.75),
                    window_ms: Some(30_000),
                    at_start: Some(0.5)
                },
                MinuteLast {
                    minute: h + 59 * 60_000,
                    last: (h + 59 * 60_000 + 59_999, 0.125),
                    window_ms: Some(0),
                    at_start: None
                },
            ]
        );
        for cut in 0..b.len() {
            assert!(HourLasts::parse(h, &b[..cut]).is_none(), "cut at {cut}");
        }
        let mut some = Vec::new();
        let only = HourLasts::parse(h, &b).unwrap().only(0b10);
        assert_eq!(only.len(), 1);
        only.for_each(|m| some.push(m));
        assert_eq!(some, got[1..2]);
        assert_eq!(encode(h, std::iter::empty()).len(), 16);
    }

    /// An hour handed over whole gives its entries and values on starts
    /// as they lie: what `for_each` gives, minute by minute; an hour cut
    /// by a reader's range, or without windows, is not whole.
    #[test]
    fn a_whole_hour_gives_what_its_minutes_give() {
        let h = 1_700_000_000_000 / 3_600_000 * 3_600_000;
        let samples: Vec<(i64, f64, u32)> = [0, 5, 60_000, 61_500, 180_000, 3_599_999]
            .iter()
            .enumerate()
            .map(|(i, &t)| (h + t, i as f64 / 8.0, 100 + i as u32))
            .collect();
        let b = encode(h, samples.iter().copied());
        let lasts = HourLasts::parse(h, &b).unwrap();
        let whole = lasts.whole().unwrap();
        let mut from_whole = Vec::new();
        let (mut bits, mut starts) = (whole.have, whole.starts.iter());
        for e in whole.entries {
            let m = bits.trailing_zeros();
            bits &= bits - 1;
            let (off, v, w) = WholeHour::entry(e);
            let at_start =
                (whole.on_start >> m & 1 != 0).then(|| f64::from_le_bytes(*starts.next().unwrap()));
            from_whole.push(MinuteLast {
                minute: h + i64::from(m) * MINUTE_MS,
                last: (h + i64::from(off), v),
                window_ms: Some(w),
                at_start,
            });
        }
        assert_eq!(bits, 0);
        assert!(starts.next().is_none());
        let mut got = Vec::new();
        lasts.for_each(|m| got.push(m));
        assert_eq!(from_whole, got);
        assert_eq!(got.iter().filter(|m| m.at_start.is_some()).count(), 3);
        assert!(lasts.only(0b1).whole().is_none());
        assert!(lasts.without_start(0b1).whole().is_none());
    }

    #[test]
    fn records_without_windows_still_read() {
        // The layout before windows: minute 0 only, 12 bytes a minute.
        let h = 1_700_000_000_000 / 3_600_000 * 3_600_000;
        let mut b = Vec::new();
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&7u32.to_le_bytes());
        b.extend_from_slice(&0.5f64.to_le_bytes());
        let mut got = Vec::new();
        HourLasts::parse(h, &b).unwrap().for_each(|m| got.push(m));
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].last, got[0].window_ms), ((h + 7, 0.5), None));
        assert!(HourLasts::parse(h, &b).unwrap().whole().is_none());
    }
}
