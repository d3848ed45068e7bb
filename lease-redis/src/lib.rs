//! The redis backend (under construction).
