//! Joint jobs: how a job names and admits another, so that the ports (or endpoints, or
//! tagged messages) of one reach the other's (GAMMA's jobs sharing nodes).
//!
//! Two jobs that are to talk form a **joint job**: one job made of both jobs' ranks, the
//! inviting (*host*) job's first with their own numbers, then the *guest* job's, shifted by
//! the host's size, with an id, a token, a frame key and a rendezvous store of its own.
//! Whatever works in a job works in a joint job, over the same links (shared memory
//! between ranks of one node, the network between nodes), and neither job's own traffic
//! reaches the other's endpoints: frames carry their job's id and token, and a frame of
//! another job is dropped and counted as foreign before anything else looks at it.
//!
//! - **Naming.** A job is named by its id ([`crate::Job::job_id`]); a process of either
//!   job names another job's rank through the joint job ([`JointJob::rank_of`]), and
//!   learns whom a joint rank is ([`JointJob::member`]).
//! - **Admission.** Every rank of the host calls [`crate::Job::invite`]: its rank 0 draws
//!   the joint job's id and a salt and serves the joint store, whose key every rank
//!   derives from the job's own frame key and the salt (the key never travels through
//!   the job's store, whose lines are signed but not sealed); every rank gets the same
//!   [`Invitation`] (the id, the store's address and key). The host hands it out of
//!   band: its text form (`Display`, [`std::str::FromStr`]) goes in a file or a
//!   variable. Holding it is the capability: the joint store answers only clients that
//!   prove its key; the first job to join with it is the guest, and no other job can
//!   join after. Both jobs then call [`crate::Job::join`] on every rank; a host whose
//!   join failed (no guest came in time) keeps its invitation and may join again.
//! - **Settings.** Both jobs must run with the same transport, reliability mode, frame
//!   authentication, largest message and push credit (a joint job's frames and messages
//!   are checked as one job's are): `join` compares them and refuses a mismatch on both
//!   sides with an error that names both. A joint job across nodes needs every rank at
//!   an address the other nodes reach (not loopback).
//! - **Lifetime.** The host's rank 0 serves the joint store while its [`JointJob`] lives:
//!   end with a barrier on the joint job before dropping it.

use super::bootstrap::{place_ranks, random_u64, JobInfo};
use super::rendezvous::{Deadline, KvServer, KvServerHandle, Rendezvous, StoreKey};
use super::Job;
use crate::config::Config;
use crate::error::{Error, Result};
use std::fmt;
use std::net::SocketAddr;
use std::ops::Deref;
use std::str::FromStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The first field of an invitation's text form.
const PREFIX: &str = "quiver-invitation-v1";

/// What a job hands out to admit another into a joint job (module documentation): the
/// joint job's id, the address and key of its store, and the inviting job. Its text form
/// (`to_string`, `parse`) carries the key: give it only to the job to be admitted.
#[derive(Clone, PartialEq, Eq)]
pub struct Invitation {
    host_job: u32,
    host_size: u32,
    joint_id: u32,
    url: String,
    key: StoreKey,
}

impl Invitation {
    /// The inviting job's id.
    pub fn host_job(&self) -> u32 {
        self.host_job
    }

    /// The joint job's id.
    pub fn joint_id(&self) -> u32 {
        self.joint_id
    }
}

impl fmt::Debug for Invitation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Invitation")
            .field("host_job", &self.host_job)
            .field("host_size", &self.host_size)
            .field("joint_id", &self.joint_id)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl fmt::Display for Invitation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX}:{}:{}:{}:{}:{}",
            self.host_job,
            self.host_size,
            self.joint_id,
            self.key.to_hex(),
            self.url
        )
    }
}

impl FromStr for Invitation {
    type Err = Error;

