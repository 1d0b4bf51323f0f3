//! Split copies of large same-node tagged messages between two real processes (the
//! test binary starts itself twice as the ranks of a job): every byte checked, a
//! truncated receive, a sender busy elsewhere while its message is pulled (the receiver
//! then copies alone), and the two sides' accounts of what the sender wrote agree. The
//! sender waits by spinning, so on two or more cores it helps with at least one message.

mod common;

use common::{pattern, TestJob};
use quiver::tagged::{Tagged, TaggedStats};
use quiver::{Error, Job};
use std::process::Command;
use std::time::{Duration, Instant};

const RANK_VAR: &str = "QUIVER_SPLIT_TEST_RANK";
const MESSAGES: u32 = 8;
const LEN: usize = 16 << 20;
/// A message that does not fit its receive buffer.
const TRUNCATED: (usize, usize) = (8 << 20, (5 << 20) + 3);

fn sender(t: &Tagged) -> TaggedStats {
    for i in 0..MESSAGES {
        t.send(1, i, &pattern(0, i, LEN)).unwrap();
    }
    t.send(1, 100, &pattern(0, 100, TRUNCATED.0)).unwrap();
    // Busy elsewhere (not inside quiver) while the receiver pulls: it helps with nothing.
    let before = t.stats().split_helped;
    let late = pattern(0, 102, LEN);
    t.scope(|s| {
        let r = s.isend(1, 102, &late)?;
        std::thread::sleep(Duration::from_secs(1));
        r.wait()
    })
    .unwrap();
    assert_eq!(
        t.stats().split_helped,
        before,
        "helped while not inside quiver"
    );
    let st = t.stats();
    t.send(1, 101, &st.split_helped.to_le_bytes()).unwrap();
    st
}

fn receiver(t: &Tagged) -> TaggedStats {
    let mut buf = vec![0u8; LEN];
    for i in 0..MESSAGES {
        buf.fill(0xee);
        let st = t.recv(&mut buf, 0, i).unwrap();
        assert_eq!(st.len, LEN as u64);
        assert!(buf == pattern(0, i, LEN), "bytes of message {i}");
    }
    let mut small = vec![0xeeu8; TRUNCATED.1];
    match t.recv(&mut small, 0, 100) {
        Err(Error::Truncated { len, capacity, .. }) => {
            assert_eq!((len, capacity), (TRUNCATED.0 as u64, TRUNCATED.1));
        }
        other => panic!("expected truncation, got {other:?}"),
    }
    assert!(small[..] == pattern(0, 100, TRUNCATED.0)[..TRUNCATED.1]);
    buf.fill(0xee);
    t.recv(&mut buf, 0, 102).unwrap();
    assert!(
        buf == pattern(0, 102, LEN),
        "bytes of the message pulled alone"
    );
    let mut helped = [0u8; 8];
    t.recv(&mut helped, 0, 101).unwrap();
    let st = t.stats();
    assert_eq!(
        st.pulled_split_by_sender,
        u64::from_le_bytes(helped),
        "what the sender says it wrote is what the receiver counted: {st:?}"
    );
    st
}

/// One rank, in a child process.
fn rank_main(rank: u32) {
    let job = Job::from_env().unwrap();
    assert_eq!(job.rank(), rank);
    let t = Tagged::open(&job, 60).unwrap();
    let st = if rank == 0 { sender(&t) } else { receiver(&t) };
    println!("rank {rank}: {st:?}");
    job.barrier().unwrap();
}

fn run_job(extra: &[(&str, &str)]) -> Vec<String> {
    let tj = TestJob::new(2);
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--exact", "split_copy_between_two_processes", "--nocapture"])
                .envs(tj.env(rank, extra))
                .env(RANK_VAR, rank.to_string())
                .stdout(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut out = Vec::new();
    for c in &mut children {
        loop {
            if let Some(status) = c.try_wait().unwrap() {
                assert!(status.success(), "a rank failed: {status}");
                break;
            }
            if Instant::now() > deadline {
                for c in &mut children {
                    let _ = c.kill();
                }
                panic!("the ranks did not finish in time");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    for c in children {
        let o = c.wait_with_output().unwrap();
        out.push(String::from_utf8_lossy(&o.stdout).into_owned());
    }
    out
}

fn counter(out: &str, name: &str) -> u64 {
    let at = out
        .find(&format!("{name}: "))
        .unwrap_or_else(|| panic!("{name} in {out}"));
    out[at + name.len() + 2..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn split_copy_between_two_processes() {
    if let Ok(r) = std::env::var(RANK_VAR) {
        rank_main(r.parse().unwrap());
        return;
    }
    let out = run_job(&[("QUIVER_WAIT", "spin")]);
    let (helped, by_sender) = (
        counter(&out[0], "split_helped"),
        counter(&out[1], "pulled_split_by_sender"),
    );
    assert_eq!(helped, by_sender);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores >= 2 && counter(&out[1], "pulled_direct") > 0 {
        assert!(helped > 0, "a spinning sender never helped: {out:?}");
    }
    // Turned off: the receiver pulls alone, and the bytes are the same.
    let out = run_job(&[("QUIVER_WAIT", "spin"), ("QUIVER_SPLIT_COPY", "off")]);
    assert_eq!(counter(&out[0], "split_helped"), 0);
    assert_eq!(counter(&out[1], "pulled_split_by_sender"), 0);
}
