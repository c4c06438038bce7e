//! The collector's shared state: store, spec table, credentials, settings,
//! counters, and a cache of GPU records for OFU lookups.

use crate::auth::{Auth, AuthError, Credentials, Scope};
use crate::events::{AnalysisSettings, Analyzer};
use crate::limits::{LimitTable, Limiter};
use crate::live::Live;
use crate::remote_write::RemoteQueue;
use crate::stats::Stats;
use crate::store::{GpuRecord, Store};
use flopwatch_config::{CollectorConfig, GpuSpec, Precision, RemoteWriteConfig, SpecTable};
use flopwatch_proto::clock::Clock;
use flopwatch_proto::model::{Hello, Mig, Policy};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};

/// Settings the services need (a subset of [`CollectorConfig`]).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Name reported to agents.
    pub collector_id: String,
    /// Largest lead of a sample over now, ms.
    pub max_future_ms: i64,
    /// Retention, ms.
    pub retention_ms: i64,
    /// Largest batch, bytes.
    pub max_batch_bytes: u32,
    /// Most agent streams at once.
    pub max_agents: u32,
    /// Policy sent to agents.
    pub policy: Policy,
    /// Regression and straggler detection.
    pub analysis: AnalysisSettings,
    /// Remote write, when configured.
    pub remote_write: Option<RemoteWriteConfig>,
    /// Per-tenant ingest limits.
    pub limits: LimitTable,
    /// Peers and limbo settlement ([`crate::cluster`]).
    pub cluster: crate::cluster::settings::ClusterSettings,
    /// `/metrics` also carries dcgm-exporter's families (`[exporter]`).
    pub dcgm_compat: bool,
    /// Per-GPU families are on `/metrics` while a scrape's GPUs are at
    /// most this many (`[exporter] max_gpus`).
    pub exporter_max_gpus: usize,
    /// The Prometheus API's limits and turns (`[prometheus_api]`).
    pub prometheus_api: flopwatch_config::PrometheusApiConfig,
}

impl Settings {
    /// From the config file.
    pub fn from_config(c: &CollectorConfig, metrics: Vec<String>) -> Self {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        let collector_id = if c.collector_id.is_empty() {
            hostname()
        } else {
            c.collector_id.clone()
        };
        Self {
            cluster: crate::cluster::settings::ClusterSettings::from_config(c, &collector_id),
            collector_id,
            max_future_ms: ms(c.max_future),
            retention_ms: ms(c.retention),
            max_batch_bytes: c.max_batch_bytes,
            max_agents: c.max_agents,
            policy: Policy {
                min_interval_ms: ms(c.policy.min_interval) as u32,
                max_interval_ms: ms(c.policy.max_interval) as u32,
                adaptive: c.policy.adaptive,
                metrics,
                flush_interval_ms: ms(c.policy.flush_interval) as u32,
                ..Policy::default()
            },
            analysis: AnalysisSettings::from_config(&c.analysis),
            remote_write: c.remote_write.clone(),
            limits: LimitTable::from_config(c),
            dcgm_compat: c.exporter.dcgm_compat,
            exporter_max_gpus: c.exporter.max_gpus,
            prometheus_api: c.prometheus_api.clone(),
        }
    }
}

/// The machine's hostname, or "localhost".
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Shared by the ingest and query services.
pub struct Collector {
    /// Storage.
    pub store: Store,
    /// GPU spec table.
    pub specs: SpecTable,
    /// Credentials (replaced by a reload).
    auth: RwLock<Arc<Auth>>,
    /// Per-tenant ingest limits and their state.
    pub limits: Limiter,
    /// Each tenant's batches waiting for storage, written in groups.
    pub(crate) lines: crate::group::Lines,
    /// Locks held while a Hello's node ownership is checked and recorded
    /// ([`Collector::claim`]).
    claims: crate::keylock::KeyLocks,
    /// Settings.
    pub settings: Settings,
    /// Counters.
    pub stats: Arc<Stats>,
    /// Time.
    pub clock: Arc<dyn Clock>,
    /// Latest state per GPU and agent (`/metrics`, remote write).
    pub live: Live,
    /// Regression and straggler detection.
    pub events: Analyzer,
    /// The ledger's counters per job, for `/metrics` ([`crate::ledger::Live`]).
    pub ledger: crate::ledger::Live,
    /// Points waiting for remote write, when configured.
    pub remote: Option<Arc<RemoteQueue>>,
    /// Limbo and peer counters ([`crate::cluster`]).
    pub cluster: Arc<crate::cluster::settings::ClusterStats>,
    gpus: RwLock<HashMap<(String, String), GpuRecord>>,
    /// (GPU UUID, model) pairs already warned about as missing from the
    /// spec table ([`Collector::warn_if_unspecified`]).
    spec_warned: Mutex<HashSet<(String, String)>>,
}

