//! The per-backend fault report.

use std::time::Duration;

use crate::scenarios::Measured;

/// Totals for one backend.
#[derive(Debug, Clone, Default)]
pub struct BackendReport {
    /// The backend.
    pub backend: String,
    /// Scenario runs.
    pub runs: u64,
    /// Failed runs (a violated property or an error).
    pub failures: u64,
    /// Faults injected.
    pub faults: u64,
    /// Stale writes accepted (must be 0).
    pub stale_accepted: u64,
    /// Token regressions (must be 0).
    pub regressions: u64,
    /// Smallest safety margin seen.
    pub min_margin: Option<Duration>,
    /// False expiries.
    pub false_expiries: u64,
    /// Longest takeover.
    pub longest_takeover: Option<Duration>,
}

impl BackendReport {
    /// An empty report for `backend`.
    pub fn new(backend: &str) -> Self {
        BackendReport {
            backend: backend.to_string(),
            ..Self::default()
        }
    }

    /// Adds one run's result.
    pub fn add(&mut self, r: &Result<Measured, String>) {
        self.runs += 1;
        match r {
            Ok(m) => {
                self.faults += m.faults;
                self.stale_accepted += m.stale_accepted;
                self.regressions += m.regressions;
                self.false_expiries += m.false_expiries;
                if let Some(x) = m.margin {
                    self.min_margin = Some(self.min_margin.map_or(x, |y| y.min(x)));
                }
                if let Some(x) = m.takeover {
                    self.longest_takeover = Some(self.longest_takeover.map_or(x, |y| y.max(x)));
                }
            }
            Err(e) => {
                self.failures += 1;
                if e.contains("SAFETY") || e.contains("stale") {
                    self.stale_accepted += 1;
                }
                if e.contains("went back") || e.contains("reused") {
                    self.regressions += 1;
                }
            }
        }
    }

    /// A Markdown table row.
    pub fn row(&self) -> String {
        let d = |x: Option<Duration>| {
            x.map_or("-".to_string(), |d| {
                format!("{:.0} ms", d.as_secs_f64() * 1e3)
            })
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            self.backend,
            self.runs,
            self.failures,
            self.faults,
            self.stale_accepted,
            self.regressions,
            d(self.min_margin),
            self.false_expiries,
            d(self.longest_takeover)
        )
    }

    /// The Markdown table header.
    pub fn header() -> &'static str {
        "| backend | runs | failed runs | faults injected | stale writes accepted | token regressions | smallest safety margin | false expiries | longest takeover |\n|---|---|---|---|---|---|---|---|---|"
    }
}
