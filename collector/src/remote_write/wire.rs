//! Remote write's bytes: the journal's entries and the requests built from
//! them, without a label decoded on the way.
//!
//! A journal entry keeps a batch's points compactly ([`EntryWriter`]): each
//! GPU's labels once, as they go on the wire, and each series name once.
//! The sender writes each point's labels out whole into one arena
//! ([`expand`]) and sends [`RawPoint`]s borrowed from it: a 1.0 request is
//! written from those bytes straight ([`request_v1`]), the same bytes
//! prost writes for the grouped `WriteRequest` without building it. Only
//! 2.0 and OTLP, which need the labels as strings, decode them
//! ([`pairs`]). The open-series register keeps a 1.0 `WriteRequest` of
//! one series ([`series_into`]), read back by [`read`].

use prost::encoding::{decode_varint, encode_key, encode_varint, encoded_len_varint, WireType};
use std::collections::HashMap;

/// One point of a journal entry, borrowed from its body.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct RawPoint<'a> {
    /// The series' `Label` fields (tag, length and message each), in
    /// their order on the wire.
    pub labels: &'a [u8],
    pub ts_ms: i64,
    pub value: f64,
}

/// A field's header: its number, its wire type and, for a length-delimited
/// one, its bytes; `None` past the end or on bytes that are not protobuf.
struct Field<'a> {
    tag: u64,
    wire: u64,
    /// The bytes of a length-delimited field, or the fixed64 / varint
    /// payload's raw value.
    bytes: &'a [u8],
    int: u64,
}

/// Reads the field at the start of `b`, advancing it.
fn field<'a>(b: &mut &'a [u8]) -> Option<Field<'a>> {
    let key = decode_varint(b).ok()?;
    let (tag, wire) = (key >> 3, key & 7);
    if tag == 0 {
        return None;
    }
    let mut f = Field {
        tag,
        wire,
        bytes: &[],
        int: 0,
    };
    match wire {
        0 => f.int = decode_varint(b).ok()?,
        1 => {
            let (v, rest) = b.split_first_chunk::<8>()?;
            f.int = u64::from_le_bytes(*v);
            *b = rest;
        }
        2 => {
            let n = usize::try_from(decode_varint(b).ok()?).ok()?;
            if n > b.len() {
                return None;
            }
            let (v, rest) = b.split_at(n);
            f.bytes = v;
            *b = rest;
        }
        5 => {
            let (_, rest) = b.split_first_chunk::<4>()?;
            *b = rest;
        }
        _ => return None,
    }
    Some(f)
}

/// Appends the points of the `WriteRequest` `body` to `out`; `None` (and
/// `out` as it was) when the bytes are not one, or a series' labels are
/// not one run of fields.
pub(super) fn read<'a>(body: &'a [u8], out: &mut Vec<RawPoint<'a>>) -> Option<()> {
    let start = out.len();
    let r = read_into(body, out);
    if r.is_none() {
        out.truncate(start);
    }
    r
}

fn read_into<'a>(mut body: &'a [u8], out: &mut Vec<RawPoint<'a>>) -> Option<()> {
    while !body.is_empty() {
        let f = field(&mut body)?;
        if f.tag != 1 || f.wire != 2 {
            continue;
        }
        let series = f.bytes;
        let mut rest = series;
        // The labels: one run of tag-1 fields.
        let (mut from, mut to) = (None::<usize>, 0usize);
        let first = out.len();
        let mut samples = 0usize;
        while !rest.is_empty() {
            let at = series.len() - rest.len();
            let g = field(&mut rest)?;
            let end = series.len() - rest.len();
            match (g.tag, g.wire) {
                (1, 2) => {
                    if from.is_some() && to != at {
                        return None;
                    }
                    from.get_or_insert(at);
                    to = end;
                }
                (2, 2) => {
                    let (mut ts, mut value) = (0i64, 0f64);
                    let mut s = g.bytes;
                    while !s.is_empty() {
                        let h = field(&mut s)?;
                        match (h.tag, h.wire) {
                            (1, 1) => value = f64::from_bits(h.int),
                            (2, 0) => ts = h.int as i64,
                            _ => {}
                        }
                    }
                    out.push(RawPoint {
                        labels: &[],
                        ts_ms: ts,
                        value,
                    });
                    samples += 1;
                }
                _ => {}
            }
        }
        let labels = match from {
            Some(f) => &series[f..to],
            None => &series[..0],
        };
        for p in &mut out[first..first + samples] {
            p.labels = labels;
        }
    }
    Some(())
}

