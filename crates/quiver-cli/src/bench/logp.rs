//! LogP parameters between rank 0 and rank 1, like Table 4 of the LCI paper: per
//! message, in microseconds, for each size (default 8 B).
//!
//! Four phases, each preceded by a 1-byte handshake (rank 0 writes one byte, rank 1
//! answers with one byte) so that the phases never overlap; each phase first runs its
//! warm-up messages untimed, then `N` measured ones (`--iters`, default 10000 up to
//! 1 KiB):
//!
//! - `o_s`, send overhead: rank 0 writes `N` messages, separated by a busy-wait of
//!   [`SEND_SPACING`] (spinning on `Instant`) so that neither the peer nor the network is
//!   the bottleneck, and times only the write call; rank 1 reads them. The mean of the
//!   middle 80 % of the samples.
//! - `o_r`, receive overhead: for each of `N` messages, rank 0 writes a 1-byte request,
//!   rank 1 answers with one message, and rank 0 busy-waits [`RECV_DELAY`] (the message
//!   has surely arrived, and it is the only one waiting: over UDP still in the socket),
//!   then times only the read and the release of the message. Mean of the middle 80 %.
//! - `g`, gap: rank 0 writes `N` messages back to back as fast as it can; rank 1 reads
//!   them all and answers with a 1-byte ack; `g` is the time from the first write to the
//!   ack, divided by `N` (over shared memory, writes wait while the receiver's ring is
//!   full).
//! - `latency`, end-to-end one-way latency: a ping-pong as in [`super::pingpong`], the
//!   median of round trip / 2.
//!
//! `L = latency - o_s - o_r` where it can be told apart from the overheads, that is
//! where it comes out non-negative; otherwise it is not reported (JSON and CSV leave
//! it out, the table prints `n/s` and says why). Between processes of one kernel (UDP
//! on loopback, raw Ethernet or UDP across the veth pairs of an emulated cluster) the
//! sender's system call carries the datagram through the receiving side's kernel path
//! too (the softirq that a second machine's CPU would run), so `o_s` holds part of what
//! LogP counts in `L` and `o_s + o_r` exceeds the latency. Steering that work to the
//! receiver's core (receive packet steering on the switch ports) was tried: on this
//! virtual machine the inter-processor interrupt it sends costs the sender ~8 µs more,
//! which is no truer. Over shared memory the two overheads, each timed alone (a write
//! after a pause, a read of a message that waited), exceed a hot ping-pong's one-way
//! time as well: there is no wire, and L is the few nanoseconds of a cache line moving,
//! below what the overheads' own variation lets one see. `o_r`, `g` and the latency are
//! separable everywhere.
//! Over UDP every read gives up after the usual timeout.

use super::ctx::{check_len, Ctx};
use super::output::{round, BenchResult};
use super::stats::{self, Summary};
use super::Bench;
use anyhow::Context as _;
use std::time::{Duration, Instant};

/// Busy-wait between two writes of the overhead phases.
pub const SEND_SPACING: Duration = Duration::from_micros(20);

/// Busy-wait of rank 0 before each timed read of the `o_r` phase.
pub const RECV_DELAY: Duration = Duration::from_micros(100);

