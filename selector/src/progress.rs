//! The stderr progress bar.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar on stderr, hidden when `enabled` is false or stderr is
/// not a terminal (logs and pipes stay clean).
pub fn progress_bar(enabled: bool) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    steps_style(&bar);
    bar
}

/// Style for the byte-counting CSV reading phase.
pub(crate) fn bytes_style(bar: &ProgressBar) {
    if bar.is_hidden() {
        return;
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg:20} [{bar:30}] {bytes}/{total_bytes} ({elapsed})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
}

/// Style for the step-counting pipeline phase.
pub(crate) fn steps_style(bar: &ProgressBar) {
    if bar.is_hidden() {
        return;
    }
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:20} [{bar:30}] {pos}/{len} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
}
