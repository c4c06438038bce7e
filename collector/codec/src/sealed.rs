//! Sealed chunks, format version 3: prediction and an entropy stage.
//!
//! Layout: `3 | flags | columns | count varint`, then for a non-empty
//! block: first timestamp (zigzag varint), the timestamps' step `g` (the
//! greatest common divisor of the intervals; varint), the window mode
//! byte (when windows are present), the *time stream*, then each column.
//! Streams are length-prefixed range-coded bytes ([`super::entropy`]).
//! With the *shared time* flag, everything between the count and the
//! columns is left out: the block's timestamps and windows are another
//! block's, which the reader supplies ([`Block::decode_shared`]).
//!
//! * **Time stream**: per sample, the change of the interval in units of
//!   `g` (0 while the interval holds: a few thousandths of a bit), and the
//!   window against the gap to the previous sample (a sampler's window
//!   usually is that gap) or against the previous window, whichever the
//!   encoder found smaller.
//! * **Columns**: each value as an integer `s` with `value = s / D`, where
//!   `D = 10^j` (a reading printed with `j` decimals) or, *windowed*,
//!   `D = window × 10^j`: a window mean of decimal readings of equal
//!   windows is their integer sum over the window (the agent's adaptive
//!   mean, `Σ vᵢ·wᵢ / Σ wᵢ`). The division in `f64` may land a few units in
//!   the last place (ulps) off the value the agent computed; that offset is
//!   stored too, so the value comes back bit for bit. Values with no such
//!   form (NaN, −0.0, a weighted mean) are *escaped*: stored as the XOR
//!   of their bits with the previous value's. The integers are predicted
//!   from a running level (the mean of the last `2^k` values, per unit of
//!   window, restarted at a jump) — or, for a column after the first, from
//!   the first column at the same sample (a window peak from its mean) —
//!   and the residuals entropy-coded. The encoder tries the predictors on
//!   the first samples, and keeps the column as plain Gorilla XOR if that
//!   is smaller.
//!
//! The decoder checks every bound and never panics; floating-point steps
//! are single IEEE operations (exact on every platform), and the entropy
//! models are integers, so a chunk decodes identically on any host.

use super::bits::{
    decode_xor, put_bytes, put_varint, unzigzag, varint_len, xor_stream, zigzag, Reader,
};
use super::entropy::{Decoder, Encoder, Model, Patterns, Residuals};
use super::{Block, CodecError, MAX_BLOCK_SAMPLES};
use std::collections::VecDeque;

pub(super) const VERSION_SEALED: u8 = 3;
/// Most value columns of a version-3 block (more use version 2).
pub(super) const MAX_COLS: usize = 8;
const FLAG_WINDOWS: u8 = 1;
/// The block stores no timestamps or windows: they are another block's,
/// given to the decoder ([`Block::encode_compact_shared`]).
const FLAG_SHARED_TIME: u8 = 2;

const WINDOW_VS_GAP: u8 = 0;
const WINDOW_VS_PREV: u8 = 1;

const COL_XOR: u8 = 0;
const COL_SCALED: u8 = 2;

const SCALED_WINDOWED: u8 = 1;
const SCALED_ULPS: u8 = 2;
const SCALED_ESCAPES: u8 = 4;

/// Predictor byte: the level's length as a power of two in the low bits;
/// this bit: predict from the first column.
const PRED_FIRST_COLUMN: u8 = 0x80;
const MAX_LEVEL_LOG2: u8 = 6;
/// Level lengths the encoder tries (log2).
const LEVELS: [u8; 3] = [0, 2, 4];
/// The running level a quick encoding takes without trying the others:
/// the last value (and, for a column after the first, that column's value
/// at the same instant). On noisy window means it costs 1–3 % over the
/// best; on stepping counters the longer levels cost more.
const QUICK_LEVEL: u8 = 0;

/// Values a predictor is tried on, for a column of `n`: a quarter of
/// it, at least [`TRIAL_MIN`] and at most [`TRIAL`]. An hour at a backed-
/// off agent's few seconds is a few hundred values, which the candidates
/// were each coded over whole (three or four encodings of every column a
/// seal writes); on `bench storage`'s traces the raw chunks came out the
/// same at a fixed 100 ms and 0.05–0.13 % larger with adaptive sampling.
fn trial_len(n: usize) -> usize {
    (n / 4).clamp(TRIAL_MIN, TRIAL)
}

