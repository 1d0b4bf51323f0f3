//! Broadcast through GAMMA's ports, measured: rank 0 broadcasts through a port bound to
//! every other rank (`Bind::to_all`: through the link's own broadcast where it has one,
//! raw Ethernet's multicast; down a binomial tree of unicasts with
//! `QUIVER_NATIVE_BROADCAST=off` or where it has none) and every other
//! rank answers each broadcast, or each window of them, with an empty message to rank
//! 0's acknowledgement port. Printed per size, as JSON lines on rank 0:
//!
//! - `last_us_median`: the time from the broadcast until rank 0 has every receiver's
//!   acknowledgement (so: until the last receiver had the message, plus one hop back),
//!   median over `ITERS` broadcasts;
//! - `bcast_MBps`: windows of `WINDOW` broadcasts, each window acknowledged once by every
//!   receiver: payload bytes of the window / its time, median over the windows.
//!
//! usage: quiver run -n N -- ./target/release/examples/ports_bcast [SIZES [ITERS [WINDOW]]]
//! (SIZES comma-separated bytes, default 8,1024,65536; ITERS 1000; WINDOW 16.) The wait
//! mode is `QUIVER_WAIT` (hybrid by default: several ranks may share a core).

use quiver::ports::Ports;
use quiver::Job;
use std::time::Instant;

const DATA: u8 = 0;
const ACK: u8 = 1;
/// Untimed 8-byte broadcasts before the first size.
const WARMUP: usize = 2000;

fn main() -> quiver::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<usize> = args
        .get(1)
        .map_or("8,1024,65536", String::as_str)
        .split(',')
        .map(|s| s.parse().expect("sizes: comma-separated byte counts"))
        .collect();
    let iters: usize = args.get(2).map_or(1000, |s| s.parse().expect("ITERS"));
    let window: usize = args.get(3).map_or(16, |s| s.parse().expect("WINDOW"));
    let job = Job::from_env()?;
    let (rank, n) = (job.rank(), job.size());
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let ports = Ports::open(&job, 4)?;
    ports.set_wait(job.config().wait);
    ports
        .bind(DATA)
        .to_all(DATA)
        .buffer(vec![0; largest])
        .apply()?;
    if rank != 0 {
        ports.bind(ACK).to(0, ACK).apply()?;
    }
    job.barrier_progressing(&[&ports])?;
    let acks = u64::from(n - 1);
    // The first milliseconds of a fresh cluster are slow (the first 8-byte broadcasts
    // took 150 µs instead of 11): a warm-up of WARMUP broadcasts before any size.
    for _ in 0..WARMUP {
        if rank == 0 {
            ports.send(DATA, &[0; 8])?;
            ports.wait(ACK, acks)?;
        } else {
            ports.wait(DATA, 1)?;
            ports.send(ACK, &[])?;
        }
    }
    for &size in &sizes {
        let buf = vec![0x5a_u8; size];
        // Latency to the last receiver (plus one hop back).
        let warmup = iters / 10;
        let mut lat = Vec::with_capacity(iters);
        for i in 0..warmup + iters {
            if rank == 0 {
                let t0 = Instant::now();
                ports.send(DATA, &buf)?;
                ports.wait(ACK, acks)?;
                if i >= warmup {
                    lat.push(t0.elapsed().as_secs_f64() * 1e6);
                }
            } else {
                ports.wait(DATA, 1)?;
                ports.send(ACK, &[])?;
            }
        }
        // Throughput: windows of broadcasts, one acknowledgement per receiver each.
        let windows = (iters / window).clamp(3, 50);
        let mut bw = Vec::with_capacity(windows);
        for w in 0..windows + 1 {
            if rank == 0 {
                let t0 = Instant::now();
                for _ in 0..window {
                    ports.send(DATA, &buf)?;
                }
                ports.wait(ACK, acks)?;
                if w > 0 {
                    bw.push((size * window) as f64 / t0.elapsed().as_secs_f64() / 1e6);
                }
            } else {
                ports.wait(DATA, window as u64)?;
                ports.send(ACK, &[])?;
            }
        }
        if rank == 0 {
            let way = if ports.stats().native_broadcasts > 0 {
                "native"
            } else {
                "tree"
            };
            println!(
                "{{\"system\":\"quiver ports ({way})\",\"ranks\":{n},\"size\":{size},\
                 \"last_us_median\":{:.3},\"bcast_MBps\":{:.3},\"iters\":{iters},\"window\":{window}}}",
                median(&mut lat),
                median(&mut bw)
            );
        }
    }
    job.barrier_progressing(&[&ports])?;
    if std::env::var_os("QUIVER_BCAST_STATS").is_some() {
        eprintln!(
            "rank {rank}: {:?} {:?}",
            ports.stats(),
            ports.endpoint().stats()
        );
    }
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}
