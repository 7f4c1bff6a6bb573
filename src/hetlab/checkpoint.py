"""Checkpoints: nested state (tensors, arrays, numbers, strings) as safetensors + JSON, atomically.

A checkpoint is a directory `checkpoints/<iteration>/` holding `tensors.safetensors` (every
tensor and array of the state, keyed by its path) and `state.json` (everything else, with
each tensor replaced by a reference). It is written under a temporary name, flushed to disk and
renamed whole; `checkpoint.json` in the run directory then names the newest one. The checkpoint
that `checkpoint.json` names is never removed before the pointer has moved on, so a crash at any
moment leaves it naming a complete checkpoint: a second save of one iteration (a run stopped at
a checkpoint boundary) goes to `<iteration>-b` (or back to `<iteration>`) rather than over it.
`best.json` names the iteration whose policy evaluated best (`mark_best`); its checkpoint is
kept however many newer ones there are.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hetlab.errors import UserError
from hetlab.files import (fsync_directory, fsync_tree, space_checked, temporary_sibling, temporary_target,
                          write_text_atomic)

KEEP = 2  # newest checkpoints kept per run
BEST_FILE = "best.json"
CHECKPOINT_NAME = re.compile(r"[0-9]{7,}(-b)?")  # <iteration>, or <iteration>-b for its second save


def _flatten(node: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, torch.Tensor):
        tensors[path] = node.detach().cpu().contiguous()
        return {"__tensor__": path}
    if isinstance(node, np.ndarray):
        tensors[path] = torch.from_numpy(np.ascontiguousarray(node))
        return {"__ndarray__": path}
    if isinstance(node, dict):
        return {"__dict__": [[key, _flatten(value, f"{path}/{key}", tensors)] for key, value in node.items()]}
    if isinstance(node, (list, tuple)):
        return [_flatten(value, f"{path}/{i}", tensors) for i, value in enumerate(node)]
    if isinstance(node, (np.integer, np.floating, np.bool_)):
        return node.item()
    return node


def _unflatten(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, dict):
        if "__tensor__" in node:
            return tensors[node["__tensor__"]]
        if "__ndarray__" in node:
            return tensors[node["__ndarray__"]].numpy()
        return {key: _unflatten(value, tensors) for key, value in node["__dict__"]}
    if isinstance(node, list):
        return [_unflatten(value, tensors) for value in node]
    return node


def save_checkpoint(run_dir: Path, iteration: int, state: dict[str, Any],
                    write_extra: Callable[[Path], None] | None = None, keep: int = KEEP) -> Path:
    """Write `state` (and whatever `write_extra(directory)` puts beside it) as one checkpoint; the
    `keep` newest stay (0: every one)."""
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    final = checkpoints / _fresh_name(iteration, _named(run_dir))
    tmp = temporary_sibling(final, directory=True)
    try:
        with space_checked(final):
            tensors: dict[str, torch.Tensor] = {}
            tree = _flatten(state, "", tensors)
            save_file(tensors, tmp / "tensors.safetensors")
            (tmp / "state.json").write_text(json.dumps(tree))
            if write_extra is not None:
                write_extra(tmp)
            fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)  # not the named one: a leftover of an earlier crash
        tmp.rename(final)
        fsync_directory(checkpoints)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_text_atomic(run_dir / "checkpoint.json", json.dumps({"latest": final.name, "iteration": iteration}))
    best = read_best(run_dir)
    for old in _superseded(checkpoints, final, keep, best["iteration"] if best else None):  # the pointer has moved
        shutil.rmtree(old, ignore_errors=True)
    return final


def _superseded(checkpoints: Path, final: Path, keep: int, best: int | None) -> list[Path]:
    """What a save of `final` makes obsolete: the other checkpoint of its iteration, those beyond the `keep`
    newest (0: none) but the `best` iteration's, and temporary directories a crash left behind."""
    entries = list(checkpoints.iterdir())
    saved = [p for p in entries if CHECKPOINT_NAME.fullmatch(p.name)]
    replaced = [p for p in saved if p != final and checkpoint_iteration(p) == checkpoint_iteration(final)]
    newest = sorted((p for p in saved if p not in replaced), key=checkpoint_iteration)
    temporaries = [p for p in entries if CHECKPOINT_NAME.fullmatch(temporary_target(p) or "")]
    older = [p for p in newest[:-keep] if checkpoint_iteration(p) != best] if keep else []
    return replaced + [p for p in older if p != final] + temporaries


