use super::*;
use std::time::{Duration, Instant};

fn sizes(lens: &[usize]) -> Vec<Vec<u8>> {
    lens.iter()
        .enumerate()
        .map(|(i, &n)| (0..n).map(|j| (i * 31 + j) as u8).collect())
        .collect()
}

#[test]
fn gso_run_takes_equal_sizes_and_one_shorter_tail() {
    let run_of = |lens: &[usize], max_run: usize| {
        let d = sizes(lens);
        let refs: Vec<&[u8]> = d.iter().map(|v| v.as_slice()).collect();
        gso_run(&refs, max_run)
    };
    let run = |lens: &[usize]| run_of(lens, GSO_SEGMENTS);
    assert_eq!(run(&[1000, 1000, 1000, 500, 1000]), 4);
    assert_eq!(run(&[1000, 1000, 1200]), 2);
    assert_eq!(run(&[1000, 1200]), 1);
    assert_eq!(run(&[1000]), 1);
    assert_eq!(run(&[0, 0]), 1);
    assert_eq!(run(&[1000, 0]), 1, "an empty datagram cannot end a run");
    // At most GSO_SEGMENTS datagrams and GSO_BYTES bytes.
    assert_eq!(run(&[100; 100]), GSO_SEGMENTS);
    assert_eq!(run(&[1472; 100]), 65507 / 1472);
    assert_eq!(run(&[9000; 10]), 7);
    // And at most the run limit the channel's pace allows.
    assert_eq!(run_of(&[1472; 100], 4), 4);
    assert_eq!(run_of(&[1472, 1472, 1000], 2), 2);
    assert_eq!(run_of(&[1472; 100], 0), 1);
}

#[test]
fn run_limit_is_the_windows_share_of_the_run_time() {
    let us = Duration::from_micros;
    assert_eq!(
        run_limit(128, None),
        GSO_SEGMENTS,
        "round trip not known yet"
    );
    assert_eq!(run_limit(128, Some(Duration::ZERO)), GSO_SEGMENTS);
    // Unshaped veth: a 128-frame window (188 KB) every ~75 us.
    assert_eq!(run_limit(128, Some(us(75))), GSO_SEGMENTS);
    assert_eq!(run_limit(128, Some(us(200))), 32);
    // 1 Gbit/s: the window queued at the link, ~1.5 ms a round trip.
    assert_eq!(run_limit(128, Some(us(1500))), 4);
    // 100 Mbit/s: nothing offloaded.
    assert_eq!(run_limit(128, Some(us(15_000))), 0);
    assert_eq!(
        run_limit(u16::MAX, Some(Duration::from_nanos(1))),
        GSO_SEGMENTS
    );
}

/// Receives `n` datagrams on `link` (within 5 s) and returns their bytes in order.
fn receive(link: &mut UdpLink, pool: &mut SlotPool, n: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut out = Vec::new();
    let start = Instant::now();
    while got.len() < n {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "only {} of {n} datagrams arrived",
            got.len()
        );
        link.recv_batch(pool, &mut out).unwrap();
        for d in out.drain(..) {
            got.push(pool.slot(d.slot)[..d.len].to_vec());
            pool.free_slot(d.slot);
        }
    }
    got
}

#[test]
fn batches_arrive_as_sent_with_and_without_segmentation_offload() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    // Fragments of long messages (equal size, shorter tail), single datagrams and
    // empty ones, mixed, so that runs and the datagrams between them alternate.
    let mut lens = vec![1472; 90];
    lens.push(100);
    lens.extend([7, 0, 1472, 1472, 300, 0]);
    lens.extend(vec![1472; 3]);
    let data = sizes(&lens);
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    for gso in [true, false] {
        let tx = UdpLink::bind(ip, gso, false).unwrap();
        let mut rx = UdpLink::bind(ip, false, false).unwrap();
        let mut pool = SlotPool::new(1 << 20, 1472);
        let to = SockAddr::from(&rx.local_addr());
        tx.send_batch(&to, &refs, GSO_SEGMENTS).unwrap();
        assert_eq!(receive(&mut rx, &mut pool, data.len()), data, "gso {gso}");
        assert_eq!(
            tx.gso.load(Ordering::Relaxed),
            gso,
            "the kernel refused UDP_SEGMENT"
        );
    }
}

#[test]
fn destinations_get_connected_sockets_up_to_the_limit() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let tx = UdpLink::bind(ip, true, false).unwrap();
    let mut rx = UdpLink::bind(ip, false, false).unwrap();
    let mut pool = SlotPool::new(1 << 20, 1472);
    let to = SockAddr::from(&rx.local_addr());
    let data = sizes(&[1472, 1472, 1472, 5, 9]);
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    tx.send_datagram(&to, refs[4]).unwrap();
    tx.send_batch(&to, &refs, GSO_SEGMENTS).unwrap();
    let mut want = vec![data[4].clone()];
    want.extend(data.iter().cloned());
    assert_eq!(receive(&mut rx, &mut pool, want.len()), want);
    let conn = to.conn.get().unwrap().as_ref().expect("a connected socket");
    assert_eq!(conn.peer_addr().unwrap(), rx.local_addr());
    // Past the limit, destinations are sent to from the link's own socket.
    let others: Vec<SockAddr> = (0..CONNECTED_MAX)
        .map(|_| SockAddr::from(&rx.local_addr()))
        .collect();
    for o in &others {
        tx.send_datagram(o, b"x").unwrap();
    }
    assert!(others[..CONNECTED_MAX - 1]
        .iter()
        .all(|o| o.conn.get().is_some_and(|c| c.is_some())));
    assert!(others[CONNECTED_MAX - 1]
        .conn
        .get()
        .is_some_and(|c| c.is_none()));
    let got = receive(&mut rx, &mut pool, CONNECTED_MAX);
    assert!(got.iter().all(|d| d == b"x"));
}

