//! `match`: what tag matching costs with other operations outstanding. The tagged
//! ping-pong of `pingpong` runs while each rank holds N other operations that nothing
//! of the ping-pong matches, in one of three queues:
//!
//! - `posted`: N receives posted from the peer, each with a tag of its own (exact
//!   source and tag: the common case);
//! - `wildcard`: N receives posted from any source, each with a tag of its own;
//! - `unexpected`: N messages from the peer, each with a tag of its own, arrived and
//!   not yet received.
//!
//! Every arrival and every receive of the ping-pong meets them: a matching that scans a
//! list pays for N at every message, one that hashes (source, tag) pays nothing. N = 0
//! is the plain ping-pong, measured the same way. Before the timed ping-pong the ranks
//! exchange a control message so that the peer's N messages have arrived; afterwards the
//! posted receives are cancelled (when their scope ends) and the unexpected messages
//! are received and their lengths checked, and the ranks exchange a control message
//! again, so that no receive of this run is still posted when the next run's messages
//! come. The unexpected messages are sent without blocking, so push mode zero (where a
//! send waits for its receiver) works too.

use super::buffer::PageAligned;
use super::ctx::{Ctx, Sink, CONTROL_TAG};
use super::output::BenchResult;
use super::pingpong::tagged_one_way_samples;
use super::sizes::fmt_size;
use super::stats::Summary;
use super::Bench;
use anyhow::Context as _;
use quiver::tagged::{Src, Tagged};

/// The queues the outstanding operations sit in.
pub const QUEUES: [&str; 3] = ["posted", "wildcard", "unexpected"];

/// The tag of the first outstanding operation; the others follow (clear of the
/// ping-pong's and the control tags).
const FIRST_IDLE_TAG: u32 = 1000;

/// What each outstanding message carries.
const IDLE_DATA: [u8; 8] = [0x33; 8];

/// Default numbers of outstanding operations.
pub const DEFAULT_OUTSTANDING: [u32; 4] = [0, 1, 64, 1024];

/// Progress steps of a run: one per size, queue and number.
pub fn steps(sizes: &[usize], outstanding: &[u32]) -> u64 {
    (sizes.len() * QUEUES.len() * outstanding.len()) as u64
}

/// Runs every queue, number and size; rank 0 emits the results.
pub fn run(
    ctx: &Ctx<'_>,
    sizes: &[usize],
    outstanding: &[u32],
    mut sink: Option<&mut Sink>,
) -> anyhow::Result<()> {
    let t = ctx.tagged()?;
    for queue in QUEUES {
        for &n in outstanding {
            for &size in sizes {
                let what = format!("match {queue} {n} {}", fmt_size(size));
                if let Some(s) = sink.as_deref_mut() {
                    s.progress.begin(&what);
                }
                let row = run_one(ctx, t, queue, n, size).with_context(|| {
                    format!(
                        "rank {}: match, {n} outstanding {queue}, size {size} B over {}",
                        ctx.rank, ctx.transport
                    )
                })?;
                if let Some(s) = sink.as_deref_mut() {
                    s.progress.end();
                    if let Some(r) = row {
                        s.emit(r)?;
                    }
                }
            }
        }
    }
    Ok(())
}

fn run_one(
    ctx: &Ctx<'_>,
    t: &Tagged,
    queue: &str,
    n: u32,
    size: usize,
) -> anyhow::Result<Option<BenchResult>> {
    let (iters, warmup) = ctx.iterations(Bench::Match, size, 1);
    let buf = PageAligned::new(size, 0x5a);
    let buf = buf.as_slice();
    let peer = ctx.peer();
    let tags = FIRST_IDLE_TAG..FIRST_IDLE_TAG + n;
    let mut idle = vec![0u8; 8 * n as usize];
    // The scope's own errors are quiver's; the benchmark's (a wrong length, a receive
    // matched that should not be) come back inside.
    let samples = t
        .scope(|s| {
            let mut reqs = Vec::with_capacity(n as usize);
            match queue {
                "posted" | "wildcard" => {
                    let src = if queue == "posted" {
                        Src::Rank(peer)
                    } else {
                        Src::Any
                    };
                    for (chunk, tag) in idle.chunks_mut(8).zip(tags.clone()) {
                        reqs.push(s.irecv(chunk, src, tag)?);
                    }
                }
                _ => {
                    // Rank 0 sends first; each side's control message follows its N
                    // messages, so receiving it means they have arrived.
                    let send_idle = |reqs: &mut Vec<_>| -> quiver::Result<()> {
                        for tag in tags.clone() {
                            reqs.push(s.isend(peer, tag, &IDLE_DATA)?);
                        }
                        t.send(peer, CONTROL_TAG, &[])
                    };
                    let mut ctl = [0u8; 0];
                    if ctx.rank == 0 {
                        send_idle(&mut reqs)?;
                        t.recv(&mut ctl, peer, CONTROL_TAG)?;
                    } else {
                        t.recv(&mut ctl, peer, CONTROL_TAG)?;
                        send_idle(&mut reqs)?;
                    }
                }
            }
            let samples = tagged_one_way_samples(t, ctx.rank, buf, warmup, iters);
            if samples.is_err() {
                // The ping-pong's error is the one to report; the scope cancels the rest.
                return Ok(samples);
            }
            if queue == "unexpected" {
                // Receive the peer's messages (last first) and finish the sends.
                let mut got = [0u8; 8];
                for tag in tags.clone().rev() {
                    let st = t.recv(&mut got, peer, tag)?;
                    if st.len != 8 || got != IDLE_DATA {
                        return Ok(Err(anyhow::anyhow!(
                            "outstanding message {tag}: {} bytes {got:?}",
                            st.len
                        )));
                    }
                }
                for r in s.wait_all(reqs) {
                    r?;
                }
            } else {
                // Nothing matched them: still pending (the scope cancels them).
                for r in &reqs {
                    if r.test()? {
                        return Ok(Err(anyhow::anyhow!("an outstanding receive was matched")));
                    }
                }
            }
            Ok(samples)
        })
        .context("ping-pong with outstanding operations")??;
    // Every receive of this run is withdrawn on both sides before the next run sends.
    let mut ctl = [0u8; 0];
    if ctx.rank == 0 {
        t.send(peer, CONTROL_TAG, &[]).context("end of run")?;
        t.recv(&mut ctl, peer, CONTROL_TAG).context("end of run")?;
    } else {
        t.recv(&mut ctl, peer, CONTROL_TAG).context("end of run")?;
        t.send(peer, CONTROL_TAG, &[]).context("end of run")?;
    }
    if ctx.rank != 0 {
        return Ok(None);
    }
    let s = Summary::of_nanos(samples).context("no samples to summarize")?;
    let mut r = ctx.result(Bench::Match, size, iters, warmup);
    r.queue = Some(queue.to_string());
    r.outstanding = Some(n);
    r.set_latency(&s);
    Ok(Some(r))
}
