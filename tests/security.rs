//! Tenants and security end to end (docs/SECURITY.md), over TLS with
//! optional client certificates: three tenants, every RPC, every kind of
//! credential — none, malformed, another tenant's, an agent's for queries,
//! a certificate alone for queries, one removed by a reload, a client
//! certificate from a wrong CA, no client certificate where one is
//! required — and not one byte of another tenant's data in any answer
//! (its node ids, hostnames, GPU UUIDs, job ids, tenant name and sample
//! values are searched for in every encoded response and every error).

use flopwatch_collector::server::{self, Serving};
use flopwatch_collector::Collector;
use flopwatch_collector::LimitTable;
use flopwatch_collector::{digest, Auth};
use flopwatch_config::{
    AgentToken, ClientTls, CollectorConfig, QueryToken, ServerTls, SpecTable, TenantConfig,
};
use flopwatch_proto::clock::Deadline;
use flopwatch_proto::clock::{Clock, SystemClock};
use flopwatch_proto::v1::{
    self, cluster_client::ClusterClient, collector_message, ofu_request, query_client::QueryClient,
};
use flopwatch_tests::pki::{CertFiles, Pki};
use flopwatch_tests::raw::{self, RawAgent};
use flopwatch_transport::channel::TlsClient;
use prost::Message;
use std::path::Path;
use std::sync::Arc;
use tonic::transport::Channel;
use tonic::Code;

/// One call's answer: the reply's bytes or its status.
type Reply = Result<Vec<u8>, tonic::Status>;

/// One tenant and the strings and values only its data contains.
struct Tenant {
    name: &'static str,
    agent_token: String,
    query_token: String,
    node: String,
    host: String,
    gpu: String,
    job: String,
    power: f64,
}

impl Tenant {
    fn new(name: &'static str, tag: &str, power: f64) -> Self {
        Tenant {
            name,
            agent_token: format!("agent-secret-{tag}"),
            query_token: format!("query-secret-{tag}"),
            node: format!("node-{tag}-q7x"),
            host: format!("host-{tag}-k2m"),
            gpu: format!("GPU-{tag}-5e1c-99ab"),
            job: format!("job-{tag}-77w"),
            power,
        }
    }

    /// Every byte string that would reveal this tenant's data.
    fn markers(&self) -> Vec<(String, Vec<u8>)> {
        let mut m: Vec<(String, Vec<u8>)> =
            [self.name, &self.node, &self.host, &self.gpu, &self.job]
                .iter()
                .map(|s| (s.to_string(), s.as_bytes().to_vec()))
                .collect();
        m.push((
            format!("power {}", self.power),
            self.power.to_le_bytes().to_vec(),
        ));
        m
    }
}

fn tenants() -> Vec<Tenant> {
    vec![
        Tenant::new("tenant-alpha", "alpha", 301.123456789),
        Tenant::new("tenant-bravo", "bravo", 302.987654321),
        Tenant::new("tenant-charlie", "charlie", 303.192837465),
    ]
}

/// Names of foreign markers found in `bytes`.
fn leaks(bytes: &[u8], others: &[&Tenant]) -> Vec<String> {
    let mut found = Vec::new();
    for t in others {
        for (name, m) in t.markers() {
            if bytes.windows(m.len()).any(|w| w == m.as_slice()) {
                found.push(format!("{} ({name})", t.name));
            }
        }
    }
    found
}

/// Everything a client gets back from a failed call.
fn status_bytes(s: &tonic::Status) -> Vec<u8> {
    let mut b = s.message().as_bytes().to_vec();
    b.extend_from_slice(s.details());
    for kv in s.metadata().iter() {
        if let tonic::metadata::KeyAndValueRef::Ascii(k, v) = kv {
            b.extend_from_slice(k.as_str().as_bytes());
            b.extend_from_slice(v.as_bytes());
        }
    }
    b
}

const ADMIN: &str = "provider-root-token";
const ALPHA_SECOND: &str = "alpha-second-agent-token";
const ALPHA_REMOVABLE_QUERY: &str = "alpha-query-to-be-removed";
const ALPHA_REMOVABLE_AGENT: &str = "alpha-agent-to-be-removed";

fn config(dir: &Path, ts: &[Tenant], tls: ServerTls, removable: bool) -> CollectorConfig {
    let mut tenants: Vec<TenantConfig> = ts
        .iter()
        .map(|t| TenantConfig {
            name: t.name.into(),
            agent_tokens_sha256: if t.name == "tenant-charlie" {
                Vec::new()
            } else {
                vec![digest(&t.agent_token)]
            },
            agent_cert_sans: if t.name == "tenant-charlie" {
                vec!["{node}.charlie.example".into()]
            } else {
                Vec::new()
            },
            query_tokens: vec![QueryToken {
                sha256: digest(&t.query_token),
            }],
            ..Default::default()
        })
        .collect();
    tenants[0].agent_tokens.push(AgentToken {
        sha256: digest(ALPHA_SECOND),
        name: Some("second".into()),
        nodes: Vec::new(),
    });
    if removable {
        tenants[0].query_tokens.push(QueryToken {
            sha256: digest(ALPHA_REMOVABLE_QUERY),
        });
        tenants[0].agent_tokens.push(AgentToken {
            sha256: digest(ALPHA_REMOVABLE_AGENT),
            name: Some("removable".into()),
            nodes: Vec::new(),
        });
    }
    CollectorConfig {
        data_dir: dir.join("data"),
        tenants,
        admin_tokens_sha256: vec![digest(ADMIN)],
        tls: Some(tls),
        // Three tenants of one GPU each: a tenant's page lists its GPU,
        // the provider's (three GPUs) is bounded.
        exporter: flopwatch_config::ExporterConfig {
            max_gpus: 2,
            ..Default::default()
        },
        ..Default::default()
    }
}

