//! Runs the ranks of a job as threads of the test process, with a rendezvous store
//! served by the test, so that whole-stack tests need no launcher.
#![allow(dead_code)]

use quiver::job::rendezvous::{KvServer, KvServerHandle};
use quiver::{Config, Job, TransportChoice, WaitMode};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// A running rendezvous store and the job id/token of one test job.
pub struct TestJob {
    pub server: KvServerHandle,
    pub job_id: u32,
    pub token: u64,
    pub size: u32,
}

impl TestJob {
    pub fn new(size: u32) -> TestJob {
        let server = KvServer::bind("127.0.0.1:0".parse().unwrap())
            .expect("bind rendezvous")
            .spawn();
        let mut b = [0u8; 12];
        getrandom_fill(&mut b);
        TestJob {
            server,
            job_id: u32::from_le_bytes(b[..4].try_into().unwrap()) | 1,
            token: u64::from_le_bytes(b[4..].try_into().unwrap()),
            size,
        }
    }

    pub fn url(&self) -> String {
        format!("tcp://{}", self.server.local_addr())
    }

    /// The variables `quiver run` would give `rank` (plus `extra`).
    pub fn env(&self, rank: u32, extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            ("QUIVER_RANK", rank.to_string()),
            ("QUIVER_SIZE", self.size.to_string()),
            ("QUIVER_JOB_ID", self.job_id.to_string()),
            ("QUIVER_JOB_TOKEN", format!("{:016x}", self.token)),
            ("QUIVER_RENDEZVOUS", self.url()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (k, v) in extra {
            m.insert(k.to_string(), v.to_string());
        }
        m
    }

    pub fn join(&self, rank: u32, config: Config, extra: &[(&str, &str)]) -> Job {
        let env = self.env(rank, extra);
        Job::from_lookup(&|k| env.get(k).cloned(), config).expect("join job")
    }
}

fn getrandom_fill(b: &mut [u8]) {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(b))
        .expect("urandom");
}

/// Default configuration of test jobs: short polling so that four rank-threads share
/// two cores without starving each other.
pub fn config(transport: TransportChoice) -> Config {
    Config::default()
        .with_transport(transport)
        .with_wait(WaitMode::Hybrid(Duration::from_micros(20)))
}

/// Runs `body(job)` on `size` rank-threads and propagates the first panic.
pub fn run_ranks<F>(size: u32, config: Config, body: F)
where
    F: Fn(Job) + Send + Sync + 'static,
{
    run_ranks_env(size, config, &[], body)
}

/// Like [`run_ranks`] with extra variables for every rank.
pub fn run_ranks_env<F>(size: u32, config: Config, extra: &[(&str, &str)], body: F)
where
    F: Fn(Job) + Send + Sync + 'static,
{
    let tj = Arc::new(TestJob::new(size));
    let body = Arc::new(body);
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let handles: Vec<_> = (0..size)
        .map(|rank| {
            let (tj, body, config, extra) =
                (tj.clone(), body.clone(), config.clone(), extra.clone());
            std::thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || {
                    let extra: Vec<(&str, &str)> = extra
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    let job = tj.join(rank, config, &extra);
                    body(job)
                })
                .unwrap()
        })
        .collect();
    let mut first_panic = None;
    for h in handles {
        if let Err(p) = h.join() {
            first_panic.get_or_insert(p);
        }
    }
    if let Some(p) = first_panic {
        std::panic::resume_unwind(p);
    }
}

/// Deterministic contents for message `seq` of `len` bytes from `src`.
pub fn pattern(src: u32, seq: u32, len: usize) -> Vec<u8> {
    let mut x = (src as u64) << 32 | seq as u64 | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
