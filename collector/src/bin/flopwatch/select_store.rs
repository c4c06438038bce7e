//! `flopwatch select --store DIR`: metric selection over a collector's
//! store, opened read-only as a RocksDB secondary so a running collector is
//! undisturbed. A workload is one job on one GPU (`job/gpu`): redundancy
//! between counters is a property of what a GPU runs, and per-GPU series
//! keep the samples aligned as they were taken.

use anyhow::Context;
use flopwatch_collector::store::{rocks::RocksEngine, Store};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::metrics::CATALOG;
use flopwatch_selector::{Row, SelectArgs};
use std::sync::Arc;

pub fn run(args: &SelectArgs) -> anyhow::Result<()> {
    let dir = args.store.as_ref().context("--store is required")?;
    let now = SystemClock.now_ms();
    let since = match &args.since {
        Some(s) => now - crate::parse_ms(s).context("--since")?,
        None => 0,
    };
    let until = match &args.until {
        Some(s) => now - crate::parse_ms(s).context("--until")?,
        None => now + 1,
    };
    let scratch = std::env::temp_dir().join(format!("flopwatch-select-{}", std::process::id()));
    let engine = RocksEngine::open_secondary(dir, &scratch)
        .with_context(|| format!("opening {} read-only", dir.display()))?;
    let store = Store::new(Arc::new(engine), false);
    let mut rows = Vec::new();
    let jobs = store.jobs(None)?;
    if jobs.is_empty() {
        anyhow::bail!(
            "{}: no jobs recorded; nothing to select from",
            dir.display()
        );
    }
    for (tenant, j) in &jobs {
        let from = since.max(j.first_seen_ms);
        let to = until.min(j.last_seen_ms + 1);
        if from >= to {
            continue;
        }
        let workload = format!("{}/{}", j.job_id, j.gpu_uuid);
        for m in CATALOG {
            for p in store.series(tenant, &j.gpu_uuid, m.name, from, to, usize::MAX)? {
                rows.push(Row {
                    workload: workload.clone(),
                    metric: m.name.to_string(),
                    timestamp_ms: p.ts_ms,
                    value: p.value,
                });
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let options = args.options()?;
    let bar = flopwatch_selector::progress_bar(!args.no_progress);
    let selection = flopwatch_selector::select(rows, &options, &bar)?;
    bar.finish_and_clear();
    flopwatch_selector::finish(args, &selection)?;
    Ok(())
}
