//! Wire format of the network transports (placeholder: being written).
/// Length of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 32;
