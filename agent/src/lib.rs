//! The flopwatch node agent.
//!
//! One process per node reads GPU counters from a [`source::GpuSource`]
//! without touching workloads, keeps what the [`sampler::Sampler`] selects,
//! groups samples into batches ([`batcher`]) and streams them over gRPC
//! ([`client`]) to a collector, which acknowledges each batch once it is
//! durable. Unacknowledged batches wait in a bounded [`outbox`] and, when
//! configured, an on-disk [`spool`]; they are resent after a reconnect, to
//! the next collector in the node's [`placement`] order when one dies.

#![forbid(unsafe_code)]

pub mod adaptive;
pub mod attribution;
pub mod backoff;
pub mod batcher;
pub mod capture;
pub mod client;
pub mod clock;
pub mod filter;
pub mod health;
pub mod identity;
pub mod mfu;
pub mod outbox;
pub mod placement;
pub mod run;
pub mod sampler;
pub mod source;
pub mod split;
pub mod spool;
pub mod telemetry;

pub use run::{Agent, AgentOptions, DeliveryOptions};
// The TLS settings `AgentOptions` and `client::ClientOptions` carry.
pub use flopwatch_transport::TlsClient;