struct Env {
    collector: Arc<Collector>,
    server: server::Loopback,
    good: Pki,
    bad: Pki,
    tenants: Vec<Tenant>,
    cfg: CollectorConfig,
}

impl Env {
    async fn start(dir: &Path, require_client_cert: bool) -> Env {
        let good = Pki::new(&dir.join("pki-good"), "good");
        let bad = Pki::new(&dir.join("pki-bad"), "bad");
        let server_files = good.server("collector");
        let tls = ServerTls {
            cert: server_files.cert.clone(),
            key: server_files.key.clone(),
            client_ca: Some(good.ca_file()),
            require_client_cert,
        };
        let ts = tenants();
        let cfg = config(dir, &ts, tls.clone(), true);
        let collector = server::open(
            &cfg.data_dir,
            &cfg,
            SpecTable::builtin(),
            Auth::from_config(&cfg),
            Vec::new(),
            Arc::new(SystemClock),
        )
        .unwrap();
        let serving = Serving {
            tls: Some(flopwatch_collector::server_config(&tls, Path::new("")).unwrap()),
            metrics_tls: Some(flopwatch_collector::metrics_config(&tls, Path::new("")).unwrap()),
            ..Default::default()
        };
        let server = server::Loopback::start_serving(collector.clone(), serving)
            .await
            .unwrap();
        assert!(server.url.starts_with("https://"), "{}", server.url);
        assert!(
            server.metrics_url.starts_with("https://"),
            "{}",
            server.metrics_url
        );
        Env {
            collector,
            server,
            good,
            bad,
            tenants: ts,
            cfg,
        }
    }

    /// A TLS channel trusting `ca`, presenting `cert` when given; `Err`
    /// when the connection (handshake included) fails.
    async fn channel(&self, ca: &Path, cert: Option<&CertFiles>) -> Result<Channel, String> {
        let tls = TlsClient::load(
            &ClientTls {
                ca: Some(ca.to_path_buf()),
                cert: cert.map(|c| c.cert.clone()),
                key: cert.map(|c| c.key.clone()),
                domain: None,
            },
            Path::new(""),
            "tls",
        )
        .unwrap();
        tls.client_endpoint(&self.server.url)
            .unwrap()
            .connect()
            .await
            .map_err(|e| e.to_string())
    }

    async fn good_channel(&self) -> Channel {
        self.channel(&self.good.ca_file(), None).await.unwrap()
    }

    fn charlie_cert(&self, node: &str) -> CertFiles {
        self.good.client(
            &format!("charlie-{node}"),
            "charlie agent",
            &[&format!("{node}.charlie.example")],
        )
    }
}

/// How a query call presents itself.
#[derive(Clone)]
enum Header {
    None,
    Raw(&'static str),
    Bearer(String),
}

fn with_header<T>(msg: T, h: &Header) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    let v = match h {
        Header::None => None,
        Header::Raw(s) => Some(s.to_string()),
        Header::Bearer(t) => Some(format!("Bearer {t}")),
    };
    if let Some(v) = v {
        if let Ok(v) = v.parse() {
            r.metadata_mut().insert("authorization", v);
        }
    }
    r
}

/// Every Query RPC, aimed at `target`'s objects: (name, encoded answer or
/// the error).
async fn every_query(
    ch: Channel,
    h: &Header,
    target: &Tenant,
) -> Vec<(String, Result<Vec<u8>, tonic::Status>)> {
    let mut q = QueryClient::new(ch.clone());
    let now = SystemClock.now_ms();
    let ofu = |scope: Option<ofu_request::Scope>, step: i64| v1::OfuRequest {
        start_ms: now - 3_600_000,
        end_ms: now + 1000,
        step_ms: step,
        scope,
    };
    let mut out = Vec::new();
    let scopes = [
        (
            "Ofu gpu",
            Some(ofu_request::Scope::GpuUuid(target.gpu.clone())),
        ),
        (
            "Ofu node",
            Some(ofu_request::Scope::NodeId(target.node.clone())),
        ),
        (
            "Ofu job",
            Some(ofu_request::Scope::JobId(target.job.clone())),
        ),
        (
            "Ofu tenant",
            Some(ofu_request::Scope::Tenant(target.name.into())),
        ),
        ("Ofu fleet", None),
    ];
    for (name, scope) in scopes {
        let r = q.ofu(with_header(ofu(scope, 60_000), h)).await;
        out.push((name.to_string(), r.map(|r| r.into_inner().encode_to_vec())));
    }
    let series = v1::SeriesRequest {
        gpu_uuid: target.gpu.clone(),
        metric: "power_w".into(),
        start_ms: now - 3_600_000,
        end_ms: now + 1000,
        limit: 0,
    };
    let r = q.series(with_header(series, h)).await;
    out.push(("Series".into(), r.map(|r| r.into_inner().encode_to_vec())));
    let list = || v1::ListRequest { since_ms: 0 };
    let r = q.list_nodes(with_header(list(), h)).await;
    out.push((
        "ListNodes".into(),
        r.map(|r| r.into_inner().encode_to_vec()),
    ));
    let r = q.list_gpus(with_header(list(), h)).await;
    out.push(("ListGpus".into(), r.map(|r| r.into_inner().encode_to_vec())));
    let r = q.list_jobs(with_header(list(), h)).await;
    out.push(("ListJobs".into(), r.map(|r| r.into_inner().encode_to_vec())));
    let events = v1::EventsRequest {
        start_ms: 0,
        end_ms: 0,
        kind: String::new(),
        job_id: target.job.clone(),
        limit: 0,
    };
    let r = q.list_events(with_header(events, h)).await;
    out.push((
        "ListEvents".into(),
        r.map(|r| r.into_inner().encode_to_vec()),
    ));
    let ledger = |tenant: &str, job: &str| v1::LedgerRequest {
        start_ms: now - 3_600_000,
        end_ms: now + 1000,
        tenant: tenant.into(),
        job_id: job.into(),
    };
    for (name, req) in [
        ("Ledger", ledger("", "")),
        ("Ledger tenant", ledger(target.name, "")),
        ("Ledger job", ledger("", &target.job)),
    ] {
        let r = q.ledger(with_header(req, h)).await;
        out.push((name.to_string(), r.map(|r| r.into_inner().encode_to_vec())));
    }
    // The Cluster service on the same port: whether this collector holds
    // the target's first batch (provider credentials only).
    let mut c = ClusterClient::new(ch);
    let held = v1::HeldRequest {
        batches: vec![v1::BatchRef {
            tenant: target.name.into(),
            agent_id: target.node.clone(),
            boot_id: "boot-1".into(),
            seq: 1,
        }],
    };
    let r = c.held(with_header(held, h)).await;
    out.push(("Held".into(), r.map(|r| r.into_inner().encode_to_vec())));
    out
}

