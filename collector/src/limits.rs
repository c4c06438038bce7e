//! Per-tenant ingest limits: a token bucket on samples per second, a cap
//! on active series, and a cap on the tenant's storage writes at once
//! (docs/SECURITY.md, "Limits").
//!
//! The commit cap is what keeps tenants from delaying each other: storage
//! takes writes one group at a time, so a tenant with a thousand streams
//! would otherwise put a thousand writes ahead of everyone else's. With at
//! most `max_concurrent_commits` of its writes past the gate (each carrying
//! the tenant's waiting batches up to a sample cap, `crate::group`), another
//! tenant's batch waits behind at most that many of them, however hard the
//! first one floods. Past the tenant's gate, a batch also takes one of
//! [`COMMITS`] slots shared by every tenant: each commit occupies a
//! blocking thread until storage returns, and with a slow disk unbounded
//! concurrency would grow threads (and their memory) with the number of
//! agents. A Hello's registration write waits in a line of its own, as
//! many slots per tenant ([`Limiter::registration_slot`]), so connecting
//! agents do not queue behind the tenant's batches. Time is passed in
//! (`now_ms`), so tests are exact.

use flopwatch_config::{CollectorConfig, Limits};
use flopwatch_proto::model::Batch;
use foldhash::fast::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Batches and Hellos validated and committed at once over all tenants.
pub(crate) const COMMITS: usize = 32;

/// A series counts as active this long after its last sample.
pub(crate) const SERIES_ACTIVE_MS: i64 = 3_600_000;

/// How often a stream tells the tenant's shared set that a series it
/// already counted is still sending ([`StreamSeries`]).
pub(crate) const SERIES_REFRESH_MS: i64 = 60_000;

/// Each tenant's limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LimitTable {
    default: Limits,
    tenants: HashMap<String, Limits>,
}

impl LimitTable {
    /// From `[limits]` and each tenant's `[tenants.limits]`.
    pub fn from_config(c: &CollectorConfig) -> Self {
        LimitTable {
            default: c.limits.clone(),
            tenants: c
                .tenants
                .iter()
                .map(|t| (t.name.clone(), c.limits.with(&t.limits)))
                .collect(),
        }
    }

    /// No limits but the default commit cap.
    pub fn unlimited() -> Self {
        LimitTable::default()
    }

    /// `tenant`'s limits.
    pub fn get(&self, tenant: &str) -> &Limits {
        self.tenants.get(tenant).unwrap_or(&self.default)
    }
}

/// A refused batch: try again after this many milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(pub u64);

#[derive(Debug, Default)]
struct Bucket {
    tokens: f64,
    last_ms: Option<i64>,
}

#[derive(Debug, Default)]
struct SeriesSet {
    last_seen: HashMap<u64, i64, RandomState>,
    last_sweep_ms: Option<i64>,
}

/// One stream's memory of the series it has counted in its tenant's
/// shared set, and when it last told the set each was still sending. A
/// batch whose series were all told within [`SERIES_REFRESH_MS`] passes
/// without the tenant's lock or a lookup in the tenant-wide set (hundreds
/// of thousands of entries in a large fleet): an agent sends the same
/// series batch after batch. The active-series count is an hour's, so a
/// minute's delay in refreshing it changes nothing; a series new to the
/// stream, or one it has not sent for a minute, always goes to the set
/// (and its cap).
#[derive(Debug, Default)]
pub struct StreamSeries {
    told_ms: HashMap<u64, i64, RandomState>,
}

#[derive(Debug)]
struct TenantState {
    bucket: Mutex<Bucket>,
    series: Mutex<SeriesSet>,
    commits: Arc<Semaphore>,
    /// The same number of slots for Hellos, so an agent registering never
    /// waits behind the tenant's queued batches (its own cannot be sent
    /// before it is welcomed).
    registrations: Arc<Semaphore>,
    permits: Mutex<u32>,
}

/// The limits' state, per tenant, shared by every stream.
#[derive(Debug)]
pub struct Limiter {
    table: RwLock<LimitTable>,
    tenants: Mutex<HashMap<String, Arc<TenantState>>>,
    hasher: RandomState,
    /// [`COMMITS`] slots over all tenants.
    global: Arc<Semaphore>,
}

/// The right to validate and commit one batch: one of its tenant's slots
/// and one of the collector's. Dropping it frees both.
#[derive(Debug)]
pub struct CommitSlot {
    _tenant: OwnedSemaphorePermit,
    _global: OwnedSemaphorePermit,
}