/// Most (GPU, model) pairs remembered as warned about; past it the set is
/// cleared, so a huge fleet of unknown GPUs warns again rather than growing
/// the set without bound.
const MAX_SPEC_WARNED: usize = 65_536;

impl Collector {
    /// Assembles a collector, loading known GPUs from the store.
    pub fn new(
        store: Store,
        specs: SpecTable,
        auth: Auth,
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, crate::CollectorError> {
        let known = store.gpus(None)?;
        let gpus = known
            .into_iter()
            .map(|(t, g)| ((t, g.uuid.clone()), g))
            .collect();
        if let Some(rw) = &settings.remote_write {
            for k in rw.fidelity_by_metric.keys() {
                if k != "ofu" && flopwatch_proto::metrics::lookup(k).is_none() {
                    return Err(crate::CollectorError::Setup(format!(
                        "remote_write.fidelity_by_metric.{k}: neither \"ofu\" nor a metric of the catalog"
                    )));
                }
            }
        }
        let remote = settings.remote_write.as_ref().map(|rw| {
            let metrics = if rw.metrics.is_empty() {
                settings.policy.metrics.clone()
            } else {
                rw.metrics.clone()
            };
            let q = RemoteQueue::new(store.clone(), metrics, &rw.external_labels);
            // The series a previous run sent and did not end, taken back
            // before ingest starts.
            match q.restore(clock.now_ms(), crate::remote_write::RESTORE_GRACE_MS) {
                Ok(0) => {}
                Ok(n) => tracing::info!(series = n, "remote write takes back the series a previous run left open"),
                Err(e) => tracing::warn!(error = %e, "remote write: the open series of a previous run not read"),
            }
            Arc::new(q)
        });
        let stats = Arc::new(Stats::default());
        Ok(Arc::new(Self {
            store,
            specs,
            auth: RwLock::new(Arc::new(auth)),
            limits: Limiter::new(settings.limits.clone()),
            lines: crate::group::Lines::new(stats.clone()),
            claims: Default::default(),
            settings: settings.clone(),
            stats,
            clock,
            live: Live::default(),
            events: Analyzer::new(settings.analysis.clone()),
            ledger: crate::ledger::Live::default(),
            remote,
            cluster: Arc::default(),
            gpus: RwLock::new(gpus),
            spec_warned: Mutex::default(),
        }))
    }

    /// The locks under which a Hello of `tenant` checks and records the
    /// ownership of its node and GPUs ([`crate::ownership`]): one per node
    /// id and per GPU UUID. Two Hellos naming the same node or GPU run one
    /// after the other, so they cannot both win it; Hellos for different
    /// nodes (a fleet reconnecting at once) do not wait for each other.
    pub async fn claim(&self, tenant: &str, hello: &Hello) -> crate::keylock::Held<'_> {
        let node = std::iter::once(format!("{tenant}\0node\0{}", hello.node.node_id));
        let gpus = hello
            .gpus
            .iter()
            .map(|g| format!("{tenant}\0gpu\0{}", g.uuid));
        self.claims.lock(node.chain(gpus).collect()).await
    }

