#!/usr/bin/env bash
# What benchmarks/gpu_check.sh needs on the offline GPU machine beyond that machine's own Python
# packages, in one folder small enough to travel with a command there (≤ 60 MiB):
#
#   benchmarks/gpu_bundle.sh [--python X.Y] [BUNDLE_DIR]      # default: 3.12 (the GPU machine's), .gpu_bundle
#
#   wheels/        hetlab itself, and the manylinux wheels for Python X.Y of what the machine lacks
#                  (benchmarks/gpu_machine.txt lists what it has): MuJoCo, tyro, gymnasium, PyAV and
#                  their own needs; each at the version installed here, where the tests pass
#   assets.tar.xz  only the robot files the checks load (the Go1, and the G1 on flat ground) in the
#                  asset wheels' layout, for HETLAB_ASSET_TREE; the wheels they come in are 245 and 89 MB
#   aloha/         a two-episode ALOHA dataset (LeRobot v3) for the Phase B check, recorded here
#   manifest.json  the Python version, the wheels, the sizes
#
# It needs .venv (`make setup`) and the package registry; it prints the bundle's size and fails if
# the bundle would not fit. `benchmarks/gpu_check.sh` installs it (README.md beside this file).
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=3.12
if [[ ${1:-} == --python ]]; then PYVER=$2; shift 2; fi
BUNDLE=${1:-.gpu_bundle}
LIMIT_MIB=60
PY=.venv/bin/python
[[ -x $PY ]] || { echo "gpu_bundle: no .venv here; run \`make setup\` first" >&2; exit 2; }
[[ $PYVER =~ ^3\.[0-9]+$ ]] || { echo "gpu_bundle: --python takes a version such as 3.12, got $PYVER" >&2; exit 2; }

# What the checks import that the GPU machine does not have (gpu_machine.txt), and what is left out
# of what those need: MuJoCo's viewer with its window and GL bindings, as no check renders there.
# tests/test_gpu_bundle.py fails on a name both here and on the machine, or on a requirement of
# hetlab or of these that is in none of the lists.
BUNDLED="mujoco mujoco-core tyro docstring-parser typeguard gymnasium farama-notifications av"
LEFT_OUT="mujoco-studio glfw pyopengl"

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/wheels"
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done
for name in $BUNDLED; do
  version=$($PY -c "import importlib.metadata as m; print(m.version('$name'))")
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" -d "$BUNDLE/wheels" "$name==$version" 2>&1 | grep -v '^WARNING: Location' || true
  ls "$BUNDLE/wheels" | grep -qi "^${name//-/_}-$version-" ||
    { echo "gpu_bundle: no wheel of $name $version for Python $PYVER on x86-64 Linux" >&2; exit 1; }
done
$PY -m pip wheel -q --no-deps --no-build-isolation -w "$BUNDLE/wheels" . >/dev/null

# The robot files, copied in the asset wheels' layout, checked by building both tasks from the copy
# alone, then compressed (the meshes shrink to about a third).
TREE=$(mktemp -d)
trap 'rm -rf "$TREE"' EXIT
$PY - "$TREE" <<'EOF'
import os
import re
import shutil
import sys
from pathlib import Path

from hetlab.assets import ASSET_TREE_ENV, _package_roots, robot_xml, scene_xml

tree = Path(sys.argv[1])


def copy(path: Path) -> None:
    """`path` into the tree at its place under its asset-wheel root, with what it names (file="...")."""
    root = next(root for root in _package_roots() if path.is_relative_to(root))
    target = tree / path.relative_to(root)
    if target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(path, target)
    if path.suffix == ".xml":
        text = path.read_text()
        meshdir = re.search(r'<compiler[^>]*meshdir="([^"]*)"', text)
        for name in re.findall(r'\bfile="([^"]+)"', text):
            base = path.parent / meshdir.group(1) if meshdir and not name.endswith(".xml") else path.parent
            copy(Path(os.path.normpath(base / name)))


copy(robot_xml("go1"))
copy(scene_xml("g1_flat"))
os.environ[ASSET_TREE_ENV] = str(tree)
from hetlab.tasks import make_task  # noqa: E402

for task in ("go1-joystick-flat", "g1-walk-flat"):
    make_task(task, num_envs=1, threads=1)
EOF
tar -C "$TREE" -cJf "$BUNDLE/assets.tar.xz" .

.venv/bin/hetlab aloha record --out "$BUNDLE/aloha" --episodes 2 --height 64 --width 96 --steps 60 \
  --no-successful-only --render-quality fast >/dev/null

$PY - "$BUNDLE" "$PYVER" "$LIMIT_MIB" <<'EOF'
import json
import sys
from pathlib import Path

bundle, python, limit = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])
size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
manifest = {"python": python, "wheels": sorted(w.name for w in (bundle / "wheels").glob("*.whl")), "bytes": size}
(bundle / "manifest.json").write_text(json.dumps(manifest, indent=2))
print(f"{bundle}: {size / 2**20:.1f} MiB for Python {python} ({len(manifest['wheels'])} wheels, "
      f"assets.tar.xz, aloha/); the limit is {limit:g} MiB")
if size > limit * 2**20:
    sys.exit(f"gpu_bundle: {bundle} is {size / 2**20:.1f} MiB, over the {limit:g} MiB a command carries")
EOF
