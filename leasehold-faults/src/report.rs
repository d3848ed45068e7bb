//! The per-backend fault report, counted from the typed results of the runs.

use std::time::Duration;

use leasehold_testkit::history::{Verdict, ViolationKind};

use crate::failover::{Run, Scenario};
use crate::scenarios::Measured;

/// Totals for one restart or failover scenario ([`Scenario`]).
#[derive(Debug, Clone)]
pub struct FailoverReport {
    /// The scenario.
    pub scenario: Scenario,
    /// Runs.
    pub runs: u64,
    /// Runs that could not be carried out.
    pub errors: u64,
    /// Faults injected (the disruption and the storm's own faults).
    pub faults: u64,
    /// Violations of what the backend promises in this scenario (must be 0).
    pub verdict: Verdict,
    /// Violations of kinds outside the scenario's guarantee (reported, not failures).
    pub outside: Verdict,
}

impl FailoverReport {
    /// An empty report.
    pub fn new(scenario: Scenario) -> Self {
        FailoverReport {
            scenario,
            runs: 0,
            errors: 0,
            faults: 0,
            verdict: Verdict::default(),
            outside: Verdict::default(),
        }
    }

    /// Adds one run.
    pub fn add(&mut self, r: &Result<Run, String>) {
        self.runs += 1;
        match r {
            Ok(run) => {
                self.faults += run.measured.faults;
                self.verdict.merge(&run.measured.verdict());
                self.outside.merge(&Verdict::of(&run.outside));
            }
            Err(_) => self.errors += 1,
        }
    }

    /// A Markdown row.
    pub fn row(&self) -> String {
        let kinds = |v: &Verdict| {
            let parts: Vec<String> = ViolationKind::ALL
                .iter()
                .filter(|k| v.count(**k) > 0)
                .map(|k| format!("{} {k}", v.count(*k)))
                .collect();
            if parts.is_empty() {
                "0".to_string()
            } else {
                parts.join(", ")
            }
        };
        let outside = if self.scenario.outside_kinds().is_empty() {
            "- (all promised)".to_string()
        } else {
            kinds(&self.outside)
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            self.scenario.backend(),
            self.scenario.name(),
            self.runs,
            self.errors,
            self.faults,
            kinds(&self.verdict),
            outside
        )
    }

    /// The Markdown header of [`row`](Self::row).
    pub fn header() -> &'static str {
        "| backend | scenario | runs | errors (no verdict) | faults injected | violations (must be 0) | outside the guarantee (reported) |\n|---|---|---|---|---|---|---|"
    }
}

/// Totals for one backend.
#[derive(Debug, Clone, Default)]
pub struct BackendReport {
    /// The backend.
    pub backend: String,
    /// Runs (scenarios and storms).
    pub runs: u64,
    /// Storms among the runs.
    pub storms: u64,
    /// Process storms among the runs ([`crate::procstorm::on_target`]: holder processes
    /// SIGSTOPped, SIGCONTed and SIGKILLed, their wall clocks skewed and stepped).
    pub process_storms: u64,
    /// Process storms after which the resource's own record of accepted writes was checked.
    pub records_checked: u64,
    /// Storms after which the resource's own record of accepted writes was checked.
    pub storm_records_checked: u64,
    /// Accepted writes the resource's records held, over every run that checked one.
    pub recorded_writes: u64,
    /// Runs that could not be carried out (a service unreachable, a holder that never started):
    /// not a verdict either way.
    pub errors: u64,
    /// Runs with at least one violation.
    pub failed: u64,
    /// Faults injected.
    pub faults: u64,
    /// Violations by kind (all must be 0).
    pub verdict: Verdict,
    /// Confirmed renewals recorded by the storms.
    pub renewals: u64,
    /// Operations of unknown outcome recorded by the storms.
    pub unknown: u64,
    /// Safety margins (loss reported to the next grant) seen.
    pub margins: Vec<Duration>,
    /// Loss-before-store-expiry margins seen.
    pub store_margins: Vec<Duration>,
    /// Takeover times seen.
    pub takeovers: Vec<Duration>,
    /// False expiries.
    pub false_expiries: u64,
    /// Storms during which this process's runtime left a task waiting for at least the loss
    /// lead ([`stall`](crate::stall)): their timeliness was tested on a process that did not run.
    pub stalled: u64,
    /// Storms during which the host's wall clock stepped, on a backend whose store judges
    /// expiry by it.
    pub stepped: u64,
    /// What those storms found of the kinds a wall-clock step can cause (overlapping belief,
    /// late loss): outside the backend's guarantee, reported apart.
    pub outside: Verdict,
    /// Which runs could not be carried out and why ("run: error"), the first
    /// [`NO_VERDICT_KEPT`] of them; [`errors`](Self::errors) counts them all.
    pub no_verdict: Vec<String>,
    /// Tasks of this backend's soak that panicked (a storm, a failover run, the backend's whole
    /// soak task); each is also a run without a verdict.
    pub panicked: u64,
    /// Store reads at loss reports that could not be carried out
    /// ([`Measured::failed_probes`]).
    pub failed_probes: u64,
}

