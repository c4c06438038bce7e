//! What the agent, the collector and the command-line clients share below
//! the wire protocol: a gRPC [`channel`] to a collector (plain `http://` or
//! rustls `https://`, with a client certificate for mTLS), and the small
//! [`metrics_http`] server that serves a process's own `/metrics`, with the
//! [`process`] metrics and build information both export.
//!
//! It sits under both peers so that the agent and the collector meet only
//! here, in `flopwatch-config` and in `flopwatch-proto`, never through each
//! other: a node's agent build carries no collector code, and the
//! collector no agent code.

#![deny(unsafe_code)]

pub mod channel;
pub mod memory;
pub mod metrics_http;
pub mod priority;
pub mod process;
pub mod signal;

pub use channel::{ChannelError, TlsClient, TlsFileError};
pub use signal::shutdown_signal;
