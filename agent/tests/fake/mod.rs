//! The fake `libnvidia-ml.so` as the NVML tests drive it: one library per
//! test process, taken by one test at a time ([`driver`]), its clock set
//! by the test, and the simulated truth it answers from ([`truth`]).
//! Every test that loads the library holds it ([`hold`], [`driver`]).
#![allow(dead_code)]

use flopwatch_agent::source::nvml::NvmlSource;
use flopwatch_agent::source::{Capture, GpuSource};
use flopwatch_fake_nvml::config::FakeConfig;
use flopwatch_fake_nvml::mig::MigNode;
use flopwatch_fake_nvml::{control, library_path};
use flopwatch_sim::{FleetPlan, SimModel};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The one library of the process, held by one test at a time.
static DRIVER: Mutex<()> = Mutex::new(());

/// Fleet start used by every test.
pub(crate) const T0: i64 = 1_700_000_000_000;

/// Takes the library for one test, as it is.
pub(crate) fn hold() -> MutexGuard<'static, ()> {
    DRIVER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Takes the library for one test, configured with `spec` and its clock
/// frozen at `now`; returns its path.
pub(crate) fn driver(spec: &str, now: i64) -> (MutexGuard<'static, ()>, PathBuf) {
    let guard = hold();
    let path = library_path().expect("the fake NVML library is built next to this test");
    control::set_time_ms(now).unwrap();
    control::configure(&format!("start_ms={T0},{spec}")).unwrap();
    (guard, path)
}

/// What the fake answers with for `spec`: the simulated node and its MIG
/// layouts.
pub(crate) fn truth(spec: &str) -> (SimModel, MigNode) {
    let c = FakeConfig::parse(&format!("start_ms={T0},{spec}")).unwrap();
    let fleet = FleetPlan::new(c.nodes, c.gpus, c.regress_after_ms);
    (
        SimModel::new(&fleet, c.node, T0, c.seed),
        MigNode::new(&c, T0),
    )
}

/// Moves the library's clock to `t` and captures then.
pub(crate) fn capture_at(source: &mut NvmlSource, t: i64) -> Capture {
    control::set_time_ms(t).unwrap();
    source.capture(t).unwrap()
}

/// The value of `metric` of inventory GPU `gpu` in `c`.
pub(crate) fn value(c: &Capture, gpu: usize, metric: &str) -> Option<f64> {
    c.gpus
        .iter()
        .find(|g| g.gpu == gpu)?
        .readings
        .iter()
        .find(|r| r.metric == metric)
        .map(|r| r.value)
}