    /// The current credential table.
    pub fn auth(&self) -> Arc<Auth> {
        self.auth
            .read()
            .map(|a| a.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// What an HTTP request (`/metrics`, the Prometheus API) presenting
    /// the bearer `token` may read: `None` for no `authorization` header,
    /// `Some("")` for one that holds no bearer token. The rules of the
    /// query service: a tenant's query token its tenant, a provider token
    /// every tenant, no token the `anonymous_tenant` when one is set. A
    /// presented token that is refused counts as an auth failure of
    /// `service`.
    pub fn bearer_scope(
        &self,
        token: Option<&str>,
        service: &'static str,
    ) -> Result<Scope, AuthError> {
        let creds = Credentials {
            token: token.map(str::to_string),
            cert: None,
        };
        self.auth().query(&creds).inspect_err(|e| {
            if token.is_some() {
                self.stats.auth_failure(service, e);
            }
        })
    }

    /// Replaces credentials and limits (SIGHUP). Streams check their
    /// credentials again at their next batch; queries at their next call.
    pub fn reload(&self, auth: Auth, limits: LimitTable) {
        match self.auth.write() {
            Ok(mut a) => *a = Arc::new(auth),
            Err(e) => *e.into_inner() = Arc::new(auth),
        }
        self.limits.reload(limits);
    }

    /// Remembers GPU records (after they are stored).
    pub fn remember_gpus(&self, tenant: &str, gpus: &[GpuRecord]) {
        if let Ok(mut m) = self.gpus.write() {
            for g in gpus {
                m.insert((tenant.to_string(), g.uuid.clone()), g.clone());
            }
        }
    }

    /// A known GPU.
    pub fn gpu(&self, tenant: &str, uuid: &str) -> Option<GpuRecord> {
        self.gpus
            .read()
            .ok()?
            .get(&(tenant.to_string(), uuid.to_string()))
            .cloned()
    }

    /// Every known GPU with its tenant.
    pub fn all_gpus(&self) -> Vec<(String, GpuRecord)> {
        self.gpus
            .read()
            .map(|m| m.iter().map(|((t, _), g)| (t.clone(), g.clone())).collect())
            .unwrap_or_default()
    }

    /// The spec entry for a GPU record.
    pub fn spec(&self, g: &GpuRecord) -> Option<&GpuSpec> {
        self.specs.lookup(&g.model)
    }

    /// Warns, once per GPU and model, that a GPU's model is not in the spec
    /// table: OFU then uses the GPU's maximum SM clock as f_max
    /// ([`Collector::tensor_clock_mhz`]), or, without one, is not computed.
    /// Returns whether it warned.
    pub fn warn_if_unspecified(&self, g: &GpuRecord) -> bool {
        if self.spec(g).is_some() {
            return false;
        }
        let Ok(mut warned) = self.spec_warned.lock() else {
            return false;
        };
        if warned.len() >= MAX_SPEC_WARNED {
            warned.clear();
        }
        if !warned.insert((g.uuid.clone(), g.model.clone())) {
            return false;
        }
        drop(warned);
        if g.max_sm_clock_mhz > 0 {
            tracing::warn!(
                model = %g.model, uuid = %g.uuid, max_sm_clock_mhz = g.max_sm_clock_mhz,
                "GPU model not in the spec table; OFU uses its max SM clock as f_max and has no peak FLOP/s"
            );
        } else {
            tracing::warn!(
                model = %g.model, uuid = %g.uuid,
                "GPU {} model \"{}\" is unknown to the spec table and reports no max SM clock: OFU cannot be computed for it",
                g.uuid, g.model
            );
        }
        true
    }

    /// f_max of OFU eq. 1 for a GPU: the spec table's tensor clock, else
    /// (unknown model) the GPU's reported maximum SM clock.
    pub fn tensor_clock_mhz(&self, g: &GpuRecord) -> Option<f64> {
        match self.spec(g) {
            Some(s) => Some(f64::from(s.tensor_clock_mhz)),
            None if g.max_sm_clock_mhz > 0 => Some(f64::from(g.max_sm_clock_mhz)),
            None => None,
        }
    }

    /// Dense FP16 peak TFLOP/s of a GPU (0 when unknown): the model's, a
    /// MIG instance's scaled by its [`Collector::capacity_share`].
    pub fn peak_tflops(&self, g: &GpuRecord) -> f64 {
        self.spec(g)
            .and_then(|s| s.peak_tflops(Precision::Fp16))
            .map_or(0.0, |p| p * self.capacity_share(g))
    }

    /// The share of its card's compute capacity a GPU record stands for,
    /// its weight in node, job, tenant and fleet OFU (docs/MIG.md): 1 for
    /// a whole GPU, 0 for a card in MIG mode (counted through its
    /// instances), instance SMs / card SMs for a MIG instance
    /// ([`flopwatch_config::GpuSpec::mig_share`]; its `<n>g` slices of 7
    /// for a model the spec table does not know, 1 without a profile).
    pub fn capacity_share(&self, g: &GpuRecord) -> f64 {
        match g.mig() {
            Mig::Off => 1.0,
            Mig::Card => 0.0,
            Mig::Instance(i) => self
                .spec(g)
                .and_then(|s| s.mig_share(&i.profile, g.sm_count))
                .or_else(|| {
                    let slices: f64 = i.profile.split('g').next()?.parse().ok()?;
                    Some((slices / 7.0).clamp(0.0, 1.0))
                })
                .unwrap_or(1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemEngine;

    fn collector() -> Arc<Collector> {
        let cfg = CollectorConfig::default();
        Collector::new(
            Store::new(Arc::new(MemEngine::new()), false),
            SpecTable::builtin(),
            Auth::from_config(&cfg),
            Settings::from_config(&cfg, Vec::new()),
            Arc::new(flopwatch_proto::clock::ManualClock::new(0)),
        )
        .unwrap()
    }

    fn gpu(uuid: &str, model: &str, max_sm_clock_mhz: u32) -> GpuRecord {
        GpuRecord {
            uuid: uuid.into(),
            model: model.into(),
            max_sm_clock_mhz,
            ..Default::default()
        }
    }

    #[test]
    fn capacity_shares_and_peaks_of_mig_instances() {
        use flopwatch_proto::model::{GpuInfo, MigInstance};
        let c = collector();
        let record = |model: &str, mig: Mig, sm_count: u32| {
            GpuRecord::from_info(
                &GpuInfo {
                    uuid: "x".into(),
                    model: model.into(),
                    sm_count,
                    mig,
                    ..Default::default()
                },
                "n",
                None,
                0,
            )
        };
        let instance = |profile: &str| {
            Mig::Instance(MigInstance {
                parent_uuid: "GPU-1".into(),
                gpu_instance_id: 1,
                compute_instance_id: 0,
                profile: profile.into(),
            })
        };
        let a100 = "NVIDIA A100-SXM4-80GB";
        let whole = c.peak_tflops(&record(a100, Mig::Off, 108));
        assert!((whole - 311.869).abs() < 1e-3, "{whole}");
        assert_eq!(c.capacity_share(&record(a100, Mig::Off, 108)), 1.0);
        assert_eq!(c.capacity_share(&record(a100, Mig::Card, 108)), 0.0);
        assert_eq!(c.peak_tflops(&record(a100, Mig::Card, 108)), 0.0);
        // The spec table's SMs of the profile, else the driver's count.
        let g = record(a100, instance("3g.40gb"), 0);
        assert!((c.capacity_share(&g) - 42.0 / 108.0).abs() < 1e-12);
        assert!((c.peak_tflops(&g) - whole * 42.0 / 108.0).abs() < 1e-9);
        let g = record(a100, instance("3g.40gb"), 54);
        assert!((c.capacity_share(&g) - 0.5).abs() < 1e-12);
        // A model the table does not know: slices of 7.
        let g = record("Tesla Z99", instance("3g.40gb"), 0);
        assert!((c.capacity_share(&g) - 3.0 / 7.0).abs() < 1e-12);
        assert_eq!(c.capacity_share(&record("Tesla Z99", instance(""), 0)), 1.0);
    }

    #[test]
    fn unknown_models_are_warned_about_once_per_gpu_and_model() {
        let c = collector();
        // Known, in dcgm-exporter's blank-replaced spelling: no warning.
        assert!(!c.warn_if_unspecified(&gpu("GPU-1", "NVIDIA-H100-PCIe", 0)));
        let unknown = gpu("GPU-2", "Tesla K80", 0);
        assert!(c.warn_if_unspecified(&unknown));
        assert!(!c.warn_if_unspecified(&unknown), "a reconnect warns again");
        assert!(c.warn_if_unspecified(&gpu("GPU-3", "Tesla K80", 875)));
        assert!(c.warn_if_unspecified(&gpu("GPU-2", "Tesla P100", 0)));
        // The fallback f_max and its absence.
        assert_eq!(
            c.tensor_clock_mhz(&gpu("GPU-3", "Tesla K80", 875)),
            Some(875.0)
        );
        assert_eq!(c.tensor_clock_mhz(&unknown), None);
    }
}
