//! Directed Point endpoints (placeholder API).
use crate::{Result, Transport};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

/// Where a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Source {
    /// Rank of the sending process.
    pub rank: u32,
    /// DPID of the sending endpoint.
    pub dpid: u16,
}

/// Counters of an endpoint.
#[derive(Debug, Clone, Default)]
pub struct EndpointStats {
    /// Messages written.
    pub msgs_sent: u64,
    /// Payload bytes written.
    pub bytes_sent: u64,
    /// Messages read.
    pub msgs_received: u64,
    /// Payload bytes read.
    pub bytes_received: u64,
}

/// A Directed Point endpoint.
pub struct Endpoint {}

/// A zero-copy view of a received message.
pub struct Message<'a> {
    _ep: &'a Endpoint,
}

impl std::ops::Deref for Message<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        todo!()
    }
}

impl Message<'_> {
    /// Sender of the message.
    pub fn source(&self) -> Source {
        todo!()
    }
}

impl Endpoint {
    /// This endpoint's DPID.
    pub fn dpid(&self) -> u16 {
        todo!()
    }
    /// Sets the destination of `write` to endpoint `dpid` of node `nid`.
    pub fn target(&self, _nid: u32, _dpid: u16) -> Result<()> {
        todo!()
    }
    /// Sets the destination of `write` to the endpoint with this endpoint's DPID on `rank`.
    pub fn target_rank(&self, _rank: u32) -> Result<()> {
        todo!()
    }
    /// Sets the destination to endpoint `dpid` on `rank`.
    pub fn target_endpoint(&self, _rank: u32, _dpid: u16) -> Result<()> {
        todo!()
    }
    /// Sends one message to the target.
    pub fn write(&self, _data: &[u8]) -> Result<()> {
        todo!()
    }
    /// Next message, blocking per the wait mode.
    pub fn read(&self) -> Result<Message<'_>> {
        todo!()
    }
    /// Next message, waiting at most `timeout`.
    pub fn read_timeout(&self, _timeout: Duration) -> Result<Message<'_>> {
        todo!()
    }
    /// Next message if one is waiting.
    pub fn try_read(&self) -> Result<Option<Message<'_>>> {
        todo!()
    }
    /// Frees the `n` oldest held tokens.
    pub fn release(&self, _n: usize) -> usize {
        todo!()
    }
    /// Transport used towards `rank`.
    pub fn transport_to(&self, _rank: u32) -> Result<Transport> {
        todo!()
    }
    /// Counters.
    pub fn stats(&self) -> EndpointStats {
        todo!()
    }
    /// Closes the endpoint.
    pub fn close(self) {}
}

impl AsRawFd for Endpoint {
    fn as_raw_fd(&self) -> RawFd {
        todo!()
    }
}
