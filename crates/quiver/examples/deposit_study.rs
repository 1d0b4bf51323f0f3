//! The deposit seed's application study (E-D4, its Figures 11-14): two kernels over
//! each of the seed's three message-passing libraries on one `Rma`, which move data with
//! the same deposit and synchronize differently, with the time of every run split as
//! the seed splits it.
//!
//! - `pvm` (`quiver::rma::pvm`): buffered; the application gathers strided data into a
//!   contiguous block, packs it into a `SendBuffer` (a copy), the receiver unpacks it out
//!   of its system buffer (a copy) and scatters it; every message synchronizes its pair.
//! - `rrmsg` (`quiver::rma::rrmsg`): request, pull by the receiver, acknowledgement per
//!   transfer; contiguous blocks only, so gather at the sender and scatter at the
//!   receiver; the copy into its send buffer is its own.
//! - `dmsg` (as `quiver::rma::dmsg`): puts straight into the final place, strided where
//!   the layout is, barriers between phases and a congestion-control barrier every `r`
//!   rounds of an all-to-all. The loop is written here rather than calling
//!   `dmsg::alltoall_strided`, whose one strided layout per partner cannot express a
//!   b x b block transposed (it would need one step, with its two barriers, per column):
//!   here every partner gets one `put_strided` per source column inside one step with
//!   `dmsg`'s structure (barrier, permutation rounds, a flush and a barrier every `r`
//!   rounds, a flush and a barrier).
//!
//! Kernels (the seed's Appendix A.2):
//!
//! - `fft`: a 2D-FFT of an N x N single-precision complex matrix (8 bytes a value),
//!   column-major, columns distributed by block (b = N/P per rank): FFT of every local
//!   column, transpose (an all-to-all of b x b blocks), FFT of every local column,
//!   transpose back. The result is the 2-D DFT in the input's layout; rank 0 checks it
//!   against a serial 2-D FFT (columns, then rows) of the same input: max |diff| <=
//!   1e-3 max |value|.
//! - `sor`: 10 Jacobi iterations of a 5-point stencil (new = 0.25 ((up + down) +
//!   (left + right)), from a second buffer: Jacobi, not red-black) on an N x N f32 grid, rows
//!   distributed by block (row-major, b = N/P rows per rank), the global edges fixed. Each
//!   rank keeps a halo (overlap region) of 4 rows on each side, exchanged with its two
//!   neighbours (contiguous messages of 4 N f32) every 4 iterations; between exchanges
//!   it sweeps a region that shrinks by one row per side and iteration (4, 4, then 2
//!   iterations). Rank 0 checks the result against a serial run of the same sweeps: the
//!   same operations in the same order, so the values must be equal bit for bit.
//!
//! Phases per run (seconds): `compute` (the FFTs, the sweeps), `transfer` and `control`
//! (the libraries' `Phases`; for DMSG: puts and flushes, barriers), `gather_scatter`
//! (the application's copies of strided data into a contiguous block and out of one:
//! PVM and RRMSG in the FFT, and their local transposed copy of the block a rank keeps;
//! nil in SOR, whose messages are contiguous, and for DMSG, whose puts are strided),
//! `pack_unpack` (the libraries' `copy`: PVM's pack and unpack, RRMSG's copy into its
//! send buffer), `total` (the run's wall-clock time) and `comm` (`total - compute` on
//! each rank: communication and waiting for other ranks). Every figure is the maximum
//! over the ranks (`Rma::combine(ns, Combine::Max)`), each taken separately, so the
//! parts need not add up to `total`.
//!
//! Printed by rank 0: one JSON line per run (`--reps`, after one warm-up run that is
//! not printed; `r` and `tile` for DMSG's FFT). Every run starts after untimed barriers,
//! and the result is gathered to rank 0 and checked after it (untimed too).
//!
//! usage: quiver run -n P -- target/release/examples/deposit_study --kernel fft|sor
//!        --n N --lib pvm|rrmsg|dmsg [--reps R] [--r CC] [--tile T] [--chunk BYTES]
//!        target/release/examples/deposit_study --serial --kernel fft|sor --n N [--reps R]
//!
//! N must be divisible by P (fft: any P, the all-to-all's rounds are XOR pairings when P
//! is a power of two and shifts otherwise; sor: N/P >= 4). `--r`: DMSG's
//! congestion-control parameter (a barrier every r rounds; default P-1, none). `--tile`:
//! DMSG's FFT deposits T rows of a source column per strided put, tile by tile (default
//! N/P: one put per source column and partner), a friendlier order for the caches and
//! TLB of the target's side inside a node, more requests between nodes.
//! `--chunk`: PVM's system-buffer slot (default 65536 bytes). `--serial`: the kernel on
//! one core without quiver (the FFT's transposes are local copies, reported as
//! gather_scatter), the reference time; it needs no launcher.

use quiver::rma::pvm::{Pvm, SendBuffer};
use quiver::rma::rrmsg::Rrmsg;
use quiver::rma::{Combine, Phases, Rma, Strided, Window};
use quiver::Job;
use rustfft::num_complex::Complex;
use rustfft::{Fft, FftPlanner};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

type C32 = Complex<f32>;

