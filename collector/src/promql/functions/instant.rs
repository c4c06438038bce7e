//! Functions of one value (math, dates) and of a series' labels
//! (`label_replace`, `label_join`), with Go's arithmetic where it differs
//! from Rust's (`math.Max` and `math.Min` propagate NaN).

use crate::series::Labels;

/// A function of one value, its other arguments fixed per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::promql) enum ValueFn {
    Abs,
    Ceil,
    Floor,
    Exp,
    Sqrt,
    Ln,
    Log2,
    Log10,
    Sgn,
    Acos,
    Acosh,
    Asin,
    Asinh,
    Atan,
    Atanh,
    Cos,
    Cosh,
    Sin,
    Sinh,
    Tan,
    Tanh,
    Deg,
    Rad,
    Round,
    Clamp,
    ClampMin,
    ClampMax,
    DayOfMonth,
    DayOfWeek,
    DayOfYear,
    DaysInMonth,
    Hour,
    Minute,
    Month,
    Year,
}

impl ValueFn {
    pub(crate) fn of(name: &str) -> Option<Self> {
        Some(match name {
            "abs" => Self::Abs,
            "ceil" => Self::Ceil,
            "floor" => Self::Floor,
            "exp" => Self::Exp,
            "sqrt" => Self::Sqrt,
            "ln" => Self::Ln,
            "log2" => Self::Log2,
            "log10" => Self::Log10,
            "sgn" => Self::Sgn,
            "acos" => Self::Acos,
            "acosh" => Self::Acosh,
            "asin" => Self::Asin,
            "asinh" => Self::Asinh,
            "atan" => Self::Atan,
            "atanh" => Self::Atanh,
            "cos" => Self::Cos,
            "cosh" => Self::Cosh,
            "sin" => Self::Sin,
            "sinh" => Self::Sinh,
            "tan" => Self::Tan,
            "tanh" => Self::Tanh,
            "deg" => Self::Deg,
            "rad" => Self::Rad,
            "round" => Self::Round,
            "clamp" => Self::Clamp,
            "clamp_min" => Self::ClampMin,
            "clamp_max" => Self::ClampMax,
            "day_of_month" => Self::DayOfMonth,
            "day_of_week" => Self::DayOfWeek,
            "day_of_year" => Self::DayOfYear,
            "days_in_month" => Self::DaysInMonth,
            "hour" => Self::Hour,
            "minute" => Self::Minute,
            "month" => Self::Month,
            "year" => Self::Year,
            _ => return None,
        })
    }

    /// Date functions read the time of day when given no argument.
    pub(crate) fn is_date(self) -> bool {
        matches!(
            self,
            Self::DayOfMonth
                | Self::DayOfWeek
                | Self::DayOfYear
                | Self::DaysInMonth
                | Self::Hour
                | Self::Minute
                | Self::Month
                | Self::Year
        )
    }

    /// `v` through the function; `p` the other arguments at this step
    /// (`round`'s unit, `clamp`'s bounds).
    pub(crate) fn apply(self, v: f64, p: &[f64]) -> f64 {
        let arg = |i: usize| p.get(i).copied().unwrap_or(f64::NAN);
        match self {
            Self::Abs => v.abs(),
            Self::Ceil => v.ceil(),
            Self::Floor => v.floor(),
            Self::Exp => v.exp(),
            Self::Sqrt => v.sqrt(),
            Self::Ln => v.ln(),
            Self::Log2 => v.log2(),
            Self::Log10 => v.log10(),
            Self::Sgn => {
                if v < 0.0 {
                    -1.0
                } else if v > 0.0 {
                    1.0
                } else {
                    v
                }
            }
            Self::Acos => v.acos(),
            Self::Acosh => v.acosh(),
            Self::Asin => v.asin(),
            Self::Asinh => v.asinh(),
            Self::Atan => v.atan(),
            Self::Atanh => v.atanh(),
            Self::Cos => v.cos(),
            Self::Cosh => v.cosh(),
            Self::Sin => v.sin(),
            Self::Sinh => v.sinh(),
            Self::Tan => v.tan(),
            Self::Tanh => v.tanh(),
            Self::Deg => v * 180.0 / std::f64::consts::PI,
            Self::Rad => v * std::f64::consts::PI / 180.0,
            Self::Round => {
                let to = if p.is_empty() { 1.0 } else { arg(0) };
                let inv = 1.0 / to;
                (v * inv + 0.5).floor() / inv
            }
            Self::Clamp => go_max(arg(0), go_min(arg(1), v)),
            Self::ClampMin => go_max(arg(0), v),
            Self::ClampMax => go_min(arg(0), v),
            _ => date_part(self, v),
        }
    }
}

/// Go's `math.Max`: NaN wins, +0 over −0.
pub(in crate::promql) fn go_max(x: f64, y: f64) -> f64 {
    if x.is_infinite() && x > 0.0 || y.is_infinite() && y > 0.0 {
        return f64::INFINITY;
    }
    if x.is_nan() || y.is_nan() {
        return f64::NAN;
    }
    if x == 0.0 && x == y {
        return if x.is_sign_negative() { y } else { x };
    }
    if x > y {
        x
    } else {
        y
    }
}

