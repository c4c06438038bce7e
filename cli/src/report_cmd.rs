//! `flopwatch report`: the ledger (docs/LEDGER.md) — what each job,
//! tenant, namespace or node held, used, left unused and burned over a
//! period, from the collector's `Query/Ledger` entries (one per job and
//! GPU), grouped here.

use crate::query_cmd::Range;
use crate::table::{Align, Table};
use anyhow::Context;
use flopwatch_proto::v1;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Arguments of `report`.
#[derive(clap::Args)]
pub(crate) struct ReportArgs {
    /// How far back, e.g. 1h, 30d.
    #[arg(long, default_value = "1h")]
    since: String,
    #[command(flatten)]
    range: Range,
    /// One tenant (provider credentials; a tenant's token sees its own).
    #[arg(long, conflicts_with = "job")]
    tenant: Option<String>,
    /// One job.
    #[arg(long)]
    job: Option<String>,
    /// What a row is.
    #[arg(long, value_enum, default_value = "job")]
    by: By,
    /// Prices per GPU-hour by model and per kWh (TOML, docs/LEDGER.md):
    /// adds a `cost` column.
    #[arg(long, value_name = "FILE")]
    rate_card: Option<PathBuf>,
    /// Print JSON (an array of rows).
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV with a header row.
    #[arg(long)]
    csv: bool,
    /// Read a collector's data directory (RocksDB, opened read-only beside
    /// a running collector) instead of asking a collector: every tenant.
    #[cfg(feature = "collector")]
    #[arg(long, value_name = "DIR", conflicts_with = "tenant")]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    conn: crate::conn::ConnArgs,
}

/// What one row of a report adds up.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum By {
    /// A job of a tenant.
    Job,
    Tenant,
    /// A Kubernetes namespace of a tenant.
    Namespace,
    Node,
    Gpu,
    /// Everything visible, one row.
    Fleet,
}

/// A rate card: prices per GPU-hour by model, and per kWh.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateCard {
    /// Currency label printed with costs (informational).
    #[serde(default)]
    pub currency: String,
    /// Price of one kWh.
    #[serde(default)]
    pub kwh: f64,
    /// Price of one GPU-hour held, by model: a key matches a GPU whose
    /// model name contains it (case-insensitive); the longest match wins.
    #[serde(default)]
    pub gpu_hour: BTreeMap<String, f64>,
}

impl RateCard {
    /// Reads a rate card; errors name the file (and the key, from TOML).
    pub(crate) fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let card: RateCard =
            toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        for (k, v) in card.gpu_hour.iter().map(|(k, v)| (k.as_str(), *v)) {
            if !(v.is_finite() && v >= 0.0) {
                anyhow::bail!("{}: gpu_hour.{k}: expected a price ≥ 0", path.display());
            }
        }
        if !(card.kwh.is_finite() && card.kwh >= 0.0) {
            anyhow::bail!("{}: kwh: expected a price ≥ 0", path.display());
        }
        Ok(card)
    }

    /// The price of a GPU-hour of `model` (`None`: no key matches).
    pub(crate) fn gpu_hour(&self, model: &str) -> Option<f64> {
        let model = model.to_lowercase();
        self.gpu_hour
            .iter()
            .filter(|(k, _)| model.contains(&k.to_lowercase()))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, v)| *v)
    }
}

/// One row of a report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Row {
    /// The row's key (`tenant/job`, `tenant/namespace`, the node, …).
    pub key: String,
    /// GPUs with a holding in the row.
    pub gpus: usize,
    pub gpu_hours: f64,
    /// GPU-hours held in minutes of tensor activity below 1 %.
    pub idle_gpu_hours: f64,
    /// Mean OFU over the held time (eq. 11, time-weighted).
    pub ofu: f64,
    /// Σ OFU × peak × time.
    pub delivered_pflop: f64,
    /// Σ (1 − OFU) × peak × time.
    pub unused_pflop: f64,
    /// Σ (1 − OFU) × time.
    pub unused_gpu_hours: f64,
    pub energy_joules: f64,
    /// Energy per delivered PFLOP (`None`: nothing delivered).
    pub joules_per_pflop: Option<f64>,
    /// `counter`, `power`, `mixed` (some GPUs each) or `none`.
    pub energy_source: String,
    /// With a rate card: GPU-hours at their model's price plus energy at
    /// the kWh price (GPUs of an unpriced model count no GPU-hour cost).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
}

