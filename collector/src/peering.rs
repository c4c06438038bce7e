//! How a collector reaches the other collectors of its cluster: one
//! lazily connected channel per peer, and the metadata that asks a peer to
//! answer from its own data only. The Query fan-out ([`crate::fanout`]),
//! the Prometheus API ([`crate::promql::peers`]) and the limbo reconciler
//! ([`crate::cluster`]) all use them.

use flopwatch_transport::channel::TlsClient;
use std::time::Duration;
use tonic::transport::Channel;

/// Request metadata: answer from this collector's data only.
pub(crate) const LOCAL: &str = "x-flopwatch-local";

/// One lazily connected channel per peer URL: the query fan-out and the
/// limbo reconciler ([`crate::cluster`]) reach peers the same way.
/// `tls` is used for `https://` peers.
pub(crate) fn peer_channels(
    peers: &[String],
    tls: &TlsClient,
) -> Result<Vec<(String, Channel)>, crate::CollectorError> {
    peers
        .iter()
        .map(|p| {
            let ch = tls
                .endpoint(p)
                .map_err(|e| crate::CollectorError::Setup(format!("peers: {e}")))?
                .connect_timeout(Duration::from_secs(2))
                .connect_lazy();
            Ok((p.clone(), ch))
        })
        .collect()
}