/// How many runs without a verdict a [`BackendReport`] keeps the reasons of.
pub const NO_VERDICT_KEPT: usize = 20;

impl BackendReport {
    /// An empty report for `backend`.
    pub fn new(backend: &str) -> Self {
        BackendReport {
            backend: backend.to_string(),
            ..Self::default()
        }
    }

    /// Adds one run's result (`storm` says whether it was a storm).
    pub fn add(&mut self, r: &Result<Measured, String>, storm: bool) {
        self.runs += 1;
        if storm {
            self.storms += 1;
        }
        match r {
            Ok(m) => {
                self.faults += m.faults;
                self.renewals += m.renewals;
                self.unknown += m.unknown;
                self.false_expiries += m.false_expiries;
                self.failed_probes += m.failed_probes;
                self.recorded_writes += m.recorded;
                let v = m.verdict();
                if !v.is_clean() {
                    self.failed += 1;
                }
                self.verdict.merge(&v);
                self.margins.extend(m.margin);
                self.margins.extend(m.margins.iter().copied());
                self.store_margins.extend(m.store_margins.iter().copied());
                self.takeovers.extend(m.takeover);
            }
            Err(_) => self.errors += 1,
        }
    }

    /// Records why the run `what` could not be carried out, when `r` is an error (call it next
    /// to [`add`](Self::add), which counts it).
    pub fn note_no_verdict<T>(&mut self, what: &str, r: &Result<T, String>) {
        if let Err(e) = r
            && self.no_verdict.len() < NO_VERDICT_KEPT
        {
            self.no_verdict.push(format!("{what}: {e}"));
        }
    }

    /// Counts the run `what`, whose task panicked (`r` holds the panic), as a run without a
    /// verdict and as a panicked task.
    pub fn add_panicked(&mut self, what: &str, r: &Result<Measured, String>) {
        self.note_no_verdict(what, r);
        self.add(r, false);
        self.panicked += 1;
    }

    /// Counts a storm whose longest runtime stall was `stall`, against the loss lead `lead`.
    pub fn add_stall(&mut self, stall: Duration, lead: Duration) {
        if stall >= lead {
            self.stalled += 1;
        }
    }

    /// Moves the findings of a storm during which the host's wall clock stepped, on a backend
    /// whose store judges expiry by it, out of its violations: the overlapping beliefs and late
    /// losses a step causes are outside that backend's guarantee and go to
    /// [`outside`](Self::outside). Every other kind stays a violation.
    pub fn set_outside_clock_step(&mut self, m: &mut Measured) {
        self.stepped += 1;
        let (out, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut m.violations)
            .into_iter()
            .partition(|v| {
                matches!(
                    v.kind,
                    ViolationKind::OverlappingBelief | ViolationKind::LateLoss
                )
            });
        m.violations = keep;
        self.outside.merge(&Verdict::of(&out));
    }

    /// A Markdown table row of the violations by kind.
    pub fn row(&self) -> String {
        let mut s = format!(
            "| {} | {} | {} ({} record checked) | {} ({} record checked) | {} | {} | {} | {} | {} | {} |",
            self.backend,
            self.runs,
            self.storms,
            self.storm_records_checked,
            self.process_storms,
            self.records_checked,
            self.errors,
            self.panicked,
            self.failed_probes,
            self.failed,
            self.faults,
            self.recorded_writes
        );
        for k in ViolationKind::ALL {
            s.push_str(&format!(" {} |", self.verdict.count(k)));
        }
        let outside: Vec<String> = ViolationKind::ALL
            .iter()
            .filter(|k| self.outside.count(**k) > 0)
            .map(|k| format!("{} {k}", self.outside.count(*k)))
            .collect();
        s.push_str(&format!(
            " {} |",
            if outside.is_empty() {
                format!("0 (storms during a step: {})", self.stepped)
            } else {
                format!(
                    "{} (storms during a step: {})",
                    outside.join(", "),
                    self.stepped
                )
            }
        ));
        s
    }

