//! Credentials → tenant. A sample's tenant always comes from here, never
//! from a field the client sets (docs/SECURITY.md).
//!
//! Agents authenticate with a bearer token (configured as its SHA-256
//! digest, never in clear) or a TLS client certificate matched by subject
//! or subject alternative name; queries with a tenant's read-only token or
//! a provider (admin) token that reads every tenant. Each agent credential
//! has a *principal*, the stable name of the credential that node
//! ownership is bound to ([`crate::ownership`]).

use crate::peer_cert::PeerCert;
use flopwatch_config::CollectorConfig;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Which node ids an agent credential may register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeRule {
    /// Any node not owned by another credential.
    Any,
    /// Exactly this node (a certificate name matched a `{node}` pattern).
    Exactly(String),
    /// A node id matching one of these `*` patterns.
    Patterns(Vec<String>),
}

impl NodeRule {
    /// Whether `node_id` is allowed.
    pub fn allows(&self, node_id: &str) -> bool {
        match self {
            NodeRule::Any => true,
            NodeRule::Exactly(n) => n == node_id,
            NodeRule::Patterns(ps) => ps.iter().any(|p| glob(p, node_id)),
        }
    }
}

/// Who an agent stream authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentIdentity {
    /// The tenant its samples are stored under.
    pub tenant: String,
    /// The credential's stable name: `token:<name>`, `cert:<matched name>`
    /// or `anonymous`. Nodes are owned by principals.
    pub principal: String,
    /// The node ids it may register.
    pub nodes: NodeRule,
}

/// What a connection presented.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// Bearer token, if any.
    pub token: Option<String>,
    /// The verified TLS client certificate, if any.
    pub cert: Option<PeerCert>,
}

impl Credentials {
    /// From a request: its `authorization` metadata and its connection's
    /// client certificate (already verified against `tls.client_ca` by the
    /// TLS layer).
    pub fn of<T>(r: &tonic::Request<T>) -> Self {
        Credentials {
            token: bearer(r.metadata()),
            cert: r
                .peer_certs()
                .and_then(|c| c.first().and_then(|d| PeerCert::from_der(d).ok())),
        }
    }
}

#[derive(Debug, Clone)]
struct TokenEntry {
    tenant: String,
    principal: String,
    nodes: NodeRule,
}

#[derive(Debug, Clone)]
struct CertRule {
    tenant: String,
    pattern: String,
    /// Match against the subject (CN or RFC 4514 string) or against SANs.
    subject: bool,
}

