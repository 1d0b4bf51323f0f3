//! Transport conformance suite: the same tests run over every transport (shared memory,
//! UDP, raw Ethernet), with ranks as threads of the test process.

mod common;

use common::{config, pattern, run_ranks};
use quiver::FaultConfig;
use quiver::ReliabilityMode as Mode;
use quiver::{Config, Error, TransportChoice, WaitMode};
use std::time::Duration;

const SIZES: [usize; 10] = [0, 1, 63, 64, 65, 1471, 1472, 1473, 64 << 10, 1 << 20];
const T: Duration = Duration::from_secs(60);

/// End of a test: wait for the others while this endpoint keeps making progress (until
/// the offload engine exists, retransmissions and acknowledgements happen only inside
/// quiver calls, so a rank must not simply block in the rendezvous barrier).
fn settle(job: &quiver::Job, ep: &quiver::Endpoint) {
    job.barrier_progressing(&[ep]).unwrap();
}

fn sizes_in_order(c: Config) {
    run_ranks(2, c.clone(), |job| {
        let ep = job.open(1).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            for (i, &len) in SIZES.iter().enumerate() {
                ep.write(&pattern(0, i as u32, len)).unwrap();
            }
        } else {
            for (i, &len) in SIZES.iter().enumerate() {
                let m = ep.read_timeout(T).unwrap();
                assert_eq!(m.len(), len, "message {i}");
                assert!(
                    *m == *pattern(0, i as u32, len),
                    "bytes of message {i} ({len} B)"
                );
                assert_eq!(m.source().rank, 0);
            }
            assert!(ep.try_read().unwrap().is_none(), "a message arrived twice");
        }
        settle(&job, &ep);
    });
}

fn many_small_messages_fifo(c: Config) {
    const N: u32 = 20_000;
    run_ranks(2, c.clone(), |job| {
        let ep = job.open(3).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            for i in 0..N {
                ep.write(&i.to_le_bytes()).unwrap();
                // Stay within the receiver's buffers on UDP (no flow control yet).
                if i % 256 == 255 {
                    ep.read_timeout(T).unwrap();
                }
            }
        } else {
            ep.target_rank(0).unwrap();
            for i in 0..N {
                let m = ep.read_timeout(T).unwrap();
                assert_eq!(u32::from_le_bytes((*m).try_into().unwrap()), i);
                drop(m);
                if i % 256 == 255 {
                    ep.write(b"k").unwrap();
                }
            }
        }
        settle(&job, &ep);
    });
}

fn all_to_all(c: Config) {
    const PER_PEER: u32 = 200;
    run_ranks(4, c.clone(), |job| {
        let (me, n) = (job.rank(), job.size());
        let ep = job.open(2).unwrap();
        let mut next_from = vec![0u32; n as usize];
        let mut received = 0;
        let expect = PER_PEER * (n - 1);
        let len_of = |src: u32, seq: u32| ((src * 977 + seq * 131) % 3000) as usize;
        let mut check = |m: &quiver::Message| {
            let src = m.source().rank;
            let seq = next_from[src as usize];
            assert_eq!(
                &m[..],
                &pattern(src, seq, len_of(src, seq))[..],
                "from {src} seq {seq}"
            );
            next_from[src as usize] += 1;
        };
        for seq in 0..PER_PEER {
            for k in 1..n {
                let dst = (me + k) % n;
                ep.target_rank(dst).unwrap();
                ep.write(&pattern(me, seq, len_of(me, seq))).unwrap();
            }
            while let Some(m) = ep.try_read().unwrap() {
                check(&m);
                received += 1;
            }
        }
        while received < expect {
            let m = ep.read_timeout(T).unwrap();
            check(&m);
            received += 1;
        }
        settle(&job, &ep);
        assert!(ep.try_read().unwrap().is_none());
    });
}

