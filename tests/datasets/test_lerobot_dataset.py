"""Writing and reading a LeRobot v3.0 dataset: round trip, schema, chunks, selection, loaders, stats."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from hetlab.datasets.lerobot import LeRobotDataset
from hetlab.datasets.lerobot_writer import LeRobotWriter
from hetlab.errors import UserError

# The tiny dataset of conftest.py.
CAMERA = "observation.images.top"
EPISODES, STEPS, HEIGHT, WIDTH, FPS = 2, 40, 96, 128, 50

MIN_PSNR_DB = 30.0  # AV1 at CRF 30 on smooth synthetic frames; ~40 dB typical


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0 ** 2 / max(mse, 1e-12)))


def test_round_trip_keeps_state_action_exactly_and_frames_within_psnr(tiny_dataset):
    ds = LeRobotDataset(tiny_dataset.root)
    assert len(ds) == EPISODES * STEPS
    psnrs = []
    for i in range(len(ds)):
        episode, t = divmod(i, STEPS)
        item = ds[i]
        np.testing.assert_array_equal(item["observation.state"].numpy(), tiny_dataset.state[episode][t])
        np.testing.assert_array_equal(item["action"][0].numpy(), tiny_dataset.action[episode][t])
        assert (item["episode_index"].item(), item["frame_index"].item(), item["index"].item()) == (episode, t, i)
        assert item["timestamp"].item() == pytest.approx(t / FPS)
        image = item[CAMERA]
        assert image.dtype == torch.uint8 and image.shape == (3, HEIGHT, WIDTH)
        psnrs.append(psnr(image.permute(1, 2, 0).numpy(), tiny_dataset.images[episode][t]))
    assert min(psnrs) >= MIN_PSNR_DB, f"worst frame {min(psnrs):.1f} dB"


def test_float_images_and_resizing(tiny_dataset):
    ds = LeRobotDataset(tiny_dataset.root, image_size=(48, 64), float_images=True)
    image = ds[5][CAMERA]
    assert image.dtype == torch.float32 and image.shape == (3, 48, 64)
    assert 0.0 <= image.min() and image.max() <= 1.0
    # The square (red) sits where it was drawn, at half the resolution.
    top, left = 20 + 5 // 2, 10 + 5
    assert image[0, (top + 12) // 2, (left + 12) // 2] > 0.8 and image[1, (top + 12) // 2, (left + 12) // 2] < 0.3


def test_schema_has_the_v3_fields(tiny_dataset):
    root = tiny_dataset.root
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0"
    assert {"robot_type", "total_episodes", "total_frames", "total_tasks", "chunks_size", "data_files_size_in_mb",
            "video_files_size_in_mb", "fps", "splits", "data_path", "video_path", "features"} <= set(info)
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"], info["fps"]) == (2, 80, 1, FPS)
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    features = info["features"]
    assert set(features) == {CAMERA, "observation.state", "action", "episode_index", "frame_index", "timestamp",
                             "next.done", "index", "task_index"}
    for feature in features.values():
        assert {"dtype", "shape", "names"} <= set(feature)
    assert features[CAMERA]["dtype"] == "video" and features[CAMERA]["shape"] == [HEIGHT, WIDTH, 3]
    assert features[CAMERA]["info"]["video.codec"] == "av1" and features[CAMERA]["info"]["video.pix_fmt"] == "yuv420p"
    assert features["observation.state"] == {"dtype": "float32", "shape": [14], "names": list(tiny_dataset.spec.state_names)}

    data = pq.read_table(root / "data/chunk-000/file-001.parquet")
    assert set(data.column_names) == set(features) - {CAMERA}
    assert data.schema.field("observation.state").type == pa.list_(pa.float32(), 14)
    assert data.schema.field("timestamp").type == pa.float32()
    assert data.schema.field("next.done").type == pa.bool_()
    assert data["next.done"].to_pylist() == [False] * (STEPS - 1) + [True]
    assert data["index"].to_pylist() == list(range(STEPS, 2 * STEPS))

    row = pq.read_table(root / "meta/episodes/chunk-000/file-001.parquet").to_pylist()[0]
    assert {k: row[k] for k in ("episode_index", "tasks", "length", "data/chunk_index", "data/file_index",
                                "dataset_from_index", "dataset_to_index", "meta/episodes/chunk_index",
                                "meta/episodes/file_index", "seed")} == {
        "episode_index": 1, "tasks": [tiny_dataset.spec.task], "length": STEPS, "data/chunk_index": 0, "data/file_index": 1,
        "dataset_from_index": STEPS, "dataset_to_index": 2 * STEPS, "meta/episodes/chunk_index": 0,
        "meta/episodes/file_index": 1, "seed": 101}
    video = f"videos/{CAMERA}"
    assert (row[f"{video}/chunk_index"], row[f"{video}/file_index"]) == (0, 1)
    assert (row[f"{video}/from_timestamp"], row[f"{video}/to_timestamp"]) == (0.0, pytest.approx(STEPS / FPS))
    assert np.asarray(row[f"stats/{CAMERA}/mean"]).shape == (3, 1, 1)
    assert row["stats/observation.state/count"] == [STEPS]

    tasks = pq.read_table(root / "meta/tasks.parquet")
    assert tasks.to_pylist() == [{"task_index": 0, "task": tiny_dataset.spec.task}]
    assert json.loads(tasks.schema.metadata[b"pandas"])["index_columns"] == ["task"]  # LeRobot indexes tasks by text

    with av.open(str(root / f"{video}/chunk-000/file-001.mp4")) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name in ("libdav1d", "av1")
        assert stream.codec_context.pix_fmt == "yuv420p"
        assert sum(1 for _ in container.decode(stream)) == STEPS


def test_action_chunk_is_padded_past_the_episode_end(tiny_dataset):
    horizon = 5
    ds = LeRobotDataset(tiny_dataset.root, action_horizon=horizon)
    item = ds[STEPS - 3]  # episode 0, frame 37: actions 37, 38, 39, then the last one repeated
    expected = tiny_dataset.action[0][[37, 38, 39, 39, 39]]
    np.testing.assert_array_equal(item["action"].numpy(), expected)
    assert item["action_is_pad"].tolist() == [False, False, False, True, True]
    middle = ds[STEPS + 10]
    np.testing.assert_array_equal(middle["action"].numpy(), tiny_dataset.action[1][10:15])
    assert not middle["action_is_pad"].any()
    last = ds[len(ds) - 1]
    assert last["action_is_pad"].tolist() == [False] + [True] * (horizon - 1)
    np.testing.assert_array_equal(last["action"].numpy(), np.repeat(tiny_dataset.action[1][-1:], horizon, axis=0))


def test_episode_selection(tiny_dataset):
    only_second = LeRobotDataset(tiny_dataset.root, episodes=[1])
    assert len(only_second) == STEPS and only_second.episodes == [1]
    first = only_second[0]
    assert (first["episode_index"].item(), first["frame_index"].item(), first["index"].item()) == (1, 0, STEPS)
    np.testing.assert_array_equal(first["observation.state"].numpy(), tiny_dataset.state[1][0])
    assert psnr(first[CAMERA].permute(1, 2, 0).numpy(), tiny_dataset.images[1][0]) >= MIN_PSNR_DB

    reversed_order = LeRobotDataset(tiny_dataset.root, episodes=range(1, -1, -1))
    assert reversed_order.episodes == [1, 0]
    assert reversed_order[STEPS]["episode_index"].item() == 0
    assert reversed_order.episode_lengths == {1: STEPS, 0: STEPS}


def test_dataloader_workers_give_the_items_of_direct_access(tiny_dataset):
    ds = LeRobotDataset(tiny_dataset.root, action_horizon=3)
    direct = [ds[i] for i in range(len(ds))]  # opens decoders in this process first, as a forked worker inherits
    # A worker that hangs (as one forked after a multithreaded frame conversion did) fails the test, not CI.
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, shuffle=False, timeout=60)
    batches = list(loader)
    for key in direct[0]:
        np.testing.assert_array_equal(torch.cat([b[key] for b in batches]).numpy(),
                                      torch.stack([item[key] for item in direct]).numpy(), err_msg=key)
    # A spawned worker gets the dataset pickled: nothing open may travel with it.
    copy = pickle.loads(pickle.dumps(ds))
    np.testing.assert_array_equal(copy[41][CAMERA].numpy(), direct[41][CAMERA].numpy())


def test_random_access_matches_sequential(tiny_dataset):
    ds = LeRobotDataset(tiny_dataset.root)
    sequential = [ds[i][CAMERA] for i in range(len(ds))]
    order = np.random.default_rng(1).permutation(len(ds))
    shuffled = LeRobotDataset(tiny_dataset.root)
    for i in order:
        assert torch.equal(shuffled[int(i)][CAMERA], sequential[i]), f"frame {i}"


def test_stats_match_numpy_on_the_written_data(tiny_dataset):
    root = tiny_dataset.root
    stats = json.loads((root / "meta/stats.json").read_text())
    data = pq.read_table(root / "data/chunk-000/file-000.parquet")
    data = pa.concat_tables([data, pq.read_table(root / "data/chunk-000/file-001.parquet")])
    for key in ("observation.state", "action"):
        values = np.asarray(data[key].to_pylist(), dtype=np.float64)
        np.testing.assert_allclose(stats[key]["mean"], values.mean(axis=0), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(stats[key]["std"], values.std(axis=0), rtol=1e-10, atol=1e-12)
        np.testing.assert_array_equal(stats[key]["min"], values.min(axis=0))
        np.testing.assert_array_equal(stats[key]["max"], values.max(axis=0))
        assert stats[key]["count"] == [EPISODES * STEPS]
    frame_index = np.asarray(data["frame_index"].to_pylist(), dtype=np.float64)
    np.testing.assert_allclose(stats["frame_index"]["mean"], [frame_index.mean()])
    np.testing.assert_allclose(stats["frame_index"]["std"], [frame_index.std()])
    # Image stats: per channel, (3, 1, 1), in [0, 1]; a 40-frame episode is sampled whole.
    pixels = np.concatenate(tiny_dataset.images).reshape(-1, 3).astype(np.float64) / 255
    for name, value in (("mean", pixels.mean(axis=0)), ("std", pixels.std(axis=0)), ("min", pixels.min(axis=0)),
                        ("max", pixels.max(axis=0))):
        assert np.asarray(stats[CAMERA][name]).shape == (3, 1, 1)
        np.testing.assert_allclose(np.asarray(stats[CAMERA][name]).ravel(), value, rtol=1e-9, err_msg=name)
    ds = LeRobotDataset(root)
    np.testing.assert_array_equal(ds.stats["action"]["mean"], np.asarray(stats["action"]["mean"]))


def test_reopening_keeps_committed_episodes_and_cleans_leftovers(tiny_dataset, make_frames):
    root = tiny_dataset.root
    # What a killed writer leaves: a half-written temporary, and an episode's files without its metadata row.
    (root / "data/chunk-000/.file-002.parquet.tmp.parquet").write_bytes(b"half")
    (root / "data/chunk-000/file-002.parquet").write_bytes(b"orphan")
    (root / f"videos/{CAMERA}/chunk-000/file-002.mp4").write_bytes(b"orphan")
    with LeRobotWriter(root, tiny_dataset.spec) as writer:
        assert writer.num_episodes == 2 and writer.num_frames == 2 * STEPS
        assert writer.episode_column("seed") == [100, 101]
        assert not (root / "data/chunk-000/file-002.parquet").exists()
        assert not (root / f"videos/{CAMERA}/chunk-000/file-002.mp4").exists()
        assert not list(root.glob("data/chunk-000/.*"))
        rng = np.random.default_rng(7)
        state, action = rng.standard_normal((2, 10, 14)).astype(np.float32)
        assert writer.add_episode({CAMERA: make_frames(2, steps=10)}, state, action) == 2
    ds = LeRobotDataset(root)
    assert ds.episode_lengths == {0: STEPS, 1: STEPS, 2: 10}
    np.testing.assert_array_equal(ds[2 * STEPS + 9]["observation.state"].numpy(), state[9])
    assert json.loads((root / "meta/info.json").read_text())["total_frames"] == 2 * STEPS + 10


def test_reopening_deletes_only_the_writers_own_temporaries(tiny_dataset, make_frames):
    """Hidden files of other tools (a git checkout of a hub dataset, Finder's .DS_Store) are not a
    crash's leftovers: reopening keeps them, hidden directories included."""
    root = tiny_dataset.root
    others = [root / "meta/.DS_Store", root / "data/chunk-000/.gitattributes", root / f"videos/{CAMERA}/.notes"]
    for path in others:
        path.write_text("not the writer's")
    (root / "data/.git/objects").mkdir(parents=True)
    (root / "data/.git/.keep").write_text("")
    leftover = root / "meta/episodes/chunk-000/.file-002.parquet.0123456789abcdef.tmp.parquet"
    leftover.write_bytes(b"half")
    with LeRobotWriter(root, tiny_dataset.spec) as writer:
        assert writer.num_episodes == 2
        rng = np.random.default_rng(3)
        state, action = rng.standard_normal((2, 10, 14)).astype(np.float32)
        writer.add_episode({CAMERA: make_frames(2, steps=10)}, state, action)
    assert not leftover.exists()
    assert all(path.read_text() == "not the writer's" for path in others)
    assert (root / "data/.git/objects").is_dir() and (root / "data/.git/.keep").is_file()
    assert LeRobotDataset(root).episode_lengths == {0: STEPS, 1: STEPS, 2: 10}


def test_a_new_dataset_may_go_where_only_hidden_files_are(tmp_path, make_frames, tiny_dataset):
    root = tmp_path / "fresh"
    (root / ".git").mkdir(parents=True)
    (root / ".gitattributes").write_text("*.mp4 filter=lfs\n")
    rng = np.random.default_rng(4)
    state, action = rng.standard_normal((2, 10, 14)).astype(np.float32)
    with LeRobotWriter(root, tiny_dataset.spec) as writer:
        writer.add_episode({CAMERA: make_frames(0, steps=10)}, state, action)
    assert LeRobotDataset(root).episode_lengths == {0: 10}
    assert (root / ".git").is_dir() and (root / ".gitattributes").read_text() == "*.mp4 filter=lfs\n"
    (root.parent / "other").mkdir()
    (root.parent / "other" / "notes.txt").write_text("")
    with pytest.raises(UserError, match="is not empty and holds no meta/info.json"):
        LeRobotWriter(root.parent / "other", tiny_dataset.spec)


def test_writer_refuses_other_settings_and_a_second_writer(tiny_dataset):
    spec = tiny_dataset.spec
    with pytest.raises(UserError, match="other settings"):
        LeRobotWriter(tiny_dataset.root, replace(spec, height=48))
    with LeRobotWriter(tiny_dataset.root, spec):
        with pytest.raises(UserError, match="is in use: another hetlab process"):
            LeRobotWriter(tiny_dataset.root, spec)


def test_a_dataset_killed_before_its_first_stats_file_reads_the_committed_rows_stats(tiny_dataset):
    """The episode's metadata row is the commit point and stats.json follows it: a writer killed in
    between leaves no stats.json, and the reader aggregates the same stats from the rows."""
    root = tiny_dataset.root
    written = LeRobotDataset(root).stats
    (root / "meta/stats.json").unlink()
    recovered = LeRobotDataset(root).stats
    assert recovered.keys() == written.keys()
    for feature, by_stat in written.items():
        for name, value in by_stat.items():
            np.testing.assert_allclose(recovered[feature][name], value, rtol=1e-12, err_msg=f"{feature}/{name}")
