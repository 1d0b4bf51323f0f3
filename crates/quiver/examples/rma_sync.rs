//! The deposit seed's E-D1: what it costs to synchronize one all-to-all step, with no
//! data, by three schemes on one `Rma` (the seed's Figure 2):
//!
//! - `pairwise`: every rank acknowledges every other rank (an empty `put_notify` to
//!   its counter) and waits for the n-1 acknowledgements to it: n(n-1) control
//!   messages, RRMSG's per-transfer synchronization;
//! - `tree`: one combining-tree round (`combine`): 2(n-1) control messages in 2 log n
//!   steps;
//! - `barrier`: `Rma::barrier` (shared cache lines inside a node, dissemination among
//!   the nodes' leaders).
//!
//! Printed by rank 0 as JSON lines: the median over `ITERS` steps of each scheme, in µs.
//!
//! usage: quiver run -n N -- ./target/release/examples/rma_sync [ITERS]   (default 2000)

use quiver::rma::{Combine, Rma};
use quiver::Job;
use std::time::Instant;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> quiver::Result<()> {
    let iters: usize = std::env::args()
        .nth(1)
        .map_or(2000, |s| s.parse().expect("ITERS"));
    let job = Job::from_env()?;
    let (me, n) = (job.rank(), job.size());
    let rma = Rma::open(&job, 6)?;
    rma.set_wait(job.config().wait);
    let acks = rma.allocate(64)?;
    job.barrier_progressing(&[&rma])?;
    let schemes: [(&str, &dyn Fn() -> quiver::Result<()>); 3] = [
        ("pairwise", &|| {
            for k in 1..n {
                rma.put_notify((me + k) % n, &acks, 0, &[], 0)?;
            }
            rma.wait_counter(&acks, 0, u64::from(n - 1))
        }),
        ("tree", &|| rma.combine(1, Combine::Sum).map(|_| ())),
        ("barrier", &|| rma.barrier()),
    ];
    for (name, step) in schemes {
        for _ in 0..iters / 10 {
            step()?;
        }
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            step()?;
            times.push(t.elapsed().as_secs_f64() * 1e6);
        }
        // The slowest rank's median is the step's cost.
        let mine = (median(times) * 1000.0) as u64;
        let slowest = rma.combine(mine, Combine::Max)?;
        if me == 0 {
            println!(
                "{{\"bench\":\"sync\",\"ranks\":{n},\"scheme\":\"{name}\",\"us\":{:.3}}}",
                slowest as f64 / 1000.0
            );
        }
    }
    rma.barrier()?;
    Ok(())
}
