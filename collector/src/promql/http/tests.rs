//! The API's parsing and formatting against Prometheus 2.42's, and its
//! routes, authentication and error shapes over a real listener.

use super::*;
use crate::auth::{digest, Auth};
use crate::promql::{RangeSeries, Sample};
use crate::store::{memory::MemEngine, Store};
use flopwatch_config::{CollectorConfig, QueryToken, SpecTable, TenantConfig};

#[test]
fn sample_values_are_formatted_as_go_formats_them() {
    for (v, s) in [
        (2.0, "2"),
        (0.1, "0.1"),
        (-0.0, "-0"),
        (1234.5678, "1234.5678"),
        (1e-6, "0.000001"),
        (1e-7, "1e-07"),
        (-2.5e-9, "-2.5e-09"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (f64::NAN, "NaN"),
        (f64::INFINITY, "+Inf"),
        (f64::NEG_INFINITY, "-Inf"),
    ] {
        assert_eq!(format_sample(v), s, "{v}");
    }
    // A scalar never takes the exponent form ('f', -1).
    assert_eq!(format_scalar(1e-7), "0.0000001");
    assert_eq!(format_scalar(2.0), "2");
}

/// Significant digits of a plain or exponent-form decimal.
fn significant(s: &str) -> String {
    let m = s.split(['e', 'E']).next().unwrap_or(s);
    m.chars()
        .filter(char::is_ascii_digit)
        .collect::<String>()
        .trim_matches('0')
        .to_string()
}

#[test]
fn exact_ties_between_two_shortest_forms_go_to_the_even_digit_as_go_writes_them() {
    // What Debian's Prometheus 2.42 answers for these scalars (`query=`
    // the literal): Go's shortest digits round an exact tie to even, where
    // Rust's Display rounds it up.
    // Values 1/8 apart here: each sum is exact.
    let whole = 1_030_303_766_277_303.0_f64;
    assert_eq!(format_scalar(whole + 0.25), "1030303766277303.2");
    assert_eq!(format_scalar(whole + 0.75), "1030303766277303.8");
    assert_eq!(format_scalar(-(whole + 0.25)), "-1030303766277303.2");
}

proptest::proptest! {
    /// For any finite value: the shortest digits that read back as the
    /// value (as many as Rust's Display writes, the same but for the
    /// last one on an exact tie), never in exponent form for a scalar, and
    /// in Go's exponent form for a sample outside [1e-6, 1e21).
    #[test]
    fn values_are_written_in_their_shortest_round_trip_digits(bits in proptest::prelude::any::<u64>(), small in 0.0f64..1.0) {
        for v in [f64::from_bits(bits), small, small * 100.0, (small * 1e4).round()] {
            if !v.is_finite() {
                continue;
            }
            let s = format_scalar(v);
            proptest::prop_assert!(!s.contains(['e', 'E']), "{s}");
            proptest::prop_assert_eq!(s.parse::<f64>().ok(), Some(v), "{}", s);
            let (ours, display) = (significant(&s), significant(&format!("{v}")));
            proptest::prop_assert_eq!(ours.len(), display.len(), "{} {}", s, v);
            let last = |d: &str| d.bytes().last().map_or(0, i32::from);
            proptest::prop_assert!(
                ours[..ours.len().saturating_sub(1)] == display[..display.len().saturating_sub(1)]
                    && (last(&ours) - last(&display)).abs() <= 1,
                "{} against {}", s, v
            );
            let sample = format_sample(v);
            proptest::prop_assert_eq!(sample.parse::<f64>().ok(), Some(v), "{}", sample);
            proptest::prop_assert_eq!(significant(&sample), ours);
            let a = v.abs();
            let exponent = a != 0.0 && !(1e-6..1e21).contains(&a);
            proptest::prop_assert_eq!(sample.contains("e+") || sample.contains("e-"), exponent, "{}", sample);
        }
    }
}

#[test]
fn timestamps_are_seconds_with_up_to_three_decimals() {
    for (ms, s) in [
        (4000, "4"),
        (1_700_000_000_100, "1700000000.100"),
        (1_700_000_000_001, "1700000000.001"),
        (1_700_000_000_010, "1700000000.010"),
        (-1500, "-1.500"),
        (0, "0"),
    ] {
        let mut out = String::new();
        timestamp_json(&mut out, ms);
        assert_eq!(out, s);
    }
}

#[test]
fn times_parse_as_prometheus_parses_them() {
    assert_eq!(parse_time("4"), Ok(4000));
    assert_eq!(parse_time("1700000000.1"), Ok(1_700_000_000_100));
    assert_eq!(parse_time("1700000000.1234"), Ok(1_700_000_000_123));
    assert_eq!(parse_time("1.5e3"), Ok(1_500_000));
    assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
    assert_eq!(
        parse_time("2023-11-14T22:13:20.123456789Z"),
        Ok(1_700_000_000_123)
    );
    assert_eq!(
        parse_time("2023-11-14T23:13:20.5+01:00"),
        Ok(1_700_000_000_500)
    );
    assert_eq!(parse_time("1970-01-01T00:00:00Z"), Ok(0));
    assert_eq!(parse_time(MIN_TIME_TEXT), Ok(MIN_TIME_MS));
    assert_eq!(parse_time(MAX_TIME_TEXT), Ok(MAX_TIME_MS));
    for bad in [
        "",
        "abc",
        "2023-13-01T00:00:00Z",
        "2023-11-14 22:13:20Z",
        "1_000",
    ] {
        assert_eq!(
            parse_time(bad),
            Err(format!("cannot parse {bad:?} to a valid timestamp"))
        );
    }
}

#[test]
fn durations_parse_as_prometheus_parses_them() {
    let ms = |s: &str| parse_duration_ns(s).map(|ns| ns / 1_000_000);
    assert_eq!(ms("15"), Ok(15_000));
    assert_eq!(ms("0.5"), Ok(500));
    assert_eq!(ms("15s"), Ok(15_000));
    assert_eq!(ms("1m30s"), Ok(90_000));
    assert_eq!(ms("1h"), Ok(3_600_000));
    assert_eq!(ms("2d"), Ok(172_800_000));
    assert_eq!(ms("1w"), Ok(604_800_000));
    assert_eq!(ms("1y"), Ok(31_536_000_000));
    assert_eq!(ms("250ms"), Ok(250));
    assert_eq!(ms("1m5ms"), Ok(60_005));
    assert_eq!(ms("0"), Ok(0));
    // Out of order, repeated, fractional or unit-less: refused.
    for bad in ["", "s", "1s1m", "1m1m", "1.5m", "1m0.1s", "5x", "-1s"] {
        assert_eq!(
            parse_duration_ns(bad),
            Err(format!("cannot parse {bad:?} to a valid duration")),
            "{bad}"
        );
    }
}

#[test]
fn strings_are_escaped_as_go_escapes_them() {
    assert_eq!(json_str("a\"b\\c"), r#""a\"b\\c""#);
    assert_eq!(json_str("<&>"), r#""\u003c\u0026\u003e""#);
    assert_eq!(json_str("\u{1}\n"), r#""\u0001\n""#);
    assert_eq!(json_str("é"), "\"é\"");
}

async fn body(r: Response) -> (u16, String) {
    let status = r.status().as_u16();
    let b = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(b.to_vec()).unwrap())
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn results_are_written_as_prometheus_writes_them() {
    assert_eq!(
        body(json_response(query_body(
            &Value::Scalar { t_ms: 4000, v: 2.0 },
            &[]
        )))
        .await,
        (
            200,
            r#"{"status":"success","data":{"resultType":"scalar","result":[4,"2"]}}"#.into()
        )
    );
    let v = Value::Vector(vec![Sample {
        labels: labels(&[("job_id", "a"), ("__name__", "flopwatch_ofu_ratio")]),
        t_ms: 1_700_000_000_100,
        v: 0.25,
    }]);
    assert_eq!(
        body(json_response(query_body(&v, &[]))).await.1,
        r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"flopwatch_ofu_ratio","job_id":"a"},"value":[1700000000.100,"0.25"]}]}}"#
    );
    let m = Value::Matrix(vec![RangeSeries {
        labels: labels(&[("gpu", "0")]),
        points: vec![(15_000, 1.0), (30_000, f64::NAN)],
    }]);
    assert_eq!(
        body(json_response(query_body(&m, &[]))).await.1,
        r#"{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"gpu":"0"},"values":[[15,"1"],[30,"NaN"]]}]}}"#
    );
    assert_eq!(
        body(json_response(query_body(&Value::Vector(vec![]), &[])))
            .await
            .1,
        r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#
    );
}

