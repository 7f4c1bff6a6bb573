"""Read a LeRobot v3.0 dataset from disk (hetlab's or any other) as a torch Dataset.

Item i of a dataset is frame i of the selected episodes, in the order they were selected:
every camera's image (3, H, W), the state, and a chunk of the `action_horizon` actions starting
at that frame; `action_is_pad` marks the chunk's steps past the episode's end, which repeat its
last action (as LeRobot pads).

Everything that can be wrong with the files is checked at construction, before any training
starts: metadata, columns, episode selection, the presence of every data and video file, and
that each video opens and is long enough. Only decoding itself can still fail later, and that
too says which file is broken. State, action and indices are read into memory at construction
(a few MB); video files are opened lazily, once per process, and kept open, so the object
pickles into DataLoader workers and each worker decodes on its own.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from hetlab.datasets import stats as stats_lib
from hetlab.datasets.lerobot_format import (CODEBASE_VERSION, EPISODE_COLUMNS, EPISODES_DIR, INFO_PATH, STATS_PATH,
                                            video_columns)
from hetlab.datasets.video import VideoReader, require_av
from hetlab.errors import UserError

STATE, ACTION = "observation.state", "action"
DATA_COLUMNS = (STATE, ACTION, "episode_index", "frame_index", "timestamp", "index")
MAX_OPEN_VIDEOS = 16  # per process; a shuffled loader touches every episode, so bound the open files
# Decoders a forked DataLoader worker inherited. Freeing one there waits forever on the parent's
# FFmpeg worker threads (which fork does not copy), so they are kept, unused, for the process's life.
_INHERITED_DECODERS: list = []


class LeRobotDataset(torch.utils.data.Dataset):
    """The frames of `episodes` (default: all) of the dataset at `root`.

    image_size: (height, width) to resize frames to while decoding, or None to keep them.
    float_images: images as float32 in [0, 1] instead of uint8.
    decode_threads: decoder threads per video file; 1 suits DataLoader workers, which decode in parallel.
    """

    def __init__(self, root: Path | str, episodes: Sequence[int] | None = None, action_horizon: int = 1,
                 image_size: tuple[int, int] | None = None, float_images: bool = False, decode_threads: int = 1):
        if action_horizon < 1:
            raise UserError(f"action_horizon must be ≥ 1, got {action_horizon}")
        self.root = Path(root)
        self.action_horizon, self.image_size, self.float_images = action_horizon, image_size, float_images
        self.decode_threads = decode_threads
        self.info = load_info(self.root)
        self.fps = self.info["fps"]
        self.video_keys = [key for key, ft in self.info["features"].items() if ft["dtype"] == "video"]
        if self.video_keys:
            require_av()
        self.stats = _dataset_stats(self.root)
        rows = _load_episode_rows(self.root, self.video_keys)
        self.episodes = _select(self.root, rows, episodes)
        self._episode_rows = {e: rows[e] for e in self.episodes}
        self._load_frames()
        self._check_videos()
        self._readers: OrderedDict[Path, VideoReader] = OrderedDict()
        self._readers_pid = os.getpid()

    def __len__(self) -> int:
        return len(self.index)

    @property
    def episode_lengths(self) -> dict[int, int]:
        return {e: self._episode_rows[e]["length"] for e in self.episodes}

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not -len(self) <= i < len(self):
            raise IndexError(f"frame {i} of a dataset of {len(self)} frames")
        i = int(i) % len(self)
        episode = int(self.episode_index[i])
        actions, is_pad = self.action_chunk(i)
        item = {
            STATE: torch.from_numpy(self.state[i]),
            ACTION: torch.from_numpy(actions),
            "action_is_pad": torch.from_numpy(is_pad),
            "episode_index": torch.tensor(episode),
            "frame_index": torch.tensor(int(self.frame_index[i])),
            "timestamp": torch.tensor(float(self.timestamp[i])),
            "index": torch.tensor(int(self.index[i])),
        }
        for key in self.video_keys:
            row = self._episode_rows[episode]
            t = row[f"videos/{key}/from_timestamp"] + float(self.timestamp[i])
            image = torch.from_numpy(self._reader(self._video_path(key, row)).frame_at(t)).permute(2, 0, 1)
            item[key] = image.float().div_(255) if self.float_images else image.contiguous()
        return item

    def action_chunk(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Frame i's `action_horizon` actions and their padding flags, without decoding video."""
        steps = i + np.arange(self.action_horizon)
        is_pad = steps >= self._episode_end[i]
        return self.action[np.minimum(steps, self._episode_end[i] - 1)], is_pad

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_readers"] = OrderedDict()  # open decoders stay in the process that opened them
        return state

    def _reader(self, path: Path) -> VideoReader:
        if self._readers_pid != os.getpid():  # a forked worker: the inherited decoders share file offsets too
            _INHERITED_DECODERS.append(self._readers)
            self._readers, self._readers_pid = OrderedDict(), os.getpid()
        reader = self._readers.get(path)
        if reader is None:
            reader = VideoReader(path, tolerance=0.4 / self.fps, size=self.image_size, threads=self.decode_threads)
            self._readers[path] = reader
            if len(self._readers) > MAX_OPEN_VIDEOS:
                self._readers.popitem(last=False)[1].close()
        self._readers.move_to_end(path)
        return reader

    def _video_path(self, key: str, row: dict) -> Path:
        return self.root / self.info["video_path"].format(
            video_key=key, chunk_index=row[f"videos/{key}/chunk_index"], file_index=row[f"videos/{key}/file_index"])

    def _load_frames(self) -> None:
        """State, action and indices of the selected episodes, in selection order."""
        by_file: dict[tuple[int, int], list[int]] = {}
        for e in self.episodes:
            row = self._episode_rows[e]
            by_file.setdefault((row["data/chunk_index"], row["data/file_index"]), []).append(e)
        columns: dict[int, dict[str, np.ndarray]] = {}
        for (chunk, file), wanted in by_file.items():
            path = self.root / self.info["data_path"].format(chunk_index=chunk, file_index=file)
            table = _read_parquet(path, DATA_COLUMNS)
            table = table.filter(pc.is_in(table["episode_index"], pa.array(wanted, pa.int64())))
            for e in wanted:
                part = table.filter(pc.equal(table["episode_index"], e))
                part = part.take(pc.sort_indices(part["frame_index"]))
                frame_index = part["frame_index"].to_numpy()
                length = self._episode_rows[e]["length"]
                if len(part) != length or not np.array_equal(frame_index, np.arange(length)):
                    raise UserError(f"{path}: episode {e} has {len(part)} frames, its metadata says {length} "
                                    "(frames 0..length-1); the file does not match meta/episodes, restore it")
                columns[e] = {name: _column(part, name, path) for name in DATA_COLUMNS}
        merged = {name: np.concatenate([columns[e][name] for e in self.episodes]) for name in DATA_COLUMNS}
        self.state, self.action = merged[STATE], merged[ACTION]
        self.episode_index, self.frame_index = merged["episode_index"], merged["frame_index"]
        self.timestamp, self.index = merged["timestamp"], merged["index"]
        lengths = [self._episode_rows[e]["length"] for e in self.episodes]
        self._episode_end = np.repeat(np.cumsum(lengths), lengths)  # per item: where its episode ends

    def _check_videos(self) -> None:
        """Every video file exists, opens, and lasts as long as the episodes in it need."""
        needed: dict[Path, float] = {}
        for e in self.episodes:
            row = self._episode_rows[e]
            for key in self.video_keys:
                path = self._video_path(key, row)
                needed[path] = max(needed.get(path, 0.0), row[f"videos/{key}/to_timestamp"])
        for path, to_timestamp in needed.items():
            if not path.is_file():
                raise UserError(f"{path}: video file missing; restore it or record the dataset again")
            reader = VideoReader(path, tolerance=0.4 / self.fps)
            try:
                if reader.duration < to_timestamp - 1.5 / self.fps:
                    raise UserError(f"{path}: the video lasts {reader.duration:.3f} s but its episodes need "
                                    f"{to_timestamp:.3f} s; the file is truncated, restore it or record it again")
            finally:
                reader.close()


