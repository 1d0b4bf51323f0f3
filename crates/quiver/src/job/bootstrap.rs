//! Bootstrap: how a process learns its rank, the job size, the job's id and secret token,
//! and the node (name and address) of every rank.
//!
//! It reads the launcher's environment ([`detect`]): quiver's own `quiver run`
//! (`QUIVER_RANK`, `QUIVER_SIZE`), Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`), MPICH's
//! Hydra (`PMI_RANK`, `PMI_SIZE`) or Slurm's `srun` (`SLURM_PROCID`, `SLURM_NTASKS`), in
//! that order of priority. The ranks then meet in the rendezvous store named by
//! `QUIVER_RENDEZVOUS` (see [`super::rendezvous`]), or, without it, in the store rank 0
//! serves, which they find through the launcher's key-value service (PMIx, PMI-2, PMI-1:
//! `super::launcher_kv`), and exchange the rest ([`bootstrap`]).
//!
//! # Guarantees
//!
//! - Detection is a pure function of the variables it is given; every error names the
//!   variable to fix ([`Error::MissingEnv`], [`Error::InvalidEnv`]).
//! - When [`bootstrap`] returns, every rank has published its node and agrees on the job
//!   id, the token, the node names, the node ids and the addresses; every rank has
//!   finished its own bootstrap (a final barrier), so the store may be used at once.
//! - Node ids are dense and numbered in order of first appearance by rank: rank 0's node
//!   is node 0, and ranks whose node names are equal share a node id.
//!
//! # Variables
//!
//! Each launcher's rank, size, local rank and local size (`QUIVER_RANK`, `QUIVER_SIZE`,
//! `QUIVER_LOCAL_RANK`, `QUIVER_LOCAL_SIZE`, and Open MPI's, Hydra's and Slurm's
//! equivalents): decimal numbers, the size from 1 to [`MAX_JOB_SIZE`], the rank below
//! the size, the local size (where the launcher gives one) from 1 to the size, the local
//! rank below the local size and the size. Then:
//!
//! | variable | meaning |
//! |---|---|
//! | `QUIVER_RENDEZVOUS` | `tcp://HOST:PORT` (port 1 to 65535) or `file:///DIR`; required unless the launcher offers a key-value service |
//! | `QUIVER_BOOTSTRAP` | `auto` (default), `store`, `pmix`, `pmi2`, `pmi1` (`super::launcher_kv`) |
//! | `QUIVER_PMIX_LIB` | the PMIx client library to load (default `libpmix.so.2`) |
//! | `QUIVER_RENDEZVOUS_KEY` | the `tcp://` store's secret, 64 hex digits; set by `quiver run`, otherwise the user's `~/.quiver/rendezvous.key` ([`super::rendezvous::StoreKey::from_lookup`]) |
//! | `QUIVER_JOB_ID`, `QUIVER_JOB_TOKEN` | decimal u32 (0 to 4294967295) and exactly 16 hex digits, both or neither; set by `quiver run`, which then also serves the tcp store |
//! | `QUIVER_NODE` | this rank's node name, 1 to 255 printable ASCII characters without whitespace, `\|` or `,` (default: the host name) |
//! | `QUIVER_ADDR` | this rank's IPv4 or IPv6 address (default: the local address of the connection to the store, or 127.0.0.1) |
//!
//! All of them are read and checked before the store is contacted.
//!
//! Without `QUIVER_JOB_ID`, rank 0 serves a `tcp://` store itself at `HOST:PORT`, and draws
//! a random job id and token that it publishes in the store. A `file://` store is then
//! divided per run by the launcher's job id (`OMPI_MCA_ess_base_jobid`, `PMIX_NAMESPACE`,
//! or `SLURM_JOB_ID` and `SLURM_STEP_ID`).
//!
//! Keys used in the store: `job/id`, `job/token`, `node/{rank}`, `nodes/count`,
//! `nodes/{chunk}` (rank 0's merged list, so that the exchange costs O(size) requests)
//! and those of the barrier `bootstrap`.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use super::launcher_kv::{self, Kv, Plan, Service};
use super::rendezvous::{
    parse_url, show, Deadline, KvServer, KvServerHandle, Rendezvous, RendezvousUrl, StoreKey,
    MAX_ITEM_LEN,
};
use crate::error::{Error, Result};

/// The program that started the job's processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// quiver's own launcher, `quiver run`.
    Quiver,
    /// Open MPI's `mpirun` / `mpiexec` (or `prterun`).
    OpenMpi,
    /// MPICH's Hydra process manager (`mpiexec.hydra`).
    Hydra,
    /// Slurm's `srun`.
    Slurm,
}

impl fmt::Display for Launcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Launcher::Quiver => "quiver run",
            Launcher::OpenMpi => "Open MPI (mpirun)",
            Launcher::Hydra => "MPICH Hydra (mpiexec)",
            Launcher::Slurm => "Slurm (srun)",
        })
    }
}

/// What the launcher's environment says about this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detected {
    /// This process's rank, below `size`.
    pub rank: u32,
    /// The number of ranks, at least 1.
    pub size: u32,
    /// This process's rank among those on its node, when the launcher says.
    pub local_rank: Option<u32>,
    /// The launcher whose variables were found.
    pub launcher: Launcher,
}

/// Largest job size accepted: 1 048 576 ranks. Every rank keeps tables with an entry
/// per rank (node names, node ids, addresses), and rank 0 gathers every rank's entry
/// through the store, so a size read from a mistaken variable must not size them: near
/// `u32::MAX` the first table alone would take 100 GB. A million ranks is beyond any job
/// a single rendezvous store serves.
pub const MAX_JOB_SIZE: u32 = 1 << 20;

/// The variables of one launcher.
struct Scheme {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    /// Ranks on this node, if the launcher says so simply (Slurm gives only a compressed
    /// list of tasks per node).
    local_size: Option<&'static str>,
}

