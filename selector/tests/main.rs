//! The selector's tests, one module per subject, in one test binary.

mod common;
mod csv_errors;
mod distance_props;
mod known_truth;
mod outputs;
