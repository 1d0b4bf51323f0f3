//! Bandwidth, the Directed Point way (DP paper, section 5.2).
//!
//! - `bw`: rank 0 writes a window of W messages; rank 1 reads them and answers with a
//!   1-byte acknowledgement; the window is timed on rank 0 from the first write to the
//!   acknowledgement.
//! - `bibw`: both ranks write a window to each other at the same time, draining what has
//!   arrived between their own writes (so that neither blocks on a full ring while the
//!   other does the same), then read the rest and exchange 1-byte acknowledgements. Both
//!   directions count.
//!
//! With the tagged API (`--api tagged`), the same exchanges in a [`Tagged::scope`]:
//! `bw`: rank 0 starts W `isend`s of the same buffer and waits for all of them, then
//! receives the 1-byte acknowledgement; rank 1 receives the W messages one by one into a
//! single buffer (as the MPI benchmarks do; W buffers of 1 MiB and more would be cold in
//! the cache), and sends the acknowledgement. `bibw`: each rank posts its W receives, starts
//! its W sends, waits for all, then they exchange acknowledgements (rank 0 sends first,
//! rank 1 receives first: a blocking send may wait for its receiver). Tags: data
//! [`DATA_TAG`], acknowledgements [`CONTROL_TAG`].
//!
//! With GAMMA's ports (`--api ports`), the same exchanges through bound ports
//! (`bench::ports`).
//!
//! - `rate`: `bw`'s exchange (8 B messages by default), counted in messages per second,
//!   as OSU's `osu_mbw_mr` with one pair; with the tagged API rank 1 posts the window's W
//!   receives first (into W slices of one buffer) and waits for all of them, as
//!   `osu_mbw_mr` does.
//!
//! One sample per window: bytes / window time, in MB/s (10^6 bytes/s), and messages /
//! window time; the result is the mean of the middle 80 % of the samples.
//!
//! Windows are capped where the transport cannot hold them: over UDP, to
//! [`UDP_WINDOW_BYTES`]; for `bibw`, to half the receive pool, so that both windows in
//! flight always fit (neither rank then waits in a send for a peer that waits in one
//! too); with the tagged API, to [`TAGGED_WINDOW_BYTES`] of receive buffers and, over
//! UDP, to a quarter of the network channel's window ([`tagged_window`]).

use super::buffer::PageAligned;
use super::ctx::{check_len, Ctx, CONTROL_TAG, DATA_TAG, RECORD_SLACK};
use super::output::{round, BenchResult};
use super::ports;
use super::stats::{self, avg80};
use super::Bench;
use anyhow::Context as _;
use quiver::tagged::Tagged;
use std::time::Instant;

/// Largest window over UDP, in bytes.
pub const UDP_WINDOW_BYTES: usize = 2 << 20;

/// Largest window of the tagged API, in bytes: a receive buffer per message of the
/// window is allocated.
pub const TAGGED_WINDOW_BYTES: usize = 64 << 20;

/// [`effective_window`] further capped for the tagged API: at most
/// [`TAGGED_WINDOW_BYTES`] per window, and over UDP at most a quarter of the frames a
/// network channel has in flight (`net_window`, `QUIVER_WINDOW`). The tagged layer writes
/// its protocol messages (pull requests, pulled data) from inside its receives; with more
/// messages in flight both ranks can end up in a write that waits for credits which the
/// other returns only when it reads (seen with bibw, 64 messages of 8 B to 4 KiB, push
/// zero).
pub fn tagged_window(window: u32, size: usize, network: bool, net_window: u16) -> u32 {
    let fit = TAGGED_WINDOW_BYTES / size.max(1);
    let mut w = window.min(u32::try_from(fit).unwrap_or(u32::MAX));
    if network {
        w = w.min(u32::from(net_window / 4));
    }
    w.max(1)
}

/// Messages per window for `bench` at `size` bytes on this transport.
pub fn effective_window(
    bench: Bench,
    size: usize,
    window: u32,
    network: bool,
    pool_size: usize,
) -> u32 {
    let cap = |w: u32, bytes: usize, per_msg: usize| -> u32 {
        let fit = bytes / per_msg.max(1);
        w.min(u32::try_from(fit).unwrap_or(u32::MAX)).max(1)
    };
    let mut w = window.max(1);
    if network && size > 0 {
        w = cap(w, UDP_WINDOW_BYTES, size);
    }
    if bench == Bench::Bibw {
        w = cap(w, pool_size / 2, size + RECORD_SLACK);
    }
    w
}

