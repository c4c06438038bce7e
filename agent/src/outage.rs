//! A source's outages, told as transitions: one warning when it goes from
//! answering to failing (with the error), a reminder at most every
//! [`REMIND_EVERY`] while it keeps failing (with the count and the time),
//! and one info line when it answers again ("recovered after N failures /
//! T s"). Never silenced for good, and never a line per failed capture: a
//! dcgm-exporter that is down for an hour logs about sixty lines, not
//! thirty-six thousand.
//!
//! [`Outage`] is the state machine alone, on injected time (the capture's
//! or the clock's ms), so its tests are exact. [`Watch`] joins it to the
//! log and to the probes ([`Health`]): the sampling loop tells it every
//! capture's outcome, the opening loop ([`crate::opening`]) every attempt
//! to open the source.

use crate::health::Health;
use std::time::Duration;
use tracing::{info, warn};

/// How often a source that keeps failing is mentioned again.
pub(crate) const REMIND_EVERY: Duration = Duration::from_secs(60);

/// Longest error text kept for the probes and the reminders.
const MAX_ERROR_CHARS: usize = 512;

/// What the caller should say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Said {
    /// Nothing new.
    Nothing,
    /// The source just went from answering (or never tried) to failing.
    Failing {
        /// The error.
        error: String,
    },
    /// The source still fails: a reminder.
    StillFailing {
        /// Failures in a row so far.
        failures: u64,
        /// Time since the first of them, ms.
        for_ms: u64,
        /// The latest error.
        error: String,
    },
    /// The source answers again.
    Recovered {
        /// Failures in a row it had.
        failures: u64,
        /// Time from the first of them to this success, ms.
        after_ms: u64,
    },
}

/// An outage under way.
#[derive(Debug, Clone)]
struct Failing {
    since_ms: i64,
    failures: u64,
    last_said_ms: i64,
    error: String,
}

/// Answering or failing, with what has been said. See the module docs.
#[derive(Debug, Clone)]
pub(crate) struct Outage {
    remind_every_ms: i64,
    failing: Option<Failing>,
}

impl Outage {
    /// Reminders at most every `remind_every`.
    pub(crate) fn new(remind_every: Duration) -> Self {
        Self {
            remind_every_ms: i64::try_from(remind_every.as_millis()).unwrap_or(i64::MAX),
            failing: None,
        }
    }

    /// A failure at `now_ms`.
    pub(crate) fn failed(&mut self, now_ms: i64, error: &dyn std::fmt::Display) -> Said {
        let error = bounded(error);
        match &mut self.failing {
            None => {
                self.failing = Some(Failing {
                    since_ms: now_ms,
                    failures: 1,
                    last_said_ms: now_ms,
                    error: error.clone(),
                });
                Said::Failing { error }
            }
            Some(f) => {
                f.failures += 1;
                f.error = error;
                if now_ms.saturating_sub(f.last_said_ms) < self.remind_every_ms {
                    return Said::Nothing;
                }
                f.last_said_ms = now_ms;
                Said::StillFailing {
                    failures: f.failures,
                    for_ms: ms_between(f.since_ms, now_ms),
                    error: f.error.clone(),
                }
            }
        }
    }

    /// A success at `now_ms`.
    pub(crate) fn succeeded(&mut self, now_ms: i64) -> Said {
        match self.failing.take() {
            None => Said::Nothing,
            Some(f) => Said::Recovered {
                failures: f.failures,
                after_ms: ms_between(f.since_ms, now_ms),
            },
        }
    }

    /// Failures in a row (0 while answering).
    pub(crate) fn failures(&self) -> u64 {
        self.failing.as_ref().map_or(0, |f| f.failures)
    }

    /// Time from the first failure in a row to `now_ms` (zero while
    /// answering).
    pub(crate) fn failing_for(&self, now_ms: i64) -> Duration {
        self.failing.as_ref().map_or(Duration::ZERO, |f| {
            Duration::from_millis(ms_between(f.since_ms, now_ms))
        })
    }

