"""What needs no job: the package's names, its exceptions, statuses, stubs, and the
error outside a job."""

import subprocess
import sys
from pathlib import Path

import quiver
from conftest import environment


def test_names_of_mpi4py():
    assert quiver.ANY_SOURCE == -1 and quiver.ANY_TAG == -1
    assert quiver.UNDEFINED == -32766
    for name in ("Send", "Recv", "Isend", "Irecv", "Ssend", "Issend", "Probe", "Iprobe",
                 "send", "recv", "isend", "irecv", "ssend", "issend", "close", "__enter__",
                 "__exit__", "Get_rank", "Get_size"):
        assert callable(getattr(quiver.Tagged, name)), name
    for name in ("Wait", "wait", "Test", "test", "Cancel", "cancel", "Waitall", "waitall",
                 "Waitany", "waitany"):
        assert callable(getattr(quiver.Request, name)), name
    assert quiver.__version__


def test_exception_hierarchy():
    errors = [getattr(quiver, n) for n in quiver.__all__
              if isinstance(getattr(quiver, n), type)
              and issubclass(getattr(quiver, n), BaseException)]
    assert len(errors) >= 18
    for e in errors:
        assert issubclass(e, quiver.Error) and e.__module__ == "quiver", e
    assert issubclass(quiver.TimeoutError, TimeoutError)
    assert issubclass(quiver.RankError, ValueError)
    assert issubclass(quiver.IoError, OSError)
    assert not issubclass(quiver.Error, (ValueError, OSError))
    # Every class of quiver._errors is listed, and re-exported.
    defined = {n for n, v in vars(quiver._errors).items()
               if isinstance(v, type) and issubclass(v, quiver.Error)}
    assert defined == set(quiver._errors.__all__) <= set(quiver.__all__)


def test_status():
    s = quiver.Status()
    assert (s.source, s.tag, s.count, s.cancelled) == (-1, -1, 0, False)
    s.source, s.tag, s.count = 3, 4, 5
    assert (s.Get_source(), s.Get_tag(), s.Get_count(), s.Is_cancelled()) == (3, 4, 5, False)
    assert "count=5" in repr(s)
    t = quiver.Status()
    assert s != t
    t.source, t.tag, t.count = 3, 4, 5
    assert s == t


def test_source():
    assert quiver.Source(1, 2) == quiver.Source(1, 2)
    assert quiver.Source(1, 2) != quiver.Source(2, 1)
    assert len({quiver.Source(1, 2), quiver.Source(1, 2)}) == 1


def test_outside_a_job_the_error_says_what_to_do():
    """A program started without a launcher gets quiver.ConfigError naming the fix (in a
    child, so that this process's environment stays as it is)."""
    code = ("import quiver\n"
            "try:\n"
            "    quiver.Job.from_env()\n"
            "except quiver.ConfigError as e:\n"
            "    print('ConfigError:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environment(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ConfigError:" in out.stdout and "quiver run" in out.stdout, out.stdout


def test_type_stubs_are_installed():
    pkg = Path(quiver.__file__).parent
    assert (pkg / "py.typed").is_file()
    stub = (pkg / "_quiver.pyi").read_text()
    for name in ("class Tagged", "def Recv", "class Request", "def waitany", "class Job"):
        assert name in stub, name


def test_invalid_rendezvous_is_a_config_error():
    """An invalid QUIVER_* variable is quiver.ConfigError."""
    env = environment({"QUIVER_RANK": "0", "QUIVER_SIZE": "1",
                       "QUIVER_RENDEZVOUS": "nonsense://x", "QUIVER_JOB_ID": "1"})
    code = ("import quiver\n"
            "try:\n"
            "    quiver.Job.from_env()\n"
            "except quiver.Error as e:\n"
            "    print(type(e).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ConfigError", out.stdout
