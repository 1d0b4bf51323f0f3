"""The type stubs: they match the extension module (mypy's stubtest compares every
class, method and parameter with the module as imported), and a program written
against them type-checks with ``mypy --strict``."""

import subprocess
import sys
from pathlib import Path

from conftest import cannot_run, environment

HERE = Path(__file__).resolve().parent


def mypy(*args, tmp):
    try:
        import mypy  # noqa: F401
    except ImportError:
        cannot_run("mypy is not installed (pip install mypy)")
    # In a scratch directory: its cache goes there, and `quiver` is the installed one.
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          env=environment(), cwd=tmp, timeout=300)


def test_stubs_match_the_module(tmp_path):
    # PEP 800's @disjoint_base is left out: type checkers do not need it yet.
    out = mypy("mypy.stubtest", "--ignore-disjoint-bases", "quiver._quiver", tmp=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_program_type_checks_against_the_stubs(tmp_path):
    out = mypy("mypy", "--strict", str(HERE / "typed_usage.py"), tmp=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
