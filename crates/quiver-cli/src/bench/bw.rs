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
//! One sample per window: bytes / window time, in MB/s (10^6 bytes/s); the result is the
//! mean of the middle 80 % of the samples.
//!
//! Windows are capped where the transport cannot hold them: over UDP, which has no flow
//! control yet, to [`UDP_WINDOW_BYTES`]; for `bibw`, to half the receive pool, so that
//! both windows in flight always fit.

use super::output::{round, BenchResult};
use super::runner::{check_len, Ctx, RECORD_SLACK};
use super::stats::{self, avg80};
use super::Bench;
use anyhow::Context as _;
use std::time::Instant;

/// Largest window over UDP, in bytes.
pub const UDP_WINDOW_BYTES: usize = 2 << 20;

/// Messages per window for `bench` at `size` bytes on this transport.
pub fn effective_window(
    bench: Bench,
    size: usize,
    window: u32,
    udp: bool,
    pool_size: usize,
) -> u32 {
    let cap = |w: u32, bytes: usize, per_msg: usize| -> u32 {
        let fit = bytes / per_msg.max(1);
        w.min(u32::try_from(fit).unwrap_or(u32::MAX)).max(1)
    };
    let mut w = window.max(1);
    if udp && size > 0 {
        w = cap(w, UDP_WINDOW_BYTES, size);
    }
    if bench == Bench::Bibw {
        w = cap(w, pool_size / 2, size + RECORD_SLACK);
    }
    w
}

/// Runs one size of `bw` or `bibw`; rank 0 returns the result, rank 1 `None`.
pub fn run(ctx: &Ctx<'_>, bench: Bench, size: usize) -> anyhow::Result<Option<BenchResult>> {
    let window = effective_window(bench, size, ctx.opts.window, ctx.udp(), ctx.pool_size);
    let (iters, warmup) = ctx.iterations(bench, size, window);
    let buf = vec![0xa5u8; size];
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    let bytes = size as f64 * f64::from(window) * if bench == Bench::Bibw { 2.0 } else { 1.0 };
    for i in 0..warmup + iters {
        let t0 = Instant::now();
        match (bench, ctx.rank) {
            (Bench::Bibw, _) => bibw_window(ctx, &buf, window)?,
            (_, 0) => {
                for _ in 0..window {
                    ctx.send(&buf, "data")?;
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
        }
    }
    if ctx.rank != 0 {
        return Ok(None);
    }
    stats::sort(&mut samples);
    let mut r = BenchResult::new(bench, &ctx.transport_name(), &ctx.wait, size, iters, warmup);
    r.reliability = ctx.reliability.clone();
    r.window = Some(window);
    r.bandwidth_mbps = Some(round(
        avg80(&samples).context("no samples to summarize")?,
        3,
    ));
    r.bandwidth_mbps_median = stats::median_sorted(&samples).map(|v| round(v, 3));
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
    }
}