/// The rows of `entries` grouped `by`, sorted by key.
pub(crate) fn rows(entries: &[v1::LedgerEntry], by: By, rates: Option<&RateCard>) -> Vec<Row> {
    #[derive(Default)]
    struct Acc {
        gpus: std::collections::BTreeSet<String>,
        held: f64,
        idle: f64,
        ofu: f64,
        delivered_tflop: f64,
        capacity_tflop: f64,
        energy: f64,
        sources: std::collections::BTreeSet<String>,
        cost: f64,
    }
    let mut groups: BTreeMap<String, Acc> = BTreeMap::new();
    for e in entries {
        let key = match by {
            By::Job => format!("{}/{}", e.tenant, e.job_id),
            By::Tenant => e.tenant.clone(),
            By::Namespace => format!("{}/{}", e.tenant, e.namespace),
            By::Node => e.node_id.clone(),
            By::Gpu => e.gpu_uuid.clone(),
            By::Fleet => "fleet".to_string(),
        };
        let a = groups.entry(key).or_default();
        a.gpus.insert(e.gpu_uuid.clone());
        a.held += e.held_s;
        a.idle += e.idle_s;
        a.ofu += e.ofu_s;
        a.delivered_tflop += e.ofu_s * e.peak_tflops;
        a.capacity_tflop += e.held_s * e.peak_tflops;
        a.energy += e.energy_j;
        a.sources.insert(e.energy_source.clone());
        if let Some(r) = rates {
            a.cost += e.held_s / 3600.0 * r.gpu_hour(&e.model).unwrap_or(0.0)
                + e.energy_j / 3.6e6 * r.kwh;
        }
    }
    groups
        .into_iter()
        .map(|(key, a)| {
            let delivered = a.delivered_tflop / 1000.0;
            Row {
                key,
                gpus: a.gpus.len(),
                gpu_hours: a.held / 3600.0,
                idle_gpu_hours: a.idle / 3600.0,
                ofu: if a.held > 0.0 { a.ofu / a.held } else { 0.0 },
                delivered_pflop: delivered,
                unused_pflop: (a.capacity_tflop - a.delivered_tflop).max(0.0) / 1000.0,
                unused_gpu_hours: (a.held - a.ofu).max(0.0) / 3600.0,
                energy_joules: a.energy,
                joules_per_pflop: (delivered > 0.0).then(|| a.energy / delivered),
                energy_source: match a.sources.len() {
                    1 => a.sources.into_iter().next().unwrap_or_default(),
                    _ => "mixed".to_string(),
                },
                cost: rates.map(|_| a.cost),
            }
        })
        .collect()
}

pub(crate) async fn run(args: ReportArgs) -> anyhow::Result<()> {
    let rates = args.rate_card.as_deref().map(RateCard::load).transpose()?;
    let now = flopwatch_proto::clock::Clock::now_ms(&flopwatch_proto::clock::SystemClock);
    let (start_ms, end_ms) = args.range.resolve(&args.since, now)?;
    let req = v1::LedgerRequest {
        start_ms,
        end_ms: if end_ms == 0 { now + 1 } else { end_ms },
        tenant: args.tenant.clone().unwrap_or_default(),
        job_id: args.job.clone().unwrap_or_default(),
    };
    #[cfg(feature = "collector")]
    let local = args.data_dir.as_deref();
    #[cfg(not(feature = "collector"))]
    let local: Option<&Path> = None;
    let (resp, partial) = match local {
        #[cfg(feature = "collector")]
        Some(dir) => (from_store(dir, &req)?, false),
        _ => {
            let mut c = args.conn.connect().await?;
            let resp = c
                .ledger(req)
                .await
                .map_err(|s| anyhow::anyhow!("{}: {}", args.conn.collector, s.message()))?;
            let partial = resp.metadata().get("x-flopwatch-partial").is_some();
            (resp.into_inner(), partial)
        }
    };
    let rows = rows(&resp.entries, args.by, rates.as_ref());
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else if args.csv {
        let mut w = csv::Writer::from_writer(std::io::stdout());
        for r in &rows {
            w.serialize(r)?;
        }
        w.flush()?;
    } else {
        print_table(&rows, rates.as_ref());
        println!(
            "{} to {} (unix ms, whole minutes); idle: held minutes with tensor activity < 1 %",
            resp.start_ms, resp.end_ms
        );
    }
    if partial {
        eprintln!("warning: some collectors of the cluster did not answer; figures are partial");
    }
    Ok(())
}

