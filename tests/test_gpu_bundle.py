"""The GPU check's bundle and the GPU machine's own packages cover everything the checks need: a
missing package would otherwise show only on the rare, offline GPU machine."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
              "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
              "platform_python_implementation": "CPython"}
# The extras whose code the checks run: Phase B's ONNX export and INT8 runtime, dataset video, NVML power.
CHECKED_EXTRAS = ("export", "video", "gpu-power")


def shell_list(script: str, variable: str) -> set[str]:
    text = (BENCHMARKS / script).read_text()
    value = re.search(rf'^{variable}="([^"]*)"', text, re.MULTILINE)
    assert value, f"{script} sets no {variable}"
    return {canonicalize_name(name) for name in value.group(1).split()}


def machine_packages() -> set[str]:
    lines = (BENCHMARKS / "gpu_machine.txt").read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line and not line.startswith("#")}


def requirements(distribution: str, extras: tuple[str, ...] = ()) -> set[str]:
    """`distribution`'s requirements on the GPU machine's Python, with `extras`."""
    needed = set()
    for spec in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(spec)
        if requirement.marker is None or any(requirement.marker.evaluate({**GPU_PYTHON, "extra": extra})
                                             for extra in ("", *extras)):
            needed.add(canonicalize_name(requirement.name))
    return needed


def needed_on_the_machine() -> set[str]:
    """What the checks need installed there: hetlab's requirements with the checked extras, and the
    bundled wheels' own."""
    needed = requirements("hetlab", CHECKED_EXTRAS) - {"hetlab"}
    for name in shell_list("gpu_bundle.sh", "BUNDLED"):
        needed |= requirements(name)
    return needed


def test_the_bundle_carries_only_what_the_machine_lacks():
    assert not shell_list("gpu_bundle.sh", "BUNDLED") & machine_packages()
    assert not shell_list("gpu_bundle.sh", "LEFT_OUT") & machine_packages()


def test_every_requirement_of_hetlab_and_the_bundle_is_carried_on_the_machine_or_left_out_on_purpose():
    bundled, left_out, machine = (shell_list("gpu_bundle.sh", "BUNDLED"), shell_list("gpu_bundle.sh", "LEFT_OUT"),
                                  machine_packages())
    needed = needed_on_the_machine()
    missing = needed - bundled - left_out - machine
    assert not missing, f"neither bundled nor on the GPU machine: {sorted(missing)}"
    assert "mujoco-core" in bundled and "av" in bundled and "torch" in machine  # the list is the real one


def test_a_rehearsal_installs_every_package_the_checks_take_from_the_machine():
    """--rehearse builds the machine's side from MACHINE_PACKAGES_USED: it must hold every package
    the checks need from the machine (torch comes from the TORCH build), and only the machine's."""
    used, machine = shell_list("gpu_check.sh", "MACHINE_PACKAGES_USED"), machine_packages()
    needed = needed_on_the_machine()
    assert used <= machine, sorted(used - machine)
    assert needed & machine - {"torch"} <= used, sorted(needed & machine - {"torch"} - used)


def run_gpu_check(tmp_path, gpu: bool, **env) -> subprocess.CompletedProcess:
    """benchmarks/gpu_check.sh with an `nvidia-smi` that finds a GPU or none (the guards run first)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{'echo GPU 0: test' if gpu else 'exit 9'}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return subprocess.run([str(BENCHMARKS / "gpu_check.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable,
                               "OUT": str(tmp_path / "out"), **env})


def test_gpu_check_without_a_gpu_or_a_fitting_bundle_stops_in_one_line(tmp_path):
    no_gpu = run_gpu_check(tmp_path, gpu=False)
    assert no_gpu.returncode == 2 and "no NVIDIA GPU here" in no_gpu.stderr and no_gpu.stderr.count("\n") == 1
    missing = run_gpu_check(tmp_path, gpu=True, BUNDLE=str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1
    assert f"no bundle at {tmp_path / 'nowhere'}; make it with benchmarks/gpu_bundle.sh" in missing.stderr
    other = tmp_path / "bundle"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps({"python": "3.9", "wheels": [], "bytes": 0}))
    mismatch = run_gpu_check(tmp_path, gpu=True, BUNDLE=str(other))
    here = "%d.%d" % sys.version_info[:2]
    assert mismatch.returncode == 2 and mismatch.stderr.count("\n") == 1
    assert f"is for Python 3.9, {sys.executable} is {here}; run benchmarks/gpu_bundle.sh --python {here}" \
        in mismatch.stderr
    assert not (tmp_path / "out").exists()  # stopped before any work