/// The label fields of `labels`, in wire order: each one's name, value,
/// and where it starts and ends in `labels`; ends at bytes that are not a
/// field.
fn label_fields(labels: &[u8]) -> impl Iterator<Item = (&[u8], &[u8], usize, usize)> {
    let mut b = labels;
    std::iter::from_fn(move || {
        let at = labels.len() - b.len();
        let f = field(&mut b)?;
        let (mut name, mut value) = (&[][..], &[][..]);
        let mut l = f.bytes;
        while let Some(g) = field(&mut l) {
            match (g.tag, g.wire) {
                (1, 2) => name = g.bytes,
                (2, 2) => value = g.bytes,
                _ => {}
            }
        }
        Some((name, value, at, labels.len() - b.len()))
    })
}

/// The labels of `labels` (a [`RawPoint`]'s) as name–value pairs, in wire
/// order; bytes that are not UTF-8 are replaced.
pub(super) fn pairs(labels: &[u8]) -> Vec<(String, String)> {
    label_fields(labels)
        .map(|(name, value, _, _)| {
            (
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )
        })
        .collect()
}

/// The value of the label `__name__` in `labels`, if any.
pub(super) fn metric_name(labels: &[u8]) -> Option<&[u8]> {
    label_fields(labels).find_map(|(name, value, _, _)| (name == b"__name__").then_some(value))
}

/// `labels` split around their `__name__` field: the fields before it and
/// those after it; `None` without one.
pub(super) fn split_name(labels: &[u8]) -> Option<(&[u8], &[u8])> {
    label_fields(labels)
        .find(|(name, ..)| *name == b"__name__")
        .map(|(_, _, at, end)| (&labels[..at], &labels[end..]))
}

/// A hash of a series' labels, for sharding.
pub(super) fn series_hash(labels: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    labels.hash(&mut h);
    h.finish()
}

/// A sample message's length as prost writes it: a zero value and a
/// zero time left out.
fn sample_len(ts_ms: i64, value: f64) -> usize {
    usize::from(value != 0.0) * 9
        + if ts_ms == 0 {
            0
        } else {
            1 + encoded_len_varint(ts_ms as u64)
        }
}

/// A series' `Sample` field (tag 2).
fn sample_into(ts_ms: i64, value: f64, b: &mut Vec<u8>) {
    encode_key(2, WireType::LengthDelimited, b);
    encode_varint(sample_len(ts_ms, value) as u64, b);
    if value != 0.0 {
        encode_key(1, WireType::SixtyFourBit, b);
        b.extend_from_slice(&value.to_le_bytes());
    }
    if ts_ms != 0 {
        encode_key(2, WireType::Varint, b);
        encode_varint(ts_ms as u64, b);
    }
}

/// The length of a `Sample` field.
fn sample_field_len(ts_ms: i64, value: f64) -> usize {
    let m = sample_len(ts_ms, value);
    1 + encoded_len_varint(m as u64) + m
}

/// One `Label` field of a series (tag 1), as prost writes it: an empty
/// string left out.
pub(super) fn label_into(name: &str, value: &str, b: &mut Vec<u8>) {
    let str_len = |s: &str| {
        if s.is_empty() {
            0
        } else {
            1 + encoded_len_varint(s.len() as u64) + s.len()
        }
    };
    encode_key(1, WireType::LengthDelimited, b);
    encode_varint((str_len(name) + str_len(value)) as u64, b);
    for (tag, s) in [(1, name), (2, value)] {
        if !s.is_empty() {
            encode_key(tag, WireType::LengthDelimited, b);
            encode_varint(s.len() as u64, b);
            b.extend_from_slice(s.as_bytes());
        }
    }
}