/// The ledger of a data directory, as a collector would answer `req`
/// with provider credentials.
#[cfg(feature = "collector")]
fn from_store(dir: &Path, req: &v1::LedgerRequest) -> anyhow::Result<v1::LedgerResponse> {
    use flopwatch_collector::store::{rocks::RocksEngine, Store};
    let scratch = std::env::temp_dir().join(format!("flopwatch-report-{}", std::process::id()));
    let engine = RocksEngine::open_secondary(dir, &scratch)
        .with_context(|| format!("opening {} read-only", dir.display()))?;
    let store = Store::new(std::sync::Arc::new(engine), false);
    let specs = flopwatch_config::SpecTable::builtin();
    let peak = |g: &flopwatch_collector::store::GpuRecord| {
        specs
            .lookup(&g.model)
            .and_then(|s| s.peak_tflops(flopwatch_config::Precision::Fp16))
            .unwrap_or(0.0)
    };
    let job = (!req.job_id.is_empty()).then_some(req.job_id.as_str());
    let held =
        flopwatch_collector::ledger::holdings(&store, &peak, None, job, req.start_ms, req.end_ms);
    let _ = std::fs::remove_dir_all(&scratch);
    let minute = flopwatch_collector::store::MINUTE_MS;
    Ok(v1::LedgerResponse {
        entries: held?.into_iter().map(Into::into).collect(),
        start_ms: req.start_ms.div_euclid(minute) * minute,
        end_ms: (req.end_ms + minute - 1).div_euclid(minute) * minute,
    })
}

