//! The pull phase on another core (the Push-Pull seed's section 4.1): when the offload
//! engine runs (`QUIVER_RELIABILITY=offload`), same-node pulls of at least
//! [`MIN_OFFLOADED`] bytes are made by a thread of their own (pinned like the engine,
//! `QUIVER_OFFLOAD_CPU`), so a large transfer proceeds while the application computes.
//! The application thread hands a pull over and later collects its completion; the
//! receive completes (and the sender is told) at its next call into the tagged endpoint.

use crate::error::{Error, Result};
use crate::link::cma::{self, CmaError, Piece};
use std::sync::mpsc;
use std::thread::JoinHandle;

/// Smaller pulls are made by the application thread itself: handing one over costs a
/// few microseconds of thread wake-up, the copy of 64 KiB about as much.
pub(crate) const MIN_OFFLOADED: u64 = 64 << 10;

/// One pull: `len` bytes of process `pid` at `remote` into `dst`.
pub(crate) struct Job {
    pub op: u64,
    pub pid: u32,
    pub remote: Piece,
    /// Address of the destination in this process (valid until the job's completion is
    /// collected: the receive cannot complete before).
    pub dst: usize,
}

/// A finished pull.
pub(crate) struct Finished {
    pub op: u64,
    pub result: std::result::Result<(), CmaError>,
}

/// The pull thread and its two queues.
pub(crate) struct Puller {
    jobs: Option<mpsc::Sender<Job>>,
    finished: mpsc::Receiver<Finished>,
    thread: Option<JoinHandle<()>>,
    /// Jobs handed over and not collected.
    pub pending: usize,
}

impl Puller {
    pub(crate) fn start(cpu: Option<usize>) -> Result<Puller> {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (done_tx, finished) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("quiver-pull".into())
            .spawn(move || {
                if let Some(cpu) = cpu {
                    crate::engine::pin_current_thread(cpu);
                }
                for job in job_rx {
                    // SAFETY: `dst` and `remote.len` describe a receive buffer region that
                    // stays valid and untouched by the application until this job's
                    // completion is collected (the receive is not complete before).
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(job.dst as *mut u8, job.remote.len)
                    };
                    let result = cma::read_from(job.pid, &[job.remote], dst).map(|_| ());
                    if done_tx.send(Finished { op: job.op, result }).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| Error::io("spawning the pull thread", e))?;
        Ok(Puller {
            jobs: Some(jobs),
            finished,
            thread: Some(thread),
            pending: 0,
        })
    }

    pub(crate) fn submit(&mut self, job: Job) -> Result<()> {
        let sent = self.jobs.as_ref().map(|j| j.send(job));
        match sent {
            Some(Ok(())) => {
                self.pending += 1;
                Ok(())
            }
            _ => Err(Error::io(
                "pull thread",
                std::io::Error::other("the pull thread has stopped"),
            )),
        }
    }

    /// A finished pull, if any.
    pub(crate) fn try_finished(&mut self) -> Option<Finished> {
        let f = self.finished.try_recv().ok()?;
        self.pending -= 1;
        Some(f)
    }
}

impl Drop for Puller {
    fn drop(&mut self) {
        // Closing the job queue ends the thread once it has finished what it holds.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