fn held_tokens_stay_valid_until_released(c: Config) {
    run_ranks(2, c.clone(), |job| {
        let ep = job.open(4).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            for i in 0..50u32 {
                ep.write(&pattern(0, i, 100)).unwrap();
            }
        } else {
            let mut ptrs = Vec::new();
            for i in 0..50u32 {
                let m = ep.read_timeout(T).unwrap();
                assert_eq!(*m, *pattern(0, i, 100));
                ptrs.push((m.as_ptr() as usize, m.len(), i));
                m.hold();
            }
            assert_eq!(ep.held(), 50);
            // Held tokens are not reused: their bytes are intact.
            for (p, len, i) in ptrs {
                // SAFETY: the token is held, so the pool memory is still this message.
                let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
                assert_eq!(bytes, &pattern(0, i, 100)[..]);
            }
            assert_eq!(ep.release(20), 20);
            assert_eq!(ep.release(100), 30);
            assert_eq!(ep.held(), 0);
        }
        settle(&job, &ep);
    });
}

fn errors_are_typed(c: Config) {
    run_ranks(
        2,
        c.clone().with_max_message(4096).with_pool_size(64 << 10),
        |job| {
            let ep = job.open(5).unwrap();
            assert!(matches!(ep.write(b"x"), Err(Error::NoTarget)));
            assert!(matches!(
                ep.target_rank(7),
                Err(Error::NoSuchRank { rank: 7, size: 2 })
            ));
            ep.target_rank(1 - job.rank()).unwrap();
            let e = ep.write(&vec![0u8; 4097]).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::MessageTooLarge {
                        len: 4097,
                        max: 4096
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("QUIVER_MAX_MESSAGE"));
            assert!(matches!(job.open(5), Err(Error::DpidInUse { dpid: 5 })));
            ep.write(&[9u8; 4096]).unwrap();
            let m = ep.read_timeout(T).unwrap();
            assert_eq!(*m, [9u8; 4096]);
            drop(m);
            settle(&job, &ep);
        },
    );
}

fn send_to_self_and_by_node(c: Config) {
    run_ranks(2, c.clone(), |job| {
        // Rank 0 opens first, so it owns the node-wide name (NID, 6).
        if job.rank() == 1 {
            job.barrier().unwrap();
        }
        let ep = job.open(6).unwrap();
        if job.rank() == 0 {
            job.barrier().unwrap();
        }
        ep.target_rank(job.rank()).unwrap();
        ep.write(b"to myself").unwrap();
        let m = ep.read_timeout(T).unwrap();
        assert_eq!(&*m, b"to myself");
        assert_eq!(m.source().rank, job.rank());
        drop(m);
        settle(&job, &ep);
        // (NID, DPID) names the endpoint of the first rank of the node that opened it.
        if job.rank() == 1 {
            ep.target(job.nid_of(0).unwrap(), 6).unwrap();
            ep.write(b"by name").unwrap();
        } else {
            let m = ep.read_timeout(T).unwrap();
            assert_eq!(&*m, b"by name");
        }
        settle(&job, &ep);
    });
}

fn wait_modes(c: Config) {
    for mode in [
        WaitMode::Spin,
        WaitMode::Block,
        WaitMode::Hybrid(Duration::from_micros(5)),
    ] {
        run_ranks(2, c.clone().with_wait(mode), move |job| {
            let ep = job.open(7).unwrap();
            ep.target_rank(1 - job.rank()).unwrap();
            for i in 0..200u32 {
                if (i % 2 == 0) == (job.rank() == 0) {
                    ep.write(&i.to_le_bytes()).unwrap();
                } else {
                    let m = ep.read_timeout(T).unwrap();
                    assert_eq!(*m, i.to_le_bytes(), "{mode:?}");
                }
            }
            settle(&job, &ep);
        });
    }
}

fn read_times_out(c: Config) {
    run_ranks(1, c.clone().with_wait(WaitMode::Block), |job| {
        let ep = job.open(8).unwrap();
        let start = std::time::Instant::now();
        let e = ep.read_timeout(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, Error::Timeout(_)));
        assert!(start.elapsed() >= Duration::from_millis(45));
    });
}

