//! Point-to-point: MPI's sends, receives and requests on the communicators' tagged
//! endpoints, and the progress rule that lets a blocking call complete operations of
//! other endpoints.
//!
//! A request is an entry of the process's table ([`ReqId`] is its index) holding the
//! tagged endpoint's raw request, and for a datatype that is not contiguous the packed
//! copy it sends from or receives into (unpacked when the receive completes).

use crate::error::{check, Class, MpiError, Result};
use crate::{Comm, Layout, Mpi, Peer, TagSel};
use quiver::tagged::{RawRequest, Src, Tag, Tagged};

/// A request's index in the process's table.
pub type ReqId = usize;

/// What a completed operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The sender (of a receive; [`Peer::Null`] for `MPI_PROC_NULL`).
    pub source: Peer,
    /// The message's tag ([`TagSel::Any`] for `MPI_PROC_NULL`).
    pub tag: TagSel,
    /// Bytes received (sent, for a send).
    pub bytes: u64,
    /// Whether the operation was cancelled.
    pub cancelled: bool,
}

impl Status {
    /// The status of an operation with `MPI_PROC_NULL`.
    pub const NULL: Status = Status {
        source: Peer::Null,
        tag: TagSel::Any,
        bytes: 0,
        cancelled: false,
    };
}

/// How long a blocking call waits on one endpoint before it gives the process's other
/// endpoints a round of work (see [`Mpi::wait_raw`]).
pub(crate) const DRIVE_EVERY: std::time::Duration = std::time::Duration::from_micros(200);
/// Turns of a busy wait between two yields of the core.
const YIELD_EVERY: u32 = 64;

/// Which of a communicator's endpoints.
pub(crate) const P2P: usize = 0;
pub(crate) const COLL: usize = 1;

/// A receive into a type that is not contiguous: the packed bytes arrive in `tmp` and
/// are scattered into the application's `count` elements at `buf` on completion.
struct Unpack {
    tmp: Vec<u8>,
    buf: *mut u8,
    layout: Layout,
    /// Bytes the application's elements hold (a matched message longer than this is
    /// truncated).
    room: usize,
}

/// An operation on an endpoint, not complete.
pub(crate) struct Pending {
    raw: RawRequest,
    /// Where a non-contiguous receive's bytes go (boxed: the contiguous operations'
    /// requests stay small, and are moved in and out of the table at every call).
    unpack: Option<Box<Unpack>>,
    /// A non-contiguous send's packed bytes (alive until the send completes).
    _packed: Option<Vec<u8>>,
}

enum State {
    /// On the endpoint, not complete.
    Pending(Pending),
    /// Complete when started (`MPI_PROC_NULL`), or completed by
    /// [`Mpi::request_status`] and kept for its wait.
    Done(Status),
    /// Failed, found by [`Mpi::request_status`]; its wait reports it.
    Failed(MpiError),
}

pub(crate) struct Entry {
    comm: usize,
    ep: usize,
    state: State,
}

/// The process's requests.
#[derive(Default)]
pub(crate) struct Requests {
    table: Vec<Option<Entry>>,
    free: Vec<usize>,
}

impl Requests {
    fn add(&mut self, e: Entry) -> ReqId {
        match self.free.pop() {
            Some(i) => {
                self.table[i] = Some(e);
                i
            }
            None => {
                self.table.push(Some(e));
                self.table.len() - 1
            }
        }
    }

    /// Puts `e` back as request `id` (just taken).
    fn restore(&mut self, id: ReqId, e: Entry) {
        if self.free.last() == Some(&id) {
            self.free.pop();
        } else {
            self.free.retain(|&f| f != id);
        }
        self.table[id] = Some(e);
    }

    fn take(&mut self, id: ReqId) -> Result<Entry> {
        let e = self
            .table
            .get_mut(id)
            .and_then(Option::take)
            .ok_or_else(|| MpiError::new(Class::Request, format!("request {id} does not exist")))?;
        self.free.push(id);
        Ok(e)
    }

    fn get_mut(&mut self, id: ReqId) -> Result<&mut Entry> {
        self.table
            .get_mut(id)
            .and_then(Option::as_mut)
            .ok_or_else(|| MpiError::new(Class::Request, format!("request {id} does not exist")))
    }

