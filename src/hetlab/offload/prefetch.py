"""The next batch, prepared in the background while the learner trains on this one.

A producer thread walks the training steps in order: it loads step N+1's frames and runs the
offloaded encoder prefix on them (ONNX Runtime and PyAV release the GIL while they work), and
hands the result over through a bounded queue, so at most `depth` batches wait and the
producer never runs further ahead than that.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from hetlab.measure.timeline import SpanRecorder


@dataclass
class Prepared:
    step: int
    batch: dict
    tokens: list | None  # the prefix's token arrays, or None when the learner encodes itself
    spans: list = field(default_factory=list)  # (stage, t0, t1) of the producer for this batch


class Prefetcher:
    def __init__(self, steps: Iterable[int], load: Callable[[int], dict],
                 encode: Callable[[dict], list] | None, depth: int = 2):
        if depth < 1:
            raise ValueError(f"prefetch depth must be ≥ 1, got {depth}")
        self._steps, self._load, self._encode = steps, load, encode
        self._queue: queue.Queue[Prepared | BaseException | None] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="hetlab-prefetch", daemon=True)

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            recorder = SpanRecorder()
            for step in self._steps:
                with recorder.span("load"):
                    batch = self._load(step)
                tokens = None
                if self._encode is not None:
                    with recorder.span("inference"):
                        tokens = self._encode(batch)
                if not self._put(Prepared(step, batch, tokens, recorder.take())):
                    return
            self._put(None)
        except BaseException as error:  # handed to the learner, which raises it
            self._put(error)

    def get(self) -> Prepared | None:
        """The next prepared batch; None after the last step."""
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def __enter__(self) -> Prefetcher:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
