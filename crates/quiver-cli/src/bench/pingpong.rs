//! Ping-pong latency: rank 0 sends a message and waits for rank 1's echo of the same
//! size; each round trip is timed on rank 0 (send, then receive the echo), and one-way
//! latency is half of it. Warm-up round trips are not timed. The clock is `quanta`'s
//! calibrated time-stamp counter where the CPU has a stable one (about 10 ns a read
//! here, against 24 ns for `clock_gettime`, whose cost would otherwise be part of every
//! sub-microsecond sample), else the monotonic clock.
//!
//! With the Directed Point API (`--api dm`) a send is `write` and a receive is `read`
//! and the release of the message. With the tagged API (`--api tagged`) they are the
//! blocking [`Tagged::send`] and [`Tagged::recv`] with tag [`DATA_TAG`] into a buffer of
//! the message's size, in the push mode in force (`--push`, `QUIVER_PUSH`); a send
//! returns when the receiver has what was not pushed. With GAMMA's ports (`--api
//! ports`) they are a send through the data port and a wait for its signal
//! (`bench::ports`).

use super::buffer::PageAligned;
use super::ctx::{check_len, Ctx, DATA_TAG};
use super::output::BenchResult;
use super::ports;
use super::stats::Summary;
use super::Bench;
use anyhow::Context as _;
use quiver::tagged::Tagged;

/// Runs one size; rank 0 returns the result, rank 1 `None`.
pub fn run(ctx: &Ctx<'_>, size: usize) -> anyhow::Result<Option<BenchResult>> {
    let (iters, warmup) = ctx.iterations(Bench::Pingpong, size, 1);
    let buf = PageAligned::new(size, 0x5a);
    let samples = match (ctx.tagged, ctx.ports) {
        (Some(t), _) => tagged_one_way_samples(t, ctx.rank, buf.as_slice(), warmup, iters)?,
        (_, Some(p)) => {
            let copy = ctx.opts.ports_copy;
            ports::one_way_samples(p, ctx.rank, buf.as_slice(), warmup, iters, copy)?
        }
        _ => one_way_samples(ctx, buf.as_slice(), warmup, iters)?,
    };
    if ctx.rank != 0 {
        return Ok(None);
    }
    let s = Summary::of_nanos(samples).context("no samples to summarize")?;
    let mut r = ctx.result(Bench::Pingpong, size, iters, warmup);
    r.set_latency(&s);
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
    let clock = quanta::Clock::new();
    for i in 0..total {
        let t0 = clock.raw();
        ctx.send(buf, "ping")?;
        let msg = ctx.recv().context("reading pong")?;
        let len = msg.len();
        drop(msg);
        let rtt = clock.delta(t0, clock.raw());
        check_len(len, size, "pong")?;
        if i >= warmup {
            samples.push(rtt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(samples)
}

/// The tagged ping-pong between `rank` 0 and 1 (blocking send and receive with
/// [`DATA_TAG`]): rank 0's one-way samples in ns, none on rank 1. Shared with
/// `tune-btp` and the calibration of `early-late`.
pub fn tagged_one_way_samples(
    t: &Tagged,
    rank: u32,
    buf: &[u8],
    warmup: u64,
    iters: u64,
) -> anyhow::Result<Vec<f64>> {
    let size = buf.len();
    let total = warmup + iters;
    let peer = 1 - rank;
    let mut rbuf = PageAligned::new(size, 0);
    let rbuf = rbuf.as_mut_slice();
    if rank != 0 {
        for _ in 0..total {
            let st = t.recv(rbuf, peer, DATA_TAG).context("receiving ping")?;
            check_len(st.len as usize, size, "ping")?;
            t.send(peer, DATA_TAG, buf).context("sending pong")?;
        }
        return Ok(Vec::new());
    }
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    let clock = quanta::Clock::new();
    for i in 0..total {
        let t0 = clock.raw();
        t.send(peer, DATA_TAG, buf).context("sending ping")?;
        let st = t.recv(rbuf, peer, DATA_TAG).context("receiving pong")?;
        let rtt = clock.delta(t0, clock.raw());
        check_len(st.len as usize, size, "pong")?;
        if i >= warmup {
            samples.push(rtt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(samples)
}
