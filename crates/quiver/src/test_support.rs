//! What the crate's own tests share: how a test that cannot run here says so, and a job
//! of several ranks joined from threads of the test process.

/// Skips a test that needs what this machine lacks (root, a raw socket, a network
/// namespace, a command), with one line saying why; under `.ci/run` (`QUIVER_CI` set),
/// which runs as root with every tool installed, fails instead, so that CI never passes a
/// test it did not run.
pub(crate) fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipping: {why}");
}

/// Joins `size` ranks of one job with `config`, each from a thread of this process, with
/// a store served here; the jobs in rank order, and the store (which lives as long as
/// the handle).
pub(crate) fn jobs(
    size: u32,
    config: &crate::config::Config,
) -> (Vec<crate::Job>, crate::job::rendezvous::KvServerHandle) {
    let server = crate::job::rendezvous::KvServer::bind("127.0.0.1:0".parse().unwrap())
        .unwrap()
        .spawn();
    let url = format!("tcp://{}", server.local_addr());
    let mut id = [0u8; 4];
    getrandom::fill(&mut id).unwrap();
    let job_id = (u32::from_le_bytes(id) | 1).to_string();
    let joins: Vec<_> = (0..size)
        .map(|rank| {
            let env: std::collections::HashMap<&str, String> = [
                ("QUIVER_RANK", rank.to_string()),
                ("QUIVER_SIZE", size.to_string()),
                ("QUIVER_JOB_ID", job_id.clone()),
                ("QUIVER_JOB_TOKEN", "0123456789abcdef".to_string()),
                ("QUIVER_RENDEZVOUS", url.clone()),
            ]
            .into_iter()
            .collect();
            let config = config.clone();
            std::thread::spawn(move || {
                crate::Job::from_lookup(&|k| env.get(k).cloned(), config).unwrap()
            })
        })
        .collect();
    let jobs = joins.into_iter().map(|j| j.join().unwrap()).collect();
    (jobs, server)
}