/// A tenant's commit slots and the collector's ([`Limiter::commit_gate`]).
#[derive(Debug, Clone)]
pub(crate) struct CommitGate {
    own: Arc<Semaphore>,
    global: Arc<Semaphore>,
}

impl CommitGate {
    /// Waits for one of the tenant's slots, then one of the collector's.
    pub(crate) async fn acquire(&self) -> Option<CommitSlot> {
        let own = self.own.clone().acquire_owned().await.ok()?;
        let global = self.global.clone().acquire_owned().await.ok()?;
        Some(CommitSlot {
            _tenant: own,
            _global: global,
        })
    }
}

impl Limiter {
    /// Enforces `table`.
    pub fn new(table: LimitTable) -> Self {
        Limiter {
            table: RwLock::new(table),
            tenants: Mutex::new(HashMap::new()),
            hasher: RandomState::default(),
            global: Arc::new(Semaphore::new(COMMITS)),
        }
    }

    /// Replaces the limits (a config reload); counts and buckets carry on.
    pub fn reload(&self, table: LimitTable) {
        if let Ok(mut t) = self.table.write() {
            *t = table;
        }
        let states: Vec<(String, Arc<TenantState>)> = self
            .tenants
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default();
        for (tenant, st) in states {
            let want = self.limits(&tenant).max_concurrent_commits.max(1);
            st.resize(want);
        }
    }

    /// `tenant`'s current limits.
    pub fn limits(&self, tenant: &str) -> Limits {
        self.table
            .read()
            .map(|t| t.get(tenant).clone())
            .unwrap_or_default()
    }

    fn state(&self, tenant: &str) -> Arc<TenantState> {
        let permits = self.limits(tenant).max_concurrent_commits.max(1);
        let mut m = self.tenants.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(tenant.to_string())
            .or_insert_with(|| {
                Arc::new(TenantState {
                    bucket: Mutex::default(),
                    series: Mutex::default(),
                    commits: Arc::new(Semaphore::new(permits as usize)),
                    registrations: Arc::new(Semaphore::new(permits as usize)),
                    permits: Mutex::new(permits),
                })
            })
            .clone()
    }

    /// Takes `samples` from `tenant`'s rate budget, or says how long to
    /// wait. A batch larger than the whole bucket passes when the bucket is
    /// full (and leaves it in debt), so no batch is refused forever.
    pub fn admit(&self, tenant: &str, samples: u64, now_ms: i64) -> Result<(), RetryAfter> {
        let l = self.limits(tenant);
        if l.ingest_rate == 0 {
            return Ok(());
        }
        let rate = l.ingest_rate as f64;
        let cap = if l.ingest_burst > 0 {
            l.ingest_burst as f64
        } else {
            rate
        };
        let st = self.state(tenant);
        let mut b = st.bucket.lock().unwrap_or_else(|e| e.into_inner());
        match b.last_ms {
            None => b.tokens = cap,
            Some(last) => {
                let dt = (now_ms - last).max(0) as f64 / 1000.0;
                b.tokens = (b.tokens + dt * rate).min(cap);
            }
        }
        b.last_ms = Some(now_ms);
        let need = (samples as f64).min(cap);
        if b.tokens >= need {
            b.tokens -= samples as f64;
            Ok(())
        } else {
            let wait_ms = ((need - b.tokens) / rate * 1000.0).ceil().max(1.0);
            Err(RetryAfter(wait_ms as u64))
        }
    }

    /// Drops the samples of series beyond `tenant`'s active-series cap from
    /// `batch` (known series always pass); returns how many were dropped.
    /// `stream` is the sending stream's [`StreamSeries`].
    pub fn series(
        &self,
        tenant: &str,
        batch: &mut Batch,
        now_ms: i64,
        stream: &mut StreamSeries,
    ) -> u64 {
        let keys: Vec<u64> = batch
            .series
            .iter()
            .map(|s| self.hasher.hash_one((&s.gpu_uuid, &s.metric)))
            .collect();
        let fresh = keys.iter().all(|k| {
            stream
                .told_ms
                .get(k)
                .is_some_and(|&t| (0..SERIES_REFRESH_MS).contains(&(now_ms - t)))
        });
        if fresh {
            return 0;
        }
        let max = self.limits(tenant).max_series;
        let st = self.state(tenant);
        let mut set = st.series.lock().unwrap_or_else(|e| e.into_inner());
        set.sweep(now_ms);
        stream.told_ms.retain(|_, t| now_ms - *t < SERIES_ACTIVE_MS);
        let mut dropped = 0u64;
        let mut keys = keys.into_iter();
        batch.series.retain(|s| {
            let Some(key) = keys.next() else {
                return true;
            };
            if let Some(seen) = set.last_seen.get_mut(&key) {
                *seen = now_ms;
                stream.told_ms.insert(key, now_ms);
                return true;
            }
            if max > 0 && set.last_seen.len() as u64 >= max {
                dropped += s.points.len() as u64;
                return false;
            }
            set.last_seen.insert(key, now_ms);
            stream.told_ms.insert(key, now_ms);
            true
        });
        dropped
    }

