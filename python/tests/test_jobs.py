"""The Python package in real jobs: two ranks started by ``quiver run`` (and by Open MPI's
``mpirun``) run the scenarios of ``ranks.py``, which check every byte they receive; the
tests here check that each rank passed, and drive what needs an outside hand (Ctrl-C).
"""

import os
import re
import signal
import time

import pytest

from conftest import EXAMPLES, RANKS, Streaming, mpiexec_hydra, mpirun, quiver_run


@pytest.mark.parametrize("transport", ["shm", "shm-no-cma", "udp"])
def test_arrays_of_every_dtype_and_size(transport):
    """numpy arrays of 8 dtypes, 0 B to 6 MiB, both directions, byte for byte, over
    shared memory (pulled by cross-memory attach or by request) and UDP."""
    env = {"shm": {}, "shm-no-cma": {"QUIVER_CMA": "off"},
           "udp": {"QUIVER_TRANSPORT": "udp"}}[transport]
    quiver_run(2, RANKS, "arrays", env=env).expect_pass(["arrays"])


@pytest.mark.parametrize("transport", ["shm", "udp", "udp-offload"])
def test_ports(transport):
    """GAMMA's ports: handlers that answer, plain ports, a broadcast, errors to the
    error handler and a handler's exception raised by the next call; with the offload
    engine the handlers of network messages run on its thread, taking the GIL."""
    env = {"shm": {}, "udp": {"QUIVER_TRANSPORT": "udp"},
           "udp-offload": {"QUIVER_TRANSPORT": "udp", "QUIVER_RELIABILITY": "offload"}}
    quiver_run(2, RANKS, "ports", env=env[transport]).expect_pass(["ports"])


@pytest.mark.parametrize("transport", ["shm", "shm-no-cma", "udp", "udp-offload"])
def test_rma(transport):
    """One-sided operations on windows: puts and gets of bytes and numpy arrays up to
    3 MiB both ways, atomics from both ranks, strided and indexed layouts, a put that
    counts, typed errors, the collective free; over shared memory and UDP (with the
    offload engine serving requests on its thread)."""
    env = {"shm": {}, "shm-no-cma": {"QUIVER_CMA": "off"}, "udp": {"QUIVER_TRANSPORT": "udp"},
           "udp-offload": {"QUIVER_TRANSPORT": "udp", "QUIVER_RELIABILITY": "offload"}}
    quiver_run(2, RANKS, "rma", env=env[transport]).expect_pass(["rma"])


@pytest.mark.parametrize("transport", ["shm", "udp"])
def test_two_jobs_in_a_joint_job(transport, tmp_path):
    """Two jobs started apart: the first invites, the second joins with the text it
    wrote to a file; ports of each reach the other's ranks."""
    import subprocess
    import threading
    path = tmp_path / "invitation"
    base = {} if transport == "shm" else {"QUIVER_TRANSPORT": "udp"}
    results = {}

    def start(role):
        env = dict(base, QUIVER_TEST_ROLE=role, QUIVER_TEST_INVITATION=str(path))
        results[role] = quiver_run(2, RANKS, "joint", env=env)

    threads = [threading.Thread(target=start, args=(r,)) for r in ("host", "guest")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for role in ("host", "guest"):
        results[role].expect_pass(["joint"])


def test_pickled_objects():
    quiver_run(2, RANKS, "objects").expect_pass(["objects"])


def test_nonblocking_requests():
    quiver_run(2, RANKS, "nonblocking").expect_pass(["nonblocking"])


def test_probe():
    quiver_run(2, RANKS, "probe").expect_pass(["probe"])


def test_cancel():
    quiver_run(2, RANKS, "cancel").expect_pass(["cancel"])


def test_synchronous_sends():
    quiver_run(2, RANKS, "synchronous").expect_pass(["synchronous"])


def test_errors_are_typed():
    quiver_run(2, RANKS, "errors").expect_pass(["errors"])


def test_endpoint_api():
    quiver_run(2, RANKS, "endpoint").expect_pass(["endpoint"])


def test_blocking_calls_release_the_gil():
    quiver_run(2, RANKS, "threads").expect_pass(["threads"])


def test_ctrl_c_interrupts_blocking_calls():
    """SIGINT to a rank blocked in Recv, Probe and Request.wait raises KeyboardInterrupt
    within a second each (the wait's slice is 50 ms); the rank then goes on using its
    endpoint, and the abandoned receive never wrote its buffer (checked by the rank)."""
    job = Streaming(2, RANKS, "interrupt")
    try:
        for what in ("Recv", "Probe", "wait"):
            line, _ = job.wait_for(f"BLOCKED {what} ")
            pid = int(re.search(r"pid=(\d+)", line).group(1))
            time.sleep(0.3)  # well inside the call by now
            sent = time.monotonic()
            os.kill(pid, signal.SIGINT)
            _, seen = job.wait_for(f"INTERRUPTED {what} ")
            assert seen - sent < 1.0, f"{what}: KeyboardInterrupt after {seen - sent:.3f} s"
        done = job.finish()
    finally:
        job.kill()
    done.expect_pass(["interrupt"])


def test_hello_example():
    job = quiver_run(3, EXAMPLES / "hello.py")
    assert job.returncode == 0, job.describe()
    for r in range(3):
        assert f"hello from rank {r} of 3" in job.stdout, job.describe()
    assert "the greeting came back through [0, 1, 2]" in job.stdout, job.describe()


def test_pingpong_example():
    job = quiver_run(2, EXAMPLES / "pingpong.py", "--sizes", "0,8,1K,1M", "--iters", "200",
                     "--warmup", "20")
    assert job.returncode == 0, job.describe()
    rows = re.findall(r"^\[0\]\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s*$", job.stdout, re.M)
    assert [int(r[0]) for r in rows] == [0, 8, 1024, 1 << 20], job.describe()
    assert all(0 < float(r[2]) <= float(r[1]) for r in rows), job.describe()


def test_under_mpirun():
    """The same scenarios under Open MPI's mpirun."""
    job = mpirun(2, RANKS, "arrays", "objects", "nonblocking", "probe")
    job.expect_pass(["arrays", "objects", "nonblocking", "probe"])


PINGPONG = (EXAMPLES / "pingpong.py", "--sizes", "8,64K", "--iters", "200", "--warmup",
            "20", "--json")


def pingpong_ran(job):
    assert job.returncode == 0, job.describe()
    assert job.stdout.count('"bench": "pingpong"') == 2, job.describe()


def test_pingpong_under_mpirun():
    """`mpirun -n 2 python3 examples/python/pingpong.py` with no configuration (PMIx)."""
    pingpong_ran(mpirun(2, *PINGPONG))


def test_pingpong_under_mpiexec_hydra():
    """The same under MPICH's Hydra (PMI-2)."""
    pingpong_ran(mpiexec_hydra(2, *PINGPONG))


@pytest.mark.parametrize("mpi", ["pmix", "pmi2"])
def test_pingpong_under_srun(slurm, mpi):
    """The same under `srun --mpi=pmix` and `--mpi=pmi2`."""
    pingpong_ran(slurm(mpi, 2, *PINGPONG))
