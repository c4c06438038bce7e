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

/// The minutes of the record `b` of the hour starting at `hour`, in
/// order, to `f`; `None` when the record is malformed.
pub(super) fn decode(hour: i64, b: &[u8], f: &mut dyn FnMut(MinuteLast)) -> Option<()> {
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let (have, on_start) = (word(0)?, word(8)?);
    let windows = have & WITH_WINDOWS != 0;
    let have = have & !WITH_WINDOWS;
    if have >> 60 != 0 || on_start & !have != 0 {
        return None;
    }
    let n = have.count_ones() as usize;
    let each = if windows { 16 } else { 12 };
    let starts = 16 + each * n;
    if b.len() != starts + 8 * on_start.count_ones() as usize {
        return None;
    }
    let (mut i, mut j) = (0, 0);
    for m in 0..60 {
        if have & (1 << m) == 0 {
            continue;
        }
        let at = 16 + each * i;
        let off = u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?);
        let v = f64::from_le_bytes(b.get(at + 4..at + 12)?.try_into().ok()?);
        let window_ms = if windows {
            Some(u32::from_le_bytes(
                b.get(at + 12..at + 16)?.try_into().ok()?,
            ))
        } else {
            None
        };
        i += 1;
        let at_start = if on_start & (1 << m) != 0 {
            let at = starts + 8 * j;
            j += 1;
            Some(f64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        } else {
            None
        };
        f(MinuteLast {
            minute: hour + m as i64 * MINUTE_MS,
            last: (hour + i64::from(off), v),
            window_ms,
            at_start,
        });
    }
    Some(())
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
        decode(h, &b, &mut |m| got.push(m)).unwrap();
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
            assert_eq!(decode(h, &b[..cut], &mut |_| {}), None, "cut at {cut}");
        }
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
        decode(h, &b, &mut |m| got.push(m)).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].last, got[0].window_ms), ((h + 7, 0.5), None));
    }
}
