//! GPUs time-sliced between several processes (Kubernetes time-slicing,
//! MPS): `share=GPU:PID/PCT+PID/PCT;…`.
//!
//! `share=2:4242/70+4343/30` says GPU 2 runs two compute processes, PIDs
//! 4242 and 4343, which get 70 % and 30 % of the time its SMs are busy.
//! The percents are whole numbers, 1..=100 each, at most 100 together (a
//! GPU may keep idle slices: `0:7/25+8/25`); the PIDs of one GPU are
//! distinct and non-zero. Several GPUs are separated by `;` or given by
//! repeating the key; the last entry for a GPU wins.
//!
//! What a shared GPU answers:
//!
//! * `nvmlDeviceGetComputeRunningProcesses_v3` lists its PIDs, in the
//!   order given, each holding its percent of the GPU's used memory over
//!   the percents' sum (instead of the simulator's one process, PID
//!   `10000 + gpu`);
//! * `nvmlDeviceGetProcessUtilization` has one sample per process per
//!   10 ms simulator tick, stamped (µs, the fake clock) at the tick's end
//!   like the processor-clock samples, from the same bounded ring (`ring`
//!   ticks, one second by default): its `smUtil` is [`sample_sm_util`], the
//!   process's percent of the GPU's SM activity during that tick, a whole
//!   percent as the driver gives it; `memUtil` is the same share of the DRAM
//!   activity, `encUtil` and `decUtil` 0. A tick where a process computed
//!   nothing still gives its sample (0). (The real driver samples about
//!   every 1/6 s and may leave out a process idle in a period; the fake's
//!   finer grain makes the mean over a window exact up to rounding.)
//!
//! A GPU without the key gives no per-process samples
//! (`NVML_ERROR_NOT_FOUND`, "nothing since `lastSeenTimeStamp`"), and a
//! card in MIG mode answers `NVML_ERROR_NOT_SUPPORTED`, as nvml.h says of
//! MIG-enabled GPUs. Tests compare what the agent reads with
//! [`process_sm_util`], the ground truth.

use flopwatch_sim::{GpuState, SimModel};

/// One time-sliced GPU (`share=GPU:PID/PCT+…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareSpec {
    /// GPU index on the node.
    pub gpu: usize,
    /// Its processes: (PID, percent of the GPU's SM time), in the order
    /// given.
    pub processes: Vec<(u32, u32)>,
}

impl ShareSpec {
    /// Parses `GPU:PID/PCT+PID/PCT…`.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        let (gpu, procs) = s.split_once(':').ok_or("expected GPU:PID/PCT+PID/PCT…")?;
        let gpu = gpu.trim().parse().map_err(|_| "GPU must be a GPU index")?;
        let mut processes: Vec<(u32, u32)> = Vec::new();
        for term in procs.split('+').map(str::trim) {
            let (pid, pct) = term.split_once('/').ok_or("expected PID/PCT")?;
            let pid: u32 = pid
                .trim()
                .parse()
                .ok()
                .filter(|&p| p > 0)
                .ok_or("PID must be a positive integer")?;
            let pct: u32 = pct
                .trim()
                .parse()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .ok_or("PCT must be a whole percent, 1..=100")?;
            if processes.iter().any(|&(p, _)| p == pid) {
                return Err("a PID is given twice for one GPU");
            }
            processes.push((pid, pct));
        }
        if processes.iter().map(|&(_, pct)| pct).sum::<u32>() > 100 {
            return Err("the percents of one GPU add up to more than 100");
        }
        Ok(Self { gpu, processes })
    }

    /// The percents' sum: the part of the GPU's SM time its processes get.
    pub fn total_percent(&self) -> u32 {
        self.processes.iter().map(|&(_, pct)| pct).sum()
    }
}

/// A process's `smUtil` in one sample: `percent` % of the GPU's SM
/// activity at that tick (`state.sm_active`, 0..=1), in whole percent of
/// the GPU's SMs, as the driver reports it.
pub fn sample_sm_util(percent: u32, state: &GpuState) -> u32 {
    (f64::from(percent) * state.sm_active.clamp(0.0, 1.0)).round() as u32
}

/// A process's `memUtil` in one sample: its share of the DRAM activity.
pub fn sample_mem_util(percent: u32, state: &GpuState) -> u32 {
    (f64::from(percent) * state.dram_active.clamp(0.0, 1.0)).round() as u32
}

/// Ground truth: the SM utilisation (percent of GPU `gpu`'s SMs) of a
/// process that gets `percent` % of the GPU's SM time, over
/// `[from_ms, to_ms)`: `percent` × the GPU's mean SM activity there. The
/// mean of the process's samples over a window of whole ticks is within
/// 0.5 of it (each sample is rounded to a whole percent). For a GPU
/// outside MIG mode (MIG cards give no per-process samples).
pub fn process_sm_util(
    model: &SimModel,
    gpu: usize,
    percent: u32,
    from_ms: i64,
    to_ms: i64,
) -> f64 {
    f64::from(percent)
        * model
            .window(gpu, from_ms, to_ms)
            .mean
            .sm_active
            .clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pids_and_percents() {
        assert_eq!(
            ShareSpec::parse(" 2 : 4242/70 + 4343 / 30 ").unwrap(),
            ShareSpec {
                gpu: 2,
                processes: vec![(4242, 70), (4343, 30)],
            }
        );
        let idle_slices = ShareSpec::parse("0:7/25+8/25").unwrap();
        assert_eq!(idle_slices.total_percent(), 50);
        assert_eq!(
            ShareSpec::parse("1:9/100").unwrap().processes,
            vec![(9, 100)]
        );
    }

    #[test]
    fn rejects_what_cannot_be_a_share() {
        for bad in [
            "4242/70+4343/30",
            "x:1/50",
            "0:",
            "0:1",
            "0:1/",
            "0:0/50",
            "0:-1/50",
            "0:1/0",
            "0:1/101",
            "0:1/50.5",
            "0:1/60+2/50",
            "0:1/10+1/20",
            "0:1/10+",
        ] {
            assert!(ShareSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn samples_are_whole_percents_of_the_sm_activity() {
        let at = |sm_active| GpuState {
            sm_active,
            dram_active: sm_active / 2.0,
            ..GpuState::default()
        };
        assert_eq!(sample_sm_util(70, &at(0.9)), 63);
        assert_eq!(sample_sm_util(30, &at(0.9)), 27);
        assert_eq!(sample_sm_util(30, &at(0.05)), 2);
        assert_eq!(sample_sm_util(100, &at(1.2)), 100);
        assert_eq!(sample_sm_util(50, &at(0.0)), 0);
        assert_eq!(sample_mem_util(50, &at(0.8)), 20);
    }
}
