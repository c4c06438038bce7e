//! The remote-write sender compliance cases (prometheus/compliance,
//! `remotewrite/sender`) that apply to a sender that scrapes nothing,
//! checked in our own words on flopwatch's own traffic: batches through
//! [`RemoteQueue`], the store's journal and the send loop to a scripted
//! receiver, in protocol 1.0 and 2.0.
//!
//! Not applicable, and why: native histograms, exemplars and summaries
//! (flopwatch sends floats only); `up`, `job`/`instance` and scrape-time
//! staleness (nothing is scraped: the series name the GPU and node, and
//! staleness markers follow [`crate::staleness`]); start timestamps
//! (`created_timestamp` stays unset: the counters are the GPU's own, whose
//! start the agent does not know).
//!
//! Covered elsewhere: exponential backoff with full jitter and a cap
//! (`endpoint::tests::backoff_has_full_jitter_below_a_doubling_capped_bound`),
//! `Retry-After` as seconds and dates (`retry_after_takes_seconds_and_http_dates`),
//! the 415 fall-back to 1.0, its content type and its persistence
//! (`remote_write_2_0_and_its_fall_back_to_1_0_on_415`), the written-count
//! headers (`remote_write_v2::tests::written_headers_read_counts_and_tell_a_silent_receiver`),
//! credentials and extra headers, and connection refused through a
//! restart (`sender::tests::the_journal_outlives_an_outage_and_a_restart`).

use super::queue::RemoteQueue;
use super::stub::{fast, run_until, Stub};
use super::{WriteRequest, STALE_NAN};
use crate::live::{Freshness, GpuLive};
use crate::remote_write_v2::wire;
use crate::stats::Stats;
use crate::store::memory::MemEngine;
use crate::store::{CommitSet, Store};
use flopwatch_config::RemoteWriteConfig;
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::metrics as m;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A series as a receiver decodes it: sorted (name, value) pairs and its
/// samples.
type Decoded = (Vec<(String, String)>, Vec<(i64, f64)>);

/// GPU `uuid` at `ts`: OFU, power and the energy counter, owned by `job`.
fn gpu(uuid: &str, ts: i64, job: Option<&str>) -> GpuLive {
    let fresh = Freshness {
        seen_ms: ts,
        for_ms: 20_000,
    };
    GpuLive {
        tenant: "t".into(),
        uuid: uuid.into(),
        model: "NVIDIA H100 80GB HBM3".into(),
        // Unicode reaches the receiver as it is.
        hostname: "nœud-α".into(),
        node_id: "n1".into(),
        job: job.map(|j| flopwatch_proto::v1::JobAssignment {
            job_id: j.into(),
            pod: "llm-0".into(),
            ..Default::default()
        }),
        ofu: Some(0.25 + (ts % 7) as f64 / 100.0),
        tensor_active: 0.5,
        sm_clock_mhz: 1755.0,
        counters: [
            (m::TENSOR_ACTIVE.to_string(), (ts, 0.5)),
            ("power_w".to_string(), (ts, 410.5)),
            ("energy_j".to_string(), (ts, 1.0e6 + ts as f64)),
        ]
        .into(),
        ofu_fresh: fresh,
        fresh: [
            ("power_w".to_string(), fresh),
            ("energy_j".to_string(), fresh),
        ]
        .into(),
        ..Default::default()
    }
}

/// A queue over a fresh store, sending OFU, power and energy.
fn queue() -> Arc<RemoteQueue> {
    Arc::new(RemoteQueue::new(
        Store::new(Arc::new(MemEngine::new()), false),
        vec!["power_w".into(), "energy_j".into()],
        &BTreeMap::new(),
    ))
}

/// Commits one batch of `gpus` as ingest does (entry and register with it).
fn commit(q: &RemoteQueue, gpus: &[GpuLive]) {
    let (forward, forward_open) = q.forward_live(gpus, &CommitSet::default());
    let set = CommitSet {
        forward,
        forward_open,
        ..Default::default()
    };
    q.store.commit("t", &set).unwrap();
    q.committed(&set.forward);
}

/// Three batches of two GPUs a second apart, then GPU-b's job ends (its
/// job's series get staleness markers): the traffic every case reads.
fn traffic(q: &RemoteQueue, t0: i64) {
    for i in 0..3 {
        let t = t0 + i * 1_000;
        commit(q, &[gpu("GPU-a", t, None), gpu("GPU-b", t, Some("train"))]);
    }
    commit(q, &[gpu("GPU-b", t0 + 3_000, None)]);
}

