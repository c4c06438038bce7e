//! The whole cluster behind one collector's Prometheus API.
//!
//! Agents spread over the collectors of a cluster, so a tenant's series
//! are too (and a node's, after a failover). With `peers` configured, a
//! query first finds what each of its selectors reads — the matchers, and
//! the time range the steps, lookback, ranges, offsets, `@` and enclosing
//! subqueries make it reach ([`reads`]) — then asks every peer's
//! `Query/Select` for those series over those ranges, presenting the
//! caller's own bearer token (so a peer answers for the caller's tenant
//! only), and evaluates over its own series and the peers' together: the
//! same labels from two collectors are one series, a point stored on both
//! counts once. The derived node and job series are derived here from all
//! their GPUs' series, wherever they are stored, so each peer is also
//! asked for the OFU ratio of the nodes and jobs a selector could pick.
//!
//! A peer that does not answer within [`PEER_TIMEOUT`] (or refuses) is
//! left out and named in the answer's `warnings`, as Prometheus (and
//! Thanos, Mimir) report partial answers.

use super::derived::{JOB_GPUS, JOB_OFU, NODE_OFU};
use super::points::Timeline;
use super::syntax::{at_ms, matchers as selector_matchers, offset_ms};
use super::LOOKBACK_MS;
use crate::series::Labels;
use flopwatch_proto::v1::{self, query_client::QueryClient};
use promql_parser::label::Matcher;
use promql_parser::parser::Expr;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

/// How long a peer gets to answer.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(10);

use crate::peering::LOCAL;

/// The other collectors of the cluster.
#[derive(Debug, Clone)]
pub struct Peers {
    peers: Vec<(String, Channel)>,
    handle: tokio::runtime::Handle,
}

/// What the peers returned for one query.
#[derive(Debug, Default)]
pub struct Remote {
    /// Series by label set, their points merged in time order, each with
    /// the last instant it is current.
    pub series: Vec<(Labels, Arc<Timeline>)>,
    /// One line per peer that did not answer.
    pub warnings: Vec<String>,
}

/// One selector's read: its matchers and the time range `[from, to]` its
/// evaluation reaches.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub matchers: Vec<Matcher>,
    pub from: i64,
    pub to: i64,
}

/// The reads of every selector in `e` evaluated over `[start, end]` of a
/// query whose own range is `[query_start, query_end]` (for `@ start()`
/// and `@ end()`). Enclosing subqueries widen (and `@` pins) the range
/// their selectors read.
pub fn reads(e: &Expr, start: i64, end: i64, query: (i64, i64)) -> Vec<Read> {
    let mut out = Vec::new();
    walk(e, start, end, query, &mut out);
    out
}