const DPID: u16 = 9;
/// SOR: rows of overlap region on each side, and iterations.
const HALO: usize = 4;
const SOR_ITERS: usize = 10;
// Every phase of sweeps is even, so its result ends in the window (buffer 0).
const _: () = assert!(HALO.is_multiple_of(2) && (SOR_ITERS % HALO).is_multiple_of(2));
/// Side of the tiles of the local transposed copies.
const TILE: usize = 32;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Fft,
    Sor,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Pvm,
    Rrmsg,
    Dmsg,
}

pub struct Args {
    kernel: Kernel,
    n: usize,
    lib: Option<Lib>,
    reps: usize,
    r: Option<u32>,
    tile: Option<usize>,
    chunk: usize,
    serial: bool,
}

impl Args {
    /// A run of `kernel` at `n` with `lib` and the defaults (for tests).
    pub fn new(kernel: Kernel, n: usize, lib: Lib, reps: usize) -> Args {
        Args {
            kernel,
            n,
            lib: Some(lib),
            reps,
            r: None,
            tile: None,
            chunk: 65536,
            serial: false,
        }
    }
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "deposit_study: {msg}\nusage: deposit_study --kernel fft|sor --n N --lib pvm|rrmsg|dmsg \
         [--reps R] [--r CC] [--tile T] [--chunk BYTES]\n       deposit_study --serial --kernel fft|sor --n N [--reps R]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let (mut kernel, mut n, mut lib) = (None, None, None);
    let (mut reps, mut r, mut tile, mut chunk, mut serial) = (3, None, None, 65536, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--serial" {
            serial = true;
            continue;
        }
        let value = it
            .next()
            .unwrap_or_else(|| usage(&format!("{flag} needs a value")));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| usage(&format!("{flag} {value}: not a number")))
        };
        match flag.as_str() {
            "--kernel" => {
                kernel = Some(match value.as_str() {
                    "fft" => Kernel::Fft,
                    "sor" => Kernel::Sor,
                    _ => usage(&format!("unknown kernel {value}")),
                })
            }
            "--lib" => {
                lib = Some(match value.as_str() {
                    "pvm" => Lib::Pvm,
                    "rrmsg" => Lib::Rrmsg,
                    "dmsg" => Lib::Dmsg,
                    _ => usage(&format!("unknown library {value}")),
                })
            }
            "--n" => n = Some(number()),
            "--reps" => reps = number(),
            "--r" => r = Some(u32::try_from(number().max(1)).unwrap_or(u32::MAX)),
            "--tile" => tile = Some(number().max(1)),
            "--chunk" => chunk = number(),
            _ => usage(&format!("unknown option {flag}")),
        }
    }
    let kernel = kernel.unwrap_or_else(|| usage("--kernel is missing"));
    let n = n.unwrap_or_else(|| usage("--n is missing"));
    if n < 2 {
        usage("N must be at least 2");
    }
    if lib.is_none() && !serial {
        usage("--lib is missing");
    }
    Args {
        kernel,
        n,
        lib,
        reps,
        r,
        tile,
        chunk,
        serial,
    }
}

/// Where one run's time went, on one rank (or the maximum over ranks).
#[derive(Debug, Default, Clone, Copy)]
struct Breakdown {
    compute: Duration,
    transfer: Duration,
    control: Duration,
    gather_scatter: Duration,
    pack_unpack: Duration,
    total: Duration,
    /// `total - compute` on this rank: communication, waits for other ranks included.
    comm: Duration,
}

impl Breakdown {
    /// Adds what a library spent between two readings of its phases.
    fn add_lib(&mut self, before: Phases, after: Phases) {
        self.transfer += after.transfer - before.transfer;
        self.control += after.control - before.control;
        self.pack_unpack += after.copy - before.copy;
    }

