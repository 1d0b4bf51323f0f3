//! The early and late receiver tests of Push-Pull Messaging (the paper's section 5.3 and
//! Figure 5): a ping-pong redesigned as a compute-then-communicate program, run for each
//! push mode (Push-Zero, Push-All, Push-Pull; `--push` picks one) and each receiver
//! (early, late) over the sizes (default 0..64K), with the tagged API.
//!
//! One iteration, after a barrier:
//!
//! ```text
//! ping (rank 0)                          pong (rank 1)
//!   start timer                            compute y
//!   compute x                              recv(message)
//!   isend(message)                         compute x
//!   compute y                              send(message)
//!   recv(message), wait for the isend
//!   stop timer
//! ```
//!
//! - **Barrier**: a 0-byte tagged exchange, pong first (pong sends, ping receives and
//!   answers). Ping leaves it first and pong one one-way latency `d` of an empty message
//!   later, the asymmetry the paper mentions (there the ping was late); 0-byte messages
//!   are never pulled, so the barrier costs the same in every push mode.
//! - **Ping's send** is an `isend` in a scope, waited for after the receive: the paper's
//!   `pp_send` returns once the pushes are out and its pulls are served by an interrupt
//!   handler, while a blocking `send` here would wait for the receiver to pull, which
//!   puts the receiver's compute on the sender's path. Pong's `send` is the blocking one.
//! - **Compute** is a busy loop on the clock (`Instant`), not NOPs: the same duration on
//!   any processor, and no quiver call inside it (a program computing), so no progress
//!   is made meanwhile.
//!
//! # Compute times
//!
//! Per push mode and size, a short tagged ping-pong first measures the round trip `rtt`
//! in that mode; with `gap = max(20 us, 2 rtt)`:
//!
//! - **early**: `y = 10 us`, `x = y + 2 gap` (at least 50 us and 10 us, the paper's 5:1).
//!   Pong posts its receive `d + y` after ping started, ping sends `x` after: the receive
//!   is posted `2 gap - d` (more than a round trip) before the message is sent; ping
//!   posts its receive `y` after its send, long before pong's reply (pong computes `x`).
//! - **late**: `x = 10 us`, `y = x + gap` (at least 10 us and 30 us, the paper's 1:3).
//!   Ping's message is sent at `x` and has arrived (a one-way time, at most `rtt`) well
//!   before pong posts its receive at `d + y = d + x + gap`: every push lands in the
//!   pushed buffer. The reply usually finds ping's receive posted: ping posts it at
//!   `x + s + y` (`s`: its `isend` call), pong replies at `d + y + r + x` (`r`: its late
//!   receive); where `s` is about `d + r` (messages pushed whole, a few KiB) the reply
//!   can win (`ping_late_fraction` says how often), and the iteration then ends with
//!   ping's late receive instead of the reply's flight: no compute is added either way.
//!
//! Pong's compute times are rank 0's choice, sent to it before the measured iterations.
//! Each row reports how often the intended order held: `pong_late_fraction` (the
//! fraction of measured iterations in which pong's receive found the message already
//! arrived, from the endpoint's count of unexpected messages: near 0 early, 1 late) and
//! `ping_late_fraction` (the same for ping's receive of the reply, from an `iprobe`
//! just before it: near 0 in both tests); rank 0 warns when early or late did not hold
//! for pong in more than a tenth of the iterations.
//!
//! # What is reported
//!
//! `latency_us_median` (and `_avg80`, `_p99`, `_min`, `_max`): per measured iteration,
//! the time on ping's clock from the start to the end of the iteration, **less the
//! compute on the critical path** (`compute_us`), in microseconds:
//!
//! - early: `compute_us = 2x` (ping's `x` before its send, pong's `x` before its reply;
//!   the `y`s overlap them). What is left is the communication of the two messages to
//!   receives already posted: about a round trip.
//! - late: `compute_us = x + y` (pong's `y` before its receive, then its `x`; ping's
//!   `x` and the flight of its message hide in pong's `y`). What is left is `d` (the
//!   barrier's skew, an empty message's one-way time), pong's late receive (copy out of
//!   the pushed buffer and the pull of the rest) and the reply's communication.
//!
//! Without progress during compute, a pull that needs the sender's answer (over UDP, or
//! with cross-memory attach off or refused) waits for the sender's next quiver call: in
//! the early test pong's pull request waits for ping to finish `y`, and that wait is in
//! the reported time. Same-node pulls by cross-memory attach need nothing of the sender.
//! Likewise a receive is "late" only if the tagged layer sees the message when the
//! receive is posted; `pong_late_fraction` reports what it saw.

