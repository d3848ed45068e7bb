//! Timestamps of the JSON event lines, and the JSON log format (`--log-format json`).

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The wall-clock time now as RFC 3339 in UTC with milliseconds, `2026-12-06T07:15:02.431Z`:
/// the `ts` member of every JSON event line and log record.
pub(crate) fn now() -> String {
    rfc3339(SystemTime::now())
}

/// `t` as RFC 3339 in UTC with milliseconds. A time before 1970 prints as the epoch.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX / 2);
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// How `lease` writes its logs (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines (tracing's default format).
    #[default]
    Text,
    /// One JSON object per line: `ts`, `level`, `target`, `message` and the event's fields.
    Json,
}

/// Formats each log event as one JSON object per line (see [`LogFormat::Json`]).
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields(Map::new());
        fields.0.insert("ts".into(), Value::from(now()));
        fields
            .0
            .insert("level".into(), Value::from(meta.level().as_str()));
        fields.0.insert("target".into(), Value::from(meta.target()));
        event.record(&mut fields);
        writeln!(writer, "{}", Value::Object(fields.0))
    }
}

/// Collects an event's fields into a JSON object.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::from(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day in a year divisible by 400), 12:34:56.789.
        let t = UNIX_EPOCH + Duration::from_millis(951_827_696_789);
        assert_eq!(rfc3339(t), "2000-02-29T12:34:56.789Z");
        // 2100-03-01: 2100 is not a leap year.
        let t = UNIX_EPOCH + Duration::from_secs(4_107_542_400);
        assert_eq!(rfc3339(t), "2100-03-01T00:00:00.000Z");
        // The far future does not panic.
        let _ = rfc3339(UNIX_EPOCH + Duration::from_secs(u64::MAX / 4));
    }
}