/// In order of priority: an MPI launcher run inside a Slurm allocation wins over Slurm.
const SCHEMES: [Scheme; 4] = [
    Scheme {
        launcher: Launcher::Quiver,
        rank: "QUIVER_RANK",
        size: "QUIVER_SIZE",
        local_rank: "QUIVER_LOCAL_RANK",
        local_size: Some("QUIVER_LOCAL_SIZE"),
    },
    Scheme {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Scheme {
        launcher: Launcher::Hydra,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
    Scheme {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
];

/// The `QUIVER_*` variables [`bootstrap`] reads, beside the other launchers' (for the
/// UTF-8 check of [`bootstrap_from_env`]).
pub(crate) const VARIABLES: &[&str] = &[
    "QUIVER_RANK",
    "QUIVER_SIZE",
    "QUIVER_LOCAL_RANK",
    "QUIVER_LOCAL_SIZE",
    "QUIVER_RENDEZVOUS",
    "QUIVER_JOB_ID",
    "QUIVER_JOB_TOKEN",
    "QUIVER_NODE",
    "QUIVER_ADDR",
    "QUIVER_BOOTSTRAP",
    "QUIVER_PMIX_LIB",
];

/// The variable's value, trimmed; `None` when unset or blank.
fn var(get: &dyn Fn(&str) -> Option<String>, name: &str) -> Option<String> {
    get(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn invalid(var: &str, value: &str, reason: impl Into<String>) -> Error {
    Error::InvalidEnv {
        var: var.to_string(),
        value: value.to_string(),
        reason: reason.into(),
    }
}

/// Parses a decimal u32 (digits only: no sign).
fn parse_u32(name: &str, value: &str) -> Result<u32> {
    match value.parse::<u32>() {
        Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(invalid(
            name,
            value,
            "expected a decimal number from 0 to 4294967295",
        )),
    }
}

/// Parses a job token: exactly 16 hex digits.
fn parse_token(name: &str, value: &str) -> Result<u64> {
    match u64::from_str_radix(value, 16) {
        Ok(t) if value.len() == 16 && value.bytes().all(|b| b.is_ascii_hexdigit()) => Ok(t),
        _ => Err(invalid(
            name,
            value,
            "expected exactly 16 hexadecimal digits",
        )),
    }
}

/// Reads rank, size and local rank from the launcher's variables, looked up with `get`.
///
/// Priority: `QUIVER_RANK`/`QUIVER_SIZE` (`QUIVER_LOCAL_RANK`) >
/// `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE` (`OMPI_COMM_WORLD_LOCAL_RANK`) >
/// `PMI_RANK`/`PMI_SIZE` (`MPI_LOCALRANKID`) > `SLURM_PROCID`/`SLURM_NTASKS`
/// (`SLURM_LOCALID`). Blank values count as unset.
///
/// # Errors
///
/// [`Error::MissingEnv`] naming the missing variable when a rank variable is set without
/// its size variable or the reverse, or (naming `QUIVER_RANK`) when no launcher is found;
/// [`Error::InvalidEnv`] naming the variable when a value is not a decimal number, the
/// size is not from 1 to [`MAX_JOB_SIZE`], the rank (or local rank) is not below the
/// size, the local size is not from 1 to the size, or the local rank is not below it.
pub fn detect(get: &dyn Fn(&str) -> Option<String>) -> Result<Detected> {
    for s in &SCHEMES {
        let (rank, size) = match (var(get, s.rank), var(get, s.size)) {
            (None, None) => continue,
            (Some(rank), Some(size)) => (rank, size),
            (Some(_), None) => {
                return Err(Error::MissingEnv {
                    var: s.size,
                    hint: format!(
                        "{} is set, so this process looks started by {}, but the job size \
                         {} is not",
                        s.rank, s.launcher, s.size
                    ),
                })
            }
            (None, Some(_)) => {
                return Err(Error::MissingEnv {
                    var: s.rank,
                    hint: format!(
                        "{} is set, so this process looks started by {}, but its rank {} \
                         is not",
                        s.size, s.launcher, s.rank
                    ),
                })
            }
        };
        let size_n = parse_u32(s.size, &size)?;
        if !(1..=MAX_JOB_SIZE).contains(&size_n) {
            return Err(invalid(
                s.size,
                &size,
                format!(
                    "the job size must be from 1 to {MAX_JOB_SIZE} ranks; is this the \
                     variable of the launcher that started the job?"
                ),
            ));
        }
        let rank_n = parse_u32(s.rank, &rank)?;
        if rank_n >= size_n {
            return Err(invalid(
                s.rank,
                &rank,
                format!("the rank must be below the job size {size_n} ({})", s.size),
            ));
        }
        // Read only to be checked: a local size that contradicts the rest means the
        // launcher's variables are not this job's.
        let local_size = match s.local_size.and_then(|name| Some((name, var(get, name)?))) {
            None => None,
            Some((name, v)) => {
                let n = parse_u32(name, &v)?;
                if !(1..=size_n).contains(&n) {
                    return Err(invalid(
                        name,
                        &v,
                        format!(
                            "the local size must be from 1 to the job size {size_n} ({})",
                            s.size
                        ),
                    ));
                }
                Some((name, n))
            }
        };
        let local_rank = match var(get, s.local_rank) {
            None => None,
            Some(v) => {
                let n = parse_u32(s.local_rank, &v)?;
                if n >= size_n {
                    return Err(invalid(
                        s.local_rank,
                        &v,
                        format!(
                            "the local rank must be below the job size {size_n} ({})",
                            s.size
                        ),
                    ));
                }
                if let Some((name, local_size)) = local_size.filter(|&(_, l)| n >= l) {
                    return Err(invalid(
                        s.local_rank,
                        &v,
                        format!(
                            "the local rank must be below the local size {local_size} ({name})"
                        ),
                    ));
                }
                Some(n)
            }
        };
        // `srun --mpi=pmi2` sets PMI_RANK and PMI_SIZE to Slurm's own rank and size, and
        // not Hydra's MPI_LOCALRANKID.
        let launcher = if s.launcher == Launcher::Hydra
            && var(get, "MPI_LOCALRANKID").is_none()
            && var(get, "SLURM_PROCID").as_deref() == Some(rank.as_str())
            && var(get, "SLURM_NTASKS").as_deref() == Some(size.as_str())
        {
            Launcher::Slurm
        } else {
            s.launcher
        };
        return Ok(Detected {
            rank: rank_n,
            size: size_n,
            local_rank,
            launcher,
        });
    }
    Err(Error::MissingEnv {
        var: "QUIVER_RANK",
        hint: "no launcher was found (none of QUIVER_RANK, OMPI_COMM_WORLD_RANK, PMI_RANK, \
               SLURM_PROCID is set): start the program with `quiver run -n N PROGRAM`, \
               `mpirun -n N PROGRAM` or `srun -n N PROGRAM`"
            .into(),
    })
}

/// Everything a rank knows about its job once bootstrapped.
pub struct JobInfo {
    /// This process's rank.
    pub rank: u32,
    /// The number of ranks.
    pub size: u32,
    /// Rank among those on this node, when the launcher says.
    pub local_rank: Option<u32>,
    /// The job's id, the same on every rank.
    pub job_id: u32,
    /// The job's secret token, the same on every rank.
    pub token: u64,
    /// The key that signs the job's network frames when `QUIVER_AUTH` is on, the same
    /// on every rank: derived from the `tcp://` store's key (which quiver never sends;
    /// under a launcher's service the launcher carries it once), or
    /// drawn by the first rank and kept in a `file://` store (readable by the user only).
    pub frame_key: [u8; 32],
    /// The launcher that started the job.
    pub launcher: Launcher,
    /// How the ranks met: the store's URL, or the launcher's service that told them
    /// where rank 0 serves it.
    pub bootstrap: String,
    /// The node name of every rank, indexed by rank.
    pub node_names: Vec<String>,
    /// The node id of every rank, indexed by rank (dense, by first appearance).
    pub nids: Vec<u32>,
    /// The IP address of every rank, indexed by rank.
    pub addrs: Vec<IpAddr>,
    /// The rendezvous store, for later exchanges (endpoint addresses, barriers).
    pub rendezvous: Arc<Rendezvous>,
    /// The store this rank serves (rank 0 of a `tcp://` job not started by `quiver run`).
    /// The other ranks need it for as long as they use the store.
    pub server: Option<KvServerHandle>,
}

impl fmt::Debug for JobInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobInfo")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("local_rank", &self.local_rank)
            .field("job_id", &self.job_id)
            .field("token", &"<secret>")
            .field("launcher", &self.launcher)
            .field("bootstrap", &self.bootstrap)
            .field("node_names", &self.node_names)
            .field("nids", &self.nids)
            .field("addrs", &self.addrs)
            .field("rendezvous", &self.rendezvous)
            .field("server", &self.server)
            .finish()
    }
}

/// [`bootstrap`] over the process environment. A `QUIVER_*` variable set to something
/// other than UTF-8 is an [`Error::InvalidEnv`] (rather than taken for unset).
pub fn bootstrap_from_env(timeout: Duration) -> Result<JobInfo> {
    crate::config::check_unicode(VARIABLES)?;
    bootstrap(&|name| std::env::var(name).ok(), timeout)
}

/// The variables of [`bootstrap`] other than the launcher's rank and size, read and
/// checked before anything is contacted.
struct Settings {
    /// `QUIVER_RENDEZVOUS` as given, and the store it names (a `file://` one already
    /// divided per run); `None` when unset.
    store: Option<(String, RendezvousUrl)>,
    /// `QUIVER_JOB_ID` and `QUIVER_JOB_TOKEN`, when set.
    env_job: Option<(u32, u64)>,
    /// `QUIVER_NODE`, when set (a valid node name).
    node: Option<String>,
    /// `QUIVER_ADDR`, when set.
    addr: Option<IpAddr>,
}

/// Reads [`Settings`] through `get`: a pure function of the variables.
///
/// # Errors
///
/// [`Error::MissingEnv`] or [`Error::InvalidEnv`] naming the variable to fix (for a
/// `file://` store without any job id, `QUIVER_JOB_ID`; for a launcher's job id too long
/// to name a directory, the launcher's variable).
fn settings(get: &dyn Fn(&str) -> Option<String>) -> Result<Settings> {
    let url_text = var(get, "QUIVER_RENDEZVOUS");
    let url = match &url_text {
        None => None,
        Some(text) => Some(parse_url(text).map_err(|e| match e {
            Error::Rendezvous { reason, .. } => invalid("QUIVER_RENDEZVOUS", text, reason),
            e => e,
        })?),
    };

    let env_job = match (var(get, "QUIVER_JOB_ID"), var(get, "QUIVER_JOB_TOKEN")) {
        (Some(id), Some(token)) => Some((
            parse_u32("QUIVER_JOB_ID", &id)?,
            parse_token("QUIVER_JOB_TOKEN", &token)?,
        )),
        (None, None) => None,
        (Some(_), None) => {
            return Err(Error::MissingEnv {
                var: "QUIVER_JOB_TOKEN",
                hint: "QUIVER_JOB_ID is set, so QUIVER_JOB_TOKEN (16 hex digits, the same on \
                       every rank) must be set too; `quiver run` sets both"
                    .into(),
            })
        }
        (None, Some(_)) => {
            return Err(Error::MissingEnv {
                var: "QUIVER_JOB_ID",
                hint: "QUIVER_JOB_TOKEN is set, so QUIVER_JOB_ID (a decimal number, the same \
                       on every rank) must be set too; `quiver run` sets both"
                    .into(),
            })
        }
    };
    // A directory store is divided per run, by our job id or the launcher's.
    let url = match url {
        Some(RendezvousUrl::File(dir)) => {
            let namespace = match env_job {
                Some((id, _)) => format!("quiver-{id}"),
                None => launcher_namespace(get)?,
            };
            Some(RendezvousUrl::File(dir.join(namespace)))
        }
        tcp => tcp,
    };

    let node = var(get, "QUIVER_NODE");
    if let Some(name) = &node {
        if let Err(why) = check_node_name(name) {
            return Err(invalid("QUIVER_NODE", name, format!("a node name {why}")));
        }
    }
    let addr = match var(get, "QUIVER_ADDR") {
        Some(a) => Some(
            a.parse::<IpAddr>()
                .map_err(|_| invalid("QUIVER_ADDR", &a, "expected an IPv4 or IPv6 address"))?,
        ),
        None => None,
    };
    Ok(Settings {
        store: url_text.zip(url),
        env_job,
        node,
        addr,
    })
}

/// Joins the job described by the variables looked up with `get` (see the module
/// documentation), waiting at most `timeout` in all for the store and the other ranks.
///
/// # Errors
///
/// The errors of [`detect`]; [`Error::MissingEnv`] or [`Error::InvalidEnv`] for the
/// `QUIVER_*` variables of the module documentation; [`Error::Io`] if rank 0 cannot serve
/// the store at `HOST:PORT`; [`Error::Rendezvous`] if the store cannot be reached, holds
/// malformed entries, or some rank does not show up within `timeout` (the message says
/// which).
pub fn bootstrap(get: &dyn Fn(&str) -> Option<String>, timeout: Duration) -> Result<JobInfo> {
    let deadline = Deadline::after(timeout);
    let plan = launcher_kv::plan(get)?;
    let detected = detect(get);
    let Settings {
        store,
        env_job,
        node,
        addr,
    } = settings(get)?;

    let Joined {
        det,
        rv,
        key,
        server,
        service,
    } = match (plan, store) {
        (Plan::Store, Some((url_text, url))) => {
            join_store(detected?, &url_text, url, env_job, get, deadline)?
        }
        (Plan::Launcher(services), _) => {
            join_through_launcher(detected, &services, get, addr, deadline)?
        }
        (Plan::Nothing | Plan::Store, _) => {
            detected?;
            return Err(Error::MissingEnv {
                var: "QUIVER_RENDEZVOUS",
                hint: "the launcher offers no key-value service quiver can use (no PMIx, \
                       PMI_FD or PMI_PORT variables: under Slurm, use srun --mpi=pmix or \
                       --mpi=pmi2): set QUIVER_RENDEZVOUS=tcp://HOST:PORT (a store served by \
                       rank 0, on HOST, or by the launcher) or file:///SHARED/DIR (a directory \
                       every node sees) on every rank; `quiver run` sets it"
                    .into(),
            });
        }
    };
    let (rank, size) = (det.rank, det.size);
    let waiting = |what: String| {
        let url = rv.url().to_string();
        move |e: Error| match e {
            Error::Timeout(_) => Error::Rendezvous {
                url,
                reason: format!(
                    "timed out after {timeout:?} waiting for {what}; did all {size} ranks start, \
                     with the same QUIVER_RENDEZVOUS?"
                ),
            },
            e => e,
        }
    };

    // Job id and token.
    let (job_id, token) = match env_job {
        Some(job) => job,
        None => {
            let (id_text, token_text) = if rank == 0 {
                let id = loop {
                    let id = random_u64()? as u32;
                    if id != 0 {
                        break id;
                    }
                };
                let token = loop {
                    let token = random_u64()?;
                    if token != 0 {
                        break token;
                    }
                };
                (
                    rv.put_if_absent("job/id", &id.to_string())?,
                    rv.put_if_absent("job/token", &format!("{token:016x}"))?,
                )
            } else {
                (
                    rv.get("job/id", deadline.remaining())
                        .map_err(waiting("rank 0 to publish the job id".into()))?,
                    rv.get("job/token", deadline.remaining())
                        .map_err(waiting("rank 0 to publish the job token".into()))?,
                )
            };
            let bad = |what: &str, value: &str| Error::Rendezvous {
                url: rv.url().to_string(),
                reason: format!("the store holds a malformed {what} {}", show(value)),
            };
            let id = parse_u32("job/id", &id_text).map_err(|_| bad("job id", &id_text))?;
            let token =
                parse_token("job/token", &token_text).map_err(|_| bad("job token", &token_text))?;
            (id, token)
        }
    };

    // This rank's node and address (QUIVER_NODE was checked with the other settings).
    let name = match node {
        Some(n) => n,
        None => {
            let name = hostname().ok_or_else(|| {
                Error::Config("cannot determine the host name; set QUIVER_NODE".into())
            })?;
            if let Err(why) = check_node_name(&name) {
                return Err(invalid(
                    "QUIVER_NODE",
                    &name,
                    format!("QUIVER_NODE is unset and the host name {why}; set QUIVER_NODE to a name without whitespace, '|' or ','"),
                ));
            }
            name
        }
    };
    let addr = addr.unwrap_or_else(|| rv.local_ip().unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)));

    let Placed {
        node_names,
        nids,
        addrs,
    } = place_ranks(&rv, rank, size, (&name, addr), deadline, &waiting)?;

    // The key of authenticated frames: derived from the tcp store's key, which quiver's
    // connections never carry, or drawn by the first rank to get here and kept in the
    // file store.
    let frame_key = match &key {
        Some(k) => k.derive(
            "quiver frame key v1",
            &[&job_id.to_le_bytes()[..], &token.to_le_bytes()].concat(),
        ),
        None => {
            let kept = rv.put_if_absent("job/frame-key", &StoreKey::generate().to_hex())?;
            StoreKey::parse(&kept)
                .ok_or_else(|| Error::Rendezvous {
                    url: rv.url().to_string(),
                    reason: "the store's job/frame-key is not 64 hex digits".into(),
                })?
                .bytes()
        }
    };

    rv.barrier("bootstrap", rank, size, deadline.remaining())
        .map_err(waiting(
            "every rank to finish bootstrapping (barrier)".into(),
        ))?;

    Ok(JobInfo {
        rank,
        size,
        local_rank: det.local_rank,
        job_id,
        token,
        frame_key,
        launcher: det.launcher,
        bootstrap: service,
        node_names,
        nids,
        addrs,
        rendezvous: Arc::new(rv),
        server,
    })
}

/// Where every rank of a job runs, indexed by rank.
pub(super) struct Placed {
    pub node_names: Vec<String>,
    /// Dense node ids, by first appearance of the node's name.
    pub nids: Vec<u32>,
    pub addrs: Vec<IpAddr>,
}

/// Publishes this rank's node name and address in `rv` and returns every rank's, with
/// the node ids they make (ranks of one node name share an id).
pub(super) fn place_ranks<W, F>(
    rv: &Rendezvous,
    rank: u32,
    size: u32,
    (name, addr): (&str, IpAddr),
    deadline: Deadline,
    waiting: &W,
) -> Result<Placed>
where
    W: Fn(String) -> F,
    F: FnOnce(Error) -> Error,
{
    let nodes = exchange_nodes(rv, rank, size, &format!("{name}|{addr}"), deadline, waiting)?;
    let mut placed = Placed {
        node_names: Vec::with_capacity(nodes.len()),
        nids: Vec::with_capacity(nodes.len()),
        addrs: Vec::with_capacity(nodes.len()),
    };
    let mut nid_of: HashMap<String, u32> = HashMap::new();
    for (node, ip) in nodes {
        let next = nid_of.len() as u32;
        placed
            .nids
            .push(*nid_of.entry(node.clone()).or_insert(next));
        placed.node_names.push(node);
        placed.addrs.push(ip);
    }
    Ok(placed)
}

/// A rank that reached its job's store.
struct Joined {
    det: Detected,
    rv: Rendezvous,
    /// The store's key (a `tcp://` store's), from which the frame key derives.
    key: Option<StoreKey>,
    /// The store, when this rank serves it.
    server: Option<KvServerHandle>,
    /// How: the store's URL, or the launcher service that named it.
    service: String,
}

/// Joins the store `QUIVER_RENDEZVOUS` names: served by the launcher (`QUIVER_JOB_ID`
/// set), by rank 0 (a `tcp://` store otherwise), or a directory.
fn join_store(
    det: Detected,
    url_text: &str,
    url: RendezvousUrl,
    env_job: Option<(u32, u64)>,
    get: &dyn Fn(&str) -> Option<String>,
    deadline: Deadline,
) -> Result<Joined> {
    // A tcp:// store admits only the job's processes, which share its key.
    let key = match &url {
        RendezvousUrl::Tcp(_) => Some(StoreKey::from_lookup(get)?),
        RendezvousUrl::File(_) => None,
    };
    let mut server = None;
    if let (RendezvousUrl::Tcp(host_port), Some(key)) = (&url, &key) {
        if env_job.is_none() && det.rank == 0 {
            server = Some(serve(host_port, url_text, key.clone())?);
        }
    }
    let rv =
        Rendezvous::connect_url(url, key.as_ref(), deadline.remaining()).map_err(|e| match e {
            Error::Rendezvous { url, reason } if env_job.is_some() => Error::Rendezvous {
                url,
                reason: format!(
                "{reason} (QUIVER_JOB_ID is set, so the launcher is expected to serve the store; \
                 unset QUIVER_JOB_ID and QUIVER_JOB_TOKEN to have rank 0 serve it)"
            ),
            },
            e => e,
        })?;
    let service = format!("the store {} (QUIVER_RENDEZVOUS)", rv.url());
    Ok(Joined {
        det,
        rv,
        key,
        server,
        service,
    })
}

/// Joins through the launcher's key-value service ([`launcher_kv`]): rank 0 serves the
/// store (at `addr` if `QUIVER_ADDR` gives one), every rank learns where and its key.
/// Where the environment names no rank (Hydra's `-pmi-port`), the service says it.
fn join_through_launcher(
    detected: Result<Detected>,
    services: &[Service],
    get: &dyn Fn(&str) -> Option<String>,
    addr: Option<IpAddr>,
    deadline: Deadline,
) -> Result<Joined> {
    let known = match detected {
        Ok(d) => Some(d),
        // No launcher variables, but a service that may say (checked below).
        Err(Error::MissingEnv {
            var: "QUIVER_RANK", ..
        }) => None,
        Err(e) => return Err(e),
    };
    let job = var(get, "PMI_JOBID");
    let kv = Kv::connect(services, job.as_deref(), known.map(|d| d.rank), deadline)?;
    let service = kv.describe();
    let det = match (known, kv.rank_size()) {
        (Some(d), None) => d,
        (Some(d), Some((rank, size))) => {
            if rank != d.rank || size.is_some_and(|s| s != d.size) {
                return Err(Error::Launcher {
                    service,
                    reason: format!(
                        "it says this process is rank {rank}{}, but the environment says rank \
                         {} of {} ({}): are the variables of another job inherited?",
                        size.map_or(String::new(), |s| format!(" of {s}")),
                        d.rank,
                        d.size,
                        d.launcher
                    ),
                });
            }
            d
        }
        (None, Some((rank, Some(size)))) if size <= MAX_JOB_SIZE => Detected {
            rank,
            size,
            local_rank: None,
            launcher: Launcher::Hydra,
        },
        (None, _) => {
            return Err(detect(get).err().unwrap_or(Error::Config(
                "no launcher variables name this process's rank".into(),
            )))
        }
    };
    let met = launcher_kv::meet(kv, det.rank, addr, deadline)?;
    // Addresses other nodes reach come first; a try that fails leaves time for the next.
    let mut failures = Vec::new();
    for (i, url) in met.urls.iter().enumerate() {
        let last = i + 1 == met.urls.len();
        let left = deadline.remaining();
        let slice = if last {
            left
        } else {
            left.min(Duration::from_secs(2))
        };
        let parsed = parse_url(url)?;
        match Rendezvous::connect_url(parsed, Some(&met.key), slice) {
            Ok(rv) => {
                return Ok(Joined {
                    det,
                    rv,
                    key: Some(met.key),
                    server: met.server,
                    service: format!("{service}, then the store rank 0 serves at {url}"),
                })
            }
            Err(e) => failures.push(e.to_string()),
        }
    }
    Err(Error::Rendezvous {
        url: met.urls.join(","),
        reason: format!(
            "no address of rank 0's store answered ({}); set QUIVER_ADDR on rank 0 to an \
             address the other nodes reach",
            failures.join("; ")
        ),
    })
}

/// Rank 0 serves the store at `host_port` (an address of its own node).
fn serve(host_port: &str, url_text: &str, key: StoreKey) -> Result<KvServerHandle> {
    let context = format!(
        "rank 0 cannot serve the rendezvous store at {url_text} (QUIVER_RENDEZVOUS): HOST must \
         be an address of rank 0's node and PORT free"
    );
    let addrs = host_port
        .to_socket_addrs()
        .map_err(|e| Error::io(context.clone(), e))?;
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "HOST resolves to no address");
    for addr in addrs {
        match KvServer::bind(addr) {
            Ok(server) => return Ok(server.spawn(key)),
            Err(e) => last = e,
        }
    }
    Err(Error::io(context, last))
}