/// A matrix is written on every core as point by point on one, its
/// series' timestamps taken from the longest series' where they are
/// there: series of unequal length, with gaps, and with times the
/// longest has not.
#[test]
fn large_matrices_are_written_on_every_core_as_on_one() {
    // Enough points for the parallel path, over series of unequal length.
    let series: Vec<RangeSeries> = (0..7)
        .map(|g| RangeSeries {
            labels: labels(&[("gpu", &g.to_string())]),
            points: (0..(PARALLEL_POINTS / 4 + g * 1_000))
                .filter(|i| g % 2 == 0 || i % 3 != 0)
                .map(|i| {
                    let late = if g == 3 && i % 5 == 0 { 500 } else { 0 };
                    (i as i64 * 15_000 + 1 + late, i as f64 / 7.0 + g as f64)
                })
                .collect(),
        })
        .collect();
    let mut want = String::from(SUCCESS);
    want.push_str(r#"{"resultType":"matrix","result":["#);
    for (i, s) in series.iter().enumerate() {
        if i > 0 {
            want.push(',');
        }
        want.push_str(r#"{"metric":"#);
        labels_json(&mut want, &s.labels);
        want.push_str(r#","values":["#);
        for (j, &(t, v)) in s.points.iter().enumerate() {
            if j > 0 {
                want.push(',');
            }
            point_json(&mut want, t, v);
        }
        want.push_str("]}");
    }
    want.push_str(r#"]},"warnings":["peer c2 did not answer"]}"#);
    let warnings = ["peer c2 did not answer".to_string()];
    assert_eq!(query_body(&Value::Matrix(series), &warnings), want);
}

#[tokio::test]
async fn errors_carry_prometheus_types_and_codes() {
    for (e, code, json) in [
        (
            ApiError::Query(QueryError::BadData("x".into())),
            400,
            r#"{"status":"error","errorType":"bad_data","error":"x"}"#,
        ),
        (
            ApiError::Query(QueryError::Unsupported("y".into())),
            422,
            r#"{"status":"error","errorType":"execution","error":"y"}"#,
        ),
        (
            ApiError::Query(QueryError::Internal("z".into())),
            500,
            r#"{"status":"error","errorType":"internal","error":"z"}"#,
        ),
        (
            ApiError::Timeout,
            503,
            r#"{"status":"error","errorType":"timeout","error":"query timed out in query execution"}"#,
        ),
    ] {
        assert_eq!(body(e.into_response()).await, (code, json.to_string()));
    }
}

/// A collector over an in-memory store with tenant `acme` (query token
/// `acme-read`) and a provider token, its API on `127.0.0.1:0`.
async fn api(anonymous: Option<&str>) -> String {
    let cfg = CollectorConfig {
        admin_tokens_sha256: vec![digest("provider")],
        anonymous_tenant: anonymous.map(String::from),
        tenants: vec![TenantConfig {
            name: "acme".into(),
            query_tokens: vec![QueryToken {
                sha256: digest("acme-read"),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let c = Collector::new(
        Store::new(Arc::new(MemEngine::new()), false),
        SpecTable::builtin(),
        Auth::from_config(&cfg),
        crate::Settings::from_config(&cfg, Vec::new()),
        Arc::new(flopwatch_proto::clock::ManualClock::new(1_700_000_000_000)),
    )
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(serve(c, l, None, std::future::pending()));
    url
}

async fn get(url: &str, token: Option<&str>) -> (u16, String) {
    let mut r = reqwest::Client::new().get(url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let r = r.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn every_endpoint_needs_a_known_token() {
    let url = api(None).await;
    for path in [
        "/api/v1/query?query=1%2B1&time=4",
        "/api/v1/query_range?query=up&start=0&end=60&step=15",
        "/api/v1/series?match[]=up",
        "/api/v1/labels",
        "/api/v1/label/job_id/values",
        "/api/v1/status/buildinfo",
        "/api/v1/metadata",
        "/api/v1/rules",
    ] {
        for token in [None, Some("wrong"), Some("")] {
            let (code, body) = get(&format!("{url}{path}"), token).await;
            assert_eq!(code, 401, "{path} {token:?}");
            assert_eq!(
                body,
                r#"{"status":"error","errorType":"unauthorized","error":"missing or invalid credentials"}"#
            );
        }
        for token in ["acme-read", "provider"] {
            let (code, body) = get(&format!("{url}{path}"), Some(token)).await;
            assert_ne!(code, 401, "{path} {token}: {body}");
        }
    }
}

#[tokio::test]
async fn an_anonymous_tenant_needs_no_token_but_a_wrong_one_is_refused() {
    let url = api(Some("default")).await;
    let (code, body) = get(&format!("{url}/api/v1/labels"), None).await;
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"status":"success","data":[]}"#)
    );
    assert_eq!(get(&format!("{url}/api/v1/labels"), Some("x")).await.0, 401);
}

#[tokio::test]
async fn bad_parameters_are_refused_with_prometheus_messages() {
    let url = api(None).await;
    let err = |m: &str| {
        format!(
            r#"{{"status":"error","errorType":"bad_data","error":{}}}"#,
            json_str(m)
        )
    };
    for (path, msg) in [
        (
            "/api/v1/query?query=up&time=yesterday",
            r#"invalid parameter "time": Invalid time value for 'time': cannot parse "yesterday" to a valid timestamp"#,
        ),
        (
            "/api/v1/query?query=up&timeout=soon",
            r#"invalid parameter "timeout": cannot parse "soon" to a valid duration"#,
        ),
        (
            "/api/v1/query_range?query=up&end=60&step=15",
            r#"invalid parameter "start": cannot parse "" to a valid timestamp"#,
        ),
        (
            "/api/v1/query_range?query=up&start=60&end=0&step=15",
            r#"invalid parameter "end": end timestamp must not be before start time"#,
        ),
        (
            "/api/v1/query_range?query=up&start=0&end=60",
            r#"invalid parameter "step": cannot parse "" to a valid duration"#,
        ),
        (
            "/api/v1/query_range?query=up&start=0&end=60&step=0",
            r#"invalid parameter "step": zero or negative query resolution step widths are not accepted. Try a positive integer"#,
        ),
        (
            "/api/v1/query_range?query=up&start=0&end=11001&step=1",
            "exceeded maximum resolution of 11,000 points per timeseries. Try decreasing the query resolution (?step=XX)",
        ),
        ("/api/v1/series", "no match[] parameter provided"),
        (
            "/api/v1/labels?start=x",
            r#"invalid parameter "start": Invalid time value for 'start': cannot parse "x" to a valid timestamp"#,
        ),
        ("/api/v1/label/job-id/values", r#"invalid label name: "job-id""#),
    ] {
        assert_eq!(
            get(&format!("{url}{path}"), Some("acme-read")).await,
            (400, err(msg)),
            "{path}"
        );
    }
    // 11,000 points exactly are allowed through to the engine.
    let (code, _) = get(
        &format!("{url}/api/v1/query_range?query=up&start=0&end=11000&step=1"),
        Some("acme-read"),
    )
    .await;
    assert_ne!(code, 400);
}

#[tokio::test]
async fn post_forms_are_read_body_first() {
    let url = api(None).await;
    let r = reqwest::Client::new()
        .post(format!("{url}/api/v1/query_range?step=oops"))
        .bearer_auth("acme-read")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("query=up&start=0&end=60&step=15s&step=bad")
        .send()
        .await
        .unwrap();
    // The body's first step (15s) wins over the URL's and the body's later
    // ones: the request reaches the engine.
    assert_ne!(r.status().as_u16(), 400, "{}", r.text().await.unwrap());
    let r = reqwest::Client::new()
        .post(format!("{url}/api/v1/series"))
        .bearer_auth("acme-read")
        .header("content-type", "application/x-www-form-urlencoded")
        .body("match%5B%5D=up&match%5B%5D=flopwatch_ofu_ratio")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test]
async fn fixed_endpoints_answer_as_prometheus_does() {
    let url = api(None).await;
    let t = Some("acme-read");
    assert_eq!(
        get(&format!("{url}/api/v1/metadata"), t).await,
        (200, r#"{"status":"success","data":{}}"#.into())
    );
    assert_eq!(
        get(&format!("{url}/api/v1/rules"), t).await,
        (200, r#"{"status":"success","data":{"groups":[]}}"#.into())
    );
    let (code, b) = get(&format!("{url}/api/v1/status/buildinfo"), t).await;
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["data"]["version"], API_VERSION);
    assert!(v["data"].get("features").is_none(), "{b}");
    for f in ["revision", "branch", "buildUser", "buildDate", "goVersion"] {
        assert!(v["data"][f].is_string(), "{f}: {b}");
    }
    let (code, b) = get(
        &format!("{url}/api/v1/query_exemplars?query=up&start=0&end=1"),
        t,
    )
    .await;
    assert_eq!(code, 404);
    assert!(b.contains(r#""errorType":"not_found""#), "{b}");
}
