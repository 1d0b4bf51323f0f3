//! Channel layer: per-channel state of a directed edge (source endpoint to destination
//! endpoint), written sans-IO: frames go in, deliveries and loss reports come out;
//! nothing here touches a socket or a clock.
//!
//! Today this is the receive side of the unreliable network path: sequence numbers
//! detect loss and duplication, and multi-fragment Directed Messages are reassembled.
//! Reliability (acknowledgements, retransmission, credits) builds on the same structure.

pub mod reliable;
pub mod rx;

pub use rx::{Delivery, RxChannel, SpareBuffers};
