//! Endpoint addresses: the (rank, DPID) pair that names an endpoint inside a job.
//!
//! Every layer that carries messages between endpoints names them with this type, so it
//! lives on the lowest floor, beside [`crate::error`]: links (the shm ring records its
//! sender), the engine (the peer table) and the personalities all import it from here.

/// Where a message came from: the sending endpoint's rank and DPID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    /// Rank of the sending process.
    pub rank: u32,
    /// DPID of the sending endpoint.
    pub dpid: u16,
}
