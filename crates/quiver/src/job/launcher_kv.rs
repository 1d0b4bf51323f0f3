//! The launcher's key-value service: how the ranks of a job started by `mpirun`,
//! `mpiexec` or `srun` find each other without `QUIVER_RENDEZVOUS`, as MPI libraries do.
//!
//! Which service, in order of preference ([`plan`]):
//!
//! 1. `QUIVER_RENDEZVOUS` set: the store it names; no launcher service is used.
//! 2. PMIx (`PMIX_NAMESPACE` and `PMIX_RANK` set: Open MPI's `mpirun`, `srun
//!    --mpi=pmix`), if its client library loads ([`super::pmix`]).
//! 3. PMI-2, or PMI-1 if the server speaks only that, over `PMI_FD` (MPICH's Hydra
//!    `mpiexec`, `srun --mpi=pmi2`) or `PMI_PORT` (`mpiexec -pmi-port`)
//!    ([`super::pmi`]).
//!
//! `QUIVER_BOOTSTRAP` = `store`, `pmix`, `pmi2` or `pmi1` insists on one; `auto` (the
//! default) follows the order above.
//!
//! Over the service the ranks meet once ([`meet`]): rank 0 serves the job's rendezvous
//! store (on every address of its node, on a port the kernel picks, admitting only those
//! who hold a key drawn for this job), publishes the store's addresses and the key,
//! and after one fence every rank reads them. Everything later (the nodes, endpoint
//! addresses, barriers, failures) goes through that store, as under `quiver run`: a
//! launcher's service is collective (a fence waits for every rank) and dies with the
//! job's first failure, while endpoints open at any time and the survivors of a failure
//! keep using the store. The service is finalized as soon as the ranks have met.
//!
//! # Guarantees
//!
//! - [`plan`] is a pure function of the variables; every error names the variable.
//! - The key travels only through the launcher's service, which each process reaches
//!   through a descriptor the launcher passed or a PMIx server that checks its clients
//!   (between nodes, the launcher's own channels carry it); a PMI port other hosts
//!   reach (`PMI_PORT`) is used only when `QUIVER_BOOTSTRAP` asks for PMI by name.
//! - A service that cannot be used (PMIx library missing, server refusing) is skipped
//!   for the next one in `auto`; the error lists why each failed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use super::pmi::{Pmi, Version, Via};
use super::pmix::Pmix;
use super::rendezvous::{show, Deadline, KvServer, KvServerHandle, StoreKey};
use crate::error::{Error, Result};

/// The key under which rank 0 publishes its store's URLs.
const STORE_KEY: &str = "quiver-store";
/// The key under which rank 0 publishes the store's key.
const KEY_KEY: &str = "quiver-store-key";
/// At most this many addresses of rank 0's node are published.
const MAX_URLS: usize = 8;

/// A launcher service to try.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Service {
    /// PMIx, through the library `QUIVER_PMIX_LIB` names (or the usual ones).
    Pmix { library: Option<String> },
    /// PMI-1 or PMI-2 (`None`: PMI-2 first).
    Pmi { via: Via, version: Option<Version> },
}

impl std::fmt::Display for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Service::Pmix { .. } => f.write_str("PMIx"),
            Service::Pmi { via, version } => {
                let v = match version {
                    Some(Version::One) => "PMI-1",
                    Some(Version::Two) => "PMI-2",
                    None => "PMI-2 or PMI-1",
                };
                write!(f, "{v} over {via}")
            }
        }
    }
}

/// How a process joins its job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Through the store `QUIVER_RENDEZVOUS` names.
    Store,
    /// Through the first of these services that works.
    Launcher(Vec<Service>),
    /// No way found: neither `QUIVER_RENDEZVOUS` nor a launcher service.
    Nothing,
}

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

