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

impl Source {
    /// The rank that names "every member of the group" in the engine's tables (never a
    /// real rank: a job has fewer).
    pub(crate) const GROUP_RANK: u32 = u32::MAX;

    /// The destination "every endpoint `dpid` of the job on the other nodes", reached
    /// through the link's broadcast (the engine's group channel).
    pub(crate) const fn group(dpid: u16) -> Source {
        Source {
            rank: Self::GROUP_RANK,
            dpid,
        }
    }

    /// Whether this is [`Source::group`].
    pub(crate) const fn is_group(&self) -> bool {
        self.rank == Self::GROUP_RANK
    }
}
