//! Channel layer (placeholder).
