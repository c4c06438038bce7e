//! The MFU cross-check (OFU paper §V-C): a job's own, application-level
//! MFU against the OFU the collector measures on the job's GPUs.
//!
//! A job reports either its MFU directly (eq. 10, against whatever peak the
//! framework assumed) or its achieved TFLOP/s per GPU at each precision. In
//! the second case the collector computes MFU against the effective peak of
//! eq. 12 for the GPUs' own model:
//!
//! P_eff = Σ F_i / Σ (F_i / P_i), so MFU = Σ F_i / P_eff = Σ (F_i / P_i),
//!
//! with F_i the achieved rate at precision i and P_i that precision's dense
//! peak. A job whose reported MFU departs from the measured OFU by more than
//! `analysis.mfu_tolerance` (absolute) is flagged as a suspected FLOPs
//! miscalculation ([`crate::events`]); the paper's case is 54.27 % reported
//! against 25.58 % measured, a ratio of 2.12.

use flopwatch_config::{GpuSpec, Precision};
use flopwatch_proto::model::MfuReport;

/// Highest MFU a report may carry: above 1 is already a sign of miscounted
/// FLOPs and worth flagging, but 10× the peak is garbage.
pub(crate) const MAX_REPORTED_MFU: f64 = 10.0;

/// Why a report cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum MfuError {
    /// No job id.
    #[error("MFU report without job_id")]
    NoJob,
    /// Neither an MFU nor per-precision rates.
    #[error("MFU report for `{0}` has neither mfu nor tflops_by_precision")]
    Empty(String),
    /// A value out of range.
    #[error("MFU report for `{job}`: {what} = {value} is out of range")]
    OutOfRange {
        /// Job.
        job: String,
        /// Which value.
        what: String,
        /// The value.
        value: f64,
    },
    /// A precision the spec table does not know, or the GPU lacks.
    #[error("MFU report for `{job}`: {message}")]
    Precision {
        /// Job.
        job: String,
        /// What is wrong.
        message: String,
    },
    /// Per-precision rates for a GPU model the spec table does not know.
    #[error("MFU report for `{0}`: per-precision TFLOP/s need a known GPU model")]
    UnknownModel(String),
}

/// The MFU a report stands for, fraction of peak: its per-precision rates
/// against the effective peak (eq. 12) of `spec` when it has them, else its
/// own `mfu`.
pub(crate) fn reported_mfu(r: &MfuReport, spec: Option<&GpuSpec>) -> Result<f64, MfuError> {
    if r.job_id.is_empty() {
        return Err(MfuError::NoJob);
    }
    let range = |what: &str, value: f64, max: f64| {
        if value.is_finite() && (0.0..=max).contains(&value) {
            Ok(value)
        } else {
            Err(MfuError::OutOfRange {
                job: r.job_id.clone(),
                what: what.to_string(),
                value,
            })
        }
    };
    if r.tflops_by_precision.is_empty() {
        let mfu = r.mfu.ok_or_else(|| MfuError::Empty(r.job_id.clone()))?;
        return range("mfu", mfu, MAX_REPORTED_MFU);
    }
    let spec = spec.ok_or_else(|| MfuError::UnknownModel(r.job_id.clone()))?;
    let mut mfu = 0.0;
    for (name, tflops) in &r.tflops_by_precision {
        let tflops = range(&format!("tflops_by_precision.{name}"), *tflops, 1e6)?;
        let p: Precision = name.parse().map_err(|m| MfuError::Precision {
            job: r.job_id.clone(),
            message: m,
        })?;
        let peak = spec
            .peak_tflops(p)
            .filter(|&x| x > 0.0)
            .ok_or_else(|| MfuError::Precision {
                job: r.job_id.clone(),
                message: format!("{} has no dense {name} peak", spec.name),
            })?;
        mfu += tflops / peak;
    }
    range("mfu", mfu, MAX_REPORTED_MFU)
}

/// Effective peak of eq. 12 for per-precision rates (TFLOP/s), `None` when
/// a precision has no peak on `spec` or the rates are all zero. The tests
/// check [`mfu`] against it.
#[cfg(test)]
fn effective_peak_tflops(spec: &GpuSpec, rates: &[(Precision, f64)]) -> Option<f64> {
    let total: f64 = rates.iter().map(|(_, f)| f).sum();
    let mut denom = 0.0;
    for (p, f) in rates {
        denom += f / spec.peak_tflops(*p).filter(|&x| x > 0.0)?;
    }
    (total > 0.0 && denom > 0.0).then(|| total / denom)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_config::SpecTable;

    fn h100() -> GpuSpec {
        SpecTable::builtin()
            .lookup("NVIDIA H100 80GB HBM3")
            .cloned()
            .expect("H100 SXM in the built-in table")
    }

    fn report(mfu: Option<f64>, rates: &[(&str, f64)]) -> MfuReport {
        MfuReport {
            job_id: "moe".into(),
            ts_ms: 60_000,
            start_ms: 0,
            mfu,
            tflops_by_precision: rates.iter().map(|(p, f)| (p.to_string(), *f)).collect(),
        }
    }

    #[test]
    fn a_plain_mfu_is_taken_as_reported() {
        assert_eq!(reported_mfu(&report(Some(0.5427), &[]), None), Ok(0.5427));
    }

    #[test]
    fn per_precision_rates_use_the_effective_peak_of_eq_12() {
        let h = h100();
        let (p16, p8) = (
            h.peak_tflops(Precision::Bf16).unwrap(),
            h.peak_tflops(Precision::Fp8).unwrap(),
        );
        // 300 TFLOP/s in BF16 and 400 in FP8 on an H100 SXM (989.4 and
        // 1978.9 dense): P_eff = 700 / (300/989.4 + 400/1978.9).
        let peff = effective_peak_tflops(&h, &[(Precision::Bf16, 300.0), (Precision::Fp8, 400.0)])
            .unwrap();
        assert!((peff - 700.0 / (300.0 / p16 + 400.0 / p8)).abs() < 1e-9);
        assert!(peff > p16 && peff < p8, "{peff} between the two peaks");
        let mfu = reported_mfu(
            &report(Some(0.99), &[("bf16", 300.0), ("fp8", 400.0)]),
            Some(&h),
        )
        .unwrap();
        // The rates win over the job's own figure, and equal 700 / P_eff.
        assert!((mfu - 700.0 / peff).abs() < 1e-12, "{mfu}");
        assert!((mfu - (300.0 / 989.4 + 400.0 / 1978.9)).abs() < 1e-3);
    }

    #[test]
    fn bad_reports_are_refused_with_the_reason() {
        let h = h100();
        assert_eq!(
            reported_mfu(&report(None, &[]), Some(&h)),
            Err(MfuError::Empty("moe".into()))
        );
        assert!(matches!(
            reported_mfu(&report(Some(f64::NAN), &[]), None),
            Err(MfuError::OutOfRange { .. })
        ));
        assert!(matches!(
            reported_mfu(&report(Some(-0.1), &[]), None),
            Err(MfuError::OutOfRange { .. })
        ));
        assert!(matches!(
            reported_mfu(&report(None, &[("fp12", 1.0)]), Some(&h)),
            Err(MfuError::Precision { .. })
        ));
        assert_eq!(
            reported_mfu(&report(None, &[("bf16", 1.0)]), None),
            Err(MfuError::UnknownModel("moe".into()))
        );
        let mut r = report(Some(0.3), &[]);
        r.job_id.clear();
        assert_eq!(reported_mfu(&r, None), Err(MfuError::NoJob));
    }
}
