"""Bad datasets fail with one UserError that names the file and says what is wrong."""

from __future__ import annotations

import json
import os

import av
import pyarrow.parquet as pq
import pytest

from hetlab.datasets.lerobot import LeRobotDataset
from hetlab.errors import UserError

CAMERA = "observation.images.top"
STEPS = 40  # frames per episode of the tiny dataset


def video_path(root, episode: int):
    return root / f"videos/{CAMERA}/chunk-000/file-{episode:03d}.mp4"


def test_truncated_video_is_reported_at_construction(tiny_dataset):
    video = video_path(tiny_dataset.root, 1)
    os.truncate(video, video.stat().st_size // 2)  # the mp4 index (moov) is written last, so it is cut off
    with pytest.raises(UserError, match="truncated") as error:
        LeRobotDataset(tiny_dataset.root)
    assert str(video) in str(error.value)
    assert len(LeRobotDataset(tiny_dataset.root, episodes=[0])) == STEPS  # the intact episode still reads


def test_truncated_video_with_its_index_first_is_reported_at_decoding(tiny_dataset):
    # Videos muxed with the index first (faststart, common on the hub) still open when cut short.
    video = video_path(tiny_dataset.root, 1)
    remuxed = video.with_name("remuxed.mp4")
    with av.open(str(video)) as source, av.open(str(remuxed), "w", format="mp4",
                                                 options={"movflags": "faststart"}) as target:
        stream = target.add_stream_from_template(source.streams.video[0], opaque=True)
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = stream
                target.mux(packet)
    os.replace(remuxed, video)
    os.truncate(video, video.stat().st_size * 6 // 10)
    ds = LeRobotDataset(tiny_dataset.root)
    ds[STEPS]  # the start of episode 1 is intact
    with pytest.raises(UserError, match="truncated|corrupt") as error:
        for i in range(STEPS, 2 * STEPS):
            ds[i]
    assert str(video) in str(error.value)


def test_missing_video(tiny_dataset):
    video = video_path(tiny_dataset.root, 0)
    video.unlink()
    with pytest.raises(UserError, match="missing") as error:
        LeRobotDataset(tiny_dataset.root)
    assert str(video) in str(error.value)


def test_data_file_without_a_column(tiny_dataset):
    path = tiny_dataset.root / "data/chunk-000/file-001.parquet"
    table = pq.read_table(path)
    pq.write_table(table.drop_columns(["action"]), path)
    with pytest.raises(UserError, match="missing column") as error:
        LeRobotDataset(tiny_dataset.root)
    assert str(path) in str(error.value) and "action" in str(error.value)


def test_episodes_metadata_without_a_column(tiny_dataset):
    path = tiny_dataset.root / "meta/episodes/chunk-000/file-000.parquet"
    pq.write_table(pq.read_table(path).drop_columns([f"videos/{CAMERA}/to_timestamp"]), path)
    with pytest.raises(UserError, match="missing column") as error:
        LeRobotDataset(tiny_dataset.root)
    assert str(path) in str(error.value) and "to_timestamp" in str(error.value)


@pytest.mark.parametrize("relative", ["data/chunk-000/file-001.parquet", "meta/episodes/chunk-000/file-000.parquet",
                                      "meta/info.json", "meta/stats.json"])
def test_a_truncated_file_is_one_line_naming_it(tiny_dataset, relative):
    """A file damaged on disk after it was written whole (the writer renames complete files into place)."""
    path = tiny_dataset.root / relative
    os.truncate(path, path.stat().st_size // 2)
    with pytest.raises(UserError) as error:
        LeRobotDataset(tiny_dataset.root)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_other_codebase_version(tiny_dataset):
    path = tiny_dataset.root / "meta/info.json"
    info = json.loads(path.read_text())
    path.write_text(json.dumps(info | {"codebase_version": "v2.1"}))
    with pytest.raises(UserError, match="v2.1") as error:
        LeRobotDataset(tiny_dataset.root)
    assert str(path) in str(error.value) and "v3.0" in str(error.value)


def test_episode_out_of_range(tiny_dataset):
    with pytest.raises(UserError, match=r"episode\(s\) \[2\] out of range; the dataset has episodes 0–1") as error:
        LeRobotDataset(tiny_dataset.root, episodes=[0, 2])
    assert str(tiny_dataset.root) in str(error.value)


def test_not_a_dataset(tmp_path):
    with pytest.raises(UserError, match="info.json"):
        LeRobotDataset(tmp_path)
    with pytest.raises(UserError, match="no such dataset directory"):
        LeRobotDataset(tmp_path / "absent")
