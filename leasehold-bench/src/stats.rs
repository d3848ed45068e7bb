//! Confidence for the report's ratios: a percentile bootstrap over paired per-round ratios, and
//! the verdict a goal gets from the interval rather than from one figure.
//!
//! Throughput: every round of the interleaved run gives each side one block, so each round gives
//! one paired ratio (side A's rate over side B's in the same seconds). Rounds of one process
//! share that process's luck (its connections, its table pages, where its threads run), so the
//! bootstrap has two levels: it draws the processes (repeats) with replacement, then the rounds
//! of each drawn process with replacement, and takes the geometric mean of the drawn ratios. With
//! one process it is the plain bootstrap of its rounds. The generator is a SplitMix64 with a
//! fixed seed: the same measurements give the same interval.

/// Resamples per interval.
pub(crate) const RESAMPLES: usize = 2000;
/// The interval's coverage (two-sided, equal tails).
pub(crate) const LEVEL: f64 = 0.95;

/// SplitMix64: small, fast, seedable; plenty for drawing indices.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform index in `0..n` (`n > 0`; the modulo bias is below 2^-40 for the sizes here).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        let n = u64::try_from(n.max(1)).unwrap_or(u64::MAX);
        usize::try_from(self.next_u64() % n).unwrap_or(0)
    }

    /// A uniform float in `[0, 1)`.
    #[cfg(test)]
    pub(crate) fn unit(&mut self) -> f64 {
        // 53 random bits, exactly representable.
        let bits = self.next_u64() >> 11;
        f64::from(u32::try_from(bits >> 21).unwrap_or(0)) * 2f64.powi(-32)
            + f64::from(u32::try_from(bits & 0x1f_ffff).unwrap_or(0)) * 2f64.powi(-53)
    }
}

/// A ratio with its bootstrap confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Interval {
    /// The point estimate.
    pub(crate) est: f64,
    /// Lower and upper bound of the [`LEVEL`] interval.
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// How many paired ratios (rounds, or samples for a quantile) and processes it rests on.
    pub(crate) n: usize,
    pub(crate) groups: usize,
}

impl Interval {
    /// `0.93 [0.90, 0.96]`, with `digits` decimals.
    pub(crate) fn show(&self, digits: usize) -> String {
        format!(
            "{:.digits$} [{:.digits$}, {:.digits$}]",
            self.est, self.lo, self.hi
        )
    }
}

/// The lower and upper percentile of sorted `v` for the [`LEVEL`] interval.
fn bounds(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let last = v.len().saturating_sub(1);
    let at = |p: f64| {
        let i = (p * f64::from(u32::try_from(last).unwrap_or(u32::MAX))).round();
        // `i` is in 0..=last: the cast back cannot truncate.
        let i = (0..=last)
            .find(|j| f64::from(u32::try_from(*j).unwrap_or(u32::MAX)) >= i)
            .unwrap_or(last);
        v[i]
    };
    let tail = (1.0 - LEVEL) / 2.0;
    (at(tail), at(1.0 - tail))
}

fn count(n: usize) -> f64 {
    f64::from(u32::try_from(n).unwrap_or(u32::MAX))
}

/// The geometric mean of paired ratios, grouped by process (`groups[p]` holds process `p`'s
/// per-round ratios), with its two-level bootstrap interval. Ratios that are not finite and
/// positive are left out; `None` with fewer than two ratios left.
pub(crate) fn ratio_interval(groups: &[Vec<f64>], seed: u64) -> Option<Interval> {
    let logs: Vec<Vec<f64>> = groups
        .iter()
        .map(|g| {
            g.iter()
                .filter(|r| r.is_finite() && **r > 0.0)
                .map(|r| r.ln())
                .collect::<Vec<f64>>()
        })
        .filter(|g| !g.is_empty())
        .collect();
    let n: usize = logs.iter().map(Vec::len).sum();
    if n < 2 {
        return None;
    }
    let mean = logs.iter().flatten().sum::<f64>() / count(n);
    let mut rng = Rng::new(seed);
    let mut draws = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        let (mut sum, mut k) = (0.0, 0usize);
        for _ in 0..logs.len() {
            let g = &logs[rng.below(logs.len())];
            for _ in 0..g.len() {
                sum += g[rng.below(g.len())];
            }
            k += g.len();
        }
        draws.push(sum / count(k));
    }
    let (lo, hi) = bounds(draws);
    Some(Interval {
        est: mean.exp(),
        lo: lo.exp(),
        hi: hi.exp(),
        n,
        groups: logs.len(),
    })
}

/// The `q` quantile of `v` (nearest rank, as `measure::quantile_ms`), reordering `v`.
fn quantile(v: &mut [f64], q: f64) -> f64 {
    let last = v.len() - 1;
    let i = (q * count(last)).round();
    let i = (0..=last).find(|j| count(*j) >= i).unwrap_or(last);
    *v.select_nth_unstable_by(i, f64::total_cmp).1
}

