//! One-sided operations between two real processes (the test binary starts itself twice
//! as the ranks of a job): an allocated window written and read in place, a registered
//! window reached by cross-memory attach into the other process (and, with
//! `QUIVER_CMA=off`, through its engine), fetch-and-add from both processes on the
//! registered word summing exactly, a range past the window's end refused at the
//! origin, and the registered memory given back by `Rma::free` holding what the other
//! process put there; then the same over UDP (every operation through the target's
//! engine, gets of 1 MB asked in chunks), and with the offload engine serving them.

mod common;

use common::{pattern, TestJob};
use quiver::rma::Rma;
use quiver::Job;
use std::process::Command;
use std::time::{Duration, Instant};

const RANK_VAR: &str = "QUIVER_RMA_PROCESS_TEST_RANK";
// Over the network a get of this many bytes is asked in chunks (`GET_CHUNK_PIECES`).
const LEN: usize = 1_000_000;
const ADDS: u64 = 500;

/// One rank, in a child process: prints its stats and what it checked.
fn rank_main(rank: u32) {
    let job = Job::from_env().unwrap();
    assert_eq!(job.rank(), rank);
    let rma = Rma::open(&job, 61).unwrap();
    let other = 1 - rank;
    let shared = rma.allocate(LEN).unwrap();
    let mine = rma.register(vec![0u8; LEN + 64]).unwrap();
    // Each rank writes its pattern into the other's windows, then both check.
    rma.put(other, &shared, 0, &pattern(rank, 1, LEN)).unwrap();
    rma.put(other, &mine, 64, &pattern(rank, 2, LEN)).unwrap();
    for _ in 0..ADDS {
        // Both ranks add to rank 0's registered word 0: one from its own process, one
        // through rank 0's engine.
        rma.fetch_add(0, &mine, 0, 1).unwrap();
    }
    rma.flush_all().unwrap();
    rma.barrier().unwrap();
    assert!(
        shared.to_vec() == pattern(other, 1, LEN),
        "the allocated window"
    );
    let mut back = vec![0u8; LEN];
    rma.get(other, &mine, 64, &mut back).unwrap();
    assert!(
        back == pattern(rank, 2, LEN),
        "a get from the other's registered memory"
    );
    if rank == 0 {
        assert_eq!(
            mine.word(0)
                .unwrap()
                .load(std::sync::atomic::Ordering::Acquire),
            2 * ADDS
        );
    }
    match rma.put(other, &shared, (LEN - 4) as u64, &[0u8; 8]) {
        Err(quiver::Error::Rma(quiver::rma::RmaError::OutOfBounds { .. })) => {}
        other => panic!("a put past the window's end: {other:?}"),
    }
    let stats = rma.stats();
    let given_back = rma
        .free(mine)
        .unwrap()
        .expect("registered memory comes back");
    assert!(
        given_back[64..] == pattern(other, 2, LEN)[..],
        "the registered memory holds what the other process put"
    );
    rma.free(shared).unwrap();
    println!(
        "rank {rank}: puts_applied: {} direct: {}",
        stats.puts_applied, stats.direct
    );
    job.barrier().unwrap();
}

fn run_job(extra: &[(&str, &str)]) -> Vec<String> {
    let tj = TestJob::new(2);
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..2)
        .map(|rank| {
            let mut cmd = Command::new(&exe);
            cmd.args(["--exact", "rma_between_two_processes", "--nocapture"])
                .envs(tj.env(rank, extra))
                .env(RANK_VAR, rank.to_string())
                .stdout(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
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
    children
        .into_iter()
        .map(|c| String::from_utf8_lossy(&c.wait_with_output().unwrap().stdout).into_owned())
        .collect()
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
fn rma_between_two_processes() {
    if let Ok(r) = std::env::var(RANK_VAR) {
        rank_main(r.parse().unwrap());
        return;
    }
    // Cross-memory attach on: the puts into the other's registered memory go by attach
    // (none applied by an engine), the get too.
    let out = run_job(&[]);
    for o in &out {
        assert_eq!(counter(o, "puts_applied"), 0, "{out:?}");
    }
    // Off: the same bytes, through the target's engine.
    let out = run_job(&[("QUIVER_CMA", "off")]);
    for o in &out {
        assert!(counter(o, "puts_applied") > 0, "{out:?}");
    }
    // Over UDP, as two nodes would: every put applied by the target's engine (with the
    // offload engine, on its thread); nothing direct but rank 0's adds to its own word.
    for extra in [
        &[("QUIVER_TRANSPORT", "udp")][..],
        &[
            ("QUIVER_TRANSPORT", "udp"),
            ("QUIVER_RELIABILITY", "offload"),
        ][..],
    ] {
        let out = run_job(extra);
        for (rank, o) in out.iter().enumerate() {
            assert!(counter(o, "puts_applied") > 0, "{extra:?}: {out:?}");
            let own_adds = if rank == 0 { ADDS } else { 0 };
            assert_eq!(counter(o, "direct"), own_adds, "{extra:?}: {out:?}");
        }
    }
}
