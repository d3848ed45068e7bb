//! The sqlite backend (under construction).
