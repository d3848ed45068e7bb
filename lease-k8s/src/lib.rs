//! The k8s backend (under construction).