    fn fields(&self) -> [(&'static str, Duration); 7] {
        [
            ("compute", self.compute),
            ("transfer", self.transfer),
            ("control", self.control),
            ("gather_scatter", self.gather_scatter),
            ("pack_unpack", self.pack_unpack),
            ("total", self.total),
            ("comm", self.comm),
        ]
    }
}

/// Adds the time `f` takes to `slot`.
fn timed<T>(slot: &mut Duration, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    *slot += t.elapsed();
    r
}

/// Values whose bytes are all meaningful and any bytes of which are a value: f32 and
/// complex f32 (`#[repr(C)]`, two f32, no padding).
///
/// # Safety
/// Implemented only for such types.
unsafe trait Plain: Copy {}
// SAFETY: 4 bytes, every bit pattern an f32.
unsafe impl Plain for f32 {}
// SAFETY: num_complex's Complex is #[repr(C)] { re, im }: two f32, no padding.
unsafe impl Plain for C32 {}

fn bytes<T: Plain>(v: &[T]) -> &[u8] {
    // SAFETY: `T: Plain` has no padding; the bytes are those of `v`, borrowed as long.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

fn bytes_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as `bytes`, and any bytes written are a `T` (`Plain`).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Values `at` of window `w` (counted in `T`s) as a slice.
///
/// # Safety
/// While the slice lives, no rank writes those values (other than through it) and no
/// other slice of them lives here: the kernels separate the phases in which other ranks
/// deposit into a window from those in which its owner reads or writes it by barriers
/// or by the libraries' own synchronization, and make one slice at a time.
#[allow(clippy::mut_from_ref)] // the window is memory shared with other ranks, not owned by the `&Window`
unsafe fn view<T: Plain>(w: &Window, at: Range<usize>) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(
        at.start <= at.end && at.end * size <= w.len(),
        "inside the window"
    );
    assert_eq!(w.as_ptr().align_offset(std::mem::align_of::<T>()), 0);
    // SAFETY: inside the window's mapping (checked), aligned (checked; it is
    // page-aligned), alive as long as `w`; any bytes are a `T` (`Plain`); exclusive by
    // the caller's contract.
    unsafe {
        std::slice::from_raw_parts_mut(w.as_ptr().cast::<T>().add(at.start), at.end - at.start)
    }
}

/// The input of the FFT: deterministic in (row, column), re and im in [-1, 1).
fn fft_input(i: usize, j: usize) -> C32 {
    let h = mix(((i as u64) << 32) | j as u64);
    C32::new(unit(h) * 2.0 - 1.0, unit(h >> 32) * 2.0 - 1.0)
}

/// The initial SOR grid (and its fixed edges): deterministic in (row, column), in [0, 1).
fn sor_input(i: usize, j: usize) -> f32 {
    unit(mix(((i as u64) << 32) | j as u64 | 1 << 63))
}

/// splitmix64's finalizer.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// 24 bits of `x` as a number in [0, 1).
fn unit(x: u64) -> f32 {
    (x & 0xff_ffff) as f32 / 16_777_216.0
}

/// `dst[dst_off + i * dst_ld + c] = src[src_off + c * src_ld + i]` for c, i in 0..b: a
/// b x b block transposed, by tiles.
fn transpose_block(
    src: &[C32],
    src_off: usize,
    src_ld: usize,
    dst: &mut [C32],
    dst_off: usize,
    dst_ld: usize,
    b: usize,
) {
    for c0 in (0..b).step_by(TILE) {
        for i0 in (0..b).step_by(TILE) {
            for c in c0..(c0 + TILE).min(b) {
                let s = &src[src_off + c * src_ld..];
                for i in i0..(i0 + TILE).min(b) {
                    dst[dst_off + i * dst_ld + c] = s[i];
                }
            }
        }
    }
}

/// Round `k` (1..p) of an all-to-all: the rank this one sends to and the rank it
/// receives from (DMSG's permutation rounds: XOR pairs when p is a power of two, else
/// shifts).
fn round(me: usize, k: usize, p: usize) -> (usize, usize) {
    if p.is_power_of_two() {
        (me ^ k, me ^ k)
    } else {
        ((me + k) % p, (me + p - k) % p)
    }
}

/// The library a run communicates with (opened once: its windows are collective).
enum Comm<'a> {
    Pvm(Pvm<'a>),
    Rrmsg(Rrmsg<'a>),
    Dmsg,
}

impl Comm<'_> {
    fn phases(&self) -> Phases {
        match self {
            Comm::Pvm(p) => p.phases(),
            Comm::Rrmsg(r) => r.phases(),
            Comm::Dmsg => Phases::default(),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Comm::Pvm(_) => "pvm",
            Comm::Rrmsg(_) => "rrmsg",
            Comm::Dmsg => "dmsg",
        }
    }
}

/// This rank, the job, the problem.
struct Ctx<'a> {
    rma: &'a Rma,
    me: usize,
    p: usize,
    n: usize,
    /// N / P: columns (FFT) or rows (SOR) per rank.
    b: usize,
    /// DMSG's congestion control: a barrier every `r` rounds.
    r: usize,
    /// DMSG's FFT: rows of a source column per strided put (1..=b).
    tile: usize,
}

/// Two untimed barriers before a run: the first waits for rank 0's check of the last
/// run (its slow ranks may fall asleep meanwhile), the second lines up ranks that are
/// awake, so that no rank's first wait counts another's wake-up.
fn start_together(ctx: &Ctx) -> quiver::Result<()> {
    ctx.rma.barrier()?;
    ctx.rma.barrier()
}

// ---------------------------------------------------------------- 2D-FFT

struct FftState {
    fft: Arc<dyn Fft<f32>>,
    scratch: Vec<C32>,
    /// This rank's b columns (column-major, N values each), and the transpose's other
    /// matrix; the whole result gathered on rank 0.
    a: Window,
    w: Window,
    gather: Window,
    /// The block to send, gathered (PVM, RRMSG), and the block received.
    sendbuf: Vec<C32>,
    recvbuf: Vec<C32>,
    reference: Option<Vec<C32>>,
}

impl FftState {
    fn open(ctx: &Ctx) -> quiver::Result<FftState> {
        let (n, b) = (ctx.n, ctx.b);
        let fft = FftPlanner::<f32>::new().plan_fft_forward(n);
        let scratch = vec![C32::default(); fft.get_inplace_scratch_len()];
        let a = ctx.rma.allocate(n * b * 8)?;
        let w = ctx.rma.allocate(n * b * 8)?;
        let gather = ctx.rma.allocate(if ctx.me == 0 { n * n * 8 } else { 64 })?;
        Ok(FftState {
            fft,
            scratch,
            a,
            w,
            gather,
            sendbuf: vec![C32::default(); b * b],
            recvbuf: vec![C32::default(); b * b],
            reference: None,
        })
    }
}

