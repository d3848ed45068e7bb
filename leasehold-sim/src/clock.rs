//! Forward steps of a host's clock, and the mapping from the host's instants back to simulated
//! time.
//!
//! Each turmoil host is a paused tokio runtime that turmoil advances by one tick per step, so all
//! host clocks run at one rate. A host can still move its own clock forward
//! (`tokio::time::advance`): every timer due in between fires at once, as after a step of the
//! clock or a freeze of the process. A turmoil tick ends at a fixed instant of the host's clock,
//! so a step taken at the start of a tick gains its size less that tick: a step of `d` is taken
//! as an advance of `d + TICK`, and the tick it happens in is collapsed (the host sees its start,
//! then its end `d` later).
//!
//! Host instants are mapped back to simulated time (what the trace and the checks use) through
//! anchors, pairs of a host instant and the simulated time it was read at in a tick without a
//! step (where turmoil's `sim_elapsed` is exact). An instant inside a step's gap maps into the
//! collapsed tick (at most one tick late, the checks' tolerance).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};

use crate::trace::{EventKind, Trace};

/// The simulated time of one turmoil tick.
pub(crate) const TICK: Duration = Duration::from_millis(1);

#[derive(Debug, Clone, Copy)]
struct Step {
    /// The host instant the step started from.
    from: Instant,
    /// The simulated time it started at.
    at: Duration,
    /// The first anchor after it, once known.
    anchor: Option<(Instant, Duration)>,
}

#[derive(Debug, Default)]
struct State {
    base: Option<(Instant, Duration)>,
    steps: Vec<Step>,
}

/// One host's clock steps. Cloning shares the state; it lives on the host's thread.
#[derive(Debug, Clone, Default)]
pub(crate) struct HostClock {
    state: Rc<RefCell<State>>,
}

fn sim_elapsed() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

impl HostClock {
    /// Anchors the clock. Call on the host before any step, in a tick without a step.
    pub(crate) fn start(&self) {
        let mut s = self.state.borrow_mut();
        if s.base.is_none() {
            s.base = Some((Instant::now(), sim_elapsed()));
        }
    }

    /// The simulated time of the host instant `t` (a past or present instant of this host).
    pub(crate) fn to_sim(&self, t: Instant) -> Duration {
        let s = self.state.borrow();
        let linear = |(h, at): (Instant, Duration)| {
            if t >= h {
                at + (t - h)
            } else {
                at.saturating_sub(h - t)
            }
        };
        match s.steps.iter().rev().find(|st| st.from <= t) {
            Some(st) => match st.anchor {
                Some((h, at)) if t >= h => linear((h, at)),
                _ => st.at + (t - st.from).min(TICK),
            },
            None => match s.base {
                Some(b) => linear(b),
                None => sim_elapsed(),
            },
        }
    }

    /// The current simulated time, as this host's clock maps to it.
    pub(crate) fn now(&self) -> Duration {
        self.to_sim(Instant::now())
    }

    /// Steps this host's clock forward by each `(at, by)` (simulated time, step size), in order
    /// of `at`. Runs on the host; returns after the last step.
    pub(crate) async fn run_steps(
        self,
        mut steps: Vec<(Duration, Duration)>,
        trace: Trace,
        host: String,
    ) {
        steps.sort();
        for (at, by) in steps {
            let now = self.now();
            if at > now {
                // No step of this host lies in between, so host time and simulated time run
                // alike until then.
                sleep(at - now).await;
            }
            let from = Instant::now();
            let step = Step {
                from,
                at: self.to_sim(from),
                anchor: None,
            };
            self.state.borrow_mut().steps.push(step);
            trace.record_at(step.at, &host, EventKind::ClockStepped { by });
            tokio::time::advance(by + TICK).await;
            // In the next tick turmoil's simulated time is exact again: anchor there.
            sleep_until(from + by + TICK + Duration::from_micros(1)).await;
            let anchor = (Instant::now(), sim_elapsed());
            if let Some(last) = self.state.borrow_mut().steps.last_mut() {
                last.anchor = Some(anchor);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of 50 ms at 10 ms: the host's clock runs 50 ms ahead afterwards, a timer due inside
    /// the step fires in the collapsed tick, and host instants map back to simulated time.
    #[test]
    fn a_step_moves_the_host_clock_and_maps_back() {
        let mut sim = turmoil::Builder::new()
            .tick_duration(TICK)
            .simulation_duration(Duration::from_secs(1))
            .build();
        sim.client("h", async {
            let clock = HostClock::default();
            clock.start();
            let t0 = Instant::now();
            let trace = Trace::new();
            let steps = tokio::task::spawn_local(clock.clone().run_steps(
                vec![(Duration::from_millis(10), Duration::from_millis(50))],
                trace.clone(),
                "h".into(),
            ));
            sleep(Duration::from_millis(5)).await;
            assert_eq!(clock.now(), Duration::from_millis(5));
            // Due at host time 25 ms, inside the step: fires in the collapsed tick.
            sleep(Duration::from_millis(20)).await;
            let woke = clock.now();
            assert!(
                woke >= Duration::from_millis(10) && woke <= Duration::from_millis(11),
                "woke at {woke:?}"
            );
            steps.await?;
            sleep(Duration::from_millis(30)).await;
            let sim_now = turmoil::sim_elapsed().unwrap_or_default();
            assert_eq!(clock.now(), sim_now);
            // The host's clock is 50 ms ahead of simulated time.
            assert_eq!(Instant::now() - t0, sim_now + Duration::from_millis(50));
            assert!(matches!(
                trace.events()[..],
                [crate::trace::Event {
                    kind: EventKind::ClockStepped { .. },
                    ..
                }]
            ));
            Ok(())
        });
        sim.run().expect("the simulation runs");
    }
}
