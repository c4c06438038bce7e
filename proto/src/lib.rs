//! The flopwatch wire protocol (`flopwatch.v1`) and its domain model.
//!
//! Wire types are generated from `proto/flopwatch/v1/flopwatch.proto` with a
//! vendored `protoc` (no tool for users to install). The rest of flopwatch
//! speaks the domain types of [`model`] and [`metrics`]; conversions between
//! the two live in [`convert`], so wire details stay in this crate.

#![forbid(unsafe_code)]

pub mod clock;
pub mod cluster;
pub mod convert;
pub mod metrics;
pub mod model;
pub mod ofu;
pub mod stats;
pub mod wire_batch;

/// Generated `flopwatch.v1` messages, clients and servers.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("flopwatch.v1");

    /// Encoded `FileDescriptorSet` of `flopwatch.v1`, for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("flopwatch_v1_descriptor");
}

pub use convert::ConvertError;
