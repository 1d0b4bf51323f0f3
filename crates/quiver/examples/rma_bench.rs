//! One-sided operations measured (the deposit seed's E-D6, beside `bench/progs/mpi_rma.c`
//! for Open MPI): rank 0 works on rank 1's window while rank 1 only makes progress until
//! rank 0 raises a flag in its window (with the offload engine it would not even need
//! to; inside a node it has nothing to do). Printed as JSON lines on rank 0:
//!
//! - `put_us`: 8-byte put followed by a flush (the put is in the window when the flush
//!   returns), median of `ITERS`;
//! - `get_us`: 8-byte get, median;
//! - `fadd_us`: fetch-and-add on a word, median;
//! - `barrier_us`: `Rma::barrier` on both ranks, the slower rank's median of `ITERS`;
//! - `put_MBps` per size: `REPS` puts of the size to the same place, then one flush,
//!   payload bytes / time, median of 5 rounds;
//! - `get_MBps` per size: one get of the size, median of `REPS`.
//!
//! usage: quiver run -n 2 -- ./target/release/examples/rma_bench [SIZES [ITERS [REPS]]]
//! (SIZES comma-separated bytes, default 65536,1048576,16777216; ITERS 10000; REPS 20.)

use quiver::rma::{Combine, Rma};
use quiver::Job;
use std::time::Instant;

const WARMUP: usize = 1000;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> quiver::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let sizes: Vec<usize> = args
        .get(1)
        .map_or("65536,1048576,16777216", String::as_str)
        .split(',')
        .map(|s| s.parse().expect("sizes: comma-separated byte counts"))
        .collect();
    let iters: usize = args.get(2).map_or(10_000, |s| s.parse().expect("ITERS"));
    let reps: usize = args.get(3).map_or(20, |s| s.parse().expect("REPS"));
    let job = Job::from_env()?;
    if job.size() != 2 {
        eprintln!("rma_bench runs on 2 ranks");
        std::process::exit(2);
    }
    let largest = sizes.iter().copied().max().unwrap_or(8).max(64);
    let rma = Rma::open(&job, 5)?;
    rma.set_wait(job.config().wait);
    let win = rma.allocate(largest)?;
    let flags = rma.allocate(64)?;
    job.barrier_progressing(&[&rma])?;
    // The barrier, on both ranks.
    for _ in 0..WARMUP {
        rma.barrier()?;
    }
    let mut bar = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        rma.barrier()?;
        bar.push(t.elapsed().as_secs_f64() * 1e6);
    }
    // The slowest rank's median (bench/progs/mpi_rma.c reports MPI_Barrier's so too).
    let slowest = rma.combine((median(bar) * 1000.0) as u64, Combine::Max)?;
    if job.rank() == 0 {
        println!(
            "{{\"bench\":\"rma_barrier\",\"size\":0,\"barrier_us\":{:.3}}}",
            slowest as f64 / 1000.0
        );
    }
    if job.rank() == 1 {
        // Serves rank 0's requests until rank 0 raises the flag in this rank's window.
        while flags.word(0)?.load(std::sync::atomic::Ordering::Acquire) == 0 {
            rma.progress()?;
        }
        report(&rma, "target");
        return Ok(());
    }
    let data = vec![7u8; largest];
    let mut word = [0u8; 8];
    for _ in 0..WARMUP {
        rma.put(1, &win, 0, &word)?;
        rma.flush(1)?;
        rma.get(1, &win, 0, &mut word)?;
    }
    let time = |f: &mut dyn FnMut() -> quiver::Result<()>| -> quiver::Result<Vec<f64>> {
        let mut v = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            f()?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(v)
    };
    let put = time(&mut || {
        rma.put(1, &win, 0, &word)?;
        rma.flush(1)
    })?;
    let mut w = [0u8; 8];
    let get = time(&mut || rma.get(1, &win, 0, &mut w))?;
    let fadd = time(&mut || rma.fetch_add(1, &win, 8, 1).map(|_| ()))?;
    println!(
        "{{\"bench\":\"rma_latency\",\"size\":8,\"put_us\":{:.3},\"get_us\":{:.3},\"fadd_us\":{:.3}}}",
        median(put),
        median(get),
        median(fadd)
    );
    let mut back = vec![0u8; largest];
    for &size in &sizes {
        let mut put_rates = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                rma.put(1, &win, 0, &data[..size])?;
            }
            rma.flush(1)?;
            put_rates.push((size * reps) as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
        let mut get_rates = Vec::new();
        for _ in 0..reps {
            let t = Instant::now();
            rma.get(1, &win, 0, &mut back[..size])?;
            get_rates.push(size as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
        assert!(
            back[..size].iter().all(|&b| b == 7),
            "the window holds what was put"
        );
        println!(
            "{{\"bench\":\"rma_bw\",\"size\":{size},\"put_MBps\":{:.0},\"get_MBps\":{:.0}}}",
            median(put_rates),
            median(get_rates)
        );
    }
    rma.fetch_add(1, &flags, 0, 1)?;
    report(&rma, "origin");
    Ok(())
}

/// What the channel did meanwhile, on stderr (the tables read stdout).
fn report(rma: &Rma, role: &str) {
    let st = rma.endpoint().stats();
    eprintln!(
        "rma_bench {role}: frames sent {}, retransmissions {} (timeouts {}, fast {}), credit stalls {}",
        st.frames_sent, st.retransmissions, st.timeouts, st.fast_retransmits, st.credit_stalls
    );
}