use super::ctx::{check_len, Ctx, Sink, BARRIER_TAG, CONTROL_TAG, DATA_TAG};
use super::output::round;
use super::pingpong::tagged_one_way_samples;
use super::sizes::fmt_size;
use super::stats::{self, Summary};
use super::{Bench, BenchOpts};
use anyhow::{bail, Context as _};
use quiver::tagged::{PushMode, Tagged};
use std::time::{Duration, Instant};

/// Whether the receive is posted before the message arrives (early) or after (late).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Receiver {
    /// The receive is posted before the send starts.
    Early,
    /// The receive is posted after the message has arrived.
    Late,
}

impl Receiver {
    /// `early` or `late`.
    pub fn name(self) -> &'static str {
        match self {
            Receiver::Early => "early",
            Receiver::Late => "late",
        }
    }
}

/// The receivers, in the order they are run.
pub const RECEIVERS: [Receiver; 2] = [Receiver::Early, Receiver::Late];

/// The push modes run without `--push`, in order.
pub const MODES: [PushMode; 3] = [PushMode::Zero, PushMode::All, PushMode::Pull];

/// The short compute: `y` of the early test, `x` of the late one.
pub const BASE: Duration = Duration::from_micros(10);

/// Least margin between the two sides' compute.
pub const MIN_GAP: Duration = Duration::from_micros(20);

/// The compute times `(x, y)` of `receiver` for a measured round trip `rtt` (see the
/// module's documentation).
pub fn compute_times(receiver: Receiver, rtt: Duration) -> (Duration, Duration) {
    let gap = MIN_GAP.max(rtt * 2);
    match receiver {
        Receiver::Early => (BASE + gap * 2, BASE),
        Receiver::Late => (BASE, BASE + gap),
    }
}

/// The compute on the critical path of an iteration: `2x` early, `x + y` late.
pub fn critical_compute(receiver: Receiver, x: Duration, y: Duration) -> Duration {
    match receiver {
        Receiver::Early => x * 2,
        Receiver::Late => x + y,
    }
}

/// The push modes to run: `--push`, or all three.
pub fn modes(opts: &BenchOpts) -> Vec<PushMode> {
    match opts.push {
        Some(p) => vec![p.mode()],
        None => MODES.to_vec(),
    }
}

/// Rows the run produces (progress steps).
pub fn steps(opts: &BenchOpts, sizes: &[usize]) -> u64 {
    (modes(opts).len() * RECEIVERS.len() * sizes.len()) as u64
}

