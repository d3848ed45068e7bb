//! The lease CLI (under construction).
fn main() {}
