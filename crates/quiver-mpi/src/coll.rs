//! Collective operations over a communicator's collective endpoint.
//!
//! Simple, correct algorithms (quiver's own collectives are a later piece of work):
//! the barrier is a dissemination (⌈log₂ n⌉ rounds of empty messages); broadcast a
//! binomial tree from the root; reduction a binomial tree towards rank 0 over the
//! ranks in order (so that a non-commutative operation sees its operands in rank order,
//! as MPI requires), then to the root; allreduce a reduction and a broadcast; gathers
//! and scatters direct to and from the root; the all-to-alls direct exchanges. Each
//! collective call takes the next sequence number of its communicator as its messages'
//! tag, so consecutive collectives never mix.
//!
//! Buffers are (address, count, [`Layout`]) as in point-to-point; a reduction needs a
//! type of one kind of number ([`Layout::elem`]). `None` as a send buffer is
//! `MPI_IN_PLACE`.

use crate::error::{check, Class, MpiError, Result};
use crate::p2p::{Pending, COLL};
use crate::{Layout, Mpi, Op, Peer, TagSel};

/// Elements at an address: one side of a collective.
#[derive(Clone, Copy)]
pub struct Elems<'a> {
    /// The address of the first element.
    pub ptr: *const u8,
    /// How many.
    pub count: usize,
    /// Their type.
    pub layout: &'a Layout,
}

impl Mpi {
    /// The tag of the next collective of `comm`.
    fn next_tag(&self, comm: usize) -> Result<u32> {
        let c = self.comm(comm)?;
        let t = c.coll_seq.get();
        c.coll_seq.set(t.wrapping_add(1) & 0x7fff_ffff);
        Ok(t)
    }

    /// Sends on the collective endpoint.
    ///
    /// # Safety
    ///
    /// The elements are readable until the operation completes.
    unsafe fn c_send(&self, comm: usize, to: u32, tag: u32, e: Elems<'_>) -> Result<Pending> {
        // SAFETY: the caller's promise.
        unsafe { self.post_send(comm, COLL, e.ptr, e.count, e.layout, to, tag, false) }
    }

    /// Receives on the collective endpoint.
    ///
    /// # Safety
    ///
    /// The elements are writable, and untouched by others, until the operation
    /// completes.
    unsafe fn c_recv(&self, comm: usize, from: u32, tag: u32, e: Elems<'_>) -> Result<Pending> {
        // SAFETY: the caller's promise.
        unsafe {
            self.post_recv(
                comm,
                COLL,
                e.ptr.cast_mut(),
                e.count,
                e.layout,
                Peer::Rank(from),
                TagSel::Is(tag),
            )
        }
    }

    /// Adds a posted operation to `ops`; if posting failed, ends the ones posted
    /// (nothing uses their buffers afterwards) and fails.
    fn c_post(&self, comm: usize, ops: &mut Vec<Pending>, posted: Result<Pending>) -> Result<()> {
        match posted {
            Ok(p) => {
                ops.push(p);
                Ok(())
            }
            Err(e) => {
                for p in std::mem::take(ops) {
                    self.abandon_pending(comm, COLL, p);
                }
                Err(e)
            }
        }
    }

