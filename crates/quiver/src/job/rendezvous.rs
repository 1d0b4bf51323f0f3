//! Rendezvous store (placeholder: being written).
