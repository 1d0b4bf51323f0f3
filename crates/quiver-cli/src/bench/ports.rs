//! The benchmarks with GAMMA's ports (`--api ports`): `pingpong`, `bw`, `bibw` and
//! `rate` with the same exchanges as the endpoints', each rank's ports bound once
//! ([`bind`]): port [`DATA_PORT`] to the peer's data port with a receive buffer of the
//! largest size in the node's shared memory (`Ports::buffer`: a peer on the same node
//! writes messages of at least `DEPOSIT_MIN` bytes straight into it), port
//! [`ACK_PORT`] to the peer's acknowledgement port with a buffer of 8 bytes; neither has a handler, so every message delivered into the buffer signals
//! its port. A send is [`Ports::send`] (the port names the destination), a receive is
//! [`Ports::wait`] for the port's signal; the message is then in the port's buffer (and
//! is checked for its length there), as a GAMMA program would find it.
//!
//! With `--ports-copy` each received message is also copied out of the port's buffer
//! into another one (GAMMA's "buffered" curve of its Figure 1, the cost of one copy).

use super::ctx::check_len;
use super::Bench;
use anyhow::Context as _;
use quiver::ports::Ports;
use quiver::WaitMode;

/// The port that carries the measured messages, on both ranks.
pub const DATA_PORT: u8 = 0;
/// The port of the 1-byte acknowledgements of `bw`, `bibw` and `rate`.
pub const ACK_PORT: u8 = 1;

/// Binds this rank's ports to the peer's (`largest`: the longest message), waiting as
/// `wait` says.
pub fn bind(ports: &Ports, peer: u32, largest: usize, wait: WaitMode) -> quiver::Result<()> {
    ports.set_wait(wait);
    let buffer: quiver::ports::Buffer = match ports.buffer(largest.max(1)) {
        Ok(shared) => shared.into(),
        Err(e) => {
            tracing::debug!("no shared port buffer ({e}): a private one");
            vec![0; largest.max(1)].into()
        }
    };
    ports
        .bind(DATA_PORT)
        .to(peer, DATA_PORT)
        .buffer(buffer)
        .apply()?;
    ports
        .bind(ACK_PORT)
        .to(peer, ACK_PORT)
        .buffer(vec![0; 8])
        .apply()
}

/// Waits for the next message on `port` and checks its length; with `copy`, copies it
/// out into `copy`.
fn receive(
    ports: &Ports,
    port: u8,
    size: usize,
    copy: Option<&mut Vec<u8>>,
    what: &str,
) -> anyhow::Result<()> {
    ports
        .wait(port, 1)
        .with_context(|| format!("waiting for {what}"))?;
    // Without --ports-copy only the length is read (an empty destination).
    let dst = match copy {
        Some(c) => {
            c.resize(size, 0);
            &mut c[..]
        }
        None => &mut [][..],
    };
    let (len, _) = ports
        .read(port, dst)
        .with_context(|| format!("{what}: the port's buffer is empty"))?;
    check_len(len, size, what)
}

/// The ping-pong between rank 0 and 1: rank 0's one-way samples in ns, none on rank 1.
pub fn one_way_samples(
    ports: &Ports,
    rank: u32,
    buf: &[u8],
    warmup: u64,
    iters: u64,
    copy: bool,
) -> anyhow::Result<Vec<f64>> {
    let size = buf.len();
    let total = warmup + iters;
    let mut copied = copy.then(|| Vec::with_capacity(size));
    if rank != 0 {
        for _ in 0..total {
            receive(ports, DATA_PORT, size, copied.as_mut(), "ping")?;
            ports.send(DATA_PORT, buf).context("sending pong")?;
        }
        return Ok(Vec::new());
    }
    let mut samples = Vec::with_capacity(usize::try_from(iters).unwrap_or(0));
    let clock = quanta::Clock::new();
    for i in 0..total {
        let t0 = clock.raw();
        ports.send(DATA_PORT, buf).context("sending ping")?;
        receive(ports, DATA_PORT, size, copied.as_mut(), "pong")?;
        let rtt = clock.delta(t0, clock.raw());
        if i >= warmup {
            samples.push(rtt.as_nanos() as f64 / 2.0);
        }
    }
    Ok(samples)
}

/// One window of `bw`, `rate` (rank 0 sends `window` messages, rank 1 receives them and
/// acknowledges) or `bibw` (both send their window, then receive the peer's, then
/// both acknowledge: a send makes progress while it waits for room, so the two never
/// wait for each other).
pub fn window_exchange(
    ports: &Ports,
    rank: u32,
    bench: Bench,
    buf: &[u8],
    window: u32,
    copy: &mut Option<Vec<u8>>,
) -> anyhow::Result<()> {
    let size = buf.len();
    let sends = bench == Bench::Bibw || rank == 0;
    let receives = bench == Bench::Bibw || rank == 1;
    if sends {
        for _ in 0..window {
            ports.send(DATA_PORT, buf).context("sending data")?;
        }
    }
    if receives {
        for _ in 0..window {
            receive(ports, DATA_PORT, size, copy.as_mut(), "data")?;
        }
    }
    if bench == Bench::Bibw || rank == 1 {
        ports.send(ACK_PORT, &[0]).context("acknowledging")?;
    }
    if bench == Bench::Bibw || rank == 0 {
        receive(ports, ACK_PORT, 1, None, "acknowledgement")?;
    }
    Ok(())
}
