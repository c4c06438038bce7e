//! `[sampling]`: adaptive sampling (Moneo §2.3), see `flopwatch_agent::adaptive`.

use crate::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// `[sampling]` in `agent.toml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingConfig {
    /// Adaptive sampling on; `false` sends every capture at `min_interval`.
    pub adaptive: bool,
    /// Capture interval and the shortest send interval (the hardware
    /// counters' floor is 100 ms).
    #[serde(with = "humantime_serde")]
    pub min_interval: Duration,
    /// Hard cap on a send interval (Moneo: never above 30 s); the learned
    /// cap (5th percentile of stable-run lengths) may be lower.
    #[serde(with = "humantime_serde")]
    pub max_interval: Duration,
    /// Relative peak change that makes a metric "not stable" (Moneo: 10 %).
    pub change_threshold: f64,
    /// "Not stable" when the density of values near the peak falls below
    /// this fraction of the density learned in the ground-truth period.
    pub density_threshold: f64,
    /// Window over which the peak and its density are measured.
    #[serde(with = "humantime_serde")]
    pub peak_window: Duration,
    /// Random jitter added when doubling, as a fraction of the interval.
    pub jitter: f64,
    /// Ground-truth period length as a fraction of the current interval
    /// (never shorter than `peak_window`).
    pub ground_truth_ratio: f64,
    /// Percentile of learned stable-run lengths used as the interval cap.
    pub stable_percentile: f64,
    /// Sent windows are also cut at multiples of this (unix time), so a
    /// window mean never straddles a query-grid boundary (1-min, 10-min,
    /// 1-h buckets); `0s` turns the cut off. Costs at most one extra
    /// sample per metric per `align`.
    #[serde(with = "humantime_serde")]
    pub align: Duration,
    /// Metrics read at every capture and sent on one shared schedule (the
    /// OFU inputs by default).
    pub trigger_metrics: Vec<String>,
    /// Per-metric overrides, keyed by metric name.
    pub overrides: BTreeMap<String, MetricOverride>,
}

/// `[sampling.overrides.<metric>]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricOverride {
    /// Shortest send interval for this metric (a multiple of the capture
    /// interval in effect).
    #[serde(with = "humantime_serde")]
    pub min_interval: Option<Duration>,
    /// Longest send interval for this metric.
    #[serde(with = "humantime_serde")]
    pub max_interval: Option<Duration>,
}

impl Default for SamplingConfig {
    fn default() -> Self {
        Self {
            adaptive: false,
            min_interval: Duration::from_millis(100),
            max_interval: Duration::from_secs(30),
            change_threshold: 0.10,
            density_threshold: 0.5,
            peak_window: Duration::from_secs(5),
            jitter: 0.05,
            ground_truth_ratio: 0.25,
            stable_percentile: 5.0,
            align: Duration::from_secs(60),
            trigger_metrics: ["tensor_active", "sm_clock_avg_mhz", "sm_clock_mhz"]
                .map(String::from)
                .to_vec(),
            overrides: BTreeMap::new(),
        }
    }
}

impl SamplingConfig {
    /// Checks ranges; errors name the key (`sampling.<key>`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let k = |s: &str| format!("sampling.{s}");
        if self.min_interval < Duration::from_millis(10)
            || self.min_interval > Duration::from_secs(30)
        {
            return Err(ConfigError::invalid(
                &k("min_interval"),
                "must lie between 10ms and 30s",
            ));
        }
        if self.max_interval < self.min_interval || self.max_interval > Duration::from_secs(30) {
            return Err(ConfigError::invalid(
                &k("max_interval"),
                "must lie between sampling.min_interval and 30s",
            ));
        }
        let frac = |key: &str, v: f64, lo: f64, hi: f64| {
            if v.is_finite() && v >= lo && v <= hi {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    &k(key),
                    format!("must lie between {lo} and {hi}"),
                ))
            }
        };
        frac("change_threshold", self.change_threshold, 0.001, 1.0)?;
        frac("density_threshold", self.density_threshold, 0.0, 1.0)?;
        frac("jitter", self.jitter, 0.0, 0.5)?;
        frac("ground_truth_ratio", self.ground_truth_ratio, 0.0, 1.0)?;
        frac("stable_percentile", self.stable_percentile, 0.0, 100.0)?;
        if self.peak_window < self.min_interval || self.peak_window > Duration::from_secs(300) {
            return Err(ConfigError::invalid(
                &k("peak_window"),
                "must lie between sampling.min_interval and 300s",
            ));
        }
        if !self.align.is_zero()
            && (self.align < self.min_interval || self.align > Duration::from_secs(3600))
        {
            return Err(ConfigError::invalid(
                &k("align"),
                "must be 0s (off) or lie between sampling.min_interval and 1h",
            ));
        }
        for (m, o) in &self.overrides {
            if let Some(d) = o.min_interval {
                if d < self.min_interval || d > self.max_interval {
                    return Err(ConfigError::invalid(
                        &k(&format!("overrides.{m}.min_interval")),
                        "must lie between sampling.min_interval and sampling.max_interval",
                    ));
                }
            }
            if let Some(d) = o.max_interval {
                if d < o.min_interval.unwrap_or(self.min_interval) || d > Duration::from_secs(30) {
                    return Err(ConfigError::invalid(
                        &k(&format!("overrides.{m}.max_interval")),
                        "must lie between the metric's min_interval and 30s",
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_the_key() {
        SamplingConfig::default().validate().unwrap();
        let c = SamplingConfig {
            max_interval: Duration::from_secs(60),
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("sampling.max_interval"), "{e}");
        let c: SamplingConfig = toml::from_str(
            "adaptive = true\nmin_interval = \"200ms\"\n[overrides.power_w]\nmin_interval = \"1s\"\n",
        )
        .unwrap();
        assert!(c.adaptive);
        assert_eq!(
            c.overrides["power_w"].min_interval,
            Some(Duration::from_secs(1))
        );
        c.validate().unwrap();
        assert!(toml::from_str::<SamplingConfig>("bogus = 1").is_err());
        let c: SamplingConfig = toml::from_str("align = \"0s\"\n").unwrap();
        assert!(c.align.is_zero());
        c.validate().unwrap();
        let c = SamplingConfig {
            align: Duration::from_millis(20),
            ..Default::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("sampling.align"), "{e}");
    }
}
