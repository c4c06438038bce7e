//! The config crate's tests, one module per subject, in one test binary:
//! the example files, docs/CONFIG.md against the code, the GPU spec table.

mod config_doc;
mod examples;
mod specs_match;
