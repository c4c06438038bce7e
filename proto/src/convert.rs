//! Wire ⇄ domain conversions. Decoding checks structure only (lengths,
//! required fields); value checks (NaN, timestamps, known metrics) belong to
//! the collector's validation so that good samples of a batch survive.

use crate::model::{
    Batch, DeviceInfo, Event, GpuInfo, Hello, JobAssignment, MfuReport, Mig, MigInstance,
    NodeIdentity, Point, Policy, SamplingInterval, SeriesBatch, Share, Split,
};
use crate::v1;

/// A wire message that cannot become a domain value.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    /// A required field is empty.
    #[error("field `{0}` is required")]
    Missing(&'static str),
    /// Parallel arrays of a series disagree in length.
    #[error("series {gpu}/{metric}: {field} has {got} entries, timestamps_ms has {want}")]
    LengthMismatch {
        /// GPU of the series.
        gpu: String,
        /// Metric of the series.
        metric: String,
        /// Offending field.
        field: &'static str,
        /// Its length.
        got: usize,
        /// Expected length.
        want: usize,
    },
}

impl From<v1::GpuInfo> for GpuInfo {
    fn from(g: v1::GpuInfo) -> Self {
        Self {
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            sm_count: g.sm_count,
            max_sm_clock_mhz: g.max_sm_clock_mhz,
            max_mem_clock_mhz: g.max_mem_clock_mhz,
            driver_version: g.driver_version,
            pci_bus_id: g.pci_bus_id,
            gpm_supported: g.gpm_supported,
            memory_total_bytes: g.memory_total_bytes,
            mig: if !g.mig_parent_uuid.is_empty() {
                Mig::Instance(MigInstance {
                    parent_uuid: g.mig_parent_uuid,
                    gpu_instance_id: g.gpu_instance_id,
                    compute_instance_id: g.compute_instance_id,
                    profile: g.mig_profile,
                })
            } else if g.mig_enabled {
                Mig::Card
            } else {
                Mig::Off
            },
        }
    }
}

impl From<GpuInfo> for v1::GpuInfo {
    fn from(g: GpuInfo) -> Self {
        Self {
            index: g.index,
            uuid: g.uuid,
            model: g.model,
            sm_count: g.sm_count,
            max_sm_clock_mhz: g.max_sm_clock_mhz,
            max_mem_clock_mhz: g.max_mem_clock_mhz,
            driver_version: g.driver_version,
            pci_bus_id: g.pci_bus_id,
            gpm_supported: g.gpm_supported,
            memory_total_bytes: g.memory_total_bytes,
            mig_enabled: g.mig.is_card(),
            mig_parent_uuid: g.mig.parent_uuid().unwrap_or_default().to_string(),
            gpu_instance_id: g.mig.instance().map_or(0, |i| i.gpu_instance_id),
            compute_instance_id: g.mig.instance().map_or(0, |i| i.compute_instance_id),
            mig_profile: g
                .mig
                .instance()
                .map(|i| i.profile.clone())
                .unwrap_or_default(),
        }
    }
}

impl TryFrom<v1::Hello> for Hello {
    type Error = ConvertError;
    fn try_from(h: v1::Hello) -> Result<Self, ConvertError> {
        let node = h.node.ok_or(ConvertError::Missing("hello.node"))?;
        if node.node_id.is_empty() {
            return Err(ConvertError::Missing("hello.node.node_id"));
        }
        let agent_id = if h.agent_id.is_empty() {
            node.node_id.clone()
        } else {
            h.agent_id
        };
        Ok(Self {
            token: (!h.token.is_empty()).then_some(h.token),
            agent_id,
            node: NodeIdentity {
                node_id: node.node_id,
                hostname: node.hostname,
                boot_id: node.boot_id,
                labels: node.labels.into_iter().collect(),
            },
            gpus: h.gpus.into_iter().map(GpuInfo::from).collect(),
            agent_version: h.agent_version,
            metrics: h.metrics,
            devices: h
                .devices
                .into_iter()
                .map(|d| DeviceInfo {
                    id: d.id,
                    kind: d.kind,
                    name: d.name,
                })
                .collect(),
        })
    }
}

impl From<Hello> for v1::Hello {
    fn from(h: Hello) -> Self {
        Self {
            token: h.token.unwrap_or_default(),
            agent_id: h.agent_id,
            node: Some(v1::NodeIdentity {
                node_id: h.node.node_id,
                hostname: h.node.hostname,
                boot_id: h.node.boot_id,
                labels: h.node.labels.into_iter().collect(),
            }),
            gpus: h.gpus.into_iter().map(Into::into).collect(),
            agent_version: h.agent_version,
            protocol_version: 1,
            metrics: h.metrics,
            devices: h
                .devices
                .into_iter()
                .map(|d| v1::DeviceInfo {
                    id: d.id,
                    kind: d.kind,
                    name: d.name,
                })
                .collect(),
        }
    }
}

