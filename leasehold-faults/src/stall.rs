//! How late this process's own runtime runs its tasks.
//!
//! Every timeliness check of the suite (a loss reported before the deadline, no write in flight
//! at it) assumes that the holder's process is scheduled: a supervisor cannot cancel work, nor
//! report a loss, while its task does not run. A host with more runnable threads than cores, or a
//! worker thread blocked by a synchronous call, delays tasks in the same way as a pause of the
//! process. The [`StallMonitor`] measures that delay in the process under test, so that a report
//! can show how late the runtime ran (and a violation can be set against the stalls around it)
//! rather than guess.
//!
//! The same ticker watches the host's wall clock against the monotonic one: a step of the wall
//! clock (an NTP step, `date -s`, a virtual machine paused and its clock corrected afterwards) is
//! invisible to the supervisor, which runs on a monotonic clock, but it moves every expiry that a
//! store judges by its wall clock (PostgreSQL's `clock_timestamp()`, Redis's `PX`, SQLite's
//! `unixepoch()` on this host). [`StallMonitor::worst_step_between`] tells a report when that
//! happened.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! let monitor = leasehold_faults::stall::StallMonitor::start(Duration::from_millis(5));
//! tokio::time::sleep(Duration::from_millis(50)).await;
//! let lag = monitor.summary();
//! assert!(lag.samples > 0);
//! # }
//! ```

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A lag at or above this is kept as a stall episode, with the instant it began.
pub const EPISODE: Duration = Duration::from_millis(20);

/// How many lag buckets of one millisecond the histogram keeps; longer lags go in the last one.
const BUCKETS: usize = 10_000;

/// A change of the wall clock's offset from the monotonic clock of at least this between two
/// wake-ups is kept as a step (both clocks are read together; their reads differ by microseconds).
pub const STEP: Duration = Duration::from_millis(10);

#[derive(Debug)]
struct Log {
    /// `histogram[ms]`: how many ticks ran that many whole milliseconds late.
    histogram: Vec<u64>,
    /// Lags of [`EPISODE`] or more: when the tick was due, and how late it ran.
    episodes: Vec<(Instant, Duration)>,
    max: Duration,
    /// Wall-clock steps: when seen, and by how much the wall clock moved against the monotonic
    /// clock (positive: forward).
    steps: Vec<(Instant, f64)>,
}

/// A task that sleeps `tick` over and over and records how late each wake-up ran. It stops when
/// dropped.
#[derive(Debug)]
pub struct StallMonitor {
    log: Arc<Mutex<Log>>,
    stop: CancellationToken,
}

/// The distribution of the lags a [`StallMonitor`] saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StallSummary {
    /// Ticks measured.
    pub samples: u64,
    /// Median lag (whole milliseconds).
    pub p50: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// The longest lag.
    pub max: Duration,
    /// Lags of [`EPISODE`] or more.
    pub episodes: u64,
    /// Steps of the wall clock of [`STEP`] or more.
    pub steps: u64,
    /// The largest wall-clock step, in seconds (its sign: forward or back).
    pub largest_step: f64,
}

impl StallMonitor {
    /// Starts measuring on the current runtime, one wake-up every `tick`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(tick: Duration) -> Self {
        let log = Arc::new(Mutex::new(Log::default()));
        let stop = CancellationToken::new();
        let (l, s) = (log.clone(), stop.clone());
        tokio::spawn(async move {
            let mut offset = wall_offset();
            loop {
                let due = Instant::now() + tick;
                tokio::select! {
                    () = s.cancelled() => return,
                    () = tokio::time::sleep_until(due) => {}
                }
                // Timers have a resolution of a millisecond: a wake-up within it is on time.
                let lag = Instant::now().saturating_duration_since(due);
                let now = wall_offset();
                let mut log = l.lock().unwrap_or_else(|p| p.into_inner());
                log.add(due, lag);
                if (now - offset).abs() >= STEP.as_secs_f64() {
                    log.steps.push((Instant::now(), now - offset));
                }
                offset = now;
            }
        });
        StallMonitor { log, stop }
    }

    /// The lags seen so far.
    pub fn summary(&self) -> StallSummary {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let samples: u64 = log.histogram.iter().sum();
        let quantile = |q: f64| {
            if samples == 0 {
                return Duration::ZERO;
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let rank = ((samples as f64) * q).ceil().max(1.0) as u64;
            let mut seen = 0;
            for (ms, n) in log.histogram.iter().enumerate() {
                seen += n;
                if seen >= rank {
                    return Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
                }
            }
            log.max
        };
        StallSummary {
            samples,
            p50: quantile(0.5),
            p99: quantile(0.99),
            p999: quantile(0.999),
            max: log.max,
            episodes: u64::try_from(log.episodes.len()).unwrap_or(u64::MAX),
            steps: u64::try_from(log.steps.len()).unwrap_or(u64::MAX),
            largest_step: log
                .steps
                .iter()
                .map(|(_, s)| *s)
                .max_by(|a, b| a.abs().total_cmp(&b.abs()))
                .unwrap_or(0.0),
        }
    }

    /// The largest wall-clock step (seconds, signed) seen in `[from, to]`, if any.
    pub fn worst_step_between(&self, from: Instant, to: Instant) -> Option<f64> {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.steps
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, s)| *s)
            .max_by(|a, b| a.abs().total_cmp(&b.abs()))
    }

    /// The longest lag of a wake-up that was due in `[from, to]` or ran late into it: how long
    /// the runtime may have left a task unscheduled in that window.
    pub fn worst_between(&self, from: Instant, to: Instant) -> Duration {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.episodes
            .iter()
            .filter(|(due, lag)| *due <= to && *due + *lag >= from)
            .map(|(_, lag)| *lag)
            .max()
            .unwrap_or(Duration::ZERO)
    }
}

