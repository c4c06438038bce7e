//! NVML with a dcgm-exporter standing in for refused GPM samples.
//!
//! In a container without `CAP_SYS_ADMIN` the driver refuses GPM samples
//! ([`nvml::GPM_DENIED_HELP`](super::nvml::GPM_DENIED_HELP)), and with them
//! tensor pipe activity, which OFU needs. A dcgm-exporter on the node reads
//! the same profiling counters through DCGM's host engine, which holds the
//! privilege. With `[nvml] gpm_fallback = URL`, every capture of a GPU whose
//! GPM samples were refused takes the readings NVML could not give (those
//! of the metrics its capture lacks) from that exporter's page, matched by
//! GPU UUID; everything NVML did read stays NVML's.
//!
//! The exporter is opened on the first refusal, not at start: a node whose
//! agent holds the capability never scrapes it. An exporter that cannot be
//! opened or scraped costs the fallback's readings only, never the NVML
//! capture; it is logged once and retried at the next capture.
//!
//! MIG: GPUs NVML lists later (MIG instances created after the exporter
//! was opened) are matched by UUID when they appear, and a MIG card
//! ([`Mig::Card`](flopwatch_proto::model::Mig::Card)) is never given the
//! compute activity its instances carry
//! ([`INSTANCE_ACTIVITY`]).

use super::dcgm::DcgmExporterSource;
use super::{GpuSource, SourceError, INSTANCE_ACTIVITY};
use crate::capture::{Capture, ReadPlan};
use flopwatch_proto::model::{DeviceInfo, GpuInfo, MfuReport};
use std::collections::HashMap;
use tracing::{info, warn};

/// NVML (`inner`) with refused GPM readings taken from a dcgm-exporter.
pub struct GpmFallback {
    inner: Box<dyn GpuSource>,
    url: String,
    exporter: Option<DcgmExporterSource>,
    /// The exporter's GPU index of each inner inventory GPU (by UUID).
    map: Vec<Option<usize>>,
    /// Whether the exporter's last open or scrape failed (logged once until
    /// it works again).
    failing: bool,
    /// Opens the exporter; a seam for tests of the failure path.
    open: fn(&str) -> Result<DcgmExporterSource, SourceError>,
}

impl std::fmt::Debug for GpmFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpmFallback")
            .field("inner", &self.inner.name())
            .field("url", &self.url)
            .field("open", &self.exporter.is_some())
            .finish_non_exhaustive()
    }
}

impl GpmFallback {
    /// `inner` (an NVML source), falling back to the dcgm-exporter at `url`
    /// for the GPUs whose GPM samples it is refused.
    pub fn new(inner: Box<dyn GpuSource>, url: &str) -> Self {
        Self {
            inner,
            url: url.to_string(),
            exporter: None,
            map: Vec::new(),
            failing: false,
            open: DcgmExporterSource::open,
        }
    }

    /// Whether the exporter is open (it is opened on the first refusal).
    pub fn exporter_open(&self) -> bool {
        self.exporter.is_some()
    }

    fn failed(&mut self, e: &SourceError) {
        if !self.failing {
            warn!(
                url = %self.url,
                error = %e,
                "GPM refused and the dcgm-exporter fallback is unavailable; tensor activity and OFU stay missing (retried every capture)"
            );
            self.failing = true;
        }
    }

    /// The exporter, opened on first use.
    fn exporter(&mut self) -> Option<&mut DcgmExporterSource> {
        if self.exporter.is_none() {
            match (self.open)(&self.url) {
                Ok(e) => {
                    let by_uuid: HashMap<&str, usize> = e
                        .inventory()
                        .iter()
                        .enumerate()
                        .map(|(i, g)| (g.uuid.as_str(), i))
                        .collect();
                    self.map = self
                        .inner
                        .inventory()
                        .iter()
                        .map(|g| by_uuid.get(g.uuid.as_str()).copied())
                        .collect();
                    let matched = self.map.iter().flatten().count();
                    info!(
                        url = %self.url,
                        gpus = matched,
                        "GPM refused: tensor activity now comes from the dcgm-exporter"
                    );
                    if matched < self.map.len() {
                        warn!(
                            url = %self.url,
                            missing = self.map.len() - matched,
                            "the dcgm-exporter does not show every GPU NVML sees (by UUID)"
                        );
                    }
                    self.exporter = Some(e);
                }
                Err(e) => {
                    self.failed(&e);
                    return None;
                }
            }
        }
        self.exporter.as_mut()
    }