/// Sends `traffic` under `cfg` to a receiver answering `script`, and
/// returns what it received.
async fn send(
    mut cfg: RemoteWriteConfig,
    script: Vec<(u16, &'static str)>,
    t0: i64,
) -> Vec<(String, Vec<u8>)> {
    let stub = Stub::start(script).await;
    cfg.url = stub.url.clone();
    let q = queue();
    traffic(&q, t0);
    let stats = Arc::new(Stats::default());
    run_until(&cfg, &q, &stats, || q.pending() == 0).await;
    stub.requests()
}

/// A request body decoded as the receiver would (snappy block format,
/// then the protobuf of `protocol`), each series' labels resolved.
fn decode(body: &[u8], v2: bool) -> Vec<Decoded> {
    let raw = snap::raw::Decoder::new()
        .decompress_vec(body)
        .expect("snappy block format");
    if !v2 {
        let req = WriteRequest::decode(&raw[..]).expect("a prometheus.WriteRequest");
        return req
            .timeseries
            .into_iter()
            .map(|s| {
                (
                    s.labels.into_iter().map(|l| (l.name, l.value)).collect(),
                    s.samples.iter().map(|x| (x.timestamp, x.value)).collect(),
                )
            })
            .collect();
    }
    let req = wire::Request::decode(&raw[..]).expect("an io.prometheus.write.v2.Request");
    let sym = |i: u32| {
        req.symbols
            .get(i as usize)
            .cloned()
            .expect("label ref in range")
    };
    req.timeseries
        .iter()
        .map(|s| {
            assert_eq!(s.labels_refs.len() % 2, 0, "labels_refs_even_length");
            (
                s.labels_refs
                    .chunks(2)
                    .map(|p| (sym(p[0]), sym(p[1])))
                    .collect(),
                s.samples.iter().map(|x| (x.timestamp, x.value)).collect(),
            )
        })
        .collect()
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
}

/// The cases on the series themselves, for either protocol: labels,
/// samples, timestamps, staleness.
fn check_series(reqs: &[(String, Vec<u8>)], v2: bool, t0: i64) {
    let mut all: BTreeMap<_, Vec<(i64, f64)>> = BTreeMap::new();
    for (_, body) in reqs {
        let series = decode(body, v2);
        // multiple_series_per_request
        assert!(!series.is_empty(), "empty request");
        for (labels, samples) in series {
            let names: Vec<&str> = labels.iter().map(|l| l.0.as_str()).collect();
            // label_lexicographic_ordering, no_duplicate_label_names
            assert!(names.windows(2).all(|w| w[0] < w[1]), "{names:?}");
            // metric_name_label_present, metric_name_format_valid
            let name = labels
                .iter()
                .find(|l| l.0 == "__name__")
                .map(|l| l.1.clone())
                .expect("__name__");
            assert!(is_metric_name(&name), "{name}");
            for (k, v) in &labels {
                // label_names_not_empty, label_name_format_valid,
                // reserved_label_prefix (only __name__)
                assert!(is_label_name(k), "{k}");
                assert!(!k.starts_with("__") || k == "__name__", "{k}");
                // flopwatch sends no empty value (the spec lets a sender).
                assert!(!v.is_empty(), "{k} is empty");
            }
            // timestamp_int64_milliseconds, timestamp_recent
            for (ts, _) in &samples {
                assert!(
                    (t0 - 60_000..t0 + 60_000).contains(ts),
                    "{ts} is not ms near {t0}"
                );
            }
            all.entry(labels).or_default().extend(samples);
        }
    }
    // The traffic's series: OFU, tensor, clock, power, energy of GPU-a,
    // GPU-b with its job and without.
    assert_eq!(all.len(), 15, "{:?}", all.keys().collect::<Vec<_>>());
    let get = |labels: &Vec<(String, String)>, k: &str| {
        labels.iter().find(|l| l.0 == k).map(|l| l.1.clone())
    };
    for (labels, samples) in &all {
        // timestamp_ordering_within_series (each series in one shard,
        // its requests in order)
        assert!(
            samples.windows(2).all(|w| w[0].0 < w[1].0),
            "{labels:?}: {samples:?}"
        );
        // unicode_in_label_values
        assert_eq!(get(labels, "hostname").as_deref(), Some("nœud-α"));
        let job = get(labels, "job_id");
        let stale = samples
            .iter()
            .filter(|s| s.1.to_bits() == STALE_NAN)
            .count();
        if job.is_some() {
            // stale_marker: the job's series end with Prometheus' marker,
            // exactly its bits, after their last sample.
            assert_eq!(samples.len(), 4, "{labels:?}");
            assert_eq!(stale, 1, "{labels:?}");
            assert_eq!(samples[3].1.to_bits(), STALE_NAN);
        } else {
            assert_eq!(stale, 0, "{labels:?}");
            // float_value_encoding, precision_preservation
            assert!(samples.iter().all(|s| s.1.is_finite()));
        }
    }
    let energy: Vec<f64> = all
        .iter()
        .filter(|(l, _)| {
            get(l, "__name__").as_deref() == Some("flopwatch_gpu_energy_joules_total")
                && get(l, "UUID").as_deref() == Some("GPU-a")
        })
        .flat_map(|(_, s)| s.iter().map(|x| x.1))
        .collect();
    // large_float_values, integer_value_encoding: exact.
    assert_eq!(
        energy,
        (0..3)
            .map(|i| 1.0e6 + (t0 + i * 1_000) as f64)
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn protocol_1_0_headers_body_series_and_metadata() {
    let t0 = SystemClock.now_ms();
    let reqs = send(fast(""), Vec::new(), t0).await;
    assert!(!reqs.is_empty());
    for (head, body) in &reqs {
        // rw1_content_type, content_encoding_snappy, rw1_version_header,
        // user_agent_present
        assert!(
            head.contains("content-type: application/x-protobuf\r\n"),
            "{head}"
        );
        assert!(head.contains("content-encoding: snappy"), "{head}");
        assert!(
            head.contains("x-prometheus-remote-write-version: 0.1.0"),
            "{head}"
        );
        assert!(head.contains("user-agent: flopwatch/"), "{head}");
        let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
        let req = WriteRequest::decode(&raw[..]).unwrap();
        // rw1_metadata_handling: each family in a request has its type,
        // help and unit there; counters typed as counters (named
        // without `_total`).
        for ts in &req.timeseries {
            let name = &ts
                .labels
                .iter()
                .find(|l| l.name == "__name__")
                .unwrap()
                .value;
            let (family, kind) = match name.strip_suffix("_total") {
                Some(f) => (f, 1),
                None => (name.as_str(), 2),
            };
            let md = req
                .metadata
                .iter()
                .find(|x| x.metric_family_name == family)
                .unwrap_or_else(|| panic!("no metadata of {family}"));
            assert_eq!(md.r#type, kind, "{family}");
            assert!(!md.help.is_empty(), "{family}");
        }
    }
    check_series(&reqs, false, t0);
}

#[tokio::test]
async fn protocol_2_0_headers_symbols_series_and_metadata() {
    let t0 = SystemClock.now_ms();
    let mut cfg = fast("");
    cfg.protocol = "2.0".into();
    let reqs = send(cfg, Vec::new(), t0).await;
    for (head, body) in &reqs {
        // content_type_with_proto_param, version_header_value
        assert!(
            head.contains(
                "content-type: application/x-protobuf;proto=io.prometheus.write.v2.request"
            ),
            "{head}"
        );
        assert!(head.contains("content-encoding: snappy"), "{head}");
        assert!(
            head.contains("x-prometheus-remote-write-version: 2.0.0"),
            "{head}"
        );
        assert!(head.contains("user-agent: flopwatch/"), "{head}");
        let raw = snap::raw::Decoder::new().decompress_vec(body).unwrap();
        let req = wire::Request::decode(&raw[..]).unwrap();
        // empty_string_at_index_zero, string_deduplication
        assert_eq!(req.symbols.first().map(String::as_str), Some(""));
        let unique: std::collections::BTreeSet<&String> = req.symbols.iter().collect();
        assert_eq!(unique.len(), req.symbols.len(), "{:?}", req.symbols);
        for s in &req.timeseries {
            // metadata_type_*, metadata_help_refs_valid
            let md = s.metadata.as_ref().expect("metadata");
            assert!((md.help_ref as usize) < req.symbols.len());
            assert!((md.unit_ref as usize) < req.symbols.len());
            assert!(!req.symbols[md.help_ref as usize].is_empty(), "help");
            let name = s
                .labels_refs
                .chunks(2)
                .find(|p| req.symbols[p[0] as usize] == "__name__")
                .map(|p| req.symbols[p[1] as usize].clone())
                .unwrap();
            let want = if name.ends_with("_total") {
                wire::MetricType::Counter
            } else {
                wire::MetricType::Gauge
            };
            assert_eq!(md.r#type, want as i32, "{name}");
            // rw1_no_start_timestamp's 2.0 side: unset, not made up.
            assert_eq!(s.created_timestamp, 0);
        }
    }
    check_series(&reqs, true, t0);
}

#[tokio::test]
async fn retried_and_dropped_by_status_as_the_spec_says() {
    // (status, retried): no_retry_on_400/401/404/413; may_retry_on_429;
    // retry_on_500/502/503/504.
    let cases: [(u16, bool); 9] = [
        (400, false),
        (401, false),
        (404, false),
        (413, false),
        (429, true),
        (500, true),
        (502, true),
        (503, true),
        (504, true),
    ];
    for (status, retried) in cases {
        let stub = Stub::start(vec![(status, "error body\nsecond line")]).await;
        let mut cfg = fast(&stub.url);
        cfg.max_shards = 1;
        cfg.max_samples_per_request = 1_000;
        let q = queue();
        commit(&q, &[gpu("GPU-a", SystemClock.now_ms(), None)]);
        let stats = Arc::new(Stats::default());
        // sender_continues_after_errors: either way the journal empties.
        run_until(&cfg, &q, &stats, || q.pending() == 0).await;
        let reqs = stub.requests();
        if retried {
            assert_eq!(reqs.len(), 2, "{status}: retried once, then 200");
            assert_eq!(reqs[0].1, reqs[1].1, "{status}: the same request again");
            assert_eq!(Stats::get(&stats.remote_write_samples), 5);
        } else {
            assert_eq!(reqs.len(), 1, "{status}: not retried");
            assert_eq!(Stats::get(&stats.remote_write_refused), 5);
        }
    }
}

#[tokio::test]
async fn successes_errors_and_odd_answers() {
    // handle_200_ok, handle_204_no_content, ignore_response_body_on_success:
    // every one delivers, none is sent again.
    let mut one = fast("");
    one.max_shards = 1;
    for (status, body) in [(200, "{\"whatever\": true}"), (204, ""), (202, "queued")] {
        let reqs = send(one.clone(), vec![(status, body)], SystemClock.now_ms()).await;
        let first = &reqs[0].1;
        assert_eq!(reqs.iter().filter(|r| &r.1 == first).count(), 1, "{status}");
    }
    // handle_large_error_body, log_error_messages_verbatim: a 500 with a
    // megabyte of body is retried; its first line is what is logged.
    let big: &'static str = Box::leak(format!("boom\n{}", "x".repeat(1 << 20)).into_boxed_str());
    let reqs = send(one.clone(), vec![(500, big)], SystemClock.now_ms()).await;
    assert_eq!(reqs[0].1, reqs[1].1);
    // handle_empty_response, handle_malformed_response, handle_timeout:
    // a connection closed without an answer, garbage instead of HTTP,
    // and no answer within `timeout` are all retried.
    let mut cfg = one;
    cfg.timeout = Duration::from_millis(300);
    let reqs = send(
        cfg,
        vec![(0, ""), (1, "not http at all\r\n\r\n"), (2, "")],
        SystemClock.now_ms(),
    )
    .await;
    assert!(reqs.len() >= 4, "{}", reqs.len());
    assert_eq!(reqs[0].1, reqs[1].1);
    assert_eq!(reqs[1].1, reqs[2].1);
    assert_eq!(reqs[2].1, reqs[3].1);
}

#[tokio::test]
async fn requests_stay_within_their_size_and_carry_many_series() {
    // batch_size_reasonable, multiple_series_per_request, many_timeseries:
    // 200 GPUs' batches go in requests of at most max_samples_per_request
    // samples, each with many series.
    let stub = Stub::start(Vec::new()).await;
    let mut cfg = fast(&stub.url);
    cfg.max_samples_per_request = 100;
    let q = queue();
    let t0 = SystemClock.now_ms();
    let gpus: Vec<GpuLive> = (0..200)
        .map(|i| gpu(&format!("GPU-{i:03}"), t0, None))
        .collect();
    commit(&q, &gpus);
    let stats = Arc::new(Stats::default());
    run_until(&cfg, &q, &stats, || q.pending() == 0).await;
    let mut total = 0;
    for (_, body) in stub.requests() {
        let series = decode(&body, false);
        let n: usize = series.iter().map(|s| s.1.len()).sum();
        assert!(n <= 100, "{n} samples in one request");
        assert!(series.len() >= 10, "{} series", series.len());
        total += n;
    }
    assert_eq!(total, 1_000);
    // The journal held them as sent: nothing dropped.
    assert!(q.store.journal_read(0, u64::MAX).unwrap().0.is_empty());
}
