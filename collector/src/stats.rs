//! The collector's own counters (exported on `/metrics` by
//! [`crate::exporter`]; read directly by the demo).

use crate::auth::AuthError;
use crate::validate::Reason;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Counters, all monotonic except `agents_connected`.
#[derive(Debug)]
pub struct Stats {
    /// Samples stored.
    pub samples_accepted: AtomicU64,
    /// Batches acknowledged (duplicates included).
    pub batches_acked: AtomicU64,
    /// Batches acknowledged as replays of stored ones.
    pub batches_duplicate: AtomicU64,
    /// Batches refused as a whole.
    pub batches_rejected: AtomicU64,
    /// OFU samples derived.
    pub ofu_samples: AtomicU64,
    /// Agents with an open stream.
    pub agents_connected: AtomicI64,
    rejected: [AtomicU64; Reason::ALL.len()],
    /// Sum of commit latencies, µs (with `batches_committed`, a mean).
    pub commit_micros: AtomicU64,
    /// Batches committed to storage.
    pub batches_committed: AtomicU64,
    /// Storage writes that carried them (a group commit carries several,
    /// `crate::group`).
    pub commit_writes: AtomicU64,
    /// Seconds from a batch's arrival to its acknowledgement.
    pub ack_latency: Histogram,
    /// Samples pushed to the remote-write endpoint.
    pub remote_write_samples: AtomicU64,
    /// Remote-write requests that failed, by reason
    /// ([`Failure::ALL`] order).
    remote_write_failures: [AtomicU64; Failure::ALL.len()],
    /// Samples dropped because the remote-write queue was full.
    pub remote_write_dropped: AtomicU64,
    /// Samples dropped because the remote-write endpoint refused them (4xx
    /// other than 429; never retried).
    pub remote_write_refused: AtomicU64,
    /// Samples dropped because they were older than `max_age` when their
    /// turn came.
    pub remote_write_expired: AtomicU64,
    /// Samples dropped by validation and limits, by tenant and reason.
    by_tenant: Mutex<BTreeMap<(String, Reason), u64>>,
    /// Batches refused as a whole, by tenant and reason.
    batch_rejects: Mutex<BTreeMap<(String, String), u64>>,
    /// Failed authentications and authorizations, by service and kind.
    auth_failures: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// XID errors agents reported, by (tenant, GPU UUID).
    xids: Mutex<BTreeMap<(String, String), Xid>>,
    /// Prometheus API queries evaluated (answered or stopped).
    pub queries: AtomicU64,
    /// Prometheus API queries evaluating now.
    pub queries_running: AtomicI64,
    /// Prometheus API queries waiting for a turn now.
    pub queries_queued: AtomicI64,
    /// Prometheus API queries refused or stopped by a limit, by (tenant,
    /// limit); the tenant `*` is a provider's query over every tenant.
    query_limits: Mutex<BTreeMap<(String, &'static str), u64>>,
}

/// The XID errors of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Xid {
    /// Reported so far.
    pub count: u64,
    /// The last one's code.
    pub last: i64,
}

impl Default for Stats {
    fn default() -> Self {
        Self {
            samples_accepted: AtomicU64::new(0),
            batches_acked: AtomicU64::new(0),
            batches_duplicate: AtomicU64::new(0),
            batches_rejected: AtomicU64::new(0),
            ofu_samples: AtomicU64::new(0),
            agents_connected: AtomicI64::new(0),
            rejected: Default::default(),
            commit_micros: AtomicU64::new(0),
            batches_committed: AtomicU64::new(0),
            commit_writes: AtomicU64::new(0),
            // 100 µs … ~3.3 s.
            ack_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            remote_write_samples: AtomicU64::new(0),
            remote_write_failures: Default::default(),
            remote_write_dropped: AtomicU64::new(0),
            remote_write_refused: AtomicU64::new(0),
            remote_write_expired: AtomicU64::new(0),
            by_tenant: Mutex::default(),
            batch_rejects: Mutex::default(),
            auth_failures: Mutex::default(),
            xids: Mutex::default(),
            queries: AtomicU64::new(0),
            queries_running: AtomicI64::new(0),
            queries_queued: AtomicI64::new(0),
            query_limits: Mutex::default(),
        }
    }
}

