//! The label sets of the series flopwatch exports, shared by the
//! collector's `/metrics` page and its remote_write queue so both name a
//! GPU or a node device the same way.
//!
//! GPU labels follow dcgm-exporter's (`gpu`, `UUID`, `modelName`,
//! `hostname`) plus `node`, `tenant` and, when the agent attributes the GPU
//! to a job, `job_id`, `pod`, `namespace`, `container`, `hpc_job`.

use crate::live::{DeviceLive, GpuLive};

/// A series' labels, in order.
pub type Labels = Vec<(String, String)>;

/// The labels of one GPU's series.
pub fn gpu_labels(g: &GpuLive) -> Labels {
    let mut l: Labels = vec![
        ("gpu".into(), g.index.to_string()),
        ("UUID".into(), g.uuid.clone()),
        ("modelName".into(), g.model.clone()),
        ("hostname".into(), g.hostname.clone()),
        ("node".into(), g.node_id.clone()),
        ("tenant".into(), g.tenant.clone()),
    ];
    if let Some(j) = &g.job {
        for (k, v) in [
            ("job_id", &j.job_id),
            ("pod", &j.pod),
            ("namespace", &j.namespace),
            ("container", &j.container),
            ("hpc_job", &j.hpc_job),
        ] {
            if !v.is_empty() {
                l.push((k.into(), v.clone()));
            }
        }
    }
    l
}

/// The labels of one node device's series.
pub fn device_labels(d: &DeviceLive) -> Labels {
    vec![
        ("kind".into(), d.kind.clone()),
        ("device".into(), d.name.clone()),
        ("device_id".into(), d.id.clone()),
        ("hostname".into(), d.hostname.clone()),
        ("node".into(), d.node_id.clone()),
        ("tenant".into(), d.tenant.clone()),
    ]
}