    fn get(&self, id: ReqId) -> Result<&Entry> {
        self.table
            .get(id)
            .and_then(Option::as_ref)
            .ok_or_else(|| MpiError::new(Class::Request, format!("request {id} does not exist")))
    }

    pub(crate) fn clear(&mut self) {
        self.table.clear();
        self.free.clear();
    }
}

impl Comm {
    fn dest(&self, r: u32) -> Result<u32> {
        check(r < self.size(), Class::Rank, || {
            format!(
                "rank {r} is not in the communicator of {} ranks",
                self.size()
            )
        })?;
        Ok(self.job_rank(r))
    }

    fn src(&self, p: Peer) -> Result<Src> {
        match p {
            Peer::Any => Ok(Src::Any),
            Peer::Rank(r) => self.dest(r).map(Src::Rank),
            Peer::Null => Err(MpiError::new(
                Class::Intern,
                "MPI_PROC_NULL reached the endpoint",
            )),
        }
    }

    /// quiver's status of a receive in the communicator's ranks.
    fn status(&self, s: quiver::tagged::Status) -> Status {
        Status {
            source: self.rank_of_job(s.peer).map_or(Peer::Null, Peer::Rank),
            tag: TagSel::Is(s.tag),
            bytes: s.len,
            cancelled: false,
        }
    }

    /// quiver's error in MPI's terms (a truncated message keeps its status).
    fn error(&self, e: quiver::Error) -> MpiError {
        let status = match e {
            quiver::Error::Truncated {
                capacity,
                rank,
                tag,
                ..
            } => Some(Status {
                source: self.rank_of_job(rank).map_or(Peer::Null, Peer::Rank),
                tag: TagSel::Is(tag),
                bytes: capacity as u64,
                cancelled: false,
            }),
            _ => None,
        };
        MpiError::from(e).with_status(status)
    }
}

fn tag_of(t: TagSel) -> Tag {
    match t {
        TagSel::Any => Tag::Any,
        TagSel::Is(t) => Tag::Is(t),
    }
}

/// Progress across endpoints.
impl Mpi {
    /// Whether an endpoint other than (`comm`, `ep`) has operations outstanding (the
    /// one-sided endpoint while windows exist: other ranks' requests for them may come
    /// at any time).
    fn others_busy(&self, comm: usize, ep: usize) -> bool {
        self.rma_active()
            || self.comms.iter().enumerate().any(|(c, o)| {
                o.as_ref().is_some_and(|o| {
                    o.outstanding
                        .iter()
                        .enumerate()
                        .any(|(e, n)| n.get() > 0 && (c, e) != (comm, ep))
                })
            })
    }

    /// One round of protocol work on every open endpoint other than (`comm`, `ep`):
    /// what arrived, acknowledgements, retransmissions, answers owed (a `Done`, the
    /// bytes a receiver asked for), heartbeats. Their errors are left for their own
    /// operations to report (a peer that failed fails every later operation with it).
    fn drive_others(&self, comm: usize, ep: usize) {
        self.drive_rma();
        self.parked.round();
        for (c, o) in self.comms.iter().enumerate() {
            let Some(eps) = o.as_ref().and_then(|o| o.eps.get()) else {
                continue;
            };
            if (c, P2P) != (comm, ep) {
                let _ = eps.p2p.progress();
            }
            if (c, COLL) != (comm, ep) {
                let _ = eps.coll.progress();
            }
        }
    }

    /// One round of protocol work on every endpoint of the process.
    pub(crate) fn drive_all(&self) {
        self.drive_others(usize::MAX, usize::MAX);
    }

    /// Whether every open endpoint other than (`comm`, `ep`) is idle
    /// ([`Tagged::idle`]): a blocking call may then wait inside quiver on its own.
    fn others_idle(&self, comm: usize, ep: usize) -> bool {
        !self.rma_active()
            && self.parked.idle()
            && self.comms.iter().enumerate().all(|(c, o)| {
                let Some(eps) = o.as_ref().and_then(|o| o.eps.get()) else {
                    return true;
                };
                ((c, P2P) == (comm, ep) || eps.p2p.idle())
                    && ((c, COLL) == (comm, ep) || eps.coll.idle())
            })
    }

