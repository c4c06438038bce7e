//! Comparing PromQL answers: a result (Prometheus's JSON, or flopwatch's
//! engine value) reduced to its label sets and points, and the
//! differences two such answers have (same label sets, same times, values
//! within a relative 1e-6, NaN equal to NaN).

use flopwatch_collector::promql::Value;
use std::collections::BTreeMap;

/// Label set → points.
pub type Canon = BTreeMap<Vec<(String, String)>, Vec<(i64, f64)>>;

/// The label set under which a scalar's (or string's) point is kept.
fn scalar_key() -> Vec<(String, String)> {
    vec![("__scalar__".into(), String::new())]
}

/// Values equal to within a relative 1e-6 (or 1e-12 absolute), NaN
/// equal to NaN.
pub fn approx(a: f64, b: f64) -> bool {
    (a.is_nan() && b.is_nan())
        || a == b
        || (a - b).abs() <= 1e-6 * a.abs().max(b.abs())
        || (a - b).abs() < 1e-12
}

/// An engine value reduced.
pub fn canon_value(v: Value) -> Canon {
    let mut out = Canon::new();
    match v {
        Value::Scalar { t_ms, v } => {
            out.insert(scalar_key(), vec![(t_ms, v)]);
        }
        Value::String { t_ms, .. } => {
            out.insert(scalar_key(), vec![(t_ms, f64::NAN)]);
        }
        Value::Vector(s) => {
            for s in s {
                out.entry(s.labels).or_default().push((s.t_ms, s.v));
            }
        }
        Value::Matrix(m) => {
            for s in m {
                out.entry(s.labels).or_default().extend(s.points);
            }
        }
    }
    out
}

/// A Prometheus API `data` object reduced; the order of an instant
/// vector's series comes back too (for `sort`).
pub fn canon_json(data: &serde_json::Value) -> (Canon, Vec<Vec<(String, String)>>) {
    let point = |p: &serde_json::Value| -> (i64, f64) {
        let t = (p[0].as_f64().unwrap() * 1000.0).round() as i64;
        let v: f64 = match p[1].as_str().unwrap() {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            s => s.parse().unwrap_or(f64::NAN),
        };
        (t, v)
    };
    let labels = |m: &serde_json::Value| -> Vec<(String, String)> {
        let mut l: Vec<(String, String)> = m
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
            .collect();
        l.sort();
        l
    };
    let mut out = Canon::new();
    let mut order = Vec::new();
    let result = &data["result"];
    match data["resultType"].as_str().unwrap() {
        "scalar" | "string" => {
            let (t, v) = point(result);
            let v = if data["resultType"] == "string" {
                f64::NAN
            } else {
                v
            };
            out.insert(scalar_key(), vec![(t, v)]);
        }
        "vector" => {
            for s in result.as_array().unwrap() {
                let l = labels(&s["metric"]);
                order.push(l.clone());
                out.entry(l).or_default().push(point(&s["value"]));
            }
        }
        "matrix" => {
            for s in result.as_array().unwrap() {
                let pts = s["values"].as_array().unwrap().iter().map(point);
                out.entry(labels(&s["metric"])).or_default().extend(pts);
            }
        }
        other => panic!("result type {other}"),
    }
    (out, order)
}

/// How `got` differs from `want`, if it does.
pub fn differ(want: &Canon, got: &Canon) -> Option<String> {
    if want.keys().ne(got.keys()) {
        let only = |a: &Canon, b: &Canon| -> Vec<String> {
            a.keys()
                .filter(|k| !b.contains_key(*k))
                .take(3)
                .map(|k| format!("{k:?}"))
                .collect()
        };
        return Some(format!(
            "label sets differ ({} vs {}): only in prometheus {:?}, only in flopwatch {:?}",
            want.len(),
            got.len(),
            only(want, got),
            only(got, want)
        ));
    }
    for (l, w) in want {
        let g = &got[l];
        if w.len() != g.len() {
            return Some(format!("{l:?}: {} points vs {}", w.len(), g.len()));
        }
        for (a, b) in w.iter().zip(g) {
            if a.0 != b.0 || !approx(a.1, b.1) {
                return Some(format!("{l:?}: prometheus {a:?}, flopwatch {b:?}"));
            }
        }
    }
    None
}
