//! The agent's integration tests, one module per subject, in one test
//! binary: sources (NVML through the fake `libnvidia-ml.so`, dcgm-exporter,
//! host counters), sampling, batching, pacing, health.

mod adaptive;
mod attribution;
mod batching;
mod dcgm_exporter;
mod fake;
mod gpm_permission;
mod health;
mod host_counters;
mod nvml;
mod nvml_counters;
mod nvml_mig;
mod nvml_plan;
mod nvml_shared;
mod pacing;
mod source_late;