/// The 2-D DFT of the input computed serially another way: FFTs of the columns, then of
/// the rows (each copied out and back), no transpose.
fn fft_reference(n: usize, fft: &dyn Fft<f32>) -> Vec<C32> {
    let mut m: Vec<C32> = (0..n * n).map(|x| fft_input(x % n, x / n)).collect();
    let mut scratch = vec![C32::default(); fft.get_inplace_scratch_len()];
    fft.process_with_scratch(&mut m, &mut scratch);
    let mut row = vec![C32::default(); n];
    for i in 0..n {
        for (j, v) in row.iter_mut().enumerate() {
            *v = m[j * n + i];
        }
        fft.process_with_scratch(&mut row, &mut scratch);
        for (j, v) in row.iter().enumerate() {
            m[j * n + i] = *v;
        }
    }
    m
}

fn fft_close(got: &[C32], want: &[C32]) -> bool {
    let max = want.iter().map(|v| v.norm()).fold(0.0f32, f32::max);
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).norm())
        .fold(0.0f32, f32::max);
    got.len() == want.len() && diff.is_finite() && diff <= 1e-3 * max
}

fn fft_run(ctx: &Ctx, comm: &Comm, st: &mut FftState) -> quiver::Result<(Breakdown, bool)> {
    let (n, b, me) = (ctx.n, ctx.b, ctx.me);
    {
        // SAFETY: nobody deposits into `a` outside the transposes (the last one ended
        // with a barrier, and the gather only read it).
        let a = unsafe { view::<C32>(&st.a, 0..n * b) };
        for (lc, col) in a.chunks_exact_mut(n).enumerate() {
            for (i, v) in col.iter_mut().enumerate() {
                *v = fft_input(i, me * b + lc);
            }
        }
    }
    start_together(ctx)?;
    let mut bd = Breakdown::default();
    let before = comm.phases();
    let t0 = Instant::now();
    for (from, to) in [(&st.a, &st.w), (&st.w, &st.a)] {
        {
            // SAFETY: `from` is deposited into only by the previous transpose (ended
            // with a barrier, or by this rank's own receives) or not at all yet.
            let m = unsafe { view::<C32>(from, 0..n * b) };
            timed(&mut bd.compute, || {
                st.fft.process_with_scratch(m, &mut st.scratch)
            });
        }
        let bufs = (&mut st.sendbuf, &mut st.recvbuf);
        match comm {
            Comm::Dmsg => transpose_dmsg(ctx, from, to, &mut bd)?,
            Comm::Pvm(pvm) => transpose_pvm(ctx, pvm, from, to, bufs, &mut bd)?,
            Comm::Rrmsg(rr) => transpose_rrmsg(ctx, rr, from, to, bufs, &mut bd)?,
        }
    }
    bd.total = t0.elapsed();
    bd.add_lib(before, comm.phases());
    // The result to rank 0, untimed.
    {
        // SAFETY: the transposes are over (the last ended with a barrier or this rank's
        // receives); nobody writes `a` until the next run.
        let a = unsafe { view::<C32>(&st.a, 0..n * b) };
        ctx.rma
            .put(0, &st.gather, (me * b * n * 8) as u64, bytes(a))?;
    }
    ctx.rma.flush_all()?;
    ctx.rma.barrier()?;
    let verified = me != 0 || {
        let want = st
            .reference
            .get_or_insert_with(|| fft_reference(n, &*st.fft));
        // SAFETY: every rank's put is flushed and behind the barrier; none comes until
        // the next run's first barrier.
        let got = unsafe { view::<C32>(&st.gather, 0..n * n) };
        fft_close(got, want)
    };
    Ok((bd, verified))
}

/// DMSG's transpose: every block deposited transposed into its final place in `to` on
/// its rank, one strided put per source column (b values 8 bytes apart here, N * 8
/// bytes apart there) or, with `--tile T`, per T rows of a source column, tile by tile,
/// in permutation rounds between barriers.
fn transpose_dmsg(ctx: &Ctx, from: &Window, to: &Window, bd: &mut Breakdown) -> quiver::Result<()> {
    let (n, b, me, p, rma) = (ctx.n, ctx.b, ctx.me, ctx.p, ctx.rma);
    // SAFETY: ranks deposit into `to`, not `from`, during this transpose.
    let src = bytes(unsafe { view::<C32>(from, 0..n * b) });
    let deposit = |j: usize| -> quiver::Result<()> {
        for i0 in (0..b).step_by(ctx.tile) {
            let count = ctx.tile.min(b - i0);
            for lc in 0..b {
                // Rows j*b+i0.. of column lc land as row me*b+lc of rank j's columns
                // i0.. (8 bytes apart here, N * 8 there).
                let at = Strided {
                    offset: ((i0 * n + me * b + lc) * 8) as u64,
                    stride: (n * 8) as u64,
                    elem: 8,
                    count: count as u64,
                };
                rma.put_strided(j as u32, to, at, &src[(lc * n + j * b + i0) * 8..], 8)?;
            }
        }
        Ok(())
    };
    // Barrier A: every rank is done with `to`.
    timed(&mut bd.control, || rma.barrier())?;
    timed(&mut bd.transfer, || deposit(me))?;
    for k in 1..p {
        timed(&mut bd.transfer, || deposit(round(me, k, p).0))?;
        if k % ctx.r == 0 && k < p - 1 {
            timed(&mut bd.transfer, || rma.flush_all())?;
            timed(&mut bd.control, || rma.barrier())?;
        }
    }
    timed(&mut bd.transfer, || rma.flush_all())?;
    // Barrier B: every block is in place everywhere.
    timed(&mut bd.control, || rma.barrier())
}