/// Spins until `d` has passed.
fn spin_for(d: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Mean of the middle 80 % of `samples` (nanoseconds), in microseconds.
pub fn avg80_us(mut samples: Vec<f64>) -> Option<f64> {
    stats::sort(&mut samples);
    stats::avg80(&samples).map(|ns| ns / 1e3)
}

/// Gap per message in microseconds: `elapsed` for `n` messages (`None` when `n` is 0).
pub fn gap_us(elapsed: Duration, n: u64) -> Option<f64> {
    (n > 0).then(|| elapsed.as_nanos() as f64 / 1e3 / n as f64)
}

/// L = latency - o_s - o_r, where it is separable from the overheads (module
/// documentation): `None` when it comes out negative.
pub fn big_l(latency_us: f64, o_s_us: f64, o_r_us: f64) -> Option<f64> {
    let l = latency_us - o_s_us - o_r_us;
    (l >= 0.0).then_some(l)
}

/// Keeps the two ranks in lock-step: rank 0 writes one byte and waits for rank 1's.
fn handshake(ctx: &Ctx<'_>, phase: &str) -> anyhow::Result<()> {
    let what = format!("handshake before {phase}");
    if ctx.rank == 0 {
        ctx.send(&[1], &what)?;
        ctx.recv_expect(1, &what)
    } else {
        ctx.recv_expect(1, &what)?;
        ctx.send(&[1], &what)
    }
}

/// Send overhead: rank 0's timed, spaced writes (ns samples on rank 0).
fn send_overhead(ctx: &Ctx<'_>, buf: &[u8], warmup: u64, iters: u64) -> anyhow::Result<Vec<f64>> {
    let size = buf.len();
    let total = warmup + iters;
    if ctx.rank != 0 {
        for _ in 0..total {
            ctx.recv_expect(size, "o_s message")?;
        }
        return Ok(Vec::new());
    }
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    for i in 0..total {
        spin_for(SEND_SPACING);
        let t0 = Instant::now();
        ctx.send(buf, "o_s message")?;
        let dt = t0.elapsed();
        if i >= warmup {
            samples.push(dt.as_nanos() as f64);
        }
    }
    Ok(samples)
}

/// Receive overhead: rank 0's timed reads of messages that have surely arrived.
fn recv_overhead(ctx: &Ctx<'_>, buf: &[u8], warmup: u64, iters: u64) -> anyhow::Result<Vec<f64>> {
    let size = buf.len();
    let total = warmup + iters;
    if ctx.rank != 0 {
        for _ in 0..total {
            ctx.recv_expect(1, "o_r request")?;
            ctx.send(buf, "o_r message")?;
        }
        return Ok(Vec::new());
    }
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    for i in 0..total {
        // One message at a time: a timed read must not find others already pulled in.
        ctx.send(&[1], "o_r request")?;
        spin_for(RECV_DELAY);
        let t0 = Instant::now();
        let msg = ctx.recv().context("reading o_r message")?;
        let len = msg.len();
        drop(msg);
        let dt = t0.elapsed();
        check_len(len, size, "o_r message")?;
        if i >= warmup {
            samples.push(dt.as_nanos() as f64);
        }
    }
    Ok(samples)
}

/// One back-to-back burst of `n` messages and the ack; rank 0 returns its duration.
fn burst(ctx: &Ctx<'_>, buf: &[u8], n: u64) -> anyhow::Result<Duration> {
    if ctx.rank != 0 {
        for _ in 0..n {
            ctx.recv_expect(buf.len(), "g message")?;
        }
        ctx.send(&[1], "g ack")?;
        return Ok(Duration::ZERO);
    }
    let t0 = Instant::now();
    for _ in 0..n {
        ctx.send(buf, "g message")?;
    }
    ctx.recv_expect(1, "g ack")?;
    Ok(t0.elapsed())
}

/// Runs one size; rank 0 returns the result, rank 1 `None`.
pub fn run(ctx: &Ctx<'_>, size: usize) -> anyhow::Result<Option<BenchResult>> {
    let (iters, warmup) = ctx.iterations(Bench::Logp, size, 1);
    let buf = vec![0x5au8; size];

    handshake(ctx, "o_s")?;
    let o_s = send_overhead(ctx, &buf, warmup, iters).context("o_s phase")?;
    handshake(ctx, "o_r")?;
    let o_r = recv_overhead(ctx, &buf, warmup, iters).context("o_r phase")?;
    handshake(ctx, "g")?;
    burst(ctx, &buf, warmup).context("g warm-up")?;
    let g_time = burst(ctx, &buf, iters).context("g phase")?;
    handshake(ctx, "latency")?;
    let lat =
        super::pingpong::one_way_samples(ctx, &buf, warmup, iters).context("latency phase")?;
    handshake(ctx, "the next size")?;
    if ctx.rank != 0 {
        return Ok(None);
    }

    let o_s = avg80_us(o_s).context("no o_s samples")?;
    let o_r = avg80_us(o_r).context("no o_r samples")?;
    let g = gap_us(g_time, iters).context("no g messages")?;
    let latency = Summary::of_nanos(lat).context("no latency samples")?.median / 1e3;
    let mut r = BenchResult::new(
        Bench::Logp,
        &ctx.transport_name(),
        &ctx.wait,
        size,
        iters,
        warmup,
    );
    r.reliability = ctx.reliability.clone();
    r.o_s_us = Some(round(o_s, 4));
    r.o_r_us = Some(round(o_r, 4));
    r.g_us = Some(round(g, 4));
    r.l_us = big_l(latency, o_s, o_r).map(|l| round(l, 4));
    r.latency_us = Some(round(latency, 4));
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pure_helpers() {
        // 1..=10 us: the middle 80 % is 2..=9 us, mean 5.5 us.
        let v: Vec<f64> = (1..=10).rev().map(|x| f64::from(x) * 1e3).collect();
        assert_eq!(avg80_us(v), Some(5.5));
        assert_eq!(avg80_us(Vec::new()), None);
        assert_eq!(gap_us(Duration::from_millis(5), 10_000), Some(0.5));
        assert_eq!(gap_us(Duration::from_millis(5), 0), None);
        assert_eq!(big_l(2.0, 0.5, 0.25), Some(1.25));
        assert_eq!(big_l(1.0, 0.5, 0.5), Some(0.0));
        assert_eq!(big_l(1.0, 0.75, 0.5), None);
    }

    #[test]
    fn spin_for_waits_at_least_the_duration() {
        let t0 = Instant::now();
        spin_for(Duration::from_micros(200));
        assert!(t0.elapsed() >= Duration::from_micros(200));
    }
}