/// Spins until `d` has passed (the compute).
pub fn spin(d: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs every push mode, receiver and size; rank 0 reports a row for each. The modes
/// take turns size by size (rather than one mode's whole curve after another's), so that
/// drift of a shared machine over the run falls on every mode alike: the figures that
/// matter are ratios between modes at one size. The rows are reported afterwards, one
/// mode's curve after another's.
pub fn run(ctx: &Ctx<'_>, sizes: &[usize], mut sink: Option<&mut Sink>) -> anyhow::Result<()> {
    let t = ctx.tagged()?;
    let modes = modes(ctx.opts);
    let mut rows = Vec::new();
    for (r, receiver) in RECEIVERS.into_iter().enumerate() {
        for (z, &size) in sizes.iter().enumerate() {
            for (m, &mode) in modes.iter().enumerate() {
                t.set_push(mode);
                let what = format!(
                    "early-late {} {} {}",
                    mode.name(),
                    receiver.name(),
                    fmt_size(size)
                );
                if let Some(s) = sink.as_deref_mut() {
                    s.progress.begin(&what);
                }
                let row = run_one(ctx, t, receiver, size).with_context(|| {
                    format!(
                        "rank {}: early-late, push {}, {} receiver, size {size} B over {}",
                        ctx.rank,
                        mode.name(),
                        receiver.name(),
                        ctx.transport
                    )
                })?;
                if let Some(s) = sink.as_deref_mut() {
                    s.progress.end();
                }
                if let Some(row) = row {
                    rows.push(((m, r, z), row));
                }
            }
        }
    }
    rows.sort_by_key(|(order, _)| *order);
    if let Some(s) = sink {
        for (_, row) in rows {
            s.emit(row)?;
        }
    }
    Ok(())
}

/// The 0-byte barrier before each iteration: pong sends, ping receives and answers.
fn barrier(t: &Tagged, rank: u32) -> anyhow::Result<()> {
    let peer = 1 - rank;
    if rank == 0 {
        t.recv(&mut [], peer, BARRIER_TAG).context("barrier")?;
        t.send(peer, BARRIER_TAG, &[]).context("barrier")?;
    } else {
        t.send(peer, BARRIER_TAG, &[]).context("barrier")?;
        t.recv(&mut [], peer, BARRIER_TAG).context("barrier")?;
    }
    Ok(())
}

/// Sends `v` to the peer (rank 0 to rank 1 the compute times, rank 1 to rank 0 its
/// count of late receives).
fn send_u64s(t: &Tagged, peer: u32, v: &[u64]) -> anyhow::Result<()> {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    t.send(peer, CONTROL_TAG, &bytes)
        .context("sending control values")
}

fn recv_u64s<const N: usize>(t: &Tagged, peer: u32) -> anyhow::Result<[u64; N]> {
    let mut bytes = vec![0u8; 8 * N];
    let st = t
        .recv(&mut bytes, peer, CONTROL_TAG)
        .context("receiving control values")?;
    check_len(st.len as usize, 8 * N, "control values")?;
    let mut out = [0u64; N];
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(8)) {
        let mut b = [0u8; 8];
        b.copy_from_slice(c);
        *o = u64::from_le_bytes(b);
    }
    Ok(out)
}

/// The endpoint's count of messages whose first push found no posted receive.
fn unexpected(t: &Tagged) -> u64 {
    t.stats().unexpected
}