/// The shortest trial.
const TRIAL_MIN: usize = 128;
/// The longest trial.
const TRIAL: usize = 4096;

/// How hard an encoder looks for a column's predictor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effort {
    /// Every candidate tried on a prefix of the column ([`trial_len`]),
    /// the smallest kept: for chunks that are kept.
    Best,
    /// One fixed candidate, coded once: for blocks re-encoded later (a
    /// fold's), where the trials were most of the time.
    Quick,
}

/// Farthest a value may lie from `s / D`, in ulps, and still be stored as
/// an integer (else it is escaped).
const MAX_ULPS: i64 = 1 << 16;
const LIMIT: f64 = (1u64 << 53) as f64;
const POW10: [f64; 10] = [1.0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9];
const MAX_J: i8 = 9;

/// `value = s / 10^j` (`j` may be negative: `s · 10^-j`), or, windowed,
/// `value = s / (10^j × window)` (`j ≥ 0`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scale {
    j: i8,
    windowed: bool,
}

impl Scale {
    /// `(factor, divides)`: `value = s / factor` or `s × factor`.
    fn factor(self, w: u32) -> (f64, bool) {
        let p = POW10[usize::from(self.j.unsigned_abs())];
        if self.windowed {
            (p * f64::from(w.max(1)), true)
        } else {
            (p, self.j >= 0)
        }
    }

    fn to_int(self, v: f64, w: u32) -> f64 {
        match self.factor(w) {
            (f, true) => round(v * f),
            (f, false) => round(v / f),
        }
    }

    fn to_value(self, s: i64, w: u32) -> f64 {
        match self.factor(w) {
            (f, true) => s as f64 / f,
            (f, false) => s as f64 * f,
        }
    }

    /// The integer and ulp offset of `v`, or `None` (escape).
    fn split(self, v: f64, w: u32) -> Option<(i64, i64)> {
        if !v.is_finite() {
            return None;
        }
        let m = self.to_int(v, w);
        // NaN fails this test too.
        if m.abs() >= LIMIT || m.is_nan() {
            return None;
        }
        let s = m as i64;
        let q = self.to_value(s, w);
        if q.is_sign_negative() != v.is_sign_negative() || !q.is_finite() {
            return None;
        }
        // Same sign: both bit patterns on one side, the difference fits.
        let e = (v.to_bits() as i64).wrapping_sub(q.to_bits() as i64);
        (e.abs() <= MAX_ULPS).then_some((s, e))
    }

    fn join(self, s: i64, e: i64, w: u32) -> f64 {
        let q = self.to_value(s, w);
        f64::from_bits((q.to_bits() as i64).wrapping_add(e) as u64)
    }

    /// The integer nearest `v`'s, when there is one.
    fn nearest(self, v: f64, w: u32) -> Option<i64> {
        let m = self.to_int(v, w);
        (m.abs() < LIMIT).then_some(m as i64)
    }
}

/// `x` rounded to the nearest integer, halves away from zero: exactly
/// [`f64::round`], which is a library call on a baseline x86-64 target
/// (no SSE4.1 rounding instruction) and most of the cost of trying a
/// scale. Below 2^52, adding and subtracting 2^52 rounds to an integer
/// (halves to even) exactly; a half rounded down is then moved up.
fn round(x: f64) -> f64 {
    const BIG: f64 = (1u64 << 52) as f64;
    let t = x.abs();
    // NaN, infinities and values from 2^52 (already integers) unchanged.
    if t.is_nan() || t >= BIG {
        return x;
    }
    let mut r = (t + BIG) - BIG;
    if t - r == 0.5 {
        r += 1.0;
    }
    r.copysign(x)
}

/// ⌊16 · log2 w⌋, roughly (w ≥ 1).
fn log2_16(w: u64) -> i32 {
    let w = w.max(1);
    let k = 63 - w.leading_zeros();
    let frac = if k >= 4 {
        (w >> (k - 4)) & 15
    } else {
        (w << (4 - k)) & 15
    };
    (k * 16 + frac as u32) as i32
}

