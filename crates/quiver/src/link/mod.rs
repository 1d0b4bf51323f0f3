//! Link layer: transports that move frames between endpoints.
#[cfg(not(loom))]
pub mod cma;
#[cfg(not(loom))]
pub(crate) mod eth;
#[cfg(not(loom))]
pub mod fault;
#[cfg(not(loom))]
pub(crate) mod network;
pub mod shm;
#[cfg(all(test, not(loom)))]
pub mod sim;
#[cfg(not(loom))]
pub mod udp;
// Compiled (and tested) always; the eth link calls it only with the feature.
#[cfg(not(loom))]
#[cfg_attr(not(feature = "eth-turnaround"), allow(dead_code))]
mod turnaround;

/// What opening an endpoint's network link takes ([`network::NetLink::open`]), built by
/// the layer above from its configuration: the link layer reads no configuration itself.
#[derive(Debug, Clone)]
pub(crate) struct LinkParams {
    /// Raw Ethernet is wanted, and by what (named in the line that says why it fell back
    /// to UDP); `None`: UDP.
    pub eth_wanted_by: Option<&'static str>,
    /// Send runs of equal datagrams with UDP segmentation offload.
    pub udp_gso: bool,
    /// Receive coalesced runs with UDP receive offload while traffic streams.
    pub udp_gro: bool,
    /// Largest datagram, if fixed; else it follows the interface MTU.
    pub datagram: Option<usize>,
    /// Bytes of the receive pool (udp; at least four windows of datagrams).
    pub pool_size: usize,
    /// Channel window of a link that sends frame by frame.
    pub window: u16,
    /// Channel window of UDP that sends runs with segmentation offload.
    pub window_segmented: u16,
    /// Frames of the Ethernet receive ring, if fixed; else [`LinkParams::eth_ring_frames`].
    pub eth_ring: Option<usize>,
}

#[cfg(not(loom))]
impl LinkParams {
    /// Frames of the Ethernet receive ring of an endpoint with `remote_ranks` possible
    /// senders on other nodes and frames of `frame_bytes` ([`eth::ring_frames`]).
    pub(crate) fn eth_ring_frames(&self, remote_ranks: usize, frame_bytes: usize) -> usize {
        self.eth_ring
            .unwrap_or_else(|| eth::ring_frames(self.window, remote_ranks, frame_bytes))
    }
}

/// A received datagram, as every network link hands it out: the slot that holds it
/// (a pool slot on udp, a ring frame on eth) and its length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Datagram {
    pub slot: u32,
    pub len: usize,
}

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