    /// The latest error, while failing.
    pub(crate) fn error(&self) -> Option<&str> {
        self.failing.as_ref().map(|f| f.error.as_str())
    }
}

fn ms_between(from: i64, to: i64) -> u64 {
    u64::try_from(to.saturating_sub(from)).unwrap_or(0)
}

/// `error` as text, at most [`MAX_ERROR_CHARS`] characters.
fn bounded(error: &dyn std::fmt::Display) -> String {
    let text = error.to_string();
    match text.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// What a [`Watch`] watches: the words of its log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    /// Attempts to open the source.
    Open,
    /// Captures of an open source.
    Capture,
}

/// An [`Outage`] that logs its transitions and keeps the probes told.
#[derive(Debug)]
pub(crate) struct Watch {
    outage: Outage,
    watched: Watched,
    health: std::sync::Arc<Health>,
}

impl Watch {
    /// Watches `watched`, reminding every `remind_every`, telling `health`.
    pub(crate) fn new(
        watched: Watched,
        remind_every: Duration,
        health: std::sync::Arc<Health>,
    ) -> Self {
        Self {
            outage: Outage::new(remind_every),
            watched,
            health,
        }
    }

    /// A failure at `now_ms`.
    pub(crate) fn failed(&mut self, now_ms: i64, error: &dyn std::fmt::Display) {
        let said = self.outage.failed(now_ms, error);
        let failures = self.outage.failures();
        let for_ms = u64::try_from(self.outage.failing_for(now_ms).as_millis()).unwrap_or(u64::MAX);
        let text = self.outage.error().unwrap_or_default();
        match self.watched {
            Watched::Open => self.health.open_failed(failures, for_ms, text),
            Watched::Capture => self.health.capture_failed(failures, for_ms, text),
        }
        self.say(said);
    }

    /// A success at `now_ms`.
    pub(crate) fn succeeded(&mut self, now_ms: i64) {
        let said = self.outage.succeeded(now_ms);
        if said != Said::Nothing {
            self.health.source_answers();
        }
        self.health.set_source_up(true);
        self.say(said);
    }