fn print_table(rows: &[Row], rates: Option<&RateCard>) {
    let mut cols = vec![
        ("KEY", Align::Left),
        ("GPUS", Align::Right),
        ("GPU-H", Align::Right),
        ("IDLE GPU-H", Align::Right),
        ("OFU", Align::Right),
        ("DELIVERED PFLOP", Align::Right),
        ("UNUSED GPU-H", Align::Right),
        ("ENERGY kWh", Align::Right),
        ("J/PFLOP", Align::Right),
        ("ENERGY FROM", Align::Left),
    ];
    let cost = rates.map(|r| format!("COST {}", r.currency).trim().to_string());
    if let Some(c) = &cost {
        cols.push((c.as_str(), Align::Right));
    }
    let mut t = Table::new(&cols);
    for r in rows {
        let mut cells = vec![
            r.key.clone(),
            r.gpus.to_string(),
            format!("{:.2}", r.gpu_hours),
            format!("{:.2}", r.idle_gpu_hours),
            format!("{:.1}%", r.ofu * 100.0),
            format!("{:.1}", r.delivered_pflop),
            format!("{:.2}", r.unused_gpu_hours),
            format!("{:.3}", r.energy_joules / 3.6e6),
            r.joules_per_pflop
                .map_or_else(|| "-".to_string(), |j| format!("{j:.1}")),
            r.energy_source.clone(),
        ];
        if let Some(c) = r.cost {
            cells.push(format!("{c:.2}"));
        }
        t.row(cells);
    }
    t.print();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        tenant: &str,
        job: &str,
        gpu: &str,
        held: f64,
        idle: f64,
        ofu: f64,
    ) -> v1::LedgerEntry {
        v1::LedgerEntry {
            tenant: tenant.into(),
            job_id: job.into(),
            namespace: "ns".into(),
            node_id: "n1".into(),
            gpu_uuid: gpu.into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            peak_tflops: 989.4,
            held_s: held,
            idle_s: idle,
            ofu_s: ofu,
            energy_j: 700.0 * held,
            energy_source: "counter".into(),
            ..Default::default()
        }
    }

    /// Rows add their holdings' figures and derive the rest from the sums.
    #[test]
    fn rows_add_holdings_and_derive_from_the_sums() {
        let es = [
            entry("a", "train", "G1", 3600.0, 0.0, 1800.0),
            entry("a", "train", "G2", 3600.0, 600.0, 900.0),
            entry("a", "nb", "G3", 7200.0, 7200.0, 0.0),
            entry("b", "x", "G4", 1800.0, 0.0, 900.0),
        ];
        let by_job = rows(&es, By::Job, None);
        assert_eq!(
            by_job.iter().map(|r| r.key.as_str()).collect::<Vec<_>>(),
            ["a/nb", "a/train", "b/x"]
        );
        let t = &by_job[1];
        assert_eq!(t.gpus, 2);
        assert_eq!(t.gpu_hours, 2.0);
        assert!((t.idle_gpu_hours - 600.0 / 3600.0).abs() < 1e-12);
        assert!((t.ofu - 2700.0 / 7200.0).abs() < 1e-12);
        assert!((t.delivered_pflop - 2700.0 * 989.4 / 1000.0).abs() < 1e-6);
        assert!((t.unused_pflop - 4500.0 * 989.4 / 1000.0).abs() < 1e-6);
        assert!((t.unused_gpu_hours - 4500.0 / 3600.0).abs() < 1e-12);
        let j = t.joules_per_pflop.unwrap();
        assert!((j - 700.0 * 7200.0 / t.delivered_pflop).abs() < 1e-6);
        // Nothing delivered: no energy per PFLOP, the idle GPU-hours whole.
        assert_eq!(by_job[0].joules_per_pflop, None);
        assert_eq!(by_job[0].idle_gpu_hours, 2.0);
        assert_eq!(by_job[0].unused_gpu_hours, 2.0);
        let tenants = rows(&es, By::Tenant, None);
        assert_eq!(tenants.len(), 2);
        assert_eq!(tenants[0].gpu_hours, 4.0);
        let fleet = rows(&es, By::Fleet, None);
        assert_eq!(fleet.len(), 1);
        assert_eq!(fleet[0].gpus, 4);
        assert_eq!(fleet[0].gpu_hours, 4.5);
    }

    #[test]
    fn energy_sources_mix_and_a_rate_card_prices_hours_and_kwh() {
        let mut es = vec![
            entry("a", "j", "G1", 3600.0, 0.0, 1800.0),
            entry("a", "j", "G2", 3600.0, 0.0, 1800.0),
        ];
        es[1].energy_source = "power".into();
        es[1].model = "Tesla V100-SXM2-16GB".into();
        let card: RateCard = toml::from_str(
            "currency = \"EUR\"\nkwh = 0.5\n[gpu_hour]\nH100 = 2.0\n\"H100 80GB\" = 3.0\n",
        )
        .unwrap();
        let r = &rows(&es, By::Job, Some(&card))[0];
        assert_eq!(r.energy_source, "mixed");
        // G1: 1 h at the longest matching key (3.0); G2's model unpriced;
        // 2 × 2.52 MJ = 1.4 kWh at 0.5.
        let kwh = 2.0 * 700.0 * 3600.0 / 3.6e6;
        assert!((r.cost.unwrap() - (3.0 + kwh * 0.5)).abs() < 1e-9);
        assert_eq!(rows(&es, By::Job, None)[0].cost, None);
    }

    #[test]
    fn a_bad_rate_card_names_the_file_and_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("rates.toml");
        std::fs::write(&p, "kwh = 0.1\n[gpu_hour]\nH100 = -1\n").unwrap();
        let e = RateCard::load(&p).unwrap_err().to_string();
        assert!(
            e.contains("rates.toml") && e.contains("gpu_hour.H100"),
            "{e}"
        );
        std::fs::write(&p, "kwh = 0.1\nprice = 2\n").unwrap();
        let e = RateCard::load(&p).unwrap_err().to_string();
        assert!(e.contains("rates.toml") && e.contains("price"), "{e}");
    }
}