/// `labels` as a series' label fields.
#[cfg(test)]
pub(super) fn labels_of(labels: &[super::Label]) -> Vec<u8> {
    let mut b = Vec::new();
    for l in labels {
        label_into(&l.name, &l.value, &mut b);
    }
    b
}

/// A `TimeSeries` field (tag 1 of a request) of one sample: what the
/// journal keeps of a point.
pub(super) fn series_into(labels: &[u8], ts_ms: i64, value: f64, b: &mut Vec<u8>) {
    encode_key(1, WireType::LengthDelimited, b);
    encode_varint((labels.len() + sample_field_len(ts_ms, value)) as u64, b);
    b.extend_from_slice(labels);
    sample_into(ts_ms, value, b);
}

/// A journal entry's body being written. A batch's points share their
/// GPU's labels and differ in their name, so an entry keeps each GPU's
/// labels once and each name once, not per point (a point's labels on the
/// wire are about 270 bytes, its time and value 16):
///
/// ```text
/// body  := count names, name*, group*
/// name  := length, bytes
/// group := length, before, length, after, count, point*
/// point := name's number + 1 (0: none), zigzag time (ms), value (f64, LE)
/// ```
///
/// (every length, count and number a protobuf varint). A point's labels
/// are `before`, its `__name__` label, then `after`, as [`label_into`]
/// writes them; a point without a name (a staleness marker, whose labels
/// are kept whole) has all its labels in `before`.
#[derive(Debug, Default)]
pub(super) struct EntryWriter {
    names: Vec<String>,
    groups: Vec<u8>,
    points: u32,
    oldest_ms: i64,
}

impl EntryWriter {
    /// Adds the points of the series whose labels are `before`, their
    /// name's label, `after`: each a name (`None`: the labels are whole in
    /// `before`), a time and a value.
    pub(super) fn group<'n>(
        &mut self,
        before: &[u8],
        after: &[u8],
        points: impl ExactSizeIterator<Item = (Option<&'n str>, i64, f64)>,
    ) {
        if points.len() == 0 {
            return;
        }
        for part in [before, after] {
            encode_varint(part.len() as u64, &mut self.groups);
            self.groups.extend_from_slice(part);
        }
        encode_varint(points.len() as u64, &mut self.groups);
        for (name, ts, value) in points {
            let n = match name {
                None => 0,
                Some(name) => match self.names.iter().position(|x| x == name) {
                    Some(i) => i + 1,
                    None => {
                        self.names.push(name.to_string());
                        self.names.len()
                    }
                },
            };
            encode_varint(n as u64, &mut self.groups);
            encode_varint(((ts << 1) ^ (ts >> 63)) as u64, &mut self.groups);
            self.groups.extend_from_slice(&value.to_le_bytes());
            self.oldest_ms = if self.points == 0 {
                ts
            } else {
                self.oldest_ms.min(ts)
            };
            self.points = self.points.saturating_add(1);
        }
    }

    /// Points written.
    pub(super) fn points(&self) -> u32 {
        self.points
    }

    /// The oldest point's time (meaningless without a point).
    pub(super) fn oldest_ms(&self) -> i64 {
        self.oldest_ms
    }

    /// The body.
    pub(super) fn finish(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.groups.len() + 32 * self.names.len() + 4);
        encode_varint(self.names.len() as u64, &mut b);
        for n in &self.names {
            encode_varint(n.len() as u64, &mut b);
            b.extend_from_slice(n.as_bytes());
        }
        b.extend_from_slice(&self.groups);
        b
    }
}

/// A journal entry's body as [`expand`] reads it: decompressed when
/// `packed` (`store::journal::PACKED`); `None` when that fails.
pub(super) fn unpack(packed: bool, body: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
    if !packed {
        return Some(std::borrow::Cow::Borrowed(body));
    }
    snap::raw::Decoder::new()
        .decompress_vec(body)
        .ok()
        .map(std::borrow::Cow::Owned)
}

/// A point of a journal entry, its labels a range of an arena.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Span {
    pub labels: std::ops::Range<usize>,
    pub ts_ms: i64,
    pub value: f64,
}

