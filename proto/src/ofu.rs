//! OFU math (OFU paper, Moyer et al.).
//!
//! * eq. 1: `OFU = TPA × f_SM / f_max`, with TPA the tensor pipe activity
//!   averaged over the window and f_max the *tensor-core* peak clock of the
//!   GPU model (`config/gpus.toml`, §IV-D).
//! * eq. 11: a job's OFU is the mean over all its GPUs and samples.
//!
//! **Clamping.** On H100 SXM the SM clock can boost to 1980 MHz while tensor
//! instructions in FP8/FP16/BF16/TF32 run at most at 1830 MHz (§IV-D). A
//! clock reading above f_max therefore does not raise tensor throughput, so
//! we use `min(f_SM, f_max)`: OFU never exceeds TPA, and a GPU whose tensor
//! pipes are busy 100 % of the time at or above the tensor clock reads
//! exactly 100 %. Without the clamp an idle-clocked GPU (1980 MHz) with
//! light tensor work would report more FLOP/s than the hardware can do.
//!
//! **Weights.** With adaptive sampling, samples cover windows of different
//! lengths. A mean "over samples" must then weight each sample by its
//! window, or long quiet windows would count as much as one 100 ms burst.
//! With equal windows this is exactly eq. 11's plain mean.

/// OFU eq. 1 with the clamp described above. Inputs out of range (negative
/// or non-finite) give 0; TPA is capped at 1.
pub fn ofu(tensor_active: f64, sm_clock_mhz: f64, tensor_clock_mhz: f64) -> f64 {
    if !(tensor_active.is_finite() && sm_clock_mhz.is_finite() && tensor_clock_mhz > 0.0) {
        return 0.0;
    }
    let tpa = tensor_active.clamp(0.0, 1.0);
    let clk = sm_clock_mhz.clamp(0.0, tensor_clock_mhz);
    tpa * clk / tensor_clock_mhz
}

/// Running window-weighted mean, min and max (eq. 11). The store's rollups
/// keep the same aggregate per hour and minute; for a raw series the OFU
/// column holds the series' value and the other two sums stay 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Mean {
    sum: f64,
    weight: f64,
    /// Samples added.
    pub count: u64,
    min: f64,
    max: f64,
    tpa_sum: f64,
    clk_sum: f64,
    /// Σ OFU, unweighted: what PromQL's `avg_over_time` divides by the
    /// count (NaN where unknown: rollups written before it was kept).
    plain: f64,
}

impl Mean {
    /// Adds one sample covering `window_ms` (0 counts as 1 ms so that
    /// window-less samples still weigh equally among themselves).
    pub fn add(&mut self, ofu: f64, tensor_active: f64, sm_clock_mhz: f64, window_ms: u32) {
        let w = f64::from(window_ms.max(1));
        if self.count == 0 {
            self.min = ofu;
            self.max = ofu;
        } else {
            self.min = self.min.min(ofu);
            self.max = self.max.max(ofu);
        }
        self.sum += ofu * w;
        self.tpa_sum += tensor_active * w;
        self.clk_sum += sm_clock_mhz * w;
        self.plain += ofu;
        self.weight += w;
        self.count += 1;
    }

    /// The aggregate as a store keeps it (a rollup bucket): the sample
    /// count and `[weight, Σ w·OFU, Σ w·TPA, Σ w·f_SM, min, max, Σ OFU]`,
    /// which [`Mean::from_parts`] takes back.
    pub fn parts(&self) -> (u64, [f64; 7]) {
        let Self {
            sum,
            weight,
            count,
            min,
            max,
            tpa_sum,
            clk_sum,
            plain,
        } = *self;
        (count, [weight, sum, tpa_sum, clk_sum, min, max, plain])
    }

    /// A mean from the [`Mean::parts`] of one.
    pub fn from_parts(count: u64, parts: [f64; 7]) -> Self {
        let [weight, sum, tpa_sum, clk_sum, min, max, plain] = parts;
        Self {
            sum,
            weight,
            count,
            min,
            max,
            tpa_sum,
            clk_sum,
            plain,
        }
    }