    /// Waits for `raw` of endpoint (`comm`, `ep`), keeping the process's other
    /// endpoints going until they are idle: at every turn while one of them has
    /// operations outstanding (a peer may be waiting for its answer), otherwise every
    /// [`DRIVE_EVERY`] (what they owe then: acknowledgements, retransmissions, a last
    /// `Done`). Once they are idle, it waits inside quiver (spinning, then blocking).
    pub(crate) fn wait_raw(&self, comm: usize, ep: usize, raw: RawRequest) -> Result<Status> {
        let (c, eps) = self.eps(comm)?;
        let t = if ep == P2P { &eps.p2p } else { &eps.coll };
        let mut turns = 0u32;
        let out = loop {
            if self.others_idle(comm, ep) {
                break t.wait_raw(raw);
            }
            if self.others_busy(comm, ep) {
                match t.test_raw(&raw) {
                    Ok(true) => break t.wait_raw(raw),
                    Ok(false) => {
                        self.drive_others(comm, ep);
                        // A process that waits this way may wait long (while its windows
                        // exist, every wait does): it lets a rank that shares its core
                        // run.
                        turns = turns.wrapping_add(1);
                        if turns.is_multiple_of(YIELD_EVERY) {
                            std::thread::yield_now();
                        }
                    }
                    // As quiver's own waits: a wait that fails ends its operation, so
                    // that nothing uses the buffer once the caller has it back.
                    Err(e) => {
                        t.abandon_raw(raw);
                        break Err(e);
                    }
                }
            } else {
                match t.wait_raw_within(&raw, DRIVE_EVERY) {
                    Some(r) => break r,
                    None => self.drive_others(comm, ep),
                }
            }
        };
        match out {
            Ok(s) => Ok(c.status(s)),
            // A cancelled receive completes, its status saying so (MPI_Test_cancelled).
            Err(quiver::Error::Cancelled) => Ok(Status {
                cancelled: true,
                ..Status::NULL
            }),
            Err(e) => Err(c.error(e)),
        }
    }