/// `a.div_euclid(d)` for `d > 0`, through 64-bit division when `a` fits
/// in 64 bits (the usual case; a 128-bit division is a library call many
/// times slower).
fn div_euclid(a: i128, d: i64) -> i128 {
    // A full level's length is a power of two: a shift floors as
    // `div_euclid` does for a positive divisor.
    if d > 0 && d.count_ones() == 1 {
        return a >> d.trailing_zeros();
    }
    match i64::try_from(a) {
        Ok(a) => i128::from(a.div_euclid(d)),
        Err(_) => a.div_euclid(i128::from(d)),
    }
}

/// Running level: the mean of the last `len` values per unit of window,
/// in 1/2^16.
struct Level {
    len: usize,
    ring: VecDeque<i128>,
    sum: i128,
}

impl Level {
    fn new(log2: u8) -> Self {
        Self {
            len: 1 << log2,
            ring: VecDeque::new(),
            sum: 0,
        }
    }

    fn predict(&self, w: u64) -> i64 {
        if self.ring.is_empty() {
            return 0;
        }
        let rate = div_euclid(self.sum, self.ring.len() as i64);
        let p = (rate * i128::from(w) + (1 << 15)) >> 16;
        p.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
    }

    fn push(&mut self, s: i64, w: u64, restart: bool) {
        if restart {
            self.ring.clear();
            self.sum = 0;
        }
        let rate = match i64::try_from(w) {
            Ok(1) | Ok(0) => i128::from(s) << 16,
            Ok(w) => div_euclid(i128::from(s) << 16, w),
            Err(_) => (i128::from(s) << 16).div_euclid(i128::from(w)),
        };
        self.ring.push_back(rate);
        self.sum += rate;
        if self.ring.len() > self.len {
            self.sum -= self.ring.pop_front().unwrap_or(0);
        }
    }
}

/// How one scaled column is coded.
#[derive(Clone, Copy, Debug)]
struct ColumnCode {
    scale: Scale,
    ulps: bool,
    escapes: bool,
    pred: u8,
}

impl ColumnCode {
    fn flags(self) -> u8 {
        (u8::from(self.scale.windowed) * SCALED_WINDOWED)
            | (u8::from(self.ulps) * SCALED_ULPS)
            | (u8::from(self.escapes) * SCALED_ESCAPES)
    }
}

/// Window of sample `i` for scaling (1 when the block has none).
fn window_at(windows: &[u32], i: usize) -> u32 {
    windows.get(i).copied().unwrap_or(1)
}

/// Per-sample coding state shared by the encoder and the decoder.
struct ColumnState {
    level: Level,
    res: Residuals,
    /// Only for a column that has ulp offsets: its models are most of a
    /// state's memory, and a short column's encoding is mostly setting
    /// them up.
    ulps: Option<Residuals>,
    escape: [Model; 2],
    was_escaped: usize,
    patterns: Patterns,
    prev_bits: u64,
}

impl ColumnState {
    fn new(code: ColumnCode) -> Self {
        Self {
            level: Level::new(code.pred & 0x0f),
            res: Residuals::default(),
            ulps: code.ulps.then(Residuals::default),
            escape: [Model::default(); 2],
            was_escaped: 0,
            patterns: Patterns::default(),
            prev_bits: 0,
        }
    }

    /// Prediction for sample `i` and the residual context's bias.
    fn predict(&self, code: ColumnCode, w: u32, first: Option<f64>) -> (i64, i32) {
        let (lw, bias) = if code.scale.windowed {
            (u64::from(w.max(1)), log2_16(u64::from(w)) / 2)
        } else {
            (1, 0)
        };
        let from_first = first
            .filter(|_| code.pred & PRED_FIRST_COLUMN != 0)
            .and_then(|v| code.scale.nearest(v, w));
        (from_first.unwrap_or_else(|| self.level.predict(lw)), bias)
    }

    fn learn(&mut self, code: ColumnCode, s: i64, w: u32, jump: bool) {
        let lw = if code.scale.windowed {
            u64::from(w.max(1))
        } else {
            1
        };
        self.level.push(s, lw, jump);
    }
}

