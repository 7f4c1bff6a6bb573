"""The LeRobot v3.0 dataset layout, shared by the writer and the reader.

A dataset directory holds

    meta/info.json                         codebase_version "v3.0", fps, totals, path templates, features
    meta/stats.json                        mean/std/min/max/count of every numeric feature, all episodes
    meta/tasks.parquet                     one row per task: the task string is the index, `task_index`
    meta/episodes/chunk-CCC/file-FFF.parquet   one row per episode: length, frame range, where its data and
                                           video live, its own stats as `stats/<feature>/<stat>` columns
    data/chunk-CCC/file-FFF.parquet        one row per frame: state, action, indices, timestamp
    videos/<video key>/chunk-CCC/file-FFF.mp4  the frames of a camera, one or more episodes per file

Files are size-bounded pieces of the dataset and a chunk directory holds at most `chunks_size`
of them, so any number of episodes may share a file (an episode's rows and its
[from_timestamp, to_timestamp) span of video say where). hetlab writes one episode per file,
which keeps each episode's commit a handful of renames.
"""

from __future__ import annotations

CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000  # files per chunk directory
DATA_FILES_SIZE_IN_MB = 100  # LeRobot's defaults; informative only, as hetlab writes one episode per file
VIDEO_FILES_SIZE_IN_MB = 500

INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
EPISODES_DIR = "meta/episodes"
_CHUNK_FILE = "chunk-{chunk_index:03d}/file-{file_index:03d}"
EPISODES_PATH = f"{EPISODES_DIR}/{_CHUNK_FILE}.parquet"
DATA_PATH = f"data/{_CHUNK_FILE}.parquet"
VIDEO_PATH = "videos/{video_key}/" + _CHUNK_FILE + ".mp4"

# Columns every frame carries besides the features a dataset declares.
INDEX_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}

# The episodes-metadata columns a reader needs, besides one group per video key (below).
EPISODE_COLUMNS = ("episode_index", "length", "dataset_from_index", "dataset_to_index",
                   "data/chunk_index", "data/file_index")


def video_columns(video_key: str) -> tuple[str, ...]:
    """The episodes-metadata columns that locate an episode inside a camera's video files."""
    return tuple(f"videos/{video_key}/{name}" for name in ("chunk_index", "file_index", "from_timestamp",
                                                            "to_timestamp"))


def chunk_and_file(file_number: int) -> tuple[int, int]:
    """The (chunk_index, file_index) of the `file_number`-th file of a kind."""
    return divmod(file_number, CHUNKS_SIZE)