/// Reads `n` bytes off the front of `b`.
fn take<'a>(b: &mut &'a [u8], n: u64) -> Option<&'a [u8]> {
    let n = usize::try_from(n).ok()?;
    if n > b.len() {
        return None;
    }
    let (v, rest) = b.split_at(n);
    *b = rest;
    Some(v)
}

/// Appends the points of the journal entry body `body` ([`EntryWriter`])
/// to `out`, their labels written out whole into `arena`; `None` (and both
/// as they were) when the bytes are not a body.
pub(super) fn expand(body: &[u8], arena: &mut Vec<u8>, out: &mut Vec<Span>) -> Option<()> {
    let (a, o) = (arena.len(), out.len());
    let r = expand_into(body, arena, out);
    if r.is_none() {
        arena.truncate(a);
        out.truncate(o);
    }
    r
}

fn expand_into(mut body: &[u8], arena: &mut Vec<u8>, out: &mut Vec<Span>) -> Option<()> {
    let b = &mut body;
    let count = decode_varint(b).ok()?;
    let mut names: Vec<Vec<u8>> = Vec::new();
    for _ in 0..count {
        let n = decode_varint(b).ok()?;
        let name = std::str::from_utf8(take(b, n)?).ok()?;
        let mut l = Vec::with_capacity(name.len() + 14);
        label_into("__name__", name, &mut l);
        names.push(l);
    }
    while !b.is_empty() {
        let n = decode_varint(b).ok()?;
        let before = take(b, n)?;
        let n = decode_varint(b).ok()?;
        let after = take(b, n)?;
        let points = decode_varint(b).ok()?;
        for _ in 0..points {
            let name = match usize::try_from(decode_varint(b).ok()?).ok()? {
                0 => &[][..],
                i => names.get(i - 1)?,
            };
            let z = decode_varint(b).ok()?;
            let ts = ((z >> 1) as i64) ^ -((z & 1) as i64);
            let value = f64::from_le_bytes(*take(b, 8)?.first_chunk::<8>()?);
            let from = arena.len();
            arena.extend_from_slice(before);
            arena.extend_from_slice(name);
            arena.extend_from_slice(after);
            out.push(Span {
                labels: from..arena.len(),
                ts_ms: ts,
                value,
            });
        }
    }
    Some(())
}

/// The protobuf of the 1.0 `WriteRequest` of `points` (before snappy):
/// one series per distinct labels, in the order they first appear, its
/// samples in time order and one per timestamp (the first), and the
/// metadata of the families in it — byte for byte what prost writes for
/// that request.
pub(super) fn request_v1(points: &[RawPoint<'_>]) -> Vec<u8> {
    let mut index: HashMap<&[u8], usize> = HashMap::with_capacity(points.len());
    // Each series' labels and (time, value) samples.
    type Series<'a> = (&'a [u8], Vec<(i64, f64)>);
    let mut series: Vec<Series<'_>> = Vec::new();
    for p in points {
        let i = *index.entry(p.labels).or_insert_with(|| {
            series.push((p.labels, Vec::new()));
            series.len() - 1
        });
        series[i].1.push((p.ts_ms, p.value));
    }
    let series_len = |labels: &[u8], samples: &[(i64, f64)]| {
        labels.len()
            + samples
                .iter()
                .map(|&(t, v)| sample_field_len(t, v))
                .sum::<usize>()
    };
    let mut len = 0usize;
    for (labels, samples) in &mut series {
        samples.sort_by_key(|s| s.0);
        samples.dedup_by_key(|s| s.0);
        let n = series_len(labels, samples);
        len += 1 + encoded_len_varint(n as u64) + n;
    }
    let mut b = Vec::with_capacity(len + 1024);
    let mut names: Vec<&[u8]> = Vec::new();
    for (labels, samples) in &series {
        encode_key(1, WireType::LengthDelimited, &mut b);
        encode_varint(series_len(labels, samples) as u64, &mut b);
        b.extend_from_slice(labels);
        for &(t, v) in samples {
            sample_into(t, v, &mut b);
        }
        if let Some(name) = metric_name(labels) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
    }
    for m in super::metadata_v1(&names) {
        prost::encoding::message::encode(3, &m, &mut b);
    }
    b
}