#[test]
fn coalesced_receives_hand_over_every_datagram_in_order() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let mut lens = vec![1472; 100];
    lens.push(9);
    lens.extend([0, 33, 1472, 1472, 700]);
    let data = sizes(&lens);
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    for gso in [true, false] {
        let tx = UdpLink::bind(ip, gso, false).unwrap();
        let mut rx = UdpLink::bind(ip, false, true).unwrap();
        assert!(rx.gro.is_some(), "the kernel refused UDP_GRO");
        let mut pool = SlotPool::new(1 << 20, 1472);
        let to = SockAddr::from(&rx.local_addr());
        stream_until_coalescing(&tx, &mut rx, &mut pool, &to);
        tx.send_batch(&to, &refs, GSO_SEGMENTS).unwrap();
        assert_eq!(receive(&mut rx, &mut pool, data.len()), data, "gso {gso}");
    }
}

/// Sends single datagrams until `rx` sees a stream and turns coalescing on.
fn stream_until_coalescing(tx: &UdpLink, rx: &mut UdpLink, pool: &mut SlotPool, to: &SockAddr) {
    let one = [7u8; 10];
    for _ in 0..100 {
        let burst: Vec<&[u8]> = vec![&one; 8];
        tx.send_each(to, &burst).unwrap();
        assert_eq!(receive(rx, pool, 8).len(), 8);
        if rx.gro_on {
            assert!(gro_option(rx), "the flag says on, the socket says off");
            return;
        }
    }
    panic!("a stream never turned coalescing on");
}

/// The socket's UDP_GRO option as the kernel has it.
fn gro_option(link: &UdpLink) -> bool {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`.
    let rc = unsafe {
        libc::getsockopt(
            link.sock.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_GRO,
            &mut v as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    assert_eq!(rc, 0);
    v != 0
}

#[test]
fn coalescing_follows_the_traffic_on_and_off() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let tx = UdpLink::bind(ip, true, false).unwrap();
    let mut rx = UdpLink::bind(ip, false, true).unwrap();
    assert!(rx.gro.is_some(), "the kernel refused UDP_GRO");
    assert!(!gro_option(&rx), "off until traffic streams");
    let mut pool = SlotPool::new(1 << 20, 1472);
    let to = SockAddr::from(&rx.local_addr());
    stream_until_coalescing(&tx, &mut rx, &mut pool, &to);
    // A ping-pong's worth of lone datagrams: coalescing goes off again, in order.
    for i in 0..(2 * SPARSE_AFTER) as u8 {
        tx.send_datagram(&to, &[i; 5]).unwrap();
        assert_eq!(receive(&mut rx, &mut pool, 1), vec![vec![i; 5]]);
        // An empty poll, as a spinning reader makes between messages.
        let mut none = Vec::new();
        rx.recv_batch(&mut pool, &mut none).unwrap();
        assert!(none.is_empty());
    }
    assert!(!rx.gro_on && !rx.batching);
    assert!(!gro_option(&rx));
}

#[test]
fn a_coalesced_run_waits_for_free_slots() {
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let data = sizes(&[1000; 60]);
    let refs: Vec<&[u8]> = data.iter().map(|v| v.as_slice()).collect();
    let tx = UdpLink::bind(ip, true, false).unwrap();
    let mut rx = UdpLink::bind(ip, false, true).unwrap();
    // The smallest pool: RECV_BATCH slots, fewer than one coalesced run of 60.
    let mut pool = SlotPool::new(0, 1000);
    assert_eq!(pool.free.len(), RECV_BATCH);
    let to = SockAddr::from(&rx.local_addr());
    stream_until_coalescing(&tx, &mut rx, &mut pool, &to);
    tx.send_batch(&to, &refs, GSO_SEGMENTS).unwrap();
    let mut held = Vec::new();
    let start = Instant::now();
    while held.len() < RECV_BATCH {
        assert!(start.elapsed() < Duration::from_secs(5), "nothing arrived");
        rx.recv_batch(&mut pool, &mut held).unwrap();
    }
    // Every slot is taken: the rest of the coalesced run waits in the staging buffer
    // (were it not coalesced, the staging buffer would be empty and this test would
    // not be testing the wait), nothing more is handed over, and nothing is lost.
    let st = rx.gro.as_ref().unwrap();
    assert!(st.at < st.len, "the run was not received coalesced");
    let mut more = Vec::new();
    rx.recv_batch(&mut pool, &mut more).unwrap();
    assert!(more.is_empty());
    let mut got: Vec<Vec<u8>> = Vec::new();
    for d in held.drain(..) {
        got.push(pool.slot(d.slot)[..d.len].to_vec());
        pool.free_slot(d.slot);
    }
    got.extend(receive(&mut rx, &mut pool, data.len() - got.len()));
    assert_eq!(got, data);
}
