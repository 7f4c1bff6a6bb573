"""The worker pool with real spawned processes: results, failures, deaths, Ctrl-C and orphans.

The jobs are the module-level functions below, which the workers import from this file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from hetlab.errors import UserError
from hetlab.runtime.workers import WorkerPool, call_in_own_process

pytestmark = pytest.mark.serial  # bounds on how soon workers answer, restart and die


class Offset:
    """A worker's state: its setup's argument, and a token drawn once, when the worker sets up."""

    def __init__(self, offset: int):
        self.offset, self.token = offset, uuid.uuid4().hex

    def add(self, x: int) -> tuple[int, int, str]:
        return x + self.offset, os.getpid(), self.token


def pid(_, job) -> int:
    return os.getpid()


def sleep_for(_, seconds: float) -> int:
    time.sleep(seconds)
    return os.getpid()


def divide(_, x: int) -> float:
    return 1 / x


def refuse(_, job) -> None:
    raise UserError(f"job {job} names no dataset; pass --dataset DIR")


def refuse_setup() -> None:
    raise UserError("the run has no weights; train it first")


class HangsOnce:
    """A worker's state: a folder where a job that hangs leaves its worker's pid, so that a restarted
    worker does not hang on it again."""

    def __init__(self, directory: str):
        self.directory = Path(directory)

    def run(self, job: int) -> int:
        mark = self.directory / f"hung-{job}"
        if job < 0 and not mark.exists():  # a negative job hangs the first time, as a deadlocked encoder did
            mark.write_text(str(os.getpid()))
            time.sleep(3600)
        return 10 * job


def announce_pid(directory: str) -> None:
    (Path(directory) / str(os.getpid())).touch()


def wait_for_workers(directory: Path, count: int) -> list[int]:
    """The pids of `count` workers once each has announced itself in `directory`."""
    deadline = time.monotonic() + 60
    while len(list(directory.iterdir())) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = [int(path.name) for path in directory.iterdir()]
    assert len(workers) == count, "the workers never set up"
    return workers


def alive(process_id: int) -> bool:
    """Whether the process exists and is not a zombie (a zombie has exited; only its entry is left)."""
    try:
        stat = Path(f"/proc/{process_id}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_every_job_comes_back_with_its_result_and_setup_runs_once_per_worker():
    with WorkerPool(2, Offset.add, setup=Offset, setup_args=(100,)) as pool:
        results = dict(pool.as_completed(range(20)))
        assert pool.pending == 0
    assert {job: value for job, (value, _, _) in results.items()} == {job: job + 100 for job in range(20)}
    tokens = {}
    for _, worker, token in results.values():
        tokens.setdefault(worker, set()).add(token)
    assert 1 <= len(tokens) <= 2 and all(len(drawn) == 1 for drawn in tokens.values())


def test_next_with_a_timeout_returns_none_until_a_job_finishes():
    with WorkerPool(1, sleep_for) as pool:
        pool.submit(2.0)
        start = time.monotonic()
        assert pool.next(timeout=0) is None and pool.next(timeout=0.2) is None
        assert 0.2 <= time.monotonic() - start < 1.5  # it looked, and waited about as long as asked
        job, _ = pool.next(timeout=60)
        assert job == 2.0 and pool.pending == 0


def test_a_restart_replaces_a_stuck_worker_and_hands_its_jobs_out_again(tmp_path):
    with WorkerPool(1, HangsOnce.run, setup=HangsOnce, setup_args=(str(tmp_path),)) as pool:
        for job in (1, -2, 3):
            pool.submit(job)
        assert pool.next(timeout=60) == (1, 10)
        assert pool.next(timeout=1.0) is None  # stuck on -2, with 3 behind it
        mark = tmp_path / "hung--2"
        deadline = time.monotonic() + 60
        while not (mark.is_file() and mark.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        stuck = int(mark.read_text())
        pool.restart()
        assert not alive(stuck)
        assert dict(pool.next(timeout=60) for _ in range(2)) == {-2: -20, 3: 30}
        assert pool.pending == 0


def test_an_exception_reaches_the_parent_with_the_workers_traceback():
    with pytest.raises(RuntimeError) as failure:
        with WorkerPool(1, divide, name="division") as pool:
            for _ in pool.as_completed([2, 0]):
                pass
    message = str(failure.value)
    assert message.startswith("a division worker failed on job 0:\n")
    assert "Traceback" in message and "in divide" in message and "ZeroDivisionError: division by zero" in message


def test_a_user_error_stays_one_line_from_a_job_or_a_setup():
    with pytest.raises(UserError) as failure, WorkerPool(1, refuse) as pool:
        pool.submit(7)
        pool.next()
    assert str(failure.value) == "job 7 names no dataset; pass --dataset DIR"
    with pytest.raises(UserError) as failure, WorkerPool(1, pid, setup=refuse_setup) as pool:
        pool.submit(0)
        pool.next()
    assert str(failure.value) == "the run has no weights; train it first"


def test_a_killed_worker_is_reported_within_seconds():
    with WorkerPool(1, sleep_for) as pool:
        pool.submit(0)
        _, worker = pool.next()
        pool.submit(60)
        time.sleep(0.2)  # the worker has taken the job
        os.kill(worker, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"hetlab-worker-0 died \(exit code -9\)"):
            pool.next()
        assert time.monotonic() - started < 3


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
def test_stop_signals_are_left_to_the_parent(signum):
    # Ctrl-C, a hang-up, `timeout` or `kill -TERM -PGID` signal the whole process group.
    with WorkerPool(1, sleep_for) as pool:
        pool.submit(0)
        _, worker = pool.next()
        pool.submit(0.5)
        os.kill(worker, signum)  # while it works on the job
        assert pool.next() == (0.5, worker)


def test_leaving_the_block_on_an_error_ends_busy_workers_at_once(tmp_path):
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), WorkerPool(2, sleep_for, setup=announce_pid,
                                                      setup_args=(str(tmp_path),)) as pool:
        pool.submit(60)
        pool.submit(60)
        workers = wait_for_workers(tmp_path, 2)
        raise KeyboardInterrupt
    assert time.monotonic() - started < 30
    assert not any(map(alive, workers))


def test_no_orphans_when_the_parent_is_killed(tmp_path):
    parent = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_workers import announce_pid, sleep_for
        from hetlab.runtime.workers import WorkerPool
        pool = WorkerPool(2, sleep_for, setup=announce_pid, setup_args=({str(tmp_path)!r},))
        pool.submit(60)
        time.sleep(60)
    """)
    process = subprocess.Popen([sys.executable, "-c", parent])
    try:
        workers = wait_for_workers(tmp_path, 2)
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 5
    while any(map(alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(alive, workers)), "a worker outlived its parent"


def test_a_call_in_its_own_process():
    assert call_in_own_process(divide, None, 4) == 0.25
    assert call_in_own_process(pid, None, None) != os.getpid()
