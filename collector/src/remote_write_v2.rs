//! Prometheus Remote-Write 2.0 on the wire (`io.prometheus.write.v2.Request`)
//! and its encoder from a neutral list of [`Sample`]s.
//!
//! 2.0 replaces 1.0's per-series label strings with one de-duplicated
//! symbols table per request: each series names its labels as pairs of
//! indices into it (`labels_refs`), and its metadata (type, help, unit)
//! travels with the series instead of in a separate request. The symbols
//! table starts with `""`, so index 0 means "no help" or "no unit".
//!
//! The messages below are the subset of the official schema
//! (`prompb/io/prometheus/write/v2/types.proto` in prometheus/prometheus)
//! that flopwatch sends: float samples only, so `TimeSeries.histograms` (3)
//! and `exemplars` (4) are left out; a receiver sees them empty. Field
//! numbers are the official ones, checked byte for byte by
//! `tests::field_numbers_match_the_official_schema`.
//!
//! The body is snappy *block* format (the spec forbids the framed format),
//! sent with [`CONTENT_TYPE`], `Content-Encoding: snappy` and
//! [`VERSION_HEADER`]: [`VERSION`]. A 2.0 receiver answers with how much it
//! wrote ([`written_headers`]).

// Used by the sender from the next change.

use prost::Message;
use std::collections::HashMap;

/// One sample to forward: its labels (name, value; `__name__` included,
/// any order), time (unix ms) and value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sample<'a> {
    pub labels: &'a [(String, String)],
    pub ts_ms: i64,
    pub value: f64,
}

/// A metric family's metadata: name, type (`"gauge"` | `"counter"`), help,
/// unit.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Meta<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    pub help: &'a str,
    pub unit: &'a str,
}

/// The `Content-Type` of a 2.0 request.
pub(crate) const CONTENT_TYPE: &str = "application/x-protobuf;proto=io.prometheus.write.v2.Request";
/// The header naming the protocol version, and its 2.0 value.
pub(crate) const VERSION_HEADER: &str = "X-Prometheus-Remote-Write-Version";
/// See [`VERSION_HEADER`].
pub(crate) const VERSION: &str = "2.0.0";
/// Response headers of a 2.0 receiver: what it wrote of the request.
pub(crate) const SAMPLES_WRITTEN: &str = "X-Prometheus-Remote-Write-Samples-Written";
/// See [`SAMPLES_WRITTEN`].
pub(crate) const HISTOGRAMS_WRITTEN: &str = "X-Prometheus-Remote-Write-Histograms-Written";
/// See [`SAMPLES_WRITTEN`].
pub(crate) const EXEMPLARS_WRITTEN: &str = "X-Prometheus-Remote-Write-Exemplars-Written";

/// The 2.0 messages (a subset of `io.prometheus.write.v2`, official field
/// numbers).
pub(crate) mod wire {
    /// `io.prometheus.write.v2.Request`; fields 1 to 3 are reserved (1.0's).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Request {
        /// De-duplicated strings, `""` first.
        #[prost(string, repeated, tag = "4")]
        pub symbols: Vec<String>,
        #[prost(message, repeated, tag = "5")]
        pub timeseries: Vec<TimeSeries>,
    }

    /// `io.prometheus.write.v2.TimeSeries`, without `histograms` (3) and
    /// `exemplars` (4).
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct TimeSeries {
        /// (name, value) index pairs into `symbols`, sorted by name.
        #[prost(uint32, repeated, packed = "true", tag = "1")]
        pub labels_refs: Vec<u32>,
        /// Oldest first.
        #[prost(message, repeated, tag = "2")]
        pub samples: Vec<Sample>,
        #[prost(message, optional, tag = "5")]
        pub metadata: Option<Metadata>,
        /// Unix ms; 0 means unset.
        #[prost(int64, tag = "6")]
        pub created_timestamp: i64,
    }

    /// `io.prometheus.write.v2.Sample`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Sample {
        #[prost(double, tag = "1")]
        pub value: f64,
        /// Unix ms.
        #[prost(int64, tag = "2")]
        pub timestamp: i64,
    }

    /// `io.prometheus.write.v2.Metadata`; field 2 is unused in the schema.
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Metadata {
        #[prost(enumeration = "MetricType", tag = "1")]
        pub r#type: i32,
        /// Index into `symbols`; 0 (`""`) when there is no help.
        #[prost(uint32, tag = "3")]
        pub help_ref: u32,
        /// Index into `symbols`; 0 (`""`) when there is no unit.
        #[prost(uint32, tag = "4")]
        pub unit_ref: u32,
    }

    /// `io.prometheus.write.v2.Metadata.MetricType`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
    #[repr(i32)]
    pub(crate) enum MetricType {
        Unspecified = 0,
        Counter = 1,
        Gauge = 2,
        Histogram = 3,
        Gaugehistogram = 4,
        Summary = 5,
        Info = 6,
        Stateset = 7,
    }
}

