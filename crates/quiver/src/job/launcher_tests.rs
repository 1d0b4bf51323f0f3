//! Bootstrap through a launcher's PMI service, against a PMI server of the test's own
//! (one socket pair per rank, as Hydra and Slurm pass `PMI_FD`): whole jobs of threads
//! meet through PMI-1 and PMI-2, and a server that misbehaves gives typed errors on
//! every rank, never a panic or a hang.

use super::bootstrap::{bootstrap, JobInfo};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

/// How the test's server misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lie {
    /// It does not.
    Honest,
    /// It answers `init` with a line that is not a PMI reply.
    Garbage,
    /// Every `put` fails with rc=14.
    PutFails,
    /// It closes the connection instead of answering the fence.
    ClosesAtFence,
    /// PMI-2's `fullinit` names another rank than the environment.
    WrongRank,
    /// Rank 0's store address reads back as something else.
    BadStoreAddress,
    /// It never answers the fence.
    Silent,
    /// It speaks PMI-1 only: it refuses a PMI-2 `init`.
    OnlyV1,
}

/// The server's fence: waits for every rank, or gives up after a few seconds (a rank
/// whose bootstrap failed never comes).
struct Fence {
    arrived: Mutex<u32>,
    all: Condvar,
    size: u32,
}

impl Fence {
    fn wait(&self) -> bool {
        let mut n = self.arrived.lock().unwrap();
        *n += 1;
        self.all.notify_all();
        let (n, _) = self
            .all
            .wait_timeout_while(n, Duration::from_secs(5), |n| *n < self.size)
            .unwrap();
        *n >= self.size
    }
}

/// The server's side of one rank's connection.
fn serve_rank(
    conn: UnixStream,
    rank: u32,
    size: u32,
    lie: Lie,
    kv: Arc<Mutex<HashMap<String, String>>>,
    fence: Arc<Fence>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut w = conn;
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    if lie == Lie::Garbage {
        let _ = w.write_all(b"\x00\xffhello there\n");
        return;
    }
    let mut v2 = line.contains("pmi_version=2");
    if v2 && lie == Lie::OnlyV1 {
        let _ = writeln!(
            w,
            "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1"
        );
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || !line.contains("pmi_version=1") {
            return;
        }
        v2 = false;
    }
    let version = if v2 {
        "2 pmi_subversion=0"
    } else {
        "1 pmi_subversion=1"
    };
    let _ = writeln!(w, "cmd=response_to_init pmi_version={version} rc=0");
    let fence_or_lie = |w: &mut UnixStream| -> bool {
        match lie {
            Lie::ClosesAtFence => {
                let _ = w.shutdown(std::net::Shutdown::Both);
                false
            }
            Lie::Silent => {
                thread::sleep(Duration::from_secs(3));
                false
            }
            _ => fence.wait(),
        }
    };
    let stored = |key: &str| {
        let v = kv.lock().unwrap().get(key).cloned();
        match (lie, key) {
            (Lie::BadStoreAddress, "quiver-store") => v.map(|_| "tcp://nowhere".to_string()),
            _ => v,
        }
    };
    if !v2 {
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let words: HashMap<&str, &str> = line
                .split_whitespace()
                .filter_map(|w| w.split_once('='))
                .collect();
            let reply = match words.get("cmd").copied() {
                Some("get_my_kvsname") => "cmd=my_kvsname kvsname=kvs_1 rc=0".to_string(),
                Some("put") if lie == Lie::PutFails => "cmd=put_result rc=14".to_string(),
                Some("put") => {
                    kv.lock()
                        .unwrap()
                        .insert(words["key"].to_string(), words["value"].to_string());
                    "cmd=put_result rc=0".to_string()
                }
                Some("barrier_in") => {
                    if !fence_or_lie(&mut w) {
                        return;
                    }
                    "cmd=barrier_out".to_string()
                }
                Some("get") => match stored(words["key"]) {
                    Some(v) => format!("cmd=get_result rc=0 value={v}"),
                    None => "cmd=get_result rc=-1 value=unknown".to_string(),
                },
                Some("finalize") => {
                    let _ = writeln!(w, "cmd=finalize_ack");
                    return;
                }
                _ => "cmd=unknown rc=1".to_string(),
            };
            let _ = writeln!(w, "{reply}");
        }
    }
    loop {
        let mut len = [0u8; 6];
        if reader.read_exact(&mut len).is_err() {
            return;
        }
        let n: usize = std::str::from_utf8(&len).unwrap().trim().parse().unwrap();
        let mut body = vec![0u8; n];
        reader.read_exact(&mut body).unwrap();
        let body = String::from_utf8(body).unwrap();
        let fields: HashMap<&str, &str> =
            body.split(';').filter_map(|f| f.split_once('=')).collect();
        let reply = match fields.get("cmd").copied() {
            Some("fullinit") => {
                let r = if lie == Lie::WrongRank {
                    rank + 1
                } else {
                    rank
                };
                format!("cmd=fullinit-response;rc=0;rank={r};size={size};appnum=0;")
            }
            Some("kvs-put") if lie == Lie::PutFails => "cmd=kvs-put-response;rc=14;".into(),
            Some("kvs-put") => {
                kv.lock()
                    .unwrap()
                    .insert(fields["key"].to_string(), fields["value"].to_string());
                "cmd=kvs-put-response;rc=0;".into()
            }
            Some("kvs-fence") => {
                if !fence_or_lie(&mut w) {
                    return;
                }
                "cmd=kvs-fence-response;rc=0;".into()
            }
            Some("kvs-get") => match stored(fields["key"]) {
                Some(v) => format!("cmd=kvs-get-response;rc=0;found=TRUE;value={v};"),
                None => "cmd=kvs-get-response;rc=0;found=FALSE;".into(),
            },
            Some("finalize") => {
                let _ = w.write_all(b"27    cmd=finalize-response;rc=0;");
                return;
            }
            _ => "cmd=unknown;rc=1;".into(),
        };
        let _ = w.write_all(format!("{:<6}{reply}", reply.len()).as_bytes());
    }
}