impl Stats {
    /// Counts samples of `tenant` dropped for `reason`.
    pub fn reject(&self, tenant: &str, reason: Reason, n: u64) {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.rejected[i].fetch_add(n, Ordering::Relaxed);
        if let Ok(mut m) = self.by_tenant.lock() {
            *m.entry((tenant.to_string(), reason)).or_default() += n;
        }
    }

    /// Samples dropped per (tenant, reason) so far.
    pub fn rejected_by_tenant(&self) -> Vec<((String, Reason), u64)> {
        self.by_tenant
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    /// Counts a batch of `tenant` refused as a whole for `reason`.
    pub fn batch_rejected(&self, tenant: &str, reason: &str) {
        self.batches_rejected.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = self.batch_rejects.lock() {
            *m.entry((tenant.to_string(), reason.to_string()))
                .or_default() += 1;
        }
    }

    /// Batches refused per (tenant, reason) so far.
    pub fn batch_rejects(&self) -> Vec<((String, String), u64)> {
        self.batch_rejects
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    /// Counts a refused credential on `service` (`ingest`, `query`,
    /// `metrics`).
    pub fn auth_failure(&self, service: &'static str, e: &AuthError) {
        let kind = match e {
            AuthError::Unauthenticated => "unauthenticated",
            AuthError::Denied => "permission_denied",
        };
        if let Ok(mut m) = self.auth_failures.lock() {
            *m.entry((service, kind)).or_default() += 1;
        }
    }

    /// Refused credentials per (service, kind) so far.
    pub fn auth_failures(&self) -> Vec<((&'static str, &'static str), u64)> {
        self.auth_failures
            .lock()
            .map(|m| m.iter().map(|(k, v)| (*k, *v)).collect())
            .unwrap_or_default()
    }

    /// Counts an XID error an agent reported on a GPU.
    pub fn xid(&self, tenant: &str, gpu_uuid: &str, code: i64) {
        if let Ok(mut m) = self.xids.lock() {
            let x = m
                .entry((tenant.to_string(), gpu_uuid.to_string()))
                .or_default();
            x.count += 1;
            x.last = code;
        }
    }

    /// XID errors per (tenant, GPU UUID) so far.
    pub fn xids(&self) -> BTreeMap<(String, String), Xid> {
        self.xids.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Counts a query of `tenant` refused or stopped by `limit`.
    pub fn query_limited(&self, tenant: &str, limit: &'static str) {
        if let Ok(mut m) = self.query_limits.lock() {
            *m.entry((tenant.to_string(), limit)).or_default() += 1;
        }
    }

    /// Queries refused or stopped per (tenant, limit) so far.
    pub fn query_limits(&self) -> Vec<((String, &'static str), u64)> {
        self.query_limits
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    /// Counts a failed remote-write request.
    pub fn remote_write_failure(&self, reason: Failure) {
        self.remote_write_failures[reason.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Remote-write requests that failed for `reason` so far.
    pub fn remote_write_failures(&self, reason: Failure) -> u64 {
        self.remote_write_failures[reason.index()].load(Ordering::Relaxed)
    }

    /// Samples dropped for `reason` so far.
    pub fn rejected(&self, reason: Reason) -> u64 {
        let i = Reason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.rejected[i].load(Ordering::Relaxed)
    }

    /// Shorthand for a relaxed load.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// Why a remote-write request failed: the `reason` label of
/// `flopwatch_remote_write_failures_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No answer: connection refused, TLS handshake, timeout (retried).
    Connection,
    /// 5xx (retried).
    ServerError,
    /// 429 Too Many Requests (retried).
    TooManyRequests,
    /// Another 4xx: the endpoint will never take the batch, which is
    /// dropped (not retried).
    ClientError,
    /// `bearer_token_file` or `password_file` could not be read; no request
    /// was sent (retried).
    Credentials,
}

impl Failure {
    /// Every reason, in the order of [`Stats`]'s counters.
    pub const ALL: [Failure; 5] = [
        Failure::Connection,
        Failure::ServerError,
        Failure::TooManyRequests,
        Failure::ClientError,
        Failure::Credentials,
    ];

    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Failure::Connection => "connection",
            Failure::ServerError => "5xx",
            Failure::TooManyRequests => "429",
            Failure::ClientError => "4xx",
            Failure::Credentials => "credentials",
        }
    }

    /// Position in [`Failure::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}
