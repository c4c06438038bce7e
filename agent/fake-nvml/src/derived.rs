//! Answers for counters the simulator keeps no state for, derived from the
//! state it does keep, the way the agent's simulated source derives them
//! (so the NVML path over this fake and the simulated source agree):
//!
//! * the graphics engine (`NVML_GPM_METRIC_GRAPHICS_UTIL`) is busy at
//!   least as long as an SM is and at most as long as a kernel runs: the
//!   square root of the window's SM activity;
//! * HBM runs a few degrees above the GPU die's sensor: the memory
//!   temperature (`NVML_FI_DEV_MEMORY_TEMP`) is the GPU temperature plus
//!   [`MEMORY_ABOVE_GPU_C`], in whole °C.
//!
//! Tests compute their ground truth with these functions over the
//! simulator's state.

use flopwatch_sim::GpuState;

/// How much warmer the memory is than the GPU die, °C.
pub const MEMORY_ABOVE_GPU_C: f64 = 4.0;

/// Sampling period the video encoder and decoder utilizations are reported
/// over, µs (`samplingPeriodUs`).
pub const VIDEO_SAMPLING_PERIOD_US: u32 = 167_000;

/// Graphics-engine activity, a fraction 0..=1, over a window whose means
/// are `mean`.
pub fn graphics_util(mean: &GpuState) -> f64 {
    mean.sm_active.clamp(0.0, 1.0).sqrt()
}

/// Memory temperature at a state, whole °C.
pub fn memory_temp_c(s: &GpuState) -> u32 {
    (s.temp_c + MEMORY_ABOVE_GPU_C).max(0.0).round() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_graphics_engine_is_busy_at_least_as_long_as_an_sm() {
        for sm in [0.0, 0.04, 0.5, 0.93, 1.0] {
            let s = GpuState {
                sm_active: sm,
                ..GpuState::default()
            };
            let g = graphics_util(&s);
            assert!((sm..=1.0).contains(&g), "{sm}: {g}");
        }
    }

    #[test]
    fn memory_is_warmer_than_the_die() {
        let s = GpuState {
            temp_c: 61.4,
            ..GpuState::default()
        };
        assert_eq!(memory_temp_c(&s), 65);
    }
}