/// Bootstraps `size` ranks (threads) through a PMI server that behaves as `lie` says,
/// with `QUIVER_BOOTSTRAP` = `bootstrap_var`; every rank's result.
fn job_through_pmi(size: u32, lie: Lie, bootstrap_var: &str) -> Vec<Result<JobInfo>> {
    job_through_pmi_at(size, lie, bootstrap_var, "127.0.0.1")
}

/// [`job_through_pmi`] with rank 0's `QUIVER_ADDR` = `addr0`.
fn job_through_pmi_at(
    size: u32,
    lie: Lie,
    bootstrap_var: &str,
    addr0: &str,
) -> Vec<Result<JobInfo>> {
    let kv = Arc::new(Mutex::new(HashMap::new()));
    let fence = Arc::new(Fence {
        arrived: Mutex::new(0),
        all: Condvar::new(),
        size,
    });
    let mut ranks = Vec::new();
    let mut servers = Vec::new();
    for rank in 0..size {
        let (client, server) = UnixStream::pair().unwrap();
        let (kv, fence) = (kv.clone(), fence.clone());
        servers.push(thread::spawn(move || {
            serve_rank(server, rank, size, lie, kv, fence)
        }));
        let choice = bootstrap_var.to_string();
        let addr = if rank == 0 { addr0 } else { "127.0.0.1" }.to_string();
        ranks.push(thread::spawn(move || {
            let env: HashMap<&str, String> = HashMap::from([
                ("PMI_FD", client.as_raw_fd().to_string()),
                ("PMI_RANK", rank.to_string()),
                ("PMI_SIZE", size.to_string()),
                ("MPI_LOCALRANKID", rank.to_string()),
                ("QUIVER_ADDR", addr),
                ("QUIVER_BOOTSTRAP", choice),
            ]);
            let r = bootstrap(&|k| env.get(k).cloned(), Duration::from_secs(2));
            drop(client);
            r
        }));
    }
    let out = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    for s in servers {
        s.join().unwrap();
    }
    out
}

#[test]
fn ranks_meet_through_pmi_2_and_pmi_1() {
    for (choice, lie, says) in [
        ("auto", Lie::Honest, "PMI-2"),
        ("pmi2", Lie::Honest, "PMI-2"),
        ("pmi1", Lie::Honest, "PMI-1"),
        // A server that refuses PMI-2 is spoken to in PMI-1 on the same connection.
        ("auto", Lie::OnlyV1, "PMI-1"),
    ] {
        let infos: Vec<JobInfo> = job_through_pmi(3, lie, choice)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        for (rank, info) in infos.iter().enumerate() {
            assert_eq!(info.rank, rank as u32);
            assert_eq!(
                (info.size, info.job_id, info.token),
                (3, infos[0].job_id, infos[0].token)
            );
            assert_eq!(info.frame_key, infos[0].frame_key);
            assert!(
                info.bootstrap.starts_with(says),
                "{choice}: {}",
                info.bootstrap
            );
            assert!(
                info.bootstrap.contains("tcp://127.0.0.1:"),
                "QUIVER_ADDR decides where rank 0 serves: {}",
                info.bootstrap
            );
        }
        assert!(infos[0].server.is_some() && infos[1].server.is_none());
    }
}

