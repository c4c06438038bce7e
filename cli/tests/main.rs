//! The `flopwatch` binary's tests, one module per subject, in one test
//! binary: commands, exit statuses, the terminal view.

mod agent_source_late;
mod cli;
mod top;