    fn say(&self, said: Said) {
        let secs = |ms: u64| ms as f64 / 1000.0;
        match (said, self.watched) {
            (Said::Nothing, _) => {}
            (Said::Failing { error }, Watched::Open) => warn!(
                %error,
                "the source cannot be opened yet; retrying with backoff (/readyz answers 503 until it opens)"
            ),
            (Said::Failing { error }, Watched::Capture) => {
                warn!(%error, "capture failed; the source is failing")
            }
            (
                Said::StillFailing {
                    failures,
                    for_ms,
                    error,
                },
                Watched::Open,
            ) => warn!(
                failures,
                for_s = secs(for_ms),
                %error,
                "the source still cannot be opened"
            ),
            (
                Said::StillFailing {
                    failures,
                    for_ms,
                    error,
                },
                Watched::Capture,
            ) => warn!(
                failures,
                for_s = secs(for_ms),
                %error,
                "the source is still failing"
            ),
            (Said::Recovered { failures, after_ms }, Watched::Open) => info!(
                failures,
                after_s = secs(after_ms),
                "source opened after {failures} failed attempts / {:.1} s",
                secs(after_ms)
            ),
            (Said::Recovered { failures, after_ms }, Watched::Capture) => info!(
                failures,
                after_s = secs(after_ms),
                "source recovered after {failures} failures / {:.1} s",
                secs(after_ms)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outage() -> Outage {
        Outage::new(Duration::from_secs(60))
    }

    #[test]
    fn answering_says_nothing() {
        let mut o = outage();
        for t in 0..100 {
            assert_eq!(o.succeeded(t * 100), Said::Nothing);
        }
        assert_eq!(o.failures(), 0);
        assert_eq!(o.failing_for(10_000), Duration::ZERO);
        assert_eq!(o.error(), None);
    }

    /// One warning when it starts failing, a reminder a minute (with the
    /// count and the time), one line when it answers again.
    #[test]
    fn an_outage_is_told_as_transitions_and_reminders() {
        let mut o = outage();
        assert_eq!(o.succeeded(0), Said::Nothing);
        assert_eq!(
            o.failed(1_000, &"refused"),
            Said::Failing {
                error: "refused".into()
            }
        );
        // A capture every 100 ms for the next minute: silence.
        let mut t = 1_000;
        let mut said = Vec::new();
        while t < 1_000 + 150_000 {
            t += 100;
            match o.failed(t, &"HTTP 500") {
                Said::Nothing => {}
                s => said.push((t, s)),
            }
        }
        assert_eq!(
            said,
            vec![
                (
                    61_000,
                    Said::StillFailing {
                        failures: 601,
                        for_ms: 60_000,
                        error: "HTTP 500".into()
                    }
                ),
                (
                    121_000,
                    Said::StillFailing {
                        failures: 1_201,
                        for_ms: 120_000,
                        error: "HTTP 500".into()
                    }
                ),
            ]
        );
        assert_eq!(o.failures(), 1_501);
        assert_eq!(o.failing_for(151_000), Duration::from_secs(150));
        assert_eq!(o.error(), Some("HTTP 500"));
        assert_eq!(
            o.succeeded(151_100),
            Said::Recovered {
                failures: 1_501,
                after_ms: 150_100
            }
        );
        assert_eq!(o.succeeded(151_200), Said::Nothing);
        assert_eq!(o.failures(), 0);
    }

    /// The tenth, the thousandth outage are told like the first (the
    /// loop once went quiet after ten errors in the process's life).
    #[test]
    fn never_silenced_for_good() {
        let mut o = outage();
        let mut t = 0;
        for _ in 0..1_000 {
            t += 1_000;
            assert!(matches!(o.failed(t, &"x"), Said::Failing { .. }));
            t += 1_000;
            assert_eq!(o.failed(t, &"x"), Said::Nothing);
            t += 1_000;
            assert_eq!(
                o.succeeded(t),
                Said::Recovered {
                    failures: 2,
                    after_ms: 2_000
                }
            );
        }
    }

    #[test]
    fn long_errors_are_cut() {
        let mut o = outage();
        let long = "é".repeat(10_000);
        let Said::Failing { error } = o.failed(0, &long) else {
            panic!("a first failure is said");
        };
        assert_eq!(error.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(error.ends_with('…'));
    }

    /// Time going backwards (a clock step) neither panics nor says
    /// nonsense.
    #[test]
    fn time_going_backwards_is_harmless() {
        let mut o = outage();
        o.failed(10_000, &"x");
        assert_eq!(o.failed(5_000, &"x"), Said::Nothing);
        assert_eq!(o.failing_for(1_000), Duration::ZERO);
        assert_eq!(
            o.succeeded(2_000),
            Said::Recovered {
                failures: 2,
                after_ms: 0
            }
        );
    }

    /// The watch keeps the probes told: not up while failing, the count
    /// and the error for `/readyz`, up again on success.
    #[test]
    fn the_watch_tells_the_probes() {
        let health = std::sync::Arc::new(Health::default());
        let mut w = Watch::new(Watched::Capture, REMIND_EVERY, health.clone());
        w.succeeded(0);
        assert!(health.source_up());
        w.failed(100, &"HTTP status 500");
        w.failed(200, &"HTTP status 500");
        assert!(!health.source_up());
        let p = health.source_problem().expect("failing");
        assert_eq!((p.failures, p.for_ms, p.opening), (2, 100, false));
        assert_eq!(p.error, "HTTP status 500");
        w.succeeded(300);
        assert!(health.source_up());
        assert!(health.source_problem().is_none());
    }
}
