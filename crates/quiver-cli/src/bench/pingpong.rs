//! Ping-pong latency: rank 0 writes a message and waits for rank 1's echo of the same
//! size; each round trip is timed on rank 0 with `Instant` (write, then read and release
//! the echo), and one-way latency is half of it. Warm-up round trips are not timed.

use super::output::{round, BenchResult};
use super::runner::{check_len, Ctx};
use super::stats::Summary;
use super::Bench;
use anyhow::Context as _;
use std::time::Instant;

/// Runs one size; rank 0 returns the result, rank 1 `None`.
pub fn run(ctx: &Ctx<'_>, size: usize) -> anyhow::Result<Option<BenchResult>> {
    let (iters, warmup) = ctx.iterations(Bench::Pingpong, size, 1);
    let buf = vec![0x5au8; size];
    let samples = one_way_samples(ctx, &buf, warmup, iters)?;
    if ctx.rank != 0 {
        return Ok(None);
    }
    let s = Summary::of_nanos(samples).context("no samples to summarize")?;
    let mut r = BenchResult::new(
        Bench::Pingpong,
        &ctx.transport_name(),
        &ctx.wait,
        size,
        iters,
        warmup,
    );
    r.reliability = ctx.reliability.clone();
    r.latency_us_median = Some(round(s.median / 1e3, 4));
    r.latency_us_avg80 = Some(round(s.avg80 / 1e3, 4));
    r.latency_us_p99 = Some(round(s.p99 / 1e3, 4));
    r.latency_us_min = Some(round(s.min / 1e3, 4));
    r.latency_us_max = Some(round(s.max / 1e3, 4));
    Ok(Some(r))
}

/// The ping-pong itself: rank 1 echoes, rank 0 times each round trip; returns rank 0's
/// one-way samples (round trip / 2, in ns) after `warmup` untimed ones, and none on
/// rank 1. Shared with the latency phase of `logp`.
pub fn one_way_samples(
    ctx: &Ctx<'_>,
    buf: &[u8],
    warmup: u64,
    iters: u64,
) -> anyhow::Result<Vec<f64>> {
    let size = buf.len();
    let total = warmup + iters;
    if ctx.rank != 0 {
        for _ in 0..total {
            ctx.recv_expect(size, "ping")?;
            ctx.send(buf, "pong")?;
        }
        return Ok(Vec::new());
    }
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    for i in 0..total {
        let t0 = Instant::now();
        ctx.send(buf, "ping")?;
        let msg = ctx.recv().context("reading pong")?;
        let len = msg.len();
        drop(msg);
        let rtt = t0.elapsed();
        check_len(len, size, "pong")?;
        if i >= warmup {
            samples.push(rtt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(samples)
}
