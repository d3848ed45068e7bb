//! What the instruments record beyond the defaults.

/// Options for [`LeaseMetrics`](crate::LeaseMetrics).
///
/// By default no instrument carries the lease key: keys are unbounded in number and every
/// distinct attribute set is a separate time series in the metrics backend. Opt in when the
/// application uses a small, fixed set of keys (a handful of singleton jobs, one election).
///
/// ```
/// use leasehold_otel::OtelConfig;
/// let config = OtelConfig::new().with_key_attribute();
/// assert!(config.key_attribute());
/// assert!(!OtelConfig::default().key_attribute());
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OtelConfig {
    key_attribute: bool,
}

impl OtelConfig {
    /// The defaults: `lease.backend` (and the instrument's own attributes) only.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the `lease.key` attribute to every data point that concerns one key.
    pub fn with_key_attribute(mut self) -> Self {
        self.key_attribute = true;
        self
    }

    /// Whether data points carry `lease.key`.
    pub fn key_attribute(&self) -> bool {
        self.key_attribute
    }
}