/// One (push mode, receiver, size): calibration, then the measured iterations. Rank 0
/// returns the row.
fn run_one(
    ctx: &Ctx<'_>,
    t: &Tagged,
    receiver: Receiver,
    size: usize,
) -> anyhow::Result<Option<super::output::BenchResult>> {
    let rank = ctx.rank;
    let peer = ctx.peer();
    let (iters, warmup) = ctx.iterations(Bench::EarlyLate, size, 1);
    let sbuf = vec![0x3cu8; size];
    let mut rbuf = vec![0u8; size];

    // Calibration: the round trip in this push mode, then rank 0's compute times.
    let (cal_warmup, cal_iters) = if size <= 1 << 20 { (10, 40) } else { (2, 5) };
    let cal = tagged_one_way_samples(t, rank, &sbuf, cal_warmup, cal_iters)
        .context("calibration ping-pong")?;
    let (x, y) = if rank == 0 {
        let mut cal = cal;
        stats::sort(&mut cal);
        let one_way = stats::median_sorted(&cal).context("no calibration samples")?;
        let rtt = Duration::from_nanos((2.0 * one_way) as u64);
        let (x, y) = compute_times(receiver, rtt);
        send_u64s(t, peer, &[x.as_nanos() as u64, y.as_nanos() as u64])?;
        (x, y)
    } else {
        let [x, y] = recv_u64s::<2>(t, peer)?;
        (Duration::from_nanos(x), Duration::from_nanos(y))
    };
    let compute = critical_compute(receiver, x, y);

    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    let mut late = 0u64;
    for i in 0..warmup + iters {
        barrier(t, rank)?;
        let was_late;
        if rank == 0 {
            let t0 = Instant::now();
            spin(x);
            let (got, len) = t
                .scope(|s| {
                    let req = s.isend(peer, DATA_TAG, &sbuf)?;
                    spin(y);
                    // Off the critical path (the reply is not due yet): whether it is
                    // here already. The endpoint's count of unexpected messages would
                    // also count pong's next barrier message, often handled in the
                    // same receive.
                    let got = t.iprobe(peer, DATA_TAG)?.is_some();
                    let st = t.recv(&mut rbuf, peer, DATA_TAG)?;
                    req.wait()?;
                    Ok((got, st.len))
                })
                .context("ping")?;
            let dt = t0.elapsed();
            check_len(len as usize, size, "pong")?;
            was_late = got;
            if i >= warmup {
                samples.push(dt.saturating_sub(compute).as_nanos() as f64);
            }
        } else {
            spin(y);
            // Nothing but ping's message can arrive during this receive (ping's next
            // barrier message waits for the reply), so the count of unexpected messages
            // tells whether it was here first, at the cost of two loads on the path.
            let before = unexpected(t);
            let st = t
                .recv(&mut rbuf, peer, DATA_TAG)
                .context("receiving ping")?;
            was_late = unexpected(t) > before;
            check_len(st.len as usize, size, "ping")?;
            spin(x);
            t.send(peer, DATA_TAG, &sbuf).context("sending pong")?;
        }
        if i >= warmup && was_late {
            late += 1;
        }
    }
    if rank != 0 {
        send_u64s(t, peer, &[late])?;
        return Ok(None);
    }
    let [pong_late] = recv_u64s::<1>(t, peer)?;
    if pong_late > iters || late > iters {
        bail!("late receive counts {pong_late} and {late} exceed {iters} iterations");
    }
    let pong_frac = pong_late as f64 / iters as f64;
    let ping_frac = late as f64 / iters as f64;
    let held = match receiver {
        Receiver::Early => 1.0 - pong_frac,
        Receiver::Late => pong_frac,
    };
    if held < 0.9 {
        eprintln!(
            "quiver bench: early-late: {} receiver at {} B: pong's receive was {} in only {:.0} % \
             of the iterations (a busy machine?)",
            receiver.name(),
            size,
            receiver.name(),
            held * 100.0
        );
    }
    let s = Summary::of_nanos(samples).context("no samples to summarize")?;
    let mut r = ctx.result(Bench::EarlyLate, size, iters, warmup);
    r.mode = r.push.clone();
    r.receiver = Some(receiver.name().into());
    r.set_latency(&s);
    r.compute_x_us = Some(round(x.as_nanos() as f64 / 1e3, 3));
    r.compute_y_us = Some(round(y.as_nanos() as f64 / 1e3, 3));
    r.compute_us = Some(round(compute.as_nanos() as f64 / 1e3, 3));
    r.pong_late_fraction = Some(round(pong_frac, 4));
    r.ping_late_fraction = Some(round(ping_frac, 4));
    Ok(Some(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_times_keep_the_order() {
        let us = Duration::from_micros;
        // Fast transport: the minimum gap, the paper's ratios.
        assert_eq!(compute_times(Receiver::Early, us(2)), (us(50), us(10)));
        assert_eq!(compute_times(Receiver::Late, us(2)), (us(10), us(30)));
        // Slow round trip: the gap grows with it.
        let (x, y) = compute_times(Receiver::Early, us(100));
        assert_eq!((x, y), (us(410), us(10)));
        assert!(x - y >= us(100) * 2);
        let (x, y) = compute_times(Receiver::Late, us(100));
        assert!(y - x >= us(100) * 2);
        assert_eq!(critical_compute(Receiver::Early, us(50), us(10)), us(100));
        assert_eq!(critical_compute(Receiver::Late, us(10), us(30)), us(40));
    }

    #[test]
    fn spin_waits_at_least_the_duration() {
        let t0 = Instant::now();
        spin(Duration::from_micros(100));
        assert!(t0.elapsed() >= Duration::from_micros(100));
    }
}
