//! The postgres backend (under construction).