    /// Starts a send of `bytes` at `data` on endpoint `ep` of `comm` (`sync`: complete
    /// once a receive took it, MPI's synchronous mode).
    ///
    /// # Safety
    ///
    /// `data..data + bytes` stays readable and unchanged until the request completes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn start_send(
        &self,
        comm: usize,
        ep: usize,
        dest: u32,
        tag: u32,
        data: *const u8,
        bytes: usize,
        sync: bool,
    ) -> Result<RawRequest> {
        let (c, eps) = self.live_eps(comm)?;
        let t: &Tagged = if ep == P2P { &eps.p2p } else { &eps.coll };
        let to = c.dest(dest)?;
        // SAFETY: the caller's promise.
        let raw = unsafe {
            if sync {
                t.issend_raw(to, tag, data, bytes)
            } else {
                t.isend_raw(to, tag, data, bytes)
            }
        }
        .map_err(|e| c.error(e))?;
        c.outstanding[ep].set(c.outstanding[ep].get() + 1);
        Ok(raw)
    }

    /// Starts a receive of at most `cap` bytes into `buf` on endpoint `ep` of `comm`.
    ///
    /// # Safety
    ///
    /// `buf..buf + cap` stays writable, and untouched by others, until the request
    /// completes.
    pub(crate) unsafe fn start_recv(
        &self,
        comm: usize,
        ep: usize,
        src: Peer,
        tag: TagSel,
        buf: *mut u8,
        cap: usize,
    ) -> Result<RawRequest> {
        let (c, eps) = self.live_eps(comm)?;
        let t: &Tagged = if ep == P2P { &eps.p2p } else { &eps.coll };
        let from = c.src(src)?;
        // SAFETY: the caller's promise.
        let raw = unsafe { t.irecv_raw(buf, cap, from, tag_of(tag)) }.map_err(|e| c.error(e))?;
        c.outstanding[ep].set(c.outstanding[ep].get() + 1);
        Ok(raw)
    }

    /// Completes `raw` (see [`Mpi::wait_raw`]) and counts it off its endpoint.
    pub(crate) fn finish_raw(&self, comm: usize, ep: usize, raw: RawRequest) -> Result<Status> {
        let out = self.wait_raw(comm, ep, raw);
        let c = self.comm_any(comm)?;
        c.outstanding[ep].set(c.outstanding[ep].get().saturating_sub(1));
        out
    }

    /// Starts sending `count` elements of `layout` at `buf` to rank `dest` of `comm`
    /// on endpoint `ep` (packed first unless contiguous).
    ///
    /// # Safety
    ///
    /// The elements at `buf` stay readable and unchanged until it completes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_send(
        &self,
        comm: usize,
        ep: usize,
        buf: *const u8,
        count: usize,
        layout: &Layout,
        dest: u32,
        tag: u32,
        sync: bool,
    ) -> Result<Pending> {
        let bytes = layout.bytes(count)?;
        if layout.is_contiguous() {
            // SAFETY: the caller's promise.
            let raw = unsafe { self.start_send(comm, ep, dest, tag, buf, bytes, sync) }?;
            return Ok(Pending {
                raw,
                unpack: None,
                _packed: None,
            });
        }
        let mut packed = Vec::new();
        // SAFETY: the caller promises the elements readable.
        unsafe { layout.pack(buf, count, &mut packed) };
        // SAFETY: `packed` moves into the pending operation (its heap buffer stays put)
        // and lives until the operation completes.
        let raw =
            unsafe { self.start_send(comm, ep, dest, tag, packed.as_ptr(), packed.len(), sync) }?;
        Ok(Pending {
            raw,
            unpack: None,
            _packed: Some(packed),
        })
    }

    /// Starts receiving at most `count` elements of `layout` into `buf` from `src` of
    /// `comm` on endpoint `ep` (into a packed copy unless contiguous).
    ///
    /// # Safety
    ///
    /// The elements at `buf` stay writable, and untouched by others, until it
    /// completes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn post_recv(
        &self,
        comm: usize,
        ep: usize,
        buf: *mut u8,
        count: usize,
        layout: &Layout,
        src: Peer,
        tag: TagSel,
    ) -> Result<Pending> {
        let bytes = layout.bytes(count)?;
        if layout.is_contiguous() {
            // SAFETY: the caller's promise.
            let raw = unsafe { self.start_recv(comm, ep, src, tag, buf, bytes) }?;
            return Ok(Pending {
                raw,
                unpack: None,
                _packed: None,
            });
        }
        let mut tmp = vec![0u8; bytes];
        // SAFETY: `tmp` moves into the pending operation (its heap buffer stays put) and
        // lives until it completes.
        let raw = unsafe { self.start_recv(comm, ep, src, tag, tmp.as_mut_ptr(), bytes) }?;
        Ok(Pending {
            raw,
            unpack: Some(Box::new(Unpack {
                tmp,
                buf,
                layout: layout.clone(),
                room: bytes,
            })),
            _packed: None,
        })
    }

    /// Ends a pending operation whether or not it completed (a receive is withdrawn, a
    /// send stops): nothing uses its buffers afterwards.
    pub(crate) fn abandon_pending(&self, comm: usize, ep: usize, p: Pending) {
        if let Ok((c, eps)) = self.eps(comm) {
            let t = if ep == P2P { &eps.p2p } else { &eps.coll };
            t.abandon_raw(p.raw);
            c.outstanding[ep].set(c.outstanding[ep].get().saturating_sub(1));
        }
    }

    /// Completes a pending operation (unpacking what a receive got).
    pub(crate) fn finish(&self, comm: usize, ep: usize, p: Pending) -> Result<Status> {
        let s = self.finish_raw(comm, ep, p.raw)?;
        if let Some(u) = p.unpack {
            let n = (s.bytes as usize).min(u.tmp.len()).min(u.room);
            // SAFETY: the caller of `post_recv` (or `imrecv`) promised the elements
            // writable until now; `n` bytes cover at most the elements it named.
            unsafe { u.layout.unpack(&u.tmp[..n], u.buf) };
            if (s.bytes as usize) > u.room {
                let cut = Status {
                    bytes: u.room as u64,
                    ..s
                };
                return Err(MpiError::new(
                    Class::Truncate,
                    format!(
                        "a message of {} bytes truncated to the receive buffer of {}",
                        s.bytes, u.room
                    ),
                )
                .with_status(Some(cut)));
            }
        }
        Ok(s)
    }
}