    /// Merges another mean.
    pub fn merge(&mut self, o: &Mean) {
        if o.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *o;
            return;
        }
        self.sum += o.sum;
        self.tpa_sum += o.tpa_sum;
        self.clk_sum += o.clk_sum;
        self.plain += o.plain;
        self.weight += o.weight;
        self.count += o.count;
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
    }

    /// The same samples weighing `share` times as much against other
    /// GPUs': a MIG instance's share of its card (docs/MIG.md), so that
    /// a group's mean is weighted by capacity. Count, min, max and the
    /// unweighted sum are unchanged; a share of 0 leaves no weight.
    pub fn scaled(&self, share: f64) -> Mean {
        let k = if share.is_finite() {
            share.max(0.0)
        } else {
            1.0
        };
        Mean {
            sum: self.sum * k,
            weight: self.weight * k,
            tpa_sum: self.tpa_sum * k,
            clk_sum: self.clk_sum * k,
            ..*self
        }
    }

    /// Weighted mean OFU (`None` without samples).
    pub fn mean(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }

    /// Weighted mean tensor activity.
    pub fn tensor_active(&self) -> f64 {
        if self.weight > 0.0 {
            self.tpa_sum / self.weight
        } else {
            0.0
        }
    }

    /// Weighted mean SM clock.
    pub fn sm_clock_mhz(&self) -> f64 {
        if self.weight > 0.0 {
            self.clk_sum / self.weight
        } else {
            0.0
        }
    }

    /// Σ OFU over the samples, unweighted (`None` where the aggregate
    /// does not know it).
    pub fn plain_sum(&self) -> Option<f64> {
        (!self.plain.is_nan()).then_some(self.plain)
    }

    /// Smallest sample.
    pub fn min(&self) -> f64 {
        self.min
    }

    /// Largest sample.
    pub fn max(&self) -> f64 {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_means_weigh_groups_by_capacity() {
        // A 1g instance (share 1/7) at 0.9 and a 6g one (6/7) at 0.2, one
        // second each: the capacity-weighted mean is 0.3, the plain 0.55.
        let one = |ofu: f64| {
            let mut m = Mean::default();
            m.add(ofu, ofu, 1410.0, 1000);
            m
        };
        let mut g = one(0.9).scaled(1.0 / 7.0);
        g.merge(&one(0.2).scaled(6.0 / 7.0));
        assert!((g.mean().unwrap() - 0.3).abs() < 1e-12);
        assert_eq!((g.count, g.min(), g.max()), (2, 0.2, 0.9));
        assert!((g.plain_sum().unwrap() - 1.1).abs() < 1e-12);
        // Share 0 (a MIG card) adds no weight.
        let mut h = one(0.5);
        h.merge(&one(1.0).scaled(0.0));
        assert!((h.mean().unwrap() - 0.5).abs() < 1e-12);
    }

    #[test]
    fn eq1_with_paper_numbers() {
        // §IV-C: sustained GEMM at 1352 MHz on H100 (f_max 1830).
        let o = ofu(0.75, 1352.0, 1830.0);
        assert!((o - 0.75 * 1352.0 / 1830.0).abs() < 1e-12);
        assert!((o - 0.554_098).abs() < 1e-6);
        // Clamp: 1980 MHz SM boost does not beat the 1830 MHz tensor clock.
        assert_eq!(ofu(1.0, 1980.0, 1830.0), 1.0);
        assert_eq!(ofu(0.5, 1980.0, 1830.0), 0.5);
        assert_eq!(ofu(f64::NAN, 1500.0, 1830.0), 0.0);
        assert_eq!(ofu(1.2, 1830.0, 1830.0), 1.0);
    }

    #[test]
    fn eq11_job_mean_over_gpus_and_samples() {
        // Two GPUs, equal windows: the plain mean of every sample (eq. 11).
        let samples = [(0.6, 1400.0), (0.5, 1500.0), (0.2, 1830.0), (0.0, 1980.0)];
        let mut m = Mean::default();
        for (t, c) in samples {
            m.add(ofu(t, c, 1830.0), t, c, 100);
        }
        let plain: f64 = samples.iter().map(|&(t, c)| ofu(t, c, 1830.0)).sum::<f64>() / 4.0;
        assert!((m.mean().unwrap() - plain).abs() < 1e-12);
        assert_eq!(m.count, 4);
        assert_eq!(m.max(), 0.6 * 1400.0 / 1830.0);
        assert_eq!(m.min(), 0.0);
    }

    #[test]
    fn long_windows_weigh_more() {
        let mut m = Mean::default();
        m.add(1.0, 1.0, 1830.0, 100);
        m.add(0.0, 0.0, 1830.0, 900);
        assert!((m.mean().unwrap() - 0.1).abs() < 1e-12);
        // PromQL's plain sum counts each sample once, whatever its window.
        assert_eq!(m.plain_sum(), Some(1.0));
        let mut a = Mean::default();
        a.add(1.0, 1.0, 1830.0, 100);
        let mut b = Mean::default();
        b.add(0.0, 0.0, 1830.0, 900);
        a.merge(&b);
        assert_eq!(a, m);
        let (count, parts) = m.parts();
        assert_eq!(Mean::from_parts(count, parts), m);
    }
}
