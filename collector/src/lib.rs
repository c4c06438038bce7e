//! The flopwatch collector.
//!
//! Agents stream numbered batches over gRPC ([`ingest`]); each batch is
//! validated ([`validate`]), its OFU derived ([`ofu`], OFU paper eq. 1 with
//! the tensor-core peak clock of `config/gpus.toml`), and committed with the
//! agent's acked sequence number in one durable write ([`store`]) before it
//! is acknowledged. [`query`] answers OFU per GPU, node, job (eq. 11) and
//! tenant, raw series and inventories, for the caller's tenant only.

#![forbid(unsafe_code)]

pub mod auth;
pub mod cluster;
pub mod codec;
pub mod error;
pub mod events;
pub mod exporter;
pub mod fanout;
pub mod ingest;
pub mod keylock;
pub mod limits;
pub mod live;
pub mod mfu;
pub mod ofu;
pub mod ownership;
pub mod peer_cert;
pub mod query;
pub mod remote_write;
pub mod series;
pub mod server;
pub mod state;
pub mod stats;
pub mod store;
pub mod tile;
pub mod tls;
pub mod validate;

pub use error::CollectorError;
pub use state::{Collector, Settings};