/// Credential tables built from the config. Each build gets a new
/// generation number, so sessions notice a reload.
#[derive(Debug)]
pub struct Auth {
    agent: HashMap<String, TokenEntry>,
    certs: Vec<CertRule>,
    query: HashMap<String, String>,
    admin: Vec<String>,
    anonymous: Option<String>,
    generation: u64,
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

impl Default for Auth {
    fn default() -> Self {
        Auth {
            agent: HashMap::new(),
            certs: Vec::new(),
            query: HashMap::new(),
            admin: Vec::new(),
            anonymous: None,
            generation: GENERATION.fetch_add(1, Ordering::Relaxed),
        }
    }
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
                let h = h.to_ascii_lowercase();
                let entry = TokenEntry {
                    tenant: t.name.clone(),
                    principal: format!("token:{}", &h[..12]),
                    nodes: NodeRule::Any,
                };
                a.agent.insert(h, entry);
            }
            for tok in &t.agent_tokens {
                let h = tok.sha256.to_ascii_lowercase();
                let name = tok.name.clone().unwrap_or_else(|| h[..12].to_string());
                let entry = TokenEntry {
                    tenant: t.name.clone(),
                    principal: format!("token:{name}"),
                    nodes: if tok.nodes.is_empty() {
                        NodeRule::Any
                    } else {
                        NodeRule::Patterns(tok.nodes.clone())
                    },
                };
                a.agent.insert(h, entry);
            }
            for (subject, list) in [(true, &t.agent_cert_subjects), (false, &t.agent_cert_sans)] {
                a.certs.extend(list.iter().map(|p| CertRule {
                    tenant: t.name.clone(),
                    pattern: p.clone(),
                    subject,
                }));
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

    /// This table's generation: different after every reload.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Who an agent presenting `creds` is. A token, when present, decides
    /// alone (a wrong token is refused even with a good certificate); a
    /// certificate must match exactly one tenant's patterns.
    pub fn agent(&self, creds: &Credentials) -> Result<AgentIdentity, AuthError> {
        if let Some(t) = &creds.token {
            let e = self
                .agent
                .get(&digest(t))
                .ok_or(AuthError::Unauthenticated)?;
            return Ok(AgentIdentity {
                tenant: e.tenant.clone(),
                principal: e.principal.clone(),
                nodes: e.nodes.clone(),
            });
        }
        if let Some(cert) = &creds.cert {
            return self.agent_by_cert(cert);
        }
        self.anonymous
            .as_ref()
            .map(|t| AgentIdentity {
                tenant: t.clone(),
                principal: "anonymous".into(),
                nodes: NodeRule::Any,
            })
            .ok_or(AuthError::Unauthenticated)
    }

    fn agent_by_cert(&self, cert: &PeerCert) -> Result<AgentIdentity, AuthError> {
        let mut found: Option<AgentIdentity> = None;
        for rule in &self.certs {
            let names: Vec<&str> = if rule.subject {
                cert.cn
                    .iter()
                    .map(String::as_str)
                    .chain([cert.subject.as_str()])
                    .collect()
            } else {
                cert.sans.iter().map(String::as_str).collect()
            };
            for name in names {
                let Some(node) = match_name(&rule.pattern, name) else {
                    continue;
                };
                let id = AgentIdentity {
                    tenant: rule.tenant.clone(),
                    principal: format!("cert:{name}"),
                    nodes: node.map_or(NodeRule::Any, NodeRule::Exactly),
                };
                match &found {
                    Some(f) if f.tenant != id.tenant => {
                        tracing::warn!(
                            subject = %cert.subject,
                            "client certificate matches several tenants' patterns: refused"
                        );
                        return Err(AuthError::Unauthenticated);
                    }
                    // The most specific binding wins within a tenant.
                    Some(f) if f.nodes != NodeRule::Any => {}
                    _ => found = Some(id),
                }
            }
        }
        found.ok_or(AuthError::Unauthenticated)
    }

    /// What a query presenting `creds` may read (tokens; a client
    /// certificate alone grants no query rights).
    pub fn query(&self, creds: &Credentials) -> Result<Scope, AuthError> {
        match &creds.token {
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
pub(crate) fn bearer(md: &tonic::metadata::MetadataMap) -> Option<String> {
    let v = md.get("authorization")?.to_str().ok()?;
    let t = v
        .strip_prefix("Bearer ")
        .or_else(|| v.strip_prefix("bearer "))?;
    (!t.is_empty()).then(|| t.trim().to_string())
}

/// Matches a certificate name against a pattern: `*` matches any run of
/// characters, `{node}` one or more characters that become the node id
/// the agent must use. `None`: no match; `Some(node)`: a match, binding
/// the node when the pattern has `{node}`.
pub(crate) fn match_name(pattern: &str, name: &str) -> Option<Option<String>> {
    match pattern.split_once("{node}") {
        Some((pre, post)) => {
            let node = name.strip_prefix(pre)?.strip_suffix(post)?;
            (!node.is_empty()).then(|| Some(node.to_string()))
        }
        None => glob(pattern, name).then_some(None),
    }
}

/// `*` matches any run of characters (none included); everything else
/// matches itself.
pub(crate) fn glob(pattern: &str, s: &str) -> bool {
    let (p, s) = (pattern.as_bytes(), s.as_bytes());
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use flopwatch_config::{AgentToken, QueryToken, TenantConfig};

    fn tok(t: &str) -> Credentials {
        Credentials {
            token: Some(t.into()),
            cert: None,
        }
    }

    fn cert(cn: &str, sans: &[&str]) -> Credentials {
        Credentials {
            token: None,
            cert: Some(PeerCert {
                subject: format!("CN={cn}, O=Example"),
                cn: Some(cn.into()),
                sans: sans.iter().map(|s| s.to_string()).collect(),
            }),
        }
    }

    fn config() -> CollectorConfig {
        CollectorConfig {
            tenants: vec![
                TenantConfig {
                    name: "acme".into(),
                    agent_tokens_sha256: vec![digest("a-secret")],
                    agent_tokens: vec![AgentToken {
                        sha256: digest("a-rack1"),
                        name: Some("rack1".into()),
                        nodes: vec!["r1-*".into()],
                    }],
                    agent_cert_sans: vec!["{node}.nodes.acme.example".into()],
                    query_tokens: vec![QueryToken {
                        sha256: digest("a-read"),
                    }],
                    ..Default::default()
                },
                TenantConfig {
                    name: "beta".into(),
                    agent_tokens_sha256: vec![digest("b-secret")],
                    agent_cert_subjects: vec!["beta-agent-*".into()],
                    ..Default::default()
                },
            ],
            admin_tokens_sha256: vec![digest("root")],
            ..Default::default()
        }
    }

    #[test]
    fn tokens_map_to_their_tenant_only() {
        let a = Auth::from_config(&config());
        assert_eq!(a.agent(&tok("a-secret")).unwrap().tenant, "acme");
        assert_eq!(a.agent(&tok("b-secret")).unwrap().tenant, "beta");
        assert_eq!(a.agent(&tok("a-read")), Err(AuthError::Unauthenticated));
        assert_eq!(
            a.agent(&Credentials::default()),
            Err(AuthError::Unauthenticated)
        );
        assert_eq!(a.query(&tok("a-read")), Ok(Scope::Tenant("acme".into())));
        assert_eq!(a.query(&tok("root")), Ok(Scope::All));
        assert_eq!(a.query(&tok("a-secret")), Err(AuthError::Unauthenticated));
        assert!(!Scope::Tenant("acme".into()).allows("beta"));
        assert_eq!(
            digest("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn principals_and_node_rules() {
        let a = Auth::from_config(&config());
        let plain = a.agent(&tok("a-secret")).unwrap();
        assert_eq!(
            plain.principal,
            format!("token:{}", &digest("a-secret")[..12])
        );
        assert_eq!(plain.nodes, NodeRule::Any);
        let rack = a.agent(&tok("a-rack1")).unwrap();
        assert_eq!(rack.principal, "token:rack1");
        assert!(rack.nodes.allows("r1-n07"));
        assert!(!rack.nodes.allows("r2-n07"));
    }

    #[test]
    fn certificates_match_by_san_or_subject_and_bind_nodes() {
        let a = Auth::from_config(&config());
        let id = a
            .agent(&cert("whatever", &["gpu-7.nodes.acme.example"]))
            .unwrap();
        assert_eq!(id.tenant, "acme");
        assert_eq!(id.nodes, NodeRule::Exactly("gpu-7".into()));
        assert_eq!(id.principal, "cert:gpu-7.nodes.acme.example");
        let b = a.agent(&cert("beta-agent-3", &[])).unwrap();
        assert_eq!(b.tenant, "beta");
        assert_eq!(b.nodes, NodeRule::Any);
        assert_eq!(
            a.agent(&cert("nobody", &["x.nodes.other.example"])),
            Err(AuthError::Unauthenticated)
        );
        // A certificate never grants query rights.
        assert_eq!(
            a.query(&cert("beta-agent-3", &[])),
            Err(AuthError::Unauthenticated)
        );
        // A wrong token is refused even with a good certificate.
        let mut both = cert("beta-agent-3", &[]);
        both.token = Some("wrong".into());
        assert_eq!(a.agent(&both), Err(AuthError::Unauthenticated));
    }

    #[test]
    fn a_certificate_matching_two_tenants_is_refused() {
        let mut c = config();
        c.tenants[0].agent_cert_subjects = vec!["shared-*".into()];
        c.tenants[1].agent_cert_subjects = vec!["shared-*".into()];
        let a = Auth::from_config(&c);
        assert_eq!(
            a.agent(&cert("shared-1", &[])),
            Err(AuthError::Unauthenticated)
        );
    }

    #[test]
    fn patterns() {
        assert_eq!(
            match_name("{node}.n.example", "a.b.n.example"),
            Some(Some("a.b".into()))
        );
        assert_eq!(match_name("{node}.n.example", ".n.example"), None);
        assert_eq!(
            match_name("spiffe://acme/node/{node}", "spiffe://acme/node/g1"),
            Some(Some("g1".into()))
        );
        assert_eq!(match_name("*.acme.example", "x.acme.example"), Some(None));
        assert_eq!(match_name("*.acme.example", "x.acme.example.evil"), None);
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(glob("*", ""));
        assert!(!glob("a*b", "a"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
    }

    #[test]
    fn each_build_has_a_new_generation() {
        let c = config();
        assert_ne!(
            Auth::from_config(&c).generation(),
            Auth::from_config(&c).generation()
        );
    }
}