    /// The Markdown header of [`row`](Self::row).
    pub fn header() -> String {
        let mut h = String::from(
            "| backend | runs | storms | process storms | errors (no verdict) | of them panicked tasks | failed probes | runs with violations | faults injected | accepted writes in the resource's records |",
        );
        let mut sep = String::from("|---|---|---|---|---|---|---|---|---|---|");
        for k in ViolationKind::ALL {
            h.push_str(&format!(" {} |", k.name()));
            sep.push_str("---|");
        }
        h.push_str(" outside the guarantee: wall clock stepped (reported) |");
        sep.push_str("---|");
        format!("{h}\n{sep}")
    }

    /// A Markdown row of the measurements.
    pub fn measure_row(&self) -> String {
        let q = |v: &[Duration]| {
            if v.is_empty() {
                return "-".to_string();
            }
            let mut v = v.to_vec();
            v.sort();
            let at = |pct: usize| {
                let i = ((v.len() - 1) * pct).div_ceil(100);
                format!("{:.0}", v[i].as_secs_f64() * 1e3)
            };
            format!("{} / {} / {} / {}", at(0), at(50), at(99), at(100))
        };
        format!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            self.backend,
            self.renewals,
            self.unknown,
            self.false_expiries,
            q(&self.margins),
            q(&self.store_margins),
            q(&self.takeovers)
        )
    }

    /// The Markdown header of [`measure_row`](Self::measure_row).
    pub fn measure_header() -> &'static str {
        "| backend | confirmed renewals recorded | unknown outcomes recorded | false expiries | safety margin ms (min / p50 / p99 / max) | loss before the store's expiry ms (min / p50 / p99 / max) | takeover ms (min / p50 / p99 / max) |\n|---|---|---|---|---|---|---|"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_testkit::history::Violation;

    /// A wall-clock step moves only the kinds it can cause; fencing findings stay violations.
    #[test]
    fn a_clock_step_moves_overlaps_and_late_losses_only() {
        let mut rep = BackendReport::new("postgres");
        let mut m = Measured {
            violations: vec![
                Violation::new(ViolationKind::OverlappingBelief, "a"),
                Violation::new(ViolationKind::LateLoss, "b"),
                Violation::new(ViolationKind::StaleWriteAccepted, "c"),
                Violation::new(ViolationKind::TokenRegression, "d"),
            ],
            ..Measured::default()
        };
        rep.set_outside_clock_step(&mut m);
        rep.add(&Ok(m), true);
        assert_eq!(rep.stepped, 1);
        assert_eq!(rep.outside.count(ViolationKind::OverlappingBelief), 1);
        assert_eq!(rep.outside.count(ViolationKind::LateLoss), 1);
        assert_eq!(rep.verdict.count(ViolationKind::StaleWriteAccepted), 1);
        assert_eq!(rep.verdict.count(ViolationKind::TokenRegression), 1);
        assert_eq!(rep.verdict.total(), 2);
        assert_eq!(rep.failed, 1);
        assert!(
            rep.row()
                .ends_with("| 1 overlapping belief, 1 late loss (storms during a step: 1) |")
        );
    }

    /// A run without a verdict is counted and its reason kept, up to the bound; a run with one
    /// leaves no reason.
    #[test]
    fn runs_without_a_verdict_keep_their_reason() {
        let mut rep = BackendReport::new("etcd");
        let ok: Result<Measured, String> = Ok(Measured::default());
        rep.note_no_verdict("storm seed 1", &ok);
        rep.add(&ok, true);
        for i in 0..NO_VERDICT_KEPT + 5 {
            let r: Result<Measured, String> = Err(format!("not granted within {i}s"));
            rep.note_no_verdict(&format!("scenario {i}"), &r);
            rep.add(&r, false);
        }
        assert_eq!(rep.errors, u64::try_from(NO_VERDICT_KEPT + 5).unwrap());
        assert_eq!(rep.no_verdict.len(), NO_VERDICT_KEPT);
        assert_eq!(rep.no_verdict[0], "scenario 0: not granted within 0s");
    }
}
