//! How long each tenant's data is kept.

use flopwatch_proto::clock::Clock;
use std::collections::HashMap;
use std::sync::Arc;

/// How long each tenant's data is kept, against an injected clock.
#[derive(Clone)]
pub struct Retention {
    /// Retention of tenants without their own, ms.
    pub default_ms: i64,
    /// Per-tenant retention, ms.
    pub tenants: HashMap<String, i64>,
    /// Now.
    pub clock: Arc<dyn Clock>,
}

impl Retention {
    /// From `retention` and `tenant_retention` of the config file.
    pub fn from_config(c: &flopwatch_config::CollectorConfig, clock: Arc<dyn Clock>) -> Self {
        let ms = |d: std::time::Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        Self {
            default_ms: ms(c.retention),
            tenants: c
                .tenant_retention
                .iter()
                .map(|(t, r)| (t.clone(), ms(r.retention)))
                .collect(),
            clock,
        }
    }

    /// The oldest timestamp of `tenant` still kept.
    pub fn cutoff(&self, tenant: &str) -> i64 {
        let keep = self.tenants.get(tenant).copied().unwrap_or(self.default_ms);
        self.clock.now_ms().saturating_sub(keep)
    }
}
