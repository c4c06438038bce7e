//! Numbers as Prometheus writes them: Go's `strconv.FormatFloat` with
//! precision -1, shortest round-trip digits (an exact tie between two
//! shortest forms goes to the even digit), for the API's answers and for
//! `count_values`' labels.

use std::fmt::Write as _;

/// [`sample_into`] as a string.
#[cfg(test)]
pub(super) fn format_sample(v: f64) -> String {
    let mut s = String::new();
    sample_into(&mut s, v);
    s
}

/// A sample value of a vector or matrix appended to `out`: Go's shortest
/// representation, in exponent form below 1e-6 and from 1e21
/// (Prometheus's `jsonutil.MarshalValue`).
pub(super) fn sample_into(out: &mut String, v: f64) {
    let a = v.abs();
    if a != 0.0 && a.is_finite() && !(1e-6..1e21).contains(&a) {
        let mut b = ryu::Buffer::new();
        let (neg, digits, exp) = shortest(b.format_finite(v));
        // Go's 'e' with precision -1: `1e-07`, `1.5e+21`.
        if neg {
            out.push('-');
        }
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = exp - 1;
        let _ = write!(
            out,
            "e{}{:02}",
            if e < 0 { '-' } else { '+' },
            e.unsigned_abs()
        );
    } else {
        scalar_into(out, v);
    }
}

/// A scalar's value: Go's `strconv.FormatFloat(v, 'f', -1, 64)`.
pub(super) fn format_scalar(v: f64) -> String {
    let mut s = String::new();
    scalar_into(&mut s, v);
    s
}

/// [`format_scalar`] appended to `out`.
pub(super) fn scalar_into(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v == f64::INFINITY {
        out.push_str("+Inf");
    } else if v == f64::NEG_INFINITY {
        out.push_str("-Inf");
    } else {
        // The shortest round-trip digits, never in exponent notation:
        // Go's 'f' with precision -1. ryu's digits are Go's (an exact tie
        // between two shortest forms goes to the even digit, where Rust's
        // Display rounds up); it writes them positionally for magnitudes
        // from 1e-5 to 1e16 (with `.0` on whole numbers, which Go leaves
        // off), in exponent form otherwise, placed here.
        let mut b = ryu::Buffer::new();
        let s = b.format_finite(v);
        if !s.bytes().any(|c| c == b'e' || c == b'E') {
            out.push_str(s.strip_suffix(".0").unwrap_or(s));
            return;
        }
        let (neg, digits, exp) = shortest(s);
        if neg {
            out.push('-');
        }
        // The point lies `exp` digits after the first one's place.
        match usize::try_from(exp) {
            Ok(at) if at >= digits.len() => {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', at - digits.len()));
            }
            Ok(at) if at > 0 => {
                out.push_str(&digits[..at]);
                out.push('.');
                out.push_str(&digits[at..]);
            }
            _ => {
                out.push_str("0.");
                out.extend(std::iter::repeat_n('0', exp.unsigned_abs() as usize));
                out.push_str(&digits);
            }
        }
    }
}

/// ryu's form of a finite value as its sign, significant digits (no
/// leading or trailing zeros; "0" for zero) and decimal exponent: the
/// value is `0.digits × 10^exp`.
fn shortest(s: &str) -> (bool, String, i32) {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (mantissa, e) = match s.split_once(['e', 'E']) {
        Some((m, e)) => (m, e.parse::<i32>().unwrap_or(0)),
        None => (s, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all = format!("{int}{frac}");
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = all.trim_matches('0');
    if digits.is_empty() {
        return (neg, "0".into(), 1);
    }
    let exp = e + int.len() as i32 - lead as i32;
    (neg, digits.to_string(), exp)
}
