//! The flopwatch node agent.
//!
//! One process per node reads GPU counters from a [`source::GpuSource`]
//! without touching workloads, keeps what the [`sampler::Sampler`] selects,
//! groups samples into batches ([`batcher`]) and streams them over gRPC
//! ([`client`]) to a collector, which acknowledges each batch once it is
//! durable. Unacknowledged batches wait in a bounded [`outbox`] and, when
//! configured, an on-disk [`spool`]; they are resent after a reconnect, to
//! the next collector in the node's [`placement`] order when one dies.

// Unsafe code only where a module allows it: `source::gpm`, NVML's GPM
// calls without per-call allocation.
#![deny(unsafe_code)]

mod adaptive;
pub mod attribution;
mod backoff;
mod batcher;
mod cadence;
mod capture;
pub mod client;
mod clock;
pub mod deadline;
mod filter;
mod health;
mod identity;
pub mod latency;
mod mfu;
mod opening;
mod outage;
mod outbox;
mod placement;
mod refresh;
mod run;
mod sampler;
mod sampling;
pub mod source;
mod split;
mod spool;
mod telemetry;
mod trailing;
mod wire;

pub use adaptive::{floor_for, AdaptiveSampler, WEIGHTED_CLOCK_STEPS_PER_MHZ};
pub use batcher::Batcher;
pub use capture::{Capture, GpuCapture, PlanCarry, ReadPlan, Reading};
pub use clock::TokioClock;
pub use identity::{boot_id, node_identity};
pub use opening::{OpenSource, RetryOptions, SamplerFor, StartError};
pub use outbox::Outbox;
pub use placement::order;
pub use refresh::{RefreshPaced, MAX_POLL, MIN_POLL};
pub use run::{Agent, AgentOptions, DeliveryOptions, SLOW_INTERVAL};
pub use sampler::{FixedSampler, Sampler};
pub use sampling::Pacing;
pub use spool::{Spool, SpoolOptions, SpoolStats};
pub use telemetry::registry;
// The TLS settings `AgentOptions` and `client::ClientOptions` carry.
pub use flopwatch_transport::TlsClient;
