//! The lease facade (under construction).
pub use lease_core::*;