/// Codes `col`, whose values `code.scale` splits as `splits` says (one
/// per value, [`Scale::split`]).
fn encode_scaled(
    col: &[f64],
    splits: &[Split],
    windows: &[u32],
    first: Option<&[f64]>,
    code: ColumnCode,
) -> Result<Vec<u8>, CodecError> {
    let mut enc = Encoder::new();
    let mut st = ColumnState::new(code);
    for (i, (&v, &split)) in col.iter().zip(splits).enumerate() {
        let w = window_at(windows, i);
        if code.escapes {
            enc.bit(&mut st.escape[st.was_escaped], split.is_none());
            st.was_escaped = usize::from(split.is_none());
        }
        match split {
            None => st.patterns.put(&mut enc, v.to_bits() ^ st.prev_bits),
            Some((s, e)) => {
                let (p, bias) = st.predict(code, w, first.map(|f| f[i]));
                let jump = st.res.put(&mut enc, s.wrapping_sub(p), bias);
                if let Some(ulps) = st.ulps.as_mut() {
                    ulps.put(&mut enc, e, 0);
                }
                st.learn(code, s, w, jump);
            }
        }
        st.prev_bits = v.to_bits();
    }
    Ok(enc.finish())
}

fn decode_scaled(
    bytes: &[u8],
    n: usize,
    windows: &[u32],
    first: Option<&[f64]>,
    code: ColumnCode,
) -> Result<Vec<f64>, CodecError> {
    let mut dec = Decoder::new(bytes)?;
    let mut st = ColumnState::new(code);
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let w = window_at(windows, i);
        let escaped = if code.escapes {
            let e = dec.bit(&mut st.escape[st.was_escaped])?;
            st.was_escaped = usize::from(e);
            e
        } else {
            false
        };
        let v = if escaped {
            f64::from_bits(st.patterns.get(&mut dec)? ^ st.prev_bits)
        } else {
            let (p, bias) = st.predict(code, w, first.map(|f| f[i]));
            let (r, jump) = st.res.get(&mut dec, bias)?;
            let s = p.wrapping_add(r);
            let e = match st.ulps.as_mut() {
                Some(ulps) => ulps.get(&mut dec, 0)?.0,
                None => 0,
            };
            st.learn(code, s, w, jump);
            code.scale.join(s, e, w)
        };
        st.prev_bits = v.to_bits();
        out.push(v);
    }
    Ok(out)
}

/// Every scale a column may take, in the order ties are broken: not
/// windowed before windowed, then the smallest integers.
fn scales(windowed: bool) -> impl Iterator<Item = Scale> {
    let plain = (-MAX_J..=MAX_J).map(|j| Scale { j, windowed: false });
    let windowed = (0..=MAX_J)
        .filter(move |_| windowed)
        .map(|j| Scale { j, windowed: true });
    plain.chain(windowed)
}

/// A value as a scale holds it: its integer and ulp offset, or `None`
/// (escaped).
type Split = Option<(i64, i64)>;

/// Values of `col` that `scale` escapes, stopping once `stop(escaped)`
/// holds; with whether any value kept needs an ulp offset, and whether
/// the whole column was counted. With `keep`, each value's split is
/// pushed onto it.
fn escapes(
    col: &[f64],
    windows: &[u32],
    scale: Scale,
    stop: impl Fn(usize) -> bool,
    mut keep: Option<&mut Vec<Split>>,
) -> (usize, bool, bool) {
    let (mut escaped, mut ulps) = (0, false);
    for (i, &v) in col.iter().enumerate() {
        let split = scale.split(v, window_at(windows, i));
        match split {
            None => escaped += 1,
            Some((_, e)) => ulps |= e != 0,
        }
        if let Some(keep) = keep.as_deref_mut() {
            keep.push(split);
        }
        if stop(escaped) {
            return (escaped, ulps, false);
        }
    }
    (escaped, ulps, true)
}

/// Samples each scale is first tried on.
const SCALE_PROBE: usize = 16;