/// Runs one size of `bw` or `bibw`; rank 0 returns the result, rank 1 `None`.
pub fn run(ctx: &Ctx<'_>, bench: Bench, size: usize) -> anyhow::Result<Option<BenchResult>> {
    let mut window = effective_window(bench, size, ctx.opts.window, ctx.network(), ctx.pool_size);
    if ctx.tagged.is_some() {
        window = tagged_window(window, size, ctx.network(), ctx.net_window);
    }
    let (iters, warmup) = ctx.iterations(bench, size, window);
    let buf = PageAligned::new(size, 0xa5);
    let buf = buf.as_slice();
    // Receive buffers of the tagged API: one per message of a window for bibw (its
    // receives are all posted before its sends); bw's receiver takes the messages one
    // by one into a single buffer, as the MPI benchmarks do.
    let mut rbufs = PageAligned::new(
        match ctx.tagged {
            Some(_) if bench == Bench::Bibw => size * window as usize,
            Some(_) if bench == Bench::Rate && ctx.rank == 1 => size * window as usize,
            Some(_) if ctx.rank == 1 => size,
            _ => 0,
        },
        0,
    );
    let rbufs = rbufs.as_mut_slice();
    // With --ports-copy, where each received message is copied out of its port's buffer.
    let mut copy = ctx.opts.ports_copy.then(|| Vec::with_capacity(size));
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    let mut rates = Vec::with_capacity(samples.capacity());
    let bytes = size as f64 * f64::from(window) * if bench == Bench::Bibw { 2.0 } else { 1.0 };
    for i in 0..warmup + iters {
        let t0 = Instant::now();
        match (bench, ctx.rank, ctx.tagged) {
            (_, _, Some(t)) => tagged_window_exchange(t, ctx.rank, bench, buf, rbufs, window)?,
            (_, rank, None) if ctx.ports.is_some() => {
                let p = ctx.ports.context("ports")?;
                ports::window_exchange(p, rank, bench, buf, window, &mut copy)?;
            }
            (Bench::Bibw, _, None) => bibw_window(ctx, buf, window)?,
            (_, 0, None) => {
                for _ in 0..window {
                    ctx.send(buf, "data")?;
                }
                ctx.recv_expect(1, "acknowledgement")?;
            }
            _ => {
                for _ in 0..window {
                    ctx.recv_expect(size, "data")?;
                }
                ctx.send(&[0u8], "acknowledgement")?;
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        if i >= warmup && secs > 0.0 {
            samples.push(bytes / secs / 1e6);
            rates.push(f64::from(window) / secs);
        }
    }
    if ctx.rank != 0 {
        return Ok(None);
    }
    stats::sort(&mut samples);
    let mut r = ctx.result(bench, size, iters, warmup);
    r.window = Some(window);
    r.bandwidth_mbps = Some(round(
        avg80(&samples).context("no samples to summarize")?,
        3,
    ));
    r.bandwidth_mbps_median = stats::median_sorted(&samples).map(|v| round(v, 3));
    if bench == Bench::Rate {
        stats::sort(&mut rates);
        r.messages_per_s = avg80(&rates).map(|v| v.round());
        r.messages_per_s_median = stats::median_sorted(&rates).map(|v| v.round());
    }
    Ok(Some(r))
}

/// One bi-directional window: W writes interleaved with draining reads, the remaining
/// reads, then one acknowledgement each way.
fn bibw_window(ctx: &Ctx<'_>, buf: &[u8], window: u32) -> anyhow::Result<()> {
    let size = buf.len();
    let mut got = 0u32;
    for _ in 0..window {
        ctx.send(buf, "data")?;
        while got < window {
            match ctx.ep.try_read().context("polling for data")? {
                Some(msg) => {
                    let len = msg.len();
                    drop(msg);
                    check_len(len, size, "data")?;
                    got += 1;
                }
                None => break,
            }
        }
    }
    while got < window {
        ctx.recv_expect(size, "data")?;
        got += 1;
    }
    ctx.send(&[0u8], "acknowledgement")?;
    ctx.recv_expect(1, "acknowledgement")
}

/// One window of `bw` or `bibw` with the tagged API (see the module's documentation);
/// `rbufs` holds `window` receive buffers of `buf.len()` bytes where this rank receives.
fn tagged_window_exchange(
    t: &Tagged,
    rank: u32,
    bench: Bench,
    buf: &[u8],
    rbufs: &mut [u8],
    window: u32,
) -> anyhow::Result<()> {
    let size = buf.len();
    let peer = 1 - rank;
    let sends = bench == Bench::Bibw || rank == 0;
    // `rate`'s receiver posts the window's receives first, as osu_mbw_mr.
    let receives = bench == Bench::Bibw || (bench == Bench::Rate && rank == 1);
    if bench == Bench::Bw && rank == 1 {
        for _ in 0..window {
            let st = t
                .recv(&mut rbufs[..size], peer, DATA_TAG)
                .context("tagged message of the window")?;
            check_len(st.len as usize, size, "data")?;
        }
    }
    let statuses = t
        .scope(|s| {
            let mut reqs = Vec::with_capacity(2 * window as usize);
            if receives {
                // `chunks_mut` of an empty buffer yields nothing: size 0 needs empty slices.
                if size == 0 {
                    for _ in 0..window {
                        reqs.push(s.irecv(&mut [], peer, DATA_TAG)?);
                    }
                } else {
                    for chunk in rbufs.chunks_mut(size).take(window as usize) {
                        reqs.push(s.irecv(chunk, peer, DATA_TAG)?);
                    }
                }
            }
            if sends {
                for _ in 0..window {
                    reqs.push(s.isend(peer, DATA_TAG, buf)?);
                }
            }
            Ok(s.wait_all(reqs))
        })
        .context("window of tagged messages")?;
    for st in statuses {
        let st = st.context("tagged message of the window")?;
        check_len(st.len as usize, size, "data")?;
    }
    // A blocking send may wait for the receiver to pull (push mode zero): rank 0 sends
    // first and rank 1 receives first, never both sending at once.
    let mut ack = [0u8; 1];
    let mut receive_ack = || -> anyhow::Result<()> {
        let st = t
            .recv(&mut ack, peer, CONTROL_TAG)
            .context("receiving acknowledgement")?;
        check_len(st.len as usize, 1, "acknowledgement")
    };
    if rank == 0 {
        if bench == Bench::Bibw {
            t.send(peer, CONTROL_TAG, &[0])
                .context("sending acknowledgement")?;
        }
        receive_ack()
    } else {
        if bench == Bench::Bibw {
            receive_ack()?;
        }
        t.send(peer, CONTROL_TAG, &[0])
            .context("sending acknowledgement")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_capped_where_needed() {
        let pool = 4 << 20;
        // shm bw: as asked.
        assert_eq!(effective_window(Bench::Bw, 4 << 20, 64, false, pool), 64);
        // udp: at most 2 MiB per window, at least one message.
        assert_eq!(effective_window(Bench::Bw, 4096, 64, true, pool), 64);
        assert_eq!(effective_window(Bench::Bw, 65536, 64, true, pool), 32);
        assert_eq!(effective_window(Bench::Bw, 4 << 20, 64, true, pool), 1);
        assert_eq!(effective_window(Bench::Bw, 0, 64, true, pool), 64);
        // bibw: half the pool.
        assert_eq!(effective_window(Bench::Bibw, 65536, 64, false, pool), 31);
        assert_eq!(effective_window(Bench::Bibw, 8, 64, false, pool), 64);
        assert_eq!(
            effective_window(Bench::Bibw, 1 << 20, 64, false, 8 << 20),
            3
        );
        // tagged: at most 64 MiB of receive buffers per window.
        assert_eq!(tagged_window(64, 64 << 10, false, 64), 64);
        assert_eq!(tagged_window(64, 4 << 20, false, 64), 16);
        assert_eq!(tagged_window(64, 64 << 20, false, 64), 1);
        assert_eq!(tagged_window(64, 256 << 20, false, 64), 1);
        assert_eq!(tagged_window(64, 0, false, 64), 64);
        // Over UDP: a quarter of the channel's frames.
        assert_eq!(tagged_window(64, 8, true, 64), 16);
        assert_eq!(tagged_window(8, 8, true, 64), 8);
        assert_eq!(tagged_window(64, 8, true, 2), 1);
    }
}
