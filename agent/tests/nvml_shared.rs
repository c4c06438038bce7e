//! Per-process SM utilisation through NVML (`nvmlDeviceGetProcessUtilization`)
//! on a GPU several processes share: the fake `libnvidia-ml.so` time-slices
//! a GPU between processes with `share=GPU:PID/PCT+…`, and the NVML source
//! must report, capture by capture, each process's SM utilisation over the
//! window, as the fake's ground truth (`flopwatch_fake_nvml::share`) has it
//! up to the driver's rounding to whole percents.
//!
//! All tests share the one library this process loads: each holds it
//! through [`fake::driver`] (`tests/fake`).

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::source::GpuSource;
use flopwatch_agent::ReadPlan;
use flopwatch_fake_nvml::control;
use flopwatch_fake_nvml::share::process_sm_util;
use flopwatch_proto::metrics as m;
use flopwatch_sim::{FleetPlan, SimModel};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::MutexGuard;

use crate::fake;
use fake::T0;

/// GPUs of the fake node.
const GPUS: usize = 4;
/// The two processes time-slicing the shared GPU: (PID, percent).
const PROCS: [(u32, u32); 2] = [(4242, 70), (4343, 30)];
/// Each sample is a whole percent: a window's mean is within half of one
/// of the truth.
const ROUNDING: f64 = 0.5 + 1e-9;

/// Takes the library for one test, configured with `spec` and its clock
/// frozen at `now`; returns its path.
fn driver(spec: &str, now: i64) -> (MutexGuard<'static, ()>, PathBuf) {
    fake::driver(&format!("gpus={GPUS},seed=1,{spec}"), now)
}

fn model() -> SimModel {
    SimModel::new(&FleetPlan::new(1, GPUS, 30_000), 0, T0, 1)
}

/// A GPU whose simulated job keeps its SMs busy over `[from, to)`, so that
/// the shares are well above the rounding.
fn busy_gpu(model: &SimModel, from: i64, to: i64) -> usize {
    (0..GPUS)
        .find(|&g| model.window(g, from, to).mean.sm_active > 0.3)
        .expect("a busy GPU")
}

/// The source's figures of GPU `gpu`, by PID.
fn figures(source: &NvmlSource, gpu: usize) -> BTreeMap<u32, f64> {
    source
        .process_utilization()
        .into_iter()
        .filter(|&(g, _, _)| g == gpu)
        .map(|(_, pid, util)| (pid, util))
        .collect()
}

/// Each process's figure matches the truth over `[from, to)`, and the
/// shares between them the configured fractions.
fn check_window(source: &NvmlSource, model: &SimModel, gpu: usize, from: i64, to: i64) {
    let got = figures(source, gpu);
    assert_eq!(
        got.keys().copied().collect::<Vec<_>>(),
        PROCS.map(|p| p.0).to_vec(),
        "[{from}, {to})"
    );
    let mut truths = Vec::new();
    for (pid, pct) in PROCS {
        let truth = process_sm_util(model, gpu, pct, from, to);
        let util = got[&pid];
        assert!(
            (util - truth).abs() <= ROUNDING,
            "PID {pid} over [{from}, {to}): {util} vs {truth}"
        );
        truths.push(truth);
    }
    let total: f64 = got.values().sum();
    let pct_total: u32 = PROCS.iter().map(|p| p.1).sum();
    // Each figure is off by at most ROUNDING, so the share by at most
    // about 2 × ROUNDING / total.
    let tolerance = 2.0 * ROUNDING / (truths.iter().sum::<f64>() - 2.0 * ROUNDING);
    for (pid, pct) in PROCS {
        let share = got[&pid] / total;
        let want = f64::from(pct) / f64::from(pct_total);
        assert!(
            (share - want).abs() <= tolerance,
            "PID {pid}: share {share} vs {want} (±{tolerance})"
        );
    }
}