    /// Parses an invitation's text form.
    fn from_str(s: &str) -> Result<Invitation> {
        let bad = |why: &str| Error::Config(format!("not a quiver invitation: {why}"));
        let mut f = s.trim().splitn(6, ':');
        if f.next() != Some(PREFIX) {
            return Err(bad(&format!("it does not start with {PREFIX}")));
        }
        let mut number = |what: &str| {
            f.next()
                .and_then(|v| v.parse::<u32>().ok())
                .ok_or_else(|| bad(&format!("no {what}")))
        };
        let (host_job, host_size, joint_id) = (
            number("inviting job id")?,
            number("job size")?,
            number("joint job id")?,
        );
        let key = f
            .next()
            .and_then(StoreKey::parse)
            .ok_or_else(|| bad("no key of 64 hex digits"))?;
        let url = f.next().ok_or_else(|| bad("no store address"))?;
        if !url.starts_with("tcp://") || host_size == 0 || joint_id == 0 {
            return Err(bad("its store address, job size or joint id is invalid"));
        }
        Ok(Invitation {
            host_job,
            host_size,
            joint_id,
            url: url.to_string(),
            key,
        })
    }
}

/// One of the two jobs of a joint job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Member {
    job_id: u32,
    size: u32,
}

/// A joint job: a job made of the ranks of two jobs that admitted each other (module
/// documentation). It dereferences to its [`Job`]: open endpoints or ports on it as on
/// any job, with joint ranks ([`JointJob::rank_of`]).
#[derive(Clone)]
pub struct JointJob {
    job: Job,
    host: Member,
    guest: Member,
}

impl fmt::Debug for JointJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JointJob")
            .field("id", &self.job.job_id())
            .field("rank", &self.job.rank())
            .field("host", &self.host)
            .field("guest", &self.guest)
            .finish()
    }
}

impl Deref for JointJob {
    type Target = Job;

    fn deref(&self) -> &Job {
        &self.job
    }
}

impl JointJob {
    /// The joint job itself.
    pub fn job(&self) -> &Job {
        &self.job
    }

    /// The inviting job's id.
    pub fn host_job(&self) -> u32 {
        self.host.job_id
    }

    /// The admitted job's id.
    pub fn guest_job(&self) -> u32 {
        self.guest.job_id
    }

    /// The joint rank of rank `rank` of job `job_id` (either of the two).
    pub fn rank_of(&self, job_id: u32, rank: u32) -> Result<u32> {
        let (base, m) = if job_id == self.host.job_id {
            (0, self.host)
        } else if job_id == self.guest.job_id {
            (self.host.size, self.guest)
        } else {
            return Err(Error::Config(format!(
                "job {job_id} is not part of joint job {} (jobs {} and {})",
                self.job.job_id(),
                self.host.job_id,
                self.guest.job_id
            )));
        };
        if rank >= m.size {
            return Err(Error::NoSuchRank { rank, size: m.size });
        }
        Ok(base + rank)
    }

    /// Who joint rank `rank` is: its job's id and its rank there.
    pub fn member(&self, rank: u32) -> Option<(u32, u32)> {
        if rank < self.host.size {
            Some((self.host.job_id, rank))
        } else if rank - self.host.size < self.guest.size {
            Some((self.guest.job_id, rank - self.host.size))
        } else {
            None
        }
    }
}

/// The largest job a joint job admits as its guest (a bound on what a store's value can
/// make a rank allocate).
const MAX_GUEST_SIZE: u32 = 1 << 24;

/// What two jobs must agree on to share a joint job: how frames travel and are checked,
/// and the limits a receiver holds a sender to (`QUIVER_PUSH_CREDIT` must be equal on
/// every rank; a message longer than a receiver's `QUIVER_MAX_MESSAGE` fails).
fn settings_of(c: &Config) -> String {
    format!(
        "transport={:?},reliability={:?},auth={},max_message={},push_credit={}",
        c.transport, c.reliability, c.auth, c.max_message, c.push_credit
    )
    .to_lowercase()
}

