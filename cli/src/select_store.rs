//! `flopwatch select --store DIR`: metric selection over a collector's
//! store, opened read-only as a RocksDB secondary so a running collector is
//! undisturbed. A workload is one job on one GPU (`job/gpu`): redundancy
//! between counters is a property of what a GPU runs, and per-GPU series
//! keep the samples aligned as they were taken. A node device (an
//! InfiniBand port, a NUMA node, the host; docs/COUNTERS.md) is a workload
//! of its own per job on its node (`job/device`), over the job's time
//! there: its counters are pruned among themselves the same way.

use crate::select_args::SelectArgs;
use anyhow::Context;
use flopwatch_collector::store::{rocks::RocksEngine, Store};
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::metrics::CATALOG;
use flopwatch_selector::Row;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) fn run(args: &SelectArgs) -> anyhow::Result<()> {
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
    let mut push = |tenant: &str, workload: String, series: &str, from: i64, to: i64| {
        for m in CATALOG {
            for p in store.series(tenant, series, m.name, from, to, usize::MAX)? {
                rows.push(Row {
                    workload: workload.clone(),
                    metric: m.name.to_string(),
                    timestamp_ms: p.ts_ms,
                    value: p.value,
                });
            }
        }
        anyhow::Ok(())
    };
    // Each job's time on each node, for the node's devices.
    let mut on_node: BTreeMap<(String, String, String), (i64, i64)> = BTreeMap::new();
    for (tenant, j) in &jobs {
        let from = since.max(j.first_seen_ms);
        let to = until.min(j.last_seen_ms + 1);
        if from >= to {
            continue;
        }
        push(
            tenant,
            format!("{}/{}", j.job_id, j.gpu_uuid),
            &j.gpu_uuid,
            from,
            to,
        )?;
        let span = on_node
            .entry((tenant.clone(), j.job_id.clone(), j.node_id.clone()))
            .or_insert((from, to));
        *span = (span.0.min(from), span.1.max(to));
    }
    let nodes: BTreeMap<(String, String), Vec<String>> = store
        .nodes(None)?
        .into_iter()
        .map(|(t, n)| {
            (
                (t, n.node_id),
                n.devices.into_iter().map(|d| d.id).collect(),
            )
        })
        .collect();
    for ((tenant, job, node), (from, to)) in on_node {
        for device in nodes.get(&(tenant.clone(), node)).into_iter().flatten() {
            push(&tenant, format!("{job}/{device}"), device, from, to)?;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let options = args.options()?;
    let bar = flopwatch_selector::progress_bar(!args.no_progress);
    let selection = flopwatch_selector::select(rows, &options, &bar)?;
    bar.finish_and_clear();
    flopwatch_selector::finish(&args.outputs(), &selection)?;
    Ok(())
}