/// The subdirectory of a `file://` store for this run, from the launcher's job id.
fn launcher_namespace(get: &dyn Fn(&str) -> Option<String>) -> Result<String> {
    let step = || {
        var(get, "SLURM_STEP_ID")
            .map(|v| ("SLURM_STEP_ID", v))
            .or_else(|| var(get, "SLURM_STEPID").map(|v| ("SLURM_STEPID", v)))
    };
    // The variable that named the run (for errors), its value, and the directory name.
    let (var_name, value, raw) = if let Some(id) = var(get, "OMPI_MCA_ess_base_jobid") {
        let raw = format!("ompi-{id}");
        ("OMPI_MCA_ess_base_jobid", id, raw)
    } else if let Some(ns) = var(get, "PMIX_NAMESPACE") {
        let raw = format!("pmix-{ns}");
        ("PMIX_NAMESPACE", ns, raw)
    } else if let (Some(job), Some((step_var, step))) = (var(get, "SLURM_JOB_ID"), step()) {
        let raw = format!("slurm-{job}.{step}");
        // The longer of the two is the one to blame for a name too long.
        if step.len() > job.len() {
            (step_var, step, raw)
        } else {
            ("SLURM_JOB_ID", job, raw)
        }
    } else {
        return Err(Error::MissingEnv {
            var: "QUIVER_JOB_ID",
            hint: "a file:// rendezvous needs a job id unique to this run to name its \
                   subdirectory, and none of OMPI_MCA_ess_base_jobid, PMIX_NAMESPACE, \
                   SLURM_JOB_ID with SLURM_STEP_ID (or SLURM_STEPID) is set: set \
                   QUIVER_JOB_ID (a decimal number unique to this run) and QUIVER_JOB_TOKEN \
                   (16 hex digits) on every rank, or use a tcp:// rendezvous"
                .into(),
        });
    };
    // Keep the name to safe characters, escaping the rest, and short.
    let mut name = String::new();
    for b in raw.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
            name.push(b as char);
        } else {
            name.push_str(&format!("%{b:02X}"));
        }
    }
    if name.len() > 200 {
        return Err(invalid(
            var_name,
            &value,
            "the launcher's job id is too long to name a rendezvous directory (200 \
             characters, 3 per character other than letters, digits, '-', '_' and '.'); set \
             QUIVER_JOB_ID and QUIVER_JOB_TOKEN on every rank instead",
        ));
    }
    Ok(name)
}

