"""AV1 encoding leaves the process's scheduling as it found it."""

from __future__ import annotations

import os
import threading

import numpy as np

from hetlab.datasets.video import encode_video, realtime_threads


def test_encoding_leaves_every_thread_on_the_normal_policy(tmp_path):
    # SVT-AV1 run as root (CI, most containers) puts the thread that opens it on SCHED_FIFO at
    # priority 99, and every thread started from it afterwards inherits that.
    assert realtime_threads() == set()
    encode_video(np.zeros((4, 32, 48, 3), np.uint8), tmp_path / "video.mp4", fps=50)
    assert (tmp_path / "video.mp4").stat().st_size > 0
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    policy = []
    later = threading.Thread(target=lambda: policy.append(os.sched_getscheduler(0)))
    later.start()
    later.join()
    assert policy == [os.SCHED_OTHER] and realtime_threads() == set()