/// Go's `math.Min`: NaN wins, −0 over +0.
pub(in crate::promql) fn go_min(x: f64, y: f64) -> f64 {
    if x.is_infinite() && x < 0.0 || y.is_infinite() && y < 0.0 {
        return f64::NEG_INFINITY;
    }
    if x.is_nan() || y.is_nan() {
        return f64::NAN;
    }
    if x == 0.0 && x == y {
        return if x.is_sign_negative() { x } else { y };
    }
    if x < y {
        x
    } else {
        y
    }
}

/// A civil date from days since 1970-01-01 (H. Hinnant's
/// `civil_from_days`): year, month (1..12), day (1..31).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// A part of the UTC date of `v` Unix seconds (truncated to whole
/// seconds, as Go's `time.Unix(int64(v), 0)`).
fn date_part(f: ValueFn, v: f64) -> f64 {
    let secs = v as i64;
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let yday = (1..m).map(|mm| days_in(y, mm)).sum::<i64>() + d;
    (match f {
        ValueFn::DayOfMonth => d,
        ValueFn::DayOfWeek => (days + 4).rem_euclid(7),
        ValueFn::DayOfYear => yday,
        ValueFn::DaysInMonth => days_in(y, m),
        ValueFn::Hour => sod / 3600,
        ValueFn::Minute => sod % 3600 / 60,
        ValueFn::Month => m,
        _ => y,
    }) as f64
}

/// `label_replace`'s new labels for `l`: `dst` set to `replacement`
/// expanded with the captures of `re` (anchored) on `src`'s value, or
/// removed when that is empty; `l` unchanged when `re` does not match.
pub(in crate::promql) fn label_replace(
    l: &Labels,
    dst: &str,
    replacement: &str,
    src: &str,
    re: &regex::Regex,
) -> Labels {
    let value = super::super::eval::label(l, src);
    let Some(caps) = re.captures(value) else {
        return l.clone();
    };
    let mut out = String::new();
    caps.expand(replacement, &mut out);
    with_label(l, dst, &out)
}

/// `l` with `name` set to `v`, or without it when `v` is empty; sorted.
pub(in crate::promql) fn with_label(l: &Labels, name: &str, v: &str) -> Labels {
    let mut out: Labels = l.iter().filter(|(k, _)| k != name).cloned().collect();
    if !v.is_empty() {
        let at = out.partition_point(|(k, _)| k.as_str() < name);
        out.insert(at, (name.to_string(), v.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_are_utc_parts_of_unix_seconds() {
        // 2024-02-29T13:45:00Z, a Thursday, day 60 of a leap year.
        let t = 1_709_214_300.0;
        for (f, want) in [
            (ValueFn::Year, 2024.0),
            (ValueFn::Month, 2.0),
            (ValueFn::DayOfMonth, 29.0),
            (ValueFn::DayOfWeek, 4.0),
            (ValueFn::DayOfYear, 60.0),
            (ValueFn::DaysInMonth, 29.0),
            (ValueFn::Hour, 13.0),
            (ValueFn::Minute, 45.0),
        ] {
            assert_eq!(f.apply(t, &[]), want, "{f:?}");
        }
        assert_eq!(ValueFn::Year.apply(0.0, &[]), 1970.0);
        assert_eq!(ValueFn::DayOfWeek.apply(0.0, &[]), 4.0);
    }

    #[test]
    fn clamps_and_rounding_follow_go() {
        assert!(ValueFn::ClampMin.apply(f64::NAN, &[1.0]).is_nan());
        assert!(ValueFn::ClampMax.apply(1.0, &[f64::NAN]).is_nan());
        assert_eq!(ValueFn::Clamp.apply(5.0, &[0.0, 1.0]), 1.0);
        assert_eq!(ValueFn::Round.apply(2.5, &[]), 3.0);
        assert_eq!(ValueFn::Round.apply(-2.5, &[]), -2.0);
        assert_eq!(ValueFn::Round.apply(1234.0, &[100.0]), 1200.0);
        assert_eq!(ValueFn::Sgn.apply(-3.0, &[]), -1.0);
    }

    #[test]
    fn label_replace_matches_whole_values_and_expands_groups() {
        let l: Labels = vec![
            ("__name__".into(), "x".into()),
            ("instance".into(), "host:9100".into()),
        ];
        let re = regex::Regex::new("^(?:host:(.*))$").unwrap();
        let out = label_replace(&l, "port", "p-$1", "instance", &re);
        assert_eq!(
            out,
            vec![
                ("__name__".to_string(), "x".to_string()),
                ("instance".into(), "host:9100".into()),
                ("port".into(), "p-9100".into()),
            ]
        );
        let partial = regex::Regex::new("^(?:host)$").unwrap();
        assert_eq!(label_replace(&l, "port", "x", "instance", &partial), l);
    }
}
