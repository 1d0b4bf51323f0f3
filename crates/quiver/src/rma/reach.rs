//! Whether this process may read and write the memory of a same-node peer directly, by
//! cross-memory attach (`process_vm_readv`/`writev`), and the proof it asks for first.
//!
//! A pid in a message names the peer only if both share a pid namespace, and the kernel
//! may refuse attach altogether (Yama, seccomp). So each endpoint publishes a nonce (its
//! pid, the address of a word and the word's value) in the rendezvous store under
//! `cma/RANK/DPID`; a peer probes that word once, and trusts the pid only if it reads the
//! value. A refusal by the kernel holds for every peer and is recorded once ([`Reach::cma`]);
//! a wrong process only for that peer.

use crate::error::Result;
use crate::job::rendezvous::Rendezvous;
use crate::link::cma;
use std::cell::RefCell;
use std::collections::HashMap;

/// What one endpoint knows about reaching its same-node peers' memory.
pub(crate) struct Reach {
    dpid: u16,
    /// What is known of cross-memory attach itself (off for good after the first
    /// refusal, which is logged once).
    pub cma: cma::CmaState,
    /// Peers (by rank) whose memory was verified readable, or found not to be.
    peers: RefCell<HashMap<u32, bool>>,
}

impl Reach {
    /// Publishes this endpoint's nonce (endpoint `dpid` of `rank`) in `store`.
    pub(crate) fn publish(store: &Rendezvous, rank: u32, dpid: u16) -> Result<Reach> {
        let nonce = cma::probe_target();
        store.put(
            &format!("cma/{rank}/{dpid}"),
            &format!("{}:{}:{}", std::process::id(), nonce.addr, nonce.value),
        )?;
        Ok(Reach {
            dpid,
            cma: cma::CmaState::new(),
            peers: RefCell::new(HashMap::new()),
        })
    }

    /// Whether cross-memory attach reads the memory of `source` at `pid`: checked once
    /// per peer by reading the nonce it published.
    pub(crate) fn reaches(&self, store: &Rendezvous, source: u32, pid: u32) -> bool {
        if let Some(&ok) = self.peers.borrow().get(&source) {
            return ok;
        }
        let key = format!("cma/{source}/{}", self.dpid);
        let published = store.try_get(&key).ok().flatten();
        let target = published.as_deref().and_then(|v| {
            let mut f = v.split(':').map(|x| x.parse::<u64>().ok());
            let (p, addr, value) = (f.next()??, f.next()??, f.next()??);
            (p == u64::from(pid)).then_some(cma::ProbeTarget { addr, value })
        });
        let ok = match target {
            Some(t) => match cma::probe(pid, t) {
                Ok(()) => true,
                Err(e) => {
                    // Refusals by the kernel hold for every peer; a wrong process only
                    // for this one.
                    if matches!(
                        e.unavailable(),
                        Some(cma::Unavailable::NotPermitted | cma::Unavailable::Unsupported)
                    ) {
                        self.cma.record(pid, &e);
                    }
                    false
                }
            },
            None => false,
        };
        if !ok {
            tracing::info!(
                "rank {source}: its memory cannot be read directly (cross-memory attach); \
                 tagged messages from it take the two-copy path"
            );
        }
        self.peers.borrow_mut().insert(source, ok);
        ok
    }
}