/// The ratio of the `q` quantiles of `a` over `b`, paired by index (`a[i]` and `b[i]` were taken
/// in the same round), with the bootstrap interval of the rounds. `None` without two pairs.
pub(crate) fn quantile_ratio_interval(a: &[f64], b: &[f64], q: f64, seed: u64) -> Option<Interval> {
    let n = a.len().min(b.len());
    if n < 2 {
        return None;
    }
    let ratio = |x: &mut [f64], y: &mut [f64]| {
        let d = quantile(y, q);
        (d > 0.0).then(|| quantile(x, q) / d)
    };
    let est = ratio(&mut a[..n].to_vec(), &mut b[..n].to_vec())?;
    let mut rng = Rng::new(seed);
    let (mut x, mut y) = (vec![0.0; n], vec![0.0; n]);
    let mut draws = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        for j in 0..n {
            let i = rng.below(n);
            x[j] = a[i];
            y[j] = b[i];
        }
        if let Some(r) = ratio(&mut x, &mut y) {
            draws.push(r);
        }
    }
    if draws.is_empty() {
        return None;
    }
    let (lo, hi) = bounds(draws);
    Some(Interval {
        est,
        lo,
        hi,
        n,
        groups: 1,
    })
}

/// The median of `v` (the upper median, as the report's), with the bootstrap interval of the
/// samples; `None` without samples. One sample gives an interval of that sample alone.
pub(crate) fn median_interval(v: &[f64], seed: u64) -> Option<Interval> {
    if v.is_empty() {
        return None;
    }
    let est = quantile(&mut v.to_vec(), 0.5);
    let mut rng = Rng::new(seed);
    let mut x = vec![0.0; v.len()];
    let mut draws = Vec::with_capacity(RESAMPLES);
    for _ in 0..RESAMPLES {
        for slot in &mut x {
            *slot = v[rng.below(v.len())];
        }
        draws.push(quantile(&mut x, 0.5));
    }
    let (lo, hi) = bounds(draws);
    Some(Interval {
        est,
        lo,
        hi,
        n: v.len(),
        groups: 1,
    })
}

/// A goal's verdict from an interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The whole interval is on the goal's side.
    Met,
    /// The whole interval falls short.
    Missed,
    /// The interval straddles the goal: this run cannot tell.
    Inconclusive,
}

impl Outcome {
    /// The goal `ratio >= goal`: met when the lower bound clears it, missed when the upper bound
    /// falls short.
    pub(crate) fn at_least(iv: &Interval, goal: f64) -> Self {
        if iv.lo >= goal {
            Outcome::Met
        } else if iv.hi < goal {
            Outcome::Missed
        } else {
            Outcome::Inconclusive
        }
    }

    /// The goal `ratio <= goal`: met when the upper bound is within it, missed when the lower
    /// bound exceeds it.
    pub(crate) fn at_most(iv: &Interval, goal: f64) -> Self {
        if iv.hi <= goal {
            Outcome::Met
        } else if iv.lo > goal {
            Outcome::Missed
        } else {
            Outcome::Inconclusive
        }
    }