/// `buf` = the b x b block of this rank's columns for rank `j` (rows j*b..), contiguous.
fn gather_block(src: &[C32], n: usize, b: usize, j: usize, buf: &mut [C32]) {
    for (lc, piece) in buf.chunks_exact_mut(b).enumerate() {
        piece.copy_from_slice(&src[lc * n + j * b..lc * n + j * b + b]);
    }
}

/// PVM's transpose: gather and send every block (sends do not wait), keep this rank's
/// own block by a local transposed copy, then receive, unpack and scatter every block.
fn transpose_pvm(
    ctx: &Ctx,
    pvm: &Pvm,
    from: &Window,
    to: &Window,
    (gbuf, rbuf): (&mut Vec<C32>, &mut Vec<C32>),
    bd: &mut Breakdown,
) -> quiver::Result<()> {
    let (n, b, me, p) = (ctx.n, ctx.b, ctx.me, ctx.p);
    // SAFETY: nobody deposits into these windows under PVM (messages go to its inbox).
    let (src, dst) = unsafe { (view::<C32>(from, 0..n * b), view::<C32>(to, 0..n * b)) };
    for k in 1..p {
        let j = round(me, k, p).0;
        timed(&mut bd.gather_scatter, || gather_block(src, n, b, j, gbuf));
        let mut message = SendBuffer::new();
        message.pack(bytes(gbuf));
        pvm.send(j as u32, message)?;
    }
    timed(&mut bd.gather_scatter, || {
        transpose_block(src, me * b, n, dst, me * b, n, b)
    });
    for k in 1..p {
        let j = round(me, k, p).1;
        let mut message = pvm.recv(j as u32)?;
        message.unpack(bytes_mut(rbuf))?;
        drop(message);
        timed(&mut bd.gather_scatter, || {
            transpose_block(rbuf, 0, b, dst, j * b, n, b)
        });
    }
    pvm.wait_sent()
}

/// RRMSG's transpose: in every round, the lower rank of each pair sends (gathered)
/// first and the other receives (then scatters) first, as `rrmsg`'s rendezvous needs.
fn transpose_rrmsg(
    ctx: &Ctx,
    rr: &Rrmsg,
    from: &Window,
    to: &Window,
    (gbuf, rbuf): (&mut Vec<C32>, &mut Vec<C32>),
    bd: &mut Breakdown,
) -> quiver::Result<()> {
    let (n, b, me, p) = (ctx.n, ctx.b, ctx.me, ctx.p);
    // SAFETY: nobody deposits into these windows under RRMSG (receivers pull).
    let (src, dst) = unsafe { (view::<C32>(from, 0..n * b), view::<C32>(to, 0..n * b)) };
    timed(&mut bd.gather_scatter, || {
        transpose_block(src, me * b, n, dst, me * b, n, b)
    });
    for k in 1..p {
        let (t, f) = round(me, k, p);
        let mut send = |bd: &mut Breakdown| -> quiver::Result<()> {
            timed(&mut bd.gather_scatter, || gather_block(src, n, b, t, gbuf));
            rr.send(t as u32, bytes(gbuf))
        };
        let mut recv = |bd: &mut Breakdown, dst: &mut [C32]| -> quiver::Result<()> {
            let len = rr.recv(f as u32, bytes_mut(rbuf))?;
            assert_eq!(len, b * b * 8, "an RRMSG block of the wrong length");
            timed(&mut bd.gather_scatter, || {
                transpose_block(rbuf, 0, b, dst, f * b, n, b)
            });
            Ok(())
        };
        if me < t {
            send(bd)?;
        }
        if f < me {
            recv(bd, dst)?;
        }
        if me > t {
            send(bd)?;
        }
        if f > me {
            recv(bd, dst)?;
        }
    }
    Ok(())
}