def _fresh_name(iteration: int, named: str | None) -> str:
    """`<iteration>`, or `<iteration>-b` while checkpoint.json names `<iteration>`: never the named one."""
    name = f"{iteration:07d}"
    return f"{name}-b" if named == name else name


def _named(run_dir: Path) -> str | None:
    """The checkpoint directory checkpoint.json names, if it is readable."""
    try:
        return json.loads((run_dir / "checkpoint.json").read_text())["latest"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def mark_best(run_dir: Path, iteration: int, scores: dict[str, float]) -> None:
    """Name the checkpoint of `iteration` (already saved) the run's best, with the scores that made it so."""
    write_text_atomic(run_dir / BEST_FILE, json.dumps({"iteration": iteration, **scores}))


def read_best(run_dir: Path) -> dict | None:
    """best.json: the best checkpoint's iteration and scores; None if the run has none."""
    try:
        return json.loads((run_dir / BEST_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise UserError(f"{run_dir / BEST_FILE} is corrupt ({e}); delete it (the next evaluation writes it again)") from e


def checkpoint_dir(run_dir: Path, iteration: int | str | None = None) -> Path:
    """The directory of the run's newest checkpoint (`iteration` None or "latest"), of its best
    ("best"), or of the one saved at `iteration` (a number)."""
    pointer = run_dir / "checkpoint.json"
    if not pointer.is_file():
        if (run_dir / "config.json").is_file():  # a run stopped before its first checkpoint
            raise UserError(f"{run_dir} has no checkpoint.json: it stopped before its first checkpoint, so there is "
                            "nothing to continue; start the run again")
        raise UserError(f"{run_dir} has no checkpoint.json; pass a run directory written by `hetlab train`")
    try:
        newest = run_dir / "checkpoints" / json.loads(pointer.read_text())["latest"]
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{pointer} is corrupt ({e}); write {{\"latest\": \"<a directory in checkpoints/>\"}} into it") from e
    if iteration in (None, "latest"):
        return newest
    if iteration == "best":
        best = read_best(run_dir)
        if best is None:
            raise UserError(f"{run_dir} has no best checkpoint; runs trained with --eval-every N keep the one whose "
                            "policy evaluated best")
        iteration = best["iteration"]
    elif isinstance(iteration, str):
        if not iteration.isdigit():
            raise UserError(f"--checkpoint {iteration!r}: give an iteration (a number), best or latest")
        iteration = int(iteration)
    kept = sorted(p for p in (run_dir / "checkpoints").iterdir() if CHECKPOINT_NAME.fullmatch(p.name))
    at = [p for p in kept if checkpoint_iteration(p) == iteration]
    if not at:
        have = ", ".join(str(checkpoint_iteration(p)) for p in kept) or "none"
        raise UserError(f"{run_dir} keeps no checkpoint of step {iteration}; it keeps step(s) {have}")
    return newest if newest in at else at[0]


def checkpoint_iteration(checkpoint: Path) -> int:
    """The iteration (step) a checkpoint directory was saved at."""
    return int(checkpoint.name.partition("-")[0])


def load_checkpoint(run_dir: Path, iteration: int | str | None = None) -> dict[str, Any]:
    """The state of the checkpoint `checkpoint_dir` finds for `iteration` (default the newest)."""
    return read_checkpoint(run_dir, checkpoint_dir(run_dir, iteration))


def read_checkpoint(run_dir: Path, path: Path) -> dict[str, Any]:
    """The state of `run_dir`'s checkpoint directory `path`."""
    pointer = run_dir / "checkpoint.json"
    try:
        tensors = load_file(path / "tensors.safetensors")
        tree = json.loads((path / "state.json").read_text())
        return _unflatten(tree, tensors)
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as e:
        older = sorted((checkpoint_iteration(p) for p in (run_dir / "checkpoints").iterdir()
                        if CHECKPOINT_NAME.fullmatch(p.name) and p != path), reverse=True)
        instead = (f"it keeps step(s) {', '.join(map(str, older))}: `hetlab train --resume` continues from one with "
                   f"--checkpoint N, or name its directory as \"latest\" in {pointer}") if older else "it keeps no other"
        raise UserError(f"checkpoint {path} is damaged ({type(e).__name__}: {e}); {instead}") from e
