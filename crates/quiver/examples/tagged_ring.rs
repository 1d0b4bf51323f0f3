//! Each rank sends 1 MiB to the next rank with a tagged send and receives from any rank
//! (Push-Pull underneath). Run: `quiver run -n 4 -- ./target/release/examples/tagged_ring`.

use quiver::tagged::{Src, Tag, Tagged};
use quiver::Job;

fn main() -> quiver::Result<()> {
    let job = Job::from_env()?;
    let t = Tagged::open(&job, 2)?; // every rank opens DPID 2
    let peer = (job.rank() + 1) % job.size();
    let out = vec![job.rank() as u8; 1 << 20];
    let mut inb = vec![0u8; 1 << 20];
    let status = t.scope(|s| {
        let r = s.irecv(&mut inb, Src::Any, Tag::Is(7))?; // posted first: no pushed buffer
        let w = s.isend(peer, 7, &out)?;
        w.wait()?;
        r.wait() // Status { peer, tag, len }
    })?;
    let from = status.peer as u8;
    assert!(inb.iter().all(|&b| b == from));
    println!(
        "rank {} received {} bytes from rank {}",
        job.rank(),
        status.len,
        status.peer
    );
    Ok(())
}
