//! UDP transport (placeholder).
