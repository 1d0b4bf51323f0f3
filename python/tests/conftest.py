"""What the Python tests share: starting real jobs (``quiver run``, Open MPI's
``mpirun``, MPICH's ``mpiexec.hydra``, ``srun`` on a Slurm of the session's own) under a
deadline, and the rule for tests that need a tool this machine may
lack (skip with one line saying why; fail instead under CI, ``QUIVER_CI`` set).
"""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RANKS = HERE / "ranks.py"
EXAMPLES = REPO / "examples" / "python"

#: Deadline of one job on a loaded two-core machine.
LIMIT = 240

#: Prefixes of the test's own environment variables that would change what a job does
#: (its configuration, or a launcher's variables that would make it think it is a rank).
CLEAN_PREFIXES = ("QUIVER_", "OMPI_", "PMI_", "PMIX_", "SLURM_", "MPI_LOCAL")


def cannot_run(why):
    """Skips the test with one line saying why; under CI (QUIVER_CI set), which installs
    every tool, fails instead, so that CI never passes a test it did not run."""
    if os.environ.get("QUIVER_CI"):
        pytest.fail(f"{why} (QUIVER_CI is set: CI must run this test)")
    pytest.skip(why)


def quiver_bin():
    """The `quiver` command: $QUIVER_BIN, the repository's release build, or PATH."""
    for cand in (os.environ.get("QUIVER_BIN"), REPO / "target" / "release" / "quiver",
                 shutil.which("quiver")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return str(cand)
    cannot_run("the quiver command is not built (cargo build --release -p quiver-cli, "
               "or set QUIVER_BIN)")


def environment(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Job:
    """A finished job: its status and output."""

    def __init__(self, argv, returncode, stdout, stderr):
        self.argv, self.returncode, self.stdout, self.stderr = argv, returncode, stdout, stderr

    def describe(self):
        return (f"{' '.join(map(str, self.argv))}: status {self.returncode}\n"
                f"--- stdout:\n{self.stdout}\n--- stderr:\n{self.stderr}")

    def expect_pass(self, scenarios, ranks=2):
        assert self.returncode == 0, self.describe()
        for name in scenarios:
            for r in range(ranks):
                assert f"PASS {name} rank {r}" in self.stdout, self.describe()


def run(argv, env=None, limit=LIMIT):
    """Runs `argv` in a process group of its own; past `limit` seconds the group is
    killed and the test fails with what it printed."""
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=environment(env), start_new_session=True,
                         stdin=subprocess.DEVNULL)
    try:
        out, err = p.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        pytest.fail(Job(argv, "killed", out, err).describe() + f"\nstill ran after {limit} s")
    return Job(argv, p.returncode, out, err)


def quiver_run(n, program, *args, env=None, limit=LIMIT):
    """`quiver run -n N python3 PROGRAM ARGS` (this interpreter)."""
    argv = [quiver_bin(), "run", "-n", str(n), "--timeout", str(limit - 10), "--",
            sys.executable, str(program), *map(str, args)]
    return run(argv, env, limit)


def open_mpi():
    """Open MPI's `mpirun`, or why it cannot be used (`mpirun.openmpi` first: with MPICH
    installed too, `mpirun` may be Hydra's)."""
    mpirun = shutil.which("mpirun.openmpi") or shutil.which("mpirun")
    if not mpirun:
        return None, "mpirun is not installed (install openmpi-bin)"
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    if "Open MPI" not in out.stdout + out.stderr and "OpenRTE" not in out.stdout + out.stderr:
        return None, f"{mpirun} is not Open MPI's"
    return mpirun, None


def mpirun(n, program, *args, limit=LIMIT):
    """`mpirun -n N python3 PROGRAM ARGS` as a user starts it: no QUIVER_* variable, the
    ranks meet through Open MPI's PMIx service."""
    path, why = open_mpi()
    if path is None:
        cannot_run(why)
    argv = [path, "--allow-run-as-root", "--oversubscribe", "-n", str(n),
            "-x", "PYTHONUNBUFFERED=1",
            sys.executable, str(program), *map(str, args)]
    return run(argv, None, limit)


def mpiexec_hydra(n, program, *args, limit=LIMIT):
    """`mpiexec.hydra -n N python3 PROGRAM ARGS` (MPICH): the ranks meet through PMI."""
    path = shutil.which("mpiexec.hydra")
    if path is None:
        cannot_run("MPICH's mpiexec.hydra is not installed (install mpich)")
    return run([path, "-n", str(n), sys.executable, str(program), *map(str, args)], None,
               limit)


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """A single-node Slurm of the session's own (tests/slurm-single-node.sh); yields a
    function that runs `srun --mpi=MPI -n N python3 PROGRAM ARGS`."""
    if os.geteuid() != 0:
        cannot_run("starting a Slurm of the test's own needs root")
    script = REPO / "tests" / "slurm-single-node.sh"
    d = tmp_path_factory.mktemp("slurm") / "node"
    out = subprocess.run([str(script), "start", str(d)], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        cannot_run(f"no Slurm for the test: {out.stderr.strip()}")
    conf = out.stdout.strip()

    def srun(mpi, n, program, *args, limit=LIMIT):
        argv = [shutil.which("srun") or "srun", f"--mpi={mpi}", "-n", str(n),
                sys.executable, str(program), *map(str, args)]
        return run(argv, {"SLURM_CONF": conf}, limit)

    yield srun
    subprocess.run([str(script), "stop", str(d)], stdin=subprocess.DEVNULL)


class Streaming:
    """A job whose output is read line by line while it runs (for signals)."""

    def __init__(self, n, program, *args, env=None):
        self.argv = [quiver_bin(), "run", "-n", str(n), "--timeout", str(LIMIT - 10), "--",
                     sys.executable, str(program), *map(str, args)]
        self.p = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  env=environment(env), start_new_session=True,
                                  stdin=subprocess.DEVNULL, bufsize=1)
        self.lines = []
        self.deadline = time.monotonic() + LIMIT

    def wait_for(self, marker):
        """The first line from now on that contains `marker`, and when it was read."""
        while True:
            if time.monotonic() > self.deadline:
                self.kill()
                pytest.fail(f"no line with {marker!r} in time:\n" + "".join(self.lines))
            line = self.p.stdout.readline()
            if not line:
                self.p.wait()
                pytest.fail(f"the job ended before {marker!r}:\n" + "".join(self.lines))
            self.lines.append(line)
            if marker in line:
                return line, time.monotonic()

    def finish(self):
        # Read through the text stream (which may hold lines already): the job's own
        # --timeout bounds the wait.
        self.lines.append(self.p.stdout.read())
        self.p.wait()
        return Job(self.argv, self.p.returncode, "".join(self.lines), "")

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
