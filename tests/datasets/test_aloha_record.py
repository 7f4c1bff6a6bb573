"""Recording the scripted expert: killed mid-episode, the dataset keeps what was committed; a rerun completes it.

Episodes here are short (30 steps at 96×128), which ends them before the handover, so the
expert "fails" on all of them: the tests that need episodes record them anyway
(successful_only=False), and one checks that failed seeds are skipped rather than recorded.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import signal
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from hetlab.aloha.record import RecordConfig, _InSeedOrder, record, recorded_render_quality
from hetlab.datasets.lerobot import LeRobotDataset
from hetlab.errors import UserError
from hetlab.runtime.workers import WorkerPool

CAMERA = "observation.images.top"
STEPS = 30


def short_recording(out, episodes: int, **overrides) -> RecordConfig:
    options = dict(episodes=episodes, out=out, height=96, width=128, workers=1, steps=STEPS, first_seed=5,
                   successful_only=False)
    return RecordConfig(**(options | overrides))


def test_killed_recording_keeps_committed_episodes_and_a_rerun_completes_it(tmp_path):
    out = tmp_path / "aloha"
    cfg = short_recording(out, episodes=3)
    first_committed = out / "meta/episodes/chunk-000/file-000.parquet"
    child = multiprocessing.get_context("spawn").Process(target=record, args=(cfg,))
    child.start()
    try:
        deadline = time.monotonic() + 120
        while not first_committed.exists() and child.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first_committed.exists(), "the recording never committed its first episode"
        os.kill(child.pid, signal.SIGKILL)  # mid-way through the second episode
    finally:
        child.join(10)
    assert child.exitcode == -signal.SIGKILL

    survivors = LeRobotDataset(out)
    assert 1 <= len(survivors.episodes) < 3, "the kill should land before the last episode"
    kept = {e: survivors.episode_lengths[e] for e in survivors.episodes}
    before = [survivors[i] for i in range(len(survivors))]  # every committed frame decodes
    assert all(length == STEPS for length in kept.values())

    summary = record(cfg)
    assert summary["episodes"] == 3 and summary["written"] == 3 - len(kept) and summary["failed_seeds"] == []
    ds = LeRobotDataset(out)
    assert ds.episodes == [0, 1, 2] and len(ds) == 3 * STEPS
    for i, item in enumerate(before):  # the earlier episodes are untouched
        np.testing.assert_array_equal(ds[i][CAMERA].numpy(), item[CAMERA].numpy())
        np.testing.assert_array_equal(ds[i]["action"].numpy(), item["action"].numpy())
    seeds = [row["seed"] for path in sorted(out.glob("meta/episodes/*/*.parquet"))
             for row in pq.read_table(path).to_pylist()]
    assert seeds == [5, 6, 7]
    info = json.loads((out / "meta/info.json").read_text())
    assert (info["total_episodes"], info["total_frames"]) == (3, 3 * STEPS)
    assert not (out / ".staging").exists()
    assert not [p for p in out.rglob(".*") if p.name != ".writer.lock"], "temporary files left behind"
    assert record(cfg)["written"] == 0  # nothing left to do


def test_failed_seeds_are_skipped_and_a_hopeless_expert_stops(tmp_path):
    out = tmp_path / "aloha"
    cfg = short_recording(out, episodes=1, steps=5, workers=2, successful_only=True, give_up_after=3)
    with pytest.raises(UserError, match="failed on 3 seeds in a row"):
        record(cfg)
    info = json.loads((out / "meta/info.json").read_text())
    assert info["total_episodes"] == 0 and not list(out.glob("data/*/*.parquet"))


def test_bad_settings_are_refused_before_anything_runs(tmp_path):
    with pytest.raises(UserError, match="even and at least 64"):
        record(short_recording(tmp_path / "x", episodes=1, height=63))
    with pytest.raises(UserError, match="--workers"):
        record(short_recording(tmp_path / "x", episodes=1, workers=-1))
    assert not (tmp_path / "x").exists()


def test_the_render_quality_is_recorded_and_a_recording_continues_only_at_the_same_one(tmp_path):
    out = tmp_path / "fast"
    record(short_recording(out, episodes=1, render_quality="fast"))
    info = json.loads((out / "meta" / "info.json").read_text())
    assert recorded_render_quality(info) == "fast" == info["features"][CAMERA]["info"]["render.quality"]
    with pytest.raises(UserError, match="render quality"):
        record(short_recording(out, episodes=2, render_quality="high"))
    assert len(LeRobotDataset(out).episode_lengths) == 1


class EncoderStuck:
    """A recording worker's stand-in whose seed `stuck` never comes back the first `times` times it
    is tried, as when SVT-AV1 deadlocked inside an encode; the marks it leaves count the tries."""

    def __init__(self, directory: str, stuck: int, times: int):
        self.directory, self.stuck, self.times = directory, stuck, times

    def stage(self, seed: int) -> str:
        if seed == self.stuck:
            tries = len(os.listdir(self.directory))
            if tries < self.times:
                open(os.path.join(self.directory, f"try-{tries}"), "w").close()
                time.sleep(3600)
        return f"episode {seed}"


@pytest.mark.serial  # a stall is judged against the longest episode's wall time
def test_workers_stuck_on_an_episode_are_restarted_and_its_seed_comes_back_in_order(tmp_path):
    said = []
    with WorkerPool(2, EncoderStuck.stage, setup=EncoderStuck, setup_args=(str(tmp_path), 6, 1)) as pool:
        in_order = _InSeedOrder(pool, said.append, first_stall_s=60, min_stall_s=2)
        # As the recorder does: a seed submitted for each episode handed out.
        in_order.submit(5)
        in_order.submit(6)
        assert in_order.next() == (5, "episode 5")  # the first back: the workers are warm from here
        in_order.submit(7)
        # 7 comes back and sets the stall time (10× its time, at least 2 s); 6 comes only after the restart.
        assert in_order.next() == (6, "episode 6")
        in_order.submit(8)
        assert [in_order.next() for _ in range(2)] == [(7, "episode 7"), (8, "episode 8")]
    assert in_order.restarts == 1 and len(said) == 1
    assert re.fullmatch(r"no episode came back in \d+ s \(a video encoder can deadlock\): restarting the 2 "
                        r"recording worker\(s\) for seeds 6", said[0])


@pytest.mark.serial
def test_a_seed_that_stalls_the_workers_again_and_again_stops_the_recording_in_one_line(tmp_path):
    with WorkerPool(1, EncoderStuck.stage, setup=EncoderStuck, setup_args=(str(tmp_path), 5, 99)) as pool:
        in_order = _InSeedOrder(pool, lambda _: None, first_stall_s=1, min_stall_s=1)
        in_order.submit(5)
        with pytest.raises(UserError) as stalled:
            in_order.next()
    assert str(stalled.value).startswith("the recording workers stalled 4 times in a row on seeds 5; the episodes "
                                         "committed so far are kept")
    assert in_order.restarts == 3
