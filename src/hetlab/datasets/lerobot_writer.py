"""Write a LeRobot v3.0 dataset one episode at a time, each episode committed atomically.

Episode e gets file number e of every kind (data, each camera's video, episodes metadata), so
committing it is: move its encoded videos into place, write its data file, then write its row of
episodes metadata: that row is the commit point. `meta/info.json` and `meta/stats.json` follow,
each replaced whole (a reader that finds no stats.json yet aggregates the committed rows' own). Every file is written under a hidden temporary name and renamed, so a
killed writer leaves complete episodes and at most some unreferenced files, which the next
writer to open the directory deletes before carrying on after the last committed episode. It
deletes nothing else: hidden files of other tools (`.git`, `.gitattributes`, `.DS_Store`) stay.

Encoding a video is the slow part, so it is split off: `stage_episode` (any process) encodes
into the dataset's staging directory and computes the image stats; `LeRobotWriter.commit` (the
one process holding the writer) numbers the episode and makes it part of the dataset.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hetlab.datasets import stats as stats_lib
from hetlab.datasets.lerobot_format import (CHUNKS_SIZE, CODEBASE_VERSION, DATA_FILES_SIZE_IN_MB, DATA_PATH,
                                            EPISODES_DIR, EPISODES_PATH, INDEX_FEATURES, INFO_PATH, STATS_PATH,
                                            TASKS_PATH, VIDEO_FILES_SIZE_IN_MB, VIDEO_PATH, chunk_and_file)
from hetlab.datasets.video import CODEC_NAME, PIX_FMT, encode_video
from hetlab.dir_lock import exclusive_writer
from hetlab.errors import UserError
from hetlab.files import atomic_path, space_checked, temporary_target, write_text_atomic

STATE, ACTION, DONE = "observation.state", "action", "next.done"
STAGING_DIR = ".staging"
# The files a writer replaces through a temporary one (videos come from the staging directory instead).
WRITTEN_THROUGH_TEMPORARY = re.compile(r"file-[0-9]+\.parquet|info\.json|stats\.json|tasks\.parquet")


@dataclass(frozen=True)
class DatasetSpec:
    """What every episode of a dataset holds: one task, RGB cameras of one size, state and action vectors."""

    fps: int
    task: str
    robot_type: str
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    cameras: tuple[str, ...]  # video feature keys, e.g. "observation.images.top"
    height: int
    width: int
    camera_info: tuple[tuple[str, str | int], ...] = ()  # more keys for each camera's `info` (how it was made)

    def features(self) -> dict:
        """info.json's `features`: the cameras, state and action, then the per-frame indices."""
        video_info = {"video.height": self.height, "video.width": self.width, "video.codec": CODEC_NAME,
                      "video.pix_fmt": PIX_FMT, "video.is_depth_map": False, "video.fps": self.fps,
                      "video.channels": 3, "has_audio": False, **dict(self.camera_info)}
        features = {key: {"dtype": "video", "shape": [self.height, self.width, 3],
                          "names": ["height", "width", "channels"], "info": dict(video_info)}
                    for key in self.cameras}
        features[STATE] = {"dtype": "float32", "shape": [len(self.state_names)], "names": list(self.state_names)}
        features[ACTION] = {"dtype": "float32", "shape": [len(self.action_names)], "names": list(self.action_names)}
        features[DONE] = {"dtype": "bool", "shape": [1], "names": None}
        return features | INDEX_FEATURES


@dataclass(frozen=True)
class StagedEpisode:
    """An episode ready to commit: its encoded videos in the staging directory, arrays and image stats."""

    state: np.ndarray  # (T, state dims) float32
    action: np.ndarray  # (T, action dims) float32
    videos: dict[str, Path]  # camera key -> staged mp4
    image_stats: dict[str, dict[str, np.ndarray]]
    extra: dict[str, int | float | str] = field(default_factory=dict)  # more episodes-metadata columns


def stage_episode(staging_dir: Path, spec: DatasetSpec, images: dict[str, np.ndarray], state: np.ndarray,
                  action: np.ndarray, extra: dict | None = None) -> StagedEpisode:
    """Check an episode against `spec`, encode its videos into `staging_dir`, compute its image stats.

    `images` maps each camera to (T, height, width, 3) uint8 frames; frame t is the observation
    before action t."""
    state, action = np.asarray(state, np.float32), np.asarray(action, np.float32)
    steps = len(state)
    expected = {STATE: (steps, len(spec.state_names)), ACTION: (steps, len(spec.action_names))}
    expected |= {key: (steps, spec.height, spec.width, 3) for key in spec.cameras}
    given = {STATE: state, ACTION: action} | dict(images)
    for key, shape in expected.items():
        if key not in given or np.shape(given[key]) != shape or steps == 0:
            raise ValueError(f"episode {key}: expected shape {shape}, got "
                             f"{np.shape(given[key]) if key in given else 'nothing'}")
    if set(images) != set(spec.cameras):
        raise ValueError(f"episode cameras {sorted(images)} differ from the dataset's {list(spec.cameras)}")
    folder = Path(staging_dir) / uuid.uuid4().hex
    folder.mkdir(parents=True)
    videos, image_stats = {}, {}
    for key in spec.cameras:
        frames = np.asarray(images[key], dtype=np.uint8)
        videos[key] = folder / f"{key}.mp4"
        with space_checked(videos[key]):
            encode_video(frames, videos[key], spec.fps)
        image_stats[key] = stats_lib.image_stats(frames)
    return StagedEpisode(state, action, videos, image_stats, dict(extra or {}))


