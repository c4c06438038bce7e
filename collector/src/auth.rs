//! Credentials → tenant. Tokens are configured as SHA-256 digests, never
//! stored in clear. A sample's tenant always comes from here, never from a
//! field the client sets.

use flopwatch_config::CollectorConfig;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

/// What a query credential may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// One tenant's data.
    Tenant(String),
    /// Every tenant (provider credentials).
    All,
}

impl Scope {
    /// Whether this scope may read `tenant`.
    pub fn allows(&self, tenant: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Tenant(t) => t == tenant,
        }
    }
}

/// Failed authentication or authorization. Messages carry no data.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// No or unknown credentials.
    #[error("missing or invalid credentials")]
    Unauthenticated,
    /// Valid credentials without the right.
    #[error("permission denied")]
    Denied,
}

/// Token tables built from the config.
#[derive(Debug, Default, Clone)]
pub struct Auth {
    agent: HashMap<String, String>,
    query: HashMap<String, String>,
    admin: Vec<String>,
    anonymous: Option<String>,
}

/// SHA-256 hex of a token.
pub fn digest(token: &str) -> String {
    let d = Sha256::digest(token.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

impl Auth {
    /// From the collector config.
    pub fn from_config(c: &CollectorConfig) -> Self {
        let mut a = Auth {
            anonymous: c.anonymous_tenant.clone(),
            admin: c
                .admin_tokens_sha256
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            ..Default::default()
        };
        for t in &c.tenants {
            for h in &t.agent_tokens_sha256 {
                a.agent.insert(h.to_ascii_lowercase(), t.name.clone());
            }
            for q in &t.query_tokens {
                a.query
                    .insert(q.sha256.to_ascii_lowercase(), t.name.clone());
            }
        }
        a
    }

    /// Allows unauthenticated connections into `tenant` (demo, tests).
    pub fn anonymous(tenant: &str) -> Self {
        Auth {
            anonymous: Some(tenant.to_string()),
            ..Default::default()
        }
    }

    /// The tenant an agent writes to.
    pub fn agent(&self, token: Option<&str>) -> Result<String, AuthError> {
        match token {
            Some(t) => self
                .agent
                .get(&digest(t))
                .cloned()
                .ok_or(AuthError::Unauthenticated),
            None => self.anonymous.clone().ok_or(AuthError::Unauthenticated),
        }
    }

    /// What a query may read.
    pub fn query(&self, token: Option<&str>) -> Result<Scope, AuthError> {
        match token {
            Some(t) => {
                let d = digest(t);
                if self.admin.contains(&d) {
                    Ok(Scope::All)
                } else if let Some(tenant) = self.query.get(&d) {
                    Ok(Scope::Tenant(tenant.clone()))
                } else {
                    Err(AuthError::Unauthenticated)
                }
            }
            None => self
                .anonymous
                .clone()
                .map(Scope::Tenant)
                .ok_or(AuthError::Unauthenticated),
        }
    }
}

/// The bearer token of a request's metadata, if any.
pub fn bearer(md: &tonic::metadata::MetadataMap) -> Option<String> {
    let v = md.get("authorization")?.to_str().ok()?;
    let t = v
        .strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))?;
    (!t.is_empty()).then(|| t.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_config::{QueryToken, TenantConfig};

    #[test]
    fn tokens_map_to_their_tenant_only() {
        let cfg = CollectorConfig {
            tenants: vec![
                TenantConfig {
                    name: "acme".into(),
                    agent_tokens_sha256: vec![digest("a-secret")],
                    query_tokens: vec![QueryToken {
                        sha256: digest("a-read"),
                    }],
                },
                TenantConfig {
                    name: "beta".into(),
                    agent_tokens_sha256: vec![digest("b-secret")],
                    query_tokens: vec![],
                },
            ],
            admin_tokens_sha256: vec![digest("root")],
            ..Default::default()
        };
        let a = Auth::from_config(&cfg);
        assert_eq!(a.agent(Some("a-secret")), Ok("acme".into()));
        assert_eq!(a.agent(Some("b-secret")), Ok("beta".into()));
        assert_eq!(a.agent(Some("a-read")), Err(AuthError::Unauthenticated));
        assert_eq!(a.agent(None), Err(AuthError::Unauthenticated));
        assert_eq!(a.query(Some("a-read")), Ok(Scope::Tenant("acme".into())));
        assert_eq!(a.query(Some("root")), Ok(Scope::All));
        assert_eq!(a.query(Some("a-secret")), Err(AuthError::Unauthenticated));
        assert!(!Scope::Tenant("acme".into()).allows("beta"));
        assert_eq!(
            digest("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }
}
