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
        let (b, each) = (self.b, self.each);
        let starts = 16 + each * self.have.count_ones() as usize;
        let f64_at = |at: usize| f64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
        let (mut i, mut j, mut bits) = (0usize, 0usize, self.have);
        while bits != 0 {
            let m = bits.trailing_zeros();
            bits &= bits - 1;
            let at = 16 + each * i;
            i += 1;
            let start = self.on_start & (1 << m) != 0;
            let at_start = (start && self.no_start & (1 << m) == 0).then(|| f64_at(starts + 8 * j));
            j += usize::from(start);
            if self.wanted & (1 << m) == 0 {
                continue;
            }
            f(MinuteLast {
                minute: self.hour + i64::from(m) * MINUTE_MS,
                last: (self.hour + i64::from(u32_at(at)), f64_at(at + 4)),
                window_ms: self.windows.then(|| u32_at(at + 12)),
                at_start,
            });
        }
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
    }
}