    pub(crate) fn word(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::Missed => "**missed**",
            Outcome::Inconclusive => "inconclusive",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A standard normal draw (Box-Muller).
    fn normal(rng: &mut Rng) -> f64 {
        let u = rng.unit().max(1e-300);
        let v = rng.unit();
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// Log-ratios from a known normal distribution: the 95% interval covers the true geometric
    /// mean in about 95% of runs, and its width is about 2 x 1.96 sigma / sqrt(n).
    #[test]
    fn the_interval_covers_a_known_mean_at_its_level() {
        let (mu, sigma, n, trials) = (0.9f64.ln(), 0.05, 60u32, 300u32);
        let mut rng = Rng::new(7);
        let mut covered = 0;
        let mut widths = 0.0;
        for t in 0..trials {
            let ratios: Vec<f64> = (0..n)
                .map(|_| (mu + sigma * normal(&mut rng)).exp())
                .collect();
            let iv = ratio_interval(&[ratios], u64::from(t)).expect("enough ratios");
            assert!(iv.lo <= iv.est && iv.est <= iv.hi, "{iv:?}");
            if iv.lo <= mu.exp() && mu.exp() <= iv.hi {
                covered += 1;
            }
            widths += iv.hi.ln() - iv.lo.ln();
        }
        let coverage = f64::from(covered) / f64::from(trials);
        assert!((0.90..=0.985).contains(&coverage), "coverage {coverage}");
        let width = widths / f64::from(trials);
        let expected = 2.0 * 1.96 * sigma / f64::from(n).sqrt();
        assert!(
            (width / expected - 1.0).abs() < 0.15,
            "width {width} against {expected}"
        );
    }

    /// Processes that differ by a shared offset widen the interval: rounds of one process are
    /// not independent draws, and the two-level bootstrap does not treat them as such.
    #[test]
    fn a_process_level_offset_widens_the_interval() {
        let mut rng = Rng::new(11);
        let offsets = [-0.06, 0.04, -0.02, 0.07, -0.03];
        let groups: Vec<Vec<f64>> = offsets
            .iter()
            .map(|o| {
                (0..16)
                    .map(|_| (o + 0.01 * normal(&mut rng)).exp())
                    .collect()
            })
            .collect();
        let clustered = ratio_interval(&groups, 1).expect("enough");
        let flat = ratio_interval(&[groups.concat()], 1).expect("enough");
        assert!(
            clustered.hi / clustered.lo > 2.0 * (flat.hi / flat.lo - 1.0) + 1.0,
            "clustered {clustered:?} flat {flat:?}"
        );
    }

    /// A deliberately biased pair (the library side 10% slower, 3% noise per round) is missed
    /// against 0.95; an even pair is met; a pair right at the goal is inconclusive. The verdict
    /// can therefore fail.
    #[test]
    fn a_biased_pair_is_missed_an_even_pair_met_and_a_borderline_one_inconclusive() {
        let mut rng = Rng::new(3);
        let mut draw = |bias: f64| -> Vec<Vec<f64>> {
            (0..5)
                .map(|_| {
                    (0..16)
                        .map(|_| (bias.ln() + 0.03 * normal(&mut rng)).exp())
                        .collect()
                })
                .collect()
        };
        let biased = ratio_interval(&draw(0.90), 5).expect("enough");
        assert_eq!(
            Outcome::at_least(&biased, 0.95),
            Outcome::Missed,
            "{biased:?}"
        );
        let even = ratio_interval(&draw(1.0), 5).expect("enough");
        assert_eq!(Outcome::at_least(&even, 0.95), Outcome::Met, "{even:?}");
        let borderline = ratio_interval(&draw(0.95), 5).expect("enough");
        assert_eq!(
            Outcome::at_least(&borderline, 0.95),
            Outcome::Inconclusive,
            "{borderline:?}"
        );
        // The same for an upper goal (p99 <= 1.1x).
        let slow = ratio_interval(&draw(1.25), 5).expect("enough");
        assert_eq!(Outcome::at_most(&slow, 1.1), Outcome::Missed, "{slow:?}");
        assert_eq!(Outcome::at_most(&even, 1.1), Outcome::Met, "{even:?}");
    }

    #[test]
    fn quantile_ratios_are_paired_by_round() {
        // b is a with every sample 20% higher: the p99 ratio is 1/1.2 in every resample.
        let mut rng = Rng::new(5);
        let a: Vec<f64> = (0..400).map(|_| 1.0 + rng.unit()).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 1.2).collect();
        let iv = quantile_ratio_interval(&a, &b, 0.99, 1).expect("enough");
        for x in [iv.est, iv.lo, iv.hi] {
            assert!((x - 1.0 / 1.2).abs() < 1e-9, "{iv:?}");
        }
        assert!(quantile_ratio_interval(&a[..1], &b[..1], 0.99, 1).is_none());
    }

    #[test]
    fn a_median_interval_holds_the_median_and_widens_with_spread() {
        let tight: Vec<f64> = (0..20).map(|i| 10.0 + f64::from(i % 3) * 0.1).collect();
        let iv = median_interval(&tight, 1).expect("samples");
        assert!(
            iv.lo <= iv.est && iv.est <= iv.hi && iv.hi - iv.lo <= 0.2 + 1e-9,
            "{iv:?}"
        );
        // Half the samples far out: the interval reaches them.
        let split: Vec<f64> = (0..20)
            .map(|i| if i % 2 == 0 { 1.0 } else { 9.0 })
            .collect();
        let iv = median_interval(&split, 1).expect("samples");
        assert_eq!((iv.lo, iv.hi), (1.0, 9.0), "{iv:?}");
        let one = median_interval(&[4.0], 1).expect("one sample");
        assert_eq!((one.lo, one.est, one.hi), (4.0, 4.0, 4.0));
        assert!(median_interval(&[], 1).is_none());
    }

    #[test]
    fn too_few_or_bad_ratios_give_no_interval() {
        assert!(ratio_interval(&[], 1).is_none());
        assert!(ratio_interval(&[vec![1.0]], 1).is_none());
        assert!(ratio_interval(&[vec![f64::NAN, 0.0, -1.0, f64::INFINITY]], 1).is_none());
        let iv = ratio_interval(&[vec![1.0, 1.0], vec![]], 1).expect("two ratios");
        assert_eq!(
            (iv.lo, iv.est, iv.hi, iv.n, iv.groups),
            (1.0, 1.0, 1.0, 2, 1)
        );
    }
}