impl TryFrom<v1::Series> for SeriesBatch {
    type Error = ConvertError;
    fn try_from(s: v1::Series) -> Result<Self, ConvertError> {
        let n = s.timestamps_ms.len();
        let check = |field: &'static str, got: usize, optional: bool| {
            if got == n || (optional && got == 0) {
                Ok(())
            } else {
                Err(ConvertError::LengthMismatch {
                    gpu: s.gpu_uuid.clone(),
                    metric: s.metric.clone(),
                    field,
                    got,
                    want: n,
                })
            }
        };
        check("values", s.values.len(), false)?;
        check("peaks", s.peaks.len(), true)?;
        check("window_ms", s.window_ms.len(), true)?;
        let points = (0..n)
            .map(|i| Point {
                ts_ms: s.timestamps_ms[i],
                value: s.values[i],
                peak: s.peaks.get(i).copied(),
                window_ms: s.window_ms.get(i).copied(),
            })
            .collect();
        Ok(Self {
            gpu_uuid: s.gpu_uuid,
            metric: s.metric,
            points,
        })
    }
}

impl From<SeriesBatch> for v1::Series {
    fn from(s: SeriesBatch) -> Self {
        let has_peaks = s.points.iter().any(|p| p.peak.is_some());
        let has_windows = s.points.iter().any(|p| p.window_ms.is_some());
        Self {
            timestamps_ms: s.points.iter().map(|p| p.ts_ms).collect(),
            values: s.points.iter().map(|p| p.value).collect(),
            peaks: if has_peaks {
                s.points.iter().map(|p| p.peak.unwrap_or(p.value)).collect()
            } else {
                Vec::new()
            },
            window_ms: if has_windows {
                s.points.iter().map(|p| p.window_ms.unwrap_or(0)).collect()
            } else {
                Vec::new()
            },
            gpu_uuid: s.gpu_uuid,
            metric: s.metric,
        }
    }
}

impl From<v1::JobAssignment> for JobAssignment {
    fn from(j: v1::JobAssignment) -> Self {
        Self {
            gpu_uuid: j.gpu_uuid,
            job_id: j.job_id,
            pod: j.pod,
            namespace: j.namespace,
            container: j.container,
            hpc_job: j.hpc_job,
            since_ms: j.since_ms,
            // An unknown split reads as even: the share itself stands.
            share: (j.share_ppm > 0).then(|| Share {
                ppm: j.share_ppm.min(1_000_000),
                split: Split::parse(&j.split).unwrap_or(Split::Equal),
            }),
        }
    }
}

impl From<JobAssignment> for v1::JobAssignment {
    fn from(j: JobAssignment) -> Self {
        Self {
            gpu_uuid: j.gpu_uuid,
            job_id: j.job_id,
            pod: j.pod,
            namespace: j.namespace,
            container: j.container,
            hpc_job: j.hpc_job,
            since_ms: j.since_ms,
            share_ppm: j.share.map_or(0, |s| s.ppm),
            split: j
                .share
                .map(|s| s.split.as_str().to_string())
                .unwrap_or_default(),
        }
    }
}

impl From<v1::Event> for Event {
    fn from(e: v1::Event) -> Self {
        Self {
            gpu_uuid: e.gpu_uuid,
            kind: e.kind,
            ts_ms: e.timestamp_ms,
            code: e.code,
            detail: e.detail,
        }
    }
}

impl From<Event> for v1::Event {
    fn from(e: Event) -> Self {
        Self {
            gpu_uuid: e.gpu_uuid,
            kind: e.kind,
            timestamp_ms: e.ts_ms,
            code: e.code,
            detail: e.detail,
        }
    }
}

impl TryFrom<v1::Batch> for Batch {
    type Error = ConvertError;
    fn try_from(b: v1::Batch) -> Result<Self, ConvertError> {
        if b.seq == 0 {
            return Err(ConvertError::Missing("batch.seq"));
        }
        Ok(Self {
            seq: b.seq,
            agent_id: b.agent_id,
            boot_id: b.boot_id,
            series: b
                .series
                .into_iter()
                .map(SeriesBatch::try_from)
                .collect::<Result<_, _>>()?,
            jobs: b.jobs.into_iter().map(Into::into).collect(),
            events: b.events.into_iter().map(Into::into).collect(),
            sent_at_ms: b.sent_at_ms,
            from_spool: b.from_spool,
            intervals: b
                .intervals
                .into_iter()
                .map(|i| SamplingInterval {
                    gpu_uuid: i.gpu_uuid,
                    metric: i.metric,
                    interval_ms: i.interval_ms,
                })
                .collect(),
            pending_bytes: b.pending_bytes,
            pending_batches: b.pending_batches,
            mfu_reports: b.mfu_reports.into_iter().map(Into::into).collect(),
            uncertain: b.uncertain,
        })
    }
}

