//! flopwatch configuration: the collector and agent TOML files, and the GPU
//! spec table (`config/gpus.toml`) that gives OFU its denominators.
//!
//! Every section rejects unknown keys, fills defaults in one place
//! (`Default` impls), and is checked by `validate()`; errors name the file
//! and the key. Environment variables `FLOPWATCH_<SECTION>__<KEY>` override
//! file values (read through an injectable source, so tests never touch the
//! process environment).

#![forbid(unsafe_code)]

mod agent;
mod collector;
mod error;
mod load;
mod sampling;
mod security;
mod specs;

pub use agent::{AgentConfig, HostSettings, NvmlSettings, SimSettings, SourceKind, SpoolConfig};
pub use collector::{
    resolution_decimals, AgentToken, AnalysisConfig, ClusterConfig, CollectorConfig,
    ExporterConfig, PolicyConfig, PrometheusApiConfig, QueryToken, RemoteWriteConfig,
    RemoteWriteProtocol, StorageConfig, TenantConfig, TenantRetention, MAX_QUERY_DEPTH,
};
pub use error::ConfigError;
pub use load::{
    load_file, load_file_with, parse_str, relative_to, EnvSource, ProcessEnv, Validate,
};
pub use sampling::{MetricOverride, SamplingConfig};
pub use security::{ClientTls, Limits, LimitsOverride, ServerTls};
pub use specs::{GpuSpec, Precision, SpecTable, DEFAULT_SPEC_TABLE};
