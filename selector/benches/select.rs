//! 300 metrics × 4 workloads × 36,000 points (the selector target: ≤ 10 s).
//!
//! `cargo bench -p flopwatch-selector` — data generation is outside the
//! measured loop; one iteration is a full `select_samples` (alignment,
//! variance, pairwise distances, clustering, representatives).

use criterion::{criterion_group, criterion_main, Criterion};
use flopwatch_selector::{select_samples, synth, ProgressBar, SelectOptions};

fn select_300x4x36000(c: &mut Criterion) {
    let mut set = synth::fleet_like(300, 4, 36_000, 1);
    let options = SelectOptions::default();
    let mut group = c.benchmark_group("select");
    group.sample_size(10);
    group.measurement_time(std::time::Duration::from_secs(10));
    group.bench_function("300_metrics_4_workloads_36000_points", |b| {
        b.iter(|| select_samples(&mut set, &options, &ProgressBar::hidden()).expect("selection"))
    });
    group.finish();
}

criterion_group!(benches, select_300x4x36000);
criterion_main!(benches);