/// The wall clock minus the monotonic clock, in seconds: constant unless the wall clock steps
/// (or slews, by microseconds per second).
fn wall_offset() -> f64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    wall - MONOTONIC_ORIGIN.elapsed().as_secs_f64()
}

static MONOTONIC_ORIGIN: std::sync::LazyLock<std::time::Instant> =
    std::sync::LazyLock::new(std::time::Instant::now);

impl Default for Log {
    fn default() -> Self {
        Log {
            histogram: vec![0; BUCKETS],
            episodes: Vec::new(),
            max: Duration::ZERO,
            steps: Vec::new(),
        }
    }
}

impl Log {
    fn add(&mut self, due: Instant, lag: Duration) {
        let ms = usize::try_from(lag.as_millis()).unwrap_or(usize::MAX);
        self.histogram[ms.min(BUCKETS - 1)] += 1;
        self.max = self.max.max(lag);
        if lag >= EPISODE {
            self.episodes.push((due, lag));
        }
    }
}

impl Drop for StallMonitor {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Display for StallSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} / {} / {} / {}",
            self.p50.as_millis(),
            self.p99.as_millis(),
            self.p999.as_millis(),
            self.max.as_millis()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The monitor must see a stall: a task that blocks its thread for 100 ms (a synchronous
    /// call on a one-thread runtime) delays the monitor's wake-up by about that much.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_runtime_is_seen() {
        let m = StallMonitor::start(Duration::from_millis(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let before = Instant::now();
        std::thread::sleep(Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(10)).await;
        let s = m.summary();
        assert!(s.max >= Duration::from_millis(80), "{s:?}");
        assert!(s.episodes >= 1, "{s:?}");
        assert!(
            m.worst_between(before, Instant::now()) >= Duration::from_millis(80),
            "{s:?}"
        );
    }

    /// Quantiles count from the histogram.
    #[test]
    fn quantiles() {
        let mut log = Log::default();
        let now = Instant::now();
        for _ in 0..98 {
            log.add(now, Duration::from_micros(300));
        }
        log.add(now, Duration::from_millis(5));
        log.add(now, Duration::from_millis(30));
        let m = StallMonitor {
            log: Arc::new(Mutex::new(log)),
            stop: CancellationToken::new(),
        };
        let s = m.summary();
        assert_eq!(s.samples, 100);
        assert_eq!(s.p50, Duration::ZERO);
        assert_eq!(s.p99, Duration::from_millis(5));
        assert_eq!(s.max, Duration::from_millis(30));
        assert_eq!(s.episodes, 1);
        assert_eq!(
            m.worst_between(now, now + Duration::from_millis(1)),
            Duration::from_millis(30)
        );
    }

    /// Steps are kept with their sign and found by window.
    #[test]
    fn steps_by_window() {
        let mut log = Log::default();
        let now = Instant::now();
        log.steps.push((now, 0.02));
        log.steps.push((now + Duration::from_secs(1), -18.5));
        let m = StallMonitor {
            log: Arc::new(Mutex::new(log)),
            stop: CancellationToken::new(),
        };
        assert_eq!(m.summary().steps, 2);
        assert!((m.summary().largest_step + 18.5).abs() < 1e-9);
        assert_eq!(m.worst_step_between(now, now), Some(0.02));
        assert_eq!(
            m.worst_step_between(now, now + Duration::from_secs(2)),
            Some(-18.5)
        );
        assert_eq!(
            m.worst_step_between(now + Duration::from_secs(3), now + Duration::from_secs(4)),
            None
        );
    }
}