/// The metadata of the family a series named `name` belongs to: the one
/// named so, or for a counter, the one whose name plus `_total` it is
/// (Prometheus names a counter family without the suffix its samples
/// carry).
pub(crate) fn meta_for<'m, 'a>(meta: &'m [Meta<'a>], name: &str) -> Option<&'m Meta<'a>> {
    meta.iter().find(|m| {
        m.name == name || (m.kind == "counter" && name.strip_suffix("_total") == Some(m.name))
    })
}

/// The value of the `__name__` label, `""` when there is none.
pub(crate) fn metric_name(labels: &[(String, String)]) -> &str {
    labels
        .iter()
        .find(|(k, _)| k == "__name__")
        .map_or("", |(_, v)| v.as_str())
}

/// The symbols table being built: each distinct string once, `""` first.
struct Symbols<'a> {
    list: Vec<&'a str>,
    index: HashMap<&'a str, u32>,
}

impl<'a> Symbols<'a> {
    fn new() -> Self {
        Symbols {
            list: vec![""],
            index: HashMap::from([("", 0)]),
        }
    }

    fn intern(&mut self, s: &'a str) -> u32 {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        // A request holds far fewer than 2^32 strings (it would not fit a
        // receiver's size limit); saturate rather than wrap if one did.
        let i = u32::try_from(self.list.len()).unwrap_or(u32::MAX);
        self.list.push(s);
        self.index.insert(s, i);
        i
    }
}

/// A series' labels, (name, value) sorted by name.
type LabelSet<'a> = Vec<(&'a str, &'a str)>;

/// Builds the 2.0 request of `samples`: one series per distinct label set
/// (empty values dropped, labels sorted by name), its samples in time
/// order, and the metadata of its family from `meta` (by `__name__`).
pub(crate) fn request(samples: &[Sample], meta: &[Meta]) -> wire::Request {
    // Series by label set, in the order first seen.
    let mut series: Vec<(LabelSet, Vec<wire::Sample>)> = Vec::new();
    let mut by_labels: HashMap<LabelSet, usize> = HashMap::new();
    for s in samples {
        let mut labels: LabelSet = s
            .labels
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        labels.sort_unstable();
        let point = wire::Sample {
            value: s.value,
            timestamp: s.ts_ms,
        };
        match by_labels.get(&labels) {
            Some(&i) => series[i].1.push(point),
            None => {
                by_labels.insert(labels.clone(), series.len());
                series.push((labels, vec![point]));
            }
        }
    }
    let mut symbols = Symbols::new();
    let timeseries = series
        .into_iter()
        .map(|(labels, mut points)| {
            points.sort_by_key(|p| p.timestamp);
            let mut labels_refs = Vec::with_capacity(labels.len() * 2);
            let mut name = "";
            for (k, v) in labels {
                labels_refs.push(symbols.intern(k));
                labels_refs.push(symbols.intern(v));
                if k == "__name__" {
                    name = v;
                }
            }
            let metadata = match meta_for(meta, name) {
                Some(m) => wire::Metadata {
                    r#type: metric_type(m.kind) as i32,
                    help_ref: symbols.intern(m.help),
                    unit_ref: symbols.intern(m.unit),
                },
                None => wire::Metadata::default(),
            };
            wire::TimeSeries {
                labels_refs,
                samples: points,
                metadata: Some(metadata),
                created_timestamp: 0,
            }
        })
        .collect();
    wire::Request {
        symbols: symbols.list.into_iter().map(str::to_string).collect(),
        timeseries,
    }
}

/// The 2.0 type of a [`Meta::kind`].
fn metric_type(kind: &str) -> wire::MetricType {
    match kind {
        "counter" => wire::MetricType::Counter,
        "gauge" => wire::MetricType::Gauge,
        _ => wire::MetricType::Unspecified,
    }
}

/// The body of a 2.0 request of `samples`: [`request`], protobuf, then
/// snappy block format.
pub(crate) fn encode_v2(samples: &[Sample], meta: &[Meta]) -> Result<Vec<u8>, snap::Error> {
    snap::raw::Encoder::new().compress_vec(&request(samples, meta).encode_to_vec())
}

