//! The flopwatch collector.
//!
//! Agents stream numbered batches over gRPC ([`ingest`]); each batch is
//! validated ([`validate`]), its OFU derived ([`ofu()`], OFU paper eq. 1 with
//! the tensor-core peak clock of `config/gpus.toml`), and committed with the
//! agent's acked sequence number in one durable write ([`store`]) before it
//! is acknowledged. [`query`] answers OFU per GPU, node, job (eq. 11) and
//! tenant, raw series and inventories, for the caller's tenant only.

#![forbid(unsafe_code)]

mod auth;
mod cluster;
use flopwatch_codec as codec;
mod error;
mod events;
mod exporter;
mod fanout;
mod group;
mod inbound;
mod ingest;
mod keylock;
pub mod ledger;
mod limits;
mod live;
mod mfu;
use flopwatch_proto::ofu;
mod otlp;
mod ownership;
use flopwatch_store::parallel;
mod peer_cert;
mod peering;
pub mod promql;
mod query;
mod remote_write;
mod remote_write_v2;
mod series;
pub mod server;
mod staleness;
mod state;
mod stats;
pub use flopwatch_store as store;
mod tile;
mod tls;
mod validate;

pub use auth::{digest, Auth, Scope};
pub use cluster::settings::other_peers;
pub use codec::Block;
pub use error::CollectorError;
pub use exporter::page as metrics_page;
pub use ingest::SLOT_WAIT;
pub use limits::LimitTable;
pub use ofu::ofu;
pub use remote_write::Endpoint as RemoteWriteEndpoint;
pub use state::{Collector, Settings};
pub use stats::Stats;
pub use tile::{adjusted_ofu, quantize, TileShape};
pub use tls::{api_config, metrics_config, server_config};
pub use validate::{check_kept, decode_and_validate, Rules};

/// Prometheus remote write 1.0 on the wire (`prompb`): the messages the
/// collector sends, their encoder (protobuf, then snappy) and the send
/// error of [`RemoteWriteEndpoint::write`].
pub mod prompb {
    pub use crate::remote_write::{
        encode_request, Label, Sample, SendError, TimeSeries, WriteRequest,
    };
}