/// The application's point-to-point calls.
impl Mpi {
    /// `MPI_Isend` of `count` elements of `layout` at `buf`.
    ///
    /// # Safety
    ///
    /// The elements at `buf` stay readable and unchanged until the request completes.
    pub unsafe fn isend(
        &mut self,
        buf: *const u8,
        count: usize,
        layout: &Layout,
        dest: Peer,
        tag: u32,
        comm: usize,
    ) -> Result<ReqId> {
        // SAFETY: the caller's promise.
        unsafe { self.isend_as(buf, count, layout, (dest, tag, comm), false) }
    }

    /// `MPI_Issend`: [`Mpi::isend`] whose request completes once a receive took the
    /// message (quiver's synchronous send), whatever its length.
    ///
    /// # Safety
    ///
    /// As [`Mpi::isend`].
    pub unsafe fn issend(
        &mut self,
        buf: *const u8,
        count: usize,
        layout: &Layout,
        dest: Peer,
        tag: u32,
        comm: usize,
    ) -> Result<ReqId> {
        // SAFETY: the caller's promise.
        unsafe { self.isend_as(buf, count, layout, (dest, tag, comm), true) }
    }

    /// `MPI_Ssend`: returns once a receive took the message.
    ///
    /// # Safety
    ///
    /// The elements at `buf` are readable.
    pub unsafe fn ssend(
        &mut self,
        buf: *const u8,
        count: usize,
        layout: &Layout,
        dest: Peer,
        tag: u32,
        comm: usize,
    ) -> Result<()> {
        // SAFETY: the caller's promise; the request is waited for before returning.
        let req = unsafe { self.issend(buf, count, layout, dest, tag, comm) }?;
        self.wait(req).map(|_| ())
    }

    /// [`Mpi::isend`] or [`Mpi::issend`] (`sync`).
    ///
    /// # Safety
    ///
    /// As [`Mpi::isend`].
    unsafe fn isend_as(
        &mut self,
        buf: *const u8,
        count: usize,
        layout: &Layout,
        (dest, tag, comm): (Peer, u32, usize),
        sync: bool,
    ) -> Result<ReqId> {
        layout.check_committed()?;
        let dest = match dest {
            Peer::Null => {
                self.comm(comm)?;
                return Ok(self.p2p_request(comm, State::Done(Status::NULL)));
            }
            Peer::Any => {
                return Err(MpiError::new(
                    Class::Rank,
                    "MPI_ANY_SOURCE is not a destination",
                ))
            }
            Peer::Rank(r) => r,
        };
        // SAFETY: the caller's promise.
        let p = unsafe { self.post_send(comm, P2P, buf, count, layout, dest, tag, sync) }?;
        Ok(self.p2p_request(comm, State::Pending(p)))
    }

    /// `MPI_Irecv` of at most `count` elements of `layout` into `buf`.
    ///
    /// # Safety
    ///
    /// The elements at `buf` stay writable, and untouched by others, until the request
    /// completes.
    pub unsafe fn irecv(
        &mut self,
        buf: *mut u8,
        count: usize,
        layout: &Layout,
        src: Peer,
        tag: TagSel,
        comm: usize,
    ) -> Result<ReqId> {
        layout.check_committed()?;
        if src == Peer::Null {
            self.comm(comm)?;
            return Ok(self.p2p_request(comm, State::Done(Status::NULL)));
        }
        // SAFETY: the caller's promise.
        let p = unsafe { self.post_recv(comm, P2P, buf, count, layout, src, tag) }?;
        Ok(self.p2p_request(comm, State::Pending(p)))
    }

    /// A request of the table for a point-to-point operation of `comm`.
    fn p2p_request(&mut self, comm: usize, state: State) -> ReqId {
        self.reqs.add(Entry {
            comm,
            ep: P2P,
            state,
        })
    }

