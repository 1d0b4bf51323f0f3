//! GAMMA's ports: every rank binds port 0 to port 0 of the next rank, and a receive
//! buffer with a handler that keeps each message (re-binding a fresh buffer) and signals
//! the port; a token goes round the ring `ROUNDS` times, each rank adding its rank to it.
//! Run: `quiver run -n 4 -- ./target/release/examples/ports_ring`.

use quiver::ports::{Delivery, Ports};
use quiver::Job;
use std::sync::{Arc, Mutex};

const ROUNDS: u64 = 3;

fn main() -> quiver::Result<()> {
    let job = Job::from_env()?;
    let (rank, size) = (job.rank(), job.size());
    let ports = Ports::open(&job, 3)?; // every rank opens DPID 3
    let kept = Arc::new(Mutex::new(Vec::new()));
    let k = kept.clone();
    ports
        .bind(0)
        .to((rank + 1) % size, 0) // where sends through port 0 go
        .buffer(vec![0; 8]) // where messages arriving on port 0 land
        .handler(move |d: &mut Delivery<'_>| {
            // Keep this message; the next one lands in a fresh buffer.
            let full = d.rebind(vec![0; 8]);
            k.lock()
                .unwrap()
                .push(u64::from_le_bytes(full[..8].try_into().unwrap()));
            d.signal();
        })
        .on_error(|e| eprintln!("port error: {e}"))
        .apply()?;
    job.barrier()?; // every rank is bound before the token starts
    for round in 0..ROUNDS {
        if rank == 0 {
            ports.send(0, &(round * 1000).to_le_bytes())?;
            ports.wait(0, 1)?; // the token came back
        } else {
            ports.wait(0, 1)?;
            let token = *kept.lock().unwrap().last().unwrap();
            ports.send(0, &(token + u64::from(rank)).to_le_bytes())?;
        }
    }
    if rank == 0 {
        let sum: u64 = (1..u64::from(size)).sum();
        let got = kept.lock().unwrap().clone();
        let want: Vec<u64> = (0..ROUNDS).map(|r| r * 1000 + sum).collect();
        assert_eq!(got, want, "the token did not add up");
        println!("rank 0: the token went round {ROUNDS} times: {got:?}");
    }
    Ok(())
}
