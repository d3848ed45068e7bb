//! OpenTelemetry metrics for lease (under construction).