/// RPCs that only the provider's credential may call.
fn provider_only(rpc: &str) -> bool {
    rpc == "Held"
}

/// Seeds each tenant with one node, GPU, job and 20 samples per metric.
async fn seed(env: &Env) {
    let now = SystemClock.now_ms();
    for t in &env.tenants {
        let (ch, token) = if t.name == "tenant-charlie" {
            let cert = env.charlie_cert(&t.node);
            let ch = env.channel(&env.good.ca_file(), Some(&cert)).await.unwrap();
            (ch, None)
        } else {
            (env.good_channel().await, Some(t.agent_token.as_str()))
        };
        let (mut a, w) = RawAgent::open(ch, token, raw::hello(&t.node, &t.host, &t.gpu))
            .await
            .unwrap_or_else(|s| panic!("{}: {s:?}", t.name));
        assert_eq!(w.tenant, t.name);
        let reply = a
            .call(raw::batch(
                1,
                &t.gpu,
                now - 5000,
                20,
                0.5,
                t.power,
                Some(&t.job),
            ))
            .await
            .unwrap();
        let collector_message::Msg::Ack(ack) = reply else {
            panic!("{}: {reply:?}", t.name)
        };
        assert_eq!(ack.accepted_samples, 60, "{}", t.name);
    }
}