impl From<v1::MfuReport> for MfuReport {
    fn from(r: v1::MfuReport) -> Self {
        let mut tflops: Vec<(String, f64)> = r.tflops_by_precision.into_iter().collect();
        tflops.sort_by(|a, b| a.0.cmp(&b.0));
        Self {
            job_id: r.job_id,
            ts_ms: r.timestamp_ms,
            start_ms: r.start_ms,
            mfu: r.mfu,
            tflops_by_precision: tflops,
        }
    }
}

impl From<MfuReport> for v1::MfuReport {
    fn from(r: MfuReport) -> Self {
        Self {
            job_id: r.job_id,
            timestamp_ms: r.ts_ms,
            start_ms: r.start_ms,
            mfu: r.mfu,
            tflops_by_precision: r.tflops_by_precision.into_iter().collect(),
        }
    }
}

impl From<Batch> for v1::Batch {
    fn from(b: Batch) -> Self {
        Self {
            seq: b.seq,
            agent_id: b.agent_id,
            boot_id: b.boot_id,
            series: b.series.into_iter().map(Into::into).collect(),
            jobs: b.jobs.into_iter().map(Into::into).collect(),
            events: b.events.into_iter().map(Into::into).collect(),
            sent_at_ms: b.sent_at_ms,
            from_spool: b.from_spool,
            intervals: b
                .intervals
                .into_iter()
                .map(|i| v1::SamplingInterval {
                    gpu_uuid: i.gpu_uuid,
                    metric: i.metric,
                    interval_ms: i.interval_ms,
                })
                .collect(),
            pending_bytes: b.pending_bytes,
            pending_batches: b.pending_batches,
            mfu_reports: b.mfu_reports.into_iter().map(Into::into).collect(),
            uncertain: b.uncertain,
        }
    }
}

impl From<v1::Policy> for Policy {
    fn from(p: v1::Policy) -> Self {
        let d = Policy::default();
        let or = |v: u32, default: u32| if v == 0 { default } else { v };
        Self {
            min_interval_ms: or(p.min_interval_ms, d.min_interval_ms),
            max_interval_ms: or(p.max_interval_ms, d.max_interval_ms),
            adaptive: p.adaptive,
            metrics: p.metrics,
            max_batch_samples: or(p.max_batch_samples, d.max_batch_samples),
            flush_interval_ms: or(p.flush_interval_ms, d.flush_interval_ms),
        }
    }
}

impl From<Policy> for v1::Policy {
    fn from(p: Policy) -> Self {
        Self {
            min_interval_ms: p.min_interval_ms,
            max_interval_ms: p.max_interval_ms,
            adaptive: p.adaptive,
            metrics: p.metrics,
            max_batch_samples: p.max_batch_samples,
            flush_interval_ms: p.flush_interval_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips() {
        let b = Batch {
            seq: 7,
            agent_id: "a".into(),
            boot_id: "b".into(),
            series: vec![SeriesBatch {
                gpu_uuid: "GPU-1".into(),
                metric: "tensor_active".into(),
                points: vec![
                    Point {
                        ts_ms: 1,
                        value: 0.5,
                        peak: Some(0.7),
                        window_ms: Some(100),
                    },
                    Point {
                        ts_ms: 2,
                        value: 0.6,
                        peak: Some(0.6),
                        window_ms: Some(100),
                    },
                ],
            }],
            intervals: vec![SamplingInterval {
                gpu_uuid: "GPU-1".into(),
                metric: "tensor_active".into(),
                interval_ms: 1600,
            }],
            pending_bytes: 4096,
            pending_batches: 2,
            mfu_reports: vec![MfuReport {
                job_id: "moe".into(),
                ts_ms: 5,
                start_ms: 1,
                mfu: Some(0.5427),
                tflops_by_precision: vec![("bf16".into(), 300.0), ("fp8".into(), 120.0)],
            }],
            ..Default::default()
        };
        let wire: v1::Batch = b.clone().into();
        assert_eq!(Batch::try_from(wire).unwrap(), b);
    }

    #[test]
    fn mismatched_lengths_are_rejected() {
        let wire = v1::Batch {
            seq: 1,
            series: vec![v1::Series {
                gpu_uuid: "g".into(),
                metric: "m".into(),
                timestamps_ms: vec![1, 2],
                values: vec![1.0],
                ..Default::default()
            }],
            ..Default::default()
        };
        let err = Batch::try_from(wire).unwrap_err();
        assert!(matches!(
            err,
            ConvertError::LengthMismatch {
                field: "values",
                got: 1,
                want: 2,
                ..
            }
        ));
    }

    #[test]
    fn seq_zero_is_rejected() {
        assert_eq!(
            Batch::try_from(v1::Batch::default()).unwrap_err(),
            ConvertError::Missing("batch.seq")
        );
    }
}