fn walk(e: &Expr, start: i64, end: i64, query: (i64, i64), out: &mut Vec<Read>) {
    match e {
        Expr::VectorSelector(vs) => {
            let (a, b) = at_ms(&vs.at, query).map_or((start, end), |t| (t, t));
            let off = offset_ms(&vs.offset);
            if let Ok(m) = selector_matchers(vs) {
                out.push(Read {
                    matchers: m,
                    from: a - off - LOOKBACK_MS,
                    to: b - off,
                });
            }
        }
        Expr::MatrixSelector(ms) => {
            let (a, b) = at_ms(&ms.vs.at, query).map_or((start, end), |t| (t, t));
            let off = offset_ms(&ms.vs.offset);
            if let Ok(m) = selector_matchers(&ms.vs) {
                out.push(Read {
                    matchers: m,
                    from: a - off - ms.range.as_millis() as i64,
                    to: b - off,
                });
            }
        }
        Expr::Subquery(sq) => {
            let (a, b) = at_ms(&sq.at, query).map_or((start, end), |t| (t, t));
            let off = offset_ms(&sq.offset);
            let range = sq.range.as_millis() as i64;
            walk(&sq.expr, a - off - range, b - off, query, out);
        }
        Expr::Aggregate(a) => {
            if let Some(p) = &a.param {
                walk(p, start, end, query, out);
            }
            walk(&a.expr, start, end, query, out);
        }
        Expr::Unary(u) => walk(&u.expr, start, end, query, out),
        Expr::Binary(b) => {
            walk(&b.lhs, start, end, query, out);
            walk(&b.rhs, start, end, query, out);
        }
        Expr::Paren(p) => walk(&p.expr, start, end, query, out),
        Expr::Call(c) => {
            for a in &c.args.args {
                walk(a, start, end, query, out);
            }
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
    }
}

/// `m` as selector text (`{a="b",__name__=~"c"}`).
fn selector_text(m: &[Matcher]) -> String {
    let parts: Vec<String> = m.iter().map(|x| x.to_string()).collect();
    format!("{{{}}}", parts.join(","))
}

/// The requests a read makes of a peer: its selector, and for a selector
/// that could pick a derived series, the OFU ratio of the GPUs it would
/// derive from, over a lookback more.
fn requests(r: &Read) -> Vec<(String, i64, i64)> {
    let mut out = vec![(selector_text(&r.matchers), r.from, r.to)];
    let name = r.matchers.iter().find(|x| x.name == "__name__");
    let derived = [NODE_OFU, JOB_OFU, JOB_GPUS]
        .iter()
        .any(|f| name.is_none_or(|x| x.is_match(f)));
    if derived {
        let mut m: Vec<Matcher> = r
            .matchers
            .iter()
            .filter(|x| ["tenant", "node", "hostname", "job_id"].contains(&x.name.as_str()))
            .cloned()
            .collect();
        m.push(Matcher::new(
            promql_parser::label::MatchOp::Equal,
            "__name__",
            "flopwatch_ofu_ratio",
        ));
        out.push((selector_text(&m), r.from - LOOKBACK_MS, r.to));
    }
    out
}

impl Peers {
    /// The collectors at `urls` (their gRPC URLs), reached as the Query
    /// fan-out reaches them; calls are made on `handle`'s runtime.
    pub fn new(
        urls: &[String],
        tls: &flopwatch_transport::channel::TlsClient,
        handle: tokio::runtime::Handle,
    ) -> Result<Self, crate::CollectorError> {
        Ok(Self {
            peers: crate::peering::peer_channels(urls, tls)?,
            handle,
        })
    }

    /// Asks every peer for `reads`, presenting `token`; blocks the calling
    /// (query) thread until all answered or timed out.
    pub fn fetch(&self, token: Option<&str>, reads: &[Read], labels_only: bool) -> Remote {
        // One request per distinct selector, over the union of its ranges.
        let mut wanted: BTreeMap<String, (i64, i64)> = BTreeMap::new();
        for r in reads {
            for (sel, from, to) in requests(r) {
                let e = wanted.entry(sel).or_insert((from, to));
                e.0 = e.0.min(from);
                e.1 = e.1.max(to);
            }
        }
        // Selectors sharing a range go in one request.
        let mut by_range: BTreeMap<(i64, i64), Vec<String>> = BTreeMap::new();
        for (sel, range) in wanted {
            by_range.entry(range).or_default().push(sel);
        }
        let token = token.map(str::to_string);
        let peers = self.peers.clone();
        self.handle.block_on(async move {
            let futs = peers.iter().map(|(url, ch)| {
                let by_range = &by_range;
                let token = token.clone();
                async move {
                    let mut got = Vec::new();
                    for ((from, to), selectors) in by_range {
                        let mut req = tonic::Request::new(v1::SelectRequest {
                            selectors: selectors.clone(),
                            start_ms: *from,
                            end_ms: *to,
                            labels_only,
                        });
                        if let Some(t) = &token {
                            if let Ok(v) = MetadataValue::try_from(format!("Bearer {t}")) {
                                req.metadata_mut().insert("authorization", v);
                            }
                        }
                        req.metadata_mut()
                            .insert(LOCAL, MetadataValue::from_static("1"));
                        req.set_timeout(PEER_TIMEOUT);
                        let mut client =
                            QueryClient::new(ch.clone()).max_decoding_message_size(256 << 20);
                        match tokio::time::timeout(PEER_TIMEOUT, client.select(req)).await {
                            Ok(Ok(r)) => got.extend(r.into_inner().series),
                            Ok(Err(s)) => {
                                return Err(format!(
                                    "peer {url} did not answer: {:?}: {}",
                                    s.code(),
                                    s.message()
                                ))
                            }
                            Err(_) => {
                                return Err(format!(
                                    "peer {url} did not answer within {PEER_TIMEOUT:?}"
                                ))
                            }
                        }
                    }
                    Ok(got)
                }
            });
            let mut remote = Remote::default();
            let mut merged: BTreeMap<Labels, BTreeMap<i64, (f64, i64)>> = BTreeMap::new();
            for r in futures::future::join_all(futs).await {
                match r {
                    Ok(series) => {
                        for s in series {
                            let mut labels: Labels =
                                s.labels.into_iter().map(|l| (l.name, l.value)).collect();
                            labels.sort();
                            let e = merged.entry(labels).or_default();
                            // A peer without the ends: current for the
                            // lookback delta.
                            let ends = s.current_until_ms;
                            for (k, (t, v)) in s.timestamps_ms.into_iter().zip(s.values).enumerate()
                            {
                                let end = ends.get(k).copied().unwrap_or(t + LOOKBACK_MS);
                                e.entry(t).or_insert((v, end));
                            }
                        }
                    }
                    Err(w) => {
                        tracing::warn!(warning = %w, "query fan-out");
                        remote.warnings.push(w);
                    }
                }
            }
            remote.series = merged
                .into_iter()
                .map(|(l, p)| {
                    let tl: Timeline = p.into_iter().map(|(t, (v, e))| (t, v, e)).collect();
                    (l, Arc::new(tl))
                })
                .collect();
            remote
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_reach_back_by_lookback_range_offset_and_subqueries() {
        let e = promql_parser::parser::parse(
            "rate(x[5m] offset 1m) + max_over_time(y[10m:1m]) + z @ 1000 + flopwatch_node_ofu_ratio",
        )
        .unwrap();
        let r = reads(&e, 1_000_000, 2_000_000, (1_000_000, 2_000_000));
        let at = |n: &str| {
            r.iter()
                .find(|r| r.matchers.iter().any(|m| m.value == n))
                .map(|r| (r.from, r.to))
                .unwrap()
        };
        assert_eq!(at("x"), (1_000_000 - 60_000 - 300_000, 2_000_000 - 60_000));
        assert_eq!(at("y"), (1_000_000 - 600_000 - LOOKBACK_MS, 2_000_000));
        assert_eq!(at("z"), (1_000_000 - LOOKBACK_MS, 1_000_000));
        let node = r
            .iter()
            .find(|r| r.matchers.iter().any(|m| m.value == NODE_OFU))
            .unwrap();
        let reqs = requests(node);
        assert_eq!(reqs.len(), 2);
        assert!(reqs[1].0.contains("flopwatch_ofu_ratio"), "{reqs:?}");
        assert_eq!(reqs[1].1, node.from - LOOKBACK_MS);
    }
}