/// The PMI server the variables name, if any.
fn pmi_via(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Via>> {
    if let Some(fd) = var(get, "PMI_FD") {
        return match fd.parse::<i32>() {
            Ok(n) if n >= 0 && fd.bytes().all(|b| b.is_ascii_digit()) => Ok(Some(Via::Fd(n))),
            _ => Err(invalid("PMI_FD", &fd, "expected a descriptor number")),
        };
    }
    let Some(host_port) = var(get, "PMI_PORT") else {
        return Ok(None);
    };
    if !host_port.contains(':') {
        return Err(invalid("PMI_PORT", &host_port, "expected HOST:PORT"));
    }
    let id = var(get, "PMI_ID").ok_or_else(|| Error::MissingEnv {
        var: "PMI_ID",
        hint: "PMI_PORT is set, so the launcher should also say which process this is \
               (PMI_ID)"
            .into(),
    })?;
    let id = id
        .parse::<u32>()
        .map_err(|_| invalid("PMI_ID", &id, "expected a decimal number"))?;
    Ok(Some(Via::Port { host_port, id }))
}

/// The bootstrap the variables select (module documentation).
pub(crate) fn plan(get: &dyn Fn(&str) -> Option<String>) -> Result<Plan> {
    let choice = var(get, "QUIVER_BOOTSTRAP").unwrap_or_else(|| "auto".into());
    let store = var(get, "QUIVER_RENDEZVOUS").is_some();
    let pmix = var(get, "PMIX_NAMESPACE").is_some() && var(get, "PMIX_RANK").is_some();
    let library = var(get, "QUIVER_PMIX_LIB");
    let pmix_service = || Service::Pmix {
        library: library.clone(),
    };
    let missing_pmi = |v: Version| Error::MissingEnv {
        var: "PMI_FD",
        hint: format!(
            "QUIVER_BOOTSTRAP asks for {}, but neither PMI_FD nor PMI_PORT is set: is the \
             program started by mpiexec (Hydra) or srun --mpi=pmi2?",
            if v == Version::One { "PMI-1" } else { "PMI-2" }
        ),
    };
    match choice.to_ascii_lowercase().as_str() {
        "auto" => {
            if store {
                return Ok(Plan::Store);
            }
            let mut services = Vec::new();
            if pmix {
                services.push(pmix_service());
            }
            if let Some(via) = pmi_via(get)? {
                services.push(Service::Pmi { via, version: None });
            }
            Ok(if services.is_empty() {
                Plan::Nothing
            } else {
                Plan::Launcher(services)
            })
        }
        "store" => {
            if store {
                Ok(Plan::Store)
            } else {
                Err(Error::MissingEnv {
                    var: "QUIVER_RENDEZVOUS",
                    hint: "QUIVER_BOOTSTRAP=store asks for the store QUIVER_RENDEZVOUS names"
                        .into(),
                })
            }
        }
        "pmix" => {
            if pmix {
                Ok(Plan::Launcher(vec![pmix_service()]))
            } else {
                Err(Error::MissingEnv {
                    var: "PMIX_NAMESPACE",
                    hint: "QUIVER_BOOTSTRAP=pmix asks for PMIx, but PMIX_NAMESPACE and \
                           PMIX_RANK are not both set: is the program started by mpirun (Open \
                           MPI) or srun --mpi=pmix?"
                        .into(),
                })
            }
        }
        "pmi2" | "pmi1" => {
            let v = if choice.eq_ignore_ascii_case("pmi1") {
                Version::One
            } else {
                Version::Two
            };
            let via = pmi_via(get)?.ok_or_else(|| missing_pmi(v))?;
            Ok(Plan::Launcher(vec![Service::Pmi {
                via,
                version: Some(v),
            }]))
        }
        _ => Err(invalid(
            "QUIVER_BOOTSTRAP",
            &choice,
            "expected auto, store, pmix, pmi2 or pmi1",
        )),
    }
}

/// What [`plan`] selects here, in words, without connecting to anything (whether the
/// PMIx library loads is checked): for `quiver info`.
pub fn describe(get: &dyn Fn(&str) -> Option<String>) -> String {
    let launcher = match super::bootstrap::detect(get) {
        Ok(d) => format!("{}, rank {} of {}", d.launcher, d.rank, d.size),
        Err(_) => "no launcher".into(),
    };
    let how = match plan(get) {
        Err(e) => format!("cannot join: {e}"),
        Ok(Plan::Store) => format!(
            "the store {} (QUIVER_RENDEZVOUS)",
            var(get, "QUIVER_RENDEZVOUS").unwrap_or_default()
        ),
        Ok(Plan::Nothing) => "none: start the program with quiver run, mpirun (PMIx), mpiexec \
                              (PMI) or srun --mpi=pmix|pmi2, or set QUIVER_RENDEZVOUS"
            .into(),
        Ok(Plan::Launcher(services)) => services
            .iter()
            .map(|s| match s {
                Service::Pmix { library } => match super::pmix::loadable(library.as_deref()) {
                    Ok(lib) => format!("PMIx ({lib})"),
                    Err(e) => format!("PMIx, not usable: {e}"),
                },
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", else "),
    };
    format!("{how} [{launcher}]")
}

/// A connected launcher service.
pub(crate) enum Kv {
    Pmix(Box<Pmix>),
    Pmi(Pmi),
}

impl Kv {
    /// Connects to the first of `services` that works; the error says why each failed.
    /// `job` and `rank` are what the environment says (`PMI_JOBID`, the detected rank),
    /// for PMI-2's `fullinit`.
    pub(crate) fn connect(
        services: &[Service],
        job: Option<&str>,
        rank: Option<u32>,
        deadline: Deadline,
    ) -> Result<Kv> {
        let mut failures = Vec::new();
        for s in services {
            let r = match s {
                Service::Pmix { library } => {
                    Pmix::init(library.as_deref()).map(|p| Kv::Pmix(Box::new(p)))
                }
                Service::Pmi { via, version } => {
                    Pmi::connect(via.clone(), *version, job, rank, deadline).map(Kv::Pmi)
                }
            };
            match r {
                Ok(kv) => return Ok(kv),
                Err(e) if services.len() == 1 => return Err(e),
                Err(e) => {
                    tracing::debug!("launcher service {s} cannot be used: {e}");
                    failures.push(format!("{s}: {e}"));
                }
            }
        }
        Err(Error::Launcher {
            service: services
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            reason: format!(
                "none can be used ({}); or set QUIVER_RENDEZVOUS",
                failures.join("; ")
            ),
        })
    }

    /// What the service says this process is: its rank, and the size when it says.
    pub(crate) fn rank_size(&self) -> Option<(u32, Option<u32>)> {
        match self {
            Kv::Pmix(p) => Some((p.rank(), None)),
            Kv::Pmi(p) => p.rank_size().map(|(r, s)| (r, Some(s))),
        }
    }

    /// The service, for `quiver info` and errors.
    pub(crate) fn describe(&self) -> String {
        match self {
            Kv::Pmix(p) => format!("PMIx (namespace {}, {})", p.namespace(), p.library()),
            Kv::Pmi(p) => {
                let v = match p.version() {
                    Version::One => "PMI-1",
                    Version::Two => "PMI-2",
                };
                format!("{v} over {}", p.via())
            }
        }
    }

    fn put(&mut self, key: &str, value: &str) -> Result<()> {
        match self {
            Kv::Pmix(p) => p.put(key, value),
            Kv::Pmi(p) => p.put(key, value),
        }
    }

    /// A fence, waiting at most until `deadline` (PMI's own reads are bounded by the
    /// deadline it was connected with).
    fn fence(&mut self, deadline: Deadline) -> Result<()> {
        match self {
            Kv::Pmix(p) => p.fence(deadline.remaining()),
            Kv::Pmi(p) => p.fence(),
        }
    }

    fn get(&mut self, rank: u32, key: &str, deadline: Deadline) -> Result<Option<String>> {
        match self {
            Kv::Pmix(p) => p.get(rank, key, deadline.remaining()),
            Kv::Pmi(p) => p.get(rank, key),
        }
    }

    fn finalize(self) -> Result<()> {
        match self {
            Kv::Pmix(p) => (*p).finalize(),
            Kv::Pmi(p) => p.finalize(),
        }
    }
}

/// What the ranks learn when they meet through the service.
pub(crate) struct Met {
    /// The store's URLs, in the order to try them (`tcp://ADDR:PORT`).
    pub urls: Vec<String>,
    /// The store's key.
    pub key: StoreKey,
    /// The store, on rank 0.
    pub server: Option<KvServerHandle>,
}

/// What rank 0 publishes instead of the store's addresses when it cannot serve it, so
/// that the others stop at once with the reason (instead of waiting out their timeout).
const FAILED: &str = "failed:";

/// The ranks meet through `kv` (module documentation), which is then finalized. Rank 0
/// serves the store at `addr` if given, else on every address of its node.
pub(crate) fn meet(mut kv: Kv, rank: u32, addr: Option<IpAddr>, deadline: Deadline) -> Result<Met> {
    let service = kv.describe();
    let mut server = None;
    let mut mine = None;
    if rank == 0 {
        let key = StoreKey::generate();
        let published = serve(addr, key.clone()).and_then(|(handle, urls)| {
            kv.put(STORE_KEY, &urls.join(","))?;
            kv.put(KEY_KEY, &key.to_hex())?;
            Ok((handle, urls))
        });
        match published {
            Ok((handle, urls)) => {
                server = Some(handle);
                mine = Some((urls, key));
            }
            Err(e) => {
                // The others learn of it through the same fence they wait in.
                let why = match &e {
                    Error::Io { source, .. } => format!("{FAILED}{:?}", source.kind()),
                    _ => format!("{FAILED}publishing"),
                };
                let _ = kv.put(STORE_KEY, &why.replace(' ', "_"));
                let _ = kv.fence(deadline);
                finalize(kv);
                return Err(e);
            }
        }
    }
    kv.fence(deadline)?;
    let (urls, key) = match mine {
        Some(m) => m,
        None => {
            let bad = |what: &str, value: &str| Error::Launcher {
                service: service.clone(),
                reason: format!("rank 0 published a malformed {what} {}", show(value)),
            };
            let absent = |what: &str| Error::Launcher {
                service: service.clone(),
                reason: format!(
                    "rank 0 published no {what} before the fence (is rank 0 a quiver program \
                     of the same version?)"
                ),
            };
            let urls_text = kv
                .get(0, STORE_KEY, deadline)?
                .ok_or_else(|| absent("store address"))?;
            if let Some(why) = urls_text.strip_prefix(FAILED) {
                return Err(Error::Launcher {
                    service,
                    reason: format!(
                        "rank 0 could not serve the job's rendezvous store ({why}; its own \
                         error says more)"
                    ),
                });
            }
            let key_text = kv
                .get(0, KEY_KEY, deadline)?
                .ok_or_else(|| absent("store key"))?;
            let key = StoreKey::parse(&key_text).ok_or_else(|| bad("store key", "(hidden)"))?;
            let urls: Vec<String> = urls_text.split(',').map(str::to_string).collect();
            let well_formed = |u: &String| {
                u.strip_prefix("tcp://")
                    .is_some_and(|hp| hp.parse::<SocketAddr>().is_ok())
            };
            if urls.is_empty() || urls.len() > MAX_URLS + 1 || !urls.iter().all(well_formed) {
                return Err(bad("store address", &urls_text));
            }
            (urls, key)
        }
    };
    finalize(kv);
    Ok(Met { urls, key, server })
}

/// Ends the use of the service; the ranks have met, so a failure here only matters to
/// the launcher (logged, not returned: rank 0's store must not go away over it).
fn finalize(kv: Kv) {
    let service = kv.describe();
    if let Err(e) = kv.finalize() {
        tracing::warn!("finalizing {service}: {e}");
    }
}

/// Serves a store at `addr`, or on every address of this node; returns it and the URLs
/// to publish (addresses other ranks can reach first, loopback last).
fn serve(addr: Option<IpAddr>, key: StoreKey) -> Result<(KvServerHandle, Vec<String>)> {
    let bind_at = addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let server = KvServer::bind(SocketAddr::new(bind_at, 0)).map_err(|e| {
        Error::io(
            format!("rank 0 cannot serve the job's rendezvous store at {bind_at}"),
            e,
        )
    })?;
    let port = server.local_addr().port();
    let ips = match addr {
        Some(ip) => vec![ip],
        None => node_addresses(),
    };
    let urls = ips
        .into_iter()
        .map(|ip| SocketAddr::new(ip, port))
        .map(|a| format!("tcp://{a}"))
        .collect();
    Ok((server.spawn(key), urls))
}

/// The IPv4 addresses of this node's interfaces that are up, in the order other nodes
/// most likely reach them: those of the interfaces that carry a default route first
/// (where the node's traffic to elsewhere goes), then the others but link-local ones,
/// at most [`MAX_URLS`] of them, and 127.0.0.1 last (for a job on one node).
fn node_addresses() -> Vec<IpAddr> {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let by_default = default_route_interfaces(&routes);
    let mut ips: Vec<(bool, IpAddr)> = crate::link::eth::ip_addresses()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.up && !a.ip.is_loopback())
        .filter(|a| matches!(a.ip, IpAddr::V4(v4) if !v4.is_link_local()))
        .map(|a| (!by_default.contains(&a.interface), a.ip))
        .collect();
    // Stable: the kernel's order within each group.
    ips.sort_by_key(|&(elsewhere, _)| elsewhere);
    let mut ips: Vec<IpAddr> = ips.into_iter().map(|(_, ip)| ip).collect();
    ips.dedup();
    ips.truncate(MAX_URLS);
    ips.push(IpAddr::V4(Ipv4Addr::LOCALHOST));
    ips
}

/// The interfaces of the IPv4 default routes in `/proc/net/route`'s text.
fn default_route_interfaces(routes: &str) -> Vec<String> {
    routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (iface, dest) = (f.next()?, f.next()?);
            (dest == "00000000").then(|| iface.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn plan_in(pairs: &[(&str, &str)]) -> Result<Plan> {
        let e: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        plan(&|k| e.get(k).cloned())
    }

    #[test]
    fn the_store_overrides_and_services_come_in_order() {
        let pmix = [("PMIX_NAMESPACE", "ns"), ("PMIX_RANK", "0")];
        assert_eq!(plan_in(&[]).unwrap(), Plan::Nothing);
        assert_eq!(
            plan_in(&[("QUIVER_RENDEZVOUS", "tcp://h:1"), pmix[0], pmix[1]]).unwrap(),
            Plan::Store
        );
        assert_eq!(
            plan_in(&[pmix[0], pmix[1], ("PMI_FD", "6")]).unwrap(),
            Plan::Launcher(vec![
                Service::Pmix { library: None },
                Service::Pmi {
                    via: Via::Fd(6),
                    version: None
                }
            ])
        );
        assert_eq!(
            plan_in(&[("PMI_PORT", "vm:38709"), ("PMI_ID", "1")]).unwrap(),
            Plan::Launcher(vec![Service::Pmi {
                via: Via::Port {
                    host_port: "vm:38709".into(),
                    id: 1
                },
                version: None
            }])
        );
        assert_eq!(
            plan_in(&[("PMI_FD", "6"), ("QUIVER_BOOTSTRAP", "pmi1")]).unwrap(),
            Plan::Launcher(vec![Service::Pmi {
                via: Via::Fd(6),
                version: Some(Version::One)
            }])
        );
    }

    #[test]
    fn bad_or_missing_variables_are_named() {
        let var_of = |r: Result<Plan>| match r {
            Err(Error::InvalidEnv { var, .. }) => var,
            Err(Error::MissingEnv { var, .. }) => var.to_string(),
            other => panic!("{other:?}"),
        };
        assert_eq!(var_of(plan_in(&[("PMI_FD", "-1")])), "PMI_FD");
        assert_eq!(var_of(plan_in(&[("PMI_FD", "six")])), "PMI_FD");
        assert_eq!(
            var_of(plan_in(&[("PMI_PORT", "nocolon"), ("PMI_ID", "0")])),
            "PMI_PORT"
        );
        assert_eq!(var_of(plan_in(&[("PMI_PORT", "h:1")])), "PMI_ID");
        assert_eq!(
            var_of(plan_in(&[("QUIVER_BOOTSTRAP", "smoke")])),
            "QUIVER_BOOTSTRAP"
        );
        assert_eq!(
            var_of(plan_in(&[("QUIVER_BOOTSTRAP", "pmix")])),
            "PMIX_NAMESPACE"
        );
        assert_eq!(var_of(plan_in(&[("QUIVER_BOOTSTRAP", "pmi2")])), "PMI_FD");
        assert_eq!(
            var_of(plan_in(&[("QUIVER_BOOTSTRAP", "store")])),
            "QUIVER_RENDEZVOUS"
        );
    }

    #[test]
    fn default_routes_are_read_from_the_kernels_table() {
        let table = "Iface\tDestination\tGateway \tFlags\n\
                     eth1\t0000A8C0\t00000000\t0001\n\
                     eth0\t00000000\t0102A8C0\t0003\n";
        assert_eq!(default_route_interfaces(table), ["eth0"]);
        assert!(default_route_interfaces("").is_empty());
    }

    #[test]
    fn rank_0_publishes_reachable_addresses_before_loopback() {
        let ips = node_addresses();
        assert_eq!(ips.last(), Some(&IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(ips[..ips.len() - 1].iter().all(|ip| !ip.is_loopback()));
    }
}