#[cfg(test)]
mod tests {
    use super::super::{encode_points, labels, request, Point, WriteRequest};
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    fn point(names: &[&str], i: usize, ts_ms: i64, value: f64) -> Point {
        let base = vec![
            ("UUID".to_string(), format!("GPU-{i}")),
            (
                "job_id".to_string(),
                if i.is_multiple_of(3) {
                    String::new()
                } else {
                    format!("j{i}")
                },
            ),
        ];
        Point {
            labels: labels(names[i % names.len()], &base),
            ts_ms,
            value,
        }
    }

    /// What the sender sent before reading in place: prost's encoding of
    /// the grouped request with its metadata.
    fn by_prost(points: &[Point]) -> Vec<u8> {
        let mut req = request(points);
        let names: Vec<&[u8]> = req
            .timeseries
            .iter()
            .flat_map(|s| s.labels.iter().find(|l| l.name == "__name__"))
            .map(|l| l.value.as_bytes())
            .collect();
        let metadata = super::super::metadata_v1(&names).collect();
        req.metadata = metadata;
        req.encode_to_vec()
    }

    fn values() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(0.0),
            Just(-0.0),
            Just(f64::from_bits(crate::staleness::STALE_NAN)),
            Just(f64::INFINITY),
            any::<f64>(),
            0.0..1.0f64,
        ]
    }

    proptest! {
        /// Read in place and written straight, a request is byte for byte
        /// the one prost writes from the decoded points: same series in
        /// the same order, samples sorted and deduplicated alike, stale
        /// markers, zero values and zero timestamps alike.
        #[test]
        fn a_request_from_raw_points_is_the_one_prost_writes(
            pts in prop::collection::vec((0usize..12, prop_oneof![Just(0i64), 0i64..5_000, any::<i64>()], values()), 0..80),
        ) {
            let names = ["flopwatch_ofu_ratio", "flopwatch_gpu_power_watts", "custom_thing"];
            let points: Vec<Point> = pts.iter().map(|&(i, t, v)| point(&names, i, t, v)).collect();
            let body = encode_points(&points);
            let mut raw = Vec::new();
            read(&body, &mut raw).unwrap();
            prop_assert_eq!(raw.len(), points.len());
            for (r, p) in raw.iter().zip(&points) {
                prop_assert_eq!(r.ts_ms, p.ts_ms);
                prop_assert_eq!(r.value.to_bits(), if p.value == 0.0 { 0.0f64.to_bits() } else { p.value.to_bits() });
                let pairs = pairs(r.labels);
                let want: Vec<(String, String)> = p.labels.iter().map(|l| (l.name.clone(), l.value.clone())).collect();
                prop_assert_eq!(pairs, want);
            }
            prop_assert_eq!(request_v1(&raw), by_prost(&points));
        }

        /// Bytes that are not a request are refused, never a panic, and
        /// leave what was read before as it was.
        #[test]
        fn garbage_is_refused_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let keep = encode_points(&[point(&["a"], 1, 5, 1.0)]);
            let mut raw = Vec::new();
            read(&keep, &mut raw).unwrap();
            let before = raw.clone();
            let ok = read(&bytes, &mut raw).is_some();
            prop_assert_eq!(&raw[..before.len()], &before[..]);
            if !ok {
                prop_assert_eq!(raw.len(), before.len());
            }
            // What prost reads as a request, this reads too.
            if let (true, Ok(req)) = (ok, WriteRequest::decode(&bytes[..])) {
                let n: usize = req.timeseries.iter().map(|s| s.samples.len()).sum();
                prop_assert_eq!(raw.len() - before.len(), n);
            }
        }
    }

    proptest! {
        /// A journal entry gives back every point it was given, in order,
        /// with its labels whole (`before`, its name's label, `after`) and
        /// its time and value bit for bit.
        #[test]
        fn an_entry_gives_back_its_points_with_their_labels_whole(
            groups in prop::collection::vec(
                (0usize..4, 0usize..4, prop::collection::vec(
                    (prop::option::of(0usize..5), any::<i64>(), values()), 0..6)),
                0..6),
        ) {
            let labels = ["", "gpu", "UUID", "modelName"];
            let names = ["flopwatch_ofu_ratio", "a", "b_total", "ü", "x_max"];
            let part = |k: usize, v: &str| {
                let mut b = Vec::new();
                for n in &labels[..k] {
                    label_into(n, v, &mut b);
                }
                b
            };
            let mut w = EntryWriter::default();
            let mut want = Vec::new();
            for (i, (b, a, pts)) in groups.iter().enumerate() {
                let (before, after) = (part(*b, &format!("b{i}")), part(*a, "z"));
                w.group(&before, &after, pts.iter().map(|(n, t, v)| (n.map(|n| names[n]), *t, *v)));
                for (n, t, v) in pts {
                    let mut l = before.clone();
                    if let Some(n) = n {
                        label_into("__name__", names[*n], &mut l);
                    }
                    l.extend_from_slice(&after);
                    want.push((l, *t, v.to_bits()));
                }
            }
            prop_assert_eq!(w.points() as usize, want.len());
            if let Some(o) = want.iter().map(|p| p.1).min() {
                prop_assert_eq!(w.oldest_ms(), o);
            }
            let body = w.finish();
            let (mut arena, mut spans) = (vec![7u8], Vec::new());
            expand(&body, &mut arena, &mut spans).unwrap();
            let got: Vec<(Vec<u8>, i64, u64)> = spans
                .iter()
                .map(|s| (arena[s.labels.clone()].to_vec(), s.ts_ms, s.value.to_bits()))
                .collect();
            prop_assert_eq!(got, want);
            // Cut short, it is refused and leaves both as they were.
            if body.len() > 1 {
                let (mut a2, mut s2) = (vec![7u8], Vec::new());
                for cut in [1, body.len() / 2, body.len() - 1] {
                    let r = expand(&body[..cut], &mut a2, &mut s2);
                    if r.is_none() {
                        prop_assert_eq!(&a2, &vec![7u8]);
                        prop_assert!(s2.is_empty());
                    }
                    a2.truncate(1);
                    s2.clear();
                }
            }
        }

        /// Bytes that are not an entry's body never panic.
        #[test]
        fn an_entry_of_garbage_is_refused_without_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let (mut arena, mut spans) = (Vec::new(), Vec::new());
            if expand(&bytes, &mut arena, &mut spans).is_none() {
                prop_assert!(arena.is_empty() && spans.is_empty());
            }
        }
    }

    #[test]
    fn labels_split_around_their_name() {
        let mut l = Vec::new();
        label_into("UUID", "G", &mut l);
        let at = l.len();
        label_into("__name__", "x", &mut l);
        let end = l.len();
        label_into("job_id", "j", &mut l);
        let (before, after) = split_name(&l).unwrap();
        assert_eq!((before, after), (&l[..at], &l[end..]));
        let mut only = Vec::new();
        label_into("__name__", "x", &mut only);
        assert_eq!(split_name(&only), Some((&[][..], &[][..])));
        assert_eq!(split_name(&l[..at]), None);
        assert_eq!(split_name(b"\xff\xff"), None);
    }

    #[test]
    fn labels_split_by_another_field_are_refused() {
        let l = super::super::Label {
            name: "a".into(),
            value: "b".into(),
        };
        // A series: label, sample, label.
        let mut series = Vec::new();
        prost::encoding::message::encode(1, &l, &mut series);
        prost::encoding::message::encode(
            2,
            &super::super::Sample {
                value: 1.0,
                timestamp: 2,
            },
            &mut series,
        );
        prost::encoding::message::encode(1, &l, &mut series);
        let mut body = Vec::new();
        encode_key(1, WireType::LengthDelimited, &mut body);
        encode_varint(series.len() as u64, &mut body);
        body.extend_from_slice(&series);
        let mut raw = Vec::new();
        assert!(read(&body, &mut raw).is_none());
        assert!(raw.is_empty());
    }
}