/// Why `name` cannot be a node name, if it cannot.
fn check_node_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() || name.len() > 255 {
        Err("must be 1 to 255 characters long")
    } else if !name
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b'|' && b != b',')
    {
        Err("must be printable ASCII without whitespace, '|' or ','")
    } else {
        Ok(())
    }
}

/// Parses a node entry `name|addr`.
fn parse_node(entry: &str) -> Option<(String, IpAddr)> {
    let (name, addr) = entry.split_once('|')?;
    check_node_name(name).ok()?;
    Some((name.to_string(), addr.parse().ok()?))
}

/// Publishes this rank's node entry and returns every rank's, indexed by rank.
///
/// Every rank puts `node/{rank}`; rank 0 gathers them all, checks them, and publishes the
/// merged list as `nodes/0..n` (each at most [`MAX_ITEM_LEN`] bytes) and then
/// `nodes/count`, which the other ranks wait for.
fn exchange_nodes<W, F>(
    rv: &Rendezvous,
    rank: u32,
    size: u32,
    entry: &str,
    deadline: Deadline,
    waiting: &W,
) -> Result<Vec<(String, IpAddr)>>
where
    W: Fn(String) -> F,
    F: FnOnce(Error) -> Error,
{
    let malformed = |r: usize, e: &str| Error::Rendezvous {
        url: rv.url().to_string(),
        reason: format!("rank {r} published a malformed node entry {}", show(e)),
    };
    rv.put(&format!("node/{rank}"), entry)?;
    let entries = if rank == 0 {
        let mut all = Vec::with_capacity(size as usize);
        all.push(entry.to_string());
        for r in 1..size {
            let e = rv
                .get(&format!("node/{r}"), deadline.remaining())
                .map_err(waiting(format!("rank {r} to publish its node")))?;
            if parse_node(&e).is_none() {
                return Err(malformed(r as usize, &e));
            }
            all.push(e);
        }
        let mut chunks = Vec::new();
        let mut chunk = String::new();
        for e in &all {
            if !chunk.is_empty() && chunk.len() + 1 + e.len() > MAX_ITEM_LEN {
                chunks.push(std::mem::take(&mut chunk));
            }
            if !chunk.is_empty() {
                chunk.push(',');
            }
            chunk.push_str(e);
        }
        chunks.push(chunk);
        for (i, c) in chunks.iter().enumerate() {
            rv.put(&format!("nodes/{i}"), c)?;
        }
        rv.put("nodes/count", &chunks.len().to_string())?;
        all
    } else {
        let count_text = rv
            .get("nodes/count", deadline.remaining())
            .map_err(waiting("rank 0 to publish the list of nodes".into()))?;
        let count = match count_text.parse::<u32>() {
            Ok(n) if n >= 1 && n <= size => n,
            _ => {
                return Err(Error::Rendezvous {
                    url: rv.url().to_string(),
                    reason: format!(
                        "the store holds a malformed nodes/count {}",
                        show(&count_text)
                    ),
                })
            }
        };
        let mut all = Vec::with_capacity(size as usize);
        for i in 0..count {
            let c = rv
                .get(&format!("nodes/{i}"), deadline.remaining())
                .map_err(waiting("rank 0 to publish the list of nodes".into()))?;
            all.extend(c.split(',').map(str::to_string));
        }
        if all.len() != size as usize {
            return Err(Error::Rendezvous {
                url: rv.url().to_string(),
                reason: format!(
                    "the list of nodes in the store has {} entries for {size} ranks",
                    all.len()
                ),
            });
        }
        all
    };
    entries
        .iter()
        .enumerate()
        .map(|(r, e)| parse_node(e).ok_or_else(|| malformed(r, e)))
        .collect()
}

