//! The counters of an endpoint ([`EndpointStats`]), which the driver and the endpoint keep
//! and `Endpoint::stats` hands out.

/// Counters of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Messages written.
    pub msgs_sent: u64,
    /// Payload bytes written.
    pub bytes_sent: u64,
    /// Messages read.
    pub msgs_received: u64,
    /// Payload bytes read.
    pub bytes_received: u64,
    /// Network frames (UDP datagrams or Ethernet frames) sent.
    pub frames_sent: u64,
    /// Network frames received.
    pub frames_received: u64,
    /// Ethernet frames the kernel dropped because the endpoint's receive ring was full
    /// (repaired by retransmission in `host` and `offload` mode).
    pub ring_drops: u64,
    /// Ethernet frames a channel kept (out of order, or not yet read) that were copied
    /// out of the receive ring when the ring came round to them, so that the kernel
    /// could go on filling it.
    pub ring_evacuations: u64,
    /// Writes that found the receiver's pool full and had to wait.
    pub send_stalls: u64,
    /// Frames dropped because they did not decode (truncated, bad version, bad kind...).
    pub dropped_malformed: u64,
    /// Frames dropped because they belong to another job.
    pub dropped_foreign_job: u64,
    /// Frames of this job id dropped because their token is wrong.
    pub dropped_bad_token: u64,
    /// Frames dropped because they name another endpoint or an unknown rank.
    pub dropped_misaddressed: u64,
    /// Frames of this job, with its token, dropped because they did not come from the
    /// address the rank they name published (udp: its IP address).
    pub dropped_spoofed: u64,
    /// Datagrams dropped because their tag was wrong or missing (`QUIVER_AUTH=on`).
    pub dropped_unauthenticated: u64,
    /// Messages dropped because they exceed this endpoint's maximum.
    pub dropped_oversized: u64,
    /// Duplicate frames ignored.
    pub duplicates: u64,
    /// Frames detected as lost (gaps in sequence numbers).
    pub lost_frames: u64,
    /// Shared-memory rings found corrupt (their sender is ignored from then on).
    pub corrupt_rings: u64,
    /// Network frames sent again after a timeout or a selective acknowledgement.
    pub retransmissions: u64,
    /// Expiries of the network channels' retransmission timers. Each resends every
    /// unacknowledged frame the peer has not reported received; under selective repeat
    /// (the default) with no hole reported, only the oldest, and the others if the next
    /// acknowledgements show them lost (F-RTO). When the peer's stats show the resent
    /// frames as [`duplicates`](Self::duplicates) and no
    /// [`lost_frames`](Self::lost_frames), the expiries were spurious (acknowledgements
    /// late, not frames lost).
    pub timeouts: u64,
    /// Repairs started by a selective acknowledgement (a frame reported missing by the
    /// peer) rather than by the timer.
    pub fast_retransmits: u64,
    /// Tail-loss probes: a sender's last frames went unacknowledged for two round trips
    /// with nothing after them, and the newest was sent again (also counted in
    /// `retransmissions`); the receiver's answer shows which were lost, and they are
    /// resent without waiting for the retransmission timeout.
    pub tail_probes: u64,
    /// Network frames whose CRC32C did not match (dropped; repaired by retransmission in
    /// `host` mode, reported in `none` mode).
    pub checksum_failures: u64,
    /// Network frames that arrived ahead of a missing one.
    pub out_of_order: u64,
    /// Times a network sender found its window closed (no credits) and waited.
    pub credit_stalls: u64,
    /// Explicit acknowledgement frames sent (the others ride on data frames).
    pub acks_sent: u64,
    /// Datagrams the fault injector (`QUIVER_FAULTS`) dropped.
    pub faults_lost: u64,
    /// Datagrams the fault injector sent twice.
    pub faults_duplicated: u64,
    /// Datagrams the fault injector held back so that later ones passed them.
    pub faults_reordered: u64,
    /// Datagrams the fault injector corrupted.
    pub faults_corrupted: u64,
}