/// A process waits on several endpoints' descriptors with poll(2).
fn epoll_on_several_endpoints(c: Config) {
    use std::os::fd::AsRawFd;
    run_ranks(2, c.clone(), |job| {
        let a = job.open(10).unwrap();
        let b = job.open(11).unwrap();
        job.barrier().unwrap();
        if job.rank() == 0 {
            std::thread::sleep(Duration::from_millis(100));
            b.target_rank(1).unwrap();
            b.write(b"on b").unwrap();
        } else {
            let mut fds = [
                libc::pollfd {
                    fd: a.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: b.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let mut got = None;
            let start = std::time::Instant::now();
            while got.is_none() {
                assert!(start.elapsed() < T, "the message never arrived");
                // Sleep no longer than the protocol's timers allow (network channels
                // retransmit and acknowledge only when called).
                let timeout_ms = [a.poll_timeout(), b.poll_timeout()]
                    .into_iter()
                    .flatten()
                    .min()
                    .map_or(30_000, |d| d.as_millis().clamp(1, 30_000) as i32);
                // SAFETY: fds is a valid array of two pollfd.
                let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
                assert!(n >= 0, "poll failed");
                if n == 0 {
                    a.progress().unwrap();
                    b.progress().unwrap();
                    continue;
                }
                if fds[1].revents & libc::POLLIN != 0 {
                    got = b.try_read().unwrap().map(|m| m.to_vec());
                }
                assert!(
                    a.try_read().unwrap().is_none(),
                    "a message arrived at endpoint a"
                );
            }
            assert_eq!(got.unwrap(), b"on b");
            assert!(a.try_read().unwrap().is_none());
        }
        settle(&job, &b);
    });
}

macro_rules! conformance {
    ($module:ident, $config:expr) => {
        mod $module {
            use super::*;
            #[test]
            fn sizes_in_order() {
                super::sizes_in_order($config)
            }
            #[test]
            fn many_small_messages_fifo() {
                super::many_small_messages_fifo($config)
            }
            #[test]
            fn all_to_all() {
                super::all_to_all($config)
            }
            #[test]
            fn held_tokens_stay_valid_until_released() {
                super::held_tokens_stay_valid_until_released($config)
            }
            #[test]
            fn errors_are_typed() {
                super::errors_are_typed($config)
            }
            #[test]
            fn send_to_self_and_by_node() {
                super::send_to_self_and_by_node($config)
            }
            #[test]
            fn wait_modes() {
                super::wait_modes($config)
            }
            #[test]
            fn read_times_out() {
                super::read_times_out($config)
            }
            #[test]
            fn epoll_on_several_endpoints() {
                super::epoll_on_several_endpoints($config)
            }
        }
    };
}

conformance!(shm, config(TransportChoice::Auto));
// UDP with the default reliability (host: retransmission, selective repeat, credits).
conformance!(udp, config(TransportChoice::Udp));
// UDP with flow control only (LCI's RX_no): a loss-free loopback needs nothing more.
conformance!(
    udp_none,
    config(TransportChoice::Udp).with_reliability(Mode::None)
);
// UDP through the fault injector: every byte must still arrive, once, in order.
conformance!(
    udp_lossy,
    config(TransportChoice::Udp).with_faults(Some(lossy()))
);

// UDP without coalesced receives (QUIVER_UDP_GRO=off: streams are read with recvmmsg
// batches instead), loss-free and through the fault injector. The suites above run with
// the default, coalescing while traffic streams.
conformance!(udp_without_gro, {
    let mut c = config(TransportChoice::Udp);
    c.udp_gro = false;
    c
});
conformance!(udp_without_gro_lossy, {
    let mut c = config(TransportChoice::Udp).with_faults(Some(lossy()));
    c.udp_gro = false;
    c
});

// UDP with authenticated frames (QUIVER_AUTH=on: a keyed MAC on every datagram), and
// through the fault injector, whose corruptions must now fail the tag.
conformance!(udp_auth, config(TransportChoice::Udp).with_auth(true));
conformance!(
    udp_auth_lossy,
    config(TransportChoice::Udp)
        .with_auth(true)
        .with_faults(Some(lossy()))
);

// UDP run by the offload engine's progress thread (LCI's RX_ni).
conformance!(
    udp_offload,
    config(TransportChoice::Udp).with_reliability(Mode::Offload)
);
// The offload engine through the fault injector.
conformance!(
    udp_offload_lossy,
    config(TransportChoice::Udp)
        .with_reliability(Mode::Offload)
        .with_faults(Some(lossy()))
);

// Raw Ethernet between nodes of a test cluster (one rank per node, in network
// namespaces; needs root).
conformance!(eth, config(TransportChoice::Eth));
conformance!(
    eth_lossy,
    config(TransportChoice::Eth).with_faults(Some(lossy()))
);
conformance!(
    eth_offload,
    config(TransportChoice::Eth).with_reliability(Mode::Offload)
);

/// A long (reassembled) message's buffer, once the message is released, assembles the
/// next one: the second message lies where the first did. Rank 1 releases the first
/// before it asks for the second, so the second is assembled after the release; a decoy
/// of the same size allocated in between takes the freed memory if the endpoint did not
/// keep it, so that the allocator cannot hand the same address back by chance.
fn released_long_message_lends_its_buffer(c: Config) {
    const LEN: usize = 200_000;
    run_ranks(2, c, |job| {
        let ep = job.open(5).unwrap();
        let peer = 1 - job.rank();
        ep.target_rank(peer).unwrap();
        if job.rank() == 0 {
            ep.write(&pattern(0, 0, LEN)).unwrap();
            assert_eq!(&*ep.read_timeout(T).unwrap(), b"next");
            ep.write(&pattern(0, 1, LEN)).unwrap();
            settle(&job, &ep);
        } else {
            let first = ep.read_timeout(T).unwrap();
            let first_ok = *first == *pattern(0, 0, LEN);
            let at = first.as_ptr();
            drop(first);
            let decoy: Vec<u8> = std::hint::black_box(Vec::with_capacity(LEN));
            ep.write(b"next").unwrap();
            let second = ep.read_timeout(T).unwrap();
            let second_ok = *second == *pattern(0, 1, LEN);
            let reused = second.as_ptr() == at && decoy.as_ptr() != at;
            drop(second);
            drop(decoy);
            // Checked after the barrier: a failure here must not leave rank 0 in it.
            settle(&job, &ep);
            assert!(first_ok && second_ok, "the messages' bytes differ");
            assert!(reused, "the released buffer was not reused");
        }
    });
}

#[test]
fn released_long_message_lends_its_buffer_over_udp() {
    released_long_message_lends_its_buffer(config(TransportChoice::Udp));
}

#[test]
fn released_long_message_lends_its_buffer_over_eth() {
    released_long_message_lends_its_buffer(config(TransportChoice::Eth));
}

/// The eth suites above really run over raw Ethernet (an endpoint that cannot open an
/// `AF_PACKET` socket falls back to UDP, which would pass them too).
#[test]
fn eth_suite_runs_over_raw_ethernet() {
    run_ranks(2, config(TransportChoice::Eth), |job| {
        let ep = job.open(1).unwrap();
        let peer = 1 - job.rank();
        assert_eq!(ep.transport_to(peer).unwrap(), quiver::Transport::Eth);
        ep.target_rank(peer).unwrap();
        ep.write(b"over ethernet").unwrap();
        assert_eq!(&*ep.read_timeout(T).unwrap(), b"over ethernet");
        settle(&job, &ep);
    });
}

/// Every remote sender may fill its window while the receiver reads nothing: the eth
/// receive ring holds a window for every rank on another node (`Config::eth_ring_frames`),
/// so the kernel drops none of it. Five senders of 60 frames each overflow the four
/// windows (256 frames) that one to four senders get.
#[test]
fn eth_ring_holds_a_window_from_every_remote_sender() {
    const SENDERS: u32 = 5;
    // Under the window of 64 frames: no sender waits for credit.
    const EACH: u32 = 60;
    run_ranks(SENDERS + 1, config(TransportChoice::Eth), |job| {
        let ep = job.open(6).unwrap();
        if job.rank() != 0 {
            ep.target_rank(0).unwrap();
            for i in 0..EACH {
                ep.write(&pattern(job.rank(), i, 100)).unwrap();
            }
            // Every frame is in rank 0's ring before it reads one.
            job.barrier().unwrap();
        } else {
            job.barrier().unwrap();
            let mut next = [0u32; SENDERS as usize + 1];
            for _ in 0..SENDERS * EACH {
                let m = ep.read_timeout(T).unwrap();
                let src = m.source().rank as usize;
                assert_eq!(*m, *pattern(src as u32, next[src], 100), "from {src}");
                next[src] += 1;
            }
            let stats = ep.stats();
            assert_eq!(stats.ring_drops, 0, "{stats:?}");
        }
        settle(&job, &ep);
    });
}

/// A channel keeps a frame that arrives out of order (selective repeat) where it lies
/// until the gap before it is filled. With a ring shorter than the window, the ring
/// comes round to such a frame before the retransmission arrives, and the kernel, which
/// fills the ring in order, would drop everything behind it, the retransmission too, for
/// good. The frame is copied out instead (`ring_evacuations`), and every message arrives.
#[test]
fn eth_frames_kept_out_of_order_move_out_of_a_small_ring() {
    const COUNT: u32 = 600;
    let faults = FaultConfig::parse("loss=0.05,reorder=0.05,seed=5").unwrap();
    let mut c = config(TransportChoice::Eth).with_faults(Some(faults));
    c.eth_ring = Some(16);
    run_ranks(2, c, |job| {
        let ep = job.open(7).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            for i in 0..COUNT {
                ep.write(&pattern(0, i, 200)).unwrap();
            }
        } else {
            for i in 0..COUNT {
                let m = ep.read_timeout(T).unwrap();
                assert_eq!(*m, *pattern(0, i, 200), "message {i}");
            }
            let stats = ep.stats();
            assert!(stats.ring_evacuations > 0, "{stats:?}");
        }
        settle(&job, &ep);
    });
}

/// Messages that arrive while the application only progresses (as in a barrier) wait
/// in the endpoint's queue, their frames still in the ring; with more of them than the
/// ring holds, the ring comes round to them, and the kernel would stop there until the
/// application reads. They are copied out instead, and reception goes on: every frame
/// arrives before the first read.
#[test]
fn eth_messages_waiting_to_be_read_move_out_of_a_small_ring() {
    // Under the window of 64 frames: the sender needs no credit back.
    const COUNT: u32 = 60;
    let mut c = config(TransportChoice::Eth);
    c.eth_ring = Some(16);
    run_ranks(2, c, |job| {
        let ep = job.open(8).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            for i in 0..COUNT {
                ep.write(&pattern(0, i, 100)).unwrap();
            }
        } else {
            let start = std::time::Instant::now();
            while ep.stats().frames_received < u64::from(COUNT) {
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "reception stopped: {:?}",
                    ep.stats()
                );
                ep.progress().unwrap();
            }
            for i in 0..COUNT {
                let m = ep.read_timeout(T).unwrap();
                assert_eq!(*m, *pattern(0, i, 100), "message {i}");
            }
            let stats = ep.stats();
            assert!(stats.ring_evacuations > 0, "{stats:?}");
        }
        settle(&job, &ep);
    });
}

