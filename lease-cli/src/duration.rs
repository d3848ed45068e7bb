//! Durations on the command line: `500ms`, `30s`, `2m`, `1h`, `1m30s`, `1.5s`.

use std::time::Duration;

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
    fn formats() {
        assert_eq!(human(Duration::from_millis(250)), "250ms");
        assert_eq!(human(Duration::from_millis(1500)), "1.5s");
        assert_eq!(human(Duration::from_secs(125)), "2m05s");
        assert_eq!(human(Duration::from_secs(3720)), "1h02m");
    }
}