class LeRobotWriter:
    """Creates a dataset at `root`, or opens the one there and appends after its committed episodes.

    One writer per directory at a time (a lock file enforces it). Use as a context manager."""

    def __init__(self, root: Path | str, spec: DatasetSpec):
        self.root, self.spec = Path(root), spec
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = ExitStack()
        self._lock.enter_context(exclusive_writer(self.root, "dataset"))
        try:
            self._episodes = self._open()
        except BaseException:
            self.close()
            raise
        self.staging_dir.mkdir(exist_ok=True)

    @property
    def staging_dir(self) -> Path:
        """Where `stage_episode` puts videos before their commit; on the dataset's file system, so commit renames."""
        return self.root / STAGING_DIR

    @property
    def num_episodes(self) -> int:
        return len(self._episodes)

    @property
    def num_frames(self) -> int:
        return self._episodes[-1]["dataset_to_index"] if self._episodes else 0

    def episode_column(self, name: str) -> list:
        """One episodes-metadata column over the committed episodes (None where an episode lacks it)."""
        return [row.get(name) for row in self._episodes]

    def add_episode(self, images: dict[str, np.ndarray], state: np.ndarray, action: np.ndarray,
                    extra: dict | None = None) -> int:
        """Stage and commit an episode in this process; returns its episode index."""
        return self.commit(stage_episode(self.staging_dir, self.spec, images, state, action, extra))

    def commit(self, staged: StagedEpisode) -> int:
        """Make a staged episode the dataset's next one; returns its episode index."""
        episode, start, steps = self.num_episodes, self.num_frames, len(staged.state)
        chunk, file = chunk_and_file(episode)
        where = {"chunk_index": chunk, "file_index": file}
        for key, staged_video in staged.videos.items():
            video = self.root / VIDEO_PATH.format(video_key=key, **where)
            video.parent.mkdir(parents=True, exist_ok=True)
            os.replace(staged_video, video)
            shutil.rmtree(staged_video.parent, ignore_errors=True)
        data = self._frames_table(staged, episode, start)
        _write_parquet(data, self.root / DATA_PATH.format(**where))

        row = {"episode_index": episode, "tasks": [self.spec.task], "length": steps,
               "data/chunk_index": chunk, "data/file_index": file,
               "dataset_from_index": start, "dataset_to_index": start + steps}
        for key in staged.videos:
            row |= {f"videos/{key}/chunk_index": chunk, f"videos/{key}/file_index": file,
                    f"videos/{key}/from_timestamp": 0.0, f"videos/{key}/to_timestamp": steps / self.spec.fps}
        row |= {"meta/episodes/chunk_index": chunk, "meta/episodes/file_index": file} | staged.extra
        episode_stats = {name: stats_lib.array_stats(data.column(name).to_numpy()) for name in INDEX_FEATURES}
        episode_stats |= {STATE: stats_lib.array_stats(staged.state), ACTION: stats_lib.array_stats(staged.action)}
        episode_stats |= staged.image_stats
        row |= {f"stats/{feature}/{name}": np.asarray(value).tolist()
                for feature, by_stat in episode_stats.items() for name, value in by_stat.items()}
        _write_parquet(pa.Table.from_pylist([row]), self.root / EPISODES_PATH.format(**where))  # the commit
        self._episodes.append(row)
        self._write_summaries()
        return episode

    def close(self) -> None:
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        self._lock.close()

    def __enter__(self) -> LeRobotWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _frames_table(self, staged: StagedEpisode, episode: int, start: int) -> pa.Table:
        steps = len(staged.state)
        frame_index = np.arange(steps, dtype=np.int64)
        return pa.table({
            STATE: _vectors(staged.state),
            ACTION: _vectors(staged.action),
            "timestamp": pa.array((frame_index / self.spec.fps).astype(np.float32)),
            "frame_index": pa.array(frame_index),
            "episode_index": pa.array(np.full(steps, episode, dtype=np.int64)),
            "index": pa.array(start + frame_index),
            "task_index": pa.array(np.zeros(steps, dtype=np.int64)),
            DONE: pa.array(frame_index == steps - 1),
        })

    def _open(self) -> list[dict]:
        """The committed episodes' metadata rows, after checking the directory and cleaning up after a crash."""
        info_path = self.root / INFO_PATH
        if not info_path.exists():
            if any(not p.name.startswith(".") for p in self.root.iterdir()):  # hidden ones are other tools'
                raise UserError(f"{self.root} is not empty and holds no {INFO_PATH}; record into a new or empty "
                                "directory")
            self._write_summaries_for([])
            return []
        info = _read_json(info_path)
        if info.get("codebase_version") != CODEBASE_VERSION:
            raise UserError(f"{info_path}: codebase_version {info.get('codebase_version')!r}, hetlab appends only "
                            f"to {CODEBASE_VERSION} datasets; record into a new directory")
        if info.get("fps") != self.spec.fps or info.get("features") != self.spec.features():
            raise UserError(f"{self.root} holds a dataset recorded with other settings (fps, image size, render "
                            "quality or features differ from this recording's); record into a new directory or use the "
                            "settings it was made with")
        shutil.rmtree(self.staging_dir, ignore_errors=True)
        for kind in ("meta", "data", "videos"):
            for leftover in (self.root / kind).rglob(".*"):  # temporary files of writes a crash cut short
                if WRITTEN_THROUGH_TEMPORARY.fullmatch(temporary_target(leftover) or "") and leftover.is_file():
                    leftover.unlink()
        episodes = []
        for path in sorted((self.root / EPISODES_DIR).glob("chunk-*/file-*.parquet")):
            episodes.extend(pq.read_table(path).to_pylist())
        for number, row in enumerate(episodes):
            if row.get("episode_index") != number or row.get("data/file_index") != chunk_and_file(number)[1]:
                raise UserError(f"{self.root / EPISODES_DIR}: episode {number}'s metadata is not where hetlab puts "
                                "it (one episode per file); hetlab appends only to datasets it wrote")
        self._delete_uncommitted(len(episodes))
        self._write_summaries_for(episodes)  # info and stats may lag the last committed row after a crash
        return episodes

    def _delete_uncommitted(self, num_episodes: int) -> None:
        """Files of episodes whose metadata row was never written, which LeRobot would otherwise read."""
        for pattern in ("data/chunk-*/file-*.parquet", "videos/*/chunk-*/file-*.mp4",
                        f"{EPISODES_DIR}/chunk-*/file-*.parquet"):
            for path in self.root.glob(pattern):
                chunk, file = int(path.parent.name[len("chunk-"):]), int(path.stem[len("file-"):])
                if chunk * CHUNKS_SIZE + file >= num_episodes:
                    path.unlink()

    def _write_summaries(self) -> None:
        self._write_summaries_for(self._episodes)

    def _write_summaries_for(self, episodes: list[dict]) -> None:
        """tasks.parquet, info.json and stats.json for the committed `episodes`."""
        tasks = self.root / TASKS_PATH
        if not tasks.exists():
            tasks.parent.mkdir(parents=True, exist_ok=True)
            table = pa.table({"task_index": pa.array([0], pa.int64()), "task": [self.spec.task]})
            # pandas reads `task` back as the index, as LeRobot expects.
            table = table.replace_schema_metadata({b"pandas": json.dumps(_PANDAS_TASK_INDEX).encode()})
            _write_parquet(table, tasks)
        total_frames = episodes[-1]["dataset_to_index"] if episodes else 0
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.spec.robot_type,
            "total_episodes": len(episodes),
            "total_frames": total_frames,
            "total_tasks": 1,
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
            "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB,
            "fps": self.spec.fps,
            "splits": {"train": f"0:{len(episodes)}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH,
            "features": self.spec.features(),
        }
        (self.root / INFO_PATH).parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / INFO_PATH, json.dumps(info, indent=4))
        if episodes:
            dataset_stats = stats_lib.from_episode_rows(episodes)
            write_text_atomic(self.root / STATS_PATH, json.dumps(stats_lib.to_json(dataset_stats), indent=4))


# The pandas metadata pyarrow writes for a DataFrame indexed by `task` with one column `task_index`.
_PANDAS_TASK_INDEX = {
    "index_columns": ["task"], "column_indexes": [],
    "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64", "numpy_type": "int64",
                 "metadata": None},
                {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
                 "metadata": None}],
    "creator": {"library": "pyarrow", "version": pa.__version__}, "pandas_version": "2.2.0",
}


def _vectors(values: np.ndarray) -> pa.FixedSizeListArray:
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def _write_parquet(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read it ({e}); restore it or record into a new directory") from e
