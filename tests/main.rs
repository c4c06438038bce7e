//! flopwatch's cross-crate and process tests, one module per subject, in
//! one test binary (`cargo test -p flopwatch-tests --test all`; one
//! subject: `… --test all fault::`).

mod alerts;
mod cluster_api;
mod comm;
mod dcgm_drop_in;
mod deploy;
mod e2e;
mod fault;
mod gpu_validate;
mod grafana;
mod image;
mod job_churn;
mod layout;
mod ledger;
mod limbo;
mod limits;
mod mig;
mod prometheus;
mod promql_compliance;
mod promql_diff;
mod protocol;
mod remote_write;
mod sampling;
mod security;
mod shared_gpu;
