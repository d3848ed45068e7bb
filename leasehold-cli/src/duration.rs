//! Durations on the command line: `500ms`, `30s`, `2m`, `1h`, `1m30s`, `1.5s`, each checked
//! against its flag's range when parsed (a value out of range is a usage error, status 64).

use std::time::Duration;

/// The longest `--ttl`: the library's [`leasehold::MAX_TTL`] (24h).
pub(crate) const MAX_TTL: Duration = leasehold::MAX_TTL;
/// The longest `--wait`: a week. Every wait is bounded; this bound also keeps deadline arithmetic
/// (now + wait) far from overflow.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `--grace` accepted by the parser; `lease run` then requires it to fit before the
/// lease's local deadline (see `run::grace_budget`), which is far shorter.
pub(crate) const MAX_GRACE: Duration = MAX_TTL;

/// `--ttl`: from 1ms to [`MAX_TTL`].
pub(crate) fn ttl(text: &str) -> Result<Duration, String> {
    within(text, Duration::from_millis(1), MAX_TTL)
}

/// `--wait`: from zero (one attempt) to [`MAX_WAIT`].
pub(crate) fn wait(text: &str) -> Result<Duration, String> {
    within(text, Duration::ZERO, MAX_WAIT)
}

/// `--grace`: from zero (SIGKILL right after SIGTERM) to [`MAX_GRACE`].
pub(crate) fn grace(text: &str) -> Result<Duration, String> {
    within(text, Duration::ZERO, MAX_GRACE)
}

/// Parses `text` and checks that it lies in `min..=max`.
fn within(text: &str, min: Duration, max: Duration) -> Result<Duration, String> {
    let d = parse(text)?;
    if d < min || d > max {
        let low = if min.is_zero() {
            "0".to_string()
        } else {
            human(min)
        };
        return Err(format!(
            "{} is out of range: must be at least {low} and at most {}",
            text.trim(),
            human(max)
        ));
    }
    Ok(d)
}

/// Parses a duration: one or more `<number><unit>` parts with units `ms`, `s`, `m`, `h` (a lone
/// `0` is allowed without unit).
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let bad = || format!("invalid duration {text:?} (examples: 500ms, 30s, 2m, 1h, 1m30s)");
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let value: f64 = num.parse().map_err(|_| bad())?;
        let seconds = match unit {
            "ms" => value / 1000.0,
            "s" | "sec" => value,
            "m" | "min" => value * 60.0,
            "h" => value * 3600.0,
            _ => return Err(bad()),
        };
        let part = Duration::try_from_secs_f64(seconds).map_err(|_| bad())?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = next;
    }
    Ok(total)
}

/// Formats a duration for people: `1.5s`, `250ms`, `2m05s`.
pub(crate) fn human(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms < 60_000 {
        format!("{:.1}s", d.as_secs_f64())
    } else {
        let s = d.as_secs();
        if s < 3600 {
            format!("{}m{:02}s", s / 60, s % 60)
        } else {
            format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "30", "s", "3x", "-1s", "1..2s", "ms"] {
            assert!(parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn ranges_are_checked() {
        assert!(ttl("0").is_err());
        assert!(ttl("0ms").is_err());
        assert_eq!(ttl("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(ttl("24h"), Ok(MAX_TTL));
        assert!(ttl("24h1ms").is_err());
        assert_eq!(wait("0"), Ok(Duration::ZERO));
        assert_eq!(wait("168h"), Ok(MAX_WAIT));
        assert!(wait("168h1ms").is_err());
        assert_eq!(grace("0"), Ok(Duration::ZERO));
        for flag in [ttl, wait, grace] {
            let err = flag("3000000000000000h").expect_err("huge");
            assert!(err.contains("at most"), "{err}");
            // Larger than any Duration: the sum overflows, still an error.
            assert!(flag("18446744073709551615s1s").is_err());
            assert!(flag(&format!("{}h", "9".repeat(400))).is_err());
        }
    }

    #[test]
    fn formats() {
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_secs(125)), "2m05s");
        assert_eq!(human(Duration::from_secs(3720)), "1h02m");
    }
}