def load_info(root: Path) -> dict:
    path = root / INFO_PATH
    if not root.is_dir():
        raise UserError(f"{root}: no such dataset directory; record one with `hetlab aloha record` or give the "
                        "path of a LeRobot v3.0 dataset")
    info = _read_json(path)
    if info.get("codebase_version") != CODEBASE_VERSION:
        raise UserError(f"{path}: codebase_version {info.get('codebase_version')!r}, hetlab reads {CODEBASE_VERSION} "
                        "datasets; convert it with LeRobot's convert_dataset_v21_to_v30 or record it again")
    missing = [key for key in ("fps", "features", "data_path") if key not in info]
    if missing:
        raise UserError(f"{path}: missing {', '.join(missing)}; the file is not LeRobot v3.0 metadata")
    features = info["features"]
    for key in (STATE, ACTION):
        if key not in features or len(features[key].get("shape", ())) != 1:
            raise UserError(f"{path}: the dataset has no vector feature {key!r}; hetlab needs state and action")
    for key, ft in features.items():
        if ft.get("dtype") == "image":
            raise UserError(f"{path}: camera {key!r} is stored as images in parquet, hetlab reads cameras stored "
                            "as video only; re-encode the dataset with videos")
    if any(ft.get("dtype") == "video" for ft in features.values()) and "video_path" not in info:
        raise UserError(f"{path}: the dataset has video features but no video_path template")
    return info


