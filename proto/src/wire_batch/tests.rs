use super::*;
use proptest::prelude::*;
use prost::encoding::{double, encode_key, encode_varint, int64, string as pstring, uint32};

/// What the generated code and the conversion make of `bytes`.
fn reference(bytes: &[u8]) -> Result<Result<Batch, ConvertError>, DecodeError> {
    Ok(Batch::try_from(v1::Batch::decode(bytes)?))
}

/// `decode_batch` against [`reference`]: both errors, or the same batch
/// (or the same malformed series), and the samples counted.
fn agrees(bytes: &[u8]) -> Result<(), TestCaseError> {
    let ours = decode_batch(bytes);
    let theirs = reference(bytes);
    match (ours, theirs) {
        (Err(_), Err(_)) => {}
        (Ok(w), Ok(conv)) => {
            prop_assert_eq!(w.len, bytes.len());
            let wire = v1::Batch::decode(bytes).unwrap();
            let samples: usize = wire.series.iter().map(|s| s.timestamps_ms.len()).sum();
            prop_assert_eq!(w.samples, samples);
            match conv {
                Ok(b) => {
                    prop_assert_eq!(w.malformed, None);
                    prop_assert_eq!(w.batch, b);
                }
                // The conversion refuses a zero seq; the decoding leaves it
                // to the collector.
                Err(ConvertError::Missing("batch.seq")) => {
                    prop_assert_eq!(w.batch.seq, 0);
                    let mut again = wire.clone();
                    again.seq = 1;
                    match Batch::try_from(again) {
                        Ok(mut b) => {
                            b.seq = 0;
                            prop_assert_eq!(w.malformed, None);
                            prop_assert_eq!(w.batch, b);
                        }
                        Err(e) => prop_assert_eq!(w.malformed, Some(e)),
                    }
                }
                Err(e) => prop_assert_eq!(w.malformed, Some(e)),
            }
        }
        (ours, theirs) => {
            return Err(TestCaseError::fail(format!(
                "ours {:?}, generated code {:?}",
                ours.map(|_| ()),
                theirs.map(|_| ())
            )))
        }
    }
    Ok(())
}

fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("GPU-0a1b2c3d-0000-1111-2222-333344445555".to_string()),
        Just("tensor_active".to_string()),
        Just(String::new()),
        "\\PC{0,6}",
    ]
}

/// A series whose columns mostly agree in length, and sometimes do not.
fn series() -> impl Strategy<Value = v1::Series> {
    (
        name(),
        name(),
        0usize..5,
        prop_oneof![4 => Just(None), 1 => (0usize..5).prop_map(Some)],
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(any::<(i64, f64, f64, u32)>(), 5),
    )
        .prop_map(|(gpu, metric, n, other, peaks, windows, cells)| {
            let m = other.unwrap_or(n);
            v1::Series {
                gpu_uuid: gpu,
                metric,
                timestamps_ms: cells[..n].iter().map(|c| c.0).collect(),
                values: cells[..m].iter().map(|c| c.1).collect(),
                peaks: if peaks {
                    cells[..n].iter().map(|c| c.2).collect()
                } else {
                    vec![]
                },
                window_ms: if windows {
                    cells[..n].iter().map(|c| c.3).collect()
                } else {
                    vec![]
                },
            }
        })
}

fn batch() -> impl Strategy<Value = v1::Batch> {
    (
        0u64..4,
        name(),
        name(),
        proptest::collection::vec(series(), 0..6),
        any::<(i64, bool, u64, u32, bool)>(),
        proptest::collection::vec((name(), name(), any::<u32>()), 0..3),
        proptest::collection::vec((name(), name(), any::<i64>()), 0..2),
        proptest::collection::vec((name(), any::<i64>(), any::<Option<f64>>()), 0..2),
    )
        .prop_map(
            |(seq, agent, boot, series, (sent, spool, pb, pn, unc), iv, jobs, mfu)| v1::Batch {
                seq,
                agent_id: agent,
                boot_id: boot,
                series,
                jobs: jobs
                    .into_iter()
                    .map(|(gpu, job, since)| v1::JobAssignment {
                        gpu_uuid: gpu,
                        job_id: job,
                        since_ms: since,
                        ..Default::default()
                    })
                    .collect(),
                events: vec![],
                sent_at_ms: sent,
                from_spool: spool,
                intervals: iv
                    .into_iter()
                    .map(|(gpu, metric, ms)| v1::SamplingInterval {
                        gpu_uuid: gpu,
                        metric,
                        interval_ms: ms,
                    })
                    .collect(),
                pending_bytes: pb,
                pending_batches: pn,
                mfu_reports: mfu
                    .into_iter()
                    .map(|(job, ts, m)| v1::MfuReport {
                        job_id: job,
                        timestamp_ms: ts,
                        mfu: m,
                        ..Default::default()
                    })
                    .collect(),
                uncertain: unc,
            },
        )
}