pub(crate) fn random_u64() -> Result<u64> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| {
        Error::io(
            "drawing a random job id and token",
            std::io::Error::other(e.to_string()),
        )
    })?;
    Ok(u64::from_le_bytes(bytes))
}

/// The host name, from gethostname(2) or /proc.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the duration of the call.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end]) {
            if !s.is_empty() {
                return Some(s.to_string());
            }
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{SocketAddr, TcpListener};
    use std::thread;

    type Env = HashMap<String, String>;

    /// The store key of the tests' jobs (every environment below has it).
    const TEST_KEY: &str = "0707070707070707070707070707070707070707070707070707070707070707";

    fn env(pairs: &[(&str, &str)]) -> Env {
        let mut e: Env = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        e.entry(super::super::rendezvous::KEY_VAR.to_string())
            .or_insert_with(|| TEST_KEY.to_string());
        e
    }

    fn detect_in(pairs: &[(&str, &str)]) -> Result<Detected> {
        let e = env(pairs);
        detect(&|k| e.get(k).cloned())
    }

    #[test]
    fn detects_each_launcher() {
        let d = detect_in(&[
            ("QUIVER_RANK", "2"),
            ("QUIVER_SIZE", "4"),
            ("QUIVER_LOCAL_RANK", "0"),
        ])
        .unwrap();
        assert_eq!(
            d,
            Detected {
                rank: 2,
                size: 4,
                local_rank: Some(0),
                launcher: Launcher::Quiver
            }
        );
        let d = detect_in(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ])
        .unwrap();
        assert_eq!(
            d,
            Detected {
                rank: 1,
                size: 2,
                local_rank: Some(1),
                launcher: Launcher::OpenMpi
            }
        );
        let d = detect_in(&[("PMI_RANK", "0"), ("PMI_SIZE", "3")]).unwrap();
        assert_eq!(
            d,
            Detected {
                rank: 0,
                size: 3,
                local_rank: None,
                launcher: Launcher::Hydra
            }
        );
        let d = detect_in(&[
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "3"),
            ("SLURM_NODEID", "1"),
        ])
        .unwrap();
        assert_eq!(
            d,
            Detected {
                rank: 7,
                size: 8,
                local_rank: Some(3),
                launcher: Launcher::Slurm
            }
        );
    }

    #[test]
    fn detection_priority() {
        // mpirun inside a Slurm allocation: Open MPI wins; quiver run wins over all.
        let d = detect_in(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "1"),
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((d.launcher, d.rank, d.size), (Launcher::OpenMpi, 3, 4));
        let d = detect_in(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "1"),
            ("QUIVER_RANK", "1"),
            ("QUIVER_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(d.launcher, Launcher::Quiver);
        let d = detect_in(&[("PMI_RANK", "1"), ("PMI_SIZE", "2"), ("SLURM_PROCID", "0")]).unwrap();
        assert_eq!(d.launcher, Launcher::Hydra);
        // srun --mpi=pmi2: PMI_RANK is Slurm's rank, and no MPI_LOCALRANKID.
        let pmi2 = [
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
        ];
        assert_eq!(detect_in(&pmi2).unwrap().launcher, Launcher::Slurm);
        let hydra = [&pmi2[..], &[("MPI_LOCALRANKID", "1")]].concat();
        assert_eq!(detect_in(&hydra).unwrap().launcher, Launcher::Hydra);
    }

    fn err_text(pairs: &[(&str, &str)]) -> String {
        detect_in(pairs).unwrap_err().to_string()
    }

    #[test]
    fn detection_errors_name_the_variable() {
        let e = err_text(&[("QUIVER_RANK", "0")]);
        assert!(e.contains("QUIVER_SIZE"), "{e}");
        let e = err_text(&[("OMPI_COMM_WORLD_SIZE", "4")]);
        assert!(e.contains("OMPI_COMM_WORLD_RANK"), "{e}");
        let e = err_text(&[("SLURM_PROCID", "0")]);
        assert!(e.contains("SLURM_NTASKS"), "{e}");
        let e = err_text(&[("PMI_RANK", "x"), ("PMI_SIZE", "2")]);
        assert!(e.contains("PMI_RANK") && e.contains("\"x\""), "{e}");
        let e = err_text(&[("PMI_RANK", "0"), ("PMI_SIZE", "-2")]);
        assert!(e.contains("PMI_SIZE"), "{e}");
        let e = err_text(&[("QUIVER_RANK", "+1"), ("QUIVER_SIZE", "2")]);
        assert!(e.contains("QUIVER_RANK"), "{e}");
        let e = err_text(&[("QUIVER_RANK", "4"), ("QUIVER_SIZE", "4")]);
        assert!(e.contains("QUIVER_RANK") && e.contains("below"), "{e}");
        let e = err_text(&[("QUIVER_RANK", "0"), ("QUIVER_SIZE", "0")]);
        assert!(e.contains("QUIVER_SIZE"), "{e}");
        let e = err_text(&[("QUIVER_RANK", "0"), ("QUIVER_SIZE", "99999999999")]);
        assert!(e.contains("QUIVER_SIZE"), "{e}");
        let e = err_text(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_LOCALID", "z"),
        ]);
        assert!(e.contains("SLURM_LOCALID"), "{e}");
        let e = err_text(&[]);
        assert!(e.contains("QUIVER_RANK") && e.contains("quiver run"), "{e}");
        assert!(matches!(
            detect_in(&[]),
            Err(Error::MissingEnv {
                var: "QUIVER_RANK",
                ..
            })
        ));
        // Blank counts as unset.
        let e = err_text(&[("QUIVER_RANK", " "), ("QUIVER_SIZE", "2")]);
        assert!(e.contains("QUIVER_RANK"), "{e}");
    }

    /// Issue 28: a job size near `u32::MAX` was accepted, and rank 0 then aborted
    /// allocating a table of that many ranks.
    #[test]
    fn a_job_size_near_u32_max_is_an_error_naming_the_variable() {
        let e = err_text(&[("QUIVER_RANK", "0"), ("QUIVER_SIZE", "4294967295")]);
        assert!(e.contains("QUIVER_SIZE"), "{e}");
        let dir = temp_dir("huge");
        let url = format!("file://{}", dir.display());
        let e = bootstrap_in(&[
            ("QUIVER_RANK", "0"),
            ("QUIVER_SIZE", "4294967295"),
            ("QUIVER_RENDEZVOUS", &url),
            ("QUIVER_JOB_ID", "7"),
            ("QUIVER_JOB_TOKEN", "0123456789abcdef"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("QUIVER_SIZE"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes_local_sizes_and_local_ranks_have_ranges() {
        let max = MAX_JOB_SIZE.to_string();
        let last = (MAX_JOB_SIZE - 1).to_string();
        let d = detect_in(&[("QUIVER_RANK", &last), ("QUIVER_SIZE", &max)]).unwrap();
        assert_eq!((d.rank, d.size), (MAX_JOB_SIZE - 1, MAX_JOB_SIZE));
        let over = (MAX_JOB_SIZE + 1).to_string();
        for size in [over.as_str(), "4294967296", "-1", "1e3", "0x10"] {
            let e = err_text(&[("QUIVER_RANK", "0"), ("QUIVER_SIZE", size)]);
            assert!(e.contains("QUIVER_SIZE"), "{size}: {e}");
        }
        // The local size, where a launcher gives one: 1 to the size, above the local rank.
        let d = detect_in(&[
            ("QUIVER_RANK", "3"),
            ("QUIVER_SIZE", "4"),
            ("QUIVER_LOCAL_RANK", "1"),
            ("QUIVER_LOCAL_SIZE", "2"),
        ])
        .unwrap();
        assert_eq!(d.local_rank, Some(1));
        let base = [("QUIVER_RANK", "0"), ("QUIVER_SIZE", "4")];
        for (pairs, var, other) in [
            (
                &[("QUIVER_LOCAL_SIZE", "5")][..],
                "QUIVER_LOCAL_SIZE",
                "QUIVER_SIZE",
            ),
            (
                &[("QUIVER_LOCAL_SIZE", "0")],
                "QUIVER_LOCAL_SIZE",
                "QUIVER_SIZE",
            ),
            (
                &[("QUIVER_LOCAL_RANK", "2"), ("QUIVER_LOCAL_SIZE", "2")],
                "QUIVER_LOCAL_RANK",
                "QUIVER_LOCAL_SIZE",
            ),
            (
                &[("QUIVER_LOCAL_RANK", "4")],
                "QUIVER_LOCAL_RANK",
                "QUIVER_SIZE",
            ),
        ] {
            let all: Vec<_> = base.iter().chain(pairs).copied().collect();
            let e = err_text(&all);
            assert!(e.contains(var) && e.contains(other), "{pairs:?}: {e}");
        }
        let e = err_text(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "4"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
        ]);
        assert!(e.contains("OMPI_COMM_WORLD_LOCAL_RANK"), "{e}");
        let e = err_text(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "2"),
            ("MPI_LOCALNRANKS", "3"),
        ]);
        assert!(e.contains("MPI_LOCALNRANKS"), "{e}");
    }

    /// The property of issue 28 for the job's variables: whatever string one of them
    /// holds (the others valid), reading them gives settings or an error that names it;
    /// nothing panics, and nothing is contacted before they are all checked.
    mod any_value {
        use super::*;
        use crate::test_support::{arb_env_value, env_cases};
        use proptest::prelude::*;

        /// A valid environment of each launcher, with a tcp store and our job id.
        fn bases() -> Vec<Env> {
            let store = [
                ("QUIVER_RENDEZVOUS", "tcp://127.0.0.1:7777"),
                ("QUIVER_JOB_ID", "7"),
                ("QUIVER_JOB_TOKEN", "0123456789abcdef"),
                ("QUIVER_NODE", "n0"),
                ("QUIVER_ADDR", "127.0.0.1"),
            ];
            SCHEMES
                .iter()
                .map(|s| {
                    let mut e = env(&store);
                    e.insert(s.rank.into(), "1".into());
                    e.insert(s.size.into(), "4".into());
                    e.insert(s.local_rank.into(), "1".into());
                    if let Some(l) = s.local_size {
                        e.insert(l.into(), "2".into());
                    }
                    e
                })
                .collect()
        }

        /// A `file://` store named by each launcher's job id instead of ours.
        fn namespace_bases() -> Vec<(Env, &'static str)> {
            let base = env(&[
                ("QUIVER_RANK", "0"),
                ("QUIVER_SIZE", "1"),
                ("QUIVER_RENDEZVOUS", "file:///tmp/quiver-store"),
            ]);
            let with = |pairs: &[(&str, &str)]| {
                let mut e = base.clone();
                e.extend(env(pairs));
                e
            };
            vec![
                (
                    with(&[("OMPI_MCA_ess_base_jobid", "1")]),
                    "OMPI_MCA_ess_base_jobid",
                ),
                (with(&[("PMIX_NAMESPACE", "ns")]), "PMIX_NAMESPACE"),
                (
                    with(&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0")]),
                    "SLURM_JOB_ID",
                ),
                (
                    with(&[("SLURM_JOB_ID", "1"), ("SLURM_STEP_ID", "0")]),
                    "SLURM_STEP_ID",
                ),
                (
                    with(&[("SLURM_JOB_ID", "1"), ("SLURM_STEPID", "0")]),
                    "SLURM_STEPID",
                ),
            ]
        }

        fn read(e: &Env) -> Result<()> {
            let get = |k: &str| e.get(k).cloned();
            detect(&get)?;
            settings(&get).map(drop)
        }

        #[test]
        fn the_bases_are_valid() {
            for e in bases() {
                read(&e).unwrap();
            }
            for (e, _) in namespace_bases() {
                read(&e).unwrap();
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(env_cases()))]

            #[test]
            fn one_variable_set(value in arb_env_value()) {
                for base in bases() {
                    for var in base.keys() {
                        let mut e = base.clone();
                        e.insert(var.clone(), value.clone());
                        if let Err(err) = read(&e) {
                            let err = err.to_string();
                            prop_assert!(err.contains(var.as_str()), "{var}={value:?}: {err}");
                        }
                    }
                }
                for (base, var) in namespace_bases() {
                    let mut e = base;
                    e.insert(var.into(), value.clone());
                    if let Err(err) = read(&e) {
                        let err = err.to_string();
                        prop_assert!(err.contains(var), "{var}={value:?}: {err}");
                    }
                }
            }
        }
    }

    fn bootstrap_in(pairs: &[(&str, &str)]) -> Result<JobInfo> {
        let e = env(pairs);
        bootstrap(&|k| e.get(k).cloned(), Duration::from_secs(2))
    }

    #[test]
    fn bootstrap_env_errors_name_the_variable() {
        let base = [("QUIVER_RANK", "0"), ("QUIVER_SIZE", "1")];
        let e = bootstrap_in(&base).unwrap_err().to_string();
        assert!(
            e.contains("QUIVER_RENDEZVOUS") && e.contains("tcp://"),
            "{e}"
        );
        let mut with = base.to_vec();
        with.push(("QUIVER_RENDEZVOUS", "http://x:1"));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(
            e.contains("QUIVER_RENDEZVOUS") && e.contains("expected tcp://"),
            "{e}"
        );
        let mut with = base.to_vec();
        with.push(("QUIVER_RENDEZVOUS", "tcp://127.0.0.1:1"));
        with.push(("QUIVER_JOB_ID", "5"));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(e.contains("QUIVER_JOB_TOKEN"), "{e}");
        with.push(("QUIVER_JOB_TOKEN", "123"));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(e.contains("QUIVER_JOB_TOKEN") && e.contains("16"), "{e}");
        let mut with = base.to_vec();
        with.push(("QUIVER_RENDEZVOUS", "tcp://127.0.0.1:1"));
        with.push(("QUIVER_JOB_TOKEN", "0123456789abcdef"));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(e.contains("QUIVER_JOB_ID"), "{e}");
        // file:// without any job id.
        let dir = temp_dir("nojob");
        let url = format!("file://{}", dir.display());
        let mut with = base.to_vec();
        with.push(("QUIVER_RENDEZVOUS", &url));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(e.contains("QUIVER_JOB_ID") && e.contains("file://"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_node_and_addr_are_invalid_env() {
        let srv = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .spawn(StoreKey::parse(TEST_KEY).unwrap());
        let url = format!("tcp://{}", srv.local_addr());
        let base = [
            ("QUIVER_RANK", "0"),
            ("QUIVER_SIZE", "1"),
            ("QUIVER_RENDEZVOUS", url.as_str()),
            ("QUIVER_JOB_ID", "9"),
            ("QUIVER_JOB_TOKEN", "00000000deadbeef"),
        ];
        let mut with = base.to_vec();
        with.push(("QUIVER_NODE", "a|b"));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(e.contains("QUIVER_NODE"), "{e}");
        let mut with = base.to_vec();
        with.push(("QUIVER_ADDR", "not-an-ip"));
        let e = bootstrap_in(&with).unwrap_err().to_string();
        assert!(e.contains("QUIVER_ADDR"), "{e}");
        let job = bootstrap_in(&base).unwrap();
        assert_eq!(
            (job.job_id, job.token, job.nids.clone()),
            (9, 0xdead_beef, vec![0])
        );
        let shown = format!("{job:?}").to_lowercase();
        assert!(
            !shown.contains("deadbeef") && !shown.contains("3735928559"),
            "{shown}"
        );
    }

    fn temp_dir(tag: &str) -> std::path::PathBuf {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        std::env::temp_dir().join(format!(
            "quiver-bs-test-{tag}-{}-{nanos}",
            std::process::id()
        ))
    }

    /// Runs one bootstrap per environment, each on its own thread.
    fn run_ranks(envs: Vec<Env>) -> Vec<JobInfo> {
        let threads: Vec<_> = envs
            .into_iter()
            .map(|e| {
                thread::spawn(move || bootstrap(&|k| e.get(k).cloned(), Duration::from_secs(20)))
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap().unwrap())
            .collect()
    }

    fn quiver_envs(url: &str, nodes: &[&str]) -> Vec<Env> {
        let size = nodes.len().to_string();
        nodes
            .iter()
            .enumerate()
            .map(|(r, node)| {
                let rank = r.to_string();
                let mut e = env(&[
                    ("QUIVER_RANK", &rank),
                    ("QUIVER_SIZE", &size),
                    ("QUIVER_LOCAL_RANK", &rank),
                    ("QUIVER_JOB_ID", "4242"),
                    ("QUIVER_JOB_TOKEN", "0123456789ABCDEF"),
                    ("QUIVER_RENDEZVOUS", url),
                ]);
                if !node.is_empty() {
                    e.insert("QUIVER_NODE".into(), node.to_string());
                }
                e
            })
            .collect()
    }

    fn check_agree(jobs: &[JobInfo]) {
        for (r, j) in jobs.iter().enumerate() {
            assert_eq!(j.rank as usize, r);
            assert_eq!(j.size as usize, jobs.len());
            assert_eq!(j.job_id, jobs[0].job_id);
            assert_eq!(j.token, jobs[0].token);
            assert_eq!(j.node_names, jobs[0].node_names);
            assert_eq!(j.nids, jobs[0].nids);
            assert_eq!(j.addrs, jobs[0].addrs);
            assert_eq!(j.node_names.len(), jobs.len());
        }
    }

    #[test]
    fn four_ranks_against_a_launcher_store() {
        let srv = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .spawn(StoreKey::parse(TEST_KEY).unwrap());
        let url = format!("tcp://{}", srv.local_addr());
        let jobs = run_ranks(quiver_envs(&url, &["", "", "", ""]));
        check_agree(&jobs);
        assert_eq!(jobs[0].job_id, 4242);
        assert_eq!(jobs[0].token, 0x0123_4567_89ab_cdef);
        assert_eq!(jobs[0].nids, vec![0, 0, 0, 0]);
        assert_eq!(jobs[0].node_names[0], hostname().unwrap());
        assert!(jobs
            .iter()
            .all(|j| j.server.is_none() && j.launcher == Launcher::Quiver));
        assert_eq!(jobs[0].addrs, vec![IpAddr::V4(Ipv4Addr::LOCALHOST); 4]);
        assert_eq!(jobs[2].local_rank, Some(2));
    }

    #[test]
    fn two_nodes_from_quiver_node() {
        let srv = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .spawn(StoreKey::parse(TEST_KEY).unwrap());
        let url = format!("tcp://{}", srv.local_addr());
        let jobs = run_ranks(quiver_envs(&url, &["n0", "n0", "n1", "n1"]));
        check_agree(&jobs);
        assert_eq!(jobs[0].nids, vec![0, 0, 1, 1]);
        assert_eq!(jobs[3].node_names, vec!["n0", "n0", "n1", "n1"]);
        // Numbering by first appearance, on a store of its own.
        let srv2 = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .spawn(StoreKey::parse(TEST_KEY).unwrap());
        let url2 = format!("tcp://{}", srv2.local_addr());
        let jobs = run_ranks(quiver_envs(&url2, &["b", "a", "b", "c"]));
        check_agree(&jobs);
        assert_eq!(jobs[1].nids, vec![0, 1, 0, 2]);
    }

    #[test]
    fn rank_zero_serves_the_store_and_draws_the_job_id() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("tcp://127.0.0.1:{port}");
        let envs = (0..4)
            .map(|r| {
                let rank = r.to_string();
                env(&[
                    ("OMPI_COMM_WORLD_RANK", &rank),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", &rank),
                    ("QUIVER_RENDEZVOUS", &url),
                ])
            })
            .collect();
        let jobs = run_ranks(envs);
        check_agree(&jobs);
        assert!(jobs[0].server.is_some());
        assert!(jobs[1..].iter().all(|j| j.server.is_none()));
        assert!(jobs.iter().all(|j| j.launcher == Launcher::OpenMpi));
        assert_ne!(jobs[0].job_id, 0);
        assert_ne!(jobs[0].token, 0);
        assert_eq!(jobs[0].nids, vec![0, 0, 0, 0]);
        // The store stays usable while rank 0 holds its handle.
        jobs[3].rendezvous.put("after", "1").unwrap();
        assert_eq!(
            jobs[1]
                .rendezvous
                .get("after", Duration::from_secs(5))
                .unwrap(),
            "1"
        );
    }

    #[test]
    fn file_store_with_quiver_job_id() {
        let dir = temp_dir("file");
        let url = format!("file://{}", dir.display());
        let jobs = run_ranks(quiver_envs(&url, &["x", "y", "x", "y"]));
        check_agree(&jobs);
        assert_eq!(jobs[0].nids, vec![0, 1, 0, 1]);
        assert_eq!(jobs[0].job_id, 4242);
        assert!(dir.join("quiver-4242").is_dir());
        assert!(jobs[0].rendezvous.local_ip().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn file_store_divided_by_the_slurm_job() {
        let dir = temp_dir("slurm");
        let url = format!("file://{}", dir.display());
        let envs = (0..3)
            .map(|r| {
                let rank = r.to_string();
                env(&[
                    ("SLURM_PROCID", &rank),
                    ("SLURM_NTASKS", "3"),
                    ("SLURM_JOB_ID", "777"),
                    ("SLURM_STEP_ID", "0"),
                    ("QUIVER_RENDEZVOUS", &url),
                ])
            })
            .collect();
        let jobs = run_ranks(envs);
        check_agree(&jobs);
        assert!(dir.join("slurm-777.0").is_dir());
        assert!(jobs.iter().all(|j| j.server.is_none()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn many_ranks_spill_the_node_list_over_chunks() {
        let srv = KvServer::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .unwrap()
            .spawn(StoreKey::parse(TEST_KEY).unwrap());
        let url = format!("tcp://{}", srv.local_addr());
        let long: Vec<String> = (0..24).map(|i| format!("{}{i}", "n".repeat(200))).collect();
        let names: Vec<&str> = long.iter().map(String::as_str).collect();
        let jobs = run_ranks(quiver_envs(&url, &names));
        check_agree(&jobs);
        assert_eq!(jobs[5].nids, (0..24).collect::<Vec<u32>>());
        let count = jobs[0].rendezvous.try_get("nodes/count").unwrap().unwrap();
        assert!(count.parse::<u32>().unwrap() > 1, "{count}");
    }
}