#[test]
fn each_process_gets_its_share_of_the_window() {
    let model = model();
    let t1 = T0 + 12_340;
    let gpu = busy_gpu(&model, t1, t1 + 2_000);
    let share = format!("share={gpu}:4242/70+4343/30");
    let (_guard, path) = driver(&share, t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();

    // The first read only sets the driver's stamp: no window yet.
    source.capture(t1).unwrap();
    assert!(source.process_utilization().is_empty());
    let listed: Vec<u32> = source
        .processes()
        .into_iter()
        .filter(|&(g, _)| g == gpu)
        .map(|(_, pid)| pid)
        .collect();
    assert_eq!(listed, PROCS.map(|p| p.0).to_vec());

    let mut from = t1;
    for to in [t1 + 1_000, t1 + 1_250, t1 + 1_350, t1 + 2_000] {
        control::set_time_ms(to).unwrap();
        let c = source.capture(to).unwrap();
        let count = c.gpus[gpu]
            .readings
            .iter()
            .find(|r| r.metric == m::COMPUTE_PROCESSES)
            .map(|r| r.value);
        assert_eq!(count, Some(2.0));
        check_window(&source, &model, gpu, from, to);
        for (pid, _) in PROCS {
            assert!(source.processes().contains(&(gpu, pid)));
        }
        // The GPUs without the key give no per-process figures.
        assert!(
            source
                .process_utilization()
                .iter()
                .all(|&(g, _, _)| g == gpu),
            "{:?}",
            source.process_utilization()
        );
        from = to;
    }
}

#[test]
fn no_new_samples_give_no_figures_and_no_error() {
    let model = model();
    let t1 = T0 + 40_000;
    let gpu = busy_gpu(&model, t1, t1 + 500);
    let (_guard, path) = driver(&format!("share={gpu}:4242/70+4343/30"), t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    let t2 = t1 + 500;
    control::set_time_ms(t2).unwrap();
    source.capture(t2).unwrap();
    check_window(&source, &model, gpu, t1, t2);

    // Same instant: the driver has nothing since the stamp (NotFound).
    let again = source.capture(t2).unwrap();
    assert!(source.process_utilization().is_empty());
    assert_eq!(again.gpus.len(), GPUS);
    // Not a tick later either (the samples are 10 ms apart).
    control::set_time_ms(t2 + 9).unwrap();
    source.capture(t2 + 9).unwrap();
    assert!(source.process_utilization().is_empty());

    // The stamp stands: the next window starts where the last one ended.
    let t3 = t2 + 700;
    control::set_time_ms(t3).unwrap();
    source.capture(t3).unwrap();
    check_window(&source, &model, gpu, t2, t3);
}

#[test]
fn the_figures_are_read_with_the_process_list() {
    let model = model();
    let t1 = T0 + 20_000;
    let gpu = busy_gpu(&model, t1, t1 + 3_000);
    let (_guard, path) = driver(&format!("share={gpu}:4242/70+4343/30,ring=50"), t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    source.capture(t1).unwrap();
    let t2 = t1 + 400;
    control::set_time_ms(t2).unwrap();
    source.capture(t2).unwrap();
    check_window(&source, &model, gpu, t1, t2);
    let read = source.process_utilization();

    // A plan without the process list reads neither: the last figures
    // stand, as the PIDs do.
    let skip = ReadPlan::skipping([(gpu, m::COMPUTE_PROCESSES)]);
    let t3 = t2 + 200;
    control::set_time_ms(t3).unwrap();
    source.capture_planned(t3, &skip).unwrap();
    assert_eq!(source.process_utilization(), read);

    // The next read covers the skipped capture too.
    let t4 = t3 + 200;
    control::set_time_ms(t4).unwrap();
    source.capture(t4).unwrap();
    check_window(&source, &model, gpu, t2, t4);

    // After a gap longer than the driver's buffer (`ring=50`: 500 ms),
    // the figures are of the newest samples it kept.
    for at in [t4 + 300, t4 + 600] {
        control::set_time_ms(at).unwrap();
        source.capture_planned(at, &skip).unwrap();
    }
    let t5 = t4 + 1_500;
    control::set_time_ms(t5).unwrap();
    source.capture(t5).unwrap();
    check_window(&source, &model, gpu, t5 - 500, t5);
}

#[test]
fn a_gpu_without_the_key_has_no_per_process_figures() {
    let t1 = T0 + 5_000;
    let (_guard, path) = driver("", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    for at in [t1, t1 + 1_000, t1 + 2_000] {
        control::set_time_ms(at).unwrap();
        source.capture(at).unwrap();
        assert!(source.process_utilization().is_empty());
    }
    // The simulator's one process per busy GPU is still listed.
    assert!(!source.processes().is_empty());
}

#[test]
fn a_mig_card_keeps_its_processes_without_figures() {
    let t1 = T0 + 5_000;
    let (_guard, path) = driver("mig_layout=0:3g.40gb+4g.40gb,share=0:4242/70+4343/30", t1);
    let mut source = NvmlSource::open(Some(&path)).unwrap();
    for at in [t1, t1 + 1_000] {
        control::set_time_ms(at).unwrap();
        source.capture(at).unwrap();
    }
    // The driver does not report per-process utilisation in MIG mode.
    assert!(source.process_utilization().is_empty());
    let card: Vec<u32> = source
        .processes()
        .into_iter()
        .filter(|&(g, _)| g == 0)
        .map(|(_, pid)| pid)
        .collect();
    assert_eq!(card, vec![4242, 4343]);
}