/// Encoded fields of a message whose tag `t` (from 1) has the wire type
/// `wires[t - 1]` (0 varint, 1 64 bits, 2 length-delimited; an unknown
/// tag past them), each mostly of its own wire type, in any order and
/// number: non-canonical bools and integers, unknown fields, repeats,
/// and now and then a wrong wire type.
fn soup(wires: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    let tags = wires.len() as u32 + 2;
    proptest::collection::vec(
        (
            1..=tags,
            prop_oneof![9 => Just(None), 1 => (0u8..3).prop_map(Some)],
            prop_oneof![Just(0u64), Just(1), Just(2), any::<u64>()],
            prop_oneof![
                Just(Vec::new()),
                "\\PC{0,4}".prop_map(String::into_bytes),
                proptest::collection::vec(any::<u8>(), 0..9)
            ],
        ),
        0..10,
    )
    .prop_map(move |fields| {
        let mut b = Vec::new();
        for (tag, wrong, v, bytes) in fields {
            let own = wires
                .get(tag as usize - 1)
                .copied()
                .unwrap_or((tag % 3) as u8);
            match wrong.unwrap_or(own) {
                0 => {
                    encode_key(tag, WireType::Varint, &mut b);
                    encode_varint(v, &mut b);
                }
                1 => {
                    encode_key(tag, WireType::SixtyFourBit, &mut b);
                    b.extend_from_slice(&v.to_le_bytes());
                }
                _ => {
                    encode_key(tag, WireType::LengthDelimited, &mut b);
                    encode_varint(bytes.len() as u64, &mut b);
                    b.extend_from_slice(&bytes);
                }
            }
        }
        b
    })
}

/// `v1::Batch`'s fields' wire types (series, field 4, added apart).
const BATCH_WIRES: &[u8] = &[0, 2, 2, 3, 2, 2, 0, 0, 2, 0, 0, 2, 0];
/// `v1::Series`'s: strings, then packed columns or single entries.
const SERIES_WIRES: &[u8] = &[2, 2, 0, 1, 1, 0];

proptest! {
    /// Any batch, encoded as the generated code encodes it, decodes to
    /// what the generated code and the conversion make of it.
    #[test]
    fn a_batch_decodes_as_the_generated_code_and_the_conversion_make_it(b in batch()) {
        agrees(&b.encode_to_vec())?;
    }

    /// The same bytes damaged (a byte changed, or cut short): an error
    /// where the generated code finds one, else the same batch.
    #[test]
    fn damaged_bytes_fail_where_the_generated_code_fails(
        b in batch(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<bool>(),
    ) {
        let mut bytes = b.encode_to_vec();
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            if cut {
                bytes.truncate(i);
            } else {
                bytes[i] = byte;
            }
        }
        agrees(&bytes)?;
    }

    /// Fields of any number and wire type, in any order, at the batch's
    /// level and inside a series: what the generated code makes of them.
    #[test]
    fn any_soup_of_fields_decodes_as_the_generated_code_decodes_it(
        outer in soup(BATCH_WIRES),
        inner in proptest::collection::vec(soup(SERIES_WIRES), 0..3),
    ) {
        let mut bytes = outer;
        for s in inner {
            encode_key(4, WireType::LengthDelimited, &mut bytes);
            encode_varint(s.len() as u64, &mut bytes);
            bytes.extend_from_slice(&s);
        }
        agrees(&bytes)?;
    }

    /// Arbitrary bytes as an AgentMessage: an error where the generated
    /// code finds one, else the same message.
    #[test]
    fn arbitrary_bytes_as_an_agent_message(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let ours = AgentFrame::decode(&bytes);
        let theirs = v1::AgentMessage::decode(bytes.as_slice());
        prop_assert_eq!(ours.is_ok(), theirs.is_ok(), "{:?} / {:?}", ours, theirs);
    }
}

