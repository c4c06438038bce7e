//! When to read and what to send.
//!
//! The loop in [`crate::run`] asks a [`Sampler`] how long to wait before the
//! next capture and which readings of a capture to keep. [`FixedSampler`]
//! reads everything at a fixed interval; the adaptive sampler (Moneo §2.3)
//! implements the same trait.

use crate::source::Capture;
use std::collections::HashSet;
use std::time::Duration;

/// Decides the schedule and what is kept.
pub trait Sampler: Send {
    /// Delay until the next capture.
    fn next_delay(&self) -> Duration;

    /// Filters a capture in place: readings removed are not sent.
    fn observe(&mut self, capture: &mut Capture);
}

/// Fixed interval; optionally a metric allow-list.
#[derive(Debug, Clone)]
pub struct FixedSampler {
    interval: Duration,
    metrics: Option<HashSet<String>>,
}

impl FixedSampler {
    /// Every `interval`, keeping `metrics` (all when `None`).
    pub fn new(interval: Duration, metrics: Option<HashSet<String>>) -> Self {
        Self { interval, metrics }
    }
}

impl Sampler for FixedSampler {
    fn next_delay(&self) -> Duration {
        self.interval
    }

    fn observe(&mut self, capture: &mut Capture) {
        if let Some(keep) = &self.metrics {
            for g in &mut capture.gpus {
                g.readings.retain(|r| keep.contains(r.metric));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{GpuCapture, Reading};

    #[test]
    fn allow_list_filters_readings() {
        let mut s = FixedSampler::new(
            Duration::from_millis(100),
            Some(["power_w".to_string()].into()),
        );
        let mut c = Capture {
            gpus: vec![GpuCapture {
                gpu: 0,
                window_ms: 100,
                readings: vec![Reading::new("power_w", 1.0), Reading::new("temp_c", 2.0)],
            }],
            ..Default::default()
        };
        s.observe(&mut c);
        assert_eq!(c.gpus[0].readings.len(), 1);
        assert_eq!(s.next_delay(), Duration::from_millis(100));
    }
}