fn fft_serial(n: usize, reps: usize) {
    let fft = FftPlanner::<f32>::new().plan_fft_forward(n);
    let mut scratch = vec![C32::default(); fft.get_inplace_scratch_len()];
    let reference = fft_reference(n, &*fft);
    let mut m = vec![C32::default(); n * n];
    let mut t = vec![C32::default(); n * n];
    for rep in 0..=reps {
        for (x, v) in m.iter_mut().enumerate() {
            *v = fft_input(x % n, x / n);
        }
        let mut bd = Breakdown::default();
        let t0 = Instant::now();
        timed(&mut bd.compute, || {
            fft.process_with_scratch(&mut m, &mut scratch)
        });
        timed(&mut bd.gather_scatter, || {
            transpose_block(&m, 0, n, &mut t, 0, n, n)
        });
        timed(&mut bd.compute, || {
            fft.process_with_scratch(&mut t, &mut scratch)
        });
        timed(&mut bd.gather_scatter, || {
            transpose_block(&t, 0, n, &mut m, 0, n, n)
        });
        bd.total = t0.elapsed();
        bd.comm = bd.total - bd.compute;
        if rep > 0 {
            report(
                "fft",
                n,
                1,
                "serial",
                None,
                rep,
                &bd,
                fft_close(&m, &reference),
            );
        }
    }
}

// ---------------------------------------------------------------- SOR

struct SorState {
    /// This rank's rows with their halos: HALO rows from the rank above, b own rows,
    /// HALO rows from the rank below (row-major, N values each): Jacobi's buffer 0, which
    /// neighbours deposit into, and buffer 1.
    s: Window,
    next: Vec<f32>,
    gather: Window,
    reference: Option<Vec<f32>>,
}

impl SorState {
    fn rows(ctx: &Ctx) -> usize {
        ctx.b + 2 * HALO
    }

    fn open(ctx: &Ctx) -> quiver::Result<SorState> {
        let n = ctx.n;
        let s = ctx.rma.allocate(Self::rows(ctx) * n * 4)?;
        let gather = ctx.rma.allocate(if ctx.me == 0 { n * n * 4 } else { 64 })?;
        Ok(SorState {
            s,
            next: vec![0.0; Self::rows(ctx) * n],
            gather,
            reference: None,
        })
    }
}

/// One Jacobi sweep of rows `rows` of an N-wide row-major grid, columns 1..N-1, from
/// `cur` into `next`: the one formula of both the distributed and the serial runs.
fn sweep(cur: &[f32], next: &mut [f32], n: usize, rows: Range<usize>) {
    for l in rows {
        let (up, mid, down) = (&cur[(l - 1) * n..], &cur[l * n..], &cur[(l + 1) * n..]);
        let out = &mut next[l * n..(l + 1) * n];
        for c in 1..n - 1 {
            out[c] = 0.25 * ((up[c] + down[c]) + (mid[c - 1] + mid[c + 1]));
        }
    }
}

fn sor_reference(n: usize) -> Vec<f32> {
    let mut cur: Vec<f32> = (0..n * n).map(|x| sor_input(x / n, x % n)).collect();
    let mut next = cur.clone();
    for _ in 0..SOR_ITERS {
        sweep(&cur, &mut next, n, 1..n - 1);
        std::mem::swap(&mut cur, &mut next);
    }
    cur
}

fn sor_run(ctx: &Ctx, comm: &Comm, st: &mut SorState) -> quiver::Result<(Breakdown, bool)> {
    let (n, b, me) = (ctx.n, ctx.b, ctx.me);
    let rows = SorState::rows(ctx);
    // Local row l is global row me*b + l - HALO; the interior (updated) rows are global
    // 1..n-1.
    let first = (HALO + 1).saturating_sub(me * b);
    let end = (n - 1 + HALO).saturating_sub(me * b).min(rows);
    {
        // SAFETY: nobody deposits into `s` outside the exchanges (the last one ended
        // with a barrier or this rank's own receives).
        let cur = unsafe { view::<f32>(&st.s, 0..rows * n) };
        for (l, row) in cur.chunks_exact_mut(n).enumerate() {
            let g = (me * b + l).checked_sub(HALO).filter(|&g| g < n);
            for (c, v) in row.iter_mut().enumerate() {
                *v = g.map_or(0.0, |g| sor_input(g, c));
            }
        }
        st.next.copy_from_slice(cur);
    }
    start_together(ctx)?;
    let mut bd = Breakdown::default();
    let before = comm.phases();
    let t0 = Instant::now();
    let mut done = 0;
    while done < SOR_ITERS {
        let sweeps = HALO.min(SOR_ITERS - done);
        match comm {
            Comm::Dmsg => exchange_dmsg(ctx, &st.s, &mut bd)?,
            Comm::Pvm(pvm) => exchange_pvm(ctx, pvm, &st.s)?,
            Comm::Rrmsg(rr) => exchange_rrmsg(ctx, rr, &st.s)?,
        }
        // SAFETY: the exchange is over (a barrier, or this rank's receives); the next
        // one starts after these sweeps.
        let cur = unsafe { view::<f32>(&st.s, 0..rows * n) };
        let next = &mut st.next;
        timed(&mut bd.compute, || {
            // Sweep t is valid on the rows t away from the halo's outer edge.
            for t in 1..=sweeps {
                let region = first.max(t)..end.min(rows - t);
                if t % 2 == 1 {
                    sweep(cur, next, n, region);
                } else {
                    sweep(next, cur, n, region);
                }
            }
        });
        done += sweeps;
    }
    bd.total = t0.elapsed();
    bd.add_lib(before, comm.phases());
    {
        // SAFETY: as for the sweeps; nobody writes `s` until the next run.
        let own = unsafe { view::<f32>(&st.s, HALO * n..(HALO + b) * n) };
        ctx.rma
            .put(0, &st.gather, (me * b * n * 4) as u64, bytes(own))?;
    }
    ctx.rma.flush_all()?;
    ctx.rma.barrier()?;
    let verified = me != 0 || {
        let want = st.reference.get_or_insert_with(|| sor_reference(n));
        // SAFETY: every rank's put is flushed and behind the barrier.
        let got = unsafe { view::<f32>(&st.gather, 0..n * n) };
        got.iter()
            .zip(want.iter())
            .all(|(a, b)| a.to_bits() == b.to_bits())
    };
    Ok((bd, verified))
}

