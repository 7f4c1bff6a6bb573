"""meta.json: what made a run, one entry per launch (the first, then each resume).

A run's config.json says what it trains; meta.json says how it came about: the command line,
the hetlab version and git commit, the libraries' versions and the hardware, so a number can be
traced to the machine and code behind it. A resume appends; nothing earlier is lost. A run
resumed from an older checkpoint (`--checkpoint`) starts with the launches of the run it
branched from and `branched_from`: that run and the iteration.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import hetlab
from hetlab.devices import cpu_count
from hetlab.files import write_text_atomic
from hetlab.cpu_isa import host_cpu

META_FILE = "meta.json"
LIBRARIES = ("torch", "numpy", "mujoco", "onnxruntime", "openvino", "ray", "av", "pyarrow", "safetensors")


def record_launch(run_dir: Path, device: str, device_name: str) -> dict:
    """Append this launch to RUN/meta.json; returns the entry."""
    entry = {
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "cwd": os.getcwd(),
        "hetlab": hetlab.__version__,
        "git": git_state(),
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in LIBRARIES if _version(name)},
        "hardware": hardware(device, device_name),
    }
    path = run_dir / META_FILE
    meta = json.loads(path.read_text()) if path.is_file() else {"launches": []}
    write_text_atomic(path, json.dumps({**meta, "launches": [*meta["launches"], entry]}, indent=2))
    return entry


def git_state() -> dict | None:
    """The commit of the hetlab source tree, and whether it had uncommitted changes; None outside a checkout."""
    source = Path(hetlab.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10)
        if commit.returncode:
            return None
        changes = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):  # no git on the machine
        return None
    return {"commit": commit.stdout.strip(), "uncommitted_changes": bool(changes.stdout.strip())}


def hardware(device: str, device_name: str) -> dict:
    cpu = host_cpu()
    try:
        memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):  # a platform without these sysconf names
        memory_gib = None
    return {"cpu": cpu.model, "arch": cpu.arch, "cpu_flags": cpu.flags_in_order, "cores": cpu_count(),
            "memory_gib": memory_gib, "learner_device": device, "learner_device_name": device_name}


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