fn others<'a>(ts: &'a [Tenant], me: &Tenant) -> Vec<&'a Tenant> {
    ts.iter().filter(|t| t.name != me.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_byte_crosses_tenants_for_any_rpc_or_credential() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::start(dir.path(), false).await;
    seed(&env).await;
    let ts = &env.tenants;
    let checked = std::cell::Cell::new(0usize);
    // Checks answers to calls by `caller` (None: no valid credential)
    // aimed at `target`'s objects: no byte of any tenant but the caller's
    // own, then `expect` on each result.
    let check = |caller: Option<&Tenant>,
                 target: &Tenant,
                 calls: &[(String, Reply)],
                 expect: &dyn Fn(&str, &Reply)| {
        let forbidden: Vec<&Tenant> = ts
            .iter()
            .filter(|t| caller.is_none_or(|c| c.name != t.name))
            .collect();
        for (rpc, r) in calls {
            let bytes = match r {
                Ok(b) => b.clone(),
                Err(s) => status_bytes(s),
            };
            let found = leaks(&bytes, &forbidden);
            assert!(
                found.is_empty(),
                "{:?} → {rpc} on {}: leaked {found:?}",
                caller.map(|c| c.name),
                target.name
            );
            expect(rpc, r);
            checked.set(checked.get() + 1);
        }
    };
    let code = |want: Code| {
        move |rpc: &str, r: &Result<Vec<u8>, tonic::Status>| match r {
            Err(s) => assert_eq!(s.code(), want, "{rpc}: {s:?}"),
            Ok(_) => panic!("{rpc}: answered, expected {want:?}"),
        }
    };

    for target in ts {
        let ch = env.good_channel().await;
        // Own query token: answers, and they hold the tenant's own data.
        let own = every_query(
            ch.clone(),
            &Header::Bearer(target.query_token.clone()),
            target,
        )
        .await;
        let own_nodes = own
            .iter()
            .find(|(n, _)| n == "ListNodes")
            .unwrap()
            .1
            .as_ref()
            .unwrap();
        assert!(
            leaks(own_nodes, &[target])
                .iter()
                .any(|l| l.contains(&target.node)),
            "own data missing"
        );
        let ledger = own
            .iter()
            .find(|(n, _)| n == "Ledger")
            .unwrap()
            .1
            .as_ref()
            .unwrap();
        assert!(
            leaks(ledger, &[target])
                .iter()
                .any(|l| l.contains(&target.job)),
            "own ledger missing"
        );
        let series = own
            .iter()
            .find(|(n, _)| n == "Series")
            .unwrap()
            .1
            .as_ref()
            .unwrap();
        assert!(
            leaks(series, &[target]).iter().any(|l| l.contains("power")),
            "own samples missing"
        );
        check(Some(target), target, &own, &|rpc, r| {
            if provider_only(rpc) {
                assert_eq!(
                    r.as_ref().err().map(|s| s.code()),
                    Some(Code::PermissionDenied),
                    "{rpc}: {r:?}"
                );
            } else {
                assert!(r.is_ok(), "{rpc}: {r:?}")
            }
        });

        // Another tenant's query token, aimed at this tenant's objects.
        for other in others(ts, target) {
            let calls = every_query(
                ch.clone(),
                &Header::Bearer(other.query_token.clone()),
                target,
            )
            .await;
            check(Some(other), target, &calls, &|rpc, r| {
                let scoped = rpc.starts_with("Ofu ") && rpc != "Ofu fleet"
                    || rpc == "Series"
                    || rpc == "Ledger tenant";
                if provider_only(rpc) {
                    assert_eq!(
                        r.as_ref().err().map(|s| s.code()),
                        Some(Code::PermissionDenied),
                        "{rpc}: {r:?}"
                    );
                } else if scoped {
                    assert_eq!(
                        r.as_ref().err().map(|s| s.code()),
                        Some(Code::NotFound),
                        "{rpc}: {r:?}"
                    );
                } else {
                    assert!(r.is_ok(), "{rpc}: {r:?}");
                }
            });
        }
        // No credentials, malformed ones, an agent token, a token of
        // another kind: UNAUTHENTICATED everywhere.
        let unauth = [
            Header::None,
            Header::Raw("Bearer"),
            Header::Raw("Bearer "),
            Header::Raw("Basic dXNlcjpwYXNz"),
            Header::Raw("bearer-token-without-scheme"),
            Header::Bearer("definitely-not-a-token".into()),
            Header::Bearer(format!("{} ", target.query_token.to_uppercase())),
            Header::Bearer(digest(&target.query_token)),
            Header::Bearer(target.agent_token.clone()),
        ];
        for h in &unauth {
            let calls = every_query(ch.clone(), h, target).await;
            check(None, target, &calls, &code(Code::Unauthenticated));
        }
        // A client certificate alone grants no query rights.
        let cert = env.charlie_cert(&ts[2].node);
        let cert_ch = env.channel(&env.good.ca_file(), Some(&cert)).await.unwrap();
        let calls = every_query(cert_ch, &Header::None, target).await;
        check(None, target, &calls, &code(Code::Unauthenticated));
        // A client certificate from a CA the collector does not trust:
        // nothing gets through the handshake.
        let stray = env.bad.client(
            "stray",
            "charlie agent",
            &[&format!("{}.charlie.example", ts[2].node)],
        );
        match env.channel(&env.bad.ca_file(), Some(&stray)).await {
            // The server's certificate is not from the bad CA either.
            Err(_) => {}
            Ok(c) => panic!("connected with the wrong CA: {c:?}"),
        }
        match env.channel(&env.good.ca_file(), Some(&stray)).await {
            Err(_) => checked.set(checked.get() + 1),
            Ok(c) => {
                let calls =
                    every_query(c, &Header::Bearer(target.query_token.clone()), target).await;
                for (rpc, r) in &calls {
                    let s = r.as_ref().expect_err(&format!(
                        "{rpc}: a certificate from a wrong CA was accepted"
                    ));
                    assert!(leaks(&status_bytes(s), &[&ts[0], &ts[1], &ts[2]]).is_empty());
                    checked.set(checked.get() + 1);
                }
            }
        }
    }
    // The provider reads every tenant.
    let ch = env.good_channel().await;
    let calls = every_query(ch.clone(), &Header::Bearer(ADMIN.into()), &ts[0]).await;
    let nodes = calls
        .iter()
        .find(|(n, _)| n == "ListNodes")
        .unwrap()
        .1
        .as_ref()
        .unwrap();
    for t in ts {
        assert!(!leaks(nodes, &[t]).is_empty(), "provider misses {}", t.name);
    }
    // ... and may ask what this collector holds: tenant-alpha's batch 1.
    let held = calls.iter().find(|(n, _)| n == "Held").unwrap().1.as_ref();
    let held = v1::HeldResponse::decode(held.unwrap().as_slice()).unwrap();
    assert_eq!(held.holdings, vec![v1::Holding::Held as i32]);

    // A removed query token stops working at once.
    let removable = Header::Bearer(ALPHA_REMOVABLE_QUERY.into());
    let before = every_query(ch.clone(), &removable, &ts[0]).await;
    assert!(before
        .iter()
        .all(|(rpc, r)| r.is_ok() || provider_only(rpc)));
    let cfg = config(dir.path(), ts, env.cfg.tls.clone().unwrap(), false);
    env.collector
        .reload(Auth::from_config(&cfg), LimitTable::from_config(&cfg));
    let after = every_query(ch.clone(), &removable, &ts[0]).await;
    check(None, &ts[0], &after, &code(Code::Unauthenticated));
    // 3 tenants × (own + 2 others + 9 bad + cert-only) × 14 RPCs, and more.
    let checked = checked.get();
    assert!(checked >= 3 * 13 * 14, "{checked} checks");
}

/// A `/metrics` scrape over TLS presenting `h`: the status and the page.
async fn scrape(env: &Env, h: &Header) -> (u16, String) {
    scrape_with(env, h, "").await
}

