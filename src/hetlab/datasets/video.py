"""Camera frames to AV1 mp4 and back, with PyAV.

Encoding follows LeRobot's choices: SVT-AV1, yuv420p, a keyframe every 2 frames. The short
GOP costs some file size but makes any frame reachable by decoding at most two, which is what a
shuffled training loader asks for. Decoding (dav1d) keeps the container open, reads on without
seeking when the next request is just ahead of the last frame, and seeks otherwise.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from hetlab.errors import UserError
from hetlab.extras import require

ENCODER = "libsvtav1"
CODEC_NAME = "av1"
PIX_FMT = "yuv420p"
GOP = 2
CRF = 30
PRESET = 8  # 3.5 s per 400-frame 640×480 episode on one core, ~4 % of recording it; preset 10 saves 0.7 s
# Reading on decodes every frame in between; past this many frames a seek (≤ GOP frames) is cheaper.
MAX_READ_AHEAD = 8


def require_av():
    return require("video", "av", "LeRobot datasets store camera frames as video, which")


def encode_video(frames: np.ndarray, path: Path, fps: int) -> None:
    """Write (T, H, W, 3) uint8 RGB frames to an AV1 mp4 at `path`; frame t is shown at t / fps."""
    av = require_av()
    if ENCODER not in av.codecs_available:
        raise UserError(f"this PyAV build has no {ENCODER} encoder for AV1 videos; reinstall it: pip install -U av")
    # SVT-AV1 prints a banner and its settings to stderr per video unless told to log errors only.
    os.environ.setdefault("SVT_LOG", "1")
    height, width = frames.shape[1:3]
    realtime_before = realtime_threads()
    try:
        with av.open(str(path), "w", format="mp4") as container:
            stream = container.add_stream(ENCODER, rate=fps, options={"crf": str(CRF), "preset": str(PRESET)})
            stream.width, stream.height, stream.pix_fmt = width, height, PIX_FMT
            stream.codec_context.gop_size = GOP
            stream.time_base = Fraction(1, fps)
            for t, image in enumerate(frames):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
                frame.pts = t
                container.mux(stream.encode(frame))
                if t == 0:  # the encoder opens on its first frame
                    demote_realtime_threads(keep=realtime_before)
            container.mux(stream.encode())  # flush the encoder's delayed frames
    finally:
        demote_realtime_threads(keep=realtime_before)


# SVT-AV1 run as root switches the thread that opens an encoder, and the threads it starts, to
# SCHED_FIFO at the highest priority. The calling thread stays so after the encoder closes, and
# every thread or process it starts later inherits it: a recorder or a training run, busy on every
# core, would then starve the rest of the machine. These put them back to the normal policy.

def realtime_threads() -> set[int]:
    """The ids of this process's threads on a real-time scheduling policy (Linux; elsewhere none)."""
    if not hasattr(os, "sched_getscheduler") or not os.path.isdir("/proc/self/task"):
        return set()
    found = set()
    for tid in map(int, os.listdir("/proc/self/task")):
        try:
            if os.sched_getscheduler(tid) in (os.SCHED_FIFO, os.SCHED_RR):
                found.add(tid)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    return found


def demote_realtime_threads(keep: set[int]) -> None:
    """Back to the normal policy: every real-time thread of this process but those in `keep`."""
    for tid in realtime_threads() - keep:
        try:
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
        except ProcessLookupError:
            pass


class VideoReader:
    """The frames of one video file by timestamp, as (H, W, 3) uint8 RGB, optionally resized.

    `tolerance` (seconds) is how far a frame's timestamp may be from the one asked for; half a
    frame period picks the nearest frame. Not picklable once open: open one per process.
    """

    def __init__(self, path: Path, tolerance: float, size: tuple[int, int] | None = None, threads: int = 1):
        av = require_av()
        self.path, self.tolerance, self.size = Path(path), tolerance, size
        try:
            self._container = av.open(str(path))
        except (av.error.FFmpegError, OSError) as e:
            raise UserError(f"{path}: cannot open the video ({e}); the file is truncated or corrupt, "
                            "restore it or record the dataset again") from e
        if not self._container.streams.video:
            self._container.close()
            raise UserError(f"{path}: the file holds no video stream; restore it or record the dataset again")
        self._stream = self._container.streams.video[0]
        self._stream.codec_context.thread_count = threads
        self._frames = None  # decoding generator, positioned after `_last`
        self._last = None  # the last decoded frame

    @property
    def duration(self) -> float:
        """Seconds the container says the video lasts (the index, not the frames actually present)."""
        stream = self._stream
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return (self._container.duration or 0) / 1e6

    def frame_at(self, t: float) -> np.ndarray:
        last = self._last
        ahead = t - last.time if last is not None else -1.0
        if last is None or not (-self.tolerance <= ahead <= MAX_READ_AHEAD * 2 * self.tolerance):
            self._seek(t)
        frame = self._decode_until(t)
        # One conversion thread: PyAV ≥ 17 otherwise starts a thread pool for swscale, and a DataLoader
        # worker forked from a process that converted a frame waits forever for the pool's threads.
        if self.size is None:
            return frame.to_ndarray(format="rgb24", threads=1)
        height, width = self.size
        return frame.to_ndarray(format="rgb24", width=width, height=height, interpolation="AREA", threads=1)

    def _seek(self, t: float) -> None:
        # Seek to the keyframe at or before t, then decode forward.
        self._container.seek(max(0, int(t / self._stream.time_base)), stream=self._stream, backward=True)
        self._frames = self._container.decode(self._stream)
        self._last = None

    def _decode_until(self, t: float):
        av = require_av()
        frame = self._last
        try:
            while frame is None or frame.time < t - self.tolerance:
                frame = next(self._frames, None)
                if frame is None:
                    break
                self._last = frame
        except av.error.FFmpegError as e:
            raise UserError(f"{self.path}: decoding failed near t={t:.3f} s ({e}); the file is corrupt, "
                            "restore it or record the dataset again") from e
        if frame is None:
            raise UserError(f"{self.path}: the video ends before t={t:.3f} s, which its episode needs; the file "
                            "is truncated, restore it or record the dataset again")
        if frame.time > t + self.tolerance:
            raise UserError(f"{self.path}: no frame at t={t:.3f} s (the nearest is at {frame.time:.3f} s); the "
                            "video does not match its episode metadata")
        return frame

    def close(self) -> None:
        self._frames = self._last = None
        self._container.close()