/// The scale that leaves the fewest values escaped (ties: the first in
/// [`scales`]' order), with whether offsets and escapes occur, and how it
/// splits each value.
///
/// Exact, but most scales are ruled out after a few values: the scale
/// that escapes fewest of the first [`SCALE_PROBE`] values is counted
/// over the whole column first, and every other scale is then dropped as
/// soon as it has escaped more than that (as many, for scales later in
/// the order), so a column usually costs one full pass, not one per scale.
fn best_scale(col: &[f64], windows: &[u32]) -> (Scale, bool, bool, Vec<Split>) {
    let all: Vec<Scale> = scales(!windows.is_empty()).collect();
    // The first scale with the fewest escapes on the probe; a scale is
    // dropped once it has escaped as many as the best so far.
    let probe = &col[..col.len().min(SCALE_PROBE)];
    let mut first = (usize::MAX, 0);
    for (k, &scale) in all.iter().enumerate() {
        let bound = first.0;
        let (escaped, _, whole) = escapes(probe, windows, scale, |e| e >= bound, None);
        if whole && escaped < bound {
            first = (escaped, k);
            // None later can do better (ties go to the earlier).
            if escaped == 0 {
                break;
            }
        }
    }
    let first = first.1;
    let mut splits = Vec::with_capacity(col.len());
    let (escaped, ulps, _) = escapes(col, windows, all[first], |_| false, Some(&mut splits));
    let mut best = (escaped, first, ulps);
    for (k, &scale) in all.iter().enumerate() {
        // Escaping none over the whole column, `first` is the answer: the
        // scales before it escaped some of the probe already, and those
        // after would only tie.
        if best.0 == 0 && best.1 == first {
            break;
        }
        if k == first {
            continue;
        }
        let bound = best.0;
        // Earlier in the order, it wins a tie.
        let earlier = k < best.1;
        let stop = |e: usize| if earlier { e > bound } else { e >= bound };
        let (escaped, ulps, whole) = escapes(col, windows, scale, stop, None);
        if whole && !stop(escaped) {
            best = (escaped, k, ulps);
        }
    }
    if best.1 != first {
        splits.clear();
        escapes(col, windows, all[best.1], |_| false, Some(&mut splits));
    }
    (all[best.1], best.2, best.0 > 0, splits)
}

/// One column: its mode byte, parameters and stream, whichever candidate
/// is smallest.
fn encode_column(
    out: &mut Vec<u8>,
    col: &[f64],
    windows: &[u32],
    first: Option<&[f64]>,
    effort: Effort,
) -> Result<(), CodecError> {
    let (scale, ulps, escapes, splits) = best_scale(col, windows);
    let preds: Vec<u8> = match (effort, first) {
        (Effort::Best, None) => LEVELS.to_vec(),
        (Effort::Best, Some(_)) => [&LEVELS[..], &[PRED_FIRST_COLUMN | 2]].concat(),
        (Effort::Quick, None) => vec![QUICK_LEVEL],
        (Effort::Quick, Some(_)) => vec![PRED_FIRST_COLUMN | QUICK_LEVEL],
    };
    let code = |pred| ColumnCode {
        scale,
        ulps,
        escapes,
        pred,
    };
    // The predictor is chosen on a prefix (compaction encodes once); a
    // lone candidate is coded whole at once.
    let k = if preds.len() == 1 {
        col.len()
    } else {
        col.len().min(trial_len(col.len()))
    };
    let (w, f) = (&windows[..windows.len().min(k)], first.map(|f| &f[..k]));
    let mut chosen: Option<(Vec<u8>, u8)> = None;
    for pred in preds {
        let trial = encode_scaled(&col[..k], &splits[..k], w, f, code(pred))?;
        if chosen.as_ref().is_none_or(|c| trial.len() < c.0.len()) {
            chosen = Some((trial, pred));
        }
    }
    let (trial, pred) = chosen.unwrap_or_default();
    let c = code(pred);
    // A column no longer than the trial was coded whole by it.
    let stream = if k == col.len() {
        trial
    } else {
        encode_scaled(col, &splits, windows, first, c)?
    };
    let mut scaled = vec![COL_SCALED, scale.j as u8, c.flags(), c.pred];
    put_bytes(&mut scaled, &stream);
    // The XOR stream wins ties; it is given up once its mode byte, length
    // and bytes so far (at least 2 + its length) exceed the scaled column.
    match xor_stream(col, scaled.len().saturating_sub(2)) {
        Some(xor) if 1 + varint_len(xor.len() as u64) + xor.len() <= scaled.len() => {
            out.push(COL_XOR);
            put_bytes(out, &xor);
        }
        _ => out.extend_from_slice(&scaled),
    }
    Ok(())
}