/// An unpacked column entry by entry, as protobuf allows a sender to
/// write a repeated scalar.
#[test]
fn unpacked_columns_in_any_order_decode_as_packed_ones() {
    let mut s = Vec::new();
    // Values first, then timestamps one field each, windows packed, the
    // metric after the columns, an unknown field in between.
    for v in [0.5f64, 0.75] {
        double::encode(4, &v, &mut s);
    }
    encode_key(99, WireType::Varint, &mut s);
    encode_varint(7, &mut s);
    for t in [1_000i64, 2_000] {
        int64::encode(3, &t, &mut s);
    }
    uint32::encode_packed(6, &[100, 100], &mut s);
    pstring::encode(1, &"GPU-a".to_string(), &mut s);
    pstring::encode(2, &"tensor_active".to_string(), &mut s);
    let mut b = Vec::new();
    int64::encode(1, &5, &mut b);
    encode_key(4, WireType::LengthDelimited, &mut b);
    encode_varint(s.len() as u64, &mut b);
    b.extend_from_slice(&s);

    let w = decode_batch(&b).unwrap();
    assert_eq!(w.malformed, None);
    assert_eq!(w.samples, 2);
    let got = &w.batch.series[0];
    assert_eq!(
        (got.gpu_uuid.as_str(), got.metric.as_str()),
        ("GPU-a", "tensor_active")
    );
    let want: Vec<Point> = [(1_000, 0.5), (2_000, 0.75)]
        .into_iter()
        .map(|(ts_ms, value)| Point {
            ts_ms,
            value,
            peak: None,
            window_ms: Some(100),
        })
        .collect();
    assert_eq!(got.points, want);
    agrees(&b).unwrap();
}

#[test]
fn a_series_whose_columns_disagree_is_reported_not_an_error() {
    let b = v1::Batch {
        seq: 3,
        series: vec![
            v1::Series {
                gpu_uuid: "g".into(),
                metric: "power_w".into(),
                timestamps_ms: vec![1, 2],
                values: vec![1.0, 2.0],
                ..Default::default()
            },
            v1::Series {
                gpu_uuid: "g".into(),
                metric: "sm_clock_avg_mhz".into(),
                timestamps_ms: vec![1, 2],
                values: vec![1.0],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let w = decode_batch(&b.encode_to_vec()).unwrap();
    assert_eq!(w.batch.seq, 3);
    assert_eq!(w.samples, 4);
    assert_eq!(
        w.malformed.map(|e| e.to_string()).as_deref(),
        Some("series g/sm_clock_avg_mhz: values has 1 entries, timestamps_ms has 2")
    );
}

/// A oneof takes its last member; repeats of a message member merge.
#[test]
fn an_agent_message_takes_its_last_member_and_merges_repeats() {
    let part = |b: v1::Batch| {
        v1::AgentMessage {
            msg: Some(v1::agent_message::Msg::Batch(b)),
        }
        .encode_to_vec()
    };
    let hello = v1::AgentMessage {
        msg: Some(v1::agent_message::Msg::Hello(v1::Hello {
            agent_id: "a".into(),
            ..Default::default()
        })),
    }
    .encode_to_vec();
    let one = v1::Batch {
        seq: 1,
        agent_id: "first".into(),
        series: vec![v1::Series {
            gpu_uuid: "g".into(),
            metric: "power_w".into(),
            timestamps_ms: vec![1],
            values: vec![1.0],
            ..Default::default()
        }],
        ..Default::default()
    };
    let two = v1::Batch {
        seq: 2,
        series: one.series.clone(),
        ..Default::default()
    };
    let bytes = [hello.clone(), part(one), part(two)].concat();
    let theirs = v1::AgentMessage::decode(bytes.as_slice()).unwrap();
    let Some(v1::agent_message::Msg::Batch(theirs)) = theirs.msg else {
        panic!("the generated code took the batch");
    };
    let AgentFrame::Batch(ours) = AgentFrame::decode(&bytes).unwrap() else {
        panic!("a batch");
    };
    assert_eq!(ours.batch, Batch::try_from(theirs).unwrap());
    assert_eq!((ours.batch.seq, ours.batch.series.len()), (2, 2));
    assert_eq!(ours.batch.agent_id, "first");
    // A Hello after the batch wins.
    let bytes = [bytes, hello].concat();
    assert!(
        matches!(AgentFrame::decode(&bytes).unwrap(), AgentFrame::Hello(h) if h.agent_id == "a")
    );
    assert_eq!(AgentFrame::decode(&[]).unwrap(), AgentFrame::Empty);
}