/// [`Job::invite`]: rank 0 draws the joint id and a salt and serves the joint store; every
/// rank derives the store's key from the job's frame key (which never travels: the key
/// of the invitation is not written in the job's store, whose lines are signed, not
/// sealed), and notes that it issued the invitation.
pub(super) fn invite(job: &Job) -> Result<Invitation> {
    let sh = &job.shared;
    let n = sh.invitations.fetch_add(1, Ordering::Relaxed);
    let name = format!("joint/invitation{n}");
    let derive_key = |joint_id: u32, salt: u64| {
        let material = [joint_id.to_le_bytes().as_slice(), &salt.to_le_bytes()].concat();
        StoreKey::from_bytes(
            StoreKey::from_bytes(sh.frame_key).derive("quiver joint store key v1", &material),
        )
    };
    let (inv, server) = if sh.rank == 0 {
        let joint_id = loop {
            let id = random_u64()? as u32;
            if id != 0 && id != sh.job_id {
                break id;
            }
        };
        let salt = random_u64()?;
        let key = derive_key(joint_id, salt);
        let server = KvServer::bind(SocketAddr::new(sh.addrs[0], 0))
            .map_err(|e| Error::io("serving a joint job's store", e))?;
        let url = format!("tcp://{}", server.local_addr());
        let handle = server.spawn(key.clone());
        let rv = Rendezvous::connect(&url, &key, sh.config.connect_timeout)?;
        rv.put("settings", &settings_of(&sh.config))?;
        rv.put("host", &format!("{}:{}", sh.job_id, sh.size))?;
        sh.kv.put(&name, &format!("{joint_id}:{salt:016x}:{url}"))?;
        let inv = Invitation {
            host_job: sh.job_id,
            host_size: sh.size,
            joint_id,
            url,
            key,
        };
        (inv, Some(handle))
    } else {
        let text = sh
            .kv
            .get(&name, super::BARRIER_TIMEOUT)
            .map_err(|e| match e {
                Error::Timeout(t) => Error::Rendezvous {
                    url: sh.kv.url().to_string(),
                    reason: format!("rank 0 published no invitation within {t:?}"),
                },
                e => e,
            })?;
        let bad = || Error::Rendezvous {
            url: sh.kv.url().to_string(),
            reason: format!("the store holds a malformed invitation {text:?}"),
        };
        let mut f = text.splitn(3, ':');
        let joint_id: u32 = f.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
        let salt = f
            .next()
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .ok_or_else(bad)?;
        let url = f.next().ok_or_else(bad)?.to_string();
        let inv = Invitation {
            host_job: sh.job_id,
            host_size: sh.size,
            joint_id,
            url,
            key: derive_key(joint_id, salt),
        };
        (inv, None)
    };
    issued(job)?.push((inv.joint_id, server));
    Ok(inv)
}

/// The invitations a rank issued and has not joined yet, by joint job id, with the joint
/// store rank 0 serves.
pub(super) type Issued = Vec<(u32, Option<KvServerHandle>)>;

/// This rank's [`Issued`].
fn issued(job: &Job) -> Result<std::sync::MutexGuard<'_, Issued>> {
    job.shared
        .invited
        .lock()
        .map_err(|_| Error::Config("joint job registry poisoned by a panic".into()))
}

/// [`Job::join`]: the joint job's bootstrap, over its own store. The host's ranks keep
/// their invitation (and rank 0 its store) when the join fails, so that it can be tried
/// again.
pub(super) fn join(job: &Job, inv: &Invitation) -> Result<JointJob> {
    let sh = &job.shared;
    // The host's ranks issued it (and rank 0 serves its store); anyone else is a guest.
    let issued_here = {
        let mut issued = issued(job)?;
        let i = issued.iter().position(|(id, _)| *id == inv.joint_id);
        i.map(|i| issued.swap_remove(i))
    };
    let host = issued_here.is_some();
    if !host && inv.host_job == sh.job_id {
        return Err(Error::Config(format!(
            "job {} cannot join an invitation of its own as a guest (nor one of a job with \
             the same id); a host joins with the invitation Job::invite returned",
            sh.job_id
        )));
    }
    match bootstrap(job, inv, host) {
        Ok((info, guest)) => {
            let server = issued_here.and_then(|(_, server)| server);
            let info = JobInfo { server, ..info };
            Ok(JointJob {
                job: Job::from_info(info, sh.config.clone())?,
                host: Member {
                    job_id: inv.host_job,
                    size: inv.host_size,
                },
                guest,
            })
        }
        Err(e) => {
            if let Some(entry) = issued_here {
                issued(job)?.push(entry);
            }
            Err(e)
        }
    }
}