/// [`scrape`] of `/metrics{query}`.
async fn scrape_with(env: &Env, h: &Header, query: &str) -> (u16, String) {
    let ca = std::fs::read(env.good.ca_file()).unwrap();
    let http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let mut req = http.get(format!("{}{query}", env.server.metrics_url));
    match h {
        Header::None => {}
        Header::Raw(v) => req = req.header("authorization", *v),
        Header::Bearer(t) => req = req.bearer_auth(t),
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

/// What of `t` a `/metrics` page shows: its markers, and its power reading
/// as the page writes it.
fn page_leaks(page: &str, ts: &[&Tenant]) -> Vec<String> {
    let mut found = leaks(page.as_bytes(), ts);
    for t in ts {
        if page.contains(&t.power.to_string()) {
            found.push(format!("{} (power as text)", t.name));
        }
    }
    found
}

/// The collector's `/metrics` is scoped like the query API: a tenant's
/// query token sees its own GPUs and nothing of another tenant, the
/// provider's sees every tenant, no token sees the collector's health and
/// no GPU series, and a bad token is refused; all over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_page_shows_each_token_only_its_tenants_series() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::start(dir.path(), false).await;
    seed(&env).await;
    let ts = &env.tenants;
    // An XID error on tenant-alpha's GPU: counted on its GPU's series.
    let alpha = &ts[0];
    let (mut a, _) = RawAgent::open(
        env.good_channel().await,
        Some(alpha.agent_token.as_str()),
        raw::hello(&alpha.node, &alpha.host, &alpha.gpu),
    )
    .await
    .unwrap();
    let mut batch = raw::batch(
        2,
        &alpha.gpu,
        SystemClock.now_ms() - 2000,
        5,
        0.5,
        alpha.power,
        Some(&alpha.job),
    );
    batch.events.push(v1::Event {
        gpu_uuid: alpha.gpu.clone(),
        kind: "xid".into(),
        timestamp_ms: SystemClock.now_ms() - 1000,
        code: 79,
        detail: "GPU has fallen off the bus".into(),
    });
    let reply = a.call(batch).await.unwrap();
    assert!(matches!(reply, collector_message::Msg::Ack(_)), "{reply:?}");
    for me in ts {
        let (status, page) = scrape(&env, &Header::Bearer(me.query_token.clone())).await;
        let xid = page
            .lines()
            .find(|l| l.starts_with("flopwatch_gpu_xid_errors_total{"))
            .unwrap_or_else(|| panic!("{page}"));
        let want = if me.name == alpha.name { 1 } else { 0 };
        assert!(xid.ends_with(&format!(" {want}")), "{}: {xid}", me.name);
        assert_eq!(status, 200, "{page}");
        let own = page
            .lines()
            .find(|l| l.starts_with("flopwatch_gpu_power_watts{"))
            .unwrap_or_else(|| panic!("{}: no power family:\n{page}", me.name));
        assert!(own.contains(&me.gpu) && own.contains(&me.host), "{own}");
        assert!(page.contains(&me.power.to_string()), "own reading missing");
        let found = page_leaks(&page, &others(ts, me));
        assert!(found.is_empty(), "{} sees {found:?}", me.name);
    }
    // The provider's scope holds three GPUs, more than `max_gpus`: its
    // default page keeps node and job figures, leaves the GPU families
    // off and says so; `gpus=all` lists every tenant's GPUs.
    let (status, page) = scrape(&env, &Header::Bearer(ADMIN.into())).await;
    assert_eq!(status, 200);
    let omitted = |page: &str| -> f64 {
        page.lines()
            .find_map(|l| l.strip_prefix("flopwatch_exporter_gpus_omitted"))
            .and_then(|v| v.trim_start_matches("{}").trim().parse().ok())
            .unwrap_or_else(|| panic!("no omitted count:\n{page}"))
    };
    assert_eq!(omitted(&page), 3.0);
    assert!(!page.contains("flopwatch_gpu_power_watts{"), "{page}");
    for t in ts {
        assert!(
            page.lines()
                .any(|l| l.starts_with("flopwatch_node_ofu_ratio{") && l.contains(&t.node)),
            "provider's bounded page misses {}'s node",
            t.name
        );
    }
    let (status, page) = scrape_with(&env, &Header::Bearer(ADMIN.into()), "?gpus=all").await;
    assert_eq!(status, 200);
    assert_eq!(omitted(&page), 0.0);
    for t in ts {
        assert!(
            page.lines()
                .any(|l| l.starts_with("flopwatch_gpu_power_watts{") && l.contains(&t.gpu)),
            "provider misses {}",
            t.name
        );
    }
    // `tenant=` narrows a scrape: the provider asking for alpha gets
    // alpha's GPU (one: under the bound) and no one else's ...
    let (_, page) = scrape_with(
        &env,
        &Header::Bearer(ADMIN.into()),
        &format!("?tenant={}", ts[0].name),
    )
    .await;
    assert!(page.contains(&ts[0].gpu), "{page}");
    assert!(page_leaks(&page, &others(ts, &ts[0])).is_empty(), "{page}");
    // ... and a tenant asking for another gets nothing of either.
    let (status, page) = scrape_with(
        &env,
        &Header::Bearer(ts[0].query_token.clone()),
        &format!("?tenant={}&gpus=all", ts[1].name),
    )
    .await;
    assert_eq!(status, 200);
    let all: Vec<&Tenant> = ts.iter().collect();
    assert!(page_leaks(&page, &all).is_empty(), "{page}");
    // No token: the collector's own health, no GPU series, no tenant.
    let (status, page) = scrape(&env, &Header::None).await;
    assert_eq!(status, 200);
    assert!(page.contains("flopwatch_agents_connected "), "{page}");
    assert!(page.contains("flopwatch_build_info{"), "{page}");
    assert!(
        !page.contains("flopwatch_gpu_") && !page.contains("flopwatch_ofu_ratio"),
        "{page}"
    );
    let all: Vec<&Tenant> = ts.iter().collect();
    assert!(page_leaks(&page, &all).is_empty(), "{page}");
    // Bad credentials of every kind: 401, and nothing in the answer.
    let bad = [
        Header::Raw("Bearer"),
        Header::Raw("Bearer "),
        Header::Raw("Basic dXNlcjpwYXNz"),
        Header::Raw("bearer-token-without-scheme"),
        Header::Bearer("definitely-not-a-token".into()),
        Header::Bearer(ts[0].query_token.to_uppercase()),
        Header::Bearer(digest(&ts[0].query_token)),
        Header::Bearer(ts[0].agent_token.clone()),
    ];
    for h in &bad {
        let (status, page) = scrape(&env, h).await;
        assert_eq!(status, 401, "{page}");
        assert!(page_leaks(&page, &all).is_empty(), "{page}");
    }
    // ... each counted on the provider's page.
    let (_, page) = scrape(&env, &Header::Bearer(ADMIN.into())).await;
    let refused = page
        .lines()
        .find(|l| {
            l.starts_with("flopwatch_auth_failures_total{")
                && l.contains("service=\"metrics\"")
                && l.contains("kind=\"unauthenticated\"")
        })
        .unwrap_or_else(|| panic!("{page}"));
    assert!(refused.ends_with(&format!(" {}", bad.len())), "{refused}");
    // The page is TLS only: plain HTTP to it gets no page.
    let plain = env.server.metrics_url.replacen("https://", "http://", 1);
    let got = reqwest::get(&plain).await;
    assert!(
        got.as_ref().map_or(true, |r| !r.status().is_success()),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_write_only_their_tenant_and_their_own_nodes() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::start(dir.path(), false).await;
    seed(&env).await;
    let ts = &env.tenants;
    let (alpha, bravo, charlie) = (&ts[0], &ts[1], &ts[2]);
    let now = SystemClock.now_ms();
    let open = |ch: Channel, token: Option<String>, hello: v1::Hello| async move {
        RawAgent::open(ch, token.as_deref(), hello).await
    };
    let refused =
        |r: Result<(RawAgent, v1::Welcome), tonic::Status>, want: Code, what: &str| match r {
            Ok((_, w)) => panic!("{what}: welcomed into {}", w.tenant),
            Err(s) => {
                assert_eq!(s.code(), want, "{what}: {s:?}");
                assert!(
                    leaks(&status_bytes(&s), &[alpha, bravo, charlie]).is_empty(),
                    "{what}: {s:?}"
                );
            }
        };
    for t in ts {
        let h = || raw::hello(&t.node, &t.host, &t.gpu);
        // No credentials, malformed ones, a query token.
        refused(
            open(env.good_channel().await, None, h()).await,
            Code::Unauthenticated,
            "no credentials",
        );
        for bad in ["x", "Bearer", &digest(&t.agent_token), &t.query_token] {
            refused(
                open(env.good_channel().await, Some(bad.into()), h()).await,
                Code::Unauthenticated,
                "bad token",
            );
        }
        // A certificate from an untrusted CA does not get through TLS.
        let stray = env.bad.client(
            &format!("stray-{}", t.name),
            "x",
            &[&format!("{}.charlie.example", t.node)],
        );
        if let Ok(ch) = env.channel(&env.good.ca_file(), Some(&stray)).await {
            // The handshake completed on the client's side only: the
            // collector refuses the certificate and closes the connection.
            match open(ch, None, h()).await {
                Ok((_, w)) => panic!("wrong CA: welcomed into {}", w.tenant),
                Err(s) => {
                    assert!(
                        matches!(
                            s.code(),
                            Code::Unavailable | Code::Cancelled | Code::Unknown
                        ),
                        "wrong CA: {s:?}"
                    );
                    assert!(leaks(&status_bytes(&s), &[alpha, bravo, charlie]).is_empty());
                }
            }
        }
    }
    // Another tenant's agent credential claiming alpha's node and GPU:
    // the credential decides the tenant, so whatever it writes lands in
    // bravo's own namespace and alpha's data do not change.
    let (mut b, w) = open(
        env.good_channel().await,
        Some(bravo.agent_token.clone()),
        raw::hello(&alpha.node, &alpha.host, &alpha.gpu),
    )
    .await
    .unwrap();
    assert_eq!(w.tenant, bravo.name);
    let reply = b
        .call(raw::batch(
            1,
            &alpha.gpu,
            now - 4000,
            5,
            0.9,
            999.0,
            Some(&alpha.job),
        ))
        .await
        .unwrap();
    assert!(matches!(reply, collector_message::Msg::Ack(_)), "{reply:?}");
    // A second principal of alpha cannot take alpha's node, nor register
    // alpha's GPU under a new node.
    refused(
        open(
            env.good_channel().await,
            Some(ALPHA_SECOND.into()),
            raw::hello(&alpha.node, "other-host", "GPU-new"),
        )
        .await,
        Code::PermissionDenied,
        "second principal, same node",
    );
    refused(
        open(
            env.good_channel().await,
            Some(ALPHA_SECOND.into()),
            raw::hello("node-alpha-new", "h", &alpha.gpu),
        )
        .await,
        Code::PermissionDenied,
        "second principal, same GPU",
    );
    // ... but may register a node of its own.
    let (_second, w) = open(
        env.good_channel().await,
        Some(ALPHA_SECOND.into()),
        raw::hello("node-alpha-second", "h2", "GPU-alpha-second"),
    )
    .await
    .unwrap();
    assert_eq!(w.tenant, alpha.name);
    // The first principal comes back to its node: welcome.
    let (_again, w) = open(
        env.good_channel().await,
        Some(alpha.agent_token.clone()),
        raw::hello(&alpha.node, &alpha.host, &alpha.gpu),
    )
    .await
    .unwrap();
    assert_eq!(w.tenant, alpha.name);
    // Two principals racing for a new node, and for a new GPU under two
    // new nodes: in each race, only one principal is ever welcomed.
    let races = [
        [("node-race", "GPU-race-1"), ("node-race", "GPU-race-2")],
        [("node-race-a", "GPU-race-3"), ("node-race-b", "GPU-race-3")],
    ];
    for [(node_1, gpu_1), (node_2, gpu_2)] in races {
        let tries = (0..8).map(|i| {
            let (token, node, gpu) = if i % 2 == 0 {
                (alpha.agent_token.clone(), node_1, gpu_1)
            } else {
                (ALPHA_SECOND.to_string(), node_2, gpu_2)
            };
            let ch = env.good_channel();
            async move {
                let r = open(ch.await, Some(token), raw::hello(node, "h", gpu)).await;
                (i % 2, r.map(|_| ()).map_err(|s| s.code()))
            }
        });
        let results = futures::future::join_all(tries).await;
        let winners: std::collections::BTreeSet<_> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(who, _)| *who)
            .collect();
        assert_eq!(winners.len(), 1, "{node_1}/{node_2}: {results:?}");
        for (who, r) in &results {
            if !winners.contains(who) {
                assert_eq!(r.as_ref().err(), Some(&Code::PermissionDenied));
            }
        }
    }
    // A certificate bound to one node ({node} pattern) cannot announce
    // another, nor a device of another node.
    let cert = env.charlie_cert(&charlie.node);
    let ch = env.channel(&env.good.ca_file(), Some(&cert)).await.unwrap();
    refused(
        open(
            ch.clone(),
            None,
            raw::hello("node-charlie-other", "h", "GPU-c2"),
        )
        .await,
        Code::PermissionDenied,
        "certificate for another node",
    );
    let mut hello = raw::hello(&charlie.node, &charlie.host, &charlie.gpu);
    hello.devices.push(v1::DeviceInfo {
        id: "host@node-charlie-other".into(),
        kind: "host".into(),
        name: "h".into(),
    });
    refused(
        open(ch.clone(), None, hello).await,
        Code::InvalidArgument,
        "device of another node",
    );
    // Without a certificate or token, charlie (certificates only) is out.
    refused(
        open(
            env.good_channel().await,
            None,
            raw::hello(&charlie.node, &charlie.host, &charlie.gpu),
        )
        .await,
        Code::Unauthenticated,
        "no client certificate",
    );
    // A batch naming another agent is refused, the stream goes on.
    let (mut a, _) = open(
        ch,
        None,
        raw::hello(&charlie.node, &charlie.host, &charlie.gpu),
    )
    .await
    .unwrap();
    let mut spoof = raw::batch(2, &charlie.gpu, now - 3000, 3, 0.5, charlie.power, None);
    spoof.agent_id = alpha.node.clone();
    match a.call(spoof).await.unwrap() {
        collector_message::Msg::Reject(r) => assert_eq!(
            (r.code, r.reason.as_str()),
            (Code::PermissionDenied as i32, "identity_mismatch")
        ),
        m => panic!("{m:?}"),
    }
    // Samples for a GPU outside the stream's Hello are dropped.
    match a
        .call(raw::batch(3, &alpha.gpu, now - 2000, 3, 0.5, 1.0, None))
        .await
        .unwrap()
    {
        collector_message::Msg::Ack(ack) => {
            assert_eq!(ack.accepted_samples, 0);
            assert_eq!(ack.rejected[0].reason, "unknown_gpu");
        }
        m => panic!("{m:?}"),
    }

    // A stream whose token is removed by a reload ends at its next batch.
    let (mut r, _) = open(
        env.good_channel().await,
        Some(ALPHA_REMOVABLE_AGENT.into()),
        raw::hello("node-alpha-r", "hr", "GPU-alpha-r"),
    )
    .await
    .unwrap();
    assert!(matches!(
        r.call(raw::batch(1, "GPU-alpha-r", now - 1000, 2, 0.5, 1.0, None))
            .await
            .unwrap(),
        collector_message::Msg::Ack(_)
    ));
    let cfg = config(dir.path(), ts, env.cfg.tls.clone().unwrap(), false);
    env.collector
        .reload(Auth::from_config(&cfg), LimitTable::from_config(&cfg));
    let s = r
        .call(raw::batch(2, "GPU-alpha-r", now - 800, 2, 0.5, 1.0, None))
        .await
        .unwrap_err();
    assert_eq!(s.code(), Code::Unauthenticated, "{s:?}");

    // Every tenant's data are exactly what it wrote itself.
    let ch = env.good_channel().await;
    for t in ts {
        let mut q = QueryClient::new(ch.clone());
        let s = q
            .series(with_header(
                v1::SeriesRequest {
                    gpu_uuid: t.gpu.clone(),
                    metric: "power_w".into(),
                    start_ms: 0,
                    end_ms: 0,
                    limit: 0,
                },
                &Header::Bearer(t.query_token.clone()),
            ))
            .await
            .unwrap()
            .into_inner()
            .series
            .unwrap();
        assert_eq!(s.values.len(), 20, "{}", t.name);
        assert!(
            s.values.iter().all(|v| *v == t.power),
            "{}: {:?}",
            t.name,
            s.values
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_client_certificate_is_required() {
    let dir = tempfile::tempdir().unwrap();
    let env = Env::start(dir.path(), true).await;
    let t = &env.tenants[0];
    // Without a certificate the handshake fails, or the first call does.
    match env.channel(&env.good.ca_file(), None).await {
        Err(_) => {}
        Ok(ch) => {
            let r = RawAgent::open(
                ch,
                Some(&t.agent_token),
                raw::hello(&t.node, &t.host, &t.gpu),
            )
            .await;
            let s = r.err().expect("no client certificate, yet welcomed");
            assert!(leaks(&status_bytes(&s), &env.tenants.iter().collect::<Vec<_>>()).is_empty());
        }
    }
    // With one from the trusted CA (and the tenant's token) it works.
    let cert = env
        .good
        .client("alpha-node", "alpha node", &["alpha.example"]);
    let ch = env.channel(&env.good.ca_file(), Some(&cert)).await.unwrap();
    let (_, w) = RawAgent::open(
        ch,
        Some(&t.agent_token),
        raw::hello(&t.node, &t.host, &t.gpu),
    )
    .await
    .unwrap();
    assert_eq!(w.tenant, t.name);
}

/// A `flopwatch collector` process and the address it printed.
struct CollectorProcess {
    child: std::process::Child,
    addr: String,
}

impl CollectorProcess {
    fn start(config: &Path) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(flopwatch_tests::flopwatch_bin())
            .args(["collector", "--config"])
            .arg(config)
            .env("FLOPWATCH_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(out).lines();
        let addr = loop {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(a) = l.strip_prefix("listening on ") {
                        break a.trim().to_string();
                    }
                }
                _ => panic!("the collector exited before listening"),
            }
        };
        CollectorProcess { child, addr }
    }

    fn signal(&self, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
}

impl Drop for CollectorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn query_cli(args: &[&str]) -> std::process::Output {
    std::process::Command::new(flopwatch_tests::flopwatch_bin())
        .args(args)
        .output()
        .unwrap()
}

/// The binaries as a user runs them: a collector serving TLS from its
/// config file, an agent streaming over https with the CA, `flopwatch
/// query` with `--ca` and a token; then the token is removed from the file
/// and SIGHUP makes the running collector refuse it.
#[test]
fn binaries_speak_tls_and_a_reload_revokes_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"), "site");
    let server = pki.server("collector");
    let write_config = |tokens: &[&str]| {
        let q: Vec<String> = tokens
            .iter()
            .map(|t| format!("{{ sha256 = \"{}\" }}", digest(t)))
            .collect();
        std::fs::write(
            dir.path().join("collector.toml"),
            format!(
                "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n\
                 [tls]\ncert = \"{}\"\nkey = \"{}\"\n\
                 [[tenants]]\nname = \"acme\"\nagent_tokens_sha256 = [\"{}\"]\nquery_tokens = [{}]\n",
                dir.path().join("data").display(),
                server.cert.display(),
                server.key.display(),
                digest("acme-agent"),
                q.join(", ")
            ),
        )
        .unwrap();
    };
    write_config(&["acme-reader-1", "acme-reader-2"]);
    let c = CollectorProcess::start(&dir.path().join("collector.toml"));
    let url = format!("https://{}", c.addr);
    let ca = pki.ca_file();
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "node_id = \"tls-node\"\ncollectors = [\"{url}\"]\ntoken = \"acme-agent\"\nsource = \"sim\"\nmetrics_listen = \"\"\n\
             [sim]\ngpus = 2\n[tls]\nca = \"{}\"\n",
            ca.display()
        ),
    )
    .unwrap();
    let mut agent = std::process::Command::new(flopwatch_tests::flopwatch_bin())
        .args(["agent", "--config"])
        .arg(dir.path().join("agent.toml"))
        .env("FLOPWATCH_LOG", "warn")
        .spawn()
        .unwrap();
    let ca_s = ca.to_str().unwrap();
    let nodes = |token: &str, url: &str| {
        query_cli(&[
            "query",
            "nodes",
            "--json",
            "--collector",
            url,
            "--ca",
            ca_s,
            "--token",
            token,
        ])
    };
    // The agent's node shows up through TLS.
    let deadline = Deadline::after(std::time::Duration::from_secs(30));
    loop {
        let out = nodes("acme-reader-1", &url);
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("tls-node") {
            break;
        }
        assert!(
            !deadline.passed(),
            "no node over TLS: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let _ = agent.kill();
    let _ = agent.wait();
    // Plaintext to the TLS port, or TLS without trusting the CA: refused.
    let plain = nodes("acme-reader-1", &format!("http://{}", c.addr));
    assert!(!plain.status.success());
    let untrusted = query_cli(&[
        "query",
        "nodes",
        "--collector",
        &url,
        "--token",
        "acme-reader-1",
    ]);
    assert!(!untrusted.status.success());
    // Remove reader 1, SIGHUP: refused from now on; reader 2 still reads.
    write_config(&["acme-reader-2"]);
    c.signal("HUP");
    let deadline = Deadline::after(std::time::Duration::from_secs(10));
    loop {
        let out = nodes("acme-reader-1", &url);
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("Unauthenticated") || err.contains("credentials"),
                "{err}"
            );
            break;
        }
        assert!(!deadline.passed(), "reader 1 still reads after SIGHUP");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let out = nodes("acme-reader-2", &url);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("tls-node"));
}