/// The timestamps' step: the greatest common divisor of the intervals
/// (1 when there is none).
fn step(ts: &[i64]) -> i64 {
    fn gcd(mut a: u64, mut b: u64) -> u64 {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    }
    let g = ts
        .windows(2)
        .fold(0u64, |g, p| gcd(g, p[1].wrapping_sub(p[0]).unsigned_abs()));
    i64::try_from(g).ok().filter(|&g| g > 0).unwrap_or(1)
}

fn window_pred(mode: u8, ts: &[i64], windows: &[u32], i: usize) -> i64 {
    match (i, mode) {
        (0, _) => 0,
        (_, WINDOW_VS_GAP) => ts[i].wrapping_sub(ts[i - 1]),
        _ => i64::from(windows[i - 1]),
    }
}

fn encode_time(ts: &[i64], windows: &[u32], g: i64, mode: u8) -> Result<Vec<u8>, CodecError> {
    let mut enc = Encoder::new();
    let (mut tr, mut wr) = (Residuals::default(), Residuals::default());
    let mut prev_q = 0i64;
    for i in 0..ts.len() {
        if i > 0 {
            let q = ts[i].wrapping_sub(ts[i - 1]) / g;
            tr.put(&mut enc, q.wrapping_sub(prev_q), 0);
            prev_q = q;
        }
        if !windows.is_empty() {
            let p = window_pred(mode, ts, windows, i);
            wr.put(&mut enc, i64::from(windows[i]).wrapping_sub(p), 0);
        }
    }
    Ok(enc.finish())
}

fn decode_time(
    bytes: &[u8],
    n: usize,
    t0: i64,
    g: i64,
    mode: Option<u8>,
) -> Result<(Vec<i64>, Vec<u32>), CodecError> {
    let mut dec = Decoder::new(bytes)?;
    let (mut tr, mut wr) = (Residuals::default(), Residuals::default());
    let mut ts = Vec::with_capacity(n);
    let mut windows = Vec::with_capacity(if mode.is_some() { n } else { 0 });
    let mut prev_q = 0i64;
    for i in 0..n {
        if i == 0 {
            ts.push(t0);
        } else {
            let q = prev_q.wrapping_add(tr.get(&mut dec, 0)?.0);
            prev_q = q;
            ts.push(ts[i - 1].wrapping_add(q.wrapping_mul(g)));
        }
        if let Some(mode) = mode {
            let p = window_pred(mode, &ts, &windows, i);
            let w = p.wrapping_add(wr.get(&mut dec, 0)?.0);
            windows.push(u32::try_from(w).map_err(|_| CodecError::Corrupt("window"))?);
        }
    }
    Ok((ts, windows))
}

/// Encodes `b` (already checked for shape by the caller) as version 3;
/// with `shared_time`, without its timestamps and windows.
pub(super) fn encode(b: &Block, shared_time: bool, effort: Effort) -> Result<Vec<u8>, CodecError> {
    let n = b.ts.len();
    let mut flags = if b.windows.is_empty() {
        0
    } else {
        FLAG_WINDOWS
    };
    if shared_time {
        flags |= FLAG_SHARED_TIME;
    }
    let mut out = vec![VERSION_SEALED, flags, b.cols.len() as u8];
    put_varint(&mut out, n as u64);
    if n == 0 {
        return Ok(out);
    }
    if shared_time {
        encode_columns(&mut out, b, effort)?;
        return Ok(out);
    }
    put_varint(&mut out, zigzag(b.ts[0]));
    let g = step(&b.ts);
    put_varint(&mut out, g as u64);
    let time = if b.windows.is_empty() {
        encode_time(&b.ts, &b.windows, g, WINDOW_VS_GAP)?
    } else {
        let gap = encode_time(&b.ts, &b.windows, g, WINDOW_VS_GAP)?;
        let prev = encode_time(&b.ts, &b.windows, g, WINDOW_VS_PREV)?;
        let (mode, s) = if prev.len() < gap.len() {
            (WINDOW_VS_PREV, prev)
        } else {
            (WINDOW_VS_GAP, gap)
        };
        out.push(mode);
        s
    };
    put_bytes(&mut out, &time);
    encode_columns(&mut out, b, effort)?;
    Ok(out)
}