    /// `MPI_Send`.
    ///
    /// # Safety
    ///
    /// The elements at `buf` are readable.
    pub unsafe fn send(
        &mut self,
        buf: *const u8,
        count: usize,
        layout: &Layout,
        dest: Peer,
        tag: u32,
        comm: usize,
    ) -> Result<()> {
        // Contiguous data needs no request of the table: an eager message leaves at
        // once; with the other endpoints idle, quiver's own blocking send.
        if let (Peer::Rank(d), true) = (dest, layout.is_contiguous() && layout.committed) {
            let bytes = layout.bytes(count)?;
            let (c, eps) = self.live_eps(comm)?;
            let to = c.dest(d)?;
            let data = if bytes == 0 {
                &[][..]
            } else {
                // SAFETY: the caller promises `count` contiguous elements at `buf`.
                unsafe { std::slice::from_raw_parts(buf, bytes) }
            };
            if eps.p2p.try_send(to, tag, data).map_err(|e| c.error(e))? {
                return Ok(());
            }
            if self.others_idle(comm, P2P) {
                return eps.p2p.send(to, tag, data).map_err(|e| c.error(e));
            }
            // SAFETY: the caller promises `count` contiguous elements at `buf`; the send
            // is waited for before returning.
            let raw = unsafe { self.start_send(comm, P2P, d, tag, buf, bytes, false) }?;
            return self.finish_raw(comm, P2P, raw).map(|_| ());
        }
        // SAFETY: the caller's promise; the request is waited for before returning.
        let req = unsafe { self.isend(buf, count, layout, dest, tag, comm) }?;
        self.wait(req).map(|_| ())
    }

    /// `MPI_Recv`.
    ///
    /// # Safety
    ///
    /// The elements at `buf` are writable and not borrowed elsewhere.
    pub unsafe fn recv(
        &mut self,
        buf: *mut u8,
        count: usize,
        layout: &Layout,
        src: Peer,
        tag: TagSel,
        comm: usize,
    ) -> Result<Status> {
        if src != Peer::Null && layout.is_contiguous() && layout.committed {
            let bytes = layout.bytes(count)?;
            if self.others_idle(comm, P2P) {
                let (c, eps) = self.live_eps(comm)?;
                let from = c.src(src)?;
                let data = if bytes == 0 {
                    &mut [][..]
                } else {
                    // SAFETY: the caller promises `count` contiguous writable elements.
                    unsafe { std::slice::from_raw_parts_mut(buf, bytes) }
                };
                let got = eps.p2p.recv(data, from, tag_of(tag));
                return got.map(|s| c.status(s)).map_err(|e| c.error(e));
            }
            // SAFETY: the caller promises `count` contiguous writable elements at `buf`;
            // the receive is waited for before returning.
            let raw = unsafe { self.start_recv(comm, P2P, src, tag, buf, bytes) }?;
            return self.finish_raw(comm, P2P, raw);
        }
        // SAFETY: the caller's promise; the request is waited for before returning.
        let req = unsafe { self.irecv(buf, count, layout, src, tag, comm) }?;
        self.wait(req)
    }

    /// `MPI_Wait`: the request is spent.
    pub fn wait(&mut self, req: ReqId) -> Result<Status> {
        let e = self.reqs.take(req)?;
        let comm = e.comm;
        let done = self.complete(e);
        if self.comm(comm).is_err() {
            // The last operation of a freed communicator may have completed.
            self.reap();
        }
        done
    }

    fn complete(&self, e: Entry) -> Result<Status> {
        match e.state {
            State::Done(s) => Ok(s),
            State::Failed(err) => Err(err),
            State::Pending(p) => self.finish(e.comm, e.ep, p),
        }
    }