/// The rows this rank sends up (its first HALO) and down (its last HALO), and the halos
/// that the rank above and the rank below fill.
fn halo_rows(ctx: &Ctx) -> [Range<usize>; 4] {
    let (n, b) = (ctx.n, ctx.b);
    [
        HALO * n..2 * HALO * n,
        b * n..(b + HALO) * n,
        0..HALO * n,
        (HALO + b) * n..(2 * HALO + b) * n,
    ]
}

/// DMSG's exchange: a barrier (the neighbours are done with their halos), the rows put
/// straight into the neighbours' halos, a flush, a barrier.
fn exchange_dmsg(ctx: &Ctx, s: &Window, bd: &mut Breakdown) -> quiver::Result<()> {
    let (me, p, rma) = (ctx.me, ctx.p, ctx.rma);
    let [up, down, _, below] = halo_rows(ctx);
    timed(&mut bd.control, || rma.barrier())?;
    timed(&mut bd.transfer, || -> quiver::Result<()> {
        if me > 0 {
            // SAFETY: neighbours deposit into this rank's halos only, not its own rows.
            let rows = unsafe { view::<f32>(s, up) };
            rma.put(me as u32 - 1, s, (below.start * 4) as u64, bytes(rows))?;
        }
        if me + 1 < p {
            // SAFETY: as above.
            let rows = unsafe { view::<f32>(s, down) };
            rma.put(me as u32 + 1, s, 0, bytes(rows))?;
        }
        rma.flush_all()
    })?;
    timed(&mut bd.control, || rma.barrier())
}

/// PVM's exchange: pack and send both boundaries (no waiting), receive and unpack both
/// halos.
fn exchange_pvm(ctx: &Ctx, pvm: &Pvm, s: &Window) -> quiver::Result<()> {
    let (me, p) = (ctx.me, ctx.p);
    let [up, down, above, below] = halo_rows(ctx);
    for (to, rows) in [
        (me.checked_sub(1), up),
        ((me + 1 < p).then_some(me + 1), down),
    ] {
        if let Some(to) = to {
            // SAFETY: nobody deposits into this window under PVM.
            let rows = unsafe { view::<f32>(s, rows) };
            let mut message = SendBuffer::new();
            message.pack(bytes(rows));
            pvm.send(to as u32, message)?;
        }
    }
    for (from, rows) in [
        (me.checked_sub(1), above),
        ((me + 1 < p).then_some(me + 1), below),
    ] {
        if let Some(from) = from {
            // SAFETY: as above.
            let halo = unsafe { view::<f32>(s, rows) };
            pvm.recv(from as u32)?.unpack(bytes_mut(halo))?;
        }
    }
    pvm.wait_sent()
}

/// RRMSG's exchange: pairs (2k, 2k+1), then (2k+1, 2k+2); the lower rank of a pair
/// sends first, the receiver pulls straight into its halo.
fn exchange_rrmsg(ctx: &Ctx, rr: &Rrmsg, s: &Window) -> quiver::Result<()> {
    let (me, p) = (ctx.me, ctx.p);
    let [up, down, above, below] = halo_rows(ctx);
    for parity in 0..2 {
        let lower = me % 2 == parity;
        let partner = if lower {
            (me + 1 < p).then_some(me + 1)
        } else {
            me.checked_sub(1)
        };
        let Some(j) = partner else { continue };
        let (out, into) = if j > me {
            (down.clone(), below.clone())
        } else {
            (up.clone(), above.clone())
        };
        // SAFETY: nobody deposits into this window under RRMSG (receivers pull), and
        // the two slices are used one after the other.
        let send = || rr.send(j as u32, bytes(unsafe { view::<f32>(s, out.clone()) }));
        // SAFETY: as above.
        let recv = || rr.recv(j as u32, bytes_mut(unsafe { view::<f32>(s, into.clone()) }));
        if lower {
            send()?;
            recv()?;
        } else {
            recv()?;
            send()?;
        }
    }
    Ok(())
}

fn sor_serial(n: usize, reps: usize) {
    let reference = sor_reference(n);
    for rep in 0..=reps {
        let mut cur: Vec<f32> = (0..n * n).map(|x| sor_input(x / n, x % n)).collect();
        let mut next = cur.clone();
        let mut bd = Breakdown::default();
        let t0 = Instant::now();
        timed(&mut bd.compute, || {
            for _ in 0..SOR_ITERS {
                sweep(&cur, &mut next, n, 1..n - 1);
                std::mem::swap(&mut cur, &mut next);
            }
        });
        bd.total = t0.elapsed();
        bd.comm = bd.total - bd.compute;
        if rep > 0 {
            let ok = cur
                .iter()
                .zip(&reference)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            report("sor", n, 1, "serial", None, rep, &bd, ok);
        }
    }
}

