"""The suite's own pytest settings survive a test that crashes the interpreter: a child pytest run
with this project's configuration on a file whose second test segfaults reports that test failed,
shows faulthandler's traceback of the crash, runs the test after it, and exits non-zero."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

CRASHING = '''
import ctypes


def test_before_the_crash():
    pass


def test_segfaults():
    ctypes.string_at(0)  # reads address 0: SIGSEGV in native code


def test_after_the_crash():
    pass
'''


def test_a_segfaulting_test_fails_alone_and_the_run_goes_on(tmp_path):
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    # This run's worker variables would tell the child's own pytest-xdist workers they are ours.
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_XDIST")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(PYPROJECT), "--rootdir", str(tmp_path), "-p", "no:cacheprovider",
         "-rA", str(tmp_path / "test_crashing.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    said = result.stdout + result.stderr
    assert result.returncode == 1, f"exit {result.returncode}, expected 1 (tests failed):\n{said}"
    assert "FAILED test_crashing.py::test_segfaults" in result.stdout, said
    assert "PASSED test_crashing.py::test_before_the_crash" in result.stdout, said
    assert "PASSED test_crashing.py::test_after_the_crash" in result.stdout, said
    assert "1 failed, 2 passed" in result.stdout, said
    # faulthandler's report names the crashing line.
    assert "Fatal Python error: Segmentation fault" in result.stderr, said
    assert 'test_crashing.py", line 10 in test_segfaults' in result.stderr, said