/// Without `CAP_NET_RAW` an endpoint asked for eth takes udp (and logs why): ranks that
/// both lack it still talk.
#[test]
fn eth_without_cap_net_raw_falls_back_to_udp() {
    common::run_ranks_allowing_udp(2, config(TransportChoice::Eth), |job| {
        drop_cap_net_raw();
        let ep = job.open(1).unwrap();
        let peer = 1 - job.rank();
        assert_eq!(ep.transport_to(peer).unwrap(), quiver::Transport::Udp);
        ep.target_rank(peer).unwrap();
        ep.write(b"over udp").unwrap();
        assert_eq!(&*ep.read_timeout(T).unwrap(), b"over udp");
        settle(&job, &ep);
    });
}

/// Removes `CAP_NET_RAW` from the calling thread's effective capabilities.
fn drop_cap_net_raw() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_NET_RAW: u32 = 13;
    let mut h = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut d = [Data::default(); 2];
    // SAFETY: capget fills the header and two data structs (version 3).
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut h, d.as_mut_ptr()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    d[0].effective &= !(1 << CAP_NET_RAW);
    // SAFETY: capset reads the header and two data structs; pid 0 is this thread.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut h, d.as_ptr()) };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

fn lossy() -> FaultConfig {
    FaultConfig::parse("loss=0.05,dup=0.01,reorder=0.02,corrupt=0.01,seed=11").unwrap()
}