/// The joint job's bootstrap on one rank: the settings compared, the guest admitted (or
/// found), the ranks placed; the joint job's [`JobInfo`] (without the store's server)
/// and its guest.
fn bootstrap(job: &Job, inv: &Invitation, host: bool) -> Result<(JobInfo, Member)> {
    let sh = &job.shared;
    let timeout = sh.config.connect_timeout;
    let rv = Rendezvous::connect(&inv.url, &inv.key, timeout)?;
    let url = rv.url().to_string();
    let waiting = |what: String| {
        let url = url.clone();
        move |e: Error| match e {
            Error::Timeout(_) => Error::Rendezvous {
                url,
                reason: format!("timed out after {timeout:?} waiting for {what} of the joint job"),
            },
            e => e,
        }
    };
    let malformed = |what: &str, value: &str| Error::Rendezvous {
        url: url.clone(),
        reason: format!("the joint store holds a malformed {what} {value:?}"),
    };
    let member = |what: &str, text: &str| {
        text.split_once(':')
            .and_then(|(j, s)| Some((j.parse().ok()?, s.parse().ok()?)))
            .filter(|&(_, s): &(u32, u32)| s > 0)
            .map(|(job_id, size)| Member { job_id, size })
            .ok_or_else(|| malformed(what, text))
    };
    let mine = settings_of(&sh.config);
    let deadline = Deadline::after(timeout);
    let theirs = rv
        .get("settings", deadline.remaining())
        .map_err(waiting("the inviting job's settings".into()))?;
    if host && mine != theirs {
        return Err(Error::Config(format!(
            "this rank runs with {mine} and its rank 0 with {theirs}"
        )));
    }
    let guest = if host {
        // The guest may start long after the host: the wait for it has a time limit
        // of its own, and the bootstrap's starts once it came.
        let text = rv
            .get("guest", timeout)
            .map_err(waiting("a job to accept the invitation".into()))?;
        if let Some(refusal) = text.strip_prefix('!') {
            let (job_id, settings) = refusal.split_once('/').unwrap_or((refusal, "?"));
            return Err(Error::Config(format!(
                "job {job_id} could not join: it runs with {settings} and this job ({}) with \
                 {mine}; the jobs of a joint job need the same settings",
                sh.job_id
            )));
        }
        member("guest", &text)?
    } else {
        let stated = member(
            "host",
            &rv.get("host", deadline.remaining())
                .map_err(waiting("the inviting job's size".into()))?,
        )?;
        if stated.job_id != inv.host_job || stated.size != inv.host_size {
            return Err(Error::Config(format!(
                "the invitation names job {} of {} ranks, but its store says job {} of {}",
                inv.host_job, inv.host_size, stated.job_id, stated.size
            )));
        }
        if inv.joint_id == sh.job_id {
            return Err(Error::Config(format!(
                "the joint job's id {} is this job's own: ask the inviting job for another \
                 invitation",
                inv.joint_id
            )));
        }
        if sh.size > MAX_GUEST_SIZE {
            return Err(Error::Config(format!(
                "a joint job admits a guest of at most {MAX_GUEST_SIZE} ranks"
            )));
        }
        let me = if mine == theirs {
            format!("{}:{}", sh.job_id, sh.size)
        } else {
            // Tell the host why, so that it fails with the reason rather than a timeout.
            format!("!{}/{mine}", sh.job_id)
        };
        let taken = rv.put_if_absent("guest", &me)?;
        if taken != me {
            return Err(Error::Config(format!(
                "the invitation to joint job {} was already taken by job {}",
                inv.joint_id,
                taken
                    .trim_start_matches('!')
                    .split([':', '/'])
                    .next()
                    .unwrap_or("?")
            )));
        }
        if mine != theirs {
            return Err(Error::Config(format!(
                "job {} runs with {mine} and the inviting job {} with {theirs}: the jobs of a \
                 joint job need the same settings",
                sh.job_id, inv.host_job
            )));
        }
        member("guest", &taken)?
    };
    if guest.size > MAX_GUEST_SIZE || guest.job_id == inv.host_job {
        return Err(malformed(
            "guest",
            &format!("{}:{}", guest.job_id, guest.size),
        ));
    }
    let size = inv
        .host_size
        .checked_add(guest.size)
        .filter(|&s| s < u32::MAX)
        .ok_or_else(|| Error::Config("the two jobs have too many ranks together".into()))?;
    let rank = if host {
        sh.rank
    } else {
        inv.host_size + sh.rank
    };
    let deadline = Deadline::after(timeout);
    let here = (
        sh.node_names[sh.rank as usize].as_str(),
        sh.addrs[sh.rank as usize],
    );
    let placed = place_ranks(&rv, rank, size, here, deadline, &waiting)?;
    // A rank that others reach at a loopback address only works inside one node.
    let nodes = placed.nids.iter().max().map_or(1, |&m| m + 1);
    if nodes > 1 {
        if let Some(r) = placed.addrs.iter().position(|a| a.is_loopback()) {
            return Err(Error::Config(format!(
                "rank {r} of the joint job has the loopback address {} but the joint job \
                 spans {nodes} nodes: start that job with QUIVER_ADDR set to an address the \
                 other nodes reach",
                placed.addrs[r]
            )));
        }
    }
    let derived = inv
        .key
        .derive("quiver joint job token v1", &inv.joint_id.to_le_bytes());
    let token = u64::from_le_bytes(derived[..8].try_into().expect("8 bytes")).max(1);
    let frame_key = inv.key.derive(
        "quiver frame key v1",
        &[&inv.joint_id.to_le_bytes()[..], &token.to_le_bytes()].concat(),
    );
    rv.barrier("bootstrap", rank, size, deadline.remaining())
        .map_err(waiting("every rank of both jobs to join".into()))?;
    let info = JobInfo {
        rank,
        size,
        local_rank: None,
        job_id: inv.joint_id,
        token,
        frame_key,
        launcher: sh.launcher,
        bootstrap: format!(
            "joint job of jobs {} and {} through {url}",
            inv.host_job, guest.job_id
        ),
        node_names: placed.node_names,
        nids: placed.nids,
        addrs: placed.addrs,
        rendezvous: Arc::new(rv),
        server: None,
    };
    Ok((info, guest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Invitation {
        Invitation {
            host_job: 7,
            host_size: 3,
            joint_id: 99,
            url: "tcp://[::1]:4000".into(),
            key: StoreKey::generate(),
        }
    }

    #[test]
    fn the_text_form_round_trips() {
        let inv = sample();
        let back: Invitation = inv.to_string().parse().unwrap();
        assert_eq!(back, inv);
    }

    #[test]
    fn the_debug_form_keeps_the_key_out() {
        let inv = sample();
        assert!(!format!("{inv:?}").contains(&inv.key.to_hex()));
    }

    #[test]
    fn malformed_invitations_are_refused_with_a_reason() {
        let good = sample().to_string();
        let cut = &good[..good.len() / 2];
        for bad in [
            "",
            "hello",
            cut,
            &good.replacen(PREFIX, "quiver-invitation-v0", 1),
            &good.replace("tcp://", "file://"),
            &good.replacen(":3:", ":0:", 1),
        ] {
            match bad.parse::<Invitation>() {
                Err(Error::Config(why)) => assert!(why.contains("invitation"), "{why}"),
                other => panic!("{bad:?} gave {other:?}"),
            }
        }
    }

    #[test]
    fn joint_ranks_put_the_host_first() {
        let (mut jobs, _store) = crate::test_support::jobs(1, &Config::default());
        let j = JointJob {
            job: jobs.pop().unwrap(),
            host: Member { job_id: 5, size: 2 },
            guest: Member { job_id: 6, size: 3 },
        };
        assert_eq!(j.rank_of(5, 1).unwrap(), 1);
        assert_eq!(j.rank_of(6, 0).unwrap(), 2);
        assert_eq!(j.member(4), Some((6, 2)));
        assert_eq!(j.member(5), None);
        assert!(matches!(j.rank_of(6, 3), Err(Error::NoSuchRank { .. })));
        assert!(matches!(j.rank_of(8, 0), Err(Error::Config(_))));
    }
}