fn encode_columns(out: &mut Vec<u8>, b: &Block, effort: Effort) -> Result<(), CodecError> {
    for (c, col) in b.cols.iter().enumerate() {
        let first = (c > 0).then(|| b.cols[0].as_slice());
        encode_column(out, col, &b.windows, first, effort)?;
    }
    Ok(())
}

/// Whether the version-3 block in `buf` (version byte included) stores no
/// timestamps of its own.
pub(super) fn shares_time(buf: &[u8]) -> bool {
    buf.first() == Some(&VERSION_SEALED) && buf.get(1).is_some_and(|f| f & FLAG_SHARED_TIME != 0)
}

/// A version-3 header: flags, columns, count.
fn header(r: &mut Reader<'_>) -> Result<(u8, usize, usize), CodecError> {
    let flags = r.u8()?;
    if flags & !(FLAG_WINDOWS | FLAG_SHARED_TIME) != 0 {
        return Err(CodecError::Corrupt("unknown flags"));
    }
    let ncols = usize::from(r.u8()?);
    if ncols > MAX_COLS {
        return Err(CodecError::Corrupt("columns"));
    }
    let n = usize::try_from(r.varint()?).map_err(|_| CodecError::Corrupt("count"))?;
    if n > MAX_BLOCK_SAMPLES {
        return Err(CodecError::Corrupt("count"));
    }
    Ok((flags, ncols, n))
}

/// The timestamps and windows of a version-3 block that has its own; `r`
/// is past the version byte, and is left before the columns.
fn decode_own_time(
    r: &mut Reader<'_>,
    flags: u8,
    n: usize,
) -> Result<(Vec<i64>, Vec<u32>), CodecError> {
    if flags & FLAG_SHARED_TIME != 0 {
        return Err(CodecError::SharedTime);
    }
    if n == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let t0 = unzigzag(r.varint()?);
    let g = i64::try_from(r.varint()?)
        .ok()
        .filter(|&g| g > 0)
        .ok_or(CodecError::Corrupt("time step"))?;
    let mode = if flags & FLAG_WINDOWS != 0 {
        match r.u8()? {
            m @ (WINDOW_VS_GAP | WINDOW_VS_PREV) => Some(m),
            _ => return Err(CodecError::Corrupt("window mode")),
        }
    } else {
        None
    };
    decode_time(r.bytes("stream length")?, n, t0, g, mode)
}

/// Only the timestamps and windows of a version-3 block; `r` is past the
/// version byte.
pub(super) fn decode_times(r: &mut Reader<'_>) -> Result<(Vec<i64>, Vec<u32>), CodecError> {
    let (flags, _, n) = header(r)?;
    decode_own_time(r, flags, n)
}

