//! Link layer: transports that move frames between endpoints.
#[cfg(not(loom))]
pub mod cma;
#[cfg(not(loom))]
pub(crate) mod eth;
#[cfg(not(loom))]
pub(crate) mod network;
pub mod shm;
#[cfg(not(loom))]
pub mod sim;
#[cfg(not(loom))]
pub mod udp;
// Compiled (and tested) always; the eth link calls it only with the feature.
#[cfg(not(loom))]
#[cfg_attr(not(feature = "eth-turnaround"), allow(dead_code))]
mod turnaround;

/// The transports quiver can use between two endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Shared-memory receive rings (same node).
    Shm,
    /// UDP datagrams.
    Udp,
    /// Raw Ethernet frames (`AF_PACKET`).
    Eth,
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Shm => "shm",
            Transport::Udp => "udp",
            Transport::Eth => "eth",
        })
    }
}