    /// Adds to `capture` the exporter's readings of the metrics it lacks on
    /// the GPUs whose GPM samples were refused.
    fn fill(&mut self, capture: &mut Capture, now_ms: i64, plan: &ReadPlan) {
        let denied: Vec<usize> = self
            .inner
            .gpm_permission_denied()
            .iter()
            .enumerate()
            .filter(|(_, d)| **d)
            .map(|(g, _)| g)
            .collect();
        if denied.is_empty() {
            return;
        }
        let Some(exporter) = self.exporter() else {
            return;
        };
        let page = match exporter.capture(now_ms) {
            Ok(c) => c,
            Err(e) => {
                self.failed(&e);
                return;
            }
        };
        if self.failing {
            info!(url = %self.url, "the dcgm-exporter fallback works again");
            self.failing = false;
        }
        let inventory = self.inner.inventory();
        if self.map.len() < inventory.len() {
            if let Some(e) = &self.exporter {
                let listed = e.inventory();
                let new = inventory[self.map.len()..]
                    .iter()
                    .map(|g| listed.iter().position(|x| x.uuid == g.uuid));
                self.map.extend(new.collect::<Vec<_>>());
            }
        }
        for g in denied {
            let card = inventory.get(g).is_some_and(|i| i.mig.is_card());
            let Some(Some(e)) = self.map.get(g) else {
                continue;
            };
            let Some(from) = page.gpus.iter().find(|c| c.gpu == *e) else {
                continue;
            };
            let Some(into) = capture.gpus.iter_mut().find(|c| c.gpu == g) else {
                continue;
            };
            for r in &from.readings {
                if !plan.wants(g, r.metric)
                    || into.readings.iter().any(|x| x.metric == r.metric)
                    || (card && INSTANCE_ACTIVITY.contains(&r.metric))
                {
                    continue;
                }
                let mut r = *r;
                // The exporter's window, not NVML's capture's.
                r.window_ms = r.window_ms.or(Some(from.window_ms));
                into.readings.push(r);
            }
        }
    }
}

impl GpuSource for GpmFallback {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn inventory(&self) -> &[GpuInfo] {
        self.inner.inventory()
    }

    fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
        self.capture_planned(now_ms, &ReadPlan::all())
    }

    fn capture_planned(&mut self, now_ms: i64, plan: &ReadPlan) -> Result<Capture, SourceError> {
        let mut capture = self.inner.capture_planned(now_ms, plan)?;
        self.fill(&mut capture, now_ms, plan);
        Ok(capture)
    }

    fn devices(&self) -> &[DeviceInfo] {
        self.inner.devices()
    }

    fn gpm_permission_denied(&self) -> &[bool] {
        self.inner.gpm_permission_denied()
    }

    fn processes(&self) -> Vec<(usize, u32)> {
        self.inner.processes()
    }

    fn mfu_reports(&mut self, now_ms: i64) -> Vec<MfuReport> {
        self.inner.mfu_reports(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::{GpuCapture, Reading};

    /// A source whose GPU 1 has its GPM samples refused.
    struct Refused {
        inventory: Vec<GpuInfo>,
        denied: Vec<bool>,
    }

    impl GpuSource for Refused {
        fn name(&self) -> &'static str {
            "nvml"
        }
        fn inventory(&self) -> &[GpuInfo] {
            &self.inventory
        }
        fn capture(&mut self, now_ms: i64) -> Result<Capture, SourceError> {
            Ok(Capture {
                ts_ms: now_ms,
                gpus: (0..self.inventory.len())
                    .map(|gpu| GpuCapture {
                        gpu,
                        window_ms: 100,
                        readings: vec![Reading::new("power_w", 300.0)],
                    })
                    .collect(),
                ..Capture::default()
            })
        }
        fn gpm_permission_denied(&self) -> &[bool] {
            &self.denied
        }
    }

    fn refused(denied: Vec<bool>) -> Box<dyn GpuSource> {
        let inventory = (0..denied.len())
            .map(|i| GpuInfo {
                index: i as u32,
                uuid: format!("GPU-{i}"),
                ..GpuInfo::default()
            })
            .collect();
        Box::new(Refused { inventory, denied })
    }

    /// An exporter that cannot be reached costs the fallback only: the
    /// NVML capture comes whole, and the open is retried each capture.
    #[test]
    fn an_unreachable_exporter_leaves_the_nvml_capture_whole() {
        let mut f = GpmFallback::new(refused(vec![false, true]), "http://127.0.0.1:1/metrics");
        f.open = |url| {
            Err(SourceError::Exporter {
                url: url.to_string(),
                message: "refused".to_string(),
            })
        };
        for t in [0, 100] {
            let c = f.capture(t).unwrap();
            assert_eq!(c.gpus.len(), 2);
            assert!(c.gpus.iter().all(|g| g.readings.len() == 1));
            assert!(!f.exporter_open());
        }
    }

    /// Without a refusal the exporter is never opened.
    #[test]
    fn no_refusal_no_exporter() {
        let mut f = GpmFallback::new(refused(vec![false, false]), "http://127.0.0.1:1/metrics");
        f.open = |_| panic!("opened without a refusal");
        let c = f.capture(0).unwrap();
        assert_eq!(c.gpus.len(), 2);
        assert!(!f.exporter_open());
    }
}