    /// Completes every pending operation (all of them, even after a failure), then
    /// returns the first failure.
    fn c_finish(&self, comm: usize, ops: Vec<Pending>) -> Result<()> {
        let mut first = Ok(());
        for p in ops {
            if let Err(e) = self.finish(comm, COLL, p) {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Bytes to receive into, as elements (the pointer is the slice's mutable one).
    fn bytes_mut<'a>(b: &'a mut [u8], layout: &'a Layout) -> Elems<'a> {
        Elems {
            ptr: b.as_mut_ptr(),
            count: b.len(),
            layout,
        }
    }

    /// Bytes as elements.
    fn bytes<'a>(b: &'a [u8], layout: &'a Layout) -> Elems<'a> {
        Elems {
            ptr: b.as_ptr(),
            count: b.len(),
            layout,
        }
    }

    /// `MPI_Barrier`.
    pub fn barrier(&mut self, comm: usize) -> Result<()> {
        let tag = self.next_tag(comm)?;
        let (n, r) = {
            let c = self.comm(comm)?;
            (c.size(), c.rank())
        };
        let byte = Layout::builtin(crate::Elem::Bytes {
            size: 1,
            bitwise: true,
        });
        let mut k = 1;
        while k < n {
            let none = Elems {
                ptr: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                count: 0,
                layout: &byte,
            };
            // SAFETY: empty messages touch no memory.
            let recv = unsafe { self.c_recv(comm, (r + n - k) % n, tag, none) }?;
            // SAFETY: as above.
            let ops = match unsafe { self.c_send(comm, (r + k) % n, tag, none) } {
                Ok(send) => vec![recv, send],
                Err(e) => {
                    // The receive is withdrawn, not left posted.
                    self.abandon_pending(comm, COLL, recv);
                    return Err(e);
                }
            };
            self.c_finish(comm, ops)?;
            k *= 2;
        }
        Ok(())
    }

    /// `MPI_Bcast` of `count` elements at `buf` from `root`.
    ///
    /// # Safety
    ///
    /// The elements at `buf` are readable (at the root) or writable (elsewhere) and not
    /// borrowed elsewhere.
    pub unsafe fn bcast(
        &mut self,
        buf: *mut u8,
        count: usize,
        layout: &Layout,
        root: u32,
        comm: usize,
    ) -> Result<()> {
        layout.check_committed()?;
        let tag = self.next_tag(comm)?;
        let (n, r) = self.size_rank(comm, root)?;
        let e = Elems {
            ptr: buf,
            count,
            layout,
        };
        // SAFETY: the caller's promise.
        unsafe { self.tree_bcast(comm, tag, n, (r + n - root) % n, root, e) }
    }

    /// A binomial-tree broadcast: rank `vr` (relative to `root`) receives from its
    /// parent, then sends to its children.
    ///
    /// # Safety
    ///
    /// As [`Mpi::bcast`].
    unsafe fn tree_bcast(
        &self,
        comm: usize,
        tag: u32,
        n: u32,
        vr: u32,
        root: u32,
        e: Elems<'_>,
    ) -> Result<()> {
        let real = |v: u32| (v + root) % n;
        let mut mask = 1;
        while mask < n {
            if vr & mask != 0 {
                // SAFETY: the caller's promise.
                let p = unsafe { self.c_recv(comm, real(vr - mask), tag, e) }?;
                self.c_finish(comm, vec![p])?;
                break;
            }
            mask <<= 1;
        }
        let mut ops = Vec::new();
        mask >>= 1;
        while mask > 0 {
            if vr + mask < n {
                // SAFETY: the caller's promise; the sends complete before returning.
                self.c_post(comm, &mut ops, unsafe {
                    self.c_send(comm, real(vr + mask), tag, e)
                })?;
            }
            mask >>= 1;
        }
        self.c_finish(comm, ops)
    }

    fn size_rank(&self, comm: usize, root: u32) -> Result<(u32, u32)> {
        let c = self.comm(comm)?;
        check(root < c.size(), Class::Root, || {
            format!(
                "root {root} is not in the communicator of {} ranks",
                c.size()
            )
        })?;
        Ok((c.size(), c.rank()))
    }

    /// `MPI_Reduce`: `send` `None` is `MPI_IN_PLACE` (the root's contribution is in
    /// `recv`); `recv` matters at the root only. `handle` is the front-end's name of the
    /// datatype, for an application's operation.
    ///
    /// # Safety
    ///
    /// `count` elements are readable at `send` (or at `recv` in place) and, at the root,
    /// writable at `recv`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn reduce(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        count: usize,
        layout: &Layout,
        op: &Op,
        root: u32,
        comm: usize,
        handle: u64,
    ) -> Result<()> {
        let tag = self.next_tag(comm)?;
        let (_, r) = self.size_rank(comm, root)?;
        // SAFETY: the caller's promise.
        let acc = unsafe {
            self.reduce_to_0(send.unwrap_or(recv), count, layout, op, comm, tag, handle)
        }?;
        let bytes = Layout::builtin(crate::Elem::Bytes {
            size: 1,
            bitwise: false,
        });
        match (r, acc) {
            (0, Some(acc)) if root == 0 => {
                // SAFETY: the caller promises the root's `recv` writable.
                unsafe { layout.unpack(&acc, recv) };
            }
            (0, Some(acc)) => {
                // SAFETY: `acc` lives until the send completes, just below.
                let p = unsafe { self.c_send(comm, root, tag, Mpi::bytes(&acc, &bytes)) }?;
                self.c_finish(comm, vec![p])?;
            }
            (r, _) if r == root => {
                // SAFETY: the caller promises the root's `recv` writable.
                let p = unsafe {
                    self.c_recv(
                        comm,
                        0,
                        tag,
                        Elems {
                            ptr: recv,
                            count,
                            layout,
                        },
                    )
                }?;
                self.c_finish(comm, vec![p])?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Reduces everyone's `count` elements at `data` towards rank 0, which gets the
    /// packed result (everyone else `None`).
    ///
    /// # Safety
    ///
    /// `count` elements are readable at `data`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn reduce_to_0(
        &self,
        data: *const u8,
        count: usize,
        layout: &Layout,
        op: &Op,
        comm: usize,
        tag: u32,
        handle: u64,
    ) -> Result<Option<Vec<u8>>> {
        layout.check_committed()?;
        op.check_layout(layout)?;
        let (n, r) = self.size_rank(comm, 0)?;
        let mut acc = Vec::new();
        // SAFETY: the caller's promise.
        unsafe { layout.pack(data, count, &mut acc) };
        let bytes = Layout::builtin(crate::Elem::Bytes {
            size: 1,
            bitwise: false,
        });
        let mut mask = 1;
        while mask < n {
            if r & mask != 0 {
                // SAFETY: `acc` lives until the send completes, just below.
                let p = unsafe { self.c_send(comm, r - mask, tag, Mpi::bytes(&acc, &bytes)) }?;
                self.c_finish(comm, vec![p])?;
                return Ok(None);
            }
            if r + mask < n {
                let mut higher = vec![0u8; acc.len()];
                // SAFETY: `higher` lives until the receive completes, just below.
                let p = unsafe {
                    self.c_recv(comm, r + mask, tag, Mpi::bytes_mut(&mut higher, &bytes))
                }?;
                self.c_finish(comm, vec![p])?;
                // Lower ranks' (acc) op higher ranks': inout = in op inout.
                // SAFETY: both hold `acc.len()` bytes.
                unsafe {
                    op.combine(layout, acc.len(), acc.as_ptr(), higher.as_mut_ptr(), handle)
                }?;
                acc = higher;
            }
            mask <<= 1;
        }
        Ok(Some(acc))
    }

    /// `MPI_Allreduce` (`send` `None`: `MPI_IN_PLACE`, the data in `recv`).
    ///
    /// # Safety
    ///
    /// As [`Mpi::reduce`], `recv` writable at every rank.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn allreduce(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        count: usize,
        layout: &Layout,
        op: &Op,
        comm: usize,
        handle: u64,
    ) -> Result<()> {
        let tag = self.next_tag(comm)?;
        // SAFETY: the caller's promise.
        let acc = unsafe {
            self.reduce_to_0(send.unwrap_or(recv), count, layout, op, comm, tag, handle)
        }?;
        if let Some(acc) = acc {
            // SAFETY: the caller promises `recv` writable.
            unsafe { layout.unpack(&acc, recv) };
        }
        let n = self.comm(comm)?.size();
        let r = self.comm(comm)?.rank();
        // SAFETY: as above; rank 0 broadcasts what it unpacked.
        unsafe {
            self.tree_bcast(
                comm,
                tag,
                n,
                r,
                0,
                Elems {
                    ptr: recv,
                    count,
                    layout,
                },
            )
        }
    }

    /// `MPI_Gatherv`: each rank's `send` lands at the root in `recv[i]` (address, count,
    /// type of rank `i`'s piece). `send` `None` at the root: `MPI_IN_PLACE`.
    ///
    /// # Safety
    ///
    /// `send` readable; at the root every piece of `recv` writable and apart.
    pub unsafe fn gatherv(
        &mut self,
        send: Option<Elems<'_>>,
        recv: &[Elems<'_>],
        root: u32,
        comm: usize,
    ) -> Result<()> {
        let tag = self.next_tag(comm)?;
        let (n, r) = self.size_rank(comm, root)?;
        if r != root {
            let send = send
                .ok_or_else(|| MpiError::new(Class::Buffer, "MPI_IN_PLACE is for the root only"))?;
            // SAFETY: the caller's promise.
            let p = unsafe { self.c_send(comm, root, tag, send) }?;
            return self.c_finish(comm, vec![p]);
        }
        check(recv.len() == n as usize, Class::Arg, || {
            "a receive piece per rank".into()
        })?;
        let mut ops = Vec::new();
        for (i, piece) in recv.iter().enumerate() {
            let i = i as u32;
            if i == root {
                if let Some(s) = send {
                    // SAFETY: the caller's promises: `s` readable, the piece writable.
                    unsafe { copy_elems(s, recv[i as usize])? };
                }
                continue;
            }
            // SAFETY: the caller's promise; completed below.
            self.c_post(comm, &mut ops, unsafe { self.c_recv(comm, i, tag, *piece) })?;
        }
        self.c_finish(comm, ops)
    }

    /// `MPI_Scatterv`: piece `send[i]` of the root goes to rank `i`'s `recv` (`None` at
    /// the root: `MPI_IN_PLACE`, its piece stays).
    ///
    /// # Safety
    ///
    /// At the root every piece readable; `recv` writable.
    pub unsafe fn scatterv(
        &mut self,
        send: &[Elems<'_>],
        recv: Option<Elems<'_>>,
        root: u32,
        comm: usize,
    ) -> Result<()> {
        let tag = self.next_tag(comm)?;
        let (n, r) = self.size_rank(comm, root)?;
        if r != root {
            let recv = recv
                .ok_or_else(|| MpiError::new(Class::Buffer, "MPI_IN_PLACE is for the root only"))?;
            // SAFETY: the caller's promise.
            let p = unsafe { self.c_recv(comm, root, tag, recv) }?;
            return self.c_finish(comm, vec![p]);
        }
        check(send.len() == n as usize, Class::Arg, || {
            "a send piece per rank".into()
        })?;
        let mut ops = Vec::new();
        for (i, piece) in send.iter().enumerate() {
            if i as u32 == root {
                if let Some(rv) = recv {
                    // SAFETY: the caller's promises.
                    unsafe { copy_elems(*piece, rv)? };
                }
                continue;
            }
            // SAFETY: the caller's promise; completed below.
            self.c_post(comm, &mut ops, unsafe {
                self.c_send(comm, i as u32, tag, *piece)
            })?;
        }
        self.c_finish(comm, ops)
    }

    /// A direct exchange: `send[i]` goes to rank `i`, `recv[i]` comes from it (this
    /// rank's own piece is copied; `None`: it is already in place). `MPI_Alltoall(v)`,
    /// and `MPI_Allgather(v)` with every `send[i]` the same.
    ///
    /// # Safety
    ///
    /// Every send piece readable, every receive piece writable and apart from the rest.
    pub unsafe fn exchange(
        &mut self,
        send: &[Elems<'_>],
        recv: &[Elems<'_>],
        own: Option<(Elems<'_>, Elems<'_>)>,
        comm: usize,
    ) -> Result<()> {
        let tag = self.next_tag(comm)?;
        let c = self.comm(comm)?;
        let (n, r) = (c.size() as usize, c.rank() as usize);
        check(send.len() == n && recv.len() == n, Class::Arg, || {
            "a piece per rank".into()
        })?;
        if let Some((s, d)) = own {
            // SAFETY: the caller's promises.
            unsafe { copy_elems(s, d)? };
        }
        let mut ops = Vec::new();
        // Receives first, then sends, each in an order that starts with the neighbours
        // (spreads the load instead of everyone sending to rank 0 first).
        for k in 1..n {
            let from = (r + n - k) % n;
            // SAFETY: the caller's promise; completed below.
            self.c_post(comm, &mut ops, unsafe {
                self.c_recv(comm, from as u32, tag, recv[from])
            })?;
        }
        for k in 1..n {
            let to = (r + k) % n;
            // SAFETY: as above.
            self.c_post(comm, &mut ops, unsafe {
                self.c_send(comm, to as u32, tag, send[to])
            })?;
        }
        self.c_finish(comm, ops)
    }

    /// `MPI_Scan` (`exclusive`: `MPI_Exscan`, where rank 0's `recv` is left alone): a
    /// chain from rank 0 up.
    ///
    /// # Safety
    ///
    /// `count` elements readable at `send` (at `recv` in place) and writable at `recv`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scan(
        &mut self,
        send: Option<*const u8>,
        recv: *mut u8,
        count: usize,
        layout: &Layout,
        op: &Op,
        comm: usize,
        handle: u64,
        exclusive: bool,
    ) -> Result<()> {
        layout.check_committed()?;
        op.check_layout(layout)?;
        let tag = self.next_tag(comm)?;
        let (n, r) = self.size_rank(comm, 0)?;
        let mut mine = Vec::new();
        // SAFETY: the caller's promise.
        unsafe { layout.pack(send.unwrap_or(recv), count, &mut mine) };
        let bytes = Layout::builtin(crate::Elem::Bytes {
            size: 1,
            bitwise: false,
        });
        // The prefix of the ranks below, then this rank's included.
        let mut upto = mine.clone();
        if r > 0 {
            let mut below = vec![0u8; mine.len()];
            // SAFETY: `below` lives until the receive completes, just below.
            let p = unsafe { self.c_recv(comm, r - 1, tag, Mpi::bytes_mut(&mut below, &bytes)) }?;
            self.c_finish(comm, vec![p])?;
            // below op mine.
            // SAFETY: both hold `mine.len()` bytes.
            unsafe {
                op.combine(
                    layout,
                    mine.len(),
                    below.as_ptr(),
                    upto.as_mut_ptr(),
                    handle,
                )
            }?;
            let result = if exclusive { &below } else { &upto };
            // SAFETY: the caller promises `recv` writable.
            unsafe { layout.unpack(result, recv) };
        } else if !exclusive {
            // SAFETY: as above.
            unsafe { layout.unpack(&upto, recv) };
        }
        if r + 1 < n {
            // SAFETY: `upto` lives until the send completes, just below.
            let p = unsafe { self.c_send(comm, r + 1, tag, Mpi::bytes(&upto, &bytes)) }?;
            self.c_finish(comm, vec![p])?;
        }
        Ok(())
    }

    /// The largest and the smallest of the ranks' `mine`: the library's own allreduce
    /// (context ids), one call for both (the smallest as the largest of the complements).
    pub(crate) fn allreduce_max_min(&mut self, comm: usize, mine: u32) -> Result<(u32, u32)> {
        let u32s = Layout::builtin(crate::Elem::Num(crate::Num::U32));
        let send = [mine, u32::MAX - mine];
        let mut agreed = [0u32; 2];
        let max = Op::Builtin(crate::Builtin::Max);
        // SAFETY: two u32s at each, borrowed for the call.
        unsafe {
            self.allreduce(
                Some(send.as_ptr().cast()),
                agreed.as_mut_ptr().cast(),
                2,
                &u32s,
                &max,
                comm,
                0,
            )
        }?;
        Ok((agreed[0], u32::MAX - agreed[1]))
    }

    /// Sends `mine` to every rank and gathers everyone's into `all` (equal sizes): the
    /// library's own allgather (communicator splits).
    pub(crate) fn allgather_bytes(
        &mut self,
        comm: usize,
        mine: &[u8],
        all: &mut [u8],
    ) -> Result<()> {
        let n = self.comm(comm)?.size() as usize;
        let r = self.comm(comm)?.rank() as usize;
        let len = mine.len();
        check(all.len() == n * len, Class::Intern, || {
            "allgather of unequal pieces".into()
        })?;
        let bytes = Layout::builtin(crate::Elem::Bytes {
            size: 1,
            bitwise: false,
        });
        let base = all.as_mut_ptr();
        let recv: Vec<Elems<'_>> = (0..n)
            .map(|i| Elems {
                ptr: base.wrapping_add(i * len),
                count: len,
                layout: &bytes,
            })
            .collect();
        let send = vec![Mpi::bytes(mine, &bytes); n];
        // SAFETY: `mine` and `all` are borrowed for the call; the pieces of `all` are
        // apart; this rank's own piece is copied.
        unsafe { self.exchange(&send, &recv, Some((send[r], recv[r])), comm) }
    }
}

/// Copies elements from `from` to `to` (a rank's own piece of a gather or scatter).
///
/// # Safety
///
/// `from` readable, `to` writable, apart.
unsafe fn copy_elems(from: Elems<'_>, to: Elems<'_>) -> Result<()> {
    let mut packed = Vec::new();
    // SAFETY: the caller's promise.
    unsafe { from.layout.pack(from.ptr, from.count, &mut packed) };
    let room = to.layout.bytes(to.count)?;
    check(packed.len() <= room, Class::Truncate, || {
        format!("a piece of {} bytes into room for {room}", packed.len())
    })?;
    // SAFETY: the caller's promise.
    unsafe { to.layout.unpack(&packed, to.ptr.cast_mut()) };
    Ok(())
}

/// Values whose bytes are all initialised and any bytes make a valid value (no padding,
/// no invalid bit patterns): sent and received as bytes by the collectives.
///
/// # Safety
///
/// Only for types with that property.
pub(crate) unsafe trait Plain: Copy {}
// SAFETY: integers and arrays of them have no padding and no invalid bit patterns.
unsafe impl Plain for u32 {}
// SAFETY: as above.
unsafe impl Plain for i64 {}
// SAFETY: as above.
unsafe impl Plain for [i64; 2] {}
// SAFETY: as above.
unsafe impl Plain for [u64; 3] {}

/// The bytes of plain values.
pub(crate) fn bytes_of<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `T: Plain` has every byte initialised; the bytes are read only, for as
    // long as `v` is borrowed.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

/// The bytes of plain values, writable.
pub(crate) fn bytes_of_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: `T: Plain` accepts any bytes; `v` is borrowed mutably for as long.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}
