//! Engine (placeholder).
