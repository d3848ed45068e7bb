//! The etcd backend (under construction).
