#!/usr/bin/env bash
# Every check that needs an NVIDIA GPU, in one command on the offline GPU machine (about 7 minutes;
# the checks' own limits add up to 515 s), over that machine's own Python and torch and the bundle
# benchmarks/gpu_bundle.sh makes:
#
#   benchmarks/gpu_check.sh               # on the GPU machine; results in $OUT if set, else runs/gpu_check
#   benchmarks/gpu_check.sh --rehearse    # on a CPU machine: the same commands at tiny sizes
#
# benchmarks/README.md gives the command to send there and the paths it carries. Steps:
#   0. the bundle (BUNDLE, default .gpu_bundle) installed with pip --no-index into a folder of its own
#      on PYTHONPATH, never touching the machine's torch; its robot files unpacked for HETLAB_ASSET_TREE;
#   1. the CUDA-only tests: pinned staging and side streams, peak memory, device probing;
#   2. `hetlab bench sim` on Go1 at 16k envs on every core;
#   3. PPO end to end, CPU collectors and the GPU learner, sync and async against each stage alone
#      (benchmarks/runtime_throughput.py; the design asks async ≥ 0.9 × the slower stage): Go1 at
#      4k and 16k envs, G1 walk-flat at 4k;
#   4. FastSAC and FlashSAC updates/s, inference in the collectors and on the learner;
#   5. Phase B on the bundle's two-episode dataset: the learner on the GPU alone against L4 INT8
#      offloaded to the CPU's ONNX Runtime (the CPU as the inference accelerator), with NVML board
#      power, energy per sample and peak memory;
#   6. G1 walk-flat trained for the minute left (benchmarks/time_to_solve.py), as far as it gets.
# Each check has its own time limit; one that fails or times out is reported and the rest still run.
# Writes OUT/gpu_check.md (the table), OUT/gpu_check.json, OUT/logs.tar.gz and the G1 curve, and exits
# non-zero if any check failed. ONLY="name ..." runs only the checks named. --rehearse makes
# .gpu_rehearsal/: a venv of `python3` with the CPU torch (TORCH, as for make) and the GPU machine's
# packages the checks use, and a bundle for its Python.
set -uo pipefail
cd "$(dirname "$0")/.."
REHEARSE=0
if [[ ${1:-} == --rehearse ]]; then REHEARSE=1; shift; fi
[[ $# == 0 ]] || { echo "gpu_check: unknown argument $1; the one option is --rehearse" >&2; exit 2; }
export PYTHONUNBUFFERED=1 MUJOCO_GL=egl
# What the checks use of the GPU machine's own packages (gpu_machine.txt) besides torch: a rehearsal
# installs these from the registry (tests/test_gpu_bundle.py keeps the list complete).
MACHINE_PACKAGES_USED="numpy pyarrow matplotlib tensorboard safetensors rich typing-extensions cloudpickle onnx
  onnxscript onnxruntime nvidia-ml-py pytest pytest-xdist"

if [[ $REHEARSE == 1 ]]; then
  REHEARSAL=.gpu_rehearsal
  BUNDLE=${BUNDLE:-$REHEARSAL/bundle}
  OUT=${OUT:-runs/gpu_check_rehearsal}
  PYTHON=$REHEARSAL/venv/bin/python
  if [[ ! -x $PYTHON ]]; then
    python3 -m venv "$REHEARSAL/venv" && $PYTHON -m pip install -q --upgrade pip &&
      $PYTHON -m pip install -q ${TORCH:-torch==2.13.0} && $PYTHON -m pip install -q $MACHINE_PACKAGES_USED ||
      { rm -rf "$REHEARSAL/venv"; exit 1; }
  fi
  VERSION=$($PYTHON -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  [[ -f $BUNDLE/manifest.json ]] || benchmarks/gpu_bundle.sh --python "$VERSION" "$BUNDLE" || exit 1
  BIG=256 SMALL=64 SECONDS_EACH=4 PHASE_B_STEPS=5 G1_MINUTES=0.5 G1_ENVS=64
else
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (nvidia-smi finds none); these checks need one (--rehearse runs them on a CPU)" >&2
    exit 2
  fi
  BUNDLE=${BUNDLE:-.gpu_bundle}
  OUT=${OUT:-runs/gpu_check}
  PYTHON=${PYTHON:-python3}
  BIG=16384 SMALL=4096 SECONDS_EACH=10 PHASE_B_STEPS=300 G1_MINUTES=1 G1_ENVS=4096
fi
if [[ ! -f $BUNDLE/manifest.json ]]; then
  echo "gpu_check: no bundle at $BUNDLE; make it with benchmarks/gpu_bundle.sh on the CPU machine and carry it" >&2
  exit 2
fi
VERSION=$($PYTHON -c 'import sys; print("%d.%d" % sys.version_info[:2])')
BUNDLED=$($PYTHON -c 'import json, sys; print(json.load(open(sys.argv[1]))["python"])' "$BUNDLE/manifest.json")
if [[ $VERSION != "$BUNDLED" ]]; then
  echo "gpu_check: $BUNDLE is for Python $BUNDLED, $PYTHON is $VERSION; run benchmarks/gpu_bundle.sh --python $VERSION" >&2
  exit 2
fi

mkdir -p "$OUT"
WORK=$(mktemp -d)
LOGS=$WORK/logs
mkdir -p "$LOGS" "$WORK/site" "$WORK/assets"
$PYTHON -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" "$BUNDLE"/wheels/*.whl \
  || exit 1
tar -C "$WORK/assets" -xJf "$BUNDLE/assets.tar.xz" || exit 1
export PYTHONPATH=$WORK/site HETLAB_ASSET_TREE=$WORK/assets
HETLAB=("$PYTHON" -m hetlab.cli)
[[ $REHEARSE == 1 ]] || nvidia-smi -L >"$OUT/gpus.txt"

declare -A STATUS
check() {  # check NAME SECONDS COMMAND...: runs it with a limit, logs to LOGS/NAME.log, records the outcome
  local name=$1 limit=$2
  shift 2
  [[ -z ${ONLY:-} || " $ONLY " == *" $name "* ]] || return 0
  echo "== $name (at most ${limit}s)"
  local start=$SECONDS
  timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
  local rc=$?
  STATUS[$name]="rc=$rc, $((SECONDS - start))s"
  [[ $rc == 0 ]] || { echo "   failed (rc=$rc):"; tail -n 5 "$LOGS/$name.log" | sed 's/^/   /'; }
}

check cuda_tests 45 "$PYTHON" -m pytest -q -n0 -p no:cacheprovider -rs tests/runtime/test_staging.py \
  tests/measure/test_memory.py tests/test_devices.py -k "cuda or memory or staging or device"
check bench_sim 30 "${HETLAB[@]}" bench sim --task go1-joystick-flat --envs $BIG --seconds $SECONDS_EACH --json
check ppo_go1 100 "$PYTHON" benchmarks/runtime_throughput.py --task go1-joystick-flat --envs $SMALL $BIG --runs 1 \
  --seconds $SECONDS_EACH
check ppo_g1 50 "$PYTHON" benchmarks/runtime_throughput.py --task g1-walk-flat --envs $SMALL --runs 1 \
  --seconds $SECONDS_EACH
check off_policy 80 "$PYTHON" benchmarks/off_policy_throughput.py --algos fastsac flashsac \
  --placement-algos fastsac flashsac --envs $SMALL --runs 1 --seconds $SECONDS_EACH
check phase_b 90 bash -c "
  set -e
  ${HETLAB[*]} aloha train --dataset $BUNDLE/aloha --preset tiny --steps 20 --train-episodes 0-1 --runs-dir $WORK/runs
  phase_a=\$(ls -d $WORK/runs/aloha-ar-actor/*/ | head -1)
  episodes='--train-episodes 0-1 --calibration-episodes 0-1'
  ${HETLAB[*]} aloha train --phase B --from \$phase_a --condition learner --steps $PHASE_B_STEPS \$episodes \
    --out $WORK/phase_b_learner
  ${HETLAB[*]} aloha train --phase B --from \$phase_a --condition L4 --offload-device cpu --steps $PHASE_B_STEPS \
    \$episodes --out $WORK/phase_b_L4"
# G1 walk-flat for the minute left: its recipe (PPO at 5 ms, Playground's discount), more envs.
check g1_walk $(awk "BEGIN { print int($G1_MINUTES * 60 + 60) }") "$PYTHON" benchmarks/time_to_solve.py \
  --task g1-walk-flat --budget-minutes $G1_MINUTES --runs-dir "$WORK/runs" --out "$OUT" -- \
  --envs $G1_ENVS --eval-every 10 --eval-envs 128

STATUS_LINES=$(for name in "${!STATUS[@]}"; do printf '%s\t%s\n' "$name" "${STATUS[$name]}"; done)
STATUS_LINES="$STATUS_LINES" "$PYTHON" - "$OUT" "$LOGS" "$WORK" <<'EOF'
import json
import os
import sys
from pathlib import Path

out, logs, work = (Path(arg) for arg in sys.argv[1:4])
status = dict(line.split("\t") for line in os.environ["STATUS_LINES"].splitlines() if line)
report, rows = {"status": status}, []
try:
    r = report["bench_sim"] = json.loads((logs / "bench_sim.log").read_text())
    rows.append(f"| bench sim go1, {r['envs']} envs | {r['sim']} ({r['threads']} threads) | "
                f"{r['physics_steps_per_s']:,.0f} substeps/s, {r['env_steps_per_s']:,.0f} env steps/s, "
                f"task_efficiency {r['task_efficiency']:.2f} |")
except (OSError, ValueError, KeyError):
    pass
for name in ("ppo_go1", "ppo_g1", "off_policy", "g1_walk"):
    log = logs / f"{name}.log"
    if log.is_file():
        table = [line for line in log.read_text().splitlines() if line.startswith("|")]
        report[name] = table
        rows += table
for condition in ("learner", "L4"):
    path = work / f"phase_b_{condition}" / "summary.json"
    if path.is_file():
        s = json.loads(path.read_text())
        report[f"phase_b_{condition}"] = s
        energy = s["energy_per_sample"]
        joules = (f"{energy['combined']:.3g} J/sample" if energy.get("combined") is not None else
                  f"energy not read ({', '.join(energy.get('missing', []))})")
        memory = s["peak_memory"]
        rows.append(f"| Phase B, {condition} | | {s['samples_per_s']:.1f} samples/s, {joules}, peak memory "
                    f"{memory['bytes'] / 2**20:,.0f} MiB ({memory['what']}) |")
for name, outcome in sorted(status.items()):
    rows.append(f"| check {name} | | {outcome} |")
(out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
(out / "gpu_check.md").write_text("| check | backend | result |\n|---|---|---|\n" + "\n".join(rows) + "\n")
print((out / "gpu_check.md").read_text())
EOF
tar -C "$WORK" -czf "$OUT/logs.tar.gz" logs
rm -rf "$WORK"
for outcome in "${STATUS[@]}"; do [[ $outcome == rc=0,* ]] || exit 1; done