/// What a 2.0 receiver says it wrote: (samples, histograms, exemplars) from
/// the `X-Prometheus-Remote-Write-*-Written` response headers, read through
/// `get` (a case-insensitive header lookup).
///
/// The spec reads a missing header as 0, but a 1.x receiver (or a proxy
/// that drops headers) sends none at all, which does not mean nothing was
/// written: so `None` when none of the three is present, as Prometheus's
/// own sender does. `None` too when one is present but not a count, since
/// such an answer cannot be trusted either.
pub(crate) fn written_headers(get: impl Fn(&str) -> Option<String>) -> Option<(u64, u64, u64)> {
    let mut seen = false;
    let mut read = |name: &str| -> Option<u64> {
        match get(name) {
            Some(v) if !v.trim().is_empty() => {
                seen = true;
                v.trim().parse().ok()
            }
            _ => Some(0),
        }
    };
    let samples = read(SAMPLES_WRITTEN);
    let histograms = read(HISTOGRAMS_WRITTEN);
    let exemplars = read(EXEMPLARS_WRITTEN);
    if !seen {
        return None;
    }
    Some((samples?, histograms?, exemplars?))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Owned labels from pairs (also for the OTLP tests).
    pub(crate) fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A sample of `labels` (also for the OTLP tests).
    pub(crate) fn at(labels: &[(String, String)], ts_ms: i64, value: f64) -> Sample<'_> {
        Sample {
            labels,
            ts_ms,
            value,
        }
    }

    fn decode(body: &[u8]) -> wire::Request {
        let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
        wire::Request::decode(raw.as_slice()).unwrap()
    }

    /// A series' labels, resolved through the symbols table.
    fn resolve(req: &wire::Request, ts: &wire::TimeSeries) -> Vec<(String, String)> {
        assert_eq!(ts.labels_refs.len() % 2, 0);
        ts.labels_refs
            .chunks(2)
            .map(|p| {
                (
                    req.symbols[p[0] as usize].clone(),
                    req.symbols[p[1] as usize].clone(),
                )
            })
            .collect()
    }

    #[test]
    fn series_are_grouped_sorted_and_symbolized() {
        let power_a = labels(&[
            ("__name__", "flopwatch_gpu_power_watts"),
            ("gpu", "0"),
            ("UUID", "GPU-a"),
            ("job_id", ""),
            ("hostname", "n1"),
        ]);
        // The same series with its labels in another order.
        let power_a2 = labels(&[
            ("hostname", "n1"),
            ("UUID", "GPU-a"),
            ("__name__", "flopwatch_gpu_power_watts"),
            ("gpu", "0"),
        ]);
        let power_b = labels(&[
            ("__name__", "flopwatch_gpu_power_watts"),
            ("gpu", "1"),
            ("UUID", "GPU-b"),
            ("hostname", "n1"),
        ]);
        let energy = labels(&[
            ("__name__", "flopwatch_gpu_energy_joules_total"),
            ("UUID", "GPU-a"),
        ]);
        let unknown = labels(&[("__name__", "other"), ("x", "y")]);
        let samples = [
            at(&power_a, 2_000, 310.0),
            at(&power_b, 1_000, 120.0),
            at(&power_a2, 1_000, 300.0),
            at(&energy, 1_000, 5e6),
            at(&unknown, 1_000, 1.0),
        ];
        let meta = [
            Meta {
                name: "flopwatch_gpu_power_watts",
                kind: "gauge",
                help: "Board power draw. In watts.",
                unit: "watts",
            },
            Meta {
                name: "flopwatch_gpu_energy_joules",
                kind: "counter",
                help: "Total energy consumed since driver load. In joules.",
                unit: "joules",
            },
        ];
        let req = decode(&encode_v2(&samples, &meta).unwrap());

        assert_eq!(req.symbols[0], "");
        let mut distinct = req.symbols.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), req.symbols.len(), "symbols repeat");

        assert_eq!(req.timeseries.len(), 4);
        let a = &req.timeseries[0];
        assert_eq!(
            resolve(&req, a),
            labels(&[
                ("UUID", "GPU-a"),
                ("__name__", "flopwatch_gpu_power_watts"),
                ("gpu", "0"),
                ("hostname", "n1"),
            ]),
            "sorted by name, the empty job_id dropped"
        );
        let ts: Vec<_> = a.samples.iter().map(|s| (s.timestamp, s.value)).collect();
        assert_eq!(
            ts,
            [(1_000, 300.0), (2_000, 310.0)],
            "one series, in time order"
        );
        let md = a.metadata.clone().unwrap();
        assert_eq!(md.r#type, wire::MetricType::Gauge as i32);
        assert_eq!(
            req.symbols[md.help_ref as usize],
            "Board power draw. In watts."
        );
        assert_eq!(req.symbols[md.unit_ref as usize], "watts");

        let b = &req.timeseries[1];
        assert_eq!(resolve(&req, b)[0], ("UUID".into(), "GPU-b".into()));
        assert_eq!(
            b.metadata, a.metadata,
            "each series of a family has its metadata"
        );

        // A counter's samples carry `_total`; its family does not.
        let e = &req.timeseries[2];
        let md = e.metadata.clone().unwrap();
        assert_eq!(md.r#type, wire::MetricType::Counter as i32);
        assert_eq!(req.symbols[md.unit_ref as usize], "joules");
        assert_eq!(e.samples[0].value, 5e6);

        // No metadata known: unspecified, empty help and unit.
        let u = &req.timeseries[3];
        assert_eq!(u.metadata, Some(wire::Metadata::default()));
        assert_eq!(
            resolve(&req, u),
            labels(&[("__name__", "other"), ("x", "y")])
        );
    }

    #[test]
    fn empty_input_is_a_request_with_only_the_empty_symbol() {
        let req = decode(&encode_v2(&[], &[]).unwrap());
        assert_eq!(req.symbols, [""]);
        assert!(req.timeseries.is_empty());
    }

    /// The protobuf of a one-sample request, written by hand from the
    /// official field numbers and wire types: a wrong tag or type in
    /// [`wire`] changes these bytes.
    #[test]
    fn field_numbers_match_the_official_schema() {
        let l = labels(&[("__name__", "a")]);
        let samples = [at(&l, 1, 1.0)];
        let meta = [Meta {
            name: "a",
            kind: "gauge",
            help: "h",
            unit: "u",
        }];
        let body = encode_v2(&samples, &meta).unwrap();
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();

        let mut want: Vec<u8> = Vec::new();
        // Request.symbols = 4, length-delimited: "", "__name__", "a", "h", "u".
        want.extend([0x22, 0x00]);
        want.extend([0x22, 0x08]);
        want.extend(b"__name__");
        want.extend([0x22, 0x01, b'a']);
        want.extend([0x22, 0x01, b'h']);
        want.extend([0x22, 0x01, b'u']);
        // Request.timeseries = 5, length-delimited, 25 bytes:
        want.extend([0x2a, 25]);
        //   TimeSeries.labels_refs = 1, packed: [1, 2].
        want.extend([0x0a, 0x02, 0x01, 0x02]);
        //   TimeSeries.samples = 2, 11 bytes:
        want.extend([0x12, 11]);
        //     Sample.value = 1, fixed64 double 1.0; Sample.timestamp = 2, varint 1.
        want.push(0x09);
        want.extend(1.0f64.to_le_bytes());
        want.extend([0x10, 0x01]);
        //   TimeSeries.metadata = 5, 6 bytes: type = 1 (GAUGE = 2),
        //   help_ref = 3 (3), unit_ref = 4 (4).
        want.extend([0x2a, 6, 0x08, 0x02, 0x18, 0x03, 0x20, 0x04]);
        assert_eq!(raw, want);
    }

    #[test]
    fn the_body_is_snappy_block_format() {
        let l = labels(&[("__name__", "a")]);
        let samples = [at(&l, 1, 1.0)];
        let body = encode_v2(&samples, &[]).unwrap();
        // Block format starts with the uncompressed length (a varint); the
        // framed format would start with its stream identifier 0xff.
        assert_ne!(body[0], 0xff);
        let raw = request(&samples, &[]).encode_to_vec();
        assert_eq!(snap::raw::decompress_len(&body).unwrap(), raw.len());
    }

    #[test]
    fn written_headers_read_counts_and_tell_a_silent_receiver() {
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            written_headers(headers(&[
                ("x-prometheus-remote-write-samples-written", "12"),
                ("x-prometheus-remote-write-histograms-written", "0"),
                ("x-prometheus-remote-write-exemplars-written", " 3 "),
            ])),
            Some((12, 0, 3))
        );
        // A missing header is 0 once any is present.
        assert_eq!(
            written_headers(headers(&[(SAMPLES_WRITTEN, "7")])),
            Some((7, 0, 0))
        );
        // None at all: a 1.x receiver; nothing is confirmed.
        assert_eq!(written_headers(headers(&[])), None);
        assert_eq!(written_headers(headers(&[(SAMPLES_WRITTEN, "")])), None);
        // Present but not a count.
        assert_eq!(written_headers(headers(&[(SAMPLES_WRITTEN, "-1")])), None);
        assert_eq!(written_headers(headers(&[(EXEMPLARS_WRITTEN, "x")])), None);
    }
}
