//! `quiver.Job`: the process's place in its job (rank, size, node), its barrier, and
//! where endpoints are opened.

use pyo3::prelude::*;

use crate::endpoint::PyEndpoint;
use crate::errors::IntoPy;
use crate::ports::PyPorts;
use crate::tagged::PyTagged;
use crate::wait::on_helper_thread;

/// The process's membership in a job (``quiver.Job.from_env()``).
#[pyclass(module = "quiver", name = "Job", frozen)]
pub struct PyJob {
    pub job: quiver::Job,
    /// The two jobs, when this is a joint job (``Job.join``).
    pub joint: Option<quiver::JointJob>,
}

impl PyJob {
    fn joint(&self) -> PyResult<&quiver::JointJob> {
        self.joint
            .as_ref()
            .ok_or_else(|| {
                quiver::Error::Config(format!(
                    "job {} is not a joint job (Job.join makes one)",
                    self.job.job_id()
                ))
            })
            .py()
    }
}

#[pymethods]
impl PyJob {
    /// Joins the job this process was started in: by ``quiver run``, Open MPI's
    /// ``mpirun``, MPICH's Hydra or Slurm, configured by the ``QUIVER_*`` variables.
    /// Waits (interruptible) for the rendezvous store.
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<PyJob> {
        let job = on_helper_thread(py, "Job.from_env", quiver::Job::from_env)?.py()?;
        Ok(PyJob { job, joint: None })
    }

    /// This process's rank, ``0 .. size-1``.
    #[getter]
    fn rank(&self) -> u32 {
        self.job.rank()
    }

    /// Number of ranks in the job.
    #[getter]
    fn size(&self) -> u32 {
        self.job.size()
    }

    /// This rank's node id.
    #[getter]
    fn nid(&self) -> u32 {
        self.job.nid()
    }

    /// The job's id (shared by its ranks).
    #[getter]
    fn job_id(&self) -> u32 {
        self.job.job_id()
    }

    /// Number of nodes the job spans.
    #[getter]
    fn node_count(&self) -> usize {
        self.job.node_count()
    }

    /// What started the job (``"quiver run"``, ``"Open MPI (mpirun)"``, ...).
    #[getter]
    fn launcher(&self) -> String {
        self.job.launcher().to_string()
    }

    /// The node id of ``rank``.
    fn nid_of(&self, rank: u32) -> PyResult<u32> {
        self.job.nid_of(rank).py()
    }

    /// Waits until every rank has called ``barrier`` as often (through the rendezvous
    /// store: for set-up, not for speed). Ctrl-C interrupts the wait (the job's barriers
    /// are then out of step: end the job).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let job = self.job.clone();
        on_helper_thread(py, "Job.barrier", move || job.barrier())?.py()
    }

    /// Invites another job into a joint job with this one (every rank calls it and gets
    /// the same text): hand the text to the other job out of band; whoever holds it can
    /// join. Rank 0 serves the joint job's store from now on.
    fn invite(&self, py: Python<'_>) -> PyResult<String> {
        let job = self.job.clone();
        let inv = on_helper_thread(py, "Job.invite", move || job.invite())?.py()?;
        Ok(inv.to_string())
    }

    /// Joins the joint job of ``invitation`` (the text ``invite`` gave), as its host (the
    /// job that issued it) or its guest: every rank of both jobs calls it. The joint
    /// job's ranks are the host's, then the guest's (``rank_of``); open ports on it to
    /// reach the other job.
    fn join(&self, py: Python<'_>, invitation: &str) -> PyResult<PyJob> {
        let inv: quiver::Invitation = invitation.parse().py()?;
        let job = self.job.clone();
        let joint = on_helper_thread(py, "Job.join", move || job.join(&inv))?.py()?;
        Ok(PyJob {
            job: joint.job().clone(),
            joint: Some(joint),
        })
    }

    /// In a joint job: the joint rank of rank ``rank`` of job ``job_id``.
    fn rank_of(&self, job_id: u32, rank: u32) -> PyResult<u32> {
        self.joint()?.rank_of(job_id, rank).py()
    }

    /// In a joint job: who joint rank ``rank`` is, as ``(job_id, rank)``.
    fn member(&self, rank: u32) -> PyResult<(u32, u32)> {
        let joint = self.joint()?;
        joint
            .member(rank)
            .ok_or(quiver::Error::NoSuchRank {
                rank,
                size: self.job.size(),
            })
            .py()
    }

    /// Opens the Directed Point endpoint ``dpid`` of this rank (a DPID is open once per
    /// rank at a time). The endpoint belongs to the calling thread.
    fn open(&self, py: Python<'_>, dpid: u16) -> PyResult<Py<PyEndpoint>> {
        PyEndpoint::open(py, &self.job, dpid)
    }

    /// Opens the tagged endpoint ``dpid`` (every rank opens the same DPID); the same as
    /// ``quiver.Tagged(job, dpid)``. It belongs to the calling thread.
    fn tagged(&self, py: Python<'_>, dpid: u16) -> PyResult<Py<PyTagged>> {
        PyTagged::open(py, &self.job, dpid)
    }

    /// Opens GAMMA's ports on DPID ``dpid`` (every rank opens the same DPID); the same
    /// as ``quiver.Ports(job, dpid)``. They belong to the calling thread.
    fn ports(&self, py: Python<'_>, dpid: u16) -> PyResult<Py<PyPorts>> {
        PyPorts::open(py, &self.job, dpid)
    }

    /// This rank's one-sided endpoint on ``dpid`` (every rank opens the same DPID).
    fn rma(&self, py: Python<'_>, dpid: u16) -> PyResult<Py<crate::rma::PyRma>> {
        crate::rma::PyRma::open(py, &self.job, dpid)
    }

    fn __repr__(&self) -> String {
        format!(
            "Job(rank={}, size={}, nid={}, launcher={:?})",
            self.job.rank(),
            self.job.size(),
            self.job.nid(),
            self.job.launcher().to_string()
        )
    }
}