/// Every rank gets an error of the kind expected, naming the service, and no thread
/// panics or waits past the timeout.
#[test]
fn a_misbehaving_pmi_server_gives_typed_errors() {
    for lie in [
        Lie::Garbage,
        Lie::PutFails,
        Lie::ClosesAtFence,
        Lie::WrongRank,
        Lie::BadStoreAddress,
        Lie::Silent,
    ] {
        let results = job_through_pmi(2, lie, "auto");
        // Rank 0 has its own store's address and is not misled by the bad one.
        let which = if lie == Lie::BadStoreAddress {
            &results[1..]
        } else {
            &results[..]
        };
        for r in which {
            match r {
                Err(Error::Launcher { service, reason }) => {
                    assert!(service.contains("PMI_FD"), "{lie:?}: {service}");
                    assert!(!reason.is_empty());
                }
                other => panic!("{lie:?}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_stale_pmi_fd_is_named() {
    let env: HashMap<&str, String> = HashMap::from([
        ("PMI_FD", "987654".to_string()),
        ("PMI_RANK", "0".to_string()),
        ("PMI_SIZE", "2".to_string()),
    ]);
    match bootstrap(&|k| env.get(k).cloned(), Duration::from_secs(1)) {
        Err(Error::InvalidEnv { var, reason, .. }) => {
            assert_eq!(var, "PMI_FD");
            assert!(reason.contains("not an open descriptor"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // A descriptor that is open but not a socket.
    let file = std::fs::File::open("/proc/self/stat").unwrap();
    let env: HashMap<&str, String> = HashMap::from([
        ("PMI_FD", file.as_raw_fd().to_string()),
        ("PMI_RANK", "0".to_string()),
        ("PMI_SIZE", "2".to_string()),
        ("QUIVER_BOOTSTRAP", "pmi2".to_string()),
    ]);
    match bootstrap(&|k| env.get(k).cloned(), Duration::from_secs(1)) {
        Err(Error::InvalidEnv { var, reason, .. }) => {
            assert_eq!(var, "PMI_FD");
            assert!(reason.contains("not a socket"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// Rank 0 that cannot serve the store says so through the fence: the others stop at
/// once with the reason, not at their timeout.
#[test]
fn rank_0_that_cannot_serve_stops_the_others_at_once() {
    let start = std::time::Instant::now();
    // An address of no interface here (TEST-NET-1): the bind fails.
    let results = job_through_pmi_at(3, Lie::Honest, "auto", "192.0.2.231");
    assert!(
        matches!(results[0], Err(Error::Io { .. })),
        "{:?}",
        results[0]
    );
    for r in &results[1..] {
        match r {
            Err(Error::Launcher { reason, .. }) => {
                assert!(reason.contains("rank 0 could not serve"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
}

/// A second bootstrap over a PMI connection this process already finalized (a second
/// `Job::from_env` under mpiexec) is an error that says so.
#[test]
fn a_finalized_pmi_connection_is_not_used_twice() {
    let (client, server) = UnixStream::pair().unwrap();
    let kv = Arc::new(Mutex::new(HashMap::new()));
    let fence = Arc::new(Fence {
        arrived: Mutex::new(0),
        all: Condvar::new(),
        size: 1,
    });
    let serving = thread::spawn(move || serve_rank(server, 0, 1, Lie::Honest, kv, fence));
    let env: HashMap<&str, String> = HashMap::from([
        ("PMI_FD", client.as_raw_fd().to_string()),
        ("PMI_RANK", "0".to_string()),
        ("PMI_SIZE", "1".to_string()),
        ("QUIVER_ADDR", "127.0.0.1".to_string()),
    ]);
    let first = bootstrap(&|k| env.get(k).cloned(), Duration::from_secs(2));
    assert!(first.is_ok(), "{first:?}");
    serving.join().unwrap();
    match bootstrap(&|k| env.get(k).cloned(), Duration::from_secs(2)) {
        Err(Error::Launcher { reason, .. }) => assert!(reason.contains("closed"), "{reason}"),
        Err(Error::Io { .. }) => {}
        other => panic!("{other:?}"),
    }
}

/// A PMI port other hosts reach is not used unless asked for by name (whoever reaches
/// it could read the store's key).
#[test]
fn a_pmi_port_on_the_network_needs_to_be_asked_for() {
    let env: HashMap<&str, String> = HashMap::from([
        ("PMI_PORT", "192.0.2.77:5".to_string()),
        ("PMI_ID", "0".to_string()),
    ]);
    match bootstrap(&|k| env.get(k).cloned(), Duration::from_secs(1)) {
        Err(Error::Launcher { reason, .. }) => {
            assert!(reason.contains("QUIVER_BOOTSTRAP=pmi2"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}
