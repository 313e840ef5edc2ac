//! Placeholder; see daemon/mod.rs.