    /// `tenant`'s active series.
    pub fn active_series(&self, tenant: &str, now_ms: i64) -> u64 {
        let st = self.state(tenant);
        let set = st.series.lock().unwrap_or_else(|e| e.into_inner());
        set.last_seen
            .values()
            .filter(|&&t| now_ms - t < SERIES_ACTIVE_MS)
            .count() as u64
    }

    /// Tenants seen so far.
    pub fn tenants(&self) -> Vec<String> {
        self.tenants
            .lock()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Waits for one of `tenant`'s commit slots, then for one of the
    /// collector's: a flooding tenant holds at most its own cap of the
    /// shared ones.
    pub async fn commit_slot(&self, tenant: &str) -> Option<CommitSlot> {
        let own = self.state(tenant).commits.clone();
        self.slot(own).await
    }

    /// The slot a Hello's registration write takes: one of `tenant`'s
    /// registration slots (as many as its commit slots, but a separate
    /// line, so a Hello does not queue behind the tenant's batches), then
    /// one of the collector's shared ones.
    pub async fn registration_slot(&self, tenant: &str) -> Option<CommitSlot> {
        let own = self.state(tenant).registrations.clone();
        self.slot(own).await
    }

    /// `tenant`'s commit slots and the collector's, to wait on without
    /// the limiter ([`crate::group`]'s task).
    pub(crate) fn commit_gate(&self, tenant: &str) -> CommitGate {
        CommitGate {
            own: self.state(tenant).commits.clone(),
            global: self.global.clone(),
        }
    }

    async fn slot(&self, own: Arc<Semaphore>) -> Option<CommitSlot> {
        CommitGate {
            own,
            global: self.global.clone(),
        }
        .acquire()
        .await
    }
}

impl SeriesSet {
    /// Forgets series idle for [`SERIES_ACTIVE_MS`]; at most once a minute,
    /// so the set holds the last hour's series whatever the cap.
    fn sweep(&mut self, now_ms: i64) {
        if self.last_sweep_ms.is_some_and(|t| now_ms - t < 60_000) {
            return;
        }
        self.last_sweep_ms = Some(now_ms);
        self.last_seen
            .retain(|_, &mut t| now_ms - t < SERIES_ACTIVE_MS);
    }
}

impl TenantState {
    fn resize(&self, want: u32) {
        let mut have = self.permits.lock().unwrap_or_else(|e| e.into_inner());
        for slots in [&self.commits, &self.registrations] {
            if want > *have {
                slots.add_permits((want - *have) as usize);
            } else if want < *have {
                slots.forget_permits((*have - want) as usize);
            }
        }
        *have = want;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_config::{LimitsOverride, TenantConfig};
    use flopwatch_proto::model::{Point, SeriesBatch};

    fn table(rate: u64, burst: u64, series: u64) -> LimitTable {
        let c = CollectorConfig {
            tenants: vec![TenantConfig {
                name: "acme".into(),
                limits: LimitsOverride {
                    ingest_rate: Some(rate),
                    ingest_burst: Some(burst),
                    max_series: Some(series),
                    ..Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        LimitTable::from_config(&c)
    }

    #[test]
    fn the_bucket_refills_at_the_rate_and_says_how_long_to_wait() {
        let l = Limiter::new(table(1000, 2000, 0));
        assert_eq!(l.admit("acme", 1500, 0), Ok(()));
        // 500 left: 800 more need 300 tokens = 300 ms.
        assert_eq!(l.admit("acme", 800, 0), Err(RetryAfter(300)));
        assert_eq!(l.admit("acme", 800, 299), Err(RetryAfter(1)));
        assert_eq!(l.admit("acme", 800, 300), Ok(()));
        // Other tenants have the (unlimited) default.
        assert_eq!(l.admit("beta", 1_000_000_000, 300), Ok(()));
    }

    #[test]
    fn a_batch_larger_than_the_bucket_passes_when_it_is_full() {
        let l = Limiter::new(table(1000, 1000, 0));
        assert_eq!(l.admit("acme", 5000, 0), Ok(()));
        // 4000 in debt, then 1000 needed: 5 s.
        assert_eq!(l.admit("acme", 5000, 0), Err(RetryAfter(5000)));
        assert_eq!(l.admit("acme", 5000, 5000), Ok(()));
    }

    fn batch(series: &[(&str, &str)]) -> Batch {
        Batch {
            seq: 1,
            series: series
                .iter()
                .map(|(g, m)| SeriesBatch {
                    gpu_uuid: g.to_string(),
                    metric: m.to_string(),
                    points: vec![Point::new(1, 1.0), Point::new(2, 1.0)],
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn series_past_the_cap_are_dropped_and_known_ones_pass() {
        let l = Limiter::new(table(0, 0, 2));
        let mut s = StreamSeries::default();
        let mut b = batch(&[("g1", "a"), ("g1", "b"), ("g1", "c")]);
        assert_eq!(l.series("acme", &mut b, 0, &mut s), 2);
        assert_eq!(b.series.len(), 2);
        let mut again = batch(&[("g1", "b"), ("g2", "a"), ("g1", "a")]);
        assert_eq!(l.series("acme", &mut again, 1000, &mut s), 2);
        let kept: Vec<_> = again
            .series
            .iter()
            .map(|s| s.gpu_uuid.clone() + &s.metric)
            .collect();
        assert_eq!(kept, vec!["g1b", "g1a"]);
        assert_eq!(l.active_series("acme", 1000), 2);
        // An hour later the old series are idle and make room.
        let mut later = batch(&[("g2", "a")]);
        let t = 1000 + SERIES_ACTIVE_MS + 1;
        assert_eq!(l.series("acme", &mut later, t, &mut s), 0);
        assert_eq!(l.active_series("acme", t), 1);
    }

    #[test]
    fn a_stream_that_sends_the_same_series_skips_the_set_but_keeps_them_active() {
        let l = Limiter::new(table(0, 0, 2));
        let (mut one, mut two) = (StreamSeries::default(), StreamSeries::default());
        let mut t = 0;
        // Two hours of a batch every 20 s: the series stay active (each is
        // told to the shared set at least once a minute)...
        while t <= 2 * SERIES_ACTIVE_MS {
            let mut b = batch(&[("g1", "a"), ("g1", "b")]);
            assert_eq!(l.series("acme", &mut b, t, &mut one), 0);
            assert_eq!(l.active_series("acme", t), 2, "at {t} ms");
            t += 20_000;
        }
        // ...so they still hold the cap: a third series is refused, from
        // another stream and from this one alongside its known series.
        let mut other = batch(&[("g2", "a")]);
        assert_eq!(l.series("acme", &mut other, t, &mut two), 2);
        let mut more = batch(&[("g1", "a"), ("g1", "b"), ("g1", "c")]);
        assert_eq!(l.series("acme", &mut more, t, &mut one), 2);
        assert_eq!(more.series.len(), 2);
        // The stream goes quiet for an hour; its series then make room.
        t += SERIES_ACTIVE_MS + 60_000;
        let mut back = batch(&[("g2", "a")]);
        assert_eq!(l.series("acme", &mut back, t, &mut two), 0);
        assert_eq!(l.active_series("acme", t), 1);
    }

    #[tokio::test]
    async fn commit_slots_follow_reloads() {
        let l = Limiter::new(table(0, 0, 0));
        let a = l.commit_slot("acme").await.unwrap();
        let b = l.commit_slot("acme").await.unwrap();
        // The default is two slots: the third waits.
        let third =
            tokio::time::timeout(std::time::Duration::from_millis(20), l.commit_slot("acme"));
        assert!(third.await.is_err());
        let mut c = CollectorConfig::default();
        c.limits.max_concurrent_commits = 3;
        l.reload(LimitTable::from_config(&c));
        let third =
            tokio::time::timeout(std::time::Duration::from_millis(20), l.commit_slot("acme"));
        assert!(third.await.is_ok());
        drop((a, b));
    }

    #[tokio::test]
    async fn hellos_do_not_queue_behind_batches() {
        let l = Limiter::new(LimitTable::default());
        let wait = std::time::Duration::from_millis(20);
        let held = [
            l.commit_slot("acme").await.unwrap(),
            l.commit_slot("acme").await.unwrap(),
        ];
        assert!(tokio::time::timeout(wait, l.commit_slot("acme"))
            .await
            .is_err());
        let r1 = tokio::time::timeout(wait, l.registration_slot("acme"))
            .await
            .expect("a Hello while every commit slot is taken");
        let r2 = l.registration_slot("acme").await;
        // ... but Hellos have their own cap.
        assert!(tokio::time::timeout(wait, l.registration_slot("acme"))
            .await
            .is_err());
        drop((held, r1, r2));
    }
}