def _dataset_stats(root: Path) -> dict[str, dict[str, np.ndarray]]:
    """meta/stats.json, or, where a writer was killed before its first one, the same aggregated
    from the committed episodes' metadata rows."""
    if (root / STATS_PATH).is_file():
        return stats_lib.from_json(_read_json(root / STATS_PATH))
    rows = [row for path in sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
            for row in pq.read_table(path).to_pylist()]
    stats = stats_lib.from_episode_rows(rows)
    if not stats:
        _read_json(root / STATS_PATH)  # the one-line "file missing" error
    return stats


def _load_episode_rows(root: Path, video_keys: list[str]) -> dict[int, dict]:
    """Each episode's metadata row (without its stats), by episode index."""
    paths = sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet"))
    if not paths:
        raise UserError(f"{root / EPISODES_DIR}: no episodes metadata (chunk-*/file-*.parquet); the dataset is "
                        "empty or incomplete")
    needed = list(EPISODE_COLUMNS) + [column for key in video_keys for column in video_columns(key)]
    rows = {}
    for path in paths:
        for row in _read_parquet(path, needed).to_pylist():
            rows[row["episode_index"]] = row
    return rows


def episode_seeds(root: Path | str, episodes: Sequence[int]) -> dict[int, int | None]:
    """The environment seed each of `episodes` was recorded from (hetlab's `seed` column), by
    episode; None for episodes of datasets made otherwise, which do not say."""
    root = Path(root)
    seeds: dict[int, int | None] = {}
    for path in sorted((root / EPISODES_DIR).glob("chunk-*/file-*.parquet")):
        for row in _read_parquet(path, ["episode_index"], optional=["seed"]).to_pylist():
            seeds[row["episode_index"]] = row.get("seed")
    absent = [e for e in episodes if e not in seeds]
    if absent:
        raise UserError(f"{root}: episode(s) {absent} out of range; the dataset has {len(seeds)} episodes")
    return {e: seeds[e] for e in episodes}


def _select(root: Path, rows: dict[int, dict], episodes: Sequence[int] | None) -> list[int]:
    if episodes is None:
        return sorted(rows)
    selected = [int(e) for e in episodes]
    absent = [e for e in selected if e not in rows]
    if absent:
        have = f"episodes {min(rows)}–{max(rows)}" if len(rows) == max(rows) - min(rows) + 1 else \
            f"{len(rows)} episodes"
        raise UserError(f"{root}: episode(s) {absent} out of range; the dataset has {have}")
    if len(set(selected)) != len(selected):
        raise UserError(f"episodes {selected}: each episode may be selected once")
    if not selected:
        raise UserError("the episode selection is empty")
    return selected


def _read_parquet(path: Path, columns: Sequence[str], optional: Sequence[str] = ()) -> pa.Table:
    """`columns` of a parquet file (UserError naming any missing), and those of `optional` it has."""
    if not path.is_file():
        raise UserError(f"{path}: file missing; restore it or record the dataset again")
    try:
        names = pq.read_schema(path).names
        missing = [c for c in columns if c not in names]
        if missing:
            raise UserError(f"{path}: missing column(s) {', '.join(missing)}; the file is not LeRobot v3.0 "
                            "data, restore it or record the dataset again")
        return pq.read_table(path, columns=[*columns, *(c for c in optional if c in names)])
    except (pa.ArrowException, OSError) as e:
        raise UserError(f"{path}: cannot read it ({e}); the file is corrupt, restore it") from e


def _column(table: pa.Table, name: str, path: Path) -> np.ndarray:
    """A column as numpy: vectors (list or fixed-size list) as (rows, dims), scalars as (rows,)."""
    column = table[name].combine_chunks()
    if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type) or \
            pa.types.is_large_list(column.type):
        values = column.flatten().to_numpy(zero_copy_only=False)
        if len(values) % max(len(column), 1):
            raise UserError(f"{path}: column {name!r} holds vectors of different lengths")
        return values.reshape(len(column), -1).astype(np.float32)
    return column.to_numpy(zero_copy_only=False)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise UserError(f"{path}: file missing; the directory is not a LeRobot v3.0 dataset, or an incomplete one")
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: cannot read it ({e}); restore it") from e
