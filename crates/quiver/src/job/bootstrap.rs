//! Bootstrap (placeholder: being written).
