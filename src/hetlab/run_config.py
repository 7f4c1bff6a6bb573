"""A run directory's config.json, read with one-line errors, and which kind of run wrote it.

Two kinds of run share the runs/ tree: those of `hetlab train` (an RL policy; config.json is the
TrainConfig, with no "kind") and the AR-Actor's of `hetlab aloha train` (Phase A or B; "kind"
is AR_ACTOR_KIND). Each command takes one kind and says so when it is given the other.
"""

from __future__ import annotations

import json
from pathlib import Path

from hetlab.errors import UserError

AR_ACTOR_KIND = "aloha-ar-actor"
RL_RUNS = "runs/<task>-<algo>/<timestamp> (written by `hetlab train`)"


def read_config_json(run_dir: Path | str, expected: str) -> dict:
    """The parsed config.json of `run_dir`; `expected` says what to pass instead when there is none."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{run_dir}: not a run directory (no config.json); pass {expected}")
    try:
        config = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror}); check its permissions") from e
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        raise UserError(f"{path} is corrupt ({e}); restore it from a copy of the run, or start a new run") from e
    if not isinstance(config, dict):
        raise UserError(f"{path} is corrupt (a JSON {type(config).__name__}, not an object); restore it from a "
                        "copy of the run, or start a new run")
    return config


def read_rl_run_config(run_dir: Path | str) -> dict:
    """config.json of a `hetlab train` run; an AR-Actor run (or another tool's) is refused by name."""
    config = read_config_json(run_dir, RL_RUNS)
    if config.get("kind") == AR_ACTOR_KIND:
        phase = config.get("phase", "?")
        resume = ", or continue it with `hetlab aloha train --resume`" if phase == "A" else ""
        raise UserError(f"{run_dir} is an AR-Actor run (Phase {phase} of `hetlab aloha train`); this command takes "
                        f"{RL_RUNS}: evaluate this one with `hetlab aloha eval`{resume}")
    if "kind" in config:
        raise UserError(f"{run_dir} holds a {config['kind']!r} run; this command takes {RL_RUNS}")
    return config