/// Without retransmission, a lossy link is reported as an error, never a hang.
#[test]
fn udp_none_on_a_lossy_link_reports_an_error() {
    let c = config(TransportChoice::Udp)
        .with_reliability(Mode::None)
        .with_faults(Some(FaultConfig::parse("loss=0.2,seed=5").unwrap()));
    run_ranks(2, c, |job| {
        let ep = job.open(20).unwrap();
        ep.target_rank(1 - job.rank()).unwrap();
        if job.rank() == 0 {
            for i in 0..200u32 {
                // The writer sees the failure too once the receiver stops crediting it.
                if ep.write(&pattern(0, i, 3000)).is_err() {
                    break;
                }
            }
            // Keep answering (acknowledgements, probes) until the receiver has judged.
            let _ = ep.read_timeout(Duration::from_secs(10));
        } else {
            // The error handler runs on every error the endpoint delivers.
            let handled = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
            let h = handled.clone();
            ep.set_error_handler(move |_| {
                h.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            });
            let start = std::time::Instant::now();
            let mut failed = None;
            for _ in 0..200 {
                match ep.read_timeout(Duration::from_secs(30)) {
                    Ok(_) => {}
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            let e = failed.expect("200 messages crossed a 20 % lossy link without retransmission");
            assert!(
                matches!(
                    e,
                    Error::Lost { rank: 0, .. } | Error::ChannelFailed { rank: 0, .. }
                ),
                "{e}"
            );
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "loss detected only after {:?}",
                start.elapsed()
            );
            assert_eq!(
                handled.load(std::sync::atomic::Ordering::Relaxed),
                1,
                "the error handler did not run once"
            );
            ep.write(b"done").ok();
        }
    });
}

/// A receiver that sleeps between reads never loses a message: the sender waits for
/// credits (flow control), in every network reliability scheme.
#[test]
fn udp_slow_receiver_stalls_the_sender_instead_of_dropping() {
    for mode in [Mode::None, Mode::Host, Mode::Offload] {
        let c = config(TransportChoice::Udp).with_reliability(mode);
        run_ranks(2, c, move |job| {
            let ep = job.open(22).unwrap();
            ep.target_rank(1 - job.rank()).unwrap();
            const N: u32 = 400; // 400 x 3 frames, far beyond a window of 64 frames
            if job.rank() == 0 {
                for i in 0..N {
                    ep.write(&pattern(0, i, 4000)).unwrap();
                }
                if mode == Mode::Offload {
                    // The writes only queued the messages: the engine sends them. The
                    // receiver reads nothing until the engine has run out of credits
                    // (else a sender slowed by a loaded machine could never get ahead
                    // of a reader that sleeps only now and then).
                    let until = std::time::Instant::now() + T;
                    while ep.stats().credit_stalls == 0 && std::time::Instant::now() < until {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    job.barrier().unwrap();
                }
                let _ = ep.read_timeout(T).unwrap(); // "done"
                let st = ep.stats();
                // The channel ran out of credits; in host and none modes the writer
                // waited, in offload mode the engine did (its command ring holds more
                // than these 1.6 MB, so the writer had no need to).
                assert!(
                    st.credit_stalls > 0,
                    "{mode}: the channel never ran out of credits: {st:?}"
                );
                assert!(
                    st.send_stalls > 0 || mode == Mode::Offload,
                    "{mode}: the sender never waited: {st:?}"
                );
            } else {
                if mode == Mode::Offload {
                    job.barrier().unwrap();
                }
                for i in 0..N {
                    if i % 50 == 0 {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let m = ep.read_timeout(T).unwrap();
                    assert_eq!(&m[..], &pattern(0, i, 4000)[..], "{mode}: message {i}");
                }
                let st = ep.stats();
                assert_eq!(st.lost_frames, 0, "{mode}: {st:?}");
                ep.write(b"done").unwrap();
                let _ = ep.flush_within(Duration::from_secs(5));
            }
        });
    }
}

/// A writer that queues messages without waiting (`try_write_parts`, 16 MiB in all)
/// and closes at once: its close lingers as long as the receiver keeps taking the
/// backlog, even past one linger period (2 s), so everything arrives. (It used to give
/// up after one period and drop the rest, leaving the receiver waiting forever.)
#[test]
fn udp_a_closing_writer_lingers_while_its_backlog_drains() {
    const COUNT: u32 = 16;
    const LEN: usize = 1 << 20;
    let c = config(TransportChoice::Udp);
    run_ranks(2, c, move |job| {
        let ep = job.open(23).unwrap();
        ep.target_rank(1 - job.rank()).unwrap();
        if job.rank() == 0 {
            for i in 0..COUNT {
                assert!(ep.try_write_parts(&[], &pattern(0, i, LEN)).unwrap());
            }
            drop(ep);
        } else {
            // A slow reader: one round of progress every 25 ms, so that the 16 MiB
            // (11 400 frames, a window at a time) take longer than a linger period.
            let start = std::time::Instant::now();
            for i in 0..COUNT {
                let m = loop {
                    ep.progress().unwrap();
                    if let Some(m) = ep.try_read().unwrap() {
                        break m;
                    }
                    assert!(
                        start.elapsed() < Duration::from_secs(60),
                        "message {i} did not arrive"
                    );
                    std::thread::sleep(Duration::from_millis(25));
                };
                assert!(m[..] == pattern(0, i, LEN)[..], "message {i}");
            }
            assert!(
                start.elapsed() > Duration::from_secs(2),
                "the transfer took less than one linger period: the test shows nothing"
            );
        }
    });
}

/// The receive path counts what the fault injector did on the sending side.
#[test]
fn udp_lossy_stats_show_retransmissions() {
    run_ranks(
        2,
        config(TransportChoice::Udp).with_faults(Some(lossy())),
        |job| {
            let ep = job.open(21).unwrap();
            ep.target_rank(1 - job.rank()).unwrap();
            if job.rank() == 0 {
                for i in 0..300u32 {
                    ep.write(&pattern(0, i, 5000)).unwrap();
                }
                let _ = ep.read_timeout(T).unwrap(); // the receiver's "done"
                let st = ep.stats();
                assert!(st.faults_lost > 0 && st.retransmissions > 0, "{st:?}");
                // Every resend has a cause: the timer or a selective acknowledgement.
                assert!(st.timeouts + st.fast_retransmits > 0, "{st:?}");
            } else {
                for i in 0..300u32 {
                    let m = ep.read_timeout(T).unwrap();
                    assert_eq!(&m[..], &pattern(0, i, 5000)[..]);
                }
                ep.write(b"done").unwrap();
                // Answer retransmissions of the last frames until the sender has its acks.
                let _ = ep.read_timeout(Duration::from_millis(300));
            }
        },
    );
}

/// Writing to an endpoint its owner closed is an error naming the peer, not a silent loss.
#[test]
fn shm_write_to_a_closed_endpoint_fails() {
    run_ranks(2, config(TransportChoice::Auto), |job| {
        let ep = job.open(12).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            ep.write(b"first").unwrap();
            job.barrier().unwrap(); // rank 1 read it and closes
            job.barrier().unwrap();
            let e = ep.write(b"second").unwrap_err();
            assert!(matches!(e, Error::PeerClosed { rank: 1, dpid: 12 }), "{e}");
        } else {
            assert_eq!(&*ep.read_timeout(T).unwrap(), b"first");
            job.barrier().unwrap();
            ep.close();
            job.barrier().unwrap();
        }
    });
}

/// The offload engine makes progress while the application is elsewhere: the writer
/// blocks outside quiver (on a plain barrier that opens only once the reader has every
/// message), so the lost frames can only be retransmitted by its engine thread. In
/// `host` mode this would never finish.
#[test]
fn udp_offload_progresses_while_the_application_is_elsewhere() {
    const N: u32 = 300;
    let c = config(TransportChoice::Udp)
        .with_reliability(Mode::Offload)
        .with_faults(Some(FaultConfig::parse("loss=0.1,seed=21").unwrap()));
    let outside = std::sync::Arc::new(std::sync::Barrier::new(2));
    run_ranks(2, c, move |job| {
        let ep = job.open(24).unwrap();
        if job.rank() == 0 {
            ep.target_rank(1).unwrap();
            for i in 0..N {
                ep.write(&pattern(0, i, 2000)).unwrap();
            }
            outside.wait();
            let st = ep.stats();
            assert!(
                st.retransmissions > 0,
                "no retransmission at 10 % loss: {st:?}"
            );
            assert!(
                st.faults_lost > 0 && st.frames_sent > u64::from(N),
                "{st:?}"
            );
        } else {
            for i in 0..N {
                let m = ep.read_timeout(T).unwrap();
                assert!(*m == *pattern(0, i, 2000), "message {i}");
            }
            outside.wait();
            assert_eq!(ep.stats().msgs_received, u64::from(N));
        }
        settle(&job, &ep);
    });
}

/// The harness: a rank that panics while the other waits for it in a barrier (whose
/// timeout is an hour) fails the test within seconds instead of hanging it.
#[test]
#[should_panic(expected = "rank 1 gives up")]
fn a_rank_that_panics_before_a_barrier_fails_the_test_at_once() {
    run_ranks(2, config(TransportChoice::Udp), |job| {
        let ep = job.open(6).unwrap();
        if job.rank() == 1 {
            panic!("rank 1 gives up");
        }
        settle(&job, &ep);
    });
}

/// The harness: the namespace and store of a test cluster whose process is gone are
/// removed; those of a live process (this one) stay.
#[test]
fn stale_test_clusters_are_removed_and_live_ones_kept() {
    // A pid that was just used and is gone.
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("run true");
    let dead_pid = child.id();
    child.wait().expect("wait for true");
    let stale = format!("qvt{dead_pid}-7-sw");
    let live = format!("qvt{}-stale-test-sw", std::process::id());
    if let Err(why) = common::ip(&["netns", "add", &stale]) {
        common::cannot_run(&why.to_string());
        return;
    }
    common::ip(&["netns", "add", &live]).expect("add a namespace");
    let store = std::env::temp_dir().join(format!("qvt{dead_pid}-7-store"));
    std::fs::create_dir_all(&store).expect("make a store");
    common::remove_stale_clusters();
    let exists = |ns: &str| std::path::Path::new("/run/netns").join(ns).exists();
    let (stale_left, live_left, store_left) = (exists(&stale), exists(&live), store.exists());
    let _ = common::ip(&["netns", "del", &live]);
    let _ = common::ip(&["netns", "del", &stale]);
    let _ = std::fs::remove_dir_all(&store);
    assert!(!stale_left, "the dead process's namespace is left");
    assert!(!store_left, "the dead process's store is left");
    assert!(live_left, "a live process's namespace was removed");
}