    /// `MPI_Test`: the status if complete (the request is then spent).
    pub fn test(&mut self, req: ReqId) -> Result<Option<Status>> {
        if self.is_done(req)? {
            self.wait(req).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Makes progress on the request's endpoint and says whether it is complete.
    fn is_done(&self, req: ReqId) -> Result<bool> {
        self.entry_done(self.reqs.get(req)?)
    }

    fn entry_done(&self, e: &Entry) -> Result<bool> {
        match &e.state {
            State::Done(_) | State::Failed(_) => Ok(true),
            State::Pending(Pending { raw, .. }) => {
                let (c, eps) = self.eps(e.comm)?;
                let t = if e.ep == P2P { &eps.p2p } else { &eps.coll };
                let done = t.test_raw(raw).map_err(|err| c.error(err))?;
                if !done {
                    self.drive_others(e.comm, e.ep);
                }
                Ok(done)
            }
        }
    }

    /// `MPI_Waitall`: each request's result, in order (`None`: `MPI_REQUEST_NULL`).
    pub fn waitall(&mut self, reqs: &[Option<ReqId>]) -> Vec<Result<Status>> {
        reqs.iter()
            .map(|r| match r {
                Some(r) => self.wait(*r),
                None => Ok(Status::NULL),
            })
            .collect()
    }

    /// `MPI_Waitany`: the index and result of one completed request; `None` when all
    /// are `MPI_REQUEST_NULL`.
    pub fn waitany(&mut self, reqs: &[Option<ReqId>]) -> Result<Option<(usize, Result<Status>)>> {
        if reqs.iter().all(Option::is_none) {
            return Ok(None);
        }
        loop {
            if let Some(done) = self.testany(reqs)? {
                return Ok(Some(done));
            }
        }
    }

    /// `MPI_Testany` (one pass): the index and result of a completed request.
    pub fn testany(&mut self, reqs: &[Option<ReqId>]) -> Result<Option<(usize, Result<Status>)>> {
        for (i, r) in reqs.iter().enumerate() {
            if let Some(r) = *r {
                if self.is_done(r)? {
                    return Ok(Some((i, self.wait(r))));
                }
            }
        }
        Ok(None)
    }

    /// `MPI_Testall`: whether all are complete (then every one is spent and its
    /// result returned; otherwise none is).
    pub fn testall(&mut self, reqs: &[Option<ReqId>]) -> Result<Option<Vec<Result<Status>>>> {
        for r in reqs.iter().flatten() {
            if !self.is_done(*r)? {
                return Ok(None);
            }
        }
        Ok(Some(self.waitall(reqs)))
    }

    /// Whether the request is complete (it stays for its wait).
    pub fn peek(&mut self, req: ReqId) -> Result<bool> {
        self.is_done(req)
    }

    /// `MPI_Request_get_status`: the status if the request is complete, without spending
    /// it (its result is kept for its wait; a failure is kept as well, and reported by
    /// the wait).
    pub fn request_status(&mut self, req: ReqId) -> Result<Option<Status>> {
        if let State::Done(s) = self.reqs.get(req)?.state {
            return Ok(Some(s));
        }
        if !self.is_done(req)? {
            return Ok(None);
        }
        let e = self.reqs.take(req)?;
        let (comm, ep) = (e.comm, e.ep);
        let result = self.complete(e);
        let state = match &result {
            Ok(s) => State::Done(*s),
            Err(err) => State::Failed(err.clone()),
        };
        self.reqs.restore(req, Entry { comm, ep, state });
        result.map(Some)
    }

    /// `MPI_Cancel` of a receive no message matched yet (a send, or a matched receive,
    /// completes normally).
    pub fn cancel(&mut self, req: ReqId) -> Result<()> {
        let e = self.reqs.get(req)?;
        if let State::Pending(Pending { raw, .. }) = &e.state {
            let (_, eps) = self.eps(e.comm)?;
            let t = if e.ep == P2P { &eps.p2p } else { &eps.coll };
            t.cancel_raw(raw);
        }
        Ok(())
    }

    /// `MPI_Request_free`: nobody will wait for the operation; it completes on its
    /// own (driven by later calls, finished at the latest by [`Mpi::finalize`]).
    pub fn request_free(&mut self, req: ReqId) -> Result<()> {
        let e = self.reqs.take(req)?;
        self.detached.push(e);
        // Those complete by now leave the list.
        let mut i = 0;
        while i < self.detached.len() {
            if self.entry_done(&self.detached[i])? {
                let e = self.detached.swap_remove(i);
                let _ = self.complete(e);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// Completes the requests nobody waits for ([`Mpi::request_free`]).
    pub(crate) fn finish_detached(&mut self) {
        for e in std::mem::take(&mut self.detached) {
            let _ = self.complete(e);
        }
    }

    /// `MPI_Iprobe`: the status of a matching message, if one arrived.
    pub fn iprobe(&mut self, src: Peer, tag: TagSel, comm: usize) -> Result<Option<Status>> {
        let (c, eps) = self.live_eps(comm)?;
        if src == Peer::Null {
            return Ok(Some(Status::NULL));
        }
        self.drive_others(comm, P2P);
        let from = c.src(src)?;
        eps.p2p
            .iprobe(from, tag_of(tag))
            .map(|s| s.map(|s| c.status(s)))
            .map_err(|e| c.error(e))
    }

    /// `MPI_Improbe`: a message that matches, if one arrived, taken out of matching (no
    /// other receive can take it) and held as a request for [`Mpi::imrecv`]. Its bytes
    /// are received into a buffer of the library's, copied to the application's by
    /// `imrecv`'s completion.
    pub fn improbe(
        &mut self,
        src: Peer,
        tag: TagSel,
        comm: usize,
    ) -> Result<Option<(Status, ReqId)>> {
        let Some(st) = self.iprobe(src, tag, comm)? else {
            return Ok(None);
        };
        let (Peer::Rank(from), TagSel::Is(t)) = (st.source, st.tag) else {
            return Err(MpiError::new(
                Class::Intern,
                "a probed message without a source or tag",
            ));
        };
        let bytes = usize::try_from(st.bytes)
            .map_err(|_| MpiError::new(Class::Count, "a message longer than memory"))?;
        let mut tmp = vec![0u8; bytes];
        // The earliest message of (from, t) is the one probed: any earlier one would have
        // matched the probe's pattern too, and messages of one sender stay in order.
        // SAFETY: `tmp` moves into the request (its heap buffer stays put) and lives
        // until it completes.
        let raw = unsafe {
            self.start_recv(
                comm,
                P2P,
                Peer::Rank(from),
                TagSel::Is(t),
                tmp.as_mut_ptr(),
                bytes,
            )
        }?;
        let unpack = Unpack {
            tmp,
            buf: std::ptr::null_mut(),
            layout: Layout::builtin(crate::Elem::Bytes {
                size: 1,
                bitwise: false,
            }),
            room: 0,
        };
        let pending = Pending {
            raw,
            unpack: Some(Box::new(unpack)),
            _packed: None,
        };
        let id = self.p2p_request(comm, State::Pending(pending));
        Ok(Some((st, id)))
    }

    /// `MPI_Mprobe`: [`Mpi::improbe`], waiting for a message.
    pub fn mprobe(&mut self, src: Peer, tag: TagSel, comm: usize) -> Result<(Status, ReqId)> {
        loop {
            if let Some(got) = self.improbe(src, tag, comm)? {
                return Ok(got);
            }
        }
    }

    /// `MPI_Imrecv`: the message held as request `msg` ([`Mpi::improbe`]) goes to
    /// `count` elements of `layout` at `buf` (truncated, with `MPI_ERR_TRUNCATE`, if
    /// longer); returns the request to wait for (the same id).
    ///
    /// # Safety
    ///
    /// The elements at `buf` stay writable, and untouched by others, until the request
    /// completes.
    pub unsafe fn imrecv(
        &mut self,
        msg: ReqId,
        buf: *mut u8,
        count: usize,
        layout: &Layout,
    ) -> Result<ReqId> {
        layout.check_committed()?;
        let room = layout.bytes(count)?;
        let e = self.reqs.get_mut(msg)?;
        match &mut e.state {
            State::Pending(Pending {
                unpack: Some(u), ..
            }) if u.buf.is_null() && u.room == 0 => {
                u.buf = buf;
                u.layout = layout.clone();
                u.room = room;
                Ok(msg)
            }
            _ => Err(MpiError::new(
                Class::Request,
                "not a message of MPI_Mprobe or MPI_Improbe",
            )),
        }
    }

    /// `MPI_Probe`.
    pub fn probe(&mut self, src: Peer, tag: TagSel, comm: usize) -> Result<Status> {
        loop {
            if let Some(s) = self.iprobe(src, tag, comm)? {
                return Ok(s);
            }
        }
    }

    /// `MPI_Sendrecv`.
    ///
    /// # Safety
    ///
    /// As [`Mpi::send`] for the send buffer and [`Mpi::recv`] for the receive buffer;
    /// the two do not overlap.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sendrecv(
        &mut self,
        sbuf: *const u8,
        scount: usize,
        stype: &Layout,
        dest: Peer,
        stag: u32,
        rbuf: *mut u8,
        rcount: usize,
        rtype: &Layout,
        src: Peer,
        rtag: TagSel,
        comm: usize,
    ) -> Result<Status> {
        // SAFETY: the caller's promises; both requests are waited for here.
        let r = unsafe { self.irecv(rbuf, rcount, rtype, src, rtag, comm) }?;
        // SAFETY: as above.
        let s = match unsafe { self.isend(sbuf, scount, stype, dest, stag, comm) } {
            Ok(s) => s,
            Err(e) => {
                let _ = self.cancel(r);
                let _ = self.wait(r);
                return Err(e);
            }
        };
        let sent = self.wait(s);
        let got = self.wait(r);
        sent?;
        got
    }
}