/// Decodes a version-3 block; `r` is past the version byte. `time` gives
/// the timestamps and windows of a block that shares them.
pub(super) fn decode(
    r: &mut Reader<'_>,
    time: Option<(&[i64], &[u32])>,
) -> Result<Block, CodecError> {
    let (flags, ncols, n) = header(r)?;
    let (ts, windows) = if flags & FLAG_SHARED_TIME != 0 {
        let (ts, windows) = time.ok_or(CodecError::SharedTime)?;
        let has_windows = flags & FLAG_WINDOWS != 0;
        if ts.len() != n
            || (has_windows && windows.len() != n)
            || (!has_windows && !windows.is_empty())
        {
            return Err(CodecError::Corrupt("shared timestamps do not fit"));
        }
        (ts.to_vec(), windows.to_vec())
    } else {
        decode_own_time(r, flags, n)?
    };
    if n == 0 {
        return Ok(Block {
            ts,
            cols: vec![Vec::new(); ncols],
            windows,
        });
    }
    let mut cols: Vec<Vec<f64>> = Vec::with_capacity(ncols);
    for c in 0..ncols {
        let col = match r.u8()? {
            COL_XOR => decode_xor(r, n)?,
            COL_SCALED => {
                let j = r.u8()? as i8;
                let f = r.u8()?;
                let pred = r.u8()?;
                if !(-MAX_J..=MAX_J).contains(&j)
                    || (j < 0 && f & SCALED_WINDOWED != 0)
                    || f & !(SCALED_WINDOWED | SCALED_ULPS | SCALED_ESCAPES) != 0
                    || pred & 0x0f > MAX_LEVEL_LOG2
                    || pred & 0x70 != 0
                    || (pred & PRED_FIRST_COLUMN != 0 && c == 0)
                    || (f & SCALED_WINDOWED != 0 && windows.is_empty())
                {
                    return Err(CodecError::Corrupt("column parameters"));
                }
                let code = ColumnCode {
                    scale: Scale {
                        j,
                        windowed: f & SCALED_WINDOWED != 0,
                    },
                    ulps: f & SCALED_ULPS != 0,
                    escapes: f & SCALED_ESCAPES != 0,
                    pred,
                };
                let first = (c > 0).then(|| cols[0].as_slice());
                decode_scaled(r.bytes("stream length")?, n, &windows, first, code)?
            }
            _ => return Err(CodecError::Corrupt("column mode")),
        };
        cols.push(col);
    }
    Ok(Block { ts, cols, windows })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The scale search as plainly written: every scale over the whole
    /// column.
    fn best_scale_by_every_pass(col: &[f64], windows: &[u32]) -> (Scale, bool, bool, Vec<Split>) {
        let mut best: Option<(usize, Scale, bool)> = None;
        for scale in scales(!windows.is_empty()) {
            let (escaped, ulps, _) = escapes(col, windows, scale, |_| false, None);
            if best.is_none_or(|b| escaped < b.0) {
                best = Some((escaped, scale, ulps));
            }
        }
        let (escaped, scale, ulps) = best.expect("at least one scale");
        let splits = col
            .iter()
            .enumerate()
            .map(|(i, &v)| scale.split(v, window_at(windows, i)))
            .collect();
        (scale, ulps, escaped > 0, splits)
    }

    /// Values of mixed forms: decimals of several lengths, window means,
    /// NaN and other values no scale holds.
    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            (-100_000i64..100_000, 0u32..6).prop_map(|(s, d)| s as f64 / 10f64.powi(d as i32)),
            (1i64..1000, 1u32..40).prop_map(|(s, w)| s as f64 / f64::from(w)),
            Just(f64::NAN),
            Just(-0.0),
            any::<f64>(),
        ]
    }

    proptest! {
        #[test]
        fn round_is_the_standard_rounding(x in any::<f64>(), half in -1e6f64..1e6) {
            for v in [x, half.trunc() + 0.5, -(half.trunc() + 0.5), half] {
                prop_assert_eq!(round(v).to_bits(), v.round().to_bits(), "{}", v);
            }
        }

        #[test]
        fn the_scale_search_finds_what_every_pass_finds(
            // Runs of one form, so that a column's first values may
            // mislead the probe.
            runs in prop::collection::vec((value(), 1usize..80), 1..12),
            windowed in any::<bool>(),
        ) {
            let col: Vec<f64> = runs.iter().flat_map(|&(v, n)| std::iter::repeat_n(v, n)).collect();
            let windows: Vec<u32> = if windowed {
                (0..col.len()).map(|i| 100 * (1 + (i % 7) as u32)).collect()
            } else {
                Vec::new()
            };
            prop_assert_eq!(best_scale(&col, &windows), best_scale_by_every_pass(&col, &windows));
        }
    }

    #[test]
    fn level_divisions_agree_with_128_bit_ones() {
        for a in [
            0i128,
            1,
            -1,
            7,
            -7,
            i128::from(i64::MAX),
            i128::from(i64::MIN),
            1 << 80,
            -(1 << 80),
        ] {
            for d in [1i64, 2, 3, 16, 100, 1 << 40, i64::MAX] {
                assert_eq!(div_euclid(a, d), a.div_euclid(i128::from(d)), "{a} / {d}");
            }
        }
    }
}