// ---------------------------------------------------------------- driver

#[allow(clippy::too_many_arguments)]
fn report(
    kernel: &str,
    n: usize,
    ranks: usize,
    lib: &str,
    dmsg_fft: Option<(usize, usize)>,
    rep: usize,
    bd: &Breakdown,
    verified: bool,
) {
    let mut line = format!(
        "{{\"bench\":\"deposit\",\"kernel\":\"{kernel}\",\"n\":{n},\"ranks\":{ranks},\"lib\":\"{lib}\",\"rep\":{rep}"
    );
    if let Some((r, tile)) = dmsg_fft {
        line += &format!(",\"r\":{r},\"tile\":{tile}");
    }
    for (name, d) in bd.fields() {
        line += &format!(",\"{name}\":{:.6}", d.as_secs_f64());
    }
    line += &format!(",\"verified\":{verified}}}");
    println!("{line}");
}

fn main() -> quiver::Result<()> {
    let args = parse_args();
    if args.serial {
        match args.kernel {
            Kernel::Fft => fft_serial(args.n, args.reps),
            Kernel::Sor => sor_serial(args.n, args.reps),
        }
        return Ok(());
    }
    let job = Job::from_env()?;
    match study(&job, &args, true) {
        Err(quiver::Error::Config(msg)) => usage(&msg),
        r => r.map(drop),
    }
}

/// Runs `args` (not serial) on `job`: one warm-up, then `args.reps` runs; rank 0 prints
/// each run's line when `print`. Returns whether every run's result matched the serial
/// computation (checked on rank 0; true on the others).
pub fn study(job: &Job, args: &Args, print: bool) -> quiver::Result<bool> {
    let kname = match args.kernel {
        Kernel::Fft => "fft",
        Kernel::Sor => "sor",
    };
    let mut all_verified = true;
    let (me, p, n) = (job.rank() as usize, job.size() as usize, args.n);
    let bad = |msg: String| Err(quiver::Error::Config(msg));
    if !n.is_multiple_of(p) {
        return bad(format!("N = {n} is not divisible by the {p} ranks"));
    }
    let b = n / p;
    if args.kernel == Kernel::Sor && b < HALO {
        return bad(format!(
            "SOR needs at least {HALO} rows per rank (N/P = {b})"
        ));
    }
    let rma = Rma::open(job, DPID)?;
    rma.set_wait(job.config().wait);
    let ctx = Ctx {
        rma: &rma,
        me,
        p,
        n,
        b,
        r: args.r.map_or(p.saturating_sub(1), |r| r as usize).max(1),
        tile: args.tile.unwrap_or(b).min(b),
    };
    // Collective allocations, in one order everywhere: the kernel's windows, then the
    // library's. The longest message: a b x b block (FFT), HALO rows (SOR).
    enum State {
        Fft(Box<FftState>),
        Sor(SorState),
    }
    let (mut state, longest) = match args.kernel {
        Kernel::Fft => (State::Fft(Box::new(FftState::open(&ctx)?)), b * b * 8),
        Kernel::Sor => (State::Sor(SorState::open(&ctx)?), HALO * n * 4),
    };
    let comm = match args.lib.expect("checked") {
        Lib::Pvm => Comm::Pvm(Pvm::open(&rma, args.chunk)?),
        Lib::Rrmsg => Comm::Rrmsg(Rrmsg::open(&rma, longest)?),
        Lib::Dmsg => Comm::Dmsg,
    };
    job.barrier_progressing(&[&rma])?;
    // DMSG's congestion control and tiles apply to the FFT's all-to-all only.
    let dmsg_fft =
        (matches!(comm, Comm::Dmsg) && args.kernel == Kernel::Fft).then_some((ctx.r, ctx.tile));
    for rep in 0..=args.reps {
        let (mut bd, verified) = match &mut state {
            State::Fft(st) => fft_run(&ctx, &comm, st)?,
            State::Sor(st) => sor_run(&ctx, &comm, st)?,
        };
        bd.comm = bd.total.saturating_sub(bd.compute);
        all_verified &= verified;
        if rep == 0 {
            continue; // the warm-up
        }
        // Every figure: the slowest rank's.
        let mut max = Breakdown::default();
        for (slot, (_, mine)) in [
            &mut max.compute,
            &mut max.transfer,
            &mut max.control,
            &mut max.gather_scatter,
            &mut max.pack_unpack,
            &mut max.total,
            &mut max.comm,
        ]
        .into_iter()
        .zip(bd.fields())
        {
            *slot = Duration::from_nanos(rma.combine(mine.as_nanos() as u64, Combine::Max)?);
        }
        if me == 0 && print {
            report(kname, n, p, comm.name(), dmsg_fft, rep, &max, verified);
        }
    }
    rma.barrier()?;
    Ok(all_verified)
}
